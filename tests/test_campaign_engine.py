"""The campaign engine and its results file: every task gets exactly one outcome, whatever its worker
does (returns, raises, dies, is killed from outside, hangs), and the results file survives
interruptions (a cut last line is dropped, complete rows are kept, two campaigns cannot share it).

The task functions below are module-level so that spawned workers import them from this file.
"""

from __future__ import annotations

import gzip
import os
import signal
import tempfile
import threading
import time

import pytest

import torchlean_bridge as tlb
from torchlean_bridge.app.campaign.engine import Dispatcher, Outcome, Task
from torchlean_bridge.app.campaign.engines import make_engine
from torchlean_bridge.app.campaign.files import local_file
from torchlean_bridge.app.campaign.local import InlineEngine, _Processes
from torchlean_bridge.app.campaign.results import open_results


def square(x: int) -> int:
    return x * x


def nap(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def exit_now(code: int) -> None:
    os._exit(code)


def kill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def raise_bridge_error() -> None:
    raise tlb.BridgeError("this row's input is bad")


def raise_bug() -> None:
    raise KeyError("deep inside")


def read_text(path: str) -> str:
    with open(path) as f:
        return f.read()


def exit_after_reading(path: str) -> None:
    """The task's file was decompressed; the worker ends the way a pool worker ends: no atexit."""
    os._exit(0)


def where(path: str) -> str:
    return path


def gz_file(folder, text: str = "(declare-const X_0 Real)\n") -> str:
    f = folder / "prop.vnnlib.gz"
    with gzip.open(f, "wt") as g:
        g.write(text)
    return str(f)


def test_every_task_has_one_outcome_whatever_its_worker_does():
    tasks = ([Task(f"q{i}", square, args=(i,)) for i in range(4)]
             + [Task("exit", exit_now, args=(3,)), Task("sigkill", kill_self), Task("bridge", raise_bridge_error),
                Task("bug", raise_bug), Task("hang", nap, args=(60.0,), timeout=0.3)]
             + [Task(f"r{i}", square, args=(i,)) for i in range(4)])
    outcomes: list[Outcome] = []
    start = time.monotonic()
    make_engine("local", 2, grace=0.5).run(tasks, outcomes.append)
    assert time.monotonic() - start < 45  # the hang was stopped, not waited for
    by_key = {o.key: o for o in outcomes}
    assert len(outcomes) == len(tasks) == len(by_key)
    for i in range(4):
        assert (by_key[f"q{i}"].status, by_key[f"q{i}"].value) == ("done", i * i)
        assert (by_key[f"r{i}"].status, by_key[f"r{i}"].value) == ("done", i * i)
    assert by_key["exit"].status == "error" and "exit status 3" in by_key["exit"].message
    assert by_key["sigkill"].status == "error" and "SIGKILL" in by_key["sigkill"].message
    assert (by_key["bridge"].status, by_key["bridge"].message) == ("error", "this row's input is bad")
    assert by_key["bug"].status == "error" and by_key["bug"].message.startswith("internal error: KeyError")
    assert by_key["hang"].status == "timeout" and by_key["hang"].elapsed >= 0.8


def test_a_worker_killed_from_outside_mid_task_is_an_error_and_the_campaign_goes_on(tmp_path):
    dispatcher = Dispatcher(_Processes(str(tmp_path)), 2)
    tasks = [Task("slow", nap, args=(60.0,))] + [Task(f"q{i}", nap, args=(0.2,)) for i in range(6)]
    outcomes: list[Outcome] = []
    killed: list[int] = []

    def on_outcome(o: Outcome) -> None:
        outcomes.append(o)
        for slot in dispatcher.slots:
            if not killed and slot.task is not None and slot.task.key == "slow":
                killed.append(slot.handle.proc.pid)
                os.kill(slot.handle.proc.pid, signal.SIGKILL)

    dispatcher.run(tasks, on_outcome)
    by_key = {o.key: o for o in outcomes}
    assert killed and len(outcomes) == len(tasks) == len(by_key)
    assert by_key["slow"].status == "error" and "killed by SIGKILL" in by_key["slow"].message
    assert all(by_key[f"q{i}"].status == "done" for i in range(6))


def test_workers_that_cannot_start_stop_the_campaign_with_a_clear_error(monkeypatch):
    task = Task("x", square, args=(1,))
    monkeypatch.setattr(square, "__module__", "no_such_module_for_the_campaign")
    with pytest.raises(tlb.BridgeError, match="workers died before they were ready"):
        make_engine("local", 1).run([task], lambda o: None)


def test_gz_files_are_decompressed_once_per_worker(tmp_path):
    f = tmp_path / "prop.vnnlib.gz"
    with gzip.open(f, "wt") as g:
        g.write("(declare-const X_0 Real)\n")
    path = local_file(str(f))
    assert path.endswith("prop.vnnlib") and local_file(str(f)) == path
    assert open(path).read() == "(declare-const X_0 Real)\n"
    (tmp_path / "bad.gz").write_bytes(b"not gzip")
    with pytest.raises(tlb.BridgeError, match="cannot decompress"):
        local_file(str(tmp_path / "bad.gz"))
    outcomes: list[Outcome] = []
    make_engine("local", 1).run([Task("t", read_text, files=(str(f),))], outcomes.append)
    assert outcomes[0].value == "(declare-const X_0 Real)\n"


def test_gz_files_are_checked_before_they_are_decompressed(tmp_path):
    """Both readers of a ``.gz`` (a worker's copy, the bytes shipped to Ray) refuse a missing file and one
    that is not a regular file (a FIFO would block the read) by name, and the shipped bytes are the plain
    ones."""
    from torchlean_bridge.app.campaign.files import read_plain
    f = tmp_path / "prop.vnnlib.gz"
    with gzip.open(f, "wt") as g:
        g.write("(declare-const X_0 Real)\n")
    assert read_plain(str(f)) == b"(declare-const X_0 Real)\n"
    fifo = tmp_path / "pipe.gz"
    os.mkfifo(fifo)

    def unblock() -> None:  # a reader that opened the FIFO ends with EOF (and the test fails) instead of hanging
        try:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        except OSError:
            pass  # nobody is reading it: the check held
    for reader in (local_file, read_plain):
        for bad in (tmp_path / "missing.gz", fifo):
            timer = threading.Timer(5.0, unblock)
            timer.start()
            try:
                with pytest.raises(tlb.BridgeError, match=f"{bad.name}.*(not a regular file|no such|does not exist)"):
                    reader(str(bad))
            finally:
                timer.cancel()


@pytest.mark.parametrize("engine", ["local", "inline"])
def test_a_campaign_leaves_no_files_behind_whatever_its_workers_do(engine, tmp_path, monkeypatch):
    """Workers that end by os._exit, are killed or hang run no clean-up: the campaign's folder goes."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    gz = gz_file(tmp_path)
    tasks = [Task("where", where, files=(gz,)), Task("read", read_text, files=(gz,))]
    if engine == "local":
        tasks += [Task("exit", exit_after_reading, files=(gz,)), Task("kill", kill_self, files=(gz,)),
                  Task("hang", nap, files=(gz,), args=(60.0,), timeout=0.3)]
    outcomes: list[Outcome] = []
    (make_engine("local", 2, grace=0.5) if engine == "local" else InlineEngine()).run(tasks, outcomes.append)
    by_key = {o.key: o for o in outcomes}
    assert by_key["read"].value == "(declare-const X_0 Real)\n" and len(outcomes) == len(tasks)
    assert by_key["where"].value.startswith(str(tmp_path / "tmp" / "tlb-campaign-"))
    assert os.listdir(tmp_path / "tmp") == []


def test_make_engine_validates_its_options():
    with pytest.raises(tlb.BridgeError, match="--workers must be between 1"):
        make_engine("local", 0)
    with pytest.raises(tlb.BridgeError, match="--ray-address needs --engine ray"):
        make_engine("local", 1, address="10.0.0.1:6379")
    with pytest.raises(tlb.BridgeError, match="--engine must be local or ray"):
        make_engine("dask", 1)


# -- the results file ----------------------------------------------------------------------------


def test_results_rows_survive_a_cut_last_line_and_resume(tmp_path):
    path = tmp_path / "results.csv"
    with open_results(path, 3, resume=True) as out:
        out.append(["a", "1", "reason, with a comma\nand a newline"])
        out.append(["b", "2", ""])
    with open(path, "ab") as f:
        f.write(b"c,3,half a ro")  # an interrupted write
    with open_results(path, 3, resume=True) as out:
        assert out.rows == [["a", "1", "reason, with a comma and a newline"], ["b", "2", ""]]
        out.append(["c", "3", "whole"])
    assert path.read_text().splitlines() == ['a,1,"reason, with a comma and a newline"', "b,2,", "c,3,whole"]
    with open_results(path, 3, resume=False) as out:
        assert out.rows == []
    assert path.read_text() == ""


def test_results_refuses_another_campaigns_file_and_a_second_writer(tmp_path):
    path = tmp_path / "results.csv"
    path.write_text("x,y\n")
    with pytest.raises(tlb.BridgeError, match="line 1 has 2 fields, a results row has 3"):
        open_results(path, 3, resume=True)
    path.write_text("")
    with open_results(path, 3, resume=True):
        with pytest.raises(tlb.BridgeError, match="another campaign is writing to it"):
            open_results(path, 3, resume=True)
    with pytest.raises(tlb.BridgeError, match="it is a folder"):
        open_results(tmp_path, 3, resume=True)
