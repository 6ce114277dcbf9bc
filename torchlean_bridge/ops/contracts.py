"""Shared shape arithmetic: the one place where broadcast, matmul, window and axis rules live.

Shape inference (the registry's rules), evaluation and the importers all call these functions, so
the shape a rule promises and the shape an evaluator produces cannot disagree (TorchLean's
``NN/IR/OpContracts.lean`` plays the same role). Every failure raises ``ShapeRuleError`` with the
bare TorchLean rule message.
"""

from __future__ import annotations

import contextvars
import math
from contextlib import contextmanager
from typing import Callable, Iterator, Sequence

from ..errors import ShapeRuleError

__all__ = [
    "Shape",
    "fmt_shape",
    "fmt_array",
    "numel",
    "broadcast_shapes",
    "can_broadcast_to",
    "matmul_dims",
    "window_out_dim",
    "v1_pool_out_dim",
    "conv_out_shape",
    "conv_transpose_full_dim",
    "conv_transpose_out_shape",
    "reduce_shape",
    "concat_shape",
    "slice_extent",
    "check_axis",
    "resolve_reshape",
    "MAX_RANK",
    "DEFAULT_ELEMENT_LIMIT",
    "element_limit",
    "current_element_limit",
    "check_buffer",
    "window_buffers",
    "check_per_axis",
]

Shape = tuple[int, ...]

# numpy holds at most 64 axes; a declared rank above this is refused where it is read
MAX_RANK = 32
# the most elements one declared shape, or one buffer an op's evaluation allocates, may have
DEFAULT_ELEMENT_LIMIT = 2 ** 31
_ELEMENT_LIMIT: contextvars.ContextVar[int] = contextvars.ContextVar("element_limit", default=DEFAULT_ELEMENT_LIMIT)


@contextmanager
def element_limit(limit: int) -> Iterator[int]:
    """Run a block (``check``, evaluation) with another element limit for shapes and buffers."""
    token = _ELEMENT_LIMIT.set(int(limit))
    try:
        yield int(limit)
    finally:
        _ELEMENT_LIMIT.reset(token)


def current_element_limit() -> int:
    return _ELEMENT_LIMIT.get()


def check_buffer(elements: int, what: str, tag: str) -> None:
    """Refuse, in the shape rule, a buffer evaluation would allocate past the element limit: the rule
    runs in ``check`` before any semantics, so the allocation never happens."""
    limit = _ELEMENT_LIMIT.get()
    if elements > limit:
        raise ShapeRuleError(f"{tag}: evaluating it needs {what} of {elements} elements, above the limit of {limit}")


def window_buffers(p: Shape, out: Shape, kernel: Sequence[int], stride: Sequence[int], padding: Sequence[int],
                   padding_after: Sequence[int], tag: str) -> None:
    """Buffers of a pooling window over the trailing ``len(kernel)`` axes: the padded input, the
    per-axis window tables (``out * kernel``) and the window reads (``numel(out) * prod(kernel)``)."""
    r = len(kernel)
    check_per_axis(tag, r, stride=stride, padding=padding, padding_after=padding_after)
    lead, spatial, out_spatial = p[:len(p) - r], p[len(p) - r:], out[len(out) - r:]
    # (ceil mode may pad up to one stride more on the far side)
    padded = numel(lead) * math.prod(n + b + a + s for n, b, a, s in zip(spatial, padding, padding_after, stride))
    check_buffer(padded, "a padded input", tag)
    for o, k in zip(out_spatial, kernel):
        check_buffer(o * k, "a window table", tag)
    check_buffer(numel(out) * math.prod(kernel), "window reads", tag)


def fmt_shape(shape: Sequence[int]) -> str:
    """Lean's ``repr`` of a ``List Nat``: ``[1, 4]``, scalar ``[]``."""
    return "[" + ", ".join(str(int(d)) for d in shape) + "]"


def fmt_array(values: Sequence[int]) -> str:
    """Lean's ``repr`` of an ``Array Nat``: ``#[1, 0]``."""
    return "#[" + ", ".join(str(int(v)) for v in values) + "]"


def numel(shape: Sequence[int]) -> int:
    return math.prod(int(d) for d in shape)


def check_axis(axis: int, rank: int) -> None:
    """TorchLean's shared axis guard (softmax, layernorm, concat, conv, batch norm)."""
    if not 0 <= axis < rank:
        raise ShapeRuleError(f"invalid axis {axis} for rank {rank}")


def _broadcast_dim(a: int, b: int) -> int | None:
    if a == b:
        return a
    if a == 1:
        return b
    if b == 1:
        return a
    return None


def _right_aligned(a: Sequence[int], b: Sequence[int]) -> zip:
    """Extent pairs of two shapes aligned from the right, the shorter padded with 1s."""
    rank = max(len(a), len(b))
    return zip((1,) * (rank - len(a)) + tuple(a), (1,) * (rank - len(b)) + tuple(b))


def broadcast_shapes(a: Shape, b: Shape, op: str = "broadcast") -> Shape:
    """NumPy right-aligned broadcasting of two shapes (used by importers and ext ops)."""
    out = []
    for x, y in _right_aligned(a, b):
        d = _broadcast_dim(x, y)
        if d is None:
            raise ShapeRuleError(f"{op}: shapes {fmt_shape(a)} and {fmt_shape(b)} do not broadcast")
        out.append(d)
    return tuple(out)


def can_broadcast_to(src: Shape, dst: Shape) -> bool:
    """``broadcast_to`` legality: right-aligned, each source extent equal or 1 (1 may go to 0)."""
    if len(src) > len(dst):
        return False
    padded = (1,) * (len(dst) - len(src)) + tuple(src)
    return all(s == d or s == 1 for s, d in zip(padded, dst))


def matmul_dims(left: Shape, right: Shape) -> Shape:
    """``torch.matmul`` shape rule, TorchLean's ``OpContracts.matmulDims``."""
    if len(left) == 0 or len(right) == 0:
        raise ShapeRuleError(
            f"matmul: expected non-scalar inputs, got {fmt_shape(left)} and {fmt_shape(right)}")
    if len(left) == 1 and len(right) == 1:
        if left[0] != right[0]:
            raise ShapeRuleError(f"matmul: inner dims mismatch: {left[0]} vs {right[0]}")
        return ()
    if len(left) == 1:
        if left[0] != right[-2]:
            raise ShapeRuleError(f"matmul: inner dims mismatch: {left[0]} vs {right[-2]}")
        return tuple(right[:-2]) + (right[-1],)
    if len(right) == 1:
        if left[-1] != right[0]:
            raise ShapeRuleError(f"matmul: inner dims mismatch: {left[-1]} vs {right[0]}")
        return tuple(left[:-1])
    if left[-1] != right[-2]:
        raise ShapeRuleError(f"matmul: inner dims mismatch: {left[-1]} vs {right[-2]}")
    batch = []
    for x, y in _right_aligned(left[:-2], right[:-2]):
        d = _broadcast_dim(x, y)
        if d is None:
            raise ShapeRuleError(f"matmul: incompatible batch dimensions {x} and {y}")
        batch.append(d)
    return tuple(batch) + (left[-2], right[-1])


def window_out_dim(size: int, kernel: int, stride: int, pad_before: int, pad_after: int,
                   dilation: int = 1, ceil_mode: bool = False) -> int | None:
    """Sliding-window output extent; None when the window does not fit the padded input."""
    eff = dilation * (kernel - 1) + 1
    span = size + pad_before + pad_after
    if span < eff:
        return None
    if not ceil_mode:
        return (span - eff) // stride + 1
    out = -(-(span - eff) // stride) + 1
    # PyTorch/ONNX rule: the last window must start inside the input or left padding.
    if (out - 1) * stride >= size + pad_before:
        out -= 1
    return out


def v1_pool_out_dim(size: int, kernel: int, stride: int, pad: int) -> int:
    """TorchLean's ``poolOutDim``: 0 for empty input, zero kernel or pad > kernel // 2."""
    if size == 0 or kernel == 0 or pad > kernel // 2:
        return 0
    if size + 2 * pad < kernel:
        return 0
    return (size + 2 * pad - kernel) // stride + 1


def check_per_axis(tag: str, spatial_rank: int, **lists: Sequence[int]) -> None:
    """Every per-axis attribute has one entry per spatial axis (importers build attrs from files)."""
    limit = _ELEMENT_LIMIT.get()
    for name, values in lists.items():
        if len(values) != spatial_rank:
            raise ShapeRuleError(f"{tag}: {name} has {len(values)} entries, expected spatial rank {spatial_rank}")
        for v in values:
            if v > limit:  # no extent can be larger, and strided views would overflow their byte steps
                raise ShapeRuleError(f"{tag}: {name} {fmt_shape(values)} has an entry above the limit of {limit}")


def _conv_shape(p: Shape, extent: Callable[[int, int], int], *, spatial_rank: int, kernel: Sequence[int],
                stride: Sequence[int], dilation: Sequence[int], groups: int, channel_axis: int, in_channels: int,
                out_channels: int, tag: str) -> Shape:
    """The checks convolution and transposed convolution share, in TorchLean's order (channels, rank,
    then per spatial axis kernel/stride/dilation before that axis's ``extent(k, axis)``)."""
    if in_channels <= 0:
        raise ShapeRuleError(f"{tag}: inChannels must be > 0")
    if out_channels <= 0:
        raise ShapeRuleError(f"{tag}: outChannels must be > 0")
    if groups <= 0:
        raise ShapeRuleError(f"{tag}: groups must be > 0")
    if in_channels % groups:
        raise ShapeRuleError(f"{tag}: in_channels={in_channels} is not divisible by groups={groups}")
    if out_channels % groups:
        raise ShapeRuleError(f"{tag}: out_channels={out_channels} is not divisible by groups={groups}")
    check_axis(channel_axis, len(p))
    if p[channel_axis] != in_channels:
        raise ShapeRuleError(f"{tag}: input-channel mismatch: op={in_channels} vs input={p[channel_axis]}")
    n_spatial = len(p) - channel_axis - 1
    if len(kernel) != n_spatial or spatial_rank != n_spatial:
        raise ShapeRuleError(f"{tag}: kernel rank {len(kernel)} does not match the {n_spatial} "
                             f"spatial axes after channel axis {channel_axis}")
    out = []
    for k, axis in enumerate(range(channel_axis + 1, len(p))):
        if kernel[k] <= 0:
            raise ShapeRuleError(f"{tag}: axis {axis} kernel must be > 0")
        if stride[k] <= 0:
            raise ShapeRuleError(f"{tag}: axis {axis} stride must be > 0")
        if dilation[k] <= 0:
            raise ShapeRuleError(f"{tag}: axis {axis} dilation must be > 0")
        out.append(extent(k, axis))
    return tuple(p[:channel_axis]) + (out_channels,) + tuple(out)


def conv_out_shape(p: Shape, *, spatial_rank: int, kernel: Sequence[int], stride: Sequence[int],
                   padding: Sequence[int], padding_after: Sequence[int], dilation: Sequence[int],
                   groups: int, channel_axis: int, in_channels: int, out_channels: int,
                   tag: str = "conv") -> Shape:
    """``OpContracts.inferConvConfigOutShape``, checks in TorchLean's order."""
    check_per_axis(tag, spatial_rank, kernel=kernel, stride=stride, padding=padding, padding_after=padding_after,
              dilation=dilation)
    def extent(k: int, axis: int) -> int:
        d = window_out_dim(p[axis], kernel[k], stride[k], padding[k], padding_after[k], dilation[k])
        if d is None:
            eff = dilation[k] * (kernel[k] - 1) + 1
            raise ShapeRuleError(
                f"{tag}: axis {axis} window does not fit padded input: input={p[axis]}, "
                f"padding=({padding[k]}, {padding_after[k]}), effectiveKernel={eff}")
        return d
    out = _conv_shape(p, extent, spatial_rank=spatial_rank, kernel=kernel, stride=stride, dilation=dilation,
                      groups=groups, channel_axis=channel_axis, in_channels=in_channels,
                      out_channels=out_channels, tag=tag)
    # the padded input, and one output row of the im2col matrix (the smallest block it is built in)
    check_buffer(numel(p[:channel_axis + 1]) * math.prod(n + b + a for n, b, a in
                                                           zip(p[channel_axis + 1:], padding, padding_after)),
                 "a padded input", tag)
    check_buffer(in_channels * math.prod(kernel) * numel(out[channel_axis + 2:]), "an im2col block", tag)
    return out


def conv_transpose_full_dim(size: int, kernel: int, stride: int, dilation: int) -> int:
    """Extent of a transposed convolution's uncropped output: input cell ``i`` scatters to
    ``i*stride + f*dilation`` for kernel offsets ``f``."""
    return (size - 1) * stride + dilation * (kernel - 1) + 1


def conv_transpose_out_shape(p: Shape, *, spatial_rank: int, kernel: Sequence[int], stride: Sequence[int],
                             padding: Sequence[int], padding_after: Sequence[int],
                             output_padding: Sequence[int], dilation: Sequence[int], groups: int,
                             channel_axis: int, in_channels: int, out_channels: int,
                             tag: str = "conv_transpose") -> Shape:
    """PyTorch's ``conv_transposeNd`` / ONNX ``ConvTranspose`` extent per spatial axis:
    ``(in - 1)*stride + dilation*(kernel - 1) + 1 - padding - padding_after + output_padding``."""
    check_per_axis(tag, spatial_rank, kernel=kernel, stride=stride, padding=padding, padding_after=padding_after,
              output_padding=output_padding, dilation=dilation)
    def extent(k: int, axis: int) -> int:
        if output_padding[k] >= max(stride[k], dilation[k]):
            raise ShapeRuleError(f"{tag}: axis {axis} output_padding {output_padding[k]} must be smaller than "
                                 f"the stride {stride[k]} or the dilation {dilation[k]}")
        if p[axis] <= 0:
            raise ShapeRuleError(f"{tag}: axis {axis} input extent must be > 0")
        d = (conv_transpose_full_dim(p[axis], kernel[k], stride[k], dilation[k]) - padding[k] - padding_after[k]
             + output_padding[k])
        if d <= 0:
            raise ShapeRuleError(f"{tag}: axis {axis} output extent {d} is not positive (input={p[axis]}, "
                                 f"padding=({padding[k]}, {padding_after[k]}), output_padding={output_padding[k]})")
        return d
    out = _conv_shape(p, extent, spatial_rank=spatial_rank, kernel=kernel, stride=stride, dilation=dilation,
                      groups=groups, channel_axis=channel_axis, in_channels=in_channels,
                      out_channels=out_channels, tag=tag)
    # per sample: every (input cell, kernel offset) contribution, and the uncropped output
    spatial = p[channel_axis + 1:]
    check_buffer(out_channels * math.prod(kernel) * numel(spatial), "a contribution matrix", tag)
    check_buffer(out_channels * math.prod(conv_transpose_full_dim(n, k, s, d)
                                          for n, k, s, d in zip(spatial, kernel, stride, dilation)),
                 "an uncropped output", tag)
    return out


def reduce_shape(p: Shape, axes: Sequence[int], keepdim: bool, tag: str) -> Shape:
    """Multi-axis reduction shape; axes must be distinct and in range."""
    for a in axes:
        if not 0 <= a < len(p):
            raise ShapeRuleError(f"{tag}: reduction axis {a} is outside rank {len(p)}")
    if len(set(axes)) != len(axes):
        raise ShapeRuleError(f"{tag}: reduction axes contain duplicates")
    if keepdim:
        return tuple(1 if i in axes else d for i, d in enumerate(p))
    return tuple(d for i, d in enumerate(p) if i not in axes)


def concat_shape(shapes: Sequence[Shape], axis: int) -> Shape:
    """TorchLean's concat rule: same rank, axis in range, equal non-axis extents."""
    first = shapes[0]
    if any(len(s) != len(first) for s in shapes):
        raise ShapeRuleError("concat: rank mismatch")
    check_axis(axis, len(first))
    total = 0
    for s in shapes:
        for i, (e, a) in enumerate(zip(first, s)):
            if i != axis and e != a:
                raise ShapeRuleError(f"concat: non-axis dim mismatch at axis {i}: expected {e}, got {a}")
        total += s[axis]
    return tuple(first[:axis]) + (total,) + tuple(first[axis + 1:])


def slice_extent(size: int, start: int, end: int, step: int) -> int:
    """Extent of ``range(start, end, step)`` over normalized, clamped bounds (step > 0)."""
    if step <= 0:
        raise ShapeRuleError(f"slice: step must be > 0, got {step}")
    if not (0 <= start <= size and 0 <= end <= size):
        raise ShapeRuleError(f"slice: bounds [{start}, {end}) outside extent {size}")
    return max(0, -(-(end - start) // step))


def resolve_reshape(src: Sequence[int], shape: Sequence[int], op: str = "reshape") -> Shape:
    """A reshape target with its one ``-1`` resolved (PyTorch and ONNX meaning; an ambiguous ``-1``
    over zero known elements is refused, as PyTorch does)."""
    out = [int(d) for d in shape]
    if out.count(-1) > 1:
        raise ShapeRuleError(f"{op}: target shape {out} has several -1 entries")
    if -1 in out:
        known = math.prod(d for d in out if d != -1)
        if known == 0 or numel(src) % known:
            raise ShapeRuleError(f"{op}: cannot reshape {fmt_shape(src)} to {list(shape)}")
        out[out.index(-1)] = numel(src) // known
    if any(d < 0 for d in out) or numel(out) != numel(src):
        raise ShapeRuleError(f"{op}: cannot reshape {fmt_shape(src)} to {list(shape)}")
    return tuple(out)
