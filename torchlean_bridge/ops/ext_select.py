"""ext ops for the value-dependent outputs and mixed-type arithmetic of issue #15: ``topk_indices`` (TopK's
Indices), ``max_pool_indices`` (MaxPool's Indices), ``max_unpool`` (MaxUnpool), ``pow_elem`` (Pow with a
computed or non-uniform exponent), ``int_pow`` (integer Pow, exact in int64) and ``dynamic_slice`` (a static-size
Slice at offsets computed at run time, issue #32)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ..errors import ShapeRuleError
from .contracts import Shape, check_buffer, fmt_shape, numel
from .ext import INT_TYPE_ATTRS, POOL_ND_ATTRS, _pool_nd, _sort
from .registry import int_only
from .registry import FLOAT, INT64, Attr, OpSpec, register
from .v1 import _same_shape

__all__: list[str] = []

A = Mapping[str, Any]
P = Sequence[Shape]


def _int64(attrs: A, parents: Sequence[str], declared: str) -> str:
    return INT64


register(OpSpec("topk_indices", "ext", 1, 1, _sort,
                attrs=(Attr("axis", "nat"), Attr("k", "nat"), Attr("descending", "bool", False)), dtype=_int64,
                doc="int64 positions along `axis` of `sort`'s values (ONNX TopK Indices, torch.topk/sort indices); "
                    "equal values keep their order (the lower index first)"))


def _pool_indices_dtype(attrs: A, parents: Sequence[str], declared: str) -> str:
    if parents[0] != FLOAT:
        raise ShapeRuleError(f"max_pool_indices: operand has element type {parents[0]}, expected float")
    return INT64


register(OpSpec("max_pool_indices", "ext", 1, 1, _pool_nd("max_pool_indices"),
                attrs=POOL_ND_ATTRS + (Attr("storage_order", "bool", False),), dtype=_pool_indices_dtype,
                doc="int64 flat position in the input (row-major, or spatially column-major with `storage_order`) "
                    "of each window's first maximum: ONNX MaxPool Indices (max_pool_nd's geometry)"))


def _unpool(attrs: A, p: P, d: Shape) -> Shape:
    x, idx, out, grid = tuple(p[0]), tuple(p[1]), tuple(attrs["out_shape"]), tuple(attrs["scatter_shape"])
    if x != idx:
        raise ShapeRuleError(f"max_unpool: values {fmt_shape(x)} and indices {fmt_shape(idx)} differ in shape")
    if len(out) != len(x) or len(grid) != len(x) or out[:2] != x[:2] or grid[:2] != x[:2] \
            or any(g > o for g, o in zip(grid, out)):
        raise ShapeRuleError(f"max_unpool: scatter shape {fmt_shape(grid)} and output shape {fmt_shape(out)} must keep "
                             f"the batch and channel extents of {fmt_shape(x)}, the output no smaller")
    check_buffer(numel(out), "an output buffer", "max_unpool")
    return out


def _unpool_dtype(attrs: A, parents: Sequence[str], declared: str) -> str:
    if parents != [FLOAT, INT64] and tuple(parents) != (FLOAT, INT64):
        raise ShapeRuleError(f"max_unpool: operands of element types {', '.join(parents)}, expected float, int64")
    return FLOAT


register(OpSpec("max_unpool", "ext", 2, 2, _unpool, attrs=(Attr("scatter_shape", "shape"), Attr("out_shape", "shape")),
                dtype=_unpool_dtype,
                doc="each value written at its flat index into zeros of `scatter_shape` (the shape the pooling read), "
                    "placed at the origin of zeros of `out_shape` (ONNX MaxUnpool as onnx's reference computes it); "
                    "an index out of range, or one index given two different values, is refused"))

register(OpSpec("pow_elem", "ext", 2, 2, _same_shape("pow_elem"),
                doc="x ** y elementwise (ONNX Pow with a computed exponent, torch.pow of two tensors); a negative base "
                    "to a non-integer power is NaN (as torch, onnxruntime and C's pow); 0 to a negative power is "
                    "refused"))
register(OpSpec("int_pow", "ext", 2, 2, _same_shape("int_pow"), attrs=INT_TYPE_ATTRS, dtype=int_only("int_pow"),
                doc="integer a ** b, exact; a negative exponent is refused, and the result must fit the "
                    "`bits`/`signed` type"))


# -- dynamic_slice (issue #32): a window of static size at offsets computed at run time ----------------------


def _dynamic_slice(attrs: A, p: P, d: Shape) -> Shape:
    x, starts = p
    axes, sizes = tuple(attrs["axes"]), tuple(attrs["sizes"])
    if len(axes) != len(sizes) or not axes:
        raise ShapeRuleError(f"dynamic_slice: {len(axes)} axes and {len(sizes)} sizes")
    if len(set(axes)) != len(axes) or any(a >= len(x) for a in axes):
        raise ShapeRuleError(f"dynamic_slice: axes {list(axes)} for rank {len(x)}")
    if tuple(starts) != (len(axes),):
        raise ShapeRuleError(f"dynamic_slice: starts of shape {fmt_shape(starts)}, expected [{len(axes)}]")
    out = list(x)
    for a, k in zip(axes, sizes):
        if not 1 <= k <= x[a]:
            raise ShapeRuleError(f"dynamic_slice: size {k} on axis {a} of extent {x[a]}")
        out[a] = k
    return tuple(out)


def _dynamic_slice_dtype(attrs: A, parents: Sequence[str], declared: str) -> str:
    if parents[1] != INT64:
        raise ShapeRuleError(f"dynamic_slice: starts have element type {parents[1]}, expected int64")
    return parents[0]


register(OpSpec("dynamic_slice", "ext", 2, 2, _dynamic_slice, attrs=(Attr("axes", "nats"), Attr("sizes", "nats")),
                dtype=_dynamic_slice_dtype,
                doc="x[s:s+size] on each listed axis, s from the int64 operand `starts` at run time (ONNX Slice with "
                    "computed starts and ends = starts + size; XLA's dynamic_slice). A start is read as ONNX reads "
                    "it (a negative start counts from the end); a start whose window leaves the axis, where ONNX "
                    "would return fewer than `size` cells, is refused"))
