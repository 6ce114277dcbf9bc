"""Directed rounding for float64 interval endpoints.

Every box endpoint is a float64 that bounds an *exact real* value. IEEE +, -, *, / and sqrt are
correctly rounded, so moving their round-to-nearest result outward by at least one ulp (``down`` /
``up``: ``np.nextafter`` for scalars, a cheaper ``x -+ (|x| 2**-52 + 2**-1022)`` for arrays, which
moves at least as far) is a sound bound, overflow included (an exact value that rounds to +inf is
above the largest float). Sums and dot products go through BLAS or pairwise summation in an
unknown order; for those we use the order-independent bound
``|fl(sum) - sum| <= gamma_{n-1} * sum |x_i|`` with ``gamma_n = n u / (1 - n u)`` and ``u = 2**-53``
(Higham, Accuracy and Stability of Numerical Algorithms, Lemma 3.1 and section 3.1; it holds for
any order, with or without FMA), plus an underflow allowance of one smallest normal number.
Library transcendentals (exp, log, tanh, erf, sin, ...) are not correctly rounded; we assume at
most ``LIB_ULPS`` = 4 ulps of error (glibc's libm-test-ulps and NumPy's float64 SIMD loops stay
within 1-4 ulps) and widen by twice that many spacings of the computed value, which also covers
an exact value lying in the next binade.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from .scratch import scratch

__all__ = ["U", "TINY", "LIB_ULPS", "Box", "down", "up", "down_", "up_", "gamma", "clean", "lib_bounds", "sum_bounds",
           "sum_nonneg_bounds", "spacings", "widen", "widen_end", "WIDEN_FLOOR", "center_radius", "dot_radius",
           "up_exact_zero", "CleanBox", "all_finite", "any_nan"]

Box = tuple[np.ndarray, np.ndarray]


class CleanBox(tuple):
    """A box ``clean`` returned: two float64 arrays without NaN, so the domain need not look again."""


def all_finite(x: np.ndarray) -> bool:
    """Whether every entry is finite, from one reduction (a sum is NaN or infinite whenever an entry
    is, or when the sum overflows: then the caller takes its careful path, which is still right)."""
    return math.isfinite(np.add.reduce(x, axis=None))


def any_nan(x: np.ndarray) -> bool:
    """Whether some entry may be NaN, from one reduction (never False when one is)."""
    return math.isnan(np.add.reduce(x, axis=None))

U = 2.0 ** -53          # unit roundoff of binary64
TINY = 2.0 ** -1074     # smallest subnormal: absolute error of one product that underflows
MIN_NORMAL = 2.0 ** -1022
LIB_ULPS = 4            # assumed maximal error of a library transcendental, in ulps

_NEG, _POS = -np.inf, np.inf
_MAX = float(np.finfo(np.float64).max)


def down(x: np.ndarray) -> np.ndarray:
    """A float at or below the predecessor of a correctly rounded result: a lower bound of the exact
    value. Arrays use ``x - (|x| 2**-52 + 2**-1022)`` (about 10x faster than ``np.nextafter``, at most
    one extra ulp): the step exceeds the spacing below x, so the rounded difference is at most the
    predecessor. ``down(+inf)`` is the largest float (an exact real value is finite); NaN stays NaN
    (``clean`` turns it into the trivial bound)."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim == 0:
        return np.nextafter(x, _NEG)
    return _outward(x, _step(x), -1.0)


def up(x: np.ndarray) -> np.ndarray:
    """A float at or above the successor of a correctly rounded result (see ``down``)."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim == 0:
        return np.nextafter(x, _POS)
    return _outward(x, _step(x), 1.0)


def down_(x: np.ndarray, finite: bool = False) -> np.ndarray:
    """``down`` in place, for a float64 array the caller has just computed and owns (its step lives
    in a scratch buffer, so a rule's result costs one fresh array, not three). ``finite``: the caller
    has checked that every entry is finite."""
    return _outward(x, _step(x, scratch("round.step", x.shape)), -1.0, out=x, finite=finite)


def up_(x: np.ndarray, finite: bool = False) -> np.ndarray:
    """``up`` in place (see ``down_``)."""
    return _outward(x, _step(x, scratch("round.step", x.shape)), 1.0, out=x, finite=finite)


def _outward(x: np.ndarray, step: np.ndarray, direction: float, out: np.ndarray | None = None,
             finite: bool = False) -> np.ndarray:
    """``x -+ step`` into ``out`` (default: into ``step``; may be ``x`` itself), an infinite ``x`` on the
    inner side becoming the largest float (an exact real value is finite; inf - inf would be NaN)."""
    inner = None
    if not finite and not all_finite(x):  # one reduction, no mask, in the common all-finite case
        inner = np.isposinf(x) if direction < 0 else np.isneginf(x)
    out = step if out is None else out
    if direction < 0:
        np.subtract(x, step, out=out)
    else:
        np.add(x, step, out=out)
    if inner is not None:
        out[inner] = _MAX * -direction
    return out


def _step(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    # 2**-1022 (smallest normal) rather than the smallest subnormal: covers zero and subnormal x,
    # and keeps denormal operands (slow on x86) out of the arithmetic
    step = np.abs(x, out=out)
    step *= 2.0 ** -52
    step += MIN_NORMAL
    return step


def gamma(n: int) -> float:
    """An upper bound of ``gamma_n / (1 - gamma_n)``, the relative error factor we apply to a
    computed (not exact) absolute sum; the 1.01 factor absorbs this function's own rounding."""
    n = max(int(n), 1)
    g = n * U / (1.0 - n * U)
    return 1.01 * g / (1.0 - g)


def clean(lo: np.ndarray, hi: np.ndarray) -> Box:
    """NaN endpoints (from inf - inf, 0 * inf) become the trivially sound -inf / +inf."""
    with np.errstate(all="ignore"):
        # one cheap reduction first: a sum is NaN whenever an entry is (or inf - inf occurs)
        if any_nan(lo):
            lo = np.where(np.isnan(lo), _NEG, lo)
        if any_nan(hi):
            hi = np.where(np.isnan(hi), _POS, hi)
    if isinstance(lo, np.ndarray) and isinstance(hi, np.ndarray) and lo.dtype == hi.dtype == np.float64:
        return CleanBox((lo, hi))
    return lo, hi


_EXPONENT_BITS = np.int64(0x7FF0000000000000)
_MIN_NORMAL_BITS = np.int64(0x0010000000000000)


def spacings(y: np.ndarray, count: int) -> np.ndarray:
    """``count`` spacings of each finite float64 y, exactly, as a new flat array: 2**e 2**-52 count with
    2**e the power of two y's exponent bits hold (2**-1022 for subnormals and zero, whose spacing is
    2**-1074). Three passes; np.spacing costs 5x the exp whose result it widens."""
    bits = np.bitwise_and(np.ascontiguousarray(y, dtype=np.float64).reshape(-1).view(np.int64), _EXPONENT_BITS)
    np.maximum(bits, _MIN_NORMAL_BITS, out=bits)
    step = bits.view(np.float64)
    step *= count * 2.0 ** -52  # exact: a power of two times a small integer
    return step


# The absolute part of ``widen``: below every composed enclosure's underflow error (each states its own)
WIDEN_FLOOR = 2.0 ** -1000


def _widen_radius(v: np.ndarray, rel: float, out: np.ndarray) -> np.ndarray:
    t = np.abs(v, out=out)
    t *= rel
    t += WIDEN_FLOOR
    return t


def widen(v: np.ndarray, rel: float) -> Box:
    """v -+ (|v| rel + WIDEN_FLOOR) for the flat float64 array v: the enclosure of a value computed
    within a relative ``rel`` (minus the two roundings of this step, 2**-53 each, which ``rel`` must also
    cover) plus an absolute error below 2**-1000; the ends are new arrays."""
    t = _widen_radius(v, rel, np.empty_like(v))
    return np.subtract(v, t), np.add(v, t, out=t)


def widen_end(v: np.ndarray, rel: float, upper: bool) -> np.ndarray:
    """One end of ``widen(v, rel)``, bit for bit, written over v (which the caller owns): for a box rule
    that keeps only the lower end at the lower ends and the upper end at the upper ends of a monotone
    function, half the work and no fresh array."""
    t = _widen_radius(v, rel, scratch("widen.radius", v.shape))
    return np.add(v, t, out=v) if upper else np.subtract(v, t, out=v)


def lib_bounds(fn: Callable[[np.ndarray], np.ndarray], x: np.ndarray) -> Box:
    """Enclosure of a library function's exact value at the points x (``LIB_ULPS`` assumption).

    y -+ (2 LIB_ULPS + 2) spacings of y: the subtraction's own rounding costs at most one spacing.
    """
    with np.errstate(all="ignore"):
        y = np.asarray(fn(x), dtype=np.float64)
        if not np.isfinite(np.sum(y)):
            # an overflowed result still bounds from one side; from the other start at the largest float
            finite = np.where(np.isinf(y), np.copysign(_MAX, y), y)
            # the spacing at the largest float is the one just inside it
            step = spacings(finite, 2 * LIB_ULPS + 2).reshape(y.shape)
            lo = np.where(y == _NEG, _NEG, finite - step)
            hi = np.where(y == _POS, _POS, finite + step)
            return clean(lo, hi)
        step = spacings(y, 2 * LIB_ULPS + 2).reshape(y.shape)
        return y - step, np.add(y, step, out=step)


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
        c = lo + hi
        c *= 0.5  # any float will do: r is measured from the c we get (inf for huge or infinite ends)
        if not all_finite(c):
            c = np.where(np.isfinite(c), c, 0.0)
        # up(max of the two rounded gaps) is above both exact gaps; a rounded gap is 0 only when
        # lo == c == hi, and that zero is kept exact (see up_exact_zero)
        return c, up_exact_zero(np.maximum(hi - c, c - lo))


def up_exact_zero(x: np.ndarray) -> np.ndarray:
    """``up`` for values that are 0 only when exactly 0 (differences of equal floats, sums of
    non-negative floats). Keeping those zeros (point entries, dead ReLU units) out of the
    subnormal range matters: BLAS slows down badly on subnormal products."""
    return np.where(x == 0, 0.0, up(x))


def dot_radius(abs_dot: Callable[[np.ndarray], np.ndarray], c: np.ndarray, r: np.ndarray, n: int,
               abs_bias: np.ndarray | None = None) -> np.ndarray:
    """Radius covering the input radius and the rounding of the center's affine image.

    For y = A c + b computed as fl(fl(A c) + b), n terms per output counting the bias: the exact
    image of [c - r, c + r] lies within that value +- (|A| r + gamma_n (|A| |c| + |b|) + underflow),
    one smallest normal covering the underflow of up to 2**51 products. ``abs_dot(v)`` must compute
    ``|A| v`` in floating point; its own rounding is covered by the factor (1 + gamma_n).
    """
    g = gamma(n)
    g_up = (1.0 + g) * (1.0 + 4 * U)  # fl(t * g_up) >= t (1 + g) for normal results
    with np.errstate(all="ignore"):
        gc = np.where(c == 0, 0.0, up(g * np.abs(c)))
        v = up_exact_zero(r + gc)
        t = abs_dot(v)
        t *= g_up
        t += MIN_NORMAL
        if abs_bias is not None:
            t += (g * (1.0 + 4 * U)) * abs_bias
        return up(t)
