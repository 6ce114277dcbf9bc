"""The same tasks on Ray: one actor per worker, files through the object store.

``ray.init()`` starts Ray on this machine, or joins the cluster at ``address`` (``ray start --head``
on one node, ``ray start --address=HEAD:6379`` on the others; every node needs torchlean-bridge
installed). Each worker is an actor holding one CPU, so a hung task is stopped by killing its actor
(``ray.kill``) and a new actor takes its place, as the local pool does with processes. A file a task
reads is put in the object store once per campaign (``ray.put``) and fetched by a worker only the
first time it needs it (the worker keeps it on its node's disk), so a model is shipped once per
worker, not per task. Folders (bundles) are passed by path: on a multi-node cluster they must be on
a shared file system. Install with ``pip install 'torchlean-bridge[distributed]'``.
"""

from __future__ import annotations

import hashlib
import os
import socket
from typing import Any, Callable, Sequence

from ...errors import BridgeError
from .engine import DEFAULT_GRACE, Dispatcher, Outcome, Task, thread_limits, warm_up
from .files import campaign_scratch, drop_scratch, local_file, materialize, use_scratch
from .local import run_task

__all__ = ["RayEngine"]

_CLOSE_WAIT = 5.0  # seconds an idle actor gets to remove its files before it is killed

_actor_class: list[Any] = []


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise BridgeError("--engine ray needs Ray: pip install 'torchlean-bridge[distributed]'") from None
    return ray


class _Worker:
    """A Ray actor: warms up like a local worker, keeps the files shipped to it, runs one task a call."""

    def __init__(self, warm: Sequence[str], scratch: str, home: str) -> None:
        use_scratch(scratch, home)
        warm_up(warm)
        self.files: dict[str, str] = {}

    def close(self) -> None:
        """Remove this actor's files (on a node that is not the campaign's, nobody else will)."""
        drop_scratch()

    def ready(self) -> int:
        return os.getpid()

    def run(self, task: Task, shipped: dict[str, tuple[str, Any]]) -> Outcome:
        import ray

        def resolve(path: str) -> str:
            if path not in shipped:
                return local_file(path)
            digest, ref = shipped[path]
            if digest not in self.files:  # the reference is wrapped in a list so Ray does not fetch it per call
                self.files[digest] = materialize(path, digest, ray.get(ref[0]))
            return self.files[digest]

        return run_task(task, resolve)


def _worker_class() -> Any:
    """The actor class (made once: ``ray.remote`` needs Ray imported)."""
    if not _actor_class:
        _actor_class.append(_ray().remote(num_cpus=1, max_restarts=0, max_task_retries=0)(_Worker))
    return _actor_class[0]


class _Handle:
    def __init__(self, actor: Any, ready_ref: Any) -> None:
        self.actor, self.pending, self.pid = actor, ready_ref, None
        self.kind = "ready"


class _Actors:
    """The Ray transport: actors, object references and ``ray.wait``."""

    def __init__(self, shipped: dict[str, tuple[str, Any]], scratch: str) -> None:
        self.ray, self.cls, self.shipped, self.scratch = _ray(), _worker_class(), shipped, scratch

    def start(self, warm: Sequence[str]) -> _Handle:
        limits = thread_limits(1)  # the actor holds one CPU
        cls = self.cls.options(runtime_env={"env_vars": limits}) if limits else self.cls
        actor = cls.remote(list(warm), self.scratch, socket.gethostname())
        return _Handle(actor, actor.ready.remote())

    def send(self, worker: _Handle, task: Task) -> None:
        shipped = {f: self.shipped[f] for f in task.files if f in self.shipped}
        worker.pending, worker.kind = worker.actor.run.remote(task, shipped), "result"

    def poll(self, workers: Sequence[_Handle], timeout: float) -> list[tuple[Any, str, Any]]:
        ray = self.ray
        by_ref = {w.pending: w for w in workers if w.pending is not None}
        if not by_ref:
            return []
        done, rest = ray.wait(list(by_ref), num_returns=1, timeout=timeout)
        if done and rest:
            more, _ = ray.wait(rest, num_returns=len(rest), timeout=0)
            done += more
        events = []
        for ref in done:
            w = by_ref[ref]
            w.pending = None
            try:
                value = ray.get(ref)
            except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError) as e:
                events.append((w, "died", _first_line(e)))
                continue
            except ray.exceptions.RayError as e:  # e.g. the result could not be deserialized
                events.append((w, "died", f"Ray: {_first_line(e)}"))
                continue
            if w.kind == "ready":
                w.pid = value
                events.append((w, "ready", None))
            else:
                events.append((w, "result", value))
        return events

    def stop(self, worker: _Handle, kill: bool) -> None:
        if not kill:
            try:
                self.ray.get(worker.actor.close.remote(), timeout=_CLOSE_WAIT)
            except Exception:  # noqa: BLE001 - a worker that cannot clean up is killed all the same
                pass
        try:
            self.ray.kill(worker.actor, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone
            pass


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def _ship(ray: Any, tasks: Sequence[Task]) -> dict[str, tuple[str, Any]]:
    """Every regular file the tasks read, put in the object store once: path -> (digest, [ref])."""
    from .files import read_plain
    out: dict[str, tuple[str, Any]] = {}
    for t in tasks:
        for f in t.files:
            if f in out or not os.path.isfile(f):
                continue  # folders go by path; a missing file fails in its task, as locally
            try:
                data = read_plain(f)
            except BridgeError:
                continue  # the task reports it
            out[f] = (hashlib.sha256(data).hexdigest(), [ray.put(data)])
    return out


class RayEngine:
    """Tasks on Ray actors: ``workers`` of them (default: the cluster's CPUs)."""

    name = "ray"

    def __init__(self, workers: int | None = None, address: str | None = None, grace: float = DEFAULT_GRACE) -> None:
        self.requested, self.address, self.grace = workers, address, grace
        self.workers = workers or 0

    def run(self, tasks: Sequence[Task], on_outcome: Callable[[Outcome], None]) -> None:
        ray = _ray()
        started = not ray.is_initialized()
        if started:
            try:
                if self.address:
                    ray.init(address=self.address, log_to_driver=False)
                else:
                    ray.init(num_cpus=self.requested, include_dashboard=False, log_to_driver=False)
            except (ConnectionError, RuntimeError, ValueError) as e:
                raise BridgeError(f"--engine ray: cannot start or join Ray"
                                  f"{f' at {self.address}' if self.address else ''}: {e}") from None
        try:
            self.workers = self.requested or max(1, int(ray.cluster_resources().get("CPU", 1)))
            shipped = _ship(ray, tasks)
            with campaign_scratch() as scratch:
                Dispatcher(_Actors(shipped, scratch), self.workers, grace=self.grace).run(tasks, on_outcome)
        finally:
            if started:
                ray.shutdown()
