"""ONNX quantization ops, lowered to the IR's exact ops (docs/element-types.md, "Quantization").

- QuantizeLinear: ``x / y_scale`` (the division rounded to the ``precision`` type, by default y_scale's),
  then for integer targets ``clamp(round_half_even(q) + zero_point, lo, hi)`` as int64, for float8
  ``round_float(q)`` with ``saturate``, for float4/float6 ``round_float(q + zero_point)``.
- DequantizeLinear: ``(x - zero_point) * x_scale``, the difference exact in int64, rounded once to the
  output type (``output_dtype``, else x_scale's).
- DynamicQuantizeLinear: onnx's formula (uint8) in binary32, step by step.
- MatMulInteger / ConvInteger: ``int_matmul`` / ``int_conv`` of the zero-point-shifted operands (exact).
- QLinearMatMul / QLinearConv: the exact integer product, rescaled by ``a_scale * b_scale / y_scale``
  in the evaluator's precision (binary32 for float32 models, as onnxruntime; onnx's reference rescales
  in binary64), then rounded half to even, shifted by the output zero point and clamped.

Scales and zero points broadcast per tensor, per axis, or blocked (``block_size``): a constant one is
expanded at import (onnx's reference ``reshape_input``); a computed one must be per tensor.
Clamping before the conversion to int64 gives the exact result even where ``q + zero_point`` rounds
in binary32 (rounding is monotone and the bounds are representable); a NaN is refused by the cast.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from torchlean_bridge.ops import FLOAT, INT64

from .context import OnnxContext, Value
from .inputs import element_type_name
from .ops_cast import NARROW_FLOAT_CODES, input_elem_type
from .ops_int import _broadcast_add
from .ops_nn import _check_window, _window_pads
from semantics.narrow import widen

__all__ = ["HANDLERS", "OPSETS", "EMITS"]

Handler = Callable[[OnnxContext], list[Value]]

_INT_RANGES = {2: (0, 255), 3: (-128, 127), 4: (0, 65535), 5: (-32768, 32767), 21: (0, 15), 22: (-8, 7),
               25: (0, 3), 26: (-2, 1), 6: (-2 ** 31, 2 ** 31 - 1)}
_FLOAT8 = {17, 18, 19, 20}
_FINITE_ONLY = {23, 27, 28}  # float4e2m1, float6e2m3, float6e3m2


def _expanded(ctx: OnnxContext, i: int, axis: int, block: int) -> int:
    """Scale / zero point input ``i`` as an IR node that broadcasts against input 0."""
    shape = ctx.shape(0)
    c = ctx.const(i)
    if c is not None:
        from onnx.reference.ops._quant_utils import reshape_input
        value = np.asarray(widen(c.value))
        if value.ndim > 1 and not block:
            raise ctx.fail(f"input {i} has rank {value.ndim}; per-axis parameters are 1-D (blocked ones need "
                           "block_size)")
        try:
            value = np.asarray(reshape_input(value, tuple(shape), axis, block or None))
        except (ValueError, IndexError) as e:
            raise ctx.fail(f"input {i} of shape {list(c.value.shape)} does not fit input 0 of shape {list(shape)} "
                           f"(axis={axis}, block_size={block}): {e}") from None
        return ctx.b.const(value, source=ctx.source, folded=True)
    if int(np.prod(ctx.shape(i))) != 1 or block:
        ctx.needed(i, "a per-axis or blocked scale / zero point")  # raises, naming the tensor to bind
    return ctx.operand(i)


def _float(ctx: OnnxContext, nid: int) -> int:
    return nid if ctx.b.dtype(nid) == FLOAT else ctx.add("cast", [nid], {"dtype": FLOAT})


def _int(ctx: OnnxContext, nid: int) -> int:
    return nid if ctx.b.dtype(nid) == INT64 else ctx.add("cast", [nid], {"dtype": INT64})


def _round_to(ctx: OnnxContext, nid: int, code: int | None, saturate: bool = True) -> int:
    """``nid`` rounded to ONNX float type ``code`` when that is a narrow float, else as it is."""
    fmt = NARROW_FLOAT_CODES.get(code or 0)
    if fmt is None:
        return nid
    return ctx.add("round_float", [nid], {"format": fmt, "saturate": bool(saturate), "round_mode": "nearest"})


def _zero_point_is_zero(ctx: OnnxContext, i: int, what: str) -> None:
    if not ctx.has_input(i):
        return
    c = ctx.needed(i, f"a {what} zero point")
    if np.any(np.asarray(widen(c.value), dtype=np.float64) != 0):
        raise ctx.fail(f"a {what} zero point must be 0 (ONNX requires it)")


def _axis_block(ctx: OnnxContext) -> tuple[int, int]:
    rank = len(ctx.shape(0))
    per_tensor = int(np.prod(ctx.shape(1))) == 1  # a 1-D input is quantized per tensor: axis is not read
    axis = 0 if per_tensor or rank == 0 else ctx.axis(int(ctx.attr("axis", 1)), rank)
    block = int(ctx.attr("block_size", 0))
    if block < 0:
        raise ctx.fail(f"block_size={block}")
    return axis, block


def _quantized_type(ctx: OnnxContext, zp_index: int) -> int:
    declared = int(ctx.attr("output_dtype", 0))
    if ctx.has_input(zp_index):
        zp_type = input_elem_type(ctx, zp_index)
        if declared and zp_type != declared:
            raise ctx.fail(f"output_dtype {element_type_name(declared)} differs from the zero point's type")
        return int(zp_type or 0)
    return declared or 2  # uint8


def _requantize(ctx: OnnxContext, q: int, zp_index: int, to: int, axis: int, block: int) -> int:
    """``clamp(round(q) + zero_point, lo, hi)`` as int64 (an integer target type ``to``)."""
    lo, hi = _INT_RANGES[to]
    r = ctx.add("round", [q])
    if ctx.has_input(zp_index):
        r = ctx.elementwise("add", [r, _float(ctx, _expanded(ctx, zp_index, axis, block))])
    return ctx.add("cast", [ctx.add("clamp", [r], {"min": float(lo), "max": float(hi)})], {"dtype": INT64})


def _quantize(ctx: OnnxContext) -> list[Value]:
    if ctx.dtype(0) != FLOAT:
        raise ctx.fail(f"x of element type {ctx.onnx_type(ctx.node.input[0])}")
    axis, block = _axis_block(ctx)
    to = _quantized_type(ctx, 2)
    saturate = bool(ctx.attr("saturate", 1))
    q = ctx.elementwise("div", [ctx.operand(0), _float(ctx, _expanded(ctx, 1, axis, block))])
    q = _round_to(ctx, q, int(ctx.attr("precision", 0)) or input_elem_type(ctx, 1))
    if to in _INT_RANGES:
        return [_requantize(ctx, q, 2, to, axis, block)]
    if to in _FLOAT8:
        _zero_point_is_zero(ctx, 2, element_type_name(to))
        return [_round_to(ctx, q, to, saturate)]
    if to in _FINITE_ONLY:
        if ctx.has_input(2):
            q = ctx.elementwise("add", [q, _float(ctx, _expanded(ctx, 2, axis, block))])
        return [_round_to(ctx, q, to)]
    raise ctx.fail(f"quantization to {element_type_name(to)}")


def _dequantize(ctx: OnnxContext) -> list[Value]:
    axis, block = _axis_block(ctx)
    source = input_elem_type(ctx, 0)
    x = ctx.operand(0)
    if ctx.dtype(0) == INT64:
        if ctx.has_input(2):
            zp = _int(ctx, _expanded(ctx, 2, axis, block))
            x = _broadcast_add(ctx, "int_sub", x, zp, {"bits": 64, "signed": True})
        x = _float(ctx, x)
    elif ctx.dtype(0) == FLOAT and source in NARROW_FLOAT_CODES:
        _zero_point_is_zero(ctx, 2, element_type_name(source))
    else:
        raise ctx.fail(f"x of element type {ctx.onnx_type(ctx.node.input[0])}")
    y = ctx.elementwise("mul_elem", [x, _float(ctx, _expanded(ctx, 1, axis, block))])
    return [_round_to(ctx, y, int(ctx.attr("output_dtype", 0)) or input_elem_type(ctx, 1))]


def _dynamic_quantize(ctx: OnnxContext) -> list[Value]:
    """onnx's DynamicQuantizeLinear (uint8): scale from the range of x and 0, zero point rounded and clamped."""
    if ctx.dtype(0) != FLOAT:
        raise ctx.fail(f"x of element type {ctx.onnx_type(ctx.node.input[0])}")
    x = ctx.operand(0)
    axes = tuple(range(len(ctx.shape(0))))
    zero = ctx.scalar(0.0)
    top = ctx.elementwise("max_elem", [ctx.add("reduce_max", [x], {"axes": axes, "keepdim": False}), zero])
    bottom = ctx.elementwise("min_elem", [ctx.add("reduce_min", [x], {"axes": axes, "keepdim": False}), zero])
    span = ctx.elementwise("where", [ctx.elementwise("eq", [top, bottom]), ctx.scalar(1.0),
                                     ctx.elementwise("sub", [top, bottom])])
    scale = ctx.elementwise("div", [span, ctx.scalar(255.0)])
    initial = ctx.elementwise("sub", [zero, ctx.elementwise("div", [bottom, scale])])
    zp = ctx.add("round", [ctx.add("clamp", [initial], {"min": 0.0, "max": 255.0})])
    q = ctx.add("round", [ctx.elementwise("div", [x, scale])])
    y = ctx.add("clamp", [ctx.elementwise("add", [q, zp])], {"min": 0.0, "max": 255.0})
    return [ctx.add("cast", [y], {"dtype": INT64}), scale, ctx.add("cast", [zp], {"dtype": INT64})]


def _shifted(ctx: OnnxContext, i: int, zp_index: int, shape_for_zp) -> int:
    """Integer input ``i`` minus its zero point (exact, int64)."""
    if ctx.dtype(i) != INT64:
        raise ctx.fail(f"input {i} of element type {ctx.onnx_type(ctx.node.input[i])}")
    x = ctx.operand(i)
    if not ctx.has_input(zp_index):
        return x
    c = ctx.const(zp_index)
    if c is None and int(np.prod(ctx.shape(zp_index))) != 1:
        c = ctx.needed(zp_index, "a per-row / per-channel zero point")
    if c is None:
        zp = ctx.operand(zp_index)
    else:
        value = np.asarray(widen(c.value)).astype(np.int64)
        zp = ctx.b.const(shape_for_zp(value), source=ctx.source, folded=True)
    return _broadcast_add(ctx, "int_sub", x, zp, {"bits": 64, "signed": True})


def _per_row(ctx: OnnxContext, i: int):
    """A's zero point: a scalar, or one per row of A (1-D of A's row count)."""
    rows = ctx.shape(i)[-2] if len(ctx.shape(i)) >= 2 else 1

    def shape(value: np.ndarray) -> np.ndarray:
        if value.size == 1:
            return value.reshape(())
        if value.ndim != 1 or value.size != rows:
            raise ctx.fail(f"A's zero point of shape {list(value.shape)} (expected a scalar or {rows} per row)")
        return value.reshape(rows, 1)
    return shape


def _per_column(value: np.ndarray) -> np.ndarray:
    return value.reshape(()) if value.size == 1 else value


def _matmul_integer(ctx: OnnxContext) -> list[Value]:
    a, b = _shifted(ctx, 0, 2, _per_row(ctx, 0)), _shifted(ctx, 1, 3, _per_column)
    return [ctx.add("int_matmul", [a, b])]


def _qlinear_matmul(ctx: OnnxContext) -> list[Value]:
    """Inputs: a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point."""
    a = _shifted(ctx, 0, 2, _per_row(ctx, 0))
    b = _shifted(ctx, 3, 5, _per_column)
    product = ctx.add("int_matmul", [a, b])
    return [_rescale(ctx, product, (1, 4, 6), 7, last_axis=True)]


def _rescale(ctx: OnnxContext, product: int, scales: tuple[int, int, int], zp_index: int, last_axis: bool) -> int:
    """``clamp(round(product * (s_a * s_b / s_y)) + y_zero_point)`` in the output's integer type."""
    to = input_elem_type(ctx, zp_index) if ctx.has_input(zp_index) else input_elem_type(ctx, 0)
    if to not in _INT_RANGES:
        raise ctx.fail(f"output type {element_type_name(to or 0)}")
    out_shape = ctx.b.shape(product)

    def scale(i: int) -> int:
        c = ctx.const(i)
        if c is None and int(np.prod(ctx.shape(i))) != 1:
            c = ctx.needed(i, "a per-channel scale")
        if c is None:
            return ctx.operand(i)
        value = np.asarray(widen(c.value))
        if value.size > 1:  # per output channel / column
            value = value.reshape(-1) if last_axis else value.reshape((-1,) + (1,) * (len(out_shape) - 2))
        return ctx.b.const(value.reshape(()) if value.size == 1 else value, source=ctx.source, folded=True)

    code = input_elem_type(ctx, scales[0])
    factor = _round_to(ctx, ctx.elementwise("mul_elem", [scale(scales[0]), scale(scales[1])]), code)
    factor = _round_to(ctx, ctx.elementwise("div", [factor, scale(scales[2])]), code)
    q = ctx.elementwise("mul_elem", [_float(ctx, product), factor])
    lo, hi = _INT_RANGES[to]
    r = ctx.add("round", [q])
    if ctx.has_input(zp_index):
        c = ctx.const(zp_index)
        if c is None:
            zp = ctx.operand(zp_index)
        else:
            value = np.asarray(widen(c.value)).astype(np.float64)
            zp = ctx.b.const(value.reshape(()) if value.size == 1 else value, source=ctx.source, folded=True)
        r = ctx.elementwise("add", [r, _float(ctx, zp)])
    return ctx.add("cast", [ctx.add("clamp", [r], {"min": float(lo), "max": float(hi)})], {"dtype": INT64})


def _conv_geometry(ctx: OnnxContext, weight_shape: tuple[int, ...]) -> dict:
    xs = ctx.shape(0)
    r = len(xs) - 2
    if r < 1:
        raise ctx.fail(f"input rank {len(xs)} (expected batch, channels and spatial axes)")
    groups = int(ctx.attr("group", 1))
    kernel = list(ctx.attr("kernel_shape") or weight_shape[2:])
    strides = list(ctx.attr("strides") or [1] * r)
    dilations = list(ctx.attr("dilations") or [1] * r)
    _check_window(ctx, r, kernel, strides, dilations)
    if groups < 1:
        raise ctx.fail(f"group={groups}")
    before, after = _window_pads(ctx, xs[2:], kernel, strides, dilations)
    return {"spatial_rank": r, "kernel": tuple(kernel), "stride": tuple(strides), "padding": tuple(before),
            "padding_after": tuple(after), "dilation": tuple(dilations), "groups": groups, "channel_axis": 1,
            "in_channels": xs[1], "out_channels": int(weight_shape[0])}


def _per_output_channel(rank: int):
    def shape(value: np.ndarray) -> np.ndarray:
        return value.reshape(()) if value.size == 1 else value.reshape((-1,) + (1,) * (rank - 1))
    return shape


def _conv_integer(ctx: OnnxContext) -> list[Value]:
    w_shape = ctx.shape(1)
    x = _shifted(ctx, 0, 2, lambda v: v.reshape(()))
    w = _shifted(ctx, 1, 3, _per_output_channel(len(w_shape)))
    return [ctx.add("int_conv", [x, w], _conv_geometry(ctx, w_shape))]


def _qlinear_conv(ctx: OnnxContext) -> list[Value]:
    """Inputs: x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, B (int32 bias)."""
    w_shape = ctx.shape(3)
    x = _shifted(ctx, 0, 2, lambda v: v.reshape(()))
    w = _shifted(ctx, 3, 5, _per_output_channel(len(w_shape)))
    geometry = _conv_geometry(ctx, w_shape)
    product = ctx.add("int_conv", [x, w], geometry)
    if ctx.has_input(8):
        bias = _int(ctx, ctx.operand(8))
        rank = len(ctx.b.shape(product))
        bias = ctx.add("reshape", [bias], {"in_shape": tuple(ctx.b.shape(bias)),
                                           "out_shape": (w_shape[0],) + (1,) * (rank - 2)})
        product = _broadcast_add(ctx, "int_add", product, bias, {"bits": 64, "signed": True})
    return [_rescale(ctx, product, (1, 4, 6), 7, last_axis=False)]


HANDLERS: dict[str, Handler] = {
    "QuantizeLinear": _quantize, "DequantizeLinear": _dequantize, "DynamicQuantizeLinear": _dynamic_quantize,
    "MatMulInteger": _matmul_integer, "ConvInteger": _conv_integer, "QLinearMatMul": _qlinear_matmul,
    "QLinearConv": _qlinear_conv,
}
# QuantizeLinear/DequantizeLinear-10 (per tensor), -13 (axis), -19 (float8, saturate), -21 (blocked, int4/int16,
# output_dtype), -23..-28 (float4, int2, precision); QLinearMatMul-21 (more types); the others have one version
OPSETS: dict[str, tuple[int, int]] = {
    "QuantizeLinear": (10, 28), "DequantizeLinear": (10, 28), "DynamicQuantizeLinear": (11, 11),
    "MatMulInteger": (10, 10), "ConvInteger": (10, 10), "QLinearMatMul": (10, 21), "QLinearConv": (10, 10),
}
EMITS = frozenset({"div", "round", "add", "clamp", "cast", "round_float", "mul_elem", "int_sub", "int_add",
                   "int_matmul", "int_conv", "reshape", "max_elem", "min_elem", "reduce_max", "reduce_min", "where",
                   "eq", "sub", "const", "broadcast_to"})
