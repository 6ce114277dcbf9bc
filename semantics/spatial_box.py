"""grid_sample's interval rule for a point grid: the sample is linear in the image, with weights known up to a
tiny error, so its box is an interval dot product of weight boxes and pixel boxes.

Per axis, the pixel coordinate is computed in float64 with an error radius (``coordinate_radius``) around
the exact real one. Wherever the exact coordinate could fall on the other side of a decision (a rounding
tie of nearest, the border a fix applies beyond), both sides are candidates and the boxes of every
combination of the axes' candidates are joined. For one candidate coordinate v (radius d), each pixel j
the kernel may reach gets the weight box ``k(v - j) +- (L d + eps)``: the kernel k (linear, or Keys cubic)
is L-Lipschitz (1, resp. 1.5), and eps bounds its float64 evaluation error. Nearest weights are 1, or [0, 1]
for each of two candidate pixels. Pixel boxes are read through the padding mode (zeros outside: [0, 0]); the
products and sums are outward rounded (``interval_arith``), contracted one axis at a time.
"""

from __future__ import annotations

import itertools
import math
from typing import NamedTuple, Sequence

import numpy as np

from . import interval_arith as ia
from .interval_round import U, Box, down, up
from .spatial import CUBIC_A, REFLECT_LIMIT, TAP_MARGIN, _pad_index, grid_borders, grid_coordinates, reflect

__all__ = ["grid_sample_box", "coordinate_radius", "kernel_weight"]

_LIPSCHITZ = {"linear": 1.0, "cubic": 1.5}  # max |k'|: 1 for the hat, 1.35 for Keys' a = -0.75
_KERNEL_EPS = 64 * U  # float64 evaluation error of a kernel value (|k| <= 1.1, a handful of operations)
_REACH = {"linear": (0, 1), "cubic": (1, 2)}  # pixels floor(v) - a .. floor(v) + b carry weight


class Slot(NamedTuple):
    """One pixel of one axis for every sample point: index (already padded), weight box, inside mask."""

    index: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    inside: np.ndarray | None


def coordinate_radius(g: np.ndarray, size: int) -> np.ndarray:
    """A bound of |float64 coordinate - exact coordinate| for grid value g on an axis of ``size`` pixels
    (either normalization: four roundings of magnitudes at most (|g| + 1)(size + 1))."""
    return up(8 * U * (np.abs(g) + 1) * (size + 1) + 4 * 2.0 ** -1074)


def kernel_weight(s: np.ndarray, mode: str) -> np.ndarray:
    """The interpolation kernel at offset s: the hat max(0, 1 - |s|) or Keys' cubic (a = -0.75)."""
    a, t = CUBIC_A, np.abs(s)
    if mode == "linear":
        return np.maximum(0.0, 1.0 - t)
    inner = ((a + 2) * t - (a + 3)) * t * t + 1
    outer = ((a * t - 5 * a) * t + 8 * a) * t - 4 * a
    return np.where(t <= 1, inner, np.where(t < 2, outer, 0.0))


def _fix(v: np.ndarray, size: int, padding_mode: str, align_corners: bool, clip_after: bool) -> np.ndarray:
    lo, hi = grid_borders(size, align_corners)
    if padding_mode == "border":
        return np.clip(v, 0, size - 1)
    if padding_mode == "reflection":
        w = reflect(v, lo, hi)
        return np.clip(w, 0, size - 1) if clip_after else w
    return v


def _fix_radius(v: np.ndarray, radius: np.ndarray, size: int, padding_mode: str) -> np.ndarray:
    """Clipping is exact and 1-Lipschitz; reflecting adds a few roundings of magnitudes up to |v| + size."""
    if padding_mode != "reflection":
        return radius
    return up(radius + 8 * U * (np.abs(v) + size + 1))


def _candidates(c: np.ndarray, radius: np.ndarray, size: int, mode: str, padding_mode: str, align_corners: bool,
                convention: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """Up to two (coordinate, radius) candidates per point: where the first and the second differ, the exact
    coordinate may take either path. Nearest candidates are rounded (radius 0)."""
    lo, hi = grid_borders(size, align_corners)
    if convention == "torch":
        if mode == "cubic":
            return [(c, radius)]
        v = _fix(c, size, padding_mode, align_corners, clip_after=True)
        r = _fix_radius(c, radius, size, padding_mode)
        if mode != "nearest":
            return [(v, r)]
        return [(np.rint(down(v - r)), np.zeros_like(r)), (np.rint(up(v + r)), np.zeros_like(r))]
    if mode == "nearest":
        out = []
        for k in (np.rint(down(c - radius)), np.rint(up(c + radius))):
            outside = (k < lo) | (k > hi)
            out.append((np.where(outside, _fix(k, size, padding_mode, align_corners, False), k), np.zeros_like(k)))
        return out
    if padding_mode == "zeros":
        return [(c, radius)]
    low, high = down(c - radius), up(c + radius)
    outside = (c < lo) | (c > hi)
    fixed = _fix(c, size, padding_mode, align_corners, False)
    fixed_radius = _fix_radius(c, radius, size, padding_mode)
    first = (np.where(outside, fixed, c), np.where(outside, fixed_radius, radius))
    straddles = ((low <= lo) & (lo <= high)) | ((low <= hi) & (hi <= high))
    second = (np.where(straddles & ~outside, fixed, first[0]), np.where(straddles & ~outside, fixed_radius, first[1]))
    second = (np.where(straddles & outside, c, second[0]), np.where(straddles & outside, radius, second[1]))
    return [first, second]


def _slots(v: np.ndarray, radius: np.ndarray, size: int, mode: str, tap_padding: str, align_corners: bool
           ) -> list[Slot]:
    if mode == "nearest":
        idx = np.clip(v, -TAP_MARGIN, size + TAP_MARGIN).astype(np.int64)
        tap = _pad_index(idx, size, tap_padding, align_corners)
        one = np.ones_like(v)
        return [Slot(tap.index, one, one, tap.inside)]
    before, after = _REACH[mode]
    first = np.floor(down(v - radius)) - before
    count = before + after + 2  # floor(v + radius) <= floor(v - radius) + 1 (radius << 1)
    slack = up(_LIPSCHITZ[mode] * radius + _KERNEL_EPS)
    margin = 2 * TAP_MARGIN if tap_padding == "zeros" else REFLECT_LIMIT
    base = np.clip(first, -margin, size + margin)
    far = first != base  # (zeros only) every reachable pixel is padding
    slots = []
    for j in range(count):
        pixel = base + j
        w = kernel_weight(v - pixel, mode)
        wl, wh = down(w - slack), up(w + slack)
        if tap_padding == "zeros":
            wl, wh = np.where(far, 0.0, wl), np.where(far, 0.0, wh)
        tap = _pad_index(pixel.astype(np.int64), size, tap_padding, align_corners)
        slots.append(Slot(tap.index, wl, wh, tap.inside))
    return slots


def _contract(lo: np.ndarray, hi: np.ndarray, axes: Sequence[Sequence[Slot]]) -> Box:
    n, c = lo.shape[:2]
    sizes = lo.shape[2:]
    flat_lo, flat_hi = lo.reshape(n, c, -1), hi.reshape(n, c, -1)
    strides = [math.prod(sizes[i + 1:]) for i in range(len(sizes))]
    rows, chans = np.arange(n)[:, None, None], np.arange(c)[None, :, None]

    def level(axis: int, offset, inside) -> Box:
        acc = None
        for slot in axes[axis]:
            idx = offset + slot.index * strides[axis]
            ok = slot.inside if inside is None else inside if slot.inside is None else inside & slot.inside
            if axis + 1 < len(axes):
                v = level(axis + 1, idx, ok)
            else:
                v = flat_lo[rows, chans, idx[:, None, :]], flat_hi[rows, chans, idx[:, None, :]]
                if ok is not None:
                    v = tuple(np.where(ok[:, None, :], e, 0.0) for e in v)
            term = ia.mul((slot.lo[:, None, :], slot.hi[:, None, :]), v)
            acc = term if acc is None else ia.add(acc, term)
        return acc

    return level(0, 0, None)


def grid_sample_box(lo: np.ndarray, hi: np.ndarray, grid: np.ndarray, mode: str, padding_mode: str,
                    align_corners: bool, convention: str) -> Box:
    """The box of grid_sample over the image box [lo, hi] at the finite point grid ``grid`` (float64)."""
    n, c = lo.shape[:2]
    sizes = lo.shape[2:]
    points = grid.shape[1:-1]
    g = grid.reshape(n, -1, len(sizes)).astype(np.float64)
    if convention == "torch":
        tap_padding = padding_mode if (mode == "cubic" or padding_mode == "zeros") else "border"
    else:
        tap_padding = padding_mode
    if padding_mode != "zeros" and np.any(np.abs(g) > 2.0 ** 40):
        raise ia.DomainError(f"grid_sample: a grid value beyond 2^40 with padding_mode={padding_mode} (its taps "
                             "are not placed exactly)")
    per_axis = []
    for i, (coord, size) in enumerate(zip(grid_coordinates(g, sizes, align_corners), sizes)):
        radius = coordinate_radius(g[..., len(sizes) - 1 - i], size)
        cands = _candidates(coord, radius, size, mode, padding_mode, align_corners, convention)
        per_axis.append([_slots(v, r, size, mode, tap_padding, align_corners) for v, r in cands])
    if mode == "nearest":  # two candidate pixels: each may carry the whole weight or none
        for a, cands in enumerate(per_axis):
            if len(cands) == 2:
                (s0,), (s1,) = cands
                same = s0.index == s1.index
                if s0.inside is not None:
                    same &= s0.inside == s1.inside
                half = np.where(same, 1.0, 0.0)
                per_axis[a] = [[s0, Slot(s1.index, np.zeros_like(half), 1.0 - half, s1.inside)]]
                per_axis[a][0][0] = s0._replace(lo=half)
    out_lo = out_hi = None
    with np.errstate(all="ignore"):
        for choice in itertools.product(*(range(len(c)) for c in per_axis)):
            b_lo, b_hi = _contract(lo, hi, [per_axis[a][k] for a, k in enumerate(choice)])
            out_lo = b_lo if out_lo is None else np.minimum(out_lo, b_lo)
            out_hi = b_hi if out_hi is None else np.maximum(out_hi, b_hi)
    shape = (n, c) + tuple(points)
    return out_lo.reshape(shape), out_hi.reshape(shape)
