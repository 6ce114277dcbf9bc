"""Which explicit ``broadcast_to`` nodes an ONNX writer can leave to ONNX's implicit broadcasting.

Our IR broadcasts explicitly (``add`` reads operands of one shape); ONNX's elementwise ops broadcast
numpy-style, and the ONNX importer turns that back into ``broadcast_to`` nodes. Writing each
broadcast as an ``Expand`` would make every exported bias add two ONNX nodes and the re-import a
different graph, so the writer reads the broadcast's source instead wherever the consumer
broadcasts by itself to the same result. This pass decides that once for the whole graph. The
graph it returns is unchanged (without the broadcasts it would not be valid IR); the note's facts
say ``operands``: ``{(consumer id, operand position): source id}`` for every absorbed operand, and
``absorbed``: the broadcast nodes no consumer needs written (an output's value is always written).
"""

from __future__ import annotations

__all__ = ["absorb_broadcasts", "BROADCASTING_KINDS"]

import functools

from ..bundle import Bundle
from ..errors import ShapeRuleError
from ..graph import Graph, Node
from ..ops.contracts import broadcast_shapes
from .base import Note

# IR kinds whose ONNX counterpart broadcasts its operands (numpy rules)
BROADCASTING_KINDS = frozenset({"add", "sub", "mul_elem", "div", "max_elem", "min_elem", "prelu", "where", "eq", "ne",
                                "lt", "le", "gt", "ge", "logical_and", "logical_or", "safe_log"})


def _absorbable(g: Graph, consumer: Node) -> bool:
    """ONNX broadcasting of the consumer's unbroadcast operands gives the consumer's shape."""
    if consumer.kind not in BROADCASTING_KINDS:
        return False
    shapes = []
    for p in consumer.parents:
        pn = g.nodes[p]
        shapes.append(g.nodes[pn.parents[0]].out_shape if pn.kind == "broadcast_to" else pn.out_shape)
    try:
        return functools.reduce(broadcast_shapes, shapes) == consumer.out_shape
    except ShapeRuleError:
        return False


def absorb_broadcasts(bundle: Bundle) -> tuple[Bundle, Note]:
    g = bundle.graph
    consumers = g.consumers()
    operands: dict[tuple[int, int], int] = {}
    for node in g.nodes:
        if any(g.nodes[p].kind == "broadcast_to" for p in node.parents) and _absorbable(g, node):
            for i, p in enumerate(node.parents):
                if g.nodes[p].kind == "broadcast_to":
                    operands[(node.id, i)] = g.nodes[p].parents[0]
    absorbed_by = {(c, i) for c, i in operands}
    outputs = set(g.outputs)
    absorbed = frozenset(
        n.id for n in g.nodes if n.kind == "broadcast_to" and n.id not in outputs and consumers[n.id]
        and all((c, i) in absorbed_by for c in set(consumers[n.id])
                for i, p in enumerate(g.nodes[c].parents) if p == n.id))
    return bundle, Note("absorb_broadcasts", len(absorbed), tuple(f"node {nid} broadcast_to" for nid in sorted(absorbed)),
                        {"operands": operands, "absorbed": absorbed})
