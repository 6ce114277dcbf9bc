"""Spatial sampling kernels: grid_sample, lp_pool_nd, col2im, deform_conv, roi_align (float semantics).

Sampling is separable: each spatial axis gives, per sample point, a few taps (a pixel index, a weight and
whether the index lies inside the input, for zero padding); the sample is the weighted sum over the
product of the axes' taps, contracted one axis at a time from the first (outermost) to the last, as the
ONNX reference nests its 1-D interpolations. Every step is a whole-array numpy operation; the loops run
over taps (at most 4 per axis) and kernel offsets, never over elements.

grid_sample follows onnx/reference/ops/op_grid_sample.py (ONNX GridSample-20) or, with ``convention``
torch, ATen's GridSampler: the two differ where ONNX applies the border/reflection fix to a coordinate
only when it lies outside the border, rounds a nearest coordinate before the fix and fixes bicubic
coordinates too, while PyTorch always fixes (and clips a reflected coordinate), rounds after the fix,
and pads only the bicubic taps.
"""

from __future__ import annotations

import itertools
import math
from typing import Any, Mapping, NamedTuple, Sequence

import numpy as np

from .conv import pool_nd

__all__ = ["AxisTap", "CUBIC_A", "cubic_coefficients", "reflect", "grid_coordinates", "fix_coordinate",
           "axis_taps", "sample", "grid_sample", "lp_pool", "col2im", "deform_conv", "roi_align", "roi_grid",
           "grid_borders", "TAP_MARGIN", "REFLECT_LIMIT"]

CUBIC_A = -0.75  # Keys' cubic convolution parameter (PyTorch and ONNX)
# a tap index further than this outside the input reads padding (zeros) or the edge (border): indices are
# clipped to it before the int64 conversion (so a huge coordinate cannot overflow it); reflected taps are
# clipped only at REFLECT_LIMIT, where float64 still holds every integer exactly
TAP_MARGIN = 8
REFLECT_LIMIT = 2 ** 50


class AxisTap(NamedTuple):
    """One tap of one axis for every sample point: pixel index, weight (None = 1) and, under zero padding,
    whether the index lies inside the input (None = always)."""

    index: np.ndarray
    weight: np.ndarray | None
    inside: np.ndarray | None


def cubic_coefficients(t: np.ndarray) -> list[np.ndarray]:
    """The four Keys weights of taps floor(u) - 1 .. floor(u) + 2 at fraction ``t`` (the reference's formulas)."""
    a = CUBIC_A
    t1, s, s1 = t + 1, 1 - t, 2 - t
    return [((a * t1 - 5 * a) * t1 + 8 * a) * t1 - 4 * a,
            ((a + 2) * t - (a + 3)) * t * t + 1,
            ((a + 2) * s - (a + 3)) * s * s + 1,
            ((a * s1 - 5 * a) * s1 + 8 * a) * s1 - 4 * a]


def reflect(v: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Reflect by the near border until inside [lo, hi] (the reference's ``_gs_reflect``); lo = hi gives lo."""
    span = hi - lo
    if span == 0:
        return np.full_like(v, lo)
    below, above = v < lo, v > hi
    dx = np.where(below, lo - v, v - hi)
    n = np.trunc(dx / span)
    r = dx - n * span
    even = np.fmod(n, 2) == 0
    from_below = np.where(even, lo + r, hi - r)
    from_above = np.where(even, hi - r, lo + r)
    return np.where(below, from_below, np.where(above, from_above, v)).astype(v.dtype, copy=False)


def grid_borders(size: int, align_corners: bool) -> tuple[float, float]:
    """The coordinates of the input's outer edges (align_corners: its corner pixel centers)."""
    return (0.0, size - 1.0) if align_corners else (-0.5, size - 0.5)


def grid_coordinates(grid: np.ndarray, sizes: Sequence[int], align_corners: bool) -> list[np.ndarray]:
    """Per input axis i, the pixel coordinate of every sample point: grid component r - 1 - i denormalized."""
    r = len(sizes)
    out = []
    for i, size in enumerate(sizes):
        n = grid[..., r - 1 - i]
        out.append((n + 1) / 2 * (size - 1) if align_corners else ((n + 1) * size - 1) / 2)
    return out


def fix_coordinate(u: np.ndarray, size: int, mode: str, padding_mode: str, align_corners: bool,
                   convention: str) -> np.ndarray:
    """The coordinate the taps are taken at: rounded (nearest) and moved inside by the padding mode."""
    lo, hi = grid_borders(size, align_corners)
    if convention == "onnx":
        if mode == "nearest":
            u = np.rint(u)
        outside = (u < lo) | (u > hi)
        if padding_mode == "border":
            u = np.where(outside, np.clip(u, 0, size - 1), u)
        elif padding_mode == "reflection":
            u = np.where(outside, reflect(u, lo, hi), u)
        return u
    if mode != "cubic":
        if padding_mode == "border":
            u = np.clip(u, 0, size - 1)
        elif padding_mode == "reflection":
            u = np.clip(reflect(u, lo, hi), 0, size - 1)
    return np.rint(u) if mode == "nearest" else u


def _pad_index(i: np.ndarray, size: int, padding_mode: str, align_corners: bool) -> AxisTap:
    if padding_mode == "zeros":
        inside = (i >= 0) & (i < size)
        return AxisTap(np.clip(i, 0, size - 1), None, inside)
    if padding_mode == "border":
        return AxisTap(np.clip(i, 0, size - 1), None, None)
    lo, hi = grid_borders(size, align_corners)
    return AxisTap(np.clip(reflect(i.astype(np.float64), lo, hi).astype(np.int64), 0, size - 1), None, None)


def axis_taps(u: np.ndarray, size: int, mode: str, padding_mode: str, align_corners: bool) -> list[AxisTap]:
    """The taps of one axis at fixed coordinates ``u`` (nearest: ``u`` is already an integer)."""
    if mode == "nearest":
        base, offsets, weights = u, (0,), (None,)
    else:
        base = np.floor(u)
        t = u - base
        offsets, weights = ((0, 1), (1 - t, t)) if mode == "linear" else ((-1, 0, 1, 2), cubic_coefficients(t))
    margin = REFLECT_LIMIT if padding_mode == "reflection" else TAP_MARGIN  # (reflected taps keep their place)
    start = np.clip(base, -margin, size + margin).astype(np.int64)
    taps = []
    for off, w in zip(offsets, weights):
        tap = _pad_index(start + off, size, padding_mode, align_corners)
        taps.append(tap._replace(weight=w))
    return taps


def sample(x: np.ndarray, taps: Sequence[Sequence[AxisTap]]) -> np.ndarray:
    """``x`` [N, C, d1..dr] sampled at P points per batch entry: ``taps[i]`` are axis i's taps with arrays
    [N, P]; the result is [N, C, P], contracted one axis at a time (first axis outermost)."""
    n, c = x.shape[:2]
    sizes = x.shape[2:]
    flat = x.reshape(n, c, -1)
    strides = [math.prod(sizes[i + 1:]) for i in range(len(sizes))]
    rows, chans = np.arange(n)[:, None, None], np.arange(c)[None, :, None]

    def level(axis: int, offset: np.ndarray | int, inside: np.ndarray | None) -> np.ndarray:
        acc = None
        for tap in taps[axis]:
            idx = offset + tap.index * strides[axis]
            ok = tap.inside if inside is None else inside if tap.inside is None else inside & tap.inside
            if axis + 1 < len(taps):
                v = level(axis + 1, idx, ok)
            else:
                v = flat[rows, chans, idx[:, None, :]]
                if ok is not None:
                    v = np.where(ok[:, None, :], v, 0).astype(x.dtype, copy=False)
            if tap.weight is not None:
                v = tap.weight[:, None, :].astype(x.dtype, copy=False) * v
            acc = v if acc is None else acc + v
        return acc

    return level(0, 0, None)


def grid_sample(x: np.ndarray, grid: np.ndarray, mode: str, padding_mode: str, align_corners: bool,
                convention: str) -> np.ndarray:
    """GridSample (see the module docstring); ``grid`` must be finite (the rule refuses NaN and inf)."""
    n, c = x.shape[:2]
    sizes = x.shape[2:]
    points = grid.shape[1:-1]
    g = grid.reshape(n, -1, len(sizes)).astype(x.dtype, copy=False)
    taps = []
    for u, size in zip(grid_coordinates(g, sizes, align_corners), sizes):
        u = fix_coordinate(u, size, mode, padding_mode, align_corners, convention)
        pad = padding_mode if not (convention == "torch" and mode != "cubic" and padding_mode != "zeros") \
            else "border"  # (torch: the fixed coordinate is inside, its taps clip)
        taps.append(axis_taps(u, size, mode, pad, align_corners))
    return sample(x, taps).reshape((n, c) + tuple(points))


def lp_pool(x: np.ndarray, attrs: Mapping[str, Any], out_spatial: Sequence[int]) -> np.ndarray:
    """(sum of |x|^p over the window's cells inside the input)^(1/p)."""
    p = float(attrs["p"])
    powered = np.power(np.abs(x), p) if p != 1 else np.abs(x)
    sums = pool_nd(powered, mode="avg", kernel=attrs["kernel"], stride=attrs["stride"], padding=attrs["padding"],
                   padding_after=attrs["padding_after"], dilation=attrs["dilation"], out_spatial=out_spatial,
                   divisor=1.0)
    return np.power(sums, 1.0 / p) if p != 1 else sums


def col2im(x: np.ndarray, attrs: Mapping[str, Any], blocks: Sequence[int]) -> np.ndarray:
    """Scatter-add of every block offset's column into the padded image (offsets in row-major order), cropped."""
    block, stride, dilation = attrs["block"], attrs["stride"], attrs["dilation"]
    before, after, image = attrs["padding"], attrs["padding_after"], attrs["image"]
    n, ck = x.shape[:2]
    c = ck // math.prod(block)
    cols = x.reshape((n, c) + tuple(block) + tuple(blocks))
    padded = np.zeros((n, c) + tuple(i + b + a for i, b, a in zip(image, before, after)), x.dtype)
    for offs in itertools.product(*(range(k) for k in block)):
        target = (slice(None), slice(None)) + tuple(slice(f * d, f * d + (nb - 1) * s + 1, s)
                                                    for f, d, nb, s in zip(offs, dilation, blocks, stride))
        padded[target] += cols[(slice(None), slice(None)) + offs]
    return padded[(slice(None), slice(None)) + tuple(slice(b, b + i) for b, i in zip(before, image))]


def _linear_zero_taps(u: np.ndarray, size: int) -> list[AxisTap]:
    return axis_taps(u, size, "linear", "zeros", True)


def deform_conv(x: np.ndarray, weight: np.ndarray, offset: np.ndarray, bias: np.ndarray, mask: np.ndarray,
                attrs: Mapping[str, Any], out_spatial: Sequence[int]) -> np.ndarray:
    """Each kernel tap k of output cell o reads x bilinearly (zeros outside) at
    ``o * stride - padding + k * dilation + offset``, times its mask; then a grouped convolution."""
    n, c = x.shape[:2]
    sizes = x.shape[2:]
    r = len(sizes)
    kernel = tuple(attrs["kernel"])
    og, g = attrs["offset_groups"], attrs["groups"]
    kk, pp = math.prod(kernel), math.prod(out_spatial)
    offset = offset.reshape((n, og) + kernel + (r,) + tuple(out_spatial))
    mask = mask.reshape(n, og, kk * pp)
    cols = np.empty((n, c, kk * pp), x.dtype)
    cg = c // og
    for j in range(og):
        taps = []
        for i in range(r):
            kpos = (np.arange(kernel[i]) * attrs["dilation"][i]).reshape(
                tuple(kernel[i] if a == i else 1 for a in range(r)) + (1,) * r)
            opos = (np.arange(out_spatial[i]) * attrs["stride"][i] - attrs["padding"][i]).reshape(
                (1,) * r + tuple(out_spatial[i] if a == i else 1 for a in range(r)))
            u = (kpos + opos).astype(x.dtype) + offset[(slice(None), j) + (slice(None),) * r + (i,)]
            taps.append(_linear_zero_taps(u.reshape(n, kk * pp), sizes[i]))
        cols[:, j * cg:(j + 1) * cg] = sample(x[:, j * cg:(j + 1) * cg], taps) * mask[:, j][:, None, :]
    out_c = weight.shape[0]
    w = weight.reshape(g, out_c // g, (c // g) * kk)
    y = np.matmul(w[None], cols.reshape(n, g, (c // g) * kk, pp))
    y = y.reshape(n, out_c, pp) + bias.reshape(1, out_c, 1).astype(x.dtype, copy=False)
    return y.reshape((n, out_c) + tuple(out_spatial))


class RoiSamples(NamedTuple):
    """Per roi and output row (or column): the sample coordinates and how many samples the roi uses."""

    coord: np.ndarray  # [R, out, G]
    used: np.ndarray  # [R] samples per bin along this axis


def roi_samples(start: np.ndarray, extent: np.ndarray, out: int, ratio: int, grid: int) -> RoiSamples:
    """Sample coordinates start + o * bin + (i + 0.5) * bin / used for i < grid (unused ones are masked)."""
    bin_size = extent / out
    used = np.full(start.shape, ratio, np.int64) if ratio > 0 else np.ceil(extent / out).astype(np.int64)
    o = np.arange(out, dtype=start.dtype)[None, :, None]
    i = np.arange(grid, dtype=start.dtype)[None, None, :]
    denom = np.maximum(used, 1).astype(start.dtype)[:, None, None]
    coord = start[:, None, None] + o * bin_size[:, None, None] + (i + start.dtype.type(0.5)) * bin_size[:, None, None] \
        / denom
    return RoiSamples(coord, used)


def _roi_axis(coord: np.ndarray, size: int) -> tuple[np.ndarray, ...]:
    """The reference's per-axis bilinear precalculation: low/high index, weights, and the in-map test."""
    inside = ~((coord < -1.0) | (coord > size))
    v = np.maximum(coord, 0)
    low = np.clip(np.trunc(v), 0, size + 1).astype(np.int64)
    edge = low >= size - 1
    low = np.where(edge, size - 1, low)
    high = np.where(edge, size - 1, low + 1)
    v = np.where(edge, low.astype(coord.dtype), v)
    lw = v - low
    hw = 1 - lw
    zero = np.zeros_like(lw)
    return (np.where(inside, low, 0), np.where(inside, high, 0), np.where(inside, hw, zero),
            np.where(inside, lw, zero))


def roi_extents(rois: np.ndarray, attrs: Mapping[str, Any], dt: np.dtype) -> tuple[np.ndarray, ...]:
    """Per roi: its start (x, y) in input pixels and its height and width (at least 1 without half_pixel)."""
    scale, shift = dt.type(attrs["spatial_scale"]), dt.type(0.5 if attrs["half_pixel"] else 0.0)
    rois = rois.astype(dt, copy=False)
    x1, y1, x2, y2 = (rois[:, k] * scale - shift for k in range(4))
    rh, rw = y2 - y1, x2 - x1
    if not attrs["half_pixel"]:
        rh, rw = np.maximum(rh, dt.type(1)), np.maximum(rw, dt.type(1))
    return x1, y1, rh, rw


def roi_grid(rois: np.ndarray, attrs: Mapping[str, Any], dt: np.dtype) -> tuple[int, int]:
    """The largest number of samples per bin along y and x over all rois (rois must be finite)."""
    ratio = attrs["sampling_ratio"]
    if ratio > 0 or len(rois) == 0:
        return ratio, ratio
    _, _, rh, rw = roi_extents(rois, attrs, dt)
    return (max(0, int(np.ceil(rh / attrs["output_height"]).max())),
            max(0, int(np.ceil(rw / attrs["output_width"]).max())))


def roi_align(x: np.ndarray, rois: np.ndarray, batch: np.ndarray, attrs: Mapping[str, Any],
              grid_h: int, grid_w: int) -> np.ndarray:
    """RoiAlign (onnx/reference/ops/op_roi_align.py) over every roi at once; ``grid_h``/``grid_w`` are the
    largest sample counts per bin (the caller sized the buffers they imply)."""
    dt = x.dtype
    _, c, h, w = x.shape
    oh, ow = attrs["output_height"], attrs["output_width"]
    x1, y1, rh, rw = roi_extents(rois, attrs, dt)
    ys = roi_samples(y1, rh, oh, attrs["sampling_ratio"], grid_h)
    xs = roi_samples(x1, rw, ow, attrs["sampling_ratio"], grid_w)
    yl, yh, yhw, ylw = (a[:, :, :, None, None] for a in _roi_axis(ys.coord, h))  # [R, oh, Gh, 1, 1]
    xl, xh, xhw, xlw = (a[:, None, None, :, :] for a in _roi_axis(xs.coord, w))  # [R, 1, 1, ow, Gw]
    inside_y = ~((ys.coord < -1.0) | (ys.coord > h))
    inside_x = ~((xs.coord < -1.0) | (xs.coord > w))
    inside = inside_y[:, :, :, None, None] & inside_x[:, None, None, :, :]
    flat = x.reshape(x.shape[0], c, h * w)
    b = batch[:, None, None, None, None]

    def corner(iy: np.ndarray, ix: np.ndarray, wy: np.ndarray, wx: np.ndarray) -> np.ndarray:
        pos = np.where(inside, iy * w + ix, 0)
        weight = np.where(inside, wy * wx, dt.type(0))  # [R, oh, Gh, ow, Gw]
        v = flat[b[:, None], np.arange(c)[None, :, None, None, None, None], pos[:, None]]
        return weight[:, None] * v  # [R, C, oh, Gh, ow, Gw]

    terms = (corner(yl, xl, yhw, xhw), corner(yl, xh, yhw, xlw), corner(yh, xl, ylw, xhw), corner(yh, xh, ylw, xlw))
    used = (np.arange(grid_h)[None, None, :, None, None] < ys.used[:, None, None, None, None]) & \
        (np.arange(grid_w)[None, None, None, None, :] < xs.used[:, None, None, None, None])
    used = used[:, None]
    if attrs["mode"] == "avg":
        s = ((terms[0] + terms[1]) + terms[2]) + terms[3]
        total = np.where(used, s, dt.type(0)).sum(axis=(3, 5))
        count = np.maximum(ys.used * xs.used, 1).astype(dt)
        return (total / count[:, None, None, None]).astype(dt, copy=False)
    s = np.maximum(np.maximum(np.maximum(terms[0], terms[1]), terms[2]), terms[3])
    best = np.where(used, s, dt.type(-np.inf)).max(axis=(3, 5))
    empty = (ys.used * xs.used) == 0
    return np.where(empty[:, None, None, None], dt.type(0), best).astype(dt, copy=False)
