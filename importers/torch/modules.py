"""The torch.fx dispatch tables: leaf modules, functions (torch.*, F.*, operator.*) and methods.

Functions and methods adapt their Python signatures onto the shared lowerings of ``torch_ops`` and
``torch_nn``. Module lowerings read their hyper-parameters from the module and their tensors from
the state_dict by dotted path (``cx.param(path, "weight")``), so the role map binds the same keys
``module.state_dict()`` has. Leaf modules absent from ``MODULES`` (``nn.MultiheadAttention``,
``nn.TransformerEncoderLayer``, ...) are exported with torch.export and inlined by ``fx.py``.
"""

from __future__ import annotations

import builtins
import operator
from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import torch_nn as N
from . import torch_ops as T
from .torch_common import Lowerer, Lowering, NotLowerable

__all__ = ["FUNCTIONS", "METHODS", "MODULES", "ModuleLowering"]

Cx = Lowerer
ModuleLowering = Callable[..., Any]

# -- functions -------------------------------------------------------------------------------------
FUNCTIONS: dict[Any, Lowering] = {
    operator.add: N.add, operator.iadd: N.add, operator.sub: T.sub, operator.isub: T.sub,
    operator.mul: T.mul, operator.imul: T.mul, operator.truediv: T.div, operator.itruediv: T.div,
    operator.pow: T.pow_, operator.matmul: N.matmul, operator.getitem: T.getitem,
    operator.neg: T.unary("neg"), operator.eq: T.compare("eq"), operator.ne: T.compare("ne"),
    operator.lt: T.compare("lt"), operator.le: T.compare("le"), operator.gt: T.compare("gt"),
    operator.ge: T.compare("ge"), operator.and_: T.logical("logical_and"), operator.or_: T.logical("logical_or"),
    operator.invert: T.logical_not, builtins.getattr: T.getattr_,
}


def _fn(names: str, fn: Lowering, *namespaces: Any) -> None:
    for ns in namespaces or (torch,):
        for name in names.split():
            if hasattr(ns, name):
                FUNCTIONS[getattr(ns, name)] = fn


_fn("add", N.add)
_fn("sub subtract", T.sub)
_fn("rsub", T.rsub)
_fn("mul multiply", T.mul)
_fn("div divide true_divide", T.div)
_fn("pow", T.pow_)
for _k in ("eq", "ne", "lt", "le", "gt", "ge"):
    _fn(_k, T.compare(_k))
_fn("logical_and", T.logical("logical_and"))
_fn("logical_or", T.logical("logical_or"))
_fn("where", T.where)
_fn("masked_fill", T.masked_fill)
for _name, _kind in T.UNARY.items():
    _fn(_name, T.unary(_kind), torch, F)
    _fn(_name + "_", T.unary(_kind), torch, F)
_fn("round", T.round_, torch)
_fn("round_", T.round_, torch)
_fn("elu", lambda cx, input, alpha=1.0, inplace=False: T.elu(cx, input, alpha), F)
_fn("clamp clip", T.clamp)
_fn("sum", T.reduce_sum)
_fn("mean", T.reduce_mean)
_fn("max", T.max_or_min("max"))
_fn("min", T.max_or_min("min"))
_fn("softmax", lambda cx, input, dim=None, _stacklevel=3, dtype=None: T.softmax("softmax")(cx, input, dim), F)
_fn("log_softmax", lambda cx, input, dim=None, _stacklevel=3, dtype=None:
    T.softmax("log_softmax")(cx, input, dim), F)
_fn("softmax", T.softmax("softmax"))
_fn("log_softmax", T.softmax("log_softmax"))
_fn("reshape", T.reshape)
_fn("transpose swapaxes swapdims", T.transpose)
_fn("squeeze", T.squeeze)
_fn("flatten", T.flatten)
_fn("unflatten", T.unflatten)
_fn("cat concat concatenate", lambda cx, tensors, dim=0, axis=None: T.cat(cx, tensors, dim if axis is None else axis))
_fn("stack", T.stack)
_fn("narrow", T.narrow)
_fn("select", T.select)
_fn("split", lambda cx, tensor, split_size_or_sections, dim=0: T.split(cx, tensor, split_size_or_sections, dim))
_fn("unbind", T.unbind)
_fn("broadcast_to", T.expand)
_fn("broadcast_tensors", T.broadcast_tensors)
_fn("einsum", N.einsum)
_fn("conv1d conv2d conv3d", N.conv, F)
_fn("conv_transpose1d conv_transpose2d conv_transpose3d", N.conv_transpose, F)
_fn("layer_norm", N.layer_norm, F)
_fn("group_norm", N.group_norm, F)
_fn("batch_norm", lambda cx, input, running_mean, running_var, weight=None, bias=None, training=False,
    momentum=0.1, eps=1e-5: N.batch_norm(cx, input, weight, bias, running_mean, running_var, training, momentum,
                                         eps), F)
for _r in (1, 2, 3):
    _fn(f"max_pool{_r}d", N.max_pool(_r), F)
    _fn(f"avg_pool{_r}d", N.avg_pool(_r), F)
    _fn(f"adaptive_avg_pool{_r}d", N.adaptive_pool("avg", _r), F)
    _fn(f"adaptive_max_pool{_r}d", N.adaptive_pool("max", _r), F)
_fn("dropout dropout1d dropout2d dropout3d alpha_dropout feature_alpha_dropout",
    lambda cx, input, p=0.5, training=True, inplace=False: T.dropout(cx, input, p, training), F)
_fn("pad", T.pad, F)
_fn("scaled_dot_product_attention", N.scaled_dot_product_attention, F)

_fn("var", T.variance)
_fn("std", T.std)
_fn("var_mean", T.with_mean(T.variance))
_fn("std_mean", T.with_mean(T.std))
_fn("vector_norm", T.vector_norm, torch.linalg)
_fn("norm", T.norm)
_fn("normalize", T.normalize, F)
_fn("logsumexp", T.logsumexp, torch, torch.special)
_fn("prod", T.reduce_prod)
_fn("logsigmoid", T.log_sigmoid, F)
_fn("softmin", T.softmin, F)
for _name, _lowering in N.SAME_NAME.items():
    _fn(_name, _lowering, torch, F)
_fn("repeat_interleave", T.repeat_interleave)
_fn("interpolate upsample", T.interpolate, F)
_fn("upsample_nearest", lambda cx, input, size=None, scale_factor=None: T.interpolate(cx, input, size, scale_factor),
    F)
_fn("rms_norm", N.rms_norm, F)
_fn("instance_norm", N.f_instance_norm, F)


def _f_embedding(cx: Cx, input: Any, weight: Any, padding_idx: Any = None, max_norm: Any = None,
                 norm_type: float = 2.0, scale_grad_by_freq: bool = False, sparse: bool = False) -> Any:
    if max_norm is not None:
        raise NotLowerable("embedding with max_norm renormalizes the table in place")
    return N.embedding(cx, weight, input)


FUNCTIONS[F.embedding] = _f_embedding

# -- methods ---------------------------------------------------------------------------------------
METHODS: dict[str, Lowering] = {
    "add": N.add, "sub": T.sub, "rsub": T.rsub, "mul": T.mul, "div": T.div, "true_divide": T.div,
    "pow": T.pow_,
    "eq": T.compare("eq"), "ne": T.compare("ne"), "lt": T.compare("lt"), "le": T.compare("le"),
    "gt": T.compare("gt"), "ge": T.compare("ge"), "logical_and": T.logical("logical_and"),
    "logical_or": T.logical("logical_or"),
    "masked_fill": T.masked_fill, "where": lambda cx, input, condition, other: T.where(cx, condition, input, other),
    "clamp": T.clamp, "clip": T.clamp, "softmax": T.softmax("softmax"),
    "log_softmax": T.softmax("log_softmax"),
    "sum": T.reduce_sum, "mean": T.reduce_mean, "max": T.max_or_min("max"), "min": T.max_or_min("min"),
    "any": T.any_all("max"), "all": T.any_all("min"),
    "view": T.view, "reshape": T.view, "transpose": T.transpose,
    "squeeze": T.squeeze, "flatten": T.flatten, "unflatten": T.unflatten,
    "expand": T.expand, "expand_as": T.expand_as, "view_as": T.view_as, "reshape_as": T.view_as,
    "contiguous": T.identity, "clone": T.identity, "detach": T.identity,
    "to": T.to, "type_as": T.type_as, "float": T.method_cast(torch.float32), "double": T.method_cast(torch.float64),
    "half": T.method_cast(torch.float32), "long": T.method_cast(torch.int64), "int": T.method_cast(torch.int64),
    "bool": T.method_cast(torch.bool),
    "size": T.size, "dim": T.dim, "numel": T.numel, "split": T.split, "unbind": T.unbind,
    "narrow": T.narrow, "select": T.select, "repeat": T.repeat,
    "new_zeros": T.like(0), "new_ones": T.like(1), "new_full": T.like(None),
    "var": T.variance, "std": T.std, "norm": T.tensor_norm, "logsumexp": T.logsumexp, "prod": T.reduce_prod,
    "repeat_interleave": T.repeat_interleave,
    **{name: lowering for name, lowering in N.SAME_NAME.items() if hasattr(torch.Tensor, name)},
}
for _name, _kind in T.UNARY.items():
    METHODS[_name] = T.unary(_kind)
METHODS["round"] = T.round_
for _name in list(METHODS):
    METHODS.setdefault(_name + "_", METHODS[_name])  # in-place variants: same value, rebound by the lowerer


# -- modules ---------------------------------------------------------------------------------------
def _linear(cx: Cx, m: nn.Linear, path: str, x: Any) -> Any:
    return N.linear(cx, x, cx.param(path, "weight"), cx.param(path, "bias"))


def _conv(cx: Cx, m: nn.modules.conv._ConvNd, path: str, x: Any) -> Any:
    if m.padding_mode != "zeros":
        raise NotLowerable(f"convolution padding_mode={m.padding_mode!r} (only 'zeros' is supported)")
    return N.conv(cx, x, cx.param(path, "weight"), cx.param(path, "bias"), m.stride, m.padding, m.dilation,
                  m.groups)


def _conv_transpose(cx: Cx, m: nn.modules.conv._ConvTransposeNd, path: str, x: Any, output_size: Any = None) -> Any:
    if m.padding_mode != "zeros":
        raise NotLowerable(f"transposed convolution padding_mode={m.padding_mode!r} (only 'zeros' is supported)")
    if output_size is not None:
        raise NotLowerable("transposed convolution called with output_size (pass output_padding to the module)")
    return N.conv_transpose(cx, x, cx.param(path, "weight"), cx.param(path, "bias"), m.stride, m.padding,
                            m.output_padding, m.groups, m.dilation)


def _batch_norm(cx: Cx, m: nn.modules.batchnorm._BatchNorm, path: str, x: Any) -> Any:
    return N.batch_norm(cx, x, cx.param(path, "weight"), cx.param(path, "bias"), cx.param(path, "running_mean"),
                        cx.param(path, "running_var"), m.training or m.running_mean is None, m.momentum or 0.0,
                        m.eps)


def _layer_norm(cx: Cx, m: nn.LayerNorm, path: str, x: Any) -> Any:
    return N.layer_norm(cx, x, m.normalized_shape, cx.param(path, "weight"), cx.param(path, "bias"), m.eps)


def _group_norm(cx: Cx, m: nn.GroupNorm, path: str, x: Any) -> Any:
    return N.group_norm(cx, x, m.num_groups, cx.param(path, "weight"), cx.param(path, "bias"), m.eps)


def _embedding(cx: Cx, m: nn.Embedding, path: str, x: Any) -> Any:
    if m.max_norm is not None:
        raise NotLowerable("embedding with max_norm renormalizes the table in place")
    return N.embedding(cx, cx.param(path, "weight"), x)


def _dropout(cx: Cx, m: nn.Module, path: str, x: Any) -> Any:
    return T.dropout(cx, x, getattr(m, "p", 0.0), m.training)


def _rms_norm(cx: Cx, m: nn.RMSNorm, path: str, x: Any) -> Any:
    return N.rms_norm(cx, x, m.normalized_shape, cx.param(path, "weight"), m.eps)


def _instance_norm(cx: Cx, m: nn.modules.instancenorm._InstanceNorm, path: str, x: Any) -> Any:
    """Unbatched inputs (rank ``_get_no_batch_dim()``) get a batch axis around the norm, as the module does."""
    unbatched = cx.rank(x) == m._get_no_batch_dim()
    if unbatched:
        x = T.unsqueeze(cx, x, 0)
    out = N.instance_norm(cx, x, cx.param(path, "weight"), cx.param(path, "bias"), cx.param(path, "running_mean"),
                          cx.param(path, "running_var"), m.training or not m.track_running_stats,
                          m.momentum or 0.0, m.eps)
    return T.squeeze(cx, out, 0) if unbatched else out


def _upsample(cx: Cx, m: nn.Upsample, path: str, x: Any) -> Any:
    return T.interpolate(cx, x, m.size, m.scale_factor, m.mode, m.align_corners, m.recompute_scale_factor)


def _simple(fn: Lowering, *attrs: str) -> ModuleLowering:
    """A parameter-free module: its hyper-parameters passed to a functional lowering."""
    return lambda cx, m, path, x: fn(cx, x, *(getattr(m, a, None) for a in attrs))


MODULES: dict[type, ModuleLowering] = {
    nn.Linear: _linear, nn.Conv1d: _conv, nn.Conv2d: _conv, nn.Conv3d: _conv,
    nn.ConvTranspose1d: _conv_transpose, nn.ConvTranspose2d: _conv_transpose, nn.ConvTranspose3d: _conv_transpose,
    nn.BatchNorm1d: _batch_norm, nn.BatchNorm2d: _batch_norm, nn.BatchNorm3d: _batch_norm,
    nn.LayerNorm: _layer_norm, nn.GroupNorm: _group_norm, nn.Embedding: _embedding,
    nn.Dropout: _dropout, nn.Dropout1d: _dropout, nn.Dropout2d: _dropout, nn.Dropout3d: _dropout,
    nn.AlphaDropout: _dropout, nn.Identity: lambda cx, m, path, x, *a, **k: x,
    nn.ReLU: _simple(T.unary("relu")), nn.Tanh: _simple(T.unary("tanh")), nn.Sigmoid: _simple(T.unary("sigmoid")),
    nn.SiLU: _simple(T.unary("silu")), nn.Mish: _simple(T.unary("mish")), nn.Hardswish: _simple(T.unary("hardswish")),
    nn.SELU: _simple(T.unary("selu")), nn.Softsign: _simple(T.unary("softsign")),
    nn.GELU: _simple(T.gelu, "approximate"), nn.LeakyReLU: _simple(T.leaky_relu, "negative_slope"),
    nn.ELU: _simple(T.elu, "alpha"), nn.CELU: _simple(T.celu, "alpha"),
    nn.Softplus: _simple(T.softplus, "beta", "threshold"), nn.Hardtanh: _simple(T.hardtanh, "min_val", "max_val"),
    nn.ReLU6: _simple(T.relu6), nn.Hardsigmoid: _simple(T.hardsigmoid),
    nn.Softmax: _simple(T.softmax("softmax"), "dim"), nn.LogSoftmax: _simple(T.softmax("log_softmax"), "dim"),
    nn.Flatten: _simple(T.flatten, "start_dim", "end_dim"),
    nn.Unflatten: _simple(T.unflatten, "dim", "unflattened_size"),
    nn.RMSNorm: _rms_norm, nn.InstanceNorm1d: _instance_norm, nn.InstanceNorm2d: _instance_norm,
    nn.InstanceNorm3d: _instance_norm, nn.Upsample: _upsample, nn.UpsamplingNearest2d: _upsample,
    nn.UpsamplingBilinear2d: _upsample, nn.PixelShuffle: _simple(T.pixel_shuffle, "upscale_factor"),
    nn.PixelUnshuffle: _simple(T.pixel_unshuffle, "downscale_factor"), nn.LogSigmoid: _simple(T.log_sigmoid),
    nn.GLU: _simple(T.glu, "dim"), nn.Softmin: _simple(T.softmin, "dim"),
}
for _r, (_mp, _ap, _aap, _amp) in enumerate(((nn.MaxPool1d, nn.AvgPool1d, nn.AdaptiveAvgPool1d, nn.AdaptiveMaxPool1d),
                                             (nn.MaxPool2d, nn.AvgPool2d, nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool2d),
                                             (nn.MaxPool3d, nn.AvgPool3d, nn.AdaptiveAvgPool3d, nn.AdaptiveMaxPool3d)),
                                            start=1):
    MODULES[_mp] = _simple(N.max_pool(_r), "kernel_size", "stride", "padding", "dilation", "ceil_mode",
                           "return_indices")
    MODULES[_ap] = _simple(N.avg_pool(_r), "kernel_size", "stride", "padding", "ceil_mode", "count_include_pad",
                           "divisor_override")
    MODULES[_aap] = _simple(N.adaptive_pool("avg", _r), "output_size")
    MODULES[_amp] = _simple(N.adaptive_pool("max", _r), "output_size", "return_indices")
