"""Sound linear relaxations of elementwise functions: ``a_l z + b_l <= f(z) <= a_u z + b_u`` on [l, u].

Every relaxation holds for the *exact real* f on the whole real interval [l, u] (l, u floats, the
node's input bounds). Slopes are chosen by heuristics in plain floating point (any slope is sound);
the intercepts are then computed rigorously for the chosen slope:

* ReLU-like functions (relu, leaky_relu, prelu with constant slopes) are piecewise linear: the
  chord touches both ends and by convexity (concavity when the negative slope exceeds 1) lies above
  (below) f; its intercept is the outward-rounded max (min) over the two ends of f(z) - k z. The
  other side is the line s z through the origin with s between the two slopes, chosen as auto_LiRPA's
  default "adaptive" rule (slope 1 when the chord's slope exceeds 1/2).
* Smooth functions (sigmoid, tanh, exp, softplus, gelu, silu, integer powers; 1/x and 1/sqrt(x) on
  positive boxes) are described by a point
  enclosure of f and of f', and their convexity pieces. For a slope s the intercept of the lower line
  is a lower bound of min over [l, u] of g(z) = f(z) - s z, taken piece by piece: on a concave piece
  g is concave and its minimum is at an end; on a convex piece g is convex and lies above its tangent
  at any point d (d ~ argmin: where f'(d) = s, in closed form for sigmoid, tanh, exp, softplus and elu,
  else by Newton steps inside a bisection bracket), so min g >= g(d) - |g'(d)| max(d - a, b - d)
  with g'(d) enclosed: wherever d lands the bound holds, its accuracy only buys tightness. Upper lines
  are symmetric. A few candidate slopes (chord, tangents at the midpoint and the quartiles, and the
  tangents through an end) are ranked, all stacked in one pass over the entries, by plain floating-point
  estimates of their intercepts (g at the box's ends, breaks and tangent points), and the one closest to
  f at the midpoint is kept; only its intercept is computed rigorously. Candidate points use plain
  floating-point f, f' and f''.

This is where auto_LiRPA's CROWN is unsound for x**2 on [2, 5] (upper line below 25 at z = 5): here
the upper intercept is the max of f(z) - s z over the two ends, so the line is above f at both ends,
and by convexity on all of [l, u].
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from .. import interval_arith as ia
from ..float_special import erf
from ..interval_arith import erf_at, exp_at, tanh_at
from ..interval_round import LIB_ULPS, Box, down, up, widen
from ..rules.activations import INV_SQRT2, _elu_with, _silu_at, gelu_box, sigmoid_at, softplus_at
from ..rules.elementwise import pow_box, rsqrt_box

__all__ = ["Lines", "relu_lines", "Smooth", "intercepts", "smooth_for", "smooth_lines", "SMOOTH_KINDS", "POSITIVE_ONLY"]

# (a_l, b_l, a_u, b_u): a_l z + b_l <= f(z) <= a_u z + b_u on the node's input box
Lines = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]

_BISECT_STEPS = 44


def relu_lines(lo: np.ndarray, hi: np.ndarray, slope: np.ndarray | float) -> Lines:
    """Lines for f(z) = z (z >= 0), slope * z (z < 0), per entry (slope broadcastable)."""
    if isinstance(slope, float) and slope == 0.0 and lo.ndim:
        return _plain_relu_lines(lo, hi)
    a = np.broadcast_to(np.asarray(slope, dtype=np.float64), lo.shape)
    one = np.ones_like(lo)
    with np.errstate(all="ignore"):
        mixed = (lo < 0) & (hi > 0)
        # chord through (l, a l) and (u, u); its slope is any float (soundness is in the intercept)
        k = np.where(mixed, (hi - a * lo) / np.where(mixed, hi - lo, 1.0), 0.0)
        fl_lo, fl_hi = ia.mul(ia.point(a), ia.point(lo))  # f(l) = a l, enclosed
        convex = a <= 1.0
        # f(u) - k u and f(l) - k l, rounded up (for an upper chord) or down (for a lower chord)
        c_up = np.maximum(up(fl_hi - down(k * lo)), up(hi - down(k * hi)))
        c_dn = np.minimum(down(fl_lo - up(k * lo)), down(hi - up(k * hi)))
        # the line through the origin: its slope lies between a and 1 (auto_LiRPA's "adaptive" choice:
        # slope 1 when the chord is steeper than 1/2, i.e. u > -l for relu)
        s = np.where(k > 0.5, one, a)
        a_l = np.where(lo >= 0, one, np.where(hi <= 0, a, np.where(convex, s, k)))
        b_l = np.where(mixed & ~convex, c_dn, 0.0)
        a_u = np.where(lo >= 0, one, np.where(hi <= 0, a, np.where(convex, k, s)))
        b_u = np.where(mixed & convex, c_up, 0.0)
    return a_l, b_l, a_u, b_u


def _plain_relu_lines(lo: np.ndarray, hi: np.ndarray) -> Lines:
    """``relu_lines`` at slope 0, bit for bit, in half the passes (a branch-and-bound round relaxes
    every ReLU of every subdomain): the line pieces a zero slope makes constant are not computed.
    f(l) = 0 l is exact, so its enclosure's upper end is ``up(0)`` = the smallest normal; with a = 0
    every entry is convex, so the lower intercept is 0, and the chord's slope k is 0 off the mixed units."""
    with np.errstate(all="ignore"):
        mixed = (lo < 0) & (hi > 0)
        k = np.where(mixed, hi / np.where(mixed, hi - lo, 1.0), 0.0)
        c_up = np.maximum(up(_UP_ZERO - down(k * lo)), up(hi - down(k * hi)))
        a_l = ((lo >= 0) | (k > 0.5)).astype(np.float64)
        a_u = np.where(lo >= 0, 1.0, k)
        b_u = np.where(mixed, c_up, 0.0)
    return a_l, np.zeros(lo.shape), a_u, b_u


_UP_ZERO = float(up(np.zeros(1))[0])  # the upper end of an exact zero's enclosure (``ia.mul``'s up)


@dataclass(frozen=True)
class Smooth:
    """A smooth elementwise function: point enclosures of f and f', and its convexity pieces.

    ``breaks`` are exact floats splitting the line into pieces with ``curvature`` +1 (convex),
    -1 (concave) or 0 (unknown: a sliver around an irrational inflection point, bounded through the
    Lipschitz constant ``lipschitz`` of f there).
    """

    f: Callable[[np.ndarray], Box]
    df: Callable[[np.ndarray], Box]
    breaks: tuple[float, ...]
    curvature: tuple[int, ...]
    lipschitz: float = 0.0
    # approximately the point d of the convex (True) or concave (False) piece where f'(d) = s, in closed
    # form (the end of the piece, or +-inf, where f' never reaches s); None: found by bisection. Only
    # ``_stationary``'s candidate: the bound at d is rigorous wherever d is
    stationary: Callable[[np.ndarray, bool], np.ndarray] | None = None
    # f'' in plain floating point (no enclosure): Newton steps for ``_stationary``'s candidate point where
    # there is no closed form (bisection where a step leaves the bracket); None: bisection alone
    d2f: Callable[[np.ndarray], np.ndarray] | None = None
    # f and f' in plain floating point, for the candidate points (``_stationary``, ``_tangent_through``):
    # a few times cheaper than the enclosures; None: the enclosures' midpoints
    f_point: Callable[[np.ndarray], np.ndarray] | None = None
    df_point: Callable[[np.ndarray], np.ndarray] | None = None

    def f_mid(self, x: np.ndarray) -> np.ndarray:
        if self.f_point is not None:
            return self.f_point(x)
        lo, hi = self.f(x)
        return lo * 0.5 + hi * 0.5

    def df_mid(self, x: np.ndarray) -> np.ndarray:
        if self.df_point is not None:
            return self.df_point(x)
        lo, hi = self.df(x)
        return lo * 0.5 + hi * 0.5


# The derivatives of sigmoid and tanh from one library call and a few correctly rounded steps, widened
# once (``widen``), as activations' point enclosures are; L = LIB_ULPS, u = 2**-53.
# sigmoid' = e / (1 + e)**2 with e = exp(-|x|) (no cancellation): e's error, 2L 2**-52 relative, enters
# once in the numerator and twice through (1 + e)**2; fl(1 + e), its square and the quotient add u each:
# (6L + 2) 2**-52 + O(u**2) in all. Where e is subnormal (|x| > 708) the value is below 2**-1000.
_SIGMOID_DF_REL = (6 * LIB_ULPS + 5) * 2.0 ** -52
# tanh' = 1 / cosh(|x|)**2: cosh's error twice, the square and the quotient: (4L + 1) 2**-52 + O(u**2);
# where the square overflows or the quotient is subnormal (|x| > 354) the value is below 2**-1000.
_TANH_DF_REL = (4 * LIB_ULPS + 4) * 2.0 ** -52


def _sigmoid_df(x: np.ndarray) -> Box:
    e = np.negative(np.abs(np.asarray(x, dtype=np.float64).reshape(-1)))
    np.exp(e, out=e)
    d = e + 1.0
    d *= d
    np.divide(e, d, out=e)
    lo, hi = widen(e, _SIGMOID_DF_REL)
    shape = np.shape(x)
    return np.maximum(lo, 0.0).reshape(shape), np.minimum(hi, 0.25).reshape(shape)


def _tanh_df(x: np.ndarray) -> Box:
    c = np.abs(np.asarray(x, dtype=np.float64).reshape(-1))
    with np.errstate(over="ignore"):
        np.cosh(c, out=c)
        c *= c
    np.divide(1.0, c, out=c)
    lo, hi = widen(c, _TANH_DF_REL)
    shape = np.shape(x)
    return np.maximum(lo, 0.0).reshape(shape), np.minimum(hi, 1.0).reshape(shape)


_INV_SQRT_2PI = down(down(np.float64(0.3989422804014327))), up(up(np.float64(0.3989422804014327)))


def _gelu_f(x: np.ndarray) -> Box:
    return gelu_box(ia.point(x), {"approximate": "none"})


def _gelu_df(x: np.ndarray) -> Box:
    """Phi(x) + x phi(x): Phi = (1 + erf(x / sqrt 2)) / 2, phi = exp(-x^2 / 2) / sqrt(2 pi)."""
    px = ia.point(x)
    t = erf_at(x * INV_SQRT2[0]), erf_at(x * INV_SQRT2[1])
    e = ia.min_box(t[0], t[1])[0], ia.max_box(t[0], t[1])[1]
    big_phi = ia.scale(ia.add_const(e, 1.0), 0.5)
    half_sq = ia.scale(ia.square(px), -0.5)
    ex = exp_at(half_sq[0])[0], exp_at(half_sq[1])[1]
    ex = np.minimum(ex[0], ex[1]), np.maximum(ex[0], ex[1])
    phi = ia.mul(ex, _INV_SQRT_2PI)
    return ia.add(big_phi, ia.mul(px, phi))


def _sech2_inverse(s: np.ndarray, scale: float) -> np.ndarray:
    """t >= 0 with sech(t)**2 = s / scale (0 where s >= scale, inf where s <= 0)."""
    q = np.clip(s / scale, 2.0 ** -1000, 1.0)
    t = np.arccosh(1.0 / np.sqrt(q))
    return np.where(s <= 0, np.inf, t)


def _tanh_stationary(s: np.ndarray, convex: bool) -> np.ndarray:
    """tanh' = sech**2: the convex piece is x <= 0, the concave one x >= 0."""
    t = _sech2_inverse(s, 1.0)
    return -t if convex else t


def _sigmoid_stationary(s: np.ndarray, convex: bool) -> np.ndarray:
    """sigmoid'(x) = sech(x / 2)**2 / 4."""
    t = 2.0 * _sech2_inverse(s, 0.25)
    return -t if convex else t


def _exp_stationary(s: np.ndarray, convex: bool) -> np.ndarray:
    return np.log(np.maximum(s, 0.0))  # -inf where s <= 0


def _softplus_stationary(s: np.ndarray, convex: bool) -> np.ndarray:
    """softplus' = sigmoid: its inverse, the logit (-inf / inf outside (0, 1))."""
    q = np.clip(s, 0.0, 1.0)
    return np.log(q) - np.log1p(-q)


def _tanh_d2f(x: np.ndarray) -> np.ndarray:
    return -2.0 * np.tanh(x) / np.cosh(x) ** 2


def _sigmoid_d2f(x: np.ndarray) -> np.ndarray:
    t = np.tanh(0.5 * x)  # sigmoid = (1 + t) / 2, sigmoid' = (1 - t^2) / 4, sigmoid'' = -t (1 - t^2) / 4
    return -0.25 * t * (1.0 - t * t)


def _gelu_d2f(x: np.ndarray) -> np.ndarray:
    return np.exp(-0.5 * x * x) * _INV_SQRT_2PI[0] * (2.0 - x * x)


def _sigmoid_point(x: np.ndarray) -> np.ndarray:
    return 0.5 + 0.5 * np.tanh(0.5 * x)


def _gelu_point(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + erf(x * INV_SQRT2[0]))


def _gelu_df_point(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + erf(x * INV_SQRT2[0])) + x * np.exp(-0.5 * x * x) * _INV_SQRT_2PI[0]


def _silu_df(x: np.ndarray) -> Box:
    """silu' = s(x) + x s(x) s(-x), s the sigmoid (no cancellation: s(-x) is enclosed directly)."""
    s_pos = sigmoid_at(x)
    return ia.add(s_pos, ia.mul(ia.point(x), ia.mul(s_pos, sigmoid_at(-x))))


def _silu_d2f(x: np.ndarray) -> np.ndarray:
    """silu'' = s (1 - s) (2 - x tanh(x / 2)), s the sigmoid."""
    t = np.tanh(0.5 * x)
    return 0.25 * (1.0 - t * t) * (2.0 - x * t)


def _silu_point(x: np.ndarray) -> np.ndarray:
    return x * (0.5 + 0.5 * np.tanh(0.5 * x))


def _silu_df_point(x: np.ndarray) -> np.ndarray:
    s = 0.5 + 0.5 * np.tanh(0.5 * x)
    return s + x * s * (1.0 - s)


# silu'' changes sign where x tanh(x / 2) = 2, x = +-2.39935728051546766783...; these floats bracket it (the
# sign of x tanh(x / 2) - 2 at each is checked in high precision by test_smooth_relax_fast), and
# x tanh(x / 2) increases for x > 0, so silu is convex on [-_SILU_LO, _SILU_LO], concave beyond +-_SILU_HI
_SILU_LO, _SILU_HI = 2.3993572805154653, 2.3993572805154697

_SQRT2_LO, _SQRT2_HI = float(down(down(np.float64(np.sqrt(2.0))))), float(up(up(np.float64(np.sqrt(2.0)))))

SMOOTH: dict[str, Smooth] = {
    "sigmoid": Smooth(sigmoid_at, _sigmoid_df, (0.0,), (1, -1), stationary=_sigmoid_stationary, d2f=_sigmoid_d2f,
                      f_point=_sigmoid_point, df_point=lambda x: 0.25 / np.cosh(0.5 * x) ** 2),
    "tanh": Smooth(tanh_at, _tanh_df, (0.0,), (1, -1), stationary=_tanh_stationary, d2f=_tanh_d2f,
                   f_point=np.tanh, df_point=lambda x: 1.0 / np.cosh(x) ** 2),
    "exp": Smooth(exp_at, exp_at, (), (1,), stationary=_exp_stationary, d2f=np.exp, f_point=np.exp, df_point=np.exp),
    "softplus": Smooth(softplus_at, sigmoid_at, (), (1,), stationary=_softplus_stationary,
                       d2f=lambda x: 0.25 / np.cosh(0.5 * x) ** 2, f_point=lambda x: np.logaddexp(0.0, x),
                       df_point=_sigmoid_point),
    # gelu'' = phi(x) (2 - x^2): concave, convex on [-sqrt 2, sqrt 2], concave; |gelu'| < 1.2 near +-sqrt 2
    "gelu": Smooth(_gelu_f, _gelu_df, (-_SQRT2_HI, -_SQRT2_LO, _SQRT2_LO, _SQRT2_HI), (-1, 0, 1, 0, -1), 1.2,
                   d2f=_gelu_d2f, f_point=_gelu_point, df_point=_gelu_df_point),
    # silu: concave, convex on [-2.3994, 2.3994], concave; |silu'| <= 1.0999 everywhere
    "silu": Smooth(_silu_at, _silu_df, (-_SILU_HI, -_SILU_LO, _SILU_LO, _SILU_HI), (-1, 0, 1, 0, -1), 1.1,
                   d2f=_silu_d2f, f_point=_silu_point, df_point=_silu_df_point),
}


def _inv_f(x: np.ndarray) -> Box:
    return ia.inv(ia.point(x))


def _inv_df(x: np.ndarray) -> Box:
    return ia.neg(ia.inv(ia.square(ia.point(x))))  # -1 / x^2


def _rsqrt_f(x: np.ndarray) -> Box:
    return rsqrt_box(ia.point(x), {})


def _rsqrt_df(x: np.ndarray) -> Box:
    r = _rsqrt_f(x)
    return ia.scale(ia.mul(r, ia.square(r)), -0.5)  # -x^(-3/2) / 2


# 1/x and 1/sqrt(x) are relaxed on x > 0 only, where both are convex and decreasing (CROWN's
# ``_relax`` keeps the box of an entry whose input reaches 0): softmax's sums (>= 1) and layernorm's
# variance plus eps. Their tangent of slope s < 0 touches at d = (-s)^(-1/2), d = (-2 s)^(-2/3).
SMOOTH["inv"] = Smooth(_inv_f, _inv_df, (), (1,), stationary=lambda s, convex: np.where(s < 0, 1.0 / np.sqrt(-s), np.inf),
                       d2f=lambda x: 2.0 / x ** 3, f_point=lambda x: 1.0 / x, df_point=lambda x: -1.0 / (x * x))
SMOOTH["rsqrt"] = Smooth(_rsqrt_f, _rsqrt_df, (), (1,),
                         stationary=lambda s, convex: np.where(s < 0, np.power(-2.0 * s, -2.0 / 3.0), np.inf),
                         d2f=lambda x: 0.75 * x ** -2.5, f_point=lambda x: 1.0 / np.sqrt(x),
                         df_point=lambda x: -0.5 * x ** -1.5)
POSITIVE_ONLY = frozenset({"inv", "rsqrt"})
SMOOTH_KINDS = frozenset(SMOOTH) | {"pow", "elu"}


def _power(p: int) -> Smooth:
    """x ** p for an integer p >= 2: convex when p is even; concave then convex (inflection 0) when odd."""
    f = lambda x: pow_box(ia.point(x), {"exponent": float(p)})  # noqa: E731
    fm = lambda x: pow_box(ia.point(x), {"exponent": float(p - 1)})  # noqa: E731
    df = lambda x: ia.scale(fm(x), float(p))  # noqa: E731
    # plain f, f', f'' for the candidate points (Newton steps, not bisection's 44)
    points = dict(f_point=lambda x: x ** p, df_point=lambda x: p * x ** (p - 1), d2f=lambda x: p * (p - 1) * x ** (p - 2))
    return Smooth(f, df, (), (1,), **points) if p % 2 == 0 else Smooth(f, df, (0.0,), (-1, 1), **points)


def _elu(alpha: float) -> Smooth:
    """elu with 0 < alpha <= 1: x above 0, alpha (e^x - 1) below; f' = alpha e^x <= 1 grows, so convex."""
    def df(x: np.ndarray) -> Box:
        e_lo, e_hi = ia.scale(exp_at(np.minimum(x, 0.0)), alpha)
        return np.where(x > 0, 1.0, e_lo), np.where(x >= 0, 1.0, e_hi)  # at 0: the subgradients [alpha, 1]
    def stationary(s: np.ndarray, convex: bool) -> np.ndarray:
        # f' = alpha e^x below 0 (up to alpha), 1 above: log(s / alpha), or the kink 0 for s in [alpha, 1)
        # (Newton's steps crawl there: from the left they overshoot onto the flat side, which only bisects)
        with np.errstate(divide="ignore"):
            return np.where(s >= 1.0, np.inf, np.where(s <= 0.0, -np.inf, np.minimum(np.log(s / alpha), 0.0)))
    # plain f, f', f'' for the candidate points (Newton steps for the tangents through an end)
    return Smooth(lambda x: _elu_with(ia.point(x), alpha), df, (), (1,), stationary=stationary,
                  f_point=lambda x: np.where(x > 0, x, alpha * np.expm1(np.minimum(x, 0.0))),
                  df_point=lambda x: np.where(x > 0, 1.0, alpha * np.exp(np.minimum(x, 0.0))),
                  d2f=lambda x: np.where(x > 0, 0.0, alpha * np.exp(np.minimum(x, 0.0))))


def smooth_for(kind: str, attrs: Mapping[str, Any]) -> Smooth | None:
    """The description of a node's function, or None when this kind/attribute has no relaxation here."""
    if kind == "elu":
        alpha = float(attrs["alpha"])
        return _elu(alpha) if 0 < alpha <= 1 else None
    if kind == "gelu":
        return SMOOTH["gelu"] if attrs.get("approximate", "none") == "none" else None
    if kind == "pow":
        p = float(attrs["exponent"])
        return _power(int(p)) if p == int(p) and 2 <= p <= 64 else None
    return SMOOTH.get(kind)


def _g(fn: Smooth, z: np.ndarray, s: np.ndarray, side: int) -> np.ndarray:
    """A lower (side -1) or upper (+1) bound of f(z) - s z at the float points z."""
    return _g_at(fn.f(z), z, s, side)


def _stationary(fn: Smooth, a: np.ndarray, b: np.ndarray, s: np.ndarray, increasing: bool) -> np.ndarray:
    """A point d of [a, b] near where f'(d) = s, f' monotone on [a, b]: the closed form clipped to the
    piece where ``fn`` has one (what bisection converges to: f' - s keeps one sign on [a, b] exactly when
    the solution lies outside it), else bisection, vectorized."""
    if fn.stationary is not None:
        with np.errstate(all="ignore"):
            d = fn.stationary(s, increasing)
        return np.clip(np.where(np.isnan(d), a, d), a, b)
    if fn.d2f is not None:
        s_flat = np.ravel(np.broadcast_to(s, np.shape(a)))

        def h(d: np.ndarray, at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            return fn.df_mid(d) - s_flat[at], fn.d2f(d)
        return _newton_bisect(h, a, b, increasing)
    lo, hi = a.copy(), b.copy()
    for _ in range(_BISECT_STEPS):
        mid = lo * 0.5 + hi * 0.5
        below = (fn.df_mid(mid) < s) == increasing
        lo = np.where(below, mid, lo)
        hi = np.where(below, hi, mid)
    return np.clip(lo * 0.5 + hi * 0.5, a, b)


@dataclass(frozen=True)
class _Piece:
    """One convexity piece of f met by the boxes, [a, b] = [lo, hi] clipped to it (``there``: where it
    meets them; elsewhere a = b = lo), with the enclosures of f and (curved pieces) f' at its ends:
    they do not depend on the slope, so every candidate line reuses them."""

    a: np.ndarray
    b: np.ndarray
    there: np.ndarray
    curvature: int
    fa: Box
    fb: Box
    dfa: Box | None
    dfb: Box | None


def _pieces(fn: Smooth, lo: np.ndarray, hi: np.ndarray, f_ends: tuple[Box, Box] | None = None) -> list[_Piece]:
    """The convexity pieces the boxes meet. Every end of a piece is a box end or a break, so the enclosures
    there are the ones at lo and hi (``f_ends`` when the caller has them) and at each break, picked per
    entry: two or four enclosures of the entries' length whatever the number of pieces (GELU and SiLU
    have five), not two or four a piece."""
    edges = (-np.inf,) + fn.breaks + (np.inf,)
    f_lo, f_hi = f_ends if f_ends is not None else (fn.f(lo), fn.f(hi))
    curved = any(fn.curvature)
    df_lo, df_hi = (fn.df(lo), fn.df(hi)) if curved else (None, None)
    f_at = {e: fn.f(np.array([e])) for e in fn.breaks}
    df_at = {e: fn.df(np.array([e])) for e in fn.breaks} if curved else {}
    out = []
    with np.errstate(all="ignore"):
        for p, curv in enumerate(fn.curvature):
            a, b = np.maximum(lo, edges[p]), np.minimum(hi, edges[p + 1])
            there = a <= b
            if not np.any(there):
                continue
            a, b = np.where(there, a, lo), np.where(there, b, lo)
            e_a, e_b = edges[p], edges[p + 1]
            fa, fb = _picked(a, lo, hi, f_lo, f_hi, f_at.get(e_a)), _picked(b, lo, hi, f_lo, f_hi, f_at.get(e_b))
            dfa = _picked(a, lo, hi, df_lo, df_hi, df_at.get(e_a)) if curv else None
            dfb = _picked(b, lo, hi, df_lo, df_hi, df_at.get(e_b)) if curv else None
            out.append(_Piece(a, b, there, curv, fa, fb, dfa, dfb))
    return out


def _picked(x: np.ndarray, lo: np.ndarray, hi: np.ndarray, at_lo: Box, at_hi: Box, at_break: Box | None) -> Box:
    """The enclosure at x, each entry lo, hi or the break (``at_break``, one entry; None for an infinite
    edge, which no entry equals): the enclosure at equal floats is the same."""
    on_lo, on_hi = x == lo, x == hi
    if at_break is None:
        return tuple(np.where(on_lo, l_, h_) for l_, h_ in zip(at_lo, at_hi))
    return tuple(np.where(on_lo, l_, np.where(on_hi, h_, e[0])) for l_, h_, e in zip(at_lo, at_hi, at_break))


def _g_at(fz: Box, z: np.ndarray, s: np.ndarray, side: int) -> np.ndarray:
    """``_g`` from the enclosure ``fz`` of f(z)."""
    with np.errstate(all="ignore"):
        if side < 0:
            return down(fz[0] - up(s * z))
        return up(fz[1] - down(s * z))


def _extremum(fn: Smooth, pieces: list[_Piece], lo: np.ndarray, s: np.ndarray, side: int) -> np.ndarray:
    """Rigorous min (side -1) or max (+1) of f(z) - s z over [lo, hi], piece by piece (``_pieces``)."""
    best = np.full(lo.shape, np.inf if side < 0 else -np.inf)
    pick = np.minimum if side < 0 else np.maximum
    with np.errstate(all="ignore"):
        for piece in pieces:
            a, b, curv = piece.a, piece.b, piece.curvature
            ends = pick(_g_at(piece.fa, a, s, side), _g_at(piece.fb, b, s, side))
            if curv == 0:  # unknown curvature on a sliver: ends -+ Lipschitz * width
                slack = up(up(fn.lipschitz + np.abs(s)) * up(b - a))
                value = down(ends - slack) if side < 0 else up(ends + slack)
            elif curv == side:  # the extremum of g sits at an end (concave g for a min, convex for a max)
                value = ends
            else:
                value = _tangent_bound(fn, piece, s, side)
            best = np.where(piece.there, pick(best, value), best)
    return best


def _tangent_bound(fn: Smooth, piece: _Piece, s: np.ndarray, side: int) -> np.ndarray:
    """Min of a convex g (side -1) or max of a concave g (+1) over [a, b]: g(d) -+ |g'(d)| max(d - a, b - d)."""
    a, b, increasing = piece.a, piece.b, piece.curvature > 0
    (da_lo, da_hi), (db_lo, db_hi) = piece.dfa, piece.dfb
    if increasing:  # f' increasing: g monotone on the piece when s is outside [f'(a), f'(b)]
        at_a, at_b = da_lo >= s, db_hi <= s
    else:
        at_a, at_b = da_hi <= s, db_lo >= s
    # monotone g: the extremum is at the end g moves away from
    out = np.where(at_a, _g_at(piece.fa, a, s, side), _g_at(piece.fb, b, s, side))
    # the other entries of boxes meeting the piece need the point d (entries elsewhere are ignored)
    need = ~(at_a | at_b) & piece.there
    if not np.any(need):
        return out
    a, b = np.broadcast_to(a, s.shape)[need], np.broadcast_to(b, s.shape)[need]
    s_need = s[need]
    d = _stationary(fn, a, b, s_need, increasing)
    d_lo, d_hi = fn.df(d)
    slope = np.maximum(np.abs(up(d_hi - s_need)), np.abs(down(d_lo - s_need)))
    reach = up(np.maximum(up(d - a), up(b - d)))
    if side < 0:
        out[need] = down(_g(fn, d, s_need, side) - up(up(slope) * reach))
    else:
        out[need] = up(_g(fn, d, s_need, side) + up(up(slope) * reach))
    return out


_NEWTON_STEPS = 12
# a step this small relative to the entry's bracket ends the iteration. The point is only a candidate:
# landing delta from the root loosens a rigorous intercept by about |f''| delta width, 2**-30 of the
# relaxation's own gap |f''| width**2 / 8. (A tolerance relative to the root itself, with bisection
# towards an end where h keeps one sign, took all 12 steps on the through-tangents: silu'' was evaluated
# 48 times per CROWN pass of a 2-layer silu MLP, now 17; that pass took 14.6 ms, now 9.2.)
_SETTLED = 2.0 ** -33
_COMPACT_MIN = 4096  # entries from which Newton's later steps work only on the entries still moving


def _newton_bisect(h: Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]], a: np.ndarray,
                   b: np.ndarray, increasing: bool) -> np.ndarray:
    """A root of h on [a, b] (h monotone there, ``increasing`` or not), vectorized: Newton steps kept
    inside the shrinking bracket, bisection where a step would leave it; an end of [a, b] when h keeps
    one sign. ``h(d, at)`` returns h's value and derivative at the points d of the flat entries ``at``.
    Only a candidate point (the bounds built at it are rigorous wherever it lands), so at most a fixed
    number of steps, and an entry stops once its step is below ``_SETTLED`` of its bracket (later steps
    work only on the entries still moving)."""
    lo, hi = np.ravel(a).copy(), np.ravel(b).copy()
    tolerance = (hi - lo) * _SETTLED
    every = np.arange(lo.size)
    with np.errstate(all="ignore"):
        # h of one sign on the whole bracket: the end the root lies beyond, without bisecting towards it
        at_lo, at_hi = h(lo, every)[0], h(hi, every)[0]
        past_lo, past_hi = (at_lo >= 0, at_hi <= 0) if increasing else (at_lo <= 0, at_hi >= 0)
        d = np.where(past_lo, lo, np.where(past_hi, hi, lo * 0.5 + hi * 0.5))
        go = ~(past_lo | past_hi)  # the entries still stepping
        compact = lo.size >= _COMPACT_MIN  # below this, the gathers cost more numpy calls than they save
        active = np.flatnonzero(go) if compact else every
        go = go[active]
        for _ in range(_NEWTON_STEPS):
            if not np.any(go):
                break
            at = d[active]
            value, slope = h(at, active)
            below = (value < 0) == increasing
            left, right = np.where(below, at, lo[active]), np.where(below, hi[active], at)
            step = at - value / slope
            moved = np.where(np.isfinite(step) & (step >= left) & (step <= right), step, left * 0.5 + right * 0.5)
            # an entry that settled keeps its point, so its result does not depend on its neighbours' steps
            lo[active], hi[active] = np.where(go, left, lo[active]), np.where(go, right, hi[active])
            d[active] = np.where(go, moved, at)
            go &= np.abs(moved - at) > tolerance[active]
            if compact:
                active, go = active[go], go[go]
    return np.clip(d.reshape(np.shape(a)), a, b)


def _tangent_through(fn: Smooth, a: np.ndarray, b: np.ndarray, z0: np.ndarray, f0: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray]:
    """The slope f'(d) of a tangent at d in [a, b] that passes through (z0, f0), and d: a sign change of
    h(d) = f(d) + f'(d)(z0 - d) - f0, h'(d) = f''(d)(z0 - d) (Newton steps inside the bracket where f''
    is known, else bisection). Only a candidate slope: its intercept is computed rigorously afterwards."""
    if fn.d2f is not None:
        z0_flat, f0_flat = (np.ravel(np.broadcast_to(x, np.shape(a))) for x in (z0, f0))

        def h(d: np.ndarray, at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            gap = z0_flat[at] - d
            return fn.f_mid(d) + fn.df_mid(d) * gap - f0_flat[at], fn.d2f(d) * gap
        d = _newton_bisect(h, a, b, True)
        return fn.df_mid(d), d
    left, right = a.copy(), b.copy()
    for _ in range(_BISECT_STEPS):
        d = left * 0.5 + right * 0.5
        h = fn.f_mid(d) + fn.df_mid(d) * (z0 - d) - f0
        left, right = np.where(h < 0, d, left), np.where(h < 0, right, d)
    d = left * 0.5 + right * 0.5
    return fn.df_mid(d), d


# entries relaxed at once: the candidate slopes are stacked ``[slopes, entries]`` and every temporary has
# that shape, so a chunk's working set stays around a few MiB whatever the layer's size
_SMOOTH_CHUNK = 1 << 15


def intercepts(fn: Smooth, lo: np.ndarray, hi: np.ndarray, slope_l: np.ndarray, slope_u: np.ndarray,
               f_ends: tuple[Box, Box] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Rigorous intercepts of the lower and upper lines with the given slopes on [lo, hi] (flat arrays of
    one shape): the outward-rounded min and max of f(z) - s z over the box, as ``smooth_lines`` takes them.
    ``f_ends``: the enclosures of f at lo and hi, when the caller has them."""
    pieces = _pieces(fn, lo, hi, f_ends)
    with np.errstate(all="ignore"):
        return _extremum(fn, pieces, lo, slope_l, -1), _extremum(fn, pieces, lo, slope_u, 1)


def smooth_lines(fn: Smooth, lo: np.ndarray, hi: np.ndarray) -> Lines:
    """The best of a few candidate lines on each side, with rigorous intercepts (finite lo <= hi):
    all candidates of a chunk of entries in one stacked pass (a handful of numpy calls per step
    whatever the number of candidates, so a batch of 1 is not dominated by call overhead)."""
    shape = np.shape(lo)
    flat_lo, flat_hi = np.ravel(lo), np.ravel(hi)
    if flat_lo.size <= _SMOOTH_CHUNK:
        parts = [_smooth_lines_flat(fn, flat_lo, flat_hi)]
    else:
        parts = [_smooth_lines_flat(fn, flat_lo[k:k + _SMOOTH_CHUNK], flat_hi[k:k + _SMOOTH_CHUNK])
                 for k in range(0, flat_lo.size, _SMOOTH_CHUNK)]
    a_l, b_l, a_u, b_u = (np.concatenate([part[q] for part in parts]).reshape(shape) for q in range(4))
    return a_l, b_l, a_u, b_u


def _screened(fn: Smooth, lo: np.ndarray, hi: np.ndarray, slopes: np.ndarray, side: int,
              points: np.ndarray | None = None) -> np.ndarray:
    """Plain floating-point estimates of the min (side -1) or max (+1) of f(z) - s z over [lo, hi] for
    each candidate slope (rows of ``slopes``): g at the box's ends, at the convexity breaks inside it and,
    on each piece where g is convex (for a min; concave for a max), at the point where f' = s, clipped into
    the piece and the box. Every point lies in the box, so no entry needs a mask (a random mask costs numpy
    a mispredicted branch an entry, several times a plain pass). Without enclosures or outward rounding:
    they only rank the candidates, and the kept slope's intercept is then computed rigorously
    (``intercepts``), so the rigorous pass runs once a side, not once a candidate. ``points``: where a
    candidate is the tangent at a known point (NaN elsewhere), that point, which is where f' = s on its
    piece: only the other entries are solved for (Newton's or bisection's steps; closed forms are cheaper
    than the masks)."""
    pick = np.fmin if side < 0 else np.fmax  # a NaN estimate (a point where f' never reaches s) is ignored
    best = pick(fn.f_mid(lo) - slopes * lo, fn.f_mid(hi) - slopes * hi)
    for e in fn.breaks:
        z = np.clip(e, lo, hi)
        best = pick(best, fn.f_mid(z) - slopes * z)
    edges = (-np.inf,) + fn.breaks + (np.inf,)
    for p, curv in enumerate(fn.curvature):
        if curv != -side:  # g concave for a min (convex for a max) or of unknown curvature: its ends suffice
            continue
        a = np.clip(np.clip(lo, edges[p], edges[p + 1]), lo, hi)
        b = np.clip(np.clip(hi, edges[p], edges[p + 1]), lo, hi)
        if fn.stationary is None:
            # Newton's or bisection's steps: only where f' = s inside the piece (elsewhere g is monotone on it
            # and its extremum is an end of the piece, already taken)
            da, db = fn.df_mid(a), fn.df_mid(b)
            inside = (slopes > da) & (slopes < db) if curv > 0 else (slopes < da) & (slopes > db)
            if points is not None:
                known = np.nonzero(inside & (points >= a) & (points <= b))  # NaN compares false
                z = points[known]
                best[known] = pick(best[known], fn.f_mid(z) - slopes[known] * z)
                inside[known] = False
            at = np.nonzero(inside)
            s_at = slopes[at]
            d = _stationary(fn, a[at[1]], b[at[1]], s_at, curv > 0)
            best[at] = pick(best[at], fn.f_mid(d) - s_at * d)
            continue
        a, b = np.broadcast_to(a, slopes.shape), np.broadcast_to(b, slopes.shape)
        d = _stationary(fn, a, b, slopes, curv > 0)
        best = pick(best, fn.f_mid(d) - slopes * d)
    return best


def _candidate_slopes(fn: Smooth, lo: np.ndarray, hi: np.ndarray, f_lo: Box, f_hi: Box
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``[candidates, entries]`` slopes for the lower and the upper line (any slope is sound): the chord,
    the tangents at the midpoint and the quartiles, and the tangent through one end of the box; and the
    tangent points of each (NaN for the chord and where a slope is not finite; None for a function whose
    tangent points have a closed form)."""
    width = hi - lo
    mid = lo * 0.5 + hi * 0.5
    chord = np.where(width > 0, ((f_hi[0] + f_hi[1]) - (f_lo[0] + f_lo[1])) * 0.5 / np.where(width > 0, width, 1.0), 0.0)
    at = np.stack((mid, lo * 0.75 + hi * 0.25, lo * 0.25 + hi * 0.75))
    d_lo, d_hi = fn.df(at)
    f_l, f_u = (f_lo[0] + f_lo[1]) * 0.5, (f_hi[0] + f_hi[1]) * 0.5
    # the upper line of an S-shape from (l, f(l)), the lower line through (u, f(u))
    (up_through, low_through), (up_point, low_point) = _tangent_through(
        fn, np.stack((mid, lo)), np.stack((hi, mid)), np.stack((lo, hi)), np.stack((f_l, f_u)))
    both = np.concatenate((chord[None], d_lo * 0.5 + d_hi * 0.5))
    # the points serve only the screen's solves (a closed form needs none)
    shared = np.concatenate((np.full((1,) + mid.shape, np.nan), at)) if fn.stationary is None else None
    # per side, the candidates that can be closest to f at the midpoint (on 20,000 random silu,
    # sigmoid and tanh boxes the tangents at the ends never were, nor a through-tangent on its
    # other side): 5 slopes a side, not the same 8 on both
    out = []
    for through, point in ((low_through, low_point), (up_through, up_point)):
        slopes = np.concatenate((both, through[None]))
        finite = np.isfinite(slopes)
        points = None if shared is None else np.where(finite, np.concatenate((shared, point[None])), np.nan)
        out.append((np.where(finite, slopes, 0.0), points))
    (slopes_l, points_l), (slopes_u, points_u) = out
    return slopes_l, slopes_u, points_l, points_u


def _smooth_lines_flat(fn: Smooth, lo: np.ndarray, hi: np.ndarray) -> Lines:
    with np.errstate(all="ignore"):
        f_lo, f_hi = fn.f(lo), fn.f(hi)
        mid = lo * 0.5 + hi * 0.5
        kept = []
        slopes_l, slopes_u, points_l, points_u = _candidate_slopes(fn, lo, hi, f_lo, f_hi)
        for side, slopes, points in ((-1, slopes_l, points_l), (1, slopes_u, points_u)):
            v = slopes * mid + _screened(fn, lo, hi, slopes, side, points)
            # the candidate closest to f at the midpoint (the first of equals; a NaN never wins)
            if side < 0:
                best = np.argmax(np.where(np.isnan(v), -np.inf, v), axis=0)[None]
            else:
                best = np.argmin(np.where(np.isnan(v), np.inf, v), axis=0)[None]
            kept.append(np.take_along_axis(slopes, best, 0)[0])
        c_l, c_u = intercepts(fn, lo, hi, kept[0], kept[1], (f_lo, f_hi))
        point = hi == lo  # a point box: the constant enclosure of f there
        return (np.where(point, 0.0, kept[0]), np.where(point, f_lo[0], c_l), np.where(point, 0.0, kept[1]),
                np.where(point, f_lo[1], c_u))


def window_indices(spatial: tuple[int, ...], out_spatial: tuple[int, ...], kernel, stride, padding, dilation
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Flat input-cell index of every (output cell, window offset), ``[O, K]``, and whether that
    cell lies inside the input (padded cells are outside and ignored by max pooling)."""
    flat = np.zeros((1, 1), dtype=np.int64)
    valid = np.ones((1, 1), dtype=bool)
    for size, out, k, s, p, d in zip(spatial, out_spatial, kernel, stride, padding, dilation):
        coord = np.arange(out)[:, None] * s - p + np.arange(k)[None, :] * d  # [out, k]
        ok = (coord >= 0) & (coord < size)
        flat = (flat[:, None, :, None] * size + np.where(ok, coord, 0)[None, :, None, :]).reshape(
            flat.shape[0] * out, flat.shape[1] * k)
        valid = (valid[:, None, :, None] & ok[None, :, None, :]).reshape(valid.shape[0] * out, valid.shape[1] * k)
    return flat, valid


def max_pool_relaxation(lo: np.ndarray, hi: np.ndarray, idx: np.ndarray, valid: np.ndarray
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For max pooling over windows ``idx`` of the flattened cells (``lo``/``hi``: ``[..., cells]``):
    the cell j* with the largest lower end (max >= x_j* always), whether it decides the window
    (its lower end reaches every other upper end, so max = x_j*), and the largest upper end (a
    constant upper bound otherwise). Exact comparisons, nothing rounds."""
    l_win = np.where(valid, lo[..., idx], -np.inf)
    u_win = np.where(valid, hi[..., idx], -np.inf)
    best = np.argmax(l_win, axis=-1)
    jstar = np.take_along_axis(np.broadcast_to(idx, l_win.shape), best[..., None], axis=-1)[..., 0]
    l_best = np.take_along_axis(l_win, best[..., None], axis=-1)[..., 0]
    others = u_win.copy()
    np.put_along_axis(others, best[..., None], -np.inf, axis=-1)
    decided = l_best >= others.max(axis=-1)
    return jstar, decided, u_win.max(axis=-1)
