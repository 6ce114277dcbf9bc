"""`bounds --plot` and `diff --plot`: images written (through symlinks too), the first divergence marked,
and a clear error, before any work, when matplotlib is missing or the suffix is not an image's."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import torchlean_bridge as tlb
from torchlean_bridge.app.cli import main
from torchlean_bridge.seed import seed_mlp_bundle
from tests.test_cli_output import cli, seed_files

pytest.importorskip("matplotlib")
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture()
def seed(tmp_path):
    return seed_files(tmp_path)


def test_bounds_plot_is_an_image_written_through_a_link(seed):
    from PIL import Image
    (seed / "w.png").symlink_to("real.png")
    r = cli("bounds", str(seed / "seed"), "--center", str(seed / "x0.npy"), "--radius", "0.05", "--samples", "0",
            "--plot", str(seed / "w.png"))
    assert r.returncode == 0 and r.stderr == "" and r.stdout.splitlines()[-1] == f"wrote {seed / 'w.png'}"
    assert os.path.islink(seed / "w.png") and (seed / "real.png").read_bytes()[:8] == PNG
    with Image.open(seed / "real.png") as im:
        assert im.size[0] > 400 and im.size[1] > 200


def test_plot_widths_counts_point_boxes(seed):
    from torchlean_bridge.app.plots import plot_widths
    g = tlb.Graph([tlb.Node(0, [], "input", [3]), tlb.Node(1, [0], "relu", [3])])
    lo, hi = np.array([-2.0, -1.0, 0.0]), np.array([-1.0, 1.0, 0.0])
    boxes = tlb.interval_bounds(g, None, lo, hi)
    assert plot_widths(g, boxes, str(seed / "p.svg"), "t") == {"plotted": 2, "points": 0}
    boxes = tlb.interval_bounds(g, None, lo, lo)
    assert plot_widths(g, boxes, str(seed / "p.svg"), "t") == {"plotted": 0, "points": 2}
    assert (seed / "p.svg").read_text().lstrip().startswith("<?xml")


@pytest.mark.slow
def test_diff_plot_marks_the_first_divergence(seed):
    tlb.export_onnx(seed_mlp_bundle(), seed / "m.onnx")
    assert main(["import", str(seed / "m.onnx"), "-o", str(seed / "b"), "--quiet"]) == 0
    b = tlb.load(seed / "b")
    linear = next(n.id for n in b.graph if n.kind == "linear")
    payload = b.payload.copy()
    payload.set(linear, "bias", payload.get(linear, "bias") + 0.5)
    tlb.save(tlb.Bundle(b.graph, payload, b.roles, b.report), seed / "bad")
    from torchlean_bridge.app.plots import plot_diff
    report = tlb.diff(tlb.load(seed / "bad"), against="onnxruntime", onnx_model=str(seed / "m.onnx"), random=2)
    assert report.first_divergence is not None and report.first_divergence.node == linear
    got = plot_diff(report, str(seed / "d.png"))
    assert got["marked"] == linear and got["plotted"] >= 5
    r = cli("diff", str(seed / "bad"), "--against", "onnxruntime", "--onnx", str(seed / "m.onnx"), "--random", "2",
            "--plot", str(seed / "d2.png"))
    assert r.returncode == 1 and (seed / "d2.png").read_bytes()[:8] == PNG and f"DIVERGED: node {linear}" in r.stdout


def test_missing_matplotlib_and_bad_suffix_fail_before_the_work(seed, capsys, monkeypatch):
    args = ["bounds", str(seed / "seed"), "--center", str(seed / "x0.npy"), "--radius", "0.05"]
    assert main(args + ["--plot", str(seed / "w.jpg")]) == 2
    assert "--plot" in capsys.readouterr().err and not (seed / "w.jpg").exists()
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # import raises ImportError
    assert main(args + ["--plot", str(seed / "w.png")]) == 2
    out = capsys.readouterr()
    assert out.out == "" and "--plot needs matplotlib, which is not installed: pip install 'torchlean-bridge[plot]'" \
        in out.err
    assert main(["diff", str(seed / "seed"), "--against", "onnxruntime", "--plot", str(seed / "d.png")]) == 2
    assert "needs matplotlib" in capsys.readouterr().err and not (seed / "d.png").exists()
