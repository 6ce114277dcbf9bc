"""Reduction lowerings: sums, means, extrema, arg-extrema, any/all, sort/topk values, softmax,
statistics and norms, logsumexp, products and running sums.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch

from torchlean_bridge.ops import BOOL, FLOAT

from .common import NotLowerable, Sym, normalize_axis, prod
from .lowerer import Lowerer
from .ops_elementwise import (COMPARE, add, clamp, div, exact_integer, integer_range, is_tensor, maximum, minimum,
                              square, sub, unary, where)
from .ops_layout import reshape
from .targets import lowers, register

Cx = Lowerer


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


@lowers(aten="sum.default sum.dim_IntList", fx="torch.sum", methods="sum")
def reduce_sum(cx: Cx, input: Any, dim: Any = None, keepdim: bool = False, dtype: Any = None) -> Sym:
    if cx.etype(input) != FLOAT and (dtype is None or not dtype.is_floating_point):
        raise NotLowerable("integer/bool sums have no IR op")
    return _reduce(cx, input, _axes(cx, input, dim), keepdim, "reduce_sum", "reduce_sum_axes", "sum")


@lowers(aten="mean.default mean.dim", fx="torch.mean", methods="mean")
def reduce_mean(cx: Cx, input: Any, dim: Any = None, keepdim: bool = False, dtype: Any = None) -> Sym:
    return _reduce(cx, input, _axes(cx, input, dim), keepdim, "reduce_mean", "reduce_mean_axes", None)


def _extremum(kind: str):
    def lower(cx: Cx, input: Any, dim: Any = None, keepdim: bool = False) -> Sym:
        axes = _axes(cx, input, dim)
        return cx.add(kind, [cx.node(input, cx.etype(input))], {"axes": axes, "keepdim": bool(keepdim)})
    return lower


reduce_max = register(_extremum("reduce_max"), aten="amax.default", fx="torch.amax", methods="amax")
reduce_min = register(_extremum("reduce_min"), aten="amin.default", fx="torch.amin", methods="amin")


def _arg(kind: str):
    def lower(cx: Cx, input: Any, dim: int | None = None, keepdim: bool = False) -> Sym:
        x: Any = input
        if dim is None:
            x, dim = reshape(cx, input, [-1]), 0
            keepdim = False
        ax = normalize_axis(int(dim), cx.rank(x))
        return cx.add(kind, [cx.node(x, FLOAT)], {"axis": ax, "keepdim": bool(keepdim)})
    return lower


argmax = register(_arg("argmax"), aten="argmax.default", fx="torch.argmax", methods="argmax")
argmin = register(_arg("argmin"), aten="argmin.default", fx="torch.argmin", methods="argmin")


class ValuesIndices(NamedTuple):
    """``torch.return_types.max/min``: a pair that also answers ``.values`` and ``.indices``."""

    values: Any
    indices: Any


@lowers(aten="sort.default sort.stable", fx="torch.sort", methods="sort")
def sort(cx: Cx, input: Any, dim: int = -1, descending: bool = False, stable: Any = None) -> ValuesIndices:
    """torch.sort and aten.sort(.stable): the sorted values (NaN above +inf, as PyTorch) and their int64
    positions (``topk_indices``: stable, which any sort's indices may be)."""
    axis = normalize_axis(int(dim), cx.rank(input))
    return _sorted(cx, input, axis, cx.shape(input)[axis], bool(descending), "sort")


@lowers(aten="topk.default", fx="torch.topk", methods="topk")
def topk(cx: Cx, input: Any, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> ValuesIndices:
    """torch.topk: the k largest (or smallest) values, in order (a valid answer also when sorted=False)."""
    axis = normalize_axis(int(dim), cx.rank(input))
    return _sorted(cx, input, axis, int(k), bool(largest), "topk")


def _sorted(cx: Cx, input: Any, axis: int, k: int, descending: bool, what: str) -> ValuesIndices:
    if cx.etype(input) != FLOAT:
        raise NotLowerable(f"{what} of a {cx.etype(input)} tensor (only float values)")
    attrs = {"axis": axis, "k": k, "descending": descending}
    values = cx.add("sort", [cx.node(input, FLOAT)], attrs)
    # int64 positions, equal values by lower index (torch.sort(stable=True)'s order; any order is topk's answer)
    return ValuesIndices(values, cx.add("topk_indices", [cx.node(input, FLOAT)], attrs))


def max_or_min(which: str):
    """torch.max(x) / max(x, dim, keepdim) -> (values, indices) / max(x, other)."""

    def lower(cx: Cx, input: Any, dim: Any = None, keepdim: bool = False) -> Any:
        if is_tensor(dim):
            return (maximum if which == "max" else minimum)(cx, input, dim)
        reduce, arg = (reduce_max, argmax) if which == "max" else (reduce_min, argmin)
        if dim is None:
            return reduce(cx, input, None, False)
        return ValuesIndices(reduce(cx, input, [dim], keepdim), arg(cx, input, dim, keepdim))

    return lower


register(max_or_min("max"), aten="max.default max.dim", fx="torch.max", methods="max")
register(max_or_min("min"), aten="min.default min.dim", fx="torch.min", methods="min")



def any_all(which: str):
    """any/all over bool values: max/min of the 0/1 values, an exact reading of the definition."""

    def lower(cx: Cx, input: Any, dim: Any = None, keepdim: bool = False) -> Sym:
        as_float = cx.node(input, FLOAT)
        red = cx.add(f"reduce_{which}", [as_float], {"axes": _axes(cx, input, dim), "keepdim": bool(keepdim)})
        return Sym(cx.node(red, BOOL))

    return lower


register(any_all("max"), aten="any.dim any.dims any.default", methods="any")
register(any_all("min"), aten="all.dim all.dims all.default", methods="all")


def _softmax(kind: str):
    def lower(cx: Cx, input: Any, dim: int | None = None, dtype: Any = None, **_: Any) -> Sym:
        if isinstance(dtype, bool):  # aten._softmax(self, dim, half_to_float)
            dtype = None
        r = cx.rank(input)
        if dim is None:  # F.softmax's legacy implicit dim
            dim = 0 if r in (0, 1, 3) else 1
        return cx.add(kind, [cx.node(input, FLOAT)], {"axis": normalize_axis(int(dim), r)})
    return lower


softmax = register(_softmax("softmax"), aten="softmax.int _softmax.default _safe_softmax.default",
                   fx="torch.softmax", methods="softmax")
log_softmax = register(_softmax("log_softmax"), aten="log_softmax.int _log_softmax.default",
                       fx="torch.log_softmax", methods="log_softmax")


@lowers(fx="F.softmax")
def f_softmax(cx: Cx, input: Any, dim: int | None = None, _stacklevel: int = 3, dtype: Any = None) -> Sym:
    return softmax(cx, input, dim)


@lowers(fx="F.log_softmax")
def f_log_softmax(cx: Cx, input: Any, dim: int | None = None, _stacklevel: int = 3, dtype: Any = None) -> Sym:
    return log_softmax(cx, input, dim)



# -- statistics and norms --------------------------------------------------------------------------
def _correction(unbiased: Any, correction: Any) -> float:
    """PyTorch's Bessel correction: ``correction`` wins; ``unbiased`` (default True) means 1, else 0."""
    if correction is not None:
        return float(correction)
    return 0.0 if unbiased is False else 1.0


@lowers(aten="var.dim var.correction var.default", fx="torch.var", methods="var")
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
    dev = sub(cx, x, mean)
    total = _reduce(cx, square(cx, dev), axes, keepdim, "reduce_sum", "reduce_sum_axes", "sum")
    return total if n - c == 1 else div(cx, total, float(n - c))


@lowers(aten="std.dim std.correction std.default", fx="torch.std", methods="std")
def std(cx: Cx, input: Any, dim: Any = None, unbiased: Any = None, keepdim: bool = False, *,
        correction: Any = None) -> Sym:
    return cx.add("sqrt", [variance(cx, input, dim, unbiased, keepdim, correction=correction).nid])


def _with_mean(spread: Any):
    """var_mean / std_mean: ``(spread, mean)`` over the same dims, with the same keepdim."""

    def lower(cx: Cx, input: Any, dim: Any = None, unbiased: Any = None, keepdim: bool = False, *,
              correction: Any = None) -> tuple[Sym, Sym]:
        if isinstance(dim, bool):
            dim, unbiased = None, dim
        out = spread(cx, input, dim, unbiased, keepdim, correction=correction)
        return out, reduce_mean(cx, Sym(cx.node(input, FLOAT)), dim, keepdim)

    return lower


register(_with_mean(variance), aten="var_mean.dim var_mean.correction var_mean.default", fx="torch.var_mean")
register(_with_mean(std), aten="std_mean.dim std_mean.correction std_mean.default", fx="torch.std_mean")


@lowers(aten="linalg_vector_norm.default", fx="linalg.vector_norm")
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
        nonzero = Sym(cx.node(COMPARE["ne"](cx, x, 0.0), FLOAT))
        return _reduce(cx, nonzero, axes, keepdim, "reduce_sum", "reduce_sum_axes", "sum")
    if p < 0:
        raise NotLowerable(f"vector_norm with ord={ord:g} (negative orders are not supported)")
    if p == 2:
        return cx.add("sqrt", [_reduce(cx, square(cx, x), axes, keepdim, "reduce_sum", "reduce_sum_axes", "sum").nid])
    powered = unary("abs")(cx, x) if p == 1 else cx.add("pow", [unary("abs")(cx, x).nid], {"exponent": p})
    total = _reduce(cx, powered, axes, keepdim, "reduce_sum", "reduce_sum_axes", "sum")
    return total if p == 1 else cx.add("pow", [total.nid], {"exponent": 1.0 / p})


@lowers(fx="torch.norm")
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


@lowers(methods="norm")
def tensor_norm(cx: Cx, input: Any, p: Any = "fro", dim: Any = None, keepdim: bool = False,
                dtype: Any = None) -> Sym:
    """Tensor.norm: torch.norm's arguments, with ``dtype`` where torch.norm has ``out``."""
    return norm(cx, input, p, dim, keepdim, None, dtype)


@lowers(aten="norm.Scalar norm.ScalarOpt_dim norm.ScalarOpt_dim_dtype norm.ScalarOpt_dtype")
def aten_norm(cx: Cx, input: Any, p: Any = 2, dim: Any = None, keepdim: bool = False, dtype: Any = None) -> Sym:
    """aten.norm.Scalar / ScalarOpt_dim(_dtype): a vector norm."""
    return vector_norm(cx, input, 2 if p is None else p, dim, keepdim, dtype=dtype)


@lowers(fx="F.normalize")
def normalize(cx: Cx, input: Any, p: float = 2.0, dim: Any = 1, eps: float = 1e-12, out: Any = None) -> Sym:
    """F.normalize: ``x / clamp_min(vector_norm(x, p, dim, keepdim=True), eps)``."""
    if out is not None:
        raise NotLowerable("normalize with out=")
    dims = list(dim) if isinstance(dim, (list, tuple)) else [dim]
    denom = clamp(cx, vector_norm(cx, input, p, dims, True), float(eps), None)
    return div(cx, input, denom)


@lowers(aten="logsumexp.default", fx="torch.logsumexp special.logsumexp", methods="logsumexp")
def logsumexp(cx: Cx, input: Any, dim: Any = None, keepdim: bool = False) -> Sym:
    """torch._refs.logsumexp: ``log(sum(exp(x - m))) + m`` with m = amax(x), 0 where |m| is inf."""
    axes = _axes(cx, input, dim)
    if prod(cx.shape(input)) == 0:
        raise NotLowerable("logsumexp of an empty tensor")
    x = Sym(cx.node(input, FLOAT))
    top = cx.add("reduce_max", [x.nid], {"axes": axes, "keepdim": True})
    infinite = COMPARE["eq"](cx, unary("abs")(cx, top), float("inf"))
    top = where(cx, infinite, 0.0, top)
    total = _reduce(cx, unary("exp")(cx, sub(cx, x, top)), axes, keepdim, "reduce_sum", "reduce_sum_axes", "sum")
    shift = top if keepdim else reshape(cx, top, list(cx.shape(total)))
    return add(cx, unary("log")(cx, total), shift)


@lowers(aten="prod.default prod.dim_int", fx="torch.prod", methods="prod")
def reduce_prod(cx: Cx, input: Any, dim: Any = None, keepdim: bool = False, dtype: Any = None) -> Sym:
    if cx.etype(input) != FLOAT and (dtype is None or not dtype.is_floating_point):
        raise NotLowerable("prod of integer/bool tensors (an integer result) has no IR op")
    axes = _axes(cx, input, dim)
    return cx.add("reduce_prod", [cx.node(input, FLOAT)], {"axes": axes, "keepdim": bool(keepdim)})



@lowers(fx="F.softmin")
def softmin(cx: Cx, input: Any, dim: int | None = None, _stacklevel: int = 3, dtype: Any = None) -> Sym:
    """``softmax(-x)`` (F.softmin's legacy implicit dim is softmax's)."""
    return softmax(cx, unary("neg")(cx, input), dim)



@lowers(aten="cumsum.default", fx="torch.cumsum", methods="cumsum")
def cumsum(cx: Cx, input: Any, dim: int, dtype: Any = None) -> Sym:
    """torch.cumsum: float running sums; an integer or bool tensor's (int64 in PyTorch) are computed
    on floats and proven exact from the entries' range (``ops_elementwise.exact_integer``)."""
    axis = normalize_axis(int(dim), cx.rank(input))
    integer = cx.etype(input) != FLOAT and (dtype is None or not dtype.is_floating_point)
    if dtype is not None and dtype not in (torch.float32, torch.float64) and not integer:
        raise NotLowerable(f"cumsum with dtype={dtype}")
    total = cx.add("cumsum", [cx.node(input, FLOAT)], {"axis": axis})
    if not integer:
        return total
    entries, n = integer_range(cx, input), cx.shape(input)[axis]
    bounds = None if entries is None else (n * min(entries[0], 0), n * max(entries[1], 0))
    return exact_integer(cx, total, bounds, "running sum")
