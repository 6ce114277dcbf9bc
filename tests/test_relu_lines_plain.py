"""``relu_lines`` at slope 0 takes a shorter path (``_plain_relu_lines``): bit for bit the general rule's
lines on boxes of every kind (stable, unstable, degenerate, signed zeros, subnormal and huge ends)."""

from __future__ import annotations

import numpy as np
import pytest

from semantics.linear_bounds.relax import relu_lines


def _boxes(rng: np.random.Generator, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    special = np.array([0.0, -0.0, 5e-324, -5e-324, 2.0 ** -1022, -(2.0 ** -1022), 1e-300, -1e-300,
                        1e300, -1e300, 1.7e308, -1.7e308, 0.5, -0.5, 1.0, -1.0])
    a = rng.standard_normal(shape) * 10.0 ** rng.integers(-8, 8, shape)
    b = rng.standard_normal(shape) * 10.0 ** rng.integers(-8, 8, shape)
    for x in (a, b):
        pick = rng.random(shape) < 0.3
        x[pick] = special[rng.integers(0, len(special), int(pick.sum()))]
    same = rng.random(shape) < 0.1
    b[same] = a[same]  # degenerate boxes
    return np.minimum(a, b), np.maximum(a, b)


@pytest.mark.parametrize("shape", [(1,), (7,), (64, 256), (3, 4, 5)])
def test_plain_relu_lines_are_the_general_rules_bit_for_bit(shape):
    rng = np.random.default_rng(sum(shape))
    lo, hi = _boxes(rng, shape)
    fast = relu_lines(lo, hi, 0.0)
    general = relu_lines(lo, hi, np.zeros(shape))  # an array slope takes the general rule
    for got, want in zip(fast, general):
        assert got.shape == want.shape and got.dtype == want.dtype == np.float64
        assert np.array_equal(got.view(np.int64), want.view(np.int64))


def test_plain_relu_lines_enclose_relu():
    """Soundness on its own terms: a_l z + b_l <= relu(z) <= a_u z + b_u at points of each box, in exact
    rationals."""
    from fractions import Fraction
    rng = np.random.default_rng(5)
    lo = rng.uniform(-2, 1, 200)
    hi = lo + rng.uniform(0, 3, 200)
    a_l, b_l, a_u, b_u = relu_lines(lo, hi, 0.0)
    for i in range(200):
        for t in (0.0, 0.25, 0.5, 1.0):
            z = Fraction(lo[i]) + Fraction(t) * (Fraction(hi[i]) - Fraction(lo[i]))
            f = max(z, Fraction(0))
            assert Fraction(a_l[i]) * z + Fraction(b_l[i]) <= f <= Fraction(a_u[i]) * z + Fraction(b_u[i])
