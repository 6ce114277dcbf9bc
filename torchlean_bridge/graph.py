"""Node and Graph: TorchLean's IR records, plus provenance kept outside the v1 core fields.

A graph is a *candidate*: ids, parents and declared shapes are plain data that ``check`` validates.
Parameters never live here; they are in a ``Payload`` keyed by node id.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Iterable, Iterator, Mapping, Sequence

from .ops import FLOAT, REGISTRY, OpSpec, Shape

__all__ = ["Source", "Node", "Graph", "freeze_attr", "normalized_attrs"]


@dataclass(frozen=True)
class Source:
    """Where a node came from: shown in errors, used to match nodes in differential tests."""

    framework: str | None = None  # "fx", "export", "onnx", "torchlean", "builder"
    name: str | None = None  # FX node name / ONNX node name
    target: str | None = None  # module type, aten overload, callable, ONNX op type
    module: str | None = None  # module path (FX/export)
    tensor: str | None = None  # framework tensor name this node's value corresponds to
    location: str | None = None  # "file.py:12" stack line
    folded: bool = False  # computed at import time and stored as a const

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)
                if getattr(self, f.name) not in (None, False)}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Source":
        """Known fields only, each type-checked (text or null; ``folded`` a boolean)."""
        from .errors import WireError
        values = {}
        for f in fields(cls):
            if f.name not in d:
                continue
            v = d[f.name]
            ok = isinstance(v, bool) if f.name == "folded" else (v is None or isinstance(v, str))
            if not ok:
                raise WireError(f"source.{f.name}: expected {'boolean' if f.name == 'folded' else 'string'}, "
                                f"got {v!r}"[:200])
            values[f.name] = v
        return cls(**values)

    def __str__(self) -> str:
        parts = [p for p in (self.framework, self.name, self.target and f"({self.target})",
                             self.module and f"in {self.module}", self.location) if p]
        return " ".join(parts) + (" [folded]" if self.folded else "")


def freeze_attr(value: Any) -> Any:
    """Lists become tuples so nodes compare and hash by value."""
    if isinstance(value, (list, tuple)):
        return tuple(freeze_attr(v) for v in value)
    return value


def normalized_attrs(kind: str, attrs: Mapping[str, Any], out_shape: Shape) -> dict[str, Any]:
    """The registry's defaults, then ``attrs`` frozen (lists become tuples); a const's value_shape."""
    spec = REGISTRY.get(kind)
    out = dict(spec.defaults()) if spec else {}
    out.update({k: freeze_attr(v) for k, v in dict(attrs).items()})
    if kind == "const" and out.get("value_shape") is None:
        out["value_shape"] = tuple(out_shape)
    return out


def _int_tuple(values: Iterable[Any]) -> tuple[int, ...]:
    """``tuple(int(v) for v in values)``; a tuple of exact ints (the wire reader's) is kept as it is."""
    if type(values) is tuple and (not values or set(map(type, values)) == {int}):
        return values
    return tuple(int(v) for v in values)


@dataclass(frozen=True, eq=True)
class Node:
    id: int
    parents: tuple[int, ...]
    kind: str
    out_shape: Shape
    attrs: Mapping[str, Any] = field(default_factory=dict)
    dtype: str = FLOAT
    source: Source | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "parents", _int_tuple(self.parents))
        object.__setattr__(self, "out_shape", _int_tuple(self.out_shape))
        object.__setattr__(self, "attrs", normalized_attrs(self.kind, self.attrs, self.out_shape))

    @classmethod
    def from_normal_form(cls, id: int, parents: tuple[int, ...], kind: str, out_shape: Shape,
                         attrs: dict[str, Any], dtype: str = FLOAT, source: Source | None = None) -> "Node":
        """The node ``Node(id, parents, kind, out_shape, attrs, dtype, source)`` from fields already in
        the form ``__post_init__`` gives them (exact-int tuples, ``attrs`` as ``normalized_attrs`` returns
        them), without normalizing them again: the wire reader builds 10^6 nodes this way."""
        node = object.__new__(cls)
        object.__setattr__(node, "__dict__", {"id": id, "parents": parents, "kind": kind, "out_shape": out_shape,
                                              "attrs": attrs, "dtype": dtype, "source": source})
        return node

    @property
    def spec(self) -> OpSpec | None:
        return REGISTRY.get(self.kind)

    def describe(self) -> str:
        spec = self.spec
        return spec.describe(self.attrs) if spec else self.kind

    def summary(self) -> str:
        """TorchLean's node summary used inside error messages."""
        from .ops import fmt_array, fmt_shape
        return (f"Node(id={self.id}, kind={self.describe()}, parents={fmt_array(self.parents)}, "
                f"outShape={fmt_shape(self.out_shape)})")

    def with_(self, **changes: Any) -> "Node":
        """A copy with ``changes``; moving a node (id, parents, source) skips re-normalizing its attributes."""
        if changes.keys() <= {"id", "parents", "source"}:
            node = object.__new__(Node)
            for f in fields(Node):
                object.__setattr__(node, f.name, changes.get(f.name, getattr(self, f.name)))
            object.__setattr__(node, "id", int(node.id))
            object.__setattr__(node, "parents", tuple(int(p) for p in node.parents))
            return node
        return replace(self, **changes)


@dataclass(frozen=True)
class Graph:
    nodes: tuple[Node, ...]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]

    def __init__(self, nodes: Iterable[Node], inputs: Sequence[int] | None = None,
                 outputs: Sequence[int] | None = None) -> None:
        nodes = tuple(nodes)
        if inputs is None:
            inputs = tuple(n.id for n in nodes if n.kind == "input")
        if outputs is None:
            outputs = (nodes[-1].id,) if nodes else ()
        object.__setattr__(self, "nodes", nodes)
        object.__setattr__(self, "inputs", tuple(int(i) for i in inputs))
        object.__setattr__(self, "outputs", tuple(int(o) for o in outputs))
        # the smallest element limit ``check`` passed this graph under (None: not yet validated);
        # a graph is immutable, so a graph validated once stays valid (check.py reads this)
        object.__setattr__(self, "validated_under", None)
        object.__setattr__(self, "well_formed", False)  # set once check_well_formed (or check) passed it

    def __len__(self) -> int:
        return len(self.nodes)

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def __getitem__(self, i: int) -> Node:
        return self.nodes[i]

    def consumers(self) -> list[list[int]]:
        """For each node, the ids of the nodes that read it (in order, duplicates kept)."""
        users: list[list[int]] = [[] for _ in self.nodes]
        for n in self.nodes:
            for p in n.parents:
                if 0 <= p < len(users):
                    users[p].append(n.id)
        return users

    def last_use(self) -> list[int]:
        """Index of the last node reading each value (outputs live to the end)."""
        last = list(range(len(self.nodes)))
        for n in self.nodes:
            for p in n.parents:
                if 0 <= p < len(last):
                    last[p] = max(last[p], n.id)
        for o in self.outputs:
            if 0 <= o < len(last):
                last[o] = len(self.nodes)
        return last

    def ops_used(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for n in self.nodes:
            counts[n.kind] = counts.get(n.kind, 0) + 1
        return dict(sorted(counts.items()))
