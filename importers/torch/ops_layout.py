"""Layout lowerings: reshape, permute, transpose, squeeze, broadcast, concat, slicing, padding, tiling.

Pure data movement. Layout ops applied to a state_dict tensor keep it a ``Known`` with the transform
recorded (``Known.moved``), so its binding in the role map survives.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from torchlean_bridge.errors import ShapeRuleError
from torchlean_bridge.ops.contracts import broadcast_shapes, resolve_reshape

from .common import Known, NotLowerable, Sym, normalize_axis, prod
from .lowerer import Lowerer
from .ops_elementwise import promote
from .targets import lowers

Cx = Lowerer


# -- reshaping ------------------------------------------------------------------------------------
def shape_arg(shape: Sequence[Any]) -> list[int]:
    if len(shape) == 1 and isinstance(shape[0], (list, tuple, torch.Size)):
        shape = shape[0]
    return [int(s) for s in shape]


def resolve_shape(src: tuple[int, ...], shape: Sequence[int]) -> tuple[int, ...]:
    try:
        return resolve_reshape(src, shape)
    except ShapeRuleError as e:
        raise NotLowerable(e.message) from None


@lowers(aten="view.default reshape.default _unsafe_view.default", fx="torch.reshape")
def reshape(cx: Cx, input: Any, shape: Sequence[int]) -> Any:
    src = cx.shape(input)
    out = resolve_shape(src, shape)
    if isinstance(input, Known):
        return input.moved(input.tensor.reshape(out), ("reshape", out))
    return Sym(cx.builder.reshape(cx.node(input), out, source=cx.source()))


@lowers(methods="view reshape")
def view(cx: Cx, input: Any, *shape: Any) -> Any:
    if len(shape) == 1 and isinstance(shape[0], torch.dtype):
        raise NotLowerable("view(dtype) reinterprets bits; not supported")
    return reshape(cx, input, shape_arg(shape))


@lowers(aten="permute.default", fx="torch.permute", methods="permute")
def permute(cx: Cx, input: Any, *dims: Any) -> Any:
    r = cx.rank(input)
    perm = tuple(normalize_axis(d, r) for d in shape_arg(dims))
    if perm == tuple(range(r)):
        return input
    if isinstance(input, Known):
        return input.moved(input.tensor.permute(perm), ("permute", perm))
    return cx.add("permute", [cx.node(input)], {"perm": perm})


@lowers(aten="transpose.int", fx="torch.transpose", methods="transpose")
def transpose(cx: Cx, input: Any, dim0: int, dim1: int) -> Any:
    r = cx.rank(input)
    a, b = normalize_axis(dim0, r), normalize_axis(dim1, r)
    if a == b:
        return input
    if isinstance(input, Known):
        perm = list(range(r))
        perm[a], perm[b] = perm[b], perm[a]
        return permute(cx, input, perm)
    return cx.add("transpose", [cx.node(input)], {"axis1": min(a, b), "axis2": max(a, b)})


@lowers(aten="t.default numpy_T.default", fx="torch.t", methods="t")
def t(cx: Cx, input: Any) -> Any:
    return input if cx.rank(input) < 2 else transpose(cx, input, 0, 1)


@lowers(aten="unsqueeze.default", fx="torch.unsqueeze", methods="unsqueeze")
def unsqueeze(cx: Cx, input: Any, dim: int) -> Any:
    s = list(cx.shape(input))
    s.insert(normalize_axis(dim, len(s) + 1), 1)
    return reshape(cx, input, s)


@lowers(aten="squeeze.default squeeze.dim squeeze.dims", fx="torch.squeeze", methods="squeeze")
def squeeze(cx: Cx, input: Any, dim: Any = None) -> Any:
    s = cx.shape(input)
    axes = range(len(s)) if dim is None else [normalize_axis(d, len(s)) for d in
                                              ([dim] if isinstance(dim, int) else dim)]
    drop = {a for a in axes if s[a] == 1}
    return reshape(cx, input, [d for i, d in enumerate(s) if i not in drop])


@lowers(aten="flatten.using_ints", fx="torch.flatten", methods="flatten")
def flatten(cx: Cx, input: Any, start_dim: int = 0, end_dim: int = -1) -> Any:
    s = cx.shape(input)
    if not s:
        return reshape(cx, input, [1])
    a, b = normalize_axis(start_dim, len(s)), normalize_axis(end_dim, len(s))
    return reshape(cx, input, list(s[:a]) + [prod(s[a:b + 1])] + list(s[b + 1:]))


@lowers(aten="unflatten.int", fx="torch.unflatten", methods="unflatten")
def unflatten(cx: Cx, input: Any, dim: int, sizes: Sequence[int]) -> Any:
    s = list(cx.shape(input))
    a = normalize_axis(dim, len(s))
    inner = resolve_shape((s[a],), sizes)
    return reshape(cx, input, s[:a] + list(inner) + s[a + 1:])


@lowers(aten="expand.default", fx="torch.broadcast_to", methods="expand")
def expand(cx: Cx, input: Any, *size: Any, implicit: bool = False) -> Sym:
    sizes = shape_arg(size)
    src = cx.shape(input)
    lead = len(sizes) - len(src)
    target = tuple(src[i - lead] if s == -1 else s for i, s in enumerate(sizes))
    return Sym(cx.builder.broadcast(cx.node(input), target, source=cx.source()))


@lowers(aten="expand_as.default", methods="expand_as")
def expand_as(cx: Cx, input: Any, other: Any) -> Sym:
    return expand(cx, input, list(cx.shape(other)))


@lowers(aten="view_as.default reshape_as.default", methods="view_as reshape_as")
def view_as(cx: Cx, input: Any, other: Any) -> Any:
    return reshape(cx, input, cx.shape(other))


@lowers(aten="cat.default")
def cat(cx: Cx, tensors: Sequence[Any], dim: int = 0) -> Any:
    tensors = [x for x in tensors if cx.shape(x) != (0,)]  # PyTorch skips legacy empty tensors
    if len(tensors) == 1:
        return tensors[0]
    et = promote(cx, *tensors)
    ax = normalize_axis(dim, cx.rank(tensors[0]))
    return cx.add("concat", [cx.node(x, et) for x in tensors], {"axis": ax})


@lowers(fx="torch.cat")
def f_cat(cx: Cx, tensors: Sequence[Any], dim: int = 0, axis: int | None = None) -> Any:
    """torch.cat and its aliases (numpy's ``axis`` spelling included)."""
    return cat(cx, tensors, dim if axis is None else axis)


@lowers(aten="stack.default", fx="torch.stack")
def stack(cx: Cx, tensors: Sequence[Any], dim: int = 0) -> Any:
    ax = normalize_axis(dim, cx.rank(tensors[0]) + 1)
    return cat(cx, [unsqueeze(cx, x, ax) for x in tensors], ax)


@lowers(aten="slice.Tensor")
def slice_axis(cx: Cx, input: Any, dim: int = 0, start: int | None = None, end: int | None = None,
           step: int = 1) -> Any:
    s = cx.shape(input)
    ax = normalize_axis(dim, len(s))
    lo, hi, st = slice(start, end, step).indices(s[ax])
    if step <= 0:
        raise NotLowerable(f"slice step {step} (only positive steps)")
    hi = max(hi, lo)
    if (lo, hi, st) == (0, s[ax], 1):
        return input
    if isinstance(input, Known) and not input.pinned:
        return Known(input.tensor[(slice(None),) * ax + (slice(lo, hi, st),)], folded=True)
    return cx.add("slice", [cx.node(input)], {"axes": [ax], "starts": [lo], "ends": [hi], "steps": [st]})


@lowers(aten="narrow.default", fx="torch.narrow", methods="narrow")
def narrow(cx: Cx, input: Any, dim: int, start: int, length: int) -> Any:
    ax = normalize_axis(dim, cx.rank(input))
    start = normalize_axis(start, cx.shape(input)[ax], "start") if start < 0 else start  # torch: n + start
    return slice_axis(cx, input, ax, start, start + length)


@lowers(aten="select.int", fx="torch.select", methods="select")
def select(cx: Cx, input: Any, dim: int, index: int) -> Any:
    s = cx.shape(input)
    ax = normalize_axis(dim, len(s))
    i = normalize_axis(int(index), s[ax], "index")
    return squeeze(cx, slice_axis(cx, input, ax, i, i + 1), ax)


@lowers(aten="split.Tensor split_with_sizes.default split.sizes", methods="split")
def split(cx: Cx, input: Any, split_size: Any, dim: int = 0) -> tuple[Any, ...]:
    ax = normalize_axis(dim, cx.rank(input))
    n = cx.shape(input)[ax]
    if isinstance(split_size, int):
        sizes = [min(split_size, n - i) for i in range(0, n, split_size)] or [0]
    else:
        sizes = [int(x) for x in split_size]
    out, start = [], 0
    for size in sizes:
        out.append(slice_axis(cx, input, ax, start, start + size))
        start += size
    return tuple(out)


@lowers(fx="torch.split")
def f_split(cx: Cx, tensor: Any, split_size_or_sections: Any, dim: int = 0) -> tuple[Any, ...]:
    return split(cx, tensor, split_size_or_sections, dim)


@lowers(aten="chunk.default", fx="torch.chunk", methods="chunk")
def chunk(cx: Cx, input: Any, chunks: int, dim: int = 0) -> tuple[Any, ...]:
    n = cx.shape(input)[normalize_axis(dim, cx.rank(input))]
    return split(cx, input, -(-n // chunks) if n else 1, dim)


@lowers(aten="unbind.int", fx="torch.unbind", methods="unbind")
def unbind(cx: Cx, input: Any, dim: int = 0) -> tuple[Any, ...]:
    ax = normalize_axis(dim, cx.rank(input))
    return tuple(select(cx, input, ax, i) for i in range(cx.shape(input)[ax]))


@lowers(aten="pad.default", fx="F.pad")
def constant_pad(cx: Cx, input: Any, pad: Sequence[int], mode: str = "constant", value: float | None = None) -> Any:
    if mode != "constant":
        raise NotLowerable(f"padding mode {mode!r} (only constant padding)")
    s = cx.shape(input)
    before, after = [0] * len(s), [0] * len(s)
    for i in range(len(pad) // 2):
        ax = len(s) - 1 - i
        before[ax], after[ax] = int(pad[2 * i]), int(pad[2 * i + 1])
    if any(p < 0 for p in before + after):
        raise NotLowerable("negative padding (cropping) is not supported")
    if not any(before + after):
        return input
    return cx.add("pad", [cx.node(input)], {"pads_before": before, "pads_after": after,
                                            "value": float(value or 0.0)})


@lowers(aten="constant_pad_nd.default")
def constant_pad_nd(cx: Cx, input: Any, pad: Sequence[int], value: float = 0.0) -> Any:
    return constant_pad(cx, input, pad, "constant", value)



@lowers(aten="repeat.default", methods="repeat")
def repeat(cx: Cx, input: Any, *repeats: Any) -> Any:
    """Tile by unsqueeze, broadcast and reshape: pure data movement, exact."""
    reps = shape_arg(repeats)
    s = (1,) * (len(reps) - cx.rank(input)) + cx.shape(input)
    x = reshape(cx, input, [d for pair in ((1, e) for e in s) for d in pair])
    x = expand(cx, x, [d for pair in zip(reps, s) for d in pair])
    return reshape(cx, x, [r * e for r, e in zip(reps, s)])


@lowers(fx="torch.broadcast_tensors")
def broadcast_tensors(cx: Cx, *tensors: Any) -> tuple[Any, ...]:
    shape: tuple[int, ...] = ()
    for x in tensors:
        shape = broadcast_shapes(shape, cx.shape(x))
    return tuple(expand(cx, x, list(shape)) for x in tensors)
