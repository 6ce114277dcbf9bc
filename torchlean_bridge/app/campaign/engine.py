"""The engine interface: run independent tasks on a pool of workers, one outcome per task.

A campaign is a list of ``Task``s (a module-level function, the files it reads, small arguments and
a time limit). An engine runs them on long-lived workers and reports each ``Outcome`` as it
finishes; it never stops for one task's failure: an exception is an ``error`` outcome, a worker that
dies is an ``error`` outcome naming how it died (and a fresh worker takes its place), a task still
running ``grace`` seconds past its time limit is a ``timeout`` outcome (its worker is stopped and
replaced). Files a task reads are shipped to each worker once (``Worker.files``) and the task
function may cache what it builds from them, so a model is loaded once per worker, not per task.

The two engines differ only in their transport (``Transport``): processes and pipes on this
machine (``local.py``), Ray actors and the object store on a Ray cluster (``ray_engine.py``). The
dispatch loop (``Dispatcher``) is shared: no task queue or retry logic of our own beyond handing
the next task to an idle worker.
"""

from __future__ import annotations

import os
import sys
import time
from importlib import import_module
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence

from ...errors import BridgeError

__all__ = ["Task", "Outcome", "Transport", "Dispatcher", "Engine", "STATUSES", "DEFAULT_GRACE", "warm_up",
           "modules_to_warm", "thread_limits", "default_workers"]

STATUSES = ("done", "error", "timeout")
MAX_FAILED_STARTS = 3  # workers in a row that die before they are ready: the engine itself is broken
DEFAULT_GRACE = 10.0  # seconds a task may run past its own time limit before its worker is stopped


@dataclass(frozen=True)
class Task:
    """``fn(*local_paths_of(files), *args)`` on a worker, within ``timeout`` seconds (None: no limit)."""

    key: str
    fn: Callable[..., Any]
    files: tuple[str, ...] = ()
    args: tuple = ()
    timeout: float | None = None


@dataclass
class Outcome:
    key: str
    status: str  # one of STATUSES
    value: Any = None  # fn's return value when done
    message: str = ""
    elapsed: float = 0.0  # seconds the task ran on its worker (measured by the engine when it gave up)


@dataclass
class _Slot:
    handle: Any
    task: Task | None = None
    started: float = 0.0
    ready: bool = False


class Transport(Protocol):
    """What a dispatcher needs from an engine: start, feed, watch and stop workers."""

    def start(self, warm: Sequence[str]) -> Any:
        """A new worker (importing the modules ``warm`` before it reports ready)."""

    def send(self, worker: Any, task: Task) -> None:
        """Hand ``task`` to an idle, ready worker."""

    def poll(self, workers: Sequence[Any], timeout: float) -> list[tuple[Any, str, Any]]:
        """Events within ``timeout`` seconds: ``(worker, "ready", None)``, ``(worker, "result", Outcome)``
        or ``(worker, "died", message)``."""

    def stop(self, worker: Any, kill: bool) -> None:
        """End a worker (at once with ``kill``)."""


@dataclass
class Dispatcher:
    """The loop every engine runs: the next task to each idle worker, deadlines, dead workers replaced."""

    transport: Transport
    workers: int
    grace: float = DEFAULT_GRACE
    poll_interval: float = 0.5
    slots: list[_Slot] = field(default_factory=list)

    def run(self, tasks: Sequence[Task], on_outcome: Callable[[Outcome], None]) -> None:
        if not tasks:
            return
        warm = modules_to_warm(tasks)
        pending = list(reversed(tasks))
        try:
            while len(self.slots) < min(self.workers, len(tasks)):
                self.slots.append(_Slot(self.transport.start(warm)))
            busy = failed_starts = 0
            while pending or busy:
                for slot in self.slots:
                    if slot.ready and slot.task is None and pending:
                        slot.task, slot.started = pending.pop(), time.monotonic()
                        self.transport.send(slot.handle, slot.task)
                        busy += 1
                wait = self._next_deadline() - time.monotonic()
                events = self.transport.poll([s.handle for s in self.slots], max(0.0, min(wait, self.poll_interval)))
                by_handle = {id(s.handle): s for s in self.slots}
                for handle, kind, payload in events:
                    slot = by_handle.get(id(handle))
                    if slot is None:
                        continue
                    if kind == "ready":
                        slot.ready, failed_starts = True, 0
                    elif kind == "result" and slot.task is not None:
                        slot.task = None
                        busy -= 1
                        on_outcome(payload)
                    elif kind == "died":
                        if slot.task is None and not slot.ready:
                            failed_starts += 1
                            if failed_starts >= MAX_FAILED_STARTS:
                                raise BridgeError(f"campaign: {failed_starts} workers died before they were ready; "
                                                  f"the last: {payload}")
                        if slot.task is not None:
                            busy -= 1
                            on_outcome(Outcome(slot.task.key, "error", message=f"the worker died: {payload}",
                                               elapsed=time.monotonic() - slot.started))
                        self._replace(slot, warm, kill=True)
                now = time.monotonic()
                for slot in self.slots:
                    task = slot.task
                    if task is not None and task.timeout is not None and now > slot.started + task.timeout + self.grace:
                        busy -= 1
                        on_outcome(Outcome(task.key, "timeout", elapsed=now - slot.started,
                                           message=f"no answer {task.timeout:g} s + {self.grace:g} s after it "
                                                   "started: its worker was stopped"))
                        self._replace(slot, warm, kill=True)
        finally:
            self.close()

    def _next_deadline(self) -> float:
        ends = [s.started + s.task.timeout + self.grace for s in self.slots
                if s.task is not None and s.task.timeout is not None]
        return min(ends, default=time.monotonic() + self.poll_interval)

    def _replace(self, slot: _Slot, warm: Sequence[str], kill: bool) -> None:
        self.transport.stop(slot.handle, kill=kill)
        slot.handle, slot.task, slot.ready = self.transport.start(warm), None, False

    def close(self) -> None:
        for slot in self.slots:
            self.transport.stop(slot.handle, kill=slot.task is not None)
        self.slots.clear()


class Engine(Protocol):
    """Runs a campaign's tasks; ``on_outcome`` is called in the calling process as each one finishes."""

    name: str

    def run(self, tasks: Sequence[Task], on_outcome: Callable[[Outcome], None]) -> None: ...


def modules_to_warm(tasks: Sequence[Task]) -> list[str]:
    """The task functions' modules and what each lists in its ``PRELOAD`` (heavy imports its tasks
    need), imported by a worker before it reports ready so that start-up is not counted in a task."""
    out: list[str] = []
    for name in dict.fromkeys(t.fn.__module__ for t in tasks):
        out += [m for m in getattr(sys.modules.get(name), "PRELOAD", ()) if m not in out]
        out.append(name)
    return out


def default_workers() -> int:
    """The cores this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def thread_limits(threads: int) -> dict[str, str]:
    """Environment variables that cap the BLAS/OpenMP threads of a worker (the user's own settings
    win): a worker per core that also starts a thread per core makes N workers no faster than one
    (measured: 1.02x with 2 workers on 2 cores, 1.96x with one thread each)."""
    return {k: str(threads) for k in THREAD_VARIABLES if k not in os.environ}


def warm_up(modules: Sequence[str]) -> None:
    for name in modules:
        import_module(name)
