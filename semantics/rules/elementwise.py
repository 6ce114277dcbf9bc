"""Elementwise arithmetic and math functions, comparisons and logic, each with its interval rule.

Float rules read like spec section 2.2 (v1) or the PyTorch/ONNX definition (ext). Partial operations
never return NaN: they raise ``EvalError`` naming the node (log of a value <= 0, square root of a
negative, division by zero). The one exception is pow of a negative base by a non-integer exponent:
torch, onnxruntime and C's pow (so TorchLean's Float) all answer NaN, and so does the rule; its
interval rule refuses boxes reaching below 0 (no box encloses NaN).

Interval rules: monotone functions at the endpoints (tanh of [a, b] is [tanh a, tanh b], never
[-1, 1]); sin, cos and tan detect the peaks or poles inside the box; library functions are enclosed
by ``lib_bounds``; ops floating point computes exactly (max, min, sign, floor, ...) apply their float
rule to both ends. Bool boxes are 0/1 float boxes: lo = surely true, hi = possibly true.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping

import numpy as np

from .. import interval_arith as ia
from ..interval_arith import DomainError, decreasing, exp_at, expm1_at, library_at, log1p_at, log_at, monotone, \
    tanh_at
from ..interval_round import Box, down, lib_bounds, up
from ..records import fail
from ..folds import libm
from .table import domain_error, exact_rule, float_binary, float_rule, float_unary, interval_pointwise, \
    interval_rule, on_ends, stored_entries

__all__ = ["LOG_DOMAIN_MESSAGE", "sqrt_box", "inv_box"]

LOG_DOMAIN_MESSAGE = ("IR eval: log: input contains values <= 0 (or NaN); use `safe_log`, "
                      "which is log(softplus(x) + eps)")

# -- arithmetic -------------------------------------------------------------------------------

float_binary("add", np.add)
float_binary("sub", np.subtract)
float_binary("mul_elem", np.multiply)


def lean_max(x: np.ndarray, y) -> np.ndarray:
    """Lean core's ``maxOfLe``: ``if x <= y then y else x`` (order-dependent with NaN and signed
    zeros: max(1, NaN) = 1, max(NaN, 1) = NaN; spec section 2.2)."""
    return np.where(x <= y, y, x)


def lean_min(x: np.ndarray, y) -> np.ndarray:
    """``minOfLe``: ``if x <= y then x else y`` (min(NaN, 1) = 1, min(0.0, -0.0) = +0.0)."""
    return np.where(x <= y, x, y)


float_binary("max_elem", lean_max)
float_binary("min_elem", lean_min)
interval_rule("add")(lambda node, ps, rec: ia.add(ps[0], ps[1]))
interval_rule("sub")(lambda node, ps, rec: ia.sub(ps[0], ps[1]))
interval_rule("mul_elem")(lambda node, ps, rec: ia.mul(ps[0], ps[1]))

float_unary("abs", np.abs)
float_unary("neg", np.negative)
float_unary("sign", np.sign)
float_unary("floor", np.floor)
float_unary("ceil", np.ceil)
float_unary("round", np.rint)  # half to even, as torch.round and ONNX Round
float_unary("trunc", np.trunc)
on_ends("max_elem", "min_elem", "sign", "floor", "ceil", "round", "trunc")
interval_pointwise("abs")(lambda a, attrs: ia.abs_box(a))
interval_pointwise("neg")(lambda a, attrs: ia.neg(a))


@float_rule("div")
def div(node, xs, rec, dt):
    if np.any(stored_entries(xs[1]) == 0):
        raise domain_error(node, "division by zero")
    return xs[0] / xs[1]


@interval_rule("div")
def div_box(node, ps, rec):
    if np.any(ia.contains_zero(ps[1])):
        raise DomainError("div: the denominator's box contains 0")
    return ia.div(ps[0], ps[1])


@float_rule("inv")
def inv(node, xs, rec, dt):
    """Spec 2.2: inv(x) = 1/x in IEEE arithmetic, so +-0 gives +-inf (a value, not an error or NaN)."""
    return np.divide(1, xs[0])


@interval_pointwise("inv")
def inv_box(a: Box, attrs: Mapping[str, Any] | None = None) -> Box:
    """1/x; where the box contains 0 the float semantics gives +inf at +0 and -inf at -0 (and a
    box [0, b] holds -0 too), so the only sound box there is [-inf, inf]."""
    zero = ia.contains_zero(a)
    with np.errstate(all="ignore"):
        lo, hi = ia.inv((np.where(zero, 1.0, a[0]), np.where(zero, 1.0, a[1])))
    return np.where(zero, -np.inf, lo), np.where(zero, np.inf, hi)


@float_rule("pow")
def power(node, xs, rec, dt):
    x, e = xs[0], node.attrs["exponent"]
    if e < 0 and np.any(x == 0):
        raise domain_error(node, f"zero raised to the negative power {e}")
    with np.errstate(invalid="ignore"):
        return np.power(x, e)  # a negative base to a non-integer power is NaN, as in torch, onnxruntime and C


@interval_pointwise("pow")
def pow_box(a: Box, attrs: Mapping[str, Any]) -> Box:
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
    if np.any(a[0] < 0):  # the float rule gives NaN there, which no box encloses
        raise DomainError(f"pow: box reaches below 0 and the exponent {p} is not an integer (the value there is NaN)")
    if p < 0 and np.any(a[0] == 0):
        raise DomainError(f"pow: box reaches 0 and the exponent {p} is negative")
    lo, hi = monotone(power, a) if p > 0 else decreasing(power, a)
    return np.maximum(lo, 0.0), hi

# -- exponentials and logarithms --------------------------------------------------------------


def _lifted(kind: str, fn: Callable[[np.ndarray], np.ndarray], enclosure: Callable[[np.ndarray], Box]) -> None:
    """A monotone library function: float rule ``fn``, interval rule ``enclosure`` at both ends."""
    float_unary(kind, fn)
    interval_pointwise(kind)(lambda a, attrs: monotone(enclosure, a))


_lifted("exp", np.exp, exp_at)
_lifted("expm1", np.expm1, expm1_at)
_lifted("exp2", np.exp2, library_at(np.exp2))
_lifted("tanh", np.tanh, tanh_at)
_lifted("atan", np.arctan, library_at(np.arctan))
_lifted("sinh", np.sinh, library_at(np.sinh))
_lifted("asinh", np.arcsinh, library_at(np.arcsinh))
float_unary("cosh", np.cosh)
interval_pointwise("cosh")(lambda a, attrs: monotone(library_at(np.cosh), ia.abs_box(a)))


@float_rule("log")
def log(node, xs, rec, dt):
    x = xs[0]
    if not np.all(x > 0):
        raise fail(node, LOG_DOMAIN_MESSAGE)
    return np.log(x)


for _kind in ("exp", "tanh", "sin", "cos"):
    exact_rule(_kind)((lambda name: lambda node, xs, rec, dt: libm(name, xs[0]))(_kind))


@exact_rule("log")
def log_exact(node, xs, rec, dt):
    if not np.all(xs[0] > 0):
        raise fail(node, LOG_DOMAIN_MESSAGE)
    return libm("log", xs[0])


@interval_pointwise("log")
def log_box(a: Box, attrs: Mapping[str, Any]) -> Box:
    if np.any(a[0] <= 0):
        raise DomainError(f"log: box reaches {float(np.min(a[0]))} <= 0, where log is undefined")
    return monotone(log_at, a)


def _defined_where(kind: str, fn: Callable[[np.ndarray], np.ndarray], inside: Callable[[np.ndarray], np.ndarray],
                   outside: str) -> None:
    """An op defined only where ``inside`` holds: elsewhere its value would be NaN, so the node is
    refused instead (architecture decision 5), naming it and what the input held."""
    @float_rule(kind)
    def run(node, xs, rec, dt):
        if not np.all(inside(xs[0])):
            raise domain_error(node, f"input contains {outside} (or NaN)")
        return fn(xs[0])


_defined_where("log2", np.log2, lambda x: x > 0, "values <= 0")
_defined_where("log1p", np.log1p, lambda x: x > -1, "values <= -1")


@interval_pointwise("log1p")
def log1p_box(a: Box, attrs: Mapping[str, Any]) -> Box:
    if np.any(a[0] <= -1):
        raise DomainError(f"log1p: box reaches {float(np.min(a[0]))} <= -1, where log1p is undefined")
    return monotone(log1p_at, a)


@interval_pointwise("log2")
def log2_box(a: Box, attrs: Mapping[str, Any]) -> Box:
    if np.any(a[0] <= 0):
        raise DomainError(f"log2: box reaches {float(np.min(a[0]))} <= 0, where log2 is undefined")
    return monotone(library_at(np.log2), a)

# -- roots ------------------------------------------------------------------------------------


@float_rule("sqrt")
def sqrt(node, xs, rec, dt):
    """TorchLean's ``sqrtSpec``: ``sqrt(max(x, 0))``, so a negative input (and -0.0) gives +0.0 and
    NaN stays NaN (spec section 2.2, corrected 12-01)."""
    return np.sqrt(lean_max(xs[0], dt.type(0)))


_defined_where("rsqrt", lambda x: 1 / np.sqrt(x), lambda x: x > 0, "values <= 0")


def sqrt_box(a: Box) -> Box:
    """sqrt(max(x, 0)) (TorchLean's ``sqrtSpec``): the box clipped to [0, inf), a box below 0 gives [0, 0]."""
    with np.errstate(all="ignore"):
        return (np.maximum(down(np.sqrt(np.maximum(a[0], 0.0))), 0.0),
                np.where(a[1] <= 0, 0.0, up(np.sqrt(np.maximum(a[1], 0.0)))))


interval_pointwise("sqrt")(lambda a, attrs: sqrt_box(a))


@interval_pointwise("rsqrt")
def rsqrt_box(a: Box, attrs: Mapping[str, Any]) -> Box:
    if np.any(a[1] < 0):
        raise DomainError(f"rsqrt: box lies below 0 (hi = {float(np.min(a[1]))})")
    s = sqrt_box(a)
    with np.errstate(all="ignore"):
        return down(1.0 / s[1]), up(1.0 / s[0])

# -- trigonometric ----------------------------------------------------------------------------


float_unary("sin", np.sin)
float_unary("cos", np.cos)
float_unary("tan", np.tan)

_TWO_PI = 2.0 * math.pi
_HUGE_ANGLE = 2.0 ** 40  # beyond this we do not trust the phase arithmetic below: [-1, 1]


def _hits(lo: np.ndarray, hi: np.ndarray, phase: float, period: float) -> np.ndarray:
    """Whether phase + k * period may lie in [lo, hi] for an integer k (conservative margin)."""
    with np.errstate(all="ignore"):
        q_lo = (lo - phase) / period
        q_hi = (hi - phase) / period
        eps = 1e-9 + 1e-15 * np.maximum(np.abs(q_lo), np.abs(q_hi))
        return np.ceil(q_lo - eps) <= np.floor(q_hi + eps)


def _trig(kind: str, fn: Callable[[np.ndarray], np.ndarray], max_phase: float, min_phase: float) -> None:
    @interval_pointwise(kind)
    def rule(a: Box, attrs: Mapping[str, Any]) -> Box:
        lo, hi = a
        e_lo, e_hi = lib_bounds(fn, lo), lib_bounds(fn, hi)
        low, high = np.minimum(e_lo[0], e_hi[0]), np.maximum(e_lo[1], e_hi[1])
        wild = (hi - lo >= _TWO_PI) | (np.abs(lo) > _HUGE_ANGLE) | (np.abs(hi) > _HUGE_ANGLE) \
            | ~np.isfinite(lo) | ~np.isfinite(hi)
        high = np.where(wild | _hits(lo, hi, max_phase, _TWO_PI), 1.0, high)
        low = np.where(wild | _hits(lo, hi, min_phase, _TWO_PI), -1.0, low)
        return np.clip(low, -1.0, 1.0), np.clip(high, -1.0, 1.0)


_trig("sin", np.sin, math.pi / 2, -math.pi / 2)
_trig("cos", np.cos, 0.0, math.pi)


@interval_pointwise("tan")
def tan_box(a: Box, attrs: Mapping[str, Any]) -> Box:
    lo, hi = a
    pole = (hi - lo >= math.pi) | (np.abs(lo) > _HUGE_ANGLE) | (np.abs(hi) > _HUGE_ANGLE) \
        | ~np.isfinite(lo) | ~np.isfinite(hi) | _hits(lo, hi, math.pi / 2, math.pi)
    low, high = lib_bounds(np.tan, lo)[0], lib_bounds(np.tan, hi)[1]
    return np.where(pole, -np.inf, low), np.where(pole, np.inf, high)


def _within(kind: str, fn: Callable[[np.ndarray], np.ndarray], lo: float, hi: float, increasing: bool) -> None:
    """An op defined on [lo, hi], ends included (atanh(+-1) and acosh's unbounded end are values,
    +-inf, not NaN): a float input or a box reaching outside is refused."""
    outside = f"values below {lo:g}" if hi == math.inf else f"values outside [{lo:g}, {hi:g}]"
    _defined_where(kind, fn, lambda x: (x >= lo) & (x <= hi), outside)
    lift = monotone if increasing else decreasing

    @interval_pointwise(kind)
    def run(a: Box, attrs: Mapping[str, Any]) -> Box:
        if np.any(a[0] < lo) or np.any(a[1] > hi):
            raise DomainError(f"{kind}: box reaches outside [{lo}, {hi}], where {kind} is undefined")
        return lift(library_at(fn), a)


_within("asin", np.arcsin, -1.0, 1.0, True)
_within("acos", np.arccos, -1.0, 1.0, False)
_within("atanh", np.arctanh, -1.0, 1.0, True)
_within("acosh", np.arccosh, 1.0, math.inf, True)

# -- comparisons and logic --------------------------------------------------------------------

for _kind, _fn in (("eq", np.equal), ("ne", np.not_equal), ("lt", np.less), ("le", np.less_equal),
                   ("gt", np.greater), ("ge", np.greater_equal), ("logical_and", np.logical_and),
                   ("logical_or", np.logical_or)):
    float_binary(_kind, _fn)
float_unary("logical_not", np.logical_not)
float_unary("isnan", np.isnan)


def _bools(surely: np.ndarray, possibly: np.ndarray) -> Box:
    return surely.astype(np.float64), possibly.astype(np.float64)


_COMPARE = {
    "lt": lambda a, b: (a[1] < b[0], a[0] < b[1]),
    "le": lambda a, b: (a[1] <= b[0], a[0] <= b[1]),
    "gt": lambda a, b: (a[0] > b[1], a[1] > b[0]),
    "ge": lambda a, b: (a[0] >= b[1], a[1] >= b[0]),
    "eq": lambda a, b: ((a[0] == a[1]) & (b[0] == b[1]) & (a[0] == b[0]), (a[0] <= b[1]) & (b[0] <= a[1])),
    "ne": lambda a, b: ((a[1] < b[0]) | (b[1] < a[0]), ~((a[0] == a[1]) & (b[0] == b[1]) & (a[0] == b[0]))),
}
for _kind, _fn in _COMPARE.items():
    interval_rule(_kind)((lambda f: lambda node, ps, rec: _bools(*f(ps[0], ps[1])))(_fn))

interval_rule("logical_and")(lambda node, ps, rec: ia.min_box(ps[0], ps[1]))
interval_rule("logical_or")(lambda node, ps, rec: ia.max_box(ps[0], ps[1]))
interval_rule("logical_not")(lambda node, ps, rec: (1.0 - ps[0][1], 1.0 - ps[0][0]))


@interval_rule("isnan")
def isnan_box(node, ps, rec):
    """False (the point box 0) where the input box is finite: a box encloses real values, and the
    evaluator makes NaN only from valid input through an overflow to +-inf (inf - inf, 0 * inf),
    which a finite box rules out. An infinite end leaves the answer open: [0, 1]."""
    lo, hi = ps[0]
    return _bools(np.zeros(lo.shape, bool), ~(np.isfinite(lo) & np.isfinite(hi)))

