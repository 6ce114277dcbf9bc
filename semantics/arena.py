"""Memory for a propagator's results, reused from one call to the next once the caller lets go.

A rule's result is a fresh array, and a fresh array above glibc's mmap threshold is a fresh mapping,
page-faulted and zeroed by the kernel on first touch. ``scratch`` removes that cost for temporaries;
results outlive the rule, so they cannot live in a named buffer. An ``IntervalPropagator`` that runs
box after box through one model instead hands its hot rules pieces of a few large chunks (through
``result_array``). At the start of the next call, the chunks are reused only if no array made from
them is still alive anywhere: every such array holds a reference to its chunk (numpy views keep
their owner as ``base``), so a chunk whose reference count is back to the arena's own is free. A
caller that keeps the previous boxes keeps their chunks: the arena lets them go and starts new ones.

``result_array`` outside an active arena is ``np.empty``; rules never depend on which they got.
"""

from __future__ import annotations

import contextlib
import math
import sys
import threading
from typing import Iterator, Sequence

import numpy as np

__all__ = ["ResultArena", "ThreadArenas", "result_array", "MAX_ARENA_BYTES"]

# an arena never holds more than this; requests beyond it are plain arrays
MAX_ARENA_BYTES = 256 << 20
_MIN_CHUNK = 1 << 20
_ALIGN = 64
_LOCAL = threading.local()


def _refcounts(chunks: list[np.ndarray]) -> list[int]:
    return [sys.getrefcount(chunk) for chunk in chunks]


# the count ``_refcounts`` sees for a chunk that only the arena's list refers to
_FREE_REFS = _refcounts([np.empty(1, np.uint8)])[0]


class ResultArena:
    """Chunks of memory handed out in order during one call and reused by the next when free.
    One arena serves one thread at a time (``IntervalPropagator`` keeps one per thread)."""

    def __init__(self, max_bytes: int = MAX_ARENA_BYTES) -> None:
        self.max_bytes = max_bytes
        self._chunks: list[np.ndarray] = []
        self._chunk = 0       # index of the chunk being filled
        self._offset = 0      # bytes used in it
        self._demand = 0      # the most bytes one call has taken (the size of a chunk that would hold them all)
        self._taken = 0
        self._active = False

    def _begin(self) -> None:
        """Reuse the chunks when nothing made from them is alive, else let them go to their holders."""
        if any(count != _FREE_REFS for count in _refcounts(self._chunks)):
            self._chunks = []
        self._chunk, self._offset, self._taken = 0, 0, 0

    def _end(self) -> None:
        self._demand = max(self._demand, self._taken)

    def take(self, shape: Sequence[int], dtype: np.dtype | type = np.float64) -> np.ndarray | None:
        """An uninitialized C-contiguous array from the arena, or None when it would pass ``max_bytes``."""
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        need = -(-max(nbytes, 1) // _ALIGN) * _ALIGN
        while self._chunk < len(self._chunks) and self._offset + need > self._chunks[self._chunk].nbytes:
            self._chunk, self._offset = self._chunk + 1, 0
        if self._chunk == len(self._chunks):
            held = sum(c.nbytes for c in self._chunks)
            size = max(need, _MIN_CHUNK, self._demand - self._taken)
            if held + size > self.max_bytes:
                size = need
                if held + size > self.max_bytes:
                    return None
            self._chunks.append(np.empty(size, np.uint8))
            self._offset = 0
        chunk = self._chunks[self._chunk]
        start = self._offset
        self._offset += need
        self._taken += need
        return chunk[start:start + nbytes].view(dtype).reshape(tuple(shape))

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Make this arena the one ``result_array`` draws from on this thread for the block. A block
        nested in one where the arena is already active draws plain arrays (its results must not
        share the outer block's memory, which is still being handed out)."""
        previous = getattr(_LOCAL, "arena", None)
        nested = self._active
        if not nested:
            self._begin()
            self._active = True
        _LOCAL.arena = None if nested else self
        try:
            yield
        finally:
            _LOCAL.arena = previous
            if not nested:
                self._active = False
                self._end()


class ThreadArenas:
    """One ``ResultArena`` per calling thread, for an object that threads may share."""

    def __init__(self) -> None:
        self._local = threading.local()

    def active(self) -> contextlib.AbstractContextManager[None]:
        arena = getattr(self._local, "arena", None)
        if arena is None:
            arena = self._local.arena = ResultArena()
        return arena.active()


def result_array(shape: Sequence[int], dtype: np.dtype | type = np.float64) -> np.ndarray:
    """An uninitialized array for a rule's result: from the active arena when there is one."""
    arena = getattr(_LOCAL, "arena", None)
    if arena is not None:
        got = arena.take(shape, dtype)
        if got is not None:
            return got
    return np.empty(tuple(shape), dtype)
