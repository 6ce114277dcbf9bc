"""Linear resizing (``resize_linear``): interpolation taps from exact rational source coordinates.

Output index ``o`` along an axis of extent ``n`` resized to ``m`` reads the real source coordinate
``x`` of its coordinate mode (ONNX Resize's names; PyTorch's ``align_corners=False`` is
``half_pixel``, ``True`` is ``align_corners``), clamped to ``[0, n - 1]``, and returns
``(1 - l) v[i0] + l v[i1]`` with ``i0 = floor(x)``, ``i1 = min(i0 + 1, n - 1)``, ``l = x - i0``.
``x`` is a ratio of integers, so ``i0`` is exact and ``l`` is one correctly rounded division: the
weights are within ``WEIGHT_ERROR`` of the exact ones, which the interval rule accounts for. Axes
are resized one at a time, last axis first (PyTorch's kernels nest the same way).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from torchlean_bridge.ops.resize_taps import Taps, linear_taps

from .interval_round import U, Box, clean, down, up

__all__ = ["Taps", "linear_taps", "resize_linear", "resize_linear_box", "WEIGHT_ERROR"]

# |fl(l) - l| <= u l and |fl(1 - fl(l)) - (1 - l)| <= 2u: each computed weight is within 2u of its exact value
WEIGHT_ERROR = 2 * U


def _axis_shape(ndim: int, axis: int, m: int) -> tuple[int, ...]:
    return tuple(m if a == axis else 1 for a in range(ndim))


def resize_linear(x: np.ndarray, sizes: Sequence[int], mode: str) -> np.ndarray:
    """Resize the trailing ``len(sizes)`` axes of ``x`` (float arithmetic in ``x``'s dtype)."""
    for axis in range(x.ndim - 1, x.ndim - len(sizes) - 1, -1):
        m = sizes[axis - (x.ndim - len(sizes))]
        taps = linear_taps(x.shape[axis], m, mode)
        w1 = taps.weight1.astype(x.dtype).reshape(_axis_shape(x.ndim, axis, m))
        y = np.take(x, taps.i0, axis=axis)
        y *= 1 - w1
        far = np.take(x, taps.i1, axis=axis) * w1
        if not np.isfinite(x).all():  # a tap of weight 0 does not read its pixel (no 0 * inf = NaN)
            y[np.broadcast_to(w1 == 1, y.shape)] = 0
            far[np.broadcast_to(w1 == 0, far.shape)] = 0
        y += far
        x = y
    return x


def resize_linear_box(lo: np.ndarray, hi: np.ndarray, sizes: Sequence[int], mode: str) -> Box:
    """Sound enclosure: interpolation has non-negative weights, so the ends map to the ends; each
    computed ``w0 a + w1 b`` is within ``(2u + WEIGHT_ERROR) (|a| + |b|)`` plus one underflow
    step of the exact ``(1 - l) a + l b``."""
    slack = 1.01 * (2 * U + WEIGHT_ERROR)
    with np.errstate(all="ignore"):
        for axis in range(lo.ndim - 1, lo.ndim - len(sizes) - 1, -1):
            m = sizes[axis - (lo.ndim - len(sizes))]
            taps = linear_taps(lo.shape[axis], m, mode)
            w1 = taps.weight1.reshape(_axis_shape(lo.ndim, axis, m))
            w0 = 1 - w1
            ends = []
            for end, outward in ((lo, down), (hi, up)):
                a, b = np.take(end, taps.i0, axis=axis), np.take(end, taps.i1, axis=axis)
                err = up((np.abs(a) + np.abs(b)) * slack + 2.0 ** -1022)
                value = w0 * a + w1 * b
                ends.append(outward(value - err) if outward is down else outward(value + err))
            lo, hi = clean(*ends)
    return lo, hi
