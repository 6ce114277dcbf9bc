"""TorchLean's deterministic random ops: rand_uniform and bernoulli_mask (the stream is
``semantics.float_random``'s splitmix64, keyed by seed and node index)."""

from __future__ import annotations

import numpy as np

from ..float_random import bernoulli, uniform
from ..records import fail
from .table import float_rule, interval_rule

__all__: list[str] = []


@float_rule("rand_uniform")
def rand_uniform(node, xs, rec, dt):
    return uniform(node.attrs["seed"], node.id, node.out_shape, dt)


@interval_rule("rand_uniform")
def rand_uniform_box(node, ps, rec):
    """[0, 1], TorchLean's rule (the box holds every draw)."""
    return np.zeros(node.out_shape), np.ones(node.out_shape)


@float_rule("bernoulli_mask")
def bernoulli_mask(node, xs, rec, dt):
    if xs[0].shape != ():
        raise fail(node, f"IR eval: node {node.id}: bernoulli_mask expects scalar keepProb parent ({node.summary()})")
    return bernoulli(float(xs[0]), node.attrs["seed"], node.id, node.out_shape, dt)


@interval_rule("bernoulli_mask")
def bernoulli_mask_box(node, ps, rec):
    """[0, 1] unless the keep probability's box decides every entry."""
    q_lo, q_hi = ps[0]
    lo = np.full(node.out_shape, 1.0 if q_lo >= 1 else 0.0)
    hi = np.full(node.out_shape, 0.0 if q_hi <= 0 else 1.0)
    return lo, hi
