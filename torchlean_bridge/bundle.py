"""Bundle: a graph with its payload, role map and import report, moved around as one value."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .graph import Graph
from .payload import Payload
from .roles import RoleMap

__all__ = ["Bundle"]


@dataclass
class Bundle:
    graph: Graph
    payload: Payload = field(default_factory=Payload)
    roles: RoleMap = field(default_factory=RoleMap)
    report: dict[str, Any] = field(default_factory=dict)  # import notes, provenance, warnings

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Bundle):
            return NotImplemented
        return self.graph == other.graph and self.payload == other.payload and self.roles == other.roles

    def summary(self) -> dict[str, Any]:
        """Nodes, parameters and ops used (``passes.rewrite_to_v1`` says what blocks torchlean.ir.v1)."""
        return {"nodes": len(self.graph), "inputs": list(self.graph.inputs), "outputs": list(self.graph.outputs),
                "parameters": self.payload.num_parameters(), "tensors": len(self.payload),
                "ops": self.graph.ops_used()}
