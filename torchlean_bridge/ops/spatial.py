"""Spatial sampling ext ops (issue #15): grid_sample, lp_pool_nd, col2im, deform_conv, roi_align.

None has an exact torchlean.ir.v1 form, so each blocks v1 export by name. Every shape rule also sizes
the buffers its evaluation builds (``check_buffer``) before anything is allocated.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from ..errors import ShapeRuleError
from .contracts import Shape, check_buffer, check_per_axis, fmt_shape, numel, window_out_dim
from .ext import POOL_ND_ATTRS, _pool_nd
from .registry import FLOAT, INT64, Attr, OpSpec, per_axis_attrs, register

__all__ = ["GRID_SAMPLE_MODES", "GRID_PADDING_MODES", "GRID_CONVENTIONS", "col2im_blocks"]

A = Mapping[str, Any]
P = Sequence[Shape]

GRID_SAMPLE_MODES = ("linear", "nearest", "cubic")
GRID_PADDING_MODES = ("zeros", "border", "reflection")
# where ONNX GridSample and torch.nn.functional.grid_sample compute differently (see semantics.spatial)
GRID_CONVENTIONS = ("onnx", "torch")

# -- grid_sample ----------------------------------------------------------------------------------------


def _grid_sample(attrs: A, p: P, d: Shape) -> Shape:
    x, grid = p[0], p[1]
    r = len(x) - 2
    if r < 1 or len(grid) != r + 2 or grid[-1] != r or grid[0] != x[0]:
        raise ShapeRuleError(f"grid_sample: input {fmt_shape(x)} (N, C, d1..dr) and grid {fmt_shape(grid)} "
                             f"(N, D1..Dr, r) do not match")
    out = (x[0], x[1]) + tuple(grid[1:-1])
    taps = {"nearest": 1, "linear": 2, "cubic": 4}[attrs["mode"]]
    # one gathered [N, C, D1..Dr] operand and per-axis index/weight tables of the grid's size
    check_buffer(numel(out), "a gathered operand", "grid_sample")
    check_buffer(numel(grid) * taps, "a tap table", "grid_sample")
    return out


register(OpSpec(
    "grid_sample", "ext", 2, 2, _grid_sample,
    attrs=(Attr("mode", "str", "linear", choices=GRID_SAMPLE_MODES),
           Attr("padding_mode", "str", "zeros", choices=GRID_PADDING_MODES),
           Attr("align_corners", "bool", False),
           Attr("convention", "str", "onnx", choices=GRID_CONVENTIONS)),
    doc="samples x [N, C, d1..dr] at the normalized positions grid [N, D1..Dr, r] (last entry = last axis's "
        "coordinate first, as x, y, z) by nearest (ties to even), N-linear or N-cubic (Keys, a = -0.75) "
        "interpolation; ONNX GridSample-20, or torch.nn.functional.grid_sample (`convention` torch: the "
        "coordinate fix is always applied, nearest rounds after it, bicubic pads taps only)"))

# -- lp_pool_nd -----------------------------------------------------------------------------------------

LP_POOL_ATTRS = tuple(a for a in POOL_ND_ATTRS if a.name != "count_include_pad") + (Attr("p", "float", 2.0),)


def _lp_pool(attrs: A, p: P, d: Shape) -> Shape:
    if not attrs["p"] > 0 or not math.isfinite(attrs["p"]):
        raise ShapeRuleError(f"lp_pool_nd: p={attrs['p']} must be positive and finite")
    return _pool_nd("lp_pool_nd")(attrs, p, d)


register(OpSpec(
    "lp_pool_nd", "ext", 1, 1, _lp_pool, attrs=LP_POOL_ATTRS,
    doc="(sum over the window's cells inside the input of |x|^p)^(1/p) (ONNX LpPool: padded cells add 0), "
        "window geometry as max_pool_nd"))

# -- col2im ---------------------------------------------------------------------------------------------

COL2IM_ATTRS = per_axis_attrs("image", "block", "stride", "padding", "padding_after", "dilation")


def col2im_blocks(attrs: A) -> tuple[int, ...] | None:
    """The number of sliding blocks per axis (None when a block does not fit the padded image)."""
    out = []
    for n, k, s, b, a, dl in zip(attrs["image"], attrs["block"], attrs["stride"], attrs["padding"],
                                 attrs["padding_after"], attrs["dilation"]):
        o = window_out_dim(n, k, s, b, a, dl)
        if o is None or o <= 0:
            return None
        out.append(o)
    return tuple(out)


def _col2im(attrs: A, p: P, d: Shape) -> Shape:
    s, r = p[0], attrs["spatial_rank"]
    check_per_axis("col2im", r, **{k: attrs[k] for k in ("image", "block", "stride", "padding", "padding_after",
                                                        "dilation")})
    if r < 1 or any(v == 0 for k in ("image", "block", "stride", "dilation") for v in attrs[k]):
        raise ShapeRuleError("col2im: image, block, stride and dilation extents must be nonzero")
    k = math.prod(attrs["block"])
    blocks = col2im_blocks(attrs)
    if len(s) != 3 or s[1] % k or blocks is None or s[2] != math.prod(blocks):
        raise ShapeRuleError(f"col2im: input {fmt_shape(s)} must be [N, C * {k}, L] with L the "
                             f"{'x'.join(map(str, blocks)) if blocks else 'empty'} sliding blocks of "
                             f"{fmt_shape(attrs['block'])} over the padded image {fmt_shape(attrs['image'])}")
    out = (s[0], s[1] // k) + tuple(attrs["image"])
    padded = tuple(n + b + a for n, b, a in zip(attrs["image"], attrs["padding"], attrs["padding_after"]))
    check_buffer(s[0] * (s[1] // k) * math.prod(padded), "a padded image", "col2im")
    return out


register(OpSpec(
    "col2im", "ext", 1, 1, _col2im, attrs=COL2IM_ATTRS,
    doc="the adjoint of im2col (ONNX Col2Im, torch fold): column c * prod(block) + k of x [N, C * prod(block), L] "
        "adds block offset k of each sliding block into image [N, C, *image]; cells in the padding are dropped"))

# -- deform_conv ----------------------------------------------------------------------------------------

DEFORM_ATTRS = per_axis_attrs("kernel", "stride", "padding", "padding_after", "dilation") + (
    Attr("groups", "nat", 1), Attr("offset_groups", "nat", 1))


def _deform_conv(attrs: A, p: P, d: Shape) -> Shape:
    x, w, offset, bias, mask = p
    r, kernel = attrs["spatial_rank"], tuple(attrs["kernel"])
    check_per_axis("deform_conv", r, **{k: attrs[k] for k in ("kernel", "stride", "padding", "padding_after",
                                                             "dilation")})
    g, og = attrs["groups"], attrs["offset_groups"]
    if r < 1 or len(x) != r + 2 or g == 0 or og == 0 or any(v == 0 for k in ("kernel", "stride", "dilation")
                                                           for v in attrs[k]):
        raise ShapeRuleError(f"deform_conv: input {fmt_shape(x)} with spatial rank {r}, groups {g} and offset "
                             f"groups {og} (all nonzero)")
    n, c = x[0], x[1]
    if len(w) != r + 2 or tuple(w[2:]) != kernel or c != w[1] * g or w[0] % g or c % og:
        raise ShapeRuleError(f"deform_conv: weight {fmt_shape(w)} must be [out, C/groups, *kernel] for input "
                             f"{fmt_shape(x)}, groups {g}, offset groups {og}, kernel {fmt_shape(kernel)}")
    out = []
    for i in range(r):
        o = window_out_dim(x[2 + i], kernel[i], attrs["stride"][i], attrs["padding"][i], attrs["padding_after"][i],
                           attrs["dilation"][i])
        if o is None or o <= 0:
            raise ShapeRuleError(f"deform_conv: the kernel does not fit axis {2 + i} of extent {x[2 + i]}")
        out.append(o)
    k = math.prod(kernel)
    if tuple(offset) != (n, og * k * r) + tuple(out):
        raise ShapeRuleError(f"deform_conv: offset {fmt_shape(offset)}, expected {fmt_shape((n, og * k * r, *out))}")
    if tuple(mask) != (n, og * k) + tuple(out):
        raise ShapeRuleError(f"deform_conv: mask {fmt_shape(mask)}, expected {fmt_shape((n, og * k, *out))}")
    if tuple(bias) != (w[0],):
        raise ShapeRuleError(f"deform_conv: bias {fmt_shape(bias)}, expected {fmt_shape((w[0],))}")
    check_buffer(n * c * k * math.prod(out), "a sampled column matrix", "deform_conv")
    return (n, w[0]) + tuple(out)


register(OpSpec(
    "deform_conv", "ext", 5, 5, _deform_conv, attrs=DEFORM_ATTRS,
    doc="deformable convolution (ONNX DeformConv, torchvision deform_conv2d): parents (x, weight [out, C/groups, "
        "*kernel], offset [N, offset_groups * prod(kernel) * r, *out], bias [out], mask [N, offset_groups * "
        "prod(kernel), *out]); each kernel tap reads x bilinearly (zeros outside) at its position plus its "
        "offset, times its mask"))

# -- roi_align --------------------------------------------------------------------------------------------


def _roi_align(attrs: A, p: P, d: Shape) -> Shape:
    x, rois, idx = p
    if len(x) != 4 or len(rois) != 2 or rois[1] != 4 or tuple(idx) != (rois[0],):
        raise ShapeRuleError(f"roi_align: input {fmt_shape(x)} (N, C, H, W), rois {fmt_shape(rois)} (R, 4) and "
                             f"batch indices {fmt_shape(idx)} (R) do not match")
    if attrs["output_height"] == 0 or attrs["output_width"] == 0:
        raise ShapeRuleError("roi_align: output_height and output_width must be nonzero")
    if not math.isfinite(attrs["spatial_scale"]):
        raise ShapeRuleError(f"roi_align: spatial_scale {attrs['spatial_scale']} is not finite")
    return (rois[0], x[1], attrs["output_height"], attrs["output_width"])


def _roi_align_dtype(attrs: A, parents: Sequence[str], declared: str) -> str:
    if parents[0] != FLOAT or parents[1] != FLOAT or parents[2] != INT64:
        raise ShapeRuleError(f"roi_align: operands of element types {', '.join(parents)}, expected float, float, "
                             "int64")
    return FLOAT


register(OpSpec(
    "roi_align", "ext", 3, 3, _roi_align, dtype=_roi_align_dtype,
    attrs=(Attr("output_height", "nat", 1), Attr("output_width", "nat", 1), Attr("sampling_ratio", "nat", 0),
           Attr("spatial_scale", "float", 1.0), Attr("mode", "str", "avg", choices=("avg", "max")),
           Attr("half_pixel", "bool", True)),
    doc="ONNX RoiAlign: parents (x [N, C, H, W], rois [R, 4] as x1, y1, x2, y2, batch indices [R] int64); each "
        "output bin averages (or, mode max, takes the largest of the weighted taps of) a regular grid of bilinear "
        "samples; sampling_ratio 0 means ceil(roi extent / output extent) samples per bin"))
