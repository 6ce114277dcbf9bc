"""Lowerings of ``torch.nn`` leaf modules, registered by module type.

A module lowering is called as ``lower(cx, module, path, *args)``: it reads hyper-parameters from the
module and tensors from the state_dict by dotted path (``cx.param(path, "weight")``), so the role
map binds the same keys ``module.state_dict()`` has. Leaf modules without a lowering here
(``nn.MultiheadAttention``, ``nn.TransformerEncoderLayer``, ...) are exported with torch.export and
their ATen program is inlined (``program.TorchLowerer.inline_module``).
"""

from __future__ import annotations

from typing import Any, Callable

import torch.nn as nn

from . import ops_elementwise as elementwise
from . import ops_layout as layout
from . import ops_nn as nn_ops
from . import ops_rearrange as rearrange
from . import ops_reduce as reduction
from . import ops_resize as resize
from .common import Lowering, NotLowerable
from .lowerer import Lowerer
from .targets import lowers, register

__all__ = ["ModuleLowering"]

Cx = Lowerer
ModuleLowering = Callable[..., Any]


# -- modules ---------------------------------------------------------------------------------------
@lowers(modules=[nn.Linear])
def _linear(cx: Cx, m: nn.Linear, path: str, x: Any) -> Any:
    return nn_ops.linear(cx, x, cx.param(path, "weight"), cx.param(path, "bias"))


@lowers(modules=[nn.Conv1d, nn.Conv2d, nn.Conv3d])
def _conv(cx: Cx, m: nn.modules.conv._ConvNd, path: str, x: Any) -> Any:
    if m.padding_mode != "zeros":
        raise NotLowerable(f"convolution padding_mode={m.padding_mode!r} (only 'zeros' is supported)")
    return nn_ops.conv(cx, x, cx.param(path, "weight"), cx.param(path, "bias"), m.stride, m.padding, m.dilation,
                  m.groups)


@lowers(modules=[nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d])
def _conv_transpose(cx: Cx, m: nn.modules.conv._ConvTransposeNd, path: str, x: Any, output_size: Any = None) -> Any:
    if m.padding_mode != "zeros":
        raise NotLowerable(f"transposed convolution padding_mode={m.padding_mode!r} (only 'zeros' is supported)")
    if output_size is not None:
        raise NotLowerable("transposed convolution called with output_size (pass output_padding to the module)")
    return nn_ops.conv_transpose(cx, x, cx.param(path, "weight"), cx.param(path, "bias"), m.stride, m.padding,
                            m.output_padding, m.groups, m.dilation)


@lowers(modules=[nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d])
def _batch_norm(cx: Cx, m: nn.modules.batchnorm._BatchNorm, path: str, x: Any) -> Any:
    return nn_ops.batch_norm(cx, x, cx.param(path, "weight"), cx.param(path, "bias"), cx.param(path, "running_mean"),
                        cx.param(path, "running_var"), m.training or m.running_mean is None, m.momentum or 0.0,
                        m.eps)


@lowers(modules=[nn.LayerNorm])
def _layer_norm(cx: Cx, m: nn.LayerNorm, path: str, x: Any) -> Any:
    return nn_ops.layer_norm(cx, x, m.normalized_shape, cx.param(path, "weight"), cx.param(path, "bias"), m.eps)


@lowers(modules=[nn.GroupNorm])
def _group_norm(cx: Cx, m: nn.GroupNorm, path: str, x: Any) -> Any:
    return nn_ops.group_norm(cx, x, m.num_groups, cx.param(path, "weight"), cx.param(path, "bias"), m.eps)


@lowers(modules=[nn.Embedding])
def _embedding(cx: Cx, m: nn.Embedding, path: str, x: Any) -> Any:
    if m.max_norm is not None:
        raise NotLowerable("embedding with max_norm renormalizes the table in place")
    return nn_ops.embedding(cx, cx.param(path, "weight"), x)


@lowers(modules=[nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout])
def _dropout(cx: Cx, m: nn.Module, path: str, x: Any) -> Any:
    return elementwise.dropout(cx, x, getattr(m, "p", 0.0), m.training)


@lowers(modules=[nn.RMSNorm])
def _rms_norm(cx: Cx, m: nn.RMSNorm, path: str, x: Any) -> Any:
    return nn_ops.rms_norm(cx, x, m.normalized_shape, cx.param(path, "weight"), m.eps)


@lowers(modules=[nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d])
def _instance_norm(cx: Cx, m: nn.modules.instancenorm._InstanceNorm, path: str, x: Any) -> Any:
    """Unbatched inputs (rank ``_get_no_batch_dim()``) get a batch axis around the norm, as the module does."""
    unbatched = cx.rank(x) == m._get_no_batch_dim()
    if unbatched:
        x = layout.unsqueeze(cx, x, 0)
    out = nn_ops.instance_norm(cx, x, cx.param(path, "weight"), cx.param(path, "bias"), cx.param(path, "running_mean"),
                          cx.param(path, "running_var"), m.training or not m.track_running_stats,
                          m.momentum or 0.0, m.eps)
    return layout.squeeze(cx, out, 0) if unbatched else out


@lowers(modules=[nn.Upsample, nn.UpsamplingNearest2d, nn.UpsamplingBilinear2d])
def _upsample(cx: Cx, m: nn.Upsample, path: str, x: Any) -> Any:
    return resize.interpolate(cx, x, m.size, m.scale_factor, m.mode, m.align_corners, m.recompute_scale_factor)


@lowers(modules=[nn.Identity])
def _identity(cx: Cx, m: nn.Identity, path: str, x: Any, *args: Any, **kwargs: Any) -> Any:
    return x


def _simple(fn: Lowering, *attrs: str) -> ModuleLowering:
    """A parameter-free module: its hyper-parameters passed to a functional lowering."""
    return lambda cx, m, path, x: fn(cx, x, *(getattr(m, a, None) for a in attrs))


for _module, _lowering in {
    **{module: _simple(elementwise.unary(kind)) for module, kind in (
        (nn.ReLU, "relu"), (nn.Tanh, "tanh"), (nn.Sigmoid, "sigmoid"), (nn.SiLU, "silu"), (nn.Mish, "mish"),
        (nn.Hardswish, "hardswish"), (nn.SELU, "selu"), (nn.Softsign, "softsign"))},
    nn.GELU: _simple(elementwise.gelu, "approximate"), nn.LeakyReLU: _simple(elementwise.leaky_relu, "negative_slope"),
    nn.ELU: _simple(elementwise.elu, "alpha"), nn.CELU: _simple(elementwise.celu, "alpha"),
    nn.Softplus: _simple(elementwise.softplus, "beta", "threshold"),
    nn.Hardtanh: _simple(elementwise.hardtanh, "min_val", "max_val"), nn.ReLU6: _simple(elementwise.relu6),
    nn.Hardsigmoid: _simple(elementwise.hardsigmoid), nn.LogSigmoid: _simple(elementwise.log_sigmoid),
    nn.Softmax: _simple(reduction.softmax, "dim"), nn.LogSoftmax: _simple(reduction.log_softmax, "dim"),
    nn.Softmin: _simple(reduction.softmin, "dim"), nn.GLU: _simple(rearrange.glu, "dim"),
    nn.Flatten: _simple(layout.flatten, "start_dim", "end_dim"),
    nn.Unflatten: _simple(layout.unflatten, "dim", "unflattened_size"),
    nn.PixelShuffle: _simple(rearrange.pixel_shuffle, "upscale_factor"),
    nn.PixelUnshuffle: _simple(rearrange.pixel_unshuffle, "downscale_factor"),
}.items():
    register(_lowering, modules=[_module])
for _r, (_mp, _ap, _aap, _amp) in enumerate(((nn.MaxPool1d, nn.AvgPool1d, nn.AdaptiveAvgPool1d, nn.AdaptiveMaxPool1d),
                                             (nn.MaxPool2d, nn.AvgPool2d, nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool2d),
                                             (nn.MaxPool3d, nn.AvgPool3d, nn.AdaptiveAvgPool3d, nn.AdaptiveMaxPool3d)),
                                            start=1):
    register(_simple(nn_ops.MAX_POOL[_r], "kernel_size", "stride", "padding", "dilation", "ceil_mode",
                     "return_indices"), modules=[_mp])
    register(_simple(nn_ops.AVG_POOL[_r], "kernel_size", "stride", "padding", "ceil_mode", "count_include_pad",
                     "divisor_override"), modules=[_ap])
    register(_simple(nn_ops.ADAPTIVE_AVG_POOL[_r], "output_size"), modules=[_aap])
    register(_simple(nn_ops.ADAPTIVE_MAX_POOL[_r], "output_size", "return_indices"), modules=[_amp])
from . import ops_recurrent  # noqa: E402,F401  nn.LSTM / nn.GRU / nn.RNN (flow)
