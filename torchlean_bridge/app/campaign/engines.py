"""The engines by name: ``local`` (a process pool on this machine, the default) and ``ray``."""

from __future__ import annotations

from ...errors import BridgeError
from .engine import DEFAULT_GRACE, Engine, default_workers

__all__ = ["make_engine", "default_workers", "MAX_WORKERS"]


MAX_WORKERS = 1024


def make_engine(name: str, workers: int | None = None, address: str | None = None,
                grace: float = DEFAULT_GRACE) -> Engine:
    """``local`` (a process pool on this machine, the default) or ``ray`` (a local Ray instance, or the
    cluster at ``address``)."""
    if workers is not None and not 1 <= workers <= MAX_WORKERS:
        raise BridgeError(f"--workers must be between 1 and {MAX_WORKERS}, got {workers}")
    if name == "local":
        if address:
            raise BridgeError("--ray-address needs --engine ray")
        from .local import LocalEngine
        return LocalEngine(workers or default_workers(), grace=grace)
    if name == "ray":
        from .ray_engine import RayEngine
        return RayEngine(workers, address=address, grace=grace)
    raise BridgeError(f"--engine must be local or ray, got {name!r}")
