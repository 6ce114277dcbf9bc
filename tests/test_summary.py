"""The GraphSpec view (``tlb.summary``, ``abi --summary``) against the architecture chapter."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import torchlean_bridge as tlb
from torchlean_bridge.bundle import Bundle
from torchlean_bridge.graph import Graph, Node
from torchlean_bridge.app.commands.demo_init_plan import mlp_231_bundle

ROOT = Path(__file__).resolve().parents[1]
CHAPTER = """Sequential: [2] -> [1], layers=3, params=13, state=13
  [0] Linear(2, 3): [2] -> [3] params=9, state=9 [[3, 2], [3]]
  [1] ReLU: [3] -> [3] params=0, state=0 []
  [2] Linear(3, 1): [3] -> [1] params=4, state=4 [[1, 3], [1]]"""


def test_the_chapters_summary():
    assert tlb.summary(mlp_231_bundle()) == CHAPTER  # from the graph's ABI: no payload needed
    b = mlp_231_bundle()
    assert tlb.summary(Bundle(b.graph, tlb.init_params(b))) == CHAPTER


def test_batch_norm_buffers_make_state_exceed_params():
    g = Graph([Node(0, [], "input", [1, 3, 4, 4]),
               Node(1, [0], "batch_norm_eval", [1, 3, 4, 4], {"channel_axis": 1, "channels": 3, "eps": 1e-5}),
               Node(2, [1], "relu", [1, 3, 4, 4])], inputs=[0], outputs=[2])
    text = tlb.summary(Bundle(g))
    assert text.splitlines()[0] == "Sequential: [1, 3, 4, 4] -> [1, 3, 4, 4], layers=2, params=6, state=12"
    assert text.splitlines()[1] == ("  [0] BatchNorm(channels=3,rank=2): [1, 3, 4, 4] -> [1, 3, 4, 4] params=6, "
                                    "state=12 [[3], [3], [3], [3]]")


def test_a_residual_graph_is_a_dag():
    g = Graph([Node(0, [], "input", [2]), Node(1, [0], "linear", [2]), Node(2, [1, 0], "add", [2]),
               Node(3, [2], "relu", [2])], inputs=[0], outputs=[3])
    lines = tlb.summary(Bundle(g)).splitlines()
    assert lines[0] == "DAG: [2] -> [2], layers=3, params=6, state=6"
    assert lines[2] == "  [1] Add: [2], [2] -> [2] params=0, state=0 []"


def test_summary_of_an_imported_module_counts_its_state_dict():
    torch = pytest.importorskip("torch")
    from torch import nn
    m = nn.Sequential(nn.Conv2d(1, 3, 3, padding=1), nn.BatchNorm2d(3), nn.ReLU(), nn.Flatten(),
                      nn.Linear(192, 2)).eval()
    b = tlb.import_fx(m, (torch.zeros(1, 1, 8, 8),))
    head = tlb.summary(b).splitlines()[0]
    params = sum(p.numel() for p in m.parameters())
    state = sum(v.numel() for k, v in m.state_dict().items() if not k.endswith("num_batches_tracked"))
    assert head.endswith(f"params={params}, state={state}") and state > params


def test_abi_summary_cli(tmp_path):
    from exporters.folder import save
    folder = save(mlp_231_bundle(), tmp_path / "b")
    r = subprocess.run([sys.executable, "-m", "torchlean_bridge", "abi", str(folder), "--summary"], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip("\n") == CHAPTER
