"""Linear planes bounding softmax over its last axis as a function of all its inputs, sound in floating point.

For an input box [l, u] (per row of T logits) and each output k, planes J_l x + b_l <= softmax_k(x) <=
J_u x + b_u on the whole box, from two convex/concave bounds of softmax (the "LSE" bounds of Wei et al.,
AISTATS 2023; our derivation and rounding, not auto_LiRPA's code):

* lower: with chords kappa_i z + beta_i >= e^z on [l_i - m, u_i - m] (m = max u, a float shift),
  SE(x) = sum_i kappa_i (x_i - m) + beta_i >= sum_i e^(x_i - m) > 0, so
  softmax_k(x) >= L_k(x) = e^(x_k - m) / SE(x) = exp(x_k - m - log SE(x)), convex (exp of affine
  minus the log of a positive affine function); its tangent at the center x0 lies below it.
* upper: t_k(x) = x_k - LSE(x) = log softmax_k(x) is concave and lies in [log p_lo, log p_hi] for
  the box [p_lo, p_hi] of softmax_k; the chord c t + a of e^t there lies above e^t, so
  softmax_k <= h_k(x) = a + c t_k(x), concave (c >= 0); its tangent at x0 lies above it.

The slopes J are plain floating-point gradients (any slope is sound); the intercepts are rigorous:
for g = L_k - J x convex, min over the box >= g(x0) - sum_i |grad g(x0)_i| r_i (r_i = max distance
from x0_i to an end), every term enclosed in outward-rounded interval arithmetic; symmetrically for
the concave h_k. Rows whose boxes are not finite (or whose softmax box reaches 0) get constant planes
from the box.
"""

from __future__ import annotations

import numpy as np

from .. import interval_arith as ia
from ..interval_round import Box, down, gamma, sum_bounds, up

__all__ = ["softmax_planes", "Planes"]

# (J_l, b_l, J_u, b_u): [..., T, T] slopes (output k, input i) and [..., T] intercepts
Planes = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def _abs_hi(a: Box) -> np.ndarray:
    return np.maximum(np.abs(a[0]), np.abs(a[1]))


def _exp_chord(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Slope kappa and an intercept beta with kappa z + beta >= e^z on [a, b] (convexity: the max of
    e^z - kappa z over the interval is at an end)."""
    w = b - a
    kappa = np.where(w > 1e-12, (np.exp(b) - np.exp(a)) / np.where(w > 1e-12, w, 1.0), np.exp(b))
    kappa = np.maximum(np.where(np.isfinite(kappa), kappa, 0.0), 0.0)
    at = lambda z: ia.sub(ia.exp_at(z), ia.mul(ia.point(kappa), ia.point(z)))[1]  # noqa: E731
    return kappa, np.maximum(at(a), at(b))


def _tangent_intercept(g0: Box, grad: Box, slope: np.ndarray, r: np.ndarray, side: int) -> np.ndarray:
    """A bound of min (side -1, convex g) or max (side +1, concave) over the box of f(x) - slope x, from
    its enclosed value g0 = f(x0) - slope x0 and the enclosed gradient of f at x0 ([..., T, T])."""
    dev = _abs_hi(ia.sub(grad, ia.point(slope)))
    with np.errstate(all="ignore"):
        # a float sum of T nonnegative terms is within gamma_(T-1) of the exact one
        growth = 1.0 + 2.0 * gamma(max(slope.shape[-1], 2))
        spread = up(up(np.sum(up(dev * r[..., None, :]), axis=-1)) * growth + 2.0 ** -1070)
        return down(g0[0] - spread) if side < 0 else up(g0[1] + spread)


def _dot_box(slope: np.ndarray, x0: np.ndarray) -> Box:
    """slope @ x0 per output k (enclosed): [..., T]."""
    prod = ia.mul(ia.point(slope), ia.point(np.broadcast_to(x0[..., None, :], slope.shape)))
    return sum_bounds(prod[0], prod[1], -1)


def softmax_planes(lo: np.ndarray, hi: np.ndarray, out_lo: np.ndarray, out_hi: np.ndarray) -> Planes:
    """Planes of softmax over the last axis of the box [lo, hi] (output box [out_lo, out_hi])."""
    t = lo.shape[-1]
    eye = np.eye(t)
    finite = np.all(np.isfinite(lo) & np.isfinite(hi), axis=-1, keepdims=True)
    lo, hi = np.where(finite, lo, 0.0), np.where(finite, hi, 0.0)
    with np.errstate(all="ignore"):
        x0 = np.clip(lo * 0.5 + hi * 0.5, lo, hi)
        r = np.maximum(up(x0 - lo), up(hi - x0))
        # lower: L_k = e^(x_k - m) / SE(x)
        m = np.max(hi, axis=-1, keepdims=True)
        za, zb = down(lo - m), up(hi - m)
        kappa, beta = _exp_chord(za, zb)
        shifted = ia.sub(ia.point(x0), ia.point(np.broadcast_to(m, x0.shape)))
        se_terms = ia.add(ia.mul(ia.point(kappa), shifted), ia.point(beta))
        se0 = sum_bounds(se_terms[0], se_terms[1], -1)
        se0 = se0[0][..., None], se0[1][..., None]  # > 0 in exact arithmetic; a rounded end <= 0 gives a non-finite b_l
        e0 = ia.monotone(ia.exp_at, shifted)
        l0 = ia.div(e0, se0)  # [..., T] (k)
        # grad L_k = L_k (e_k - kappa / SE): [..., k, i]
        ratio = ia.div(ia.point(np.broadcast_to(kappa, x0.shape)), se0)  # [..., i]
        inner = ia.sub(ia.point(np.broadcast_to(eye, x0.shape + (t,))), (ratio[0][..., None, :], ratio[1][..., None, :]))
        grad_l = ia.mul((l0[0][..., :, None], l0[1][..., :, None]), inner)
        l0_f = np.exp(x0 - m) / np.maximum(np.sum(kappa * (x0 - m) + beta, axis=-1, keepdims=True), 2.0 ** -1000)
        j_l = l0_f[..., :, None] * (eye - (kappa / np.sum(kappa * (x0 - m) + beta, axis=-1, keepdims=True))[..., None, :])
        j_l = np.where(np.isfinite(j_l), j_l, 0.0)
        g0 = ia.sub(l0, _dot_box(j_l, x0))
        b_l = _tangent_intercept(g0, grad_l, j_l, r, -1)
        # upper: h_k = a + c (x_k - LSE(x)) on t in [log p_lo, log p_hi]
        p_lo, p_hi = np.maximum(out_lo, 0.0), np.minimum(out_hi, 1.0)
        usable = finite & (p_lo > 2.0 ** -1000) & (p_lo <= p_hi)
        ta = down(ia.log_at(np.where(usable, p_lo, 1.0))[0])
        tb = up(ia.log_at(np.where(usable, p_hi, 1.0))[1])
        c, a = _exp_chord(ta, tb)
        m0 = np.max(x0, axis=-1, keepdims=True)
        sh0 = ia.sub(ia.point(x0), ia.point(np.broadcast_to(m0, x0.shape)))
        ex0 = ia.monotone(ia.exp_at, sh0)
        s0 = sum_bounds(ex0[0], ex0[1], -1)
        s0 = np.maximum(s0[0], 1.0)[..., None], np.maximum(s0[1], 1.0)[..., None]  # the max term is e^0 = 1
        lse0 = ia.add(ia.point(m0), ia.monotone(ia.log_at, s0))
        sm0 = ia.div(ex0, s0)  # softmax(x0), [..., i]
        h0 = ia.add(ia.point(a), ia.mul(ia.point(c), ia.sub(ia.point(x0), lse0)))  # [..., k]
        inner_u = ia.sub(ia.point(np.broadcast_to(eye, x0.shape + (t,))), (sm0[0][..., None, :], sm0[1][..., None, :]))
        grad_u = ia.mul((c[..., :, None], c[..., :, None]), inner_u)
        sm_f = np.exp(x0 - m0) / np.sum(np.exp(x0 - m0), axis=-1, keepdims=True)
        j_u = c[..., :, None] * (eye - sm_f[..., None, :])
        j_u = np.where(np.isfinite(j_u), j_u, 0.0)
        hg0 = ia.sub(h0, _dot_box(j_u, x0))
        b_u = _tangent_intercept(hg0, grad_u, j_u, r, 1)
    ok_l = finite & np.isfinite(b_l) & (se0[0] > 0)  # ia.div needs a denominator box above 0
    ok_u = usable & np.isfinite(b_u)
    j_l, b_l = np.where(ok_l[..., None], j_l, 0.0), np.where(ok_l, b_l, out_lo)
    j_u, b_u = np.where(ok_u[..., None], j_u, 0.0), np.where(ok_u, b_u, out_hi)
    return j_l, b_l, j_u, b_u
