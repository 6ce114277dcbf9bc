"""TorchLean's ``maxPoolValue`` (``pool_nd`` mode ``max_first``): the vectorized fold with its repairs is
bit-identical to the sequential rule read from the spec, on inputs full of NaNs, signed zeros, infinities
and padding, and agrees with torch where torch's max is defined the same way (no NaN)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from semantics.conv import pool_nd


def _spec_max_first(x: np.ndarray, kernel, stride, padding, out_spatial) -> np.ndarray:
    """One window at a time: the first in-range cell (row-major) seeds, a later cell replaces it only
    when ``cell > best``; a window with no cell in the input is -inf."""
    r = len(kernel)
    lead, spatial = x.shape[:x.ndim - r], x.shape[x.ndim - r:]
    out = np.empty(lead + tuple(out_spatial), x.dtype)
    for li in np.ndindex(*lead):
        for o in np.ndindex(*out_spatial):
            best = None
            for offs in itertools.product(*(range(k) for k in kernel)):
                at = tuple(oo * s - p + f for oo, s, p, f in zip(o, stride, padding, offs))
                if all(0 <= a < n for a, n in zip(at, spatial)):
                    cell = x[li + at]
                    if best is None or cell > best:
                        best = cell
            out[li + o] = -np.inf if best is None else best
    return out


def _adversarial(rng: np.random.Generator, shape, dtype) -> np.ndarray:
    pool = np.array([np.nan, -np.nan, 0.0, -0.0, np.inf, -np.inf, 1.0, -1.0, 2.0, -2.0], dtype)
    x = rng.standard_normal(shape).astype(dtype)
    pick = rng.random(shape) < 0.6
    x[pick] = pool[rng.integers(0, len(pool), int(pick.sum()))]
    return x


def _out(n, k, s, p, ceil=False):
    return -(-(n + 2 * p - k) // s) + 1 if ceil else (n + 2 * p - k) // s + 1


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kernel, stride, padding, ceil", [((3, 3), (2, 2), (0, 0), False),
                                                          ((3, 3), (2, 2), (1, 1), False),
                                                          ((2, 3), (1, 2), (1, 1), True),
                                                          ((3, 3), (2, 2), (0, 0), True)])
def test_bit_identical_to_the_sequential_rule_on_nans_signed_zeros_and_padding(dtype, kernel, stride, padding,
                                                                               ceil):
    rng = np.random.default_rng(0)
    x = _adversarial(rng, (2, 3, 7, 8), dtype)
    out = tuple(_out(n, k, s, p, ceil) for n, k, s, p in zip(x.shape[2:], kernel, stride, padding))
    got = pool_nd(x, mode="max_first", kernel=kernel, stride=stride, padding=padding, padding_after=padding,
                  dilation=(1, 1), out_spatial=out)
    want = _spec_max_first(x, kernel, stride, padding, out)
    bits = np.uint32 if dtype == np.float32 else np.uint64
    assert np.array_equal(got.view(bits), want.view(bits))  # NaN payloads and zero signs included


@pytest.mark.parametrize("case", ["relu", "negative zeros", "nan first", "1d", "3d", "window in padding"])
def test_bit_identical_on_structured_inputs(case):
    rng = np.random.default_rng(1)
    kernel, stride, padding = (3, 3), (2, 2), (1, 1)
    x = np.maximum(rng.standard_normal((1, 4, 9, 9)), 0.0).astype(np.float32)  # many all-zero windows
    if case == "negative zeros":
        x[x == 0] = np.where(rng.random(int((x == 0).sum())) < 0.5, np.float32(-0.0), np.float32(0.0))
    elif case == "nan first":
        x[..., ::2, ::2] = np.nan
    elif case == "1d":
        x, kernel, stride, padding = _adversarial(rng, (3, 20), np.float32), (4,), (3,), (2,)
    elif case == "3d":
        x, kernel, stride, padding = _adversarial(rng, (2, 5, 6, 7), np.float64), (2, 2, 3), (2, 1, 2), (1, 0, 1)
    elif case == "window in padding":  # ceil mode past the padding: the last window reads no input cell
        x, kernel, stride, padding = _adversarial(rng, (2, 5), np.float32), (1,), (3,), (0,)
    out = tuple(_out(n, k, s, p, case == "window in padding") for n, k, s, p in
                zip(x.shape[x.ndim - len(kernel):], kernel, stride, padding))
    if case == "window in padding":
        out = (3,)  # positions 0, 3 and 6: the last one is past the input
    got = pool_nd(x, mode="max_first", kernel=kernel, stride=stride, padding=padding, padding_after=padding,
                  dilation=(1,) * len(kernel), out_spatial=out)
    want = _spec_max_first(x, kernel, stride, padding, out)
    bits = np.uint32 if x.dtype == np.float32 else np.uint64
    assert np.array_equal(got.view(bits), want.view(bits))


def test_agrees_with_torch_without_nans():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 8, 23, 23)).astype(np.float32)
    got = pool_nd(x, mode="max_first", kernel=(3, 3), stride=(2, 2), padding=(1, 1), padding_after=(1, 1),
                  dilation=(1, 1), out_spatial=(12, 12))
    want = torch.nn.functional.max_pool2d(torch.from_numpy(x), 3, 2, 1).numpy()
    assert np.array_equal(got, want)


def _spec_max(x: np.ndarray, kernel, stride, padding, dilation, out_spatial) -> np.ndarray:
    """``max_pool_nd``'s rule, one window at a time: NaN when an in-range cell is NaN, else the
    largest in-range cell; -inf for a window with no cell in the input."""
    r = len(kernel)
    lead, spatial = x.shape[:x.ndim - r], x.shape[x.ndim - r:]
    out = np.empty(lead + tuple(out_spatial), x.dtype)
    for li in np.ndindex(*lead):
        for o in np.ndindex(*out_spatial):
            cells = [x[li + at] for offs in itertools.product(*(range(k) for k in kernel))
                     for at in [tuple(oo * s - p + f * d for oo, s, p, f, d in zip(o, stride, padding, offs, dilation))]
                     if all(0 <= a < n for a, n in zip(at, spatial))]
            out[li + o] = (-np.inf if not cells else np.nan if any(np.isnan(c) for c in cells) else max(cells))
    return out


@pytest.mark.parametrize("seed", range(40))
def test_max_mode_matches_the_window_rule_on_random_geometries(seed):
    """The axis-by-axis maximum (dilation, padding wider than the kernel, ceil-mode windows past the
    input, 1 to 3 spatial axes) against the window-by-window rule, NaNs and infinities included
    (zero signs are not part of max_pool_nd's rule)."""
    rng = np.random.default_rng(100 + seed)
    r = int(rng.integers(1, 4))
    kernel = tuple(int(k) for k in rng.integers(1, 4, r))
    stride = tuple(int(s) for s in rng.integers(1, 4, r))
    dilation = tuple(int(d) for d in rng.integers(1, 3, r))
    padding = tuple(int(p) for p in rng.integers(0, 3, r))
    spatial = tuple(int(n) for n in rng.integers(1, 8, r))
    out = tuple(max(1, -(-(n + 2 * p - d * (k - 1) - 1) // s) + 1)
                for n, k, s, p, d in zip(spatial, kernel, stride, padding, dilation))
    x = _adversarial(rng, (2, 3) + spatial, np.float32 if seed % 2 else np.float64)
    got = pool_nd(x, mode="max", kernel=kernel, stride=stride, padding=padding, padding_after=padding,
                  dilation=dilation, out_spatial=out)
    want = _spec_max(x, kernel, stride, padding, dilation, out)
    assert np.array_equal(got, want, equal_nan=True)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_negative_zero_scan_sees_only_negative_zero(dtype):
    """The scan reads the bits as signed integers: -0.0 alone is the most negative one; the negative
    subnormal next to it, -inf and NaNs with the sign bit are not -0.0, and a strided view is scanned too."""
    from semantics.conv import _has_negative_zero
    tiny = np.finfo(dtype).smallest_subnormal
    clean = np.array([0.0, -tiny, tiny, -np.inf, np.inf, -1.0, 3.0], dtype)
    neg_nan = np.array([np.nan], dtype)
    neg_nan = np.copysign(neg_nan, -1.0).astype(dtype)
    assert not _has_negative_zero(np.concatenate([clean, neg_nan]))
    assert not _has_negative_zero(np.zeros(0, dtype))
    with_zero = np.concatenate([clean, np.array([-0.0], dtype)])
    assert _has_negative_zero(with_zero)
    both = np.stack([with_zero, np.concatenate([clean, np.array([1.0], dtype)])])
    assert _has_negative_zero(both[:, ::-1].T)  # not contiguous
    assert not _has_negative_zero(both[:, :-1:2])
