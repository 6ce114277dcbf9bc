"""Rearrangement lowerings composed from layout, indexing and elementwise ops: GLU, pixel (un)shuffle,
flip, roll, triangles, outer products, differences, repeat_interleave. Each is exact data movement
(or the op's defining arithmetic), so the result equals PyTorch's entry for entry.
"""

from __future__ import annotations

from typing import Any

import torch

from torchlean_bridge.ops import BOOL, FLOAT, INT64

from .common import Known, NotLowerable, Sym, normalize_axis
from .lowerer import Lowerer
from .ops_elementwise import is_tensor, mul, sub, unary, where
from .ops_index import gather_axis
from .ops_layout import cat, expand, permute, reshape, shape_arg, slice_axis, unsqueeze
from .targets import lowers, register

Cx = Lowerer


@lowers(aten="glu.default", fx="F.glu")
def glu(cx: Cx, input: Any, dim: int = -1) -> Sym:
    """``a * sigmoid(b)`` for the two halves a, b of ``dim``."""
    ax = normalize_axis(dim, cx.rank(input))
    n = cx.shape(input)[ax]
    if n % 2:
        raise NotLowerable(f"glu halves dim {dim} of odd size {n}")
    a, b = slice_axis(cx, input, ax, 0, n // 2), slice_axis(cx, input, ax, n // 2, n)
    return mul(cx, a, unary("sigmoid")(cx, b))



# -- rearrangements ---------------------------------------------------------------------------------
@lowers(aten="pixel_shuffle.default", fx="torch.pixel_shuffle F.pixel_shuffle")
def pixel_shuffle(cx: Cx, input: Any, upscale_factor: int) -> Any:
    """(*, C r^2, H, W) -> (*, C, H r, W r): split channels, interleave, merge."""
    r = int(upscale_factor)
    *lead, c, h, w = cx.shape(input)
    if c % (r * r):
        raise NotLowerable(f"pixel_shuffle: {c} channels are not divisible by {r}^2")
    k = len(lead)
    x = reshape(cx, input, lead + [c // (r * r), r, r, h, w])
    x = permute(cx, x, list(range(k)) + [k, k + 3, k + 1, k + 4, k + 2])
    return reshape(cx, x, lead + [c // (r * r), h * r, w * r])


@lowers(aten="pixel_unshuffle.default", fx="torch.pixel_unshuffle F.pixel_unshuffle")
def pixel_unshuffle(cx: Cx, input: Any, downscale_factor: int) -> Any:
    """(*, C, H r, W r) -> (*, C r^2, H, W): the inverse rearrangement of pixel_shuffle."""
    r = int(downscale_factor)
    *lead, c, h, w = cx.shape(input)
    if h % r or w % r:
        raise NotLowerable(f"pixel_unshuffle: spatial size {h}x{w} is not divisible by {r}")
    k = len(lead)
    x = reshape(cx, input, lead + [c, h // r, r, w // r, r])
    x = permute(cx, x, list(range(k)) + [k, k + 2, k + 4, k + 1, k + 3])
    return reshape(cx, x, lead + [c * r * r, h // r, w // r])


@lowers(aten="flip.default", fx="torch.flip", methods="flip")
def flip(cx: Cx, input: Any, *args: Any, dims: Any = None) -> Any:
    """A gather with the constant reversed index per flipped axis."""
    x = input
    r = cx.rank(input)
    for ax in sorted({normalize_axis(d, r) for d in shape_arg(args if dims is None else (dims,))}):
        n = cx.shape(input)[ax]
        if n > 1:
            x = gather_axis(cx, x, ax, Known(torch.arange(n - 1, -1, -1), folded=True))
    return x


@lowers(aten="fliplr.default", fx="torch.fliplr", methods="fliplr")
def fliplr(cx: Cx, input: Any) -> Any:
    return flip(cx, input, 1)


@lowers(aten="flipud.default", fx="torch.flipud", methods="flipud")
def flipud(cx: Cx, input: Any) -> Any:
    return flip(cx, input, 0)


@lowers(aten="roll.default", fx="torch.roll", methods="roll")
def roll(cx: Cx, input: Any, shifts: Any, dims: Any = None) -> Any:
    """Each shifted axis is the concat of its last ``s`` entries and the rest; no dims rolls the
    flattened tensor and restores the shape."""
    shifts = [shifts] if isinstance(shifts, int) else [int(s) for s in shifts]
    dims = [] if dims is None else [dims] if isinstance(dims, int) else [int(d) for d in dims]
    if not dims:
        if len(shifts) != 1:
            raise NotLowerable(f"roll with {len(shifts)} shifts and no dims")
        return reshape(cx, roll(cx, reshape(cx, input, [-1]), shifts, [0]), list(cx.shape(input)))
    if len(shifts) != len(dims):
        raise NotLowerable(f"roll with {len(shifts)} shifts for {len(dims)} dims")
    x = input
    for s, d in zip(shifts, dims):
        ax = normalize_axis(d, cx.rank(input))
        n = cx.shape(input)[ax]
        k = s % n if n else 0
        if k:
            x = cat(cx, [slice_axis(cx, x, ax, n - k, n), slice_axis(cx, x, ax, 0, n - k)], ax)
    return x


def triangle(which: str):
    """tril/triu: ``where(mask, x, 0)`` with the constant mask of the last two axes (a product
    would turn inf*0 into NaN)."""

    def lower(cx: Cx, input: Any, diagonal: int = 0) -> Sym:
        s = cx.shape(input)
        if len(s) < 2:
            raise NotLowerable(f"{which} of a rank-{len(s)} tensor (needs at least 2 dims)")
        rows, cols = torch.arange(s[-2]).unsqueeze(1), torch.arange(s[-1]).unsqueeze(0)
        offset = cols - rows
        mask = offset <= int(diagonal) if which == "tril" else offset >= int(diagonal)
        zero: Any = {BOOL: False, INT64: 0, FLOAT: 0.0}[cx.etype(input)]
        return where(cx, Known(mask, folded=True), input, zero)

    return lower


register(triangle("tril"), aten="tril.default", fx="torch.tril", methods="tril")
register(triangle("triu"), aten="triu.default", fx="torch.triu", methods="triu")


@lowers(aten="outer.default", fx="torch.outer", methods="outer")
def outer(cx: Cx, input: Any, vec2: Any) -> Sym:
    """``input[:, None] * vec2[None, :]``."""
    if cx.rank(input) != 1 or cx.rank(vec2) != 1:
        raise NotLowerable(f"outer of ranks {cx.rank(input)} and {cx.rank(vec2)} (needs two vectors)")
    return mul(cx, reshape(cx, input, [-1, 1]), reshape(cx, vec2, [1, -1]))


@lowers(aten="diff.default", fx="torch.diff", methods="diff")
def diff(cx: Cx, input: Any, n: int = 1, dim: int = -1, prepend: Any = None, append: Any = None) -> Any:
    """``x[1:] - x[:-1]`` along ``dim``, ``n`` times, after concatenating prepend/append tensors."""
    if cx.etype(input) == BOOL:
        raise NotLowerable("diff of a bool tensor (PyTorch takes a logical xor)")
    ax = normalize_axis(dim, cx.rank(input))
    parts = [v for v in (prepend, input, append) if v is not None]
    if any(not is_tensor(v) or cx.rank(v) != cx.rank(input) for v in parts):
        raise NotLowerable("diff with a scalar prepend/append (only tensors of the input's rank)")
    x = cat(cx, parts, ax)
    for _ in range(int(n)):
        m = cx.shape(x)[ax]
        if m == 0:
            break
        x = sub(cx, slice_axis(cx, x, ax, 1, m), slice_axis(cx, x, ax, 0, m - 1))
    return x


@lowers(aten="repeat_interleave.self_int", fx="torch.repeat_interleave", methods="repeat_interleave")
def repeat_interleave(cx: Cx, input: Any, repeats: Any = None, dim: int | None = None, *,
                      output_size: Any = None) -> Any:
    """Each entry repeated ``repeats`` times along ``dim`` (flattened when None): unsqueeze,
    broadcast, reshape."""
    k = cx.known(repeats) if is_tensor(repeats) else None
    if k is not None and k.numel() == 1 and not (isinstance(repeats, Known) and repeats.pinned):
        repeats = int(k.item())
    if not isinstance(repeats, int):
        raise NotLowerable("repeat_interleave with tensor repeats (a per-entry count; only an int repeats)")
    x = input
    if dim is None:
        x, dim = reshape(cx, input, [-1]), 0
    s = list(cx.shape(x))
    ax = normalize_axis(dim, len(s))
    x = unsqueeze(cx, x, ax + 1)
    x = expand(cx, x, s[:ax + 1] + [repeats] + s[ax + 1:])
    return reshape(cx, x, s[:ax] + [s[ax] * repeats] + s[ax + 1:])
