"""ONNX ``DFT`` and ``STFT`` as exact compositions: a discrete Fourier transform is linear, so it is a
``matmul`` by constant cosine and sine matrices built at import (in binary64, angles reduced modulo the
length first) on the real and imaginary parts.

Both follow onnx's reference (numpy.fft): the signal is zero-padded or truncated to ``dft_length``,
``onesided`` keeps bins 0..N/2, ``inverse`` divides by N with the conjugate kernel, and inverse with
onesided is numpy's irfft (a real output, each bin 0 < k < N/2 counted twice for its conjugate).
``STFT`` gathers the frames, multiplies by the window and transforms each frame.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from torchlean_bridge.ops import FLOAT

from .context import OnnxContext, Value

__all__ = ["HANDLERS", "OPSETS", "EMITS"]

Handler = Callable[[OnnxContext], list[Value]]

_MAX_MATRIX = 1 << 22  # entries of one DFT matrix (n_in x bins): 32 MB in binary64


def _const(ctx: OnnxContext, value: np.ndarray) -> int:
    return ctx.b.const(np.asarray(value), source=ctx.source, folded=True)


def _kernels(ctx: OnnxContext, rows: int, n: int, cols: int, inverse: bool, half: bool) -> tuple[np.ndarray, ...]:
    """cos and sin of 2 pi j k / n, j < rows (input positions), k < cols (output bins). Input rows past
    the transform (j >= n; for irfft, bins past n/2) are zero rows: the truncation. ``half``: irfft's
    weights, 2 for the bins that stand for a conjugate pair, 1 for bin 0 and bin n/2."""
    if n < 1 or rows * cols > _MAX_MATRIX:
        raise ctx.fail(f"a DFT of length {n} over {rows} inputs and {cols} bins (at most {_MAX_MATRIX} matrix "
                       "entries)")
    used = min(rows, n // 2 + 1 if half else n)
    j = np.arange(used, dtype=np.int64)[:, None]
    k = np.arange(cols, dtype=np.int64)[None, :]
    angle = 2 * np.pi * ((j * k) % n) / n
    weight = np.where((j == 0) | ((n % 2 == 0) & (j == n // 2)), 1.0, 2.0) if half else np.ones_like(angle)
    scale = weight / n if inverse else weight
    cos, sin = np.zeros((rows, cols)), np.zeros((rows, cols))
    cos[:used], sin[:used] = np.cos(angle) * scale, np.sin(angle) * scale
    return cos, sin


def _transform_last(ctx: OnnxContext, re: int, im: int | None, n: int, inverse: bool, onesided: bool) -> list[int]:
    """The DFT along the last axis of ``re`` (+ i ``im``): [..., n_in] -> real and imaginary parts [..., bins]
    (the real part alone for irfft)."""
    n_in = ctx.b.shape(re)[-1]
    used = min(n_in, n // 2 + 1 if inverse and onesided else n)
    if 0 < used < n_in:  # truncation drops the samples past the transform (zero kernel rows would turn an
        last = len(ctx.b.shape(re)) - 1  # infinite dropped sample into 0 * inf = NaN)
        trim = lambda v: ctx.add("slice", [v], {"axes": (last,), "starts": (0,), "ends": (used,),  # noqa: E731
                                                "steps": (1,)})
        re, im, n_in = trim(re), (trim(im) if im is not None else None), used
    if inverse and onesided:  # irfft: input bins 0..n/2 (Hermitian half), a real output of length n
        cos, sin = _kernels(ctx, n_in, n, n, True, True)
        out = ctx.add("matmul", [re, _const(ctx, cos)])
        if im is not None:  # Re((R + iI)(C + iS)) = RC - IS
            out = ctx.elementwise("sub", [out, ctx.add("matmul", [im, _const(ctx, sin)])])
        return [out]
    bins = n // 2 + 1 if onesided else n
    cos, sin = _kernels(ctx, n_in, n, bins, inverse, False)
    rc, rs = ctx.add("matmul", [re, _const(ctx, cos)]), ctx.add("matmul", [re, _const(ctx, sin)])
    if im is None:
        return [rc, rs if inverse else ctx.add("neg", [rs])]
    ic, is_ = ctx.add("matmul", [im, _const(ctx, cos)]), ctx.add("matmul", [im, _const(ctx, sin)])
    if inverse:  # (R + iI)(C + iS) / n
        return [ctx.elementwise("sub", [rc, is_]), ctx.elementwise("add", [rs, ic])]
    return [ctx.elementwise("add", [rc, is_]), ctx.elementwise("sub", [ic, rs])]  # (R + iI)(C - iS)


def _dft_on(ctx: OnnxContext, x: int, axis: int, n: int | None, inverse: bool, onesided: bool) -> int:
    """DFT of ``x`` ([..., 1 or 2], real or interleaved complex) along ``axis``."""
    s = ctx.b.shape(x)
    rank = len(s)
    if s[-1] not in (1, 2):
        raise ctx.fail(f"last axis of extent {s[-1]} (1: real, 2: complex)")
    if not 0 <= axis < rank - 1:
        raise ctx.fail(f"axis {axis} for a rank-{rank} input (the last axis holds the complex parts)")
    if n is None:
        n = 2 * (s[axis] - 1) if inverse and onesided else s[axis]
    # move ``axis`` last, the complex parts first: [2 or 1, ..., n_in]
    perm = (rank - 1,) + tuple(i for i in range(rank - 1) if i != axis) + (axis,)
    moved = ctx.add("permute", [x], {"perm": perm})
    inner = tuple(ctx.b.shape(moved)[1:])
    part = lambda c: ctx.b.reshape(ctx.add("slice", [moved], {"axes": (0,), "starts": (c,), "ends": (c + 1,),  # noqa: E731
                                                              "steps": (1,)}), inner, ctx.source)
    re, im = part(0), (part(1) if s[-1] == 2 else None)
    parts = _transform_last(ctx, re, im, n, inverse, onesided)
    out_inner = ctx.b.shape(parts[0])
    stacked = ctx.add("concat", [ctx.b.reshape(p, (1,) + tuple(out_inner), ctx.source) for p in parts], {"axis": 0}) \
        if len(parts) > 1 else ctx.b.reshape(parts[0], (1,) + tuple(out_inner), ctx.source)
    back = tuple(int(i) for i in np.argsort(perm))
    return ctx.add("permute", [stacked], {"perm": back})


def _scalar(ctx: OnnxContext, i: int, what: str) -> int | None:
    if not ctx.has_input(i):
        return None
    v = np.asarray(ctx.static(i, what)).reshape(-1)
    if v.size != 1:
        raise ctx.fail(f"{what} has {v.size} values (a scalar)")
    return int(v[0])


def _dft(ctx: OnnxContext) -> list[Value]:
    if ctx.dtype(0) != FLOAT:
        raise ctx.fail(f"DFT of {ctx.onnx_type(ctx.node.input[0])} input")
    rank = ctx.rank(0)
    n = _scalar(ctx, 1, "dft_length")
    if ctx.opset >= 20:
        a = _scalar(ctx, 2, "axis")
        axis = -2 if a is None else a
    else:
        axis = int(ctx.attr("axis", 1))
    if not -rank <= axis < rank:
        raise ctx.fail(f"axis {axis} for rank {rank}")
    return [_dft_on(ctx, ctx.operand(0), axis % rank, n, bool(ctx.attr("inverse", 0)), bool(ctx.attr("onesided", 0)))]


def _stft(ctx: OnnxContext) -> list[Value]:
    """Frames ``[batch, frames, frame_length, parts]`` gathered at f * frame_step, windowed, transformed."""
    if ctx.dtype(0) != FLOAT:
        raise ctx.fail(f"STFT of {ctx.onnx_type(ctx.node.input[0])} signal")
    s = ctx.shape(0)
    if len(s) != 3 or s[2] not in (1, 2):
        raise ctx.fail(f"signal {list(s)} (expected [batch, length, 1 or 2])")
    step = _scalar(ctx, 1, "frame_step")
    length = _scalar(ctx, 3, "frame_length")
    if length is None:
        length = ctx.shape(2)[0] if ctx.has_input(2) else s[1]
    if ctx.has_input(2) and ctx.shape(2) != (length,):
        raise ctx.fail(f"window {list(ctx.shape(2))} for frame_length {length}")
    if step is None or step < 1 or not 1 <= length <= s[1]:
        raise ctx.fail(f"frame_step {step} and frame_length {length} for a signal of length {s[1]}")
    frames = 1 + (s[1] - length) // step
    if frames * length > ctx.max_elements:
        raise ctx.fail(f"{frames} frames of {length} samples exceed the limit of {ctx.max_elements} elements")
    table = np.arange(frames, dtype=np.int64)[:, None] * step + np.arange(length, dtype=np.int64)[None, :]
    x = ctx.add("gather", [ctx.operand(0), ctx.b.const(table, source=ctx.source, folded=True)], {"axis": 1})
    if ctx.has_input(2):
        x = ctx.elementwise("mul_elem", [x, ctx.b.reshape(ctx.operand(2), (1, 1, length, 1), ctx.source)])
    return [_dft_on(ctx, x, 2, length, False, bool(ctx.attr("onesided", 1)))]


HANDLERS: dict[str, Handler] = {"DFT": _dft, "STFT": _stft}
# DFT-17 (axis attribute, default 1), DFT-20 (axis input, default -2); inverse with onesided is irfft in both
OPSETS: dict[str, tuple[int, int]] = {"DFT": (17, 20), "STFT": (17, 17)}
EMITS = frozenset({"permute", "slice", "reshape", "matmul", "neg", "add", "sub", "concat", "gather", "mul_elem",
                   "broadcast_to", "const"})
