"""The way out to TorchLean: cut, fold, rewrite to v1, measure what the rewrite changed, write.

``export_for_torchlean`` is ``export --to torchlean``: optionally cut the graph at a node (token models:
``input_at="embeddings"``), freeze other inputs to given values, fold constant subgraphs, rewrite every
node to its v1 form, and write the document. What was verified must be known, so the report (also in
the document's ``torchlean_bridge`` root field) lists every rewrite by kind and node with its formula,
its deviation class and the largest deviation measured on sample inputs, in float64:

* per rewritten node, the original op and its v1 form fed the *same* parent values (the node's own
  deviation, not what reaches it from upstream);
* for approximations, also the largest deviation over the interval the node's inputs span on the
  samples (a dense grid of that interval);
* per output, the end-to-end difference between the prepared graph and the v1 graph.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from torchlean_bridge.bundle import Bundle
from torchlean_bridge.errors import BridgeError
from torchlean_bridge.graph import Graph, Node
from torchlean_bridge.ops import FLOAT
from torchlean_bridge.passes.cut_at import cut_at, embeddings_node, freeze_inputs
from torchlean_bridge.payload import Payload

from .constant_fold import fold_constants

__all__ = ["export_for_torchlean", "export_torchlean", "resolve_node", "TorchleanExport", "prepare_for_torchlean"]

GRID = 4097  # points on an approximated node's input interval


@dataclass
class TorchleanExport:
    """What ``export_for_torchlean`` did: the document, the cut, what was folded, every rewrite."""

    document: dict[str, Any]
    cut: dict[str, Any] | None
    folded: list[int]
    rewrites: list[dict[str, Any]]
    by_kind: dict[str, dict[str, Any]]
    outputs: list[float]
    samples: str
    frozen: list[int] = field(default_factory=list)

    def annotations(self) -> dict[str, Any]:
        """JSON-ready (an infinite deviation, from a -inf constant written finite, is the string "inf")."""
        return _json_numbers({"cut": self.cut, "folded": self.folded, "frozen_inputs": self.frozen,
                              "samples": self.samples, "deviation_by_kind": self.by_kind,
                              "output_deviation": self.outputs})

    def lines(self) -> list[str]:
        out = []
        if self.cut:
            out.append(f"cut: node {self.cut['node']} ({self.cut['kind']} {self.cut['shape']}) is the input; "
                       f"{len(self.cut['prefix'])} node(s) before it are left to `eval --at {self.cut['node']} "
                       f"--save FILE.npy`")
        if self.frozen:
            out.append(f"inputs frozen to the given constants: {self.frozen}")
        if self.folded:
            out.append(f"folded {len(self.folded)} constant subgraph(s) into constants (nodes {_ids(self.folded)})")
        for kind, k in self.by_kind.items():
            measured = (f"; {k['note']}" if k.get("note") else "" if k["max_deviation"] is None
                        else f"; largest deviation {k['max_deviation']:.3g}")
            if k["max_deviation"] == np.inf:
                measured += " (where the op gives an infinity the form gives a finite value: see the class)"
            if k.get("interval_deviation") is not None:
                measured += f" (over the input interval {k['interval']}: {k['interval_deviation']:.3g})"
            out.append(f"rewrote {k['count']} {kind} node(s) ({_ids(k['nodes'])}) as {k['formula']}{measured}; "
                       f"deviation class: {k['deviation']}")
        if self.outputs and self.rewrites:
            out.append(f"outputs vs the graph before rewriting: largest difference "
                       f"{max(self.outputs):.3g} on {self.samples}")
        return out


def _json_numbers(value: Any) -> Any:
    if isinstance(value, float) and not np.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _json_numbers(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_numbers(v) for v in value]
    return value


def _ids(ids: Sequence[int], limit: int = 8) -> str:
    shown = ", ".join(map(str, ids[:limit]))
    return shown + (f", ... {len(ids) - limit} more" if len(ids) > limit else "")


def resolve_node(bundle: Bundle, spec: str | int) -> int:
    """A node named by id or by the preset ``embeddings``."""
    if isinstance(spec, int) or (isinstance(spec, str) and spec.isdigit()):
        nid = int(spec)
        if not 0 <= nid < len(bundle.graph):
            raise BridgeError(f"node {nid}: the graph has nodes 0..{len(bundle.graph) - 1}")
        return nid
    if spec == "embeddings":
        return embeddings_node(bundle.graph)
    raise BridgeError(f"node {spec!r}: give a node id or `embeddings`")


def prepare_for_torchlean(bundle: Bundle, input_at: str | int | None = None,
                          constants: Mapping[int, np.ndarray] | None = None
                          ) -> tuple[Bundle, dict[int, int], dict[str, Any] | None, list[int]]:
    """Cut, freeze and fold: the bundle the v1 rewrite sees, the old -> new id map, the cut, the folds."""
    ids = {n: n for n in range(len(bundle.graph))}
    cut = None
    if constants:
        bundle, note = freeze_inputs(bundle, constants)
        ids = _compose(ids, note.facts["ids"])
    if input_at is not None:
        original = resolve_node(bundle, input_at)
        node = bundle.graph.nodes[original]
        bundle, note = cut_at(bundle, original)
        inverse = {new: old for old, new in ids.items()}
        cut = {"node": inverse[original], "kind": node.kind, "shape": list(node.out_shape),
               "prefix": [inverse[n] for n in note.facts["prefix"]]}
        ids = _compose(ids, note.facts["ids"])
    bundle, note = fold_constants(bundle)
    inverse = {new: old for old, new in ids.items()}
    folded = [inverse.get(n, n) for n in note.facts.get("folded", [])]
    if note.changed:
        ids = _compose(ids, note.facts["ids"])
    return bundle, ids, cut, folded


def _compose(first: Mapping[int, int], second: Mapping[int, int]) -> dict[int, int]:
    return {old: second[mid] for old, mid in first.items() if mid in second}


def export_for_torchlean(bundle: Bundle, file: str | Path | None, inline_payload: bool = True,
                         input_at: str | int | None = None, constants: Mapping[int, np.ndarray] | None = None,
                         approximate: Mapping[str, str] | None = None,
                         samples: Sequence[Sequence[np.ndarray]] | None = None) -> TorchleanExport:
    """Write ``bundle`` as a torchlean.ir.v1 document (see the module docstring).

    ``samples``: inputs of the *given* bundle (one list of arrays per sample), used to measure the
    deviations; by default two standard-normal samples of the prepared graph's input.
    """
    from exporters.torchlean_json import export_torchlean, to_v1
    original = bundle
    prepared, ids, cut, folded = prepare_for_torchlean(bundle, input_at, constants)
    seeds, described = _samples(original, prepared, ids, samples, cut)  # checked before any rewrite work
    v1, note = to_v1(prepared, approximate)
    inverse = {new: old for old, new in ids.items()}
    rewrites = [dict(r, id=inverse.get(r["id"], r["id"]), prepared_id=r["id"]) for r in note.facts["rewrites"]]
    by_kind, outputs = _measure(prepared, v1, rewrites, seeds, approximate or {})
    report = TorchleanExport({}, cut, folded, rewrites, by_kind, outputs, described, sorted(constants or {}))
    report.document = export_torchlean(prepared, file, inline_payload=inline_payload, approximate=approximate,
                                       annotations=report.annotations())
    return report


def export_torchlean(bundle: Bundle, file: str | Path | None, inline_payload: bool = True,
                     **options: Any) -> dict[str, Any]:
    """``tlb.export_torchlean``: the document ``export_for_torchlean`` writes (constant subgraphs folded,
    every node in a v1 form, the rewrites and their measured deviations in its ``torchlean_bridge`` field);
    ``options`` are export_for_torchlean's (input_at, constants, approximate, samples)."""
    return export_for_torchlean(bundle, file, inline_payload, **options).document


def _samples(original: Bundle, prepared: Bundle, ids: Mapping[int, int], given, cut: dict[str, Any] | None
             ) -> tuple[list[np.ndarray], str]:
    """One input array per sample for the prepared graph (which has one input once it exports)."""
    from semantics.evaluate import evaluate
    g = prepared.graph
    if len(g.inputs) != 1:
        return [], "no samples (the graph does not have exactly one input)"
    target = g.inputs[0]
    if given:
        out = []
        for sample in given:
            if len(sample) != len(original.graph.inputs):
                raise BridgeError(f"--sample: give one array per graph input of the bundle "
                                  f"({len(original.graph.inputs)}), got {len(sample)}")
            if cut is not None:
                out.append(evaluate(original.graph, original.payload, list(sample), all_nodes=True)[cut["node"]])
            else:
                source = next(old for old, new in ids.items() if new == target)
                out.append(list(sample)[list(original.graph.inputs).index(source)])
        return [np.asarray(x, dtype=np.float64) for x in out], f"{len(out)} given sample(s)"
    if g.nodes[target].dtype != FLOAT:
        return [], "no samples (the input is not float)"
    rng = np.random.default_rng(0)
    return ([rng.standard_normal(g.nodes[target].out_shape) for _ in range(2)],
            "2 standard-normal samples (give --sample for the model's own inputs)")


def _measure(prepared: Bundle, v1: Bundle, rewrites: list[dict[str, Any]], seeds: list[np.ndarray],
             approximate: Mapping[str, str]) -> tuple[dict[str, dict[str, Any]], list[float]]:
    from semantics.evaluate import evaluate
    g = prepared.graph
    try:
        tables = [evaluate(g, prepared.payload, [x], all_nodes=True) for x in seeds]
    except BridgeError as e:  # the samples are outside the model's domain (a log of a negative, ...)
        tables, seeds = [], []
        for r in rewrites:
            r["max_deviation"] = None
        unmeasured = f"not measured: the samples cannot be evaluated ({str(e).splitlines()[0][:200]})"
        return {r["kind"]: {"count": sum(x["kind"] == r["kind"] for x in rewrites),
                            "nodes": [x["id"] for x in rewrites if x["kind"] == r["kind"]], "formula": r["formula"],
                            "deviation": r["deviation"], "max_deviation": None, "note": unmeasured}
                for r in rewrites}, []
    by_kind: dict[str, dict[str, Any]] = {}
    for r in rewrites:
        node = g.nodes[r["prepared_id"]]
        worst = _local_deviation(prepared, node, [[t[p] for p in node.parents] for t in tables], approximate)
        r["max_deviation"] = worst
        k = by_kind.setdefault(r["kind"], {"count": 0, "nodes": [], "formula": r["formula"],
                                           "deviation": r["deviation"], "max_deviation": None})
        k["count"] += 1
        k["nodes"].append(r["id"])
        if worst is not None:
            k["max_deviation"] = worst if k["max_deviation"] is None else max(k["max_deviation"], worst)
        if r["approximation"] is not None and tables:
            lo = min(float(np.min(t[node.parents[0]])) for t in tables)
            hi = max(float(np.max(t[node.parents[0]])) for t in tables)
            grid = _unary_deviation(node, np.linspace(lo, hi, GRID), approximate)
            k["interval"] = [lo, hi]
            k["interval_deviation"] = max(k.get("interval_deviation") or 0.0, grid)
    outputs = []
    for x, table in zip(seeds, tables):
        theirs = evaluate(v1.graph, v1.payload, [x])
        outputs.extend(float(np.max(np.abs(table[o] - t), initial=0.0)) for o, t in zip(g.outputs, theirs))
    worst_outputs = [max(outputs[i::len(g.outputs)]) for i in range(len(g.outputs))] if outputs else []
    return by_kind, worst_outputs


def _local_deviation(prepared: Bundle, node: Node, parent_values: list[list[np.ndarray]],
                     approximate: Mapping[str, str]) -> float | None:
    """max |op(parents) - v1 form(parents)| over the samples, both fed the same parent values.

    The node and its form are built once as a small graph of their own and evaluated per sample.
    """
    from semantics.evaluate import evaluate
    from torchlean_bridge.passes.v1_rewrite import rewrite_to_v1
    if not parent_values:
        return None
    nodes, inputs, fed = [], [], []
    record = {}
    for i, p in enumerate(node.parents):
        parent = prepared.graph.nodes[p]
        if parent.kind == "const":
            nodes.append(Node(i, (), "const", parent.out_shape, dict(parent.attrs), dtype=parent.dtype))
            record[i] = prepared.payload.record(p)
        else:
            nodes.append(Node(i, (), "input", parent.out_shape, dtype=parent.dtype))
            inputs.append(i)
            fed.append(i)
    k = len(nodes)
    nodes.append(node.with_(id=k, parents=tuple(range(k))))
    if node.id in prepared.payload:
        record[k] = prepared.payload.record(node.id)
    mini = Bundle(Graph(nodes, inputs, [k]), Payload(record))
    rewritten, _ = rewrite_to_v1(mini, approximate)
    worst = 0.0
    for values in parent_values:
        feed = [values[i] for i in fed]
        ours = evaluate(mini.graph, mini.payload, feed)[0]
        try:
            theirs = evaluate(rewritten.graph, rewritten.payload, feed)[0]
        except BridgeError:  # the form fails where the op gives a value (v1 log at 0, ...): the class says so
            return float("inf")
        with np.errstate(invalid="ignore"):
            diff = np.abs(np.asarray(ours, dtype=np.float64) - np.asarray(theirs, dtype=np.float64))
        same = (ours == theirs) | (np.isnan(ours) & np.isnan(theirs))
        worst = max(worst, float(np.max(np.where(same, 0.0, np.nan_to_num(diff, nan=np.inf)), initial=0.0)))
    return worst


def _unary_deviation(node: Node, grid: np.ndarray, approximate: Mapping[str, str]) -> float:
    from semantics.evaluate import evaluate
    from torchlean_bridge.passes.v1_rewrite import rewrite_to_v1
    mini = Bundle(Graph([Node(0, (), "input", grid.shape), Node(1, (0,), node.kind, grid.shape, dict(node.attrs))],
                        [0], [1]))
    v1, _ = rewrite_to_v1(mini, approximate)
    ours = evaluate(mini.graph, mini.payload, [grid])[0]
    theirs = evaluate(v1.graph, v1.payload, [grid])[0]
    return float(np.max(np.abs(ours - theirs), initial=0.0))
