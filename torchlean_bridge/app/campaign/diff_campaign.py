"""``diff BUNDLE --inputs FILE.npz|DIR``: a dataset's input sets compared in batches on a campaign engine.

One task per batch of consecutive input sets: the worker runs the one-process diff (``tlb.diff``) on
its batch, with the bundle, the reference module (or ONNX file) and the dataset loaded once per
worker. The batches' reports merge into exactly the report the one-process diff gives over the
whole dataset (``merge_batches``): a row's maxima are maxima over batches, its counts add up, the
first input set where it exceeded its budget and the one where it was worst are the earliest such
over the batches in dataset order, and the verdict, the classification (root divergence or
downstream) and the findings are computed once, over the merged rows, by the diff's own code.
Exactness assumes the oracle shows the same values on every input set (torch, onnxruntime and
onnx's evaluator do).

A batch whose worker dies or fails is a ``batch-failed`` error naming its sets and the reason; the
others go on, and the verdict then says how many sets were compared (never "agree" over a part of
the dataset). Nothing is written before every batch has finished: Ctrl-C leaves no file.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
import math
import time
from dataclasses import dataclass, field
from importlib.util import find_spec
from typing import Any

from ...errors import BridgeError
from ...report import Finding
from ..diff import DiffReport, _add_findings, _classify
from ..diff_dataset import MAX_SETS
from .engine import Engine, Outcome, Task
from .progress import campaign_progress

__all__ = ["diff_batch", "run_diff_campaign", "merge_batches", "batch_bounds", "default_batch_size",
           "reduce_first_divergence", "run_from_args", "DatasetDiffReport", "MAX_BATCH", "RUN_FINDINGS"]

PRELOAD = ("torchlean_bridge.app.diff", "torchlean_bridge.app.diff_runners", "torchlean_bridge.app.diff_dataset",
           *(("torch",) if find_spec("torch") else ()))  # torch imported once in the fork server, not per worker
MAX_BATCH = 64  # input sets per task at most by default: enough tasks for progress and for balancing workers
RUN_FINDINGS = ("input-skipped", "output-count")  # what the diff adds while it runs the sets, in set order

_cache: dict[tuple, Any] = {}


def _once(key: tuple, make: Any) -> Any:
    if key not in _cache:
        _cache[key] = make()
    return _cache[key]


def _weights_digest(module: Any) -> str:
    """A digest of a module's parameters and buffers: the workers' modules must be the same."""
    h = hashlib.sha256()
    for name, t in sorted(module.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def diff_batch(dataset_path: str, bundle_path: str, start: int, stop: int, options: dict[str, Any]
               ) -> tuple[Any, str]:
    """The one-process diff of input sets ``start..stop-1``, and the digest of the reference weights.
    The dataset file is the task's file (shipped to each worker once); the bundle, a folder or a
    document with its payload beside it, goes by path."""
    from ..commands.common import read_bundle
    from ..diff import diff
    from ..diff_dataset import load_dataset
    bundle = _once(("bundle", bundle_path), lambda: read_bundle(bundle_path))
    dataset = _once(("dataset", bundle_path, dataset_path), lambda: load_dataset(bundle.graph, dataset_path))
    module, digest = None, ""
    if options.get("reference"):
        module, digest = _once(("reference", options["reference"]), lambda: _load_reference(options["reference"]))
    onnx = options.get("onnx")
    report = diff(bundle, against=options["against"], module=module, onnx_model=onnx,
                  dataset=dataset.batch(start, stop))
    return report, digest


def _load_reference(spec: str) -> tuple[Any, str]:
    from ..commands.common import load_factory
    module = load_factory(spec, "--reference")
    return module, _weights_digest(module)


def batch_bounds(count: int, size: int) -> list[tuple[int, int]]:
    """``[start, stop)`` of each batch of ``size`` consecutive sets."""
    return [(a, min(a + size, count)) for a in range(0, count, size)]


def default_batch_size(count: int, workers: int) -> int:
    """About four batches per worker, at most ``MAX_BATCH`` sets each."""
    return max(1, min(MAX_BATCH, math.ceil(count / (4 * max(workers, 1)))))


@dataclass
class DatasetDiffReport(DiffReport):
    """The diff report plus the campaign's figures, and a verdict that counts the sets compared."""

    total: int = 0  # input sets in the dataset
    failed: list[dict[str, Any]] = field(default_factory=list)  # batches not compared, with why
    engine: str = ""
    workers: int = 0
    batches: int = 0
    wall_s: float = 0.0
    busy_s: float = 0.0  # seconds the workers spent in the batches (wall_s x workers when nothing waits)

    @property
    def compared_sets(self) -> int:
        return self.total - sum(b["stop"] - b["start"] for b in self.failed)

    def _verdict(self) -> str:
        if not self.failed:
            return super()._verdict()
        part = (f"NOT FULLY COMPARED: {self.compared_sets} of {self.total} input sets "
                f"({len(self.failed)} batch(es) failed)")
        if self.first_divergence is not None:
            return f"{part}; DIVERGED: {self.first_divergence.message}"
        return f"{part}; no divergence on the sets compared"

    def summary(self) -> str:
        return (super().summary() + f"\n  dataset campaign: {self.total} input set(s) in {self.batches} "
                f"batch(es) on {self.engine} ({self.workers} worker(s)) in {self.wall_s:.2f} s")

    def _extra_json(self) -> dict:
        return {**super()._extra_json(),
                "campaign": {"engine": self.engine, "workers": self.workers, "batches": self.batches,
                             "total": self.total, "compared": self.compared_sets, "failed": self.failed,
                             "wall_s": round(self.wall_s, 6), "busy_s": round(self.busy_s, 6)}}


def _fold(into: Any, part: Any) -> None:
    """Fold a later batch's row into ``into`` exactly as the diff folds a later input set."""
    into.max_abs = max(into.max_abs, part.max_abs)
    into.max_rel = max(into.max_rel, part.max_rel)
    into.max_ulp = max(into.max_ulp, part.max_ulp)
    into.budget = max(into.budget, part.budget)
    into.gap32 = max(into.gap32, part.gap32)
    if part.worst_on is not None and (part.worst_ratio > into.worst_ratio or into.worst_on is None):
        into.worst_on = part.worst_on
    into.worst_ratio = max(into.worst_ratio, part.worst_ratio)
    into.exceeded += part.exceeded
    into.diverged_on = into.diverged_on or part.diverged_on
    into.problem = into.problem or part.problem
    if part.via is not None:
        into.via = part.via


def _merged_row(parts: list[Any]) -> Any:
    """One node's row over the batches that ran sets (in dataset order)."""
    compared = [p for p in parts if p.status != "no counterpart"]
    if not compared:  # never compared: the last batch's reason, as the diff gives the last set's
        return dataclasses.replace(parts[-1])
    row = dataclasses.replace(compared[0], status="ok")
    for p in compared[1:]:
        _fold(row, p)
    ulps = [p.exact_ulps for p in parts if p.exact_ulps is not None]
    row.exact_ulps = max([0.0, *ulps]) if ulps else None
    last = parts[-1]
    if last.status != "no counterpart":
        row.counterpart = last.counterpart
    elif row.via is not None:
        row.counterpart = "finer oracle"
    else:
        row.counterpart = next((p.counterpart for p in compared if p.counterpart != "finer oracle"),
                               compared[-1].counterpart)
    return row


def merge_batches(bundle: Any, reports: list[Any], failed: list[dict[str, Any]], total: int) -> Any:
    """The whole dataset's report from its batches' reports (dataset order; failed batches left out)."""
    g = bundle.graph
    report = DatasetDiffReport(title=reports[0].title if reports else "diff over a dataset",
                             against=reports[0].against if reports else "", total=total, failed=list(failed))
    if reports:
        ran = [r for r in reports if not r.of_kind("no-inputs")] or reports[-1:]
        seen_outputs = False
        for r in reports:
            report.inputs.extend(r.inputs)
            for f in r.findings:
                if f.kind == "output-count" and seen_outputs:
                    continue
                if f.kind in RUN_FINDINGS:
                    report.add(f)
            seen_outputs = seen_outputs or bool(r.outputs)
        if all(r.of_kind("no-inputs") for r in reports):
            report.add(reports[0].of_kind("no-inputs")[0])
        rows = {row.node: _merged_row([r.nodes[k] for r in ran]) for k, row in enumerate(ran[0].nodes)}
        outs = [dataclasses.replace(o) for o in next((r.outputs for r in ran if r.outputs), [])]
        _merge_outputs(outs, [r.outputs for r in ran if r.outputs])
        unmatched = {nid: row.problem for nid, row in rows.items() if row.status == "no counterpart"}
        _classify(g, rows)
        for row in outs:
            row.status = "diverged" if row.worst_ratio > 1.0 else "ok"
        report.nodes, report.outputs = list(rows.values()), outs
        parameters = reports[0].of_kind("parameter-mismatch")
        _add_findings(report, bundle, rows, outs, unmatched, parameters)
        report.extend(parameters)
    for b in failed:
        report.add(Finding("batch-failed", f"input sets {b['start']}..{b['stop'] - 1} not compared: {b['message']}",
                           data=dict(b)))
    return report


def _merge_outputs(outs: list[Any], batches: list[list[Any]]) -> None:
    """Fold every later batch's output rows into the first batch's copies (``outs``)."""
    for later in batches[1:]:
        for into, part in zip(outs, later):
            _fold(into, part)


def run_diff_campaign(bundle_path: str, dataset_path: str, bundle: Any, total: int, engine: Engine,
                      options: dict[str, Any], batch_size: int | None = None, quiet: bool = False) -> Any:
    """The dataset's diff over ``engine`` (``options``: ``against``, ``reference``, ``onnx``)."""
    start_time = time.monotonic()
    size = batch_size or default_batch_size(total, getattr(engine, "workers", 0) or 1)
    bounds = batch_bounds(total, size)
    onnx = options.get("onnx")  # a file the tasks read, like the dataset: shipped once per worker
    fn, files = (_diff_batch_onnx, (dataset_path, onnx)) if onnx else (diff_batch, (dataset_path,))
    tasks = [Task(str(k), fn, files, (bundle_path, a, b, options)) for k, (a, b) in enumerate(bounds)]
    done: dict[int, Any] = {}
    digests: set[str] = set()
    failed: list[dict[str, Any]] = []
    busy = [0.0]
    with campaign_progress(len(tasks), "diff", quiet, solved_label="without divergence") as advance:
        def on_outcome(o: Outcome) -> None:
            busy[0] += o.elapsed
            k = int(o.key)
            a, b = bounds[k]
            if o.status == "done":
                done[k], digest = o.value
                digests.add(digest)
                advance(done[k].ok)
            else:
                failed.append({"batch": k, "start": a, "stop": b, "status": o.status, "message": o.message})
                advance(False)

        try:
            engine.run(tasks, on_outcome)
        finally:
            _cache.clear()  # an in-process engine's loads last one campaign (the files may change after it)
    if len(digests) > 1:
        raise BridgeError(f"--reference {options['reference']}: the factory made different weights in different "
                          "workers (seed it, e.g. torch.manual_seed(0)); the batches are not comparable")
    failed.sort(key=lambda b: b["batch"])
    report = merge_batches(bundle, [done[k] for k in sorted(done)], failed, total)
    report.engine, report.workers, report.batches = engine.name, getattr(engine, "workers", 0), len(tasks)
    report.wall_s, report.busy_s = time.monotonic() - start_time, busy[0]
    return report


def _diff_batch_onnx(dataset_path: str, onnx_path: str, bundle_path: str, start: int, stop: int,
                     options: dict[str, Any]) -> tuple[Any, str]:
    """``diff_batch`` with the ONNX file at its worker-local path."""
    return diff_batch(dataset_path, bundle_path, start, stop, {**options, "onnx": onnx_path})



def reduce_first_divergence(report: Any, bundle: Any, dataset: Any, folder: str, against: str, module: Any,
                            onnx: str | None) -> None:
    """``--reduce`` after a dataset campaign: the one-process diff on the set where the first divergence
    was first seen (the earliest node exceeding anywhere is the earliest there too), reduced here."""
    from ..diff import diff
    first = report.first_divergence
    if first is None or first.node is None:
        report.add(Finding("reduced", "nothing to reduce: no node diverged", severity="info"))
        return
    k = dataset.index((first.data or {})["diverged_on"])
    single = diff(bundle, against=against, module=module, onnx_model=onnx, dataset=dataset.batch(k, k + 1),
                  reduce=folder)
    if single.first_divergence is None or single.first_divergence.node != first.node:
        report.add(Finding("reduce-failed", f"node {first.node} does not diverge first when {dataset.label(k)} "
                                            "is run alone", node=first.node, severity="warning"))
        return
    report.reduced = single.reduced
    report.extend(single.of_kind("reduced", "reduce-failed"))


def run_from_args(args: argparse.Namespace, bundle: Any) -> Any:
    """The diff command's ``--inputs`` branch: the dataset checked here, its batches on the engine."""
    from ..diff_dataset import load_dataset
    from .options import engine_from_args
    if args.batch_size is not None and not 1 <= args.batch_size <= MAX_SETS:
        raise BridgeError(f"diff: --batch-size must be between 1 and {MAX_SETS}, got {args.batch_size}")
    dataset = load_dataset(bundle.graph, args.inputs)  # refused here, before any worker starts
    reference = None
    if args.reference:
        path, _, name = args.reference.rpartition(":")
        reference = f"{os.path.abspath(path)}:{name}" if path else args.reference
    options = {"against": args.against, "reference": reference,
               "onnx": os.path.abspath(args.onnx) if args.onnx else None}
    report = run_diff_campaign(os.path.abspath(args.bundle), os.path.abspath(args.inputs), bundle, len(dataset),
                               engine_from_args(args), options, args.batch_size, args.quiet)
    if args.reduce:
        from ..commands.common import load_factory
        module = load_factory(reference, "--reference") if reference else None
        reduce_first_divergence(report, bundle, dataset, args.reduce, args.against, module, options["onnx"])
    return report
