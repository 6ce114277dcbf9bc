"""What every pass shares: the ``Note`` it returns and ``GraphEdit``, a one-sweep graph rebuilder.

A pass is a function ``bundle -> (bundle, note)``: it never mutates its input, and the note says
what it changed (``changed == 0`` means the bundle came back as it went in). ``GraphEdit`` walks the
nodes in order; each is kept (parents remapped), replaced by new nodes, or aliased to an existing
value; payload records and role bindings follow their nodes to the new ids.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from ..bundle import Bundle
from ..graph import Graph, Node, Source
from ..payload import Payload
from ..roles import Binding, RoleMap

__all__ = ["Note", "Pass", "GraphEdit"]


@dataclass(frozen=True)
class Note:
    """A pass's account of its work: how many nodes it changed and, per change, one line."""

    pass_name: str
    changed: int = 0
    details: tuple[str, ...] = ()
    facts: Mapping[str, Any] = field(default_factory=dict)  # what later stages read (e.g. absorbed ids)

    def __str__(self) -> str:
        return f"{self.pass_name}: {self.changed} change(s)" + "".join(f"\n  {d}" for d in self.details)


Pass = Callable[[Bundle], tuple[Bundle, Note]]


class GraphEdit:
    """Rebuild ``bundle``'s graph node by node; ``result()`` gives the new bundle."""

    def __init__(self, bundle: Bundle) -> None:
        self.old = bundle
        self.nodes: list[Node] = []
        self.new_id: dict[int, int] = {}  # old id -> new id of the node holding its value
        self.payload: dict[int, dict[str, Any]] = {}
        self.bindings: list[Binding] = []
        self._old_bindings: dict[int, list[Binding]] = {}
        for b in bundle.roles.bindings():
            self._old_bindings.setdefault(b.node, []).append(b)

    def parents(self, node: Node) -> tuple[int, ...]:
        return tuple(self.new_id[p] for p in node.parents)

    def shape(self, new_id: int) -> tuple[int, ...]:
        return self.nodes[new_id].out_shape

    def keep(self, node: Node, **changes: Any) -> int:
        """The node itself (or with ``changes``: kind, attrs, ...), its payload and bindings moved along."""
        nid = len(self.nodes)
        parents = changes.pop("parents", self.parents(node))
        if nid == node.id and parents == node.parents and not changes:
            self.nodes.append(node)
        else:
            self.nodes.append(node.with_(id=nid, parents=parents, **changes))
        self.new_id[node.id] = nid
        if node.id in self.old.payload:
            self.payload[nid] = dict(self.old.payload.record(node.id))
        self.bindings.extend(Binding(b.key, nid, b.role, b.transform) for b in self._old_bindings.get(node.id, ()))
        return nid

    def emit(self, kind: str, parents: Sequence[int], attrs: Mapping[str, Any], shape: Sequence[int],
             dtype: str, source: Source | None) -> int:
        """A new node (parents are new ids) with no payload."""
        nid = len(self.nodes)
        self.nodes.append(Node(nid, parents, kind, tuple(shape), attrs, dtype=dtype, source=source))
        return nid

    def replace(self, node: Node, new_id: int) -> None:
        """``node``'s value is now computed by ``new_id``; its payload and bindings move there."""
        self.new_id[node.id] = new_id
        if node.id in self.old.payload:
            self.payload.setdefault(new_id, {}).update(self.old.payload.record(node.id))
        self.bindings.extend(Binding(b.key, new_id, b.role, b.transform)
                             for b in self._old_bindings.get(node.id, ()))

    def alias(self, node: Node, new_id: int) -> None:
        """``node`` disappears; its consumers read ``new_id`` (it must hold no payload of its own)."""
        assert node.id not in self.old.payload and node.id not in self._old_bindings, node
        self.new_id[node.id] = new_id

    def result(self, report: Mapping[str, Any] | None = None, inputs: Sequence[int] | None = None) -> Bundle:
        """The new bundle; ``inputs`` (new ids) replaces the old inputs' images when the pass changes them."""
        g = self.old.graph
        inputs = [self.new_id[i] for i in g.inputs] if inputs is None else list(inputs)
        graph = Graph(self.nodes, inputs, [self.new_id[o] for o in g.outputs])
        return Bundle(graph, Payload(self.payload), RoleMap(self.bindings),
                      dict(self.old.report if report is None else report))
