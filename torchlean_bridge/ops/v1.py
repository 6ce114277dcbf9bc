"""The 42 ``torchlean.ir.v1`` kinds (spec section 2), in ``OpTag.all`` declaration order.

Wire spellings, JSON attribute names, arities and rule messages are TorchLean's, exactly.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from ..errors import ShapeRuleError
from .contracts import (Shape, can_broadcast_to, check_axis, concat_shape, conv_out_shape, fmt_array,
                        fmt_shape, matmul_dims, numel, v1_pool_out_dim, window_buffers, check_per_axis)
from .registry import FLOAT, Attr, OpSpec, ParamRole, per_axis_attrs, register, same_as_parent

A = Mapping[str, Any]
P = Sequence[Shape]


def _declared(attrs: A, p: P, d: Shape) -> Shape:
    return d


def _identity(attrs: A, p: P, d: Shape) -> Shape:
    return p[0]


def _same_shape(tag: str):
    def rule(attrs: A, p: P, d: Shape) -> Shape:
        if p[0] != p[1]:
            raise ShapeRuleError(f"{tag}: shape mismatch: {fmt_shape(p[0])} vs {fmt_shape(p[1])}")
        return p[0]
    return rule


def _input_dtype(attrs: A, parents: Sequence[str], declared: str) -> str:
    return declared


# -- leaves -----------------------------------------------------------------------------------

register(OpSpec("input", "v1", 0, 0, _declared, dtype=_input_dtype,
                doc="the external input; shape is whatever is declared"))


def _const_shape(attrs: A, p: P, d: Shape) -> Shape:
    vs = attrs.get("value_shape")
    return d if vs is None else tuple(vs)


register(OpSpec(
    "const", "v1", 0, 0, _const_shape,
    attrs=(Attr("value_shape", "shape", None),),
    dtype=_input_dtype,
    params=(ParamRole("values", lambda a, p, d: d),),
    describe_fn=lambda a: f"const(shape={fmt_shape(a['value_shape'])})" if a.get("value_shape") is not None
    else "const(shape=?)",
    doc="payload `values` reshaped row-major"))


def _custom_shape(attrs: A, p: P, d: Shape) -> Shape:
    expected = [tuple(s) for s in attrs["input_shapes"]]
    if len(expected) != len(p):
        raise ShapeRuleError(f"custom {attrs['name']}: expected {len(expected)} operands, got {len(p)}")
    for i, (e, g) in enumerate(zip(expected, p)):
        if e != tuple(g):
            raise ShapeRuleError(f"custom {attrs['name']}: operand {i} shape {fmt_shape(g)} "
                                 f"does not match declared {fmt_shape(e)}")
    return tuple(attrs["output_shape"])


register(OpSpec(
    "custom", "v1", 0, None, _custom_shape,
    attrs=(Attr("name", "str"), Attr("input_shapes", "shapes"), Attr("output_shape", "shape")),
    describe_fn=lambda a: (f"custom(name={a['name']}, inputs=["
                           + ", ".join(fmt_shape(s) for s in a["input_shapes"])
                           + f"], output={fmt_shape(a['output_shape'])}, body=payload)"),
    doc="a checked Lean program; TorchLean's importer rejects it and so do our evaluators"))


def _permute(attrs: A, p: P, d: Shape) -> Shape:
    perm = tuple(attrs["perm"])
    s = p[0]
    if len(perm) != len(s) or len(set(perm)) != len(perm) or any(x >= len(s) for x in perm):
        raise ShapeRuleError(f"permute: invalid permutation {fmt_array(perm)} for shape {fmt_shape(s)}")
    return tuple(s[i] for i in perm)


register(OpSpec("permute", "v1", 1, 1, _permute, attrs=(Attr("perm", "nats"),),
                dtype=same_as_parent,
                describe_fn=lambda a: f"permute(perm={fmt_array(a['perm'])})"))


def _transpose(attrs: A, p: P, d: Shape) -> Shape:
    s = list(p[0])
    for ax in (attrs["axis1"], attrs["axis2"]):
        if ax >= len(s):
            raise ShapeRuleError(f"transpose: axis {ax} out of range for rank {len(s)}")
    a1, a2 = attrs["axis1"], attrs["axis2"]
    s[a1], s[a2] = s[a2], s[a1]
    return tuple(s)


register(OpSpec("transpose", "v1", 1, 1, _transpose, attrs=(Attr("axis1", "nat"), Attr("axis2", "nat")),
                dtype=same_as_parent,
                describe_fn=lambda a: f"transpose(axis1={a['axis1']}, axis2={a['axis2']})"))

register(OpSpec("detach", "v1", 1, 1, _identity, dtype=same_as_parent))

register(OpSpec("rand_uniform", "v1", 0, 0, _declared, attrs=(Attr("seed", "nat"),),
                describe_fn=lambda a: f"rand_uniform(seed={a['seed']})"))


def _bernoulli(attrs: A, p: P, d: Shape) -> Shape:
    if p[0] != ():
        raise ShapeRuleError(f"bernoulli_mask: expected scalar keepProb parent, got {fmt_shape(p[0])}")
    return d


register(OpSpec("bernoulli_mask", "v1", 1, 1, _bernoulli, attrs=(Attr("seed", "nat"),),
                describe_fn=lambda a: f"bernoulli_mask(seed={a['seed']})"))

for _k in ("add", "sub", "mul_elem"):
    register(OpSpec(_k, "v1", 2, 2, _same_shape(_k)))

for _k in ("abs", "sqrt", "inv"):
    register(OpSpec(_k, "v1", 1, 1, _identity))

for _k in ("max_elem", "min_elem"):
    register(OpSpec(_k, "v1", 2, 2, _same_shape(_k)))

# -- pooling ----------------------------------------------------------------------------------

POOL_ATTRS = per_axis_attrs("kernel", "stride", "padding")


def _pool(tag: str):
    def rule(attrs: A, p: P, d: Shape) -> Shape:
        s, r = p[0], attrs["spatial_rank"]
        kernel, stride, padding = attrs["kernel"], attrs["stride"], attrs["padding"]
        if r <= 0:
            raise ShapeRuleError(f"{tag}: spatial rank must be > 0")
        if r > len(s):
            raise ShapeRuleError(f"{tag}: kernel rank {r} exceeds input rank {len(s)}")
        check_per_axis(tag, r, kernel=kernel, stride=stride, padding=padding)
        if any(k == 0 for k in kernel):
            raise ShapeRuleError(f"{tag}: kernel extents must be nonzero")
        if any(k == 0 for k in stride):
            raise ShapeRuleError(f"{tag}: stride extents must be nonzero")
        lead = tuple(s[:len(s) - r])
        spatial = s[len(s) - r:]
        out = lead + tuple(v1_pool_out_dim(spatial[i], kernel[i], stride[i], padding[i]) for i in range(r))
        window_buffers(s, out, kernel, stride, padding, padding, tag)
        return out
    return rule


def _window_repr(a: A) -> str:
    return (f"{{ spatialRank := {a['spatial_rank']}, kernel := {fmt_shape(a['kernel'])}, "
            f"stride := {fmt_shape(a['stride'])}, padding := {fmt_shape(a['padding'])} }}")


for _k in ("max_pool", "avg_pool"):
    register(OpSpec(_k, "v1", 1, 1, _pool(_k), attrs=POOL_ATTRS,
                    describe_fn=(lambda k: lambda a: f"{k}(config={_window_repr(a)})")(_k)))


def _broadcast_to(attrs: A, p: P, d: Shape) -> Shape:
    src, dst = tuple(attrs["from_shape"]), tuple(attrs["to_shape"])
    if p[0] != src:
        raise ShapeRuleError(f"broadcastTo: parent shape mismatch: expected {fmt_shape(src)}, got {fmt_shape(p[0])}")
    if not can_broadcast_to(src, dst):
        raise ShapeRuleError(f"broadcastTo: invalid broadcast from {fmt_shape(src)} to {fmt_shape(dst)}")
    return dst


register(OpSpec("broadcast_to", "v1", 1, 1, _broadcast_to,
                attrs=(Attr("from_shape", "shape"), Attr("to_shape", "shape")), dtype=same_as_parent,
                describe_fn=lambda a: f"broadcastTo(from={fmt_shape(a['from_shape'])}, to={fmt_shape(a['to_shape'])})"))


def _reduce_axis(attrs: A, p: P, d: Shape) -> Shape:
    ax, s = attrs["axis"], p[0]
    if ax >= len(s) or s[ax] == 0:
        raise ShapeRuleError(f"invalid or empty reduction axis {ax} for shape {fmt_shape(s)}")
    return tuple(s[:ax]) + tuple(s[ax + 1:])


for _k in ("reduce_sum", "reduce_mean"):
    register(OpSpec(_k, "v1", 1, 1, _reduce_axis, attrs=(Attr("axis", "nat"),),
                    describe_fn=(lambda k: lambda a: f"{k}(axis={a['axis']})")(_k),
                    doc="one axis, removed; the wire form with axes/keepdim is `*_axes`"))

register(OpSpec("sum", "v1", 1, 1, lambda a, p, d: ()))
register(OpSpec("matmul", "v1", 2, 2, lambda a, p, d: matmul_dims(p[0], p[1])))


def _linear(attrs: A, p: P, d: Shape) -> Shape:
    s = p[0]
    if len(s) < 1 or len(d) < 1:
        raise ShapeRuleError(f"linear: expected rank≥1 input/output, got input={fmt_shape(s)}, out={fmt_shape(d)}")
    if tuple(s[:-1]) != tuple(d[:-1]):
        raise ShapeRuleError(f"linear: leading dimensions must be preserved: input={fmt_shape(s)}, "
                             f"outShape={fmt_shape(d)}")
    return d


register(OpSpec(
    "linear", "v1", 1, 1, _linear,
    params=(ParamRole("weight", lambda a, p, d: (d[-1], p[0][-1])),
            ParamRole("bias", lambda a, p, d: (d[-1],))),
    describe_fn=lambda a: "linear(payload=node_id)"))

CONV_ATTRS = per_axis_attrs("kernel", "stride", "padding", "padding_after", "dilation") + (
    Attr("groups", "nat"), Attr("channel_axis", "nat"), Attr("in_channels", "nat"), Attr("out_channels", "nat"))


def _conv(attrs: A, p: P, d: Shape) -> Shape:
    return conv_out_shape(p[0], **{a.name: attrs[a.name] for a in CONV_ATTRS})


def _conv_repr(a: A) -> str:
    return (f"{{ spatialRank := {a['spatial_rank']}, inChannels := {a['in_channels']}, "
            f"outChannels := {a['out_channels']}, kernel := {fmt_shape(a['kernel'])}, "
            f"stride := {fmt_shape(a['stride'])}, padding := {fmt_shape(a['padding'])}, "
            f"paddingAfter := {fmt_shape(a['padding_after'])}, dilation := {fmt_shape(a['dilation'])}, "
            f"groups := {a['groups']}, channelAxis := {a['channel_axis']} }}")


register(OpSpec(
    "conv", "v1", 1, 1, _conv, attrs=CONV_ATTRS,
    params=(ParamRole("weight", lambda a, p, d: (a["out_channels"], a["in_channels"] // a["groups"], *a["kernel"])),
            ParamRole("bias", lambda a, p, d: (a["out_channels"],))),
    describe_fn=lambda a: f"conv(config={_conv_repr(a)}, payload=node_id)",
    doc="weight is stored grouped [out, in/groups, k...]; the v1 writer expands it dense"))


def _channel_vec(a: A, p: P, d: Shape) -> Shape:
    return (a["channels"],)


def _batch_norm(attrs: A, p: P, d: Shape) -> Shape:
    s, ax, c = p[0], attrs["channel_axis"], attrs["channels"]
    if c <= 0:
        raise ShapeRuleError("batch_norm_eval: channels must be > 0")
    check_axis(ax, len(s))
    if s[ax] != c:
        raise ShapeRuleError(f"batch_norm_eval: channel mismatch: op={c} vs input={s[ax]}")
    return s


register(OpSpec(
    "batch_norm_eval", "v1", 1, 1, _batch_norm,
    attrs=(Attr("channel_axis", "nat"), Attr("channels", "nat"), Attr("eps", "float", 1e-5)),
    params=(ParamRole("weight", _channel_vec), ParamRole("bias", _channel_vec),
            ParamRole("running_mean", _channel_vec), ParamRole("running_var", _channel_vec)),
    describe_fn=lambda a: (f"batch_norm_eval(channelAxis={a['channel_axis']}, channels={a['channels']}, "
                           f"payload=node_id)")))

for _k in ("relu", "tanh", "sigmoid", "exp", "log", "sin", "cos", "softplus"):
    register(OpSpec(_k, "v1", 1, 1, _identity))


def _safe_log(attrs: A, p: P, d: Shape) -> Shape:
    if p[1] != ():
        raise ShapeRuleError(f"safe_log: epsilon must be scalar, got {fmt_shape(p[1])}")
    return p[0]


register(OpSpec("safe_log", "v1", 2, 2, _safe_log, describe_fn=lambda a: "safe_log(epsilon=scalar_parent)"))


def _axis_keep(attrs: A, p: P, d: Shape) -> Shape:
    check_axis(attrs["axis"], len(p[0]))
    return p[0]


register(OpSpec("softmax", "v1", 1, 1, _axis_keep, attrs=(Attr("axis", "nat"),),
                describe_fn=lambda a: f"softmax(axis={a['axis']})"))


def _hard_mask(attrs: A, p: P, d: Shape) -> Shape:
    ms = tuple(attrs["mask_shape"])
    if ms != p[0]:
        raise ShapeRuleError(f"hard mask: expected shape {fmt_shape(p[0])}, but the payload has shape {fmt_shape(ms)}")
    if len(attrs["allowed"]) != numel(ms):
        raise ShapeRuleError(f"hard mask: shape {fmt_shape(ms)} requires {numel(ms)} entries, "
                             f"but the payload contains {len(attrs['allowed'])}")
    return p[0]


register(OpSpec("hard_masked_softmax", "v1", 1, 1, _hard_mask,
                attrs=(Attr("mask_shape", "shape"), Attr("allowed", "bools")),
                describe_fn=lambda a: f"hard_masked_softmax(maskShape={fmt_shape(a['mask_shape'])})",
                doc="last-axis softmax over allowed entries; TorchLean's importer has no mask encoding"))


def _layernorm(attrs: A, p: P, d: Shape) -> Shape:
    s, ax = p[0], attrs["axis"]
    check_axis(ax, len(s))
    if numel(s[ax:]) <= 0:
        raise ShapeRuleError("layernorm: embedDim must be > 0")
    return s


def _suffix(a: A, p: P, d: Shape) -> Shape:
    return tuple(p[0][a["axis"]:])


register(OpSpec("layernorm", "v1", 1, 1, _layernorm,
                attrs=(Attr("axis", "nat"), Attr("eps", "float", 1e-5)),
                params=(ParamRole("weight", _suffix, optional=True), ParamRole("bias", _suffix, optional=True)),
                describe_fn=lambda a: f"layernorm(axis={a['axis']})"))


def _reshape(attrs: A, p: P, d: Shape) -> Shape:
    src, dst = tuple(attrs["in_shape"]), tuple(attrs["out_shape"])
    if p[0] != src:
        raise ShapeRuleError(f"reshape: parent shape mismatch: expected {fmt_shape(src)}, got {fmt_shape(p[0])}")
    if numel(src) != numel(dst):
        raise ShapeRuleError(f"reshape: numel mismatch: {numel(src)} vs {numel(dst)}")
    return dst


register(OpSpec("reshape", "v1", 1, 1, _reshape, attrs=(Attr("in_shape", "shape"), Attr("out_shape", "shape")),
                dtype=same_as_parent,
                describe_fn=lambda a: f"reshape(from={fmt_shape(a['in_shape'])}, to={fmt_shape(a['out_shape'])})"))


def _flatten(attrs: A, p: P, d: Shape) -> Shape:
    vs = tuple(attrs["value_shape"])
    if p[0] != vs:
        raise ShapeRuleError(f"flatten: parent shape mismatch: expected {fmt_shape(vs)}, got {fmt_shape(p[0])}")
    return (numel(vs),)


register(OpSpec("flatten", "v1", 1, 1, _flatten, attrs=(Attr("value_shape", "shape"),), dtype=same_as_parent,
                describe_fn=lambda a: f"flatten(shape={fmt_shape(a['value_shape'])})"))

register(OpSpec("concat", "v1", 2, None, lambda a, p, d: concat_shape(p, a["axis"]),
                attrs=(Attr("axis", "nat"),), dtype=same_as_parent,
                describe_fn=lambda a: f"concat(axis={a['axis']})"))


def _mse(attrs: A, p: P, d: Shape) -> Shape:
    if p[0] != p[1]:
        raise ShapeRuleError(f"mse_loss: yhat/target shape mismatch: {fmt_shape(p[0])} vs {fmt_shape(p[1])}")
    return ()


register(OpSpec("mse_loss", "v1", 2, 2, _mse))

V1_KINDS = ("input", "const", "custom", "permute", "transpose", "detach", "rand_uniform", "bernoulli_mask",
            "add", "sub", "mul_elem", "abs", "sqrt", "inv", "max_elem", "min_elem", "max_pool", "avg_pool",
            "broadcast_to", "reduce_sum", "reduce_mean", "sum", "matmul", "linear", "conv", "batch_norm_eval",
            "relu", "tanh", "sigmoid", "exp", "log", "sin", "cos", "softplus", "safe_log", "softmax",
            "hard_masked_softmax", "layernorm", "reshape", "flatten", "concat", "mse_loss")
assert FLOAT == "float"
