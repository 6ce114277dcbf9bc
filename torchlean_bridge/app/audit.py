"""Mapping audits: does a checkpoint put each tensor in the role the trusted model gives it?

Key and shape checks cannot tell two same-shaped tensors apart (the seed's swapped biases pass
``load_state_dict``). The audit binds the checkpoint, evaluates the bound graph (float64) against a
trusted reference (an ``nn.Module`` with trusted weights, or golden outputs for given inputs) and,
when they disagree, searches the exchanges a key/shape check cannot see: swaps of two keys in one
ambiguity group, and transposes of square matrices. It applies the best exchange greedily (up to
``max_steps``, so two independent swaps are found too) and reports each with the error before and
after. Inputs are the user's plus, for a module reference, a zero input and seeded random ones
(``diff.make_inputs``), so a swap is observable; every exchange that changes no output on those
inputs (identical tensors, or a difference the inputs never excite) is reported as a warning.

With trusted weights (a reference module's state_dict, or a state_dict/checkpoint given as the
reference) the checkpoint is first compared with them tensor by tensor (``audit_weights``: exact
hashes, no evaluation); every difference found there is named as its transformation (block
exchange, layer shift, Q/K/V reorder, transpose, rounding, scale, different values) with the output
error before and after undoing it, and the exchange search is not needed; the first node whose
value departs (``audit_localize``) names the layer even for a difference nothing explains.

With golden outputs only, a shift that dropped the last layer is named (``layer_shift``, with the error
the absent layer leaves) when restoring it removes most of the error; otherwise a vacated layer that
duplicates its neighbour or is missing is reported as that hash fact (``duplicate_layer``,
``missing_layer``), claiming no error removed, since the outputs cannot confirm the shift.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

from .abi import ABI, AmbiguityGroup, abi, bind_checkpoint
from .audit_search import Hypothesis, SearchResult, search
from .audit_weights import WeightReport, compare_weights, is_square, transpose_words, transposed
from ..bundle import Bundle
from ..check import check
from ..errors import BridgeError
from ..graph import Graph
from ..payload import Payload, payload_errors
from ..report import Finding, Report
from ..roles import apply_transform
from semantics.evaluate import as_array, input_sets

__all__ = ["audit", "AuditReport", "Exchange"]

Case = list[np.ndarray]
# findings that name tensors in the wrong place (moved between keys, or rearranged inside one)
SWAP_KINDS = ("swap", "transpose", "cycle", "moved", "block_swap", "block_cycle", "layer_shift", "reordered")


@dataclass(frozen=True)
class Exchange:
    """A swap of two keys' tensors, or (``second`` None) the transpose of one square matrix."""

    first: str
    second: str | None = None
    ndim: int = field(default=2, compare=False)  # of a transpose: a square conv weight's first two axes

    @property
    def keys(self) -> tuple[str, ...]:
        return (self.first,) if self.second is None else (self.first, self.second)

    def describe(self) -> str:
        return f"swap {self.first} <-> {self.second}" if self.second is not None else \
            transpose_words(self.first, self.ndim)

    def apply(self, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = dict(tensors)
        if self.second is None:
            out[self.first] = transposed(tensors[self.first])
        else:
            out[self.first], out[self.second] = tensors[self.second], tensors[self.first]
        return out


class AuditReport(Report):
    """Binding findings, the comparison with the reference, and ``swaps``: the exchanges found."""

    def __init__(self, findings: Sequence[Finding] = (), title: str = "audit") -> None:
        super().__init__(list(findings), title)
        self.error_before: float | None = None
        self.error_after: float | None = None
        self.inputs_used = 0
        self.weights: WeightReport | None = None
        self.search: dict | None = None

    @property
    def swaps(self) -> list[Finding]:
        return self.of_kind(*SWAP_KINDS)

    def _extra_json(self) -> dict:
        out = {"error_before": self.error_before, "error_after": self.error_after,
               "inputs_used": self.inputs_used, "swaps": [list(f.keys) for f in self.swaps]}
        if self.weights is not None:
            out["weights"] = {"compared": self.weights.compared, "same": self.weights.same}
        if self.search is not None:
            out["search"] = self.search
        return out

    def to_dict(self) -> dict:
        return self.to_json()

    def short(self) -> str:
        """The short text form: the status, then what is wrong (errors, and where it first shows), or
        the agreement."""
        lines = [f"{self.title}: {'OK' if self.ok else 'FAILED'}"]
        lines += [f"  {f.kind}: {f.message}" for f in self.findings
                  if f.severity == "error" or f.kind in ("agreement", "first_departure")]
        return "\n".join(lines)


# -- inputs and the reference ---------------------------------------------------------------------
def _given_cases(g: Graph, inputs: Any) -> list[Case]:
    return [] if inputs is None else input_sets(g, inputs, "audit")


def _is_module(obj: Any) -> bool:
    return hasattr(obj, "state_dict") and hasattr(obj, "parameters") and callable(obj)


def _flat_outputs(value: Any) -> list[np.ndarray]:
    if isinstance(value, (list, tuple)):
        return [a for v in value for a in _flat_outputs(v)]
    if isinstance(value, dict):
        return [a for v in value.values() for a in _flat_outputs(v)]
    return [np.asarray(as_array(value), dtype=np.float64)]


def _module_outputs(module: Any, cases: list[Case]) -> list[list[np.ndarray]]:
    """The trusted module on every case, in float64 (a copy: the caller's module is left untouched)."""
    import torch
    trusted = copy.deepcopy(module).double().eval()
    out = []
    with torch.no_grad():
        for k, case in enumerate(cases):
            args = [torch.from_numpy(np.asarray(x, order="C", dtype=np.float64 if x.dtype.kind == "f" else x.dtype))
                    for x in case]
            try:
                out.append(_flat_outputs(trusted(*args)))
            except Exception as e:  # the user's module: any failure is reported as bad input, not a traceback
                raise BridgeError(f"audit: the reference module failed on input set {k} (run in float64): "
                                  f"{type(e).__name__}: {e}") from None
    return out


def _golden(reference: Any, cases: list[Case]) -> list[list[np.ndarray]]:
    """Golden outputs: one list per input set (a bare list of arrays pairs with a single set)."""
    if not cases:
        raise BridgeError("audit: golden outputs need the inputs they were computed on (inputs=...)")
    if isinstance(reference, (list, tuple)) and reference and isinstance(reference[0], (list, tuple)):
        per_case = [[np.asarray(as_array(a), np.float64) for a in outs] for outs in reference]
    elif isinstance(reference, (list, tuple)):
        per_case = [[np.asarray(as_array(a), np.float64) for a in reference]]
    else:
        per_case = [[np.asarray(as_array(reference), np.float64)]]
    if len(per_case) != len(cases):
        raise BridgeError(f"audit: {len(per_case)} golden output set(s) for {len(cases)} input set(s)")
    return per_case


def _aligned(g: Graph, outputs: list[list[np.ndarray]], what: str) -> list[list[np.ndarray]]:
    """Reference outputs in the graph's output shapes (a reshape when only the layout of dims differs)."""
    shapes = [g.nodes[o].out_shape for o in g.outputs]
    result = []
    for outs in outputs:
        if len(outs) != len(shapes):
            raise BridgeError(f"audit: {what} gives {len(outs)} output(s), the graph has {len(shapes)}")
        row = []
        for k, (a, shape) in enumerate(zip(outs, shapes)):
            if a.size != int(np.prod(shape, dtype=np.int64)):
                raise BridgeError(f"audit: {what} output {k} has shape {list(a.shape)}, the graph's is {list(shape)}")
            row.append(a.reshape(shape))
        result.append(row)
    return result


# -- evaluation of candidate assignments ----------------------------------------------------------
class _Evaluator:
    """Outputs of the graph for a given key -> tensor assignment, on every input set."""

    def __init__(self, bundle: Bundle, slots: ABI, cases: list[Case]) -> None:
        from semantics.evaluate import evaluate
        self._evaluate = evaluate
        self.bundle = bundle
        self.slots = slots
        self.cases = cases
        self._cache: list[list[Any]] | bool | None = None  # node values of the bundle's payload (False: none)

    def payload(self, tensors: dict[str, np.ndarray], changed: Sequence[str]) -> Payload:
        base = self.bundle.payload  # shared arrays, new records: nothing here writes into an array
        payload = Payload({n: base.record(n) for n in base.nodes()})
        for key in changed:
            for slot in self.slots.for_key(key):
                payload.set(slot.node, slot.role, apply_transform(slot.transform, tensors[key]))
        return payload

    def outputs(self, payload: Payload, start: int = 0) -> list[list[np.ndarray]] | None:
        """The outputs on every case; nodes before ``start`` read no changed record, so they keep the
        bundle's own values (computed once, when they fit in ``CACHE_BYTES``)."""
        g = self.bundle.graph
        tables = self._tables() if start > 0 else None
        try:
            if tables is None:
                return [[np.asarray(v, np.float64) for v in self._evaluate(g, payload, case, "float64", check=False)]
                        for case in self.cases]
            return [[np.asarray(v, np.float64) for v in self._evaluate(g, payload, case, "float64", check=False,
                                                                       resume=(start, table))]
                    for case, table in zip(self.cases, tables)]
        except BridgeError:
            return None  # e.g. an exchange that makes a log argument negative: not a candidate

    def trial(self, tensors: dict[str, np.ndarray], changed: Sequence[str]) -> list[list[np.ndarray]] | None:
        """The outputs with ``changed`` keys bound to ``tensors``: evaluation starts at the first node
        reading one of them (a hypothesis about the last layers re-runs only those)."""
        nodes = [slot.node for key in changed for slot in self.slots.for_key(key)]
        return self.outputs(self.payload(tensors, changed), min(nodes, default=0))

    def _tables(self) -> list[list[Any]] | None:
        """Every node's value on every case for the bundle's own payload, or None when they would
        take more than ``CACHE_BYTES`` (or the bundle does not evaluate)."""
        if self._cache is None:
            self._cache = False
            try:
                tables = [self._evaluate(self.bundle.graph, self.bundle.payload, case, "float64", check=False,
                                         all_nodes=True) for case in self.cases]
            except BridgeError:
                return None
            size = sum(getattr(v, "nbytes", 0) for t in tables for v in t)
            if size <= CACHE_BYTES:
                self._cache = tables
        return self._cache or None


def _max_error(ours: list[list[np.ndarray]] | None, ref: list[list[np.ndarray]]) -> float:
    """The largest |ours - reference| over every output of every case. Equal values (infinities
    included) and NaN on both sides count as 0; NaN on one side only is an infinite error."""
    if ours is None:
        return math.inf
    worst = 0.0
    for a_case, r_case in zip(ours, ref):
        for a, r in zip(a_case, r_case):
            nan = np.isnan(a)
            if (nan != np.isnan(r)).any():
                return math.inf
            with np.errstate(invalid="ignore"):
                d = np.where(nan | (a == r), 0.0, np.abs(a - r))
            if d.size:
                worst = float(np.maximum(worst, d.max()))  # a NaN here would be a bug: let it show
    return worst


def _scale(ref: list[list[np.ndarray]]) -> float:
    """max(1, the largest |reference| value), NaN ignored: the tolerance is relative to it."""
    peak = 1.0
    for case in ref:
        for r in case:
            peak = float(np.max(np.abs(r[~np.isnan(r)]), initial=peak))
    return peak


def _vector(a: np.ndarray) -> str:
    return "[" + ", ".join(_fmt(float(v)) for v in a.reshape(-1)) + "]"


def _worst_case(labelled: list[tuple[str, Case]], ours: list[list[np.ndarray]] | None,
                ref: list[list[np.ndarray]]) -> str:
    """Where the error is largest, with both values when the output is small enough to read."""
    if ours is None:
        return ""
    errors = [_max_error([o], [r]) for o, r in zip(ours, ref)]
    k = int(np.argmax(errors))
    text = f"; worst on {labelled[k][0]}"
    if len(ours[k]) == 1 and ours[k][0].size <= 8:
        text += f": ours {_vector(ours[k][0])}, reference {_vector(ref[k][0])}"
    return text


CACHE_BYTES = 256 << 20  # node values kept per evaluator so a trial re-runs only the nodes after its change
HINT_FRACTION = 0.1  # short of agreement, the best single exchange is named only if it leaves at most this much
CONFIRM = 10  # single exchanges screened on the first input set and confirmed on every set, short of agreement


def _candidates(groups: list[AmbiguityGroup], squares: list[tuple[str, int]]) -> list[Exchange]:
    """Every exchange within a group and every transpose, nearest keys first: a converter mixes up the
    tensors of one module (a batch norm's mean and variance) far more often than those of two
    layers, and the search stops at the first exchange that restores agreement."""
    out = [Exchange(a, b) for g in groups for i, a in enumerate(g.keys) for b in g.keys[i + 1:]]
    out += [Exchange(k, ndim=ndim) for k, ndim in squares]
    return sorted(out, key=_distance)  # stable: the groups' order among equally near pairs


def _distance(ex: Exchange) -> int:
    """How many dotted components of the two keys' modules differ (0: one module, or a transpose)."""
    a = ex.first.split(".")[:-1]
    b = a if ex.second is None else ex.second.split(".")[:-1]
    common = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return max(len(a), len(b)) - common


def _fmt(x: float) -> str:
    return f"{x:.6f}" if np.isfinite(x) else str(x)


# -- the audit --------------------------------------------------------------------------------------
def _with_reference_keys(bundle: Bundle, module: Any) -> Bundle:
    """An ONNX bundle whose weights the exporter renamed takes the trusted module's keys, proven by
    value against the file's own weights (never against the checkpoint under audit, whose values
    could prove a swap)."""
    from importers.onnx_keys import recover_keys
    state = module.state_dict()
    return bundle if set(state) >= set(bundle.roles) else recover_keys(bundle, state)


def _trusted_weights(reference: Any) -> Any:
    """The trusted weights a reference carries (a module's state_dict, or the reference itself when
    it is a state_dict or checkpoint), as a Checkpoint; None for golden outputs."""
    from importers.checkpoints import Checkpoint, as_checkpoint
    if _is_module(reference):
        return as_checkpoint(reference.state_dict(), strip_prefix="module.")
    if isinstance(reference, (Checkpoint, Mapping)):
        return as_checkpoint(reference, strip_prefix="module.")
    return None


def _graph_outputs(bundle: Bundle, trusted: Any, cases: list[Case]) -> list[list[np.ndarray]]:
    """Reference outputs from trusted weights alone: the graph bound to them, in float64."""
    from semantics.evaluate import evaluate
    bound, binding = bind_checkpoint(bundle, trusted, strict=False)
    problems = payload_errors(bound.graph, bound.payload)
    if problems:
        raise BridgeError(f"audit: the reference weights do not fill the graph: {problems[0]}")
    return [[np.asarray(v, np.float64) for v in evaluate(bound.graph, bound.payload, case, "float64", check=False)]
            for case in cases]


def _effect(before: float, after: float, limit: float, cases: int) -> str:
    """What undoing a weight difference does to the output error. A difference the model cancels (a
    K bias: softmax is invariant to adding one constant to every score of a query) changes no output,
    and "max error 0.000000 -> 0.000000" would read as nonsense, so it is said in words; while the
    outputs still disagree, only that undoing this difference alone changed nothing can be said."""
    if abs(after - before) > limit:
        return f"max error {_fmt(before)} -> {_fmt(after)}"
    if before > limit:  # the outputs still disagree: undoing this one alone is what changed nothing
        return f"undoing it alone leaves the max error at {_fmt(before)} on the {cases} input(s) used"
    return f"the difference does not change the outputs on the {cases} input(s) used"


def _undo_steps(report: AuditReport, weights: WeightReport, evaluator: "_Evaluator", tensors: dict[str, np.ndarray],
                trusted: Any, ref: list[list[np.ndarray]], before: float, limit: float) -> float:
    """Each weight finding with the output error before and after restoring its keys' trusted
    tensors, one after another (the steps chain); returns the error once all are undone."""
    current, changed, error = dict(tensors), set(), before
    for f in weights.findings:
        if f.severity != "error":
            report.add(f)
            continue
        bound_keys = [k for k in f.keys if k in current and k in trusted]
        for k in bound_keys:
            current[k] = np.asarray(trusted[k])
        changed |= set(bound_keys)
        after = _max_error(evaluator.trial(current, sorted(changed)), ref) if bound_keys else error
        report.add(Finding(f.kind, f"{f.message}: {_effect(error, after, limit, len(evaluator.cases))}", keys=f.keys,
                           data={**(f.data or {}), "error_before": error, "error_after": after}))
        error = after
    return error


def audit(bundle: Bundle, ckpt: Any, reference: Any = None, inputs: Any = None, *, tolerance: float = 1e-6,
          samples: int = 5, seed: int = 0, max_steps: int = 3, max_candidates: int = 5000,
          strict: bool = True, max_hypotheses: int = 2000, time_limit: float = 60.0) -> AuditReport:
    """Bind ``ckpt`` to ``bundle`` and compare the bound graph with ``reference``.

    ``reference``: an ``nn.Module`` holding the trusted weights (run in float64 on a copy), trusted
    weights alone (a state_dict or Checkpoint: the graph bound to them gives the reference outputs),
    or golden outputs (a list of arrays in graph-output order for the one input set ``inputs``, or a
    list of such lists, one per set). Without a reference only the binding is checked. Outputs agree
    when the largest absolute difference is at most ``tolerance * max(1, max |reference|)``.
    Without trusted weights, structured hypotheses (``audit_search``: block exchanges, layer shifts,
    Q/K/V orders, transposes) are searched first, bounded by ``max_hypotheses``, then single
    exchanges; both within ``time_limit`` seconds from the start of the search.
    """
    from importers.checkpoints import as_checkpoint
    if callable(reference) and not _is_module(reference):
        raise BridgeError(f"audit: the reference is a {type(reference).__name__}; give an nn.Module holding the "
                          "trusted weights, trusted weights (a state_dict or checkpoint), or golden outputs (arrays)")
    ckpt = as_checkpoint(ckpt)
    if _is_module(reference) and bundle.report.get("framework") == "onnx":
        bundle = _with_reference_keys(bundle, reference)
    trusted = _trusted_weights(reference)
    bound, binding = bind_checkpoint(bundle, ckpt, strict=strict)
    g = bundle.graph
    report = AuditReport(binding.findings, title=f"audit of {ckpt.source}")
    if reference is None:
        report.add(Finding("no_reference", "no reference given: only keys, shapes, dtypes and values were "
                                           "checked; exchanges within the ambiguity groups cannot be detected",
                           severity="warning"))
        return report
    if trusted is not None:
        report.weights = compare_weights(ckpt, trusted, title=f"weights of {ckpt.source}")
    problems = payload_errors(g, bound.payload)
    stand_ins = _stand_ins(abi(bound), ckpt) if trusted is None else {}
    if problems and stand_ins:  # a whole missing layer may be a shifted one: zeros let the search run
        bound = _with_values(bound, stand_ins)
        problems = payload_errors(g, bound.payload)
        if not problems:
            report.add(Finding("stand_in", f"{len(stand_ins)} missing key(s) have no value; zeros stand in for "
                                           f"them so the search can evaluate the graph: {', '.join(stand_ins)}",
                               keys=tuple(stand_ins), severity="warning"))
    if problems:
        report.add(Finding("not_evaluable", f"the bound graph cannot be evaluated: {problems[0]}"
                           + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")))
        if report.weights is not None:
            report.extend(report.weights.findings)
        return report

    check(g)  # once here: candidates are then evaluated without re-checking the graph
    labelled = [(f"the given input {k}", case) for k, case in enumerate(_given_cases(g, inputs))]
    if trusted is not None:
        from .diff import make_inputs
        labelled += [(f"the {label} input", case) for label, case in make_inputs(g, samples, seed)]
    cases = [case for _, case in labelled]
    if _is_module(reference):
        ref = _aligned(g, _module_outputs(reference, cases), "the reference module")
        what = f"the reference module {type(reference).__name__}"
    elif trusted is not None:
        ref = _aligned(g, _graph_outputs(bundle, trusted, cases), "the reference weights")
        what = "the graph with the reference weights"
    else:
        ref = _aligned(g, _golden(reference, cases), "the golden outputs")
        what = "the golden outputs"
    report.inputs_used = len(cases)
    limit = tolerance * _scale(ref)
    slots = abi(bound)
    tensors = {key: np.asarray(ckpt[key]) for key in slots.keys if key in ckpt}
    tensors.update(stand_ins)  # not candidates for exchanges (below), only for the layer hypotheses
    evaluator = _Evaluator(bound, slots, cases)
    base_outputs = evaluator.outputs(bound.payload)
    before = _max_error(base_outputs, ref)
    report.error_before = before
    # the trusted weights explain the checkpoint when they hold every key the graph binds
    covered = trusted is not None and all(k in trusted for k in tensors)
    by_weights = covered and not report.weights.ok

    groups = [g_ for g_ in binding.ambiguity_groups if all(k in ckpt for k in g_.keys)]
    squares = [(k, tensors[k].ndim) for k in slots.keys if k in ckpt and is_square(tensors[k].shape)
               and not np.array_equal(tensors[k], transposed(tensors[k]))]
    # trusted weights name every misplaced tensor by hash: no exchange search is needed
    candidates = [] if covered else _candidates(groups, squares)
    if len(candidates) > max_candidates:
        report.add(Finding("truncated", f"{len(candidates)} possible exchanges; only the first {max_candidates} "
                                        f"were tried", severity="warning"))
        candidates = candidates[:max_candidates]
    for ex in _candidates(groups, []):
        if np.array_equal(tensors[ex.first], tensors[ex.second]):
            report.add(Finding("indistinguishable", f"{ex.first} and {ex.second} hold identical tensors: an "
                                                    f"exchange between them cannot be seen", keys=ex.keys,
                               severity="warning"))

    screen = _Evaluator(bound, slots, cases[:1])

    deadline = [math.inf]  # set when the search starts: the single exchanges share the time limit

    def first_errors_of(observability_only: bool = False, near: frozenset[str] = frozenset()
                        ) -> dict[Exchange, float]:
        """One evaluation per exchange from the checkpoint as given: observability and the first step.
        For observability alone an exchange that changes the first input set's outputs is not
        evaluated further. Otherwise exchanges are screened on the first input set, exchanges within
        the modules ``near`` first (those a partial explanation moved: the error lies there), and the
        first that restores agreement on every set ends the search."""
        first_errors: dict[Exchange, float] = {}
        screened: dict[Exchange, float] = {}  # the first input set's error, when there are more sets
        def order(ex: Exchange) -> tuple[int, bool]:
            return _distance(ex), not {k.rpartition(".")[0] for k in ex.keys} <= near
        for ex in sorted(candidates, key=order):
            if time.perf_counter() > deadline[0]:
                tried = len(first_errors) + len(screened)
                report.add(Finding("search_bounded", f"the time limit ({time_limit} s) stopped the single exchanges "
                                                     f"after {tried} of {len(candidates)}",
                                   severity="warning", data={"tried": tried, "of": len(candidates)}))
                break
            if ex.second is not None and np.array_equal(tensors[ex.first], tensors[ex.second]):
                continue
            if base_outputs is not None and len(cases) > 1:
                first = screen.trial(ex.apply(tensors), ex.keys)
                if observability_only and _max_error(first, base_outputs[:1]) > limit:
                    continue
                if not observability_only and _max_error(first, ref[:1]) > limit \
                        and _max_error(first, base_outputs[:1]) > limit:
                    screened[ex] = _max_error(first, ref[:1])  # neither agreement nor unobservable: ranked later
                    continue
            outs = evaluator.trial(ex.apply(tensors), ex.keys)
            first_errors[ex] = _max_error(outs, ref)
            if base_outputs is not None and _max_error(outs, base_outputs) <= limit:
                report.add(Finding("indistinguishable", f"{ex.describe()} changes no output on the {len(cases)} "
                                                        f"input(s) used: these inputs cannot tell them apart",
                                   keys=ex.keys, severity="warning"))
            if not observability_only and first_errors[ex] <= limit:
                return {ex: first_errors[ex]}  # agreement: the nearest exchange restoring it is the explanation
        for ex in sorted(screened, key=screened.__getitem__)[:CONFIRM]:  # the best screened, on every set
            if time.perf_counter() > deadline[0]:
                break
            first_errors[ex] = _max_error(evaluator.trial(ex.apply(tensors), ex.keys), ref)
        return first_errors

    if before <= limit:
        deadline[0] = time.perf_counter() + time_limit  # the observability check is bounded too
        first_errors_of(observability_only=True)
        report.error_after = before
        report.add(Finding("agreement", f"outputs agree with {what}: max error {_fmt(before)} on {len(cases)} "
                                        f"input(s)", severity="info", data={"max_error": before}))
        if by_weights:
            report.error_after = _undo_steps(report, report.weights, evaluator, tensors, trusted, ref, before, limit)
        return report

    report.add(Finding("mismatch", f"outputs disagree with {what}: max error {_fmt(before)} on {len(cases)} "
                                   f"input(s){_worst_case(labelled, base_outputs, ref)}",
                       data={"max_error": before, "limit": limit}))
    if by_weights:
        report.error_after = _undo_steps(report, report.weights, evaluator, tensors, trusted, ref, before, limit)
        from .audit_localize import first_departure
        where = first_departure(bundle, ckpt, trusted, cases[0], tolerance) if cases else None
        if where is not None:
            report.add(where)
        return report
    if covered:
        report.error_after = before
        report.add(Finding("unresolved", f"every checkpoint tensor equals the trusted one ({report.weights.compared} "
                                         f"compared): the difference lies in the graph or its role map, not in "
                                         f"the weights", data={"compared": report.weights.compared}))
        return report
    deadline[0] = time.perf_counter() + time_limit
    structured = _structured_search(evaluator, screen, tensors, ref, before, limit, max_steps=max_steps,
                                    max_hypotheses=max_hypotheses, time_limit=time_limit,
                                    missing=frozenset(stand_ins), refine=_refinements(candidates))
    report.search = {k: v for k, v in structured.to_dict().items() if k != "steps"}
    if structured.bounded:
        report.add(Finding("search_bounded", f"the structured search stopped at its bound: {structured.tried} "
                                             f"hypotheses tried in {structured.time_s:.1f} s", severity="warning",
                           data=report.search))
    if structured.steps and structured.error <= limit:
        steps = _minimal(structured.steps, lambda t, h: {**t, **h.undo(t)}, lambda h: h.keys, evaluator, tensors,
                         ref, before, limit)
        report.error_after = steps[-1][2]
        for h, err_in, err_out in steps:
            report.add(Finding(h.kind, f"{h.message}: max error {_fmt(err_in)} -> {_fmt(err_out)}", keys=h.keys,
                               data={**h.data, "error_before": err_in, "error_after": err_out}))
        return report
    if structured.steps and structured.steps[0][0].data.get("absent"):
        # a layer the checkpoint does not hold: its error cannot be undone, so the error left is its own
        report.error_after = structured.error
        for h, err_in, err_out in structured.steps:
            rest = ""
            if h.data.get("absent"):
                vacated = h.data["vacated"]
                alone = _max_error(evaluator.trial(*_zeroed(tensors, vacated)), ref)
                same = (f"; the outputs alone cannot tell it from a wrong {vacated}: zeroing {vacated} instead leaves "
                        f"{_fmt(alone)}" if abs(alone - err_out) <= limit else
                        f"; zeroing {vacated} instead leaves {_fmt(alone)}")
                rest = (f" (the error left is that of the absent {h.data['absent']}, which no rearrangement of the "
                        f"checkpoint restores; the shift removes {_share(err_in, err_out)} of the error{same})")
            report.add(Finding(h.kind, f"{h.message}: max error {_fmt(err_in)} -> {_fmt(err_out)}{rest}", keys=h.keys,
                               data={k: v for k, v in h.data.items() if k not in ("group", "refines", "claim")}
                               | {"error_before": err_in, "error_after": err_out}))
        return report
    partial = None
    if structured.steps:  # most of the error explained, not all: the best explanation with what it leaves
        h_first = structured.steps[0][0]
        text = "; then ".join(h.message for h, _, _ in structured.steps)
        partial = (Finding("partial", f"{text}: max error {_fmt(before)} -> {_fmt(structured.error)} (most of the "
                                      f"error, not all: the rest is not explained by it)",
                           keys=tuple(k for h, _, _ in structured.steps for k in h.keys),
                           data={**h_first.data, "error_before": before, "error_after": structured.error,
                                 "steps": [h.message for h, _, _ in structured.steps]}))
    if not structured.steps and _name_shift_signature(report, evaluator, tensors, ref, before, stand_ins):
        report.error_after = before
        return report
    first_errors = first_errors_of(near=frozenset(k.rpartition(".")[0] for h, _, _ in structured.steps
                                                  for k in h.keys))
    suspects = _suspects(reference, tensors, ckpt)
    searched = [ex for ex in candidates if set(ex.keys) <= suspects]
    steps, error = _search(evaluator, tensors, searched, {ex: first_errors[ex] for ex in searched
                                                                  if ex in first_errors},
                                    ref, before, limit, max_steps, deadline[0])
    report.error_after = error
    if error <= limit:
        # agreement without the structured steps: a partial explanation is no part of it (not printed)
        steps = _minimal(steps, lambda t, ex: ex.apply(t), lambda ex: ex.keys, evaluator, tensors, ref, before, limit)
        for ex, err_in, err_out in steps:
            report.add(Finding("swap" if ex.second else "transpose",
                               f"{ex.describe()}: max error {_fmt(err_in)} -> {_fmt(err_out)}", keys=ex.keys,
                               data={"error_before": err_in, "error_after": err_out}))
    else:
        if partial is not None:
            report.add(partial)
        # a suggestion that does not remove nearly all of the error would mislead (moving a perturbed
        # value to a less sensitive place halves the error by chance): it is not named
        best = min(first_errors.items(), key=lambda kv: kv[1], default=None)
        hint = f" (the best single exchange, {best[0].describe()}, leaves {_fmt(best[1])})" \
            if best and best[1] <= HINT_FRACTION * before else ""
        tried = f" and none of {structured.tried} structured hypotheses" if structured.tried else ""
        report.add(Finding("unresolved", f"no exchange within the ambiguity groups{tried} restores agreement{hint}; "
                                         f"the difference lies elsewhere (different values, which golden outputs "
                                         f"alone cannot place, or a role map or import error)",
                           data={"candidates": len(candidates), "hypotheses": structured.tried}))
    return report


def _refinements(candidates: list[Exchange]) -> Callable[[list[str], bool], Iterator[Hypothesis]]:
    """The single exchanges within the given modules (those a structured hypothesis touches, in the
    order given), with (``rest``) every other one, nearest keys first (one module's two tensors before
    two modules'; the given modules first among equally near), as hypotheses: what the structured
    search checks before taking a step short of agreement."""
    def refine(modules: list[str], rest: bool) -> Iterator[Hypothesis]:
        rank = {m: i for i, m in enumerate(modules)}

        def order(ex: Exchange) -> tuple[int, int]:  # nearest keys first; among them, the modules in order
            return _distance(ex), max(rank.get(k.rpartition(".")[0], len(rank)) for k in ex.keys)
        tried = [ex for ex in candidates if rest or all(k.rpartition(".")[0] in rank for k in ex.keys)]
        for ex in sorted(tried, key=order):
            yield Hypothesis("swap" if ex.second else "transpose", ex.describe(), ex.keys,
                             lambda t, ex=ex: {k: v for k, v in ex.apply(t).items() if k in ex.keys})
    return refine


Step = tuple[Any, float, float]  # (hypothesis or exchange, error before, error after)


def _minimal(steps: list[Step], apply: Callable[[dict[str, np.ndarray], Any], dict[str, np.ndarray]],
             keys_of: Callable[[Any], Sequence[str]], evaluator: _Evaluator, tensors: dict[str, np.ndarray],
             ref: list[list[np.ndarray]], before: float, limit: float) -> list[Step]:
    """A minimal explanation: each step whose undoing keeps agreement without it is dropped (a greedy
    search can take a step that only helped on the way, e.g. an exchange in every layer that lowered
    the error before the one real exchange was found), and the errors of the steps kept re-measured."""
    kept = list(steps)
    for step in list(steps):
        if len(kept) > 1 and _chain(evaluator, tensors, ref, before, [s for s in kept if s is not step], apply,
                                    keys_of)[-1][2] <= limit:
            kept = [s for s in kept if s is not step]
    return kept if len(kept) == len(steps) else _chain(evaluator, tensors, ref, before, kept, apply, keys_of)


def _chain(evaluator: _Evaluator, tensors: dict[str, np.ndarray], ref: list[list[np.ndarray]], before: float,
           steps: list[Step], apply: Callable[[dict[str, np.ndarray], Any], dict[str, np.ndarray]],
           keys_of: Callable[[Any], Sequence[str]]) -> list[Step]:
    """The steps applied one after another from the checkpoint as given, with their measured errors."""
    out, current, changed, error = [], dict(tensors), set(), before
    for step in steps:
        current = apply(current, step[0])
        changed |= set(keys_of(step[0]))
        after = _max_error(evaluator.trial(current, sorted(changed)), ref)
        out.append((step[0], error, after))
        error = after
    return out


def _name_shift_signature(report: AuditReport, evaluator: _Evaluator, tensors: dict[str, np.ndarray],
                          ref: list[list[np.ndarray]], before: float, stand_ins: Mapping[str, np.ndarray]) -> bool:
    """A layer that is missing or duplicates its neighbour (by value), at the end of a run of layers:
    the mark a shift by one that dropped the last layer leaves. The outputs cannot confirm the shift
    (restoring it and skipping the absent layer computes the same layers as skipping the vacated one),
    so the finding states the hash fact and both measured errors, and claims no error removed."""
    from .audit_search import shift_signatures
    found = False
    for h in shift_signatures(tensors, frozenset(stand_ins)):
        trial = dict(tensors)
        trial.update(h.undo(tensors))
        after = _max_error(evaluator.trial(trial, sorted(h.keys)), ref)
        if not after <= before:
            continue
        d, vacated, neighbour, absent = h.data["shift"], h.data["vacated"], h.data["neighbour"], h.data["absent"]
        holds = (f"{vacated}'s keys are missing" if h.data["vacated_holds"] == "missing"
                 else f"{vacated} holds the same tensors as {neighbour} (equal by value)")
        kind = "missing_layer" if h.data["vacated_holds"] == "missing" else "duplicate_layer"
        report.add(Finding(kind, f"{holds}: the mark of every layer of {h.data['prefix']} shifted by {d:+d} with the "
                                 f"reference's {absent} dropped ({h.data['claim']}); the "
                                 f"outputs cannot confirm it, since restoring the shift with {absent} skipped "
                                 f"computes the same layers as skipping {vacated}: max error {_fmt(before)} as given, "
                                 f"{_fmt(after)} so restored (the rest is the absent layer's)",
                           keys=h.keys, data={"prefix": h.data["prefix"], "shift": d, "vacated": vacated,
                                              "absent": absent, "error_before": before, "error_after": after}))
        found = True
    return found


def _zeroed(tensors: dict[str, np.ndarray], layer: str) -> tuple[dict[str, np.ndarray], list[str]]:
    """The tensors with every key of ``layer`` (a key prefix) zeroed, and those keys."""
    keys = sorted(k for k in tensors if k.startswith(layer + "."))
    return dict(tensors, **{k: np.zeros_like(tensors[k]) for k in keys}), keys


def _share(before: float, after: float) -> str:
    return f"{100 * (1 - after / before):.0f}%" if before > 0 and math.isfinite(before) else "an unknown share"


def _stand_ins(slots: ABI, ckpt: Any) -> dict[str, np.ndarray]:
    """Zeros for each bound key the checkpoint lacks whose same-named key in another layer it has
    (in that key's layout): what a layer-shift hypothesis needs to fill a vacated layer."""
    from .audit_search import _layer_index
    out = {}
    for prefix, layers in _layer_index(slots.keys).items():
        for i, suffixes in layers.items():
            for suffix, key in suffixes.items():
                if key in ckpt:
                    continue
                sibling = next((s[suffix] for j, s in sorted(layers.items()) if j != i and suffix in s
                                and s[suffix] in ckpt), None)
                if sibling is not None:
                    out[key] = np.zeros(tuple(ckpt.shape(sibling)), dtype=np.asarray(ckpt[sibling]).dtype)
    return out


def _with_values(bundle: Bundle, values: Mapping[str, np.ndarray]) -> Bundle:
    """``bundle`` with ``values`` bound to the slots of their keys that have no value."""
    from dataclasses import replace
    slots = abi(bundle)
    payload = Payload({n: dict(bundle.payload.record(n)) for n in bundle.payload.nodes()})
    for key, value in values.items():
        for slot in slots.for_key(key):
            if payload.get(slot.node, slot.role) is None:
                payload.set(slot.node, slot.role, apply_transform(slot.transform, value))
    return replace(bundle, payload=payload)


def _structured_search(evaluator: _Evaluator, screen: _Evaluator, tensors: dict[str, np.ndarray],
                       ref: list[list[np.ndarray]], before: float, limit: float, **bounds: Any) -> SearchResult:
    """Structured hypotheses, screened on the first input set and confirmed on all of them (and, short
    of agreement, on the others alone)."""
    def error_of(trial: dict[str, np.ndarray], changed: list[str], screening: bool) -> float:
        use, against = (screen, ref[:1]) if screening else (evaluator, ref)
        return _max_error(use.trial(trial, changed), against)
    rest = _Evaluator(evaluator.bundle, evaluator.slots, evaluator.cases[1:]) if len(evaluator.cases) > 1 else None

    def held_out(trial: dict[str, np.ndarray], changed: list[str]) -> float:
        return _max_error(rest.trial(trial, changed), ref[1:])
    return search(tensors, error_of, before, limit, held_out=held_out if rest else None, **bounds)


def _suspects(reference: Any, tensors: dict[str, np.ndarray], ckpt: Any) -> set[str]:
    """Keys whose tensor may be misplaced: all of them, unless the reference module's own state_dict
    names the same keys, in which case only those whose value differs from the trusted one (an
    exchange must move both of its tensors away from their trusted values). This only narrows the
    search; agreement is still decided by evaluating the graph."""
    if not _is_module(reference):
        return set(tensors)
    from importers.checkpoints import as_checkpoint
    trusted = as_checkpoint(reference.state_dict(), strip_prefix="module.")
    suspects = set()
    for key, value in tensors.items():
        if key not in trusted or trusted.shape(key) != value.shape \
                or not np.array_equal(np.asarray(trusted[key], np.float64), np.asarray(value, np.float64)):
            suspects.add(key)
    return suspects


def _search(evaluator: _Evaluator, tensors: dict[str, np.ndarray], candidates: list[Exchange],
            first_errors: dict[Exchange, float], ref: list[list[np.ndarray]], error: float, limit: float,
            max_steps: int, deadline: float = math.inf) -> tuple[list[tuple[Exchange, float, float]], float]:
    """Greedy: apply the exchange that lowers the error most, until agreement, no improvement or the
    deadline (``time.perf_counter()`` seconds)."""
    steps: list[tuple[Exchange, float, float]] = []
    current, changed = tensors, set()
    errors = first_errors
    for _ in range(max_steps):
        if not errors:
            break
        best, best_error = min(errors.items(), key=lambda kv: kv[1])
        if not best_error < error:
            break
        steps.append((best, error, best_error))
        current, error = best.apply(current), best_error
        changed |= set(best.keys)
        if error <= limit:
            break
        errors = {}
        for ex in candidates:
            if time.perf_counter() > deadline:
                break
            if ex == best:
                continue
            trial = ex.apply(current)
            errors[ex] = _max_error(evaluator.trial(trial, sorted(changed | set(ex.keys))), ref)
    return steps, error
