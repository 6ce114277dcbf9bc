"""Reductions: sum, reduce_sum/mean (one axis or several), max/min/prod, argmax/argmin, sort, cumsum,
mse_loss.

Interval sums use the order-independent bound of ``interval_round.sum_bounds`` (exact-sum bounds
under any summation order); max/min are exact on the ends; products multiply boxes pairwise.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from .. import interval_arith as ia
from ..interval_arith import DomainError, divide_exact
from ..interval_round import Box, clean, down, gamma, sum_bounds, up
from ..records import fail
from torchlean_bridge.ops import fmt_shape
from ..folds import fold_sum
from .table import FLOAT_RULES, INTERVAL_RULES, FloatRule, IntervalRule, domain_error, exact_rule, float_rule, \
    interval_rule, on_ends

__all__ = ["running_sum", "sorted_values", "mean_box"]

# -- sums and means ---------------------------------------------------------------------------


@float_rule("sum")
def sum_(node, xs, rec, dt):
    return np.sum(xs[0])


@interval_rule("sum")
def sum_box(node, ps, rec):
    lo, hi = ps[0]
    if lo.ndim == 0:
        return lo, hi
    return sum_bounds(lo, hi, tuple(range(lo.ndim)))


def mean_box(a: Box, axis) -> Box:
    axes = axis if isinstance(axis, tuple) else (axis,)
    n = math.prod(a[0].shape[x] for x in axes)
    return divide_exact(sum_bounds(a[0], a[1], axis), float(n))


float_rule("reduce_sum")(lambda node, xs, rec, dt: np.sum(xs[0], axis=node.attrs["axis"]))
float_rule("reduce_mean")(lambda node, xs, rec, dt: np.mean(xs[0], axis=node.attrs["axis"]))
interval_rule("reduce_sum")(lambda node, ps, rec: sum_bounds(*ps[0], node.attrs["axis"]))
interval_rule("reduce_mean")(lambda node, ps, rec: mean_box(ps[0], node.attrs["axis"]))

# exact mode: ``tensorFoldlSpec (+) 0`` (row-major for ``sum``), ``reduce_mean = sum / axisSize``
exact_rule("sum")(lambda node, xs, rec, dt: fold_sum(xs[0].reshape(-1), 0))
exact_rule("reduce_sum")(lambda node, xs, rec, dt: fold_sum(xs[0], node.attrs["axis"]))
exact_rule("reduce_mean")(lambda node, xs, rec, dt: fold_sum(xs[0], node.attrs["axis"])
                          / xs[0].shape[node.attrs["axis"]])


def _lowered_reduction(mean: bool) -> FloatRule:
    """TorchLean's importer lowers a multi-axis reduction to one single-axis reduction per axis, the
    largest axis first (each followed by a reshape re-inserting it when ``keepdim``)."""
    def run(node, xs, rec, dt):
        axes, x = sorted(node.attrs["axes"], reverse=True), xs[0]
        if mean and any(x.shape[a] == 0 for a in axes):
            raise domain_error(node, f"reduction over an empty axis of shape {fmt_shape(x.shape)}")
        for a in axes:
            n = x.shape[a]
            x = fold_sum(x, a) / n if mean else fold_sum(x, a)
            if node.attrs["keepdim"]:
                x = np.expand_dims(x, a)
        return x
    return run


exact_rule("reduce_sum_axes")(_lowered_reduction(mean=False))
exact_rule("reduce_mean_axes")(_lowered_reduction(mean=True))

# -- reductions over several axes -------------------------------------------------------------


def _axes_reduction(fn: Callable, needs_nonempty: bool) -> FloatRule:
    def run(node, xs, rec, dt):
        axes = tuple(node.attrs["axes"])
        x = xs[0]
        if not axes:
            return x
        if needs_nonempty and any(x.shape[a] == 0 for a in axes):
            raise domain_error(node, f"reduction over an empty axis of shape {fmt_shape(x.shape)}")
        return fn(x, axis=axes, keepdims=node.attrs["keepdim"])
    return run


def _axes_box(fn: Callable[[Box, tuple[int, ...]], Box], empty_ok: bool) -> IntervalRule:
    def run(node, ps, rec):
        axes, box = tuple(node.attrs["axes"]), ps[0]
        if not axes:
            return box
        if not empty_ok and any(box[0].shape[a] == 0 for a in axes):
            raise DomainError(f"{node.kind}: reduction over an empty axis of shape {fmt_shape(box[0].shape)}")
        lo, hi = fn(box, axes)
        if node.attrs["keepdim"]:
            lo, hi = np.expand_dims(lo, axes), np.expand_dims(hi, axes)
        return lo, hi
    return run


FLOAT_RULES["reduce_sum_axes"] = _axes_reduction(np.sum, False)
FLOAT_RULES["reduce_mean_axes"] = _axes_reduction(np.mean, True)
FLOAT_RULES["reduce_max"] = _axes_reduction(np.max, True)
FLOAT_RULES["reduce_min"] = _axes_reduction(np.min, True)
FLOAT_RULES["reduce_prod"] = _axes_reduction(np.prod, False)
INTERVAL_RULES["reduce_sum_axes"] = _axes_box(lambda b, axes: sum_bounds(b[0], b[1], axes), True)
INTERVAL_RULES["reduce_mean_axes"] = _axes_box(mean_box, False)
on_ends("reduce_max", "reduce_min")


def prod_box(a: Box, axes: tuple[int, ...], keepdim: bool) -> Box:
    """Product over axes by a pairwise tree of interval multiplications: log2(k) vectorized steps,
    each outward rounded; an odd length is padded with the point box 1 (exact)."""
    lo, hi = a
    rest = [i for i in range(lo.ndim) if i not in axes]
    order = rest + list(axes)
    k = math.prod(lo.shape[i] for i in axes)
    out_shape = tuple(lo.shape[i] for i in rest)
    acc = (np.transpose(lo, order).reshape(out_shape + (k,)).astype(np.float64),
           np.transpose(hi, order).reshape(out_shape + (k,)).astype(np.float64))
    if k == 0:
        acc = np.ones(out_shape + (1,)), np.ones(out_shape + (1,))
    while acc[0].shape[-1] > 1:
        if acc[0].shape[-1] % 2:
            one = np.ones(out_shape + (1,))
            acc = np.concatenate([acc[0], one], axis=-1), np.concatenate([acc[1], one], axis=-1)
        acc = ia.mul((acc[0][..., 0::2], acc[1][..., 0::2]), (acc[0][..., 1::2], acc[1][..., 1::2]))
    acc = acc[0][..., 0], acc[1][..., 0]
    if keepdim:
        acc = np.expand_dims(acc[0], axes), np.expand_dims(acc[1], axes)
    return acc


@interval_rule("reduce_prod")
def reduce_prod_box(node, ps, rec):
    axes = tuple(node.attrs["axes"])
    return ps[0] if not axes else prod_box(ps[0], axes, node.attrs["keepdim"])

# -- arg extrema ------------------------------------------------------------------------------


def _arg_reduction(fn: Callable) -> FloatRule:
    def run(node, xs, rec, dt):
        out = fn(xs[0], axis=node.attrs["axis"])
        if node.attrs["keepdim"]:
            out = np.expand_dims(out, node.attrs["axis"])
        return out.astype(np.int64)
    return run


def arg_extremum_box(a: Box, axis: int, keepdim: bool, largest: bool) -> Box:
    """Index of the first extremum: between the smallest and largest index that can win."""
    lo, hi = a if largest else (-a[1], -a[0])
    best_low = np.max(lo, axis=axis, keepdims=True)
    candidate = hi >= best_low
    n = lo.shape[axis]
    idx = np.arange(n).reshape((n,) + (1,) * (lo.ndim - axis - 1))
    first = np.min(np.where(candidate, idx, n), axis=axis, keepdims=keepdim).astype(np.float64)
    last = np.max(np.where(candidate, idx, -1), axis=axis, keepdims=keepdim).astype(np.float64)
    return first, last


FLOAT_RULES["argmax"] = _arg_reduction(np.argmax)
FLOAT_RULES["argmin"] = _arg_reduction(np.argmin)
interval_rule("argmax")(lambda node, ps, rec: arg_extremum_box(ps[0], node.attrs["axis"], node.attrs["keepdim"],
                                                               largest=True))
interval_rule("argmin")(lambda node, ps, rec: arg_extremum_box(ps[0], node.attrs["axis"], node.attrs["keepdim"],
                                                               largest=False))

# -- order statistics and running sums --------------------------------------------------------


def sorted_values(x: np.ndarray, axis: int, k: int, descending: bool) -> np.ndarray:
    """The first k values of x sorted along axis (NaN sorts above +inf, as in PyTorch)."""
    y = np.sort(x, axis=axis)
    if descending:
        y = np.flip(y, axis)
    return y[(slice(None),) * axis + (slice(0, k),)]


@float_rule("sort")
def sort(node, xs, rec, dt):
    a = node.attrs
    return sorted_values(xs[0], a["axis"], a["k"], a["descending"])


@interval_rule("sort")
def sort_box(node, ps, rec):
    """The j-th smallest value is non-decreasing in every entry, so its range over the box is the j-th
    smallest of the lower ends to the j-th smallest of the upper ends (exact: sorting rounds nothing)."""
    a = node.attrs
    return tuple(sorted_values(end, a["axis"], a["k"], a["descending"]) for end in ps[0])


def running_sum(x: np.ndarray, axis: int, exclusive: bool, reverse: bool) -> np.ndarray:
    """Sequential running sums along ``axis`` (numpy's cumsum adds left to right, as PyTorch does)."""
    if reverse:
        x = np.flip(x, axis)
    y = np.cumsum(x, axis=axis)
    if exclusive:  # entry i gets the sum before it: the inclusive sums shifted one place, 0 first
        shifted = np.zeros_like(y)
        shifted[(slice(None),) * axis + (slice(1, None),)] = y[(slice(None),) * axis + (slice(None, -1),)]
        y = shifted
    return np.flip(y, axis) if reverse else y


@float_rule("cumsum")
def cumsum(node, xs, rec, dt):
    a = node.attrs
    return running_sum(xs[0], a["axis"], a["exclusive"], a["reverse"])


@interval_rule("cumsum")
def cumsum_box(node, ps, rec):
    """Each running sum of the ends, widened by the order-independent bound gamma_n sum|x_i| (n the
    axis length, at least the number of terms of every prefix)."""
    a = node.attrs
    lo, hi = ps[0]
    g = gamma(max(lo.shape[a["axis"]] - 1, 1))
    with np.errstate(all="ignore"):
        ends = []
        for end, outward, sign in ((lo, down, -1.0), (hi, up, 1.0)):
            total = running_sum(end, a["axis"], a["exclusive"], a["reverse"])
            err = up(running_sum(np.abs(end), a["axis"], a["exclusive"], a["reverse"]) * g)
            ends.append(outward(total + sign * err))
        return clean(*ends)

# -- losses -----------------------------------------------------------------------------------


@float_rule("mse_loss")
def mse_loss(node, xs, rec, dt):
    if xs[0].shape != xs[1].shape:
        raise fail(node, f"IR eval: node {node.id}: mse_loss expects equal shapes, got {fmt_shape(xs[0].shape)} "
                         f"vs {fmt_shape(xs[1].shape)}")
    d = xs[0] - xs[1]
    return np.sum(d * d) / max(d.size, 1)


@exact_rule("mse_loss")
def mse_loss_exact(node, xs, rec, dt):
    """``sumSpec ((y - t) * (y - t)) / meanDenominator``: a row-major fold from +0.0."""
    if xs[0].shape != xs[1].shape:
        return mse_loss(node, xs, rec, dt)  # the default rule's refusal
    d = xs[0] - xs[1]
    return fold_sum((d * d).reshape(-1), 0) / max(d.size, 1)


@interval_rule("mse_loss")
def mse_box(node, ps, rec):
    sq = ia.square(ia.sub(ps[0], ps[1]))
    total = sum_bounds(sq[0], sq[1], tuple(range(sq[0].ndim))) if sq[0].ndim else sq
    n = float(max(sq[0].size, 1))
    lo, hi = np.asarray(total[0], dtype=np.float64), np.asarray(total[1], dtype=np.float64)
    return np.maximum(down(lo / n), 0.0), up(hi / n)
