"""Fits the coefficients of ``semantics.float_special``'s binary32 erf and prints them as Python.

    python tools/fit_erf32.py

Two least-squares fits on 400 Chebyshev nodes against mpmath at 40 digits (near-minimax):
* small |x| < SPLIT: ``erf(x) = x + x s(u)``, u = x^2, ``s(u) = erf(sqrt u) / sqrt u - 1`` of degree 6;
* SPLIT <= |x| <= 4: ``erfc(a) = t exp(-a^2 + R(t))``, t = 1 / (1 + a/2) (Numerical Recipes' form),
  ``R`` of degree 7 in ``v = t - T_MID``.
Printed with the fits' largest errors on 3,001 points; the module's tests check the binary32 result.
"""

from __future__ import annotations

import mpmath as mp
import numpy as np

SPLIT, A_MAX, SMALL_DEGREE, LARGE_DEGREE = 1.0, 4.0, 6, 7
T_LO, T_HI = 1 / (1 + A_MAX / 2), 1 / (1 + SPLIT / 2)
T_MID = (T_LO + T_HI) / 2


def _nodes(lo: float, hi: float, n: int = 400) -> np.ndarray:
    k = np.arange(n)
    return (lo + hi) / 2 + (hi - lo) / 2 * np.cos(np.pi * (k + 0.5) / n)


def _fit(xs: np.ndarray, ys: np.ndarray, degree: int) -> np.ndarray:
    coefficients, *_ = np.linalg.lstsq(np.vander(xs, degree + 1, increasing=True), ys, rcond=None)
    return coefficients


def s_exact(u: float) -> mp.mpf:
    if u == 0:
        return 2 / mp.sqrt(mp.pi) - 1
    r = mp.sqrt(mp.mpf(u))
    return mp.erf(r) / r - 1


def r_exact(t: float) -> mp.mpf:
    t = mp.mpf(t)
    a = 2 / t - 2
    return mp.log(mp.erfc(a) / t) + a * a


def main() -> None:
    with mp.workdps(40):
        us = _nodes(0.0, SPLIT * SPLIT)
        small = _fit(us, np.array([float(s_exact(u)) for u in us]), SMALL_DEGREE)
        ts = _nodes(T_LO, T_HI)
        large = _fit(ts - T_MID, np.array([float(r_exact(t)) for t in ts]), LARGE_DEGREE)
        small_err = max(abs(float(np.polyval(small[::-1], u) - s_exact(u))) for u in np.linspace(0, SPLIT ** 2, 3001))
        large_err = max(abs(float(np.polyval(large[::-1], t - T_MID) - r_exact(t))) for t in np.linspace(T_LO, T_HI, 3001))
    print(f"# s(u): largest error {small_err:.2e}; R(t): largest error {large_err:.2e} (relative error of erfc)")
    print(f"_SPLIT, _T_MID = {SPLIT!r}, {T_MID!r}")
    print(f"_SMALL = {tuple(float(c) for c in small)!r}")
    print(f"_LARGE_R = {tuple(float(c) for c in large)!r}")


if __name__ == "__main__":
    main()
