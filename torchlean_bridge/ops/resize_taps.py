"""Linear-resize taps: per output index the two source indices and the weight of the second.

The geometry of ``resize_linear`` (exact rational source coordinates, one rounding per weight), shared
by its semantics (``semantics/resize.py``) and its torchlean.ir.v1 form (an interpolation matrix).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = ["Taps", "linear_taps", "interpolation_matrix"]


class Taps(NamedTuple):
    """Per output index: the two source indices and the float64 weight of the second."""

    i0: np.ndarray
    i1: np.ndarray
    weight1: np.ndarray


def _source_ratio(o: np.ndarray, n: int, m: int, mode: str) -> tuple[np.ndarray, int]:
    """Numerators (int64) and the common denominator of the unclamped source coordinates."""
    if m == 1 and mode in ("pytorch_half_pixel", "align_corners"):
        return np.zeros_like(o), 1
    if mode in ("half_pixel", "pytorch_half_pixel"):
        return (2 * o + 1) * n - m, 2 * m
    if mode == "align_corners":
        return o * (n - 1), m - 1
    return o * n, m  # asymmetric


def linear_taps(n: int, m: int, mode: str) -> Taps:
    """Taps resizing an axis of extent ``n`` to ``m``."""
    num, den = _source_ratio(np.arange(m, dtype=np.int64), n, m, mode)
    num = np.clip(num, 0, (n - 1) * den)  # clamp the coordinate to [0, n - 1]
    i0 = num // den
    weight1 = (num - i0 * den) / den  # exact integers, one rounding
    return Taps(i0, np.minimum(i0 + 1, n - 1), weight1)


def interpolation_matrix(n: int, m: int, mode: str) -> np.ndarray:
    """``[n, m]``: column ``o`` holds ``1 - w`` at ``i0`` and ``w`` at ``i1`` (``x @ M`` resizes the last axis)."""
    taps = linear_taps(n, m, mode)
    matrix = np.zeros((n, m))
    cols = np.arange(m)
    np.add.at(matrix, (taps.i0, cols), 1 - taps.weight1)
    np.add.at(matrix, (taps.i1, cols), taps.weight1)
    return matrix
