"""Depthwise convolution (one input channel per group) as banded matrix products, without im2col.

im2col per group copies ``prod(kernel)`` cells per output and then runs one tiny product per channel:
for a 9x9 depthwise layer that copy is 81 times the output. Here the kernel is folded into a banded
(Toeplitz) matrix instead. A wide output row is cut into tiles of ``TILE`` outputs, and the input into
the matching column strips (``span`` cells wide, a copy unless one tile spans whole rows), so that
the input rows one output row reads, ``rows`` of them, are one contiguous run of ``rows * span``
cells. ``out[o] = sum over i, j of x[row(i), o*s + j*d] * w[i, j]`` is then, for every output row of
every tile at once, the product of that run (a strided view: no copy) with one ``[rows * span, TILE]``
matrix holding ``w`` on its bands (a Toeplitz band is the same for every tile): one BLAS call batched
over channels and tiles. The band multiplies ``rows * span / prod(kernel)`` times more cells than the
window holds, by exact zeros (a row dilation's gaps are zero rows). For a finite input ``0 * x`` is a
zero, so every output is the window's dot product with the weights in another association order (a
zero result may change sign); an input holding an infinity or NaN would leak it into outputs whose
window does not hold it (``0 * inf`` is NaN), so such inputs keep im2col. The bands are built once
with the conv's float parameters. A row that is not a whole number of tiles reads
``depthwise_extra_columns`` zero cells past its padding (into outputs that are cut off).

Used for 1-d and 2-d convolution with ``in/groups == 1``, kernels at least 5 wide and bounded bands
(``depthwise_applies``); other geometries keep im2col.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
from numpy.lib.stride_tricks import as_strided

from .interval_round import all_finite
from .scratch import scratch

__all__ = ["MAX_BAND", "MAX_STRIP", "MAX_WASTE", "ONE_TILE", "TILE", "band_shape", "depthwise_applies",
           "depthwise_serves", "depthwise_band", "depthwise_conv", "depthwise_extra_columns"]

# rows of at most ONE_TILE outputs are one band tile; wider rows are cut into tiles of TILE outputs
# (wider tiles multiply more zeros). One thread, float32, measured inside the ConvMixer and ConvNeXt-T
# graphs: 32-wide rows as one tile 4.9 ms per 9x9 layer, as two tiles 6.1 ms; 56-wide rows as tiles of
# 16 4.0 ms per 7x7 layer, by im2col 5.3 ms (one tile of 56: 5.0 ms in isolation). With the kernel rows
# folded into one product (one run of ``rows * span`` cells per output row instead of a product per
# kernel row and a sum), tiles of 8 or 16 and one tile of up to 16, 24 or 32 were within about 10% of each
# other on eleven depthwise layers of ConvMixer, ConvNeXt-T and MobileNet/EfficientNet shapes.
ONE_TILE = 32
TILE = 16


# the most entries a band may hold (32 MiB in float64): a large stride or dilation spreads the band
# over a span of mostly zeros, where im2col does less work anyway
MAX_BAND = 1 << 22

# the most cells of input a band product reads per cell of the window (zeros included): an undilated
# 5-wide kernel on one tile of 32 outputs reads 7.2, on one of 28 at stride 2 11.8
MAX_WASTE = 16

# the widest a tile's column strip may be, in the tile's own input columns (width * stride): a strip
# is copied once per tile, so this bounds that copy against the input
MAX_STRIP = 4


def band_shape(out_channels: int, kernel: Sequence[int], stride: Sequence[int], dilation: Sequence[int],
               out_spatial: Sequence[int]) -> tuple[int, int, int, int]:
    """``[out channels, rows, span, tile width]``: the shape ``depthwise_band`` builds, ``rows`` the input
    rows one output row reads (``(kernel[0] - 1) * dilation[0] + 1``: a row dilation's gaps are zero rows)."""
    kh, kw = (1,) + tuple(kernel) if len(kernel) == 1 else tuple(kernel)
    dh = 1 if len(kernel) == 1 else dilation[0]
    width = _tile_width(out_spatial[-1])
    span = (width - 1) * stride[-1] + (kw - 1) * dilation[-1] + 1
    return out_channels, (kh - 1) * dh + 1, span, width


def _tile_width(out_width: int) -> int:
    return out_width if out_width <= ONE_TILE else TILE


def depthwise_extra_columns(in_width: int, kernel: Sequence[int], stride: Sequence[int], dilation: Sequence[int],
                            out_width: int) -> int:
    """Zero columns needed past a padded row of ``in_width`` cells so that its last tile's reads stay
    inside it (0 when the row is a whole number of tiles)."""
    width = _tile_width(out_width)
    reach = (-(-out_width // width) * width - 1) * stride[-1] + (kernel[-1] - 1) * dilation[-1] + 1
    return max(0, reach - in_width)


def depthwise_applies(c_in: int, groups: int, kernel: Sequence[int], out_spatial: Sequence[int],
                      dtype: np.dtype, *, out_channels: int | None = None, stride: Sequence[int] = (1,),
                      dilation: Sequence[int] = (1,)) -> bool:
    """Whether ``depthwise_conv`` serves this geometry, and is faster than im2col there: one input
    channel per group, 1 or 2 spatial axes, a float dtype, a kernel at least 5 wide, a band of at
    most ``MAX_BAND`` entries that multiplies at most ``MAX_WASTE`` cells per window cell, and (rows
    of several tiles) column strips at most ``MAX_STRIP`` times the tile's input columns wide, so that
    the strips' copy holds at most ``2 * MAX_STRIP`` times the padded input (a large dilation spreads
    the window over mostly zeros, where im2col does less work). Measured per layer at one thread,
    float32, against im2col: 9x9 over 256 x 32x32 (one tile) 5.5 vs 6.3 ms, 7x7 over 96 x 56x56 3.9 vs
    5.0 ms, 5x5 over 64 x 64x64 1.8 vs 2.1 ms; 3x3 kernels were slower (32 x 112x112: 2.3 vs 1.5 ms)."""
    if not (groups > 1 and c_in == groups and len(kernel) in (1, 2) and kernel[-1] >= 5 and dtype.kind == "f"):
        return False
    c_out, rows, span, width = band_shape(out_channels or c_in, kernel, stride, dilation, out_spatial)
    if rows * span > MAX_WASTE * math.prod(kernel):
        return False
    if out_spatial[-1] > width and span > MAX_STRIP * width * stride[-1]:
        return False
    return c_out * rows * span * width <= MAX_BAND


def depthwise_serves(x: np.ndarray, weight: np.ndarray, groups: int, stride: Sequence[int],
                     dilation: Sequence[int], out_spatial: Sequence[int]) -> bool:
    """``depthwise_applies`` for input ``x`` ``[n, C, *spatial]`` (padded or not) and ``weight``
    ``[C * m, 1, *kernel]``, and ``x`` finite (see the module note)."""
    return (depthwise_applies(x.shape[1], groups, weight.shape[2:], out_spatial, x.dtype, out_channels=weight.shape[0],
                              stride=stride, dilation=dilation) and all_finite(x))


def depthwise_band(weight: np.ndarray, stride: Sequence[int], dilation: Sequence[int], out_spatial: Sequence[int]
                   ) -> np.ndarray:
    """``[out channels, rows, span, tile width]`` for ``weight`` ``[C * m, 1, *kernel]``: entry
    ``[c, i * dh, o*stride + j*dilation, o] = w[c, 0, i, j]``, zero elsewhere (built once per prepared graph)."""
    c_out, rows, span, ow = band_shape(weight.shape[0], weight.shape[2:], stride, dilation, out_spatial)
    kw, sw, dw = weight.shape[-1], stride[-1], dilation[-1]
    kh, dh = (weight.shape[2], dilation[0]) if weight.ndim == 4 else (1, 1)
    taps = weight.reshape(c_out, kh, kw)
    band = np.zeros((c_out, rows, span, ow), weight.dtype)
    kernel_rows = band[:, ::dh]  # [c_out, kh, span, ow]: the rows a tap reads
    diagonal = band.strides[2] * sw + band.strides[3]
    for j in range(kw):
        view = as_strided(kernel_rows[:, :, j * dw:], shape=(c_out, kh, ow),
                          strides=kernel_rows.strides[:2] + (diagonal,))
        view[...] = taps[:, :, j, None]
    return band


def _tiled_rows(xp: np.ndarray, tiles: int, width: int, sw: int, span: int) -> np.ndarray:
    """``xp`` ``[n, C, H, W]`` as ``[n, C, tiles, H, span]`` with each tile's rows contiguous, so that the
    rows one output row reads are one run of memory: ``xp`` itself when it already is that layout (one
    tile spanning whole contiguous rows), else a copy (``span / (width * sw)`` times the input)."""
    n, c, h, w = xp.shape
    isz = xp.itemsize
    if tiles == 1 and w == span and xp.strides[3] == isz and (h == 1 or xp.strides[2] == span * isz):
        return xp[:, :, None]  # (one row, as a 1-d conv's: its row stride is never read)
    s_n, s_c, s_h, s_w = xp.strides
    view = as_strided(xp, shape=(n, c, tiles, h, span), strides=(s_n, s_c, width * sw * s_w, s_h, s_w),
                      writeable=False)
    tiled = scratch("depthwise.tiles", view.shape, xp.dtype)
    np.copyto(tiled, view)
    return tiled


def depthwise_conv(xp: np.ndarray, weight: np.ndarray, *, stride: Sequence[int], dilation: Sequence[int],
                   out_spatial: Sequence[int], band: np.ndarray | None = None) -> np.ndarray:
    """``xp`` the zero-padded finite input ``[n, C, *spatial]`` with its rows extended by
    ``depthwise_extra_columns`` zeros, ``weight`` ``[C * m, 1, *kernel]`` (``band`` its
    ``depthwise_band``, built here when not given); the products (no bias) ``[n, C * m, *out_spatial]``."""
    if band is None:
        band = depthwise_band(weight, stride, dilation, out_spatial)
    if len(out_spatial) == 1:  # one row: the 2-d path with a height-1 kernel
        y = depthwise_conv(xp[:, :, None, :], weight[:, :, None, :], stride=(1,) + tuple(stride),
                           dilation=(1,) + tuple(dilation), out_spatial=(1,) + tuple(out_spatial), band=band)
        return y[:, :, 0, :]
    n, c = xp.shape[:2]
    (sh, sw), (oh, ow) = stride, out_spatial
    rows, span, width = band.shape[1:]
    tiles = -(-ow // width)
    if (tiles - 1) * width * sw + span > xp.shape[-1] or (oh - 1) * sh + rows > xp.shape[-2]:
        raise ValueError(f"depthwise_conv: rows of {xp.shape[-2:]} cells are too short for {tiles} tiles of {span}")
    og = weight.shape[0] // c
    xt = _tiled_rows(xp, tiles, width, sw, span)
    s_n, s_c, s_t, s_h, s_w = xt.strides
    # [n, C, 1, tiles, oh, rows * span]: output row r of tile t reads tile t's rows r*sh ... r*sh + rows - 1
    windows = as_strided(xt, shape=(n, c, 1, tiles, oh, rows * span), strides=(s_n, s_c, 0, s_t, sh * s_h, s_w),
                         writeable=False)
    y = np.empty((n, c, og, oh, tiles, width), xp.dtype)
    np.matmul(windows, band.reshape(c, og, 1, rows * span, width), out=y.transpose(0, 1, 2, 4, 3, 5))
    y = y.reshape(n, c * og, oh, tiles * width)
    return y if tiles * width == ow else y[..., :ow]
