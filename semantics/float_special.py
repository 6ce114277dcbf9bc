"""Special functions numpy lacks, vectorized: ``erf`` in binary64 and binary32.

``erf`` (exact GELU) must agree with PyTorch within 1e-12 relative in float64 and 1e-5 in float32,
fast, with no per-element Python. It is one piecewise Taylor table, evaluated by Horner's rule with
per-element coefficient rows (no masks, no branches):
* interval 0 is ``[0, w)``, expanded at 0 (the odd Maclaurin series, constant term exactly 0), so
  tiny inputs keep full relative accuracy;
* interval k >= 1 is ``[k w, (k+1) w)``, expanded at its centre ``c``, with coefficients from
  ``erf^(n)(c) = 2/sqrt(pi) (-1)^(n-1) H_(n-1)(c) exp(-c^2)`` (Hermite polynomials evaluated exactly
  at the dyadic centre, then rounded once; ``erf(c)`` from libm);
* ``|x| >= 6`` uses the constant row 1: ``erfc(6) < 2.2e-17`` is below half an ulp of 1.
Binary64 uses w = 1/64 and degree 7 (measured max relative error 2.2e-16 against mpmath);
binary32 evaluates in float32 with w = 1/32 and degree 4 (1.6e-7, about one ulp). NaN propagates.
The cost is one gather per coefficient, so narrow intervals with few coefficients beat wide ones
with many (w = 1/8 at degree 13 was 25-30% slower at the same accuracy).
"""

from __future__ import annotations

import math
from fractions import Fraction
from functools import cache
from typing import NamedTuple

import numpy as np

__all__ = ["erf"]

_LARGE = 6.0
_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)


class _Table(NamedTuple):
    centres: np.ndarray  # [intervals + 1]
    rows: np.ndarray  # [degree + 1, intervals + 1]: one contiguous row per order, lowest first


def _hermite_values(x: Fraction, count: int) -> list[Fraction]:
    """Physicists' Hermite polynomials ``H_0 .. H_(count-1)`` at ``x``, exactly."""
    h = [Fraction(1), 2 * x]
    while len(h) < count:
        n = len(h) - 1
        h.append(2 * x * h[n] - 2 * n * h[n - 1])
    return h[:count]


def _table(width: float, degree: int, dtype: type) -> _Table:
    centres = [0.0] + [(k + 0.5) * width for k in range(1, round(_LARGE / width))]
    rows = []
    for c in centres:
        hermite = _hermite_values(Fraction(c), degree)
        scale = _TWO_OVER_SQRT_PI * math.exp(-c * c)
        rows.append([math.erf(c)] + [float((-1) ** (n - 1) * hermite[n - 1] / math.factorial(n)) * scale
                                     for n in range(1, degree + 1)])
    rows.append([1.0] + [0.0] * degree)
    centres.append(_LARGE)
    return _Table(np.array(centres, dtype), np.array(rows, dtype).T.copy())


# (interval width w, degree) per domain
_PIECES = {np.dtype(np.float64): (1 / 64, 7), np.dtype(np.float32): (1 / 32, 4)}


@cache
def _table_for(dtype: np.dtype) -> tuple[float, _Table]:
    """Built on first use (exact rational arithmetic, a few tens of ms), not at import."""
    width, degree = _PIECES[dtype]
    return width, _table(width, degree, dtype.type)


def erf(x: np.ndarray, dtype: np.dtype | type = np.float64) -> np.ndarray:
    """The error function, computed in ``dtype`` (float64 or float32)."""
    width, table = _table_for(np.dtype(dtype))
    x = np.asarray(x, dtype=dtype)
    ax = np.abs(x)
    last = len(table.centres) - 1
    index = np.fmin(ax * (1 / width), last).astype(np.intp)  # NaN -> the last row; t keeps the NaN
    t = np.minimum(ax, _LARGE) - table.centres[index]
    acc = table.rows[-1][index]
    for row in table.rows[-2::-1]:
        acc *= t
        acc += row[index]
    return np.copysign(acc, x)
