"""Graph inputs: their types and static shapes, and inputs the caller binds to values.

Only tensors of the IR's element types are accepted (float32/float64 as float, integer types as
int64, bool); every other type is refused by its ONNX name (sequence, optional and map types
included). The narrow types (float16, bfloat16, float8, float4, float6, e8m0 as float; int4, int2 as
int64) are held exactly in those, with their roundings explicit in the graph (docs/element-types.md). A symbolic or missing batch dimension (axis 0) is 1, with a note; any other symbolic
dimension needs ``input_shapes``, and the message names each one.
"""

from __future__ import annotations

import operator
from typing import Any, Mapping, Sequence

import numpy as np

from torchlean_bridge.errors import BridgeError

__all__ = ["InputShapes", "element_type_name", "check_tensor_type", "static_input_shapes", "bound_constants",
           "NARROW_FLOATS"]

InputShapes = Mapping[str, Sequence[int]] | Sequence[Sequence[int]] | None

NARROW_FLOATS = {10, 16, 17, 18, 19, 20, 23, 24, 27, 28}  # float16, bfloat16, float8*, float4, e8m0, float6*
_FLOATS, _INTS, _BOOL = {1, 11} | NARROW_FLOATS, {2, 3, 4, 5, 6, 7, 12, 13, 21, 22, 25, 26}, 9


def element_type_name(elem_type: int) -> str:
    """ONNX's name of an element type (``uint8``, ``float16``...)."""
    from onnx import TensorProto
    try:
        return TensorProto.DataType.Name(elem_type).lower()
    except ValueError:
        return f"unknown element type {elem_type}"


def _type_text(tp: Any, depth: int = 0) -> str:
    """ONNX's notation for a type: ``seq(tensor(float))``, ``map(int64,tensor(float))``, ``optional(...)``."""
    kind = tp.WhichOneof("value")
    if depth > 8 or kind is None:
        return "?"
    if kind in ("tensor_type", "sparse_tensor_type"):
        inner = element_type_name(getattr(tp, kind).elem_type)
        return f"{'sparse_tensor' if kind == 'sparse_tensor_type' else 'tensor'}({inner})"
    if kind == "sequence_type":
        return f"seq({_type_text(tp.sequence_type.elem_type, depth + 1)})"
    if kind == "optional_type":
        return f"optional({_type_text(tp.optional_type.elem_type, depth + 1)})"
    if kind == "map_type":
        return f"map({element_type_name(tp.map_type.key_type)},{_type_text(tp.map_type.value_type, depth + 1)})"
    return kind


def check_tensor_type(vi: Any, what: str) -> None:
    """A graph input or output must be a tensor of a supported element type."""
    kind = vi.type.WhichOneof("value")
    if kind is None:
        raise BridgeError(f"ONNX import: {what} `{vi.name}` has no type")
    if kind != "tensor_type":
        label = {"sequence_type": "a sequence", "optional_type": "an optional", "map_type": "a map",
                 "sparse_tensor_type": "a sparse tensor"}.get(kind, kind)
        raise BridgeError(f"ONNX import: {what} `{vi.name}` is {label} ({_type_text(vi.type)}); only tensors "
                          "are supported")
    et = vi.type.tensor_type.elem_type
    if et == 0 and what == "graph output":
        return  # unknown output type: the value's own type is used
    if et not in _FLOATS and et not in _INTS and et != _BOOL:
        raise BridgeError(f"ONNX import: {what} `{vi.name}` has element type {element_type_name(et)}, which the IR "
                          "does not support (float32/float64, integer types as int64, bool)")


def _given_shape(name: str, dims: Any) -> tuple[int, ...]:
    """A caller's shape for input ``name``: a sequence of non-negative ints, else a BridgeError."""
    try:
        shape = tuple(operator.index(d) for d in dims)
    except TypeError:
        shape = None
    if shape is None or isinstance(dims, (str, bytes)) or any(isinstance(d, bool) for d in dims) \
            or any(d < 0 for d in shape):
        raise BridgeError(f"ONNX import: input_shapes for `{name}` must be a sequence of non-negative ints, "
                          f"got {dims!r}"[:300])
    return shape


def _given_shapes(graph_inputs: list[Any], input_shapes: InputShapes) -> dict[str, tuple[int, ...]]:
    if isinstance(input_shapes, Mapping):
        unknown = sorted(set(input_shapes) - {i.name for i in graph_inputs})
        if unknown:
            raise BridgeError(f"ONNX import: input_shapes names unknown inputs {unknown}; the model's inputs are "
                              f"{[i.name for i in graph_inputs]}")
        return {k: _given_shape(k, v) for k, v in input_shapes.items()}
    if input_shapes is None:
        return {}
    if isinstance(input_shapes, (str, bytes)):
        raise BridgeError(f"ONNX import: input_shapes must be a mapping or a list of shapes, "
                          f"got {input_shapes!r}"[:200])
    shapes = list(input_shapes)
    if len(shapes) != len(graph_inputs):
        raise BridgeError(f"ONNX import: {len(shapes)} input shapes given for {len(graph_inputs)} inputs")
    return {i.name: _given_shape(i.name, s) for i, s in zip(graph_inputs, shapes)}


def static_input_shapes(graph_inputs: list[Any], given: InputShapes) -> tuple[dict[str, tuple[int, ...]], list[str]]:
    """Every input's static shape, and notes on the batch dimensions that were set to 1.

    The batch axis (axis 0) defaults to 1 when it is symbolic or unknown; a symbolic name used on a
    batch axis is 1 wherever else it appears. Any other dynamic dimension is an error naming it.
    """
    fixed = _given_shapes(graph_inputs, given)
    batch_params = {vi.type.tensor_type.shape.dim[0].dim_param for vi in graph_inputs
                    if vi.name not in fixed and vi.type.tensor_type.HasField("shape")
                    and len(vi.type.tensor_type.shape.dim) and vi.type.tensor_type.shape.dim[0].dim_param}
    out, notes, dynamic = {}, [], []
    for vi in graph_inputs:
        if vi.name in fixed:
            out[vi.name] = fixed[vi.name]
            continue
        if not vi.type.tensor_type.HasField("shape"):
            raise BridgeError(f"ONNX import: input `{vi.name}` has no shape (not even its rank); pass "
                              f"input_shapes={{'{vi.name}': (...)}} (CLI: --input-shape)")
        dims = []
        for axis, d in enumerate(vi.type.tensor_type.shape.dim):
            if d.HasField("dim_value"):
                dims.append(int(d.dim_value))
            elif axis == 0 or (d.dim_param and d.dim_param in batch_params):
                dims.append(1)
                notes.append(f"input `{vi.name}`: dynamic dimension {_dim_label(d)} at axis {axis} (batch) set to 1")
            else:
                dims.append(-1)
                dynamic.append(f"`{vi.name}` axis {axis} ({_dim_label(d)})")
        out[vi.name] = tuple(dims)
    if dynamic:
        names = sorted({item.split("`")[1] for item in dynamic})
        example = ", ".join(f"'{n}': {tuple(d if d >= 0 else '?' for d in out[n])}" for n in names)
        raise BridgeError(f"ONNX import: dynamic dimensions other than the batch axis: {'; '.join(dynamic)}; pass "
                          f"input_shapes={{{example}}} with every ? fixed (CLI: --input-shape)"[:800])
    return out, notes


def _dim_label(d: Any) -> str:
    return f"`{d.dim_param}`" if d.dim_param else "unknown"


def bound_constants(graph_inputs: list[Any], constants: Mapping[str, Any] | None) -> dict[str, np.ndarray]:
    """The caller's values for graph inputs frozen at import (``constants=``), checked against the model's
    declared type and shape, as arrays of the declared element type."""
    if constants is None:
        return {}
    if not isinstance(constants, Mapping):
        raise BridgeError(f"ONNX import: constants must map input names to arrays, got {type(constants).__name__}")
    by_name = {vi.name: vi for vi in graph_inputs}
    unknown = sorted(set(constants) - set(by_name))
    if unknown:
        raise BridgeError(f"ONNX import: constants names {unknown}, which are not graph inputs; the model's inputs are "
                          f"{sorted(by_name)}")
    from onnx import helper
    out = {}
    for name, value in constants.items():
        vi = by_name[name]
        check_tensor_type(vi, "bound input")
        try:
            array = np.asarray(value)
        except (TypeError, ValueError) as e:
            raise BridgeError(f"ONNX import: the value bound to `{name}` is not an array: {e}") from None
        if array.dtype == object or array.dtype.kind not in "biuf":
            raise BridgeError(f"ONNX import: the value bound to `{name}` has dtype {array.dtype}; expected numbers")
        want = np.dtype(helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type))
        if array.dtype.kind == "f" and want.kind in "iub" and not np.array_equal(array, np.trunc(array)):
            raise BridgeError(f"ONNX import: the value bound to `{name}` has fractional entries; the input is "
                              f"{element_type_name(vi.type.tensor_type.elem_type)}")
        dims = vi.type.tensor_type.shape.dim if vi.type.tensor_type.HasField("shape") else None
        if dims is not None and (len(dims) != array.ndim or any(
                d.HasField("dim_value") and d.dim_value != n for d, n in zip(dims, array.shape))):
            declared = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in dims]
            raise BridgeError(f"ONNX import: the value bound to `{name}` has shape {list(array.shape)}; the model "
                              f"declares {declared}")
        out[name] = array.astype(want, copy=False)
    return out
