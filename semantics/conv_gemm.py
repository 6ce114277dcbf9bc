"""Convolution of a whole batch as one matrix product per group, for the bound rules' hot paths.

The input is staged once into a zero-padded, channel-major copy split by stride phase: channel c,
phase p (the padded coordinates congruent to p modulo the stride) and the batch's flattened phase
grids, ``[C, phases, n * prod(grid) + tail]``. Along a stride-1 axis consecutive rows share their
padding (max(before, after) zeros between them). In that layout every kernel tap reads, for all
samples and output positions at once, one contiguous run of each channel's row, at an offset fixed
by the tap. The column matrix is therefore built from ``C * prod(kernel)`` long contiguous copies
(an im2col view of the padded batch copies a few elements per inner step instead), and one GEMM per
group contracts it. Output positions are computed on the whole phase grid; the ones past the true
output extent read neighbouring cells (or the zero tail) and are never looked at: the result is a
strided view that selects the true positions.

Every output is a plain dot product of the window's cells with the weights (taps landing in the
padding multiply an exact zero), so the order-independent rounding bound of the interval rules holds.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from .scratch import scratch

__all__ = ["ConvPlan", "conv_plan", "stage", "conv_products"]

# column matrices of at most this many bytes are built at once: pieces of the batch that stay in a 1 MiB
# L2 cache while BLAS reads them back (measured faster than 2 MiB and 512 KiB pieces on the bench models)
_COLS_BYTES = 1 << 20


def _row_stride(width: int, itemsize: int) -> int:
    """Elements per row of a buffer of ``width``-element rows: an odd multiple of 64 bytes, so that
    consecutive rows never sit a multiple of 4 KiB apart (rows of 2**k elements all map to the same
    cache sets, and a GEMM over them runs at half speed)."""
    row = -(-width * itemsize // 128) * 128 + 64
    return row // itemsize


@dataclass(frozen=True)
class ConvPlan:
    """Where each tap of one conv reads in the staged input, for one input shape."""

    n: int
    channels: int
    spatial: tuple[int, ...]
    out_spatial: tuple[int, ...]
    grid: tuple[int, ...]          # the phase grid: ceil(padded extent / stride) per axis
    stride: tuple[int, ...]
    before: tuple[int, ...]
    phases: tuple[tuple[int, ...], ...]  # the stride phases some tap reads (at most prod(kernel))
    taps: tuple[tuple[int, int], ...]  # (index in phases, flat offset in the phase grid) per kernel tap
    tail: int                      # zero cells after the last grid, for the taps' reads past it

    @property
    def cells(self) -> int:
        return math.prod(self.grid)


@functools.lru_cache(maxsize=256)
def _plan(n: int, channels: int, spatial: tuple[int, ...], kernel: tuple[int, ...], stride: tuple[int, ...],
          dilation: tuple[int, ...], before: tuple[int, ...], after: tuple[int, ...]) -> ConvPlan:
    padded = tuple(s + b + e for s, b, e in zip(spatial, before, after))
    out_sp = tuple((p - d * (k - 1) - 1) // st + 1 for p, k, st, d in zip(padded, kernel, stride, dilation))
    # a strided axis's grid ends where the last output's window does (its phase cells past that are never
    # read): a 13-cell axis under kernel 4, stride 2 has 5 outputs on 6 grid cells, not ceil(13 / 2) = 7
    grid = tuple(_shared_gap(s, b, e, o) if st == 1 else min(-(-p // st), o + d * (k - 1) // st)
                 for s, b, e, o, p, st, k, d in zip(spatial, before, after, out_sp, padded, stride, kernel, dilation))
    step = [math.prod(grid[ax + 1:]) for ax in range(len(grid))]
    phases: dict[tuple[int, ...], int] = {}  # only the phases a tap reads: a stride beyond the kernel
    taps = []                                # leaves the others out of the staged copy
    for tap in np.ndindex(*kernel):
        at = tuple(d * k for d, k in zip(dilation, tap))
        phase = tuple(a % st for a, st in zip(at, stride))
        offset = sum((a // st) * sp for a, st, sp in zip(at, stride, step))
        taps.append((phases.setdefault(phase, len(phases)), offset))
    tail = max((off for _, off in taps), default=0)
    return ConvPlan(n, channels, spatial, out_sp, grid, stride, before, tuple(phases), tuple(taps), tail)


def _shared_gap(size: int, before: int, after: int, out: int) -> int:
    """A stride-1 axis's grid extent: the cells, then max(before, after) zeros that serve as one row's
    padding after it and the next row's padding before it (a window never reaches further than
    ``before`` cells back or ``after`` cells on), so fewer wasted output positions than with both
    paddings per row; both when the outputs would not fit (padding wider than the window)."""
    shared = size + max(before, after)
    return shared if shared >= out else size + before + after


def conv_plan(shape: tuple[int, ...], attrs: Mapping[str, Any]) -> ConvPlan:
    """The plan for input ``[n, C, *spatial]`` under a conv node's attributes."""
    return _plan(shape[0], shape[1], tuple(shape[2:]), tuple(attrs["kernel"]), tuple(attrs["stride"]),
                 tuple(attrs["dilation"]), tuple(attrs["padding"]), tuple(attrs["padding_after"]))


def stage(x: np.ndarray, plan: ConvPlan, dtype: np.dtype | type, name: str) -> np.ndarray:
    """``x`` ``[n, C, *spatial]`` written (cast to ``dtype``) into the scratch buffer ``name`` in the
    staged layout ``[C, phases, n * cells + tail]``, zero elsewhere."""
    dtype = np.dtype(dtype)
    length = plan.n * plan.cells + plan.tail
    phases = len(plan.phases)
    buf = scratch(name, (plan.channels, phases, _row_stride(length, dtype.itemsize)), dtype)[:, :, :length]
    buf.fill(0)
    r = len(plan.spatial)
    grids = buf[:, :, :plan.n * plan.cells].reshape((plan.channels, phases, plan.n) + plan.grid)
    src_all = x.transpose((1, 0) + tuple(range(2, 2 + r)))
    for index, phase in enumerate(plan.phases):
        src, dst = [slice(None), slice(None)], [slice(None), index, slice(None)]
        for ax in range(r):
            st, b, s = plan.stride[ax], plan.before[ax], plan.spatial[ax]
            first = max(0, -(-(b - phase[ax]) // st))          # the first grid cell inside the input
            last = min(plan.grid[ax] - 1, (b + s - 1 - phase[ax]) // st)
            if last < first:
                break
            start = first * st + phase[ax] - b
            src.append(slice(start, start + (last - first) * st + 1, st))
            dst.append(slice(first, last + 1))
        else:
            np.copyto(grids[tuple(dst)], src_all[tuple(src)], casting="unsafe")
    return buf


def conv_products(staged: np.ndarray, plan: ConvPlan, weight: np.ndarray, groups: int, name: str) -> np.ndarray:
    """``weight`` ``[out, C/groups, *kernel]`` applied to the staged input (no bias): a strided view
    ``[n, out, *out_spatial]`` of the scratch buffer ``name`` (valid until that buffer's next use)."""
    n, cells, c = plan.n, plan.cells, plan.channels
    cout, k = weight.shape[0], len(plan.taps)
    cg, og = c // groups, cout // groups
    w = weight.reshape(groups, og, cg * k)
    dtype = np.result_type(w, staged)
    result = scratch(name, (groups, og, _row_stride(n * cells, dtype.itemsize)), dtype)[:, :, :n * cells]
    isz = staged.dtype.itemsize
    piece = max(1, _COLS_BYTES // max(1, c * k * cells * isz))
    buf = scratch("conv_gemm.cols", (groups, cg * k, _row_stride(min(piece, n) * cells, isz)), staged.dtype)
    for s0 in range(0, n, piece):
        m = min(piece, n - s0)
        width, base = m * cells, s0 * cells
        cols = buf[:, :, :width]
        taps = cols.reshape(c, k, width)
        for t, (phase, offset) in enumerate(plan.taps):
            np.copyto(taps[:, t], staged[:, phase, base + offset:base + offset + width])
        np.matmul(w, cols, out=result[:, :, base:base + width])
    grids = result.reshape((cout, n) + plan.grid)
    picked = grids[(slice(None), slice(None)) + tuple(slice(0, o) for o in plan.out_spatial)]
    return picked.transpose((1, 0) + tuple(range(2, 2 + len(plan.grid))))
