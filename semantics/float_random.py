"""TorchLean's deterministic random stream (``Spec.Random``): splitmix64, vectorized.

For node index ``i`` and seed ``s``: ``key = mix((s + i) mod 2^64)``; the entry at row-major flat
index ``k`` uses ``u = mix((key + k) mod 2^64) mod 2^32`` and the value ``u / 2^32``. numpy's
uint64 array arithmetic wraps modulo 2^64, exactly as the spec's ``UInt64`` does.
"""

from __future__ import annotations

import numpy as np

__all__ = ["splitmix64", "uniform_bits", "uniform", "bernoulli"]

_U64 = np.uint64
_MASK64 = (1 << 64) - 1


def splitmix64(z: np.ndarray) -> np.ndarray:
    """The splitmix64 finalizer over a uint64 array (wrapping arithmetic)."""
    z = z + _U64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> _U64(30))) * _U64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> _U64(27))) * _U64(0x94D049BB133111EB)
    return z ^ (z >> _U64(31))


def uniform_bits(seed: int, node_index: int, count: int) -> np.ndarray:
    """The 32-bit draws ``u`` (as uint64) for flat indices ``0 .. count-1``."""
    key = splitmix64(np.array([(int(seed) + int(node_index)) & _MASK64], dtype=_U64))
    return splitmix64(np.arange(count, dtype=_U64) + key[0]) & _U64(0xFFFFFFFF)


def uniform(seed: int, node_index: int, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """``float(u) / float(2^32)``: exact in binary64, one rounding in binary32 (may give 1.0)."""
    count = int(np.prod(shape, dtype=np.int64))
    u = uniform_bits(seed, node_index, count).astype(np.float64) / 4294967296.0
    return u.astype(dtype).reshape(shape)


def bernoulli(keep: float, seed: int, node_index: int, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """``q > 0 ? (1 > q ? (q > u / 2^32 ? 1 : 0) : 1) : 0``: a NaN keep probability gives all zeros."""
    q = dtype.type(keep)
    if not q > 0:
        return np.zeros(shape, dtype)
    if not (1 > q):
        return np.ones(shape, dtype)
    return (q > uniform(seed, node_index, shape, dtype)).astype(dtype)
