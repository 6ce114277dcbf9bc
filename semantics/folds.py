"""Kernels of the exact float64 mode: TorchLean's accumulation orders and C libm, vectorized.

TorchLean's ``Graph.denoteAll`` at Float folds every sum left to right from +0.0 and calls the C
library's ``exp``/``log``/``tanh``/``sin``/``cos`` (Lean's ``Float`` is binary64 with those
functions). numpy's ``np.sum`` is pairwise, BLAS reorders dot products, and numpy's own SIMD
``exp``/``log``/``tanh`` differ from glibc's by an ulp on a few percent of inputs (measured: exp
18k, tanh 50k, log 129 of 500k points), so the exact mode uses these kernels instead:

* ``fold_sum`` is ``np.add.accumulate`` along the axis (a recurrence: sequential by construction)
  whose last entry, plus +0.0, is the fold from +0.0 (the two differ only when every term is -0.0).
* ``fold_dot`` contracts over k as k vector steps ``acc = acc + a_k * b_k`` over all outputs at
  once (two roundings per step, never a fused multiply-add), ``acc`` starting at +0.0.
* ``libm`` maps an array through Python's ``math`` module, which calls the C library, with the
  inputs where ``math`` raises instead of returning C's value (overflow, poles, infinities)
  given C's value directly.
"""

from __future__ import annotations

import math
import sys
from typing import Callable

import numpy as np

__all__ = ["fold_sum", "fold_dot", "libm", "EXP_OVERFLOW"]


def fold_sum(x: np.ndarray, axis: int) -> np.ndarray:
    """``acc = 0.0; for v along axis: acc = acc + v`` for every position off the axis."""
    if x.shape[axis] == 0:
        return np.zeros(x.shape[:axis] + x.shape[axis + 1:], x.dtype)
    return np.add.accumulate(x, axis=axis).take(-1, axis=axis) + 0.0


def fold_dot(a: Callable[[int], np.ndarray], b: Callable[[int], np.ndarray], k: int, shape: tuple[int, ...],
             dtype: np.dtype = np.dtype(np.float64)) -> np.ndarray:
    """``acc = 0.0; for j in range(k): acc = acc + a(j) * b(j)`` with ``a(j) * b(j)`` broadcasting to
    ``shape``: k vector steps over all outputs, products rounded before they are added."""
    acc = np.zeros(shape, dtype)
    tmp = np.empty(shape, dtype)
    for j in range(k):
        np.multiply(a(j), b(j), out=tmp)
        acc += tmp
    return acc


def _largest_finite_exp() -> float:
    """The largest x whose exp is finite in this C library (``math.exp`` raises above it)."""
    x = math.log(sys.float_info.max)
    while True:
        nxt = math.nextafter(x, math.inf)
        try:
            math.exp(nxt)
        except OverflowError:
            break
        x = nxt
    while True:
        try:
            math.exp(x)
            return x
        except OverflowError:
            x = math.nextafter(x, 0.0)


EXP_OVERFLOW = _largest_finite_exp()

# where each function's math wrapper raises, C's value (math raises exactly there)
_SPECIAL: dict[str, Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]] = {
    "exp": lambda x: (x > EXP_OVERFLOW, np.full(x.shape, np.inf)),
    "log": lambda x: (x <= 0, np.where(x == 0, -np.inf, np.nan)),
    "sin": lambda x: (np.isinf(x), np.full(x.shape, np.nan)),
    "cos": lambda x: (np.isinf(x), np.full(x.shape, np.nan)),
    "tanh": lambda x: (np.zeros(x.shape, bool), x),
}
_UFUNCS = {name: np.frompyfunc(getattr(math, name), 1, 1) for name in _SPECIAL}


def libm(name: str, x: np.ndarray) -> np.ndarray:
    """The C library's ``name`` (exp, log, tanh, sin, cos) at every entry of float64 ``x``."""
    x = np.asarray(x, dtype=np.float64)
    special, value = _SPECIAL[name](x)
    if special.any():
        out = value.astype(np.float64)
        ok = ~special
        out[ok] = np.asarray(_UFUNCS[name](x[ok]), dtype=object).astype(np.float64)
        return out
    return np.asarray(_UFUNCS[name](x), dtype=object).astype(np.float64).reshape(x.shape)
