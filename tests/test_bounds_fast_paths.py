"""The fast paths of the bound computations are as sound and as tight as the general ones.

The interval convolution runs over the whole batch in center-radius form and, for an input radius
that is uniform per sample (an l-inf ball), replaces the radius GEMM by max(r) times the in-bounds
sums of |W| (cached per input shape). Checked in exact rational arithmetic: every output box
encloses the exact range W c + b +- |W| r, and exceeds it by rounding allowances only.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import torchlean_bridge as tlb
from semantics.interval import INTERVAL_RULES
from tests.test_interval_ops import SETTINGS, conv_reference, draw_conv_case, frac


def _exact_range(node, rec, c, r):
    """The exact range of each output over [c - r, c + r]: W c + b -+ |W| r (rationals)."""
    mid = conv_reference(frac(c), frac(rec["weight"]), frac(rec["bias"]), node.attrs, node.out_shape)
    rad = conv_reference(frac(r), frac(np.abs(rec["weight"])), frac(np.zeros_like(rec["bias"])), node.attrs,
                         node.out_shape)
    return mid - rad, mid + rad


@SETTINGS
@given(st.data())
def test_conv_over_a_ball_is_the_exact_range_up_to_rounding(data):
    node, in_shape, rec = draw_conv_case(data, "conv")
    rng = np.random.default_rng(data.draw(st.integers(0, 2 ** 16)))
    c = rng.uniform(-3, 3, size=in_shape)
    eps = data.draw(st.sampled_from([0.0, 1e-3, 0.25, 2.0]))
    lo, hi = c - eps, c + eps
    out = INTERVAL_RULES["conv"](node, [(lo, hi)], rec)
    cc = lo * 0.5 + hi * 0.5
    r = np.maximum(hi - cc, cc - lo)  # the float center-radius of the box covers it exactly
    exact_lo, exact_hi = _exact_range(node, rec, cc, r)
    got_lo, got_hi = frac(out[0]), frac(out[1])
    assert np.all(got_lo <= exact_lo) and np.all(exact_hi <= got_hi)
    # only rounding allowances: relative 1e-12 of the terms summed, |c| bounded by its maximum
    size = conv_reference(frac(np.full(cc.shape, np.max(np.abs(cc), initial=0.0)) + r), frac(np.abs(rec["weight"])), frac(np.abs(rec["bias"])), node.attrs,
                          node.out_shape)
    slack = np.asarray((exact_lo - got_lo) + (got_hi - exact_hi), dtype=object)
    assert np.all(slack <= size * Fraction(1, 10 ** 12) + Fraction(1, 2 ** 1000))


def _ill_conditioned_stable_net(seed: int, scale: float = 1e6):
    """A 3-6-6-2 ReLU net whose units are all active on [-1, 1]^3 (so it is affine there and CROWN is
    exact) with rows of large cancelling weights: the float products err far more than the range."""
    rng = np.random.default_rng(seed)
    w1 = rng.normal(size=(6, 3)) * scale
    w2 = rng.normal(size=(6, 6))
    w2[:, 1] = -w2[:, 0] * (1 + rng.normal(size=6) * 1e-7)  # columns 0 and 1 nearly cancel
    w1[1] = w1[0] * (1 + rng.normal(size=3) * 1e-9)
    w3 = rng.normal(size=(2, 6)) * scale
    b1 = np.abs(w1).sum(axis=1) * 2 + 1.0  # every unit positive on the box
    b2 = np.abs(w2) @ (np.abs(w1).sum(axis=1) * 3 + 2) + 1.0
    b3 = rng.normal(size=2)
    return [(w1, b1), (w2, b2), (w3, b3)]


def _affine_range(layers, lo, hi):
    """The exact range over the box [lo, hi] of the composed affine maps, per output (rationals)."""
    w_eff = [[Fraction(int(i == j)) for j in range(lo.size)] for i in range(lo.size)]
    b_eff = [Fraction(0)] * lo.size
    for w, b in layers:
        fw = [[Fraction(v) for v in row] for row in w]
        w_eff = [[sum(fw[i][k] * w_eff[k][j] for k in range(len(w_eff))) for j in range(lo.size)]
                 for i in range(len(fw))]
        b_eff = [sum((fw[i][k] * b_eff[k] for k in range(len(b_eff))), Fraction(b[i])) for i in range(len(fw))]
    c = [(Fraction(a) + Fraction(z)) / 2 for a, z in zip(lo, hi)]
    r = [(Fraction(z) - Fraction(a)) / 2 for a, z in zip(lo, hi)]
    mid = [sum((row[j] * c[j] for j in range(len(c))), b) for row, b in zip(w_eff, b_eff)]
    rad = [sum(abs(row[j]) * r[j] for j in range(len(r))) for row in w_eff]
    return [m - d for m, d in zip(mid, rad)], [m + d for m, d in zip(mid, rad)]


@pytest.mark.parametrize("seed", range(6))
def test_crown_encloses_the_exact_range_of_an_ill_conditioned_net(seed):
    """CROWN's rows of W and products through (linear, relu, linear) carry rigorous error terms: on a net
    where rounding errs by far more than the output range, the bounds still enclose the exact range,
    which is attained, so a missing error term shows (for a batch, grouped passes, and one sample)."""
    from importers.builder import GraphBuilder
    layers = _ill_conditioned_stable_net(seed)
    rng = np.random.default_rng(100 + seed)
    for batch in (1, 3):
        b = GraphBuilder("ill")
        h = b.input((batch, 3))
        for k, (w, bias) in enumerate(layers):
            h = b.add("linear", [h], shape=(batch, w.shape[0]))
            b.param(h, "weight", w, key=f"l{k}.weight")
            b.param(h, "bias", bias, key=f"l{k}.bias")
            if k < len(layers) - 1:
                h = b.add("relu", [h])
        bundle = b.finish([h])
        c = rng.uniform(-0.5, 0.5, (batch, 3))
        lo, hi = c - 0.25, c + 0.25
        res = tlb.linear_bounds(bundle.graph, bundle.payload, lo, hi)
        for s in range(batch):
            exact_lo, exact_hi = _affine_range(layers, lo[s], hi[s])
            for j in range(2):
                assert Fraction(res.lower[0][s, j]) <= exact_lo[j] and exact_hi[j] <= Fraction(res.upper[0][s, j])
