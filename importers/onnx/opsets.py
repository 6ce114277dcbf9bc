"""Which operator version each node has, and upgrading models older than the handlers.

A node's semantics is that of its op's schema in effect at the model's opset
(``onnx.defs.get_schema(op, opset).since_version``). Each handler states the versions it implements
(``OPSETS`` in ops_math / ops_tensor / ops_nn). A model with a node older than its handler is
upgraded with onnx.version_converter (recorded in the report); a node newer than its handler is
refused by name and version, never lowered with an older version's rules.
"""

from __future__ import annotations

from typing import Any

from torchlean_bridge.errors import BridgeError

from . import ops_math, ops_nn, ops_tensor
from .breadth import BREADTH_MODULES
from .checks import DEFAULT_DOMAINS

__all__ = ["OPSETS", "since_version", "upgrade_target", "upgrade", "version_problem"]

OPSETS: dict[str, tuple[int, int]] = {**ops_math.OPSETS, **ops_tensor.OPSETS, **ops_nn.OPSETS,
                                      **{op: r for m in BREADTH_MODULES for op, r in m.OPSETS.items()}}


def since_version(op: str, opset: int) -> int | None:
    """The version of ``op`` in effect at ``opset`` (None: the default domain has no such op there)."""
    import onnx.defs
    try:
        return int(onnx.defs.get_schema(op, opset, "").since_version)
    except onnx.defs.SchemaError:
        return None


def upgrade_target(graph: Any, opset: int) -> int | None:
    """The opset to upgrade to so that every handled node is at least its handler's first version."""
    target = None
    for node in graph.node:
        if node.domain not in DEFAULT_DOMAINS or node.op_type not in OPSETS:
            continue
        first = OPSETS[node.op_type][0]
        version = since_version(node.op_type, opset)
        if version is not None and version < first:
            target = max(target or 0, first)
    return target


def upgrade(model: Any, opset: int, target: int) -> Any:
    """``model`` converted from ``opset`` to ``target`` by onnx.version_converter."""
    import onnx.version_converter
    try:
        return onnx.version_converter.convert_version(model, target)
    except Exception as e:  # noqa: BLE001 - the converter raises RuntimeError/ValidationError/IndexError
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise BridgeError(f"ONNX import: the model's opset {opset} is older than its ops' handlers, and "
                          f"onnx.version_converter cannot upgrade it to opset {target}: {first}"[:500]) from None


def version_problem(op: str, opset: int) -> str | None:
    """Why a handled node at ``opset`` cannot be lowered by its handler, else None."""
    version = since_version(op, opset)
    if version is None:
        return f"opset {opset} of the default domain has no operator {op}"
    first, last = OPSETS[op]
    if version > last:
        return (f"{op}-{version} (in effect at opset {opset}) changed semantics after the versions the handler "
                f"implements ({op}-{first}..{op}-{last})")
    if version < first:
        return f"{op}-{version} (in effect at opset {opset}) predates the handler's {op}-{first}..{op}-{last}"
    return None
