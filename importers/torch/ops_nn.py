"""Lowerings of the layers with parameters or geometry: linear algebra, convolution, normalization,
pooling, embedding and attention. Shared by the FX function and module lowerings and the ATen overloads.

State_dict tensors go into the node's payload, bound to their key with the transform that turns
the stored tensor into the payload tensor (``addmm(b, x, W.t())`` is ``linear`` with ``W`` itself;
GPT-2's ``Conv1D`` weight ``[in, out]`` is bound with ``transpose``). Missing optional parameters
(no bias, no affine) get the op's neutral values, unbound.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
import torch

from torchlean_bridge.ops import BOOL, FLOAT, INT64

from .. import decompositions
from . import ops_elementwise as elementwise
from . import ops_layout as layout
from . import ops_reduce as reduction
from .common import Known, NotLowerable, Sym, prod
from .lowerer import Lowerer
from .targets import lowers, register

Cx = Lowerer


def _param(cx: Cx, v: Any, what: str) -> Known:
    if not isinstance(v, Known):
        raise NotLowerable(f"{what} is computed from the inputs; only import-time tensors can be payload")
    return v


def _zeros(n: int) -> np.ndarray:
    return np.zeros((n,), dtype=np.float32)


def _ones(n: int) -> np.ndarray:
    return np.ones((n,), dtype=np.float32)


# -- linear algebra -------------------------------------------------------------------------------
@lowers(aten="linear.default", fx="F.linear")
def linear(cx: Cx, input: Any, weight: Any, bias: Any = None, *, weight_transposed: bool = False) -> Any:
    """``linear`` when the weight is an import-time matrix; otherwise matmul (+ add)."""
    if not isinstance(weight, Known) or weight.tensor.dim() != 2 or cx.rank(input) < 1 \
            or (bias is not None and not isinstance(bias, Known)):
        w = weight if weight_transposed else layout.t(cx, weight)
        out = matmul(cx, input, w)
        return out if bias is None else elementwise.add(cx, out, bias)
    out_dim = weight.shape[1] if weight_transposed else weight.shape[0]
    if bias is not None and tuple(bias.shape) != (out_dim,):
        if prod(bias.shape) != out_dim:
            return elementwise.add(cx, linear(cx, input, weight, None, weight_transposed=weight_transposed), bias)
        bias = layout.reshape(cx, bias, [out_dim])
    x = cx.node(input, "float")
    out = cx.add("linear", [x], shape=cx.shape(input)[:-1] + (out_dim,))
    cx.bind_param(out.nid, "weight", weight, transpose=weight_transposed)
    if bias is None:
        cx.builder.param(out.nid, "bias", _zeros(out_dim))
    else:
        cx.bind_param(out.nid, "bias", bias)
    return out


@lowers(aten="addmm.default", fx="torch.addmm", methods="addmm")
def addmm(cx: Cx, input: Any, mat1: Any, mat2: Any, beta: float = 1, alpha: float = 1) -> Any:
    """``beta*input + alpha*(mat1 @ mat2)``; with a known ``mat2`` and bias it is ``linear``."""
    if beta == 1 and alpha == 1 and isinstance(mat2, Known) and isinstance(input, Known) \
            and prod(input.shape) == mat2.shape[1]:
        return linear(cx, mat1, mat2, input, weight_transposed=True)
    out = matmul(cx, mat1, mat2)
    if alpha != 1:
        out = elementwise.mul(cx, out, alpha)
    return elementwise.add(cx, out, input if beta == 1 else elementwise.mul(cx, input, beta))


@lowers(aten="matmul.default mm.default bmm.default", fx="operator.matmul torch.matmul torch.mm torch.bmm",
        methods="matmul mm bmm")
def matmul(cx: Cx, input: Any, other: Any) -> Sym:
    return cx.add("matmul", [cx.node(input, FLOAT), cx.node(other, FLOAT)])


@lowers(aten="baddbmm.default", fx="torch.baddbmm", methods="baddbmm")
def baddbmm(cx: Cx, input: Any, batch1: Any, batch2: Any, beta: float = 1, alpha: float = 1) -> Any:
    out = matmul(cx, batch1, batch2)
    if alpha != 1:
        out = elementwise.mul(cx, out, alpha)
    return elementwise.add(cx, out, input if beta == 1 else elementwise.mul(cx, input, beta))


@lowers(fx="torch.einsum")
def einsum(cx: Cx, equation: str, *operands: Any) -> Any:
    """Every einsum torch accepts, by the shared decomposition (importers/decompositions.py)."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    try:
        return Sym(decompositions.einsum(cx.builder, equation, [cx.shape(op) for op in operands],
                                         lambda i: cx.node(operands[i], FLOAT), cx.source()))
    except decompositions.Undecomposable as e:
        raise NotLowerable(f"einsum {e}") from None


@lowers(aten="einsum.default")
def aten_einsum(cx: Cx, equation: str, tensors: Sequence[Any], path: Any = None) -> Any:
    return einsum(cx, equation, *tensors)


# -- convolution ----------------------------------------------------------------------------------
def _tuple(v: Any, n: int) -> list[int]:
    if isinstance(v, int):
        return [v] * n
    v = [int(x) for x in v]
    return v * n if len(v) == 1 else v


@lowers(aten="conv1d.default conv2d.default conv3d.default conv1d.padding conv2d.padding conv3d.padding",
        fx="F.conv1d F.conv2d F.conv3d")
def conv(cx: Cx, input: Any, weight: Any, bias: Any = None, stride: Any = 1, padding: Any = 0,
         dilation: Any = 1, groups: int = 1) -> Sym:
    w = _param(cx, weight, "convolution weight")
    r = w.tensor.dim() - 2
    stride, dilation = _tuple(stride, r), _tuple(dilation, r)
    kernel = list(w.shape[2:])
    if padding == "valid":
        before = after = [0] * r
    elif padding == "same":
        total = [d * (k - 1) for d, k in zip(dilation, kernel)]
        before = [t_ // 2 for t_ in total]
        after = [t_ - b for t_, b in zip(total, before)]
    else:
        before = after = _tuple(padding, r)
    channel_axis = cx.rank(input) - r - 1
    if channel_axis not in (0, 1):
        raise NotLowerable(f"conv{r}d input of rank {cx.rank(input)}")
    attrs = {"spatial_rank": r, "kernel": kernel, "stride": stride, "padding": before, "padding_after": after,
             "dilation": dilation, "groups": int(groups), "channel_axis": channel_axis,
             "in_channels": w.shape[1] * int(groups), "out_channels": w.shape[0]}
    out = cx.add("conv", [cx.node(input, FLOAT)], attrs)
    cx.bind_param(out.nid, "weight", w)
    if bias is None:
        cx.builder.param(out.nid, "bias", _zeros(w.shape[0]))
    else:
        cx.bind_param(out.nid, "bias", _param(cx, bias, "convolution bias"))
    return out


@lowers(aten="conv_transpose1d.default conv_transpose2d.input conv_transpose3d.input",
        fx="F.conv_transpose1d F.conv_transpose2d F.conv_transpose3d")
def conv_transpose(cx: Cx, input: Any, weight: Any, bias: Any = None, stride: Any = 1, padding: Any = 0,
                   output_padding: Any = 0, groups: int = 1, dilation: Any = 1) -> Sym:
    """``F.conv_transposeNd`` (its argument order: groups before dilation); the weight keeps
    PyTorch's ``[in, out/groups, *kernel]`` layout, so it binds without a transform."""
    w = _param(cx, weight, "transposed convolution weight")
    r = w.tensor.dim() - 2
    channel_axis = cx.rank(input) - r - 1
    if channel_axis not in (0, 1):
        raise NotLowerable(f"conv_transpose{r}d input of rank {cx.rank(input)}")
    pad = _tuple(padding, r)
    attrs = {"spatial_rank": r, "kernel": list(w.shape[2:]), "stride": _tuple(stride, r), "padding": pad,
             "padding_after": pad, "output_padding": _tuple(output_padding, r), "dilation": _tuple(dilation, r),
             "groups": int(groups), "channel_axis": channel_axis, "in_channels": w.shape[0],
             "out_channels": w.shape[1] * int(groups)}
    out = cx.add("conv_transpose", [cx.node(input, FLOAT)], attrs)
    cx.bind_param(out.nid, "weight", w)
    if bias is None:
        cx.builder.param(out.nid, "bias", _zeros(attrs["out_channels"]))
    else:
        cx.bind_param(out.nid, "bias", _param(cx, bias, "transposed convolution bias"))
    return out


@lowers(aten="convolution.default _convolution.default")
def convolution(cx: Cx, input: Any, weight: Any, bias: Any, stride: Any, padding: Any, dilation: Any,
                transposed: bool, output_padding: Any, groups: int, *rest: Any) -> Sym:
    """``aten.convolution`` (``_convolution`` passes four backend flags after ``groups``)."""
    if transposed:
        return conv_transpose(cx, input, weight, bias, stride, padding, output_padding, groups, dilation)
    return conv(cx, input, weight, bias, stride, padding, dilation, groups)


# -- normalization --------------------------------------------------------------------------------
@lowers(aten="batch_norm.default")
def batch_norm(cx: Cx, input: Any, weight: Any, bias: Any, running_mean: Any, running_var: Any,
               training: bool, momentum: float = 0.1, eps: float = 1e-5, *_: Any) -> Sym:
    if training:
        raise NotLowerable("batch norm in training mode uses batch statistics; call model.eval() first")
    if running_mean is None or running_var is None:
        raise NotLowerable("batch norm without running statistics (track_running_stats=False) normalizes "
                           "with batch statistics; not an eval-mode layer")
    if cx.rank(input) < 2:
        raise NotLowerable(f"batch norm of a rank-{cx.rank(input)} input (PyTorch needs (N, C, ...))")
    if not all(isinstance(v, Known) for v in (weight, bias, running_mean, running_var) if v is not None):
        return _batch_norm_composed(cx, input, weight, bias, running_mean, running_var, eps)
    axis = 1  # PyTorch's channel axis for every rank, (N, C) included
    c = cx.shape(input)[axis]
    out = cx.add("batch_norm_eval", [cx.node(input, FLOAT)], {"channel_axis": axis, "channels": c,
                                                              "eps": float(eps)})
    for role, v, default in (("weight", weight, _ones), ("bias", bias, _zeros),
                             ("running_mean", running_mean, None), ("running_var", running_var, None)):
        if v is None:
            cx.builder.param(out.nid, role, default(c))
        else:
            cx.bind_param(out.nid, role, _param(cx, v, f"batch norm {role}"))
    return out


def _batch_norm_composed(cx: Cx, input: Any, weight: Any, bias: Any, running_mean: Any, running_var: Any,
                         eps: float) -> Any:
    """Statistics computed in the graph (instance norm's decomposition repeats them per sample):
    torch._decomp's ``(x - mean) * rsqrt(var + eps) * weight + bias`` along axis 1."""
    s = cx.shape(input)
    channel_shape = [s[1]] + [1] * (len(s) - 2)
    centered = elementwise.sub(cx, input, layout.reshape(cx, running_mean, channel_shape))
    scale = elementwise.unary("rsqrt")(cx, elementwise.add(cx, running_var, float(eps)))
    out = elementwise.mul(cx, centered, layout.reshape(cx, scale, channel_shape))
    return _channel_affine(cx, out, weight, bias, s)


@lowers(fx="F.batch_norm")
def f_batch_norm(cx: Cx, input: Any, running_mean: Any, running_var: Any, weight: Any = None, bias: Any = None,
                 training: bool = False, momentum: float = 0.1, eps: float = 1e-5) -> Sym:
    """F.batch_norm's argument order."""
    return batch_norm(cx, input, weight, bias, running_mean, running_var, training, momentum, eps)


@lowers(aten="_native_batch_norm_legit_no_training.default")
def batch_norm_no_training(cx: Cx, input: Any, weight: Any, bias: Any, running_mean: Any, running_var: Any,
                           momentum: float, eps: float) -> tuple[Any, None, None]:
    """aten._native_batch_norm_legit_no_training: (out, save_mean, save_rstd); only out is data."""
    return batch_norm(cx, input, weight, bias, running_mean, running_var, False, momentum, eps), None, None


@lowers(aten="native_batch_norm.default _native_batch_norm_legit.default")
def native_batch_norm(cx: Cx, input: Any, weight: Any, bias: Any, running_mean: Any, running_var: Any,
                      training: bool, momentum: float, eps: float) -> tuple[Any, None, None]:
    return batch_norm(cx, input, weight, bias, running_mean, running_var, training, momentum, eps), None, None


@lowers(aten="layer_norm.default", fx="F.layer_norm")
def layer_norm(cx: Cx, input: Any, normalized_shape: Sequence[int], weight: Any = None, bias: Any = None,
               eps: float = 1e-5, *_: Any) -> Sym:
    ns = [int(d) for d in ([normalized_shape] if isinstance(normalized_shape, int) else normalized_shape)]
    s = cx.shape(input)
    axis = len(s) - len(ns)
    if axis < 0 or list(s[axis:]) != ns:
        raise NotLowerable(f"layer norm over {ns} does not match the input's trailing shape {list(s)}")
    out = cx.add("layernorm", [cx.node(input, FLOAT)], {"axis": axis, "eps": float(eps)})
    for role, v in (("weight", weight), ("bias", bias)):
        if v is not None:
            cx.bind_param(out.nid, role, _param(cx, v, f"layer norm {role}"))
    return out


@lowers(aten="native_layer_norm.default")
def native_layer_norm(cx: Cx, input: Any, normalized_shape: Sequence[int], weight: Any, bias: Any,
                      eps: float) -> tuple[Any, None, None]:
    return layer_norm(cx, input, normalized_shape, weight, bias, eps), None, None


@lowers(aten="group_norm.default", fx="F.group_norm")
def group_norm(cx: Cx, input: Any, num_groups: int, weight: Any = None, bias: Any = None, eps: float = 1e-5,
               *_: Any) -> Any:
    """Group norm by the shared decomposition, then the per-channel scale and shift along axis 1."""
    s = cx.shape(input)
    try:
        out = decompositions.group_norm(cx.builder, cx.node(input, FLOAT), int(num_groups), float(eps), cx.source())
    except decompositions.Undecomposable as e:
        raise NotLowerable(f"group norm with {e}") from None
    return _channel_affine(cx, Sym(out), weight if weight is None else _param(cx, weight, "group norm weight"),
                           bias if bias is None else _param(cx, bias, "group norm bias"), s)


@lowers(aten="native_group_norm.default")
def native_group_norm(cx: Cx, input: Any, weight: Any, bias: Any, n: int, c: int, hxw: int, group: int,
                      eps: float) -> tuple[Any, None, None]:
    return group_norm(cx, input, group, weight, bias, eps), None, None


@lowers(aten="rms_norm.default", fx="F.rms_norm")
def rms_norm(cx: Cx, input: Any, normalized_shape: Sequence[int], weight: Any = None, eps: float | None = None) -> Any:
    """torch._decomp's rms_norm: ``x * rsqrt(mean(x^2 over the normalized suffix) + eps) * weight``;
    eps None is ``finfo(input dtype).eps``, read from the framework's recorded dtype."""
    ns = [int(d) for d in ([normalized_shape] if isinstance(normalized_shape, int) else normalized_shape)]
    s = cx.shape(input)
    axis = len(s) - len(ns)
    if axis < 0 or list(s[axis:]) != ns:
        raise NotLowerable(f"rms norm over {ns} does not match the input's trailing shape {list(s)}")
    if eps is None:
        eps = torch.finfo(cx.current_meta().dtype).eps
    x = Sym(cx.node(input, FLOAT))
    mean_square = reduction.reduce_mean(cx, elementwise.square(cx, x), list(range(axis, len(s))), True)
    out = elementwise.mul(cx, x, elementwise.unary("rsqrt")(cx, elementwise.add(cx, mean_square, float(eps))))
    return out if weight is None else elementwise.mul(cx, out, _param(cx, weight, "rms norm weight"))


def _channel_affine(cx: Cx, out: Any, weight: Any, bias: Any, shape: Sequence[int]) -> Any:
    """The per-channel scale and shift along axis 1 of an (N, C, ...) tensor."""
    channel_shape = [shape[1]] + [1] * (len(shape) - 2)
    per_channel = [None if p is None else (lambda p=p: cx.node(layout.reshape(cx, p, channel_shape), FLOAT))
                   for p in (weight, bias)]
    return Sym(decompositions.channel_affine(cx.builder, cx.node(out, FLOAT), *per_channel, cx.source()))


@lowers(aten="instance_norm.default")
def instance_norm(cx: Cx, input: Any, weight: Any = None, bias: Any = None, running_mean: Any = None,
                  running_var: Any = None, use_input_stats: bool = True, momentum: float = 0.1, eps: float = 1e-5,
                  *_: Any) -> Any:
    """aten.instance_norm: with input statistics it is group norm with one group per channel;
    otherwise the running statistics make it batch_norm_eval."""
    if not use_input_stats:
        return batch_norm(cx, input, weight, bias, running_mean, running_var, False, momentum, eps)
    s = cx.shape(input)
    if len(s) < 3:
        raise NotLowerable(f"instance norm of a rank-{len(s)} input (PyTorch needs (N, C, *spatial))")
    return group_norm(cx, input, s[1], weight, bias, eps)


@lowers(fx="F.instance_norm")
def f_instance_norm(cx: Cx, input: Any, running_mean: Any = None, running_var: Any = None, weight: Any = None,
                    bias: Any = None, use_input_stats: bool = True, momentum: float = 0.1, eps: float = 1e-5) -> Any:
    """F.instance_norm's argument order."""
    return instance_norm(cx, input, weight, bias, running_mean, running_var, use_input_stats, momentum, eps)


@lowers(aten="_native_batch_norm_legit.no_stats")
def batch_stats_norm(cx: Cx, input: Any, weight: Any, bias: Any, training: bool, momentum: float,
                     eps: float) -> tuple[Any, None, None]:
    """aten._native_batch_norm_legit.no_stats as instance norm's decomposition emits it: one sample
    viewed as (1, N*C, ...), so each channel is normalized over its own entries (per sample, exact).
    Several samples would share statistics: that is batch norm without running statistics."""
    s = cx.shape(input)
    if not training or len(s) < 2 or s[0] != 1:
        raise NotLowerable(f"batch norm with batch statistics over {s[0] if s else 0} samples "
                           "(track_running_stats=False) mixes the samples of a batch; not an eval-mode layer")
    rows = layout.reshape(cx, input, [s[1], -1])
    normed = cx.add("layernorm", [cx.node(rows, FLOAT)], {"axis": 1, "eps": float(eps)})
    return _channel_affine(cx, layout.reshape(cx, normed, s), weight, bias, s), None, None


# -- pooling ----------------------------------------------------------------------------------------
def _pool_geometry(cx: Cx, input: Any, r: int, kernel_size: Any, stride: Any, padding: Any, dilation: Any):
    k = _tuple(kernel_size, r)
    st = _tuple(stride, r) if stride not in (None, [], ()) else list(k)
    return k, st, _tuple(padding, r), _tuple(dilation, r)


def max_pool(r: int):
    def lower(cx: Cx, input: Any, kernel_size: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1,
              ceil_mode: bool = False, return_indices: bool = False) -> Sym:
        geometry = _pool_geometry(cx, input, r, kernel_size, stride, padding, dilation)
        values = _pool(cx, "max", r, input, *geometry, ceil_mode, True)
        if not return_indices:
            return values
        return values, _plane_max_positions(cx, input, r, values, geometry, ceil_mode)
    return lower


def _plane_max_positions(cx: Cx, input: Any, r: int, values: Sym, geometry: tuple, ceil_mode: bool) -> Sym:
    """PyTorch's pooling indices: ``max_pool_indices`` (positions in the whole input) minus the start of each
    (N, C) plane, exact in int64."""
    k, st, pad, dil = geometry
    attrs = {"spatial_rank": r, "kernel": k, "stride": st, "padding": pad, "padding_after": pad, "dilation": dil,
             "ceil_mode": bool(ceil_mode), "count_include_pad": True, "storage_order": False}
    where = cx.add("max_pool_indices", [cx.node(input, FLOAT)], attrs)
    return shift_planes(cx, where, cx.shape(input), r, -1)


def shift_planes(cx: Cx, where: Any, shape: Sequence[int], r: int, sign: int) -> Sym:
    """``where`` plus (sign +1) or minus (sign -1) the flat start of each (N, C, ...) plane of a tensor of
    ``shape`` whose trailing ``r`` axes are spatial: int64 arithmetic, exact."""
    lead, spatial = list(shape[:len(shape) - r]), list(shape[len(shape) - r:])
    out = cx.shape(where)
    starts = (np.arange(math.prod(lead), dtype=np.int64) * math.prod(spatial)).reshape(lead + [1] * r)
    offsets = cx.builder.const(np.ascontiguousarray(np.broadcast_to(starts, out)), source=cx.source(), folded=True)
    return cx.add("int_add" if sign > 0 else "int_sub", [cx.node(where, INT64), offsets], {"bits": 64, "signed": True})


def max_pool_with_indices(r: int):
    def lower(cx: Cx, input: Any, kernel_size: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1,
              ceil_mode: bool = False, return_indices: bool = True) -> tuple[Any, Any]:
        return max_pool(r)(cx, input, kernel_size, stride, padding, dilation, ceil_mode, True)
    return lower


def avg_pool(r: int):
    def lower(cx: Cx, input: Any, kernel_size: Any, stride: Any = None, padding: Any = 0, ceil_mode: bool = False,
              count_include_pad: bool = True, divisor_override: Any = None) -> Sym:
        if divisor_override is not None:
            raise NotLowerable("average pooling with divisor_override")
        return _pool(cx, "avg", r, input, *_pool_geometry(cx, input, r, kernel_size, stride, padding, 1),
                     ceil_mode, bool(count_include_pad))
    return lower


def _pool(cx: Cx, which: str, r: int, input: Any, kernel: list[int], stride: list[int], padding: list[int],
          dilation: list[int], ceil_mode: bool, count_include_pad: bool) -> Sym:
    """The general pool; passes.canonicalize makes it the v1 pool when v1's geometry is exact."""
    return cx.add(f"{which}_pool_nd", [cx.node(input, FLOAT)],
                  {"spatial_rank": r, "kernel": kernel, "stride": stride, "padding": padding, "padding_after": padding,
                   "dilation": dilation, "ceil_mode": bool(ceil_mode), "count_include_pad": bool(count_include_pad)})


def adaptive_pool(which: str, r: int, with_indices: bool = False):
    """Adaptive pooling: a fixed window where the output size divides the input size, else PyTorch's
    variable windows."""

    def lower(cx: Cx, input: Any, output_size: Any, return_indices: bool = False) -> Any:
        if return_indices:
            raise NotLowerable("adaptive max pooling with return_indices")
        spatial = cx.shape(input)[-r:]
        outs = [spatial[i] if o is None else int(o) for i, o in enumerate(_tuple_or_none(output_size, r))]
        if any(o <= 0 for o in outs):
            raise NotLowerable(f"adaptive pooling to an empty output size {outs}")
        if any(s % o for s, o in zip(spatial, outs)):
            out = _adaptive_windows(cx, which, input, spatial, outs)
        else:
            k = [s // o for s, o in zip(spatial, outs)]
            out = _pool(cx, which, r, input, k, k, [0] * r, [1] * r, False, True)
        return (out, None) if with_indices else out

    return lower


MAX_POOL = {r: register(max_pool(r), aten=f"max_pool{r}d.default", fx=f"F.max_pool{r}d") for r in (1, 2, 3)}
AVG_POOL = {r: register(avg_pool(r), aten=f"avg_pool{r}d.default", fx=f"F.avg_pool{r}d") for r in (1, 2, 3)}
ADAPTIVE_AVG_POOL = {r: register(adaptive_pool("avg", r), fx=f"F.adaptive_avg_pool{r}d",
                                 aten=f"adaptive_avg_pool{r}d.default _adaptive_avg_pool{r}d.default")
                     for r in (1, 2, 3)}
ADAPTIVE_MAX_POOL = {r: register(adaptive_pool("max", r), fx=f"F.adaptive_max_pool{r}d") for r in (1, 2, 3)}
for _r in (1, 2, 3):
    register(max_pool_with_indices(_r), aten=f"max_pool{_r}d_with_indices.default",
             fx=f"F.max_pool{_r}d_with_indices")
    register(adaptive_pool("max", _r, with_indices=True), aten=f"adaptive_max_pool{_r}d.default")


def _adaptive_windows(cx: Cx, which: str, input: Any, spatial: Sequence[int], outs: Sequence[int]) -> Any:
    """PyTorch's variable windows, output cell o of an axis of n cells reading [floor(o n / m),
    ceil((o + 1) n / m)): one axis at a time (a window is a product of intervals, so its mean is the
    mean of the per-axis means and its max the max of maxima), each cell a slice reduced with keepdim,
    the cells concatenated. Exact: the same windows, no fixed-stride approximation."""
    x = input
    first = cx.rank(input) - len(spatial)
    for i, (n, m) in enumerate(zip(spatial, outs)):
        axis = first + i
        cells: dict[tuple[int, int], Any] = {}
        parts = []
        for o in range(m):
            window = ((o * n) // m, -(-((o + 1) * n) // m))
            if window not in cells:
                part = layout.slice_axis(cx, x, axis, *window)
                if window[1] - window[0] > 1:
                    reduce = reduction.reduce_mean if which == "avg" else reduction.reduce_max
                    part = reduce(cx, part, [axis], True)
                cells[window] = part
            parts.append(cells[window])
        x = layout.cat(cx, parts, axis)
    return x


def _tuple_or_none(v: Any, n: int) -> list[Any]:
    if v is None or isinstance(v, int):
        return [v] * n
    v = list(v)
    return v * n if len(v) == 1 else v


# -- embedding and attention ------------------------------------------------------------------------
@lowers(aten="embedding.default")
def embedding(cx: Cx, weight: Any, indices: Any, padding_idx: int = -1, scale_grad_by_freq: bool = False,
              sparse: bool = False) -> Sym:
    """An embedding lookup is ``gather`` on axis 0 of the table (int64 indices)."""
    if cx.etype(indices) != INT64:
        raise NotLowerable(f"embedding indices have element type {cx.etype(indices)}, expected int64")
    return cx.add("gather", [cx.node(weight, FLOAT), cx.node(indices, INT64)], {"axis": 0})


@lowers(fx="F.embedding")
def f_embedding(cx: Cx, input: Any, weight: Any, padding_idx: Any = None, max_norm: Any = None,
                norm_type: float = 2.0, scale_grad_by_freq: bool = False, sparse: bool = False) -> Any:
    """F.embedding's argument order (indices first)."""
    if max_norm is not None:
        raise NotLowerable("embedding with max_norm renormalizes the table in place")
    return embedding(cx, weight, input)


@lowers(aten="scaled_dot_product_attention.default", fx="F.scaled_dot_product_attention")
def scaled_dot_product_attention(cx: Cx, query: Any, key: Any, value: Any, attn_mask: Any = None,
                                 dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
                                 enable_gqa: bool = False) -> Sym:
    """PyTorch's math definition: softmax(q k^T * scale + mask) v, with -inf where a bool mask is False."""
    if dropout_p:
        raise NotLowerable(f"attention dropout_p={dropout_p}; call model.eval() (dropout must be 0)")
    qs, ks = cx.shape(query), cx.shape(key)
    if enable_gqa and qs[-3] != ks[-3]:
        raise NotLowerable("grouped-query attention (enable_gqa with fewer key/value heads)")
    L, S = qs[-2], ks[-2]
    factor = 1.0 / math.sqrt(qs[-1]) if scale is None else float(scale)
    scores = matmul(cx, query, layout.transpose(cx, key, -2, -1))
    scores = elementwise.mul(cx, scores, factor)
    if is_causal:
        if attn_mask is not None:
            raise NotLowerable("attention with both attn_mask and is_causal")
        attn_mask = Known(torch.ones(L, S, dtype=torch.bool).tril(), folded=True)
    if attn_mask is not None:
        mask = cx.known(attn_mask)
        if cx.etype(attn_mask) == BOOL:
            if mask is not None and not bool(mask.any(-1).all()):
                raise NotLowerable("attention mask blocks every key of some query (PyTorch returns zeros there, "
                                   "softmax would be undefined)")
            scores = elementwise.where(cx, attn_mask, scores, float("-inf"))
        else:
            scores = elementwise.add(cx, scores, attn_mask)
    probs = reduction.softmax(cx, scores, -1)
    return matmul(cx, probs, value)
