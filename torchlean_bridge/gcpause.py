"""Pause the cyclic garbage collector around bulk construction.

A 10^6-node graph allocates millions of long-lived objects (nodes, tuples, dicts) and no cycles; the
collector's generational passes then re-scan that growing heap again and again, which made load,
check, dump, save and evaluate of such a graph several times slower than the work itself. Reference
counting still frees everything (numpy buffers included) while the collector is paused; it resumes,
if it was enabled, when the outermost paused call returns."""

from __future__ import annotations

import functools
import gc
from typing import Callable, TypeVar

F = TypeVar("F", bound=Callable)


def gc_paused(fn: F) -> F:
    """``fn`` runs with the cyclic collector disabled (restored afterwards, nested calls included)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if not gc.isenabled():
            return fn(*args, **kwargs)
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            gc.enable()
    return wrapper  # type: ignore[return-value]
