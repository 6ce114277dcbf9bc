"""The working-memory budget of buffers that rules build from attributes rather than declared shapes.

Declared shapes are capped in elements by ``check`` (``DEFAULT_MAX_ELEMENTS``); a rule that expands a
window or an index table (CROWN's max-pool windows: ``outputs * kernel`` entries per sample) can still
ask for many GiB within that cap. Such a buffer is sized in bytes against this budget before it is
allocated, so a hostile document is refused by name instead of exhausting (or swapping) the machine.
The budget is half of physical memory, or of the address-space limit (``ulimit -v``) when lower;
``TLB_MEMORY_BUDGET`` (bytes) overrides it.
"""

from __future__ import annotations

import os

from torchlean_bridge.errors import BridgeError

__all__ = ["working_memory_bytes", "exceeds_working_memory"]


def working_memory_bytes() -> int:
    override = os.environ.get("TLB_MEMORY_BUDGET")
    if override:
        if not override.strip().isdigit():
            raise BridgeError(f"TLB_MEMORY_BUDGET={override[:40]!r}: expected a whole number of bytes")
        return int(override)
    budget = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
    try:
        import resource
        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
        if soft != resource.RLIM_INFINITY:
            budget = min(budget, soft // 2)
    except (ImportError, ValueError, OSError):
        pass
    return budget


def exceeds_working_memory(nbytes: int, what: str) -> str | None:
    """A refusal message when ``nbytes`` for ``what`` exceed the budget, else None."""
    budget = working_memory_bytes()
    if nbytes <= budget:
        return None
    return (f"{what} needs {nbytes / 2 ** 30:.2f} GiB, above the working-memory budget of {budget / 2 ** 30:.2f} GiB "
            "(set TLB_MEMORY_BUDGET in bytes to change it)")
