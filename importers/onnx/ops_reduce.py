"""ONNX reductions over empty sets and bool tensors, and Clip / MaxPool / CumSum on integers (issue #15).

A reduction whose reduced axes hold no element is the identity of its operation (onnx's reference and
spec: 0 for sums and norms, 1 for a product, -inf for max, log-sum and log-sum-exp, +inf for min;
False / True for a bool max / min): a constant of the output shape. ``ReduceMax``/``ReduceMin`` of
bool tensors are the float max/min of 0/1 cast back to bool. Integer ``ReduceSum``/``ReduceProd``/
``ReduceMax``/``ReduceMin`` (and ``ReduceL1``/``ReduceSumSquare`` of ``|x|``/``x * x``) are the exact
``int_reduce_*`` kinds (issue #32). ``Clip`` on integers is
``int_min(int_max(x, min), max)`` in the input's type; ``MaxPool`` on 8- and 16-bit integers pools
their float values (exact: every such integer is a binary32 value) and casts back; ``CumSum`` on
integers is the exact ``int_cumsum``. Everything else keeps ops_math's / ops_nn's lowering.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from torchlean_bridge.ops import BOOL, FLOAT, INT64

from . import ops_math, ops_nn
from .context import OnnxContext, Value
from .ops_math import _reduce_axes

__all__ = ["HANDLERS", "OPSETS", "EMITS"]

Handler = Callable[[OnnxContext], list[Value]]

_AXES_INPUT_SINCE = {"ReduceSum": 13}  # every other Reduce* takes its axes as an input from opset 18
_FLOAT_IDENTITY = {"ReduceSum": 0.0, "ReduceSumSquare": 0.0, "ReduceL1": 0.0, "ReduceL2": 0.0, "ReduceProd": 1.0,
                   "ReduceMax": -np.inf, "ReduceMin": np.inf, "ReduceLogSum": -np.inf, "ReduceLogSumExp": -np.inf}
_BOOL_IDENTITY = {"ReduceMax": False, "ReduceMin": True}
_INT_TYPES = {f"{p}int{b}": (b, p == "") for p in ("", "u") for b in (8, 16, 32, 64)}


def _int_attrs(ctx: OnnxContext) -> dict:
    t = ctx.onnx_type(ctx.node.input[0])
    if t not in _INT_TYPES:
        raise ctx.fail(f"{ctx.node.op_type} of {t} input")
    bits, signed = _INT_TYPES[t]
    return {"bits": bits, "signed": signed}


def _reduce(op: str) -> Handler:
    previous = ops_math.HANDLERS[op]

    def lower(ctx: OnnxContext) -> list[Value]:
        reduced = _reduce_axes(ctx, _AXES_INPUT_SINCE.get(op, 18))
        if ctx.dtype(0) == INT64 and op in _INT_REDUCE:
            return [_int_reduce(ctx, op, reduced)]
        if reduced is None:
            if ctx.dtype(0) == BOOL and op in _BOOL_IDENTITY:
                return [ctx.values[ctx.node.input[0]]]
            return previous(ctx)
        axes, keep = reduced
        s = ctx.shape(0)
        if math.prod(s[a] for a in axes) == 0:
            return [_identity(ctx, s, axes, keep)]
        if ctx.dtype(0) == BOOL and op in _BOOL_IDENTITY:
            kind = "reduce_max" if op == "ReduceMax" else "reduce_min"
            as_float = ctx.add("cast", [ctx.operand(0)], {"dtype": FLOAT})
            r = ctx.add(kind, [as_float], {"axes": tuple(axes), "keepdim": keep})
            return [ctx.add("cast", [r], {"dtype": BOOL})]
        return previous(ctx)
    return lower


# integer reductions (issue #32): exact int64 kinds; ReduceL1 / ReduceSumSquare reduce |x| / x * x computed
# exactly in the input's type (a square outside the type is refused, as every integer op refuses a wrap)
_INT_REDUCE = {"ReduceSum": "int_reduce_sum", "ReduceProd": "int_reduce_prod", "ReduceMax": "int_reduce_max",
               "ReduceMin": "int_reduce_min", "ReduceL1": "int_reduce_sum", "ReduceSumSquare": "int_reduce_sum"}


def _int_reduce(ctx: OnnxContext, op: str, reduced: tuple[list[int], bool] | None) -> int:
    attrs = _int_attrs(ctx)
    x = ctx.operand(0)
    if op == "ReduceL1" and attrs["signed"]:  # |x| of an unsigned value is x
        zero = ctx.b.const(np.zeros(ctx.shape(0), dtype=np.int64), source=ctx.source, folded=True)
        x = ctx.add("int_max", [x, ctx.add("int_sub", [zero, x], attrs)], attrs)
    elif op == "ReduceSumSquare":
        x = ctx.add("int_mul", [x, x], attrs)
    if reduced is None:
        return x
    axes, keep = reduced
    s = ctx.shape(0)
    if math.prod(s[a] for a in axes) == 0:
        return _identity(ctx, s, axes, keep)
    return ctx.add(_INT_REDUCE[op], [x], {"axes": tuple(axes), "keepdim": keep, **attrs})


def _int_identity(ctx: OnnxContext, op: str) -> int:
    """The identity of an integer reduction: 0, 1, or the type's least / greatest value (ONNX Reduce*-18)."""
    bits, signed = _int_attrs(ctx)["bits"], _int_attrs(ctx)["signed"]
    least, greatest = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    value = {"ReduceMax": least, "ReduceMin": greatest, "ReduceProd": 1}.get(op, 0)
    if value > np.iinfo(np.int64).max:
        raise ctx.fail(f"{op} over an empty set of uint64 values ({value} is beyond int64)")
    return value


def _identity(ctx: OnnxContext, s: tuple[int, ...], axes: list[int], keep: bool) -> int:
    op = ctx.node.op_type
    shape = tuple(1 if i in axes else d for i, d in enumerate(s)) if keep else \
        tuple(d for i, d in enumerate(s) if i not in axes)
    if math.prod(shape) > ctx.max_elements:
        raise ctx.fail(f"an output of {math.prod(shape)} elements exceeds the limit of {ctx.max_elements}")
    if ctx.dtype(0) == BOOL and op in _BOOL_IDENTITY:
        value = np.full(shape, _BOOL_IDENTITY[op])
    elif ctx.dtype(0) == FLOAT and op in _FLOAT_IDENTITY:
        value = np.full(shape, _FLOAT_IDENTITY[op], dtype=np.float64)
    elif ctx.dtype(0) == INT64 and op in _INT_REDUCE:
        value = np.full(shape, _int_identity(ctx, op), dtype=np.int64)
    else:
        raise ctx.fail(f"{op} over an empty set of {ctx.onnx_type(ctx.node.input[0])} values")
    return ctx.b.const(value, source=ctx.source, folded=True)


# -- Clip / MaxPool / CumSum on integers ------------------------------------------------------

def _clip(ctx: OnnxContext) -> list[Value]:
    if ctx.dtype(0) != INT64:
        return ops_math.HANDLERS["Clip"](ctx)
    if ctx.opset < 11:
        raise ctx.fail("integer Clip before opset 11 (float min/max attributes)")
    attrs = _int_attrs(ctx)
    x = ctx.operand(0)
    for i, kind in ((1, "int_max"), (2, "int_min")):
        if ctx.has_input(i):
            bound = np.asarray(ctx.static(i, "min" if i == 1 else "max")).reshape(-1)
            if bound.size != 1:
                raise ctx.fail(f"input {i} has {bound.size} values (a scalar)")
            c = ctx.b.const(np.full(ctx.shape(0), int(bound[0]), dtype=np.int64), source=ctx.source, folded=True)
            x = ctx.add(kind, [x, c], attrs)
    return [x]


def _max_pool(ctx: OnnxContext) -> list[Value]:
    previous = ops_nn.HANDLERS["MaxPool"]
    if ctx.dtype(0) != INT64:
        return previous(ctx)
    bits = _int_attrs(ctx)["bits"]
    if bits > 16:
        raise ctx.fail(f"MaxPool of {ctx.onnx_type(ctx.node.input[0])} values (only 8- and 16-bit integers are held "
                       "exactly by binary32)")
    name = ctx.node.input[0]
    original = ctx.values[name]
    ctx.values[name] = ctx.add("cast", [ctx.operand(0)], {"dtype": FLOAT})
    try:
        pooled = previous(ctx)
    finally:
        ctx.values[name] = original
    return [ctx.add("cast", [pooled[0]], {"dtype": INT64})] + pooled[1:]


def _cumsum(ctx: OnnxContext) -> list[Value]:
    if ctx.dtype(0) != INT64:
        return ops_math.HANDLERS["CumSum"](ctx)
    axis = ctx.axis(int(np.asarray(ctx.static(1, "axis")).reshape(-1)[0]), ctx.rank(0))
    return [ctx.add("int_cumsum", [ctx.operand(0)], {"axis": axis, "exclusive": bool(ctx.attr("exclusive", 0)),
                                                     "reverse": bool(ctx.attr("reverse", 0)), **_int_attrs(ctx)})]


_REDUCE_OPS = ("ReduceSum", "ReduceSumSquare", "ReduceL1", "ReduceL2", "ReduceProd", "ReduceMax", "ReduceMin",
               "ReduceLogSum", "ReduceLogSumExp", "ReduceMean")
HANDLERS: dict[str, Handler] = {**{op: _reduce(op) for op in _REDUCE_OPS}, "Clip": _clip, "MaxPool": _max_pool,
                                "CumSum": _cumsum}
OPSETS: dict[str, tuple[int, int]] = {op: ops_math.OPSETS[op] for op in _REDUCE_OPS + ("Clip", "CumSum")}
OPSETS["MaxPool"] = ops_nn.OPSETS["MaxPool"]
EMITS = frozenset({"const", "cast", "reduce_max", "reduce_min", "int_max", "int_min", "int_cumsum", "int_sub",
                   "int_mul", "int_reduce_sum", "int_reduce_prod", "int_reduce_max", "int_reduce_min"}) \
    | ops_math.EMITS | ops_nn.EMITS
