"""Indexing and selection: gather, gather_elements, where."""

from __future__ import annotations

import numpy as np

from .. import interval_arith as ia
from .table import FLOAT_RULES, F64, domain_error, float_rule, interval_rule

__all__: list[str] = []


@float_rule("gather", "gather_elements")
def gather(node, xs, rec, dt):
    """``gather`` is numpy.take; ``gather_elements`` takes along the axis, its indices addressing the
    leading block of the data off the axis (torch.gather's rule). Indices lie in [-n, n)."""
    data, idx = xs
    ax = node.attrs["axis"]
    n = data.shape[ax]
    if idx.size and (idx.min() < -n or idx.max() >= n):
        bad = idx[(idx < -n) | (idx >= n)].reshape(-1)[0]
        raise domain_error(node, f"index {int(bad)} out of range for axis {ax} of extent {n}")
    if node.kind == "gather":
        return np.take(data, idx, axis=ax)
    block = data[tuple(slice(None) if k == ax else slice(0, e) for k, e in enumerate(idx.shape))]
    return np.take_along_axis(block, np.where(idx < 0, idx + n, idx), axis=ax)


@interval_rule("gather", "gather_elements")
def gather_box(node, ps, rec):
    """Exact on point indices (the data's ends are gathered); a box of indices is refused."""
    data, (i_lo, i_hi) = ps
    if not np.array_equal(i_lo, i_hi):
        raise ia.DomainError(f"{node.kind}: indices must be exact (a point box), got a box of width "
                             f"{float(np.max(i_hi - i_lo))}")
    idx = i_lo.astype(np.int64)
    fn = FLOAT_RULES[node.kind]
    return (np.asarray(fn(node, [data[0], idx], rec, F64), dtype=np.float64),
            np.asarray(fn(node, [data[1], idx], rec, F64), dtype=np.float64))


@float_rule("where")
def where(node, xs, rec, dt):
    return np.where(xs[0], xs[1], xs[2])


@interval_rule("where")
def where_box(node, ps, rec):
    """Bool boxes: lo = surely true, hi = possibly true; an undecided condition joins both branches."""
    (c_lo, c_hi), x, y = ps
    lo = np.where(c_lo >= 1, x[0], np.where(c_hi <= 0, y[0], np.minimum(x[0], y[0])))
    hi = np.where(c_lo >= 1, x[1], np.where(c_hi <= 0, y[1], np.maximum(x[1], y[1])))
    return lo, hi
