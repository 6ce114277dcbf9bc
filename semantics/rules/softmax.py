"""Softmax, log_softmax and hard_masked_softmax.

Float: the max-shifted ``exp(x - max) / sum exp(x - max)`` along the axis.

Interval: entry i is ``1 / (1 + sum_{j != i} exp(x_j - x_i))``: increasing in x_i, decreasing in every
other x_j, so its exact range over a box is reached at ``(lo_i, hi_j)`` (lower end) and
``(hi_i, lo_j)`` (upper end). We compute ``t_i = log sum_{j != i} exp(hi_j - lo_i)`` stably (shift by
the row maximum, subtract entry i from the full sum with directed rounding) and return
``sigmoid(-t_i)``; log_softmax is ``-softplus(t_i)``. These per-entry bounds are the tightest boxes.
"""

from __future__ import annotations

import numpy as np

from ..interval_arith import exp_at, log_at
from ..interval_round import Box, clean, down, sum_nonneg_bounds, up
from ..records import fail
from .activations import sigmoid_at, softplus_at
from ..folds import fold_sum, libm
from .table import exact_rule, float_rule, interval_rule

__all__ = ["softmax_box", "log_softmax_box"]


@float_rule("softmax")
def softmax(node, xs, rec, dt):
    x, ax = xs[0], node.attrs["axis"]
    if not ax < x.ndim:
        raise fail(node, f"IR eval: node {node.id}: softmax: invalid axis {ax} for rank {x.ndim} ({node.summary()})")
    if x.shape[ax] == 0:
        return x
    e = np.exp(x - np.max(x, axis=ax, keepdims=True))
    e /= np.sum(e, axis=ax, keepdims=True)
    return e


@float_rule("log_softmax")
def log_softmax(node, xs, rec, dt):
    x, ax = xs[0], node.attrs["axis"]
    if x.shape[ax] == 0:
        return x
    shifted = x - np.max(x, axis=ax, keepdims=True)
    return shifted - np.log(np.sum(np.exp(shifted), axis=ax, keepdims=True))


@float_rule("hard_masked_softmax")
def hard_masked_softmax(node, xs, rec, dt):
    x = xs[0]
    allowed = np.asarray(node.attrs["allowed"], dtype=bool).reshape(x.shape)
    if x.ndim == 0:  # Spec.hardMaskedSoftmaxSpec on a scalar: 1 if allowed, else 0
        return np.asarray(1 if allowed else 0, dtype=dt)
    if x.shape[-1] == 0:
        return x
    any_allowed = allowed.any(axis=-1, keepdims=True)
    m = np.where(any_allowed[..., 0], _first_seeded_max(x, allowed), 0)[..., None]
    e = np.zeros_like(x)
    np.exp(x - m, out=e, where=allowed)
    # TorchLean divides every numerator, blocked zeros included (0 / NaN is NaN); a fully blocked row is zeros
    return np.where(any_allowed, e / np.sum(e, axis=-1, keepdims=True), 0)


def _first_seeded_max(x: np.ndarray, allowed: np.ndarray | None = None) -> np.ndarray:
    """TorchLean's row maximum over the last axis: seeded with the first (allowed) entry, replaced by
    a later entry only when it is greater, so NaN counts only as the first entry. Equal to the
    largest non-NaN entry unless the first is NaN (which value of +-0 wins does not matter here:
    the maximum is only subtracted before exp)."""
    keep = np.ones(x.shape, bool) if allowed is None else allowed
    m = np.fmax.reduce(np.where(keep, x, -np.inf), axis=-1)
    first = np.argmax(keep, axis=-1)[..., None]
    first_value = np.take_along_axis(x, first, axis=-1)[..., 0]
    return np.where(np.isnan(first_value), np.nan, m)


@exact_rule("softmax")
def softmax_exact(node, xs, rec, dt):
    """``softmaxSpec``: the axis moved innermost, e = exp(x - m) (libm), divided by its fold from +0.0."""
    x, ax = xs[0], node.attrs["axis"]
    if not ax < x.ndim or x.shape[ax] == 0:
        return softmax(node, xs, rec, dt)
    inner = np.moveaxis(x, ax, -1)
    e = libm("exp", inner - _first_seeded_max(inner)[..., None])
    return np.moveaxis(e / fold_sum(e, -1)[..., None], -1, ax)


@exact_rule("hard_masked_softmax")
def hard_masked_softmax_exact(node, xs, rec, dt):
    """``hardMaskedSoftmaxVecSpec`` per last-axis row: numerators exp(x - rowMax) where allowed, 0
    elsewhere, each divided by their fold; a fully blocked row is zeros; a scalar is 1 or 0."""
    x = xs[0]
    allowed = np.asarray(node.attrs["allowed"], dtype=bool).reshape(x.shape)
    if x.ndim == 0 or x.shape[-1] == 0:
        return hard_masked_softmax(node, xs, rec, dt)
    any_allowed = allowed.any(axis=-1)
    m = np.where(any_allowed, _first_seeded_max(x, allowed), 0.0)
    numerators = np.where(allowed, libm("exp", np.where(allowed, x - m[..., None], 0.0)), 0.0)
    y = numerators / fold_sum(numerators, -1)[..., None]
    return np.where(any_allowed[..., None], y, 0.0)


def _log_others(num: np.ndarray, den: np.ndarray, axis: int, allowed: np.ndarray | None, upper: bool) -> np.ndarray:
    """Bound of ``log sum_{j != i, allowed} exp(num_j - den_i)`` (upper or lower end) for every i."""
    with np.errstate(all="ignore"):
        keep = np.ones(num.shape, bool) if allowed is None else allowed
        m = np.max(np.where(keep, num, -np.inf), axis=axis, keepdims=True)
        m = np.where(np.isfinite(m), m, 0.0)
        shifted = (up if upper else down)(num - m)
        e = exp_at(shifted)[1 if upper else 0]
        e = np.where(keep, e, 0.0)
        n = num.shape[axis]
        total = sum_nonneg_bounds(np.sum(e, axis=axis, keepdims=True), n)[1 if upper else 0]
        if upper:
            others = up(total - exp_at(down(num - m))[0] * keep)
        else:
            others = np.maximum(down(total - exp_at(up(num - m))[1] * keep), 0.0)
        logs = log_at(others)[1 if upper else 0]
        logs = np.where(others == 0, -np.inf, logs)
        gap = (up if upper else down)(m - den)
        out = (up if upper else down)(logs + gap)
        return np.where(np.isnan(out), np.inf if upper else -np.inf, out)


def _t_bounds(a: Box, axis: int, allowed: np.ndarray | None) -> Box:
    """(t_lo, t_hi): t_hi bounds log sum_{j!=i} exp(hi_j - lo_i) above, t_lo the (lo_j - hi_i) one below."""
    return _log_others(a[0], a[1], axis, allowed, upper=False), _log_others(a[1], a[0], axis, allowed, upper=True)


def softmax_box(a: Box, axis: int, allowed: np.ndarray | None = None) -> Box:
    if a[0].shape[axis] == 0:
        return a
    t_lo, t_hi = _t_bounds(a, axis, allowed)
    lo, hi = sigmoid_at(-t_hi)[0], sigmoid_at(-t_lo)[1]
    if allowed is not None:
        lo, hi = np.where(allowed, lo, 0.0), np.where(allowed, hi, 0.0)
    return np.clip(lo, 0.0, 1.0), np.clip(hi, 0.0, 1.0)


def log_softmax_box(a: Box, axis: int) -> Box:
    if a[0].shape[axis] == 0:
        return a
    t_lo, t_hi = _t_bounds(a, axis, None)
    lo, hi = -softplus_at(t_hi)[1], -softplus_at(t_lo)[0]
    return clean(lo, np.minimum(hi, 0.0))


interval_rule("softmax")(lambda node, ps, rec: softmax_box(ps[0], node.attrs["axis"]))
interval_rule("log_softmax")(lambda node, ps, rec: log_softmax_box(ps[0], node.attrs["axis"]))


@interval_rule("hard_masked_softmax")
def hard_masked_softmax_box(node, ps, rec):
    allowed = np.asarray(node.attrs["allowed"], dtype=bool).reshape(ps[0][0].shape)
    if allowed.ndim == 0:
        one = np.asarray(1.0 if allowed else 0.0)
        return one, one
    return softmax_box(ps[0], ps[0][0].ndim - 1, allowed)
