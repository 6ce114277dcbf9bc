"""Normalization: layernorm and batch_norm_eval.

LayerNorm, interval. ``d_i = x_i - mean(x)`` is enclosed keeping x_i's own contribution exact
(``E d_i = (E - 1) x_i - sum_{j != i} x_j``); the variance from the boxes of ``d_i^2``; then
``d_i / sqrt(var + eps)``, intersected with ``|y_i| <= sqrt(E - 1)`` (true for any row, since
``(x_i - mean)^2 <= (E - 1) var``); then gamma and beta. Sound, not exact: the enclosure forgets
that the d_i are correlated (documented loss, as in auto_LiRPA's IBP).
"""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np

from .. import interval_arith as ia
from ..interval_arith import DomainError
from ..interval_round import Box, down, sum_bounds, up
from ..records import in_dtype
from .elementwise import lean_max, sqrt_box
from ..folds import fold_sum
from .table import FLOAT_RULES, INTERVAL_RULES, exact_rule, float_params, float_rule, interval_rule, read_params

__all__ = ["layernorm_box", "batch_norm_box"]

FLOAT_RULES.params["layernorm"] = FLOAT_RULES.params["batch_norm_eval"] = lambda node, record, dt: in_dtype(record, dt)


@float_rule("layernorm")
def layernorm(node, xs, rec, dt):
    x, ax = xs[0], node.attrs["axis"]
    gamma, beta = float_params(node, rec, x.shape, dt)
    if x.size == 0:
        return x
    axes = tuple(range(ax, x.ndim))
    centered = x - np.mean(x, axis=axes, keepdims=True)
    # TorchLean's reduceVar centres again: two-pass population variance of the centred row
    again = centered - np.mean(centered, axis=axes, keepdims=True)
    var = lean_max(np.mean(again * again, axis=axes, keepdims=True), dt.type(0))
    y = centered / np.sqrt(var + node.attrs["eps"])
    y *= gamma if gamma is not None else dt.type(1)
    y += beta if beta is not None else dt.type(0)  # Lean adds its zero beta: -0.0 becomes +0.0
    return y


@exact_rule("layernorm")
def layernorm_exact(node, xs, rec, dt):
    """``Spec.layerNorm`` on the [R, E] view: mean = fold/E, c = x - mean, var = max(reduceVar(c), 0)
    with reduceVar centring again, y = c / sqrt(var + eps) * gamma + beta (ones/zeros when absent)."""
    x, ax = xs[0], node.attrs["axis"]
    gamma, beta = float_params(node, rec, x.shape, dt)
    if x.size == 0:
        return x
    e = int(np.prod(x.shape[ax:]))
    rows = x.reshape(-1, e)
    c = rows - (fold_sum(rows, 1) / e)[:, None]
    d = c - (fold_sum(c, 1) / e)[:, None]
    var = lean_max(fold_sum(d * d, 1) / e, 0.0)
    y = c / np.sqrt(var + node.attrs["eps"])[:, None]
    y = y * (gamma.reshape(-1) if gamma is not None else 1.0) + (beta.reshape(-1) if beta is not None else 0.0)
    return y.reshape(x.shape)


@float_rule("batch_norm_eval")
def batch_norm_eval(node, xs, rec, dt):
    x, ax = xs[0], node.attrs["channel_axis"]
    p = float_params(node, rec, x.shape, dt)
    shape = (-1,) + (1,) * (x.ndim - ax - 1)
    mean, var, gamma, beta = (a.reshape(shape) for a in (p.running_mean, p.running_var, p.weight, p.bias))
    # the formula's steps in its order, in place after the first (one array, not four: 0.27 against 0.34 ms
    # on ConvMixer's 256x32x32, the same bits)
    y = x - mean
    y /= np.sqrt(lean_max(var, dt.type(0)) + node.attrs["eps"])
    y *= gamma
    y += beta
    return y


def layernorm_box(a: Box, axis: int, eps: float, gamma: np.ndarray | None, beta: np.ndarray | None) -> Box:
    lo, hi = a
    if lo.size == 0:
        return a
    axes = tuple(range(axis, lo.ndim))
    e = math.prod(lo.shape[axis:])
    s_lo, s_hi = sum_bounds(lo, hi, axes)
    s_lo, s_hi = np.expand_dims(s_lo, axes), np.expand_dims(s_hi, axes)
    with np.errstate(all="ignore"):
        # E * d_i = (E - 1) x_i - (S - x_i), with S - x_i from the other entries only
        others = down(s_lo - lo), up(s_hi - hi)
        others = np.minimum(others[0], others[1]), np.maximum(others[0], others[1])
        ed = ia.sub(ia.scale(a, float(e - 1)), others)
    d = ed if e == 1 else (down(ed[0] / e), up(ed[1] / e))
    sq = ia.square(d)
    v_lo, v_hi = sum_bounds(sq[0], sq[1], axes)
    var = down(np.maximum(v_lo, 0.0) / e), up(v_hi / e)
    den = sqrt_box(ia.add_const((np.expand_dims(var[0], axes), np.expand_dims(var[1], axes)), eps))
    if np.any(den[0] <= 0):
        den = np.maximum(den[0], 0.0), den[1]
        y = _safe_quotient(d, den)
    else:
        y = ia.div(d, den)
    limit = up(np.sqrt(np.float64(e - 1)))
    y = np.clip(y[0], -limit, limit), np.clip(y[1], -limit, limit)
    if gamma is not None:
        y = ia.scale(y, np.asarray(gamma, dtype=np.float64))
    if beta is not None:
        y = ia.add_const(y, np.asarray(beta, dtype=np.float64))
    return y


def _safe_quotient(d: Box, den: Box) -> Box:
    """d / den for den in [0, hi]: unbounded where den may vanish (eps = 0 and a constant row)."""
    with np.errstate(all="ignore"):
        q = ia.div(d, (np.where(den[0] > 0, den[0], 1.0), den[1]))
    zero = den[0] <= 0
    return np.where(zero, -np.inf, q[0]), np.where(zero, np.inf, q[1])


def _channel(v: np.ndarray, axis: int, rank: int) -> np.ndarray:
    return np.asarray(v, dtype=np.float64).reshape((-1,) + (1,) * (rank - axis - 1))


def batch_norm_box(a: Box, record: Mapping[str, np.ndarray], axis: int, eps: float) -> Box:
    """((x - mean) / sqrt(max(var, 0) + eps)) * gamma + beta, each step outward rounded."""
    rank = a[0].ndim
    mean = _channel(record["running_mean"], axis, rank)
    var = np.maximum(_channel(record["running_var"], axis, rank), 0.0)
    with np.errstate(all="ignore"):
        den = np.maximum(down(np.sqrt(np.maximum(down(var + eps), 0.0))), 0.0), up(np.sqrt(up(var + eps)))
    if np.any(den[0] <= 0):
        raise DomainError("batch_norm_eval: var + eps is 0 for some channel")
    q = ia.div(ia.sub(a, ia.point(mean)), den)
    return ia.add_const(ia.scale(q, _channel(record["weight"], axis, rank)), _channel(record["bias"], axis, rank))


@interval_rule("layernorm")
def layernorm_rule(node, ps, rec):
    gamma, beta = read_params(INTERVAL_RULES, node, rec, ps[0][0].shape)
    return layernorm_box(ps[0], node.attrs["axis"], node.attrs["eps"], gamma, beta)


@interval_rule("batch_norm_eval")
def batch_norm_rule(node, ps, rec):
    p = read_params(INTERVAL_RULES, node, rec, ps[0][0].shape)
    return batch_norm_box(ps[0], p._asdict(), node.attrs["channel_axis"], node.attrs["eps"])
