"""The ATen dispatch table of the torch.export importer: overload name -> lowering.

Covers the overloads ``torch.export`` emits as is and the core ATen set ``run_decompositions()``
produces (``convolution``, ``native_layer_norm``, ``_native_batch_norm_legit_no_training``,
``addmm``, ``view``, ``expand``, ``clone``, ``alias``, ...). Arguments arrive positionally in schema
order; a keyword ``self`` is renamed ``input`` before the call.
"""

from __future__ import annotations

from typing import Any

from . import torch_nn as N
from . import torch_ops as T
from .torch_common import Lowering

__all__ = ["ATEN", "aten_lowering", "is_inplace_overload"]

ATEN: dict[str, Lowering] = {}


def _reg(names: str, fn: Lowering) -> None:
    for name in names.split():
        ATEN[f"aten.{name}"] = fn


_reg("add.Tensor add.Scalar", N.add)
_reg("sub.Tensor sub.Scalar", T.sub)
_reg("rsub.Tensor rsub.Scalar", T.rsub)
_reg("mul.Tensor mul.Scalar", T.mul)
_reg("div.Tensor div.Scalar div.Tensor_mode div.Scalar_mode true_divide.Tensor", T.div)
_reg("pow.Tensor_Scalar pow.Tensor_Tensor", T.pow_)
for _k in ("eq", "ne", "lt", "le", "gt", "ge"):
    _reg(f"{_k}.Tensor {_k}.Scalar", T.compare(_k))
_reg("logical_and.default __and__.Tensor bitwise_and.Tensor", T.logical("logical_and"))
_reg("logical_or.default __or__.Tensor bitwise_or.Tensor", T.logical("logical_or"))
_reg("bitwise_not.default", T.logical_not)
_reg("where.self where.ScalarOther where.ScalarSelf where.Scalar", T.where)
_reg("masked_fill.Scalar masked_fill.Tensor", T.masked_fill)

for _name, _kind in T.UNARY.items():
    _reg(f"{_name}.default {_name}_.default", T.unary(_kind))
_reg("round.default round.decimals round_.default", T.round_)
_reg("elu.default", T.elu)
_reg("clamp.default clamp.Tensor", T.clamp)
_reg("hardtanh_.default", T.hardtanh)

_reg("sum.default sum.dim_IntList", T.reduce_sum)
_reg("mean.default mean.dim", T.reduce_mean)
_reg("max.default max.dim", T.max_or_min("max"))
_reg("min.default min.dim", T.max_or_min("min"))
_reg("any.dim any.dims any.default", T.any_all("max"))
_reg("all.dim all.dims all.default", T.any_all("min"))
_reg("softmax.int _softmax.default", T.softmax("softmax"))
_reg("log_softmax.int _log_softmax.default", T.softmax("log_softmax"))
_reg("_safe_softmax.default", T.softmax("softmax"))

_reg("view.default reshape.default _unsafe_view.default", T.reshape)
_reg("transpose.int", T.transpose)
_reg("numpy_T.default", T.t)
_reg("squeeze.default squeeze.dim squeeze.dims", T.squeeze)
_reg("flatten.using_ints", T.flatten)
_reg("unflatten.int", T.unflatten)
_reg("expand.default", T.expand)
_reg("expand_as.default", T.expand_as)
_reg("view_as.default reshape_as.default", T.view_as)
_reg("cat.default concat.default", T.cat)
_reg("stack.default", T.stack)
_reg("slice.Tensor", T.slice_)
_reg("narrow.default", T.narrow)
_reg("select.int", T.select)
_reg("split.Tensor split_with_sizes.default split.sizes", T.split)
_reg("unbind.int", T.unbind)
_reg("index.Tensor", T.index)
_reg("constant_pad_nd.default", T.constant_pad_nd)
_reg("pad.default", T.pad)
_reg("repeat.default", T.repeat)
_reg("contiguous.default clone.default alias.default detach.default lift_fresh_copy.default "
     "_assert_tensor_metadata.default", T.identity)
_reg("dropout.default feature_dropout.default alpha_dropout.default", T.dropout)
_reg("native_dropout.default", lambda cx, input, p, train=False: (T.dropout(cx, input, p, bool(train)), None))
_reg("to.dtype to.dtype_layout to.device to.other _to_copy.default type_as.default", T.to)
_reg("new_zeros.default", T.like(0))
_reg("new_ones.default", T.like(1))
_reg("new_full.default", T.like(None))
_reg("sym_size.int", T.size)

_reg("einsum.default", lambda cx, equation, tensors, path=None: N.einsum(cx, equation, *tensors))
_reg("conv1d.default conv2d.default conv3d.default conv1d.padding conv2d.padding conv3d.padding", N.conv)
_reg("convolution.default _convolution.default", N.convolution)
_reg("conv_transpose1d.default conv_transpose2d.input conv_transpose3d.input", N.conv_transpose)
_reg("batch_norm.default", N.batch_norm)
_reg("_native_batch_norm_legit_no_training.default", N.batch_norm_no_training)
_reg("native_batch_norm.default _native_batch_norm_legit.default", N.native_batch_norm)
_reg("layer_norm.default", N.layer_norm)
_reg("native_layer_norm.default", N.native_layer_norm)
_reg("group_norm.default", N.group_norm)
_reg("native_group_norm.default", N.native_group_norm)
for _r in (1, 2, 3):
    _reg(f"max_pool{_r}d.default", N.max_pool(_r))
    _reg(f"max_pool{_r}d_with_indices.default", N.max_pool_with_indices(_r))
    _reg(f"avg_pool{_r}d.default", N.avg_pool(_r))
    _reg(f"adaptive_avg_pool{_r}d.default _adaptive_avg_pool{_r}d.default", N.adaptive_pool("avg", _r))
    _reg(f"adaptive_max_pool{_r}d.default", N.adaptive_pool("max", _r, with_indices=True))
_reg("embedding.default", N.embedding)
_reg("scaled_dot_product_attention.default", N.scaled_dot_product_attention)


_reg("var.dim var.correction var.default", T.variance)
_reg("std.dim std.correction std.default", T.std)
_reg("var_mean.dim var_mean.correction var_mean.default", T.with_mean(T.variance))
_reg("std_mean.dim std_mean.correction std_mean.default", T.with_mean(T.std))
_reg("linalg_vector_norm.default", T.vector_norm)
_reg("norm.Scalar norm.ScalarOpt_dim norm.ScalarOpt_dim_dtype norm.ScalarOpt_dtype", T.aten_norm)
_reg("logsumexp.default", T.logsumexp)
_reg("prod.default prod.dim_int", T.reduce_prod)
_reg("log_sigmoid.default", T.log_sigmoid)
_reg("log_sigmoid_forward.default", T.log_sigmoid_forward)
for _name, _lowering in N.SAME_NAME.items():
    _reg(f"{_name}.default", _lowering)
_reg("sort.stable", T.sort)
_reg("repeat_interleave.self_int", T.repeat_interleave)
for _r in (1, 2, 3):
    _reg(f"upsample_nearest{_r}d.vec upsample_nearest{_r}d.default _upsample_nearest_exact{_r}d.vec "
         f"_upsample_nearest_exact{_r}d.default", T.upsample_nearest(_r))
for _r, _op in ((1, "upsample_linear1d"), (2, "upsample_bilinear2d"), (3, "upsample_trilinear3d")):
    _reg(f"{_op}.vec {_op}.default", T.upsample_linear(_r))
_reg("upsample_bicubic2d.vec upsample_bicubic2d.default", T.upsample_interpolating("bicubic"))
_reg("rms_norm.default", N.rms_norm)
_reg("instance_norm.default", N.instance_norm)
_reg("_native_batch_norm_legit.no_stats", N.batch_stats_norm)


def aten_lowering(target: Any) -> Lowering | None:
    """The lowering of an overload; an in-place ``aten.X_.overload`` lowers as ``aten.X.overload``
    (the lowerer rebinds the mutated operand to the result)."""
    name = str(target)
    lower = ATEN.get(name)
    if lower is None and is_inplace_overload(target):
        _, packet, overload = name.split(".", 2)
        lower = ATEN.get(f"aten.{packet[:-1]}.{overload}")
    return lower


def is_inplace_overload(target: Any) -> bool:
    schema = getattr(target, "_schema", None)
    if schema is None or not schema.arguments:
        return False
    alias = schema.arguments[0].alias_info
    return bool(alias is not None and alias.is_write and not schema.arguments[0].kwarg_only)
