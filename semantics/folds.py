"""Kernels of the exact float64 mode: TorchLean's accumulation orders and C libm, vectorized.

TorchLean's ``Graph.denoteAll`` at Float folds every sum left to right from +0.0 and calls the C
library's ``exp``/``log``/``tanh``/``sin``/``cos`` (Lean's ``Float`` is binary64 with those
functions). numpy's ``np.sum`` is pairwise, BLAS reorders dot products, and numpy's own SIMD
``exp``/``log``/``tanh`` differ from glibc's by an ulp on a few percent of inputs (measured: exp
18k, tanh 50k, log 129 of 500k points), so the exact mode uses these kernels instead:

* ``fold_sum`` is ``np.add.accumulate`` along the axis (a recurrence: sequential by construction)
  whose last entry, plus +0.0, is the fold from +0.0 (the two differ only when every term is -0.0).
* ``fold_matmul`` contracts over k as k vector steps ``acc = acc + a_k * b_k`` over all outputs at
  once (two roundings per step, never a fused multiply-add), ``acc`` starting at +0.0; it runs as one
  numpy ``einsum`` where that is checked to compute exactly these steps (``einsum_folds_in_order``).
* ``libm`` maps an array through Python's ``math`` module, which calls the C library, with the
  inputs where ``math`` raises instead of returning C's value (overflow, poles, infinities)
  given C's value directly.
"""

from __future__ import annotations

import functools
import math
import sys
from typing import Callable

import numpy as np

__all__ = ["fold_sum", "fold_matmul", "einsum_folds_in_order", "libm", "EXP_OVERFLOW"]


def fold_sum(x: np.ndarray, axis: int) -> np.ndarray:
    """``acc = 0.0; for v along axis: acc = acc + v`` for every position off the axis."""
    if x.shape[axis] == 0:
        return np.zeros(x.shape[:axis] + x.shape[axis + 1:], x.dtype)
    return np.add.accumulate(x, axis=axis).take(-1, axis=axis) + 0.0


def fold_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``out[.., m, n] = (((0.0 + a[.., 0, m] * b[.., 0, n]) + a[.., 1, m] * b[.., 1, n]) + ...)``: for
    float64 ``a`` [(B,) K, M] and ``b`` [(B,) K, N] (the same batch B, or none), every product rounded,
    then added in k order from +0.0. The contracted axis leads both operands, so each step is one
    vector update of whole output rows."""
    a, b = np.ascontiguousarray(a, np.float64), np.ascontiguousarray(b, np.float64)
    k, m, n = a.shape[-2], a.shape[-1], b.shape[-1]
    batch = a.shape[:-2]
    if a.ndim not in (2, 3) or a.shape[:-1] != b.shape[:-1]:
        raise ValueError(f"fold_matmul: operands {a.shape} and {b.shape} do not share [batch,] k")
    if k == 0 or m * n * math.prod(batch) == 0:
        return np.zeros(batch + (m, n))
    if k == 1:  # one product, then + 0.0 (the fold's first step)
        return a[..., 0, :, None] * b[..., 0, None, :] + 0.0
    if m * n == 1 or not einsum_folds_in_order():
        return _fold_matmul_steps(a, b)
    b_ = "b" if batch else ""
    if n == 1:
        return np.einsum(f"{b_}km,{b_}k->{b_}m", a, b[..., 0], optimize=False)[..., None]
    if m == 1:
        return np.einsum(f"{b_}k,{b_}kn->{b_}n", a[..., 0], b, optimize=False)[..., None, :]
    return np.einsum(f"{b_}km,{b_}kn->{b_}mn", a, b, optimize=False)


def _fold_matmul_steps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``fold_matmul`` as k explicit vector steps (the definition; used where einsum is not known to
    compute it, see ``einsum_folds_in_order``)."""
    acc = np.zeros(a.shape[:-2] + (a.shape[-1], b.shape[-1]))
    tmp = np.empty_like(acc)
    for j in range(a.shape[-2]):
        np.multiply(a[..., j, :, None], b[..., j, None, :], out=tmp)
        acc += tmp
    return acc


@functools.cache
def einsum_folds_in_order() -> bool:
    """Whether this numpy's ``einsum`` computes ``fold_matmul``'s forms bit for bit.

    numpy's einsum (``optimize=False``) zeroes the output, iterates the contracted axis outside its
    inner loop when k leads both operands and the output has more than one entry, and runs
    ``out = a * b + out`` per entry: the fold from +0.0, provided the multiply-add is not fused into
    one rounding (it is not on builds whose baseline lacks FMA, e.g. x86-64 wheels; it may be on
    others). Nothing of this is documented, so it is checked once per process against the explicit
    steps, on data where a fused, reassociated or reordered sum differs: every form
    ``fold_matmul`` sends to einsum, inner lengths 2..40 (vector bodies and tails of every SIMD
    width) and misaligned starts. If any bit differs the explicit steps are used instead."""
    rng = np.random.default_rng(20)
    k = 37

    def probe(shape: tuple[int, ...], offset: int) -> np.ndarray:
        size = math.prod(shape)
        buf = rng.standard_normal(size + offset) * np.exp2(rng.integers(-30, 30, size + offset))
        return buf[offset:].reshape(shape)  # a view starting `offset` elements in: (mis)aligned

    cases = [((k, 2), (k, n)) for n in range(1, 41)] + [((k, m), (k, 1)) for m in range(2, 41)]
    cases += [((k, 1), (k, n)) for n in range(2, 41)] + [((3, k, 5), (3, k, 7)), ((2, k, 1), (2, k, 9)),
                                                          ((2, k, 9), (2, k, 1)), ((k, 64), (k, 96))]
    with np.errstate(all="ignore"):
        for i, (sa, sb) in enumerate(cases):
            a, b = probe(sa, i % 8), probe(sb, (i // 8) % 8)
            want = _fold_matmul_steps(a, b)
            m, n = sa[-1], sb[-1]
            b_ = "b" if len(sa) == 3 else ""
            if n == 1:
                got = np.einsum(f"{b_}km,{b_}k->{b_}m", a, b[..., 0], optimize=False)[..., None]
            elif m == 1:
                got = np.einsum(f"{b_}k,{b_}kn->{b_}n", a[..., 0], b, optimize=False)[..., None, :]
            else:
                got = np.einsum(f"{b_}km,{b_}kn->{b_}mn", a, b, optimize=False)
            if got.shape != want.shape or not np.array_equal(got.view(np.int64), want.view(np.int64)):
                return False
    return True


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

# where each function's math wrapper raises instead of returning C's value, and C's value there
_RAISES: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "exp": lambda x: x > EXP_OVERFLOW, "log": lambda x: x <= 0, "sin": np.isinf, "cos": np.isinf,
}
_C_VALUE: dict[str, Callable[[np.ndarray], np.ndarray | float]] = {
    "exp": lambda x: np.inf, "log": lambda x: np.where(x == 0, -np.inf, np.nan),
    "sin": lambda x: np.nan, "cos": lambda x: np.nan,
}
_LIBM_NAMES = ("exp", "log", "tanh", "sin", "cos")


def _each(fn: Callable[[float], float], x: np.ndarray) -> np.ndarray:
    return np.fromiter(map(fn, x.ravel().tolist()), np.float64, count=x.size)


def libm(name: str, x: np.ndarray) -> np.ndarray:
    """The C library's ``name`` (exp, log, tanh, sin, cos) at every entry of float64 ``x``."""
    if name not in _LIBM_NAMES:
        raise ValueError(f"libm: no C function {name!r} here")
    x = np.asarray(x, dtype=np.float64)
    fn = getattr(math, name)
    raises = _RAISES[name](x) if name in _RAISES else None
    if raises is None or not raises.any():
        return _each(fn, x).reshape(x.shape)
    out = np.empty(x.shape)
    out[raises] = _C_VALUE[name](x[raises])
    ok = ~raises
    out[ok] = _each(fn, x[ok])
    return out
