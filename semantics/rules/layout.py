"""Leaves and data movement: input, const, custom, detach, permute/transpose, broadcast, reshape,
concat, slice, pad, cast. Moving values rounds nothing, so their interval rule is the float rule on
both ends (``on_ends``)."""

from __future__ import annotations

import numpy as np

from torchlean_bridge.ops import BOOL, INT64, fmt_shape, numel
from torchlean_bridge.ops.contracts import can_broadcast_to

from .. import interval_arith as ia
from ..records import fail
from .table import FLOAT_RULES, INTERVAL_RULES, domain_error, float_params, float_rule, interval_rule, on_ends, \
    read_params

__all__ = ["NO_INTERVAL_RULE"]

_INPUT_KINDS = {"float": "f", INT64: "iu", BOOL: "b"}
_ELEMENT_TYPES = {INT64: np.dtype(np.int64), BOOL: np.dtype(bool)}


def _typed(node, values: np.ndarray, dt: np.dtype) -> np.ndarray:
    """Float values in the domain dtype; int64 and bool values keep their own type."""
    return values.astype(_ELEMENT_TYPES.get(node.dtype, dt), copy=False)


@float_rule("input")
def input_value(node, xs, rec, dt):
    """The caller's array for this input: shape and element type checked, floats put in the domain."""
    x = xs[0]
    if tuple(x.shape) != tuple(node.out_shape):
        raise fail(node, f"IR eval: shape mismatch: expected {fmt_shape(node.out_shape)}, got {fmt_shape(x.shape)}")
    if x.dtype.kind not in _INPUT_KINDS[node.dtype]:
        raise fail(node, f"IR eval: input {node.id}: element type mismatch: expected {node.dtype}, got {x.dtype}")
    if node.dtype == BOOL:
        return x
    return _typed(node, x, dt)


@interval_rule("input")
def input_box(node, ps, rec):
    """The seeded box, checked where it entered (``interval.input_boxes``)."""
    return ps[0]


FLOAT_RULES.params["const"] = lambda node, values, dt: _typed(node, values, dt)
INTERVAL_RULES.params["const"] = lambda node, values: ia.point(values.astype(np.float64))


@float_rule("const")
def const(node, xs, rec, dt):
    return float_params(node, rec, (), dt)


@interval_rule("const")
def const_box(node, ps, rec):
    return read_params(INTERVAL_RULES, node, rec, ())


@float_rule("custom")
def custom(node, xs, rec, dt):
    raise fail(node, f"IR eval: custom {node.attrs['name']}: no checked body available (custom computations "
                     f"need a checked Lean body; node {node.id})")


NO_INTERVAL_RULE = {
    "custom": "a custom node's body is a checked Lean program that is not part of the bundle",
}


@interval_rule(*NO_INTERVAL_RULE)
def no_interval_rule(node, ps, rec):
    raise ia.DomainError(f"no interval rule for {node.kind}: {NO_INTERVAL_RULE[node.kind]}")


@float_rule("detach")
def detach(node, xs, rec, dt):
    return xs[0]


@float_rule("permute")
def permute(node, xs, rec, dt):
    return np.transpose(xs[0], node.attrs["perm"])


@float_rule("transpose")
def transpose(node, xs, rec, dt):
    return np.swapaxes(xs[0], node.attrs["axis1"], node.attrs["axis2"])


@float_rule("broadcast_to", "expand")
def broadcast(node, xs, rec, dt):
    if not can_broadcast_to(xs[0].shape, node.out_shape):
        raise fail(node, f"IR eval: node {node.id}: broadcastTo invalid: {fmt_shape(xs[0].shape)} → "
                         f"{fmt_shape(node.out_shape)}")
    return np.broadcast_to(xs[0], node.out_shape)


@float_rule("reshape", "flatten", "squeeze", "unsqueeze")
def reshape(node, xs, rec, dt):
    if xs[0].size != numel(node.out_shape):
        raise fail(node, f"IR eval: node {node.id}: reshape numel mismatch: {xs[0].size} vs {numel(node.out_shape)}")
    return np.reshape(xs[0], node.out_shape)


@float_rule("concat")
def concat(node, xs, rec, dt):
    return np.concatenate(xs, axis=node.attrs["axis"])


@float_rule("slice")
def strided_slice(node, xs, rec, dt):
    index = [slice(None)] * xs[0].ndim
    a = node.attrs
    for ax, start, end, step in zip(a["axes"], a["starts"], a["ends"], a["steps"]):
        index[ax] = slice(start, end, step)
    return xs[0][tuple(index)]


@float_rule("pad")
def pad(node, xs, rec, dt):
    a = node.attrs
    return np.pad(xs[0], list(zip(a["pads_before"], a["pads_after"])), constant_values=a["value"])


on_ends("detach", "permute", "transpose", "broadcast_to", "expand", "reshape", "flatten", "squeeze", "unsqueeze",
        "concat", "slice")
on_ends("pad", nan_free=False)  # a constant pad value may be NaN


@float_rule("cast")
def cast(node, xs, rec, dt):
    x, target = xs[0], node.attrs["dtype"]
    if target == BOOL:
        return x != 0
    if target == INT64:
        if x.dtype.kind != "f":
            return x.astype(np.int64)
        t = np.trunc(x)
        inside = (t >= -2.0**63) & (t < 2.0**63)
        if not np.all(inside):
            bad = x.reshape(-1)[np.flatnonzero(~inside.reshape(-1))[0]]
            raise domain_error(node, f"value {float(bad)!r} is NaN, infinite or outside the int64 range")
        return t.astype(np.int64)
    return x.astype(dt)


@interval_rule("cast")
def cast_box(node, ps, rec):
    (lo, hi), target = ps[0], node.attrs["dtype"]
    if target == BOOL:
        return (~ia.contains_zero((lo, hi))).astype(np.float64), (~((lo == 0) & (hi == 0))).astype(np.float64)
    if target == INT64:  # the float rule's domain: truncated values inside int64 (NaN, inf and beyond refused)
        if lo.size and not (np.trunc(np.min(lo)) >= -2.0 ** 63 and np.trunc(np.max(hi)) < 2.0 ** 63):
            raise ia.DomainError("cast: a box reaching NaN, infinity or past the int64 range cannot be converted "
                                 "to int64")
        return np.trunc(lo), np.trunc(hi)
    return lo, hi

