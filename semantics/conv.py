"""Convolution and pooling through strided views: im2col + one BLAS matmul, window offsets.

Convolution follows TorchLean's ``conv`` (spec section 2.2): axes before ``channel_axis`` are
independent batch axes, grouped weights ``[out, in/groups, *kernel]``, per-axis stride, dilation
and asymmetric zero padding. The columns are gathered with one strided copy per kernel offset
(rows stay contiguous, unlike a transposed window view) and contracted with a matrix product
batched over groups, so the work is BLAS, not Python.

Pooling acts on the trailing ``spatial_rank`` axes. Windows are visited by kernel offset (a loop
over the ``prod(kernel)`` offsets, each a whole-array strided slice of the cells inside the input),
which also gives the spec's row-major accumulation order for average pooling (a padded cell adds
an exact 0, so skipping it changes nothing); large windows use a single view reduction.
"""

from __future__ import annotations

import itertools
import math
import threading
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

__all__ = ["conv_nd", "pool_nd", "pool_out_spatial", "avg_pool_divisor", "EMPTY_WINDOW", "offset_views"]

EMPTY_WINDOW = "a pooling window lies entirely in the padding"

# above this many kernel offsets, reduce over a window view instead of looping over offsets
_OFFSET_LOOP_LIMIT = 64

# the im2col matrix is rebuilt for every convolution and dies inside it: reusing one buffer per
# thread avoids paying fresh-page faults on megabytes each time. Batches are unfolded a few samples
# at a time so the buffer stays near _IM2COL_BYTES (one sample may exceed it).
_WORKSPACE = threading.local()
_IM2COL_BYTES = 64 << 20


def _workspace(shape: tuple, dtype: np.dtype) -> np.ndarray:
    nbytes = math.prod(shape) * np.dtype(dtype).itemsize
    buf = getattr(_WORKSPACE, "buffer", None)
    if buf is None or buf.nbytes < nbytes:
        buf = _WORKSPACE.buffer = np.empty(max(nbytes, 1), np.uint8)
    return buf[:nbytes].view(dtype).reshape(shape)


def _pad_spatial(x: np.ndarray, before: Sequence[int], after: Sequence[int], value: float) -> np.ndarray:
    if not any(before) and not any(after):
        return x
    lead = x.ndim - len(before)
    shape = x.shape[:lead] + tuple(n + b + a for n, b, a in zip(x.shape[lead:], before, after))
    out = np.full(shape, value, dtype=x.dtype)
    out[(Ellipsis,) + tuple(slice(b, b + n) for b, n in zip(before, x.shape[lead:]))] = x
    return out


def offset_views(xp: np.ndarray, kernel: Sequence[int], stride: Sequence[int], dilation: Sequence[int],
                 out: Sequence[int]) -> Iterator[np.ndarray]:
    """For each kernel offset in row-major order, the ``[..., *out]`` view of the cells it meets.

    Output position ``o`` meets cell ``o*s + f*d`` on each trailing axis. With a stride, the padded
    input is first split into its ``s`` phases (``xp[..., p::s]``, each copied once), so every
    offset's view is a plain contiguous-row slice of one phase instead of a strided gather.
    """
    phases: dict[tuple[int, ...], np.ndarray] = {}
    for offs in itertools.product(*(range(k) for k in kernel)):
        starts = [f * d for f, d in zip(offs, dilation)]
        phase = tuple(st % s for st, s in zip(starts, stride))
        if phase not in phases:
            phases[phase] = xp if all(s == 1 for s in stride) else np.ascontiguousarray(
                xp[(Ellipsis,) + tuple(slice(p, None, s) for p, s in zip(phase, stride))])
        yield phases[phase][(Ellipsis,) + tuple(slice(st // s, st // s + o)
                                                for st, s, o in zip(starts, stride, out))]


def conv_nd(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, *, channel_axis: int, stride: Sequence[int],
            padding: Sequence[int], padding_after: Sequence[int], dilation: Sequence[int], groups: int,
            out_spatial: Sequence[int]) -> np.ndarray:
    """``x`` is ``lead ++ [C] ++ spatial``; the result is ``lead ++ [out] ++ out_spatial``."""
    lead = x.shape[:channel_axis]
    c_in, spatial = x.shape[channel_axis], x.shape[channel_axis + 1:]
    n = math.prod(lead)
    out_c, kernel = weight.shape[0], weight.shape[2:]
    g, cg, og = groups, c_in // groups, out_c // groups
    k, length = math.prod(kernel), math.prod(out_spatial)
    xp = _pad_spatial(x.reshape((n, c_in) + spatial), padding, padding_after, 0.0)
    w = weight.reshape(g, og, cg * k)
    if k == 1 and tuple(xp.shape[2:]) == tuple(out_spatial):  # pointwise: the input is its own column matrix
        y = np.matmul(w, xp.reshape(n, g, cg, length))
    else:  # im2col, a bounded number of samples at a time
        y = np.empty((n, g, og, length), dtype=x.dtype)
        chunk = max(1, _IM2COL_BYTES // (c_in * k * length * x.dtype.itemsize))
        for lo in range(0, n, chunk):
            part = xp[lo:lo + chunk]
            np.matmul(w, _im2col(part, kernel, stride, dilation, out_spatial).reshape(len(part), g, cg * k, length),
                      out=y[lo:lo + chunk])
    y = y.reshape((n, out_c, length))
    y += bias.reshape(out_c, 1)
    return y.reshape(lead + (out_c,) + tuple(out_spatial))


def _im2col(xp: np.ndarray, kernel: Sequence[int], stride: Sequence[int], dilation: Sequence[int],
            out: Sequence[int]) -> np.ndarray:
    """``[n, C, *kernel, *out]`` in the workspace: one contiguous-row copy per kernel offset."""
    cols = _workspace(xp.shape[:2] + tuple(kernel) + tuple(out), xp.dtype)
    every = (slice(None), slice(None))
    views = offset_views(xp, kernel, stride, dilation, out)
    for offs, view in zip(itertools.product(*(range(kk) for kk in kernel)), views):
        cols[every + offs] = view
    return cols


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
            divisor: np.ndarray | float | None = None) -> np.ndarray:
    """Max (cells outside the input ignored) or sum-then-divide pooling over the trailing axes.

    ``divisor`` (average mode) is a scalar or an array broadcasting over ``out_spatial``. Cells in
    the padding, or past it (ceil mode), add nothing to a sum and are skipped by the maximum, so a
    window made only of padding gives -inf.
    """
    r = len(kernel)
    spatial = x.shape[x.ndim - r:]
    out_shape = x.shape[:x.ndim - r] + tuple(out_spatial)
    if any(o == 0 for o in out_spatial):
        return np.zeros(out_shape, x.dtype)
    lead = (Ellipsis,)
    if math.prod(kernel) <= _OFFSET_LOOP_LIMIT:
        # fold in, kernel offset by kernel offset (row-major), the cells inside the input; no padding is built
        acc = np.full(out_shape, -np.inf if mode == "max" else 0.0, x.dtype)
        fold = np.maximum if mode == "max" else np.add
        for offs in itertools.product(*(range(kk) for kk in kernel)):
            spans = [_inside(f * d - pb, n, s, o)
                     for f, d, pb, n, s, o in zip(offs, dilation, padding, spatial, stride, out_spatial)]
            if all(hi > lo for lo, hi, _ in spans):
                target = acc[lead + tuple(slice(lo, hi) for lo, hi, _ in spans)]
                cells = x[lead + tuple(slice(q, q + (hi - lo - 1) * s + 1, s) for (lo, hi, q), s in zip(spans, stride))]
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
    if mode == "max":
        return acc
    acc /= np.asarray(divisor, acc.dtype)
    return acc
