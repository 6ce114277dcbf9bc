"""The default engine: a pool of worker processes on this machine.

Each worker is a process with one pipe to the campaign, forked from multiprocessing's fork server
(never from the campaign process, which may hold threads). ``concurrent.futures.ProcessPoolExecutor`` is not used because one dead worker breaks its
whole pool and a hung task cannot be stopped alone; here a worker that dies or overruns is ended and
replaced and the campaign goes on. A worker computes on one thread (its BLAS/OpenMP threads
are capped, ``thread_limits``): the pool's parallelism is its workers, one a core. Workers ignore Ctrl-C: the campaign process handles it, stops
them and leaves the results file as it was after the last finished task.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from multiprocessing.connection import Connection, wait
from typing import Any, Callable, Sequence

from ...errors import BridgeError
from .engine import DEFAULT_GRACE, Dispatcher, Outcome, Task, thread_limits, warm_up
from .files import campaign_scratch, drop_scratch, local_file, use_scratch

__all__ = ["LocalEngine", "InlineEngine", "run_task"]


def run_task(task: Task, resolve: Callable[[str], str] = local_file) -> Outcome:
    """Run one task here; every exception becomes an ``error`` outcome (the campaign goes on)."""
    start = time.perf_counter()
    try:
        value = task.fn(*[resolve(f) for f in task.files], *task.args)
        return Outcome(task.key, "done", value, elapsed=time.perf_counter() - start)
    except BridgeError as e:
        return Outcome(task.key, "error", message=str(e), elapsed=time.perf_counter() - start)
    except Exception as e:  # noqa: BLE001 - a bug on one instance is that instance's error, labelled as such
        return Outcome(task.key, "error", message=f"internal error: {type(e).__name__}: {e}",
                       elapsed=time.perf_counter() - start)


def _worker_main(conn: Connection, warm: Sequence[str], scratch: str) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    use_scratch(scratch)
    warm_up(warm)
    conn.send(("ready", None))
    while True:
        try:
            task = conn.recv()
        except EOFError:
            return
        if task is None:
            return
        outcome = run_task(task)
        try:
            conn.send(("result", outcome))
        except Exception as e:  # noqa: BLE001 - e.g. a return value that cannot be pickled
            conn.send(("result", Outcome(task.key, "error", message=f"internal error: cannot send the result: {e}",
                                         elapsed=outcome.elapsed)))


class _Worker:
    def __init__(self, ctx: Any, warm: Sequence[str], scratch: str) -> None:
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child, list(warm), scratch), daemon=True)
        self.proc.start()
        child.close()


def _death(proc: Any) -> str:
    proc.join(1.0)
    code = proc.exitcode
    if code is None:
        return "its pipe closed"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


class _Processes:
    """The local transport: processes forked from a fork server (a single-threaded process that has
    imported the task modules once, so a replacement worker starts in milliseconds), and pipes."""

    def __init__(self, scratch: str) -> None:
        method = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
        self.ctx = multiprocessing.get_context(method)
        self.preloaded, self.scratch = False, scratch

    def start(self, warm: Sequence[str]) -> _Worker:
        if not self.preloaded and self.ctx.get_start_method() == "forkserver":
            self.ctx.set_forkserver_preload(["torchlean_bridge.app.campaign.local", *warm])
            self.preloaded = True
        saved = dict(os.environ)
        os.environ.update(thread_limits(1))  # inherited by the fork server when it starts here
        try:
            return _Worker(self.ctx, warm, self.scratch)
        finally:
            os.environ.clear()
            os.environ.update(saved)

    def send(self, worker: _Worker, task: Task) -> None:
        worker.conn.send(task)

    def poll(self, workers: Sequence[_Worker], timeout: float) -> list[tuple[Any, str, Any]]:
        watch: dict[Any, tuple[_Worker, str]] = {}
        for w in workers:
            watch[w.conn] = (w, "conn")
            watch[w.proc.sentinel] = (w, "proc")
        ready = wait(list(watch), timeout)
        events, seen = [], set()
        for obj in ready:
            w, what = watch[obj]
            if id(w) in seen:
                continue
            if what == "conn" or w.conn.poll():
                try:
                    kind, payload = w.conn.recv()
                except (EOFError, OSError):
                    kind, payload = "died", _death(w.proc)
            else:
                kind, payload = "died", _death(w.proc)
            seen.add(id(w))
            events.append((w, kind, payload))
        return events

    def stop(self, worker: _Worker, kill: bool) -> None:
        if not kill and worker.proc.is_alive():
            try:
                worker.conn.send(None)
                worker.proc.join(2.0)
            except (OSError, BrokenPipeError):
                pass
        if worker.proc.is_alive():
            worker.proc.kill()
            worker.proc.join(2.0)
        worker.conn.close()


class LocalEngine:
    """``workers`` processes on this machine (the default engine)."""

    name = "local"

    def __init__(self, workers: int, grace: float = DEFAULT_GRACE) -> None:
        self.workers, self.grace = workers, grace

    def run(self, tasks: Sequence[Task], on_outcome: Callable[[Outcome], None]) -> None:
        with campaign_scratch() as scratch:
            Dispatcher(_Processes(scratch), self.workers, grace=self.grace).run(tasks, on_outcome)


class InlineEngine:
    """The tasks one after another in this process: the reference a campaign's answers are compared
    with (tests, benches); a task that crashes or hangs takes the campaign with it."""

    name = "inline"
    workers = 1

    def run(self, tasks: Sequence[Task], on_outcome: Callable[[Outcome], None]) -> None:
        with campaign_scratch() as scratch:
            use_scratch(scratch)
            try:
                for task in tasks:
                    on_outcome(run_task(task))
            finally:
                drop_scratch()
