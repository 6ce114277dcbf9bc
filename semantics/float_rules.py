"""Float semantics of every op kind: ``FLOAT_RULES[kind](node, parents, record, dtype) -> ndarray``.

One small function per op, reading like spec section 2.2 (v1) or the PyTorch/ONNX definition (ext).
``dtype`` is the evaluation domain, ``float64`` (the reference: TorchLean computes in binary64) or
``float32`` (PyTorch/onnxruntime arithmetic); int64 and bool values stay exact. ``record`` is the
node's payload record (``{role: ndarray}``), checked by ``semantics.records``.

Partial operations never return NaN: they raise ``EvalError`` naming the node (log of a value <= 0,
square root of a negative, division by zero, pow producing NaN, gather index out of range).
"""

from __future__ import annotations

import math
from typing import Callable, Mapping, Sequence

import numpy as np

from .tables import registrar
from torchlean_bridge.graph import Node
from torchlean_bridge.ops import BOOL, INT64, fmt_shape, numel
from torchlean_bridge.ops.contracts import can_broadcast_to

from .conv import EMPTY_WINDOW, avg_pool_divisor, conv_nd, conv_transpose_nd, pool_nd, pool_out_spatial
from .float_random import bernoulli, uniform
from .float_special import erf
from .records import (batch_norm_record, const_values, conv_record, fail, layernorm_record, linear_record)
from .resize import resize_linear

__all__ = ["FLOAT_RULES", "Rule", "LOG_DOMAIN_MESSAGE", "running_sum", "sorted_values"]

Values = Sequence[np.ndarray]
Record = Mapping[str, np.ndarray]
Rule = Callable[[Node, Values, Record, np.dtype], np.ndarray]

LOG_DOMAIN_MESSAGE = ("IR eval: log: input contains values <= 0 (or NaN); use `safe_log`, "
                      "which is log(softplus(x) + eps)")

FLOAT_RULES: dict[str, Rule] = {}


rule = registrar(FLOAT_RULES)


def unary(kind: str, fn: Callable[[np.ndarray], np.ndarray]) -> None:
    FLOAT_RULES[kind] = lambda node, xs, rec, dt: fn(xs[0])


def binary(kind: str, fn: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> None:
    FLOAT_RULES[kind] = lambda node, xs, rec, dt: fn(xs[0], xs[1])


def param(arr: np.ndarray, dt: np.dtype) -> np.ndarray:
    """A payload tensor in the evaluation domain (no copy when it already is)."""
    return arr.astype(dt, copy=False)


def domain_error(node: Node, what: str) -> Exception:
    return fail(node, f"IR eval: node {node.id}: {node.kind}: {what}")


# -- leaves and data movement -----------------------------------------------------------------

_INPUT_KINDS = {"float": "f", INT64: "iu", BOOL: "b"}


@rule("input")
def _input(node, xs, rec, dt):
    """The caller's array for this input: shape and element type checked, floats put in the domain."""
    x = xs[0]
    if tuple(x.shape) != tuple(node.out_shape):
        raise fail(node, f"IR eval: shape mismatch: expected {fmt_shape(node.out_shape)}, got {fmt_shape(x.shape)}")
    if x.dtype.kind not in _INPUT_KINDS[node.dtype]:
        raise fail(node, f"IR eval: input {node.id}: element type mismatch: expected {node.dtype}, got {x.dtype}")
    if node.dtype == INT64:
        return x.astype(np.int64, copy=False)
    if node.dtype == BOOL:
        return x
    return x.astype(dt, copy=False)


@rule("const")
def _const(node, xs, rec, dt):
    values = const_values(node, rec)
    if node.dtype == INT64:
        return values.astype(np.int64, copy=False)
    if node.dtype == BOOL:
        return values.astype(bool, copy=False)
    return param(values, dt)


@rule("custom")
def _custom(node, xs, rec, dt):
    raise fail(node, f"IR eval: custom {node.attrs['name']}: no checked body available (custom computations "
                     f"need a checked Lean body; node {node.id})")


@rule("detach")
def _detach(node, xs, rec, dt):
    return xs[0]


@rule("permute")
def _permute(node, xs, rec, dt):
    return np.transpose(xs[0], node.attrs["perm"])


@rule("transpose")
def _transpose(node, xs, rec, dt):
    return np.swapaxes(xs[0], node.attrs["axis1"], node.attrs["axis2"])


@rule("broadcast_to", "expand")
def _broadcast(node, xs, rec, dt):
    if not can_broadcast_to(xs[0].shape, node.out_shape):
        raise fail(node, f"IR eval: node {node.id}: broadcastTo invalid: {fmt_shape(xs[0].shape)} → "
                         f"{fmt_shape(node.out_shape)}")
    return np.broadcast_to(xs[0], node.out_shape)


@rule("reshape", "flatten", "squeeze", "unsqueeze")
def _reshape(node, xs, rec, dt):
    if xs[0].size != numel(node.out_shape):
        raise fail(node, f"IR eval: node {node.id}: reshape numel mismatch: {xs[0].size} vs {numel(node.out_shape)}")
    return np.reshape(xs[0], node.out_shape)


@rule("concat")
def _concat(node, xs, rec, dt):
    return np.concatenate(xs, axis=node.attrs["axis"])


@rule("slice")
def _slice(node, xs, rec, dt):
    index = [slice(None)] * xs[0].ndim
    a = node.attrs
    for ax, start, end, step in zip(a["axes"], a["starts"], a["ends"], a["steps"]):
        index[ax] = slice(start, end, step)
    return xs[0][tuple(index)]


@rule("pad")
def _pad(node, xs, rec, dt):
    a = node.attrs
    return np.pad(xs[0], list(zip(a["pads_before"], a["pads_after"])), constant_values=a["value"])


@rule("gather", "gather_elements")
def _gather(node, xs, rec, dt):
    """``gather`` is numpy.take; ``gather_elements`` takes along the axis, its indices addressing the
    leading block of the data off the axis (torch.gather's rule). Indices lie in [-n, n)."""
    data, idx = xs
    ax = node.attrs["axis"]
    n = data.shape[ax]
    if idx.size and (idx.min() < -n or idx.max() >= n):
        bad = idx[(idx < -n) | (idx >= n)].reshape(-1)[0]
        raise domain_error(node, f"index {int(bad)} out of range for axis {ax} of extent {n}")
    if node.kind == "gather":
        return np.take(data, idx, axis=ax)
    block = data[tuple(slice(None) if k == ax else slice(0, e) for k, e in enumerate(idx.shape))]
    return np.take_along_axis(block, np.where(idx < 0, idx + n, idx), axis=ax)


@rule("where")
def _where(node, xs, rec, dt):
    return np.where(xs[0], xs[1], xs[2])


@rule("cast")
def _cast(node, xs, rec, dt):
    x, target = xs[0], node.attrs["dtype"]
    if target == BOOL:
        return x != 0
    if target == INT64:
        if x.dtype.kind != "f":
            return x.astype(np.int64)
        t = np.trunc(x)
        if not np.all((t >= -2.0**63) & (t < 2.0**63)):
            raise domain_error(node, "value is NaN, infinite or outside the int64 range")
        return t.astype(np.int64)
    return x.astype(dt)


# -- random -----------------------------------------------------------------------------------

@rule("rand_uniform")
def _rand_uniform(node, xs, rec, dt):
    return uniform(node.attrs["seed"], node.id, node.out_shape, dt)


@rule("bernoulli_mask")
def _bernoulli_mask(node, xs, rec, dt):
    if xs[0].shape != ():
        raise fail(node, f"IR eval: node {node.id}: bernoulli_mask expects scalar keepProb parent ({node.summary()})")
    return bernoulli(float(xs[0]), node.attrs["seed"], node.id, node.out_shape, dt)


# -- elementwise arithmetic -------------------------------------------------------------------

binary("add", np.add)
binary("sub", np.subtract)
binary("mul_elem", np.multiply)
binary("max_elem", np.maximum)
binary("min_elem", np.minimum)
unary("abs", np.abs)
unary("neg", np.negative)
unary("sign", np.sign)
unary("floor", np.floor)
unary("ceil", np.ceil)
unary("sin", np.sin)
unary("cos", np.cos)
unary("tan", np.tan)
unary("exp", np.exp)
unary("expm1", np.expm1)
unary("exp2", np.exp2)
unary("tanh", np.tanh)
unary("atan", np.arctan)
unary("sinh", np.sinh)
unary("cosh", np.cosh)
unary("asinh", np.arcsinh)
unary("round", np.rint)  # half to even, as torch.round and ONNX Round
unary("trunc", np.trunc)


def _defined_where(fn: Callable[[np.ndarray], np.ndarray], inside: Callable[[np.ndarray], np.ndarray],
                   outside: str) -> Rule:
    """An op defined only where ``inside`` holds: elsewhere its value would be NaN, so the node is
    refused instead (architecture decision 5), naming it and what the input held."""
    def run(node, xs, rec, dt):
        if not np.all(inside(xs[0])):
            raise domain_error(node, f"input contains {outside} (or NaN)")
        return fn(xs[0])
    return run


# Spec 2.2's sqrt has no domain check (Lean gives NaN below 0); sqrt(-0.0) = -0.0 is kept.
FLOAT_RULES["sqrt"] = _defined_where(np.sqrt, lambda x: x >= 0, "negative values")
FLOAT_RULES["rsqrt"] = _defined_where(lambda x: 1 / np.sqrt(x), lambda x: x > 0, "values <= 0")
FLOAT_RULES["log2"] = _defined_where(np.log2, lambda x: x > 0, "values <= 0")
FLOAT_RULES["log1p"] = _defined_where(np.log1p, lambda x: x > -1, "values <= -1")
# ends included: atanh(+-1) and acosh's unbounded end are values (+-inf), not NaN
FLOAT_RULES["asin"] = _defined_where(np.arcsin, lambda x: (x >= -1) & (x <= 1), "values outside [-1, 1]")
FLOAT_RULES["acos"] = _defined_where(np.arccos, lambda x: (x >= -1) & (x <= 1), "values outside [-1, 1]")
FLOAT_RULES["atanh"] = _defined_where(np.arctanh, lambda x: (x >= -1) & (x <= 1), "values outside [-1, 1]")
FLOAT_RULES["acosh"] = _defined_where(np.arccosh, lambda x: x >= 1, "values below 1")


@rule("inv")
def _inv(node, xs, rec, dt):
    """Spec 2.2: inv(x) = 1/x in IEEE arithmetic, so +-0 gives +-inf (a value, not an error or NaN)."""
    return np.divide(1, xs[0])


@rule("div")
def _div(node, xs, rec, dt):
    if np.any(xs[1] == 0):
        raise domain_error(node, "division by zero")
    return xs[0] / xs[1]


@rule("log")
def _log(node, xs, rec, dt):
    x = xs[0]
    if not np.all(x > 0):
        raise fail(node, LOG_DOMAIN_MESSAGE)
    return np.log(x)


@rule("pow")
def _pow(node, xs, rec, dt):
    x, e = xs[0], node.attrs["exponent"]
    if e < 0 and np.any(x == 0):
        raise domain_error(node, f"zero raised to the negative power {e}")
    y = np.power(x, e)
    if np.any(np.isnan(y) & ~np.isnan(x)):
        raise domain_error(node, f"negative base raised to the non-integer power {e} (NaN)")
    return y


def sigmoid(x: np.ndarray) -> np.ndarray:
    """Spec: ``1 / (1 + exp(-x))``."""
    return 1 / (1 + np.exp(-x))


def softplus(x: np.ndarray) -> np.ndarray:
    """Spec, sign-branched: ``x + log(1 + exp(-x))`` if ``x > 0``, else ``log(1 + exp(x))``."""
    return np.where(x > 0, x, 0) + np.log(1 + np.exp(-np.abs(x)))


unary("relu", lambda x: np.maximum(x, 0))
unary("sigmoid", sigmoid)
unary("softplus", softplus)


@rule("safe_log")
def _safe_log(node, xs, rec, dt):
    arg = softplus(xs[0]) + xs[1]
    if not np.all(arg > 0):
        raise domain_error(node, "softplus(x) + eps is not > 0 (eps <= 0 or NaN)")
    return np.log(arg)


SELU_ALPHA = 1.6732632423543772848170429916717
SELU_SCALE = 1.0507009873554804934193349852946
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_SQRT_HALF = math.sqrt(0.5)


@rule("gelu")
def _gelu(node, xs, rec, dt):
    x = xs[0]
    if node.attrs["approximate"] == "tanh":
        return 0.5 * x * (1 + np.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)))
    return x * (0.5 * (1 + erf(x * _SQRT_HALF, dt)))


@rule("erf")
def _erf(node, xs, rec, dt):
    return erf(xs[0], dt)


unary("silu", lambda x: x * sigmoid(x))
unary("softsign", lambda x: x / (1 + np.abs(x)))
unary("hardswish", lambda x: x * np.clip(x + 3, 0, 6) / 6)
unary("mish", lambda x: x * np.tanh(np.logaddexp(0, x)))
unary("selu", lambda x: SELU_SCALE * np.where(x > 0, x, SELU_ALPHA * np.expm1(np.minimum(x, 0))))


@rule("leaky_relu")
def _leaky_relu(node, xs, rec, dt):
    x = xs[0]
    return np.where(x > 0, x, x * node.attrs["negative_slope"])


@rule("elu")
def _elu(node, xs, rec, dt):
    x = xs[0]
    return np.where(x > 0, x, node.attrs["alpha"] * np.expm1(np.minimum(x, 0)))


@rule("celu")
def _celu(node, xs, rec, dt):
    x, alpha = xs[0], node.attrs["alpha"]
    return np.maximum(x, 0) + np.minimum(0, alpha * np.expm1(np.minimum(x, 0) / alpha))


@rule("hardsigmoid")
def _hardsigmoid(node, xs, rec, dt):
    a = node.attrs
    return np.clip(a["alpha"] * xs[0] + a["beta"], 0, 1)


@rule("clamp")
def _clamp(node, xs, rec, dt):
    y, lo, hi = xs[0], node.attrs["min"], node.attrs["max"]
    if lo is not None:
        y = np.maximum(y, lo)
    if hi is not None:
        y = np.minimum(y, hi)
    return y


@rule("prelu")
def _prelu(node, xs, rec, dt):
    x, slope = xs
    return np.where(x >= 0, x, slope * x)


# -- comparisons and logic --------------------------------------------------------------------

for _kind, _fn in (("eq", np.equal), ("ne", np.not_equal), ("lt", np.less), ("le", np.less_equal),
                   ("gt", np.greater), ("ge", np.greater_equal), ("logical_and", np.logical_and),
                   ("logical_or", np.logical_or)):
    binary(_kind, _fn)
unary("logical_not", np.logical_not)

# -- reductions -------------------------------------------------------------------------------


@rule("sum")
def _sum(node, xs, rec, dt):
    return np.sum(xs[0])


@rule("reduce_sum")
def _reduce_sum(node, xs, rec, dt):
    return np.sum(xs[0], axis=node.attrs["axis"])


@rule("reduce_mean")
def _reduce_mean(node, xs, rec, dt):
    return np.mean(xs[0], axis=node.attrs["axis"])


def _axes_reduction(fn: Callable, needs_nonempty: bool) -> Rule:
    def run(node, xs, rec, dt):
        axes = tuple(node.attrs["axes"])
        x = xs[0]
        if not axes:
            return x
        if needs_nonempty and any(x.shape[a] == 0 for a in axes):
            raise domain_error(node, f"reduction over an empty axis of shape {fmt_shape(x.shape)}")
        return fn(x, axis=axes, keepdims=node.attrs["keepdim"])
    return run


FLOAT_RULES["reduce_sum_axes"] = _axes_reduction(np.sum, False)
FLOAT_RULES["reduce_mean_axes"] = _axes_reduction(np.mean, True)
FLOAT_RULES["reduce_max"] = _axes_reduction(np.max, True)
FLOAT_RULES["reduce_min"] = _axes_reduction(np.min, True)
FLOAT_RULES["reduce_prod"] = _axes_reduction(np.prod, False)


def _arg_reduction(fn: Callable) -> Rule:
    def run(node, xs, rec, dt):
        out = fn(xs[0], axis=node.attrs["axis"])
        if node.attrs["keepdim"]:
            out = np.expand_dims(out, node.attrs["axis"])
        return out.astype(np.int64)
    return run


FLOAT_RULES["argmax"] = _arg_reduction(np.argmax)
FLOAT_RULES["argmin"] = _arg_reduction(np.argmin)


def sorted_values(x: np.ndarray, axis: int, k: int, descending: bool) -> np.ndarray:
    """The first k values of x sorted along axis (NaN sorts above +inf, as in PyTorch)."""
    y = np.sort(x, axis=axis)
    if descending:
        y = np.flip(y, axis)
    return y[(slice(None),) * axis + (slice(0, k),)]


@rule("sort")
def _sort(node, xs, rec, dt):
    a = node.attrs
    return sorted_values(xs[0], a["axis"], a["k"], a["descending"])


def running_sum(x: np.ndarray, axis: int, exclusive: bool, reverse: bool) -> np.ndarray:
    """Sequential running sums along ``axis`` (numpy's cumsum adds left to right, as PyTorch does)."""
    if reverse:
        x = np.flip(x, axis)
    y = np.cumsum(x, axis=axis)
    if exclusive:  # entry i gets the sum before it: the inclusive sums shifted one place, 0 first
        shifted = np.zeros_like(y)
        shifted[(slice(None),) * axis + (slice(1, None),)] = y[(slice(None),) * axis + (slice(None, -1),)]
        y = shifted
    return np.flip(y, axis) if reverse else y


@rule("cumsum")
def _cumsum(node, xs, rec, dt):
    a = node.attrs
    return running_sum(xs[0], a["axis"], a["exclusive"], a["reverse"])


@rule("mse_loss")
def _mse_loss(node, xs, rec, dt):
    if xs[0].shape != xs[1].shape:
        raise fail(node, f"IR eval: node {node.id}: mse_loss expects equal shapes, got {fmt_shape(xs[0].shape)} "
                         f"vs {fmt_shape(xs[1].shape)}")
    d = xs[0] - xs[1]
    return np.sum(d * d) / max(d.size, 1)


# -- normalization and softmax ----------------------------------------------------------------

@rule("softmax")
def _softmax(node, xs, rec, dt):
    x, ax = xs[0], node.attrs["axis"]
    if not ax < x.ndim:
        raise fail(node, f"IR eval: node {node.id}: softmax: invalid axis {ax} for rank {x.ndim} ({node.summary()})")
    if x.shape[ax] == 0:
        return x
    e = np.exp(x - np.max(x, axis=ax, keepdims=True))
    e /= np.sum(e, axis=ax, keepdims=True)
    return e


@rule("log_softmax")
def _log_softmax(node, xs, rec, dt):
    x, ax = xs[0], node.attrs["axis"]
    if x.shape[ax] == 0:
        return x
    shifted = x - np.max(x, axis=ax, keepdims=True)
    return shifted - np.log(np.sum(np.exp(shifted), axis=ax, keepdims=True))


@rule("hard_masked_softmax")
def _hard_masked_softmax(node, xs, rec, dt):
    x = xs[0]
    allowed = np.asarray(node.attrs["allowed"], dtype=bool).reshape(x.shape)
    if x.shape[-1] == 0:
        return x
    m = np.max(x, axis=-1, keepdims=True, where=allowed, initial=-np.inf)
    e = np.zeros_like(x)
    np.exp(x - m, out=e, where=allowed)
    total = np.sum(e, axis=-1, keepdims=True)
    return np.divide(e, total, out=np.zeros_like(x), where=total > 0)


@rule("layernorm")
def _layernorm(node, xs, rec, dt):
    x, ax = xs[0], node.attrs["axis"]
    gamma, beta = layernorm_record(node, rec, x.shape)
    if x.size == 0:
        return x
    axes = tuple(range(ax, x.ndim))
    mean = np.mean(x, axis=axes, keepdims=True)
    centered = x - mean
    var = np.maximum(np.mean(centered * centered, axis=axes, keepdims=True), 0)
    y = centered / np.sqrt(var + node.attrs["eps"])
    if gamma is not None:
        y *= param(gamma, dt)
    if beta is not None:
        y += param(beta, dt)
    return y


@rule("batch_norm_eval")
def _batch_norm_eval(node, xs, rec, dt):
    x, ax = xs[0], node.attrs["channel_axis"]
    p = batch_norm_record(node, rec)
    shape = (-1,) + (1,) * (x.ndim - ax - 1)
    mean, var, gamma, beta = (param(a, dt).reshape(shape) for a in (p.running_mean, p.running_var,
                                                                      p.weight, p.bias))
    return (x - mean) / np.sqrt(np.maximum(var, 0) + node.attrs["eps"]) * gamma + beta


# -- affine maps ------------------------------------------------------------------------------

@rule("matmul")
def _matmul(node, xs, rec, dt):
    return np.matmul(xs[0], xs[1])


@rule("linear")
def _linear(node, xs, rec, dt):
    x = xs[0]
    w, b = linear_record(node, rec, x.shape)
    y = np.matmul(x, param(w, dt).T)
    y += param(b, dt)
    return y


@rule("conv", "conv_transpose")
def _conv(node, xs, rec, dt):
    a = node.attrs
    w, b = conv_record(node, rec)
    geometry = dict(channel_axis=a["channel_axis"], stride=a["stride"], padding=a["padding"], dilation=a["dilation"],
                    groups=a["groups"], out_spatial=node.out_shape[a["channel_axis"] + 1:])
    if node.kind == "conv_transpose":
        return conv_transpose_nd(xs[0], param(w, dt), param(b, dt), **geometry)
    return conv_nd(xs[0], param(w, dt), param(b, dt), padding_after=a["padding_after"], **geometry)


@rule("resize_linear")
def _resize_linear(node, xs, rec, dt):
    a = node.attrs
    return resize_linear(xs[0], a["sizes"], a["coordinate_mode"])


# -- pooling ----------------------------------------------------------------------------------

def _out_spatial(node: Node) -> tuple[int, ...]:
    return pool_out_spatial(node.out_shape, node.attrs["spatial_rank"])


@rule("max_pool")
def _max_pool(node, xs, rec, dt):
    a, r = node.attrs, node.attrs["spatial_rank"]
    return pool_nd(xs[0], mode="max", kernel=a["kernel"], stride=a["stride"], padding=a["padding"],
                   padding_after=a["padding"], dilation=(1,) * r, out_spatial=_out_spatial(node))


@rule("avg_pool")
def _avg_pool(node, xs, rec, dt):
    a, r = node.attrs, node.attrs["spatial_rank"]
    return pool_nd(xs[0], mode="avg", kernel=a["kernel"], stride=a["stride"], padding=a["padding"],
                   padding_after=a["padding"], dilation=(1,) * r, out_spatial=_out_spatial(node),
                   divisor=float(math.prod(a["kernel"])))


@rule("max_pool_nd")
def _max_pool_nd(node, xs, rec, dt):
    """A window made only of padding (possible with dilation) gives -inf, as in PyTorch and ONNX."""
    a = node.attrs
    return pool_nd(xs[0], mode="max", kernel=a["kernel"], stride=a["stride"], padding=a["padding"],
                   padding_after=a["padding_after"], dilation=a["dilation"], out_spatial=_out_spatial(node))


@rule("avg_pool_nd")
def _avg_pool_nd(node, xs, rec, dt):
    """Divisor per window: cells inside the padded input (count_include_pad) or inside the input."""
    a, x = node.attrs, xs[0]
    out = _out_spatial(node)
    divisor = avg_pool_divisor(a, x.shape[x.ndim - a["spatial_rank"]:], out)
    if np.any(divisor == 0):
        raise domain_error(node, EMPTY_WINDOW)
    return pool_nd(x, mode="avg", kernel=a["kernel"], stride=a["stride"], padding=a["padding"],
                   padding_after=a["padding_after"], dilation=a["dilation"], out_spatial=out, divisor=divisor)


unary("isnan", np.isnan)
