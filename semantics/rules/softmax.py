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
from .table import float_rule, interval_rule

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
    if x.shape[-1] == 0:
        return x
    m = np.max(x, axis=-1, keepdims=True, where=allowed, initial=-np.inf)
    e = np.zeros_like(x)
    np.exp(x - m, out=e, where=allowed)
    total = np.sum(e, axis=-1, keepdims=True)
    return np.divide(e, total, out=np.zeros_like(x), where=total > 0)


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
    return softmax_box(ps[0], ps[0][0].ndim - 1, allowed)
