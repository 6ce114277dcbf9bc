"""What keeps a node out of torchlean.ir.v1 once every rewrite has been tried.

TorchLean takes v1 kinds over float values in a graph with exactly one input; its importer also
rejects some v1 kinds (``custom``, ``hard_masked_softmax``). ``passes.v1_rewrite`` lowers what it can
and asks ``blocking_reason`` about every node that is left.
"""

from __future__ import annotations

from .graph import Node
from .ops import FLOAT

__all__ = ["blocking_reason", "NO_FORM"]

NO_FORM = "ext op without an exact torchlean.ir.v1 form"
_IMPORTER_REJECTS = {"custom": "custom computations need a checked Lean body",
                     "hard_masked_softmax": "TorchLean's importer has no encoding for the mask"}


def blocking_reason(node: Node, no_form: str = NO_FORM) -> str | None:
    """Why ``node`` (as it stands after the rewrite) cannot be written as v1, or None when it can."""
    spec = node.spec
    if node.kind in _IMPORTER_REJECTS:
        return _IMPORTER_REJECTS[node.kind]
    if spec is None or not spec.is_v1:
        return no_form
    if node.dtype != FLOAT:
        hint = (": cut the graph after it with --input-at NODE (--input-at embeddings for token ids)"
                if node.kind == "input" else "")
        return f"element type {node.dtype} (torchlean.ir.v1 is float-only){hint}"
    return None
