"""The transpose of a convolution applied to many coefficient rows at once (CROWN's backward step
through a convolution, in patches, dense passes and ``chain.ConvOperator``).

Four strategies compute the same sums of the same terms (a padding cell or a tap that reaches no cell
contributes an exact zero), so the callers' order-independent rounding bound holds for each:
the dense transposed matrix for small maps (``_dense_adjoint``), the staged forward correlation for
stride 1, one stride phase at a time where that pays, and strided adds per kernel offset otherwise.
"""

from __future__ import annotations

import functools
import itertools
import math

import numpy as np

from ..conv_gemm import conv_plan, conv_products, stage
from ..scratch import scratch

__all__ = ["conv_adjoint"]


def conv_adjoint(a: np.ndarray, weight: np.ndarray, stride, padding, dilation, groups: int,
                 in_spatial: tuple[int, ...]) -> np.ndarray:
    """The transpose of a convolution applied to many coefficient rows at once.

    ``a`` is ``[M, C_out, *out_spatial]`` (M = samples x rows), ``weight`` ``[C_out, C_in/g, *kernel]``;
    the result is ``[M, C_in, *in_spatial]``, a fresh array. Small maps take one GEMM with the transposed
    convolution's dense matrix (``_dense_pays``), stride 1 the staged correlation (``_stride1_adjoint``),
    a strided convolution the phase split where it pays (``_phases_pay``), anything else the strided adds
    (``_strided_adds``): a loop over kernel offsets, never over cells or rows.
    """
    m, c_out = a.shape[:2]
    out_sp, kernel = tuple(a.shape[2:]), tuple(weight.shape[2:])
    if _dense_pays(m, c_out, out_sp, kernel, weight.shape[1], groups, in_spatial):
        return _dense_adjoint(a, weight, tuple(stride), tuple(padding), tuple(dilation), groups, tuple(in_spatial))
    cig, length = weight.shape[1], math.prod(out_sp)
    if all(d == 1 for d in dilation):
        if all(s == 1 for s in stride):
            got = _stride1_adjoint(a, weight, padding, groups, in_spatial)
        elif _phases_pay(kernel, stride, cig, length):
            got = _phase_split_adjoint(a, weight, stride, padding, groups, in_spatial)
        else:
            got = None
        if got is not None:
            return got
    return _strided_adds(a, weight, stride, padding, dilation, groups, in_spatial)


def _strided_adds(a: np.ndarray, weight: np.ndarray, stride, padding, dilation, groups: int,
                  in_spatial: tuple[int, ...]) -> np.ndarray:
    """``conv_adjoint`` for any geometry: ``W^T`` times the rows, a few kernel offsets per GEMM, each
    offset's contributions added into the uncropped input in one strided slice. Where the products of
    every offset together exceed twice ``_COLS_BYTES``, each GEMM takes every offset for a block of output
    rows (first spatial axis) instead, so that its result stays in cache for its adds and the rows are
    read once per block, not once per offset group (0.74-0.86x the time on the bench CNNs' and CIFAR
    nets' large adjoints). Every input cell sums the same terms either way."""
    m, c_out = a.shape[:2]
    out_sp, kernel = tuple(a.shape[2:]), tuple(weight.shape[2:])
    g, cog, cig = groups, c_out // groups, weight.shape[1]
    length, rest = math.prod(out_sp), math.prod(out_sp[1:])
    dtype = np.result_type(a, weight)  # float64 in sound passes, float32 in the plain heuristic ones
    # the rows innermost: every strided add below runs over long contiguous vectors; the temporaries
    # live in scratch buffers (no fresh pages per call, see semantics.scratch)
    x = scratch("adjoint.x", (g, cog, length, m), dtype)
    np.copyto(x, a.reshape(m, g, cog, length).transpose(1, 2, 3, 0))
    x = x.reshape(g, cog, out_sp[0], rest * m)
    full = tuple((o - 1) * s + (k - 1) * d + 1 for o, s, k, d in zip(out_sp, stride, kernel, dilation))
    ext = tuple(max(f, p + i) for f, p, i in zip(full, padding, in_spatial))
    acc = scratch("adjoint.acc", (g, cig) + ext + (m,), dtype)
    acc.fill(0.0)
    offsets = list(itertools.product(*(range(k) for k in kernel)))
    wt = weight.reshape(g, cog, cig, len(offsets)).transpose(0, 3, 2, 1)  # [g, offset, C_in/g, C_out/g]
    rows_per_block, group = _adds_schedule(g * cig * rest * m * dtype.itemsize, out_sp[0], len(offsets), cig)
    for y0 in range(0, out_sp[0], rows_per_block):
        y1 = min(out_sp[0], y0 + rows_per_block)
        block = x[:, :, y0:y1].reshape(g, cog, (y1 - y0) * rest * m)
        for j0 in range(0, len(offsets), group):
            j1 = min(len(offsets), j0 + group)
            w_part = np.ascontiguousarray(wt[:, j0:j1], dtype=dtype).reshape(g, (j1 - j0) * cig, cog)
            cols = np.matmul(w_part, block, out=scratch("adjoint.cols", (g, (j1 - j0) * cig, block.shape[2]), dtype))
            cols = cols.reshape((g, j1 - j0, cig, y1 - y0) + out_sp[1:] + (m,))
            for j in range(j0, j1):
                first = offsets[j][0] * dilation[0] + y0 * stride[0]
                target = ((slice(None),) * 2 + (slice(first, first + (y1 - y0 - 1) * stride[0] + 1, stride[0]),)
                          + tuple(slice(f * d, f * d + (o - 1) * s + 1, s)
                                  for f, d, o, s in zip(offsets[j][1:], dilation[1:], out_sp[1:], stride[1:])))
                acc[target] += cols[:, j - j0]
    keep = (slice(None),) * 2 + tuple(slice(p, p + i) for p, i in zip(padding, in_spatial))
    out = acc[keep].reshape((g * cig,) + tuple(in_spatial) + (m,))
    return np.moveaxis(out, -1, 0).copy()  # a fresh array, never a view of the scratch buffer


# the products of one GEMM of the strided adds: at most this many bytes when they would exceed twice that
# at once (measured: 1 MiB pieces stay in a 2 MiB L2 while their adds read them back)
_COLS_BYTES = 1 << 20


def _adds_schedule(tap_row_bytes: int, rows: int, taps: int, cig: int) -> tuple[int, int]:
    """(output rows per block, kernel offsets per GEMM) of ``_strided_adds``; ``tap_row_bytes`` is one
    offset's products for one output row. Small products: the whole map, offsets for about 8 GEMM rows
    (offsets x input channels) at a time, all when that is few; large ones: every offset, in blocks of
    output rows whose products fit ``_COLS_BYTES`` (one row at least). A single row's products above 4
    times that keep the first schedule, so that a block never holds more than 4 MiB of products."""
    row_bytes = tap_row_bytes * taps
    if row_bytes * rows <= 2 * _COLS_BYTES or row_bytes > 4 * _COLS_BYTES:
        return max(rows, 1), taps if cig * taps <= 32 else max(1, 8 // cig)  # (an empty map: no block)
    return max(1, _COLS_BYTES // row_bytes), taps


def _stride1_adjoint(a: np.ndarray, weight: np.ndarray, padding, groups: int, in_spatial: tuple[int, ...],
                     into: np.ndarray | None = None) -> np.ndarray | None:
    """``conv_adjoint`` of a stride-1, dilation-1 convolution as the forward correlation of ``a`` with the
    flipped, channel-swapped kernel (padding k - 1 - p before, in - out + p after) through
    ``conv_gemm``'s staged product: contiguous copies and one GEMM instead of a strided add per kernel
    offset, about twice as fast. The same terms are summed (a padding cell contributes an exact zero),
    so the order-independent rounding bound of the callers holds. Written into ``into`` when given (a
    view of the caller's result). None when a padding exceeds k - 1, or the input ends before the last
    window does."""
    kernel, out_sp = tuple(weight.shape[2:]), tuple(a.shape[2:])
    before = tuple(k - 1 - p for k, p in zip(kernel, padding))
    after = tuple(i - o + p for i, o, p in zip(in_spatial, out_sp, padding))
    if min(before + after) < 0:
        return None
    c_out, cig = weight.shape[0], weight.shape[1]
    cog = c_out // groups
    # [C_in, C_out / g, *kernel]: group j's block transposed, every kernel axis reversed
    flipped = weight[(slice(None), slice(None)) + (slice(None, None, -1),) * len(kernel)]
    swapped = flipped.reshape((groups, cog, cig) + kernel).swapaxes(1, 2).reshape((groups * cig, cog) + kernel)
    attrs = {"kernel": kernel, "stride": (1,) * len(kernel), "dilation": (1,) * len(kernel), "padding": before,
             "padding_after": after}
    plan = conv_plan(a.shape, attrs)
    dtype = np.result_type(a, weight)
    staged = stage(a, plan, dtype, "adjoint.staged")
    products = conv_products(staged, plan, np.ascontiguousarray(swapped, dtype=dtype), groups, "adjoint.out")
    if into is None:
        return products.copy()
    np.copyto(into, products)
    return into


def _phases_pay(kernel: tuple[int, ...], stride, cig: int, length: int) -> bool:
    """Whether the phase split beats the strided adds, measured on CIFAR ResNet patch passes (one
    thread): always when no phase reads two taps (a 1x1 or 2x2 kernel at stride 2: 0.3-0.6x the time,
    the strided adds clearing and copying an input four times the size of what they add), else for
    at least 16 input channels a group and 1024 channel-cells (0.6-0.8x), the staged copies costing
    more than they save below that (up to 4x on 3 channels)."""
    if all(k <= s for k, s in zip(kernel, stride)):
        return True
    return cig >= 16 and cig * length >= 1024


def _phase_split_adjoint(a: np.ndarray, weight: np.ndarray, stride, padding, groups: int,
                         in_spatial: tuple[int, ...]) -> np.ndarray | None:
    """``conv_adjoint`` of a strided, dilation-1 convolution, one stride phase of the input at a time.

    Input cell i receives a[o] W[k] for o s + k = i + p, so the cells of one phase, (i + p) mod s = f,
    read only the taps k = f + s t: on that phase's sub-grid the adjoint is the stride-1 adjoint of the
    sub-kernel W[f::s] (``_stride1_adjoint``, with padding j0 = (i0 + p - f) / s for the phase's first
    cell i0), written straight into its strided view of the result. The same terms are summed as by the
    strided adds (an exact zero for a cell no tap reaches), so the callers' rounding bound holds; the
    strided adds and the copy out of their rows-last buffer are gone. None when a phase does not fit
    the stride-1 form (the caller then takes the strided adds)."""
    kernel = tuple(weight.shape[2:])
    out = np.zeros((a.shape[0], weight.shape[1] * groups) + tuple(in_spatial), np.result_type(a, weight))
    for phase in itertools.product(*(range(s) for s in stride)):
        first = tuple((f - p) % s for f, p, s in zip(phase, padding, stride))
        cells = tuple(len(range(i0, n, s)) for i0, n, s in zip(first, in_spatial, stride))
        taps = tuple(len(range(f, k, s)) for f, k, s in zip(phase, kernel, stride))
        if 0 in cells or 0 in taps:
            continue  # no cell of this phase, or no tap reaches it (a stride beyond the kernel): zeros
        sub = weight[(slice(None), slice(None)) + tuple(slice(f, None, s) for f, s in zip(phase, stride))]
        pad = tuple((i0 + p - f) // s for i0, p, f, s in zip(first, padding, phase, stride))
        view = out[(slice(None), slice(None)) + tuple(slice(i0, None, s) for i0, s in zip(first, stride))]
        if _stride1_adjoint(a, sub, pad, groups, cells, into=view) is None:
            return None
    return out


# the dense matrix is used when it holds at most this many entries (512 KiB of float64, cached) and at
# most _DENSE_WASTE times the products the convolution makes (its other entries are zeros), for at
# least _DENSE_MIN_ROWS rows
_DENSE_ENTRIES = 1 << 16
_DENSE_WASTE = 6.5
_DENSE_MIN_ROWS = 64


def _dense_pays(m: int, c_out: int, out_sp: tuple[int, ...], kernel: tuple[int, ...], cig: int, groups: int,
                in_spatial: tuple[int, ...]) -> bool:
    """Whether ``_dense_adjoint`` beats the strided strategies, measured on the patch passes of the bench
    CNNs and the CIFAR ResNets (one thread): 0.26-0.9x their time where the dense matrix has at most
    6.25 times the entries the kernel fills (a 4x4 or 3x3 patch read back through a 4x4 or 3x3 kernel),
    1.8-25x where it has 13 or more (wide maps, 1x1 kernels): the GEMM's zeros then cost more than the
    strided adds' passes over the rows. A grouped convolution's matrix is zero off its groups' blocks."""
    entries = c_out * math.prod(out_sp) * cig * groups * math.prod(in_spatial)
    return (m >= _DENSE_MIN_ROWS and entries <= _DENSE_ENTRIES
            and math.prod(in_spatial) * groups <= _DENSE_WASTE * math.prod(kernel))


def _dense_adjoint(a: np.ndarray, weight: np.ndarray, stride: tuple[int, ...], padding: tuple[int, ...],
                   dilation: tuple[int, ...], groups: int, in_spatial: tuple[int, ...]) -> np.ndarray:
    """``conv_adjoint`` as one product of the rows with the transposed convolution's matrix
    ``[C_out * out cells, C_in * in cells]``. Each of its entries is one weight or an exact zero (a
    window's taps land on distinct cells), so every output sums the same non-zero terms as the other
    strategies plus exact zeros, which leave a floating-point sum unchanged."""
    dtype = np.result_type(a, weight)
    matrix = _dense_matrix(np.ascontiguousarray(weight, dtype=dtype).tobytes(), weight.shape, dtype.str,
                           tuple(a.shape[1:]), stride, padding, dilation, groups, in_spatial)
    m = a.shape[0]
    out = np.matmul(np.asarray(a, dtype=dtype).reshape(m, matrix.shape[0]), matrix)
    return out.reshape((m, weight.shape[1] * groups) + in_spatial)


@functools.lru_cache(maxsize=64)
def _dense_matrix(weight_bytes: bytes, shape: tuple[int, ...], dtype: str, a_tail: tuple[int, ...],
                  stride: tuple[int, ...], padding: tuple[int, ...], dilation: tuple[int, ...], groups: int,
                  in_spatial: tuple[int, ...]) -> np.ndarray:
    """The matrix of ``_dense_adjoint`` (read-only), from the strided adds applied to the identity: each
    entry is a single weight, exactly. Cached by the weight's bytes, so a changed weight is a new key."""
    weight = np.frombuffer(weight_bytes, dtype=np.dtype(dtype)).reshape(shape)
    rows = math.prod(a_tail)
    identity = np.eye(rows, dtype=weight.dtype).reshape((rows,) + a_tail)
    matrix = _strided_adds(identity, weight, stride, padding, dilation, groups, in_spatial).reshape(rows, -1)
    matrix.setflags(write=False)
    return matrix
