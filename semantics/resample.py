"""ONNX Resize's arithmetic (``resize``): source coordinates as exact rationals, then taps and weights.

Per resized axis (extent ``n`` to ``m``, scale ``s``, ``W = s n`` the real output width) output index ``y``
reads the source coordinate ``x(y) = a + b y`` of its coordinate mode, exactly as onnx's reference
(``onnx/reference/ops/op_resize.py``) defines it, evaluated in rationals instead of binary64:

* half_pixel ``(y + 1/2) / s - 1/2``; half_pixel_symmetric adds ``n/2 (1 - m/W)``; pytorch_half_pixel is
  ``-1/2`` when ``W = 1``; align_corners ``y (n - 1) / (W - 1)`` (0 when ``W = 1``); asymmetric ``y / s``;
  tf_crop_and_resize ``r0 (n - 1) + y (r1 - r0) (n - 1) / (W - 1)`` (the roi's centre when ``W = 1``),
  and the extrapolation value where ``x`` leaves ``[0, n - 1]``.
* nearest: ``x`` rounded by nearest_mode (round_prefer_floor is ``ceil(x - 1/2)``, round_prefer_ceil
  ``floor(x + 1/2)``), clamped to ``[0, n - 1]``.
* linear / cubic: ``T`` taps from ``ceil(x) - T/2``; tap ``i`` has the exact distance ``d = i - x`` and the
  weight ``K(d s')`` with ``s' = min(s, 1)`` under antialiasing (else ``s' = 1``), ``K`` the triangle or
  Keys' cubic with ``cubic_coeff_a``; antialiased weights are divided by their sum; exclude_outside zeroes
  the taps outside ``[0, n - 1]`` and divides by the sum (when it is not 0); taps read the clamped
  index (onnx's edge padding).

The kernel is evaluated in binary64 at the correctly rounded ``|d s'|`` (the piece chosen exactly), and
each output is ``sum_i w_i v_i`` accumulated tap by tap in the evaluation's precision. ``AxisTaps.weight_box``
encloses the exact weights and the computed ones, which the interval rule uses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Mapping, Sequence

import numpy as np

from torchlean_bridge.ops.ext_resize import resize_plan, resized_axes, tap_count

from . import interval_arith as ia
from .interval_round import MIN_NORMAL, Box, clean, down, gamma, sum_bounds, up

__all__ = ["AxisTaps", "axis_taps", "source_line", "resize", "resize_box"]

_SAFE = 2 ** 52  # integer magnitudes below this stay exact in int64 and convert to binary64 exactly


def source_line(mode: str, n: int, m: int, s: Fraction, roi: tuple[Fraction, Fraction] | None
                ) -> tuple[Fraction, Fraction]:
    """``(a, b)`` with ``x(y) = a + b y`` (see the module docstring)."""
    w = s * n
    if mode in ("half_pixel", "half_pixel_symmetric") or (mode == "pytorch_half_pixel" and w != 1):
        a = 1 / (2 * s) - Fraction(1, 2)
        if mode == "half_pixel_symmetric":
            a += Fraction(n, 2) * (1 - m / w)
        return a, 1 / s
    if mode == "pytorch_half_pixel":
        return Fraction(-1, 2), Fraction(0)
    if mode == "align_corners":
        return (Fraction(0), Fraction(0)) if w == 1 else (Fraction(0), (n - 1) / (w - 1))
    if mode == "asymmetric":
        return Fraction(0), 1 / s
    assert mode == "tf_crop_and_resize" and roi is not None, mode
    r0, r1 = roi
    if w == 1:
        return (r1 - r0) * (n - 1) / 2 + r0 * (n - 1), Fraction(0)
    return r0 * (n - 1), (r1 - r0) * (n - 1) / (w - 1)


def _ints(values: Sequence[int] | np.ndarray, big: bool) -> np.ndarray:
    return np.asarray(values, dtype=object if big else np.int64)


def _clamp(v: np.ndarray, n: int) -> np.ndarray:
    """Indices clamped to ``[0, n - 1]`` as int64 (big integers clamped before converting)."""
    if v.dtype == object:
        return np.asarray([min(max(int(e), 0), n - 1) for e in v.reshape(-1)], dtype=np.int64).reshape(v.shape)
    return np.clip(v, 0, n - 1)


def _to_float(num: np.ndarray, den: Any) -> np.ndarray:
    """``num / den`` correctly rounded (Python's int division for big integers; exact operands otherwise)."""
    if num.dtype == object:
        return np.asarray([int(v) / int(den) for v in num.reshape(-1)], dtype=np.float64).reshape(num.shape) \
            if np.ndim(den) == 0 else np.asarray([int(v) / int(d) for v, d in zip(num.reshape(-1),
                                                  np.broadcast_to(den, num.shape).reshape(-1))],
                                                 dtype=np.float64).reshape(num.shape)
    return num.astype(np.float64) / np.float64(den)


@dataclass(frozen=True)
class AxisTaps:
    """One axis's reads: ``index[m, T]`` clamped source indices, ``weight[m, T]`` (None: nearest), the
    exact ``|d s'|`` of every tap as ``arg_num / arg_den`` with its kernel piece, and the extrapolated rows."""

    index: np.ndarray
    weight: np.ndarray | None
    outside: np.ndarray | None
    mode: str
    a: float
    arg_float: np.ndarray | None = None
    piece: np.ndarray | None = None  # 0: |t| <= 1, 1: 1 < |t| < 2, 2: zero (outside the support or excluded)
    normalized: bool = False

    def weight_box(self) -> Box:
        """Enclosure of the exact weights (the kernel in interval arithmetic at the exact argument) and
        of the computed ``weight``."""
        assert self.weight is not None and self.arg_float is not None and self.piece is not None
        t = (np.maximum(down(self.arg_float), 0.0), up(self.arg_float))
        one = ia.point(np.ones_like(self.arg_float))
        if self.mode == "linear":
            k_inner = ia.sub(one, (t[0], np.minimum(t[1], 1.0)))
            k_outer = (np.zeros_like(t[0]), np.zeros_like(t[0]))
        else:
            a = ia.point(np.full_like(self.arg_float, self.a))
            t0 = (t[0], np.minimum(t[1], 1.0))
            t1 = (np.maximum(t[0], 1.0), np.minimum(t[1], 2.0))
            k_inner = ia.add(ia.mul(ia.mul(ia.sub(ia.mul(ia.add(a, ia.add(one, one)), t0), ia.add(a, ia.add(
                one, ia.add(one, one)))), t0), t0), one)
            five_a, eight_a, four_a = (ia.mul(a, ia.point(np.full_like(self.arg_float, c))) for c in (5.0, 8.0, 4.0))
            k_outer = ia.sub(ia.mul(ia.add(ia.mul(ia.sub(ia.mul(a, t1), five_a), t1), eight_a), t1), four_a)
        zero = np.zeros_like(t[0])
        lo = np.where(self.piece == 0, k_inner[0], np.where(self.piece == 1, k_outer[0], zero))
        hi = np.where(self.piece == 0, k_inner[1], np.where(self.piece == 1, k_outer[1], zero))
        if self.normalized:
            total = sum_bounds(lo, hi, 1)
            empty = np.all(self.piece == 2, axis=1)  # every tap excluded: the weights stay 0
            unbounded = ~empty & (total[0] <= 0)  # a divisor not bounded away from 0: no weight bound
            keep = empty | unbounded
            den = (np.where(keep, 1.0, total[0])[:, None], np.where(keep, 1.0, total[1])[:, None])
            lo, hi = ia.div((lo, hi), (np.broadcast_to(den[0], lo.shape), np.broadcast_to(den[1], lo.shape)))
            lo, hi = np.where(unbounded[:, None], -np.inf, lo), np.where(unbounded[:, None], np.inf, hi)
        return clean(np.minimum(lo, self.weight), np.maximum(hi, self.weight))


def axis_taps(attrs: Mapping[str, Any], n: int, m: int, s: Fraction, roi: tuple[Fraction, Fraction] | None
              ) -> AxisTaps:
    """The reads of one axis of extent ``n`` resized to ``m`` with scale ``s``."""
    mode, coord = attrs["mode"], attrs["coordinate_mode"]
    a, b = source_line(coord, n, m, s, roi)
    q = math.lcm(a.denominator, b.denominator)
    pa, pb = a.numerator * (q // a.denominator), b.numerator * (q // b.denominator)
    antialias = bool(attrs["antialias"]) and mode != "nearest"
    sp = min(s, Fraction(1)) if antialias else Fraction(1)
    taps = tap_count(mode, s, antialias)
    scale = max(sp.numerator, sp.denominator)
    big = (2 * (abs(pa) + abs(pb) * m) + (taps + 2) * q) * 2 * scale >= _SAFE
    num = _ints([pb * k + pa for k in range(m)], True) if big else np.arange(m, dtype=np.int64) * pb + pa
    outside = None
    if coord == "tf_crop_and_resize":
        outside = np.asarray((num < 0) | (num > (n - 1) * q), dtype=bool)
    if mode == "nearest":
        rounding = attrs["nearest_mode"]
        if rounding == "floor":
            idx = num // q
        elif rounding == "ceil":
            idx = -((-num) // q)
        elif rounding == "round_prefer_floor":
            idx = -((q - 2 * num) // (2 * q))
        else:
            idx = (2 * num + q) // (2 * q)
        return AxisTaps(_clamp(idx, n).reshape(m, 1), None, outside, mode, 0.0)
    start = -((-num) // q) - taps // 2  # ceil(x) - T/2
    src = start[:, None] + (_ints(list(range(taps)), big) if big else np.arange(taps, dtype=np.int64))[None, :]
    dist = src * q - num[:, None]  # d = dist / q
    arg_num, arg_den = np.abs(dist) * sp.numerator, q * sp.denominator  # |t| = |d| s'
    piece = np.where(arg_num <= arg_den, 0, np.where(arg_num < 2 * arg_den, 1, 2)).astype(np.int8)
    excluded = bool(attrs["exclude_outside"])
    if excluded:
        piece = np.where(np.asarray((src < 0) | (src >= n), dtype=bool), 2, piece).astype(np.int8)
    t = _to_float(arg_num, arg_den)
    coeff = float(attrs["cubic_coeff_a"])
    with np.errstate(all="ignore"):
        if mode == "linear":
            inner, outer = 1.0 - t, np.zeros_like(t)
        else:
            inner = ((coeff + 2) * t - (coeff + 3)) * t * t + 1
            outer = ((coeff * t - 5 * coeff) * t + 8 * coeff) * t - 4 * coeff
        w = np.where(piece == 0, inner, np.where(piece == 1, outer, 0.0))
        normalized = antialias or excluded
        if normalized:
            total = w.sum(axis=1, keepdims=True)
            w = w / np.where(total == 0, 1.0, total)
    return AxisTaps(_clamp(src, n), w, outside, mode, coeff, t, piece, normalized)


def _plans(attrs: Mapping[str, Any], shape: Sequence[int]) -> list[tuple[int, AxisTaps]]:
    scales, roi = resize_plan(attrs, [tuple(shape)])
    r = len(shape)
    return [(ax, axis_taps(attrs, shape[ax], attrs["sizes"][ax], scales[ax],
                           (roi[ax], roi[r + ax]) if roi else None)) for ax in resized_axes(attrs, tuple(shape))]


def _along(v: np.ndarray, ndim: int, axis: int) -> np.ndarray:
    return v.reshape(tuple(-1 if k == axis else 1 for k in range(ndim)))


def resize(x: np.ndarray, attrs: Mapping[str, Any]) -> np.ndarray:
    """The float rule: arithmetic in ``x``'s dtype (weights rounded to it), one axis at a time."""
    extrapolation = x.dtype.type(attrs["extrapolation_value"])
    for ax, taps in _plans(attrs, x.shape):
        if taps.weight is None:
            y = np.take(x, taps.index[:, 0], axis=ax)
        else:
            w = taps.weight.astype(x.dtype)
            finite = bool(np.isfinite(x).all())
            y = np.zeros_like(np.take(x, taps.index[:, 0], axis=ax))
            for j in range(w.shape[1]):
                term = np.take(x, taps.index[:, j], axis=ax) * _along(w[:, j], x.ndim, ax)
                if not finite:  # a tap of weight 0 does not read its pixel (no 0 * inf = NaN)
                    term[np.broadcast_to(_along(w[:, j] == 0, x.ndim, ax), term.shape)] = 0
                y += term
        if taps.outside is not None and taps.outside.any():
            y = np.where(_along(taps.outside, x.ndim, ax), extrapolation, y)
        x = y
    return x


def resize_box(lo: np.ndarray, hi: np.ndarray, attrs: Mapping[str, Any]) -> Box:
    """Sound enclosure: per tap the weight box times the value box (outward rounding), summed outward,
    widened by the rounding of the float rule's own sum (``gamma_T sum |w| |v|`` plus underflow)."""
    e = float(attrs["extrapolation_value"])
    with np.errstate(all="ignore"):
        for ax, taps in _plans(attrs, lo.shape):
            if taps.weight is None:
                lo, hi = np.take(lo, taps.index[:, 0], axis=ax), np.take(hi, taps.index[:, 0], axis=ax)
            else:
                wl, wh = taps.weight_box()
                acc: Box | None = None
                mag = None
                for j in range(wl.shape[1]):
                    v = (np.take(lo, taps.index[:, j], axis=ax), np.take(hi, taps.index[:, j], axis=ax))
                    term = ia.mul((_along(wl[:, j], lo.ndim, ax), _along(wh[:, j], lo.ndim, ax)), v)
                    acc = term if acc is None else ia.add(acc, term)
                    size = np.abs(_along(taps.weight[:, j], lo.ndim, ax)) * np.maximum(np.abs(v[0]), np.abs(v[1]))
                    mag = size if mag is None else mag + size
                assert acc is not None and mag is not None
                n = wl.shape[1]
                err = up(mag * (1.01 * gamma(n + 1)) + n * MIN_NORMAL)
                lo, hi = clean(down(acc[0] - err), up(acc[1] + err))
            if taps.outside is not None and taps.outside.any():
                mask = _along(taps.outside, lo.ndim, ax)
                lo, hi = np.where(mask, e, lo), np.where(mask, e, hi)
    return lo, hi
