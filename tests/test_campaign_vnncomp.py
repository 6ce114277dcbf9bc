"""VNN-COMP's tool interface: ``vnncomp/prepare_instance.sh`` and ``vnncomp/run_instance.sh`` with the
competition's arguments, run by bash as the harness runs them; the result file says what the
single-instance ``verify`` says, with the counterexample in the competition's format."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
from pathlib import Path

import pytest

from torchlean_bridge.app.campaign.vnncomp import main
from torchlean_bridge.app.verify import verify_files

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "fixtures" / "verify"


def script(name: str, *args: object) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHON=sys.executable)
    return subprocess.run(["bash", str(ROOT / "vnncomp" / name), *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=300)


@pytest.mark.slow  # four interpreter starts (~5 s each on two busy cores)
def test_prepare_and_run_instance_scripts(tmp_path):
    gz = tmp_path / "acas_sat.vnnlib.gz"
    gz.write_bytes(gzip.compress((FIX / "acas_sat.vnnlib").read_bytes()))
    onnx = FIX / "acas_like.onnx"
    assert script("prepare_instance.sh", "v1", "acas", onnx, gz).returncode == 0
    bad = script("prepare_instance.sh", "v1", "acas", FIX / "cnn_small.onnx", gz)
    assert bad.returncode == 1 and "declares 5 outputs Y_j, the network has 4" in bad.stderr

    out = tmp_path / "result.txt"
    assert script("run_instance.sh", "v1", "acas", onnx, gz, out, 60).returncode == 0
    single = verify_files(onnx, FIX / "acas_sat.vnnlib", timeout=60)
    lines = out.read_text().splitlines()
    assert single.result == "sat" and lines[0] == "sat"
    values = dict(ln.strip(" ()").split() for ln in lines[1:])
    assert [float(values[f"X_{i}"]) for i in range(5)] == single.counterexample["x"]
    assert [float(values[f"Y_{j}"]) for j in range(5)] == single.counterexample["y_onnxruntime"]

    assert script("run_instance.sh", "v1", "acas", onnx, FIX / "acas_robust.vnnlib", out, 60).returncode == 0
    assert out.read_text() == "unsat\n"


def test_usage_and_errors_in_process(tmp_path, capsys):
    assert main(["run", "v1", "b", "m.onnx"]) == 2
    assert "usage: run_instance.sh v1 BENCHMARK ONNX VNNLIB RESULT_FILE TIMEOUT" in capsys.readouterr().err
    assert main(["prepare", "v2", "b", "m.onnx", "p.vnnlib"]) == 2
    assert main(["run", "v1", "b", "m.onnx", "p.vnnlib", str(tmp_path / "r.txt"), "soon"]) == 2
    assert "TIMEOUT must be a positive number" in capsys.readouterr().err
    # a property that does not parse: the result file says error, the reason goes to stderr
    garbled = tmp_path / "p.vnnlib"
    garbled.write_text("(declare-const X_0 Real)\n(assert (<= X_0 1)\n")
    assert main(["run", "v1", "b", str(FIX / "acas_like.onnx"), str(garbled), str(tmp_path / "r.txt"), "30"]) == 0
    assert (tmp_path / "r.txt").read_text() == "error\n"
    assert "never closed" in capsys.readouterr().err
    assert main(["prepare", "v1", "b", str(tmp_path / "none.onnx"), str(garbled)]) == 1
    assert "unsupported instance" in capsys.readouterr().err


def test_the_time_limit_covers_reading_the_property(tmp_path, monkeypatch):
    """VNN-COMP 2022 nn4sys's 20 MB properties take about 30 s to read; run_instance gave verify the whole
    TIMEOUT less a second, measured before the property was read, so the answer came that much late."""
    import time
    import torchlean_bridge.app.campaign.verify_task as task
    import torchlean_bridge.app.verify as verify_module
    read = task.read_property
    monkeypatch.setattr(task, "read_property", lambda *a: (time.sleep(1.0), read(*a))[1])
    given = []
    real = verify_module.verify
    monkeypatch.setattr(verify_module, "verify", lambda *a, **k: (given.append(k["timeout"]), real(*a, **k))[1])
    out = tmp_path / "r.txt"
    start = time.monotonic()
    assert main(["run", "v1", "b", str(FIX / "acas_like.onnx"), str(FIX / "acas_robust.vnnlib"), str(out), "6"]) == 0
    assert out.read_text() == "unsat\n" and given and given[0] <= 6 - 1 - 1.0 + 0.05, given
    assert time.monotonic() - start < 6
    monkeypatch.setattr(task, "read_property", lambda *a: (time.sleep(2.5), read(*a))[1])
    assert main(["run", "v1", "b", str(FIX / "acas_like.onnx"), str(FIX / "acas_robust.vnnlib"), str(out), "3"]) == 0
    assert out.read_text() == "timeout\n" and len(given) == 1
