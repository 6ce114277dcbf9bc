"""Interval rules for elementwise unary ops: tight ranges, not codomain shortcuts.

Monotone functions are evaluated at the endpoints (tanh of [a, b] is [tanh a, tanh b], never
[-1, 1]). Non-monotone functions use their true extrema: gelu, silu, mish and hardswish have one
global minimum (location and value precomputed with mpmath to 20 digits; the location is enclosed
with a margin and the value rounded down, so the rule stays sound); sin, cos and tan detect the
peaks or poles inside the box. Point values are enclosed by composing the elementwise interval
arithmetic of ``interval_arith`` with ``lib_bounds`` for library functions, so every result is an
enclosure of the exact real value. A domain violation raises ``DomainError``; the driver turns it
into an ``IntervalError`` naming the node. Monotone ops that floating point computes exactly (relu,
clamp, sign, floor, ceil) are not here: ``interval.py`` applies their float rule to both ends.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping

import numpy as np

from . import interval_arith as ia
from .float_special import erf
from .interval_round import Box, down, lib_bounds, up

__all__ = ["UNARY_RULES", "DomainError", "sigmoid_at", "softplus_at", "exp_at", "log_at", "monotone",
           "join_at_zero"]

PointFn = Callable[[np.ndarray], Box]


class DomainError(ValueError):
    """The box leaves the op's domain (log at <= 0, sqrt of a box below 0, ...)."""


def _const(value: float, ulps: int = 4) -> Box:
    """Enclosure of an irrational constant from its float approximation (a few ulps either way)."""
    lo = hi = np.float64(value)
    for _ in range(ulps):
        lo, hi = down(lo), up(hi)
    return lo, hi


INV_SQRT2 = _const(1.0 / math.sqrt(2.0))
SQRT_2_OVER_PI = _const(math.sqrt(2.0 / math.pi))

# -- point enclosures of library functions -----------------------------------------------------


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


def sigmoid_at(x: np.ndarray) -> Box:
    """1 / (1 + exp(-x)), enclosed step by step."""
    lo, hi = ia.inv(ia.add_const(exp_at(-x), 1.0))
    return np.clip(lo, 0.0, 1.0), np.clip(hi, 0.0, 1.0)


def softplus_at(x: np.ndarray) -> Box:
    """max(x, 0) + log1p(exp(-|x|)): no overflow, no cancellation."""
    tail = monotone(log1p_at, exp_at(-np.abs(x)))
    return ia.add(ia.point(np.maximum(x, 0.0)), tail)


def _gelu_erf_at(x: np.ndarray) -> Box:
    px = ia.point(x)
    t = monotone(erf_at, ia.mul(px, INV_SQRT2))
    return ia.scale(ia.mul(px, ia.add_const(t, 1.0)), 0.5)


def _gelu_tanh_at(x: np.ndarray) -> Box:
    px = ia.point(x)
    cube = ia.mul(ia.mul(px, px), px)
    inner = ia.mul(ia.add(px, ia.scale(cube, 0.044715)), SQRT_2_OVER_PI)
    t = monotone(tanh_at, inner)
    return ia.scale(ia.mul(px, ia.add_const(t, 1.0)), 0.5)


def _silu_at(x: np.ndarray) -> Box:
    return ia.mul(ia.point(x), sigmoid_at(x))


def _mish_at(x: np.ndarray) -> Box:
    return ia.mul(ia.point(x), monotone(tanh_at, softplus_at(x)))


def _hardswish_at(x: np.ndarray) -> Box:
    r6 = ia.add_const(ia.point(x), 3.0)
    r6 = np.clip(r6[0], 0.0, 6.0), np.clip(r6[1], 0.0, 6.0)
    return ia.div(ia.mul(ia.point(x), r6), (np.float64(6.0), np.float64(6.0)))


def _unimodal(f: PointFn, x_star: float, f_min: float) -> Callable[[Box, Mapping[str, Any]], Box]:
    """Functions decreasing up to x_star and increasing after it, with minimum value f_min."""
    margin = 1e-12 * (1.0 + abs(x_star))
    floor = down(np.float64(f_min - 1e-15 * (1.0 + abs(f_min))))

    def rule(a: Box, attrs: Mapping[str, Any]) -> Box:
        lo, hi = a
        f_lo, f_hi = f(lo), f(hi)
        low = np.minimum(f_lo[0], f_hi[0])
        low = np.where((lo <= x_star + margin) & (hi >= x_star - margin), np.minimum(low, floor), low)
        return low, np.maximum(f_lo[1], f_hi[1])

    return rule


def _gelu(a: Box, attrs: Mapping[str, Any]) -> Box:
    if attrs.get("approximate", "none") == "tanh":
        return _GELU_TANH(a, attrs)
    return _GELU_ERF(a, attrs)


_GELU_ERF = _unimodal(_gelu_erf_at, -0.75179152469356445746, -0.16997120747990366169)
_GELU_TANH = _unimodal(_gelu_tanh_at, -0.75246142207101625849, -0.17004075057125405064)

# -- periodic functions ------------------------------------------------------------------------

_TWO_PI = 2.0 * math.pi
_HUGE_ANGLE = 2.0 ** 40  # beyond this we do not trust the phase arithmetic below: [-1, 1]


def _hits(lo: np.ndarray, hi: np.ndarray, phase: float, period: float) -> np.ndarray:
    """Whether phase + k * period may lie in [lo, hi] for an integer k (conservative margin)."""
    with np.errstate(all="ignore"):
        q_lo = (lo - phase) / period
        q_hi = (hi - phase) / period
        eps = 1e-9 + 1e-15 * np.maximum(np.abs(q_lo), np.abs(q_hi))
        return np.ceil(q_lo - eps) <= np.floor(q_hi + eps)


def _trig(fn: Callable[[np.ndarray], np.ndarray], max_phase: float, min_phase: float):
    def rule(a: Box, attrs: Mapping[str, Any]) -> Box:
        lo, hi = a
        e_lo, e_hi = lib_bounds(fn, lo), lib_bounds(fn, hi)
        low, high = np.minimum(e_lo[0], e_hi[0]), np.maximum(e_lo[1], e_hi[1])
        wild = (hi - lo >= _TWO_PI) | (np.abs(lo) > _HUGE_ANGLE) | (np.abs(hi) > _HUGE_ANGLE) \
            | ~np.isfinite(lo) | ~np.isfinite(hi)
        high = np.where(wild | _hits(lo, hi, max_phase, _TWO_PI), 1.0, high)
        low = np.where(wild | _hits(lo, hi, min_phase, _TWO_PI), -1.0, low)
        return np.clip(low, -1.0, 1.0), np.clip(high, -1.0, 1.0)
    return rule


def _tan(a: Box, attrs: Mapping[str, Any]) -> Box:
    lo, hi = a
    pole = (hi - lo >= math.pi) | (np.abs(lo) > _HUGE_ANGLE) | (np.abs(hi) > _HUGE_ANGLE) \
        | ~np.isfinite(lo) | ~np.isfinite(hi) | _hits(lo, hi, math.pi / 2, math.pi)
    low, high = lib_bounds(np.tan, lo)[0], lib_bounds(np.tan, hi)[1]
    return np.where(pole, -np.inf, low), np.where(pole, np.inf, high)

# -- rules with domains ------------------------------------------------------------------------


def _log(a: Box, attrs: Mapping[str, Any]) -> Box:
    if np.any(a[0] <= 0):
        raise DomainError(f"log: box reaches {float(np.min(a[0]))} <= 0, where log is undefined")
    return monotone(log_at, a)


def _log1p(a: Box, attrs: Mapping[str, Any]) -> Box:
    if np.any(a[0] <= -1):
        raise DomainError(f"log1p: box reaches {float(np.min(a[0]))} <= -1, where log1p is undefined")
    return monotone(log1p_at, a)


def sqrt_box(a: Box) -> Box:
    """sqrt on the box clipped to [0, inf) (TorchLean's rule); fails when the box is all negative."""
    if np.any(a[1] < 0):
        raise DomainError(f"sqrt: box lies below 0 (hi = {float(np.min(a[1]))})")
    with np.errstate(all="ignore"):
        return np.maximum(down(np.sqrt(np.maximum(a[0], 0.0))), 0.0), up(np.sqrt(a[1]))


def inv_box(a: Box) -> Box:
    """1/x; where the box contains 0 the float semantics gives +inf at +0 and -inf at -0 (and a
    box [0, b] holds -0 too), so the only sound box there is [-inf, inf]."""
    zero = ia.contains_zero(a)
    with np.errstate(all="ignore"):
        lo, hi = ia.inv((np.where(zero, 1.0, a[0]), np.where(zero, 1.0, a[1])))
    return np.where(zero, -np.inf, lo), np.where(zero, np.inf, hi)


def _rsqrt(a: Box, attrs: Mapping[str, Any]) -> Box:
    s = sqrt_box(a)
    with np.errstate(all="ignore"):
        return down(1.0 / s[1]), up(1.0 / s[0])


def _pow(a: Box, attrs: Mapping[str, Any]) -> Box:
    p = float(attrs["exponent"])
    power = lambda x: lib_bounds(lambda v: np.power(v, p), x)  # noqa: E731
    if p == 0:
        one = np.ones_like(a[0])
        return one, one
    if p == round(p) and abs(p) < 2 ** 53:
        even = int(p) % 2 == 0
        if p < 0 and np.any(ia.contains_zero(a)):
            raise DomainError(f"pow: box contains 0 and the exponent {p} is negative")
        if even:
            m = ia.abs_box(a)
            return monotone(power, m) if p > 0 else decreasing(power, m)
        return monotone(power, a) if p > 0 else decreasing(power, a)
    if np.any(a[1] < 0):
        raise DomainError(f"pow: box lies below 0 and the exponent {p} is not an integer")
    a = np.maximum(a[0], 0.0), a[1]
    if p < 0 and np.any(a[0] == 0):
        raise DomainError(f"pow: box reaches 0 and the exponent {p} is negative")
    lo, hi = monotone(power, a) if p > 0 else decreasing(power, a)
    return np.maximum(lo, 0.0), hi

# -- piecewise and composed rules --------------------------------------------------------------


def _neg_part(a: Box) -> Box:
    return np.minimum(a[0], 0.0), np.minimum(a[1], 0.0)


def join_at_zero(a: Box, tail: Box) -> Box:
    """x for x >= 0 joined to ``tail`` (the box of the x <= 0 piece on the clipped box, tail(0) = 0).
    On a box straddling 0 the range is the hull of the two pieces, not their sum: a tail that is
    positive (negative slope or alpha) would otherwise be added to the positive end."""
    lo, hi = ia.add(ia.relu_box(a), tail)
    straddle = (a[0] < 0) & (a[1] > 0)
    return np.where(straddle, np.minimum(tail[0], 0.0), lo), np.where(straddle, np.maximum(tail[1], a[1]), hi)


def _leaky_relu(a: Box, attrs: Mapping[str, Any]) -> Box:
    return join_at_zero(a, ia.scale(_neg_part(a), attrs["negative_slope"]))


def _elu_with(a: Box, alpha: float, scale: float = 1.0) -> Box:
    out = join_at_zero(a, ia.scale(monotone(expm1_at, _neg_part(a)), alpha))
    return out if scale == 1.0 else ia.scale(out, scale)


_SELU_ALPHA, _SELU_SCALE = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946


def _celu(a: Box, attrs: Mapping[str, Any]) -> Box:
    alpha = float(attrs["alpha"])
    if alpha == 0:
        raise DomainError("celu: alpha must be nonzero")
    inner = ia.div(_neg_part(a), (np.float64(alpha), np.float64(alpha)))
    tail = ia.scale(monotone(expm1_at, inner), alpha)
    return ia.add(ia.relu_box(a), (np.minimum(tail[0], 0.0), np.minimum(tail[1], 0.0)))


def _hardsigmoid(a: Box, attrs: Mapping[str, Any]) -> Box:
    lo, hi = ia.add_const(ia.scale(a, attrs["alpha"]), attrs["beta"])
    return np.clip(lo, 0.0, 1.0), np.clip(hi, 0.0, 1.0)


def _softsign_at(x: np.ndarray) -> Box:
    return ia.div(ia.point(x), ia.add_const(ia.point(np.abs(x)), 1.0))


def _library(fn: Callable[[np.ndarray], np.ndarray]) -> PointFn:
    return lambda x: lib_bounds(fn, x)


def _within(lo: float, hi: float, name: str, rule: Callable[[Box], Box]) -> Callable[[Box, Mapping[str, Any]], Box]:
    """A rule for an op defined on [lo, hi]: a box reaching outside holds inputs the float
    semantics refuses, so it is refused too."""
    def run(a: Box, attrs: Mapping[str, Any]) -> Box:
        if np.any(a[0] < lo) or np.any(a[1] > hi):
            raise DomainError(f"{name}: box reaches outside [{lo}, {hi}], where {name} is undefined")
        return rule(a)
    return run


def _log2(a: Box, attrs: Mapping[str, Any]) -> Box:
    if np.any(a[0] <= 0):
        raise DomainError(f"log2: box reaches {float(np.min(a[0]))} <= 0, where log2 is undefined")
    return monotone(_library(np.log2), a)


def _lifted(f: PointFn):
    return lambda a, attrs: monotone(f, a)


UNARY_RULES: dict[str, Callable[[Box, Mapping[str, Any]], Box]] = {
    "abs": lambda a, attrs: ia.abs_box(a),
    "neg": lambda a, attrs: ia.neg(a),
    "sqrt": lambda a, attrs: sqrt_box(a),
    "inv": lambda a, attrs: inv_box(a),
    "rsqrt": _rsqrt,
    "exp": _lifted(exp_at),
    "expm1": _lifted(expm1_at),
    "log": _log,
    "log1p": _log1p,
    "tanh": _lifted(tanh_at),
    "sigmoid": _lifted(sigmoid_at),
    "softplus": _lifted(softplus_at),
    "erf": _lifted(erf_at),
    "softsign": _lifted(_softsign_at),
    "sin": _trig(np.sin, math.pi / 2, -math.pi / 2),
    "cos": _trig(np.cos, 0.0, math.pi),
    "tan": _tan,
    "gelu": _gelu,
    "silu": _unimodal(_silu_at, -1.2784645427610737951, -0.27846454276107379511),
    "mish": _unimodal(_mish_at, -1.1924312145154952121, -0.30884341301725040663),
    "hardswish": _unimodal(_hardswish_at, -1.5, -0.375),
    "leaky_relu": _leaky_relu,
    "elu": lambda a, attrs: _elu_with(a, float(attrs["alpha"])),
    "selu": lambda a, attrs: _elu_with(a, _SELU_ALPHA, _SELU_SCALE),
    "celu": _celu,
    "hardsigmoid": _hardsigmoid,
    "pow": _pow,
    "exp2": _lifted(_library(np.exp2)),
    "log2": _log2,
    "atan": _lifted(_library(np.arctan)),
    "sinh": _lifted(_library(np.sinh)),
    "asinh": _lifted(_library(np.arcsinh)),
    "cosh": lambda a, attrs: monotone(_library(np.cosh), ia.abs_box(a)),
    "asin": _within(-1.0, 1.0, "asin", lambda a: monotone(_library(np.arcsin), a)),
    "acos": _within(-1.0, 1.0, "acos", lambda a: decreasing(_library(np.arccos), a)),
    "atanh": _within(-1.0, 1.0, "atanh", lambda a: monotone(_library(np.arctanh), a)),
    "acosh": _within(1.0, np.inf, "acosh", lambda a: monotone(_library(np.arccosh), a)),
}
