"""Fits the coefficients of ``semantics.float_special``'s binary32 GELU tail and prints them as Python.

    python tools/fit_gelu32.py

GELU(x) = x Phi(x) = max(x, 0) - |x| E(|x|) with E(a) = Phi(-a) = erfc(z) / 2, z = a / sqrt 2. The tail is
written ``|x| E = z t exp(-z^2 + R(t))`` with t = 1 / (1 + z/2) (Numerical Recipes' erfc form), so
``R(t) = log(erfc(z) / (2 t)) + z^2 + log(sqrt 2)``, fitted by least squares on 500 Chebyshev nodes
against mpmath at 40 digits for 0 <= z <= Z_MAX (past it E is below float32's range), of degree 10 in
``v = t - T_MID``. Printed with the fit's largest error on 2,001 points; the module's tests check the
binary32 result.
"""

from __future__ import annotations

import mpmath as mp
import numpy as np

Z_MAX, DEGREE = 9.6, 10
T_LO, T_HI = 1 / (1 + Z_MAX / 2), 1.0
T_MID = (T_LO + T_HI) / 2


def _nodes(lo: float, hi: float, n: int = 500) -> np.ndarray:
    k = np.arange(n)
    return (lo + hi) / 2 + (hi - lo) / 2 * np.cos(np.pi * (k + 0.5) / n)


def r_exact(t: float) -> mp.mpf:
    t = mp.mpf(t)
    z = 2 / t - 2
    return mp.log(mp.erfc(z) / (2 * t)) + z * z + mp.log(mp.sqrt(2))


def main() -> None:
    with mp.workdps(40):
        ts = _nodes(T_LO, T_HI)
        ys = np.array([float(r_exact(t)) for t in ts])
        coefficients, *_ = np.linalg.lstsq(np.vander(ts - T_MID, DEGREE + 1, increasing=True), ys, rcond=None)
        err = max(abs(float(np.polyval(coefficients[::-1], t - T_MID) - r_exact(t)))
                  for t in np.linspace(T_LO, T_HI, 2001))
    print(f"# R(t): largest error {err:.2e} (relative error of the tail)")
    print(f"_GELU_T_MID = {T_MID!r}")
    print(f"_GELU_R = {tuple(float(c) for c in coefficients)!r}")


if __name__ == "__main__":
    main()
