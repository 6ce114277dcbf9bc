"""ONNX elementwise, activation, comparison and reduction ops (opset-aware lowering functions).

Each handler reads the node being lowered from the context and returns one value per ONNX output.
Broadcasting is made explicit through ``GraphBuilder.elementwise``; attribute-vs-input forms
(``Clip`` min/max, reduction ``axes``) follow the opset that introduced them.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from torchlean_bridge.ops import BOOL, FLOAT, INT64
from torchlean_bridge.ops.contracts import broadcast_shapes

from .context import Const, OnnxContext, Value

__all__ = ["HANDLERS", "EMITS", "onnx_element_type", "refuse_wrapping_cast", "refuse_mixed_precision_cast"]

Handler = Callable[[OnnxContext], list[Value]]

_BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul_elem", "Div": "div",
           "Equal": "eq", "Less": "lt", "LessOrEqual": "le", "Greater": "gt", "GreaterOrEqual": "ge",
           "And": "logical_and", "Or": "logical_or"}

_UNARY = {"Relu": "relu", "Tanh": "tanh", "Sigmoid": "sigmoid", "Exp": "exp", "Log": "log", "Sqrt": "sqrt",
          "Abs": "abs", "Neg": "neg", "Reciprocal": "inv", "Sin": "sin", "Cos": "cos", "Tan": "tan", "Erf": "erf",
          "Softplus": "softplus", "Softsign": "softsign", "Sign": "sign", "Floor": "floor", "Ceil": "ceil",
          "HardSwish": "hardswish", "Mish": "mish", "Not": "logical_not", "IsNaN": "isnan", "Round": "round",
          "Atan": "atan", "Asin": "asin", "Acos": "acos", "Sinh": "sinh", "Cosh": "cosh", "Asinh": "asinh",
          "Acosh": "acosh", "Atanh": "atanh"}

# ONNX TensorProto element types -> our element types
# (the narrow types are held exactly in float / int64 values: docs/element-types.md, ops_cast.py)
_NARROW_FLOATS = {10, 16, 17, 18, 19, 20, 23, 24, 27, 28}  # float16, bfloat16, float8*, float4, e8m0, float6*
_FLOATS, _INTS = {1, 11} | _NARROW_FLOATS, {2, 3, 4, 5, 6, 7, 12, 13, 21, 22, 25, 26}
SELU_ALPHA, SELU_GAMMA = 1.67326319217681884765625, 1.05070102214813232421875


def onnx_element_type(elem_type: int) -> str | None:
    if elem_type in _FLOATS:
        return FLOAT
    if elem_type in _INTS:
        return INT64
    if elem_type == 9:
        return BOOL
    return None


def _binary(kind: str) -> Handler:
    def lower(ctx: OnnxContext) -> list[Value]:
        return [ctx.elementwise(kind, [ctx.operand(0), ctx.operand(1)])]
    return lower


def _unary(kind: str) -> Handler:
    def lower(ctx: OnnxContext) -> list[Value]:
        return [ctx.add(kind, [ctx.operand(0)])]
    return lower


def _activation(kind: str, **onnx_attrs: tuple[str, float]) -> Handler:
    """Unary op with float attributes: ``ir_attr=(onnx_attr, onnx_default)``."""
    def lower(ctx: OnnxContext) -> list[Value]:
        attrs = {ir: float(ctx.attr(name, default)) for ir, (name, default) in onnx_attrs.items()}
        return [ctx.add(kind, [ctx.operand(0)], attrs)]
    return lower


def _selu(ctx: OnnxContext) -> list[Value]:
    alpha, gamma = ctx.attr("alpha", SELU_ALPHA), ctx.attr("gamma", SELU_GAMMA)
    if not (np.isclose(alpha, SELU_ALPHA, rtol=1e-6) and np.isclose(gamma, SELU_GAMMA, rtol=1e-6)):
        raise ctx.fail(f"Selu with alpha={alpha}, gamma={gamma} (only the standard constants are supported)")
    return [ctx.add("selu", [ctx.operand(0)])]


def _gelu(ctx: OnnxContext) -> list[Value]:
    return [ctx.add("gelu", [ctx.operand(0)], {"approximate": ctx.attr("approximate", "none")})]


def _prelu(ctx: OnnxContext) -> list[Value]:
    return [ctx.elementwise("prelu", [ctx.operand(0), ctx.operand(1)])]


def _pow(ctx: OnnxContext) -> list[Value]:
    exp = ctx.needed(1, "exponent")
    if exp.value.size == 0 or not np.all(exp.value == exp.value.reshape(-1)[0]):
        raise ctx.fail("the exponent must be a constant with a single value")
    out_shape = broadcast_shapes(ctx.shape(0), tuple(exp.value.shape), "Pow")
    x = ctx.b.broadcast(ctx.operand(0), out_shape, ctx.source)
    return [ctx.add("pow", [x], {"exponent": float(exp.value.reshape(-1)[0])})]


def _variadic(kind: str, mean: bool = False) -> Handler:
    """``Sum``/``Max``/``Min``/``Mean`` over several inputs: a left fold, then ``/ n`` for Mean."""
    def lower(ctx: OnnxContext) -> list[Value]:
        ops = ctx.operands()
        if len(ops) == 1 and not mean:
            return [ctx.values[ctx.node.input[0]]]
        acc = ops[0]
        for o in ops[1:]:
            acc = ctx.elementwise(kind, [acc, o])
        if mean and len(ops) > 1:
            acc = ctx.elementwise("div", [acc, ctx.scalar(float(len(ops)))])
        return [acc]
    return lower


def _clip(ctx: OnnxContext) -> list[Value]:
    if ctx.opset < 11:
        lo, hi = ctx.attr("min"), ctx.attr("max")
    else:
        lo = float(np.asarray(ctx.static(1, "min")).reshape(-1)[0]) if ctx.has_input(1) else None
        hi = float(np.asarray(ctx.static(2, "max")).reshape(-1)[0]) if ctx.has_input(2) else None
    lo = None if lo is None or lo <= -3.4e38 else float(lo)
    hi = None if hi is None or hi >= 3.4e38 else float(hi)
    if lo is None and hi is None:
        return [ctx.values[ctx.node.input[0]]]
    return [ctx.add("clamp", [ctx.operand(0)], {"min": lo, "max": hi})]


def _where(ctx: OnnxContext) -> list[Value]:
    return [ctx.elementwise("where", [ctx.operand(0), ctx.operand(1), ctx.operand(2)])]


def _thresholded_relu(ctx: OnnxContext) -> list[Value]:
    """x where x > alpha, else 0."""
    x = ctx.operand(0)
    keep = ctx.elementwise("gt", [x, ctx.scalar(float(ctx.attr("alpha", 1.0)))])
    return [ctx.elementwise("where", [keep, x, ctx.scalar(0.0)])]


def _shrink(ctx: OnnxContext) -> list[Value]:
    """x - bias above lambd, x + bias below -lambd, 0 between (the ONNX definition)."""
    x = ctx.operand(0)
    lambd, bias = float(ctx.attr("lambd", 0.5)), float(ctx.attr("bias", 0.0))
    below = ctx.elementwise("where", [ctx.elementwise("lt", [x, ctx.scalar(-lambd)]),
                                      ctx.elementwise("add", [x, ctx.scalar(bias)]), ctx.scalar(0.0)])
    return [ctx.elementwise("where", [ctx.elementwise("gt", [x, ctx.scalar(lambd)]),
                                      ctx.elementwise("sub", [x, ctx.scalar(bias)]), below])]


def _is_inf(ctx: OnnxContext) -> list[Value]:
    """x == +inf and/or x == -inf, as detect_positive / detect_negative ask."""
    x = ctx.operand(0)
    tests = [ctx.elementwise("eq", [x, ctx.scalar(sign * np.inf)])
             for sign, flag in ((1.0, "detect_positive"), (-1.0, "detect_negative")) if ctx.attr(flag, 1)]
    if not tests:  # detects nothing: all false, a constant later nodes fold
        return [Const(np.zeros(ctx.shape(0), dtype=bool), folded=True)]
    return [tests[0] if len(tests) == 1 else ctx.elementwise("logical_or", tests)]


_INT64 = 7


def refuse_wrapping_cast(ctx: OnnxContext, to: int) -> None:
    """A computed tensor cast to an integer type other than int64: ONNX wraps values outside that
    type (300 -> 44 as uint8), and the IR holds every integer as int64, so it is refused (constants
    fold with ONNX's own conversion; bool sources always fit)."""
    if to in _INTS and to != _INT64 and ctx.const(0) is None and ctx.dtype(0) != BOOL:
        from .inputs import element_type_name
        name = element_type_name(to)
        raise ctx.fail(f"cast of a computed {ctx.onnx_type(ctx.node.input[0])} tensor to {name}: values outside "
                       f"{name} wrap around, which the IR (integers as int64) cannot express")


_FLOAT_WIDTHS = {1: "float32", 11: "float64"}


def refuse_mixed_precision_cast(ctx: OnnxContext, to: int) -> None:
    """The evaluator computes every float in one precision (``ctx.precision``). A cast of a computed
    tensor between float32 and float64 is exact there only when it widens a graph input into that
    precision (nothing computed it yet) or narrows a value that only leaves the graph (the output
    conversion rounds it alike); anywhere else the model computes in two precisions, and evaluating
    it in one would silently skip (or add) a rounding, so it is refused."""
    name = ctx.node.input[0]
    source, target = _FLOAT_WIDTHS.get(ctx.onnx_types.get(name, 0)), _FLOAT_WIDTHS.get(to)
    if source is None or target is None or source == target or ctx.const(0) is not None:
        return
    widens_an_input = target == ctx.precision and name in ctx.graph_inputs
    out = ctx.node.output[0]
    only_output = target != ctx.precision and ctx.consumer_count(out) == ctx.graph_outputs.count(out) > 0
    if not (widens_an_input or only_output):
        raise ctx.fail(f"cast of a computed {source} tensor to {target} inside a model evaluated in "
                       f"{ctx.precision}: the model computes in two float precisions, the evaluator in one")


def _cast(ctx: OnnxContext) -> list[Value]:
    to = int(ctx.attr("to"))
    target = onnx_element_type(to)
    if target is None or to in _NARROW_FLOATS:
        raise ctx.fail(f"cast to ONNX element type {to} (a narrower float rounds values; no exact IR op)")
    refuse_wrapping_cast(ctx, to)
    refuse_mixed_precision_cast(ctx, to)
    if ctx.dtype(0) == target:
        return [ctx.values[ctx.node.input[0]]]
    return [ctx.add("cast", [ctx.operand(0)], {"dtype": target})]


# -- reductions -------------------------------------------------------------------------------

_REDUCE = {"ReduceSum": ("reduce_sum", 13), "ReduceMean": ("reduce_mean", 18), "ReduceMax": ("reduce_max", 18),
           "ReduceMin": ("reduce_min", 18), "ReduceProd": ("reduce_prod", 18)}


def _reduce_axes(ctx: OnnxContext, axes_input_since: int) -> tuple[list[int], bool] | None:
    """The sorted reduced axes and keepdims of a Reduce* node; None when it reduces nothing."""
    rank = ctx.rank(0)
    axes = ctx.ints(1, "axes") if ctx.opset >= axes_input_since else ctx.attr("axes")
    if not axes:
        if ctx.opset >= axes_input_since and ctx.attr("noop_with_empty_axes", 0):
            return None
        axes = list(range(rank))
    axes = sorted(ctx.axis(a, rank) for a in axes)
    return (axes, bool(ctx.attr("keepdims", 1))) if axes else None


def _reduce_node(ctx: OnnxContext, kind: str, x: Value, axes: list[int], keep: bool) -> Value:
    if kind in ("reduce_sum", "reduce_mean") and len(axes) == 1 and not keep:
        return ctx.add(kind, [x], {"axis": axes[0]})
    wire_kind = kind + "_axes" if kind in ("reduce_sum", "reduce_mean") else kind
    return ctx.add(wire_kind, [x], {"axes": tuple(axes), "keepdim": keep})


def _reduce(op: str) -> Handler:
    kind, axes_input_since = _REDUCE[op]

    def lower(ctx: OnnxContext) -> list[Value]:
        reduced = _reduce_axes(ctx, axes_input_since)
        if reduced is None:
            return [ctx.values[ctx.node.input[0]]]
        return [_reduce_node(ctx, kind, ctx.operand(0), *reduced)]
    return lower


def _composite_reduce(ctx: OnnxContext) -> list[Value]:
    """ReduceL1, ReduceL2, ReduceSumSquare, ReduceLogSum and ReduceLogSumExp by their definitions
    (sum of |x|, sqrt of the sum of squares, ..., log of the sum of exp(x - max) plus max); with no
    axes to reduce (noop_with_empty_axes) each is its elementwise part alone, as the ONNX spec says."""
    op = ctx.node.op_type
    reduced = _reduce_axes(ctx, 18)
    x = ctx.operand(0)
    if op == "ReduceLogSumExp":
        if reduced is None:
            return [x]
        axes, keep = reduced
        top = _reduce_node(ctx, "reduce_max", x, axes, True)
        shifted = ctx.elementwise("exp", [ctx.elementwise("sub", [x, top])])
        total = ctx.elementwise("log", [_reduce_node(ctx, "reduce_sum", shifted, axes, True)])
        out = ctx.elementwise("add", [total, top])
        if keep:
            return [out]
        return [ctx.b.reshape(out, tuple(d for i, d in enumerate(ctx.shape(0)) if i not in axes), ctx.source)]
    inner = {"ReduceL1": lambda: ctx.elementwise("abs", [x]), "ReduceLogSum": lambda: x}.get(
        op, lambda: ctx.elementwise("mul_elem", [x, x]))()
    total = inner if reduced is None else _reduce_node(ctx, "reduce_sum", inner, *reduced)
    if op == "ReduceL2":
        return [ctx.elementwise("sqrt", [total])]
    if op == "ReduceLogSum":
        return [ctx.elementwise("log", [total])]
    return [total]


def _cumsum(ctx: OnnxContext) -> list[Value]:
    axis = ctx.axis(int(np.asarray(ctx.static(1, "axis")).reshape(-1)[0]), ctx.rank(0))
    return [ctx.add("cumsum", [ctx.operand(0)], {"axis": axis, "exclusive": bool(ctx.attr("exclusive", 0)),
                                                  "reverse": bool(ctx.attr("reverse", 0))})]


def _topk(ctx: OnnxContext) -> list[Value]:
    """``TopK`` values (sorted, which is what onnxruntime returns either way); the Indices output is
    refused when something reads it (positions that depend on the values have no IR op)."""
    if len(ctx.node.output) > 1 and ctx.node.output[1] and ctx.consumer_count(ctx.node.output[1]):
        raise ctx.fail("the Indices output is read (positions that depend on the values have no IR op)")
    if ctx.opset < 10:
        k = int(ctx.attr("k"))
    else:
        k = int(np.asarray(ctx.static(1, "K")).reshape(-1)[0])
    axis = ctx.axis(int(ctx.attr("axis", -1)), ctx.rank(0))
    return [ctx.add("sort", [ctx.operand(0)], {"axis": axis, "k": k, "descending": bool(ctx.attr("largest", 1))})]


def _arg(kind: str) -> Handler:
    def lower(ctx: OnnxContext) -> list[Value]:
        if ctx.attr("select_last_index", 0):
            raise ctx.fail("select_last_index=1")
        axis = ctx.axis(int(ctx.attr("axis", 0)), ctx.rank(0))
        return [ctx.add(kind, [ctx.operand(0)], {"axis": axis, "keepdim": bool(ctx.attr("keepdims", 1))})]
    return lower


HANDLERS: dict[str, Handler] = {
    **{op: _binary(kind) for op, kind in _BINARY.items()},
    **{op: _unary(kind) for op, kind in _UNARY.items()},
    "LeakyRelu": _activation("leaky_relu", negative_slope=("alpha", 0.01)),
    "Elu": _activation("elu", alpha=("alpha", 1.0)),
    "Celu": _activation("celu", alpha=("alpha", 1.0)),
    "HardSigmoid": _activation("hardsigmoid", alpha=("alpha", 0.2), beta=("beta", 0.5)),
    "Selu": _selu,
    "Gelu": _gelu,
    "PRelu": _prelu,
    "Pow": _pow,
    "Max": _variadic("max_elem"),
    "Min": _variadic("min_elem"),
    "Sum": _variadic("add"),
    "Mean": _variadic("add", mean=True),
    "Clip": _clip,
    "ThresholdedRelu": _thresholded_relu,
    "Shrink": _shrink,
    "IsInf": _is_inf,
    "Where": _where,
    "Cast": _cast,
    **{op: _reduce(op) for op in _REDUCE},
    **dict.fromkeys(("ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp"), _composite_reduce),
    "CumSum": _cumsum,
    "TopK": _topk,
    "ArgMax": _arg("argmax"),
    "ArgMin": _arg("argmin"),
}

# The ONNX operator versions (``since_version``) each handler implements. Where a later version
# changed semantics (not just added element types), the range stops before it; earlier versions with
# other semantics (legacy ``broadcast``/``axis`` attributes before 7, Cast's string ``to``) are
# reached by upgrading the model with onnx.version_converter.
_UNARY_SINCE = {"Sin": 7, "Cos": 7, "Tan": 7, "Asin": 7, "Acos": 7, "Atan": 7, "Erf": 9, "Sign": 9, "IsNaN": 9,
                "Sinh": 9, "Cosh": 9, "Asinh": 9, "Acosh": 9, "Atanh": 9, "HardSwish": 14, "Mish": 18, "Round": 11}
_UNARY_LAST = {"Relu": 14, "Sin": 22, "Cos": 22, "Tan": 22, "Asin": 22, "Acos": 22, "Atan": 22, "Sinh": 22,
               "Cosh": 22, "Asinh": 22, "Acosh": 22, "Atanh": 22, "Softplus": 22, "Softsign": 22, "HardSwish": 22,
               "Mish": 22, "Round": 22, "IsNaN": 20, "Not": 1}
OPSETS: dict[str, tuple[int, int]] = {
    **{op: (7, 14) for op in ("Add", "Sub", "Mul", "Div")},
    # Equal/Less/Greater/And/Or-1 differ from -7 only by their broadcast attributes, which legacy.py makes
    # explicit (onnx.version_converter has no adapter from them)
    "Equal": (1, 19), "Less": (1, 13), "Greater": (1, 13), "LessOrEqual": (12, 16), "GreaterOrEqual": (12, 16),
    "And": (1, 7), "Or": (1, 7),
    **{op: (_UNARY_SINCE.get(op, 1), _UNARY_LAST.get(op, 13)) for op in _UNARY},
    "LeakyRelu": (1, 16), "Elu": (1, 22), "Celu": (12, 28), "HardSigmoid": (1, 22), "Selu": (1, 22), "Gelu": (20, 20),
    "PRelu": (7, 16), "Pow": (7, 15), "Max": (1, 13), "Min": (1, 13), "Sum": (1, 13), "Mean": (1, 13),
    "Clip": (1, 13), "ThresholdedRelu": (10, 22), "Shrink": (9, 9), "IsInf": (10, 20), "Where": (9, 16),
    "Cast": (6, 28), "ReduceSum": (1, 13), "ReduceMean": (1, 18), "ReduceMax": (1, 20), "ReduceMin": (1, 20),
    "ReduceProd": (1, 18), "ReduceL1": (1, 18), "ReduceL2": (1, 18), "ReduceSumSquare": (1, 18),
    "ReduceLogSum": (1, 28), "ReduceLogSumExp": (1, 28), "CumSum": (11, 14), "TopK": (1, 24), "ArgMax": (1, 13),
    "ArgMin": (1, 13),
}

EMITS = frozenset({*_BINARY.values(), *_UNARY.values(), "leaky_relu", "elu", "celu", "hardsigmoid", "selu",
                   "gelu", "prelu", "pow", "max_elem", "min_elem", "clamp", "where", "cast", "reduce_sum",
                   "reduce_mean", "reduce_sum_axes", "reduce_mean_axes", "reduce_max", "reduce_min",
                   "reduce_prod", "argmax", "argmin", "broadcast_to", "const", "linear", "abs", "sqrt", "log", "exp",
                   "sub", "add", "mul_elem", "reshape", "gt", "lt", "eq", "logical_or", "cumsum", "sort"})
