"""What keeps a graph out of torchlean.ir.v1, and each node in its exact v1 form.

Ext ops whose registry entry has an exact ``v1_rewrite`` (squeeze/unsqueeze -> reshape, expand ->
broadcast_to, pools with v1 geometry) count as v1; everything else TorchLean cannot take (other ext
ops, several inputs or none, int64/bool values, kinds its importer rejects) blocks, with a reason.
"""

from __future__ import annotations

from typing import Any

from .graph import Graph, Node
from .ops import FLOAT

__all__ = ["to_v1_node", "v1_blocking_nodes"]

_IMPORTER_REJECTS = {"custom": "custom computations need a checked Lean body",
                     "hard_masked_softmax": "TorchLean's importer has no encoding for the mask"}


def to_v1_node(g: Graph, node: Node) -> Node | None:
    """The node in v1 form: itself, its exact v1 rewrite, or None when it has none."""
    spec = node.spec
    if spec is None:
        return None
    if spec.is_v1:
        return node
    if spec.v1_rewrite is None:
        return None
    parent_shapes = [g.nodes[p].out_shape for p in node.parents]
    rewritten = spec.v1_rewrite(node.attrs, parent_shapes, node.out_shape)
    if rewritten is None:
        return None
    kind, attrs = rewritten
    return Node(node.id, node.parents, kind, node.out_shape, attrs, dtype=node.dtype, source=node.source)


def v1_blocking_nodes(g: Graph) -> list[dict[str, Any]]:
    """Every node that keeps the graph out of torchlean.ir.v1, with the reason (empty when none)."""
    blocking: list[dict[str, Any]] = []

    def block(node: Node, reason: str) -> None:
        blocking.append({"id": node.id, "kind": node.kind, "source": str(node.source) if node.source else None,
                         "reason": reason})

    if not g.inputs:
        blocking.append({"id": None, "kind": None, "source": None,
                         "reason": "the graph has no input; TorchLean graphs have exactly one"})
    for nid in g.inputs[1:]:
        block(g.nodes[nid], f"graph input #{list(g.inputs).index(nid) + 1}: TorchLean graphs have exactly one input")
    for node in g.nodes:
        if node.kind in _IMPORTER_REJECTS:
            block(node, _IMPORTER_REJECTS[node.kind])
        elif to_v1_node(g, node) is None:
            block(node, "ext op without an exact torchlean.ir.v1 form")
        elif node.dtype != FLOAT:
            block(node, f"element type {node.dtype} (torchlean.ir.v1 is float-only)")
    return blocking
