"""``audit BUNDLE --checkpoints GLOB|LIST``: every checkpoint of a run audited against one bundle.

One task per checkpoint, each the single-checkpoint audit (``load_checkpoint`` then ``audit``, the
public ``tlb.audit``), with the bundle and the reference module loaded once per worker. A row says
``ok`` or what is wrong: ``swapped`` (the exchanged tensors named), ``missing`` / ``extra`` keys, or
``failed`` (any other error finding, the first one quoted); a checkpoint that cannot be read is an
``error`` row with the reason.
"""

from __future__ import annotations

import argparse
import glob
import os
import time
from pathlib import Path
from typing import Any

from ...errors import BridgeError
from ...fileio import read_capped
from ...report import Finding
from .engine import Engine, Outcome, Task
from .options import emit, engine_from_args
from .progress import campaign_progress
from .report import CampaignReport

__all__ = ["audit_checkpoint", "checkpoint_list", "run_audit_campaign", "run_from_args", "COLUMNS", "STATUSES"]

COLUMNS = ("checkpoint", "status", "swaps", "missing", "extra", "error_before", "error_after", "message")
STATUSES = ("ok", "swapped", "missing", "extra", "failed", "error", "timeout")
CHECKPOINT_SUFFIXES = (".safetensors", ".pt", ".pth", ".bin", ".onnx", ".json")
PRELOAD = ("torchlean_bridge.app.audit", "importers.checkpoints", "exporters.folder")
MAX_LIST_BYTES = 16 << 20

_cache: dict[tuple, Any] = {}


def checkpoint_list(spec: str) -> list[str]:
    """A list file (one path a line, relative to it; ``#`` comments) or a glob, in sorted order."""
    p = Path(spec)
    if p.is_file() and p.suffix.lower() not in CHECKPOINT_SUFFIXES:
        try:
            text = read_capped(p, "checkpoint list", MAX_LIST_BYTES).decode("utf-8")
        except UnicodeDecodeError:
            raise BridgeError(f"--checkpoints {spec}: the list file is not UTF-8 text") from None
        entries = [ln.strip() for ln in text.splitlines()]
        paths = [str(p.parent / e) for e in entries if e and not e.startswith("#")]
        if not paths:
            raise BridgeError(f"--checkpoints {spec}: the list file names no checkpoint")
        return paths
    paths = sorted(glob.glob(spec, recursive=True))
    if not paths:
        raise BridgeError(f"--checkpoints {spec}: no file matches (give a glob such as 'run/ckpt-*.safetensors' "
                          f"or a list file)")
    return paths


def _once(key: tuple, make: Any) -> Any:
    if key not in _cache:
        _cache[key] = make()
    return _cache[key]


def audit_checkpoint(bundle_path: str, ckpt_path: str, options: dict[str, Any]) -> dict[str, Any]:
    """One checkpoint's row (see the module docstring)."""
    from importers.checkpoints import load_checkpoint

    from ..audit import audit
    from ..commands.common import load_factory, read_array, read_bundle
    bundle = _once(("bundle", bundle_path), lambda: read_bundle(bundle_path))
    reference: Any = None
    if options.get("reference"):
        reference = _once(("reference", options["reference"]), lambda: load_factory(options["reference"],
                                                                                     "--reference"))
    elif options.get("golden"):
        reference = _once(("golden", *options["golden"]), lambda: [read_array(g) for g in options["golden"]])
    inputs = _once(("inputs", *options.get("inputs", ())), lambda: [read_array(i) for i in options.get("inputs", ())])
    ckpt = load_checkpoint(ckpt_path, strip_prefix=None if options.get("keep_prefix") else "module.")
    report = audit(bundle, ckpt, reference=reference, inputs=inputs or None, tolerance=options.get("tolerance", 1e-6),
                   samples=options.get("samples", 5), seed=options.get("seed", 0),
                   strict=options.get("strict", True))
    swaps = ["<->".join(f.keys) if f.kind == "swap" else f"transpose {f.keys[0]}" for f in report.swaps]
    missing = sorted({k for f in report.of_kind("missing") for k in f.keys})
    extra = sorted({k for f in report.of_kind("unexpected") for k in f.keys})
    other = [f for f in report.errors if f.kind not in ("missing", "unexpected", "swap", "transpose", "mismatch")]
    status = [name for name, hit in (("swapped", swaps), ("missing", missing), ("extra", extra), ("failed", other))
              if hit]
    if not status and not report.ok:
        status = ["failed"]
    message = next((f.message for f in report.errors if f.kind not in ("swap", "transpose")), "")
    return {"status": "+".join(status) or "ok", "swaps": "; ".join(swaps), "missing": " ".join(missing),
            "extra": " ".join(extra), "error_before": report.error_before, "error_after": report.error_after,
            "message": message, "report": report.to_json()}


def run_audit_campaign(bundle: str, checkpoints: list[str], engine: Engine, options: dict[str, Any],
                       quiet: bool = False) -> CampaignReport:
    start = time.monotonic()
    report = CampaignReport(f"audit campaign of {len(checkpoints)} checkpoint(s) against {bundle}", COLUMNS,
                            "status", STATUSES)
    report.engine = engine.name
    rows: dict[str, dict[str, Any]] = {}
    tasks = [Task(str(i), audit_checkpoint, (bundle, c), (options,)) for i, c in enumerate(checkpoints)]

    with campaign_progress(len(tasks), "audit", quiet) as advance:
        def on_outcome(o: Outcome) -> None:
            name = checkpoints[int(o.key)]
            if o.status == "done":
                row = {"checkpoint": name, **o.value}
            else:
                row = {"checkpoint": name, "status": o.status, "swaps": "", "missing": "", "extra": "",
                       "error_before": None, "error_after": None, "message": o.message}
            rows[o.key] = row
            advance(row["status"] == "ok")

        engine.run(tasks, on_outcome)
        report.workers = getattr(engine, "workers", 0)
    for t in tasks:  # the checkpoints' order, whatever order they finished in
        row = rows[t.key]
        report.rows.append(row)
        if row["status"] != "ok":
            report.add(Finding(row["status"], f"{row['checkpoint']}: {row['status']}"
                               + (f" ({row['swaps']})" if row["swaps"] else "")
                               + (f": {row['message']}" if row["message"] else "")))
    report.ran = len(tasks)
    report.wall_s = time.monotonic() - start
    return report


def run_from_args(args: argparse.Namespace) -> int:
    """The audit command's campaign branch (exit 0: every checkpoint ok; 1: any is not)."""
    bundle = args.bundle
    if not os.path.exists(bundle):
        raise BridgeError(f"audit: no such bundle: {bundle}")
    if args.reference and args.golden:
        raise BridgeError("audit: give --reference or --golden, not both")
    options = {"reference": args.reference, "golden": [str(Path(g).resolve()) for g in args.golden],
               "inputs": [str(Path(i).resolve()) for i in args.input], "tolerance": args.tolerance,
               "samples": args.samples, "seed": args.seed, "strict": not args.no_strict,
               "keep_prefix": args.keep_prefix}
    report = run_audit_campaign(bundle, checkpoint_list(args.checkpoints), engine_from_args(args), options)
    if args.json is None:
        for row in report.rows:
            print(f"{row['checkpoint']}: {row['status']}" + (f"  {row['swaps']}" if row["swaps"] else "")
                  + (f"  missing: {row['missing']}" if row["missing"] else "")
                  + (f"  extra: {row['extra']}" if row["extra"] else ""))
    emit(report, args.json)
    return 0 if report.ok else 1
