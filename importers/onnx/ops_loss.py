"""ONNX NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss as exact compositions of existing IR ops.

loss[n, d...] = -x[n, target[n, d...], d...] * w, w = weight[target] (1 without weights) and 0 where the
target is ``ignore_index`` (the spec's definition: an ignored position adds nothing and weighs nothing);
``mean`` divides the sum by the sum of the weights. The class is picked by ``gather_elements`` on the
class axis; SoftmaxCrossEntropyLoss is the same on ``log_softmax`` over that axis (its second output).
A target outside [0, C) that is not ``ignore_index`` is an evaluation error, never a clipped read.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from torchlean_bridge.ops import INT64

from .context import OnnxContext, Value

__all__ = ["HANDLERS", "OPSETS", "EMITS"]

Handler = Callable[[OnnxContext], list[Value]]


def _scalar(ctx: OnnxContext, value, dtype) -> int:
    return ctx.b.const(np.asarray(value, dtype=dtype), source=ctx.source, folded=True)


def _nll(ctx: OnnxContext, x: int) -> int:
    xs, ts = ctx.b.shape(x), ctx.shape(1)
    if len(xs) < 2 or ctx.dtype(1) != INT64 or tuple(ts) != (xs[0],) + tuple(xs[2:]):
        raise ctx.fail(f"input {list(xs)} and target {list(ts)} (target [N, d...] of integer class indices)")
    reduction = str(ctx.attr("reduction", "mean"))
    if reduction not in ("none", "sum", "mean"):
        raise ctx.fail(f"reduction={reduction}")
    ii = ctx.attr("ignore_index")
    target = ctx.operand(1)
    ignored = None
    if ii is not None:
        ignored = ctx.elementwise("eq", [target, _scalar(ctx, int(ii), np.int64)])
        target = ctx.elementwise("where", [ignored, _scalar(ctx, 0, np.int64), target])
    column = ctx.b.reshape(target, (ts[0], 1) + tuple(ts[1:]), ctx.source)
    picked = ctx.b.reshape(ctx.add("gather_elements", [x, column], {"axis": 1}), ts, ctx.source)
    loss = ctx.elementwise("neg", [picked])
    zero = _scalar(ctx, 0.0, np.float64)
    weights = None
    if ctx.has_input(2):
        weights = ctx.add("gather", [ctx.operand(2), target], {"axis": 0})
        if ignored is not None:
            weights = ctx.elementwise("where", [ignored, zero, weights])
        loss = ctx.elementwise("mul_elem", [weights, loss])
    elif ignored is not None:
        weights = ctx.elementwise("where", [ignored, zero, _scalar(ctx, 1.0, np.float64)])
    if ignored is not None:
        loss = ctx.elementwise("where", [ignored, zero, loss])
    if reduction == "none":
        return loss
    every = tuple(range(len(ts)))
    total = ctx.add("reduce_sum_axes", [loss], {"axes": every, "keepdim": False})
    if reduction == "sum":
        return total
    if weights is None:
        return ctx.elementwise("div", [total, _scalar(ctx, float(np.prod(ts)), np.float64)])
    return ctx.elementwise("div", [total, ctx.add("reduce_sum_axes", [weights], {"axes": every, "keepdim": False})])


def _nll_loss(ctx: OnnxContext) -> list[Value]:
    return [_nll(ctx, ctx.operand(0))]


def _softmax_cross_entropy(ctx: OnnxContext) -> list[Value]:
    if ctx.rank(0) < 2:
        raise ctx.fail(f"scores of rank {ctx.rank(0)}")
    log_prob = ctx.add("log_softmax", [ctx.operand(0)], {"axis": 1})
    return [_nll(ctx, log_prob), log_prob][:len(ctx.node.output)]


HANDLERS: dict[str, Handler] = {"NegativeLogLikelihoodLoss": _nll_loss, "SoftmaxCrossEntropyLoss": _softmax_cross_entropy}
# NegativeLogLikelihoodLoss-12/-13 and SoftmaxCrossEntropyLoss-12/-13 (13 added types)
OPSETS: dict[str, tuple[int, int]] = {"NegativeLogLikelihoodLoss": (12, 22), "SoftmaxCrossEntropyLoss": (12, 13)}
EMITS = frozenset({"eq", "where", "reshape", "gather_elements", "gather", "neg", "mul_elem", "reduce_sum_axes",
                   "div", "log_softmax", "broadcast_to", "const"})
