"""Lowerings shared by both torch importers: elementwise, activations, reductions, layout, indexing.

Each function takes the ``Lowerer`` and the resolved arguments with ATen-style names (``input``,
``other``, ``dim``, ``keepdim``) and returns the value of the framework node. The FX and ATen tables
adapt their signatures onto these. Broadcasting is explicit (``GraphBuilder.elementwise``),
Python scalars become rank-0 consts in the element type they meet, and layout ops applied to a
state_dict tensor keep it a ``Known`` with the transform recorded, so its binding survives.
"""

from __future__ import annotations

from typing import Any, Sequence

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
}


def unary(kind: str):
    def lower(cx: Cx, input: Any, inplace: bool = False) -> Sym:
        return cx.add(kind, [cx.node(input, FLOAT)])
    return lower


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


def max_or_min(which: str):
    """torch.max(x) / max(x, dim, keepdim) -> (values, indices) / max(x, other)."""

    def lower(cx: Cx, input: Any, dim: Any = None, keepdim: bool = False) -> Any:
        if _is_tensor(dim):
            return binary(f"{which}_elem")(cx, input, dim)
        if dim is None:
            return _extremum(f"reduce_{which}")(cx, input, None, False)
        values = _extremum(f"reduce_{which}")(cx, input, [dim], keepdim)
        return values, _arg(f"arg{which}")(cx, input, dim, keepdim)

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


def index_select(cx: Cx, input: Any, dim: int, index: Any) -> Sym:
    return gather_axis(cx, input, normalize_axis(dim, cx.rank(input)), index)


def index(cx: Cx, input: Any, indices: Sequence[Any]) -> Sym:
    """aten.index.Tensor: one tensor index (the others None) is a gather on that axis."""
    used = [(i, ix) for i, ix in enumerate(indices) if ix is not None]
    if len(used) != 1:
        raise NotLowerable(f"advanced indexing with {len(used)} index tensors (only one is supported)")
    return gather_axis(cx, input, used[0][0], used[0][1])


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
    advanced: tuple[int, Any] | None = None
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
            if advanced is not None:
                raise NotLowerable("indexing with more than one index tensor")
            if isinstance(it, (list, tuple)):
                it = Known(torch.tensor(it), folded=True)
            advanced = (axis, it)
            axis += 1
        else:
            raise NotLowerable(f"index {it!r} is not supported")
    if advanced is not None:
        x = gather_axis(cx, x, advanced[0], advanced[1])
    return x


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

