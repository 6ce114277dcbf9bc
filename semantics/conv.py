"""Convolution and pooling through strided views: im2col + one BLAS matmul, window offsets.

Convolution follows TorchLean's ``conv`` (spec section 2.2): axes before ``channel_axis`` are
independent batch axes, grouped weights ``[out, in/groups, *kernel]``, per-axis stride, dilation
and asymmetric zero padding. The im2col matrix is one strided view of the padded input
(``[C, *kernel, *out]``), copied a block of output rows at a time into a cache-sized buffer and
contracted with a matrix product batched over groups, so the work is BLAS, not Python.

Pooling acts on the trailing ``spatial_rank`` axes. Windows are visited by kernel offset (a loop
over the ``prod(kernel)`` offsets, each a whole-array strided slice of the cells inside the input),
which also gives the spec's row-major accumulation order for average pooling (a padded cell adds
an exact 0, so skipping it changes nothing); large windows use a single view reduction. TorchLean's
order-dependent max (``max_first``) folds with ``np.maximum`` and repairs only the windows whose
result could differ (NaN or zero), by its sequential rule.
"""

from __future__ import annotations

import itertools
import math
from typing import Any, Mapping, Sequence

import numpy as np
from numpy.lib.stride_tricks import as_strided, sliding_window_view

from torchlean_bridge.ops.contracts import conv_transpose_full_dim

from .conv_depthwise import depthwise_conv, depthwise_extra_columns, depthwise_serves
from .scratch import scratch

__all__ = ["conv_nd", "conv_transpose_nd", "pool_nd", "pool_out_spatial", "avg_pool_divisor", "EMPTY_WINDOW"]

EMPTY_WINDOW = "a pooling window lies entirely in the padding"

# above this many kernel offsets, reduce over a window view instead of looping over offsets
_OFFSET_LOOP_LIMIT = 64

# the im2col matrix is rebuilt for every convolution and dies inside it: it is copied one block of
# output rows at a time, small enough to stay in cache while BLAS reads it back, into one reused
# per-thread buffer (``scratch``: no fresh-page faults on megabytes per convolution)
_IM2COL_BLOCK_BYTES = 2 << 20
_TRANSPOSE_CHUNK_BYTES = 64 << 20


def _pad_spatial(x: np.ndarray, before: Sequence[int], after: Sequence[int], value: float) -> np.ndarray:
    if not any(before) and not any(after):
        return x
    lead = x.ndim - len(before)
    shape = x.shape[:lead] + tuple(n + b + a for n, b, a in zip(x.shape[lead:], before, after))
    out = np.full(shape, value, dtype=x.dtype)
    out[(Ellipsis,) + tuple(slice(b, b + n) for b, n in zip(before, x.shape[lead:]))] = x
    return out


def conv_nd(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, *, channel_axis: int, stride: Sequence[int],
            padding: Sequence[int], padding_after: Sequence[int], dilation: Sequence[int], groups: int,
            out_spatial: Sequence[int], band: np.ndarray | None = None) -> np.ndarray:
    """``x`` is ``lead ++ [C] ++ spatial``; the result is ``lead ++ [out] ++ out_spatial``. ``band``:
    the weight's ``depthwise_band`` when the depthwise path serves this conv, prepared once."""
    lead = x.shape[:channel_axis]
    c_in, spatial = x.shape[channel_axis], x.shape[channel_axis + 1:]
    n = math.prod(lead)
    out_c, kernel = weight.shape[0], weight.shape[2:]
    g, cg, og = groups, c_in // groups, out_c // groups
    k, length = math.prod(kernel), math.prod(out_spatial)
    xs = x.reshape((n, c_in) + spatial)
    w = weight.reshape(g, og, cg * k)
    if depthwise_serves(xs, weight, groups, stride, dilation, out_spatial):
        width = spatial[-1] + padding[-1] + padding_after[-1]
        extra = depthwise_extra_columns(width, kernel, stride, dilation, out_spatial[-1])
        xp = _pad_spatial(xs, padding, tuple(padding_after[:-1]) + (padding_after[-1] + extra,), 0.0)
        y = depthwise_conv(xp, weight, stride=stride, dilation=dilation, out_spatial=out_spatial, band=band)
    elif k == 1 and tuple(map(sum, zip(spatial, padding, padding_after))) == tuple(out_spatial):
        xp = _pad_spatial(xs, padding, padding_after, 0.0)  # pointwise: the input is its own column matrix
        y = np.matmul(w, xp.reshape(n, g, cg, length))
    else:  # im2col, one cache-sized block of output rows at a time
        xp = _pad_spatial(xs, padding, padding_after, 0.0)
        y = np.empty((n, g, og, length), dtype=x.dtype)
        rows = out_spatial[0] if out_spatial else 1
        row_length = length // rows if rows else 0
        block = max(1, _IM2COL_BLOCK_BYTES // max(1, c_in * k * row_length * x.dtype.itemsize))
        for s in range(n):
            windows = _window_view(xp[s], kernel, stride, dilation, out_spatial)
            for r0 in range(0, rows, block):
                r1 = min(rows, r0 + block)
                part = windows[(Ellipsis, slice(r0, r1)) + (slice(None),) * (len(out_spatial) - 1)]
                cols = scratch("conv.cols", part.shape, x.dtype)
                np.copyto(cols, part)
                np.matmul(w, cols.reshape(g, cg * k, (r1 - r0) * row_length),
                          out=y[s, :, :, r0 * row_length:r1 * row_length])
    y = y.reshape((n, out_c, length))
    y += bias.reshape(out_c, 1)
    return y.reshape(lead + (out_c,) + tuple(out_spatial))


def _window_view(xp: np.ndarray, kernel: Sequence[int], stride: Sequence[int], dilation: Sequence[int],
                 out: Sequence[int]) -> np.ndarray:
    """The read-only ``[C, *kernel, *out]`` view of one padded sample ``[C, *spatial]``: entry
    ``[c, f, o]`` is cell ``o*stride + f*dilation`` (the im2col matrix, not yet copied)."""
    steps = xp.strides[1:]
    return as_strided(xp, shape=xp.shape[:1] + tuple(kernel) + tuple(out),
                      strides=xp.strides[:1] + tuple(st * d for st, d in zip(steps, dilation))
                      + tuple(st * s for st, s in zip(steps, stride)), writeable=False)


def conv_transpose_nd(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, *, channel_axis: int,
                      stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int], groups: int,
                      out_spatial: Sequence[int]) -> np.ndarray:
    """The adjoint of ``conv_nd``: ``x`` is ``lead ++ [C_in] ++ spatial``, ``weight`` is
    ``[C_in, out/groups, *kernel]``; the result is ``lead ++ [out] ++ out_spatial``.

    One BLAS product per sample gives every (input cell, kernel offset) contribution
    (``W^T x``, batched over groups); each kernel offset's contributions are then added into the
    uncropped output in one strided slice (cell ``i*stride + f*dilation``), a loop over the
    ``prod(kernel)`` offsets, never over cells. Output cell ``o`` is uncropped cell ``o + padding``
    (the leading crop); ``out_spatial`` fixes the extent, so cells past the uncropped end (from
    ``output_padding``) receive only the bias.
    """
    lead = x.shape[:channel_axis]
    c_in, spatial = x.shape[channel_axis], tuple(x.shape[channel_axis + 1:])
    n = math.prod(lead)
    og, kernel = weight.shape[1], tuple(weight.shape[2:])
    g, cg = groups, c_in // groups
    out_c, k, length = og * g, math.prod(kernel), math.prod(spatial)
    full = tuple(conv_transpose_full_dim(size, kk, s, d) for size, kk, s, d in zip(spatial, kernel, stride, dilation))
    # [g, og * k, cg]: each group's weight block transposed
    wt = np.ascontiguousarray(weight.reshape(g, cg, og * k).transpose(0, 2, 1))
    xs = x.reshape(n, g, cg, length)
    y = np.zeros((n, out_c) + tuple(out_spatial), dtype=x.dtype)
    keep = tuple(slice(p, min(f, p + o)) for p, f, o in zip(padding, full, out_spatial))
    into = (slice(None), slice(None)) + tuple(slice(0, kp.stop - kp.start) for kp in keep)
    # a few samples at a time, so the contributions stay near _TRANSPOSE_CHUNK_BYTES
    chunk = max(1, _TRANSPOSE_CHUNK_BYTES // max(1, out_c * k * length * x.dtype.itemsize))
    for lo in range(0, n, chunk):
        part = xs[lo:lo + chunk]
        cols = np.matmul(wt, part).reshape((len(part), out_c) + kernel + spatial)
        uncropped = np.zeros((len(part), out_c) + full, dtype=x.dtype)
        for offs in itertools.product(*(range(kk) for kk in kernel)):
            target = (slice(None), slice(None)) + tuple(slice(f * d, f * d + (size - 1) * st + 1, st)
                                                        for f, d, size, st in zip(offs, dilation, spatial, stride))
            uncropped[target] += cols[(slice(None), slice(None)) + offs]
        y[lo:lo + chunk][into] = uncropped[(slice(None), slice(None)) + keep]
    y = y.reshape((n, out_c, math.prod(out_spatial)))
    y += bias.reshape(out_c, 1)
    return y.reshape(lead + (out_c,) + tuple(out_spatial))


def pool_out_spatial(out_shape: Sequence[int], spatial_rank: int) -> tuple[int, ...]:
    """A pooling node's output spatial extents: the trailing ``spatial_rank`` axes of its shape."""
    return tuple(out_shape[len(out_shape) - spatial_rank:])


def _window_counts(size: int, kernel: int, stride: int, pad_before: int, dilation: int, out: int,
                   lo: int, hi: int) -> np.ndarray:
    """Per output position along one axis: how many window cells fall in ``[lo, hi)`` (input coords)."""
    starts = np.arange(out) * stride - pad_before
    cells = starts[:, None] + np.arange(kernel)[None, :] * dilation
    return ((cells >= lo) & (cells < hi)).sum(axis=1)


def avg_pool_divisor(attrs: Mapping[str, Any], in_spatial: Sequence[int], out_spatial: Sequence[int]) -> np.ndarray:
    """``avg_pool_nd``'s divisor per output window (shape ``out_spatial``), as PyTorch/ONNX: the cells
    inside the padded input (``count_include_pad``) or inside the input. 0 marks a window lying
    entirely in the padding, which callers refuse (``EMPTY_WINDOW``)."""
    a = attrs
    divisor = np.ones((), np.int64)
    for i, size in enumerate(in_spatial):
        lo, hi = (-a["padding"][i], size + a["padding_after"][i]) if a["count_include_pad"] else (0, size)
        counts = _window_counts(size, a["kernel"][i], a["stride"][i], a["padding"][i], a["dilation"][i],
                                out_spatial[i], lo, hi)
        divisor = np.multiply.outer(divisor, counts)
    return divisor


def _inside(shift: int, size: int, stride: int, out: int) -> tuple[int, int, int]:
    """Output positions ``[lo, hi)`` whose cell ``o*stride + shift`` lies in ``[0, size)``; lo's cell."""
    lo = max(0, -(shift // stride))
    hi = max(lo, min(out, (size - 1 - shift) // stride + 1))
    return lo, hi, lo * stride + shift


def pool_nd(x: np.ndarray, *, mode: str, kernel: Sequence[int], stride: Sequence[int], padding: Sequence[int],
            padding_after: Sequence[int], dilation: Sequence[int], out_spatial: Sequence[int],
            divisor: np.ndarray | float | None = None, sequential: bool = False) -> np.ndarray:
    """Max (cells outside the input ignored) or sum-then-divide pooling over the trailing axes.

    ``divisor`` (average mode) is a scalar or an array broadcasting over ``out_spatial``. Cells in
    the padding, or past it (ceil mode), add nothing to a sum and are skipped by the maximum, so a
    window made only of padding gives -inf. Mode ``max_first`` is TorchLean's ``maxPoolValue``: the
    first in-range cell (row-major window order) seeds the maximum and a later cell replaces it only
    when ``cell > best`` (a NaN after the first cell is ignored, the first of equal maxima wins).
    ``sequential`` sums every window cell by cell in row-major order from +0.0 whatever its size.
    """
    r = len(kernel)
    spatial = x.shape[x.ndim - r:]
    out_shape = x.shape[:x.ndim - r] + tuple(out_spatial)
    if any(o == 0 for o in out_spatial):
        return np.zeros(out_shape, x.dtype)
    lead = (Ellipsis,)
    if mode == "max_first" and all(d == 1 for d in dilation) and x.dtype.kind == "f":
        return _max_first(x, kernel, stride, padding, out_spatial)
    if mode == "max" and math.prod(kernel) <= _OFFSET_LOOP_LIMIT:
        return _separable_max(x, kernel, stride, padding, dilation, out_spatial)
    if math.prod(kernel) <= _OFFSET_LOOP_LIMIT or sequential or mode == "max_first":
        # fold in, kernel offset by kernel offset (row-major), the cells inside the input; no padding is built
        acc = np.full(out_shape, -np.inf if mode == "max" else 0.0, x.dtype)
        seen = np.zeros(out_shape, bool) if mode == "max_first" else None
        fold = np.maximum if mode == "max" else np.add
        for offs in itertools.product(*(range(kk) for kk in kernel)):
            spans = [_inside(f * d - pb, n, s, o)
                     for f, d, pb, n, s, o in zip(offs, dilation, padding, spatial, stride, out_spatial)]
            if all(hi > lo for lo, hi, _ in spans):
                region = lead + tuple(slice(lo, hi) for lo, hi, _ in spans)
                target = acc[region]
                cells = x[lead + tuple(slice(q, q + (hi - lo - 1) * s + 1, s) for (lo, hi, q), s in zip(spans, stride))]
                if seen is not None:
                    np.copyto(target, cells, where=~seen[region] | (cells > target))
                    seen[region] = True
                else:
                    fold(target, cells, out=target)
    else:  # many offsets (global pooling): one reduction over a window view of the padded input
        extra = [max(0, (o - 1) * s + d * (kk - 1) + 1 - (n + pb + pa)) for o, s, d, kk, n, pb, pa
                 in zip(out_spatial, stride, dilation, kernel, spatial, padding, padding_after)]
        xp = _pad_spatial(x, padding, [pa + e for pa, e in zip(padding_after, extra)],
                          -np.inf if mode == "max" else 0.0)
        eff = tuple(d * (kk - 1) + 1 for d, kk in zip(dilation, kernel))
        win = sliding_window_view(xp, eff, axis=tuple(range(xp.ndim - r, xp.ndim)))
        win = win[lead + tuple(slice(0, (o - 1) * s + 1, s) for o, s in zip(out_spatial, stride))
                  + tuple(slice(None, None, d) for d in dilation)]
        red_axes = tuple(range(win.ndim - r, win.ndim))
        acc = win.max(axis=red_axes) if mode == "max" else win.sum(axis=red_axes)
    if mode in ("max", "max_first"):
        return acc
    acc /= np.asarray(divisor, acc.dtype)
    return acc


def _separable_max(x: np.ndarray, kernel: Sequence[int], stride: Sequence[int], padding: Sequence[int],
                   dilation: Sequence[int], out_spatial: Sequence[int]) -> np.ndarray:
    """The windows' ``np.maximum`` over the cells inside the input, one spatial axis at a time (first
    axis first, so the widest pass reads whole rows): a box's maximum is the maximum of its columns'
    maxima. ``sum(kernel)`` strided passes over shrinking arrays instead of ``prod(kernel)`` passes
    over the output: on SqueezeNet's first 3x3 pool 0.71 ms instead of 1.28 ms. A NaN cell makes its window NaN and a window with no cell
    in the input is -inf, as in the offset-by-offset fold; where two equal maxima differ (signed
    zeros, NaN payloads) either may come out, as there (numpy's SIMD maximum picks either)."""
    r = len(kernel)
    acc = x
    for axis in range(r):
        at = x.ndim - r + axis
        size, out, step = acc.shape[at], out_spatial[axis], stride[axis]
        runs = [_inside(f * dilation[axis] - padding[axis], size, step, out) for f in range(kernel[axis])]
        whole, partial = [], []  # offsets every window reads; offsets some windows read
        for lo, hi, q in runs:
            if hi > lo:
                cells = acc[(slice(None),) * at + (slice(q, q + (hi - lo - 1) * step + 1, step),)]
                (whole if lo == 0 and hi == out else partial).append((lo, hi, cells))
        reduced = np.empty(acc.shape[:at] + (out,) + acc.shape[at + 1:], x.dtype)
        if len(whole) >= 2:
            np.maximum(whole[0][2], whole[1][2], out=reduced)
        elif whole:
            np.copyto(reduced, whole[0][2])
        else:
            reduced.fill(-np.inf)
        for lo, hi, cells in whole[2:] + partial:
            target = reduced[(slice(None),) * at + (slice(lo, hi),)]
            np.maximum(target, cells, out=target)
        acc = reduced
    return acc


def _max_first(x: np.ndarray, kernel: Sequence[int], stride: Sequence[int], padding: Sequence[int],
               out_spatial: Sequence[int]) -> np.ndarray:
    """``pool_nd``'s ``max_first`` (TorchLean's ``maxPoolValue``, dilation 1): the windows'
    ``np.maximum`` (``_separable_max``; a ``cell > best`` select per offset costs five times more),
    then exact repairs where a plain maximum can differ from the sequential rule.

    Wherever the maximum is neither NaN nor a zero it is max_first's: with no NaN in a window
    (``np.maximum`` propagates NaN) both are the window's largest value, and equal non-zero floats have
    the same bits; a window with no cell in the input gives -inf in both. A NaN result (max_first: the
    first in-range cell when it is NaN, later NaNs ignored) is recomputed by the sequential rule on
    those windows alone, gathered. A zero result means a NaN-free window of cells <= 0: max_first
    keeps its first zero, so only an input holding a -0.0 needs those windows recomputed as well."""
    acc = _separable_max(x, kernel, stride, padding, (1,) * len(kernel), out_spatial)
    suspect = np.isnan(acc) if math.isnan(np.add.reduce(acc, axis=None)) else None  # a sum is NaN if an entry is
    if _has_negative_zero(x):
        zeros = acc == 0
        suspect = zeros if suspect is None else suspect | zeros
    if suspect is not None and suspect.any():
        acc[suspect] = _sequential_first_max(x, np.nonzero(suspect), kernel, stride, padding)
    return acc


def _has_negative_zero(x: np.ndarray) -> bool:
    """Whether ``x`` holds a -0.0: read as signed integers, -0.0 is the only float whose bits are the
    most negative integer, so one minimum (no temporary) decides a contiguous float32 or float64 array."""
    if x.flags.c_contiguous and x.dtype.itemsize in (4, 8) and x.size:
        bits = x.view(np.int32 if x.dtype.itemsize == 4 else np.int64)
        return int(bits.min()) == int(np.iinfo(bits.dtype).min)
    return bool(np.any((x == 0) & np.signbit(x)))


def _sequential_first_max(x: np.ndarray, where: tuple[np.ndarray, ...], kernel: Sequence[int],
                          stride: Sequence[int], padding: Sequence[int]) -> np.ndarray:
    """max_first of the windows at output positions ``where`` (a ``np.nonzero`` tuple), vectorized over
    those windows: the first in-range cell, replaced by each later in-range cell (row-major) greater
    than it; -inf for a window with no cell in the input."""
    r = len(kernel)
    spatial = x.shape[x.ndim - r:]
    lead_idx, out_idx = where[:x.ndim - r], where[x.ndim - r:]
    base = [o * s - pb for o, s, pb in zip(out_idx, stride, padding)]
    best = np.full(len(where[0]), -np.inf, x.dtype)
    seen = np.zeros(len(where[0]), bool)
    with np.errstate(invalid="ignore"):
        for offs in itertools.product(*(range(kk) for kk in kernel)):
            coords = [b + f for b, f in zip(base, offs)]
            inside = np.logical_and.reduce([(c >= 0) & (c < n) for c, n in zip(coords, spatial)])
            cells = x[lead_idx + tuple(np.clip(c, 0, n - 1) for c, n in zip(coords, spatial))]
            np.copyto(best, cells, where=inside & (~seen | (cells > best)))
            seen |= inside
    return best
