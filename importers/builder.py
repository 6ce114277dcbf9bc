"""The graph builder every importer shares: nodes, payload, role bindings, folding, broadcasting.

Importers declare the shapes the framework reported; the builder computes the registry's rule for
every node too and records any disagreement in the report, so validation (not the importer) is
the judge. ``finish`` runs the shared passes (dead code and renumbering, canonicalization) so every
importer emits the same canonical IR.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from semantics.narrow import widen

from torchlean_bridge.bundle import Bundle
from torchlean_bridge.check import DEFAULT_MAX_ELEMENTS, check_size
from torchlean_bridge.errors import BridgeError, ShapeRuleError
from torchlean_bridge.graph import Graph, Node, Source, normalized_attrs
from torchlean_bridge.ops import BOOL, FLOAT, INT64, REGISTRY, Shape, fmt_shape
from torchlean_bridge.ops.contracts import broadcast_shapes
from torchlean_bridge.payload import Payload
from torchlean_bridge.roles import Binding, RoleMap

__all__ = ["GraphBuilder", "element_type_of"]


def element_type_of(array: np.ndarray) -> str:
    kind = np.asarray(array).dtype.kind
    if kind == "b":
        return BOOL
    if kind in "iu":
        return INT64
    return FLOAT


class GraphBuilder:
    def __init__(self, framework: str, max_elements: int = DEFAULT_MAX_ELEMENTS) -> None:
        self.framework = framework
        self.max_elements = max_elements
        self.nodes: list[Node] = []
        self.payload = Payload()
        self.bindings: list[Binding] = []
        self.values: dict[int, np.ndarray] = {}  # import-time known values (const nodes)
        self.inputs: list[int] = []
        self.notes: list[str] = []

    # -- queries ------------------------------------------------------------------------------
    def shape(self, nid: int) -> Shape:
        return self.nodes[nid].out_shape

    def dtype(self, nid: int) -> str:
        return self.nodes[nid].dtype

    def value(self, nid: int) -> np.ndarray | None:
        """The value of a node known at import time (a const), else None."""
        return self.values.get(nid)

    # -- construction -------------------------------------------------------------------------
    def _source(self, source: Source | Mapping[str, Any] | None) -> Source | None:
        if source is None or isinstance(source, Source):
            return source
        return Source(framework=self.framework, **dict(source))

    def add(self, kind: str, parents: Sequence[int], attrs: Mapping[str, Any] | None = None, *,
            shape: Sequence[int] | None = None, dtype: str | None = None,
            source: Source | Mapping[str, Any] | None = None) -> int:
        """Append a node. The shape is the registry rule's unless the framework declared one."""
        spec = REGISTRY.get(kind)
        if spec is None:
            raise BridgeError(f"builder: unknown op kind `{kind}`")
        nid = len(self.nodes)
        src = self._source(source)
        probe_shape = tuple(int(d) for d in shape) if shape is not None else ()
        node_attrs = normalized_attrs(kind, attrs or {}, probe_shape)
        parent_shapes = [self.nodes[p].out_shape for p in parents]
        parent_types = [self.nodes[p].dtype for p in parents]
        try:
            inferred = tuple(spec.infer(node_attrs, parent_shapes, probe_shape))
            etype = spec.element_type(node_attrs, parent_types, dtype or FLOAT)
        except ShapeRuleError as e:
            raise BridgeError(f"{self.framework} import: node {nid} ({kind}"
                              f"{', ' + str(src) if src else ''}): {e.message}", node=nid, op=kind,
                              source=str(src) if src else None) from None
        declared = tuple(shape) if shape is not None else inferred
        if declared != inferred:
            self.notes.append(f"node {nid} ({kind}): framework shape {fmt_shape(declared)} differs from the rule's "
                              f"{fmt_shape(inferred)}")
        check_size(declared, self.max_elements, f"{self.framework} import: node {nid} ({kind})")
        if kind == "const" and (attrs or {}).get("value_shape") is None:
            node_attrs["value_shape"] = declared
        self.nodes.append(Node(nid, parents, kind, declared, node_attrs, dtype=dtype or etype, source=src))
        return nid

    def input(self, shape: Sequence[int], dtype: str = FLOAT,
              source: Source | Mapping[str, Any] | None = None) -> int:
        nid = self.add("input", [], shape=shape, dtype=dtype, source=source)
        self.inputs.append(nid)
        return nid

    def const(self, value: Any, *, key: str | None = None, transform: str | None = None,
              source: Source | Mapping[str, Any] | None = None, folded: bool = False) -> int:
        """A const node holding ``value``; ``key`` binds an external tensor name to it."""
        arr = widen(value)  # narrow types (float16, bfloat16, float8, int4...) exactly as float32 / int64
        if arr.dtype.kind == "f":
            arr = arr.astype(np.float64) if arr.dtype.itemsize > 4 else arr
        elif arr.dtype.kind in "iu":
            arr = arr.astype(np.int64)
        src = self._source(source)
        if folded:
            src = Source(**{**(src.to_json() if src else {"framework": self.framework}), "folded": True})
        nid = self.add("const", [], {"value_shape": arr.shape}, shape=arr.shape, dtype=element_type_of(arr),
                       source=src)
        self.payload.set(nid, "values", arr)
        self.values[nid] = arr
        if key is not None:
            self.bind(key, nid, "values", transform)
        return nid

    def param(self, nid: int, role: str, value: Any, *, key: str | None = None,
              transform: str | None = None) -> None:
        """Store a payload tensor for a node, bound to the external name it came from."""
        self.payload.set(nid, role, widen(value))
        if key is not None:
            self.bind(key, nid, role, transform)

    def bind(self, key: str, nid: int, role: str, transform: str | None = None) -> None:
        self.bindings.append(Binding(key, nid, role, transform))

    # -- conveniences shared by importers -----------------------------------------------------
    def reshape(self, nid: int, shape: Sequence[int], source: Any = None) -> int:
        shape = tuple(shape)
        if self.shape(nid) == shape:
            return nid
        return self.add("reshape", [nid], {"in_shape": self.shape(nid), "out_shape": shape}, source=source)

    def broadcast(self, nid: int, shape: Sequence[int], source: Any = None) -> int:
        """Explicit broadcasting: ``broadcast_to`` (v1 right-aligned rule) when shapes differ."""
        shape = tuple(shape)
        if self.shape(nid) == shape:
            return nid
        return self.add("broadcast_to", [nid], {"from_shape": self.shape(nid), "to_shape": shape}, source=source)

    def elementwise(self, kind: str, operands: Sequence[int], source: Any = None,
                    shape: Sequence[int] | None = None) -> int:
        """A binary/ternary elementwise op with its operands broadcast explicitly to one shape."""
        target: Shape = self.shape(operands[0])
        for o in operands[1:]:
            try:
                target = broadcast_shapes(target, self.shape(o), kind)
            except ShapeRuleError as e:
                raise BridgeError(f"{self.framework} import: {e.message}", op=kind,
                                  source=str(self._source(source) or "")) from None
        ops = [self.broadcast(o, target, source) for o in operands]
        return self.add(kind, ops, shape=shape, source=source)

    # -- result -------------------------------------------------------------------------------
    def finish(self, outputs: Sequence[int], report: Mapping[str, Any] | None = None,
               keep_dead: bool = False, canonical: bool = True) -> Bundle:
        """The bundle in canonical form (torchlean_bridge.passes), then checked: dead nodes dropped
        (inputs stay; all kept with ``keep_dead``), ids dense, ``x @ W + b`` as ``linear``, layout
        steps in their one spelling, repeated computations merged (unless ``canonical=False``: the
        graph exactly as built, for tests of one kind's rules)."""
        from torchlean_bridge.check import check
        from torchlean_bridge.passes import (canonicalize, eliminate_common_subexpressions, eliminate_dead_code,
                                             fuse_linear_bias)
        full_report = dict(report or {})
        full_report.setdefault("framework", self.framework)
        bundle = Bundle(Graph(self.nodes, self.inputs, outputs), self.payload, RoleMap(self.bindings), full_report)
        if not keep_dead:
            bundle, _ = eliminate_dead_code(bundle)
        if canonical and not keep_dead:
            bundle, _ = fuse_linear_bias(bundle)
            bundle, _ = canonicalize(bundle)
            bundle, _ = eliminate_common_subexpressions(bundle)
        notes = list(bundle.report.get("notes", [])) + self.notes + _semantic_notes(bundle.graph, self.framework)
        if notes:
            bundle = Bundle(bundle.graph, bundle.payload, bundle.roles, {**bundle.report, "notes": notes})
        check(bundle.graph)
        return bundle


def _semantic_notes(g: Graph, framework: str) -> list[str]:
    """Where the IR's TorchLean semantics differ from the framework's on some inputs, said once per
    import (the graph is still exact wherever the framework's own result is defined alike)."""
    source = {"fx": "torch", "export": "torch"}.get(framework, framework)
    if source in ("onnx", "torch") and any(n.kind == "sqrt" for n in g):
        ids = [n.id for n in g if n.kind == "sqrt"]
        shown = ", ".join(map(str, ids[:5])) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")
        return [f"sqrt (node{'s' if len(ids) > 1 else ''} {shown}): TorchLean's sqrt is sqrt(max(x, 0)), so a "
                f"negative argument gives 0 where {source} gives NaN; the values agree wherever the argument "
                "is >= 0"]
    return []
