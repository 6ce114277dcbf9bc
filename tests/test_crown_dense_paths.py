"""CROWN's dense passes that bound rows where they reach the input instead of building them.

A first linear layer's rows [W; -W] are concretized from one half (|-W| = |W|); the fused
relu-linear step of a pass whose rows then reach the input multiplies and concretizes them block by
block of rows. Both must equal the path that builds the coefficients and concretizes them
(``_Pass.ends_at`` forced false: the same sums row by row, 1e-12 of the scale), and hold in exact
rational arithmetic at sampled corners.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch
import torch.nn as nn

import torchlean_bridge as tlb
import semantics.linear_bounds.crown as crown_mod
from semantics.sampling import sample_points
from tests.test_linear_bounds import _exact_mlp


def _mlp(width: int, batch: int):
    torch.manual_seed(3)
    net = nn.Sequential(nn.Linear(6, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 3)).eval()
    return net, tlb.import_fx(net, (torch.zeros(batch, 6),))


def _counting(monkeypatch) -> list[int]:
    """The targets of the fused relu-linear steps that bounded their rows at the input."""
    calls: list[int] = []
    fn = crown_mod._Pass._relu_linear

    def counted(self, *args):
        out = fn(self, *args)
        if not out:
            calls.append(self.t)
        return out
    monkeypatch.setattr(crown_mod._Pass, "_relu_linear", counted)
    return calls


@pytest.mark.parametrize("batch", [1, 3])
def test_bounding_at_the_input_equals_building_the_rows(batch, monkeypatch):
    _, b = _mlp(48, batch)
    c = np.random.default_rng(0).uniform(-1, 1, (batch, 6))
    lo, hi = c - 0.5, c + 0.5
    fused = _counting(monkeypatch)
    direct = tlb.linear_bounds(b.graph, b.payload, lo, hi, all_nodes=True)
    assert fused, "the blockwise product-and-bound step was not used"
    monkeypatch.setattr(crown_mod._Pass, "ends_at", lambda self, v: False)
    built = tlb.linear_bounds(b.graph, b.payload, lo, hi, all_nodes=True)
    for (dlo, dhi), (blo, bhi) in zip(direct.boxes, built.boxes):
        scale = 1e-12 * (1 + np.abs(blo).max() + np.abs(bhi).max())
        np.testing.assert_allclose(dlo, blo, rtol=0, atol=scale)
        np.testing.assert_allclose(dhi, bhi, rtol=0, atol=scale)


def test_blockwise_bounds_hold_in_exact_arithmetic(monkeypatch):
    monkeypatch.setattr(crown_mod, "_BLOCK", 6 * 40)  # blocks of a few rows: every block boundary is crossed
    net, b = _mlp(40, 1)
    weights = [(m.weight.detach().double().numpy(), m.bias.detach().double().numpy()) for m in net
               if isinstance(m, nn.Linear)]
    c = np.random.default_rng(1).uniform(-1, 1, (1, 6))
    lo, hi = c - 0.6, c + 0.6
    fused = _counting(monkeypatch)
    res = tlb.linear_bounds(b.graph, b.payload, lo, hi)
    assert fused
    points, corners = sample_points([(lo, hi)], 24, 2)
    assert corners >= 1
    for (x,) in points:
        for j, v in enumerate(_exact_mlp(weights, x.reshape(-1))):
            assert Fraction(res.lower[0][0, j]) <= v <= Fraction(res.upper[0][0, j])


def test_an_infinite_input_end_on_the_fused_path_gives_no_nan(monkeypatch):
    _, b = _mlp(48, 1)
    lo, hi = np.full((1, 6), -0.5), np.full((1, 6), 0.5)
    lo[0, 2] = -np.inf
    fused = _counting(monkeypatch)
    res = tlb.linear_bounds(b.graph, b.payload, lo, hi, all_nodes=True)
    assert fused
    for blo, bhi in res.boxes:
        assert not np.any(np.isnan(blo)) and not np.any(np.isnan(bhi))
    x = np.where(np.isfinite(lo), lo, -30.0)
    y = tlb.evaluate(b.graph, b.payload, [x])[0]
    assert np.all(res.lower[0] <= y) and np.all(y <= res.upper[0])


@pytest.mark.parametrize("conv", [False, True])
def test_first_affine_layer_keeps_its_ibp_box(conv, monkeypatch):
    """A linear layer or convolution of the input is not refined by a backward pass (its IBP box is
    the exact range up to rounding): the bounds equal those with the pass, up to rounding."""
    torch.manual_seed(4)
    if conv:
        net = nn.Sequential(nn.Conv2d(1, 3, 3, stride=2), nn.ReLU(), nn.Conv2d(3, 2, 2), nn.ReLU(), nn.Flatten(),
                            nn.Linear(2 * 2 * 2, 3)).eval()
        shape = (2, 1, 7, 7)
    else:
        net, shape = _mlp(24, 2)[0], (2, 6)
    b = tlb.import_fx(net, (torch.zeros(shape),))
    c = np.random.default_rng(5).uniform(-1, 1, shape)
    skipped = tlb.linear_bounds(b.graph, b.payload, c - 0.3, c + 0.3)
    monkeypatch.setattr(crown_mod._Run, "_first_affine", lambda self, v: False)
    refined = tlb.linear_bounds(b.graph, b.payload, c - 0.3, c + 0.3)
    for s_lo, s_hi, r_lo, r_hi in zip(skipped.lower, skipped.upper, refined.lower, refined.upper):
        scale = 1e-10 * (1 + np.abs(r_lo).max() + np.abs(r_hi).max())
        np.testing.assert_allclose(s_lo, r_lo, rtol=0, atol=scale)
        np.testing.assert_allclose(s_hi, r_hi, rtol=0, atol=scale)


def test_dense_lines_step_is_exact_choice_and_bounds_its_rounding():
    """Smooth layers take every column through ``_apply_lines_dense``: its coefficients are bit for bit the
    per-entry choice of the lower line (coefficient >= 0) or the upper one, and the error it states covers
    the exact rational intercept sum <a+, b_l> + <a-, b_u>."""
    from semantics.linear_bounds.crown import _apply_lines_dense
    rng = np.random.default_rng(7)
    flat = rng.standard_normal((2, 6, 40)) * np.exp2(rng.integers(-30, 30, (2, 6, 40)))
    flat[0, 0, :3], flat[0, 1, :2] = 0.0, -0.0
    a_l, a_u, b_l, b_u = (rng.standard_normal((2, 40)) * 1e3 for _ in range(4))
    new, val, err = _apply_lines_dense(flat, a_l, b_l, a_u, b_u)
    pos = flat >= 0
    assert np.array_equal(new, np.where(pos, flat * a_l[:, None], flat * a_u[:, None]))
    for i in range(2):
        for r in range(6):
            exact = sum(Fraction(float(x)) * Fraction(float(bl if x >= 0 else bu))
                        for x, bl, bu in zip(flat[i, r], b_l[i], b_u[i]))
            assert abs(Fraction(float(val[i, r])) - exact) <= Fraction(float(err[i, r]))
            assert err[i, r] > 0


def test_box_vectors_are_each_samples_own_and_follow_set_box():
    """A run rounds the concretization vectors (center, radius, |c| + r) of a box once for every sample,
    and a pass over samples b0:b1 reads their rows: the values ``center_radius`` gives that slice alone
    (a sample's vectors do not depend on the others'). Samples sharing one box give one row. A box
    replaced by ``set_box`` gets new vectors (stale ones would concretize over the old box)."""
    from semantics.interval_round import center_radius
    net, bundle = _mlp(5, 4)
    crown = crown_mod.Crown(bundle.graph, bundle.payload)
    rng = np.random.default_rng(5)
    lo = rng.standard_normal((4, 6))
    hi = lo + rng.random((4, 6))
    hi[1, 2] = np.inf
    run = crown_mod._Run(crown, crown.ibp(lo, hi))
    v = bundle.graph.inputs[0]
    c, stack, has_inf = run.box_vectors(v)
    assert has_inf and c.shape == (4, 6) and stack.shape == (4, 6, 3)
    for b0, b1 in ((0, 1), (1, 3), (0, 4)):
        c_s, r_s = center_radius(lo[b0:b1], hi[b0:b1])
        finite = np.isfinite(r_s)
        assert np.array_equal(c[b0:b1], c_s)
        assert np.array_equal(stack[b0:b1, :, 0], np.where(finite, r_s, 0.0))
        assert np.array_equal(stack[b0:b1, :, 1], np.abs(c_s) + np.where(finite, r_s, 0.0))
        assert np.array_equal(stack[b0:b1, :, 2], (~finite).astype(float))
    shared = np.repeat(lo[:1], 4, 0), np.repeat(lo[:1] + 0.5, 4, 0)
    run.set_box(v, shared)
    c, stack, has_inf = run.box_vectors(v)
    assert not has_inf and c.shape == (1, 6) and stack.shape == (1, 6, 2)
    assert np.array_equal(c, center_radius(shared[0][:1], shared[1][:1])[0])
