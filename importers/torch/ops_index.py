"""Indexing lowerings: gathers along an axis, advanced indexing, ``x[...]``, and shape queries.

Known indices are range-checked and made non-negative at import; indices computed from the inputs
must be int64 (``gather``/``gather_elements`` read them as they are).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from torchlean_bridge.ops import BOOL, INT64
from torchlean_bridge.ops.contracts import broadcast_shapes

from .common import Known, NotLowerable, Sym, normalize_axis, prod
from .lowerer import Lowerer
from .ops_elementwise import is_tensor, torch_dtype
from .ops_layout import expand, permute, reshape, select, slice_axis, transpose, unsqueeze
from .targets import lowers

Cx = Lowerer


# -- indexing -------------------------------------------------------------------------------------
def gather_axis(cx: Cx, input: Any, axis: int, index: Any) -> Sym:
    """``numpy.take`` along one axis: PyTorch's single advanced index, index_select, embedding."""
    k = cx.known(index)
    if isinstance(index, Known) and index.pinned:  # a state_dict index buffer stays bound as it is
        if k.dtype != torch.int64 or bool((k < 0).any()):
            raise NotLowerable(f"index buffer `{index.key}` must hold non-negative int64 indices")
    elif k is not None:
        if k.dtype == torch.bool:
            if k.dim() != 1:
                raise NotLowerable("boolean mask indices of rank > 1")
            k = k.nonzero().reshape(-1)
        n = cx.shape(input)[axis]
        k = k.long()
        if bool(((k < -n) | (k >= n)).any()):
            bad = k[(k < -n) | (k >= n)].reshape(-1)[:5].tolist()
            raise NotLowerable(f"index {bad} out of range for extent {n} on axis {axis}")
        index = Known(torch.where(k < 0, k + n, k), folded=True)
    elif cx.etype(index) != INT64:
        raise NotLowerable(f"index tensor has element type {cx.etype(index)}, expected int64")
    return cx.add("gather", [cx.node(input), cx.node(index, INT64)], {"axis": axis})


def _index_operand(cx: Cx, index: Any, n: int, what: str) -> Any:
    """An int64 index tensor; known indices are range-checked against extent n and made non-negative."""
    k = cx.known(index)
    if k is not None and not (isinstance(index, Known) and index.pinned):
        k = k.long()
        if bool(((k < -n) | (k >= n)).any()):
            bad = k[(k < -n) | (k >= n)].reshape(-1)[:5].tolist()
            raise NotLowerable(f"{what} index {bad} out of range for extent {n}")
        return Known(torch.where(k < 0, k + n, k), folded=True)
    if cx.etype(index) != INT64:
        raise NotLowerable(f"{what} index tensor has element type {cx.etype(index)}, expected int64")
    return index


@lowers(aten="gather.default", fx="torch.gather", methods="gather")
def gather(cx: Cx, input: Any, dim: int, index: Any, sparse_grad: bool = False) -> Sym:
    """torch.gather: out[..., i, ...] = input[..., index[..., i, ...], ...] along dim."""
    axis = normalize_axis(int(dim), cx.rank(input))
    index = _index_operand(cx, index, cx.shape(input)[axis], "gather")
    return cx.add("gather_elements", [cx.node(input), cx.node(index, INT64)], {"axis": axis})


@lowers(aten="take_along_dim.default", fx="torch.take_along_dim", methods="take_along_dim")
def take_along_dim(cx: Cx, input: Any, indices: Any, dim: Any = None) -> Sym:
    """torch.take_along_dim with a dim: gather after broadcasting the two off that axis."""
    if dim is None:
        raise NotLowerable("take_along_dim without dim (it flattens the input)")
    axis = normalize_axis(int(dim), cx.rank(input))
    s, i = list(cx.shape(input)), list(cx.shape(indices))
    if len(s) != len(i):
        raise NotLowerable(f"take_along_dim of a rank-{len(s)} input with rank-{len(i)} indices")
    both = list(broadcast_shapes(tuple(d for k, d in enumerate(s) if k != axis),
                                 tuple(d for k, d in enumerate(i) if k != axis)))
    input = expand(cx, input, both[:axis] + [s[axis]] + both[axis:])
    indices = expand(cx, indices, both[:axis] + [i[axis]] + both[axis:])
    return gather(cx, input, axis, indices)


@lowers(aten="index_select.default", fx="torch.index_select", methods="index_select")
def index_select(cx: Cx, input: Any, dim: int, index: Any) -> Sym:
    return gather_axis(cx, input, normalize_axis(dim, cx.rank(input)), index)


@lowers(aten="as_strided.default")
def as_strided(cx: Cx, input: Any, size: Sequence[int], stride: Sequence[int],
               storage_offset: int | None = None) -> Any:
    """A strided view of a contiguous tensor (what decompositions leave of pooling and unfold): entry i
    of the result is the input's flat entry ``offset + sum_k i_k stride_k``, a gather from the
    flattened input at those constant positions (a reshape when they are 0, 1, 2, ...). Views of
    non-contiguous storage (the framework's recorded strides) are refused."""
    node = cx.current.args[0] if cx.current is not None and cx.current.args else None
    meta = cx.meta_of(node) if isinstance(node, torch.fx.Node) else None
    shape = cx.shape(input)
    if meta is None or not hasattr(meta, "stride") or not _is_contiguous(shape, tuple(meta.stride())) \
            or int(meta.storage_offset()) != 0:
        raise NotLowerable("as_strided of a tensor that is not a contiguous, offset-free view (only those "
                           "are its logical values)")
    size, stride = [int(d) for d in size], [int(d) for d in stride]
    if len(size) != len(stride) or any(d < 0 for d in size) or any(st < 0 for st in stride):
        raise NotLowerable(f"as_strided with size {size} and stride {stride}")
    positions = torch.full(size, int(storage_offset or 0), dtype=torch.int64)
    for axis, (n, st) in enumerate(zip(size, stride)):
        positions += (torch.arange(n, dtype=torch.int64) * st).reshape([n if k == axis else 1
                                                                        for k in range(len(size))])
    total = prod(shape)
    if positions.numel() and int(positions.max()) >= total:
        raise NotLowerable(f"as_strided reads position {int(positions.max())} of a tensor of {total} entries")
    if torch.equal(positions.reshape(-1), torch.arange(positions.numel())):
        return reshape(cx, input, size)
    return gather_axis(cx, reshape(cx, input, [-1]), 0, Known(positions, folded=True))


def _is_contiguous(shape: Sequence[int], stride: Sequence[int]) -> bool:
    expected = 1
    for n, st in zip(reversed(shape), reversed(stride)):
        if n != 1 and st != expected:
            return False
        expected *= n
    return len(shape) == len(stride)


@lowers(aten="index.Tensor")
def index(cx: Cx, input: Any, indices: Sequence[Any]) -> Sym:
    """aten.index.Tensor: one tensor index (the others None) is a gather on that axis; see
    ``_row_wise_index`` for the one two-index form supported."""
    used = [(i, ix) for i, ix in enumerate(indices) if ix is not None]
    if len(used) == 2:
        return _row_wise_index(cx, input, used)
    if len(used) != 1:
        raise NotLowerable(f"advanced indexing with {len(used)} index tensors (only one, or x[arange(n), j])")
    return gather_axis(cx, input, used[0][0], used[0][1])


def _row_wise_index(cx: Cx, input: Any, used: Sequence[tuple[int, Any]]) -> Sym:
    """``x[..., arange(n), j]`` on adjacent axes a, a+1 (one entry per row: CLIP's pooling at a
    computed position): the first index a known 0..n-1, the second of shape (n,). It is a
    ``gather_elements`` along a+1 with j broadcast over the trailing axes, then that axis dropped."""
    (a, rows), (b, cols) = used
    s = list(cx.shape(input))
    k = cx.known(rows)
    n = s[a]
    if b != a + 1 or k is None or tuple(k.shape) != (n,) or not torch.equal(k.long(), torch.arange(n)) \
            or tuple(cx.shape(cols)) != (n,):
        raise NotLowerable("advanced indexing with 2 index tensors (only x[..., arange(n), j] with j of shape (n,))")
    cols = _index_operand(cx, cols, s[b], "advanced")
    target = s[:b] + [1] + s[b + 1:]
    j = expand(cx, reshape(cx, Sym(cx.node(cols, INT64)), [1] * a + [n, 1] + [1] * (len(s) - b - 1)), target)
    picked = cx.add("gather_elements", [cx.node(input), cx.node(j, INT64)], {"axis": b})
    return reshape(cx, picked, s[:b] + s[b + 1:])


@lowers(fx="operator.getitem")
def getitem(cx: Cx, obj: Any, idx: Any) -> Any:
    """``x[idx]``: Python containers, or tensors with ints, slices, None, Ellipsis and one index tensor."""
    if not is_tensor(obj):
        return obj[idx]
    items = list(idx) if isinstance(idx, tuple) else [idx]
    consumes = sum(0 if (it is None or it is Ellipsis) else
                   (cx.rank(it) if is_tensor(it) and cx.etype(it) == BOOL else 1) for it in items)
    if Ellipsis in items:
        e = items.index(Ellipsis)
        items[e:e + 1] = [slice(None)] * (cx.rank(obj) - consumes)
    x: Any = obj
    axis = 0
    advanced: list[tuple[int, Any]] = []
    for it in items:
        if it is None:
            x = unsqueeze(cx, x, axis)
            axis += 1
        elif isinstance(it, slice):
            start, stop, step = (_slice_bound(cx, b) for b in (it.start, it.stop, it.step))
            x = slice_axis(cx, x, axis, start, stop, 1 if step is None else step)
            axis += 1
        elif isinstance(it, int):
            x = select(cx, x, axis, it)
        elif isinstance(it, (list, tuple)) or is_tensor(it):
            if isinstance(it, (list, tuple)):
                it = Known(torch.tensor(it), folded=True)
            advanced.append((axis, it))
            axis += 1
        else:
            raise NotLowerable(f"index {it!r} is not supported")
    if len(advanced) == 2:
        return _row_wise_index(cx, x, advanced)
    if len(advanced) > 2:
        raise NotLowerable(f"indexing with {len(advanced)} index tensors (only one, or x[..., arange(n), j])")
    return gather_axis(cx, x, *advanced[0]) if advanced else x


def _slice_bound(cx: Cx, bound: Any) -> int | None:
    """A slice bound as Python reads it (``__index__``): an int, None, or a one-element integer tensor
    known at import; a bound computed from the inputs would make the shape data-dependent."""
    if bound is None or isinstance(bound, int):
        return bound
    k = cx.known(bound) if is_tensor(bound) else None
    if k is not None and k.numel() == 1 and not k.is_floating_point() and k.dtype != torch.bool:
        return int(k.item())
    raise NotLowerable(f"slice bound {bound!r} is not an integer known at import"[:200])


@lowers(aten="sym_size.int", methods="size")
def size(cx: Cx, input: Any, dim: int | None = None) -> Any:
    s = cx.shape(input)
    return torch.Size(s) if dim is None else s[normalize_axis(dim, len(s))]


@lowers(fx="builtins.getattr")
def tensor_getattr(cx: Cx, obj: Any, name: str) -> Any:
    if not is_tensor(obj):
        return getattr(obj, name)
    if name == "shape":
        return torch.Size(cx.shape(obj))
    if name == "ndim":
        return cx.rank(obj)
    if name == "dtype":
        return cx.known(obj).dtype if cx.known(obj) is not None else torch_dtype(cx.etype(obj))
    if name == "T":
        return permute(cx, obj, list(range(cx.rank(obj)))[::-1])
    if name == "mT":
        return transpose(cx, obj, -2, -1)
    if name == "device":
        return torch.device("cpu")
    raise NotLowerable(f"tensor attribute `{name}`")


@lowers(methods="dim")
def dim(cx: Cx, input: Any) -> int:
    return cx.rank(input)


@lowers(methods="numel")
def numel(cx: Cx, input: Any) -> int:
    return prod(cx.shape(input))
