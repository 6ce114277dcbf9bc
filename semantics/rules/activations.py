"""Activations: relu and its relatives, sigmoid, softplus, safe_log, gelu/erf, silu, mish, hardswish, ...

Interval rules are tight ranges, not codomain shortcuts. Non-monotone functions use their true
extrema: gelu, silu, mish and hardswish have one global minimum (location and value precomputed with
mpmath to 20 digits; the location is enclosed with a margin and the value rounded down, so the rule
stays sound). Point values are enclosed by composing ``interval_arith``'s outward-rounded steps, or
(sigmoid, silu) computed in plain floats and widened once by their derived error (``_POINT_REL``).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping

import numpy as np

from .. import interval_arith as ia
from ..arena import result_array
from ..float_special import erf, gelu32
from ..signed_parts import clip, negative_part, positive_part
from ..interval_arith import DomainError, enclose_constant, erf_at, exp_at, expm1_at, log1p_at, log_at, monotone, \
    tanh_at
from ..interval_round import LIB_ULPS, WIDEN_FLOOR, Box, CleanBox, all_finite, down, widen, widen_end
from ..folds import libm
from .table import exact_rule, float_rule, float_unary, interval_pointwise, interval_rule, on_ends

__all__ = ["sigmoid", "softplus", "sigmoid_at", "softplus_at", "SELU_ALPHA", "SELU_SCALE"]

PointFn = Callable[[np.ndarray], Box]

SELU_ALPHA = 1.6732632423543772848170429916717
SELU_SCALE = 1.0507009873554804934193349852946
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_SQRT_HALF = math.sqrt(0.5)
INV_SQRT2 = enclose_constant(1.0 / math.sqrt(2.0))
SQRT_2_OVER_PI = enclose_constant(_SQRT_2_OVER_PI)

# -- piecewise linear -------------------------------------------------------------------------

@float_rule("relu")
def relu(node, xs, rec, dt):
    """``reluSpec``: ``if x == 0 then 0 else max(x, 0)`` with Lean's max: -0.0 gives +0.0, NaN stays NaN.
    ``positive_part`` keeps NaN and returns either zero; adding +0.0 makes -0.0 +0.0 and changes nothing
    else (the values of ``where(x <= 0, 0, x)``, bit for bit, in a quarter of its time)."""
    zero = dt.type(0)
    y = np.asarray(positive_part(xs[0]))
    y += zero  # in place: one fresh array per call, not two
    return y



@float_rule("clamp")
def clamp(node, xs, rec, dt):
    y, lo, hi = xs[0], node.attrs["min"], node.attrs["max"]
    if lo is not None and hi is not None and np.result_type(y).kind == "f":
        return clip(y, lo, hi)  # one vectorized pass (maximum and minimum against a scalar are not)
    if lo is not None:
        y = np.maximum(y, lo)
    if hi is not None:
        y = np.minimum(y, hi)
    return y


on_ends("clamp", nan_free=False)  # a NaN bound makes NaN


@interval_rule("relu")
def relu_ends(node, ps, rec):
    """max(end, 0) on each end (relu is monotone and exact), into result memory. An end may be -0.0
    where the float rule gives +0.0: the same real number, which is all a box says. The parent's ends
    carry no NaN (the domain cleaned them), so neither do these."""
    lo, hi = (positive_part(end, out=result_array(np.shape(end))) for end in ps[0])
    return CleanBox((lo, hi))


def _neg_part(a: Box) -> Box:
    return negative_part(a[0]), negative_part(a[1])


def join_at_zero(a: Box, tail: Box) -> Box:
    """x for x >= 0 joined to ``tail`` (the box of the x <= 0 piece on the clipped box, tail(0) = 0).
    On a box straddling 0 the range is the hull of the two pieces, not their sum: a tail that is
    positive (negative slope or alpha) would otherwise be added to the positive end."""
    lo, hi = ia.add(ia.relu_box(a), tail)
    straddle = (a[0] < 0) & (a[1] > 0)
    return np.where(straddle, np.minimum(tail[0], 0.0), lo), np.where(straddle, np.maximum(tail[1], a[1]), hi)


@float_rule("leaky_relu")
def leaky_relu(node, xs, rec, dt):
    x = xs[0]
    return np.where(x > 0, x, x * node.attrs["negative_slope"])


@interval_pointwise("leaky_relu")
def leaky_relu_box(a: Box, attrs: Mapping[str, Any]) -> Box:
    return join_at_zero(a, ia.scale(_neg_part(a), attrs["negative_slope"]))


@float_rule("prelu")
def prelu(node, xs, rec, dt):
    x, slope = xs
    return np.where(x >= 0, x, slope * x)


@interval_rule("prelu")
def prelu_box(node, ps, rec):
    x, slope = ps
    return join_at_zero(x, ia.mul(_neg_part(x), slope))


@float_rule("hardsigmoid")
def hardsigmoid(node, xs, rec, dt):
    a = node.attrs
    return np.clip(a["alpha"] * xs[0] + a["beta"], 0, 1)


@interval_pointwise("hardsigmoid")
def hardsigmoid_box(a: Box, attrs: Mapping[str, Any]) -> Box:
    lo, hi = ia.add_const(ia.scale(a, attrs["alpha"]), attrs["beta"])
    return np.clip(lo, 0.0, 1.0), np.clip(hi, 0.0, 1.0)

# -- exponential family -----------------------------------------------------------------------


def sigmoid(x: np.ndarray, exp=np.exp) -> np.ndarray:
    """TorchLean's two branches (Activation.lean @25576b9, spec section 2.2): ``1 / (1 + exp(-x))``
    for x > 0, ``exp(x) / (1 + exp(x))`` otherwise (no overflow to 0 below -709.78; NaN stays NaN)."""
    positive = x > 0
    e = exp(np.where(positive, -x, x))
    return np.where(positive, 1 / (1 + e), e / (1 + e))


# Point enclosures of sigmoid and silu from one exp and two or three correctly rounded steps, widened
# once at the end instead of at every step (step by step cost 6x the exp). With e = exp(-x) from the
# library, |e - E| <= 2 LIB_ULPS spacings of e <= 2 LIB_ULPS 2**-52 e (+ 2 LIB_ULPS 2**-1074), so
# 1 + E = (1 + e)(1 + eta) with |eta| <= 2 LIB_ULPS 2**-52 (+ 2**-1071); d = fl(1 + e) and
# q = fl(1 / d) add 2**-53 each: S = sigmoid(x) = q (1 + theta), |theta| <= (2 LIB_ULPS + 1) 2**-52
# + O(2**-104) while q is normal, and p = fl(x q) adds 2**-53 more. Where q is subnormal or 0
# (x < -708.4), |x| |S - q| <= 745 * 2**-1074 + |x| e**x < 4e-306 < 2**-1000. ``widen`` by
# REL = (2 LIB_ULPS + 4) 2**-52 covers that error and its own two roundings with a spacing to spare.
_POINT_REL = (2 * LIB_ULPS + 4) * 2.0 ** -52
_MAX = float(np.finfo(np.float64).max)


def _sigmoid_point(x: np.ndarray) -> np.ndarray:
    """fl(1 / fl(1 + exp(-x))) flattened: the value the enclosures widen (0 below -709.78, 1 at +inf)."""
    q = np.negative(np.asarray(x, dtype=np.float64).reshape(-1))
    with np.errstate(over="ignore"):
        np.exp(q, out=q)
    q += 1.0
    return np.divide(1.0, q, out=q)


def sigmoid_at(x: np.ndarray) -> Box:
    """sigmoid at the points x, enclosed (see ``_POINT_REL``); clipped to [0, 1]."""
    lo, hi = widen(_sigmoid_point(x), _POINT_REL)
    shape = np.shape(x)
    return np.maximum(lo, 0.0).reshape(shape), np.minimum(hi, 1.0).reshape(shape)


def _sigmoid_end(x: np.ndarray, upper: bool) -> np.ndarray:
    """One end of ``sigmoid_at(x)``, bit for bit (``widen_end``): the box rule needs the lower end at the
    box's lower ends and the upper end at its upper ends."""
    q = widen_end(_sigmoid_point(x), _POINT_REL, upper)
    clip_to = np.minimum if upper else np.maximum
    return clip_to(q, 1.0 if upper else 0.0, out=q).reshape(np.shape(x))


def softplus(x: np.ndarray, exp=np.exp, log=np.log) -> np.ndarray:
    """Spec, sign-branched: ``x + log(1 + exp(-x))`` if ``x > 0``, else ``log(1 + exp(x))``."""
    return np.where(x > 0, x, 0) + log(1 + exp(-np.abs(x)))


def _exp(x: np.ndarray) -> np.ndarray:
    return libm("exp", x)


def _log(x: np.ndarray) -> np.ndarray:
    return libm("log", x)


exact_rule("sigmoid")(lambda node, xs, rec, dt: sigmoid(xs[0], _exp))
exact_rule("softplus")(lambda node, xs, rec, dt: softplus(xs[0], _exp, _log))
exact_rule("safe_log")(lambda node, xs, rec, dt: _log(softplus(xs[0], _exp, _log) + xs[1]))


def softplus_at(x: np.ndarray) -> Box:
    """max(x, 0) + log1p(exp(-|x|)): no overflow, no cancellation."""
    tail = monotone(log1p_at, exp_at(-np.abs(x)))
    return ia.add(ia.point(np.maximum(x, 0.0)), tail)


float_unary("sigmoid", sigmoid)
float_unary("softplus", softplus)
interval_pointwise("sigmoid")(lambda a, attrs: (_sigmoid_end(a[0], False), _sigmoid_end(a[1], True)))
interval_pointwise("softplus")(lambda a, attrs: monotone(softplus_at, a))


@float_rule("safe_log")
def safe_log(node, xs, rec, dt):
    """``log(softplus(x) + eps)`` with no domain check (TorchLean's ``safeLogSpec``): eps <= 0 may
    give -inf or NaN, as in TorchLean."""
    return np.log(softplus(xs[0]) + xs[1])


@interval_rule("safe_log")
def safe_log_box(node, ps, rec):
    x, eps = ps
    s = monotone(softplus_at, x)
    arg = ia.add(s, (np.broadcast_to(eps[0], s[0].shape), np.broadcast_to(eps[1], s[1].shape)))
    if np.any(arg[0] <= 0):
        raise DomainError("safe_log: softplus(x) + eps may be <= 0 (eps box reaches 0 or below)")
    return monotone(log_at, arg)


@float_rule("elu")
def elu(node, xs, rec, dt):
    x = xs[0]
    return np.where(x > 0, x, node.attrs["alpha"] * np.expm1(np.minimum(x, 0)))


float_unary("selu", lambda x: SELU_SCALE * np.where(x > 0, x, SELU_ALPHA * np.expm1(np.minimum(x, 0))))


def _elu_with(a: Box, alpha: float, scale: float = 1.0) -> Box:
    out = join_at_zero(a, ia.scale(monotone(expm1_at, _neg_part(a)), alpha))
    return out if scale == 1.0 else ia.scale(out, scale)


interval_pointwise("elu")(lambda a, attrs: _elu_with(a, float(attrs["alpha"])))
interval_pointwise("selu")(lambda a, attrs: _elu_with(a, SELU_ALPHA, SELU_SCALE))


@float_rule("celu")
def celu(node, xs, rec, dt):
    x, alpha = xs[0], node.attrs["alpha"]
    return np.maximum(x, 0) + np.minimum(0, alpha * np.expm1(np.minimum(x, 0) / alpha))


@interval_pointwise("celu")
def celu_box(a: Box, attrs: Mapping[str, Any]) -> Box:
    alpha = float(attrs["alpha"])
    if alpha == 0:
        raise DomainError("celu: alpha must be nonzero")
    inner = ia.div(_neg_part(a), (np.float64(alpha), np.float64(alpha)))
    tail = ia.scale(monotone(expm1_at, inner), alpha)
    return ia.add(ia.relu_box(a), (np.minimum(tail[0], 0.0), np.minimum(tail[1], 0.0)))


float_unary("softsign", lambda x: x / (1 + np.abs(x)))


def _softsign_at(x: np.ndarray) -> Box:
    return ia.div(ia.point(x), ia.add_const(ia.point(np.abs(x)), 1.0))


interval_pointwise("softsign")(lambda a, attrs: monotone(_softsign_at, a))

# -- gelu, erf and the smooth unimodal activations -------------------------------------------


@float_rule("gelu")
def gelu(node, xs, rec, dt):
    x = xs[0]
    if node.attrs["approximate"] == "tanh":
        return 0.5 * x * (1 + np.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)))
    if x.dtype == np.float32:
        return gelu32(x.reshape(-1)).reshape(x.shape)
    return x * (0.5 * (1 + erf(x * _SQRT_HALF, dt)))


@float_rule("erf")
def erf_(node, xs, rec, dt):
    return erf(xs[0], dt)


interval_pointwise("erf")(lambda a, attrs: monotone(erf_at, a))

float_unary("silu", lambda x: x * sigmoid(x))
float_unary("hardswish", lambda x: x * np.clip(x + 3, 0, 6) / 6)
float_unary("mish", lambda x: x * np.tanh(np.logaddexp(0, x)))


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
    """x sigmoid(x) at the points x, enclosed (see ``_POINT_REL``); an infinite x (whose product with
    sigmoid's 0 or 1 is NaN or infinite) takes its limit, enclosed by the next float."""
    x = np.asarray(x, dtype=np.float64)
    p = _sigmoid_point(x)
    with np.errstate(invalid="ignore"):  # inf * 0
        p *= x.reshape(-1)
        lo, hi = (e.reshape(x.shape) for e in widen(p, _POINT_REL))
    if not all_finite(p):
        lo = np.where(x == np.inf, _MAX, np.where(x == -np.inf, -WIDEN_FLOOR, lo))
        hi = np.where(x == np.inf, np.inf, np.where(x == -np.inf, WIDEN_FLOOR, hi))
    return lo, hi


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


_GELU_ERF = _unimodal(_gelu_erf_at, -0.75179152469356445746, -0.16997120747990366169)
_GELU_TANH = _unimodal(_gelu_tanh_at, -0.75246142207101625849, -0.17004075057125405064)


@interval_pointwise("gelu")
def gelu_box(a: Box, attrs: Mapping[str, Any]) -> Box:
    if attrs.get("approximate", "none") == "tanh":
        return _GELU_TANH(a, attrs)
    return _GELU_ERF(a, attrs)


interval_pointwise("silu")(_unimodal(_silu_at, -1.2784645427610737951, -0.27846454276107379511))
interval_pointwise("mish")(_unimodal(_mish_at, -1.1924312145154952121, -0.30884341301725040663))
interval_pointwise("hardswish")(_unimodal(_hardswish_at, -1.5, -0.375))
