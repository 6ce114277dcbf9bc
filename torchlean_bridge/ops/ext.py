"""The ``ext`` dialect: ops real models need and ``torchlean.ir.v1`` lacks.

They are never replaced by numerically different v1 expansions. An ext op whose meaning is *exactly*
a v1 op (squeeze/unsqueeze are reshapes, expand is broadcast_to, a pool with v1 geometry is a v1
pool) carries a ``v1_rewrite`` that the torchlean.ir.v1 writer applies; every other ext op blocks
v1 export and is listed by name. Binary elementwise ops take equal shapes, as in v1: importers make
broadcasting explicit with ``broadcast_to``.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ..errors import ShapeRuleError
from .contracts import (Shape, can_broadcast_to, check_axis, conv_transpose_out_shape, fmt_shape, reduce_shape,
                        slice_extent,
                        check_per_axis, v1_pool_out_dim, window_buffers, window_out_dim)
from .registry import (BOOL, ELEMENT_TYPES, FLOAT, INT64, Attr, OpSpec, ParamRole, int_only, per_axis_attrs, register,
                       same_as_parent)
from .v1 import CONV_ATTRS, _axis_keep, _identity, _same_shape

A = Mapping[str, Any]
P = Sequence[Shape]
DT = Sequence[str]

# -- elementwise ------------------------------------------------------------------------------

for _k in ("div", "prelu"):
    register(OpSpec(_k, "ext", 2, 2, _same_shape(_k)))

_UNARY = {
    "neg": (), "erf": (), "silu": (), "rsqrt": (), "softsign": (), "sign": (), "floor": (),
    "ceil": (), "log1p": (), "hardswish": (), "mish": (), "tan": (), "expm1": (), "round": (), "trunc": (),
    "atan": (), "asin": (), "acos": (), "sinh": (), "cosh": (), "asinh": (), "acosh": (), "atanh": (),
    "log2": (), "exp2": (),
    "pow": (Attr("exponent", "float"),),
    "gelu": (Attr("approximate", "str", "none", choices=("none", "tanh")),),
    "leaky_relu": (Attr("negative_slope", "float", 0.01),),
    "elu": (Attr("alpha", "float", 1.0),),
    "selu": (),
    "celu": (Attr("alpha", "float", 1.0),),
    "hardsigmoid": (Attr("alpha", "float", 1.0 / 6.0), Attr("beta", "float", 0.5)),
    "clamp": (Attr("min", "opt_float", None), Attr("max", "opt_float", None)),
}
for _k, _attrs in _UNARY.items():
    register(OpSpec(_k, "ext", 1, 1, _identity, attrs=_attrs))

register(OpSpec("log_softmax", "ext", 1, 1, _axis_keep, attrs=(Attr("axis", "nat"),)))


def _sort(attrs: A, p: P, d: Shape) -> Shape:
    s, ax, k = p[0], attrs["axis"], attrs["k"]
    check_axis(ax, len(s))
    if k > s[ax]:
        raise ShapeRuleError(f"sort: k={k} exceeds the extent {s[ax]} of axis {ax}")
    return tuple(s[:ax]) + (k,) + tuple(s[ax + 1:])


register(OpSpec("sort", "ext", 1, 1, _sort, dtype=same_as_parent,
                attrs=(Attr("axis", "nat"), Attr("k", "nat"), Attr("descending", "bool", False)),
                doc="the k smallest (or largest, `descending`) values along `axis`, in order: torch.sort/topk "
                    "values, ONNX TopK values (k = the extent is a full sort)"))
register(OpSpec("cumsum", "ext", 1, 1, _axis_keep,
                attrs=(Attr("axis", "nat"), Attr("exclusive", "bool", False), Attr("reverse", "bool", False)),
                doc="running sums along `axis`, first to last (or last to first with `reverse`); `exclusive` "
                    "leaves each entry out of its own sum (ONNX CumSum)"))


def _compare_dtype(attrs: A, parents: DT, declared: str) -> str:
    if parents[0] != parents[1]:
        raise ShapeRuleError(f"comparison of {parents[0]} with {parents[1]}")
    return BOOL


for _k in ("eq", "ne", "lt", "le", "gt", "ge"):
    register(OpSpec(_k, "ext", 2, 2, _same_shape(_k), dtype=_compare_dtype, doc="elementwise, bool result"))


def _bool_only(kind: str):
    def rule(attrs: A, parents: DT, declared: str) -> str:
        if any(p != BOOL for p in parents):
            raise ShapeRuleError(f"{kind}: expected bool operands, got {', '.join(parents)}")
        return BOOL
    return rule


for _k in ("logical_and", "logical_or"):
    register(OpSpec(_k, "ext", 2, 2, _same_shape(_k), dtype=_bool_only(_k)))
register(OpSpec("logical_not", "ext", 1, 1, _identity, dtype=_bool_only("logical_not")))


def _where_shape(attrs: A, p: P, d: Shape) -> Shape:
    if not (p[0] == p[1] == p[2]):
        raise ShapeRuleError(f"where: shape mismatch: {fmt_shape(p[0])}, {fmt_shape(p[1])}, {fmt_shape(p[2])}")
    return p[0]


def _where_dtype(attrs: A, parents: DT, declared: str) -> str:
    if parents[0] != BOOL:
        raise ShapeRuleError(f"where: condition has element type {parents[0]}, expected bool")
    if parents[1] != parents[2]:
        raise ShapeRuleError(f"where: branches differ in element type: {parents[1]} vs {parents[2]}")
    return parents[1]


register(OpSpec("where", "ext", 3, 3, _where_shape, dtype=_where_dtype,
                doc="parents (condition: bool, x, y), all one shape"))


def _cast_dtype(attrs: A, parents: DT, declared: str) -> str:
    return attrs["dtype"]


register(OpSpec("cast", "ext", 1, 1, _identity, attrs=(Attr("dtype", "str", choices=ELEMENT_TYPES),),
                dtype=_cast_dtype, doc="element-type conversion (float -> int64 truncates toward zero)"))

# -- indexing and data movement ---------------------------------------------------------------


def _gather(attrs: A, p: P, d: Shape) -> Shape:
    data, idx, ax = p[0], p[1], attrs["axis"]
    check_axis(ax, len(data))
    return tuple(data[:ax]) + tuple(idx) + tuple(data[ax + 1:])


def _gather_dtype(attrs: A, parents: DT, declared: str) -> str:
    if parents[1] != INT64:
        raise ShapeRuleError(f"gather: indices have element type {parents[1]}, expected int64")
    return parents[0]


register(OpSpec("gather", "ext", 2, 2, _gather, attrs=(Attr("axis", "nat"),), dtype=_gather_dtype,
                doc="numpy.take(data, indices, axis); embedding is gather on axis 0"))


def _gather_elements(attrs: A, p: P, d: Shape) -> Shape:
    data, idx, ax = p[0], p[1], attrs["axis"]
    check_axis(ax, len(data))
    if len(idx) != len(data) or any(i > n for k, (i, n) in enumerate(zip(idx, data)) if k != ax):
        raise ShapeRuleError(f"gather_elements: indices {fmt_shape(idx)} must have the rank of the data "
                             f"{fmt_shape(data)} and no larger extent off axis {ax}")
    return tuple(idx)


register(OpSpec("gather_elements", "ext", 2, 2, _gather_elements, attrs=(Attr("axis", "nat"),),
                dtype=_gather_dtype,
                doc="out[..., i, ...] = data[..., indices[..., i, ...], ...] along `axis` (torch.gather, ONNX "
                    "GatherElements)"))


def _slice(attrs: A, p: P, d: Shape) -> Shape:
    s = list(p[0])
    axes, starts, ends, steps = attrs["axes"], attrs["starts"], attrs["ends"], attrs["steps"]
    if not len(axes) == len(starts) == len(ends) == len(steps):
        raise ShapeRuleError("slice: axes, starts, ends and steps must have equal lengths")
    if len(set(axes)) != len(axes):
        raise ShapeRuleError("slice: axes contain duplicates")
    for ax, st, en, sp in zip(axes, starts, ends, steps):
        check_axis(ax, len(s))
        s[ax] = slice_extent(p[0][ax], st, en, sp)
    return tuple(s)


register(OpSpec("slice", "ext", 1, 1, _slice,
                attrs=(Attr("axes", "nats"), Attr("starts", "nats"), Attr("ends", "nats"), Attr("steps", "nats")),
                dtype=same_as_parent, doc="x[start:end:step] per listed axis; bounds normalized and clamped"))


def _pad(attrs: A, p: P, d: Shape) -> Shape:
    before, after = attrs["pads_before"], attrs["pads_after"]
    if len(before) != len(p[0]) or len(after) != len(p[0]):
        raise ShapeRuleError(f"pad: expected {len(p[0])} pads per side, got {len(before)} and {len(after)}")
    return tuple(s + b + a for s, b, a in zip(p[0], before, after))


register(OpSpec("pad", "ext", 1, 1, _pad,
                attrs=(Attr("pads_before", "nats"), Attr("pads_after", "nats"), Attr("value", "float", 0.0)),
                dtype=same_as_parent, doc="constant padding on every axis"))


def _to_reshape(attrs: A, p: P, d: Shape) -> tuple[str, dict]:
    return "reshape", {"in_shape": tuple(p[0]), "out_shape": tuple(d)}


def _squeeze(attrs: A, p: P, d: Shape) -> Shape:
    for ax in attrs["axes"]:
        check_axis(ax, len(p[0]))
        if p[0][ax] != 1:
            raise ShapeRuleError(f"squeeze: axis {ax} has extent {p[0][ax]}, expected 1")
    return tuple(e for i, e in enumerate(p[0]) if i not in attrs["axes"])


def _unsqueeze(attrs: A, p: P, d: Shape) -> Shape:
    axes = attrs["axes"]
    rank = len(p[0]) + len(axes)
    if len(set(axes)) != len(axes) or any(a >= rank for a in axes):
        raise ShapeRuleError(f"unsqueeze: invalid axes {fmt_shape(axes)} for output rank {rank}")
    src = iter(p[0])
    return tuple(1 if i in axes else next(src) for i in range(rank))


register(OpSpec("squeeze", "ext", 1, 1, _squeeze, attrs=(Attr("axes", "nats"),), dtype=same_as_parent,
                v1_rewrite=_to_reshape, doc="exactly a v1 reshape"))
register(OpSpec("unsqueeze", "ext", 1, 1, _unsqueeze, attrs=(Attr("axes", "nats"),), dtype=same_as_parent,
                v1_rewrite=_to_reshape, doc="axes index the output; exactly a v1 reshape"))


def _expand(attrs: A, p: P, d: Shape) -> Shape:
    dst = tuple(attrs["to_shape"])
    if not can_broadcast_to(p[0], dst):
        raise ShapeRuleError(f"expand: invalid broadcast from {fmt_shape(p[0])} to {fmt_shape(dst)}")
    return dst


register(OpSpec("expand", "ext", 1, 1, _expand, attrs=(Attr("to_shape", "shape"),), dtype=same_as_parent,
                v1_rewrite=lambda a, p, d: ("broadcast_to", {"from_shape": tuple(p[0]), "to_shape": tuple(d)}),
                doc="exactly a v1 broadcast_to"))

# -- reductions -------------------------------------------------------------------------------

REDUCE_ATTRS = (Attr("axes", "nats"), Attr("keepdim", "bool", False))


def _reduce(tag: str):
    def rule(attrs: A, p: P, d: Shape) -> Shape:
        return reduce_shape(p[0], attrs["axes"], attrs["keepdim"], tag)
    return rule


def _wire_reduce(tag: str):
    """TorchLean lowers these to single-axis reductions, which need every reduced axis non-empty."""
    def rule(attrs: A, p: P, d: Shape) -> Shape:
        out = reduce_shape(p[0], attrs["axes"], attrs["keepdim"], tag)
        for ax in attrs["axes"]:
            if p[0][ax] == 0:
                raise ShapeRuleError(f"invalid or empty reduction axis {ax} for shape {fmt_shape(p[0])}")
        return out
    return rule


for _k, _wire in (("reduce_sum_axes", "reduce_sum"), ("reduce_mean_axes", "reduce_mean")):
    register(OpSpec(_k, "v1-wire", 1, 1, _wire_reduce(_wire), attrs=REDUCE_ATTRS,
                    doc=f"TorchLean's wire form `{_wire}` with axes/keepdim (lowered by its importer)"))

for _k in ("reduce_max", "reduce_min", "reduce_prod"):
    register(OpSpec(_k, "ext", 1, 1, _reduce(_k), attrs=REDUCE_ATTRS))


def _arg_reduce(attrs: A, p: P, d: Shape) -> Shape:
    ax = attrs["axis"]
    check_axis(ax, len(p[0]))
    if p[0][ax] == 0:
        raise ShapeRuleError(f"invalid or empty reduction axis {ax} for shape {fmt_shape(p[0])}")
    return reduce_shape(p[0], (ax,), attrs["keepdim"], "argmax")


for _k in ("argmax", "argmin"):
    register(OpSpec(_k, "ext", 1, 1, _arg_reduce, attrs=(Attr("axis", "nat"), Attr("keepdim", "bool", False)),
                    dtype=lambda a, parents, d: INT64, doc="index of the first extremum, int64"))

# -- general pooling --------------------------------------------------------------------------

POOL_ND_ATTRS = per_axis_attrs("kernel", "stride", "padding", "padding_after", "dilation") + (
    Attr("ceil_mode", "bool", False), Attr("count_include_pad", "bool", True))


def _pool_nd(tag: str):
    def rule(attrs: A, p: P, d: Shape) -> Shape:
        s, r = p[0], attrs["spatial_rank"]
        if r <= 0 or r > len(s):
            raise ShapeRuleError(f"{tag}: spatial rank {r} invalid for input rank {len(s)}")
        check_per_axis(tag, r, **{k: attrs[k] for k in ("kernel", "stride", "padding", "padding_after", "dilation")})
        if any(k == 0 for k in attrs["kernel"]) or any(k == 0 for k in attrs["stride"]) \
                or any(k == 0 for k in attrs["dilation"]):
            raise ShapeRuleError(f"{tag}: kernel, stride and dilation extents must be nonzero")
        lead, spatial = tuple(s[:len(s) - r]), s[len(s) - r:]
        out = []
        for i in range(r):
            o = window_out_dim(spatial[i], attrs["kernel"][i], attrs["stride"][i], attrs["padding"][i],
                               attrs["padding_after"][i], attrs["dilation"][i], attrs["ceil_mode"])
            if o is None or o <= 0:
                raise ShapeRuleError(f"{tag}: window does not fit axis {len(lead) + i} of extent {spatial[i]}")
            out.append(o)
        window_buffers(s, lead + tuple(out), attrs["kernel"], attrs["stride"], attrs["padding"],
                       attrs["padding_after"], tag)
        return lead + tuple(out)
    return rule


def _pool_v1_rewrite(v1_kind: str):
    def rewrite(attrs: A, p: P, d: Shape) -> tuple[str, dict] | None:
        r = attrs["spatial_rank"]
        spatial = p[0][len(p[0]) - r:]
        same = (tuple(attrs["padding"]) == tuple(attrs["padding_after"]) and all(x == 1 for x in attrs["dilation"])
                and (v1_kind == "max_pool" or attrs["count_include_pad"] or not any(attrs["padding"])))
        v1_out = tuple(v1_pool_out_dim(spatial[i], attrs["kernel"][i], attrs["stride"][i], attrs["padding"][i])
                       for i in range(r))
        if not same or v1_out != tuple(d[len(d) - r:]):
            return None
        return v1_kind, {k: attrs[k] for k in ("spatial_rank", "kernel", "stride", "padding")}
    return rewrite


register(OpSpec("max_pool_nd", "ext", 1, 1, _pool_nd("max_pool_nd"), attrs=POOL_ND_ATTRS,
                v1_rewrite=_pool_v1_rewrite("max_pool"),
                doc="max pooling with dilation, asymmetric padding and ceil mode (padded cells ignored)"))
register(OpSpec("avg_pool_nd", "ext", 1, 1, _pool_nd("avg_pool_nd"), attrs=POOL_ND_ATTRS,
                v1_rewrite=_pool_v1_rewrite("avg_pool"),
                doc="average pooling; count_include_pad chooses the divisor (PyTorch/ONNX meaning)"))

# -- transposed convolution -----------------------------------------------------------------------

CONV_TRANSPOSE_ATTRS = CONV_ATTRS + (Attr("output_padding", "nats", length_of="spatial_rank"),)


def _conv_transpose(attrs: A, p: P, d: Shape) -> Shape:
    return conv_transpose_out_shape(p[0], **{a.name: attrs[a.name] for a in CONV_TRANSPOSE_ATTRS})


register(OpSpec(
    "conv_transpose", "ext", 1, 1, _conv_transpose, attrs=CONV_TRANSPOSE_ATTRS,
    params=(ParamRole("weight", lambda a, p, d: (a["in_channels"], a["out_channels"] // a["groups"], *a["kernel"])),
            ParamRole("bias", lambda a, p, d: (a["out_channels"],))),
    doc="the adjoint of conv (PyTorch ConvTransposeNd, ONNX ConvTranspose): weight [in, out/groups, k...]; "
        "padding crops the full output, output_padding extends its end"))

# -- linear resizing -------------------------------------------------------------------------------

RESIZE_COORDINATE_MODES = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric")


def _resize_linear(attrs: A, p: P, d: Shape) -> Shape:
    s, r, sizes = p[0], attrs["spatial_rank"], tuple(attrs["sizes"])
    if r <= 0 or r > len(s):
        raise ShapeRuleError(f"resize_linear: spatial rank {r} invalid for input rank {len(s)}")
    if any(n <= 0 for n in s[len(s) - r:]) or any(n <= 0 for n in sizes):
        raise ShapeRuleError(f"resize_linear: input extents {fmt_shape(s[len(s) - r:])} and sizes "
                             f"{fmt_shape(sizes)} must be positive")
    return tuple(s[:len(s) - r]) + sizes


register(OpSpec(
    "resize_linear", "ext", 1, 1, _resize_linear,
    attrs=per_axis_attrs("sizes") + (Attr("coordinate_mode", "str", "half_pixel", choices=RESIZE_COORDINATE_MODES),),
    doc="(bi/tri)linear interpolation of the trailing axes to `sizes` (PyTorch interpolate, ONNX Resize "
        "mode=linear), one axis at a time; source coordinates are exact rationals"))

assert FLOAT == "float"


def _float_to_bool(kind: str):
    def rule(attrs: A, parents: DT, declared: str) -> str:
        if parents[0] != FLOAT:
            raise ShapeRuleError(f"{kind}: expected a float operand, got {parents[0]}")
        return BOOL
    return rule


register(OpSpec("isnan", "ext", 1, 1, _identity, dtype=_float_to_bool("isnan"), doc="elementwise, bool result"))

# -- integer arithmetic and bit operations (issue #15) -------------------------------------------
# Computed exactly on int64 values; `bits`/`signed` name the ONNX element type (int8..uint64) whose range
# the result must fit: a result outside it (where ONNX would wrap) is refused at evaluation, never wrapped.
# Shifts and bitwise ops are defined modulo 2^bits by ONNX, so those wrap exactly as the type does.

INT_TYPE_ATTRS = (Attr("bits", "nat", 64, choices=(8, 16, 32, 64)), Attr("signed", "bool", True))


_INT_BINARY = {
    "int_add": "a + b", "int_sub": "a - b", "int_mul": "a * b",
    "int_div": "a / b truncated toward zero (ONNX integer Div); division by zero is refused",
    "int_max": "max(a, b)", "int_min": "min(a, b)",
    "bitwise_and": "a & b", "bitwise_or": "a | b", "bitwise_xor": "a ^ b",
}
for _k, _doc in _INT_BINARY.items():
    register(OpSpec(_k, "ext", 2, 2, _same_shape(_k), attrs=INT_TYPE_ATTRS, dtype=int_only(_k),
                    doc=f"integer {_doc}, exact; the result must fit the `bits`/`signed` type"))
_INT_REDUCE = {"int_reduce_sum": "sum", "int_reduce_prod": "product", "int_reduce_max": "maximum",
               "int_reduce_min": "minimum"}
for _k, _doc in _INT_REDUCE.items():  # issue #32: index and shape arithmetic inside exported models
    register(OpSpec(_k, "ext", 1, 1, _reduce(_k), attrs=REDUCE_ATTRS + INT_TYPE_ATTRS, dtype=int_only(_k),
                    doc=f"integer {_doc} over `axes` (ONNX Reduce* on int8..uint64), exact; the result must fit "
                        "the `bits`/`signed` type"))
register(OpSpec("bitwise_not", "ext", 1, 1, _identity, attrs=INT_TYPE_ATTRS, dtype=int_only("bitwise_not"),
                doc="integer ~a in the `bits`/`signed` type (ONNX BitwiseNot)"))
register(OpSpec("bitshift", "ext", 2, 2, _same_shape("bitshift"),
                attrs=(Attr("left", "bool"),) + INT_TYPE_ATTRS, dtype=int_only("bitshift"),
                doc="a << b or a >> b in the `bits`-bit type (ONNX BitShift: bits shifted out are lost, a shift "
                    "by `bits` or more gives 0)"))


def _mod_dtype(attrs: A, parents: DT, declared: str) -> str:
    if parents[0] != parents[1] or parents[0] == BOOL:
        raise ShapeRuleError(f"mod: operands of element types {parents[0]} and {parents[1]}")
    return parents[0]


register(OpSpec("mod", "ext", 2, 2, _same_shape("mod"), attrs=(Attr("fmod", "bool", False),) + INT_TYPE_ATTRS,
                dtype=_mod_dtype,
                doc="remainder: numpy.fmod (sign of a, `fmod`) or numpy.mod (sign of b), float or int64 (ONNX "
                    "Mod, torch.fmod / torch.remainder); an integer remainder by zero is refused"))

# -- running products, determinants, bit casts (issue #15, ops) ----------------------------------


def _numeric_dtype(kind: str):
    def rule(attrs: A, parents: DT, declared: str) -> str:
        if parents[0] == BOOL:
            raise ShapeRuleError(f"{kind}: operand 0 has element type bool")
        return parents[0]
    return rule


register(OpSpec("cumprod", "ext", 1, 1, _axis_keep,
                attrs=(Attr("axis", "nat"), Attr("exclusive", "bool", False), Attr("reverse", "bool", False))
                + INT_TYPE_ATTRS, dtype=_numeric_dtype("cumprod"),
                doc="running products along `axis`, first to last (or last to first with `reverse`); `exclusive` "
                    "leaves each entry out of its own product (ONNX CumProd, torch.cumprod); int64 values are "
                    "exact and must fit the `bits`/`signed` type"))


def _det(attrs: A, p: P, d: Shape) -> Shape:
    s = p[0]
    if len(s) < 2 or s[-1] != s[-2]:
        raise ShapeRuleError(f"det: expected [..., n, n], got {fmt_shape(s)}")
    return tuple(s[:-2])


register(OpSpec("det", "ext", 1, 1, _det, dtype=_numeric_dtype("det"),
                doc="determinant of each trailing n x n matrix (numpy.linalg.det: LU with partial pivoting; ONNX "
                    "Det, torch.linalg.det)"))

BITCAST_TYPES = {"float32": 32, "float64": 64, "int8": 8, "int16": 16, "int32": 32, "int64": 64, "uint8": 8,
                 "uint16": 16, "uint32": 32, "uint64": 64, "bool": 8}


def _bitcast_dtype(attrs: A, parents: DT, declared: str) -> str:
    src, dst = attrs["source"], attrs["target"]
    if BITCAST_TYPES[src] != BITCAST_TYPES[dst]:
        raise ShapeRuleError(f"bitcast: {src} and {dst} differ in width")
    held = FLOAT if src.startswith("float") else BOOL if src == "bool" else INT64
    if parents[0] != held:
        raise ShapeRuleError(f"bitcast: operand 0 has element type {parents[0]}, expected {held} for {src}")
    return FLOAT if dst.startswith("float") else BOOL if dst == "bool" else INT64


register(OpSpec("bitcast", "ext", 1, 1, _identity,
                attrs=(Attr("source", "str", choices=tuple(BITCAST_TYPES)),
                       Attr("target", "str", choices=tuple(BITCAST_TYPES))), dtype=_bitcast_dtype,
                doc="the bits of each `source` value read as a `target` value of the same width (ONNX BitCast); "
                    "a value the `source` type cannot hold exactly is refused"))
register(OpSpec("int_cumsum", "ext", 1, 1, _axis_keep,
                attrs=(Attr("axis", "nat"), Attr("exclusive", "bool", False), Attr("reverse", "bool", False))
                + INT_TYPE_ATTRS, dtype=int_only("int_cumsum"),
                doc="integer running sums along `axis` (ONNX CumSum on int8..uint64), exact; every sum must fit "
                    "the `bits`/`signed` type"))
