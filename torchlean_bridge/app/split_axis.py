"""Which input entry input splitting halves next.

Two scores, one per regime:

- **Few input entries** (``verify.INPUT_SPLIT_DIMS`` or fewer, ACAS Xu's 5): split the entry that
  spreads the network's first nonlinear layer most, ``sensitivity_k * width_k``. ``sensitivity_k`` is
  measured once on the property's box (``input_sensitivity``): the summed IBP width of the input of the
  first split node (a ReLU, say; the output when there is none) when only entry k spans its width, per
  unit of that width. The bounds' looseness comes from units whose input straddles a breakpoint, and
  narrowing the entry that drives their inputs most stabilizes the most units. The score does not
  depend on the units an entry is measured in: scaling entry k by s scales its width by s and its
  sensitivity by 1/s. (The linear bound's |coefficient| x width measures how far the bound's linear
  part moves along k, not its relaxation: on ACAS Xu ``prop_1`` it kept halving the entries the
  output is most sensitive to while the relaxation's slack, 1,400 against a true margin of 4, came
  from the two wide angles; 155,573 boxes left it open, this score proves it in under 100.)
- **Many entries** (a sigmoid net on an image): one IBP pass per entry would cost more than the split
  saves, and no single entry dominates the first layer; split the entry with the largest
  |coefficient| x width of the boxes' linear lower bounds, the widest when there are none.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["input_sensitivity", "split_axis"]


def input_sensitivity(crown: Any, lo: np.ndarray, hi: np.ndarray) -> np.ndarray | None:
    """Per input entry, the IBP width of the first split node's input (summed over its units) when only
    that entry spans its width on the box ``[lo, hi]``, divided by that width; 0 for an entry of width 0.
    None when some width is not finite (an unbounded box: the other scores apply)."""
    from semantics.linear_bounds.splits import split_nodes
    g = crown.graph
    nodes = split_nodes(crown)
    probe = g.nodes[nodes[0]].parents[0] if nodes else g.outputs[0]
    flat_lo, flat_hi = lo.reshape(-1), hi.reshape(-1)
    width = flat_hi - flat_lo
    if not np.all(np.isfinite(width)):
        return None
    center = flat_lo * 0.5 + flat_hi * 0.5
    out = np.zeros(width.size)
    for k in np.flatnonzero(width > 0):  # at most INPUT_SPLIT_DIMS entries, once per property box
        a, b = center.copy(), center.copy()
        a[k], b[k] = flat_lo[k], flat_hi[k]
        box = crown.ibp(a.reshape(lo.shape), b.reshape(hi.shape))[probe]
        spread = float(np.sum(box[1] - box[0]))
        if not np.isfinite(spread):
            return None
        out[k] = spread / width[k]
    return out


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
