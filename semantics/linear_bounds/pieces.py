"""Piecewise-linear ops for branch and bound: their breakpoints, split codes, exact lines and split scores.

Branch and bound splits a unit of a piecewise-linear op at one of its breakpoints, so that on each
child the unit's input lies on one side and the op is relaxed by the exact line of the pieces left.
A split is an int8 code per unit (0: free):

* elementwise ops (``relu``, ``leaky_relu``, ``abs``: breakpoint 0; ``clamp``: its ``min`` and ``max``,
  one or two breakpoints ``t_1 < t_2``): ``+k`` means ``z >= t_k``, ``-k`` means ``z <= t_k`` and, with two
  breakpoints, ``3`` means ``t_1 <= z <= t_2``. The constraint is the closed interval ``[t_i, t_j]`` of
  breakpoint indices ``(i, j)`` (0 and m + 1 standing for -inf and +inf), so splitting at ``t_k``
  gives ``(i, k)`` and ``(k, j)``: both halves, closed, covering the parent.
* max pooling (``max_pool``, ``max_pool_nd``), one unit per output cell: ``+(k+1)`` means the window's
  k-th cell is its maximum (``x_k >= x_j`` for every cell j of the window: max = x_k), ``-(k+1)`` that it
  is not (``x_k <= max_{j != k} x_j``: the max is over the other cells). Again both halves, closed.

On a subdomain a constraint narrows the sound box of the op's input (``clip_elementwise``,
``clip_pool``): a box that leaves no point marks the subdomain empty. The op's relaxation on the
narrowed box is then the exact line where one piece is left (``pwl_lines``), and a pool whose maximum
is fixed is exactly that cell (``pool_relaxation``). Every narrowing is implied by the constraint,
never more, so a bound computed from it holds on the subdomain.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..interval_round import down, up
from .relax import Lines, max_pool_relaxation

__all__ = ["ELEMENTWISE", "POOLS", "breakpoints", "constraint_interval", "split_codes", "pwl_lines",
           "clip_elementwise", "clip_pool", "pool_relaxation", "elementwise_scores", "pool_scores", "pool_geometry"]

ELEMENTWISE = frozenset({"relu", "leaky_relu", "abs", "clamp"})
POOLS = frozenset({"max_pool", "max_pool_nd"})

# code -> (i, j): the constraint z in [t_i, t_j] over breakpoint indices (0 = -inf, m + 1 = +inf)
_INTERVALS = {1: {0: (0, 2), -1: (0, 1), 1: (1, 2)},
              2: {0: (0, 3), -1: (0, 1), 1: (1, 3), -2: (0, 2), 2: (2, 3), 3: (1, 2)}}
_CODES = {m: {ij: c for c, ij in table.items()} for m, table in _INTERVALS.items()}


def breakpoints(node: Any) -> tuple[float, ...]:
    """The sorted breakpoints of an elementwise piecewise-linear node (empty: a linear function)."""
    if node.kind in ("relu", "leaky_relu", "abs"):
        return (0.0,)
    if node.kind == "clamp":
        a, b = node.attrs.get("min"), node.attrs.get("max")
        if a is not None and b is not None and a >= b:
            return ()  # a constant (torch: max wins); no breakpoint to split
        return tuple(float(t) for t in (a, b) if t is not None)
    raise ValueError(f"breakpoints: {node.kind} is not an elementwise piecewise-linear op")


def constraint_interval(codes: np.ndarray, knots: tuple[float, ...]) -> tuple[np.ndarray, np.ndarray]:
    """The interval ``[c_lo, c_hi]`` each code confines the input to (-inf / inf where free): one gather
    per end through ``_TABLES`` (a masked assignment per code ran 3x longer)."""
    if not knots:
        return np.full(codes.shape, -np.inf), np.full(codes.shape, np.inf)
    first, last, _ = _TABLES[len(knots)]
    ends = np.array((-np.inf,) + tuple(knots) + (np.inf,))
    at = codes.astype(np.intp) + 2
    return np.take(ends[first], at), np.take(ends[last], at)


def _tables(m: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``_INTERVALS[m]`` as arrays indexed by ``code + 2`` (i and j; -1 where no code) and ``_CODES[m]``
    as an ``[m + 2, m + 2]`` array (a sentinel where no interval), so that codes map in one gather."""
    ends = np.full((2, 6), -1, dtype=np.int64)
    codes = np.full((m + 2, m + 2), np.iinfo(np.int8).min, dtype=np.int8)
    for code, (i, j) in _INTERVALS[m].items():
        ends[:, code + 2] = i, j
        codes[i, j] = code
    return ends[0], ends[1], codes


_TABLES = {m: _tables(m) for m in _INTERVALS}


def split_codes(codes: np.ndarray, k: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    """The two children's codes of units with codes ``codes`` split at breakpoint ``k`` (1-based) of m:
    ``z <= t_k`` and ``z >= t_k`` within the parent's constraint."""
    start, end, code_of = _TABLES[m]
    c = np.asarray(codes).astype(np.int64) + 2
    kk = np.asarray(k).astype(np.int64)
    i, j = start[c], end[c]
    outside = ~((i < kk) & (kk < j))
    if outside.any():
        at = int(np.flatnonzero(outside)[0])
        raise ValueError(f"split_codes: breakpoint {int(kk.flat[at])} is outside the constraint "
                         f"({int(i.flat[at])}, {int(j.flat[at])})")
    left, right = code_of[i, kk], code_of[kk, j]
    return left.astype(codes.dtype), right.astype(codes.dtype)


def _pieces(node: Any, knots: tuple[float, ...]) -> list[tuple[float, float]]:
    """(slope, intercept) of each piece, left to right: exact floats (f is exact at every float)."""
    if node.kind == "abs":
        return [(-1.0, 0.0), (1.0, 0.0)]
    if node.kind == "relu":
        return [(0.0, 0.0), (1.0, 0.0)]
    a, b = node.attrs.get("min"), node.attrs.get("max")
    if not knots:
        return [(0.0, float(b))] if a is not None and b is not None else [(1.0, 0.0)]
    out = [(0.0, float(a))] if a is not None else []
    out.append((1.0, 0.0))
    if b is not None:
        out.append((0.0, float(b)))
    return out


def _f(pieces: list[tuple[float, float]], knots: tuple[float, ...], z: np.ndarray) -> np.ndarray:
    """f at float points, exactly (every piece has slope -1, 0 or 1 and an exact intercept)."""
    out = np.full(z.shape, pieces[0][0]) * z + pieces[0][1]
    for t, (s, c) in zip(knots, pieces[1:]):
        out = np.where(z >= t, s * z + c, out)
    return out


def pwl_lines(node: Any, lo: np.ndarray, hi: np.ndarray) -> Lines:
    """Sound lines of ``abs`` or ``clamp`` on [lo, hi] (finite): the piece's own line where one piece
    is left, else a slope per side chosen in plain floats (the chord on the side where f bends away,
    a subgradient at the breakpoint on the other, as the ReLU's adaptive rule) whose intercept is
    the outward-rounded extremum of ``f(z) - s z`` over the ends and the breakpoints inside: f is
    piecewise linear, so that extremum is over [lo, hi]."""
    knots = breakpoints(node)
    pieces = _pieces(node, knots)
    slope_of = np.array([s for s, _ in pieces])
    icpt_of = np.array([c for _, c in pieces])
    kn = np.array(knots)
    with np.errstate(all="ignore"):
        inside = [(lo < t) & (hi > t) for t in knots]
        n_in = sum(x.astype(np.int64) for x in inside) if knots else np.zeros(lo.shape, np.int64)
        one = n_in == 0
        piece = np.searchsorted(kn, 0.5 * lo + 0.5 * hi, side="left") if knots else np.zeros(lo.shape, np.int64)
        exact_s, exact_c = slope_of[piece], icpt_of[piece]
        f_lo, f_hi = _f(pieces, knots, lo), _f(pieces, knots, hi)
        chord = np.where(one, 0.0, (f_hi - f_lo) / np.where(one, 1.0, hi - lo))
        # one breakpoint inside: f bends there; the other side takes the slope of the piece covering more
        k_in = np.zeros(lo.shape, np.int64)
        for k, there in enumerate(inside):
            k_in = np.where(there, k, k_in)
        t_in = kn[k_in] if knots else np.zeros(lo.shape)
        left_s = slope_of[k_in]
        right_s = slope_of[np.minimum(k_in + 1, len(pieces) - 1)]
        sub = np.where(hi - t_in > t_in - lo, right_s, left_s)
        convex = right_s > left_s
        s_l = np.where(n_in >= 2, chord, np.where(convex, sub, chord))
        s_u = np.where(n_in >= 2, chord, np.where(convex, chord, sub))
        s_l, s_u = np.where(np.isfinite(s_l), s_l, 0.0), np.where(np.isfinite(s_u), s_u, 0.0)
        b_l = np.full(lo.shape, np.inf)
        b_u = np.full(lo.shape, -np.inf)
        for z, there in [(lo, True), (hi, True)] + [(np.full(lo.shape, t), x) for t, x in zip(knots, inside)]:
            fz = _f(pieces, knots, z)
            b_l = np.where(there, np.minimum(b_l, down(fz - up(s_l * z))), b_l)
            b_u = np.where(there, np.maximum(b_u, up(fz - down(s_u * z))), b_u)
    a_l = np.where(one, exact_s, s_l)
    a_u = np.where(one, exact_s, s_u)
    return a_l, np.where(one, exact_c, b_l), a_u, np.where(one, exact_c, b_u)


def clip_elementwise(lo: np.ndarray, hi: np.ndarray, codes: np.ndarray, knots: tuple[float, ...]
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The input box ``[N, units]`` intersected with the codes' intervals, and where it is empty."""
    c_lo, c_hi = constraint_interval(codes, knots)
    lo2, hi2 = np.maximum(lo, c_lo), np.minimum(hi, c_hi)
    bad = lo2 > hi2
    return lo2, np.where(bad, lo2, hi2), bad


def _windows(codes: np.ndarray, idx: np.ndarray, lead: int):
    """Per (sample, leading index, window): the fixed offset (-1 none), excluded offset (-1 none)."""
    n = codes.shape[0]
    c = codes.reshape(n, lead, idx.shape[0]).astype(np.int64)
    return np.where(c > 0, c - 1, -1), np.where(c < 0, -c - 1, -1)


def clip_pool(lo: np.ndarray, hi: np.ndarray, codes: np.ndarray, idx: np.ndarray, valid: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The pool input's box ``[N, lead, cells]`` narrowed by the codes, and which samples are empty.

    Fixed maximum k: ``x_k >= x_j`` gives ``lo_k >= max_j lo_j`` and ``hi_j <= hi_k``; excluded k:
    ``x_k <= max_{j != k} x_j <= max_{j != k} hi_j``. Every narrowing is computed from the box before
    any of them (each is implied by its own constraint on that box). A window whose constraint leaves
    no point (its maximum's upper end below another cell's lower end; an excluded cell alone in its
    window) empties the sample."""
    n, lead, _ = lo.shape
    fixed, excluded = _windows(codes, idx, lead)
    win_l = np.where(valid, lo[..., idx], -np.inf)  # [n, lead, O, K]
    win_u = np.where(valid, hi[..., idx], -np.inf)
    k_axis = np.arange(idx.shape[1])
    o_axis = np.arange(idx.shape[0])
    ni = np.broadcast_to(np.arange(n)[:, None, None], fixed.shape)
    li = np.broadcast_to(np.arange(lead)[None, :, None], fixed.shape)
    new_lo, new_hi = lo.copy(), hi.copy()
    bad = np.zeros(n, dtype=bool)
    at = fixed >= 0
    if at.any():
        fk = np.maximum(fixed, 0)
        cell = idx[o_axis[None, None], fk]
        u_k = np.take_along_axis(win_u, fk[..., None], axis=-1)[..., 0]
        others_l = np.where(k_axis == fk[..., None], -np.inf, win_l).max(axis=-1)
        bad |= (at & (u_k < others_l)).any(axis=(1, 2))
        np.maximum.at(new_lo, (ni[at], li[at], cell[at]), win_l.max(axis=-1)[at])
        for kk in range(idx.shape[1]):
            rest = at & (fk != kk) & valid[None, None, :, kk]
            j = np.broadcast_to(idx[:, kk][None, None], fixed.shape)
            np.minimum.at(new_hi, (ni[rest], li[rest], j[rest]), u_k[rest])
    at = excluded >= 0
    if at.any():
        ek = np.maximum(excluded, 0)
        cell = idx[o_axis[None, None], ek]
        others_u = np.where(k_axis == ek[..., None], -np.inf, win_u).max(axis=-1)
        np.minimum.at(new_hi, (ni[at], li[at], cell[at]), others_u[at])
    empty = new_lo > new_hi
    bad |= empty.any(axis=(1, 2))
    return new_lo, np.where(empty, new_lo, new_hi), bad


def pool_relaxation(lo: np.ndarray, hi: np.ndarray, codes: np.ndarray | None, idx: np.ndarray,
                    valid: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``relax.max_pool_relaxation`` on a subdomain: an excluded cell leaves the window (the max is over
    the others), a fixed maximum k is the window's value (``jstar = k``, decided)."""
    if codes is None:
        return max_pool_relaxation(lo, hi, idx, valid)
    n, lead, _ = lo.shape
    fixed, excluded = _windows(codes, idx, lead)
    k_axis = np.arange(idx.shape[1])
    eff = valid[None, None] & (k_axis != excluded[..., None])  # [n, lead, O, K]
    jstar, decided, umax = max_pool_relaxation(lo, hi, idx, eff)
    at = fixed >= 0
    cell = idx[np.arange(idx.shape[0])[None, None], np.maximum(fixed, 0)]
    return np.where(at, cell, jstar), decided | at, umax


def elementwise_scores(node: Any, lo: np.ndarray, hi: np.ndarray, codes: np.ndarray
                       ) -> tuple[np.ndarray, np.ndarray]:
    """Per unit ``[N, units]``: the height of the relaxation's triangle at its best breakpoint inside
    the (narrowed) box, ``|slope change| (u - t)(t - l) / (u - l)`` (-inf where none is inside), and that
    breakpoint's 1-based index."""
    knots = breakpoints(node)
    score = np.full(lo.shape, -np.inf)
    which = np.zeros(lo.shape, dtype=np.int64)
    if not knots:
        return score, which
    pieces = _pieces(node, knots)
    if node.kind == "leaky_relu":
        jumps = [abs(1.0 - float(node.attrs["negative_slope"]))]
    else:
        jumps = [abs(b[0] - a[0]) for a, b in zip(pieces[:-1], pieces[1:])]
    c_lo, c_hi = constraint_interval(codes, knots)
    with np.errstate(all="ignore"):
        for k, (t, jump) in enumerate(zip(knots, jumps), start=1):
            inside = (lo < t) & (hi > t) & (c_lo < t) & (c_hi > t)
            h = jump * (hi - t) * (t - lo) / np.where(inside, hi - lo, 1.0)
            h = np.where(inside, np.where(np.isfinite(h), h, 0.0), -np.inf)
            better = h > score
            score, which = np.where(better, h, score), np.where(better, k, which)
    return score, which


def pool_scores(lo: np.ndarray, hi: np.ndarray, codes: np.ndarray, idx: np.ndarray, valid: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
    """Per window ``[N, lead * O]``: the gap between the relaxation's upper end and the largest lower
    end (-inf where the window is decided or already split) and the offset of that largest lower end,
    the cell a split fixes or excludes."""
    n, lead, _ = lo.shape
    win_l = np.where(valid, lo[..., idx], -np.inf)
    win_u = np.where(valid, hi[..., idx], -np.inf)
    best = np.argmax(win_l, axis=-1)
    l_best = np.take_along_axis(win_l, best[..., None], axis=-1)[..., 0]
    others = win_u.copy()
    np.put_along_axis(others, best[..., None], -np.inf, axis=-1)
    decided = l_best >= others.max(axis=-1)
    with np.errstate(all="ignore"):
        gap = win_u.max(axis=-1) - l_best
    free = codes.reshape(n, lead, -1) == 0
    score = np.where(free & ~decided, np.where(np.isfinite(gap), gap, 0.0), -np.inf)
    return score.reshape(n, -1), best.reshape(n, -1)


def pool_geometry(crown: Any, node: Any) -> tuple[np.ndarray, np.ndarray, int, int]:
    """The window table of a max-pool node (``relax.window_indices``), its leading size and cells."""
    from ..conv import pool_out_spatial
    from .relax import window_indices
    a, r = node.attrs, node.attrs["spatial_rank"]
    tail = crown.ishape(node.parents[0])[1:]
    spatial, out_sp = tuple(tail[len(tail) - r:]), pool_out_spatial(node.out_shape, r)
    idx, valid = window_indices(spatial, out_sp, a["kernel"], a["stride"], a["padding"], a.get("dilation", (1,) * r))
    return idx, valid, math.prod(tail[:len(tail) - r]), math.prod(spatial)
