"""The Ray engine on a real local cluster (``ray.init(num_cpus=2)``): the same outcomes as the local
pool for every way a task can end (an actor killed from outside mid-task included), and a verify
campaign whose rows equal the local engine's. Slow: starting Ray takes 15-40 s on two busy cores."""

from __future__ import annotations

import os
import signal
import socket
import sys
import tempfile
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from test_campaign_engine import gz_file, kill_self, nap, raise_bridge_error, read_text, square, where  # noqa: E402
from test_campaign_verify import GOOD, benchmark, read_counterexample, rows_of  # noqa: E402

from torchlean_bridge.app.campaign.engine import Dispatcher, Outcome, Task
from torchlean_bridge.app.campaign.engines import make_engine  # noqa: E402
from torchlean_bridge.app.campaign.files import local_file  # noqa: E402
from torchlean_bridge.app.campaign.ray_engine import _Actors, _Worker  # noqa: E402
from torchlean_bridge.app.campaign.verify_campaign import run_verify_campaign  # noqa: E402

pytestmark = pytest.mark.slow
HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def cluster():
    path = os.pathsep.join([str(HERE), str(HERE.parent), *sys.path])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": path}})
    yield
    ray.shutdown()


def test_outcomes_on_ray_match_the_local_pool(cluster):
    tasks = ([Task(f"q{i}", square, args=(i,)) for i in range(3)]
             + [Task("sigkill", kill_self), Task("bridge", raise_bridge_error),
                Task("hang", nap, args=(60.0,), timeout=0.3)]
             + [Task(f"r{i}", square, args=(i,)) for i in range(3)])
    outcomes: list[Outcome] = []
    engine = make_engine("ray", 2, grace=0.5)
    engine.run(tasks, outcomes.append)
    by_key = {o.key: o for o in outcomes}
    assert len(outcomes) == len(tasks) == len(by_key) and engine.workers == 2
    assert all((by_key[f"{p}{i}"].status, by_key[f"{p}{i}"].value) == ("done", i * i) for p in "qr" for i in range(3))
    assert by_key["sigkill"].status == "error" and by_key["sigkill"].message.startswith("the worker died")
    assert (by_key["bridge"].status, by_key["bridge"].message) == ("error", "this row's input is bad")
    assert by_key["hang"].status == "timeout"


def test_an_actor_killed_from_outside_mid_task_is_an_error(cluster, tmp_path):
    dispatcher = Dispatcher(_Actors({}, str(tmp_path)), 2)
    tasks = [Task("slow", nap, args=(60.0,))] + [Task(f"q{i}", nap, args=(0.2,)) for i in range(6)]
    outcomes: list[Outcome] = []
    killed: list[int] = []

    def on_outcome(o: Outcome) -> None:
        outcomes.append(o)
        for slot in dispatcher.slots:
            if not killed and slot.task is not None and slot.task.key == "slow":
                killed.append(slot.handle.pid)
                os.kill(slot.handle.pid, signal.SIGKILL)

    dispatcher.run(tasks, on_outcome)
    by_key = {o.key: o for o in outcomes}
    assert killed and len(outcomes) == len(tasks) == len(by_key)
    assert by_key["slow"].status == "error" and by_key["slow"].message.startswith("the worker died")
    assert all(by_key[f"q{i}"].status == "done" for i in range(6))


def test_verify_campaign_on_ray_equals_the_local_one(cluster, tmp_path):
    bench = benchmark(tmp_path)
    lines = [f"{o},{v},{t}" for o, v, t in GOOD] + ["onnx/missing.onnx,vnnlib/acas_robust.vnnlib,30",
                                                    "onnx/acas_like.onnx,vnnlib/garbled.vnnlib,30"]
    (bench / "instances.csv").write_text("\n".join(lines) + "\n")
    on_ray = run_verify_campaign(bench / "instances.csv", tmp_path / "ray.csv", make_engine("ray"), quiet=True)
    local = run_verify_campaign(bench / "instances.csv", tmp_path / "local.csv", make_engine("local", 2), quiet=True)
    assert on_ray.engine == "ray" and on_ray.workers == 2

    def answers(path: Path) -> dict:
        out = {}
        for r in rows_of(path):
            cex = read_counterexample(path.parent / r["counterexample"]) if r["counterexample"] else None
            out[(r["onnx"], r["vnnlib"])] = (r["result"], cex, r["reason"] if r["result"] == "error" else "")
        return out

    assert answers(tmp_path / "ray.csv") == answers(tmp_path / "local.csv")
    assert on_ray.counts == local.counts == {"unsat": 2, "sat": 2, "timeout": 1, "error": 2}
    again = run_verify_campaign(bench / "instances.csv", tmp_path / "ray.csv", make_engine("ray"), quiet=True)
    assert (again.ran, again.skipped) == (0, len(lines))


def test_ray_workers_leave_no_files_behind(cluster, tmp_path, monkeypatch):
    """Shipped files live in the campaign's folder, gone when it ends, and an idle actor told to close
    removes its own folder (on another node nobody else could)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    gz = gz_file(tmp_path)
    outcomes: list[Outcome] = []
    make_engine("ray", 2, grace=0.5).run([Task("where", where, files=(gz,)), Task("kill", kill_self, files=(gz,)),
                                          Task("read", read_text, files=(gz,))], outcomes.append)
    by_key = {o.key: o for o in outcomes}
    assert by_key["read"].value == "(declare-const X_0 Real)\n" and by_key["kill"].status == "error"
    assert by_key["where"].value.startswith(str(tmp_path / "tmp" / "tlb-campaign-"))
    assert os.listdir(tmp_path / "tmp") == []
    (tmp_path / "node").mkdir()
    worker = _Worker([], str(tmp_path / "node"), socket.gethostname())
    path = local_file(gz)
    assert path.startswith(str(tmp_path / "node")) and os.path.exists(path)
    worker.close()
    assert os.listdir(tmp_path / "node") == []
    node = tmp_path / "tlb-campaign-elsewhere"  # the campaign's folder as a Ray node elsewhere makes it
    worker = _Worker([], str(node), "another-host")
    local_file(gz)
    worker.close()
    assert not node.exists()
    # an actor that starts on the campaign's host after the campaign removed its folder makes nothing
    gone = tmp_path / "tlb-campaign-ended"
    worker = _Worker([], str(gone), socket.gethostname())
    assert not gone.exists()
    worker.close()
