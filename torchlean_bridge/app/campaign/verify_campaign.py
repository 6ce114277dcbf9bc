"""``verify --instances instances.csv --results results.csv``: a VNN-COMP benchmark as a campaign.

One task per instance row, each answered by the single-instance code (``verify_task``). Rows of
``results.csv`` are VNN-COMP's ``benchmark,onnx,vnnlib,prepare_time,result,run_time`` followed by
``counterexample`` (the file of a ``sat`` answer, relative to the results file's folder) and
``reason`` (why ``error``, ``timeout`` or ``unknown``). ``prepare_time`` is the seconds a worker took
to load the network (0 when it had it from an earlier row), ``run_time`` the rest of the row's time.
A row is appended as soon as its instance finishes; with ``--resume`` (the default when the file
exists) the instances already in it are skipped, matched by their onnx and vnnlib as written (a
repeated pair counts its occurrences).
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from pathlib import Path
from typing import Any

from ...errors import BridgeError
from ...fileio import atomic_write_text
from ...report import Finding
from .engine import Engine, Outcome, Task
from .options import emit, engine_from_args
from .instances import Instance, read_instances
from .progress import campaign_progress
from .report import CampaignReport
from .results import open_results
from .verify_task import verify_instance

__all__ = ["COLUMNS", "WORDS", "run_verify_campaign", "run_from_args", "counterexample_folder"]

COLUMNS = ("benchmark", "onnx", "vnnlib", "prepare_time", "result", "run_time", "counterexample", "reason")
WORDS = ("unsat", "sat", "unknown", "timeout", "error")


def counterexample_folder(results: Path) -> Path:
    """``results.csv`` -> ``results.counterexamples/`` beside it."""
    return results.with_name(results.stem + ".counterexamples")


def _cex_name(inst: Instance) -> str:
    def stem(p: str) -> str:
        name = Path(p).name.removesuffix(".gz")
        return Path(name).stem or "x"
    return f"{inst.line:05d}_{stem(inst.onnx)}_{stem(inst.vnnlib)}.counterexample"


def run_verify_campaign(instances: str | Path, results: str | Path, engine: Engine, *, method: str = "crown",
                        seed: int = 0, resume: bool | None = None, quiet: bool = False) -> CampaignReport:
    """Run every instance not yet in ``results`` on ``engine``; the report covers all rows."""
    start = time.monotonic()
    results = Path(results)
    rows = read_instances(instances)
    benchmark = Path(instances).resolve().parent.name
    report = CampaignReport(f"verify campaign {instances}", COLUMNS, "result", WORDS)
    report.engine = engine.name
    resume = results.exists() if resume is None else resume
    with open_results(results, len(COLUMNS), resume) as out:
        done = Counter((r[1], r[2]) for r in out.rows)
        for r in out.rows:
            if r[4] not in WORDS:
                raise BridgeError(f"--results {results}: result {r[4]!r} is not one of {', '.join(WORDS)}")
            _add(report, dict(zip(COLUMNS, r)))
        todo: list[Instance] = []
        for inst in rows:
            pair = (inst.onnx, inst.vnnlib)
            if done[pair] > 0:
                done[pair] -= 1
                report.skipped += 1
            else:
                todo.append(inst)
        by_key = {str(inst.line): inst for inst in todo}
        cex_dir = counterexample_folder(results)

        def record(inst: Instance, word: str, run_time: float, reason: str, cex: str | None = None,
                   prepare: float = 0.0) -> None:
            cex_field = ""
            if cex is not None:
                target = cex_dir / _cex_name(inst)
                atomic_write_text(target, cex)
                cex_field = str(target.relative_to(results.parent))
            row = [benchmark, inst.onnx, inst.vnnlib, f"{prepare:.6f}", word, f"{run_time:.6f}", cex_field, reason]
            out.append(row)
            _add(report, dict(zip(COLUMNS, out.rows[-1])))
            report.ran += 1

        tasks = []
        with campaign_progress(len(todo), "verify", quiet) as advance:
            for inst in todo:
                if inst.problem:
                    record(inst, "error", 0.0, inst.problem)
                    advance(False)
                else:
                    tasks.append(Task(str(inst.line), verify_instance, (inst.onnx_path, inst.vnnlib_path),
                                      (method, seed, inst.timeout, inst.vnnlib_path), timeout=inst.timeout))

            def on_outcome(o: Outcome) -> None:
                inst = by_key[o.key]
                if o.status == "done":
                    v: dict[str, Any] = o.value
                    record(inst, v["result"], max(o.elapsed - v["prepare_s"], 0.0), v["reason"], v["counterexample"],
                           v["prepare_s"])
                else:
                    record(inst, o.status, o.elapsed, o.message)
                advance(report.rows[-1]["result"] in ("sat", "unsat"))

            engine.run(tasks, on_outcome)
        report.workers = getattr(engine, "workers", 0)
    report.wall_s = time.monotonic() - start
    return report


def _add(report: CampaignReport, row: dict[str, Any]) -> None:
    report.rows.append(row)
    if row["result"] == "error":
        report.add(Finding("error", f"{row['onnx']} {row['vnnlib']}: {row['reason']}"))


def run_from_args(args: argparse.Namespace) -> int:
    """The verify command's campaign branch (exit 0: every row answered; 1: some row is ``error``)."""
    if args.instances is None:
        raise BridgeError("verify: give MODEL PROP.vnnlib, or --instances instances.csv --results results.csv")
    if args.model is not None or args.property is not None:
        raise BridgeError("verify: --instances replaces MODEL and PROP.vnnlib; give one or the other")
    if args.results is None:
        raise BridgeError("verify: --instances needs --results results.csv")
    report = run_verify_campaign(args.instances, args.results, engine_from_args(args), method=args.method,
                                 seed=args.seed, resume=args.resume)
    emit(report, args.json)
    return 0 if report.ok else 1

