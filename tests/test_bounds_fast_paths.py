"""The fast paths of the bound computations are as sound and as tight as the general ones.

The interval convolution runs over the whole batch in center-radius form and, for an input radius
that is uniform per sample (an l-inf ball), replaces the radius GEMM by max(r) times the in-bounds
sums of |W| (cached per input shape). Checked in exact rational arithmetic: every output box
encloses the exact range W c + b +- |W| r, and exceeds it by rounding allowances only.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

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
