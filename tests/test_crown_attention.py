"""CROWN through attention: softmax (``softmax_planes`` over the last axis, ``expand`` otherwise),
layernorm (``expand``), products of two computed tensors (McCormick planes in ``rules``), 1/x and
1/sqrt(x) lines in ``relax``.

Soundness: the float64 forward at the box's corners (a sample of them), its center and uniform points
lies within CROWN's output bounds; the new lines hold against mpmath on a dense grid. Tightness: never
looser than IBP, and much tighter on the attention block (IBP is ~1000x wider there).
"""

from __future__ import annotations

import mpmath as mp
import numpy as np
import pytest
import torch
import torch.nn as nn

import torchlean_bridge as tlb
from semantics.evaluate import evaluate
from semantics.linear_bounds.relax import smooth_for, smooth_lines
from semantics.sampling import sample_points
from tests.test_linear_bounds import bundle

mp.mp.dps = 40


def bounds_and_check(b: tlb.Bundle, lo: np.ndarray, hi: np.ndarray, samples: int = 40, seed: int = 0):
    """CROWN's result after checking that sampled float64 values lie within it and that it is inside IBP's box."""
    g = b.graph
    res = tlb.linear_bounds(g, b.payload, lo, hi)
    ibp = tlb.linear_bounds(g, b.payload, lo, hi, method="ibp")
    assert not res.fallback, res.fallback
    points, _ = sample_points([(lo, hi)], samples, seed)
    for point in points:
        values = evaluate(g, b.payload, point, dtype="float64")
        for o, (blo, bhi) in enumerate(res):
            v = np.asarray(values[o], dtype=np.float64)
            assert np.all(v >= blo) and np.all(v <= bhi), (o, v, blo, bhi)
    for (clo, chi), (ilo, ihi) in zip(res, ibp):
        assert np.all(clo >= ilo) and np.all(chi <= ihi)
    return res, ibp


class Softmax(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(6, 5)

    def forward(self, x):
        return torch.softmax(self.l(x), dim=-1)


class Norm(nn.Module):
    def __init__(self):
        super().__init__()
        self.l, self.n = nn.Linear(6, 5), nn.LayerNorm(5)
        with torch.no_grad():
            self.n.weight.uniform_(0.5, 1.5)
            self.n.bias.uniform_(-0.5, 0.5)

    def forward(self, x):
        return self.n(self.l(x))


class Scores(nn.Module):
    """Q K^T and then (Q K^T) V: both operands of each product computed."""

    def __init__(self):
        super().__init__()
        self.q, self.k, self.v = nn.Linear(6, 4), nn.Linear(6, 4), nn.Linear(6, 3)

    def forward(self, x):
        s = torch.matmul(self.q(x), self.k(x).transpose(1, 2))
        return torch.matmul(torch.relu(s), self.v(x)) + self.q(x)[..., :3] * self.k(x)[..., :3]


class Block(nn.Module):
    """bench/bounds_bench.py's AttentionBlock on 4 tokens of width 8."""

    def __init__(self, tokens: int = 4, width: int = 8):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.q, self.k, self.v = (nn.Linear(width, width) for _ in range(3))
        self.ff1, self.ff2 = nn.Linear(width, 2 * width), nn.Linear(2 * width, width)
        self.head = nn.Linear(tokens * width, 3)
        self.scale = width ** -0.5

    def forward(self, x):
        h = self.norm1(x)
        att = torch.softmax(torch.matmul(self.q(h), self.k(h).transpose(1, 2)) * self.scale, dim=-1)
        x = x + torch.matmul(att, self.v(h))
        x = x + self.ff2(torch.relu(self.ff1(self.norm2(x))))
        return self.head(torch.flatten(x, 1))


def _box(shape, eps, seed=1):
    c = np.random.default_rng(seed).normal(size=shape)
    return c - eps, c + eps


@pytest.mark.parametrize("eps", [0.05, 0.5])
def test_softmax_is_sound_and_tighter_than_ibp(eps):
    b = bundle(Softmax(), (2, 3, 6))
    res, ibp = bounds_and_check(b, *_box((2, 3, 6), eps))
    lo, hi = res[0]
    assert np.all(lo >= 0) and np.all(hi <= 1)
    assert np.sum(hi - lo) < np.sum(ibp[0][1] - ibp[0][0])


@pytest.mark.parametrize("eps", [0.05, 0.5])
def test_layernorm_is_sound_and_tighter_than_ibp(eps):
    b = bundle(Norm(), (2, 3, 6))
    res, ibp = bounds_and_check(b, *_box((2, 3, 6), eps))
    assert np.sum(res[0][1] - res[0][0]) < np.sum(ibp[0][1] - ibp[0][0])


def test_products_of_two_computed_tensors_are_sound_and_tighter_than_ibp():
    b = bundle(Scores(), (2, 3, 6))
    res, ibp = bounds_and_check(b, *_box((2, 3, 6), 0.1))
    assert np.sum(res[0][1] - res[0][0]) < np.sum(ibp[0][1] - ibp[0][0])


@pytest.mark.parametrize("batch", [1, 3])
def test_attention_block_is_sound_and_far_tighter_than_ibp(batch):
    b = bundle(Block(), (batch, 4, 8))
    res, ibp = bounds_and_check(b, *_box((batch, 4, 8), 0.02), samples=20)
    width, ibp_width = res[0][1] - res[0][0], ibp[0][1] - ibp[0][0]
    assert np.max(width) * 20 < np.max(ibp_width), (np.max(width), np.max(ibp_width))


def test_equal_logits_give_one_over_t():
    """softmax of equal logits is exactly 1/T: a point box gives bounds around it, a small box around equal
    logits holds 1/T at its center."""
    class Soft(nn.Module):
        def forward(self, x):
            return torch.softmax(x, dim=-1)
    b = bundle(Soft(), (1, 2, 5))
    x = np.full((1, 2, 5), 0.7)
    res = tlb.linear_bounds(b.graph, b.payload, x, x)
    lo, hi = res[0]
    assert np.all(lo <= 0.2) and np.all(hi >= 0.2) and np.all(hi - lo < 1e-12)
    res, _ = bounds_and_check(b, x - 0.1, x + 0.1)
    assert np.all(res[0][0] <= 0.2) and np.all(res[0][1] >= 0.2) and np.all(res[0][1] - res[0][0] < 0.2)


def test_zero_width_boxes_are_tight_and_contain_the_value():
    for module in (Norm(), Scores(), Block(tokens=3, width=6)):
        shape = (2, 3, 6)
        b = bundle(module, shape)
        x = np.random.default_rng(5).normal(size=shape)
        res = tlb.linear_bounds(b.graph, b.payload, x, x)
        v = np.asarray(evaluate(b.graph, b.payload, x, dtype="float64")[0])
        lo, hi = res[0]
        assert not res.fallback
        assert np.all(lo <= v) and np.all(v <= hi)
        assert np.all(hi - lo <= 1e-9 * (1 + np.abs(v))), np.max(hi - lo)


@pytest.mark.parametrize("kind, f", [("inv", lambda z: 1 / z), ("rsqrt", lambda z: 1 / mp.sqrt(z))])
def test_positive_lines_hold_against_mpmath(kind, f):
    rng = np.random.default_rng(0)
    lo = np.concatenate([rng.uniform(1e-5, 3.0, 60), [1.0, 1e-5, 7.0]])
    hi = np.concatenate([lo[:60] + rng.uniform(0.0, 5.0, 60), [1.0, 2e5, 7.0 + 1e-12]])
    a_l, b_l, a_u, b_u = smooth_lines(smooth_for(kind, {}), lo, hi)
    for i in range(lo.size):
        for t in np.linspace(0.0, 1.0, 41):
            z = mp.mpf(float(lo[i])) + (mp.mpf(float(hi[i])) - mp.mpf(float(lo[i]))) * mp.mpf(float(t))
            fz = f(z)
            assert mp.mpf(float(a_l[i])) * z + mp.mpf(float(b_l[i])) <= fz, (kind, lo[i], hi[i], t)
            assert mp.mpf(float(a_u[i])) * z + mp.mpf(float(b_u[i])) >= fz, (kind, lo[i], hi[i], t)


def test_inv_reaching_zero_keeps_its_box():
    """1/x is relaxed only where its input box is positive: an input reaching 0 keeps the (infinite) box,
    never a NaN."""
    class Inv(nn.Module):
        def forward(self, x):
            return torch.reciprocal(x)
    b = bundle(Inv(), (1, 3))
    assert [n.kind for n in b.graph.nodes] == ["input", "inv"]
    res = tlb.linear_bounds(b.graph, b.payload, np.array([[-1.0, 0.5, 1.0]]), np.array([[1.0, 2.0, 1.0]]))
    lo, hi = res[0]
    assert not np.any(np.isnan(lo)) and not np.any(np.isnan(hi))
    assert lo[0, 0] == -np.inf and hi[0, 0] == np.inf
    assert lo[0, 1] <= 0.5 and hi[0, 1] >= 2.0 and lo[0, 2] <= 1.0 <= hi[0, 2]


def _softmax_mp(x):
    m = max(x)
    e = [mp.exp(v - m) for v in x]
    s = mp.fsum(e)
    return [v / s for v in e]


@pytest.mark.parametrize("eps, scale", [(0.05, 1.0), (1.0, 3.0), (0.0, 1.0), (400.0, 1.0)])
def test_softmax_planes_hold_against_mpmath(eps, scale):
    """The planes hold at the box's corners, center and random points, in 40-digit arithmetic, with the
    tight softmax box (as IBP gives it) and with a loose one."""
    from semantics.linear_bounds.softmax_planes import softmax_planes
    rng = np.random.default_rng(3)
    c = rng.normal(size=(3, 4)) * scale
    c[2] = 0.25  # equal logits
    lo, hi = c - eps, c + eps
    el, eu = np.exp(lo), np.exp(hi)
    tight = (el / (eu.sum(-1, keepdims=True) - eu + el) * (1 - 1e-12),
             np.minimum(eu / (el.sum(-1, keepdims=True) - el + eu) * (1 + 1e-12), 1.0))
    for out_lo, out_hi in (tight, (np.zeros_like(lo), np.ones_like(hi))):
        j_l, b_l, j_u, b_u = softmax_planes(lo, hi, out_lo, out_hi)
        assert np.all(np.isfinite(j_l)) and np.all(np.isfinite(b_u)) and np.all(np.isfinite(b_l))
        for row in range(3):
            corners = [np.where(np.array([(m >> i) & 1 for i in range(4)], dtype=bool), hi[row], lo[row])
                       for m in range(16)]
            for x in corners + [c[row]] + [rng.uniform(lo[row], hi[row]) for _ in range(10)]:
                xm = [mp.mpf(float(v)) for v in x]
                s = _softmax_mp(xm)
                for k in range(4):
                    low = mp.fsum(mp.mpf(float(j_l[row, k, i])) * xm[i] for i in range(4)) + mp.mpf(float(b_l[row, k]))
                    upp = mp.fsum(mp.mpf(float(j_u[row, k, i])) * xm[i] for i in range(4)) + mp.mpf(float(b_u[row, k]))
                    assert low <= s[k] <= upp, (eps, row, k, x)
        if eps == 0.0 and out_lo is tight[0]:  # a point box: the planes pinch the value
            at_c = np.exp(c) / np.exp(c).sum(-1, keepdims=True)
            assert np.all(np.sum(j_u * c[:, None, :], -1) + b_u - (np.sum(j_l * c[:, None, :], -1) + b_l) < 1e-9)
            assert np.all(np.abs(np.sum(j_l * c[:, None, :], -1) + b_l - at_c) < 1e-9)


def test_softmax_over_a_middle_axis_is_expanded_and_sound():
    """Softmax over another axis than the last goes through its decomposition 1 / sum_j exp(x_j - x_i)."""
    class Mid(nn.Module):
        def __init__(self):
            super().__init__()
            self.l = nn.Linear(6, 5)

        def forward(self, x):
            return torch.softmax(self.l(x), dim=1)
    b = bundle(Mid(), (2, 3, 6))
    from semantics.linear_bounds.crown import Crown
    crown = Crown(b.graph, b.payload)
    assert crown.expanded is not None and "inv" in {n.kind for n in crown.graph.nodes}
    for eps in (0.01, 0.2):
        bounds_and_check(b, *_box((2, 3, 6), eps))  # sound, no fallback, inside IBP (here about as tight)


def test_layernorm_over_two_axes_is_sound():
    """Normalized over the trailing (3, 5): the rows are flattened to 15 entries, weight and bias kept."""
    class Norm2(nn.Module):
        def __init__(self):
            super().__init__()
            self.l, self.n = nn.Linear(6, 5), nn.LayerNorm([3, 5])
            with torch.no_grad():
                self.n.weight.uniform_(0.5, 1.5)
                self.n.bias.uniform_(-0.5, 0.5)

        def forward(self, x):
            return torch.relu(self.n(self.l(x)))
    b = bundle(Norm2(), (2, 3, 6))
    res, ibp = bounds_and_check(b, *_box((2, 3, 6), 0.05))
    assert np.sum(res[0][1] - res[0][0]) < np.sum(ibp[0][1] - ibp[0][0])
