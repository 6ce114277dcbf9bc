"""The smooth relaxations' fast candidate points (closed-form stationary points for sigmoid, tanh, exp and
softplus; Newton steps for GELU and SiLU) land where the bisection did, so the lines are as tight, and they stay
sound (the intercepts are rigorous wherever the point lands; ``test_linear_bounds`` checks them against
mpmath on a dense grid)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from semantics.linear_bounds import relax
from semantics.linear_bounds.relax import smooth_for, smooth_lines

KINDS = ("sigmoid", "tanh", "exp", "softplus", "gelu", "silu")


def _slow(fn: relax.Smooth) -> relax.Smooth:
    # bisection alone on the enclosures' midpoints, as before
    return dataclasses.replace(fn, stationary=None, d2f=None, f_point=None, df_point=None)


def _pieces(fn: relax.Smooth):
    edges = (-30.0,) + fn.breaks + (30.0,)
    return [(edges[p], edges[p + 1], c > 0) for p, c in enumerate(fn.curvature) if c != 0]


# integer powers (Newton steps on their plain f, f', f'') and elu (closed form; they bisected 44 steps before)
WITH_ATTRS = tuple((k, {}) for k in KINDS) + (("pow", {"exponent": 2.0}), ("pow", {"exponent": 3.0}),
                                              ("elu", {"alpha": 1.0}))
# elu with alpha < 1 has a kink at 0 (f' jumps from alpha to 1): for a slope between them the point is the
# kink, where f' = s has no solution, and the rigorous bound there carries the slack of f''s enclosure
# [alpha, 1] (as with bisection's point): only the lines' tightness against bisection's applies
KINKED = (("elu", {"alpha": 0.3}),)


@pytest.mark.parametrize("kind,attrs", WITH_ATTRS)
def test_stationary_points_solve_f_prime_equals_s(kind, attrs):
    """Slopes inside f'(piece): |f'(d) - s| at rounding level (bisection's 44 steps leave about 1e-13);
    slopes outside (closed forms): d is the piece's end that bisection converges to."""
    fn = smooth_for(kind, attrs)
    assert fn.stationary is not None or fn.d2f is not None
    rng = np.random.default_rng(0)
    for a0, b0, convex in _pieces(fn):
        a, b = np.full(500, max(a0, -12.0)), np.full(500, min(b0, 12.0))
        fa, fb = (np.mean(fn.df(e), axis=0) for e in (a, b))
        s = fa + (fb - fa) * rng.random(500)
        d = relax._stationary(fn, a, b, s, convex)
        assert np.all((a <= d) & (d <= b))
        assert np.max(np.abs(np.mean(fn.df(d), axis=0) - s) / np.maximum(np.abs(s), 1.0)) <= 1e-12
        if fn.stationary is None:
            continue  # Newton's bracket: a slope outside f'(piece) makes g monotone, bounded at an end instead
        outside = np.concatenate([np.minimum(fa, fb)[:50] - rng.random(50), np.maximum(fa, fb)[:50] + rng.random(50)])
        want = relax._stationary(_slow(fn), a[:100], b[:100], outside, convex)
        got = relax._stationary(fn, a[:100], b[:100], outside, convex)
        assert np.allclose(got, want, rtol=0, atol=1e-9)


@pytest.mark.parametrize("kind,attrs,size", [(k, a, 600) for k, a in WITH_ATTRS + KINKED] + [("silu", {}, 2500)])
def test_lines_as_tight_as_with_bisection(kind, attrs, size):
    """The area between the upper and lower lines over [l, u]: the same as with bisection's points up to
    rounding (1e-13 of the function's magnitude on the box, or absolute below 1). The candidates are
    stacked [slopes, entries], so Newton's steps meet both regimes: below ``_COMPACT_MIN`` points and from
    it, where later steps run only on the entries still moving (2500 entries: the tangents through the
    ends too)."""
    assert 2 * 2500 >= relax._COMPACT_MIN > 2 * 600
    rng = np.random.default_rng(1)
    lo = rng.standard_normal(size) * 3
    hi = lo + rng.random(size) * np.where(rng.random(size) < 0.5, 0.1, 6.0)
    fn = smooth_for(kind, attrs)
    area = []
    for f in (fn, _slow(fn)):
        a_l, b_l, a_u, b_u = smooth_lines(f, lo, hi)
        area.append((a_u - a_l) * (lo + hi) / 2 * (hi - lo) + (b_u - b_l) * (hi - lo))
    scale = np.maximum(1.0, np.abs(np.mean(fn.f(hi), axis=0)))
    assert np.max((area[0] - area[1]) / scale) <= 1e-13


def test_chunked_relaxation_equals_one_pass(monkeypatch):
    """Entries are relaxed in chunks of ``_SMOOTH_CHUNK`` (all candidate slopes stacked per chunk): every
    entry's lines are elementwise, so chunking changes no bit, and the input's shape is kept."""
    rng = np.random.default_rng(2)
    lo = rng.standard_normal((3, 7, 11)) * 2
    hi = lo + rng.random(lo.shape) * 3
    hi[0, 0, :3] = lo[0, 0, :3]  # point boxes
    fn = smooth_for("tanh", {})
    whole = smooth_lines(fn, lo, hi)
    monkeypatch.setattr(relax, "_SMOOTH_CHUNK", 10)
    chunked = smooth_lines(fn, lo, hi)
    for a, b in zip(whole, chunked):
        assert a.shape == lo.shape and np.array_equal(a, b)


def test_silu_inflection_floats_bracket_the_root():
    """silu'' = s (1 - s) (2 - x tanh(x / 2)): its sign changes where x tanh(x / 2) = 2, and x tanh(x / 2)
    increases for x > 0, so the relaxation's convexity pieces are right exactly when the two break floats
    straddle that root (checked at 50 digits) and silu'' has the stated sign inside each piece."""
    mp = pytest.importorskip("mpmath")
    with mp.workdps(50):
        _check_silu_breaks(mp)


def _check_silu_breaks(mp) -> None:
    h = lambda x: mp.mpf(x) * mp.tanh(mp.mpf(x) / 2) - 2  # noqa: E731
    assert h(relax._SILU_LO) < 0 < h(relax._SILU_HI)
    fn = smooth_for("silu", {})
    assert fn.breaks == (-relax._SILU_HI, -relax._SILU_LO, relax._SILU_LO, relax._SILU_HI)
    d2 = lambda x: mp.diff(lambda t: t / (1 + mp.exp(-t)), mp.mpf(x), 2)  # noqa: E731
    for x, sign in ((-6.0, -1), (-2.4, -1), (-2.39, 1), (0.0, 1), (2.39, 1), (2.4, -1), (9.0, -1)):
        assert mp.sign(d2(x)) == sign, x
    # the Lipschitz constant used on the slivers: silu' peaks at the inflection point, 1.09984 < 1.1
    peak = mp.diff(lambda t: t / (1 + mp.exp(-t)), mp.findroot(h, 2.4))
    assert peak < fn.lipschitz


@pytest.mark.parametrize("size", [7, relax._COMPACT_MIN + 5])
@pytest.mark.parametrize("increasing", [True, False])
def test_newton_bisect_settles_each_entry_on_its_own(size, increasing):
    """Roots of monotone h = +-(d**3 + d - r) on [a, b]: inside the bracket within ``_SETTLED`` of its
    width, exactly the end the root lies beyond when h keeps one sign, and each entry's point the same
    alone as among others (an entry stops when it settles, whatever its neighbours do)."""
    rng = np.random.default_rng(3)
    a = rng.uniform(-3, 1, size)
    b = a + rng.uniform(0.01, 4, size)
    root = np.where(rng.random(size) < 0.5, rng.uniform(a, b), rng.uniform(a - 5, b + 5))
    r = root ** 3 + root
    sign = 1.0 if increasing else -1.0

    def h_of(rr):
        return lambda d, at: (sign * (d ** 3 + d - rr[at]), sign * (3 * d ** 2 + 1))

    got = relax._newton_bisect(h_of(r), a, b, increasing)
    inside = (root > a) & (root < b)
    assert np.all(np.abs(got[inside] - root[inside]) <= 4 * relax._SETTLED * (b - a)[inside] + 1e-12)
    np.testing.assert_array_equal(got[root <= a], a[root <= a])
    np.testing.assert_array_equal(got[root >= b], b[root >= b])
    for i in range(0, size, max(1, size // 5)):
        alone = relax._newton_bisect(h_of(r[i:i + 1]), a[i:i + 1], b[i:i + 1], increasing)
        assert alone[0] == got[i]


@pytest.mark.parametrize("kind,attrs", WITH_ATTRS)
def test_screened_choice_is_as_tight_as_ranking_rigorous_intercepts(kind, attrs):
    """The kept slope is ranked by plain floating-point estimates of each candidate's intercept, and only its
    intercept is computed rigorously. Each estimate is a value g takes in the box, so it lies on the far side
    of the rigorous bound, and within 1e-9 of it (relative to f's magnitude and the box's width); and the
    lines are as tight as when every candidate's rigorous intercept is ranked (the area between them, to
    1e-12). Narrow and wide boxes, on every convexity piece, across breaks, and point boxes."""
    rng = np.random.default_rng(4)
    lo = rng.standard_normal(3000) * 3
    hi = lo + rng.random(3000) * np.where(rng.random(3000) < 0.5, 0.05, 8.0)
    hi[:20] = lo[:20]
    fn = smooth_for(kind, attrs)
    f_lo, f_hi = fn.f(lo), fn.f(hi)
    scale = np.maximum(1.0, np.maximum(np.abs(f_lo[0]), np.abs(f_hi[1])))
    with np.errstate(all="ignore"):
        slopes_l, slopes_u, points_l, points_u = relax._candidate_slopes(fn, lo, hi, f_lo, f_hi)
        rigorous = relax.intercepts(fn, lo, hi, slopes_l, slopes_u)
        estimates = (relax._screened(fn, lo, hi, slopes_l, -1, points_l), relax._screened(fn, lo, hi, slopes_u, 1, points_u))
    allowance = 1e-9 * scale * np.maximum(1.0, (hi - lo) ** 2)
    for side, est, exact in zip((-1, 1), estimates, rigorous):
        gap = (est - exact) * -side  # >= 0: the estimate is at or inside the rigorous bound
        assert np.all(gap >= -1e-14 * scale), kind
        assert np.all(gap <= allowance), (kind, float(np.max(gap / allowance)))
    mid = lo * 0.5 + hi * 0.5
    chosen = []
    for side, slopes, c in zip((-1, 1), (slopes_l, slopes_u), rigorous):
        v = slopes * mid + c
        best = (np.argmax(v, axis=0) if side < 0 else np.argmin(v, axis=0))[None]
        chosen += [np.take_along_axis(slopes, best, 0)[0], np.take_along_axis(c, best, 0)[0]]
    a_l, b_l, a_u, b_u = smooth_lines(fn, lo, hi)
    width = hi - lo
    area = (a_u - a_l) * mid * width + (b_u - b_l) * width
    area_ref = (chosen[2] - chosen[0]) * mid * width + (chosen[3] - chosen[1]) * width
    assert np.all(area <= area_ref + 1e-12 * scale * np.maximum(width, 1.0)), kind
