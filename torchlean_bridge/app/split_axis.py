"""Which input entry input splitting halves next.

Two scores, one per regime:

- **Few input entries** (``verify.INPUT_SPLIT_DIMS`` or fewer, ACAS Xu's 5): split the entry that
  spreads the split nodes' inputs most, ``sensitivity_k * width_k``. ``sensitivity_k`` is measured
  once per box of the property, at its first split (``input_sensitivity``): at each split node (a ReLU
  layer, say; the output when there is none), entry k's share of the IBP width of its input when only
  one entry at a time spans its width, summed over the split nodes, per unit of entry k's width. The
  bounds' looseness comes from units whose input straddles a breakpoint, and narrowing the entry that
  drives their inputs most stabilizes the most units. The score does not depend on the units an entry
  is measured in: scaling entry k by s scales its width by s and its sensitivity by 1/s. (The linear
  bound's |coefficient| x width measures how far the bound's linear part moves along k, not its
  relaxation: on ACAS Xu ``prop_1`` it kept halving the entries the output is most sensitive to while
  the relaxation's slack, 1,400 against a true margin of 4, came from the two wide angles; 155,573
  boxes left it open, this score proves it in under 100.)
- **Many entries** (a sigmoid net on an image): one IBP pass per entry would cost more than the split
  saves, and no single entry dominates the first layer; split the entry with the largest
  |coefficient| x width of the boxes' linear lower bounds, the widest when there are none.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["input_sensitivity", "split_axis"]


def input_sensitivity(crown: Any, lo: np.ndarray, hi: np.ndarray) -> np.ndarray | None:
    """Per input entry k, its share of the spread of each split node's input (the output's when there is
    none), summed over those nodes, per unit of its width: spread(k, v) is the summed IBP width of v's
    input when only entry k spans its width on the box ``[lo, hi]``, and entry k's share at v is
    spread(k, v) / sum_j spread(j, v). Each layer counts once (IBP's widths grow layer by layer; a sum of
    raw widths would be the last layer's alone), and an entry that reaches some split node scores above 0
    (one that reaches none is never worth splitting: CROWN is exact along it). 0 for an entry of width 0;
    None when some width is not finite (an unbounded box: the other scores apply)."""
    from semantics.linear_bounds.splits import split_nodes
    g = crown.graph
    probes = [g.nodes[v].parents[0] for v in split_nodes(crown)] or list(g.outputs)
    flat_lo, flat_hi = lo.reshape(-1), hi.reshape(-1)
    width = flat_hi - flat_lo
    if not np.all(np.isfinite(width)):
        return None
    center = flat_lo * 0.5 + flat_hi * 0.5
    spread = np.zeros((width.size, len(probes)))
    for k in np.flatnonzero(width > 0):  # at most INPUT_SPLIT_DIMS entries, once per property box
        a, b = center.copy(), center.copy()
        a[k], b[k] = flat_lo[k], flat_hi[k]
        boxes = crown.ibp(a.reshape(lo.shape), b.reshape(hi.shape))
        spread[k] = [np.sum(boxes[v][1] - boxes[v][0]) for v in probes]
    if not np.all(np.isfinite(spread)):
        return None
    total = spread.sum(axis=0)
    share = np.divide(spread, total, out=np.zeros_like(spread), where=total > 0).sum(axis=1)
    return np.divide(share, width, out=np.zeros_like(share), where=width > 0)


def split_axis(lo: np.ndarray, hi: np.ndarray, coeffs: np.ndarray | None,
               sensitivity: np.ndarray | None = None) -> int | None:
    """The flat index of the entry to halve (module docstring), None when the box is a point.
    ``coeffs``: the box's linear lower bounds' input coefficients ``[1, K, inputs]`` (or None)."""
    width = (hi - lo).reshape(-1)
    if not np.any(width > 0):
        return None
    if sensitivity is not None and np.any(sensitivity * width > 0):
        return int(np.argmax(sensitivity * width))
    if coeffs is None or not coeffs.size:
        return int(np.argmax(width))
    score = (np.abs(coeffs.reshape(coeffs.shape[1], -1)).max(axis=0) + 1e-12) * width
    return int(np.argmax(score))
