"""``dynamic_slice``: a static-size window at offsets read at run time (issue #32), float and interval rules.

The float rule reads each start as ONNX's Slice does with ``ends = starts + size``: a start in
``[0, n - size]`` is the offset; a negative start counts from the end (both bounds gain ``n``) when the
whole window stays negative. Any other start is refused naming it, since ONNX would clamp the bounds
and return fewer than ``size`` cells (a different shape). The data movement is exact in every float type.

Interval rule: the hull of the windows over every feasible offset in the start box (sliding-window
min / max of the input box's ends, one axis after the other, which is the hull over the product of the
offsets). A start box reaching outside ``[0, n - size]`` (or with an infinite end) is refused by name:
outside that range some offsets are refused or count from the end, and no enclosure is implemented.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from .. import interval_arith as ia
from .table import domain_error, float_rule, interval_rule

__all__ = ["window_start"]


def window_start(s: int, n: int, size: int) -> int | None:
    """The offset ONNX's Slice reads for start ``s`` and end ``s + size`` on an axis of extent ``n`` when
    that reads exactly ``size`` cells, else None."""
    if 0 <= s <= n - size:
        return s
    if -n <= s and s + size < 0:
        return s + n
    return None


def _onnx_length(s: int, n: int, size: int) -> int:
    """How many cells ONNX's Slice reads from ``s`` to ``s + size`` (negative bounds gain n, then clamp)."""
    lo, hi = (s + n if s < 0 else s), (s + size + n if s + size < 0 else s + size)
    return max(0, min(max(hi, 0), n) - min(max(lo, 0), n))


def _take(x: np.ndarray, axis: int, start: int, size: int) -> np.ndarray:
    return x[(slice(None),) * axis + (slice(start, start + size),)]


@float_rule("dynamic_slice")
def dynamic_slice(node, xs, rec, dt):
    x, starts = xs[0], np.asarray(xs[1], dtype=np.int64).reshape(-1)
    for i, (axis, size) in enumerate(zip(node.attrs["axes"], node.attrs["sizes"])):
        n, s = x.shape[axis], int(starts[i])
        start = window_start(s, n, size)
        if start is None:
            raise domain_error(node, f"start {s} on axis {axis} (extent {n}): ONNX's Slice would read "
                                     f"{_onnx_length(s, n, size)} of the {size} cells the window holds")
        x = _take(x, axis, start, size)
    return x


@interval_rule("dynamic_slice")
def dynamic_slice_box(node, ps, rec):
    (lo, hi), (s_lo, s_hi) = ps
    s_lo, s_hi = np.asarray(s_lo, dtype=np.float64).reshape(-1), np.asarray(s_hi, dtype=np.float64).reshape(-1)
    for i, (axis, size) in enumerate(zip(node.attrs["axes"], node.attrs["sizes"])):
        n = lo.shape[axis]
        if not (np.isfinite(s_lo[i]) and np.isfinite(s_hi[i]) and 0 <= s_lo[i] and s_hi[i] <= n - size):
            box = f"[{float(s_lo[i])!r}, {float(s_hi[i])!r}]"
            raise ia.DomainError(f"dynamic_slice: the start box {box} on axis {axis} reaches "
                                 f"outside [0, {n - size}] (extent {n}, size {size}), where the offset is not bounded")
        a = int(np.ceil(s_lo[i]))
        b = max(int(np.floor(s_hi[i])), a)  # an integer-free box holds no start: any box encloses it
        span = b - a + 1
        lo = sliding_window_view(_take(lo, axis, a, size + span - 1), span, axis=axis).min(axis=-1)
        hi = sliding_window_view(_take(hi, axis, a, size + span - 1), span, axis=axis).max(axis=-1)
    return np.ascontiguousarray(lo), np.ascontiguousarray(hi)
