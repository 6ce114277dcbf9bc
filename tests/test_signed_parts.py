"""``positive_part`` / ``negative_part`` (clip-ufunc max/min against 0) give numpy's maximum/minimum
values, and the float relu rule built on them is ``reluSpec`` bit for bit, on random bit patterns
(every NaN payload, subnormals, infinities, both zeros) of float32 and float64."""

from __future__ import annotations

import numpy as np
import pytest

from semantics.rules.activations import relu
from semantics.signed_parts import by_sign, negative_part, positive_part

_BITS = {np.float32: np.uint32, np.float64: np.uint64}


def _patterns(dtype, n: int = 1 << 20) -> np.ndarray:
    rng = np.random.default_rng(7)
    bits = rng.integers(0, np.iinfo(_BITS[dtype]).max, n, dtype=_BITS[dtype], endpoint=True)
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1.0, -1.0], dtype)
    tiny = np.array([np.finfo(dtype).smallest_subnormal, -np.finfo(dtype).smallest_subnormal], dtype)
    return np.concatenate([bits.view(dtype), specials, tiny])


def _relu_spec(x: np.ndarray) -> np.ndarray:
    """One value at a time: NaN keeps its payload (quieted, as IEEE arithmetic does), x when x > 0,
    else +0.0."""
    return np.array([v + 0.0 if (v != v or v > 0) else 0.0 for v in x.tolist()], x.dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_parts_equal_maximum_and_minimum(dtype):
    x = _patterns(dtype)
    with np.errstate(invalid="ignore"):
        for got, want in ((positive_part(x), np.maximum(x, 0.0)), (negative_part(x), np.minimum(x, 0.0))):
            assert got.dtype == want.dtype
            same = (got == want) | (np.isnan(got) & np.isnan(want))
            assert same.all()
    out = np.empty_like(x)
    assert positive_part(x, out=out) is out


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_float_relu_is_relu_spec_bit_for_bit(dtype):
    x = _patterns(dtype, 1 << 16)
    with np.errstate(invalid="ignore"):
        got = relu(None, [x], None, np.dtype(dtype))
    bits = _BITS[dtype]
    assert np.array_equal(got.view(bits), _relu_spec(x).view(bits))
    strided = x[::3]  # a non-contiguous parent takes the same path
    with np.errstate(invalid="ignore"):
        assert np.array_equal(relu(None, [strided], None, np.dtype(dtype)).view(bits), _relu_spec(strided).view(bits))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("lo, hi", [(0.0, 6.0), (-1, 1), (5.0, 1.0), (float("nan"), 1.0), (0.0, float("nan")),
                                    (-float("inf"), float("inf")), (-1e40, 1e40)])
def test_clamp_rule_is_maximum_then_minimum(dtype, lo, hi):
    from types import SimpleNamespace

    from semantics.rules.activations import clamp
    x = _patterns(dtype, 1 << 14)
    node = SimpleNamespace(attrs={"min": lo, "max": hi})
    with np.errstate(all="ignore"):
        got = clamp(node, [x], None, np.dtype(dtype))
        want = np.minimum(np.maximum(x, lo), hi)
    assert got.dtype == want.dtype
    assert ((got == want) | (np.isnan(got) & np.isnan(want))).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_by_sign_is_the_where_of_two_products_for_finite_factors(dtype):
    """``by_sign`` replaces ``np.where(x >= 0, x * f, x * g)`` in CROWN's sound pass: the same values for every
    x (signed zeros, infinities and NaN included; a zero result may change sign) when f and g are finite."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((64, 5, 40)).astype(dtype)
    flat = x.reshape(-1)
    flat[::7], flat[1::7] = 0.0, -0.0
    flat[2::97], flat[3::97], flat[4::97] = np.inf, -np.inf, np.nan
    flat[5::89] = np.finfo(dtype).max
    f = rng.standard_normal((64, 1, 40)).astype(dtype)
    g = rng.standard_normal((64, 1, 40)).astype(dtype)
    f[:, :, ::9] = 0.0
    g[:, :, 1::9] = 0.0
    with np.errstate(all="ignore"):
        want = np.where(x >= 0, x * f, x * g)
        got = by_sign(positive_part(x), negative_part(x), f, g)
        pos = positive_part(x)  # the buffers' form: the result over pos, the second product in a work array
        in_place = by_sign(pos, negative_part(x), f, g, out=pos, work=np.empty_like(x))
    assert got.dtype == want.dtype and in_place is pos
    np.testing.assert_array_equal(got + dtype(0.0), want + dtype(0.0))  # + 0 makes every zero +0
    np.testing.assert_array_equal(in_place + dtype(0.0), want + dtype(0.0))
