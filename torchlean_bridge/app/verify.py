"""``verify``: a VNN-LIB property against a network: ``unsat``, ``sat`` (with a counterexample) or ``unknown``.

For each input box of the property: sound bounds of the constrained output combinations ``C y``
(CROWN with the property's rows as the specification, or IBP). A group of rows is refuted when one
row's lower bound exceeds its right-hand side by a margin that covers binary32 evaluation (the margin
is ``2**-17 (|C_k|_1 max|y| + |d_k|)``: a float32 counterexample within rounding of the boundary
would not be refuted). Groups left open are attacked (the box centre, random points, the corners
that minimize each row's linear lower bound, then projected steps along the local linear bounds'
coefficients) and the box is split along one input entry (``split_axis``: for a few entries the one
that spreads the split nodes' inputs most, else the largest |coefficient| x width), until
every group is refuted (``unsat``), a counterexample reproduces (``sat``) or the time is up
(``unknown``).

A candidate is reported only when it lies in the box as a binary32 point and satisfies one group's
rows in float64 and float32 evaluation of the IR and in onnxruntime on the ONNX model (strict rows
strictly). So ``unsat`` rests on the sound bounds and ``sat`` on three independent evaluations.

Methods: ``crown``, ``alpha-crown`` and ``ibp`` run the input-splitting search above with that bound;
``bab-input`` is the same search with CROWN; ``bab-relu`` bounds the whole box with CROWN, attacks, then
runs branch and bound over the unstable units of piecewise-linear ops (ReLU, leaky ReLU, abs, clamp,
max pool) for every group left open (``bab.ReluBab``). ``auto`` picks ``bab-input`` when the input has
at most ``INPUT_SPLIT_DIMS`` entries or IBP leaves no such unit unstable on the box (splitting a few
input widths is cheap and complete there; ReLU splitting has nothing to split), else ``bab-relu``
(high-dimensional inputs: a split of one input width barely moves the bounds, a split of one unstable
ReLU removes its relaxation). When it picks ``bab-input`` for
a high-dimensional input (a sigmoid or tanh net: nothing piecewise-linear to split), each box is
bounded with alpha-CROWN instead of CROWN.
"""

from __future__ import annotations

import heapq
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..bundle import Bundle
from ..errors import BridgeError
from ..report import jsonable
from .input_clip import clipped_box
from .split_axis import input_sensitivity, split_axis
from .vnnlib import Case, Property, load_vnnlib

__all__ = ["verify", "verify_files", "VerifyResult", "load_model", "choose_method", "METHODS", "INPUT_SPLIT_DIMS",
           "INPUT_BATCH", "INPUT_BATCH_BYTES", "INPUT_QUEUE_BYTES", "box_cost", "input_batch"]

_MARGIN = 2.0 ** -17
METHODS = ("auto", "bab-relu", "bab-input", "crown", "alpha-crown", "ibp")
INPUT_SPLIT_DIMS = 16  # auto: input splitting up to this many input entries
# input splitting: the descent (PGD over the plain DAG, a few milliseconds; on other graphs projected steps
# that cost up to 24 CROWN passes) runs on the whole box and on one sub-box in this many; on the others only
# the cheap points (centre, bound corners, random) are tried. Every sub-box taking the CROWN-guided descent
# cost 75% of the time on ACAS Xu prop_1 (3x fewer boxes bounded in 30 s).
DESCEND_EVERY = 16
# input splitting bounds up to INPUT_BATCH boxes per CROWN pass, fewer when the model's per-box working
# memory (``box_cost``) times the batch would exceed INPUT_BATCH_BYTES; the open boxes beyond
# INPUT_QUEUE_BYTES end the search with ``unknown`` (memory cap)
INPUT_BATCH = 32
INPUT_BATCH_BYTES = 64 << 20
INPUT_QUEUE_BYTES = 256 << 20
_RESULTS = ("unsat", "sat", "unknown")


@dataclass
class VerifyResult:
    result: str
    time_s: float
    method: str
    counterexample: dict[str, Any] | None = None
    bounds: list[dict[str, Any]] = field(default_factory=list)
    reason: str = ""
    boxes_explored: int = 0
    domains_visited: int = 0  # boxes (input splitting) or ReLU subdomains (bab-relu) bounded
    best_lower_bound: float | None = None  # the smallest row gap over the open domains (> 0: refuted)

    def to_json(self) -> dict[str, Any]:
        best = self.best_lower_bound
        doc: dict[str, Any] = {"result": self.result, "time_s": round(self.time_s, 6), "method": self.method,
                               "boxes_explored": self.boxes_explored, "domains_visited": self.domains_visited,
                               "best_lower_bound": best if best is None or math.isfinite(best) else None,
                               "bounds": self.bounds}
        if self.counterexample is not None:
            doc["counterexample"] = self.counterexample
        if self.reason:
            doc["reason"] = self.reason
        return jsonable(doc)

    def __str__(self) -> str:
        lines = [self.result]
        for b in self.bounds:
            lines.append(f"  box {b['case']}: output lower {_fmt(b['lower'])}")
            lines.append(f"  box {b['case']}: output upper {_fmt(b['upper'])}")
        if self.counterexample is not None:
            lines.append(f"  counterexample x = {_fmt(self.counterexample['x'])}")
            lines.append(f"  y (float64) = {_fmt(self.counterexample['y'])}")
        if self.reason:
            lines.append(f"  {self.reason}")
        lines.append(f"  method {self.method}, {self.boxes_explored} box(es), {self.domains_visited} domain(s), "
                     f"{self.time_s:.3f} s")
        return "\n".join(lines)


def _fmt(v: list[float]) -> str:
    body = ", ".join(f"{x:.9g}" for x in v[:12])
    return "[" + body + (", ..." if len(v) > 12 else "") + "]"


@dataclass
class _Model:
    """The network in the three evaluators a counterexample must pass."""

    bundle: Bundle
    onnx_model: bytes | str | None  # serialized, or the file's path (its external data lie beside it)
    onnx_error: str = ""

    def __post_init__(self) -> None:
        from semantics.linear_bounds import Crown
        g = self.bundle.graph
        if len(g.inputs) != 1 or len(g.outputs) != 1:
            raise BridgeError(f"verify: the network must have one input and one output, it has {len(g.inputs)} "
                              f"and {len(g.outputs)}")
        inp = g.nodes[g.inputs[0]]
        if inp.dtype != "float":  # the box, the attack and the three re-checks all take real inputs
            name = inp.source.tensor or inp.source.name if inp.source is not None else None
            raise BridgeError(f"verify: the network input{f' {name!r}' if name else ''} is {inp.dtype}; VNN-LIB "
                              f"boxes are over real inputs, so verify takes a float input only")
        self.input_shape = tuple(inp.out_shape)
        self.n_outputs = int(np.prod(g.nodes[g.outputs[0]].out_shape))
        self.crown = Crown(g, self.bundle.payload)
        if self.crown.batched and self.crown.n > 1:
            # the bounds would take axis 0 as n independent samples, each with its own rows, while the
            # property's X_i and Y_j range over the whole tensors
            raise BridgeError(f"verify: the network input {list(self.input_shape)} has a leading axis of "
                              f"{self.crown.n} samples that no op mixes (a fixed batch size); verify bounds one "
                              f"sample: give the network with batch size 1 (or a dynamic one)")
        self._session = None
        self._batched: dict[int, Any] = {}
        self._prepared = None  # the graph checked and its weights converted once for the re-checks (hundreds a search)

    def batched_crown(self, n: int):
        """A Crown over the graph with a batch of n boxes (cached), or None when the graph does not rebatch."""
        from semantics.linear_bounds import Crown
        from semantics.linear_bounds.batch_axis import with_batch_payload
        if n not in self._batched:
            got = with_batch_payload(self.bundle.graph, self.bundle.payload, n)
            try:
                crown = None if got is None else Crown(*got)
            except BridgeError:  # e.g. a batch the working-memory limit refuses
                crown = None
            self._batched[n] = crown if crown is not None and crown.batched and crown.n == n else None
        return self._batched[n]

    def refuse_batch(self, n: int) -> None:
        """A pass at batch n failed (the working-memory limit): that batch is not tried again (branch and
        bound halves it; input splitting bounds one box per pass)."""
        self._batched[n] = None

    def evaluate(self, x: np.ndarray, dtype: str) -> np.ndarray:
        from semantics.prepared import prepare
        if self._prepared is None:
            self._prepared = prepare(self.bundle.graph, self.bundle.payload)
        x = x.astype(np.float32 if dtype == "float32" else np.float64)
        return np.asarray(self._prepared.evaluate([x], dtype=dtype)[0], dtype=np.float64).reshape(-1)

    def onnxruntime(self, x: np.ndarray) -> np.ndarray | None:
        if self._session is None:
            if self.onnx_model is None:
                return None
            try:
                import onnxruntime as ort
                options = ort.SessionOptions()
                options.log_severity_level = 3  # onnxruntime's own warnings go to stderr past Python's filters
                self._session = ort.InferenceSession(self.onnx_model, options, providers=["CPUExecutionProvider"])
            except Exception as e:  # noqa: BLE001 - any runtime failure means: cannot re-check
                self.onnx_error = f"onnxruntime cannot run the model: {e}"
                self.onnx_model = None
                return None
        inp = self._session.get_inputs()[0]
        x32 = x.astype(np.float32).reshape(self.input_shape)  # a double input takes the binary32 point exactly
        out = self._session.run(None, {inp.name: x32.astype(np.float64) if inp.type == "tensor(double)" else x32})[0]
        return np.asarray(out, dtype=np.float64).reshape(-1)


_NARROW_FLOATS = (10, 16, 17, 18, 19, 20)  # ONNX FLOAT16, BFLOAT16 and the FLOAT8 kinds


def load_model(path: str | Path) -> _Model:
    """An ONNX file (dynamic dimensions fixed to 1; ``.onnx.gz`` decompressed first) or a bundle folder
    or graph document (exported to ONNX for the runtime)."""
    p = Path(path)
    if p.name.endswith(".gz") and p.is_file():  # VNN-COMP ships model.onnx.gz
        from .campaign.files import local_file
        plain = local_file(str(p))
        try:
            return load_model(plain)
        except BridgeError as e:
            raise BridgeError(f"{e} (decompressed from {p})") from None
    if p.is_dir() or p.suffix.lower() != ".onnx":
        from exporters.folder import load
        try:
            bundle = load(p)
        except BridgeError as e:
            if p.is_dir() or not p.exists():
                raise
            raise BridgeError(f"verify: {p} is not an .onnx file, and as a graph document: {e}") from None
        try:
            from exporters.onnx import export_onnx
            data, error = export_onnx(bundle).SerializeToString(), ""
        except (BridgeError, ImportError) as e:
            data, error = None, f"the bundle cannot be exported to ONNX for onnxruntime: {e}"
        model = _Model(bundle, data)
        model.onnx_error = error
        return model
    try:
        data = p.read_bytes()
    except OSError as e:
        raise BridgeError(f"verify: cannot read {path}: {e}") from None
    import onnx
    from importers.onnx import import_onnx
    try:
        proto = onnx.load_from_string(data)
    except Exception as e:  # noqa: BLE001 - protobuf raises its own DecodeError
        raise BridgeError(f"verify: {path} is not an ONNX model: {e}") from None
    external = any(t.data_location == onnx.TensorProto.EXTERNAL for t in proto.graph.initializer)
    init = {t.name for t in proto.graph.initializer}
    shapes = []
    for vi in proto.graph.input:
        if vi.name in init:
            continue
        elem = vi.type.tensor_type.elem_type
        if elem in _NARROW_FLOATS:
            # the margin of a refutation covers binary32 rounding and counterexamples are binary32 points:
            # neither holds for a network that computes in a narrower format
            raise BridgeError(f"verify: {path}: input {vi.name!r} is {onnx.TensorProto.DataType.Name(elem)}; verify "
                              f"takes networks with float (binary32) or double inputs only")
        dims = vi.type.tensor_type.shape.dim
        shapes.append(tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else 1 for d in dims))
    # with external data both readers take the path, which locates the data files (the importer checks
    # every reference stays beside the model before anything reads it)
    return _Model(import_onnx(p if external else proto, input_shapes=shapes), str(p) if external else data)


def _margin(c: np.ndarray, d: np.ndarray, y_mag: float) -> np.ndarray:
    return _MARGIN * (np.abs(c).sum(axis=1) * y_mag + np.abs(d))


class _Search:
    """Bounds, attacks and input splitting for one property, within a deadline."""

    def __init__(self, model: _Model, prop: Property, method: str, deadline: float, seed: int, batch: int = 1,
                 max_queue_bytes: int = INPUT_QUEUE_BYTES) -> None:
        self.model, self.prop, self.method, self.deadline = model, prop, method, deadline
        self.batch, self.max_queue_bytes = batch, max_queue_bytes
        self.attacked = 0  # open boxes attacked (input splitting): one in DESCEND_EVERY descends
        self.rng = np.random.default_rng(seed)
        self.boxes = 0
        self.domains = 0  # ReLU subdomains bounded (bab-relu)
        self.proved = math.inf  # the smallest gap of a refuted (box, group)
        self.best_lower = math.inf
        self.pending: list[float] = []
        self.reason = ""
        self.progress = sys.stderr.isatty()
        self.rejected = 0  # candidates that passed float64 but failed a re-check
        self.open_bounds: tuple[np.ndarray, np.ndarray] = (np.array(-np.inf), np.array(np.inf))
        self._dag: Any = False  # ``_plain_dag``: not looked at yet

    def time_left(self) -> bool:
        return time.perf_counter() < self.deadline

    def bound(self, lo: np.ndarray, hi: np.ndarray, c: np.ndarray):
        """Bounds of the box and of its rows ``c`` (``DeadlineExceeded`` when time runs out first)."""
        r = self.model.crown(lo, hi, method=self.method, spec=c if c.shape[0] else None, deadline=self.deadline,
                             keep_refined=True)
        self.boxes += 1
        if not c.shape[0]:
            return r, np.zeros((1, 0)), None
        return r, r.spec_lower, r.spec_coefficients

    # -- candidates ---------------------------------------------------------------------------

    def check(self, x: np.ndarray, lo: np.ndarray, hi: np.ndarray, groups) -> dict[str, Any] | None:
        """A reproduced counterexample at (the binary32 point nearest) x, or None."""
        x = _float32_inside(x, lo, hi, *self.open_bounds)
        if x is None:
            return None
        y64 = self.model.evaluate(x, "float64")
        hits = [g for g in groups if _satisfies(y64, g)]
        if not hits:
            return None
        y32 = self.model.evaluate(x, "float32")
        yrt = self.model.onnxruntime(x)
        for g in hits:
            if _satisfies(y32, g) and yrt is not None and _satisfies(yrt, g):
                return {"x": x.reshape(-1).tolist(), "y": y64.tolist(), "y_float32": y32.tolist(),
                        "y_onnxruntime": yrt.tolist()}
        self.rejected += 1
        return None

    def attack(self, lo: np.ndarray, hi: np.ndarray, groups, coeffs, budget: int,
               descend: bool = True, whole: bool = False) -> dict[str, Any] | None:
        """Centre, corners of each row's linear lower bound, random points, then (with ``descend``) PGD
        over the plain DAG (``_pgd``; ``whole``: on a property's whole box, with ``Dag.restarts``), or where
        there is none projected steps from the best point, which cost up to 24 CROWN passes."""
        pts = [lo * 0.5 + hi * 0.5]
        if coeffs is not None:
            for k in range(coeffs.shape[1]):
                pts.append(np.where(coeffs[0, k].reshape(lo.shape) > 0, lo, hi))
        for _ in range(budget):
            pts.append(np.where(self.rng.random(lo.shape) < 0.5, lo, hi))
            pts.append(lo + self.rng.random(lo.shape) * (hi - lo))
        dag = self._plain_dag()
        if dag is not None:
            # one batched forward of the plain DAG ranks the points; only those it finds violating are
            # re-checked (a point's own evaluations, float32 and onnxruntime), then PGD (a few milliseconds)
            with np.errstate(all="ignore"):
                y = dag.forward(np.stack(pts).reshape(len(pts), -1))[0]
            score = np.min([_violations(y, g) for g in groups], axis=0)
            for i in np.argsort(score, kind="stable"):
                if not self.time_left():
                    return None
                if not score[i] <= 0:
                    break
                found = self.check(pts[i], lo, hi, groups)
                if found is not None:
                    return found
            return self._pgd(lo, hi, groups, whole=whole) if descend else None
        best, best_x = np.inf, None
        for x in pts:
            if not self.time_left():
                return None
            found = self.check(x, lo, hi, groups)
            if found is not None:
                return found
            score = min(_violation(self.model.evaluate(x, "float64"), g) for g in groups)
            if score < best:
                best, best_x = score, x
        return self._descend(best_x, lo, hi, groups) if best_x is not None and descend else None

    def _descend(self, x: np.ndarray, lo: np.ndarray, hi: np.ndarray, groups) -> dict[str, Any] | None:
        """Projected sign steps along the coefficients of linear bounds on a small box around x."""
        width = hi - lo
        step = 0.25
        for _ in range(24):
            if not self.time_left() or step < 1e-4:
                return None
            y = self.model.evaluate(x, "float64")
            g = min(groups, key=lambda g: _violation(y, g))
            c, d, _ = g
            k = int(np.argmax(c @ y - d)) if c.shape[0] else 0
            if not c.shape[0]:
                return self.check(x, lo, hi, groups)
            delta = np.maximum(width * 1e-3, 0.0)
            r = self.model.crown(np.maximum(x - delta, lo), np.minimum(x + delta, hi), method="crown", spec=c[k:k + 1],
                                 deadline=self.deadline)
            coef = r.spec_coefficients[0][0, 0].reshape(x.shape) if r.spec_coefficients else np.zeros_like(x)
            trial = np.clip(x - step * width * np.sign(coef), lo, hi)
            found = self.check(trial, lo, hi, groups)
            if found is not None:
                return found
            if _violation(self.model.evaluate(trial, "float64"), g) < _violation(y, g):
                x = trial
            else:
                step *= 0.5
        return None

    # -- the loop -----------------------------------------------------------------------------

    def case(self, index: int, case: Case, report: list) -> tuple[str, dict[str, Any] | None]:
        """'unsat' when every group is refuted on every sub-box; 'sat' with a counterexample; else 'unknown'.

        Each round pops up to ``self.batch`` boxes (the most promising first) and bounds them in one
        batched CROWN pass with every row of the case as the specification; a box keeps the groups its
        ancestors left open."""
        from semantics.linear_bounds.crown import DeadlineExceeded
        lo0, hi0 = case.lower, case.upper
        # a strict input bound: candidates must lie above (below) it; the bounds cover the closed box
        self.open_bounds = (np.where(case.lower_open, lo0, -np.inf), np.where(case.upper_open, hi0, np.inf))
        groups_all = list(case.groups)
        c = np.concatenate([g[0] for g in groups_all]) if groups_all else np.zeros((0, self.prop.n_outputs))
        rows_of, start = [], 0
        for g in groups_all:
            rows_of.append(slice(start, start + g[0].shape[0]))
            start += g[0].shape[0]
        # one queue entry: two float64 boxes, its group indices, the tuple (heapq entries are small objects)
        per_box = 16 * lo0.size + 8 * len(groups_all) + 200
        cap = max(1, self.max_queue_bytes // per_box)
        # few input entries: split the one that spreads the split nodes' inputs most (``split_axis``; measured at
        # the first split, so a case decided on its whole box costs no IBP pass)
        measure, sensitivity = lo0.size <= INPUT_SPLIT_DIMS, None
        queue: list[tuple[float, int, np.ndarray, np.ndarray, tuple[int, ...], float]] = [
            (0.0, 0, lo0, hi0, tuple(range(len(groups_all))), -math.inf)]
        order = 1
        first = True
        while queue:
            if not self.time_left():
                self._open_lower(min(q[5] for q in queue))
                return "unknown", None
            if len(queue) > cap:
                self._open_lower(min(q[5] for q in queue))
                self.reason = f"memory cap: {len(queue)} open boxes exceed {self.max_queue_bytes} bytes"
                return "unknown", None
            picked = [heapq.heappop(queue) for _ in range(min(1 if first else self.batch, len(queue)))]
            # a box's lower bound until it is bounded: its parent's (sound on the sub-box)
            self.pending = [q[5] for q in queue] + [p[5] for p in picked]
            los, his = np.stack([p[2] for p in picked]), np.stack([p[3] for p in picked])
            try:
                if first and self.method == "alpha-crown":  # CROWN first: alpha-CROWN's optimization only if needed
                    got = self.bound_many(los, his, c, method="crown")
                    if not _decides(got[0][0], got[1][0], got[2][0], groups_all, rows_of):
                        # the cheap points before the optimization (seconds on a deep sigmoid net): sat comes fast
                        found = self._cheap_points(lo0, hi0, got, groups_all, rows_of)
                        if found is not None:
                            report.append({"case": index, "lower": got[0][0].tolist(), "upper": got[1][0].tolist(),
                                           "fallback": got[4]})
                            return "sat", found
                        self.boxes -= len(picked)  # the same box again, not another one
                        got = self.bound_many(los, his, c)
                else:
                    got = self.bound_many(los, his, c)
                y_lo, y_hi, spec_lo, coeffs, fallback, line_lo = got
            except DeadlineExceeded:
                if first:  # report the box's interval bounds (a fraction of one CROWN pass)
                    r = self.model.crown(lo0, hi0, method="ibp")
                    report.append({"case": index, "lower": r.lower[0].reshape(-1).tolist(),
                                   "upper": r.upper[0].reshape(-1).tolist(), "method": "ibp"})
                return "unknown", None
            top = first
            if first:
                report.append({"case": index, "lower": y_lo[0].tolist(), "upper": y_hi[0].tolist(),
                               "fallback": fallback})
                first = False
            for j, (_, _, lo, hi, open_idx, parent_lower) in enumerate(picked):
                y_mag = _output_magnitude(y_lo[j], y_hi[j])
                still, worst = [], []
                for gi in open_idx:
                    refuted, gap = _group_gap(spec_lo[j], groups_all[gi], rows_of[gi], y_mag)
                    if refuted:
                        self.proved = min(self.proved, float(np.max(gap)))
                        continue  # some row of the group cannot hold anywhere in the box
                    still.append(gi)
                    worst.append(float(np.max(gap, initial=-np.inf)))
                if not still:
                    continue
                if line_lo is not None:  # the part of the box where a counterexample can lie (``input_clip``)
                    levels = [(rows_of[gi], groups_all[gi][1] + _margin(groups_all[gi][0], groups_all[gi][1], y_mag))
                              for gi in still]
                    clip = clipped_box(lo, hi, coeffs[j], line_lo[j], levels)
                    if clip is None:
                        continue  # every open group's rows exclude the whole box together
                    lo, hi, kept = clip
                    still, worst = [still[i] for i in kept], [worst[i] for i in kept]
                open_groups = [groups_all[gi] for gi in still]
                sub = None if coeffs is None else _group_rows(coeffs[j:j + 1], rows_of, still)
                self.attacked += 1
                try:
                    found = self.attack(lo, hi, open_groups, sub, budget=8 if top else 2,
                                        descend=top or self.attacked % DESCEND_EVERY == 0, whole=top)
                except DeadlineExceeded:
                    return "unknown", None
                if found is not None:
                    return "sat", found
                if measure:
                    measure, sensitivity = False, input_sensitivity(self.model.crown, lo0, hi0)
                dim = split_axis(lo, hi, sub, sensitivity)
                if dim is None:
                    return "unknown", None
                mid = lo.reshape(-1)[dim] * 0.5 + hi.reshape(-1)[dim] * 0.5
                if not lo.reshape(-1)[dim] < mid < hi.reshape(-1)[dim]:
                    return "unknown", None
                for part in (0, 1):
                    a, b = lo.copy().reshape(-1), hi.copy().reshape(-1)
                    if part == 0:
                        b[dim] = mid
                    else:
                        a[dim] = mid
                    heapq.heappush(queue, (-max(worst), order, a.reshape(lo.shape), b.reshape(hi.shape), tuple(still),
                                           max(parent_lower, min(worst))))
                    order += 1
        self.pending = []
        return "unsat", None

    def _cheap_points(self, lo: np.ndarray, hi: np.ndarray, got, groups_all, rows_of) -> dict[str, Any] | None:
        """``attack``'s cheap points (no projected steps, so no CROWN pass) on one box, against the groups its
        bounds ``got`` (``bound_many``'s, one box) leave open, with their rows' coefficients."""
        y_lo, y_hi, spec_lo, coeffs, _, _ = got
        y_mag = _output_magnitude(y_lo[0], y_hi[0])
        still = [gi for gi in range(len(groups_all))
                 if not _group_gap(spec_lo[0], groups_all[gi], rows_of[gi], y_mag)[0]]
        sub = None if coeffs is None else _group_rows(coeffs[:1], rows_of, still)  # (some group is open)
        return self.attack(lo, hi, [groups_all[gi] for gi in still], sub, budget=8, descend=False)

    def bound_many(self, los: np.ndarray, his: np.ndarray, c: np.ndarray, method: str | None = None):
        """Bounds of M boxes ``[M, *input shape]`` against rows ``c``: output lower and upper ``[M, outputs]``,
        row lower bounds ``[M, K]``, the input coefficients ``[M, K, inputs]`` of their linear lower bounds
        (None without CROWN's), the first box's fallback kinds, and those linear bounds' own lower bounds
        ``[M, K]`` (``LinearBounds.spec_line_lower``; None without CROWN's). One pass of the graph rebatched
        to the next power of two (padded with the last box) when it rebatches and the working-memory limit
        allows, else a pass per box."""
        m = los.shape[0]
        size = 1 << max(0, (m - 1).bit_length())
        crown = self.model.batched_crown(size) if size > 1 else None
        if crown is not None:
            pad = lambda x: np.concatenate([x, np.repeat(x[-1:], size - m, axis=0)]) if size > m else x  # noqa: E731
            shape = (size,) + tuple(self.model.input_shape[1:])
            try:
                got = self._bound_pass(crown, pad(los).reshape(shape), pad(his).reshape(shape), c, m, method)
                self.boxes += m
                return got
            except BridgeError:  # a relaxation the memory limit refuses at this batch: one box per pass
                self.model.refuse_batch(size)
        parts = []
        for i in range(m):
            parts.append(self._bound_pass(self.model.crown, los[i], his[i], c, 1, method))
            self.boxes += 1
        coeffs, line_lo = (None if any(p[k] is None for p in parts) else np.concatenate([p[k] for p in parts])
                           for k in (3, 5))
        return (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]),
                np.concatenate([p[2] for p in parts]), coeffs, parts[0][4], line_lo)

    def _bound_pass(self, crown, lo: np.ndarray, hi: np.ndarray, c: np.ndarray, m: int, method: str | None = None):
        r = crown(lo, hi, method=method or self.method, spec=c if c.shape[0] else None, deadline=self.deadline)
        y_lo, y_hi = r.lower[0].reshape(crown.n, -1)[:m], r.upper[0].reshape(crown.n, -1)[:m]
        spec_lo = r.spec_lower[:m] if c.shape[0] else np.zeros((m, 0))
        coeffs = line_lo = None
        if c.shape[0] and r.spec_coefficients:
            coeffs = r.spec_coefficients[0].reshape(crown.n, c.shape[0], -1)[:m]
            line_lo = r.spec_line_lower[:m]
        return y_lo, y_hi, spec_lo, coeffs, sorted(set(r.fallback.values())), line_lo

    def _has_dag(self) -> bool:
        return self._plain_dag() is not None

    def _plain_dag(self):
        """The network as a ``bab.Dag`` for PGD (built once), or None when it is not a DAG of affine layers,
        adds, (leaky) ReLUs and max pools (``chain.dag_layers``)."""
        if self._dag is False:
            from semantics.linear_bounds.chain import dag_layers
            from .bab import Dag
            got = dag_layers(self.model.crown)
            self._dag = None if got is None else Dag(self.model.crown, got)
        return self._dag

    def _pgd(self, lo: np.ndarray, hi: np.ndarray, groups, targets=None, whole: bool = False
             ) -> dict[str, Any] | None:
        """Multi-restart PGD on each group of ``targets`` (default: every group; DAGs of affine layers,
        adds, (leaky) ReLUs and max pools only: ``chain.dag_layers``): the best few points re-checked as
        counterexamples of any of ``groups``. ``whole``: one of the property's whole boxes, where the restarts
        fill a budget of work (``Dag.restarts``: thousands on a small network; the property's boxes share it)
        instead of ``pgd.RESTARTS``."""
        from .bab import RESTARTS, ROOT_MACS, pgd_candidates
        dag = self._plain_dag()
        if dag is None or not self.time_left():
            return None
        # the whole boxes of a property share one budget: a property of thousands of boxes stays at RESTARTS
        restarts = dag.restarts(macs=ROOT_MACS // max(1, len(self.prop.cases))) if whole else RESTARTS
        for c, d, _ in groups if targets is None else targets:
            if not c.shape[0]:
                continue
            if not self.time_left():
                return None
            for x in pgd_candidates(dag, lo.reshape(-1), hi.reshape(-1), c, d, self.rng,
                                     restarts=restarts, deadline=self.deadline)[:4]:
                found = self.check(x.reshape(lo.shape), lo, hi, groups)
                if found is not None:
                    return found
        return None

    def _open_lower(self, value: float) -> None:
        """The search stopped with domains open: the global lower bound is the smallest open one."""
        self.best_lower = min(self.best_lower, value, self.proved)

    def relu_case(self, index: int, case: Case, report: list) -> tuple[str, dict[str, Any] | None]:
        """bab-relu: CROWN on the whole box, the attack, then ReLU branch and bound per open group."""
        from semantics.linear_bounds.crown import DeadlineExceeded
        from .bab import ReluBab
        lo, hi = case.lower, case.upper
        self.open_bounds = (np.where(case.lower_open, lo, -np.inf), np.where(case.upper_open, hi, np.inf))
        groups = list(case.groups)
        c = np.concatenate([g[0] for g in groups]) if groups else np.zeros((0, self.prop.n_outputs))
        try:
            r, spec_lo, coeffs = self.bound(lo, hi, c)
        except DeadlineExceeded:
            return "unknown", None
        y_lo, y_hi = r.lower[0].reshape(-1), r.upper[0].reshape(-1)
        report.append({"case": index, "lower": y_lo.tolist(), "upper": y_hi.tolist(),
                       "fallback": sorted(set(r.fallback.values()))})
        y_mag = _output_magnitude(y_lo, y_hi)
        open_groups, start = [], 0
        for g in groups:
            cg, dg, _ = g
            rows = slice(start, start + cg.shape[0])
            start += cg.shape[0]
            refuted, gap = _group_gap(spec_lo[0], g, rows, y_mag)
            if refuted:
                self.proved = min(self.proved, float(np.max(gap)))
                continue
            open_groups.append((g, rows, _margin(cg, dg, y_mag), gap))
        if not open_groups:
            return "unsat", None
        sub = coeffs[0][:, np.concatenate([np.arange(x[1].start, x[1].stop) for x in open_groups])] \
            if coeffs is not None else None
        every = [x[0] for x in open_groups]
        # PGD over the plain DAG where there is one; the CROWN-guided descent (a CROWN pass per step) only
        # where there is not: on a CIFAR ResNet its 24 passes cost minutes
        plain = self._has_dag()
        try:
            found = self._pgd(lo, hi, every, whole=True) if plain else None
            if found is None:
                found = self.attack(lo, hi, every, sub, budget=8, descend=not plain)
        except DeadlineExceeded:
            self._open_lower(min(float(np.max(x[3], initial=-np.inf)) for x in open_groups))
            return "unknown", None
        if found is not None:
            return "sat", found
        root_boxes = None  # the split nodes' input boxes on the whole box, from the first group's root: shared
        for n_done, (g, _, margin, gap) in enumerate(open_groups):
            cg, dg, _ = g
            if not cg.shape[0]:  # an empty conjunction holds everywhere: the attack decides it
                return "unknown", None
            search = ReluBab(self.model, lo, hi, cg, dg, margin, self.deadline, method="beta-crown",
                             attack=lambda g=g: self._pgd(lo, hi, every, [g]) or self.attack(lo, hi, every, None,
                                                                                             budget=2, descend=not plain),
                             progress=self.progress, check=lambda x: self.check(x, lo, hi, every),
                             root_boxes=root_boxes, seeds=r.refined_boxes)
            out = search.run(gap)
            root_boxes = out.root_boxes
            self.domains += out.domains
            if out.result == "sat":
                return "sat", out.counterexample
            if out.result == "unknown":
                rest = [float(np.max(x[3], initial=-np.inf)) for x in open_groups[n_done + 1:]]
                self._open_lower(min([out.best_lower] + rest))
                self.reason = out.reason
                return "unknown", None
            self.proved = min(self.proved, out.best_lower)
        return "unsat", None


def _output_magnitude(y_lo: np.ndarray, y_hi: np.ndarray) -> float:
    """The largest |output| bound of one box, which ``_margin`` scales with."""
    return float(np.max(np.maximum(np.abs(y_lo), np.abs(y_hi)), initial=0.0))


def _group_gap(spec_lo: np.ndarray, group, rows: slice, y_mag: float) -> tuple[bool, np.ndarray]:
    """One box's gaps ``lower - d - margin`` of a group's rows, and whether they refute the group (some
    row's gap > 0: that row cannot hold anywhere in the box)."""
    cg, dg, _ = group
    gap = spec_lo[rows] - dg - _margin(cg, dg, y_mag)
    return bool(cg.shape[0] and np.any(gap > 0)), gap


def _group_rows(coeffs: np.ndarray, rows_of: list[slice], groups: list[int]) -> np.ndarray:
    """The rows of ``coeffs`` ``[1, K, inputs]`` that belong to ``groups`` (indices into ``rows_of``)."""
    return coeffs[:, np.concatenate([np.arange(rows_of[gi].start, rows_of[gi].stop) for gi in groups])]


def _decides(y_lo: np.ndarray, y_hi: np.ndarray, spec_lo: np.ndarray, groups, rows_of) -> bool:
    """Whether one box's bounds refute every group."""
    y_mag = _output_magnitude(y_lo, y_hi)
    return all(_group_gap(spec_lo, group, rows, y_mag)[0] for group, rows in zip(groups, rows_of))


def _float32_inside(x: np.ndarray, lo: np.ndarray, hi: np.ndarray, above: np.ndarray, below: np.ndarray
                    ) -> np.ndarray | None:
    """The binary32 point nearest x moved inside [lo, hi] and strictly between ``above`` and ``below``
    (the open sides of the property's box; -inf / inf elsewhere), as float64; None when there is no
    such point."""
    with np.errstate(over="ignore"):  # bounds beyond binary32's range round to +-inf: refused below
        x32 = np.clip(x, lo, hi).astype(np.float32)
        low = (x32.astype(np.float64) < lo) | (x32.astype(np.float64) <= above)
        x32 = np.where(low, np.nextafter(x32, np.float32(np.inf)), x32)
        high = (x32.astype(np.float64) > hi) | (x32.astype(np.float64) >= below)
        x32 = np.where(high, np.nextafter(x32, np.float32(-np.inf)), x32)
    out = x32.astype(np.float64)
    inside = (out >= lo) & (out <= hi) & (out > above) & (out < below) & np.isfinite(out)
    return out if np.all(inside) else None


def _satisfies(y: np.ndarray, group) -> bool:
    c, d, strict = group
    if not np.all(np.isfinite(y)):
        return False
    v = c @ y
    return bool(np.all(np.where(strict, v < d, v <= d)))


def _violations(y: np.ndarray, group) -> np.ndarray:
    """max_k (c_k . y - d_k) of a group for each row of outputs ``y`` ``[P, outputs]`` (<= 0: the group holds;
    -inf for a group without rows; NaN outputs give +inf, never a candidate)."""
    c, d, _ = group
    if not c.shape[0]:
        return np.full(y.shape[0], -np.inf)
    v = np.max(y @ c.T - d, axis=1)
    return np.where(np.isnan(v), np.inf, v)


def _violation(y: np.ndarray, group) -> float:
    """``_violations`` of one output vector."""
    return float(_violations(y.reshape(1, -1), group)[0])


def box_cost(model: _Model) -> int:
    """Bytes one box adds to a batched CROWN pass, an upper estimate: a backward pass from a node of
    width w carries a ``[w, width]`` coefficient matrix per ancestor, so the sum of the per-box widths of
    the input-dependent values times the largest, in float64, x4 (lower and upper, and the products'
    temporaries)."""
    crown = model.crown
    widths = [math.prod(node.out_shape[1:]) for node in crown.graph.nodes if not crown.const[node.id]]
    return 32 * sum(widths) * max(widths, default=1)


def input_batch(model: _Model, budget: int = INPUT_BATCH_BYTES) -> int:
    """Boxes per CROWN pass for input splitting: INPUT_BATCH, fewer when their cost exceeds the budget."""
    return max(1, min(INPUT_BATCH, budget // max(1, box_cost(model))))


def choose_method(model: _Model, case: Case) -> str:
    """``auto``: bab-input for at most INPUT_SPLIT_DIMS input entries or no unstable unit of a
    piecewise-linear op (ReLU, leaky ReLU, abs, clamp, max pool) under IBP, else bab-relu (see the
    module docstring)."""
    from semantics.linear_bounds.splits import split_nodes, unstable_units
    dims = int(np.prod(model.input_shape))
    if dims <= INPUT_SPLIT_DIMS:
        return "bab-input"
    if not split_nodes(model.crown) or not model.crown.float_nodes:  # nothing to split, or no CROWN pass
        return "bab-input"
    unstable = unstable_units(model.crown, model.crown.ibp(case.lower, case.upper))
    return "bab-relu" if unstable else "bab-input"


def verify(model: _Model, prop: Property, method: str = "crown", timeout: float | None = 60.0,
           seed: int = 0, batch: int | None = None, max_queue_bytes: int = INPUT_QUEUE_BYTES) -> VerifyResult:
    """Decide the property on the model (see the module docstring). ``batch``: boxes bounded per CROWN
    pass in input splitting (None: ``input_batch``); ``max_queue_bytes``: its memory cap."""
    if method not in METHODS:
        raise BridgeError(f"verify: unknown method {method!r} (use one of {', '.join(METHODS)})")
    if batch is not None and not (isinstance(batch, int) and not isinstance(batch, bool) and batch >= 1):
        raise BridgeError(f"verify: batch must be a whole number of boxes >= 1, got {batch!r}")
    if timeout is not None and not (isinstance(timeout, (int, float, np.integer, np.floating))
                                    and not isinstance(timeout, bool) and timeout > 0):
        raise BridgeError(f"verify: timeout must be a positive number of seconds, got {timeout!r}")
    if not (isinstance(seed, (int, np.integer)) and not isinstance(seed, bool) and seed >= 0):
        raise BridgeError(f"verify: seed must be a whole number >= 0, got {seed!r}")
    start = time.perf_counter()
    if prop.n_outputs != model.n_outputs:
        raise BridgeError(f"verify: the property declares {prop.n_outputs} outputs Y_j, the network has "
                          f"{model.n_outputs}")
    prop = prop.shaped(model.input_shape)
    bound_method = "crown" if method in ("auto", "bab-input", "bab-relu") else method
    if method == "auto":
        method = choose_method(model, prop.cases[0]) if prop.cases else "bab-input"
        if method == "bab-input" and int(np.prod(model.input_shape)) > INPUT_SPLIT_DIMS:
            # nothing to split in a high-dimensional box (a sigmoid or tanh net): input splitting barely
            # helps, so each box gets alpha-CROWN (its intermediate bounds optimized too)
            bound_method = "alpha-crown"
    deadline = start + (timeout if timeout is not None else float("inf"))
    search = _Search(model, prop, bound_method, deadline, seed, batch=input_batch(model) if batch is None else batch,
                     max_queue_bytes=max_queue_bytes)
    report: list[dict[str, Any]] = []
    answer, reason = "unsat", ""

    def result(answer: str, found: dict[str, Any] | None = None, reason: str = "") -> VerifyResult:
        best: float | None = None  # sat: a counterexample, no bound to report
        if answer == "unknown":
            best = min([search.best_lower, search.proved] + search.pending)
        elif answer == "unsat":
            best = search.proved
        return VerifyResult(answer, time.perf_counter() - start, method, found, report, reason=reason,
                            boxes_explored=search.boxes, domains_visited=search.boxes + search.domains,
                            best_lower_bound=best)

    for i, case in enumerate(prop.cases):
        # bab-relu needs CROWN (float values on every input-dependent node); otherwise the input search
        decide = search.relu_case if method == "bab-relu" and model.crown.float_nodes else search.case
        outcome, found = decide(i, case, report)
        if outcome == "sat":
            return result("sat", found)
        if outcome == "unknown":
            answer = "unknown"
            reason = "timeout" if not search.time_left() else (search.reason or "the bounds could not decide every box")
            break
    if answer == "unknown" and search.rejected and model.onnx_error:
        reason += f"; {search.rejected} float64 counterexample(s) could not be re-checked: {model.onnx_error}"
    return result(answer, None, reason)


def verify_files(model_path: str | Path, vnnlib_path: str | Path, method: str = "crown",
                 timeout: float | None = 60.0, seed: int = 0) -> VerifyResult:
    model = load_model(model_path)
    prop = load_vnnlib(vnnlib_path)
    return verify(model, prop, method=method, timeout=timeout, seed=seed)

