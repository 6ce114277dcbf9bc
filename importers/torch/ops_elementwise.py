"""Lowerings shared by both torch importers: elementwise, activations, reductions, layout, indexing.

Each function takes the ``Lowerer`` and the resolved arguments with ATen-style names (``input``,
``other``, ``dim``, ``keepdim``) and returns the value of the framework node. The FX and ATen tables
adapt their signatures onto these. Broadcasting is explicit (``GraphBuilder.elementwise``),
Python scalars become rank-0 consts in the element type they meet, and layout ops applied to a
state_dict tensor keep it a ``Known`` with the transform recorded, so its binding survives.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any, NamedTuple, Sequence

import torch

from torchlean_bridge.ops import BOOL, FLOAT, INT64
from torchlean_bridge.errors import ShapeRuleError
from torchlean_bridge.ops.contracts import broadcast_shapes, resolve_reshape

from .torch_common import Known, Lowerer, NotLowerable, Sym, element_type, normalize_axis, prod


Cx = Lowerer


# -- element types -------------------------------------------------------------------------------
def promote(cx: Cx, *operands: Any) -> str:
    """PyTorch's category promotion: bool < int64 < float (a float scalar makes ints float)."""
    order = {BOOL: 0, INT64: 1, FLOAT: 2}
    return max((cx.etype(o) for o in operands if o is not None), key=order.__getitem__)


def _is_tensor(v: Any) -> bool:
    return isinstance(v, (Sym, Known, torch.Tensor))


def identity(cx: Cx, input: Any, *args: Any, **kwargs: Any) -> Any:
    """contiguous, clone, detach, alias, Identity, dropout in eval mode: the value itself."""
    return input


def dropout(cx: Cx, input: Any, p: float = 0.5, train: bool = False, inplace: bool = False, **kw: Any) -> Any:
    if kw.get("training", train) and p > 0:
        raise NotLowerable("dropout is active (training mode); call model.eval() before importing")
    return input


# -- elementwise ---------------------------------------------------------------------------------
def binary(kind: str, result: str | None = None):
    """add/sub/mul/div/max/min/comparisons with explicit broadcasting and scalar operands."""

    def lower(cx: Cx, input: Any, other: Any) -> Sym:
        et = promote(cx, input, other)
        if result == "float":
            et = FLOAT
        a, b = cx.node(input, et), cx.node(other, et)
        return Sym(cx.builder.elementwise(kind, [a, b], source=cx.source()))

    return lower


_add, _sub, _mul, _div = binary("add"), binary("sub"), binary("mul_elem"), binary("div", "float")


def add(cx: Cx, input: Any, other: Any, alpha: float = 1) -> Sym:
    if not _is_tensor(input):  # 1 + x
        input, other = other, input
    if alpha != 1:
        other = _mul(cx, other, alpha)
    return _add(cx, input, other)


def sub(cx: Cx, input: Any, other: Any, alpha: float = 1) -> Sym:
    if alpha != 1:
        other = _mul(cx, other, alpha)
    return _sub(cx, input, other)


def rsub(cx: Cx, input: Any, other: Any, alpha: float = 1) -> Sym:
    return sub(cx, other, input, alpha) if alpha == 1 else _sub(cx, other, _mul(cx, input, alpha))


def mul(cx: Cx, input: Any, other: Any) -> Sym:
    return _mul(cx, input, other)


def div(cx: Cx, input: Any, other: Any, rounding_mode: str | None = None) -> Sym:
    if rounding_mode is not None:
        raise NotLowerable(f"division with rounding_mode={rounding_mode!r} has no exact IR op")
    return _div(cx, input, other)


def square(cx: Cx, input: Any) -> Sym:
    n = cx.node(input, FLOAT)
    return cx.add("mul_elem", [n, n])


def pow_(cx: Cx, input: Any, exponent: Any) -> Any:
    if not _is_tensor(input):
        raise NotLowerable("a scalar raised to a tensor power has no IR op")
    e = cx.known(exponent)
    if e is not None and e.numel() == 1 and isinstance(exponent, Known) and not exponent.pinned:
        exponent = e.item()
    if _is_tensor(exponent):
        raise NotLowerable("pow with a tensor exponent has no IR op")
    return cx.add("pow", [cx.node(input, FLOAT)], {"exponent": float(exponent)})


def compare(kind: str):
    def lower(cx: Cx, input: Any, other: Any) -> Sym:
        et = promote(cx, input, other)
        return Sym(cx.builder.elementwise(kind, [cx.node(input, et), cx.node(other, et)], source=cx.source()))
    return lower


def logical(kind: str):
    def lower(cx: Cx, input: Any, other: Any) -> Sym:
        if promote(cx, input, other) != BOOL:
            raise NotLowerable(f"{kind} on non-boolean tensors (bitwise integer logic) has no IR op")
        return Sym(cx.builder.elementwise(kind, [cx.node(input, BOOL), cx.node(other, BOOL)], source=cx.source()))
    return lower


def logical_not(cx: Cx, input: Any) -> Sym:
    return cx.add("logical_not", [cx.node(input, BOOL)])


def where(cx: Cx, condition: Any, input: Any = None, other: Any = None) -> Sym:
    if input is None:
        raise NotLowerable("where(condition) (nonzero indices) has a data-dependent shape")
    et = promote(cx, input, other)
    parts = [cx.node(condition, BOOL), cx.node(input, et), cx.node(other, et)]
    return Sym(cx.builder.elementwise("where", parts, source=cx.source()))


def masked_fill(cx: Cx, input: Any, mask: Any, value: Any) -> Sym:
    out = where(cx, mask, value, input)
    return _broadcast_back(cx, out, cx.shape(input))


def _broadcast_back(cx: Cx, v: Sym, shape: tuple[int, ...]) -> Sym:
    if cx.shape(v) != shape:
        raise NotLowerable(f"in-place result shape {cx.shape(v)} differs from the tensor's {shape}")
    return v


# -- unary ---------------------------------------------------------------------------------------
UNARY = {  # framework name -> IR kind (float result; integer inputs are cast as PyTorch promotes)
    "relu": "relu", "tanh": "tanh", "sigmoid": "sigmoid", "exp": "exp", "expm1": "expm1", "log": "log",
    "sin": "sin", "cos": "cos", "tan": "tan", "sqrt": "sqrt", "rsqrt": "rsqrt", "reciprocal": "inv", "erf": "erf",
    "log1p": "log1p", "silu": "silu", "mish": "mish", "hardswish": "hardswish", "selu": "selu",
    "softsign": "softsign", "abs": "abs", "neg": "neg", "sign": "sign", "floor": "floor", "ceil": "ceil",
    "trunc": "trunc", "fix": "trunc", "exp2": "exp2", "log2": "log2", "atan": "atan", "arctan": "atan",
    "asin": "asin", "arcsin": "asin", "acos": "acos", "arccos": "acos", "sinh": "sinh", "cosh": "cosh",
    "asinh": "asinh", "arcsinh": "asinh", "acosh": "acosh", "arccosh": "acosh", "atanh": "atanh",
    "arctanh": "atanh",
}


def unary(kind: str):
    def lower(cx: Cx, input: Any, inplace: bool = False) -> Sym:
        return cx.add(kind, [cx.node(input, FLOAT)])
    return lower


def round_(cx: Cx, input: Any, decimals: int = 0) -> Sym:
    """torch.round: half to even; ``decimals`` would scale by a power of ten first (refused)."""
    if decimals:
        raise NotLowerable(f"round with decimals={decimals} (only 0)")
    return cx.add("round", [cx.node(input, FLOAT)])


def gelu(cx: Cx, input: Any, approximate: str = "none") -> Sym:
    return cx.add("gelu", [cx.node(input, FLOAT)], {"approximate": approximate})


def leaky_relu(cx: Cx, input: Any, negative_slope: float = 0.01, inplace: bool = False) -> Sym:
    return cx.add("leaky_relu", [cx.node(input, FLOAT)], {"negative_slope": float(negative_slope)})


# PyTorch's SELU constants (aten.selu decomposes to aten.elu with exactly these floats)
SELU_ALPHA, SELU_SCALE = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946


def elu(cx: Cx, input: Any, alpha: float = 1.0, scale: float = 1.0, input_scale: float = 1.0) -> Sym:
    """aten.elu: ``scale * (x if x > 0 else alpha * expm1(input_scale * x))``; SELU is the
    (SELU_ALPHA, SELU_SCALE, 1) instance, and ``scale`` alone is a product after elu."""
    if input_scale != 1:
        raise NotLowerable(f"elu with input_scale={input_scale} (only 1 is supported)")
    if (alpha, scale) == (SELU_ALPHA, SELU_SCALE):
        return cx.add("selu", [cx.node(input, FLOAT)])
    out = cx.add("elu", [cx.node(input, FLOAT)], {"alpha": float(alpha)})
    return out if scale == 1 else _mul(cx, out, float(scale))


def celu(cx: Cx, input: Any, alpha: float = 1.0, inplace: bool = False) -> Sym:
    return cx.add("celu", [cx.node(input, FLOAT)], {"alpha": float(alpha)})


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
    return where(cx, compare("gt")(cx, scaled, float(threshold)), x, soft)


def clamp(cx: Cx, input: Any, min: Any = None, max: Any = None) -> Sym:
    if _is_tensor(min) or _is_tensor(max):
        out: Any = input
        if min is not None:
            out = binary("max_elem")(cx, out, min)
        if max is not None:
            out = binary("min_elem")(cx, out, max)
        return out
    return cx.add("clamp", [cx.node(input, FLOAT)], {"min": None if min is None else float(min),
                                                      "max": None if max is None else float(max)})


def hardtanh(cx: Cx, input: Any, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False) -> Sym:
    return clamp(cx, input, min_val, max_val)


def relu6(cx: Cx, input: Any, inplace: bool = False) -> Sym:
    return clamp(cx, input, 0.0, 6.0)


def hardsigmoid(cx: Cx, input: Any, inplace: bool = False) -> Sym:
    return cx.add("hardsigmoid", [cx.node(input, FLOAT)])


def cast_to(cx: Cx, input: Any, dtype: torch.dtype | None) -> Any:
    if dtype is None:
        return input
    want = element_type(dtype)
    if isinstance(input, Known) and not input.pinned:
        return Known(input.tensor.to(dtype), folded=True)
    if cx.etype(input) == want:
        return input
    return Sym(cx.node(input, want))


def to(cx: Cx, input: Any, *args: Any, **kwargs: Any) -> Any:
    """Tensor.to / aten.to.* / aten._to_copy: only the element type matters here."""
    dtype = kwargs.get("dtype")
    for a in args:
        if isinstance(a, torch.dtype):
            dtype = a
        elif _is_tensor(a):
            dtype = _torch_dtype(cx.etype(a))
    return cast_to(cx, input, dtype)


def _torch_dtype(etype: str) -> torch.dtype:
    return {FLOAT: torch.float32, INT64: torch.int64, BOOL: torch.bool}[etype]


def type_as(cx: Cx, input: Any, other: Any) -> Any:
    return cast_to(cx, input, _torch_dtype(cx.etype(other)))


def method_cast(dtype: torch.dtype):
    def lower(cx: Cx, input: Any, *args: Any, **kwargs: Any) -> Any:
        return cast_to(cx, input, dtype)
    return lower


def like(value: float | None):
    """zeros_like / ones_like / full_like / new_zeros ...: a constant of the framework's shape."""

    def lower(cx: Cx, *args: Any, **kwargs: Any) -> Known:
        meta = cx.current_meta()
        fill = value
        if fill is None:  # full_like(x, v) / new_full(x, size, v)
            fill = kwargs.get("fill_value", args[-1] if len(args) > 1 else None)
            if _is_tensor(fill):
                raise NotLowerable("fill value depends on an input")
        return Known(torch.full(tuple(meta.shape), fill, dtype=meta.dtype), folded=True)

    return lower


# -- reductions ----------------------------------------------------------------------------------
def _axes(cx: Cx, input: Any, dim: Any) -> list[int]:
    r = cx.rank(input)
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return list(range(r))
    dims = [dim] if isinstance(dim, int) else list(dim)
    return sorted(normalize_axis(int(d), r) for d in dims)


def _reduce(cx: Cx, input: Any, axes: list[int], keepdim: bool, one: str, many: str, total: str | None,
            etype: str = FLOAT) -> Sym:
    x = cx.node(input, etype)
    r = cx.rank(input)
    if not axes:
        return Sym(x)
    if total and not keepdim and axes == list(range(r)):
        return cx.add(total, [x])
    if len(axes) == 1 and not keepdim:
        return cx.add(one, [x], {"axis": axes[0]})
    return cx.add(many, [x], {"axes": axes, "keepdim": bool(keepdim)})


def reduce_sum(cx: Cx, input: Any, dim: Any = None, keepdim: bool = False, dtype: Any = None) -> Sym:
    if cx.etype(input) != FLOAT and (dtype is None or not dtype.is_floating_point):
        raise NotLowerable("integer/bool sums have no IR op")
    return _reduce(cx, input, _axes(cx, input, dim), keepdim, "reduce_sum", "reduce_sum_axes", "sum")


def reduce_mean(cx: Cx, input: Any, dim: Any = None, keepdim: bool = False, dtype: Any = None) -> Sym:
    return _reduce(cx, input, _axes(cx, input, dim), keepdim, "reduce_mean", "reduce_mean_axes", None)


def _extremum(kind: str):
    def lower(cx: Cx, input: Any, dim: Any = None, keepdim: bool = False) -> Sym:
        axes = _axes(cx, input, dim)
        return cx.add(kind, [cx.node(input, cx.etype(input))], {"axes": axes, "keepdim": bool(keepdim)})
    return lower


reduce_max, reduce_min = _extremum("reduce_max"), _extremum("reduce_min")


def _arg(kind: str):
    def lower(cx: Cx, input: Any, dim: int | None = None, keepdim: bool = False) -> Sym:
        x: Any = input
        if dim is None:
            x, dim = reshape(cx, input, [-1]), 0
            keepdim = False
        ax = normalize_axis(int(dim), cx.rank(x))
        return cx.add(kind, [cx.node(x, FLOAT)], {"axis": ax, "keepdim": bool(keepdim)})
    return lower


argmax, argmin = _arg("argmax"), _arg("argmin")


class ValuesIndices(NamedTuple):
    """``torch.return_types.max/min``: a pair that also answers ``.values`` and ``.indices``."""

    values: Any
    indices: Any


class DataDependent:
    """An output whose positions depend on the values (sort/topk indices): no IR op computes it, so a
    graph that uses it is refused at the use, naming it."""

    def __init__(self, what: str) -> None:
        self.what = what

    def __repr__(self) -> str:
        return f"<{self.what}: positions that depend on the values have no IR op; only the values are supported>"

    def __getattr__(self, name: str) -> Any:  # any use as a tensor (x.float(), x.shape, ...) is refused
        if name.startswith("__"):
            raise AttributeError(name)
        raise NotLowerable(f"{self.what} are used: positions that depend on the values have no IR op (only "
                           "the values are supported)")


def sort(cx: Cx, input: Any, dim: int = -1, descending: bool = False, stable: Any = None) -> ValuesIndices:
    """torch.sort and aten.sort(.stable): the sorted values (NaN above +inf, as PyTorch); the indices
    are refused where they are used (stability only orders the indices)."""
    axis = normalize_axis(int(dim), cx.rank(input))
    return _sorted(cx, input, axis, cx.shape(input)[axis], bool(descending), "sort")


def topk(cx: Cx, input: Any, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> ValuesIndices:
    """torch.topk: the k largest (or smallest) values, in order (a valid answer also when sorted=False)."""
    axis = normalize_axis(int(dim), cx.rank(input))
    return _sorted(cx, input, axis, int(k), bool(largest), "topk")


def _sorted(cx: Cx, input: Any, axis: int, k: int, descending: bool, what: str) -> ValuesIndices:
    if cx.etype(input) != FLOAT:
        raise NotLowerable(f"{what} of a {cx.etype(input)} tensor (only float values)")
    values = cx.add("sort", [cx.node(input, FLOAT)], {"axis": axis, "k": k, "descending": descending})
    return ValuesIndices(values, DataDependent(f"{what} indices"))


def max_or_min(which: str):
    """torch.max(x) / max(x, dim, keepdim) -> (values, indices) / max(x, other)."""

    def lower(cx: Cx, input: Any, dim: Any = None, keepdim: bool = False) -> Any:
        if _is_tensor(dim):
            return binary(f"{which}_elem")(cx, input, dim)
        if dim is None:
            return _extremum(f"reduce_{which}")(cx, input, None, False)
        values = _extremum(f"reduce_{which}")(cx, input, [dim], keepdim)
        return ValuesIndices(values, _arg(f"arg{which}")(cx, input, dim, keepdim))

    return lower


def maximum(cx: Cx, input: Any, other: Any) -> Sym:
    return binary("max_elem")(cx, input, other)


def minimum(cx: Cx, input: Any, other: Any) -> Sym:
    return binary("min_elem")(cx, input, other)


def any_all(which: str):
    """any/all over bool values: max/min of the 0/1 values, an exact reading of the definition."""

    def lower(cx: Cx, input: Any, dim: Any = None, keepdim: bool = False) -> Sym:
        as_float = cx.node(input, FLOAT)
        red = cx.add(f"reduce_{which}", [as_float], {"axes": _axes(cx, input, dim), "keepdim": bool(keepdim)})
        return Sym(cx.node(red, BOOL))

    return lower


def softmax(kind: str):
    def lower(cx: Cx, input: Any, dim: int | None = None, dtype: Any = None, **_: Any) -> Sym:
        if isinstance(dtype, bool):  # aten._softmax(self, dim, half_to_float)
            dtype = None
        r = cx.rank(input)
        if dim is None:  # F.softmax's legacy implicit dim
            dim = 0 if r in (0, 1, 3) else 1
        return cx.add(kind, [cx.node(input, FLOAT)], {"axis": normalize_axis(int(dim), r)})
    return lower


# -- layout ---------------------------------------------------------------------------------------
def _shape_arg(shape: Sequence[Any]) -> list[int]:
    if len(shape) == 1 and isinstance(shape[0], (list, tuple, torch.Size)):
        shape = shape[0]
    return [int(s) for s in shape]


def _resolve_shape(src: tuple[int, ...], shape: Sequence[int]) -> tuple[int, ...]:
    try:
        return resolve_reshape(src, shape)
    except ShapeRuleError as e:
        raise NotLowerable(e.message) from None


def reshape(cx: Cx, input: Any, shape: Sequence[int]) -> Any:
    src = cx.shape(input)
    out = _resolve_shape(src, shape)
    if isinstance(input, Known):
        return input.moved(input.tensor.reshape(out), ("reshape", out))
    return Sym(cx.builder.reshape(cx.node(input), out, source=cx.source()))


def view(cx: Cx, input: Any, *shape: Any) -> Any:
    if len(shape) == 1 and isinstance(shape[0], torch.dtype):
        raise NotLowerable("view(dtype) reinterprets bits; not supported")
    return reshape(cx, input, _shape_arg(shape))


def permute(cx: Cx, input: Any, *dims: Any) -> Any:
    r = cx.rank(input)
    perm = tuple(normalize_axis(d, r) for d in _shape_arg(dims))
    if perm == tuple(range(r)):
        return input
    if isinstance(input, Known):
        return input.moved(input.tensor.permute(perm), ("permute", perm))
    return cx.add("permute", [cx.node(input)], {"perm": perm})


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


def t(cx: Cx, input: Any) -> Any:
    return input if cx.rank(input) < 2 else transpose(cx, input, 0, 1)


def unsqueeze(cx: Cx, input: Any, dim: int) -> Any:
    s = list(cx.shape(input))
    s.insert(normalize_axis(dim, len(s) + 1), 1)
    return reshape(cx, input, s)


def squeeze(cx: Cx, input: Any, dim: Any = None) -> Any:
    s = cx.shape(input)
    axes = range(len(s)) if dim is None else [normalize_axis(d, len(s)) for d in
                                              ([dim] if isinstance(dim, int) else dim)]
    drop = {a for a in axes if s[a] == 1}
    return reshape(cx, input, [d for i, d in enumerate(s) if i not in drop])


def flatten(cx: Cx, input: Any, start_dim: int = 0, end_dim: int = -1) -> Any:
    s = cx.shape(input)
    if not s:
        return reshape(cx, input, [1])
    a, b = normalize_axis(start_dim, len(s)), normalize_axis(end_dim, len(s))
    return reshape(cx, input, list(s[:a]) + [prod(s[a:b + 1])] + list(s[b + 1:]))


def unflatten(cx: Cx, input: Any, dim: int, sizes: Sequence[int]) -> Any:
    s = list(cx.shape(input))
    a = normalize_axis(dim, len(s))
    inner = _resolve_shape((s[a],), sizes)
    return reshape(cx, input, s[:a] + list(inner) + s[a + 1:])


def expand(cx: Cx, input: Any, *size: Any, implicit: bool = False) -> Sym:
    sizes = _shape_arg(size)
    src = cx.shape(input)
    lead = len(sizes) - len(src)
    target = tuple(src[i - lead] if s == -1 else s for i, s in enumerate(sizes))
    return Sym(cx.builder.broadcast(cx.node(input), target, source=cx.source()))


def expand_as(cx: Cx, input: Any, other: Any) -> Sym:
    return expand(cx, input, list(cx.shape(other)))


def view_as(cx: Cx, input: Any, other: Any) -> Any:
    return reshape(cx, input, cx.shape(other))


def cat(cx: Cx, tensors: Sequence[Any], dim: int = 0) -> Any:
    tensors = [x for x in tensors if cx.shape(x) != (0,)]  # PyTorch skips legacy empty tensors
    if len(tensors) == 1:
        return tensors[0]
    et = promote(cx, *tensors)
    ax = normalize_axis(dim, cx.rank(tensors[0]))
    return cx.add("concat", [cx.node(x, et) for x in tensors], {"axis": ax})


def stack(cx: Cx, tensors: Sequence[Any], dim: int = 0) -> Any:
    ax = normalize_axis(dim, cx.rank(tensors[0]) + 1)
    return cat(cx, [unsqueeze(cx, x, ax) for x in tensors], ax)


def slice_(cx: Cx, input: Any, dim: int = 0, start: int | None = None, end: int | None = None,
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


def narrow(cx: Cx, input: Any, dim: int, start: int, length: int) -> Any:
    ax = normalize_axis(dim, cx.rank(input))
    start = normalize_axis(start, cx.shape(input)[ax], "start") if start < 0 else start  # torch: n + start
    return slice_(cx, input, ax, start, start + length)


def select(cx: Cx, input: Any, dim: int, index: int) -> Any:
    s = cx.shape(input)
    ax = normalize_axis(dim, len(s))
    i = normalize_axis(int(index), s[ax], "index")
    return squeeze(cx, slice_(cx, input, ax, i, i + 1), ax)


def split(cx: Cx, input: Any, split_size: Any, dim: int = 0) -> tuple[Any, ...]:
    ax = normalize_axis(dim, cx.rank(input))
    n = cx.shape(input)[ax]
    if isinstance(split_size, int):
        sizes = [min(split_size, n - i) for i in range(0, n, split_size)] or [0]
    else:
        sizes = [int(x) for x in split_size]
    out, start = [], 0
    for size in sizes:
        out.append(slice_(cx, input, ax, start, start + size))
        start += size
    return tuple(out)


def chunk(cx: Cx, input: Any, chunks: int, dim: int = 0) -> tuple[Any, ...]:
    n = cx.shape(input)[normalize_axis(dim, cx.rank(input))]
    return split(cx, input, -(-n // chunks) if n else 1, dim)


def unbind(cx: Cx, input: Any, dim: int = 0) -> tuple[Any, ...]:
    ax = normalize_axis(dim, cx.rank(input))
    return tuple(select(cx, input, ax, i) for i in range(cx.shape(input)[ax]))


def pad(cx: Cx, input: Any, pad: Sequence[int], mode: str = "constant", value: float | None = None) -> Any:
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


def constant_pad_nd(cx: Cx, input: Any, pad: Sequence[int], value: float = 0.0) -> Any:
    return globals()["pad"](cx, input, pad, "constant", value)


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


def gather(cx: Cx, input: Any, dim: int, index: Any, sparse_grad: bool = False) -> Sym:
    """torch.gather: out[..., i, ...] = input[..., index[..., i, ...], ...] along dim."""
    axis = normalize_axis(int(dim), cx.rank(input))
    index = _index_operand(cx, index, cx.shape(input)[axis], "gather")
    return cx.add("gather_elements", [cx.node(input), cx.node(index, INT64)], {"axis": axis})


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


def index_select(cx: Cx, input: Any, dim: int, index: Any) -> Sym:
    return gather_axis(cx, input, normalize_axis(dim, cx.rank(input)), index)


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


def getitem(cx: Cx, obj: Any, idx: Any) -> Any:
    """``x[idx]``: Python containers, or tensors with ints, slices, None, Ellipsis and one index tensor."""
    if not _is_tensor(obj):
        return obj[idx]
    items = list(idx) if isinstance(idx, tuple) else [idx]
    consumes = sum(0 if (it is None or it is Ellipsis) else
                   (cx.rank(it) if _is_tensor(it) and cx.etype(it) == BOOL else 1) for it in items)
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
            x = slice_(cx, x, axis, it.start, it.stop, 1 if it.step is None else it.step)
            axis += 1
        elif isinstance(it, int):
            x = select(cx, x, axis, it)
        elif isinstance(it, (list, tuple)) or _is_tensor(it):
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


def size(cx: Cx, input: Any, dim: int | None = None) -> Any:
    s = cx.shape(input)
    return torch.Size(s) if dim is None else s[normalize_axis(dim, len(s))]


def getattr_(cx: Cx, obj: Any, name: str) -> Any:
    if not _is_tensor(obj):
        return getattr(obj, name)
    if name == "shape":
        return torch.Size(cx.shape(obj))
    if name == "ndim":
        return cx.rank(obj)
    if name == "dtype":
        return cx.known(obj).dtype if cx.known(obj) is not None else _torch_dtype(cx.etype(obj))
    if name == "T":
        return permute(cx, obj, list(range(cx.rank(obj)))[::-1])
    if name == "mT":
        return transpose(cx, obj, -2, -1)
    if name == "device":
        return torch.device("cpu")
    raise NotLowerable(f"tensor attribute `{name}`")


def dim(cx: Cx, input: Any) -> int:
    return cx.rank(input)


def numel(cx: Cx, input: Any) -> int:
    return prod(cx.shape(input))


def repeat(cx: Cx, input: Any, *repeats: Any) -> Any:
    """Tile by unsqueeze, broadcast and reshape: pure data movement, exact."""
    reps = _shape_arg(repeats)
    s = (1,) * (len(reps) - cx.rank(input)) + cx.shape(input)
    x = reshape(cx, input, [d for pair in ((1, e) for e in s) for d in pair])
    x = expand(cx, x, [d for pair in zip(reps, s) for d in pair])
    return reshape(cx, x, [r * e for r, e in zip(reps, s)])


def broadcast_tensors(cx: Cx, *tensors: Any) -> tuple[Any, ...]:
    shape: tuple[int, ...] = ()
    for x in tensors:
        shape = broadcast_shapes(shape, cx.shape(x))
    return tuple(expand(cx, x, list(shape)) for x in tensors)


# -- statistics and norms --------------------------------------------------------------------------
def _correction(unbiased: Any, correction: Any) -> float:
    """PyTorch's Bessel correction: ``correction`` wins; ``unbiased`` (default True) means 1, else 0."""
    if correction is not None:
        return float(correction)
    return 0.0 if unbiased is False else 1.0


def variance(cx: Cx, input: Any, dim: Any = None, unbiased: Any = None, keepdim: bool = False, *,
             correction: Any = None) -> Sym:
    """``sum((x - mean)^2) / (n - correction)`` over ``dim``, torch._decomp's ``var.correction``."""
    if isinstance(dim, bool):  # torch.var(x, unbiased)
        dim, unbiased = None, dim
    axes = _axes(cx, input, dim)
    n = prod(cx.shape(input)[a] for a in axes)
    c = _correction(unbiased, correction)
    if n - c <= 0:
        raise NotLowerable(f"variance over {n} elements with correction {c:g} (n - correction <= 0: PyTorch "
                           "returns nan/inf)")
    x = Sym(cx.node(input, FLOAT))
    mean = _reduce(cx, x, axes, True, "reduce_mean", "reduce_mean_axes", None)
    dev = _sub(cx, x, mean)
    total = _reduce(cx, square(cx, dev), axes, keepdim, "reduce_sum", "reduce_sum_axes", "sum")
    return total if n - c == 1 else _div(cx, total, float(n - c))


def std(cx: Cx, input: Any, dim: Any = None, unbiased: Any = None, keepdim: bool = False, *,
        correction: Any = None) -> Sym:
    return cx.add("sqrt", [variance(cx, input, dim, unbiased, keepdim, correction=correction).nid])


def with_mean(spread: Any):
    """var_mean / std_mean: ``(spread, mean)`` over the same dims, with the same keepdim."""

    def lower(cx: Cx, input: Any, dim: Any = None, unbiased: Any = None, keepdim: bool = False, *,
              correction: Any = None) -> tuple[Sym, Sym]:
        if isinstance(dim, bool):
            dim, unbiased = None, dim
        out = spread(cx, input, dim, unbiased, keepdim, correction=correction)
        return out, reduce_mean(cx, Sym(cx.node(input, FLOAT)), dim, keepdim)

    return lower


def vector_norm(cx: Cx, input: Any, ord: Any = 2, dim: Any = None, keepdim: bool = False, *,
                dtype: Any = None, out: Any = None) -> Sym:
    """torch._refs.linalg.vector_norm: max/min of |x| for +-inf, sum(|x|) for 1, sqrt(sum(x*x)) for 2,
    ``sum(|x|^p)^(1/p)`` for other positive p, the count of non-zeros for 0."""
    if out is not None:
        raise NotLowerable("vector_norm with out=")
    if dtype is not None and not dtype.is_floating_point:
        raise NotLowerable(f"vector_norm with dtype={dtype} (only floating result types)")
    p = float(ord)
    axes = _axes(cx, input, dim)
    x = Sym(cx.node(input, FLOAT))
    if math.isinf(p):
        return cx.add("reduce_max" if p > 0 else "reduce_min", [unary("abs")(cx, x).nid],
                      {"axes": axes, "keepdim": bool(keepdim)})
    if p == 0:
        nonzero = Sym(cx.node(compare("ne")(cx, x, 0.0), FLOAT))
        return _reduce(cx, nonzero, axes, keepdim, "reduce_sum", "reduce_sum_axes", "sum")
    if p < 0:
        raise NotLowerable(f"vector_norm with ord={ord:g} (negative orders are not supported)")
    if p == 2:
        return cx.add("sqrt", [_reduce(cx, square(cx, x), axes, keepdim, "reduce_sum", "reduce_sum_axes", "sum").nid])
    powered = unary("abs")(cx, x) if p == 1 else cx.add("pow", [unary("abs")(cx, x).nid], {"exponent": p})
    total = _reduce(cx, powered, axes, keepdim, "reduce_sum", "reduce_sum_axes", "sum")
    return total if p == 1 else cx.add("pow", [total.nid], {"exponent": 1.0 / p})


def norm(cx: Cx, input: Any, p: Any = "fro", dim: Any = None, keepdim: bool = False, out: Any = None,
         dtype: Any = None) -> Sym:
    """torch.norm / Tensor.norm: a number or 'fro' over at most two dims is a vector norm."""
    if out is not None:
        raise NotLowerable("norm with out=")
    if p is None:
        p = 2
    if isinstance(p, str):
        dims = [dim] if isinstance(dim, int) else dim
        if p != "fro" or (dims is not None and len(dims) > 2):
            raise NotLowerable(f"norm with p={p!r} (matrix norms other than 'fro' are not supported)")
        p = 2
    return vector_norm(cx, input, p, dim, keepdim, dtype=dtype)


def tensor_norm(cx: Cx, input: Any, p: Any = "fro", dim: Any = None, keepdim: bool = False,
                dtype: Any = None) -> Sym:
    """Tensor.norm: torch.norm's arguments, with ``dtype`` where torch.norm has ``out``."""
    return norm(cx, input, p, dim, keepdim, None, dtype)


def aten_norm(cx: Cx, input: Any, p: Any = 2, dim: Any = None, keepdim: bool = False, dtype: Any = None) -> Sym:
    """aten.norm.Scalar / ScalarOpt_dim(_dtype): a vector norm."""
    return vector_norm(cx, input, 2 if p is None else p, dim, keepdim, dtype=dtype)


def normalize(cx: Cx, input: Any, p: float = 2.0, dim: Any = 1, eps: float = 1e-12, out: Any = None) -> Sym:
    """F.normalize: ``x / clamp_min(vector_norm(x, p, dim, keepdim=True), eps)``."""
    if out is not None:
        raise NotLowerable("normalize with out=")
    dims = list(dim) if isinstance(dim, (list, tuple)) else [dim]
    denom = clamp(cx, vector_norm(cx, input, p, dims, True), float(eps), None)
    return _div(cx, input, denom)


def logsumexp(cx: Cx, input: Any, dim: Any = None, keepdim: bool = False) -> Sym:
    """torch._refs.logsumexp: ``log(sum(exp(x - m))) + m`` with m = amax(x), 0 where |m| is inf."""
    axes = _axes(cx, input, dim)
    if prod(cx.shape(input)) == 0:
        raise NotLowerable("logsumexp of an empty tensor")
    x = Sym(cx.node(input, FLOAT))
    top = cx.add("reduce_max", [x.nid], {"axes": axes, "keepdim": True})
    infinite = compare("eq")(cx, unary("abs")(cx, top), float("inf"))
    top = where(cx, infinite, 0.0, top)
    total = _reduce(cx, unary("exp")(cx, _sub(cx, x, top)), axes, keepdim, "reduce_sum", "reduce_sum_axes", "sum")
    shift = top if keepdim else reshape(cx, top, list(cx.shape(total)))
    return _add(cx, unary("log")(cx, total), shift)


def reduce_prod(cx: Cx, input: Any, dim: Any = None, keepdim: bool = False, dtype: Any = None) -> Sym:
    if cx.etype(input) != FLOAT and (dtype is None or not dtype.is_floating_point):
        raise NotLowerable("prod of integer/bool tensors (an integer result) has no IR op")
    axes = _axes(cx, input, dim)
    return cx.add("reduce_prod", [cx.node(input, FLOAT)], {"axes": axes, "keepdim": bool(keepdim)})


# -- activations built from others ------------------------------------------------------------------
def log_sigmoid(cx: Cx, input: Any) -> Sym:
    """torch._decomp's log_sigmoid_forward: ``min(x, 0) - log1p(exp(-|x|))`` (stable both ways)."""
    x = Sym(cx.node(input, FLOAT))
    tail = unary("log1p")(cx, unary("exp")(cx, unary("neg")(cx, unary("abs")(cx, x))))
    return _sub(cx, minimum(cx, x, 0.0), tail)


def log_sigmoid_forward(cx: Cx, input: Any) -> tuple[Sym, None]:
    """aten.log_sigmoid_forward: (output, buffer); the buffer is a backward helper."""
    return log_sigmoid(cx, input), None


def glu(cx: Cx, input: Any, dim: int = -1) -> Sym:
    """``a * sigmoid(b)`` for the two halves a, b of ``dim``."""
    ax = normalize_axis(dim, cx.rank(input))
    n = cx.shape(input)[ax]
    if n % 2:
        raise NotLowerable(f"glu halves dim {dim} of odd size {n}")
    a, b = slice_(cx, input, ax, 0, n // 2), slice_(cx, input, ax, n // 2, n)
    return _mul(cx, a, unary("sigmoid")(cx, b))


def softmin(cx: Cx, input: Any, dim: int | None = None, _stacklevel: int = 3, dtype: Any = None) -> Sym:
    """``softmax(-x)`` (F.softmin's legacy implicit dim is softmax's)."""
    return softmax("softmax")(cx, unary("neg")(cx, input), dim)


# -- rearrangements ---------------------------------------------------------------------------------
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


def flip(cx: Cx, input: Any, *args: Any, dims: Any = None) -> Any:
    """A gather with the constant reversed index per flipped axis."""
    x = input
    r = cx.rank(input)
    for ax in sorted({normalize_axis(d, r) for d in _shape_arg(args if dims is None else (dims,))}):
        n = cx.shape(input)[ax]
        if n > 1:
            x = gather_axis(cx, x, ax, Known(torch.arange(n - 1, -1, -1), folded=True))
    return x


def fliplr(cx: Cx, input: Any) -> Any:
    return flip(cx, input, 1)


def flipud(cx: Cx, input: Any) -> Any:
    return flip(cx, input, 0)


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
            x = cat(cx, [slice_(cx, x, ax, n - k, n), slice_(cx, x, ax, 0, n - k)], ax)
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


def outer(cx: Cx, input: Any, vec2: Any) -> Sym:
    """``input[:, None] * vec2[None, :]``."""
    if cx.rank(input) != 1 or cx.rank(vec2) != 1:
        raise NotLowerable(f"outer of ranks {cx.rank(input)} and {cx.rank(vec2)} (needs two vectors)")
    return _mul(cx, reshape(cx, input, [-1, 1]), reshape(cx, vec2, [1, -1]))


def diff(cx: Cx, input: Any, n: int = 1, dim: int = -1, prepend: Any = None, append: Any = None) -> Any:
    """``x[1:] - x[:-1]`` along ``dim``, ``n`` times, after concatenating prepend/append tensors."""
    if cx.etype(input) == BOOL:
        raise NotLowerable("diff of a bool tensor (PyTorch takes a logical xor)")
    ax = normalize_axis(dim, cx.rank(input))
    parts = [v for v in (prepend, input, append) if v is not None]
    if any(not _is_tensor(v) or cx.rank(v) != cx.rank(input) for v in parts):
        raise NotLowerable("diff with a scalar prepend/append (only tensors of the input's rank)")
    x = cat(cx, parts, ax)
    for _ in range(int(n)):
        m = cx.shape(x)[ax]
        if m == 0:
            break
        x = _sub(cx, slice_(cx, x, ax, 1, m), slice_(cx, x, ax, 0, m - 1))
    return x


def repeat_interleave(cx: Cx, input: Any, repeats: Any = None, dim: int | None = None, *,
                      output_size: Any = None) -> Any:
    """Each entry repeated ``repeats`` times along ``dim`` (flattened when None): unsqueeze,
    broadcast, reshape."""
    k = cx.known(repeats) if _is_tensor(repeats) else None
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


def cumsum(cx: Cx, input: Any, dim: int, dtype: Any = None) -> Sym:
    """torch.cumsum over a float tensor (an integer running sum has no IR op)."""
    if dtype is not None and dtype not in (torch.float32, torch.float64):
        raise NotLowerable(f"cumsum with dtype={dtype}")
    if cx.etype(input) != FLOAT:
        raise NotLowerable(f"cumsum of a {cx.etype(input)} tensor (integer running sums have no IR op)")
    return cx.add("cumsum", [cx.node(input, FLOAT)], {"axis": normalize_axis(int(dim), cx.rank(input))})


# torch functions whose ATen overload is ``<name>.default`` with the same arguments: one lowering each,
# registered under both names (torch_modules, torch_aten; torch_nn adds its own)
def clamp_min(cx: Cx, input: Any, min: Any) -> Any:
    return clamp(cx, input, min, None)


def clamp_max(cx: Cx, input: Any, max: Any) -> Any:
    return clamp(cx, input, None, max)


SAME_NAME: dict[str, Any] = {
    "celu": celu, "softplus": softplus, "hardtanh": hardtanh, "relu6": relu6, "hardsigmoid": hardsigmoid,
    "gelu": gelu, "leaky_relu": leaky_relu, "isnan": unary("isnan"), "square": square, "maximum": maximum,
    "minimum": minimum, "logical_not": logical_not, "clamp_min": clamp_min, "clamp_max": clamp_max,
    "amax": reduce_max, "amin": reduce_min, "argmax": argmax, "argmin": argmin, "chunk": chunk,
    "index_select": index_select, "permute": permute, "t": t, "unsqueeze": unsqueeze, "zeros_like": like(0),
    "ones_like": like(1), "full_like": like(None), "flip": flip, "fliplr": fliplr, "flipud": flipud, "roll": roll,
    "tril": triangle("tril"), "triu": triangle("triu"), "outer": outer, "ger": outer, "diff": diff,
    "pixel_shuffle": pixel_shuffle, "pixel_unshuffle": pixel_unshuffle, "glu": glu, "cumsum": cumsum,
    "sort": sort, "topk": topk, "gather": gather, "take_along_dim": take_along_dim,
}


# -- nearest upsampling ----------------------------------------------------------------------------
def _integer_factors(cx: Cx, input: Any, r: int, size: Any, scales: Any) -> list[int]:
    """Per spatial axis the factor f such that PyTorch reads input index ``o // f``: an integer
    scale factor, or an output size that is an integer multiple of the input's."""
    spatial = list(cx.shape(input)[-r:])
    if scales is not None and not all(v is None for v in _as_list(scales, r)):
        values = [float(v) for v in _as_list(scales, r)]
        if any(v < 1 or v != int(v) for v in values):
            raise NotLowerable(f"nearest upsampling with scale factors {values} (only integer factors >= 1)")
        return [int(v) for v in values]
    if size is None:
        raise NotLowerable("nearest upsampling without a size or scale factor")
    sizes = [int(v) for v in _as_list(size, r)]
    if any(o < i or o % i for o, i in zip(sizes, spatial)):
        raise NotLowerable(f"nearest upsampling from {spatial} to {sizes} (only integer multiples)")
    return [o // i for o, i in zip(sizes, spatial)]


def _as_list(v: Any, r: int) -> list[Any]:
    if isinstance(v, (int, float)) or v is None:
        return [v] * r
    v = list(v)
    return v * r if len(v) == 1 else v


def repeat_each(cx: Cx, input: Any, factors: Sequence[int]) -> Any:
    """Every entry of the trailing axes repeated ``factors[i]`` times (the ONNX importer's nearest
    Resize): reshape to (e, 1) pairs, broadcast to (e, f), merge."""
    s = list(cx.shape(input))
    lead = s[:len(s) - len(factors)]
    tail = s[len(lead):]
    if all(f == 1 for f in factors):
        return input
    x = reshape(cx, input, lead + [d for e in tail for d in (e, 1)])
    x = expand(cx, x, lead + [d for e, f in zip(tail, factors) for d in (e, f)])
    return reshape(cx, x, lead + [e * f for e, f in zip(tail, factors)])


_LINEAR_MODES = {"linear": 1, "bilinear": 2, "trilinear": 3}


def interpolate(cx: Cx, input: Any, size: Any = None, scale_factor: Any = None, mode: str = "nearest",
                align_corners: Any = None, recompute_scale_factor: Any = None, antialias: bool = False) -> Any:
    """F.interpolate: nearest (and nearest-exact) with integer factors repeat each entry; linear,
    bilinear and trilinear are ``resize_linear``; bicubic and area are out of scope."""
    r = cx.rank(input) - 2
    if r < 1:
        raise NotLowerable(f"interpolate of a rank-{cx.rank(input)} input (needs (N, C, *spatial))")
    if mode in _LINEAR_MODES:
        if antialias:
            raise NotLowerable(f"interpolate mode={mode!r} with antialias=True")
        scales = None if recompute_scale_factor else scale_factor
        return resize_linear(cx, input, r, size, scales, bool(align_corners))
    if mode not in ("nearest", "nearest-exact"):
        raise NotLowerable(f"interpolate mode={mode!r} (nearest with integer scale factors, or (bi/tri)linear)")
    return repeat_each(cx, input, _integer_factors(cx, input, r, size, scale_factor))


def resize_linear(cx: Cx, input: Any, r: int, size: Any, scales: Any, align_corners: bool) -> Any:
    """Linear interpolation of the trailing ``r`` axes. Without align_corners PyTorch's source
    coordinate uses a given scale factor, and ours uses out/in: they must be equal (as rationals)."""
    spatial = list(cx.shape(input)[-r:])
    given = None if scales is None or all(v is None for v in _as_list(scales, r)) else _as_list(scales, r)
    if size is not None:
        sizes = [int(v) for v in _as_list(size, r)]
    elif given is not None:
        sizes = [int(math.floor(i * float(f))) for i, f in zip(spatial, given)]
    else:
        raise NotLowerable("linear interpolation without a size or scale factor")
    if not align_corners and given is not None:
        for i, o, f in zip(spatial, sizes, given):
            if f is not None and Fraction(float(f)) != Fraction(o, i):
                raise NotLowerable(f"linear interpolation with scale factor {f} from {i} to {o} cells (PyTorch's "
                                   "coordinates then use the scale, not out/in; pass a size or "
                                   "recompute_scale_factor=True)")
    if sizes == spatial:  # PyTorch copies (its kernels special-case equal sizes)
        return input
    mode = "align_corners" if align_corners else "half_pixel"
    return cx.add("resize_linear", [cx.node(input, FLOAT)],
                  {"spatial_rank": r, "sizes": sizes, "coordinate_mode": mode})


def upsample_linear(r: int):
    """aten.upsample_{linear1d,bilinear2d,trilinear3d}: ``.vec`` passes (output_size, align_corners,
    scale_factors); ``.default`` passes output_size, align_corners and one optional scale per axis."""

    def lower(cx: Cx, input: Any, output_size: Any, align_corners: bool, *scales: Any) -> Any:
        if len(scales) == 1 and (scales[0] is None or isinstance(scales[0], (list, tuple))):
            return resize_linear(cx, input, r, output_size, scales[0], bool(align_corners))
        return resize_linear(cx, input, r, output_size, list(scales) or None, bool(align_corners))

    return lower


def upsample_interpolating(mode: str):
    """aten.upsample_bicubic2d (and other interpolating modes without an IR form): refused with the reason."""

    def lower(cx: Cx, *args: Any, **kwargs: Any) -> Any:
        raise NotLowerable(f"upsampling mode={mode!r} (nearest with integer scale factors, or (bi/tri)linear)")

    return lower


def upsample_nearest(r: int):
    """aten.upsample_nearest{r}d and _upsample_nearest_exact{r}d: ``.vec`` passes (output_size,
    scale_factors); ``.default`` passes output_size and one optional scale per axis, which PyTorch
    reads as ``floor(o / scale)``, so a given scale must be the integer factor the size implies."""

    def lower(cx: Cx, input: Any, output_size: Any, *scales: Any) -> Any:
        if len(scales) == 1 and (scales[0] is None or isinstance(scales[0], (list, tuple))):
            return repeat_each(cx, input, _integer_factors(cx, input, r, output_size, scales[0]))
        factors = _integer_factors(cx, input, r, output_size, None)
        for f, sc in zip(factors, scales):
            if sc is not None and float(sc) != f:
                raise NotLowerable(f"nearest upsampling with scale {sc} for an output {f} times larger")
        return repeat_each(cx, input, factors)

    return lower
