"""Common-subexpression elimination: one node per distinct computation.

Tracers record every call, so ``x.transpose(0, 1)`` written for a key and again for a value gives
two nodes under torch.fx and one under torch.export (which deduplicates identical inputs). Merging
nodes with the same kind, attributes, element type and parents (after their own parents merged)
makes both importers emit the same graph. Nodes holding payload or bindings (consts, parameters) and
random nodes are never merged: equal spellings there are distinct values.
"""

from __future__ import annotations

__all__ = ["eliminate_common_subexpressions"]

from typing import Any, Hashable

from ..bundle import Bundle
from .base import GraphEdit, Note
from .dead_code import eliminate_dead_code

_NEVER_MERGED = frozenset({"input", "const", "rand_uniform", "bernoulli_mask", "custom"})


def _key(kind: str, attrs: dict[str, Any], parents: tuple[int, ...], dtype: str) -> Hashable | None:
    try:
        key = (kind, tuple(sorted(attrs.items())), parents, dtype)
        hash(key)
    except TypeError:  # an attribute that is not plain data: leave the node alone
        return None
    return key


def eliminate_common_subexpressions(bundle: Bundle) -> tuple[Bundle, Note]:
    edit = GraphEdit(bundle)
    seen: dict[Hashable, int] = {}
    holders = {b.node for b in bundle.roles.bindings()} | set(bundle.payload.nodes())
    outputs = set(bundle.graph.outputs)
    details = []
    for node in bundle.graph.nodes:
        key = None
        if node.kind not in _NEVER_MERGED and node.id not in holders and node.parents:
            key = _key(node.kind, dict(node.attrs), edit.parents(node), node.dtype)
        if key is not None and key in seen and node.id not in outputs:
            edit.alias(node, seen[key])
            details.append(f"node {node.id} {node.kind} is node {seen[key]}")
            continue
        nid = edit.keep(node)
        if key is not None:
            seen.setdefault(key, nid)
    if not details:
        return bundle, Note("common_subexpressions")
    out, _ = eliminate_dead_code(edit.result())
    return out, Note("common_subexpressions", len(details), tuple(details))
