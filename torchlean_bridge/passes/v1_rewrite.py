"""Every node in its exact torchlean.ir.v1 form, for the v1 writer.

Ext ops whose registry entry carries an exact ``v1_rewrite`` (squeeze/unsqueeze -> reshape, expand
-> broadcast_to, pools whose geometry v1 expresses) count as v1; this pass applies those rewrites,
keeping ids, parents, payload and bindings. Nodes with no v1 form are left as they are and listed
in the note (``facts["blocking"]``, from ``v1compat.v1_blocking_nodes``), so the writer can refuse
the export naming every one of them at once instead of failing on the first.
"""

from __future__ import annotations

__all__ = ["rewrite_to_v1"]

from ..bundle import Bundle
from ..v1compat import to_v1_node, v1_blocking_nodes
from .base import GraphEdit, Note


def rewrite_to_v1(bundle: Bundle) -> tuple[Bundle, Note]:
    g = bundle.graph
    edit = GraphEdit(bundle)
    details = []
    for node in g.nodes:
        v1 = to_v1_node(g, node)
        if v1 is None or v1 is node:
            edit.keep(node)
        else:
            edit.keep(node, kind=v1.kind, attrs=v1.attrs)
            details.append(f"node {node.id} {node.kind} -> {v1.kind}")
    blocking = v1_blocking_nodes(g)
    out = edit.result() if details else bundle
    return out, Note("v1_rewrite", len(details), tuple(details), {"blocking": blocking})
