"""TorchLean's deterministic random ops: rand_uniform and bernoulli_mask (the stream is
``semantics.float_random``'s splitmix64, keyed by seed and node index).

The node index in TorchLean's ``keyOf seed i`` is the node's id after TorchLean's own lowering
(spec section 1.3): a multi-axis ``reduce_sum``/``reduce_mean`` (our v1-wire ``*_axes`` kinds) becomes
one IR node per axis, each followed by a reshape when ``keepdim``, and none for empty ``axes``, so
every later id shifts. ``stream_records`` hands the rules that index (``STREAM_INDEX``); a node
evaluated on its own (``eval_node``) uses its own id.
"""

from __future__ import annotations

from typing import Callable, Mapping

import numpy as np

from torchlean_bridge.graph import Graph

from ..float_random import bernoulli, uniform
from ..records import fail
from ..schedule import schedule
from .table import float_rule, interval_rule

__all__ = ["STREAM_INDEX", "lowered_ids", "stream_records"]

STREAM_INDEX = "stream_index"
RANDOM_KINDS = ("rand_uniform", "bernoulli_mask")
_EXPANDED = ("reduce_sum_axes", "reduce_mean_axes")


def lowered_ids(g: Graph) -> list[int]:
    """Each node's id in the graph TorchLean's importer builds (the first node of its expansion)."""
    ids, shift = [], 0
    for node in g.nodes:
        ids.append(node.id + shift)
        if node.kind in _EXPANDED:
            shift += len(node.attrs["axes"]) * (2 if node.attrs["keepdim"] else 1) - 1
    return ids


def stream_records(g: Graph, record: Callable[[int], Mapping]) -> Callable[[int], Mapping]:
    """``record`` with each random node's stream index added, where lowering shifts it."""
    kinds = schedule(g).kinds
    if kinds.isdisjoint(RANDOM_KINDS) or kinds.isdisjoint(_EXPANDED):
        return record
    ids = lowered_ids(g)
    shifted = {n.id: ids[n.id] for n in g.nodes if n.kind in RANDOM_KINDS and ids[n.id] != n.id}
    if not shifted:
        return record

    def with_index(nid: int) -> Mapping:
        rec = record(nid)
        return {**rec, STREAM_INDEX: shifted[nid]} if nid in shifted else rec
    return with_index


@float_rule("rand_uniform")
def rand_uniform(node, xs, rec, dt):
    return uniform(node.attrs["seed"], rec.get(STREAM_INDEX, node.id), node.out_shape, dt)


@interval_rule("rand_uniform")
def rand_uniform_box(node, ps, rec):
    """[0, 1], TorchLean's rule (the box holds every draw)."""
    return np.zeros(node.out_shape), np.ones(node.out_shape)


@float_rule("bernoulli_mask")
def bernoulli_mask(node, xs, rec, dt):
    if xs[0].shape != ():
        raise fail(node, f"IR eval: node {node.id}: bernoulli_mask expects scalar keepProb parent ({node.summary()})")
    return bernoulli(float(xs[0]), node.attrs["seed"], rec.get(STREAM_INDEX, node.id), node.out_shape, dt)


@interval_rule("bernoulli_mask")
def bernoulli_mask_box(node, ps, rec):
    """[0, 1] unless the keep probability's box decides every entry."""
    q_lo, q_hi = ps[0]
    lo = np.full(node.out_shape, 1.0 if q_lo >= 1 else 0.0)
    hi = np.full(node.out_shape, 0.0 if q_hi <= 0 else 1.0)
    return lo, hi
