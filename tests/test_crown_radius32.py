"""CROWN's rows that end at the input with float32 radius products (``semantics.linear_bounds.radius32``).

Against the float64 product on the same nets (``crown.FLOAT32_INPUT_STEP`` off): every bound the step
produces is at most the float64 one (it charges float32's rounding, the float64 path only float64's), it
costs at most ``WIDTH_COST`` of the width, and it holds in exact rational arithmetic at sampled points and
corners; operands that float32 would hold as subnormals are flushed (sound), a weight float32 does not
hold exactly and a rounding above the width cost (rows of subnormal size: the flush's charge) keep the
float64 product.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch
import torch.nn as nn

import torchlean_bridge as tlb
import semantics.linear_bounds.crown as crown_mod
import semantics.linear_bounds.radius32 as radius32
from semantics.sampling import sample_points
from tests.test_linear_bounds import _exact_mlp


def _net(seed: int, width: int = 40, scale_second: np.ndarray | None = None, float64_first: bool = False):
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(6, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 3))
    net = net.double().eval()  # float32 weights, held exactly in float64
    with torch.no_grad():
        if scale_second is not None:
            net[2].weight.mul_(torch.from_numpy(scale_second))
        if float64_first:  # a checkpoint in float64: a weight float32 does not hold exactly
            net[0].weight.add_(1e-12)
    weights = [(m.weight.detach().numpy().copy(), m.bias.detach().numpy().copy()) for m in net
               if isinstance(m, nn.Linear)]
    return tlb.import_fx(net, (torch.zeros(1, 6, dtype=torch.float64),)), weights


def _spy(monkeypatch) -> list:
    """Per use of the float32 step: whether it answered (False: it handed back to float64)."""
    used: list = []
    fn = crown_mod.concretized32

    def spied(*args):
        out = fn(*args)
        used.append(out is not None)
        return out
    monkeypatch.setattr(crown_mod, "concretized32", spied)
    return used


def _bounds(b, lo, hi, on: bool, monkeypatch):
    monkeypatch.setattr(crown_mod, "FLOAT32_INPUT_STEP", on)
    return tlb.linear_bounds(b.graph, b.payload, lo, hi, all_nodes=True)


def _second_linear(b) -> int:
    return [n.id for n in b.graph.nodes if n.kind == "linear"][1]


@pytest.mark.parametrize("seed,radius", [(0, 0.05), (1, 0.3), (2, 0.01)])
def test_float32_rows_bound_below_the_float64_product_within_the_width_cost(seed, radius, monkeypatch):
    monkeypatch.setattr(radius32, "MIN_PRODUCT32", 0)
    b, weights = _net(seed)
    c = np.random.default_rng(seed).uniform(-1, 1, (1, 6))
    lo, hi = c - radius, c + radius
    used = _spy(monkeypatch)
    r32 = _bounds(b, lo, hi, True, monkeypatch)
    assert used and all(used), "the float32 step did not answer"
    r64 = _bounds(b, lo, hi, False, monkeypatch)
    v = _second_linear(b)  # the box the step refines: the second layer's pre-activations
    (l32, h32), (l64, h64) = r32.boxes[v], r64.boxes[v]
    tiny = 1e-13 * (1 + np.abs(l64).max() + np.abs(h64).max())
    assert np.all(l32 <= l64 + tiny) and np.all(h32 >= h64 - tiny)
    assert np.any(l32 < l64) and np.any(h32 > h64)  # float32's allowance is charged
    assert np.sum(h32 - l32) <= (1 + 2 * radius32.WIDTH_COST) * np.sum(h64 - l64)
    points, corners = sample_points([(lo, hi)], 30, seed)
    assert corners >= 1
    for (x,) in points:
        for j, y in enumerate(_exact_mlp(weights, x.reshape(-1))):
            assert Fraction(r32.lower[0][0, j]) <= y <= Fraction(r32.upper[0][0, j])


def test_float32_subnormal_coefficients_are_flushed_and_charged(monkeypatch):
    """Rows whose entries float32 holds only as subnormals: flushed to zero before the product, the flush
    charged, so the bounds still lie below the float64 product's and hold exactly."""
    monkeypatch.setattr(radius32, "MIN_PRODUCT32", 0)
    scale = np.ones((40, 40))
    scale[::3, ::2] = 2.0 ** -140  # a sixth of the rows' coefficients below float32's smallest normal
    b, weights = _net(5, scale_second=scale)
    c = np.random.default_rng(5).uniform(-1, 1, (1, 6))
    lo, hi = c - 0.1, c + 0.1
    flushed: list[int] = []
    to32 = radius32._float32

    def counting(x):
        out = to32(x)
        flushed.append(int(np.count_nonzero((out == 0) & (x != 0))))
        return out
    monkeypatch.setattr(radius32, "_float32", counting)
    used = _spy(monkeypatch)
    r32 = _bounds(b, lo, hi, True, monkeypatch)
    assert used and all(used) and sum(flushed) > 0
    r64 = _bounds(b, lo, hi, False, monkeypatch)
    v = _second_linear(b)
    (l32, h32), (l64, h64) = r32.boxes[v], r64.boxes[v]
    tiny = 1e-13 * (1 + np.abs(l64).max() + np.abs(h64).max())
    assert np.all(l32 <= l64 + tiny) and np.all(h32 >= h64 - tiny)
    points, _ = sample_points([(lo, hi)], 20, 5)
    for (x,) in points:
        for j, y in enumerate(_exact_mlp(weights, x.reshape(-1))):
            assert Fraction(r32.lower[0][0, j]) <= y <= Fraction(r32.upper[0][0, j])


def test_float64_weights_and_costly_rounding_keep_the_float64_product(monkeypatch):
    monkeypatch.setattr(radius32, "MIN_PRODUCT32", 0)
    c = np.random.default_rng(7).uniform(-1, 1, (1, 6))
    # a first-layer weight float32 does not hold exactly: the step is never prepared
    b, _ = _net(7, float64_first=True)
    used = _spy(monkeypatch)
    r32 = _bounds(b, c - 0.1, c + 0.1, True, monkeypatch)
    assert not used
    # rows float32 holds only as subnormals: flushed, the flush's charge would dwarf their radius terms,
    # so the step is prepared, then hands back (its cost does not depend on the radius: the center is float64)
    b, _ = _net(7, scale_second=np.full((40, 40), 2.0 ** -140))
    r32 = _bounds(b, c - 0.1, c + 0.1, True, monkeypatch)
    assert used and not any(used)
    r64 = _bounds(b, c - 0.1, c + 0.1, False, monkeypatch)
    for (a_lo, a_hi), (b_lo, b_hi) in zip(r32.boxes, r64.boxes):
        assert np.array_equal(a_lo, b_lo) and np.array_equal(a_hi, b_hi)
