"""ONNX Cast and CastLike to and from every numeric element type, and the narrow types' storage rounding.

Narrow values are held exactly in the IR's float (or int64) values (docs/element-types.md), so a
cast *from* a narrow type is exact and emits nothing but a float/int conversion; a cast *to* a
narrow float is ``round_float`` (ONNX's rounding, ``saturate`` and ``round_mode``); a cast to a
narrower integer type is ``int_wrap``: ONNX wraps fixed-point values out of range, but leaves a float
out of the target's range undefined, so a float operand is truncated toward zero and a value outside
the target type (int2 .. uint32 alike) is refused at evaluation, naming the node and the value, never
wrapped (peers differ: onnxruntime wraps int4, onnx's reference with current ml_dtypes gives 0).
CastLike takes its target from input 1's element type; a constant operand folds with onnx's
reference conversion.

``round_narrow_outputs`` is the storage precision of narrow-typed models: every ONNX node whose
output onnx's inference types as float16/bfloat16/float8... computes in the evaluator's precision from
its exact narrow operands, and its output is rounded once to its type.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from torchlean_bridge.ops import BOOL, FLOAT, INT64

from .context import Const, OnnxContext, Value
from .inputs import element_type_name
from .ops_math import onnx_element_type, refuse_mixed_precision_cast, refuse_wrapping_cast

__all__ = ["HANDLERS", "OPSETS", "EMITS", "undefined_cast", "round_narrow_outputs", "NARROW_FLOAT_CODES", "NARROW_INT_CODES"]

Handler = Callable[[OnnxContext], list[Value]]

NARROW_FLOAT_CODES = {10: "float16", 16: "bfloat16", 17: "float8e4m3fn", 18: "float8e4m3fnuz", 19: "float8e5m2",
                      20: "float8e5m2fnuz", 23: "float4e2m1", 24: "float8e8m0", 27: "float6e2m3", 28: "float6e3m2"}
# ONNX integer types narrower than int64: code -> (bits, signed)
NARROW_INT_CODES = {21: (4, False), 22: (4, True), 25: (2, False), 26: (2, True), 2: (8, False), 3: (8, True),
                    4: (16, False), 5: (16, True), 6: (32, True), 12: (32, False)}
_SUB_BYTE = {21, 22, 25, 26}
_BOOL = 9
_UINT64 = 13


def input_elem_type(ctx: OnnxContext, i: int) -> int | None:
    """The ONNX element type (TensorProto code) of input ``i``: a constant's dtype, else inference's."""
    from onnx import helper
    name = ctx.node.input[i]
    v = ctx.values[name]
    if isinstance(v, Const):
        try:
            return int(helper.np_dtype_to_tensor_dtype(v.value.dtype))
        except (KeyError, TypeError, ValueError):
            return None
    t = ctx.onnx_types.get(name)
    return int(t) if t else None


def _int_range(code: int | None) -> tuple[int, int] | None:
    if code == _BOOL:
        return 0, 1
    if code in NARROW_INT_CODES:
        bits, signed = NARROW_INT_CODES[code]
        return (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    return None


def undefined_cast(value: np.ndarray, to: int) -> str | None:
    """Why casting float ``value`` to integer type ``to`` is undefined in ONNX (non-finite, or out of the
    target's range after truncation toward zero), naming the first offending value; None when defined."""
    if value.dtype.kind != "f" or onnx_element_type(to) != INT64 or not value.size:
        return None
    flat = value.astype(np.float64).reshape(-1)
    lo, hi = _int_range(to) or ((0, 2 ** 64 - 1) if to == _UINT64 else (-2 ** 63, 2 ** 63 - 1))
    t = np.trunc(flat)
    bad = np.flatnonzero(~((t >= float(lo)) & (t < float(hi + 1))))  # hi + 1 is exact as a float; NaN is bad
    if not bad.size:
        return None
    return (f"constant input 0 holds {float(flat[bad[0]])!r}, outside {element_type_name(to)} (ONNX leaves a float "
            "cast out of range undefined); refused")


def _fold(ctx: OnnxContext, src: Const, to: int, saturate: bool, round_mode: str) -> list[Value]:
    """A constant operand converted at import time by onnx's reference conversion (what Cast computes)."""
    from onnx.reference.ops.op_cast import cast_to
    value = src.value
    reason = undefined_cast(value, to)
    if reason:
        raise ctx.fail(reason)
    with np.errstate(all="ignore"):
        return [Const(np.asarray(cast_to(value, to, saturate, round_mode)), folded=True)]


def lower_cast(ctx: OnnxContext, to: int, saturate: bool, round_mode: str) -> list[Value]:
    """Input 0 converted to ONNX element type ``to``."""
    target = onnx_element_type(to)
    if target is None:
        raise ctx.fail(f"cast to {element_type_name(to)}, which the IR cannot hold")
    src = ctx.const(0)
    if src is not None:
        return _fold(ctx, src, to, saturate, round_mode)
    source = input_elem_type(ctx, 0)
    x, dtype = ctx.operand(0), ctx.dtype(0)
    same = ctx.values[ctx.node.input[0]]
    if source == to:
        return [same]
    if to in NARROW_FLOAT_CODES:
        if dtype != FLOAT:
            x = ctx.add("cast", [x], {"dtype": FLOAT})
        return [ctx.add("round_float", [x], {"format": NARROW_FLOAT_CODES[to], "saturate": bool(saturate),
                                             "round_mode": round_mode})]
    if to in NARROW_INT_CODES:
        fits, (lo, hi) = _int_range(source), _int_range(to)
        if dtype == INT64 and fits is not None and lo <= fits[0] and fits[1] <= hi:
            return [same]  # a widening: every source value is a target value
        x = x if dtype == INT64 else ctx.add("cast", [x], {"dtype": INT64})
        if dtype == BOOL:
            return [x]
        bits, signed = NARROW_INT_CODES[to]
        # float to int2..uint32 out of range is undefined in ONNX: refused at evaluation, never wrapped
        checked = dtype == FLOAT
        return [ctx.add("int_wrap", [x], {"bits": bits, "signed": signed, "wrap": not checked})]
    if source in NARROW_FLOAT_CODES or source in _SUB_BYTE:
        # exact: every narrow value is a float32 / int64 value
        return [same] if dtype == target else [ctx.add("cast", [x], {"dtype": target})]
    refuse_wrapping_cast(ctx, to)  # uint64: values past int64 would wrap
    refuse_mixed_precision_cast(ctx, to)
    return [same] if dtype == target else [ctx.add("cast", [x], {"dtype": target})]


def _attrs(ctx: OnnxContext) -> tuple[bool, str]:
    saturate = bool(ctx.attr("saturate", 1))
    round_mode = str(ctx.attr("round_mode", "up"))
    if round_mode not in ("up", "down", "nearest"):
        raise ctx.fail(f"round_mode={round_mode!r}")
    return saturate, round_mode


def _cast(ctx: OnnxContext) -> list[Value]:
    return lower_cast(ctx, int(ctx.attr("to")), *_attrs(ctx))


def _cast_like(ctx: OnnxContext) -> list[Value]:
    to = input_elem_type(ctx, 1)
    if to is None:
        raise ctx.fail("the element type of input 1 (target_type) is unknown")
    return lower_cast(ctx, to, *_attrs(ctx))


def round_narrow_outputs(ctx: OnnxContext, node: Any, outs: list[Value], start: int) -> list[Value]:
    """Each float value the node computed (an IR node from ``start`` on) whose ONNX type is a narrow float,
    rounded once to that type (unless the node already is that rounding)."""
    result = []
    for name, value in zip(node.output, outs):
        fmt = NARROW_FLOAT_CODES.get(ctx.onnx_types.get(name, 0)) if name else None
        if fmt is not None and isinstance(value, int) and value >= start and ctx.b.dtype(value) == FLOAT:
            made = ctx.b.nodes[value]
            if not (made.kind == "round_float" and made.attrs.get("format") == fmt):
                value = ctx.add("round_float", [value], {"format": fmt, "saturate": True, "round_mode": "nearest"})
        result.append(value)
    return result


HANDLERS: dict[str, Handler] = {"Cast": _cast, "CastLike": _cast_like}
# Cast-6..-28 (saturate from -19, round_mode from -24, more element types from -21..-25); CastLike-15..-25
OPSETS: dict[str, tuple[int, int]] = {"Cast": (6, 28), "CastLike": (15, 25)}
EMITS = frozenset({"cast", "round_float", "int_wrap"})
