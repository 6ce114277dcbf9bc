"""Depthwise convolution (one input channel per group) as banded matrix products, without im2col.

im2col per group copies ``prod(kernel)`` cells per output and then runs one tiny product per channel:
for a 9x9 depthwise layer that copy is 81 times the output. Here the kernel's last axis is folded
into a banded (Toeplitz) matrix instead: for kernel row ``i``, ``out[o] += x[row(i), o*s + j*d] * w[i, j]``
over ``j`` is the product of the input rows (a strided view of the padded input, passed to BLAS as
is: no copy) with a ``[span, out width]`` matrix holding ``w[i, :]`` on its band: ``kernel[0]`` BLAS
calls batched over channels. The band matrix multiplies ``span / kernel[-1]`` times more cells than the
window holds, by exact zeros. For a finite input ``0 * x`` is a zero, so every output is the window's
dot product with the weights in another association order (a zero result may change sign); an input
holding an infinity or NaN would leak it into outputs whose window does not hold it (``0 * inf`` is
NaN), so such inputs keep im2col. The bands are built once with the conv's float parameters.

Used for 1-d and 2-d convolution with ``in/groups == 1``, wide kernels, narrow rows and bounded bands (``depthwise_applies``);
other geometries keep im2col.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
from numpy.lib.stride_tricks import as_strided

from .interval_round import all_finite

__all__ = ["MAX_BAND", "band_shape", "depthwise_applies", "depthwise_serves", "depthwise_band", "depthwise_conv"]

# the widest output row served: beyond it the band's zeros outnumber the products im2col performs
MAX_ROW = 32


# the most entries a band may hold (32 MiB in float64): a large stride or dilation spreads the band
# over a span of mostly zeros, where im2col does less work anyway
MAX_BAND = 1 << 22


def band_shape(out_channels: int, kernel: Sequence[int], stride: Sequence[int], dilation: Sequence[int],
               out_spatial: Sequence[int]) -> tuple[int, int, int, int]:
    """``[out channels, kernel rows, span, out width]``: the shape ``depthwise_band`` builds."""
    kh, kw = (1,) + tuple(kernel) if len(kernel) == 1 else tuple(kernel)
    span = (out_spatial[-1] - 1) * stride[-1] + (kw - 1) * dilation[-1] + 1
    return out_channels, kh, span, out_spatial[-1]


def depthwise_applies(c_in: int, groups: int, kernel: Sequence[int], out_spatial: Sequence[int],
                      dtype: np.dtype, *, out_channels: int | None = None, stride: Sequence[int] = (1,),
                      dilation: Sequence[int] = (1,)) -> bool:
    """Whether ``depthwise_conv`` serves this geometry, and is faster than im2col there: one input
    channel per group, 1 or 2 spatial axes, a float dtype, a kernel at least 5 wide, output rows
    of at most ``MAX_ROW`` and a band of at most ``MAX_BAND`` entries. Measured per layer at one
    thread (band built per call): 9x9 over 256 x 32x32 5.96 ms vs im2col 8.14 ms, 7x7 over
    768 x 14x14 2.01 vs 6.98 ms; 3x3 kernels (32 x 112x112: 1.58 vs 0.79 ms) and 56-wide rows
    (96 x 56x56, 7x7: 12.1 vs 9.0 ms) were slower."""
    if not (groups > 1 and c_in == groups and len(kernel) in (1, 2) and kernel[-1] >= 5
            and out_spatial[-1] <= MAX_ROW and dtype.kind == "f"):
        return False
    return math.prod(band_shape(out_channels or c_in, kernel, stride, dilation, out_spatial)) <= MAX_BAND


def depthwise_serves(x: np.ndarray, weight: np.ndarray, groups: int, stride: Sequence[int],
                     dilation: Sequence[int], out_spatial: Sequence[int]) -> bool:
    """``depthwise_applies`` for input ``x`` ``[n, C, *spatial]`` and ``weight`` ``[C * m, 1, *kernel]``,
    and ``x`` finite (see the module note)."""
    return (depthwise_applies(x.shape[1], groups, weight.shape[2:], out_spatial, x.dtype, out_channels=weight.shape[0],
                              stride=stride, dilation=dilation) and all_finite(x))


def depthwise_band(weight: np.ndarray, stride: Sequence[int], dilation: Sequence[int], out_spatial: Sequence[int]
                   ) -> np.ndarray:
    """``[out channels, kernel rows, span, out width]`` for ``weight`` ``[C * m, 1, *kernel]``: entry
    ``[c, i, o*stride + j*dilation, o] = w[c, 0, i, j]`` (building it costs about as much as the
    products on a 9x9 layer, hence once per prepared graph)."""
    c_out, kh, span, ow = band_shape(weight.shape[0], weight.shape[2:], stride, dilation, out_spatial)
    kw, sw, dw = weight.shape[-1], stride[-1], dilation[-1]
    rows = weight.reshape(c_out, kh, kw)
    band = np.zeros((c_out, kh, span, ow), weight.dtype)
    diagonal = band.strides[2] * sw + band.strides[3]
    for j in range(kw):
        view = as_strided(band[:, :, j * dw:], shape=(c_out, kh, ow), strides=band.strides[:2] + (diagonal,))
        view[...] = rows[:, :, j, None]
    return band


def depthwise_conv(xp: np.ndarray, weight: np.ndarray, *, stride: Sequence[int], dilation: Sequence[int],
                   out_spatial: Sequence[int], band: np.ndarray | None = None) -> np.ndarray:
    """``xp`` the zero-padded finite input ``[n, C, *spatial]``, ``weight`` ``[C * m, 1, *kernel]``
    (``band`` its ``depthwise_band``, built here when not given); the products (no bias)
    ``[n, C * m, *out_spatial]``."""
    if band is None:
        band = depthwise_band(weight, stride, dilation, out_spatial)
    if len(out_spatial) == 1:  # one row: the 2-d path with a height-1 kernel
        y = depthwise_conv(xp[:, :, None, :], weight[:, :, None, :], stride=(1,) + tuple(stride),
                           dilation=(1,) + tuple(dilation), out_spatial=(1,) + tuple(out_spatial), band=band)
        return y[:, :, 0, :]
    n, c = xp.shape[:2]
    (sh, _), (dh, _), (oh, ow) = stride, dilation, out_spatial
    kh, span = band.shape[1], band.shape[2]
    og = weight.shape[0] // c
    bands = band.reshape(c, og, kh, span, ow)
    acc = np.empty((n, c, og, oh, ow), xp.dtype)
    part = np.empty_like(acc)
    for i in range(kh):
        rows = xp[:, :, None, i * dh:i * dh + (oh - 1) * sh + 1:sh, :span]  # [n, C, 1, oh, span]: a view
        if i == 0:
            np.matmul(rows, bands[:, :, i], out=acc)
        else:
            np.matmul(rows, bands[:, :, i], out=part)
            acc += part
    return acc.reshape(n, c * og, oh, ow)
