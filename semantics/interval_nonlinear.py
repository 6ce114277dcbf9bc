"""Enclosures for the ops that couple entries: softmax, log_softmax, layernorm, products, argmax.

Softmax. Entry i is ``1 / (1 + sum_{j != i} exp(x_j - x_i))``: increasing in x_i, decreasing in every
other x_j, so its exact range over a box is reached at ``(lo_i, hi_j)`` (lower end) and
``(hi_i, lo_j)`` (upper end). We compute ``t_i = log sum_{j != i} exp(hi_j - lo_i)`` stably (shift by
the row maximum, subtract entry i from the full sum with directed rounding) and return
``sigmoid(-t_i)``; log_softmax is ``-softplus(t_i)``. These per-entry bounds are the tightest boxes.

LayerNorm. ``d_i = x_i - mean(x)`` is enclosed keeping x_i's own contribution exact
(``E d_i = (E - 1) x_i - sum_{j != i} x_j``); the variance from the boxes of ``d_i^2``; then
``d_i / sqrt(var + eps)``, intersected with ``|y_i| <= sqrt(E - 1)`` (true for any row, since
``(x_i - mean)^2 <= (E - 1) var``); then gamma and beta. Sound, not exact: the enclosure forgets
that the d_i are correlated (documented loss, as in auto_LiRPA's IBP).
"""

from __future__ import annotations

import math
import numpy as np

from . import interval_arith as ia
from .interval_round import Box, clean, down, sum_bounds, sum_nonneg_bounds, up
from .interval_unary import exp_at, log_at, sigmoid_at, softplus_at, sqrt_box

__all__ = ["softmax_box", "log_softmax_box", "layernorm_box", "prod_box", "arg_extremum_box", "mse_box"]


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


def mse_box(y: Box, t: Box) -> Box:
    sq = ia.square(ia.sub(y, t))
    total = sum_bounds(sq[0], sq[1], tuple(range(sq[0].ndim))) if sq[0].ndim else sq
    n = float(max(sq[0].size, 1))
    lo, hi = np.asarray(total[0], dtype=np.float64), np.asarray(total[1], dtype=np.float64)
    return np.maximum(down(lo / n), 0.0), up(hi / n)
