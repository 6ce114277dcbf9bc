"""TopK / MaxPool indices, MaxUnpool and elementwise powers, each op's float and interval rules side by side.

Index outputs (``topk_indices``, ``max_pool_indices``) and ``max_unpool`` (which writes at computed positions)
refuse interval bounds by name: a position jumps where two values cross, and these are not boxed.
``pow_elem``'s box is the hull of its four corners for a positive base (x ** y is monotone in each argument
there), library rounding included; ``int_pow`` is exact in int64 and refuses boxes like the other integer ops.
"""

from __future__ import annotations

import itertools

import numpy as np

from .. import interval_arith as ia
from ..interval_round import clean, lib_bounds
from .integer import _fit, _ints
from .table import domain_error, float_rule, interval_rule

__all__ = ["INTERVAL_REFUSALS", "topk_positions"]


def topk_positions(x: np.ndarray, axis: int, k: int, descending: bool) -> np.ndarray:
    """Positions of ``sorted_values``: a stable sort (equal values keep index order; NaN sorts above +inf)."""
    n = x.shape[axis]
    if descending:  # stable on the reversed axis, then reversed: descending, equal values by lower index
        order = n - 1 - np.flip(np.argsort(np.flip(x, axis), axis=axis, kind="stable"), axis)
    else:
        order = np.argsort(x, axis=axis, kind="stable")
    return order[(slice(None),) * axis + (slice(0, k),)].astype(np.int64)


@float_rule("topk_indices")
def topk_indices(node, xs, rec, dt):
    a = node.attrs
    return topk_positions(xs[0], a["axis"], a["k"], a["descending"])


@float_rule("max_pool_indices")
def max_pool_indices(node, xs, rec, dt):
    """The first maximum of each window in row-major window order (a later cell wins only when greater, as
    onnxruntime and onnx's reference scan), as a flat position in the input."""
    x, a = xs[0], node.attrs
    r = a["spatial_rank"]
    lead, spatial = x.shape[:x.ndim - r], x.shape[x.ndim - r:]
    out_spatial = node.out_shape[x.ndim - r:]
    out_shape = tuple(lead) + tuple(out_spatial)
    best = np.full(out_shape, -np.inf, x.dtype)
    where = np.full(out_shape, -1, np.int64)
    grids = np.meshgrid(*(np.arange(o) for o in out_spatial), indexing="ij")
    strides = [int(np.prod(spatial[i + 1:])) for i in range(r)]
    if a["storage_order"]:
        strides = [int(np.prod(spatial[:i])) for i in range(r)]
    base = (np.arange(int(np.prod(lead))) * int(np.prod(spatial))).reshape(tuple(lead) + (1,) * r)
    for offs in itertools.product(*(range(k) for k in a["kernel"])):
        pos = [g * s + f * d - p for g, s, f, d, p in zip(grids, a["stride"], offs, a["dilation"], a["padding"])]
        inside = np.ones(tuple(out_spatial), bool)
        for p, n in zip(pos, spatial):
            inside &= (p >= 0) & (p < n)
        clipped = [np.clip(p, 0, n - 1) for p, n in zip(pos, spatial)]
        cells = x[(Ellipsis,) + tuple(clipped)]
        take = inside & ((where < 0) | (cells > best))
        flat = base + sum(c * s for c, s in zip(clipped, strides))
        np.copyto(best, cells, where=take)
        np.copyto(where, np.broadcast_to(flat, out_shape), where=take)
    if np.any(where < 0):
        raise domain_error(node, "a window holds only padding, so it has no maximum position")
    return where


@float_rule("max_unpool")
def max_unpool(node, xs, rec, dt):
    x, idx = xs[0], np.asarray(xs[1], dtype=np.int64)
    grid = tuple(node.attrs["scatter_shape"])
    out = np.zeros(grid, x.dtype).reshape(-1)
    flat_i, flat_x = idx.reshape(-1), x.reshape(-1)
    if flat_i.size and (flat_i.min() < 0 or flat_i.max() >= out.size):
        raise domain_error(node, f"an index is outside [0, {out.size}) (the output's {out.size} positions)")
    order = np.argsort(flat_i, kind="stable")
    si, sx = flat_i[order], flat_x[order]
    clash = (si[1:] == si[:-1]) & ~((sx[1:] == sx[:-1]) | (np.isnan(sx[1:]) & np.isnan(sx[:-1])))
    if np.any(clash):
        raise domain_error(node, f"index {int(si[1:][clash][0])} is given two different values")
    out[flat_i] = flat_x
    full = np.zeros(node.out_shape, x.dtype)
    full[tuple(slice(0, g) for g in grid)] = out.reshape(grid)
    return full


@float_rule("pow_elem")
def pow_elem(node, xs, rec, dt):
    x, y = xs
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if np.any((x == 0) & (y < 0)):
            raise domain_error(node, "zero raised to a negative power")
        r = np.power(x, y)
    return r  # a negative base to a non-integer power is NaN, as in torch, onnxruntime and C's pow


@interval_rule("pow_elem")
def pow_elem_box(node, ps, rec):
    (xl, xh), (yl, yh) = ps
    if np.any(xl <= 0):
        raise ia.DomainError("pow_elem: the base box reaches 0 or below (only positive bases are bounded)")
    with np.errstate(all="ignore"):
        corners = [lib_bounds(lambda v, e=e: np.power(v, e), b) for b in (xl, xh) for e in (yl, yh)]
    lo = np.minimum.reduce([c[0] for c in corners])
    hi = np.maximum.reduce([c[1] for c in corners])
    return clean(np.maximum(lo, 0.0), hi)


@float_rule("int_pow")
def int_pow(node, xs, rec, dt):
    a, b = np.broadcast_arrays(*_ints(xs))
    if np.any(b < 0):
        raise domain_error(node, "integer power with a negative exponent")
    huge = ((a > 1) | (a < -1)) & (b >= 64)  # |a| >= 2: beyond int64 whatever the type
    exact = np.asarray([int(p) ** int(q) for p, q in zip(a.reshape(-1), np.where(huge, 0, b).reshape(-1))],
                       dtype=object).reshape(a.shape)
    overflow = huge | np.asarray((exact > np.iinfo(np.int64).max) | (exact < np.iinfo(np.int64).min), dtype=bool)
    return _fit(node, np.where(overflow, 0, exact).astype(np.int64), overflow)


INTERVAL_REFUSALS = {
    "topk_indices": "positions of the sorted values jump where two values cross, and index outputs are not boxed",
    "max_pool_indices": "the position of a window's maximum jumps where two values cross, and index outputs are "
                        "not boxed",
    "max_unpool": "it writes at positions taken from an index tensor",
    "int_pow": "integer arithmetic is evaluated on exact values only (bind or fold the integer inputs)",
}


@interval_rule(*INTERVAL_REFUSALS)
def refused_box(node, ps, rec):
    raise ia.DomainError(f"no interval rule for {node.kind}: {INTERVAL_REFUSALS[node.kind]}")
