"""The held-out table: ``verify --method auto`` on real VNN-COMP instances against alpha-beta-CROWN's answers.

    python bench/vnncomp_table.py [--vnncomp2021 DIR] [--vnncomp2021-results CSV]
                                  [--vnncomp2022 DIR] [--vnncomp2022-results CSV]
                                  [--per-benchmark N | --all] [--seed S] [--timeout 30] [--workers 1]
                                  [--workdir DIR] [--fresh] [--write]

Per benchmark the script samples ``N`` rows of its instances file (seeded; ``--all``: every row), writes
them to a sampled instances file under ``--workdir`` (absolute paths; a ``.onnx``/``.vnnlib`` the file
names that ships only as ``.gz`` is taken gzipped, as VNN-COMP 2022 ships them) and runs them through the
campaign engine, the code path of ``verify --instances`` (``--method auto``, every row at ``--timeout``
seconds instead of the competition's limit). Results are kept in the workdir and resumed unless
``--fresh``. Each of our answers is compared with alpha-beta-CROWN's word for the same (onnx, vnnlib) in
the competition's results CSV: a wrong answer is our ``sat`` where they proved ``unsat`` or our
``unsat`` where they found a counterexample, and every counterexample we give is re-checked here,
independently of ``verify``: onnxruntime runs the original ONNX file on its ``X`` values, which must lie
in a box of the property, and the outputs must satisfy one of that box's disjuncts.

Timing: alpha-beta-CROWN ran on a GPU with the competition's per-instance limits (116 s to 720 s); we run on
this CPU, one worker per core, at ``--timeout``. The default sample (4 per benchmark, 9 benchmarks) takes at
most about 25 minutes on one core.
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import random
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from torchlean_bridge.errors import BridgeError  # noqa: E402

BEGIN, END = "<!-- vnncomp-table:begin -->", "<!-- vnncomp-table:end -->"
PEERS = Path("/work/peers/vnncomp")
YEARS = {
    "2021": {"root": PEERS / "vnncomp2021" / "benchmarks",
             "results": PEERS / "vnncomp2021_results" / "results_csv" / "a-b-CROWN.csv",
             "benchmarks": ("acasxu", "mnistfc", "oval21", "eran", "cifar10_resnet", "test")},
    "2022": {"root": PEERS / "vnncomp2022_benchmarks" / "benchmarks",
             "results": PEERS / "vnncomp2022_results" / "alpha_beta_crown" / "results.csv",
             "benchmarks": ("mnist_fc", "oval21", "acasxu")},
}
# the competition's result words, as the results CSVs spell them (lower-cased), to ours
REFERENCE_WORDS = {"unsat": "unsat", "holds": "unsat", "sat": "sat", "violated": "sat", "timeout": "timeout",
                   "run_instance_timeout": "timeout", "unknown": "unknown", "error": "error", "": "unknown"}
OUR_WORDS = ("unsat", "sat", "unknown", "timeout", "error")


# --- alpha-beta-CROWN's answers ---------------------------------------------------------------------------

def instance_key(benchmark: str, onnx: str, vnnlib: str) -> tuple[str, str, str]:
    """One spelling of an instance for both files: paths relative to the benchmark folder, without
    ``./``, ``benchmarks/<benchmark>/`` or ``.gz`` (the results CSVs name files from the repository root,
    the instances files from the benchmark folder)."""
    def norm(p: str) -> str:
        p = p.strip().replace("\\", "/")
        while p.startswith("./"):
            p = p[2:]
        prefix = f"benchmarks/{benchmark}/"
        if p.startswith(prefix):
            p = p[len(prefix):]
        return p.removesuffix(".gz")
    return benchmark, norm(onnx), norm(vnnlib)


def read_reference(text: str, where: str) -> dict[tuple[str, str, str], str]:
    """A competition results CSV (``benchmark,onnx,vnnlib,prepare_time,result,run_time``) as
    ``{instance_key: word}`` in our words; blank lines are skipped, anything else malformed is refused."""
    out: dict[tuple[str, str, str], str] = {}
    for n, row in enumerate(csv.reader(io.StringIO(text)), 1):
        if not any(f.strip() for f in row):
            continue
        if len(row) != 6:
            raise BridgeError(f"{where} line {n}: expected 6 fields (benchmark, onnx, vnnlib, prepare time, "
                              f"result, run time), got {len(row)}")
        word = row[4].strip().lower()
        if word not in REFERENCE_WORDS:
            raise BridgeError(f"{where} line {n}: result {row[4]!r} is not one of "
                              f"{', '.join(w for w in REFERENCE_WORDS if w)} (or empty)")
        key = instance_key(row[0].strip(), row[1], row[2])
        if key in out and out[key] != REFERENCE_WORDS[word]:
            raise BridgeError(f"{where} line {n}: {key[1]} {key[2]} is listed twice with different results")
        out[key] = REFERENCE_WORDS[word]
    return out


# --- the comparison ---------------------------------------------------------------------------------------

@dataclass
class Row:
    """One instance we ran: our word, theirs, the seconds it took and whether our counterexample held."""
    benchmark: str
    onnx: str
    vnnlib: str
    ours: str
    theirs: str | None  # None: not in their results
    seconds: float
    cex_ok: bool | None = None  # for our sat: the independent re-check


@dataclass
class Tally:
    benchmark: str
    run: int = 0
    their_unsat: int = 0
    our_unsat_of_theirs: int = 0
    their_sat: int = 0
    our_sat_of_theirs: int = 0
    wrong: int = 0
    cex_failed: int = 0
    unknown: int = 0  # unknown or timeout
    errors: int = 0
    not_in_reference: int = 0
    seconds: list[float] = field(default_factory=list)
    wrong_rows: list[str] = field(default_factory=list)

    @property
    def median_s(self) -> float | None:
        return statistics.median(self.seconds) if self.seconds else None


def is_wrong(ours: str, theirs: str | None) -> bool:
    """Our answer contradicts a decided answer of theirs."""
    return {ours, theirs} == {"sat", "unsat"}


def tally(rows: Iterable[Row]) -> list[Tally]:
    """Per benchmark, in the order first seen, then the total (benchmark ``total``)."""
    by: dict[str, Tally] = {}
    total = Tally("total")
    for r in rows:
        for t in (by.setdefault(r.benchmark, Tally(r.benchmark)), total):
            t.run += 1
            t.seconds.append(r.seconds)
            if r.theirs is None:
                t.not_in_reference += 1
            if r.theirs == "unsat":
                t.their_unsat += 1
                t.our_unsat_of_theirs += r.ours == "unsat"
            if r.theirs == "sat":
                t.their_sat += 1
                t.our_sat_of_theirs += r.ours == "sat"
            if is_wrong(r.ours, r.theirs):
                t.wrong += 1
                t.wrong_rows.append(f"{r.onnx} {r.vnnlib}: ours {r.ours}, theirs {r.theirs}")
            if r.ours == "sat" and r.cex_ok is not True:
                t.cex_failed += 1
                t.wrong_rows.append(f"{r.onnx} {r.vnnlib}: counterexample does not reproduce")
            t.unknown += r.ours in ("unknown", "timeout")
            t.errors += r.ours == "error"
    return [*by.values(), total] if by else []


def _pct(k: int, n: int) -> str:
    return f"{k}/{n} ({100.0 * k / n:.0f}%)" if n else "0/0"


def render(year: str, tallies: list[Tally]) -> str:
    lines = [f"VNN-COMP {year}", "",
             "| benchmark | run | a-b-CROWN unsat: ours unsat | a-b-CROWN sat: ours sat | wrong | cex not reproduced "
             "| unknown/timeout | error | median s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for t in tallies:
        med = f"{t.median_s:.1f}" if t.median_s is not None else "-"
        name = f"**{t.benchmark}**" if t.benchmark == "total" else t.benchmark
        extra = f" ({t.not_in_reference} not in their results)" if t.not_in_reference else ""
        lines.append(f"| {name} | {t.run}{extra} | {_pct(t.our_unsat_of_theirs, t.their_unsat)} | "
                     f"{_pct(t.our_sat_of_theirs, t.their_sat)} | {t.wrong} | {t.cex_failed} | {t.unknown} | "
                     f"{t.errors} | {med} |")
    return "\n".join(lines)


# --- counterexamples, re-checked independently of verify -------------------------------------------------

_PAIR = re.compile(r"\(\s*([XY])_(\d+)\s+([^\s()]+)\s*\)")


def parse_counterexample(text: str, where: str) -> tuple[list[float], list[float]]:
    """VNN-COMP's result file for ``sat``: ``sat`` then ``((X_0 v) ... (Y_0 v) ...)``."""
    head, _, body = text.strip().partition("\n")
    if head.strip() != "sat":
        raise BridgeError(f"{where}: a counterexample file starts with 'sat', got {head[:40]!r}")
    xs: dict[int, float] = {}
    ys: dict[int, float] = {}
    for kind, i, v in _PAIR.findall(body):
        (xs if kind == "X" else ys)[int(i)] = float(v)
    for name, d in (("X", xs), ("Y", ys)):
        if sorted(d) != list(range(len(d))):
            raise BridgeError(f"{where}: the {name}_i values are not numbered 0..{len(d) - 1}")
    return [xs[i] for i in range(len(xs))], [ys[i] for i in range(len(ys))]


def counterexample_holds(onnx_path: str, vnnlib_path: str, cex_text: str) -> tuple[bool, str]:
    """onnxruntime on the original network at the counterexample's X; X in a box of the property, and
    the outputs satisfying one of its disjuncts exactly (no tolerance)."""
    import numpy as np
    import onnxruntime as ort
    from torchlean_bridge.app.campaign.files import local_file
    from torchlean_bridge.app.vnnlib import parse_vnnlib
    xs, _ = parse_counterexample(cex_text, vnnlib_path)
    prop = parse_vnnlib(Path(local_file(vnnlib_path)).read_text(), vnnlib_path)
    x = np.asarray(xs, dtype=np.float64)
    if x.size != prop.n_inputs:
        return False, f"{x.size} X values, the property has {prop.n_inputs} inputs"
    options = ort.SessionOptions()
    options.log_severity_level = 3
    sess = ort.InferenceSession(local_file(onnx_path), options, providers=["CPUExecutionProvider"])
    inp = sess.get_inputs()[0]
    shape = [d if isinstance(d, int) and d > 0 else 1 for d in inp.shape]
    y = np.asarray(sess.run(None, {inp.name: x.astype(np.float32).reshape(shape)})[0], dtype=np.float64).reshape(-1)
    x32 = x.astype(np.float32).astype(np.float64)  # what the network ran on
    for case in prop.cases:
        inside = (np.all(np.where(case.lower_open, x32 > case.lower, x32 >= case.lower))
                  and np.all(np.where(case.upper_open, x32 < case.upper, x32 <= case.upper)))
        if not inside:
            continue
        for c, d, strict in case.groups:
            v = c @ y
            if np.all(np.where(strict, v < d, v <= d)):
                return True, ""
    return False, "onnxruntime's outputs at X satisfy no disjunct of a box containing X"


# --- sampling and running ----------------------------------------------------------------------------------

def _instances_file(folder: Path, benchmark: str) -> Path:
    for name in (f"{benchmark}_instances.csv", "instances.csv"):
        if (folder / name).is_file():
            return folder / name
    raise BridgeError(f"{folder}: no {benchmark}_instances.csv or instances.csv")


def _existing(folder: Path, written: str) -> Path:
    p = folder / written
    if not p.exists() and Path(str(p) + ".gz").exists():
        return Path(str(p) + ".gz")
    return p


def sample_instances(folder: Path, benchmark: str, n: int | None, seed: int) -> list[tuple[str, str, Path, Path]]:
    """``n`` rows of the benchmark's instances file (all when None), seeded, in file order:
    (onnx as written, vnnlib as written, onnx path, vnnlib path)."""
    path = _instances_file(folder, benchmark)
    rows = [r for r in csv.reader(io.StringIO(path.read_text())) if any(f.strip() for f in r)]
    for i, r in enumerate(rows, 1):
        if len(r) != 3:
            raise BridgeError(f"{path} row {i}: expected 3 fields (onnx, vnnlib, timeout), got {len(r)}")
    picked = range(len(rows)) if n is None or n >= len(rows) else sorted(random.Random(f"{seed}:{benchmark}").sample(
        range(len(rows)), n))
    return [(rows[i][0].strip(), rows[i][1].strip(), _existing(folder, rows[i][0].strip()),
             _existing(folder, rows[i][1].strip())) for i in picked]


def run_year(year: str, root: Path, reference: dict, benchmarks: Iterable[str], args: argparse.Namespace) -> list[Row]:
    from torchlean_bridge.app.campaign.engines import make_engine
    from torchlean_bridge.app.campaign.verify_campaign import run_verify_campaign
    out: list[Row] = []
    for bench in benchmarks:
        folder = root / bench
        if not folder.is_dir():
            print(f"  {year} {bench}: {folder} is absent, skipped", file=sys.stderr)
            continue
        picked = sample_instances(folder, bench, None if args.all else args.per_benchmark, args.seed)
        work = Path(args.workdir) / year / bench
        work.mkdir(parents=True, exist_ok=True)
        sampled = work / "instances.csv"
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerows([str(o), str(v), args.timeout] for _, _, o, v in picked)
        sampled.write_text(buf.getvalue())
        results = work / "results.csv"
        print(f"  {year} {bench}: {len(picked)} instances", file=sys.stderr)
        before = _rows(results)
        run_verify_campaign(sampled, results, make_engine("local", args.workers), method="auto", seed=args.seed,
                            resume=not args.fresh, quiet=True)
        args.ran = args.ran or args.fresh or _rows(results) != before
        written = {(str(o), str(v)): (wo, wv, o, v) for wo, wv, o, v in picked}
        with open(results, newline="") as f:
            for rec in csv.reader(f):
                if not rec or (rec[1], rec[2]) not in written:
                    continue
                wo, wv, o, v = written[(rec[1], rec[2])]
                word, seconds = rec[4], float(rec[3]) + float(rec[5])
                cex_ok = None
                if word == "sat":
                    ok, why = counterexample_holds(str(o), str(v), (results.parent / rec[6]).read_text())
                    cex_ok = ok
                    if not ok:
                        print(f"  COUNTEREXAMPLE FAILS {wo} {wv}: {why}", file=sys.stderr)
                theirs = reference.get(instance_key(bench, wo, wv))
                out.append(Row(bench, wo, wv, word, theirs, seconds, cex_ok))
                reason = f" ({rec[7]})" if rec[7] and word != "unsat" else ""
                print(f"    {wo} {wv}: ours {word} {seconds:.1f}s, theirs {theirs}{reason}", file=sys.stderr)
    return out


def _rows(results: Path) -> int:
    return len(results.read_text().splitlines()) if results.exists() else 0


def _footer(args: argparse.Namespace, run_line: str) -> str:
    """The run's wall time and load: this run's when it bounded instances (kept in the workdir), else the
    stored one of the run whose results were resumed (a resumed table must not report its own second)."""
    stored = Path(args.workdir) / "run.txt"
    if args.ran or not stored.exists():
        stored.write_text(run_line)
        return run_line
    return stored.read_text() + " (Results resumed from that run.)"


def _write_doc(body: str) -> None:
    from torchlean_bridge.fileio import atomic_write_text
    doc = ROOT / "docs" / "verification.md"
    text = doc.read_text()
    if BEGIN not in text or END not in text:
        raise BridgeError(f"{doc}: no {BEGIN} ... {END} markers to replace")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    atomic_write_text(doc, f"{head}{BEGIN}\n{body}\n{END}{tail}")


def _load() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "load unknown"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for year, spec in YEARS.items():
        p.add_argument(f"--vnncomp{year}", type=Path, default=spec["root"], metavar="DIR",
                       help=f"the VNN-COMP {year} benchmarks folder (default {spec['root']})")
        p.add_argument(f"--vnncomp{year}-results", type=Path, default=spec["results"], metavar="CSV",
                       help=f"alpha-beta-CROWN's VNN-COMP {year} results (default {spec['results']})")
    p.add_argument("--per-benchmark", type=int, default=4, metavar="N", help="instances sampled per benchmark")
    p.add_argument("--all", action="store_true", help="every instance of every benchmark")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=30.0, help="seconds per instance (default 30)")
    p.add_argument("--workers", type=int, default=1, help="parallel instances (default 1: one core)")
    p.add_argument("--years", default=",".join(YEARS), help="comma-separated, default 2021,2022")
    p.add_argument("--benchmarks", default="", help="comma-separated subset of the benchmarks (default all)")
    p.add_argument("--workdir", default="/tmp/vnncomp_table", help="sampled instances files and results")
    p.add_argument("--fresh", action="store_true", help="rerun instances already in the workdir's results")
    p.add_argument("--write", action="store_true", help="replace the table in docs/verification.md")
    args = p.parse_args(argv)
    args.ran = False  # whether this run bounded any instance (else its results were all resumed)
    if args.per_benchmark < 1:
        p.error("--per-benchmark must be at least 1")
    if not args.timeout > 0:
        p.error("--timeout must be positive")
    chosen = [b for b in args.benchmarks.split(",") if b]
    start, load_before = time.monotonic(), _load()
    sections: list[str] = []
    problems = 0
    for year in [y for y in args.years.split(",") if y]:
        if year not in YEARS:
            p.error(f"--years: {year!r} is not one of {', '.join(YEARS)}")
        root, ref_path = getattr(args, f"vnncomp{year}"), getattr(args, f"vnncomp{year}_results")
        if not root.is_dir() or not ref_path.is_file():
            print(f"VNN-COMP {year}: benchmarks {root} or results {ref_path} absent; give --vnncomp{year} DIR "
                  f"and --vnncomp{year}-results CSV (skipped)", file=sys.stderr)
            continue
        reference = read_reference(ref_path.read_text(), str(ref_path))
        benches = [b for b in YEARS[year]["benchmarks"] if not chosen or b in chosen]
        tallies = tally(run_year(year, root, reference, benches, args))
        if not tallies:
            continue
        total = tallies[-1]
        problems += total.wrong + total.cex_failed + total.errors
        for t in tallies[:-1]:
            for w in t.wrong_rows:
                print(f"  WRONG {year} {t.benchmark}: {w}", file=sys.stderr)
        sections.append(render(year, tallies))
    if not sections:
        print("no benchmarks found", file=sys.stderr)
        return 1
    sample = "every instance" if args.all else f"{args.per_benchmark} instances per benchmark (seed {args.seed})"
    foot = (f"Sample: {sample}; `verify --method auto` through the campaign engine, {args.workers} worker(s), "
            f"{args.timeout:g} s per instance (alpha-beta-CROWN: a GPU and the competition's limits, 116-720 s). "
            + _footer(args, f"Wall time {time.monotonic() - start:.0f} s. Load when the run started: `{load_before}`; "
                            f"when it ended: `{_load()}`."))
    body = "\n\n".join(sections) + "\n\n" + foot
    print(body)
    if args.write:
        _write_doc(body)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
