"""Small ONNX ops (issue #15) written as exact compositions of existing IR ops, or folded at import.

Each lowering follows onnx's reference (onnx/reference/ops/op_<name>.py) step by step:
``Hardmax`` is ``where(argmax == position, 1, 0)`` (the first maximum, as numpy.argmax);
``Swish``/``SwiGLU`` are ``x * sigmoid(alpha * x)`` (times ``b``); ``MeanVarianceNormalization`` is its
function body (mean, mean of squares, their difference, sqrt, + 1e-9, divide); ``EyeLike`` is a
constant of the input's static shape; ``Compress`` with a known condition is a ``gather`` of the kept
positions; ``TensorScatter`` with known write indices is a ``gather`` from the concatenation of the
cache and the update; ``Dropout`` in training mode with ratio 0 is the identity (mask all true);
``BatchNormalization`` in training mode normalizes with the batch's mean and (population) variance
and updates the running statistics with ``momentum``.

Ops whose output shape follows from input values (``NonMaxSuppression``, ``Unique``,
``ConstantOfShape``, the windows and ``MelWeightMatrix``) fold with onnx's reference when their
inputs are known and otherwise name the inputs that would let them fold (``fold_sizes`` sizes the
generators' results from those values before the fold allocates them).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from torchlean_bridge.ops import BOOL, FLOAT, INT64

from . import ops_nn, ops_tensor
from .context import Const, OnnxContext, Value, data_dependent
from .fold import check_fold_size, fold_node

__all__ = ["HANDLERS", "OPSETS", "EMITS"]

Handler = Callable[[OnnxContext], list[Value]]


def _index_const(ctx: OnnxContext, values: Any) -> int:
    return ctx.b.const(np.asarray(values, dtype=np.int64), source=ctx.source, folded=True)


# -- folded when known ------------------------------------------------------------------------

def _fold_only(what: str, fix: str) -> Handler:
    """Folded with onnx's reference once every input is known (a float initializer among them keeps the
    importer from folding on its own); otherwise the unknown inputs are named as a data-dependent shape."""
    def lower(ctx: OnnxContext) -> list[Value]:
        if all(ctx.const(i) is not None for i in range(len(ctx.node.input)) if ctx.has_input(i)):
            check_fold_size(ctx, ctx.node)
            return fold_node(ctx, ctx.node)
        names = [ctx.node.input[i] for i in range(len(ctx.node.input)) if ctx.has_input(i) and ctx.const(i) is None]
        raise data_dependent(ctx, names, f"inputs {names} must be constants known at import time: {what}", fix)
    return lower


# -- Hardmax ----------------------------------------------------------------------------------

def _hardmax(ctx: OnnxContext) -> list[Value]:
    """Opset 13: one-hot of the first maximum along ``axis`` (default -1). Before 13: the input seen as
    2-D [prod(shape[:axis]), prod(shape[axis:])] (default axis 1), one-hot along the second axis."""
    s = ctx.shape(0)
    if ctx.dtype(0) != FLOAT:
        raise ctx.fail(f"Hardmax of {ctx.onnx_type(ctx.node.input[0])} input")
    if math.prod(s) == 0:
        raise ctx.fail(f"empty input {list(s)}")
    x = ctx.operand(0)
    if ctx.opset >= 13:
        axis = ctx.axis(int(ctx.attr("axis", -1)), len(s))
        work = s
    else:
        axis0 = ctx.axis(int(ctx.attr("axis", 1)), len(s)) if s else 0
        work = (math.prod(s[:axis0]), math.prod(s[axis0:]))
        x, axis = ctx.b.reshape(x, work, ctx.source), 1
    am = ctx.add("argmax", [x], {"axis": axis, "keepdim": True})
    pos = np.arange(work[axis], dtype=np.int64).reshape((work[axis],) + (1,) * (len(work) - axis - 1))
    hit = ctx.elementwise("eq", [am, _index_const(ctx, pos)])
    y = ctx.elementwise("where", [hit, ctx.scalar(1.0), ctx.scalar(0.0)])
    if tuple(ctx.b.shape(y)) != tuple(work):
        y = ctx.b.broadcast(y, work, ctx.source)
    return [y if work == s else ctx.b.reshape(y, s, ctx.source)]


# -- Swish / SwiGLU ---------------------------------------------------------------------------

def _swish_of(ctx: OnnxContext, x: int, alpha: float) -> int:
    if alpha == 1.0:
        return ctx.add("silu", [x])
    gate = ctx.add("sigmoid", [ctx.elementwise("mul_elem", [x, ctx.scalar(alpha)])])
    return ctx.elementwise("mul_elem", [x, gate])


def _float_input(ctx: OnnxContext, i: int) -> None:
    if ctx.dtype(i) != FLOAT:
        raise ctx.fail(f"{ctx.node.op_type} of {ctx.onnx_type(ctx.node.input[i])} input")


def _swish(ctx: OnnxContext) -> list[Value]:
    _float_input(ctx, 0)
    return [_swish_of(ctx, ctx.operand(0), float(ctx.attr("alpha", 1.0)))]


def _swiglu(ctx: OnnxContext) -> list[Value]:
    """``swish_alpha(a) * b``; A and B share one shape (no broadcasting, as the spec requires)."""
    _float_input(ctx, 0)
    if ctx.shape(0) != ctx.shape(1):
        raise ctx.fail(f"A {list(ctx.shape(0))} and B {list(ctx.shape(1))} differ in shape (SwiGLU does not "
                       "broadcast)")
    a = _swish_of(ctx, ctx.operand(0), float(ctx.attr("alpha", 1.0)))
    return [ctx.elementwise("mul_elem", [a, ctx.operand(1)])]


# -- MeanVarianceNormalization ----------------------------------------------------------------

def _mvn(ctx: OnnxContext) -> list[Value]:
    """The function body: (X - E[X]) / (sqrt(E[X^2] - E[X]^2) + 1e-9)."""
    _float_input(ctx, 0)
    s = ctx.shape(0)
    axes = tuple(sorted({ctx.axis(int(a), len(s)) for a in ctx.attr("axes", [0, 2, 3])}))
    x = ctx.operand(0)
    mean = ctx.add("reduce_mean_axes", [x], {"axes": axes, "keepdim": True})
    mean_sq = ctx.add("reduce_mean_axes", [ctx.elementwise("mul_elem", [x, x])], {"axes": axes, "keepdim": True})
    variance = ctx.elementwise("sub", [mean_sq, ctx.elementwise("mul_elem", [mean, mean])])
    std = ctx.add("sqrt", [variance])
    std = ctx.elementwise("add", [std, ctx.scalar(1e-9)])
    return [ctx.elementwise("div", [ctx.elementwise("sub", [x, mean]), std])]


# -- EyeLike ----------------------------------------------------------------------------------

def _eye_like(ctx: OnnxContext) -> list[Value]:
    from .ops_math import onnx_element_type
    s = ctx.shape(0)
    if len(s) != 2:
        raise ctx.fail(f"input rank {len(s)} (EyeLike takes a 2-D tensor)")
    dt = ctx.attr("dtype")
    etype = onnx_element_type(int(dt)) if dt is not None else ctx.dtype(0)
    np_type = {FLOAT: np.float64, INT64: np.int64, BOOL: bool}[etype]
    return [ctx.b.const(np.eye(s[0], s[1], k=int(ctx.attr("k", 0)), dtype=np_type), source=ctx.source, folded=True)]


# -- Compress ---------------------------------------------------------------------------------

def _compress(ctx: OnnxContext) -> list[Value]:
    """numpy.compress: the positions where the condition is true (a condition shorter than the axis keeps
    nothing beyond its end; a true entry past the end is an error)."""
    cond_c = ctx.const(1)
    if cond_c is None:
        raise data_dependent(ctx, [ctx.node.input[1]], "input 1 (condition) must be a constant known at import time: "
                             "the output shape is its count of true entries",
                             "keep the shape (Where with a fill value instead of a boolean mask)")
    cond = np.asarray(cond_c.value)
    if cond.ndim != 1:
        raise ctx.fail(f"condition of rank {cond.ndim} (Compress takes a 1-D condition)")
    s = ctx.shape(0)
    axis_attr = ctx.attr("axis")
    x = ctx.operand(0)
    if axis_attr is None:
        x, axis, extent = ctx.b.reshape(x, (math.prod(s),), ctx.source), 0, math.prod(s)
    else:
        axis = ctx.axis(int(axis_attr), len(s))
        extent = s[axis]
    keep = np.flatnonzero(cond.astype(bool))
    if keep.size and keep[-1] >= extent:
        raise ctx.fail(f"condition is true at position {int(keep[-1])}, beyond the axis extent {extent}")
    if keep.size == 0:
        raise ctx.fail("condition keeps no entry (an empty result)")
    return [ctx.add("gather", [x, _index_const(ctx, keep)], {"axis": axis})]


# -- TensorScatter ----------------------------------------------------------------------------

def _tensor_scatter(ctx: OnnxContext) -> list[Value]:
    """present = past with ``update`` written along ``axis`` at ``write_indices[batch] + j`` (modulo the
    cache length when circular): one ``gather`` from concat(past, update) with a table built at import."""
    mode = str(ctx.attr("mode", "linear"))
    if mode not in ("linear", "circular"):
        raise ctx.fail(f"mode={mode!r}")
    ps, us = ctx.shape(0), ctx.shape(1)
    if len(ps) != len(us) or len(ps) < 2:
        raise ctx.fail(f"past_cache {list(ps)} and update {list(us)}")
    axis = ctx.axis(int(ctx.attr("axis", -2)), len(ps))
    if axis == 0:
        raise ctx.fail("axis 0 (the batch axis)")
    if any(ps[i] != us[i] for i in range(len(ps)) if i != axis) or us[axis] > ps[axis]:
        raise ctx.fail(f"update {list(us)} does not fit past_cache {list(ps)} along axis {axis}")
    if ctx.has_input(2):
        idx = np.asarray(ctx.static(2, "write_indices")).astype(np.int64).reshape(-1)
        if idx.size != ps[0]:
            raise ctx.fail(f"write_indices has {idx.size} entries for batch {ps[0]}")
    else:
        idx = np.zeros(ps[0], dtype=np.int64)
    m, n = ps[axis], us[axis]
    pos = idx[:, None] + np.arange(n)[None, :]  # [batch, n] cache positions written
    if mode == "circular":
        pos = pos % m
    elif np.any((pos < 0) | (pos >= m)):
        raise ctx.fail(f"write positions {int(pos.min())}..{int(pos.max())} leave the cache of length {m}")
    # the concatenation along ``axis`` has the cache at [0, m) and the update at [m, m + n)
    table = np.broadcast_to(np.arange(m), (ps[0], m)).copy()
    rows = np.repeat(np.arange(ps[0]), n)
    table[rows, pos.reshape(-1)] = m + np.tile(np.arange(n), ps[0])
    both = ctx.add("concat", [ctx.operand(0), ctx.operand(1)], {"axis": axis})
    # gather along axis with a per-batch table: move axis next to batch, flatten [batch, m + n]
    perm = (0, axis) + tuple(i for i in range(1, len(ps)) if i != axis)
    inv = tuple(int(i) for i in np.argsort(perm))
    moved = ctx.add("permute", [both], {"perm": perm}) if perm != tuple(range(len(ps))) else both
    rest = tuple(ps[i] for i in perm[2:])
    flat = ctx.b.reshape(moved, (ps[0] * (m + n),) + rest, ctx.source)
    flat_idx = (np.arange(ps[0])[:, None] * (m + n) + table)
    out = ctx.add("gather", [flat, _index_const(ctx, flat_idx)], {"axis": 0})
    if perm != tuple(range(len(ps))):
        out = ctx.add("permute", [out], {"perm": inv})
    return [out]


# -- training-mode Dropout and BatchNormalization ---------------------------------------------

def _dropout(ctx: OnnxContext) -> list[Value]:
    """Training mode with ratio 0 keeps every element (mask all true), whatever the seed."""
    training = ctx.opset >= 12 and ctx.has_input(2) and \
        bool(np.asarray(ctx.static(2, "training_mode")).reshape(-1)[0])
    if not training:
        return ops_tensor.HANDLERS["Dropout"](ctx)
    ratio = float(np.asarray(ctx.static(1, "ratio")).reshape(-1)[0]) if ctx.has_input(1) else 0.5
    if ratio != 0.0:
        raise ctx.fail(f"training_mode=1 with ratio={ratio} (random; only ratio 0 is deterministic)")
    outs: list[Value] = [ctx.values[ctx.node.input[0]]]
    if len(ctx.node.output) > 1:
        outs.append(Const(np.ones(ctx.shape(0), dtype=bool), folded=True))
    return outs


def _batch_norm(ctx: OnnxContext) -> list[Value]:
    """BatchNormalization-14/15 with training_mode=1: Y from the batch statistics, and the running
    statistics input * momentum + batch statistic * (1 - momentum) (the reference's order)."""
    if not int(ctx.attr("training_mode", 0)) or ctx.opset < 14:
        return ops_nn.HANDLERS["BatchNormalization"](ctx)
    _float_input(ctx, 0)
    s = ctx.shape(0)
    if len(s) < 2:
        raise ctx.fail(f"input rank {len(s)}")
    c = s[1]
    axes = (0,) + tuple(range(2, len(s)))
    stat = (1, c) + (1,) * (len(s) - 2)

    def channel(i: int) -> int:
        if math.prod(ctx.shape(i)) != c:
            raise ctx.fail(f"input {i} has shape {list(ctx.shape(i))}, expected [{c}]")
        return ctx.b.reshape(ctx.operand(i), stat, ctx.source)

    x = ctx.operand(0)
    mean = ctx.add("reduce_mean_axes", [x], {"axes": axes, "keepdim": True})
    diff = ctx.elementwise("sub", [x, mean])
    var = ctx.add("reduce_mean_axes", [ctx.elementwise("mul_elem", [diff, diff])], {"axes": axes, "keepdim": True})
    eps = float(ctx.attr("epsilon", 1e-5))
    denom = ctx.add("sqrt", [ctx.elementwise("add", [var, ctx.scalar(eps)])])
    y = ctx.elementwise("div", [ctx.elementwise("mul_elem", [channel(1), diff]), denom])
    outs: list[Value] = [ctx.elementwise("add", [y, channel(2)])]
    momentum = float(ctx.attr("momentum", 0.9))
    for i, batch in ((3, mean), (4, var)):
        if len(ctx.node.output) <= len(outs) or not ctx.node.output[len(outs)]:
            break
        run = ctx.elementwise("add", [ctx.elementwise("mul_elem", [channel(i), ctx.scalar(momentum)]),
                                      ctx.elementwise("mul_elem", [batch, ctx.scalar(1.0 - momentum)])])
        outs.append(ctx.b.reshape(run, (c,), ctx.source))
    return outs


# -- LpNormalization --------------------------------------------------------------------------

def _lp_norm(ctx: OnnxContext) -> list[Value]:
    """x / ||x||_p along ``axis``, and 0 where the norm is 0 (onnx's reference: ``where(norm == 0, 0,
    x / norm)``); the divisor is 1 there, so no division by zero is evaluated."""
    _float_input(ctx, 0)
    x = ctx.operand(0)
    axis = ctx.axis(int(ctx.attr("axis", -1)), ctx.rank(0))
    p = int(ctx.attr("p", 2))
    if p not in (1, 2):
        raise ctx.fail(f"p={p} (only 1 and 2)")
    terms = ctx.elementwise("abs", [x]) if p == 1 else ctx.elementwise("mul_elem", [x, x])
    norm = ctx.add("reduce_sum_axes", [terms], {"axes": (axis,), "keepdim": True})
    if p == 2:
        norm = ctx.elementwise("sqrt", [norm])
    zero = ctx.elementwise("eq", [norm, ctx.scalar(0.0)])
    safe = ctx.elementwise("where", [zero, ctx.scalar(1.0), norm])
    quotient = ctx.elementwise("div", [x, safe])  # before the 0 constant: the order an exported file re-imports in
    return [ctx.elementwise("where", [zero, ctx.scalar(0.0), quotient])]


# -- CumProd / Det / BitCast (ext ops) --------------------------------------------------------

_INT_TYPES = {f"{p}int{b}": (b, p == "") for p in ("", "u") for b in (8, 16, 32, 64)}
_TYPE_NAMES = {"float": "float32", "double": "float64"}


def _onnx_type_name(ctx: OnnxContext, i: int) -> str:
    name = ctx.onnx_type(ctx.node.input[i])
    return _TYPE_NAMES.get(name, name)


def _cumprod(ctx: OnnxContext) -> list[Value]:
    s = ctx.shape(0)
    axis = ctx.axis(int(np.asarray(ctx.static(1, "axis")).reshape(-1)[0]), len(s))
    attrs = {"axis": axis, "exclusive": bool(ctx.attr("exclusive", 0)), "reverse": bool(ctx.attr("reverse", 0))}
    if ctx.dtype(0) == INT64:
        t = _onnx_type_name(ctx, 0)
        if t not in _INT_TYPES:
            raise ctx.fail(f"CumProd of {t} input")
        attrs["bits"], attrs["signed"] = _INT_TYPES[t]
    elif ctx.dtype(0) != FLOAT:
        raise ctx.fail(f"CumProd of {ctx.onnx_type(ctx.node.input[0])} input")
    return [ctx.add("cumprod", [ctx.operand(0)], attrs)]


def _det(ctx: OnnxContext) -> list[Value]:
    _float_input(ctx, 0)
    return [ctx.add("det", [ctx.operand(0)])]


def _bitcast(ctx: OnnxContext) -> list[Value]:
    from onnx import helper
    from torchlean_bridge.ops.ext import BITCAST_TYPES
    source = _onnx_type_name(ctx, 0)
    try:
        target = np.dtype(helper.tensor_dtype_to_np_dtype(int(ctx.attr("to")))).name
    except (KeyError, TypeError, ValueError):
        raise ctx.fail(f"to={ctx.attr('to')}") from None
    target = {"bool": "bool"}.get(target, target)
    for t in (source, target):
        if t not in BITCAST_TYPES:
            raise ctx.fail(f"BitCast between {source} and {target} ({t} values are not held exactly)")
    if BITCAST_TYPES[source] != BITCAST_TYPES[target]:
        raise ctx.fail(f"{source} and {target} differ in width")
    if source == target:
        return [ctx.values[ctx.node.input[0]]]
    return [ctx.add("bitcast", [ctx.operand(0)], {"source": source, "target": target})]


HANDLERS: dict[str, Handler] = {
    "CumProd": _cumprod, "Det": _det, "BitCast": _bitcast, "LpNormalization": _lp_norm,
    "NonMaxSuppression": _fold_only("the number of selected boxes depends on their values",
                                    "fix the count (select a constant number of boxes, e.g. TopK of the scores)"),
    "Unique": _fold_only("the number of unique values depends on the data", "fix the count"),
    "ConstantOfShape": _fold_only("the output shape is the input's value", "give a constant shape"),
    "HannWindow": _fold_only("the window length is the input's value", "give a constant length"),
    "HammingWindow": _fold_only("the window length is the input's value", "give a constant length"),
    "BlackmanWindow": _fold_only("the window length is the input's value", "give a constant length"),
    "MelWeightMatrix": _fold_only("the matrix shape is set by the inputs' values", "give constant sizes"),
    "Hardmax": _hardmax, "Swish": _swish, "SwiGLU": _swiglu, "MeanVarianceNormalization": _mvn,
    "EyeLike": _eye_like, "Compress": _compress, "TensorScatter": _tensor_scatter, "Dropout": _dropout,
    "BatchNormalization": _batch_norm,
}
# Hardmax-1/11 (2-D coercion), -13 (one axis); EyeLike-9, -22 (types); Compress-9/11 (negative axis), -28
# (types); ConstantOfShape-9..25 (types); Unique-11, -28 (types); the windows and MelWeightMatrix-17;
# Swish-24; SwiGLU-28; TensorScatter-24; MeanVarianceNormalization-9/13 (types); NonMaxSuppression-10/11
OPSETS: dict[str, tuple[int, int]] = {
    "CumProd": (26, 26), "Det": (11, 22), "BitCast": (26, 26), "LpNormalization": (1, 22),
    "NonMaxSuppression": (10, 11), "Unique": (11, 28), "ConstantOfShape": (9, 25), "HannWindow": (17, 17),
    "HammingWindow": (17, 17), "BlackmanWindow": (17, 17), "MelWeightMatrix": (17, 17), "Hardmax": (1, 13),
    "Swish": (24, 24), "SwiGLU": (28, 28), "MeanVarianceNormalization": (9, 13), "EyeLike": (9, 22),
    "Compress": (9, 28), "TensorScatter": (24, 24), "Dropout": ops_tensor.OPSETS["Dropout"],
    "BatchNormalization": ops_nn.OPSETS["BatchNormalization"],
}
EMITS = frozenset({"cumprod", "det", "bitcast", "abs", "reduce_sum_axes", "argmax", "eq", "where", "broadcast_to", "reshape", "silu", "sigmoid", "mul_elem", "add", "sub",
                   "div", "sqrt", "reduce_mean_axes", "const", "gather", "concat", "permute"}) \
    | ops_tensor.EMITS | ops_nn.EMITS
