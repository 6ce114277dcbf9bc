"""The cheap point enclosures of library functions (``lib_bounds``' exact spacings), of sigmoid and
silu and of sigmoid's and tanh's derivatives (one library call, widened once) enclose the 50-digit
value everywhere they are used: the whole float range, sigmoid's underflow below -708, subnormal
inputs and results, and infinite box ends."""

from __future__ import annotations

import mpmath as mp
import numpy as np
import pytest

from semantics.interval_arith import exp_at, tanh_at
from semantics.interval_round import spacings
from semantics.linear_bounds.relax import _sigmoid_df, _tanh_df
from semantics.rules.activations import _silu_at, sigmoid_at

mp.mp.dps = 50


def _points() -> np.ndarray:
    rng = np.random.default_rng(7)
    wide = rng.standard_normal(400) * 10.0 ** rng.integers(-320, 300, 400)
    ordinary = rng.uniform(-40, 40, 400)
    underflow = rng.uniform(-760, -700, 200)  # exp(-x) overflows or q is subnormal
    edges = [0.0, -0.0, 5e-324, -5e-324, 2.2250738585072014e-308, -708.4, -709.78, -745.2, 1e300, -1e300,
             1.7976931348623157e308, -1.7976931348623157e308, 36.0, 37.5, -36.0]
    return np.concatenate([wide, ordinary, underflow, edges])


def _sigmoid(x: float) -> mp.mpf:
    return 1 / (1 + mp.exp(-mp.mpf(x)))


def _assert_encloses(box, exact_of, xs) -> None:
    lo, hi = box
    assert lo.shape == hi.shape == xs.shape
    for x, a, b in zip(xs, lo, hi):
        exact = exact_of(float(x))
        assert mp.mpf(float(a)) <= exact <= mp.mpf(float(b)), (x, a, b, exact)


def test_spacings_are_numpys_spacings_exactly():
    xs = _points()
    xs = xs[np.abs(xs) < 1.7e308]  # np.spacing of the largest float overflows; ours is the one inside it
    assert np.array_equal(spacings(xs, 10), 10 * np.abs(np.spacing(xs)))


def test_sigmoid_encloses_everywhere_and_stays_tight():
    xs = _points()
    _assert_encloses(sigmoid_at(xs), _sigmoid, xs)
    lo, hi = sigmoid_at(xs)
    normal = (hi > 1e-300)
    # widened once: at most 24 spacings of the value (the old step-by-step box was about as wide)
    assert np.all((hi - lo)[normal] <= 48 * np.spacing(hi[normal]))


def test_silu_encloses_everywhere():
    xs = _points()
    xs = xs[np.abs(xs) < 1e300]  # x sigmoid(x) overflows nowhere below this
    _assert_encloses(_silu_at(xs), lambda x: mp.mpf(x) * _sigmoid(x), xs)


def test_silu_at_infinite_ends_takes_the_limits():
    lo, hi = _silu_at(np.array([np.inf, -np.inf, 1.0]))
    assert not np.isnan(lo).any() and not np.isnan(hi).any()
    assert hi[0] == np.inf and lo[0] > 1e308
    assert lo[1] < 0 < hi[1] and hi[1] < 1e-290


@pytest.mark.parametrize("fn, at", [(mp.exp, exp_at), (mp.tanh, tanh_at)])
def test_library_enclosures_hold_on_the_float_range(fn, at):
    xs = _points()
    if fn is mp.exp:
        xs = xs[np.abs(xs) < 1000]
    _assert_encloses(at(xs), lambda x: fn(mp.mpf(x)), xs)


def test_scalar_points_keep_their_shape():
    lo, hi = sigmoid_at(np.float64(0.5))
    assert np.shape(lo) == () and lo <= _sigmoid(0.5) <= hi
    lo, hi = _silu_at(np.array(-2.0))
    assert np.shape(lo) == () and lo <= -2 * _sigmoid(-2.0) <= hi


@pytest.mark.parametrize("df, exact", [(_sigmoid_df, lambda x: 1 / (4 * mp.cosh(mp.mpf(x) / 2) ** 2)),
                                       (_tanh_df, lambda x: 1 / mp.cosh(mp.mpf(x)) ** 2)])
def test_derivative_enclosures_hold_on_the_float_range_and_stay_tight(df, exact):
    xs = np.concatenate([_points(), [np.inf, -np.inf, 354.0, -355.8, 710.5, -745.2]])
    _assert_encloses(df(xs), exact, xs)
    lo, hi = df(xs)
    normal = hi > 1e-300
    assert np.all((hi - lo)[normal] <= 128 * np.spacing(hi[normal]))
