"""ONNX TopK and MaxPool with their Indices outputs, MaxUnpool, Slice with negative steps or computed starts, and
Pow of every type pair.

TopK's values stay ``sort`` and its Indices are ``topk_indices`` (int64, ties by lower index); MaxPool's Indices
are ``max_pool_indices`` next to the pooled values; MaxUnpool is ``max_unpool``. A negative Slice step is a
``gather`` with the constant positions it reads (exact data movement). A Slice whose starts are computed at run
time is a ``dynamic_slice`` when its ends are provably the starts plus constants (issue #32), else a
data-dependent shape refused by name. Pow: a uniform constant exponent keeps the
unary ``pow``; two floats are ``pow_elem``; two integers are ``int_pow`` (exact in int64, in the base's ONNX type);
an integer exponent of a float base is cast to float first (as onnx's reference promotes it); a float exponent of
an integer base computes in float and truncates toward zero, as the reference's ``astype`` does.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from torchlean_bridge.ops import FLOAT, INT64, REGISTRY
from torchlean_bridge.ops.contracts import broadcast_shapes

from . import ops_math, ops_nn, ops_reduce, ops_tensor
from .context import NodeUnsupported, OnnxContext, Value, data_dependent
from .ops_int import _INT_TYPES

__all__ = ["HANDLERS", "OPSETS", "EMITS"]

Handler = Callable[[OnnxContext], list[Value]]


def _read(ctx: OnnxContext, i: int) -> bool:
    return len(ctx.node.output) > i and bool(ctx.node.output[i]) and ctx.consumer_count(ctx.node.output[i]) > 0


# -- TopK -------------------------------------------------------------------------------------

def _topk(ctx: OnnxContext) -> list[Value]:
    if ctx.opset >= 10 and ctx.const(1) is None:
        raise data_dependent(ctx, [ctx.node.input[1]], "input 1 (K) must be a constant known at import time: the "
                             "number of values kept is K", "give a constant K")
    k = int(ctx.attr("k")) if ctx.opset < 10 else int(np.asarray(ctx.static(1, "K")).reshape(-1)[0])
    axis = ctx.axis(int(ctx.attr("axis", -1)), ctx.rank(0))
    if k < 0 or k > ctx.shape(0)[axis]:
        raise ctx.fail(f"k={k} for an axis of extent {ctx.shape(0)[axis]}")
    attrs = {"axis": axis, "k": k, "descending": bool(ctx.attr("largest", 1))}
    x = ctx.operand(0)
    outs: list[Value] = [ctx.add("sort", [x], attrs)]
    if _read(ctx, 1):
        outs.append(ctx.add("topk_indices", [x], attrs))
    return outs


# -- MaxPool with Indices, MaxUnpool ----------------------------------------------------------

def _max_pool(ctx: OnnxContext) -> list[Value]:
    """The pooled values as ops_nn lowers them (storage_order orders the indices only), and the Indices when read;
    integer inputs are ops_reduce's (pooled through an exact cast, their Indices refused)."""
    if ctx.dtype(0) != FLOAT:
        return ops_reduce.HANDLERS["MaxPool"](ctx)
    attrs = {**ops_nn.window_attrs(ctx), "count_include_pad": True}
    out = ops_nn.window_output(ctx, "max_pool_nd", attrs)
    rewrite = REGISTRY["max_pool_nd"].v1_rewrite(attrs, [ctx.shape(0)], out)
    x = ctx.operand(0)
    values = ctx.add(rewrite[0], [x], rewrite[1]) if rewrite is not None else ctx.add("max_pool_nd", [x], attrs)
    order = int(ctx.attr("storage_order", 0))
    if order not in (0, 1):
        raise ctx.fail(f"storage_order={order}")
    if not _read(ctx, 1):
        return [values]
    return [values, ctx.add("max_pool_indices", [x], {**attrs, "storage_order": bool(order)})]


def _max_unpool(ctx: OnnxContext) -> list[Value]:
    xs = ctx.shape(0)
    kernel = list(ctx.attr("kernel_shape"))
    r = len(kernel)
    strides = list(ctx.attr("strides") or [1] * r)
    pads = list(ctx.attr("pads") or [0] * (2 * r))
    if len(xs) != r + 2 or len(strides) != r or len(pads) != 2 * r or any(v < 1 for v in kernel + strides):
        raise ctx.fail(f"kernel_shape {kernel}, strides {strides}, pads {pads} for an input of rank {len(xs)}")
    if ctx.dtype(1) != INT64:
        raise ctx.fail(f"indices of element type {ctx.onnx_type(ctx.node.input[1])}")
    grid = list(xs[:2]) + [(n - 1) * s + k - pb - pa for n, s, k, pb, pa
                           in zip(xs[2:], strides, kernel, pads[:r], pads[r:])]
    out = [int(v) for v in ctx.ints(2, "output_shape")] if ctx.has_input(2) else grid
    if len(out) != len(xs) or any(v < 1 for v in grid) or any(o < g for o, g in zip(out, grid)):
        raise ctx.fail(f"output shape {out} for an input of shape {list(xs)} (the pooled grid is {grid}; onnx's "
                       "reference places it at the origin of a larger output)")
    return [ctx.add("max_unpool", [ctx.operand(0), ctx.operand(1)], {"scatter_shape": tuple(grid),
                                                                      "out_shape": tuple(out)})]


# -- Slice with negative steps ------------------------------------------------------------------

# -- Slice with starts computed at run time (issue #32) -------------------------------------------

_SAME_ORDER = ("reshape", "unsqueeze", "squeeze", "flatten", "cast")  # element order kept: offsets carry over


def _offset(ctx: OnnxContext, end: int, start: int) -> np.ndarray | None:
    """``k`` (start's shape, int64) with ``end == start + k`` provable from the IR nodes, else None: the same
    node, a constant added to (subtracted from) the start, or both wrapped alike (reshapes, casts, concats,
    gathers of the same constant positions)."""
    b = ctx.b
    if end == start:
        return np.zeros(b.shape(start), dtype=np.int64)
    e, s = b.nodes[end], b.nodes[start]
    if e.kind in ("int_add", "int_sub"):
        consts = [b.value(p) for p in e.parents]
        for i in (0, 1):
            if consts[1 - i] is not None and (i == 0 or e.kind == "int_add"):
                inner = _offset(ctx, e.parents[i], start)
                if inner is not None:  # int_add / int_sub are exact or refuse: end == start + k wherever defined
                    delta = np.asarray(consts[1 - i], dtype=np.int64)
                    return np.broadcast_to(inner + (delta if e.kind == "int_add" else -delta), e.out_shape).copy()
    if e.kind == "broadcast_to" and e.parents:
        inner = _offset(ctx, e.parents[0], start)
        return None if inner is None else np.broadcast_to(inner, e.out_shape).copy()
    if e.kind != s.kind or e.attrs != s.attrs or len(e.parents) != len(s.parents):
        return None
    if e.kind in _SAME_ORDER and len(e.parents) == 1:
        inner = _offset(ctx, e.parents[0], s.parents[0])
        return None if inner is None else inner.reshape(e.out_shape)
    if e.kind == "gather" and _same_value(ctx, e.parents[1], s.parents[1]):  # the same entries of both
        inner = _offset(ctx, e.parents[0], s.parents[0])
        index = b.value(e.parents[1])
        if inner is None or index is None:
            return None
        return np.take(inner, np.asarray(index, dtype=np.int64), axis=e.attrs["axis"])
    if e.kind == "concat":
        parts = [_offset(ctx, pe, ps) for pe, ps in zip(e.parents, s.parents)]
        return None if any(p is None for p in parts) else np.concatenate(parts, axis=e.attrs["axis"])
    return None


def _same_value(ctx: OnnxContext, a: int, b: int) -> bool:
    """The same node, or two constants with equal values."""
    va, vb = ctx.b.value(a), ctx.b.value(b)
    return a == b or (va is not None and vb is not None and va.shape == vb.shape and np.array_equal(va, vb))


def _dynamic_slice(ctx: OnnxContext) -> list[Value]:
    """``dynamic_slice`` when the ends are provably the computed starts plus constant sizes, with unit steps."""
    s = ctx.shape(0)
    what = "Slice with starts computed at run time"
    computed = [ctx.node.input[i] for i in range(1, 5) if ctx.has_input(i) and ctx.const(i) is None]

    def refuse(reason: str) -> NodeUnsupported:  # the backend binds ``needs`` and lowers the static slice
        return NodeUnsupported(reason, needs=computed)
    if ctx.const(2) is not None:
        raise data_dependent(ctx, [ctx.node.input[1]], f"{what} and constant ends",
                             "write the end as the start plus a constant length")
    if ctx.rank(1) != 1:
        raise refuse(f"{what}: starts of rank {ctx.rank(1)}")
    count = ctx.shape(1)[0]
    if any(ctx.has_input(i) and ctx.const(i) is None for i in (3, 4)):
        raise refuse(f"{what} and computed axes or steps")
    axes = ctx.ints(3, "axes") if ctx.has_input(3) else list(range(count))
    steps = ctx.ints(4, "steps") if ctx.has_input(4) else [1] * count
    if not len(axes) == len(steps) == count:
        raise refuse(f"{what}: starts, axes and steps differ in length")
    if any(sp != 1 for sp in steps):
        raise refuse(f"{what} and steps {steps} (only unit steps are lowered)")
    axes = [ctx.axis(a, len(s)) for a in axes]
    if len(set(axes)) != len(axes):
        raise refuse(f"axes {axes} repeat an axis")
    starts, ends = ctx.operand(1), ctx.operand(2)
    sizes = _offset(ctx, ends, starts)
    x = ctx.operand(0)
    if sizes is None:
        mixed = _split_constant_entries(ctx, x, axes, starts, ends)
        if mixed is not None:
            x, axes, starts, sizes = mixed
    if sizes is None:
        raise data_dependent(ctx, [ctx.node.input[1], ctx.node.input[2]], f"{what}: the length ends - starts is not a "
                             "constant the importer can prove", "write the end as the start plus a constant length")
    for ax, k in zip(axes, sizes.tolist()):
        if not 1 <= k <= s[ax]:
            raise refuse(f"{what}: length {k} on axis {ax} of extent {s[ax]}")
    return [ctx.add("dynamic_slice", [x, starts], {"axes": tuple(axes), "sizes": tuple(sizes.tolist())})]


def _split_constant_entries(ctx: OnnxContext, x: int, axes: list[int], starts: int, ends: int
                            ) -> tuple[int, list[int], int, np.ndarray] | None:
    """Starts and ends concatenated from parts where some parts are constants on both sides (``x[:, r:r+3, 1:]``):
    those axes become a static slice (ONNX's clamping, at import), the rest a dynamic slice of the computed
    parts. None when the parts do not pair up that way."""
    b = ctx.b
    e, s = b.nodes[ends], b.nodes[starts]
    if not (e.kind == s.kind == "concat" and len(e.parents) == len(s.parents)):
        return None
    static, parts, dyn_axes, sizes, pos = [], [], [], [], 0
    for pe, ps in zip(e.parents, s.parents):
        m = b.shape(ps)[0] if len(b.shape(ps)) == 1 else -1
        if m < 0 or b.shape(pe) != b.shape(ps):
            return None
        here, pos = axes[pos:pos + m], pos + m
        ve, vs = b.value(pe), b.value(ps)
        if ve is not None and vs is not None:
            static += list(zip(here, np.asarray(vs).reshape(-1).tolist(), np.asarray(ve).reshape(-1).tolist()))
            continue
        k = _offset(ctx, pe, ps)
        if k is None:
            return None
        parts.append(ps)
        dyn_axes += here
        sizes += k.reshape(-1).tolist()
    if not parts:
        return None
    shape = ctx.shape(0)
    for ax, st, en in static:
        n = shape[ax]
        st = min(max(st + n if st < 0 else st, 0), n)
        en = max(min(max(en + n if en < 0 else en, 0), n), st)
        if (st, en) != (0, n):
            x = ops_tensor._slice_node(ctx, x, [ax], [st], [en], [1])
    computed = parts[0] if len(parts) == 1 else ctx.add("concat", parts, {"axis": 0})
    return x, dyn_axes, computed, np.asarray(sizes, dtype=np.int64)


def _slice(ctx: OnnxContext) -> list[Value]:
    if ctx.opset >= 10 and ctx.const(1) is None:
        return _dynamic_slice(ctx)
    if ctx.opset < 10 or not ctx.has_input(4) or all(v > 0 for v in ctx.ints(4, "steps")):
        return ops_tensor._slice(ctx)
    s = ctx.shape(0)
    starts, ends = ctx.ints(1, "starts"), ctx.ints(2, "ends")
    axes = ctx.ints(3, "axes") if ctx.has_input(3) else list(range(len(starts)))
    steps = ctx.ints(4, "steps")
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise ctx.fail("starts, ends, axes and steps differ in length")
    axes = [ctx.axis(a, len(s)) for a in axes]
    if len(set(axes)) != len(axes):
        raise ctx.fail(f"axes {axes} repeat an axis")
    x: Value = ctx.values[ctx.node.input[0]]
    for ax, st, en, sp in zip(axes, starts, ends, steps):
        n = s[ax]
        if sp == 0:
            raise ctx.fail(f"step 0 on axis {ax}")
        # ONNX's clamping: [0, n] for a positive step, [0, n - 1] (start) and [-1, n - 1] (end) for a negative one
        if sp < 0 and st < -n:
            raise ctx.fail(f"start {st} below -{n} with step {sp} on axis {ax}: the spec clamps it to 0 (one cell "
                           "read), onnx's reference (numpy) reads nothing")
        st = st + n if st < 0 else st
        en = en + n if en < 0 else en
        if sp > 0:
            st, en = min(max(st, 0), n), min(max(en, 0), n)
        else:
            st, en = min(max(st, 0), n - 1), min(max(en, -1), n - 1)
        positions = np.arange(st, en, sp, dtype=np.int64)
        if sp == 1 and positions.size == n:
            continue
        data = ctx.operand(0) if x is ctx.values[ctx.node.input[0]] else x
        x = ctx.add("gather", [data, ctx.b.const(positions, source=ctx.source, folded=True)], {"axis": ax})
    return [x]


# -- Pow ----------------------------------------------------------------------------------------

def _pow(ctx: OnnxContext) -> list[Value]:
    base_t, exp_t = ctx.dtype(0), ctx.dtype(1)
    if FLOAT not in (base_t, exp_t) and {base_t, exp_t} != {INT64}:
        raise ctx.fail(f"Pow of {ctx.onnx_type(ctx.node.input[0])} and {ctx.onnx_type(ctx.node.input[1])}")
    exp = ctx.const(1)
    uniform = exp is not None and exp.value.size > 0 and np.all(exp.value == exp.value.reshape(-1)[0])
    if base_t == FLOAT and uniform and np.isfinite(float(exp.value.reshape(-1)[0])):
        return ops_math.HANDLERS["Pow"](ctx)
    shape = broadcast_shapes(ctx.shape(0), ctx.shape(1), "Pow")
    a = ctx.b.broadcast(ctx.operand(0), shape, ctx.source)
    b = ctx.b.broadcast(ctx.operand(1), shape, ctx.source)
    if base_t == INT64 and exp_t == INT64:
        bits, signed = _INT_TYPES.get(ctx.onnx_type(ctx.node.input[0]), (None, None))
        if bits is None:
            raise ctx.fail(f"integer Pow of {ctx.onnx_type(ctx.node.input[0])} values")
        return [ctx.add("int_pow", [a, b], {"bits": bits, "signed": signed})]
    if exp_t == INT64:
        b = ctx.add("cast", [b], {"dtype": FLOAT})
    if base_t == INT64:
        y = ctx.add("pow_elem", [ctx.add("cast", [a], {"dtype": FLOAT}), b])
        return [ctx.add("cast", [y], {"dtype": INT64})]
    return [ctx.add("pow_elem", [a, b])]


HANDLERS: dict[str, Handler] = {"TopK": _topk, "MaxPool": _max_pool, "MaxUnpool": _max_unpool, "Slice": _slice,
                                "Pow": _pow}
OPSETS: dict[str, tuple[int, int]] = {"TopK": (1, 24), "MaxPool": (1, 22), "MaxUnpool": (9, 22), "Slice": (1, 13),
                                      "Pow": (7, 15)}
EMITS = frozenset({"sort", "topk_indices", "max_pool_nd", "max_pool", "max_pool_indices", "max_unpool", "gather",
                   "slice", "const", "pow", "pow_elem", "int_pow", "cast", "broadcast_to", "dynamic_slice"})
