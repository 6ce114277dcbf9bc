"""Differential testing: our reference semantics against PyTorch, onnxruntime or onnx's reference
evaluator, node by node, locating the first divergence.

Values are matched through the provenance recorded at import (``Source.name`` = FX / torch.export
node name, ``Source.tensor`` = ONNX tensor name); an IR node with no counterpart (an expanded
broadcast, the inner half of a fused op) is reported as such, never guessed. Each node's tolerance
comes from our own float32-vs-float64 gap at that node (with a floor), not from one global number:
the framework computes in float32, so an error well beyond what float32 rounding did to *our*
evaluation of the same node is a real divergence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Hashable

import numpy as np

from ..bundle import Bundle
from ..errors import BridgeError, EvalError
from ..graph import Graph, Node
from ..ops import BOOL, INT64
from ..report import Finding, Report
from ..roles import apply_transform
from semantics.evaluate import input_sets

__all__ = ["diff", "DiffReport", "NodeDiff", "make_inputs", "match_nodes", "ulp_distance",
           "feeding_keys", "provenance", "AGAINST"]

AGAINST = ("torch", "onnxruntime", "reference-evaluator", "plan")

# budget = max(SAFETY * (our float32 - float64 gap), FLOOR_ULPS float32 ulps of the node's scale)
SAFETY = 16.0
FLOOR_ULPS = 64
EPS32 = float(np.finfo(np.float32).eps)
TINY = float(np.finfo(np.float32).tiny)

# ops through which an int64 input keeps its meaning as an index (for choosing a valid range)
_INDEX_PASSTHROUGH = {"reshape", "squeeze", "unsqueeze", "flatten", "expand", "broadcast_to", "slice",
                      "detach", "permute", "transpose", "concat"}
_EDGE_VALUES = np.array([0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 1e-3, -1e-3, 10.0, -10.0, 1e-7, -3.0])
_KINDS = ("normal", "uniform", "zeros", "edge")


# -- inputs -----------------------------------------------------------------------------------

def _index_bound(g: Graph, nid: int, consumers: list[list[int]]) -> int | None:
    """The number of rows a gather reads through this int64 value (smallest over all gathers)."""
    bound, stack, seen = None, [nid], {nid}
    while stack:
        v = stack.pop()
        for c in consumers[v]:
            node = g.nodes[c]
            if node.kind == "gather" and len(node.parents) == 2 and node.parents[1] == v:
                rows = g.nodes[node.parents[0]].out_shape[node.attrs["axis"]]
                bound = rows if bound is None else min(bound, rows)
            elif node.kind in _INDEX_PASSTHROUGH and c not in seen:
                seen.add(c)
                stack.append(c)
    return bound


def make_inputs(g: Graph, count: int, seed: int = 0) -> list[tuple[str, list[np.ndarray]]]:
    """``count`` labelled input sets: normal, uniform(-1, 1), zeros, edge values, then normal/uniform.

    int64 inputs feeding a gather take indices in its range (else small non-negative values), bool
    inputs are fair coins.
    """
    rng = np.random.default_rng(seed)
    consumers = g.consumers()
    bounds = {i: _index_bound(g, i, consumers) for i in g.inputs if g.nodes[i].dtype == INT64}
    sets = []
    for k in range(count):
        kind = _KINDS[k] if k < len(_KINDS) else _KINDS[k % 2]
        arrays = []
        for i in g.inputs:
            node = g.nodes[i]
            shape = node.out_shape
            if node.dtype == INT64:
                hi = bounds[i] or 4
                if kind == "zeros":
                    arrays.append(np.zeros(shape, np.int64))
                elif kind == "edge":
                    arrays.append(np.resize(np.array([0, hi - 1], np.int64), shape))
                else:
                    arrays.append(rng.integers(0, hi, size=shape, dtype=np.int64))
            elif node.dtype == BOOL:
                arrays.append(np.zeros(shape, bool) if kind == "zeros" else rng.random(shape) < 0.5)
            elif kind == "normal":
                arrays.append(rng.standard_normal(shape))
            elif kind == "uniform":
                arrays.append(rng.uniform(-1.0, 1.0, shape))
            elif kind == "zeros":
                arrays.append(np.zeros(shape))
            else:
                arrays.append(np.resize(rng.permutation(_EDGE_VALUES), shape).astype(np.float64))
        sets.append((kind, arrays))
    return sets


def _given_inputs(g: Graph, inputs: Any) -> list[tuple[str, list[np.ndarray]]]:
    """Inputs as the user gave them: one set (list in graph-input order, or one array), or a list of sets."""
    return [(f"input {k}", one) for k, one in enumerate(input_sets(g, inputs, "diff"))]


# -- matching ---------------------------------------------------------------------------------

# which recorded provenance a runner's keys are: Source.framework values accepted, and the field
_PROVENANCE = {"fx": ({"fx", "torch"}, "name"), "export": ({"export", "torch"}, "name"),
               "onnx": ({"onnx"}, "tensor")}


def _source_key(node: Node, framework: str) -> str | None:
    frameworks, field_name = _PROVENANCE[framework]
    src = node.source
    if src is None or src.framework not in frameworks:
        return None
    return getattr(src, field_name)


def match_nodes(g: Graph, framework: str) -> tuple[dict[int, str], dict[int, str]]:
    """IR node -> framework key through provenance, and the reason each other node has none.

    ``framework`` is ``fx``, ``export`` (keys: node names) or ``onnx`` (keys: tensor names); only
    provenance recorded by that framework's import counts, so equal spellings never match by accident.

    When several IR nodes carry one key (an importer lowered one framework op into several IR
    nodes), the last of them produces the framework's value; the others have no counterpart.
    """
    owner: dict[str, int] = {}
    for n in g.nodes:
        key = _source_key(n, framework)
        if key is not None:
            owner[key] = n.id
    matched, unmatched = {}, {}
    for n in g.nodes:
        key = _source_key(n, framework)
        if key is None and n.source is not None and n.source.framework in _PROVENANCE[framework][0]:
            unmatched[n.id] = "inserted by the importer: the framework has no value for it"
        elif key is None:
            origin = n.source.framework if n.source and n.source.framework else "unknown origin"
            unmatched[n.id] = f"no {framework} provenance ({origin} node)"
        elif owner[key] != n.id:
            unmatched[n.id] = f"part of the lowering of {key} (node {owner[key]} holds its value)"
        else:
            matched[n.id] = key
    return matched, unmatched


def _match_folded_onnx(g: Graph, oracle: Any, matched: dict[int, str], unmatched: dict[int, str]) -> None:
    """A node the ONNX importer folded records the ONNX node it came from, not a tensor: when that
    node has one output no other IR node holds, the oracle's value of it is this node's value."""
    held = set(matched.values())
    outputs = getattr(oracle, "node_outputs", {})
    for nid in list(unmatched):
        src = g.nodes[nid].source
        if src is not None and src.framework == "onnx" and src.folded and src.name:
            outs = outputs.get(src.name, [])
            if len(outs) == 1 and outs[0] not in held:
                matched[nid] = outs[0]
                held.add(outs[0])
                del unmatched[nid]


def feeding_keys(bundle: Bundle, nid: int) -> list[str]:
    """Checkpoint keys bound to the node, then to its ancestors (nearest first)."""
    g = bundle.graph
    seen, order, frontier = {nid}, [nid], [nid]
    while frontier:
        nxt = []
        for v in frontier:
            for p in g.nodes[v].parents:
                if p not in seen:
                    seen.add(p)
                    nxt.append(p)
        order.extend(sorted(nxt, reverse=True))
        frontier = nxt
    keys: list[str] = []
    for v in order:
        for b in bundle.roles.for_node(v):
            if b.key not in keys:
                keys.append(b.key)
    return keys


# -- comparison -------------------------------------------------------------------------------

def ulp_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elementwise distance in float32 ulps (both rounded to float32; NaN against a number is huge)."""
    def ordered(x: np.ndarray) -> np.ndarray:
        bits = np.asarray(x, dtype=np.float32, order="C").view(np.int32).astype(np.int64)
        return np.where(bits < 0, -(bits & 0x7FFFFFFF), bits)

    with np.errstate(invalid="ignore", over="ignore"):
        d = np.abs(ordered(a) - ordered(b)).astype(np.float64)
    both_nan = np.isnan(a) & np.isnan(b)
    one_nan = np.isnan(a) ^ np.isnan(b)
    return np.where(both_nan, 0.0, np.where(one_nan, np.inf, d))


def ulp64_distance(a: np.ndarray, b: np.ndarray) -> float:
    """The largest distance in float64 ulps (steps between representable doubles, +0 and -0 one
    apart) between two float64 arrays; NaN against NaN is 0, NaN against a number inf."""
    a, b = np.asarray(a, np.float64).reshape(-1), np.asarray(b, np.float64).reshape(-1)
    if a.size == 0:
        return 0.0

    def ordered(x: np.ndarray) -> np.ndarray:  # monotone in the value: -0.0 -> -1, +0.0 -> 0
        bits = np.ascontiguousarray(x).view(np.int64)
        return np.where(bits < 0, -(bits & 0x7FFFFFFFFFFFFFFF) - 1, bits)

    oa, ob = ordered(a), ordered(b)
    with np.errstate(invalid="ignore", over="ignore"):
        same_sign = (oa < 0) == (ob < 0)  # the int64 difference is exact; across signs it could overflow
        d = np.where(same_sign, np.abs(np.where(same_sign, oa - ob, 0)).astype(np.float64),
                     np.abs(oa.astype(np.float64)) + np.abs(ob.astype(np.float64)))
    d = np.where(np.isnan(a) & np.isnan(b), 0.0, np.where(np.isnan(a) | np.isnan(b), np.inf, d))
    return float(d.max())


@dataclass
class NodeDiff:
    """One compared value (a node or a model output), aggregated over every input set."""

    node: int
    op: str
    counterpart: str | None
    source: str = ""
    max_abs: float = 0.0
    max_rel: float = 0.0
    max_ulp: float = 0.0
    budget: float = 0.0
    gap32: float = 0.0
    worst_ratio: float = 0.0  # max over inputs of error / budget
    diverged_on: str | None = None  # label of the first input set where it diverged
    problem: str | None = None  # shape mismatch, missing value, ...
    status: str = "ok"  # ok | diverged | downstream | no counterpart
    output: int | None = None  # output position, for output rows
    exact_ulps: float | None = None  # default float64 vs the exact mode, float64 ulps (0: bit-identical)
    via: str | None = None  # how the oracle's value was obtained when not read directly (finer oracle)
    exceeded: int = 0  # input sets on which the error exceeded the budget
    worst_on: str | None = None  # the input set with the largest error / budget

    @property
    def diverged(self) -> bool:
        return self.status in ("diverged", "downstream")

    def to_json(self) -> dict[str, Any]:
        d = {"node": self.node, "op": self.op, "counterpart": self.counterpart, "status": self.status,
             "max_abs": self.max_abs, "max_rel": self.max_rel, "max_ulp": self.max_ulp, "budget": self.budget,
             "float32_gap": self.gap32}
        d["exceeded"] = self.exceeded
        for k in ("output", "diverged_on", "worst_on", "problem", "exact_ulps", "via"):
            if getattr(self, k) is not None:
                d[k] = getattr(self, k)
        if self.source:
            d["source"] = self.source
        return d


def _align(actual: np.ndarray, shape: tuple[int, ...]) -> np.ndarray | None:
    """The framework value in the node's shape: equal, or differing only by size-1 axes."""
    if tuple(actual.shape) == shape:
        return actual
    if actual.size == math.prod(shape) and [d for d in actual.shape if d != 1] == [d for d in shape if d != 1]:
        return actual.reshape(shape)
    return None


def _compare(row: NodeDiff, label: str, actual: np.ndarray | None, ref64: np.ndarray, ours32: np.ndarray,
             scale: float, integral: bool) -> None:
    """Fold one input set's comparison into ``row``."""
    aligned = None if actual is None else _align(np.asarray(actual), tuple(ref64.shape))
    if aligned is None:
        row.problem = row.problem or ("the framework produced no value" if actual is None else
                                      f"shape {list(np.shape(actual))} vs ours {list(ref64.shape)}")
        row.diverged_on = row.diverged_on or label
        if row.worst_ratio < math.inf:
            row.worst_on = label
        row.worst_ratio = math.inf
        row.exceeded += 1
        return
    if ref64.size == 0:
        return
    a = aligned.astype(np.float64)
    r = ref64.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.abs(a - r)
        err = np.where((np.isnan(a) & np.isnan(r)) | (a == r), 0.0, np.where(np.isnan(err), np.inf, err))
        max_abs = float(err.max())
        rel_den = np.maximum(np.abs(r), max(scale * EPS32, TINY))
        max_rel = float((err / rel_den).max())
    if integral:
        budget, gap = 0.0, 0.0
    else:
        o = ours32.astype(np.float64)
        with np.errstate(invalid="ignore"):  # equal infinities (a -inf mask fill) are no gap
            gap = float(np.where(o == r, 0.0, np.nan_to_num(np.abs(o - r), nan=np.inf)).max())
        budget = max(SAFETY * gap, FLOOR_ULPS * EPS32 * scale, TINY)
    row.max_abs = max(row.max_abs, max_abs)
    row.max_rel = max(row.max_rel, max_rel)
    row.max_ulp = max(row.max_ulp, 0.0 if integral else float(ulp_distance(a, r).max()))
    row.budget = max(row.budget, budget)
    row.gap32 = max(row.gap32, gap)
    ratio = math.inf if budget == 0.0 and max_abs > 0 else (max_abs / budget if budget else 0.0)
    if ratio > row.worst_ratio or row.worst_on is None:
        row.worst_on = label
    row.worst_ratio = max(row.worst_ratio, ratio)
    if ratio > 1.0:
        row.exceeded += 1
        row.diverged_on = row.diverged_on or label


_SCALE_REACH = 64  # nodes looked at behind one compared node


def _scale(g: Graph, nid: int, ref: dict[Hashable, np.ndarray], compared: Collection[int],
           mags: dict[int, float | None]) -> float:
    """Magnitude the node's rounding error is relative to: its value, its parents' and its
    grandparents' values (an error a parent hands on was made at the parent's own scale: a product
    that cancels to 1e-13 carries the rounding of its 1e-4 operands, and an add of it inherits that),
    and further back through nodes whose value the framework does not show (no counterpart).
    ``mags`` caches max |value| per node for one input."""
    def mag(v: int) -> float | None:
        if v not in mags:
            a = ref[v]
            finite = np.abs(a[np.isfinite(a)].astype(np.float64)) if a.dtype.kind == "f" else None
            mags[v] = float(np.max(finite)) if finite is not None and finite.size else None  # a -inf fill sets none
        return mags[v]
    found = [mag(nid)]
    stack, seen = [(p, 1) for p in g.nodes[nid].parents], set()
    while stack and len(seen) < _SCALE_REACH:
        p, depth = stack.pop()
        if p in seen:
            continue
        seen.add(p)
        found.append(mag(p))
        if depth < 2 or p not in compared:
            stack.extend((q, depth + 1) for q in g.nodes[p].parents)
    return max((m for m in found if m is not None), default=1.0)


# -- the report -------------------------------------------------------------------------------

def _fmt(x: float) -> str:
    if x == 0:
        return "0"
    if math.isinf(x):
        return "inf"
    return f"{x:.3g}" if 1e-3 <= abs(x) < 1e4 else f"{x:.2e}"


@dataclass
class DiffReport(Report):
    """Per-node and per-output errors against one oracle, and the first divergent node."""

    against: str = ""
    inputs: list[str] = field(default_factory=list)
    nodes: list[NodeDiff] = field(default_factory=list)
    outputs: list[NodeDiff] = field(default_factory=list)
    first_divergence: Finding | None = None
    reduced: dict[str, Any] | None = None  # what diff --reduce wrote (reduced.json)

    @property
    def coverage(self) -> dict[str, Any]:
        """How many IR nodes were compared (read from the oracle directly, or through the finer oracle),
        and how many were not, counted per reason."""
        direct = sum(r.status != "no counterpart" and r.via is None for r in self.nodes)
        finer = sum(r.status != "no counterpart" and r.via is not None for r in self.nodes)
        reasons: dict[str, int] = {}
        for r in self.nodes:
            if r.status == "no counterpart":
                reason = (r.problem or "no counterpart").split(";")[-1].strip()
                reasons[reason] = reasons.get(reason, 0) + 1
        return {"compared": direct + finer, "nodes": len(self.nodes), "direct": direct, "finer": finer,
                "outputs": len(self.outputs), "not_compared": reasons}

    def coverage_line(self) -> str:
        """``compared N of M IR nodes (D read from the oracle, F by the finer oracle)``."""
        c = self.coverage
        return (f"compared {c['compared']} of {c['nodes']} IR nodes ({c['direct']} read from the oracle, "
                f"{c['finer']} by the finer oracle) and {c['outputs']} output(s)")

    def _verdict(self) -> str:
        """Never a plain 'agree' over fewer nodes than the graph has."""
        if self.first_divergence is not None:
            return f"DIVERGED: {self.first_divergence.message}"
        if not self.ok:
            return "FAILED"
        c = self.coverage
        if c["compared"] == 0:
            return "outputs agree (only the outputs were compared)"
        if c["compared"] < c["nodes"]:
            return f"agree on the {c['compared']} of {c['nodes']} nodes compared (and the outputs)"
        return f"agree at every node ({c['nodes']} of {c['nodes']})"

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data (for renderers): ``to_json()``, coverage included."""
        return self.to_json()

    def _extra_json(self) -> dict:
        return {"against": self.against, "inputs": self.inputs, "coverage": self.coverage,
                "tolerance": {"safety": SAFETY, "floor_ulps": FLOOR_ULPS},
                "first_divergence": self.first_divergence.to_json() if self.first_divergence else None,
                "outputs": [r.to_json() for r in self.outputs], "nodes": [r.to_json() for r in self.nodes]}

    def summary(self) -> str:
        verdict = self._verdict()
        if len(self.inputs) <= 6:
            listed = ", ".join(self.inputs)
        else:  # counts per kind, e.g. "23 normal, 23 uniform, 1 zeros, 1 edge"
            kinds = [label.partition("(")[2].rstrip(")") or "given" for label in self.inputs]
            listed = ", ".join(f"{kinds.count(k)} {k}" for k in dict.fromkeys(kinds))
            if kinds == ["given"] * len(kinds):
                listed = f"{self.inputs[0]} .. {self.inputs[-1]}"
        exact = [r for r in self.nodes if r.exact_ulps is not None]
        same = sum(r.exact_ulps == 0 for r in exact)
        vs_exact = (f"\n  default float64 vs exact mode (TorchLean's fold orders and libm): {same} of {len(exact)} "
                    f"node(s) bit-identical" + (f", at most {_fmt(max(r.exact_ulps for r in exact))} ulps apart"
                                                 if same < len(exact) else "")) if exact else ""
        c = self.coverage
        if self.reduced is not None:
            how = self.reduced["reproduce"] or "compare with expected.npy (onnxruntime agrees with our IR there)"
            vs_exact += f"\n  reduced to {self.reduced['nodes']} node(s); reproduce: {how}"
        missing = "".join(f"\n  not compared: {n} node(s): {reason}" for reason, n in c["not_compared"].items())
        return (f"{self.title}: {verdict}\n  {self.coverage_line()}{missing}\n  {len(self.inputs)} input set(s): {listed}; "
                f"budget per node = max({SAFETY:g} x our float32 gap, {FLOOR_ULPS} float32 ulps){vs_exact}")

    def __str__(self) -> str:
        from .output import diff_text  # the one rendering layer
        return diff_text(self, all_nodes=True)


# -- the engine -------------------------------------------------------------------------------

def _oracle(bundle: Bundle, against: str, module: Any, onnx_model: Any,
            example: list[np.ndarray]) -> tuple[Any, str | dict[int, str]]:
    """The runner to compare with, and how its keys match nodes: a provenance tag (``fx``, ``export``,
    ``onnx``) or, for our own ONNX export, the exact node -> tensor map the exporter made."""
    from . import diff_runners as R
    if against == "torch":
        if module is None:
            raise BridgeError("diff against torch needs the reference module (module=...)")
        import torch.fx
        from torch.export import ExportedProgram
        if isinstance(module, ExportedProgram):
            return R.TorchExportRunner(module, example), "export"
        if isinstance(module, torch.fx.GraphModule) or bundle.report.get("framework") != "export":
            runner = R.TorchFXRunner(module)
            if not runner.traced:  # the FX importer lowers such a module through torch.export: so do we
                try:
                    runner = R.TorchExportRunner(module, example)
                    runner.name = "torch (export; symbolic tracing fails on this module)"
                except BridgeError:
                    pass  # outputs only
            return runner, "fx"
        return R.TorchExportRunner(module, example, decompose=bool(bundle.report.get("decomposed"))), "export"
    runner_cls = R.OnnxRuntimeRunner if against == "onnxruntime" else R.OnnxReferenceRunner
    if onnx_model is not None:
        runner = runner_cls(onnx_model)
        from exporters.onnx import node_value_names
        annotated = node_value_names(runner.source)
        if annotated is not None and annotated[1] == [n.kind for n in bundle.graph.nodes]:
            runner.name += " (our ONNX export of this graph)"  # matched through its node annotation
            return runner, {i: name for i, name in enumerate(annotated[0]) if name is not None}
        return runner, "onnx"
    from exporters.onnx import to_onnx_model
    own = to_onnx_model(bundle, expose_all_nodes=True)  # graph output i is node i's value
    names = {i: o.name for i, o in enumerate(own.graph.output)}
    runner = runner_cls(own)
    runner.name += " (our ONNX export)"
    runner.output_keys = [names[o] for o in bundle.graph.outputs]
    return runner, names


def _reference_tensors(bundle: Bundle, reference: Any) -> tuple[dict[tuple[int, str], tuple[str, np.ndarray]],
                                                                 list[Finding]]:
    """The reference's own tensors by the (node, role) they are bound to, transform applied."""
    from .diff_runners import reference_parameters
    params = reference_parameters(reference) if reference is not None else {}
    expected: dict[tuple[int, str], tuple[str, np.ndarray]] = {}
    findings: list[Finding] = []
    for b in bundle.roles.bindings():
        if b.key not in params:
            continue
        try:
            tensor = apply_transform(b.transform, params[b.key])  # an index table stays integral
            expected[(b.node, b.role)] = (b.key, tensor.astype(np.float64) if tensor.dtype.kind == "f" else tensor)
        except (BridgeError, ValueError) as e:
            findings.append(Finding("parameter-mismatch", f"{b.key}: cannot apply transform {b.transform!r}: {e}",
                                    node=b.node, keys=(b.key,)))
    return expected, findings


def _parameter_findings(bundle: Bundle, reference: Any) -> list[Finding]:
    """Payload tensors compared with the reference's own tensors of the same name (via the role map).

    A value that differs from its key's tensor but equals another key's tensor names both keys.
    """
    expected, findings = _reference_tensors(bundle, reference)
    candidates = list(expected.values())
    named_pairs: set[frozenset[str]] = set()
    for (nid, role), (key, want) in expected.items():
        have = bundle.payload.get(nid, role)
        if have is None:
            continue
        have = have.astype(np.float64)
        if have.shape == want.shape and np.allclose(have, want, rtol=4 * EPS32, atol=TINY, equal_nan=True):
            continue
        twins = [k for k, v in candidates if k != key and v.shape == have.shape
                 and np.allclose(have, v, rtol=4 * EPS32, atol=TINY, equal_nan=True)]
        if twins and frozenset((key, twins[0])) in named_pairs:
            continue  # the exchange was reported from the other side
        if twins:
            named_pairs.add(frozenset((key, twins[0])))
            msg = (f"{key} and {twins[0]} look exchanged: node {nid} `{role}` (bound to {key}) holds the "
                   f"reference's {twins[0]}")
        elif have.shape != want.shape:
            msg = f"node {nid} `{role}` (bound to {key}) has shape {list(have.shape)}, reference {list(want.shape)}"
        else:
            msg = (f"node {nid} `{role}` (bound to {key}) differs from the reference's {key} "
                   f"by up to {_fmt(float(np.max(np.abs(have - want))))}")
        findings.append(Finding("parameter-mismatch", msg, node=nid, keys=(key, *twins[:1])))
    return findings


def diff(bundle: Bundle, against: str = "torch", module: Any = None, onnx_model: Any = None,
         inputs: Any = None, random: int = 4, seed: int = 0, per_node: bool = True,
         advance: Callable[[], None] | None = None, plan: Any = None, reduce: Any = None,
         dataset: Any = None) -> DiffReport:
    """Compare ``bundle`` (our float64 reference, budgets from our float32) with an oracle.

    ``against="plan"``: the oracle is ``plan``'s execution in float32 (each node by its planned
    provider, see ``app/plan_exec.py``), matched node by node.

    ``inputs``: one input set (arrays in graph-input order, or one array) or a list of sets; without
    them ``random`` seeded sets are generated. ``advance`` is called after each input set (progress).

    ``dataset``: an .npz file or a folder of .npy files holding many input sets (see
    ``app/diff_dataset.py``), consumed one set at a time; each row then says on how many sets it
    exceeded its budget (``exceeded``) and where its worst error was (``worst_on``).

    ``reduce``: a folder; on a node divergence the minimal reproducer is written there (see
    ``app/diff_reduce.py``) and described by a ``reduced`` finding (``report.reduced``).
    """
    if against not in AGAINST:
        raise BridgeError(f"diff: unknown oracle {against!r}; expected one of {', '.join(AGAINST)}")
    from . import diff_runners as R
    g = bundle.graph
    if dataset is not None:
        from .diff_dataset import Dataset, load_dataset
        sets: Any = dataset if isinstance(dataset, Dataset) else load_dataset(g, dataset)
    elif inputs is not None:
        sets = _given_inputs(g, inputs)
    else:
        generated = make_inputs(g, max(int(random), 1), seed)
        sets = [(f"input {k} ({kind})", arrays) for k, (kind, arrays) in enumerate(generated)]
    ours64, ours32 = R.EvaluatorRunner(bundle, "float64"), R.EvaluatorRunner(bundle, "float32")
    exact64 = R.EvaluatorRunner(bundle, "float64", exact=True) if per_node else None
    if against == "plan":
        if plan is None:
            raise BridgeError("diff against a kernel plan needs the plan (plan=...)")
        from .plan_exec import PlanRunner
        oracle, framework = PlanRunner(bundle, plan), {n.id: PlanRunner.key(n.id) for n in g.nodes}
    else:
        oracle, framework = _oracle(bundle, against, module, onnx_model, sets[0][1])
    title = f"diff against {oracle.name}"
    report = DiffReport(title=title, against=oracle.name)  # inputs: filled as the sets are run

    if not per_node:
        matched, unmatched = {}, {}
    elif isinstance(framework, dict):
        matched = dict(framework)
        unmatched = {n.id: "no value of its own in the ONNX file (a broadcast ONNX does implicitly)"
                     for n in g.nodes if n.id not in matched}
    else:
        matched, unmatched = match_nodes(g, framework)
        if framework == "onnx":
            _match_folded_onnx(g, oracle, matched, unmatched)
    if hasattr(oracle, "wanted"):
        oracle.wanted = set(matched.values())
    rows = {n.id: NodeDiff(n.id, n.kind, matched.get(n.id), str(n.source or "")) for n in g.nodes} if per_node else {}
    reference = module if against == "torch" else onnx_model
    tensors = {k: v for k, (_, v) in _reference_tensors(bundle, reference)[0].items()} if per_node else {}
    finer = (tensors, bundle.payload, {}) if per_node else None  # the dict: literal look-ups, kept across sets
    outs, produced, via = _run_all(g, sets, (ours64, ours32, exact64), oracle, rows, matched, report, advance,
                                   finer)
    if produced is None:
        report.add(Finding("no-inputs", "no input set could be compared (our evaluation was undefined on all)"))

    for nid, key in matched.items():
        if produced is not None and key not in produced:
            unmatched.setdefault(nid, f"{key} is not among {oracle.name}'s values")
    for nid, reason in via.items():
        if nid in rows and rows[nid].via is not None:  # compared through the finer oracle
            unmatched.pop(nid, None)
            rows[nid].counterpart = "finer oracle"
        elif nid in unmatched:
            unmatched[nid] = f"{unmatched[nid]}; {reason}"
    for nid, reason in unmatched.items():
        rows[nid].status, rows[nid].counterpart, rows[nid].problem = "no counterpart", None, reason
    _classify(g, rows)
    for row in outs:
        row.status = "diverged" if row.worst_ratio > 1.0 else "ok"
    report.nodes = list(rows.values())
    report.outputs = outs
    parameters = _parameter_findings(bundle, reference) if reference is not None else []
    _add_findings(report, bundle, rows, outs, unmatched, parameters)
    report.extend(parameters)
    if reduce is not None:
        _reduce(report, reduce, bundle, sets, oracle, matched, finer, tensors)
    return report


def _reduced_diverges(reduced: Bundle, inputs: list[np.ndarray], expected: np.ndarray) -> tuple[bool, dict]:
    """Whether our evaluation of a reduced case still exceeds its output's budget against ``expected``."""
    from .diff_runners import EvaluatorRunner
    g = reduced.graph
    out = g.outputs[0]
    ref = EvaluatorRunner(reduced, "float64").run(inputs)
    low = EvaluatorRunner(reduced, "float32").run(inputs)
    row = NodeDiff(out, g.nodes[out].kind, "expected")
    shown = range(len(g.nodes))  # every reduced node had an oracle value: the scale reaches as in the diff
    _compare(row, "captured input", expected, ref[out], low[out], _scale(g, out, ref, shown, {}),
             g.nodes[out].dtype != "float")
    row.status = "diverged" if row.worst_ratio > 1.0 else "ok"
    return row.worst_ratio > 1.0, row.to_json()


def _reduced_onnx_diverges(reduced: Bundle, inputs: list[np.ndarray], model: Any) -> bool:
    """Whether the reduced bundle diverges from onnxruntime running ``model`` on the captured inputs."""
    return not diff(reduced, against="onnxruntime", onnx_model=model, inputs=[inputs]).ok


def _reduce(report: DiffReport, folder: Any, bundle: Bundle, sets: Any, oracle: Any,
            matched: dict[int, str], finer: tuple[Any, Any, dict] | None, tensors: dict) -> None:
    """Write the minimal reproducer of the first divergence (the oracle re-run on its input set)."""
    from .diff_reduce import write_reduced
    first = report.first_divergence
    if first is None or first.node is None:
        report.add(Finding("reduced", "nothing to reduce: no node diverged", severity="info"))
        return
    label = (first.data or {}).get("diverged_on")
    arrays = next((oracle.rounded(given) for lab, given in sets if lab == label), None)
    if arrays is None:
        report.add(Finding("reduce-failed", f"no input set recorded for the divergence at node {first.node}",
                           node=first.node, severity="warning"))
        return
    theirs = oracle.run(arrays)
    values, derived, _ = oracle_values(bundle.graph, oracle, theirs, matched, arrays, finer)
    known = {**values, **derived}
    out_row = next((r for r in report.outputs if r.node == first.node and first.kind == "output-divergence"), None)
    if out_row is not None and first.node not in known and out_row.counterpart in theirs:
        known[first.node] = np.asarray(theirs[out_row.counterpart])
    try:
        if first.node not in known:
            raise BridgeError(f"diff --reduce: the oracle has no value for node {first.node}")
        info = write_reduced(folder, bundle, first.node, known, known[first.node], tensors, label,
                             _reduced_diverges, _reduced_onnx_diverges)
    except BridgeError as e:
        report.add(Finding("reduce-failed", str(e), node=first.node, severity="warning"))
        return
    report.reduced = info
    report.add(Finding("reduced", f"reduced to {info['nodes']} node(s) around node {first.node} in {folder}; "
                                  + (f"reproduce: {info['reproduce']}" if info["reproduce"] else
                                     "reproduces against expected.npy (onnxruntime agrees with our IR there)"),
                       node=first.node, severity="info", data=info))


def _run_all(g: Graph, sets: list[tuple[str, list[np.ndarray]]], ours: tuple[Any, Any, Any], oracle: Any,
             rows: dict[int, NodeDiff], matched: dict[int, str], report: DiffReport,
             advance: Callable[[], None] | None, finer: tuple[Any, Any, dict] | None = None,
             ) -> tuple[list[NodeDiff], set | None, dict[int, str]]:
    """Run every input set through our two precisions and the oracle, folding each comparison into
    the rows; returns the output rows, the keys the oracle produced (None when nothing ran) and, per
    node the oracle did not show, how the finer oracle derived it (or why it could not)."""
    ours64, ours32, exact64 = ours
    outs: list[NodeDiff] = []
    produced: set | None = None
    reasons: dict[int, str] = {}
    for label, given in sets:
        arrays = oracle.rounded(given)  # exactly what the oracle sees, one set at a time
        report.inputs.append(label)
        try:
            ref, low = ours64.run(arrays), ours32.run(arrays)
            exact = exact64.run(arrays) if exact64 is not None else {}
        except EvalError as e:
            report.add(Finding("input-skipped", f"{label}: our evaluation is undefined here: {e}",
                               node=e.node, severity="warning"))
            if advance:
                advance()
            continue
        try:
            theirs = oracle.run(arrays)
        except BridgeError:
            raise
        except Exception as e:  # the oracle's own failure on this input
            raise BridgeError(f"{oracle.name} failed on {label}: {type(e).__name__}: {e}") from None
        if produced is None:  # the oracle knows its output keys after one run
            outs, produced = _output_rows(g, oracle, report), set()
        produced.update(theirs)
        values, derived, reasons = oracle_values(g, oracle, theirs, matched, arrays, finer)
        mags: dict[int, float | None] = {}
        shown = set(values) | set(derived)
        for row in outs:
            _compare(row, label, theirs.get(row.counterpart), ref[row.node], low[row.node],
                     _scale(g, row.node, ref, shown, mags), g.nodes[row.node].dtype != "float")
        for nid, value in exact.items():
            if g.nodes[nid].dtype == "float":
                row = rows[nid]
                row.exact_ulps = max(row.exact_ulps or 0.0, ulp64_distance(ref[nid], value))
        for nid, value in [*values.items(), *derived.items()]:
            if nid in derived:
                rows[nid].via = reasons[nid]
            _compare(rows[nid], label, value, ref[nid], low[nid], _scale(g, nid, ref, shown, mags),
                     g.nodes[nid].dtype != "float")
        if advance:
            advance()
    return outs, produced, reasons


def oracle_values(g: Graph, oracle: Any, theirs: dict, matched: dict[int, str], arrays: list[np.ndarray],
                  finer: tuple[Any, Any, dict] | None,
                  ) -> tuple[dict[int, np.ndarray], dict[int, np.ndarray], dict[int, str]]:
    """The oracle's values by node id: those it showed (``theirs`` through ``matched``), those the
    finer oracle derived from them, and the finer oracle's reason per remaining node."""
    from .diff_finer import derive
    values = {nid: np.asarray(theirs[key]) for nid, key in matched.items() if key in theirs}
    if finer is None:
        return values, {}, {}
    missing = [n.id for n in g.nodes if n.id not in values]
    tensors, payload, cache = finer
    operand_keys = getattr(oracle, "operand_keys", None)

    def operands(name: str) -> list[np.ndarray]:  # the oracle's own values of a framework node's arguments
        return [np.asarray(theirs[k]) for k in operand_keys(name) if k in theirs] if operand_keys else []

    index_tables = getattr(oracle, "index_tables", None)
    tables = (lambda name: index_tables(name, theirs)) if index_tables else None
    derived, reasons = derive(g, dict(values), missing, oracle.input_precision, arrays, tensors, payload,
                              literals=getattr(oracle, "literals", None), cache=cache, operands=operands,
                              tables=tables)
    return values, derived, reasons


def _output_rows(g: Graph, oracle: Any, report: DiffReport) -> list[NodeDiff]:
    """One row per model output, paired by position with the oracle's outputs."""
    if len(oracle.output_keys) != len(g.outputs):
        report.add(Finding("output-count", f"the graph has {len(g.outputs)} output(s), {oracle.name} has "
                                           f"{len(oracle.output_keys)}"))
    return [NodeDiff(o, g.nodes[o].kind, str(k), str(g.nodes[o].source or ""), output=j)
            for j, (o, k) in enumerate(zip(g.outputs, oracle.output_keys))]


def _classify(g: Graph, rows: dict[int, NodeDiff]) -> None:
    """Divergent nodes with a divergent ancestor are ``downstream``; the rest are root divergences."""
    tainted = [False] * len(g.nodes)
    for n in g.nodes:
        row = rows.get(n.id)
        upstream = any(tainted[p] for p in n.parents)
        if row is not None and row.status != "no counterpart" and row.worst_ratio > 1.0:
            row.status = "downstream" if upstream else "diverged"
            tainted[n.id] = True
        else:
            tainted[n.id] = upstream


def provenance(node: Node) -> str:
    """Where a node came from, short: ``fx l2 (torch.nn.modules.linear.Linear) in l2``."""
    src = node.source
    if src is None:
        return ""
    parts = [src.framework, src.name or src.tensor, src.target and f"({src.target})",
             src.module and f"in {src.module}"]
    return " ".join(p for p in parts if p)


def _describe(nid: int, g: Graph) -> str:
    where = provenance(g.nodes[nid])
    return f"node {nid} ({g.nodes[nid].kind}{', ' + where if where else ''})"


def _spread(r: NodeDiff, report: DiffReport) -> str:
    """On how many of several input sets a row exceeded its budget, and where it was worst."""
    n = len(report.inputs)
    if n < 2:
        return ""
    return f" (exceeded on {r.exceeded} of {n} input sets, worst on {r.worst_on})"


def _add_findings(report: DiffReport, bundle: Bundle, rows: dict[int, NodeDiff], outs: list[NodeDiff],
                  unmatched: dict[int, str], parameters: list[Finding]) -> None:
    g = bundle.graph
    for r in (r for r in rows.values() if r.status == "diverged"):
        keys = feeding_keys(bundle, r.node)
        what = r.problem or (f"max abs error {_fmt(r.max_abs)} > budget {_fmt(r.budget)} "
                             f"({_fmt(r.max_ulp)} float32 ulps)")
        suspects = [p for p in parameters if p.keys and p.keys[0] in keys]
        f = report.add(Finding(
            "divergence", f"{_describe(r.node, g)} vs {r.counterpart}: {what} on {r.diverged_on}{_spread(r, report)}"
                          + (f"; checkpoint keys feeding it: {', '.join(keys)}" if keys else "")
                          + "".join(f"; suspect: {p.message}" for p in suspects),
            node=r.node, keys=tuple(keys), data={**r.to_json(), "suspects": [list(p.keys) for p in suspects]}))
        if report.first_divergence is None:
            report.first_divergence = f
    for r in (r for r in outs if r.status == "diverged"):
        what = r.problem or f"max abs error {_fmt(r.max_abs)} > budget {_fmt(r.budget)}"
        f = report.add(Finding("output-divergence",
                               f"output {r.output} ({_describe(r.node, g)}): {what} on {r.diverged_on}"
                               f"{_spread(r, report)}",
                               node=r.node, keys=tuple(feeding_keys(bundle, r.node)), data=r.to_json()))
        if report.first_divergence is None:
            report.first_divergence = f
    if unmatched:
        listed = ", ".join(f"{nid} ({g.nodes[nid].kind})" for nid in sorted(unmatched)[:20])
        more = f" and {len(unmatched) - 20} more" if len(unmatched) > 20 else ""
        report.add(Finding("no-counterpart", f"{len(unmatched)} node(s) without a counterpart, not compared: "
                                             f"{listed}{more}", severity="info",
                           data={str(k): v for k, v in sorted(unmatched.items())}))
