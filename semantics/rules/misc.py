"""Running products, integer running sums, determinants and bit casts (issue #15), each op's float and interval rule side by side.

``cumprod`` multiplies left to right (numpy.cumprod's order, as PyTorch and onnx's reference do); on
int64 values it is exact, and a product that leaves int64 or the node's ONNX type is refused, never
wrapped. Its interval rule multiplies the running box by each entry's box with outward rounding.
``det`` is numpy.linalg.det (LU with partial pivoting, as onnx's reference); no enclosure of the
rounding of a pivoted elimination is implemented, so its interval rule refuses by name. ``bitcast``
reads each value's bits as another type of the same width (numpy ``view``); it is not monotone, so
intervals are refused.
"""

from __future__ import annotations

import numpy as np

from .. import interval_arith as ia
from .table import domain_error, float_rule, interval_rule

__all__ = ["INTERVAL_REFUSALS"]

_I64 = np.iinfo(np.int64)


def _along(x: np.ndarray, axis: int, exclusive: bool, reverse: bool, op, start) -> np.ndarray:
    """Running ``op`` along ``axis`` (``op`` accumulates with numpy's ufunc.accumulate order)."""
    if reverse:
        x = np.flip(x, axis)
    y = op.accumulate(x, axis=axis) if x.shape[axis] else x.copy()
    if exclusive:  # entry i gets the product before it: shifted one place, the identity first
        shifted = np.full_like(y, start)
        shifted[(slice(None),) * axis + (slice(1, None),)] = y[(slice(None),) * axis + (slice(None, -1),)]
        y = shifted
    return np.flip(y, axis) if reverse else y


def _int_range(attrs) -> tuple[int, int, str]:
    bits, signed = int(attrs["bits"]), bool(attrs["signed"])
    if signed:
        return -(1 << (bits - 1)), (1 << (bits - 1)) - 1, f"int{bits}"
    return 0, min((1 << bits) - 1, int(_I64.max)), f"uint{bits}"


def _within_type(node, r: np.ndarray) -> np.ndarray:
    """``r`` when every value fits the node's integer type; the first that does not is refused (ONNX
    would wrap it)."""
    lo, hi, name = _int_range(node.attrs)
    bad = (r < lo) | (r > hi)
    if np.any(bad):
        value = int(r.reshape(-1)[np.flatnonzero(bad.reshape(-1))[0]])
        raise domain_error(node, f"result {value} is outside {name} (ONNX would wrap it); refused, not wrapped")
    return r


@float_rule("cumprod")
def cumprod(node, xs, rec, dt):
    a = node.attrs
    x = xs[0]
    if x.dtype.kind == "f":
        return _along(x, a["axis"], a["exclusive"], a["reverse"], np.multiply, 1)
    x = np.asarray(x, dtype=np.int64)
    # the float64 running products bound the exact ones within a relative 1e-12: below 2^62 no int64
    # product wrapped, so the int64 results are exact
    with np.errstate(over="ignore"):
        approx = _along(x.astype(np.float64), a["axis"], a["exclusive"], a["reverse"], np.multiply, 1.0)
    if np.any(np.abs(approx) >= 2.0 ** 62):
        raise domain_error(node, "a running product leaves int64 (ONNX would wrap it); refused, not wrapped")
    with np.errstate(over="ignore"):
        r = _along(x, a["axis"], a["exclusive"], a["reverse"], np.multiply, 1)
    return _within_type(node, r)


@float_rule("int_cumsum")
def int_cumsum(node, xs, rec, dt):
    """Exact: the running sums of |x| bound every partial sum, so below 2^62 no int64 sum wrapped."""
    a = node.attrs
    x = np.asarray(xs[0], dtype=np.int64)
    magnitude = _along(np.abs(x.astype(np.float64)), a["axis"], False, a["reverse"], np.add, 0.0)
    if np.any(magnitude >= 2.0 ** 62):
        raise domain_error(node, "a running sum may leave int64 (ONNX would wrap it); refused, not wrapped")
    r = _along(x, a["axis"], a["exclusive"], a["reverse"], np.add, 0)
    return _within_type(node, r)


@interval_rule("cumprod")
def cumprod_box(node, ps, rec):
    """Box products along the axis, one step at a time (vectorized across the other axes); each
    step's outward-rounded product encloses the exact running product."""
    a = node.attrs
    lo, hi = ps[0]
    axis = a["axis"]
    if a["reverse"]:
        lo, hi = np.flip(lo, axis), np.flip(hi, axis)
    n = lo.shape[axis]
    take = lambda arr, i: np.take(arr, [i], axis=axis)  # noqa: E731
    out_lo, out_hi = np.empty_like(lo), np.empty_like(hi)
    run = (np.ones_like(take(lo, 0)), np.ones_like(take(hi, 0))) if n else None
    for i in range(n):
        if not a["exclusive"]:
            run = ia.mul(run, (take(lo, i), take(hi, i)))
        idx = (slice(None),) * axis + (slice(i, i + 1),)
        out_lo[idx], out_hi[idx] = run
        if a["exclusive"]:
            run = ia.mul(run, (take(lo, i), take(hi, i)))
    if a["reverse"]:
        out_lo, out_hi = np.flip(out_lo, axis), np.flip(out_hi, axis)
    return out_lo, out_hi


@float_rule("det")
def det(node, xs, rec, dt):
    return np.asarray(np.linalg.det(xs[0]), dtype=xs[0].dtype)


_NUMPY = {"bool": np.bool_, "float32": np.float32, "float64": np.float64, **{
    f"{p}int{b}": np.dtype(f"{p}int{b}").type for p in ("", "u") for b in (8, 16, 32, 64)}}


@float_rule("bitcast")
def bitcast(node, xs, rec, dt):
    src, dst = np.dtype(_NUMPY[node.attrs["source"]]), np.dtype(_NUMPY[node.attrs["target"]])
    x = np.asarray(xs[0])
    if max(src.itemsize if src.kind == "f" else 0, dst.itemsize if dst.kind == "f" else 0) > dt.itemsize:
        raise domain_error(node, f"a float64 bit pattern in a {dt.name} evaluation (the bits would not be the "
                                 "model's); evaluate in float64")
    with np.errstate(all="ignore"):
        held = x.astype(src)
    same = (held.astype(x.dtype) == x) | (np.isnan(x) & np.isnan(held)) if x.dtype.kind == "f" else \
        held.astype(x.dtype) == x
    if not np.all(same):
        bad = x.reshape(-1)[np.flatnonzero(~same.reshape(-1))[0]]
        raise domain_error(node, f"value {bad!r} is not a {src.name} value (the evaluation precision or type "
                                 f"cannot hold the bits {node.attrs['source']} has)")
    y = np.ascontiguousarray(held).view(dst).reshape(held.shape)
    if dst.kind == "f":
        return y.astype(dt, copy=False) if dt.itemsize >= dst.itemsize else y
    if dst.kind == "b":
        return y
    if dst == np.uint64 and np.any(y > np.uint64(_I64.max)):
        raise domain_error(node, "a uint64 result above 2^63 - 1 cannot be held exactly in int64")
    return y.astype(np.int64)


INTERVAL_REFUSALS = {
    "int_cumsum": "integer arithmetic is evaluated on exact values only (bind or fold the integer inputs)",
    "det": "a determinant computed by pivoted elimination has no implemented enclosure",
    "bitcast": "reinterpreting bits is not monotone in the value",
}


@interval_rule(*INTERVAL_REFUSALS)
def refused_box(node, ps, rec):
    raise ia.DomainError(f"no interval rule for {node.kind}: {INTERVAL_REFUSALS[node.kind]}")
