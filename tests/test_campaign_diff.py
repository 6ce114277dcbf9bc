"""``diff --inputs`` through the campaign engine: the dataset's batches on workers give exactly the report
of the one-process diff over the whole dataset (in this process batch by batch, on the local pool,
on a real local Ray cluster); a batch whose worker dies is an error naming its sets, the others are
merged and the verdict says the dataset was not fully compared; Ctrl-C leaves no output file.

``TripCNN`` is the reference model of ``tests/test_diff_dataset.py`` with a tripwire on its input
(an FX leaf function): an input set holding ``KILL`` kills its worker, one holding ``HANG`` makes it
sleep, so a worker dies or hangs where the test says.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torchlean_bridge as tlb  # noqa: E402
from tests.cli_process import cli_process as cli  # noqa: E402
from tests.test_diff import with_node  # noqa: E402
from tests.test_diff_dataset import RARE, ClampCNN, dataset  # noqa: E402
from torchlean_bridge.app.campaign.diff_campaign import batch_bounds, run_diff_campaign  # noqa: E402
from torchlean_bridge.app.campaign.engines import make_engine  # noqa: E402
from torchlean_bridge.app.campaign.local import InlineEngine  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
KILL, HANG = 777.0, 555.0


def tripwire(x):
    if bool((x == KILL).any()):
        os.kill(os.getpid(), signal.SIGKILL)
    if bool((x == HANG).any()):
        Path(os.environ["TLB_TRIP_MARK"]).write_text("hanging")
        time.sleep(120)
    return x


torch.fx.wrap("tripwire")


class TripCNN(ClampCNN):
    def forward(self, x):
        return super().forward(tripwire(x))


FACTORY = ("import torch\nfrom tests.test_campaign_diff import TripCNN\n"
           "def make():\n    torch.manual_seed(0)\n    return TripCNN().eval()\n")


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    """The clamp-slip bundle saved, its reference factory and a 250-set dataset (sets 17, 230, 231 slip)."""
    tmp = tmp_path_factory.mktemp("diffcampaign")
    torch.manual_seed(0)
    m = ClampCNN().eval()
    good = tlb.import_fx(m, (torch.zeros(1, 1, 6, 6),))
    clamp = next(n.id for n in good.graph.nodes if n.kind == "clamp")
    bad = with_node(good, clamp, max=1.6)
    tlb.save(bad, tmp / "bad")
    (tmp / "m.py").write_text(FACTORY)
    np.savez(tmp / "d.npz", x=dataset(250))
    one = tlb.diff(bad, against="torch", module=m, dataset=tmp / "d.npz")
    return tmp, bad, clamp, one


def options(tmp: Path) -> dict:
    return {"against": "torch", "reference": f"{tmp / 'm.py'}:make", "onnx": None}


def same_report(campaign, one) -> None:
    got = campaign.to_json()
    info = got.pop("campaign")
    assert info["failed"] == [] and info["compared"] == info["total"] == len(one.inputs)
    assert got == one.to_json()  # nodes, outputs, findings, first divergence, coverage, inputs: all of it
    text = [line for line in str(campaign).splitlines() if not line.startswith("  dataset campaign:")]
    assert text == str(one).splitlines()


@pytest.mark.slow
def test_batches_in_this_process_give_the_one_process_report(case):
    tmp, bad, clamp, one = case
    slipping = [k for k in RARE if k < 250]
    assert one.first_divergence.node == clamp and next(r for r in one.nodes if r.node == clamp).exceeded == 3
    assert next(r for r in one.nodes if r.node == clamp).worst_on in {f"d.npz[{k}]" for k in slipping}
    for size in (7, 64, 250):  # a batch edge between the slipping sets 230 and 231; one batch for all
        report = run_diff_campaign(str(tmp / "bad"), str(tmp / "d.npz"), bad, 250, InlineEngine(), options(tmp),
                                   size, quiet=True)
        assert report.batches == len(batch_bounds(250, size))
        same_report(report, one)
        assert report.summary().splitlines()[0] == one.summary().splitlines()[0]


def test_the_local_pool_with_two_workers_gives_the_same_report(case):
    tmp, bad, clamp, one = case
    report = run_diff_campaign(str(tmp / "bad"), str(tmp / "d.npz"), bad, 250, make_engine("local", 2),
                               options(tmp), 16, quiet=True)
    assert (report.engine, report.workers, report.batches) == ("local", 2, 16)
    same_report(report, one)


def test_a_dead_worker_fails_its_batch_and_the_verdict_says_so(case, tmp_path):
    tmp, bad, clamp, _ = case
    x = dataset(200)
    x[150, 0, 0, 0, 0] = KILL  # batch 150..159 kills its worker
    np.savez(tmp_path / "d.npz", x=x)
    report = run_diff_campaign(str(tmp / "bad"), str(tmp_path / "d.npz"), bad, 200, make_engine("local", 2),
                               options(tmp), 10, quiet=True)
    assert report.failed == [{"batch": 15, "start": 150, "stop": 160, "status": "error",
                              "message": "the worker died: killed by SIGKILL"}]
    assert not report.ok and report.compared_sets == 190 and len(report.inputs) == 190
    assert "d.npz[150]" not in report.inputs and "d.npz[160]" in report.inputs
    failed = report.of_kind("batch-failed")
    assert [f.message for f in failed] == ["input sets 150..159 not compared: the worker died: killed by SIGKILL"]
    verdict = report.summary().splitlines()[0]
    assert "NOT FULLY COMPARED: 190 of 200 input sets (1 batch(es) failed); DIVERGED: node" in verdict
    assert "agree" not in verdict
    # the merged rows are those of the one-process diff over the same 190 sets
    kept = np.concatenate([x[:150], x[160:]])
    np.savez(tmp_path / "kept.npz", x=kept)
    alone = tlb.diff(bad, against="torch", module=seeded_reference(), dataset=tmp_path / "kept.npz")
    row = next(r for r in report.nodes if r.node == clamp)
    ref = next(r for r in alone.nodes if r.node == clamp)
    assert (row.exceeded, row.max_abs, row.budget, row.worst_ratio) == (ref.exceeded, ref.max_abs, ref.budget,
                                                                          ref.worst_ratio)


def seeded_reference():
    torch.manual_seed(0)
    return ClampCNN().eval()


@pytest.mark.slow
def test_the_cli_runs_the_campaign_and_writes_the_same_json(case, tmp_path):
    tmp, bad, clamp, one = case
    p = cli("diff", str(tmp / "bad"), "--reference", f"{tmp / 'm.py'}:make", "--inputs", str(tmp / "d.npz"),
            "--workers", "2", "--batch-size", "50", "--json", str(tmp_path / "r.json"))
    out, err = p.communicate(timeout=300)
    assert p.returncode == 1, err
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc.pop("campaign")["batches"] == 5
    assert doc == json.loads(json.dumps(one.to_json()))
    assert "exceeded on 3 of 250 input sets" in out and "dataset campaign: 250 input set(s) in 5 batch(es)" in out


def test_engine_options_without_a_dataset_are_refused(case):
    from torchlean_bridge.app.cli import main
    tmp = case[0]
    assert main(["diff", str(tmp / "bad"), "--reference", f"{tmp / 'm.py'}:make", "--workers", "2"]) == 2


def test_ctrl_c_leaves_no_report_file(case, tmp_path):
    tmp, bad, *_ = case
    x = dataset(40)
    x[30, 0, 0, 0, 0] = HANG
    np.savez(tmp_path / "d.npz", x=x)
    mark = tmp_path / "mark"
    p = cli("diff", str(tmp / "bad"), "--reference", f"{tmp / 'm.py'}:make", "--inputs", str(tmp_path / "d.npz"),
            "--workers", "2", "--batch-size", "10", "--json", str(tmp_path / "r.json"),
            env={"TLB_TRIP_MARK": str(mark)})
    deadline = time.monotonic() + 120
    while not mark.exists() and time.monotonic() < deadline and p.poll() is None:
        time.sleep(0.2)
    assert mark.exists(), p.communicate()[1]
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130 and "interrupted" in err
    assert sorted(q.name for q in tmp_path.iterdir()) == ["d.npz", "mark"]  # no r.json, no temporary file


@pytest.mark.slow
def test_a_real_ray_cluster_gives_the_same_report(case):
    ray = pytest.importorskip("ray")
    tmp, bad, clamp, one = case
    path = os.pathsep.join([str(ROOT), *sys.path])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": path}})
    try:
        engine = make_engine("ray", 2)
        report = run_diff_campaign(str(tmp / "bad"), str(tmp / "d.npz"), bad, 250, engine, options(tmp), 25,
                                   quiet=True)
    finally:
        ray.shutdown()
    assert (report.engine, report.workers, report.batches) == ("ray", 2, 10)
    same_report(report, one)


@pytest.mark.slow
def test_reduce_after_a_campaign_writes_what_the_one_process_diff_writes(case, tmp_path):
    from torchlean_bridge.app.cli import main
    tmp, bad, clamp, one = case
    alone = tlb.diff(bad, against="torch", module=seeded_reference(), dataset=tmp / "d.npz",
                     reduce=tmp_path / "one")
    assert main(["diff", str(tmp / "bad"), "--reference", f"{tmp / 'm.py'}:make", "--inputs", str(tmp / "d.npz"),
                 "--workers", "2", "--reduce", str(tmp_path / "campaign"), "--json", str(tmp_path / "r.json"),
                 "--quiet"]) == 1
    doc = json.loads((tmp_path / "r.json").read_text())
    doc.pop("campaign")
    want = json.loads(json.dumps(alone.to_json()).replace(str(tmp_path / "one"), str(tmp_path / "campaign")))
    assert doc == want and [f["kind"] for f in doc["findings"]][-1] == "reduced"
    assert sorted(p.name for p in (tmp_path / "one").iterdir()) == sorted(p.name for p in
                                                                         (tmp_path / "campaign").iterdir())


def test_against_onnxruntime_with_an_onnx_file_the_pool_gives_the_same_report(case, tmp_path):
    tmp, bad, clamp, _ = case
    good = with_node(bad, clamp, max=1.5)  # the correct clamp: its ONNX export is the oracle
    tlb.export_onnx(good, tmp_path / "good.onnx")
    one = tlb.diff(bad, against="onnxruntime", onnx_model=str(tmp_path / "good.onnx"), dataset=tmp / "d.npz")
    assert one.first_divergence is not None and one.first_divergence.node == clamp
    report = run_diff_campaign(str(tmp / "bad"), str(tmp / "d.npz"), bad, 250, make_engine("local", 2),
                               {"against": "onnxruntime", "reference": None, "onnx": str(tmp_path / "good.onnx")},
                               40, quiet=True)
    same_report(report, one)


MIXED = """import torch
from torch import nn


class Mixed(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, 8))
        self.shift = nn.Parameter(torch.linspace(-1, 1, 8))
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        return self.fc(nn.functional.gelu(x * self.scale + self.shift))


def make():
    torch.manual_seed(0)
    return Mixed().eval()
"""


def test_rows_through_the_finer_oracle_and_rows_not_compared_merge_exactly(tmp_path):
    """Broadcasts compared by the finer oracle, a GELU stripped of its provenance (not compared, with
    its reason): the batches' report is still the one-process report."""
    from torchlean_bridge.app.commands.common import load_factory
    from torchlean_bridge.graph import Graph
    (tmp_path / "mixed.py").write_text(MIXED)
    spec = f"{tmp_path / 'mixed.py'}:make"
    m = load_factory(spec)
    b = tlb.import_fx(m, (torch.zeros(3, 8),))
    gelu = next(n.id for n in b.graph.nodes if n.kind == "gelu")
    nodes = [n.with_(source=None) if n.id == gelu else n for n in b.graph.nodes]
    stripped = tlb.Bundle(Graph(nodes, b.graph.inputs, b.graph.outputs), b.payload, b.roles, b.report)
    tlb.save(stripped, tmp_path / "b")
    stripped = tlb.load(tmp_path / "b")
    np.savez(tmp_path / "d.npz", x=np.random.default_rng(3).normal(size=(30, 3, 8)))
    one = tlb.diff(stripped, against="torch", module=m, dataset=tmp_path / "d.npz")
    c = one.coverage
    assert c["finer"] > 0 and c["compared"] == c["nodes"] - 1, str(one)
    for size in (4, 7):
        report = run_diff_campaign(str(tmp_path / "b"), str(tmp_path / "d.npz"), stripped, 30, InlineEngine(),
                                   {"against": "torch", "reference": spec, "onnx": None}, size, quiet=True)
        same_report(report, one)


class FreshWorkerEngine:
    """Every task on a worker of its own: this process with the campaign's per-worker loads forgotten."""

    name, workers = "fresh", 2

    def run(self, tasks, on_outcome):
        from torchlean_bridge.app.campaign import diff_campaign
        from torchlean_bridge.app.campaign.local import run_task
        for task in tasks:
            diff_campaign._cache.clear()
            on_outcome(run_task(task))


def test_a_factory_that_makes_other_weights_in_each_worker_is_refused(case, tmp_path):
    tmp, bad, *_ = case
    (tmp_path / "unseeded.py").write_text("from tests.test_diff_dataset import ClampCNN\n"
                                          "def make():\n    return ClampCNN().eval()\n")
    opts = {"against": "torch", "reference": f"{tmp_path / 'unseeded.py'}:make", "onnx": None}
    with pytest.raises(tlb.BridgeError, match="made different weights in different workers"):
        run_diff_campaign(str(tmp / "bad"), str(tmp / "d.npz"), bad, 250, FreshWorkerEngine(), opts, 125, quiet=True)
    seeded = {**opts, "reference": f"{tmp / 'm.py'}:make"}  # the same through fresh workers: accepted
    run_diff_campaign(str(tmp / "bad"), str(tmp / "d.npz"), bad, 250, FreshWorkerEngine(), seeded, 125, quiet=True)
