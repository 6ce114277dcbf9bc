"""Input splitting's domain clipping: shrink a box to the part where a counterexample can still lie.

CROWN's lower bound of a property row over a box B is linear in the input: row(x) >= a.x + beta for
every x in B, and its concretization L = min over B of a.x + beta (``spec_lower``, rounded down). So
row(x) >= L + a.x - min_B a.x, and min_B a.x = sum_i min(a_i lo_i, a_i hi_i). The row is refuted at x
(as a whole box is refuted, ``verify._group_gap``) where that exceeds d + margin, so a counterexample
x of the row satisfies sum_i |a_i| dist_i(x) <= g with g = d + margin - L >= 0, where dist_i is the
distance of x_i from the end of [lo_i, hi_i] at which a_i x_i is smallest. Every term is
non-negative, hence each alone: x_i <= lo_i + g / a_i where a_i > 0, x_i >= hi_i - g / |a_i| where
a_i < 0. A counterexample of a group satisfies all its rows (the intersection of their boxes); one of
several groups lies in the union (its bounding box). A group whose intersection is empty cannot hold
anywhere in B, although no single row's bound refutes it.

Rounding: g, the quotients and the new ends are rounded outward (``interval_round.up`` / ``down``), so
the clipped box contains every real point the exact computation keeps. A row whose bound is infinite
or whose coefficient is zero or not finite clips nothing.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from semantics.interval_round import down, up

__all__ = ["clipped_box"]


def clipped_box(lo: np.ndarray, hi: np.ndarray, coeffs: np.ndarray, spec_lower: np.ndarray,
                groups: Sequence[tuple[slice, np.ndarray]]) -> tuple[np.ndarray, np.ndarray, list[int]] | None:
    """The bounding box of the points of [lo, hi] that some group may still hold at, and the indices
    (into ``groups``) of the groups whose clipped box is not empty; None when none is left.

    ``coeffs`` ``[K, inputs]``: the input coefficients of each row's linear lower bound on this box;
    ``spec_lower`` ``[K]``: those bounds; ``groups``: per open group, its rows (a slice of K) and
    ``d + margin`` for them (the level a row must exceed to be refuted, as ``verify._group_gap``)."""
    flat_lo, flat_hi = lo.reshape(-1), hi.reshape(-1)
    hull_lo = hull_hi = None
    kept: list[int] = []
    with np.errstate(all="ignore"):
        for index, (rows, level) in enumerate(groups):
            a = coeffs[rows].reshape(-1, flat_lo.size)
            g = up(up(np.asarray(level, np.float64).reshape(-1)) - spec_lower[rows])  # [k] >= the exact shortfall
            reach = up(g[:, None] / np.abs(a))  # [k, inputs]: how far x_i may move off its low end
            reach[~(reach >= 0)] = np.inf  # NaN (0/0, inf/inf) and a non-finite bound: no clipping
            new_hi = np.min(np.where(a > 0, up(flat_lo + reach), np.inf), axis=0, initial=np.inf)
            new_lo = np.max(np.where(a < 0, down(flat_hi - reach), -np.inf), axis=0, initial=-np.inf)
            new_lo, new_hi = np.maximum(flat_lo, new_lo), np.minimum(flat_hi, new_hi)
            if np.any(new_lo > new_hi):
                continue  # no point of the box satisfies every row of this group
            kept.append(index)
            hull_lo = new_lo if hull_lo is None else np.minimum(hull_lo, new_lo)
            hull_hi = new_hi if hull_hi is None else np.maximum(hull_hi, new_hi)
    if not kept:
        return None
    return hull_lo.reshape(lo.shape), hull_hi.reshape(hi.shape), kept
