"""ONNX indexing and data-movement ops written as exact compositions of existing IR ops.

Every lowering here computes with index tables built at import time from values known then:
``Pad`` edge/reflect/wrap is a ``gather`` per padded axis with numpy.pad's index pattern;
``ScatterND``/``ScatterElements`` with constant indices are layers of ``where(mask, op(out, gather(
updates)), out)``, one layer per repeated write, applied in the reference's (C) order; ``OneHot`` is
``where(indices == position, on, off)``; ``ArgMax``/``ArgMin`` with ``select_last_index`` reverse the
axis and map the position back through a constant table; ``GatherND`` with ``batch_dims`` is a gather on
the flattened leading axes. ``Range`` and ``NonZero`` have value-dependent output shapes: they fold
when their inputs are known, and otherwise name the inputs that would let them fold.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from torchlean_bridge.errors import BridgeError
from torchlean_bridge.ops import BOOL, INT64

from . import ops_math, ops_tensor
from .context import NodeUnsupported, OnnxContext, Value, data_dependent

__all__ = ["HANDLERS", "OPSETS", "EMITS"]

Handler = Callable[[OnnxContext], list[Value]]

_MAX_SCATTER_LAYERS = 64  # repeated writes to one position: one where-layer each


def _index_const(ctx: OnnxContext, values: np.ndarray) -> int:
    return ctx.b.const(np.asarray(values, dtype=np.int64), source=ctx.source, folded=True)


# -- Pad --------------------------------------------------------------------------------------

def _pad_amounts(ctx: OnnxContext) -> tuple[list[int], list[int]]:
    rank = ctx.rank(0)
    if ctx.opset < 11:
        pads, axes = list(ctx.attr("pads")), list(range(rank))
    else:
        pads = ctx.ints(1, "pads")
        axes = [ctx.axis(a, rank) for a in ctx.ints(3, "axes")] if ctx.has_input(3) else list(range(rank))
    if len(pads) != 2 * len(axes):
        raise ctx.fail(f"pads {pads} for {len(axes)} axes")
    before, after = [0] * rank, [0] * rank
    for i, ax in enumerate(axes):
        before[ax], after[ax] = pads[i], pads[i + len(axes)]
    return before, after


def _pad(ctx: OnnxContext) -> list[Value]:
    """``edge``/``reflect``/``wrap``: each padded axis gathers the source positions numpy.pad (onnx's
    reference) reads; ``constant`` is the existing lowering."""
    mode = ctx.attr("mode", "constant")
    if mode == "constant":
        return ops_tensor.HANDLERS["Pad"](ctx)
    if mode not in ("edge", "reflect", "wrap"):
        raise ctx.fail(f"mode={mode}")
    before, after = _pad_amounts(ctx)
    if any(p < 0 for p in before + after):
        raise ctx.fail(f"negative pads (before {before}, after {after}) with mode={mode}")
    s = ctx.shape(0)
    x = ctx.operand(0)
    for ax, (b, a) in enumerate(zip(before, after)):
        if not b and not a:
            continue
        if s[ax] == 0 or (mode == "reflect" and s[ax] == 1):
            raise ctx.fail(f"mode={mode} pads axis {ax} of extent {s[ax]}")
        padded = math.prod(s) // s[ax] * (s[ax] + b + a)  # the result's size, checked before any allocation
        if padded > ctx.max_elements:
            raise ctx.fail(f"padding axis {ax} to {s[ax] + b + a} entries gives {padded} elements, above the limit "
                           f"of {ctx.max_elements}")
        idx = np.pad(np.arange(s[ax]), (b, a), mode=mode)
        x = ctx.add("gather", [x, _index_const(ctx, idx)], {"axis": ax})
    return [x]


# -- Scatter ----------------------------------------------------------------------------------

_COMBINE = {"none": None, "add": "add", "mul": "mul_elem", "max": "max_elem", "min": "min_elem"}


def _scatter_layers(ctx: OnnxContext, out_pos: np.ndarray, upd_pos: np.ndarray, reduction: str,
                    data_shape: tuple[int, ...]) -> list[Value]:
    """Writes ``updates.flat[upd_pos[i]]`` into ``out.flat[out_pos[i]]`` in order i = 0, 1, ..."""
    combine = _COMBINE.get(reduction, "?")
    if combine == "?":
        raise ctx.fail(f"reduction={reduction}")
    order = np.argsort(out_pos, kind="stable")
    sorted_pos = out_pos[order]
    starts = np.r_[0, np.flatnonzero(np.diff(sorted_pos)) + 1] if sorted_pos.size else np.zeros(0, np.int64)
    rank_in_group = np.arange(sorted_pos.size) - np.repeat(starts, np.diff(np.r_[starts, sorted_pos.size]))
    rank = np.empty_like(rank_in_group)
    rank[order] = rank_in_group
    layers = int(rank.max()) + 1 if rank.size else 0
    if combine is None and layers > 1:
        raise ctx.fail("indices repeat a position with reduction=none (ONNX leaves the result undefined)")
    if layers > _MAX_SCATTER_LAYERS:
        raise ctx.fail(f"a position is written {layers} times (at most {_MAX_SCATTER_LAYERS} are lowered)")
    out = ctx.operand(0)
    if layers == 0:
        return [out]
    total = math.prod(data_shape)
    updates = ctx.b.reshape(ctx.operand(2), (math.prod(ctx.shape(2)),), ctx.source)
    for j in range(layers):
        pick = rank == j
        mask = np.zeros(total, dtype=bool)
        table = np.zeros(total, dtype=np.int64)
        mask[out_pos[pick]] = True
        table[out_pos[pick]] = upd_pos[pick]
        gathered = ctx.add("gather", [updates, _index_const(ctx, table.reshape(data_shape))], {"axis": 0})
        value = gathered if combine is None else ctx.add(combine, [out, gathered])
        m = ctx.b.const(mask.reshape(data_shape), source=ctx.source, folded=True)
        out = ctx.add("where", [m, value, out])
    return [out]


def _scatter_indices(ctx: OnnxContext, what: str) -> np.ndarray:
    return np.asarray(ctx.static(1, what)).astype(np.int64)


def _scatter_elements(ctx: OnnxContext) -> list[Value]:
    """``ScatterElements`` (and opset < 11 ``Scatter``) with indices known at import time."""
    s = ctx.shape(0)
    axis = ctx.axis(int(ctx.attr("axis", 0)), len(s))
    idx = _scatter_indices(ctx, "indices")
    if idx.shape != ctx.shape(2) or idx.ndim != len(s):
        raise ctx.fail(f"indices {list(idx.shape)} and updates {list(ctx.shape(2))} must share one shape of the "
                       f"data's rank {len(s)}")
    if np.any((idx < -s[axis]) | (idx >= s[axis])):
        raise ctx.fail(f"an index is out of range for axis {axis} of extent {s[axis]}")
    coords = list(np.indices(idx.shape, dtype=np.int64)) if idx.size else [np.zeros(0, np.int64)] * idx.ndim
    coords[axis] = np.where(idx < 0, idx + s[axis], idx)
    if any(idx.shape[k] > s[k] for k in range(len(s)) if k != axis):
        raise ctx.fail(f"indices {list(idx.shape)} exceed the data {list(s)} off axis {axis}")
    out_pos = np.ravel_multi_index(tuple(c.reshape(-1) for c in coords), s) if idx.size else np.zeros(0, np.int64)
    return _scatter_layers(ctx, out_pos.astype(np.int64), np.arange(idx.size, dtype=np.int64),
                           str(ctx.attr("reduction", "none")), s)


def _scatter_nd(ctx: OnnxContext) -> list[Value]:
    """``ScatterND`` with indices known at import time: each index tuple writes one trailing block."""
    s = ctx.shape(0)
    idx = _scatter_indices(ctx, "indices")
    r = idx.shape[-1] if idx.ndim else 0
    if idx.ndim == 0 or r > len(s) or tuple(ctx.shape(2)) != tuple(idx.shape[:-1]) + tuple(s[r:]):
        raise ctx.fail(f"indices {list(idx.shape)} and updates {list(ctx.shape(2))} do not fit data {list(s)}")
    lead = np.asarray(s[:r], dtype=np.int64)
    tuples = idx.reshape(-1, r)
    if np.any((tuples < -lead) | (tuples >= lead)):
        raise ctx.fail(f"an index is out of range for extents {list(s[:r])}")
    tuples = np.where(tuples < 0, tuples + lead, tuples)
    rows = np.ravel_multi_index(tuple(tuples.T), s[:r]) if r else np.zeros(len(tuples), np.int64)
    block = math.prod(s[r:])
    out_pos = (rows[:, None] * block + np.arange(block)[None, :]).reshape(-1)
    upd_pos = np.arange(out_pos.size, dtype=np.int64)
    return _scatter_layers(ctx, out_pos.astype(np.int64), upd_pos, str(ctx.attr("reduction", "none")), s)


# -- OneHot -----------------------------------------------------------------------------------

def _one_hot(ctx: OnnxContext) -> list[Value]:
    """``where(indices == k or indices == k - depth, on, off)`` with k the position along ``axis``
    (negative indices count from the end; out-of-range indices match no position: all off)."""
    depth_v = np.asarray(ctx.static(1, "depth")).reshape(-1)
    depth = int(depth_v[0])
    if depth_v.dtype.kind == "f" and depth_v[0] != depth or depth < 1:
        raise ctx.fail(f"depth {depth_v[0]}")
    values = ctx.needed(2, "values").value.reshape(-1)
    if values.size != 2:
        raise ctx.fail(f"values has {values.size} entries, expected [off, on]")
    s = ctx.shape(0)
    axis = ctx.axis(int(ctx.attr("axis", -1)), len(s) + 1)
    out_shape = tuple(s[:axis]) + (depth,) + tuple(s[axis:])
    idx = ctx.operand(0)
    if ctx.dtype(0) != INT64:
        if ctx.dtype(0) == BOOL:
            raise ctx.fail("bool indices")
        idx = ctx.add("cast", [idx], {"dtype": INT64})  # ONNX casts indices to integers (toward zero)
    idx = ctx.b.broadcast(ctx.b.reshape(idx, tuple(s[:axis]) + (1,) + tuple(s[axis:]), ctx.source), out_shape,
                          ctx.source)
    pos = np.arange(depth, dtype=np.int64).reshape((depth,) + (1,) * (len(s) - axis))
    hit = ctx.elementwise("logical_or", [ctx.elementwise("eq", [idx, _index_const(ctx, pos)]),
                                         ctx.elementwise("eq", [idx, _index_const(ctx, pos - depth)])])
    off = ctx.b.const(values[0:1].reshape(()), source=ctx.source, folded=True)
    on = ctx.b.const(values[1:2].reshape(()), source=ctx.source, folded=True)
    return [ctx.elementwise("where", [hit, on, off])]


# -- value-dependent shapes -------------------------------------------------------------------

def _folded(ctx: OnnxContext) -> list[Value]:
    """The node's value computed at import (its size checked first): ops with no IR form whose operands
    are all known."""
    from .fold import check_fold_size, fold_node
    check_fold_size(ctx, ctx.node)
    try:
        return list(fold_node(ctx, ctx.node))
    except BridgeError:
        raise
    except Exception as e:  # noqa: BLE001 - the reference evaluator raises assorted errors
        raise NodeUnsupported(f"cannot fold (onnx's reference evaluator: {type(e).__name__}: {e})"[:300]) from None


def _fold_only(what: str, fix: str) -> Handler:
    def lower(ctx: OnnxContext) -> list[Value]:
        names = [ctx.node.input[i] for i in range(len(ctx.node.input)) if ctx.has_input(i) and ctx.const(i) is None]
        if not names:  # every operand is a constant (float initializers are kept as parameters): fold it now
            return _folded(ctx)
        raise data_dependent(ctx, names, f"inputs {names} ({what}) must be constants known at import time", fix)
    return lower


# -- ArgMax / ArgMin --------------------------------------------------------------------------

def _arg(kind: str) -> Handler:
    first = ops_math.HANDLERS["ArgMax" if kind == "argmax" else "ArgMin"]

    def lower(ctx: OnnxContext) -> list[Value]:
        """``select_last_index``: the first extremum of the reversed axis, mapped back by n - 1 - i."""
        if not ctx.attr("select_last_index", 0):
            return first(ctx)
        s = ctx.shape(0)
        axis = ctx.axis(int(ctx.attr("axis", 0)), len(s))
        n = s[axis]
        rev = ctx.add("gather", [ctx.operand(0), _index_const(ctx, np.arange(n - 1, -1, -1))], {"axis": axis})
        pos = ctx.add(kind, [rev], {"axis": axis, "keepdim": bool(ctx.attr("keepdims", 1))})
        return [ctx.add("gather", [_index_const(ctx, np.arange(n - 1, -1, -1)), pos], {"axis": 0})]
    return lower


# -- GatherND ---------------------------------------------------------------------------------

def _gather_nd(ctx: OnnxContext) -> list[Value]:
    """``batch_dims`` = b: the first b axes of data and indices pair up; each batch gathers its own
    slices. With constant indices that is one ``gather`` on the flattened leading b + r axes."""
    b = int(ctx.attr("batch_dims", 0))
    if not b and (ctx.const(1) is not None or ctx.shape(1)[-1:] == (1,)):
        return ops_tensor.HANDLERS["GatherND"](ctx)
    s = ctx.shape(0)
    ind = np.asarray(ctx.static(1, "indices")).astype(np.int64)
    r = ind.shape[-1] if ind.ndim else 0
    if ind.ndim <= b or b + r > len(s) or tuple(ind.shape[:b]) != tuple(s[:b]):
        raise ctx.fail(f"indices {list(ind.shape)} with batch_dims={b} do not fit data {list(s)}")
    lead = np.asarray(s[b:b + r], dtype=np.int64)
    if np.any((ind < -lead) | (ind >= lead)):
        raise ctx.fail(f"an index is out of range for extents {list(s[b:b + r])}")
    ind = np.where(ind < 0, ind + lead, ind)
    nb, block = math.prod(s[:b]), math.prod(s[b:b + r])
    inner = ind.reshape(nb, -1, r)
    local = np.ravel_multi_index(tuple(inner.reshape(-1, r).T), s[b:b + r]).reshape(nb, -1) if r else \
        np.zeros((nb, inner.shape[1]), np.int64)
    flat = (np.arange(nb)[:, None] * block + local).reshape(ind.shape[:-1])
    data = ctx.b.reshape(ctx.operand(0), (nb * block,) + tuple(s[b + r:]), ctx.source)
    return [ctx.add("gather", [data, _index_const(ctx, flat)], {"axis": 0})]


HANDLERS: dict[str, Handler] = {
    "Pad": _pad, "ScatterElements": _scatter_elements, "Scatter": _scatter_elements, "ScatterND": _scatter_nd,
    "OneHot": _one_hot, "Range": _fold_only("Range operand: the length is (limit - start) / delta",
                                                  "fix the length (a constant limit)"),
    "NonZero": _fold_only("NonZero's input: the output shape is its count of nonzero entries",
                          "fix the count (keep the shape with Where and a mask, or TopK with a constant k)"),
    "ArgMax": _arg("argmax"), "ArgMin": _arg("argmin"), "GatherND": _gather_nd,
}
# ScatterElements-11 (indices), -13 (types), -16 (reduction add/mul), -18 (max/min); ScatterND-11..18
# likewise; Scatter-9 is ScatterElements without reduction; OneHot-11 (negative indices count from the
# end; OneHot-9's text calls them out of range, but onnxruntime and onnx's reference wrap them at every
# opset, so opset-9 models are upgraded, with a note), OneHot-28 and Range-27 (element types).
OPSETS: dict[str, tuple[int, int]] = {
    "Pad": (2, 25), "ScatterElements": (11, 18), "Scatter": (9, 9), "ScatterND": (11, 18), "OneHot": (11, 28),
    "Range": (11, 27), "NonZero": (9, 13), "ArgMax": (1, 13), "ArgMin": (1, 13), "GatherND": (11, 13),
}
EMITS = frozenset({"gather", "where", "add", "mul_elem", "max_elem", "min_elem", "reshape", "broadcast_to", "eq",
                   "logical_or", "cast", "argmax", "argmin", "const"}) | ops_tensor.EMITS | ops_math.EMITS
