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

__all__: list[str] = []


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
    return wrap(xs[0], int(node.attrs["bits"]), bool(node.attrs["signed"]))


@interval_rule("int_wrap")
def int_wrap_box(node, ps, rec):
    (lo, hi), bits, signed = ps[0], int(node.attrs["bits"]), bool(node.attrs["signed"])
    low, high = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    if lo.size and (np.min(lo) < low or np.max(hi) > high):
        name = f"{'' if signed else 'u'}int{bits}"
        raise ia.DomainError(f"int_wrap: the box leaves the {name} range [{low}, {high}], where wrapping is not "
                             "monotone")
    return lo, hi
