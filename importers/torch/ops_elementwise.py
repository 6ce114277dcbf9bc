"""Elementwise lowerings: arithmetic, comparisons, logic, unary functions, activations, casts.

Each function takes the ``Lowerer`` and the resolved arguments with ATen-style names (``input``,
``other``) and returns the value of the framework node; its decorator names the framework targets
it lowers. Broadcasting is explicit (``GraphBuilder.elementwise``) and Python scalars become rank-0
consts in the element type they meet.
"""

from __future__ import annotations

from typing import Any

import torch

from torchlean_bridge.ops.contracts import broadcast_shapes
from torchlean_bridge.ops import BOOL, FLOAT, INT64

from .common import Known, NotLowerable, Sym, element_type
from .lowerer import Lowerer
from .targets import lowers, register

Cx = Lowerer


# -- element types -------------------------------------------------------------------------------
def promote(cx: Cx, *operands: Any) -> str:
    """PyTorch's category promotion: bool < int64 < float (a float scalar makes ints float)."""
    order = {BOOL: 0, INT64: 1, FLOAT: 2}
    return max((cx.etype(o) for o in operands if o is not None), key=order.__getitem__)


def is_tensor(v: Any) -> bool:
    return isinstance(v, (Sym, Known, torch.Tensor))


@lowers(aten="contiguous.default clone.default alias.default detach.default lift_fresh_copy.default "
             "_assert_tensor_metadata.default", methods="contiguous clone detach")
def identity(cx: Cx, input: Any, *args: Any, **kwargs: Any) -> Any:
    """contiguous, clone, detach, alias, Identity, dropout in eval mode: the value itself."""
    return input


@lowers(aten="dropout.default feature_dropout.default alpha_dropout.default")
def dropout(cx: Cx, input: Any, p: float = 0.5, train: bool = False, inplace: bool = False, **kw: Any) -> Any:
    if kw.get("training", train) and p > 0:
        raise NotLowerable("dropout is active (training mode); call model.eval() before importing")
    return input


@lowers(fx="F.dropout F.dropout1d F.dropout2d F.dropout3d F.alpha_dropout F.feature_alpha_dropout")
def f_dropout(cx: Cx, input: Any, p: float = 0.5, training: bool = True, inplace: bool = False) -> Any:
    """F.dropout and friends (``training`` defaults to True there)."""
    return dropout(cx, input, p, training)


@lowers(aten="native_dropout.default")
def native_dropout(cx: Cx, input: Any, p: float, train: bool | None = False) -> tuple[Any, None]:
    """aten.native_dropout: (output, mask); the mask is a backward helper."""
    return dropout(cx, input, p, bool(train)), None


# -- elementwise ---------------------------------------------------------------------------------
def binary(kind: str, result: str | None = None):
    """add/sub/mul/div/max/min/comparisons with explicit broadcasting and scalar operands."""

    def lower(cx: Cx, input: Any, other: Any) -> Sym:
        et = promote(cx, input, other)
        if result == "float":
            et = FLOAT
        if et == INT64 and kind in INTEGER_ARITHMETIC:
            return integer_arithmetic(cx, kind, input, other)
        a, b = cx.node(input, et), cx.node(other, et)
        return Sym(cx.builder.elementwise(kind, [a, b], source=cx.source()))

    return lower


# -- integer arithmetic -----------------------------------------------------------------------------
# The IR's arithmetic is float. An int64 sum, difference or product (RoBERTa's position ids: a
# running count of the non-padding tokens) is computed on floats and converted back, which is exact
# when every value involved is an integer of magnitude at most 2^24 (exact in float32 and float64):
# the importer proves that from the operands' ranges (a bool is 0 or 1, a constant its own values,
# a running sum of n entries n times their bound) and refuses where it cannot. ``round`` before the
# conversion keeps interval boxes of these exact integers points.
INTEGER_EXACT = 2 ** 24
INTEGER_ARITHMETIC = {"add": lambda a, b: (a[0] + b[0], a[1] + b[1]),
                      "sub": lambda a, b: (a[0] - b[1], a[1] - b[0]),
                      "mul_elem": lambda a, b: (min(x * y for x in a for y in b), max(x * y for x in a for y in b))}


def integer_range(cx: Cx, v: Any) -> tuple[int, int] | None:
    """Bounds of an integer or bool value known at import (None when unproven)."""
    if isinstance(v, (bool, int)):
        return int(v), int(v)
    if isinstance(v, Sym):
        return (0, 1) if cx.etype(v) == BOOL else cx.int_ranges.get(v.nid)
    t = cx.known(v)
    if t is None or t.is_floating_point() or t.is_complex():
        return None
    return (int(t.min()), int(t.max())) if t.numel() else (0, 0)


def exact_integer(cx: Cx, value: Sym, bounds: tuple[int, int] | None, what: str) -> Sym:
    """The int64 value of a float node computing an integer within ``bounds`` (refused unless they
    are proven and within ``INTEGER_EXACT``)."""
    if bounds is None:
        raise NotLowerable(f"{what} of int64 values whose range is not known at import (the IR computes on "
                           f"floats, exact for integers proven within +-2^24)")
    if max(abs(bounds[0]), abs(bounds[1])) > INTEGER_EXACT:
        raise NotLowerable(f"{what} of int64 values reaching {max(abs(bounds[0]), abs(bounds[1]))} (the IR computes "
                           "on floats, exact for integers within +-2^24)")
    out = cx.add("cast", [cx.add("round", [value.nid]).nid], {"dtype": INT64})
    cx.int_ranges[out.nid] = bounds
    return out


def integer_arithmetic(cx: Cx, kind: str, input: Any, other: Any) -> Sym:
    ra, rb = integer_range(cx, input), integer_range(cx, other)
    bounds = INTEGER_ARITHMETIC[kind](ra, rb) if ra is not None and rb is not None else None
    if bounds is not None and max(abs(x) for x in (*ra, *rb)) > INTEGER_EXACT:
        bounds = (-INTEGER_EXACT - 1, INTEGER_EXACT + 1)  # an operand itself is beyond exact floats
    value = Sym(cx.builder.elementwise(kind, [cx.node(input, FLOAT), cx.node(other, FLOAT)], source=cx.source()))
    return exact_integer(cx, value, bounds, {"mul_elem": "product"}.get(kind, kind))


_add, _sub, _mul, _div = binary("add"), binary("sub"), binary("mul_elem"), binary("div", "float")


@lowers(aten="add.Tensor add.Scalar", fx="operator.add operator.iadd torch.add", methods="add")
def add(cx: Cx, input: Any, other: Any, alpha: float = 1) -> Sym:
    """Elementwise ``input + alpha * other`` (``x @ W + b`` becomes ``linear`` in passes.fuse_linear_bias)."""
    if not is_tensor(input):  # 1 + x
        input, other = other, input
    if alpha != 1:
        other = _mul(cx, other, alpha)
    return _add(cx, input, other)


@lowers(aten="sub.Tensor sub.Scalar", fx="operator.sub operator.isub torch.sub", methods="sub")
def sub(cx: Cx, input: Any, other: Any, alpha: float = 1) -> Sym:
    if alpha != 1:
        other = _mul(cx, other, alpha)
    return _sub(cx, input, other)


@lowers(aten="rsub.Tensor rsub.Scalar", fx="torch.rsub", methods="rsub")
def rsub(cx: Cx, input: Any, other: Any, alpha: float = 1) -> Sym:
    return sub(cx, other, input, alpha) if alpha == 1 else _sub(cx, other, _mul(cx, input, alpha))


@lowers(aten="mul.Tensor mul.Scalar", fx="operator.mul operator.imul torch.mul", methods="mul")
def mul(cx: Cx, input: Any, other: Any) -> Sym:
    return _mul(cx, input, other)


@lowers(aten="div.Tensor div.Scalar div.Tensor_mode div.Scalar_mode",
        fx="operator.truediv operator.itruediv torch.div", methods="div")
def div(cx: Cx, input: Any, other: Any, rounding_mode: str | None = None) -> Sym:
    if rounding_mode is not None:
        raise NotLowerable(f"division with rounding_mode={rounding_mode!r} has no exact IR op")
    return _div(cx, input, other)


@lowers(aten="square.default", fx="torch.square", methods="square")
def square(cx: Cx, input: Any) -> Sym:
    n = cx.node(input, FLOAT)
    return cx.add("mul_elem", [n, n])


@lowers(aten="pow.Tensor_Scalar pow.Tensor_Tensor", fx="operator.pow torch.pow", methods="pow")
def power(cx: Cx, input: Any, exponent: Any) -> Any:
    if not is_tensor(input):
        raise NotLowerable("a scalar raised to a tensor power has no IR op")
    e = cx.known(exponent)
    if e is not None and e.numel() == 1 and isinstance(exponent, Known) and not exponent.pinned:
        exponent = e.item()
    if is_tensor(exponent):  # pow_elem on floats; int_pow (exact, int64) on two integer tensors
        if promote(cx, input, exponent) == INT64:
            a, b = cx.node(input, INT64), cx.node(exponent, INT64)
            shape = broadcast_shapes(cx.builder.shape(a), cx.builder.shape(b), "pow")
            return cx.add("int_pow", [cx.builder.broadcast(a, shape, cx.source()),
                                      cx.builder.broadcast(b, shape, cx.source())], {"bits": 64, "signed": True})
        a, b = cx.node(input, FLOAT), cx.node(exponent, FLOAT)
        return Sym(cx.builder.elementwise("pow_elem", [a, b], source=cx.source()))
    return cx.add("pow", [cx.node(input, FLOAT)], {"exponent": float(exponent)})


def compare(kind: str):
    def lower(cx: Cx, input: Any, other: Any) -> Sym:
        et = promote(cx, input, other)
        return Sym(cx.builder.elementwise(kind, [cx.node(input, et), cx.node(other, et)], source=cx.source()))
    return lower


COMPARE = {k: register(compare(k), aten=f"{k}.Tensor {k}.Scalar", fx=f"operator.{k} torch.{k}", methods=k)
           for k in ("eq", "ne", "lt", "le", "gt", "ge")}


def logical(kind: str):
    def lower(cx: Cx, input: Any, other: Any) -> Sym:
        if promote(cx, input, other) != BOOL:
            raise NotLowerable(f"{kind} on non-boolean tensors (bitwise integer logic) has no IR op")
        return Sym(cx.builder.elementwise(kind, [cx.node(input, BOOL), cx.node(other, BOOL)], source=cx.source()))
    return lower


register(logical("logical_and"), aten="logical_and.default", fx="torch.logical_and", methods="logical_and")
register(logical("logical_or"), aten="logical_or.default", fx="torch.logical_or", methods="logical_or")


def bitwise(kind: str, on_bools: str | None):
    """``&``, ``|``, ``^``: on bools the logical op (``^`` is ``ne``), on integers the exact int64
    bitwise op."""
    def lower(cx: Cx, input: Any, other: Any) -> Sym:
        et = promote(cx, input, other)
        if et == BOOL:  # and, or; xor of two bools is their inequality
            if on_bools is None:
                return Sym(cx.builder.elementwise("ne", [cx.node(input, BOOL), cx.node(other, BOOL)], source=cx.source()))
            return logical(on_bools)(cx, input, other)
        if et != INT64:
            raise NotLowerable(f"{kind} of {'boolean' if et == BOOL else 'float'} tensors has no IR op")
        return Sym(_int_binary(cx, kind, input, other))
    return lower


def _int_binary(cx: Cx, kind: str, input: Any, other: Any) -> int:
    a, b = cx.node(input, INT64), cx.node(other, INT64)
    shape = broadcast_shapes(cx.builder.shape(a), cx.builder.shape(b), kind)
    return cx.builder.add(kind, [cx.builder.broadcast(a, shape, cx.source()), cx.builder.broadcast(b, shape, cx.source())],
                          {"bits": 64, "signed": True}, source=cx.source())


for _kind, _name, _op, _bools in (("bitwise_and", "and", "and_", "logical_and"), ("bitwise_or", "or", "or_", "logical_or"),
                                  ("bitwise_xor", "xor", "xor", None)):
    register(bitwise(_kind, _bools), aten=f"{_kind}.Tensor {_kind}.Scalar __{_name}__.Tensor __{_name}__.Scalar",
             fx=f"operator.{_op} torch.{_kind}", methods=_kind)


@lowers(aten="logical_not.default", fx="torch.logical_not", methods="logical_not")
def logical_not(cx: Cx, input: Any) -> Sym:
    return cx.add("logical_not", [cx.node(input, BOOL)])


@lowers(aten="bitwise_not.default", fx="operator.invert torch.bitwise_not", methods="bitwise_not")
def bitwise_not(cx: Cx, input: Any) -> Sym:
    """``~``: the complement of an integer in int64, ``logical_not`` of a bool."""
    if cx.etype(input) == INT64:
        return cx.add("bitwise_not", [cx.node(input, INT64)], {"bits": 64, "signed": True})
    if cx.etype(input) != BOOL:
        raise NotLowerable("~ of a float tensor")
    return logical_not(cx, input)


def _remainder(fmod: bool):
    """``torch.fmod`` (sign of the dividend) and ``torch.remainder`` / ``%`` (sign of the divisor), as
    the IR's ``mod``: float, or exact int64 (a remainder by zero is refused when evaluated)."""
    def lower(cx: Cx, input: Any, other: Any) -> Sym:
        et = promote(cx, input, other)
        if et == BOOL:
            raise NotLowerable("remainder of boolean tensors")
        a, b = cx.node(input, et), cx.node(other, et)
        shape = broadcast_shapes(cx.builder.shape(a), cx.builder.shape(b), "mod")
        attrs = {"fmod": fmod, **({"bits": 64, "signed": True} if et == INT64 else {})}
        return cx.add("mod", [cx.builder.broadcast(a, shape, cx.source()), cx.builder.broadcast(b, shape, cx.source())],
                      attrs)
    return lower


register(_remainder(True), aten="fmod.Tensor fmod.Scalar", fx="torch.fmod", methods="fmod")
register(_remainder(False), aten="remainder.Tensor remainder.Scalar", fx="operator.mod torch.remainder",
         methods="remainder")


@lowers(aten="where.self where.ScalarOther where.ScalarSelf where.Scalar", fx="torch.where")
def where(cx: Cx, condition: Any, input: Any = None, other: Any = None) -> Sym:
    if input is None:
        raise NotLowerable("where(condition) (nonzero indices) has a data-dependent shape")
    et = promote(cx, input, other)
    parts = [cx.node(condition, BOOL), cx.node(input, et), cx.node(other, et)]
    return Sym(cx.builder.elementwise("where", parts, source=cx.source()))


@lowers(methods="where")
def where_method(cx: Cx, input: Any, condition: Any, other: Any) -> Sym:
    """``x.where(condition, y)``: ``torch.where(condition, x, y)``."""
    return where(cx, condition, input, other)


@lowers(aten="masked_fill.Scalar masked_fill.Tensor", fx="torch.masked_fill", methods="masked_fill")
def masked_fill(cx: Cx, input: Any, mask: Any, value: Any) -> Sym:
    out = where(cx, mask, value, input)
    if cx.shape(out) != cx.shape(input):
        raise NotLowerable(f"in-place result shape {cx.shape(out)} differs from the tensor's {cx.shape(input)}")
    return out


@lowers(aten="maximum.default", fx="torch.maximum", methods="maximum")
def maximum(cx: Cx, input: Any, other: Any) -> Sym:
    return binary("max_elem")(cx, input, other)


@lowers(aten="minimum.default", fx="torch.minimum", methods="minimum")
def minimum(cx: Cx, input: Any, other: Any) -> Sym:
    return binary("min_elem")(cx, input, other)


# -- unary ---------------------------------------------------------------------------------------
UNARY = {  # framework name -> IR kind (float result; integer inputs are cast as PyTorch promotes)
    "relu": "relu", "tanh": "tanh", "sigmoid": "sigmoid", "exp": "exp", "expm1": "expm1", "log": "log",
    "sin": "sin", "cos": "cos", "tan": "tan", "sqrt": "sqrt", "rsqrt": "rsqrt", "reciprocal": "inv", "erf": "erf",
    "log1p": "log1p", "silu": "silu", "mish": "mish", "hardswish": "hardswish", "selu": "selu",
    "softsign": "softsign", "abs": "abs", "neg": "neg", "sign": "sign", "floor": "floor", "ceil": "ceil",
    "trunc": "trunc", "exp2": "exp2", "log2": "log2", "atan": "atan", "asin": "asin", "acos": "acos",
    "sinh": "sinh", "cosh": "cosh", "asinh": "asinh", "acosh": "acosh", "atanh": "atanh",
}  # (their aliases, arctan, fix, ..., follow from targets.ALIASES)


def _unary(kind: str):
    def lower(cx: Cx, input: Any, inplace: bool = False) -> Sym:
        return cx.add(kind, [cx.node(input, FLOAT)])
    return lower


# one lowering per IR kind, registered under every framework spelling of it (and their in-place forms)
UNARY_LOWERINGS = {kind: _unary(kind) for kind in {*UNARY.values(), "isnan"}}
for _name, _kind in UNARY.items():
    register(UNARY_LOWERINGS[_kind], aten=f"{_name}.default {_name}_.default",
             fx=f"torch.{_name} torch.{_name}_ F.{_name} F.{_name}_", methods=_name)
register(UNARY_LOWERINGS["neg"], fx="operator.neg")
register(UNARY_LOWERINGS["isnan"], aten="isnan.default", fx="torch.isnan", methods="isnan")


def unary(kind: str):
    """The lowering of the unary IR op ``kind`` (for lowerings that compose one)."""
    return UNARY_LOWERINGS[kind]


@lowers(aten="round.default round.decimals round_.default", fx="torch.round torch.round_", methods="round")
def round_half_even(cx: Cx, input: Any, decimals: int = 0) -> Sym:
    """torch.round: half to even; ``decimals`` would scale by a power of ten first (refused)."""
    if decimals:
        raise NotLowerable(f"round with decimals={decimals} (only 0)")
    return cx.add("round", [cx.node(input, FLOAT)])


@lowers(aten="gelu.default", fx="torch.gelu F.gelu")
def gelu(cx: Cx, input: Any, approximate: str = "none") -> Sym:
    return cx.add("gelu", [cx.node(input, FLOAT)], {"approximate": approximate})


@lowers(aten="leaky_relu.default", fx="torch.leaky_relu F.leaky_relu")
def leaky_relu(cx: Cx, input: Any, negative_slope: float = 0.01, inplace: bool = False) -> Sym:
    return cx.add("leaky_relu", [cx.node(input, FLOAT)], {"negative_slope": float(negative_slope)})


# PyTorch's SELU constants (aten.selu decomposes to aten.elu with exactly these floats)
SELU_ALPHA, SELU_SCALE = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946


@lowers(aten="elu.default")
def elu(cx: Cx, input: Any, alpha: float = 1.0, scale: float = 1.0, input_scale: float = 1.0) -> Sym:
    """aten.elu: ``scale * (x if x > 0 else alpha * expm1(input_scale * x))``; SELU is the
    (SELU_ALPHA, SELU_SCALE, 1) instance, and ``scale`` alone is a product after elu."""
    if input_scale != 1:
        raise NotLowerable(f"elu with input_scale={input_scale} (only 1 is supported)")
    if (alpha, scale) == (SELU_ALPHA, SELU_SCALE):
        return cx.add("selu", [cx.node(input, FLOAT)])
    out = cx.add("elu", [cx.node(input, FLOAT)], {"alpha": float(alpha)})
    return out if scale == 1 else _mul(cx, out, float(scale))


@lowers(fx="F.elu")
def f_elu(cx: Cx, input: Any, alpha: float = 1.0, inplace: bool = False) -> Sym:
    return elu(cx, input, alpha)


@lowers(aten="celu.default", fx="torch.celu F.celu")
def celu(cx: Cx, input: Any, alpha: float = 1.0, inplace: bool = False) -> Sym:
    return cx.add("celu", [cx.node(input, FLOAT)], {"alpha": float(alpha)})


@lowers(aten="softplus.default", fx="torch.softplus F.softplus")
def softplus(cx: Cx, input: Any, beta: float = 1.0, threshold: float = 20.0) -> Sym:
    """softplus(beta*x)/beta, PyTorch's definition, and x itself where beta*x > threshold.

    At the default threshold (20) the cut-over is left out so the op stays v1 ``softplus``: the
    exact softplus differs there by log1p(exp(-beta*x))/beta < 2.1e-9 relative, below float32
    resolution. Any other threshold is emitted as PyTorch computes it (gt/where), since the
    difference can be large (0.31 at threshold 1).
    """
    x = Sym(cx.node(input, FLOAT))
    scaled = x if beta == 1 else _mul(cx, x, float(beta))
    soft = cx.add("softplus", [scaled.nid])
    if beta != 1:
        soft = _div(cx, soft, float(beta))
    if threshold == 20.0:
        return soft
    return where(cx, COMPARE["gt"](cx, scaled, float(threshold)), x, soft)


@lowers(aten="clamp.default clamp.Tensor", fx="torch.clamp", methods="clamp")
def clamp(cx: Cx, input: Any, min: Any = None, max: Any = None) -> Sym:
    if is_tensor(min) or is_tensor(max):
        out: Any = input
        if min is not None:
            out = maximum(cx, out, min)
        if max is not None:
            out = minimum(cx, out, max)
        return out
    return cx.add("clamp", [cx.node(input, FLOAT)], {"min": None if min is None else float(min),
                                                      "max": None if max is None else float(max)})


@lowers(aten="clamp_min.default", fx="torch.clamp_min", methods="clamp_min")
def clamp_min(cx: Cx, input: Any, min: Any) -> Any:
    return clamp(cx, input, min, None)


@lowers(aten="clamp_max.default", fx="torch.clamp_max", methods="clamp_max")
def clamp_max(cx: Cx, input: Any, max: Any) -> Any:
    return clamp(cx, input, None, max)


@lowers(aten="hardtanh.default hardtanh_.default", fx="torch.hardtanh F.hardtanh")
def hardtanh(cx: Cx, input: Any, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False) -> Sym:
    return clamp(cx, input, min_val, max_val)


@lowers(aten="relu6.default", fx="torch.relu6 F.relu6")
def relu6(cx: Cx, input: Any, inplace: bool = False) -> Sym:
    return clamp(cx, input, 0.0, 6.0)


@lowers(aten="hardsigmoid.default", fx="torch.hardsigmoid F.hardsigmoid")
def hardsigmoid(cx: Cx, input: Any, inplace: bool = False) -> Sym:
    return cx.add("hardsigmoid", [cx.node(input, FLOAT)])


@lowers(aten="log_sigmoid.default", fx="F.logsigmoid")
def log_sigmoid(cx: Cx, input: Any) -> Sym:
    """torch._decomp's log_sigmoid_forward: ``min(x, 0) - log1p(exp(-|x|))`` (stable both ways)."""
    x = Sym(cx.node(input, FLOAT))
    tail = unary("log1p")(cx, unary("exp")(cx, unary("neg")(cx, unary("abs")(cx, x))))
    return _sub(cx, minimum(cx, x, 0.0), tail)


@lowers(aten="log_sigmoid_forward.default")
def log_sigmoid_forward(cx: Cx, input: Any) -> tuple[Sym, None]:
    """aten.log_sigmoid_forward: (output, buffer); the buffer is a backward helper."""
    return log_sigmoid(cx, input), None


# -- element types and constants --------------------------------------------------------------------
def cast_to(cx: Cx, input: Any, dtype: torch.dtype | None) -> Any:
    if dtype is None:
        return input
    want = element_type(dtype)
    if isinstance(input, Known) and not input.pinned:
        return Known(input.tensor.to(dtype), folded=True)
    if cx.etype(input) == want:
        return input
    out = Sym(cx.node(input, want))
    bounds = integer_range(cx, input) if want == INT64 and cx.etype(input) == BOOL else None
    if bounds is not None:
        cx.int_ranges[out.nid] = bounds
    return out


@lowers(aten="to.dtype to.dtype_layout to.device to.other _to_copy.default type_as.default", methods="to")
def to(cx: Cx, input: Any, *args: Any, **kwargs: Any) -> Any:
    """Tensor.to / aten.to.* / aten._to_copy: only the element type matters here."""
    dtype = kwargs.get("dtype")
    for a in args:
        if isinstance(a, torch.dtype):
            dtype = a
        elif is_tensor(a):
            dtype = torch_dtype(cx.etype(a))
    return cast_to(cx, input, dtype)


def torch_dtype(etype: str) -> torch.dtype:
    return {FLOAT: torch.float32, INT64: torch.int64, BOOL: torch.bool}[etype]


@lowers(methods="type_as")
def type_as(cx: Cx, input: Any, other: Any) -> Any:
    return cast_to(cx, input, torch_dtype(cx.etype(other)))


def method_cast(dtype: torch.dtype):
    def lower(cx: Cx, input: Any, *args: Any, **kwargs: Any) -> Any:
        return cast_to(cx, input, dtype)
    return lower


register(method_cast(torch.float32), methods="float half")
register(method_cast(torch.float64), methods="double")
register(method_cast(torch.int64), methods="long int")
register(method_cast(torch.bool), methods="bool")


def like(value: float | None):
    """zeros_like / ones_like / full_like / new_zeros ...: a constant of the framework's shape."""

    def lower(cx: Cx, *args: Any, **kwargs: Any) -> Known:
        meta = cx.current_meta()
        fill = value
        if fill is None:  # full_like(x, v) / new_full(x, size, v)
            fill = kwargs.get("fill_value", args[-1] if len(args) > 1 else None)
            if is_tensor(fill):
                raise NotLowerable("fill value depends on an input")
        return Known(torch.full(tuple(meta.shape), fill, dtype=meta.dtype), folded=True)

    return lower


register(like(0), aten="zeros_like.default new_zeros.default", fx="torch.zeros_like", methods="new_zeros")
register(like(1), aten="ones_like.default new_ones.default", fx="torch.ones_like", methods="new_ones")
register(like(None), aten="full_like.default new_full.default", fx="torch.full_like", methods="new_full")
