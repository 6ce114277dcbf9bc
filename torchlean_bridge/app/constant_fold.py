"""Fold what depends on no graph input into constants, for the torchlean.ir.v1 writer.

Masks and index tables that real models build from shapes (a causal mask from ``arange``, position ids,
``ne``/``cumsum`` over constants, casts of constants) are values, not computations: folding them with
the reference semantics (float64) leaves the v1 rewrite constants to work with (a constant condition,
constant gather indices). Only constant subgraphs that would otherwise block v1 are folded (one with an
ext op or a non-float value); v1 constant subgraphs stay as they are, with their checkpoint bindings.
"""

from __future__ import annotations

import numpy as np

from torchlean_bridge.bundle import Bundle
from torchlean_bridge.graph import Graph
from torchlean_bridge.ops import FLOAT
from torchlean_bridge.passes.base import GraphEdit, Note
from torchlean_bridge.passes.dead_code import eliminate_dead_code
from torchlean_bridge.payload import Payload

__all__ = ["fold_constants"]

_RANDOM = ("rand_uniform", "bernoulli_mask")


def fold_constants(bundle: Bundle) -> tuple[Bundle, Note]:
    g = bundle.graph
    constant: set[int] = set()
    impure: set[int] = set()  # constant nodes whose subgraph holds an ext op or a non-float value
    for node in g.nodes:
        if node.kind == "input" or node.kind in _RANDOM or any(p not in constant for p in node.parents):
            continue
        constant.add(node.id)
        spec = node.spec
        if node.dtype != FLOAT or spec is None or not spec.is_v1 or any(p in impure for p in node.parents):
            impure.add(node.id)
    readers: dict[int, bool] = {}
    for node in g.nodes:
        if node.id not in constant:
            for p in node.parents:
                readers[p] = True
    frontier = [n for n in sorted(impure) if g.nodes[n].kind != "const" and (readers.get(n) or n in g.outputs)]
    if not frontier:
        return bundle, Note("fold_constants")
    values = _evaluate_constants(bundle, constant, frontier)
    edit = GraphEdit(bundle)
    fold = dict(zip(frontier, values))
    for node in g.nodes:
        if node.id in fold:
            nid = edit.emit("const", (), {}, node.out_shape, node.dtype, node.source)
            edit.payload[nid] = {"values": fold[node.id]}
            edit.new_id[node.id] = nid
        else:
            edit.keep(node)  # what only folded nodes read goes with dead-code elimination
    folded, dead = eliminate_dead_code(edit.result())
    after = dead.facts["ids"] if dead.changed else {n: n for n in range(len(edit.nodes))}
    ids = {old: after[new] for old, new in edit.new_id.items() if new in after}
    details = tuple(f"node {n} {g.nodes[n].kind} {list(g.nodes[n].out_shape)} -> const" for n in frontier)
    return folded, Note("fold_constants", len(frontier), details, {"folded": frontier, "ids": ids})


def _evaluate_constants(bundle: Bundle, constant: set[int], frontier: list[int]) -> list[np.ndarray]:
    """The frontier's values, from the constant subgraph alone (no inputs), in float64."""
    from semantics.evaluate import evaluate
    g = bundle.graph
    order = sorted(constant)
    index = {old: new for new, old in enumerate(order)}
    nodes = [g.nodes[old].with_(id=index[old], parents=tuple(index[p] for p in g.nodes[old].parents))
             for old in order]
    payload = Payload({index[n]: bundle.payload.record(n) for n in order if n in bundle.payload})
    sub = Graph(nodes, [], [index[n] for n in frontier])
    return [np.asarray(v) for v in evaluate(sub, payload, [])]
