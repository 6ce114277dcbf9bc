"""ONNX CastLike: Cast to the element type of a second tensor.

The target comes from the second input's element type (its value is never read). A constant first
input is converted at import time with numpy's conversion (what onnx's reference does); a computed one
is the IR's ``cast`` exactly as ``Cast`` lowers it, with the same refusals (float16/bfloat16, float8,
int4 and other element types the IR has no exact conversion for are refused by name).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from .context import Const, OnnxContext, Value
from .inputs import element_type_name
from .ops_math import _NARROW_FLOATS, onnx_element_type, refuse_mixed_precision_cast, refuse_wrapping_cast

__all__ = ["HANDLERS", "OPSETS", "EMITS"]

Handler = Callable[[OnnxContext], list[Value]]


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


def _cast_like(ctx: OnnxContext) -> list[Value]:
    from onnx import helper
    to = input_elem_type(ctx, 1)
    if to is None:
        raise ctx.fail("the element type of input 1 (target_type) is unknown")
    target = onnx_element_type(to)
    if target is None or to in _NARROW_FLOATS:
        raise ctx.fail(f"cast to {element_type_name(to)} (the IR has no exact conversion to that element type)")
    src = ctx.const(0)
    if src is not None:
        want = np.dtype(helper.tensor_dtype_to_np_dtype(to))
        if src.value.dtype.kind in "iu" and want.kind in "iu" and src.value.size:
            info = np.iinfo(want)
            if src.value.min() < info.min or src.value.max() > info.max:
                raise ctx.fail(f"constant input 0 holds values outside {want.name} (the conversion would wrap)")
        if src.value.dtype.kind == "f" and want.kind in "iu" and src.value.size \
                and not np.all(np.isfinite(src.value)):
            raise ctx.fail(f"constant input 0 holds non-finite values, which have no {want.name} value")
        return [Const(src.value.astype(want), folded=True)]
    refuse_wrapping_cast(ctx, to)
    refuse_mixed_precision_cast(ctx, to)
    if ctx.dtype(0) == target:
        return [ctx.values[ctx.node.input[0]]]
    return [ctx.add("cast", [ctx.operand(0)], {"dtype": target})]


HANDLERS: dict[str, Handler] = {"CastLike": _cast_like}
# CastLike-15 and -19 (saturate, which only float8 targets read) and -21..-25 (more element types)
OPSETS: dict[str, tuple[int, int]] = {"CastLike": (15, 25)}
EMITS = frozenset({"cast"})
