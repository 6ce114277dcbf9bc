"""ONNX normalizations and activations written as exact compositions of existing IR ops.

``RMSNormalization`` is onnx's definition step by step (x * x, mean over the trailing axes, + eps,
sqrt, reciprocal, times x, times scale); ``LayerNormalization``'s Mean and InvStdDev outputs are the
reference's mean and 1 / sqrt(var + eps) beside the existing ``layernorm`` for Y; ``Selu`` with any
alpha and gamma is gamma * elu(x, alpha) (elu is alpha * (exp(x) - 1) below zero, x above).
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from . import ops_math, ops_nn
from .context import OnnxContext, Value

__all__ = ["HANDLERS", "OPSETS", "EMITS"]

Handler = Callable[[OnnxContext], list[Value]]


def _check_stash(ctx: OnnxContext) -> None:
    stash = int(ctx.attr("stash_type", 1))
    if stash != 1:
        raise ctx.fail(f"stash_type={stash} (only float32 statistics, stash_type=1, are defined by the reference)")


def _trailing_mean(ctx: OnnxContext, x: int, axes: tuple[int, ...]) -> int:
    return ctx.add("reduce_mean_axes", [x], {"axes": axes, "keepdim": True})


def _rms_norm(ctx: OnnxContext) -> list[Value]:
    _check_stash(ctx)
    s = ctx.shape(0)
    axis = ctx.axis(int(ctx.attr("axis", -1)), len(s))
    x = ctx.operand(0)
    axes = tuple(range(axis, len(s)))
    mean_sq = _trailing_mean(ctx, ctx.elementwise("mul_elem", [x, x]), axes)
    eps = float(ctx.attr("epsilon", 1e-5))
    inv_rms = ctx.elementwise("inv", [ctx.elementwise("sqrt", [ctx.elementwise("add", [mean_sq, ctx.scalar(eps)])])])
    y = ctx.elementwise("mul_elem", [x, inv_rms])
    return [ctx.elementwise("mul_elem", [y, ctx.operand(1)])]


def _layer_norm(ctx: OnnxContext) -> list[Value]:
    """Y by the existing lowering; Mean and InvStdDev (when read) as the reference computes them."""
    outs = ctx.node.output
    if not any(n and ctx.consumer_count(n) for n in outs[1:]):
        return ops_nn.HANDLERS["LayerNormalization"](ctx)
    _check_stash(ctx)
    s = ctx.shape(0)
    axis = ctx.axis(int(ctx.attr("axis", -1)), len(s))
    axes = tuple(range(axis, len(s)))
    x = ctx.operand(0)
    mean = ctx.elementwise("div", [ctx.add("reduce_sum_axes", [x], {"axes": axes, "keepdim": True}),
                                   ctx.scalar(float(math.prod(s[axis:])))])
    diff = ctx.elementwise("sub", [x, mean])
    var = ctx.elementwise("div", [ctx.add("reduce_sum_axes", [ctx.elementwise("mul_elem", [diff, diff])],
                                          {"axes": axes, "keepdim": True}), ctx.scalar(float(math.prod(s[axis:])))])
    eps = float(ctx.attr("epsilon", 1e-5))
    inv_std = ctx.elementwise("inv", [ctx.elementwise("sqrt", [ctx.elementwise("add", [var, ctx.scalar(eps)])])])
    y = ctx.elementwise("mul_elem", [diff, inv_std])
    y = ctx.elementwise("mul_elem", [y, ctx.operand(1)])
    if ctx.has_input(2):
        y = ctx.elementwise("add", [y, ctx.operand(2)])
    return [y, mean, inv_std][:len(outs)]


def _selu(ctx: OnnxContext) -> list[Value]:
    alpha = float(ctx.attr("alpha", ops_math.SELU_ALPHA))
    gamma = float(ctx.attr("gamma", ops_math.SELU_GAMMA))
    if alpha == float(np.float32(ops_math.SELU_ALPHA)) and gamma == float(np.float32(ops_math.SELU_GAMMA)):
        return ops_math.HANDLERS["Selu"](ctx)
    elu = ctx.add("elu", [ctx.operand(0)], {"alpha": alpha})
    return [ctx.elementwise("mul_elem", [elu, ctx.scalar(gamma)])]


HANDLERS: dict[str, Handler] = {"RMSNormalization": _rms_norm, "LayerNormalization": _layer_norm, "Selu": _selu}
OPSETS: dict[str, tuple[int, int]] = {"RMSNormalization": (23, 23), "LayerNormalization": (17, 17),
                                      "Selu": (1, 22)}
EMITS = frozenset({"mul_elem", "reduce_mean_axes", "reduce_sum_axes", "add", "sub", "div", "sqrt", "inv", "elu",
                   "broadcast_to", "const", "selu"}) | ops_nn.EMITS
