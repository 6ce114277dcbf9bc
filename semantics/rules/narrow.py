"""The narrow element types' two roundings (``round_float``, ``int_wrap``), float and interval rules side by
side; their arithmetic is ``semantics.narrow``'s (docs/element-types.md).

Interval rules: ``round_float`` is monotone wherever it yields numbers, so the rounded ends of a box
enclose the rounded values (a box reaching values that round to NaN is refused); ``int_wrap`` is the
identity on boxes inside the type's range and refused beyond it (wrapping is not monotone).
"""

from __future__ import annotations

import numpy as np

from .. import interval_arith as ia
from ..narrow import NarrowError, round_box, round_to, wrap
from .table import domain_error, float_rule, interval_rule

__all__ = ["INTERVAL_REFUSALS"]


@float_rule("round_float")
def round_float(node, xs, rec, dt):
    a = node.attrs
    try:
        return round_to(np.asarray(xs[0], dtype=dt), a["format"], a["saturate"], a["round_mode"])
    except NarrowError as e:
        raise domain_error(node, str(e)) from None


@interval_rule("round_float")
def round_float_box(node, ps, rec):
    (lo, hi), a = ps[0], node.attrs
    try:
        return round_box(lo, hi, a["format"], a["saturate"], a["round_mode"])
    except NarrowError as e:
        raise ia.DomainError(f"round_float to {a['format']}: {e}") from None


@float_rule("int_wrap")
def int_wrap(node, xs, rec, dt):
    bits, signed = int(node.attrs["bits"]), bool(node.attrs["signed"])
    r = wrap(xs[0], bits, signed)
    if not node.attrs.get("wrap", True) and not np.array_equal(r, xs[0]):
        bad = np.asarray(xs[0]).reshape(-1)[np.flatnonzero((r != xs[0]).reshape(-1))[0]]
        raise domain_error(node, f"value {int(bad)} is outside {'' if signed else 'u'}int{bits} (ONNX leaves a "
                                 "float cast out of range undefined); refused")
    return r


@interval_rule("int_wrap")
def int_wrap_box(node, ps, rec):
    (lo, hi), bits, signed = ps[0], int(node.attrs["bits"]), bool(node.attrs["signed"])
    low, high = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    if lo.size and (np.min(lo) < low or np.max(hi) > high):
        name = f"{'' if signed else 'u'}int{bits}"
        raise ia.DomainError(f"int_wrap: the box leaves the {name} range [{low}, {high}], where wrapping is not "
                             "monotone")
    return lo, hi


# -- integer products (quantized models) -----------------------------------------------------------

_EXACT_BOUND = 2 ** 53  # below it every partial sum is exact in int64 and in binary64 (the ONNX form)


def _bounded(node, a: np.ndarray, b: np.ndarray, terms: int) -> None:
    """Refuse operands whose products could reach 2^53 (never reached by 8- or 16-bit quantized values)."""
    peak = (int(np.max(np.abs(a), initial=0)) * int(np.max(np.abs(b), initial=0))) * max(terms, 1)
    if peak >= _EXACT_BOUND:
        raise domain_error(node, f"sums of products could reach {peak} >= 2^53; refused, not rounded")


@float_rule("int_matmul")
def int_matmul(node, xs, rec, dt):
    a, b = (np.asarray(x, dtype=np.int64) for x in xs)
    _bounded(node, a, b, a.shape[-1])
    return np.matmul(a, b)


@float_rule("int_conv")
def int_conv(node, xs, rec, dt):
    from ..conv import conv_nd
    x, w = (np.asarray(v, dtype=np.int64) for v in xs)
    a = node.attrs
    _bounded(node, x, w, int(np.prod(w.shape[1:])))
    return conv_nd(x, w, np.zeros(w.shape[0], np.int64), channel_axis=a["channel_axis"], stride=a["stride"],
                   padding=a["padding"], padding_after=a["padding_after"], dilation=a["dilation"], groups=a["groups"],
                   out_spatial=node.out_shape[a["channel_axis"] + 1:])


INTERVAL_REFUSALS = ("int_matmul", "int_conv")


@interval_rule(*INTERVAL_REFUSALS)
def int_product_box(node, ps, rec):
    raise ia.DomainError(f"{node.kind}: integer products of quantized models have no interval rule (their operands "
                         "are quantized tensors, not boxes)")
