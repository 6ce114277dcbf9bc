"""ONNX layer ops: Gemm/MatMul, Conv, normalizations, pooling, softmax, Einsum.

``Gemm`` and ``MatMul`` with a 2-D initializer become ``linear`` when that is exact (the weight's
layout change is recorded as a role transform); anything else stays ``matmul`` plus explicit
scaling. Pools become the v1 kinds when the registry's ``v1_rewrite`` says the geometry is exactly
representable, else the ``*_pool_nd`` ext kinds.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from torchlean_bridge.ops import REGISTRY
from torchlean_bridge.ops.contracts import conv_transpose_full_dim

from .. import decompositions
from .context import Const, OnnxContext, Value

__all__ = ["HANDLERS", "EMITS"]

Handler = Callable[[OnnxContext], list[Value]]


# -- Gemm / MatMul ----------------------------------------------------------------------------

def _linear(ctx: OnnxContext, x: int, weight: Const, transpose: bool) -> int:
    """A ``linear`` node from a 2-D weight (``transpose``: stored [in, out]); zero bias, unbound."""
    w = weight.value.T if transpose else weight.value
    out = ctx.b.shape(x)[:-1] + (w.shape[0],)
    nid = ctx.add("linear", [x], shape=out)
    ctx.param_const(nid, "weight", weight, transpose=transpose)
    ctx.b.param(nid, "bias", np.zeros(w.shape[0], dtype=ctx.b.payload.get(nid, "weight").dtype))
    return nid


def _gemm(ctx: OnnxContext) -> list[Value]:
    """``alpha * A' B' + beta * C``: a ``linear`` when B is a 2-D initializer, scaled and shifted after."""
    alpha, beta = float(ctx.attr("alpha", 1.0)), float(ctx.attr("beta", 1.0))
    trans_a, trans_b = int(ctx.attr("transA", 0)), int(ctx.attr("transB", 0))
    weight, bias = ctx.const(1), ctx.const(2)
    if ctx.rank(0) != 2 or ctx.rank(1) != 2:
        raise ctx.fail(f"A {list(ctx.shape(0))} and B {list(ctx.shape(1))} (Gemm takes two matrices)")
    n = ctx.shape(1)[0 if trans_b else 1]
    a = ctx.operand(0)
    if trans_a:
        a = ctx.add("permute", [a], {"perm": (1, 0)})
    if weight is not None and weight.value.ndim == 2 and weight.value.dtype.kind == "f":
        y = _linear(ctx, a, weight, transpose=not trans_b)
        bias_is_vector = bias is not None and bias.value.size == n and tuple(bias.value.shape) in ((n,), (1, n))
        if alpha == 1.0 and bias_is_vector and beta == 1.0:
            ctx.param_const(y, "bias", bias, reshape_to=(n,))
            return [y]
        if alpha == 1.0 and not ctx.has_input(2):
            return [y]
    else:
        b = ctx.operand(1)
        if trans_b:
            b = ctx.add("permute", [b], {"perm": (1, 0)})
        y = ctx.add("matmul", [a, b])
    if alpha != 1.0:
        y = ctx.elementwise("mul_elem", [y, ctx.scalar(alpha)])
    if ctx.has_input(2) and beta != 0.0:
        if bias is not None and beta != 1.0:  # beta * C folded, as onnxruntime computes it (binary32)
            name = f"{ctx.node.output[0]}::beta_c"
            ctx.values[name] = Const((bias.value * bias.value.dtype.type(beta)).astype(bias.value.dtype), folded=True)
            c = ctx.tensor(name)
        else:
            c = ctx.operand(2)
            if beta != 1.0:
                c = ctx.elementwise("mul_elem", [c, ctx.scalar(beta)])
        y = ctx.elementwise("add", [y, c])
    return [y]


def _matmul(ctx: OnnxContext) -> list[Value]:
    weight = ctx.const(1)
    if weight is not None and weight.value.ndim == 2 and weight.value.dtype.kind == "f" and ctx.rank(0) >= 1 \
            and ctx.const(0) is None:
        return [_linear(ctx, ctx.operand(0), weight, transpose=True)]
    return [ctx.add("matmul", [ctx.operand(0), ctx.operand(1)])]


# -- convolution and pooling geometry ----------------------------------------------------------

def _check_window(ctx: OnnxContext, r: int, kernel: list[int], strides: list[int], dilations: list[int]) -> None:
    """Kernel, strides and dilations: one positive entry per spatial axis (and pads, when given, two)."""
    for what, values in (("kernel_shape", kernel), ("strides", strides), ("dilations", dilations)):
        if len(values) != r or any(v < 1 for v in values):
            raise ctx.fail(f"{what} {list(values)} (expected {r} positive entries)")
    pads = ctx.attr("pads")
    if pads is not None and (len(pads) != 2 * r or any(p < 0 for p in pads)):
        raise ctx.fail(f"pads {list(pads)} (expected {2 * r} non-negative entries)")
    if ctx.attr("auto_pad", "NOTSET") not in ("NOTSET", "", "VALID", "SAME_UPPER", "SAME_LOWER"):
        raise ctx.fail(f"auto_pad={ctx.attr('auto_pad')}")


def _window_pads(ctx: OnnxContext, spatial: tuple[int, ...], kernel: list[int], strides: list[int],
                 dilations: list[int]) -> tuple[list[int], list[int]]:
    """Explicit ``pads`` or the ones ``auto_pad`` implies, as (before, after)."""
    r = len(spatial)
    auto = ctx.attr("auto_pad", "NOTSET")
    if auto in ("NOTSET", ""):
        pads = list(ctx.attr("pads") or [0] * (2 * r))
        return pads[:r], pads[r:]
    if auto == "VALID":
        return [0] * r, [0] * r
    before, after = [], []
    for size, k, s, d in zip(spatial, kernel, strides, dilations):
        total = (-(-size // s) - 1) * s + d * (k - 1) + 1 - size
        # a negative total: onnxruntime starts the windows inside the input once its head pad (the total
        # halved towards zero) is negative, onnx's reference (halved down) already at -1: refused there
        if total <= (-3 if auto == "SAME_LOWER" else -2):
            raise ctx.fail(f"auto_pad={auto} needs a negative total padding {total} on an axis of extent {size} "
                           "(runtimes disagree on where the windows then start)")
        total = max(0, total)
        small, large = total // 2, total - total // 2
        before.append(large if auto == "SAME_LOWER" else small)
        after.append(small if auto == "SAME_LOWER" else large)
    return before, after


def _conv_transpose_geometry(ctx: OnnxContext, spatial: tuple[int, ...], kernel: list[int], strides: list[int],
                             dilations: list[int]) -> tuple[list[int], list[int], list[int]]:
    """ConvTranspose's crop (before, after) and end extension (output_padding): explicit ``pads``,
    or split from the total that an ``output_shape`` (or ``auto_pad`` SAME_*, which asks for
    ``input * stride``) implies, the odd cell at the end for SAME_UPPER and at the start otherwise
    (ONNX operator spec). A negative total (a wanted extent past the uncropped output) extends the end."""
    r = len(spatial)
    output_padding = list(ctx.attr("output_padding") or [0] * r)
    auto = ctx.attr("auto_pad", "NOTSET") or "NOTSET"
    wanted = ctx.attr("output_shape")
    if auto == "VALID":
        return [0] * r, [0] * r, output_padding
    if wanted is None and auto in ("SAME_UPPER", "SAME_LOWER"):
        wanted = [size * s for size, s in zip(spatial, strides)]
    if wanted is None:
        pads = list(ctx.attr("pads") or [0] * (2 * r))
        return pads[:r], pads[r:], output_padding
    wanted = list(wanted)[-r:]
    before, after, extend = [], [], []
    for size, k, s, d, op, out in zip(spatial, kernel, strides, dilations, output_padding, wanted):
        total = conv_transpose_full_dim(size, k, s, d) + op - out
        small, large = total // 2, total - total // 2
        b, a = (small, large) if auto == "SAME_UPPER" else (large, small)
        if b < 0:
            raise ctx.fail(f"output_shape {list(wanted)} needs cells before the transposed convolution's output")
        before.append(b)
        after.append(max(a, 0))
        extend.append(op + max(-a, 0))
    return before, after, extend


def _convolution(ctx: OnnxContext) -> list[Value]:
    """``Conv`` (weight ``[out, in/group, *k]``) and ``ConvTranspose`` (weight ``[in, out/group, *k]``)."""
    weight = ctx.needed(1, "weight")
    xs = ctx.shape(0)
    r = len(xs) - 2
    if r < 1:
        raise ctx.fail(f"input rank {len(xs)} (expected batch, channels and spatial axes)")
    groups = int(ctx.attr("group", 1))
    kernel = list(ctx.attr("kernel_shape") or weight.value.shape[2:])
    strides = list(ctx.attr("strides") or [1] * r)
    dilations = list(ctx.attr("dilations") or [1] * r)
    _check_window(ctx, r, kernel, strides, dilations)
    if groups < 1:
        raise ctx.fail(f"group={groups}")
    if ctx.node.op_type == "ConvTranspose":
        kind, out_channels = "conv_transpose", int(weight.value.shape[1]) * groups
        before, after, output_padding = _conv_transpose_geometry(ctx, xs[2:], kernel, strides, dilations)
        extra = {"output_padding": tuple(output_padding)}
    else:
        kind, out_channels, extra = "conv", int(weight.value.shape[0]), {}
        before, after = _window_pads(ctx, xs[2:], kernel, strides, dilations)
    attrs = {"spatial_rank": r, "kernel": tuple(kernel), "stride": tuple(strides), "padding": tuple(before),
             "padding_after": tuple(after), "dilation": tuple(dilations), "groups": groups, "channel_axis": 1,
             "in_channels": xs[1], "out_channels": out_channels, **extra}
    nid = ctx.add(kind, [ctx.operand(0)], attrs)
    ctx.param_const(nid, "weight", weight)
    if ctx.has_input(2):
        ctx.param(nid, "bias", 2)
    else:
        ctx.b.param(nid, "bias", np.zeros(out_channels, dtype=ctx.b.payload.get(nid, "weight").dtype))
    return [nid]


def window_attrs(ctx: OnnxContext) -> dict:
    """The window geometry every ONNX pool shares (kernel, strides, dilations, explicit or automatic
    pads, ceil_mode) as the IR's pooling attributes, checked against the input's rank."""
    xs = ctx.shape(0)
    kernel = list(ctx.attr("kernel_shape"))
    r = len(kernel)
    strides = list(ctx.attr("strides") or [1] * r)
    dilations = list(ctx.attr("dilations") or [1] * r)
    if len(xs) < r + 1:
        raise ctx.fail(f"input rank {len(xs)} for a {r}-d window")
    _check_window(ctx, r, kernel, strides, dilations)
    before, after = _window_pads(ctx, xs[len(xs) - r:], kernel, strides, dilations)
    return {"spatial_rank": r, "kernel": tuple(kernel), "stride": tuple(strides), "padding": tuple(before),
            "padding_after": tuple(after), "dilation": tuple(dilations), "ceil_mode": bool(ctx.attr("ceil_mode", 0))}


def window_output(ctx: OnnxContext, kind: str, attrs: dict) -> tuple[int, ...]:
    """The pool's output shape by the registry's rule, refused when the file declares another."""
    out = tuple(REGISTRY[kind].infer(attrs, [ctx.shape(0)], ()))
    declared = ctx.declared.get(ctx.node.output[0])
    if declared is not None and tuple(declared) != out:
        raise ctx.fail(f"output shape {list(declared)} differs from the window rule's {list(out)}")
    return out


def _pool(kind: str) -> Handler:
    def lower(ctx: OnnxContext) -> list[Value]:
        if len(ctx.node.output) > 1 and ctx.node.output[1] and ctx.consumer_count(ctx.node.output[1]):
            raise ctx.fail("the Indices output is not supported")
        if int(ctx.attr("storage_order", 0)):
            raise ctx.fail("storage_order=1")
        attrs = {**window_attrs(ctx),
                 "count_include_pad": bool(ctx.attr("count_include_pad", 0)) or kind == "max_pool"}
        nd = f"{kind}_nd"
        out = window_output(ctx, nd, attrs)
        rewrite = REGISTRY[nd].v1_rewrite(attrs, [ctx.shape(0)], out)
        x = ctx.operand(0)
        if rewrite is not None:
            return [ctx.add(rewrite[0], [x], rewrite[1])]
        return [ctx.add(nd, [x], attrs)]
    return lower


def _global_pool(kind: str) -> Handler:
    def lower(ctx: OnnxContext) -> list[Value]:
        axes = tuple(range(2, ctx.rank(0)))
        return [ctx.add(kind, [ctx.operand(0)], {"axes": axes, "keepdim": True})]
    return lower


# -- normalization ----------------------------------------------------------------------------

def _unused_outputs(ctx: OnnxContext, what: str, training: bool = True) -> None:
    for name in ctx.node.output[1:]:
        if name and ctx.consumer_count(name):
            raise ctx.fail(f"the {what} outputs are only produced in training" if training else
                           f"the {what} outputs are read (only Y is lowered)")


def _batch_norm(ctx: OnnxContext) -> list[Value]:
    if int(ctx.attr("training_mode", 0)) or not int(ctx.attr("spatial", 1)):
        raise ctx.fail("training mode or spatial=0")
    if ctx.opset < 14 and any(ctx.node.output[1:]):
        raise ctx.fail("statistics outputs declared: before BatchNormalization-14 that is training mode, where Y "
                       "is normalized with the batch's own statistics")
    _unused_outputs(ctx, "running/saved statistics")
    xs = ctx.shape(0)
    if len(xs) < 2:
        raise ctx.fail(f"input rank {len(xs)}")
    nid = ctx.add("batch_norm_eval", [ctx.operand(0)],
                  {"channel_axis": 1, "channels": xs[1], "eps": float(ctx.attr("epsilon", 1e-5))})
    for i, role in enumerate(("weight", "bias", "running_mean", "running_var"), start=1):
        ctx.param(nid, role, i, reshape_to=(xs[1],))
    return [nid]


def _trivial(c: Const | None, fill: float) -> bool:
    """A ``Constant``-node scale/bias that is all ones/zeros: the layernorm default, not a weight."""
    return c is not None and not c.initializer and bool(np.all(c.value == fill))


def _layer_norm(ctx: OnnxContext) -> list[Value]:
    _unused_outputs(ctx, "Mean/InvStdDev", training=False)
    xs = ctx.shape(0)
    axis = ctx.axis(int(ctx.attr("axis", -1)), len(xs))
    nid = ctx.add("layernorm", [ctx.operand(0)], {"axis": axis, "eps": float(ctx.attr("epsilon", 1e-5))})
    suffix = xs[axis:]
    for i, role, fill in ((1, "weight", 1.0), (2, "bias", 0.0)):
        c = ctx.needed(i, role) if ctx.has_input(i) else None
        if c is None or _trivial(c, fill):
            continue
        if c.value.size != math.prod(suffix):
            raise ctx.fail(f"{role} shape {list(c.value.shape)} does not cover the normalized shape {list(suffix)}")
        ctx.param_const(nid, role, c, reshape_to=suffix)
    return [nid]


def _channel_param(ctx: OnnxContext, i: int, what: str, xs: tuple[int, ...], note: str = "") -> int:
    """Input ``i`` (a per-channel initializer) as a (C, 1, ..., 1) const, its binding reshaped alike."""
    c = ctx.needed(i, what)
    if c.value.size != xs[1]:
        raise ctx.fail(f"{what} with {c.value.size} entries for {xs[1]} channels{note}")
    per_channel = (xs[1],) + (1,) * (len(xs) - 2)
    name = f"{ctx.node.output[0]}::{what}"
    ctx.values[name] = c.derived(c.value.reshape(per_channel), "reshape:" + ",".join(map(str, per_channel)))
    return ctx.tensor(name)


def _normalized(ctx: OnnxContext, groups: int, note: str = "") -> list[Value]:
    """The shared group-norm decomposition, then the per-channel scale and bias."""
    xs = ctx.shape(0)
    try:
        y = decompositions.group_norm(ctx.b, ctx.operand(0), groups, float(ctx.attr("epsilon", 1e-5)), ctx.source)
    except decompositions.Undecomposable as e:
        raise ctx.fail(str(e)) from None
    return [decompositions.channel_affine(ctx.b, y, lambda: _channel_param(ctx, 1, "scale", xs, note),
                                          lambda: _channel_param(ctx, 2, "bias", xs, note), ctx.source)]


def _instance_norm(ctx: OnnxContext) -> list[Value]:
    """Per-(sample, channel) normalization: group norm with one group per channel."""
    xs = ctx.shape(0)
    if len(xs) < 3:
        raise ctx.fail(f"input rank {len(xs)}")
    return _normalized(ctx, xs[1])


def _group_norm(ctx: OnnxContext) -> list[Value]:
    """``GroupNormalization``: the shared group-norm decomposition with per-channel scale and bias
    (opset 21; opset 18's per-group scale and bias only when every group is one channel)."""
    xs = ctx.shape(0)
    if len(xs) < 3:
        raise ctx.fail(f"{int(ctx.attr('num_groups'))} groups of an input shaped {list(xs)}")
    return _normalized(ctx, int(ctx.attr("num_groups")),
                       " (opset 18's per-group form is supported only with one channel per group)")


def _lrn(ctx: OnnxContext) -> list[Value]:
    """``x / (bias + alpha/size * sum of squares over a channel window) ** beta``, written out with
    pad, slices and adds (no ext op: every step is an existing op, in the spec's order)."""
    xs = ctx.shape(0)
    size = int(ctx.attr("size"))
    alpha, beta, bias = float(ctx.attr("alpha", 1e-4)), float(ctx.attr("beta", 0.75)), float(ctx.attr("bias", 1.0))
    if len(xs) < 2 or size < 1:
        raise ctx.fail(f"input rank {len(xs)}, size {size}")
    x = ctx.operand(0)
    square = ctx.add("mul_elem", [x, x])
    window = square
    if size > 1:
        before, after = (size - 1) // 2, size - 1 - (size - 1) // 2
        zeros = (0,) * len(xs)
        padded = ctx.add("pad", [square], {"pads_before": zeros[:1] + (before,) + zeros[2:],
                                           "pads_after": zeros[:1] + (after,) + zeros[2:], "value": 0.0})
        parts = [ctx.add("slice", [padded], {"axes": (1,), "starts": (k,), "ends": (k + xs[1],), "steps": (1,)})
                 for k in range(size)]
        window = parts[0]
        for part in parts[1:]:
            window = ctx.add("add", [window, part])
    scaled = ctx.elementwise("mul_elem", [window, ctx.scalar(alpha / size)])
    base = ctx.elementwise("add", [scaled, ctx.scalar(bias)])
    return [ctx.elementwise("div", [x, ctx.add("pow", [base], {"exponent": beta})])]


# -- softmax ----------------------------------------------------------------------------------

def _softmax(kind: str) -> Handler:
    def lower(ctx: OnnxContext) -> list[Value]:
        xs = ctx.shape(0)
        rank = len(xs)
        if ctx.opset >= 13:
            return [ctx.add(kind, [ctx.operand(0)], {"axis": ctx.axis(int(ctx.attr("axis", -1)), rank)})]
        axis = ctx.axis(int(ctx.attr("axis", 1)), rank)
        if axis == rank - 1:
            return [ctx.add(kind, [ctx.operand(0)], {"axis": axis})]
        flat = ctx.b.reshape(ctx.operand(0), (math.prod(xs[:axis]), math.prod(xs[axis:])), ctx.source)
        y = ctx.add(kind, [flat], {"axis": 1})
        return [ctx.b.reshape(y, xs, ctx.source)]
    return lower


# -- Einsum -----------------------------------------------------------------------------------

def _weight_matrix(c: Const, letters: str, summed: list[str], right: list[str], k: int, n: int) -> Const:
    """A constant right operand laid out [k, n], its initializer binding extended by the same steps
    (so a contraction with a weight is a ``linear``, as ``MatMul`` with an initializer is)."""
    perm = [letters.index(ch) for ch in summed + right]
    if perm != sorted(perm):
        step = "transpose" if perm == [1, 0] else "permute:" + ",".join(map(str, perm))
        c = c.derived(np.transpose(c.value, perm), step)
    if c.value.shape != (k, n):
        c = c.derived(c.value.reshape(k, n), f"reshape:{k},{n}")
    return c


def _weight_contraction(ctx: OnnxContext, weight: Const) -> decompositions.WeightContraction:
    def contract(x: int, letters: str, summed: list[str], right: list[str], k: int, n: int) -> int:
        return _linear(ctx, x, _weight_matrix(weight, letters, summed, right, k, n), transpose=True)
    return contract


def _einsum(ctx: OnnxContext) -> list[Value]:
    """Every equation the spec allows, by the shared decomposition (importers/decompositions.py); a
    float initializer as the second of two operands is contracted as a ``linear`` weight."""
    weight = ctx.const(1) if len(ctx.node.input) == 2 else None
    contract = _weight_contraction(ctx, weight) if weight is not None and weight.value.dtype.kind == "f" else None
    try:
        return [decompositions.einsum(ctx.b, str(ctx.attr("equation")),
                                      [ctx.shape(i) for i in range(len(ctx.node.input))], ctx.operand, ctx.source,
                                      contract)]
    except decompositions.Undecomposable as e:
        raise ctx.fail(str(e)) from None


HANDLERS: dict[str, Handler] = {
    "Gemm": _gemm, "MatMul": _matmul, "Conv": _convolution, "ConvTranspose": _convolution,
    "MaxPool": _pool("max_pool"), "AveragePool": _pool("avg_pool"),
    "GlobalAveragePool": _global_pool("reduce_mean_axes"), "GlobalMaxPool": _global_pool("reduce_max"),
    "BatchNormalization": _batch_norm, "LayerNormalization": _layer_norm, "InstanceNormalization": _instance_norm,
    "LRN": _lrn, "GroupNormalization": _group_norm,
    "Softmax": _softmax("softmax"), "LogSoftmax": _softmax("log_softmax"), "Einsum": _einsum,
}

# ONNX operator versions each handler implements (see ops_math.OPSETS): Gemm before 7 (C broadcast
# only with broadcast=1) and BatchNormalization before 7 (is_test, consumed_inputs) are upgraded.
OPSETS: dict[str, tuple[int, int]] = {
    "Gemm": (7, 13), "MatMul": (1, 13), "Conv": (1, 22), "ConvTranspose": (1, 22), "MaxPool": (1, 22),
    "AveragePool": (1, 22), "GlobalAveragePool": (1, 22), "GlobalMaxPool": (1, 22), "BatchNormalization": (7, 15),
    "LayerNormalization": (17, 17), "InstanceNormalization": (1, 22), "LRN": (1, 13), "GroupNormalization": (18, 21),
    "Softmax": (1, 13), "LogSoftmax": (1, 13), "Einsum": (12, 28),
}

EMITS = frozenset({"linear", "matmul", "mul_elem", "add", "broadcast_to", "const", "conv", "conv_transpose",
                   "max_pool", "avg_pool", "max_pool_nd", "avg_pool_nd", "reduce_mean_axes", "reduce_max",
                   "batch_norm_eval", "layernorm", "softmax", "log_softmax", "reshape", "permute", "reduce_sum", "pad",
                   "slice", "pow", "div", "reduce_sum_axes", "abs", "sqrt"})
