"""Elementwise interval arithmetic with outward rounding (the building blocks of every rule).

Each function takes and returns boxes ``(lo, hi)`` of float64 arrays of one shape and encloses the
exact real result for every real point of the operand boxes. The ``*_at`` functions enclose a library
function's exact value at float points (``lib_bounds``'s ulp assumption); ``monotone`` and
``decreasing`` lift them to boxes. A box leaving an op's domain raises ``DomainError``, which the
evaluator turns into an ``IntervalError`` naming the node.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from .arena import result_array
from .float_special import erf
from .interval_round import Box, CleanBox, all_finite, clean, down, down_, lib_bounds, up, up_
from .scratch import scratch
from .signed_parts import positive_part

__all__ = ["point", "add", "sub", "neg", "mul", "corner_extremes", "scale", "add_const", "div", "inv", "square",
           "abs_box", "max_box", "min_box", "relu_box", "contains_zero", "divide_exact", "DomainError",
           "enclose_constant", "exp_at", "expm1_at", "log_at", "log1p_at", "tanh_at", "erf_at", "library_at",
           "monotone", "decreasing", "ERF_ABS_ERROR"]

PointFn = Callable[[np.ndarray], Box]


class DomainError(ValueError):
    """The box leaves the op's domain (log at <= 0, sqrt of a box below 0, ...)."""


def point(x: np.ndarray) -> Box:
    x = np.asarray(x, dtype=np.float64)
    return x, x


def add(a: Box, b: Box) -> Box:
    with np.errstate(all="ignore"):
        return _outward_ends(_into(np.add, a[0], b[0]), _into(np.add, a[1], b[1]))


def sub(a: Box, b: Box) -> Box:
    with np.errstate(all="ignore"):
        return _outward_ends(_into(np.subtract, a[0], b[1]), _into(np.subtract, a[1], b[0]))


def _outward_ends(lo: np.ndarray, hi: np.ndarray) -> Box:
    """``(down(lo), up(hi))`` of ends just computed here; when both are finite float64 arrays (one
    reduction each), rounded in place without further checks and known to be clean."""
    if (isinstance(lo, np.ndarray) and isinstance(hi, np.ndarray) and lo.ndim and hi.ndim
            and lo.dtype == hi.dtype == np.float64 and all_finite(lo) and all_finite(hi)):
        return CleanBox((down_(lo, finite=True), up_(hi, finite=True)))
    return clean(_down(lo), _up(hi))


def _into(ufunc: np.ufunc, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``ufunc(x, y)``, into result memory (``arena.result_array``) when both are float64 arrays."""
    if isinstance(x, np.ndarray) and isinstance(y, np.ndarray) and x.dtype == y.dtype == np.float64:
        return ufunc(x, y, out=result_array(np.broadcast_shapes(x.shape, y.shape)))
    return ufunc(x, y)


def _down(x: np.ndarray) -> np.ndarray:
    """``down`` of a result just computed here: in place when it is a float64 array."""
    return down_(x) if isinstance(x, np.ndarray) and x.ndim and x.dtype == np.float64 else down(x)


def _up(x: np.ndarray) -> np.ndarray:
    return up_(x) if isinstance(x, np.ndarray) and x.ndim and x.dtype == np.float64 else up(x)


def neg(a: Box) -> Box:
    return -a[1], -a[0]


def mul(a: Box, b: Box) -> Box:
    """Product by the four endpoint products (0 * inf counts as 0: operands are real numbers).
    Float64 arrays take the products in scratch memory and the NaN scan (nan_to_num copies every
    product: half the time of an attention block's IBP) only when a product is not finite."""
    ends = (*a, *b)
    if all(isinstance(e, np.ndarray) and e.dtype == np.float64 for e in ends):
        shape = np.broadcast_shapes(*(e.shape for e in ends))
        if shape:
            return _mul_arrays(a, b, shape)
    with np.errstate(all="ignore"):
        return _mul_corners([x * y for x in a for y in b])


def _mul_corners(p: list[np.ndarray]) -> Box:
    p = [np.nan_to_num(q, nan=0.0, posinf=np.inf, neginf=-np.inf) for q in p]
    lo = np.minimum(np.minimum(p[0], p[1]), np.minimum(p[2], p[3]))
    hi = np.maximum(np.maximum(p[0], p[1]), np.maximum(p[2], p[3]))
    return down(lo), up(hi)


def _mul_arrays(a: Box, b: Box, shape: tuple[int, ...]) -> Box:
    lo, hi = result_array(shape), result_array(shape)
    if not corner_extremes(a, b, lo, hi):
        with np.errstate(all="ignore"):
            return _mul_corners([x * y for x in a for y in b])
    return CleanBox((down_(lo, finite=True), up_(hi, finite=True)))


def corner_extremes(a: Box, b: Box, lo: np.ndarray, hi: np.ndarray, check: bool = True) -> bool:
    """The smallest and largest of the four endpoint products of float64 boxes a and b (broadcast to
    ``lo``'s shape), unrounded, into ``lo`` and ``hi``: each is the rounded exact extreme (rounding is
    monotone). False, with ``lo`` and ``hi`` undefined, when a product is not finite (0 * inf, overflow):
    the caller takes its careful path. The products live in scratch memory. ``check=False`` leaves that
    test to the caller: a NaN or infinite product then reaches ``lo`` or ``hi`` (minimum and maximum
    propagate NaN; +inf is a largest, -inf a smallest product)."""
    with np.errstate(all="ignore"):
        p = [np.multiply(x, y, out=scratch(f"ia.corner.{k}", lo.shape)) for k, (x, y) in
             enumerate((x, y) for x in a for y in b)]
        if check and not all(all_finite(q) for q in p):
            return False
        np.minimum(p[0], p[1], out=lo)
        np.maximum(p[0], p[1], out=hi)
        np.minimum(lo, np.minimum(p[2], p[3], out=p[0]), out=lo)
        np.maximum(hi, np.maximum(p[2], p[3], out=p[1]), out=hi)
    return True


def scale(a: Box, k) -> Box:
    """Multiplication by exact float constants k (broadcastable)."""
    if isinstance(k, float) and k > 0 and math.isfinite(k):  # order kept; 0 * inf cannot occur
        with np.errstate(all="ignore"):
            return down(a[0] * k), up(a[1] * k)
    k = np.asarray(k, dtype=np.float64)
    with np.errstate(all="ignore"):
        x, y = a[0] * k, a[1] * k
        x = np.where(k == 0, 0.0, x)
        y = np.where(k == 0, 0.0, y)
        return down(np.minimum(x, y)), up(np.maximum(x, y))


def add_const(a: Box, k) -> Box:
    k = np.asarray(k, dtype=np.float64)
    with np.errstate(all="ignore"):
        return clean(down(a[0] + k), up(a[1] + k))


def contains_zero(a: Box) -> np.ndarray:
    return (a[0] <= 0) & (a[1] >= 0)


def inv(a: Box) -> Box:
    """1 / a for boxes not containing 0 (callers handle 0)."""
    with np.errstate(all="ignore"):
        return down(1.0 / a[1]), up(1.0 / a[0])


def div(a: Box, b: Box) -> Box:
    """a / b by the endpoint quotients, for b not containing 0 (callers check and raise). Where every
    divisor is positive the quotient grows with a (negative: shrinks), so each end needs the quotients
    of one end of a only, two of the four, and their extreme is that of the four (rounding is monotone)."""
    with np.errstate(all="ignore"):
        if np.all(b[0] > 0):
            lo, hi = np.minimum(a[0] / b[0], a[0] / b[1]), np.maximum(a[1] / b[0], a[1] / b[1])
        elif np.all(b[1] < 0):
            lo, hi = np.minimum(a[1] / b[0], a[1] / b[1]), np.maximum(a[0] / b[0], a[0] / b[1])
        else:
            q = [x / y for x in a for y in b]
            lo = np.minimum(np.minimum(q[0], q[1]), np.minimum(q[2], q[3]))
            hi = np.maximum(np.maximum(q[0], q[1]), np.maximum(q[2], q[3]))
        return clean(down(lo), up(hi))


def abs_box(a: Box) -> Box:
    lo, hi = a
    m = np.maximum(-lo, hi)
    return np.where(lo > 0, lo, np.where(hi < 0, -hi, 0.0)), m


def square(a: Box) -> Box:
    """x * x with the dependency kept: never negative."""
    m_lo, m_hi = abs_box(a)
    with np.errstate(all="ignore"):
        return np.maximum(down(m_lo * m_lo), 0.0), up(m_hi * m_hi)


def max_box(a: Box, b: Box) -> Box:
    return np.maximum(a[0], b[0]), np.maximum(a[1], b[1])


def min_box(a: Box, b: Box) -> Box:
    return np.minimum(a[0], b[0]), np.minimum(a[1], b[1])


def relu_box(a: Box) -> Box:
    return positive_part(a[0]), positive_part(a[1])


def divide_exact(a: Box, d) -> Box:
    """Division by positive exact floats (counts, divisors), outward rounded."""
    with np.errstate(all="ignore"):
        return down(a[0] / d), up(a[1] / d)

# -- point enclosures of library functions -----------------------------------------------------


def enclose_constant(value: float, ulps: int = 4) -> Box:
    """Enclosure of an irrational constant from its float approximation (a few ulps either way)."""
    lo = hi = np.float64(value)
    for _ in range(ulps):
        lo, hi = down(lo), up(hi)
    return lo, hi


def library_at(fn: Callable[[np.ndarray], np.ndarray]) -> PointFn:
    return lambda x: lib_bounds(fn, x)


def exp_at(x: np.ndarray) -> Box:
    lo, hi = lib_bounds(np.exp, x)
    return np.maximum(lo, 0.0), hi


def expm1_at(x: np.ndarray) -> Box:
    lo, hi = lib_bounds(np.expm1, x)
    return np.maximum(lo, -1.0), hi


def log_at(x: np.ndarray) -> Box:
    return lib_bounds(np.log, x)


def log1p_at(x: np.ndarray) -> Box:
    return lib_bounds(np.log1p, x)


def tanh_at(x: np.ndarray) -> Box:
    lo, hi = lib_bounds(np.tanh, x)
    return np.clip(lo, -1.0, 1.0), np.clip(hi, -1.0, 1.0)


# Error budget of the vectorized ``float_special.erf`` (binary64 Taylor table), added to the LIB_ULPS
# widening: its documented maximum error is 2.3e-16 relative (so absolute, |erf| <= 1) against
# math.erf; against mpmath at 40 digits we measured at most 1.5 ulps (1.1e-16 absolute) on 49k points
# (uniform on [-7, 7], near 0, down to 1e-300, interval ends and their neighbours). Subtracting it
# rounds by at most half a spacing (<= 1.2e-16 for |erf| <= 1), so the margin stays above 8.8e-16.
ERF_ABS_ERROR = 1e-15


def erf_at(x: np.ndarray) -> Box:
    lo, hi = lib_bounds(erf, x)
    lo -= ERF_ABS_ERROR
    hi += ERF_ABS_ERROR
    return np.clip(lo, -1.0, 1.0), np.clip(hi, -1.0, 1.0)


def monotone(f: PointFn, a: Box) -> Box:
    """Range of a non-decreasing function: lower end at lo, upper end at hi."""
    return f(a[0])[0], f(a[1])[1]


def decreasing(f: PointFn, a: Box) -> Box:
    return f(a[1])[0], f(a[0])[1]
