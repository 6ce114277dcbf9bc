"""ONNX spatial sampling ops (issue #15): GridSample, LpPool, Col2Im, DeformConv and RoiAlign become the ext
kinds of the same names; AffineGrid and CenterCropPad are exact compositions of existing IR ops.

AffineGrid is ``theta @ base^T`` with the base grid (x, y[, z], 1) of the requested size as a constant (what
the ONNX reference and onnxruntime compute); CenterCropPad is a centered ``slice`` and ``pad`` per axis
(the odd cell goes to the end, as the spec's reference does).
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from torchlean_bridge.ops import FLOAT, INT64

from . import ops_nn
from ..grids import affine_base_grid
from .context import OnnxContext, Value

__all__ = ["HANDLERS", "OPSETS", "EMITS", "center_crop_pad_geometry"]

Handler = Callable[[OnnxContext], list[Value]]

_GRID_MODES = {"linear": "linear", "bilinear": "linear", "nearest": "nearest", "cubic": "cubic", "bicubic": "cubic"}


def _float_operand(ctx: OnnxContext, i: int, what: str) -> int:
    if ctx.dtype(i) != FLOAT:
        raise ctx.fail(f"{what} has element type {ctx.dtype(i)} (expected a float tensor)")
    return ctx.operand(i)


def _grid_sample(ctx: OnnxContext) -> list[Value]:
    mode = str(ctx.attr("mode", "linear" if ctx.opset >= 20 else "bilinear"))
    padding = str(ctx.attr("padding_mode", "zeros"))
    names = ("linear", "nearest", "cubic") if ctx.opset >= 20 else ("bilinear", "nearest", "bicubic")
    if mode not in names:
        raise ctx.fail(f"mode={mode} (GridSample-{20 if ctx.opset >= 20 else 16} has {', '.join(names)})")
    if padding not in ("zeros", "border", "reflection"):
        raise ctx.fail(f"padding_mode={padding}")
    xs = ctx.shape(0)
    if ctx.opset < 20 and len(xs) != 4:
        raise ctx.fail(f"input rank {len(xs)} (GridSample-16 samples 4-D inputs only)")
    attrs = {"mode": _GRID_MODES[mode], "padding_mode": padding, "align_corners": bool(ctx.attr("align_corners", 0)),
             "convention": "onnx"}
    return [ctx.add("grid_sample", [_float_operand(ctx, 0, "X"), _float_operand(ctx, 1, "grid")], attrs)]


def _lp_pool(ctx: OnnxContext) -> list[Value]:
    xs = ctx.shape(0)
    kernel = list(ctx.attr("kernel_shape") or [])
    r = len(kernel)
    if r == 0 or len(xs) < r + 1:
        raise ctx.fail(f"kernel_shape {kernel} for an input of rank {len(xs)}")
    p = float(ctx.attr("p", 2))
    if not p > 0 or not math.isfinite(p):
        raise ctx.fail(f"p={p} (a positive exponent)")
    attrs = {**ops_nn.window_attrs(ctx), "p": p}
    ops_nn.window_output(ctx, "lp_pool_nd", attrs)
    return [ctx.add("lp_pool_nd", [_float_operand(ctx, 0, "X")], attrs)]


def _col2im(ctx: OnnxContext) -> list[Value]:
    image = ctx.ints(1, "image_shape")
    block = ctx.ints(2, "block_shape")
    r = len(image)
    if r == 0 or len(block) != r or any(v < 1 for v in image + block):
        raise ctx.fail(f"image_shape {image} and block_shape {block} (one positive entry per spatial axis each)")
    strides = list(ctx.attr("strides") or [1] * r)
    dilations = list(ctx.attr("dilations") or [1] * r)
    pads = list(ctx.attr("pads") or [0] * (2 * r))
    if len(strides) != r or len(dilations) != r or len(pads) != 2 * r or min(strides + dilations) < 1 \
            or min(pads) < 0:
        raise ctx.fail(f"strides {strides}, dilations {dilations}, pads {pads} for {r} spatial axes")
    attrs = {"spatial_rank": r, "image": tuple(image), "block": tuple(block), "stride": tuple(strides),
             "padding": tuple(pads[:r]), "padding_after": tuple(pads[r:]), "dilation": tuple(dilations)}
    return [ctx.add("col2im", [_float_operand(ctx, 0, "input")], attrs)]


def center_crop_pad_geometry(shape: tuple[int, ...], wanted: dict[int, int]) -> tuple[list, list, list]:
    """Per listed axis: the crop as (axis, start, end) and the padding before and after (reference rule)."""
    crops, before, after = [], [0] * len(shape), [0] * len(shape)
    for axis, want in sorted(wanted.items()):
        have = shape[axis]
        if want < have:
            start = (have - want) // 2
            crops.append((axis, start, start + want))
        elif want > have:
            before[axis] = (want - have) // 2
            after[axis] = want - have - before[axis]
    return crops, before, after


def _center_crop_pad(ctx: OnnxContext) -> list[Value]:
    xs = ctx.shape(0)
    sizes = ctx.ints(1, "shape")
    axes = ctx.attr("axes")
    axes = list(range(len(xs))) if axes is None else [ctx.axis(int(a), len(xs)) for a in axes]
    if len(set(axes)) != len(axes) or len(sizes) != len(axes) or any(s < 0 for s in sizes):
        raise ctx.fail(f"shape {sizes} for axes {axes} (one non-negative extent per distinct axis)")
    crops, before, after = center_crop_pad_geometry(xs, dict(zip(axes, sizes)))
    y = ctx.operand(0)
    if crops:
        y = ctx.add("slice", [y], {"axes": tuple(a for a, _, _ in crops), "starts": tuple(s for _, s, _ in crops),
                                   "ends": tuple(e for _, _, e in crops), "steps": (1,) * len(crops)})
    if any(before) or any(after):
        y = ctx.add("pad", [y], {"pads_before": tuple(before), "pads_after": tuple(after), "value": 0.0})
    return [y]


def _affine_grid(ctx: OnnxContext) -> list[Value]:
    ts = ctx.shape(0)
    size = ctx.ints(1, "size")
    r = len(size) - 2
    if r not in (2, 3) or tuple(ts) != (size[0], r, r + 1) or any(v < 1 for v in size):
        raise ctx.fail(f"theta {list(ts)} and size {size} (theta [N, 2, 3] with size [N, C, H, W], or [N, 3, 4] "
                       f"with [N, C, D, H, W])")
    spatial = tuple(size[2:])
    align_corners = bool(ctx.attr("align_corners", 0))
    if align_corners and 1 in spatial:
        raise ctx.fail(f"align_corners=1 with a spatial extent of 1 in size {size} (the spec's function body "
                       "divides 0 by 0 there, and onnxruntime and the reference disagree)")
    cells = math.prod(spatial)
    if cells * (r + 1) > ctx.max_elements or size[0] * cells * r > ctx.max_elements:
        raise ctx.fail(f"size {size} needs a grid of {size[0] * cells * r} elements, above the element limit")
    dtype = np.float64 if ctx.precision == "float64" else np.float32
    base = affine_base_grid(spatial, align_corners)
    base_t = ctx.b.const(np.ascontiguousarray(base.T).astype(dtype), source=ctx.source, folded=True)
    grid = ctx.add("matmul", [_float_operand(ctx, 0, "theta"), base_t])  # [N, r, cells]
    grid = ctx.add("permute", [grid], {"perm": (0, 2, 1)})
    return [ctx.b.reshape(grid, (size[0],) + spatial + (r,), ctx.source)]


def _deform_conv(ctx: OnnxContext) -> list[Value]:
    xs, ws = ctx.shape(0), ctx.shape(1)
    r = len(xs) - 2
    if r < 1 or len(ws) != len(xs):
        raise ctx.fail(f"input {list(xs)} and weight {list(ws)} (N, C and spatial axes; weight [out, C/group, *k])")
    kernel = list(ctx.attr("kernel_shape") or ws[2:])
    strides = list(ctx.attr("strides") or [1] * r)
    dilations = list(ctx.attr("dilations") or [1] * r)
    ops_nn._check_window(ctx, r, kernel, strides, dilations)
    pads = list(ctx.attr("pads") or [0] * (2 * r))
    groups, offset_groups = int(ctx.attr("group", 1)), int(ctx.attr("offset_group", 1))
    if groups < 1 or offset_groups < 1:
        raise ctx.fail(f"group={groups}, offset_group={offset_groups}")
    out_channels = ws[0]
    offset_shape = ctx.shape(2)
    out = tuple(offset_shape[2:])
    k = math.prod(kernel)
    dtype = np.float64 if ctx.precision == "float64" else np.float32
    bias = _float_operand(ctx, 3, "B") if ctx.has_input(3) else \
        ctx.b.const(np.zeros(out_channels, dtype), source=ctx.source, folded=True)
    if ctx.has_input(4):
        mask = _float_operand(ctx, 4, "mask")
    else:
        ones = (xs[0], offset_groups * k) + out
        if math.prod(ones) > ctx.max_elements:
            raise ctx.fail(f"a mask of shape {list(ones)} is above the element limit")
        mask = ctx.b.const(np.ones(ones, dtype), source=ctx.source, folded=True)
    attrs = {"spatial_rank": r, "kernel": tuple(kernel), "stride": tuple(strides), "padding": tuple(pads[:r]),
             "padding_after": tuple(pads[r:]), "dilation": tuple(dilations), "groups": groups,
             "offset_groups": offset_groups}
    parents = [_float_operand(ctx, 0, "X"), _float_operand(ctx, 1, "W"), _float_operand(ctx, 2, "offset"), bias, mask]
    return [ctx.add("deform_conv", parents, attrs)]


def _roi_align(ctx: OnnxContext) -> list[Value]:
    mode = str(ctx.attr("mode", "avg"))
    if mode not in ("avg", "max"):
        raise ctx.fail(f"mode={mode}")
    transform = str(ctx.attr("coordinate_transformation_mode", "half_pixel" if ctx.opset >= 16 else
                             "output_half_pixel"))
    if transform not in ("half_pixel", "output_half_pixel"):
        raise ctx.fail(f"coordinate_transformation_mode={transform}")
    if ctx.dtype(2) != INT64:
        raise ctx.fail(f"batch_indices has element type {ctx.dtype(2)} (expected int64)")
    oh, ow, ratio = int(ctx.attr("output_height", 1)), int(ctx.attr("output_width", 1)), int(ctx.attr("sampling_ratio", 0))
    if oh < 1 or ow < 1 or ratio < 0:
        raise ctx.fail(f"output_height={oh}, output_width={ow}, sampling_ratio={ratio}")
    attrs = {"output_height": oh, "output_width": ow, "sampling_ratio": ratio,
             "spatial_scale": float(ctx.attr("spatial_scale", 1.0)), "mode": mode,
             "half_pixel": transform == "half_pixel"}
    return [ctx.add("roi_align", [_float_operand(ctx, 0, "X"), _float_operand(ctx, 1, "rois"), ctx.operand(2)], attrs)]


HANDLERS: dict[str, Handler] = {
    "GridSample": _grid_sample, "LpPool": _lp_pool, "Col2Im": _col2im, "CenterCropPad": _center_crop_pad,
    "AffineGrid": _affine_grid, "DeformConv": _deform_conv, "RoiAlign": _roi_align,
}
# GridSample-16 (4-D, bilinear/bicubic names) and -20/-22; LpPool-1 (p a float) to -22; RoiAlign-10 (no
# coordinate_transformation_mode: output_half_pixel), -16, -22
OPSETS: dict[str, tuple[int, int]] = {
    "GridSample": (16, 22), "LpPool": (1, 22), "Col2Im": (18, 18), "CenterCropPad": (18, 18), "AffineGrid": (20, 20),
    "DeformConv": (19, 22), "RoiAlign": (10, 22),
}
EMITS = frozenset({"grid_sample", "lp_pool_nd", "col2im", "deform_conv", "roi_align", "slice", "pad", "matmul",
                   "permute", "reshape", "const"})
