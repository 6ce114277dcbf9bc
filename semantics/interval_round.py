"""Directed rounding for float64 interval endpoints.

Every box endpoint is a float64 that bounds an *exact real* value. IEEE +, -, *, / and sqrt are
correctly rounded, so moving their round-to-nearest result one step outward (``np.nextafter``) is a
sound bound, overflow included (an exact value that rounds to +inf is above the largest float).
Sums and dot products go through BLAS or pairwise summation in an unknown order; for those we use
the order-independent bound ``|fl(sum) - sum| <= gamma_{n-1} * sum |x_i|`` with
``gamma_n = n u / (1 - n u)`` and ``u = 2**-53`` (Higham, Accuracy and Stability, Thm 3.1 / 4.3),
plus an underflow term of one smallest subnormal per product. Library transcendentals
(exp, log, tanh, erf, sin, ...) are not correctly rounded; we assume at most ``LIB_ULPS`` ulps of
error (glibc and NumPy's SIMD loops document 1-4 ulps for float64) and widen by twice that many
spacings of the computed value, which also covers an exact value lying in the next binade.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

__all__ = ["U", "TINY", "LIB_ULPS", "Box", "down", "up", "gamma", "clean", "lib_bounds", "sum_bounds",
           "sum_nonneg_bounds", "center_radius", "dot_radius"]

Box = tuple[np.ndarray, np.ndarray]

U = 2.0 ** -53          # unit roundoff of binary64
TINY = 2.0 ** -1074     # smallest subnormal: absolute error of one product that underflows
LIB_ULPS = 4            # assumed maximal error of a library transcendental, in ulps

_NEG, _POS = -np.inf, np.inf
_MAX = np.finfo(np.float64).max


def down(x: np.ndarray) -> np.ndarray:
    """A float at or below the predecessor of a correctly rounded result: a lower bound of the exact
    value. Arrays use ``x - max(|x| 2**-52, TINY)`` (at most one extra ulp, ~8x faster than
    ``np.nextafter``: the step is at least the spacing below x, so the rounded difference is at most
    the predecessor); +inf becomes the largest float, since an exact real value is finite."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim == 0:
        return np.nextafter(x, _NEG)
    step = _step(x)
    np.subtract(x, step, out=step)
    return np.minimum(step, _MAX, out=step)


def up(x: np.ndarray) -> np.ndarray:
    """A float at or above the successor of a correctly rounded result (see ``down``)."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim == 0:
        return np.nextafter(x, _POS)
    step = _step(x)
    np.add(x, step, out=step)
    return np.maximum(step, -_MAX, out=step)


def _step(x: np.ndarray) -> np.ndarray:
    step = np.abs(x)
    np.minimum(step, _MAX, out=step)  # keeps the step finite for infinite x
    step *= 2.0 ** -52
    return np.maximum(step, TINY, out=step)


def gamma(n: int) -> float:
    """An upper bound of ``gamma_n / (1 - gamma_n)``, the relative error factor we apply to a
    computed (not exact) absolute sum; the 1.01 factor absorbs this function's own rounding."""
    n = max(int(n), 1)
    g = n * U / (1.0 - n * U)
    return 1.01 * g / (1.0 - g)


def clean(lo: np.ndarray, hi: np.ndarray) -> Box:
    """NaN endpoints (from inf - inf, 0 * inf) become the trivially sound -inf / +inf."""
    lo = np.where(np.isnan(lo), _NEG, lo)
    hi = np.where(np.isnan(hi), _POS, hi)
    return lo, hi


def lib_bounds(fn: Callable[[np.ndarray], np.ndarray], x: np.ndarray) -> Box:
    """Enclosure of a library function's exact value at the points x (``LIB_ULPS`` assumption)."""
    with np.errstate(all="ignore"):
        y = fn(x)
        # an overflowed result still bounds from one side; from the other, start at the largest float
        finite = np.where(np.isinf(y), np.copysign(_MAX, y), y)
        step = (2 * LIB_ULPS) * np.abs(np.spacing(finite))
        lo = np.where(y == _NEG, _NEG, down(finite - step))
        hi = np.where(y == _POS, _POS, up(finite + step))
        return clean(lo, hi)


def sum_nonneg_bounds(total: np.ndarray, n: int) -> Box:
    """Bounds of an exact sum of n non-negative floats from its computed value."""
    g = gamma(n)
    with np.errstate(all="ignore"):
        return np.maximum(down(total * (1.0 - g) - n * TINY), 0.0), up(total * (1.0 + g))


def sum_bounds(lo: np.ndarray, hi: np.ndarray, axis) -> Box:
    """Sum of boxes over axis (int or tuple): exact-sum bounds under any summation order."""
    axes = axis if isinstance(axis, tuple) else (axis,)
    n = int(np.prod([lo.shape[a] for a in axes])) if lo.ndim else 1
    g = gamma(max(n - 1, 1))
    with np.errstate(all="ignore"):
        s_lo, s_hi = lo.sum(axis=axis), hi.sum(axis=axis)
        e_lo = up(np.abs(lo).sum(axis=axis) * g)
        e_hi = up(np.abs(hi).sum(axis=axis) * g)
        return clean(down(s_lo - e_lo), up(s_hi + e_hi))


def center_radius(lo: np.ndarray, hi: np.ndarray) -> Box:
    """A float center c and radius r with [c - r, c + r] containing [lo, hi] exactly."""
    with np.errstate(all="ignore"):
        c = lo * 0.5 + hi * 0.5
        c = np.where(np.isfinite(c), c, 0.0)
        r = np.maximum(up(hi - c), up(c - lo))
        return c, r


def dot_radius(abs_dot: Callable[[np.ndarray], np.ndarray], c: np.ndarray, r: np.ndarray, n: int) -> np.ndarray:
    """Radius covering both the input radius and the rounding of the center product.

    For y = A c (+ b) computed in floating point with n terms per output: the exact image of
    [c - r, c + r] lies within fl(A c) +- (|A| r + gamma_n |A| |c|). ``abs_dot(v)`` must compute
    ``|A| v`` in floating point; its own rounding is covered by the factor (1 + gamma_n).
    """
    g = gamma(n)
    with np.errstate(all="ignore"):
        v = up(r + up(g * np.abs(c)))
        t = abs_dot(v)
        return up(up(t * (1.0 + g)) + (2 * n + 2) * TINY)
