"""Depthwise convolution (one input channel per group) as banded matrix products, without im2col.

im2col per group copies ``prod(kernel)`` cells per output and then runs one tiny product per channel:
for a 9x9 depthwise layer that copy is 81 times the output. Here the kernel's last axis is folded
into a banded (Toeplitz) matrix instead: for kernel row ``i`` and a tile of ``TW`` outputs along the
last axis, ``out[o] += x[row(i), o*s + j*d] * w[i, j]`` over ``j`` is the product of the input rows
(a strided view of the padded input, passed to BLAS as is: no copy) with a ``[span, TW]`` matrix
holding ``w[i, :]`` on its band. That is ``kernel[0] * tiles`` BLAS calls batched over channels.
The band matrix wastes ``span / kernel[-1]`` multiplications by zero (exact zeros: ``0 * x`` is
``+-0`` for finite ``x``, so every output is still the plain dot product of its window with the
weights, in another association order); tiles keep that waste bounded on wide inputs.

Used for 1-d and 2-d convolution with ``in/groups == 1``; other geometries keep im2col.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from numpy.lib.stride_tricks import as_strided

__all__ = ["depthwise_applies", "depthwise_band", "depthwise_conv"]

# outputs per tile along the last axis: wide enough that the band matrix feeds BLAS a useful product,
# narrow enough that the zeros outside the band stay a small multiple of the kernel's width
_TILE = 32


def depthwise_applies(c_in: int, groups: int, kernel: Sequence[int], out_spatial: Sequence[int],
                      dtype: np.dtype) -> bool:
    """Whether ``depthwise_conv`` serves this conv, and is faster than im2col there: one input channel
    per group, 1 or 2 spatial axes, a float input (the band's zeros are exact only in floating
    point), a kernel at least 5 wide and rows of at most one tile. Measured per layer at one thread
    (band built per call): 9x9 over 256 x 32x32 5.96 ms vs im2col 8.14 ms, 7x7 over 768 x 14x14
    2.01 vs 6.98 ms; but 3x3 kernels and 56-wide rows (two tiles, 5x the products) were slower."""
    return (groups > 1 and c_in == groups and len(kernel) in (1, 2) and kernel[-1] >= 5
            and out_spatial[-1] <= _TILE and dtype.kind == "f")


def _geometry(kw: int, sw: int, dw: int, ow: int) -> tuple[int, int, int]:
    """(outputs per tile, tiles, input cells one tile reads) along the last axis."""
    tile = min(ow, _TILE)
    return tile, -(-ow // tile), (tile - 1) * sw + (kw - 1) * dw + 1


def depthwise_band(weight: np.ndarray, stride: Sequence[int], dilation: Sequence[int], out_spatial: Sequence[int]
                   ) -> np.ndarray:
    """The band matrices ``depthwise_conv`` multiplies by, for ``weight`` ``[C * m, 1, *kernel]`` and
    an output whose last axis is ``out_spatial[-1]`` long: built once per weight by a prepared graph's
    parameters (building costs about as much as the products on a 9x9 layer)."""
    c_out, kernel = weight.shape[0], weight.shape[2:]
    kh, kw = (1,) + tuple(kernel) if len(kernel) == 1 else kernel
    tile, _, span = _geometry(kw, stride[-1], dilation[-1], out_spatial[-1])
    return _band(weight.reshape(c_out, 1, kh, kw), stride[-1], dilation[-1], tile, span)


def _band(weight: np.ndarray, stride: int, dilation: int, tile: int, span: int) -> np.ndarray:
    """``[g, og, kernel rows, span, tile]``: entry ``[.., i, o*stride + j*dilation, o] = w[.., i, j]``."""
    g, og, rows, width = weight.shape
    band = np.zeros((g, og, rows, span, tile), weight.dtype)
    diagonal = band.strides[3] * stride + band.strides[4]
    for j in range(width):
        start = band[:, :, :, j * dilation:, :]
        view = as_strided(start, shape=(g, og, rows, tile), strides=band.strides[:3] + (diagonal,))
        view[...] = weight[:, :, :, j, None]
    return band


def depthwise_conv(xp: np.ndarray, weight: np.ndarray, *, stride: Sequence[int], dilation: Sequence[int],
                   out_spatial: Sequence[int], band: np.ndarray | None = None) -> np.ndarray:
    """``xp`` the zero-padded input ``[n, C, *spatial]``, ``weight`` ``[C * m, 1, *kernel]`` (``band``
    its ``depthwise_band``, built here when not given); the products (no bias) ``[n, C * m, *out_spatial]``."""
    if band is None:
        band = depthwise_band(weight, stride, dilation, out_spatial)
    n, c = xp.shape[:2]
    if len(out_spatial) == 1:  # one row: the 2-d path with a height-1 kernel
        y = depthwise_conv(xp[:, :, None, :], weight[:, :, None, :], stride=(1,) + tuple(stride),
                           dilation=(1,) + tuple(dilation), out_spatial=(1,) + tuple(out_spatial), band=band)
        return y[:, :, 0, :]
    (sh, sw), (dh, dw), (oh, ow) = stride, dilation, out_spatial
    kh, kw = weight.shape[2:]
    og = weight.shape[0] // c
    tile, tiles, span = _geometry(kw, sw, dw, ow)
    need = (tiles * tile - 1) * sw + (kw - 1) * dw + 1  # the last tile may read past the input: zeros
    if need > xp.shape[3]:
        wider = np.zeros(xp.shape[:3] + (need,), xp.dtype)
        wider[..., :xp.shape[3]] = xp
        xp = wider
    band = band.reshape(c, og, kh, span, tile)
    acc = np.empty((n, c, og, tiles, oh, tile), xp.dtype)
    part = np.empty((n, c, og, oh, tile), xp.dtype)
    for i in range(kh):
        rows = xp[:, :, i * dh:i * dh + (oh - 1) * sh + 1:sh]
        for t in range(tiles):
            x_tile = rows[:, :, None, :, t * tile * sw:t * tile * sw + span]
            if i == 0:
                np.matmul(x_tile, band[:, :, i], out=acc[:, :, :, t])
            else:
                np.matmul(x_tile, band[:, :, i], out=part)
                acc[:, :, :, t] += part
    y = acc.transpose(0, 1, 2, 4, 3, 5).reshape(n, c * og, oh, tiles * tile)
    return y[..., :ow]
