"""Dead-code elimination with dense renumbering.

Importers build nodes for everything the framework computed, including values no output reads
(shape bookkeeping, the unused half of a split, indices nobody asked for). This pass keeps the
graph inputs and every ancestor of an output, renumbers densely (ids equal positions, parents below)
and moves payload records and role bindings with their nodes. A tensor whose every binding went with
dropped nodes is listed in ``report["unused_tensors"]`` so the loss is visible, never silent.
"""

from __future__ import annotations

__all__ = ["eliminate_dead_code"]

from ..bundle import Bundle
from .base import GraphEdit, Note


def live_nodes(bundle: Bundle) -> set[int]:
    """Graph inputs and every node an output depends on."""
    g = bundle.graph
    live = set(g.inputs) | set(g.outputs)
    stack = list(g.outputs)
    while stack:
        for p in g.nodes[stack.pop()].parents:
            if p not in live:
                live.add(p)
                stack.append(p)
    return live


def eliminate_dead_code(bundle: Bundle) -> tuple[Bundle, Note]:
    live = live_nodes(bundle)
    if len(live) == len(bundle.graph.nodes):
        return bundle, Note("dead_code")
    edit = GraphEdit(bundle)
    for node in bundle.graph.nodes:
        if node.id in live:
            edit.keep(node)
    report = dict(bundle.report)
    dropped = sorted(set(bundle.roles) - {b.key for b in edit.bindings})
    if dropped:
        report["unused_tensors"] = sorted(set(report.get("unused_tensors", ())) | set(dropped))
    removed = sorted(set(range(len(bundle.graph.nodes))) - live)
    return edit.result(report), Note("dead_code", len(removed), (f"dropped nodes {removed}",),
                                     {"unused_tensors": dropped, "ids": dict(edit.new_id)})
