"""Reusable per-thread buffers for temporaries that die inside one rule.

A fresh numpy array above glibc's mmap threshold (128 KiB; its dynamic raise is undone whenever the
heap top is trimmed) is a fresh mapping, page-faulted and zeroed by the kernel on first touch. For
the boxes of a batch of 64 that costs as much as the arithmetic on them, once per temporary per
node per call. Temporaries that never leave a rule (centers, radii, im2col columns, padded inputs,
GEMM results before their final copy) are written into named per-thread buffers instead, which stay
mapped between calls.

Contract: a buffer's contents are undefined when handed out; a rule never returns one, keeps one
after it returns, or holds two live temporaries under one name. Buffers above ``MAX_SCRATCH_BYTES``
are not kept (their page faults are small next to the work on them, and keeping them would pin
that memory after the call).
"""

from __future__ import annotations

import math
import threading
from typing import Sequence

import numpy as np

__all__ = ["scratch", "MAX_SCRATCH_BYTES"]

MAX_SCRATCH_BYTES = 64 << 20
_LOCAL = threading.local()


def scratch(name: str, shape: Sequence[int], dtype: np.dtype | type = np.float64) -> np.ndarray:
    """An uninitialized C-contiguous array of ``shape`` and ``dtype``, the buffer of ``name`` on this
    thread (grown when too small), or a fresh array above ``MAX_SCRATCH_BYTES``. Asked again for the
    same shape and type, it hands out the same array object (a hot loop asks thousands of times)."""
    buffers = getattr(_LOCAL, "buffers", None)
    if buffers is None:
        buffers = _LOCAL.buffers = {}
    shape = tuple(shape)
    got = buffers.get(name)
    if got is not None and got[1] == shape and got[2] == dtype:
        return got[3]
    dtype = np.dtype(dtype)
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes > MAX_SCRATCH_BYTES:
        return np.empty(shape, dtype)
    buf = None if got is None else got[0]
    if buf is None or buf.nbytes < nbytes:
        buf = np.empty(max(nbytes, 64), np.uint8)
    view = buf[:nbytes].view(dtype).reshape(shape)
    buffers[name] = (buf, shape, dtype, view)
    return view
