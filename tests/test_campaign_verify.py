"""``verify --instances``: a VNN-COMP benchmark as a campaign.

Its answers are the single-instance command's (same words, same counterexample), bad rows are
``error`` rows with their reason while the others run, a row out of time is ``timeout``, resuming
runs only what is missing, and killing a worker, Ctrl-C or killing the whole campaign leaves a
results file that a resumed run completes with every instance exactly once.
"""

from __future__ import annotations

import csv
import functools
import gzip
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from tests.cli_process import cli_process
from torchlean_bridge.app.campaign.engines import make_engine
from torchlean_bridge.app.campaign.verify_campaign import COLUMNS, run_verify_campaign
from torchlean_bridge.app.campaign.verify_task import vnncomp_word
from torchlean_bridge.app.cli import main
from torchlean_bridge.app.verify import load_model, verify_files

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "fixtures" / "verify"
X0 = [0.1, -0.2, 0.3, 0.05, -0.1]


def robustness(radius: float) -> str:
    """acas_like around X0: unsafe if output 3 is not above the others (CROWN proves radius 0.15 at once)."""
    lines = [f"(declare-const X_{i} Real)" for i in range(5)] + [f"(declare-const Y_{j} Real)" for j in range(5)]
    for i, c in enumerate(X0):
        lines += [f"(assert (>= X_{i} {c - radius!r}))", f"(assert (<= X_{i} {c + radius!r}))"]
    lines.append("(assert (or (and (<= Y_0 Y_3)) (and (<= Y_1 Y_3)) (and (<= Y_2 Y_3)) (and (<= Y_4 Y_3))))")
    return "\n".join(lines) + "\n"


# for zero.onnx (y = 0 x + 0 everywhere): y < 0 never holds, and no box is refuted (a refutation needs the
# bound above 0 by a margin), so the input splitting runs until its timeout however fast it gets
NEVER_DECIDED = "\n".join([f"(declare-const X_{i} Real)" for i in range(5)] + ["(declare-const Y_0 Real)"]
                          + [f"(assert (>= X_{i} -1.0))\n(assert (<= X_{i} 1.0))" for i in range(5)]
                          + ["(assert (< Y_0 0))"]) + "\n"


@functools.lru_cache(maxsize=1)
def _zero_net() -> bytes:
    """An ONNX Linear(5, 1) with zero weight and bias (exported once per session)."""
    import io

    import torch
    net = torch.nn.Linear(5, 1)
    with torch.no_grad():
        net.weight.zero_()
        net.bias.zero_()
    buf = io.BytesIO()
    torch.onnx.export(net.eval(), (torch.zeros(1, 5),), buf, input_names=["x"], output_names=["y"], dynamo=False)
    return buf.getvalue()


def benchmark(tmp_path: Path) -> Path:
    """A VNN-COMP style folder: onnx/ and vnnlib/ (some gzipped), instances.csv written by the test."""
    bench = tmp_path / "toy"
    (bench / "onnx").mkdir(parents=True)
    (bench / "vnnlib").mkdir()
    shutil.copy(FIX / "acas_like.onnx", bench / "onnx")
    with open(FIX / "cnn_small.onnx", "rb") as src, gzip.open(bench / "onnx" / "cnn_small.onnx.gz", "wb") as dst:
        dst.write(src.read())
    for name in ("acas_robust", "acas_min", "cnn_robust"):
        shutil.copy(FIX / f"{name}.vnnlib", bench / "vnnlib")
    with gzip.open(bench / "vnnlib" / "acas_sat.vnnlib.gz", "wt") as f:
        f.write((FIX / "acas_sat.vnnlib").read_text())
    (bench / "onnx" / "zero.onnx").write_bytes(_zero_net())
    (bench / "vnnlib" / "hard.vnnlib").write_text(NEVER_DECIDED)
    (bench / "vnnlib" / "easy.vnnlib").write_text(robustness(0.15))
    (bench / "vnnlib" / "garbled.vnnlib").write_text("(declare-const X_0 Real)\n(assert (<= X_0 1)\n")
    return bench


def rows_of(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return [dict(zip(COLUMNS, r)) for r in csv.reader(f)]


def plain(path: Path) -> Path:
    """The file a single-instance run reads (decompressed when gzipped)."""
    if path.suffix != ".gz":
        return path
    out = path.with_suffix("")
    out.write_bytes(gzip.decompress(path.read_bytes()))
    return out


def read_counterexample(path: Path) -> tuple[list[float], list[float]]:
    lines = path.read_text().splitlines()
    assert lines[0] == "sat"
    pairs = [ln.strip(" ()").split() for ln in lines[1:]]
    xs = [float(v) for name, v in pairs if name.startswith("X_")]
    ys = [float(v) for name, v in pairs if name.startswith("Y_")]
    return xs, ys


GOOD = [("onnx/acas_like.onnx", "vnnlib/acas_robust.vnnlib", 30), ("onnx/acas_like.onnx", "vnnlib/acas_sat.vnnlib.gz", 30),
        ("onnx/acas_like.onnx", "vnnlib/acas_min.vnnlib", 30), ("onnx/cnn_small.onnx.gz", "vnnlib/cnn_robust.vnnlib", 30),
        ("onnx/zero.onnx", "vnnlib/hard.vnnlib", 0.5)]


@pytest.mark.slow
def test_campaign_answers_equal_the_single_instance_command_and_bad_rows_are_errors(tmp_path):
    bench = benchmark(tmp_path)
    lines = [f"{o},{v},{t}" for o, v, t in GOOD] + [
        "onnx/missing.onnx,vnnlib/acas_robust.vnnlib,30",          # a file that is missing
        "onnx/acas_like.onnx,vnnlib/acas_robust.vnnlib",            # a malformed row
        "onnx/acas_like.onnx,vnnlib/garbled.vnnlib,30",             # a vnnlib that does not parse
        "onnx/acas_like.onnx,vnnlib/easy.vnnlib,-1",                # a timeout that is not one
        "onnx/cnn_small.onnx.gz,vnnlib/acas_robust.vnnlib,30",      # a property for another network
    ]
    (bench / "instances.csv").write_text("\n".join(lines) + "\n\n")
    results = tmp_path / "out" / "results.csv"
    report = run_verify_campaign(bench / "instances.csv", results, make_engine("local", 2), quiet=True)
    rows = rows_of(results)
    assert len(rows) == len(lines) == report.ran and report.skipped == 0
    by_pair = {(r["onnx"], r["vnnlib"]): r for r in rows}
    assert all(r["benchmark"] == "toy" for r in rows)

    for onnx, vnnlib, timeout in GOOD:
        row = by_pair[(onnx, vnnlib)]
        single = verify_files(plain(bench / onnx), plain(bench / vnnlib), timeout=timeout)
        assert row["result"] == vnncomp_word(single.result, single.reason), (onnx, vnnlib, row)
        assert float(row["run_time"]) >= 0 and float(row["prepare_time"]) >= 0
        if single.result == "sat":
            xs, ys = read_counterexample(results.parent / row["counterexample"])
            assert xs == single.counterexample["x"]
            model = load_model(bench / onnx)
            np.testing.assert_allclose(ys, model.evaluate(np.array(xs).reshape(model.input_shape), "float32"),
                                       rtol=1e-5, atol=1e-6)
        else:
            assert row["counterexample"] == ""
    assert by_pair[("onnx/zero.onnx", "vnnlib/hard.vnnlib")]["result"] == "timeout"
    assert {by_pair[("onnx/acas_like.onnx", f"vnnlib/{v}")]["result"] for v in ("acas_sat.vnnlib.gz", "acas_min.vnnlib")} \
        == {"sat"}

    reasons = {(r["onnx"], r["vnnlib"]): r["reason"] for r in rows if r["result"] == "error"}
    assert len(reasons) == 5
    assert "onnx file onnx/missing.onnx not found" in reasons[("onnx/missing.onnx", "vnnlib/acas_robust.vnnlib")]
    assert "line 7: expected 3 fields (onnx, vnnlib, timeout), got 2" in reasons[
        ("onnx/acas_like.onnx", "vnnlib/acas_robust.vnnlib")]
    assert "garbled.vnnlib" in reasons[("onnx/acas_like.onnx", "vnnlib/garbled.vnnlib")]
    assert "timeout '-1' is not a positive number" in reasons[("onnx/acas_like.onnx", "vnnlib/easy.vnnlib")]
    assert "declares 5 outputs Y_j, the network has 4" in reasons[("onnx/cnn_small.onnx.gz", "vnnlib/acas_robust.vnnlib")]
    assert not report.ok and report.counts["error"] == 5

    # resume: two more rows in the instances file; only they run, every instance is in the results once
    with open(bench / "instances.csv", "a") as f:
        f.write("onnx/acas_like.onnx,vnnlib/easy.vnnlib,30\nonnx/acas_like.onnx,vnnlib/acas_robust.vnnlib,30\n")
    again = run_verify_campaign(bench / "instances.csv", results, make_engine("local", 1), quiet=True)
    assert (again.skipped, again.ran) == (len(lines), 2)
    rows = rows_of(results)
    assert len(rows) == len(lines) + 2 == len(again.rows)
    assert [r["result"] for r in rows[-2:]] == ["unsat", "unsat"]


def test_cli_campaign_usage_errors_and_json(tmp_path, capsys):
    bench = benchmark(tmp_path)
    (bench / "instances.csv").write_text("onnx/acas_like.onnx,vnnlib/acas_min.vnnlib,30\n")
    assert main(["verify", "--instances", str(bench / "instances.csv")]) == 2
    assert "--instances needs --results" in capsys.readouterr().err
    assert main(["verify", str(FIX / "acas_like.onnx"), "--instances", str(bench / "instances.csv"),
                 "--results", str(tmp_path / "r.csv")]) == 2
    assert "give one or the other" in capsys.readouterr().err
    assert main(["verify"]) == 2
    assert "give MODEL PROP.vnnlib, or --instances" in capsys.readouterr().err
    assert main(["verify", "--instances", str(tmp_path / "none.csv"), "--results", str(tmp_path / "r.csv")]) == 2
    assert "no such file" in capsys.readouterr().err
    (tmp_path / "other.csv").write_text("a,b\n")
    assert main(["verify", "--instances", str(bench / "instances.csv"), "--results", str(tmp_path / "other.csv")]) == 2
    assert "line 1 has 2 fields" in capsys.readouterr().err

    assert main(["verify", "--instances", str(bench / "instances.csv"), "--results", str(tmp_path / "r.csv"),
                 "--workers", "1", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["counts"], doc["total"], doc["ran"], doc["engine"]) == ({"sat": 1}, 1, 1, "local")
    assert doc["rows"][0]["counterexample"].startswith("r.counterexamples/")


# -- interruptions (a real CLI process) ------------------------------------------------------------


def _cli(*args: str, tmpdir: Path | None = None, **kw) -> subprocess.Popen:
    """The CLI as a child process; ``tmpdir``: the campaign's scratch folder goes there."""
    return cli_process(*args, env=None if tmpdir is None else {"TMPDIR": str(tmpdir)}, **kw)


def _wait_rows(path: Path, n: int, proc: subprocess.Popen, limit: float = 240) -> None:
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if path.exists() and len(path.read_text().splitlines()) >= n:
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    raise AssertionError(f"fewer than {n} rows after {limit} s")


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for t in os.listdir(f"/proc/{pid}/task") for c in open(f"/proc/{pid}/task/{t}/children").read().split()]
    except FileNotFoundError:
        return []


def _workers(pid: int) -> list[int]:
    """The campaign's worker processes: the children of its fork server (a child of the campaign)."""
    servers = [c for c in _children(pid) if "forkserver" in open(f"/proc/{c}/cmdline").read()]
    return [w for s in servers for w in _children(s)]


SLOW = [("onnx/acas_like.onnx", "vnnlib/acas_min.vnnlib", 30), ("onnx/zero.onnx", "vnnlib/hard.vnnlib", 120),
        ("onnx/acas_like.onnx", "vnnlib/easy.vnnlib", 30), ("onnx/acas_like.onnx", "vnnlib/acas_robust.vnnlib", 30)]


@pytest.mark.slow
def test_a_worker_killed_mid_campaign_is_an_error_row_and_the_rest_run(tmp_path):
    bench = benchmark(tmp_path)
    (bench / "instances.csv").write_text("".join(f"{o},{v},{t}\n" for o, v, t in SLOW))
    results = tmp_path / "results.csv"
    proc = _cli("verify", "--instances", str(bench / "instances.csv"), "--results", str(results), "--workers", "1")
    try:
        _wait_rows(results, 1, proc)  # the first row is in: the worker now runs the 120 s instance
        time.sleep(1.0)
        workers = _workers(proc.pid)
        assert len(workers) == 1, workers
        os.kill(workers[0], signal.SIGKILL)
        out, err = proc.communicate(timeout=240)
    finally:
        proc.kill()
    assert proc.returncode == 1, err  # a row is an error
    rows = rows_of(results)
    assert [(r["vnnlib"], r["result"]) for r in rows] == [("vnnlib/acas_min.vnnlib", "sat"),
                                                         ("vnnlib/hard.vnnlib", "error"),
                                                         ("vnnlib/easy.vnnlib", "unsat"),
                                                         ("vnnlib/acas_robust.vnnlib", "unsat")]
    assert "the worker died: killed by SIGKILL" in rows[1]["reason"]


@pytest.mark.slow
@pytest.mark.parametrize("how", ["interrupt", "crash"])
def test_interrupted_campaign_resumes_with_every_instance_once(tmp_path, how):
    bench = benchmark(tmp_path)
    (bench / "instances.csv").write_text("".join(f"{o},{v},{t}\n" for o, v, t in SLOW))
    results = tmp_path / "results.csv"
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    proc = _cli("verify", "--instances", str(bench / "instances.csv"), "--results", str(results), "--workers", "1",
                tmpdir=scratch, start_new_session=True)
    try:
        _wait_rows(results, 1, proc)
        time.sleep(1.0)
        if how == "interrupt":  # Ctrl-C reaches the campaign process
            os.kill(proc.pid, signal.SIGINT)
            proc.communicate(timeout=60)
            assert proc.returncode == 130
        else:  # the machine goes away: every process of the campaign is killed at once
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert [r["vnnlib"] for r in rows_of(results)] == ["vnnlib/acas_min.vnnlib"]
    # Ctrl-C removes the campaign's files; a crash of every process cannot (its folder stays behind)
    def ours() -> list[str]:  # (multiprocessing leaves folders of its own there too)
        return sorted(p.name for p in scratch.glob("tlb-campaign-*"))
    left = ours()
    assert len(left) == (0 if how == "interrupt" else 1), left
    # the hard row gets a short timeout on the second run (rows are matched by their files, not timeouts)
    (bench / "instances.csv").write_text("".join(f"{o},{v},{1 if 'hard' in v else t}\n" for o, v, t in SLOW))
    proc = _cli("verify", "--instances", str(bench / "instances.csv"), "--results", str(results), "--workers", "2",
                tmpdir=scratch)
    out, err = proc.communicate(timeout=300)
    assert ours() == left  # the second run leaves nothing of its own
    assert proc.returncode == 0, err
    rows = rows_of(results)
    assert sorted((r["vnnlib"], r["result"]) for r in rows) == [
        ("vnnlib/acas_min.vnnlib", "sat"), ("vnnlib/acas_robust.vnnlib", "unsat"), ("vnnlib/easy.vnnlib", "unsat"),
        ("vnnlib/hard.vnnlib", "timeout")]
    assert "1 already in the results" in out
