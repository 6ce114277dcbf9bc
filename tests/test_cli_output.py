"""The CLI's rendering layer through the real command line: summaries that fit a screen on wide models,
numpy-style truncation with shapes, --full / --node, and JSON on stdout that parses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import torchlean_bridge as tlb
from torchlean_bridge import Bundle, Graph, Node, Payload
from torchlean_bridge.app.output import Table, format_number, format_tensor, stats
from torchlean_bridge.seed import SEED_X0, seed_mlp_bundle

ROOT = Path(__file__).resolve().parents[1]


def cli(*argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="100")
    return subprocess.run([sys.executable, "-m", "torchlean_bridge", *argv], capture_output=True, text=True,
                          cwd=cwd or ROOT, env=env, timeout=300)


def seed_files(folder: Path, onnx: str | None = None) -> Path:
    """The seed MLP as a bundle ``seed``, its input ``x0.npy`` and, if named, its ONNX export."""
    tlb.save(seed_mlp_bundle(), folder / "seed")
    np.save(folder / "x0.npy", SEED_X0)
    if onnx:
        tlb.export_onnx(seed_mlp_bundle(), folder / onnx)
    return folder


def wide_mlp(width: int = 512, out: tuple[int, int] = (4, 10)) -> Bundle:
    """Linear(width, width) -> ReLU -> Linear(width, 40) -> reshape [4, 10]."""
    rng = np.random.default_rng(0)
    g = Graph([Node(0, [], "input", [width]), Node(1, [0], "linear", [width]), Node(2, [1], "relu", [width]),
               Node(3, [2], "linear", [out[0] * out[1]]), Node(4, [3], "reshape", list(out), {"in_shape": [out[0] * out[1]], "out_shape": list(out)})],
              inputs=[0], outputs=[4])
    payload = Payload({1: {"weight": rng.normal(size=(width, width)) / width ** 0.5, "bias": rng.normal(size=width)},
                       3: {"weight": rng.normal(size=(out[0] * out[1], width)) / width ** 0.5,
                           "bias": np.zeros(out[0] * out[1])}})
    return Bundle(g, payload)


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    folder = tmp_path_factory.mktemp("wide")
    tlb.save(wide_mlp(), folder / "b")
    np.save(folder / "x.npy", np.linspace(-1, 1, 512))
    return seed_files(folder)


def test_numbers_never_hide_a_sign_or_a_magnitude():
    assert format_number(-1e-9) == "-1.000000e-09" and format_number(0.0) == "0.000000"
    assert format_number(-0.0) == "0.000000" and format_number(0.02754) == "0.027540"
    assert format_number(float("inf")) == "inf" and format_number(np.int64(7)) == "7"
    assert float(format_number(123456.789)) == pytest.approx(123456.789, rel=1e-9)


def test_tensors_truncate_numpy_style_and_stay_whole_when_small():
    a = np.arange(40.0).reshape(4, 10)
    text = format_tensor(a, width=100)
    lines = text.splitlines()
    assert len(lines) == 4 and "..." in lines[0] and lines[0].startswith("[[0.000000, 1.000000")
    assert lines[-1].endswith("8.000000, 39.000000]]")
    assert "..." not in format_tensor(a, full=True) and format_tensor(a, full=True).count(",") == 39
    big = format_tensor(np.zeros((64, 3, 32, 32)), width=100)
    assert len(big.splitlines()) < 40 and all(len(line) <= 100 for line in big.splitlines())
    s = stats(np.array([1.0, np.inf, -3.0]))
    assert (s.min, s.max, s.mean, s.nonfinite) == (-3.0, 1.0, -1.0, 1)


def test_tables_fit_the_width_they_are_given_and_never_drop_a_column():
    t = Table(["key", "shape", "value"], numeric=["value"], wrap=["key"])
    keys = [f"encoder.layers.{i}.self_attn.in_proj_weight" * 2 for i in range(5)]
    for i, key in enumerate(keys):
        t.add(key, "[1536, 512]", 0.5 * i)
    for width in (60, 100):
        lines = t.render(width).splitlines()
        assert lines[0].split() == ["key", "shape", "value"]
        assert max(map(len, lines)) <= width
        assert "".join(line.split()[0] for line in lines[1:] if not line.startswith(" ")).count("encoder") >= 5
        assert sum("[1536, 512]" in line for line in lines) == 5 and "2.000000" in lines[-1] + "".join(lines)
    narrow = t.render(20).splitlines()  # too narrow for whole columns: wider than asked, nothing lost
    assert sum("[1536, 512]" in line for line in narrow) == 5 and sum("2.000000" in line for line in narrow) == 1


def test_eval_on_a_wide_model_prints_one_screen(wide):
    r = cli("eval", str(wide / "b"), "--input", str(wide / "x.npy"))
    assert r.returncode == 0 and r.stderr == ""
    lines = r.stdout.splitlines()
    assert lines[0].startswith("node 4 (reshape) [4, 10]: min ") and len(lines) == 5
    assert all("..." in line for line in lines[1:]) and max(map(len, lines)) <= 100
    r = cli("eval", str(wide / "b"), "--input", str(wide / "x.npy"), "--all-nodes")
    lines = r.stdout.splitlines()
    assert r.returncode == 0 and len(lines) == 6 and lines[0].split()[:3] == ["node", "op", "shape"]
    assert lines[2].split()[:4] == ["1", "linear", "[512]", "float"] and len(r.stdout) < 2000
    full = cli("eval", str(wide / "b"), "--input", str(wide / "x.npy"), "--node", "2", "--full").stdout
    value = tlb.evaluate(wide_mlp().graph, wide_mlp().payload, np.linspace(-1, 1, 512), all_nodes=True)[2]
    numbers = [float(v) for v in full.partition(": ")[2].replace("[", "").replace("]", "").split(",")]
    assert np.allclose(numbers, value, atol=5e-7) and len(numbers) == 512


def test_eval_json_on_stdout_parses_and_matches_the_evaluator(wide):
    for flag in (["--json"], ["--json", "-"]):
        r = cli("eval", str(wide / "b"), "--input", str(wide / "x.npy"), "--node", "1", "--node", "4", *flag)
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        table = tlb.evaluate(wide_mlp().graph, wide_mlp().payload, np.linspace(-1, 1, 512), all_nodes=True)
        assert [n["id"] for n in doc["nodes"]] == [1, 4] and doc["dtype"] == "float64"
        assert doc["nodes"][1]["shape"] == [4, 10] and np.allclose(doc["nodes"][1]["value"], table[4])
        assert doc["nodes"][0]["stats"]["max"] == pytest.approx(table[1].max())


def test_bounds_on_a_wide_model_summarizes_per_output(wide):
    r = cli("bounds", str(wide / "b"), "--center", str(wide / "x.npy"), "--radius", "0.01", "--samples", "4")
    assert r.returncode == 0 and r.stderr == ""
    lines = r.stdout.splitlines()
    assert lines[0].startswith("output 0: node 4 (reshape) [4, 10]: box [") and "width min" in lines[0]
    assert lines[1].startswith("containment: 4 samples") and len(lines) == 2
    boxes = tlb.interval_bounds(wide_mlp().graph, wide_mlp().payload, np.linspace(-1, 1, 512) - 0.01,
                                np.linspace(-1, 1, 512) + 0.01)
    lo_text = lines[0].partition("box [")[2].partition(",")[0]
    assert float(lo_text) == pytest.approx(boxes[4][0].min(), abs=1e-5)
    table = cli("bounds", str(wide / "b"), "--center", str(wide / "x.npy"), "--radius", "0.01", "--samples", "0",
                "--all-nodes").stdout.splitlines()
    assert len(table) == 6 and table[0].split()[:3] == ["node", "op", "shape"]
    doc = json.loads(cli("bounds", str(wide / "b"), "--center", str(wide / "x.npy"), "--radius", "0.01",
                         "--samples", "0", "--json", "-").stdout)
    n4 = doc["nodes"][4]
    assert n4["shape"] == [4, 10] and np.asarray(n4["lo"]).shape == (4, 10)
    assert n4["width_max"] == pytest.approx(float((boxes[4][1] - boxes[4][0]).max()))
    assert doc["containment"] is None


def test_bad_node_id_is_named(wide):
    r = cli("eval", str(wide / "seed"), "--input", str(wide / "x0.npy"), "--node", "9")
    assert r.returncode == 2 and "--node 9: the graph has nodes 0..5" in r.stderr


def test_diff_table_columns_fit_their_content():
    from torchlean_bridge.app.diff import DiffReport, NodeDiff
    from torchlean_bridge.app.output import diff_table
    long_op, long_cp = "hard_masked_softmax_with_a_long_name", "encoder.layers.0.self_attn.out_proj/MatMul_output_0"
    report = DiffReport("diff against onnxruntime", against="onnxruntime")
    report.nodes = [NodeDiff(3, long_op, long_cp, max_abs=1.5e-7, budget=2e-6, status="ok")]
    report.outputs = [NodeDiff(3, long_op, long_cp, max_abs=1.5e-7, budget=2e-6, status="ok", output=0)]
    lines = diff_table(report, all_nodes=True).splitlines()
    rows = [line for line in lines if line.lstrip().startswith(("node 3", "output 0"))]
    assert len(rows) == 2 and all(long_op in row and "1.50e-07" in row for row in rows)
    assert "".join(line.strip() for line in lines).count("encoder.layers.0") == 2 and max(map(len, lines)) <= 120


def test_bounds_crown_is_tighter_and_still_contains_the_samples(wide):
    args = ["bounds", str(wide / "b"), "--center", str(wide / "x.npy"), "--radius", "0.05", "--samples", "8",
            "--json", "-"]
    ibp, crown = (json.loads(cli(*args, "--method", m).stdout) for m in ("ibp", "crown"))
    assert (ibp["method"], crown["method"]) == ("ibp", "crown") and crown["containment"]["ok"] is True
    assert crown["nodes"][4]["width_mean"] < 0.5 * ibp["nodes"][4]["width_mean"]
    assert np.all(np.asarray(crown["nodes"][4]["lo"]) >= np.asarray(ibp["nodes"][4]["lo"]) - 1e-9)


def _on_a_terminal(argv: list[str]) -> tuple[subprocess.CompletedProcess, bytes]:
    """Run the CLI with stderr on a pseudo-terminal; (the run, what was drawn there)."""
    import pty
    master, slave = pty.openpty()
    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="100")
    proc = subprocess.run([sys.executable, "-m", "torchlean_bridge", *argv], stdout=subprocess.PIPE, stderr=slave,
                          cwd=ROOT, env=env, timeout=300)
    os.close(slave)
    drawn = b""
    try:
        while chunk := os.read(master, 65536):
            drawn += chunk
    except OSError:  # the pty's writer is gone
        pass
    os.close(master)
    return proc, drawn


def test_progress_moves_on_a_terminal_and_stays_off_pipes(wide):
    argv = ["bounds", str(wide / "b"), "--center", str(wide / "x.npy"), "--radius", "0.05", "--method", "crown",
            "--samples", "200"]
    proc, drawn = _on_a_terminal(argv)
    assert proc.returncode == 0 and b"bounds: crown bounds of 5 nodes" in drawn
    assert b"\x1b[" not in proc.stdout  # the text on stdout carries no drawing
    piped = cli(*argv)
    assert piped.stderr == "" and piped.stdout.encode() == proc.stdout
    quiet, drawn = _on_a_terminal([*argv, "--quiet"])
    assert quiet.stdout == proc.stdout and drawn == b""


def test_bounds_node_view_truncates_both_bounds_to_the_terminal(wide):
    r = cli("bounds", str(wide / "b"), "--center", str(wide / "x.npy"), "--radius", "0.01", "--samples", "0",
            "--node", "1")
    lines = r.stdout.splitlines()
    assert r.returncode == 0 and lines[0].startswith("node 1 (linear) [512]: box [") and lines[1] == "  lower:"
    upper = lines.index("  upper:")
    assert all("..." in "".join(part) for part in (lines[2:upper], lines[upper + 1:]))
    assert max(len(line) for line in lines[1:]) <= 100
    boxes = tlb.interval_bounds(wide_mlp().graph, wide_mlp().payload, np.linspace(-1, 1, 512) - 0.01,
                                np.linspace(-1, 1, 512) + 0.01)
    first_lo = float(lines[2].strip().lstrip("[").split(",")[0])
    assert first_lo == pytest.approx(boxes[1][0][0], abs=1e-6)
