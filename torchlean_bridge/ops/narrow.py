"""Ops for ONNX's narrow element types (issue #15): values of float16 / bfloat16 / float8 / float4 /
float6 / e8m0 tensors are held exactly in the IR's float values, int4 / int2 values in int64 (every
such value is exactly representable there), so the IR needs no new element type, only the two
roundings that *produce* narrow values: ``round_float`` (a float onto a narrow float grid, as ONNX
Cast rounds) and ``int_wrap`` (an integer reduced modulo 2^bits, as ONNX Cast narrows integers), and
the exact integer products quantized models accumulate (``int_matmul``, ``int_conv``).
docs/element-types.md states their semantics; ``semantics/narrow.py`` computes them.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ..errors import ShapeRuleError
from .contracts import Shape, conv_out_shape, fmt_shape, matmul_dims
from .registry import FLOAT, INT64, Attr, OpSpec, int_only, register
from .v1 import CONV_ATTRS, _identity

__all__ = ["NARROW_FLOAT_FORMATS", "NARROW_INT_BITS", "ROUND_MODES"]

# ONNX's names (TensorProto.DataType, lower case) of the narrow float element types
NARROW_FLOAT_FORMATS = ("float16", "bfloat16", "float8e4m3fn", "float8e4m3fnuz", "float8e5m2", "float8e5m2fnuz",
                        "float4e2m1", "float6e2m3", "float6e3m2", "float8e8m0")
NARROW_INT_BITS = (2, 4, 8, 16, 32)
ROUND_MODES = ("nearest", "up", "down")


def _float_to_float(kind: str):
    def rule(attrs: Mapping[str, Any], parents: Sequence[str], declared: str) -> str:
        if parents[0] != FLOAT:
            raise ShapeRuleError(f"{kind}: operand 0 has element type {parents[0]}, expected float")
        return FLOAT
    return rule


def _int_to_int(attrs: Mapping[str, Any], parents: Sequence[str], declared: str) -> str:
    if parents[0] != INT64:
        raise ShapeRuleError(f"int_wrap: operand 0 has element type {parents[0]}, expected int64")
    return INT64


register(OpSpec("round_float", "ext", 1, 1, _identity,
                attrs=(Attr("format", "str", choices=NARROW_FLOAT_FORMATS), Attr("saturate", "bool", True),
                       Attr("round_mode", "str", "nearest", choices=ROUND_MODES)),
                dtype=_float_to_float("round_float"),
                doc="x rounded onto the grid of the narrow float `format` (ONNX Cast to that type, then back: "
                    "round to nearest even; `saturate` for float8 and e8m0; `round_mode` for e8m0 only)"))
register(OpSpec("int_wrap", "ext", 1, 1, _identity,
                attrs=(Attr("bits", "nat", choices=NARROW_INT_BITS), Attr("signed", "bool", True),
                       Attr("wrap", "bool", True)),
                dtype=_int_to_int,
                doc="x modulo 2^bits, two's complement when `signed` (ONNX Cast to a narrower integer type); with "
                    "`wrap` false a value outside the type is refused instead (float to integer: undefined in ONNX)"))


# -- integer products for quantized models (MatMulInteger, ConvInteger, QLinearMatMul, QLinearConv) -------
# Exact on int64 values; the float rule refuses operands whose products could reach 2^53 (so the ONNX
# form, a conv in binary64, is exact too).

def _int_conv(attrs: Mapping[str, Any], p: Sequence[Shape], d: Shape) -> Shape:
    groups, kernel = attrs["groups"], tuple(attrs["kernel"])
    want = (attrs["out_channels"], attrs["in_channels"] // max(groups, 1)) + kernel
    if tuple(p[1]) != want:
        raise ShapeRuleError(f"int_conv: weight shape {fmt_shape(p[1])}, expected {fmt_shape(want)}")
    return conv_out_shape(p[0], **{a.name: attrs[a.name] for a in CONV_ATTRS})


register(OpSpec("int_matmul", "ext", 2, 2, lambda a, p, d: matmul_dims(p[0], p[1]), dtype=int_only("int_matmul"),
                doc="integer matrix product (numpy matmul rules), exact in int64"))
register(OpSpec("int_conv", "ext", 2, 2, _int_conv, attrs=CONV_ATTRS, dtype=int_only("int_conv"),
                doc="integer convolution of (x, weight) with conv's geometry, no bias, exact in int64"))
