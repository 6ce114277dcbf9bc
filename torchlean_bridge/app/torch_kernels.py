"""The libtorch provider on the CPU: one torch functional op per IR kind.

``TORCH_RULES[kind](node, xs, rec) -> torch.Tensor``: ``xs`` are the parents as torch tensors (in
the evaluation dtype), ``rec`` the node's payload record as numpy arrays. Payload records are checked
by the same functions the reference evaluator uses (``semantics.records``), so a malformed payload
fails with the same message under either provider. Partial ops refuse the same inputs the reference
refuses (log of a value <= 0, division by zero, ...), never returning NaN. torch is imported inside
the rules, so importing this module (to list the kinds) stays cheap.

Kinds without a rule here (random generators, whose streams are TorchLean's own, ceil-mode and dilated
pooling, interpolation, custom) have no CPU libtorch capsule: a plan preferring libtorch falls back to
the reference capsule for them.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from torchlean_bridge.graph import Node
from torchlean_bridge.ops import fmt_shape, numel
from torchlean_bridge.ops.contracts import can_broadcast_to

__all__ = ["TORCH_RULES", "TorchRule"]

TorchRule = Callable[[Node, Sequence[Any], Mapping[str, np.ndarray]], Any]
TORCH_RULES: dict[str, TorchRule] = {}


def _t() -> Any:
    import torch
    return torch


def _F() -> Any:
    import torch.nn.functional as F
    return F


def _fail(node: Node, what: str) -> Exception:
    from semantics.records import fail
    return fail(node, f"IR eval: node {node.id}: {node.kind}: {what}")


def rule(*kinds: str) -> Callable[[TorchRule], TorchRule]:
    def register(fn: TorchRule) -> TorchRule:
        for kind in kinds:
            TORCH_RULES[kind] = fn
        return fn
    return register


def _param(arr: np.ndarray, like: Any) -> Any:
    return _t().from_numpy(arr if arr.flags.c_contiguous else arr.copy()).to(like.dtype)


def _unary(kind: str, fn: Callable[[Any], Any]) -> None:
    TORCH_RULES[kind] = lambda node, xs, rec: fn(xs[0])


def _partial(kind: str, fn: Callable[[Any], Any], inside: Callable[[Any], Any], outside: str) -> None:
    """A partial op refuses what the reference refuses (and with its message)."""
    def run(node: Node, xs: Sequence[Any], rec: Mapping[str, np.ndarray]) -> Any:
        if not bool(inside(xs[0]).all()):
            if kind == "log":
                from semantics.rules.elementwise import LOG_DOMAIN_MESSAGE
                from semantics.records import fail
                raise fail(node, LOG_DOMAIN_MESSAGE)
            raise _fail(node, f"input contains {outside} (or NaN)")
        return fn(xs[0])
    TORCH_RULES[kind] = run


# -- elementwise ------------------------------------------------------------------------------

for _kind, _name in (("abs", "abs"), ("neg", "neg"), ("sign", "sign"), ("floor", "floor"), ("ceil", "ceil"),
                     ("sin", "sin"), ("cos", "cos"), ("tan", "tan"), ("exp", "exp"), ("expm1", "expm1"),
                     ("exp2", "exp2"), ("tanh", "tanh"), ("atan", "atan"), ("sinh", "sinh"), ("cosh", "cosh"),
                     ("asinh", "asinh"), ("round", "round"), ("trunc", "trunc"), ("relu", "relu"),
                     ("sigmoid", "sigmoid"), ("erf", "erf"), ("isnan", "isnan"), ("logical_not", "logical_not")):
    _unary(_kind, lambda x, _n=_name: getattr(_t(), _n)(x))
for _kind, _name in (("silu", "silu"), ("softsign", "softsign"), ("hardswish", "hardswish"), ("mish", "mish"),
                     ("selu", "selu")):
    _unary(_kind, lambda x, _n=_name: getattr(_F(), _n)(x))
_unary("softplus", lambda x: _F().softplus(x, beta=1.0, threshold=math.inf))
_unary("inv", lambda x: _t().reciprocal(x))

_partial("sqrt", lambda x: _t().sqrt(x), lambda x: x >= 0, "negative values")
_partial("rsqrt", lambda x: _t().rsqrt(x), lambda x: x > 0, "values <= 0")
_partial("log", lambda x: _t().log(x), lambda x: x > 0, "values <= 0")
_partial("log2", lambda x: _t().log2(x), lambda x: x > 0, "values <= 0")
_partial("log1p", lambda x: _t().log1p(x), lambda x: x > -1, "values <= -1")
_partial("asin", lambda x: _t().asin(x), lambda x: (x >= -1) & (x <= 1), "values outside [-1, 1]")
_partial("acos", lambda x: _t().acos(x), lambda x: (x >= -1) & (x <= 1), "values outside [-1, 1]")
_partial("atanh", lambda x: _t().atanh(x), lambda x: (x >= -1) & (x <= 1), "values outside [-1, 1]")
_partial("acosh", lambda x: _t().acosh(x), lambda x: x >= 1, "values below 1")

for _kind, _name in (("add", "add"), ("sub", "sub"), ("mul_elem", "mul"), ("max_elem", "maximum"),
                     ("min_elem", "minimum"), ("eq", "eq"), ("ne", "ne"), ("lt", "lt"), ("le", "le"), ("gt", "gt"),
                     ("ge", "ge"), ("logical_and", "logical_and"), ("logical_or", "logical_or"),
                     ("matmul", "matmul")):
    TORCH_RULES[_kind] = lambda node, xs, rec, _n=_name: getattr(_t(), _n)(xs[0], xs[1])


@rule("div")
def _div(node, xs, rec):
    if bool((xs[1] == 0).any()):
        raise _fail(node, "division by zero")
    return _t().div(xs[0], xs[1])


@rule("pow")
def _pow(node, xs, rec):
    x, e = xs[0], node.attrs["exponent"]
    if e < 0 and bool((x == 0).any()):
        raise _fail(node, f"zero raised to the negative power {e}")
    return _t().pow(x, e)  # a negative base to a non-integer power is NaN, as the reference semantics says


@rule("safe_log")
def _safe_log(node, xs, rec):
    arg = _F().softplus(xs[0], beta=1.0, threshold=math.inf) + xs[1]
    if not bool((arg > 0).all()):
        raise _fail(node, "softplus(x) + eps is not > 0 (eps <= 0 or NaN)")
    return _t().log(arg)


@rule("gelu")
def _gelu(node, xs, rec):
    return _F().gelu(xs[0], approximate=node.attrs["approximate"])


rule("leaky_relu")(lambda node, xs, rec: _F().leaky_relu(xs[0], node.attrs["negative_slope"]))
rule("elu")(lambda node, xs, rec: _F().elu(xs[0], node.attrs["alpha"]))
rule("celu")(lambda node, xs, rec: _F().celu(xs[0], node.attrs["alpha"]))
rule("hardsigmoid")(lambda node, xs, rec: _t().clamp(node.attrs["alpha"] * xs[0] + node.attrs["beta"], 0, 1))
rule("clamp")(lambda node, xs, rec: xs[0] if node.attrs["min"] is None and node.attrs["max"] is None
              else _t().clamp(xs[0], node.attrs["min"], node.attrs["max"]))
rule("prelu")(lambda node, xs, rec: _t().where(xs[0] >= 0, xs[0], xs[1] * xs[0]))
rule("where")(lambda node, xs, rec: _t().where(xs[0], xs[1], xs[2]))

# -- data movement ----------------------------------------------------------------------------

rule("permute")(lambda node, xs, rec: xs[0].permute(*node.attrs["perm"]))
rule("transpose")(lambda node, xs, rec: xs[0].transpose(node.attrs["axis1"], node.attrs["axis2"]))
rule("concat")(lambda node, xs, rec: _t().cat(list(xs), dim=node.attrs["axis"]))


@rule("broadcast_to", "expand")
def _broadcast(node, xs, rec):
    if not can_broadcast_to(tuple(xs[0].shape), node.out_shape):
        raise _fail(node, f"broadcastTo invalid: {fmt_shape(tuple(xs[0].shape))} → {fmt_shape(node.out_shape)}")
    return xs[0].expand(*node.out_shape)


@rule("reshape", "flatten", "squeeze", "unsqueeze")
def _reshape(node, xs, rec):
    if xs[0].numel() != numel(node.out_shape):
        raise _fail(node, f"reshape numel mismatch: {xs[0].numel()} vs {numel(node.out_shape)}")
    return xs[0].reshape(node.out_shape)


@rule("pad")
def _pad(node, xs, rec):
    a = node.attrs
    pads = [p for before, after in reversed(list(zip(a["pads_before"], a["pads_after"]))) for p in (before, after)]
    return _F().pad(xs[0], pads, mode="constant", value=a["value"])


@rule("gather")
def _gather(node, xs, rec):
    data, idx = xs
    ax = node.attrs["axis"]
    n = data.shape[ax]
    if idx.numel() and (int(idx.min()) < -n or int(idx.max()) >= n):
        bad = idx[(idx < -n) | (idx >= n)].reshape(-1)[0]
        raise _fail(node, f"index {int(bad)} out of range for axis {ax} of extent {n}")
    flat = _t().where(idx < 0, idx + n, idx).reshape(-1)
    picked = data.index_select(ax, flat)
    return picked.reshape(tuple(data.shape[:ax]) + tuple(idx.shape) + tuple(data.shape[ax + 1:]))


# -- reductions -------------------------------------------------------------------------------

rule("sum")(lambda node, xs, rec: _t().sum(xs[0]))
rule("reduce_sum")(lambda node, xs, rec: _t().sum(xs[0], dim=node.attrs["axis"]))
rule("reduce_mean")(lambda node, xs, rec: _t().mean(xs[0], dim=node.attrs["axis"]))


def _axes_reduction(name: str, nonempty: bool) -> TorchRule:
    def run(node, xs, rec):
        axes, x = tuple(node.attrs["axes"]), xs[0]
        if not axes:
            return x
        if nonempty and any(x.shape[a] == 0 for a in axes):
            raise _fail(node, f"reduction over an empty axis of shape {fmt_shape(tuple(x.shape))}")
        return getattr(_t(), name)(x, dim=axes, keepdim=node.attrs["keepdim"])
    return run


TORCH_RULES["reduce_sum_axes"] = _axes_reduction("sum", False)
TORCH_RULES["reduce_mean_axes"] = _axes_reduction("mean", True)
TORCH_RULES["reduce_max"] = _axes_reduction("amax", True)
TORCH_RULES["reduce_min"] = _axes_reduction("amin", True)


@rule("argmax", "argmin")
def _arg(node, xs, rec):
    fn = _t().argmax if node.kind == "argmax" else _t().argmin
    return fn(xs[0], dim=node.attrs["axis"], keepdim=node.attrs["keepdim"])


@rule("sort")
def _sort(node, xs, rec):
    a = node.attrs
    values = _t().sort(xs[0], dim=a["axis"], descending=a["descending"]).values
    return values.narrow(a["axis"], 0, a["k"])


@rule("cumsum")
def _cumsum(node, xs, rec):
    a, x = node.attrs, xs[0]
    ax = a["axis"]
    if a["reverse"]:
        x = x.flip(ax)
    y = _t().cumsum(x, dim=ax)
    if a["exclusive"]:
        y = _t().cat([_t().zeros_like(y.narrow(ax, 0, min(1, y.shape[ax]))), y.narrow(ax, 0, max(0, y.shape[ax] - 1))],
                     dim=ax)
    return y.flip(ax) if a["reverse"] else y


@rule("mse_loss")
def _mse_loss(node, xs, rec):
    if tuple(xs[0].shape) != tuple(xs[1].shape):
        raise _fail(node, f"mse_loss expects equal shapes, got {fmt_shape(tuple(xs[0].shape))} vs "
                          f"{fmt_shape(tuple(xs[1].shape))}")
    if xs[0].numel() == 0:
        return _t().zeros((), dtype=xs[0].dtype)
    return _F().mse_loss(xs[0], xs[1], reduction="mean")


# -- normalization, softmax -------------------------------------------------------------------

rule("softmax")(lambda node, xs, rec: _t().softmax(xs[0], dim=node.attrs["axis"]))
rule("log_softmax")(lambda node, xs, rec: _t().log_softmax(xs[0], dim=node.attrs["axis"]))


@rule("layernorm")
def _layernorm(node, xs, rec):
    from semantics.records import layernorm_record
    x, ax = xs[0], node.attrs["axis"]
    gamma, beta = layernorm_record(node, rec, tuple(x.shape))
    weight = None if gamma is None else _param(gamma, x)
    bias = None if beta is None else _param(beta, x)
    return _F().layer_norm(x, tuple(x.shape[ax:]), weight, bias, node.attrs["eps"])


@rule("batch_norm_eval")
def _batch_norm_eval(node, xs, rec):
    from semantics.records import batch_norm_record
    x, ax = xs[0], node.attrs["channel_axis"]
    p = batch_norm_record(node, rec)
    lead, c = math.prod(x.shape[:ax]), x.shape[ax]
    y = _F().batch_norm(x.reshape(lead, c, -1), _param(p.running_mean, x), _param(p.running_var, x),
                        _param(p.weight, x), _param(p.bias, x), training=False, eps=node.attrs["eps"])
    return y.reshape(x.shape)


# -- affine maps and pooling ------------------------------------------------------------------

@rule("linear")
def _linear(node, xs, rec):
    from semantics.records import linear_record
    w, b = linear_record(node, rec, tuple(xs[0].shape))
    return _F().linear(xs[0], _param(w, xs[0]), _param(b, xs[0]))


def _spatial_pads(before: Sequence[int], after: Sequence[int]) -> list[int]:
    """F.pad's order: last axis first, (before, after) per axis."""
    return [p for b, a in reversed(list(zip(before, after))) for p in (b, a)]


@rule("conv")
def _conv(node, xs, rec):
    from semantics.records import conv_record
    a = node.attrs
    r = a["spatial_rank"]
    if r not in (1, 2, 3):
        raise _fail(node, f"torch has no {r}-d convolution")
    w, b = conv_record(node, rec)
    x, ca = xs[0], a["channel_axis"]
    lead = tuple(x.shape[:ca])
    x = x.reshape((math.prod(lead),) + tuple(x.shape[ca:]))
    x = _F().pad(x, _spatial_pads(a["padding"], a["padding_after"]))
    conv = getattr(_F(), f"conv{r}d")
    y = conv(x, _param(w, x), _param(b, x), stride=tuple(a["stride"]), dilation=tuple(a["dilation"]),
             groups=a["groups"])
    return y.reshape(lead + tuple(y.shape[1:]))


@rule("max_pool", "avg_pool")
def _pool(node, xs, rec):
    a = node.attrs
    r = a["spatial_rank"]
    if r not in (1, 2, 3):
        raise _fail(node, f"torch has no {r}-d pooling")
    x = xs[0]
    lead = tuple(x.shape[:x.ndim - r])
    x = x.reshape((math.prod(lead),) + tuple(x.shape[x.ndim - r:]))
    pads = _spatial_pads(a["padding"], a["padding"])
    if node.kind == "max_pool":  # padded cells never win: pad with -inf, pool without padding
        x = _F().pad(x, pads, value=-math.inf)
        y = getattr(_F(), f"max_pool{r}d")(x, tuple(a["kernel"]), tuple(a["stride"]))
    else:  # TorchLean divides by the whole kernel, padded cells adding exact zeros
        x = _F().pad(x, pads, value=0.0)
        y = getattr(_F(), f"avg_pool{r}d")(x, tuple(a["kernel"]), tuple(a["stride"]))
    return y.reshape(lead + tuple(y.shape[1:]))
