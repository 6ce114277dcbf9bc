"""conv_nd's banded depthwise path against torch's convolution on random depthwise geometries (1 and 2
spatial axes, channel multipliers, strides, dilation, asymmetric padding, batches), float64 and float32,
and against the im2col path it replaces."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import semantics.conv as conv
from semantics.conv import conv_nd
from semantics.conv_depthwise import MAX_BAND, ONE_TILE, TILE, band_shape, depthwise_applies

_CONV = {1: F.conv1d, 2: F.conv2d}


def _case(rng: np.random.Generator) -> tuple:
    rank = int(rng.integers(1, 3))
    c, mult = int(rng.integers(2, 6)), int(rng.integers(1, 3))
    draw = lambda lo, hi: tuple(int(v) for v in rng.integers(lo, hi, size=rank))  # noqa: E731
    kernel = draw(1, 4)[:-1] + (int(rng.integers(5, 10)),)
    stride, dilation, before, after = draw(1, 3), draw(1, 3), draw(0, 5), draw(0, 5)
    spatial = draw(1, 12)[:-1] + (int(rng.integers(kernel[-1] * dilation[-1], 50)),)
    return int(rng.integers(1, 3)), c, mult, spatial, kernel, stride, dilation, before, after


def _conv_nd(x, w, b, stride, dilation, before, after, groups, out_spatial):
    return conv.conv_nd(x, w, b, channel_axis=1, stride=stride, padding=before, padding_after=after,
                        dilation=dilation, groups=groups, out_spatial=out_spatial)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_depthwise_path_matches_torch_and_im2col(dtype, monkeypatch):
    rng = np.random.default_rng(5)
    checked = 0
    while checked < 40:
        n, c, mult, spatial, kernel, stride, dilation, before, after = _case(rng)
        padded = [s + b + a for s, b, a in zip(spatial, before, after)]
        out_spatial = tuple((p - d * (k - 1) - 1) // st + 1 for p, k, st, d in zip(padded, kernel, stride, dilation))
        if min(out_spatial) <= 0 or not depthwise_applies(c, c, kernel, out_spatial, np.dtype(dtype)):
            continue
        x = rng.standard_normal((n, c) + spatial).astype(dtype)
        w = rng.standard_normal((c * mult, 1) + kernel).astype(dtype)
        b = rng.standard_normal(c * mult).astype(dtype)
        got = _conv_nd(x, w, b, stride, dilation, before, after, c, out_spatial)
        pad = [v for bb, aa in zip(reversed(before), reversed(after)) for v in (bb, aa)]
        want = _CONV[len(spatial)](F.pad(torch.from_numpy(x), pad), torch.from_numpy(w), torch.from_numpy(b),
                                   stride=stride, dilation=dilation, groups=c).numpy()
        tol = 1e-12 if dtype == np.float64 else 1e-5
        assert got.shape == want.shape and got.dtype == dtype
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * 10)
        with monkeypatch.context() as m:  # the im2col path on the same operands
            m.setattr(conv, "depthwise_serves", lambda *args: False)
            im2col = _conv_nd(x, w, b, stride, dilation, before, after, c, out_spatial)
        np.testing.assert_allclose(got, im2col, rtol=tol, atol=tol * 10)
        checked += 1


def test_the_path_is_gated_to_wide_kernels():
    f32 = np.dtype(np.float32)
    assert depthwise_applies(256, 256, (9, 9), (32, 32), f32)
    assert depthwise_applies(96, 96, (7, 7), (56, 56), f32)               # wide rows: tiles of one band
    assert not depthwise_applies(256, 256, (3, 3), (32, 32), f32)         # im2col measured faster
    assert not depthwise_applies(256, 128, (9, 9), (32, 32), f32)         # two channels per group
    assert not depthwise_applies(8, 8, (9, 9, 9), (4, 4, 4), f32)         # 3 spatial axes
    assert not depthwise_applies(8, 8, (9, 9), (4, 4), np.dtype(np.int64))  # integer: narrow semantics


def test_a_band_is_sized_before_it_is_built_and_a_huge_one_keeps_im2col():
    """A large dilation spreads the band over a span of zeros: past MAX_BAND entries im2col serves
    (and agrees with torch), so no attribute makes the band allocation large."""
    f32 = np.dtype(np.float32)
    kernel, out_spatial, c = (5, 5), (2, 2), 64
    assert depthwise_applies(c, c, kernel, out_spatial, f32, stride=(1, 1), dilation=(1, 1))
    dilation = (1, MAX_BAND // (c * 5 * 2 * 4) + 1)
    assert math.prod(band_shape(c, kernel, (1, 1), dilation, out_spatial)) > MAX_BAND
    assert not depthwise_applies(c, c, kernel, out_spatial, f32, stride=(1, 1), dilation=dilation)
    x = torch.randn(1, c, 6, 4 * dilation[1] + 2, dtype=torch.float64)
    w = torch.randn(c, 1, *kernel, dtype=torch.float64)
    want = torch.nn.functional.conv2d(x, w, dilation=dilation, groups=c).numpy()
    got = conv_nd(x.numpy(), w.numpy(), np.zeros(c), channel_axis=1, stride=(1, 1), padding=(0, 0),
                  padding_after=(0, 0), dilation=dilation, groups=c, out_spatial=want.shape[2:])
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_a_prepared_graph_builds_the_band_once_and_evaluates_as_torch(monkeypatch):
    """A depthwise 9x9 conv with multiplier 2 and bias, imported through torch.fx: the prepared graph's
    parameters hold the band (built once, not per evaluation), and evaluation agrees with torch."""
    import semantics.conv_depthwise as dw
    import semantics.rules.affine as affine
    import torchlean_bridge as tlb

    torch.manual_seed(2)
    net = torch.nn.Conv2d(4, 8, 9, padding=4, groups=4).eval()
    x = torch.randn(2, 4, 12, 12)
    bundle = tlb.import_fx(net, (x,))
    built = []
    real = dw.depthwise_band
    for module in (dw, affine):  # the parameters' builder and depthwise_conv's own fallback
        monkeypatch.setattr(module, "depthwise_band", lambda *args: built.append(1) or real(*args))
    prepared = tlb.prepare(bundle.graph, bundle.payload)
    first = prepared.evaluate(x.numpy(), dtype="float32")[0]
    second = prepared.evaluate(x.numpy(), dtype="float32")[0]
    assert len(built) == 1
    with torch.no_grad():
        want = net(x).numpy()
    np.testing.assert_allclose(first, want, rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(first, second)


def test_an_infinite_or_nan_cell_reaches_only_the_windows_holding_it():
    """The band's zeros would turn one infinite cell into NaN across its whole row (0 * inf): such an
    input keeps im2col, and agrees with torch cell for cell (inf, NaN and finite values alike)."""
    rng = np.random.default_rng(9)
    x = rng.standard_normal((1, 3, 10, 20)).astype(np.float32)
    x[0, 0, 4, 2], x[0, 1, 7, 15] = np.inf, np.nan
    w = rng.standard_normal((3, 1, 5, 7)).astype(np.float32)
    b = np.zeros(3, np.float32)
    assert depthwise_applies(3, 3, (5, 7), (10, 20), np.dtype(np.float32))
    got = _conv_nd(x, w, b, (1, 1), (1, 1), (2, 3), (2, 3), 3, (10, 20))
    want = F.conv2d(torch.from_numpy(x), torch.from_numpy(w), padding=(2, 3), groups=3).numpy()
    assert np.isfinite(got).sum() == np.isfinite(want).sum() > 0
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("stride, dilation", [(1, 1), (2, 1), (1, 2), (3, 2)])
def test_every_row_width_around_whole_tiles_matches_torch(stride, dilation):
    """Rows of one tile and of 2 and 3 tiles, whole and not: a last tile that is partly past the row reads extra zero
    columns into outputs that are cut off, never into the ones kept."""
    rng = np.random.default_rng(stride * 10 + dilation)
    for out_width in range(1, ONE_TILE + 2 * TILE + 2):
        kernel, before, after = (3, 5), (1, 2), (0, 1)
        width = (out_width - 1) * stride + (kernel[1] - 1) * dilation + 1 - before[1] - after[1]
        x = rng.standard_normal((2, 3, 6, width))
        w = rng.standard_normal((6, 1) + kernel)
        b = rng.standard_normal(6)
        out_spatial = ((6 + 1 - dilation * 2 - 1) // stride + 1, out_width)
        assert depthwise_applies(3, 3, kernel, out_spatial, np.dtype(np.float64))
        got = _conv_nd(x, w, b, (stride, stride), (dilation, dilation), before, after, 3, out_spatial)
        padded = F.pad(torch.from_numpy(x), (before[1], after[1], before[0], after[0]))
        want = F.conv2d(padded, torch.from_numpy(w), torch.from_numpy(b), stride=stride, dilation=dilation,
                        groups=3).numpy()
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_the_rows_an_output_row_reads_are_one_run_of_the_tiled_input():
    """One tile spanning whole contiguous rows reads the padded input in place; wider rows are copied
    into column strips, tile t holding columns ``t * width * stride`` onward, each strip's rows contiguous."""
    from semantics.conv_depthwise import _tiled_rows

    xp = np.arange(2 * 3 * 7 * 20, dtype=np.float32).reshape(2, 3, 7, 20)
    same = _tiled_rows(xp, 1, 16, 1, 20)
    assert same.shape == (2, 3, 1, 7, 20) and np.shares_memory(same, xp)
    strips = _tiled_rows(xp, 3, 4, 2, 4)  # the last strip ends at the row's end
    assert strips.shape == (2, 3, 3, 7, 4) and strips[0, 0].flags.c_contiguous and not np.shares_memory(strips, xp)
    for t in range(3):
        np.testing.assert_array_equal(strips[:, :, t], xp[..., t * 8:t * 8 + 4])
    assert not np.shares_memory(_tiled_rows(xp[..., :18], 1, 16, 1, 18), xp)  # rows not contiguous: copied
    row = xp[:, :, 0, :][:, :, None, :]  # a 1-d conv's one row (its inserted axis has stride 0)
    assert np.shares_memory(_tiled_rows(row, 1, 16, 1, 20), xp)


def test_a_wide_dilation_keeps_im2col_and_every_served_geometry_bounds_its_copy_and_zeros():
    """A large dilation spreads a window over mostly zeros: along rows it would multiply zero band rows,
    along columns each tile's strip (copied once per tile) would be far wider than the tile. Such
    geometries keep im2col (and agree with torch); every geometry the path serves copies at most
    ``2 * MAX_STRIP`` times its padded input and reads at most ``MAX_WASTE`` cells per window cell."""
    from semantics.conv_depthwise import MAX_STRIP, MAX_WASTE, depthwise_extra_columns

    f32 = np.dtype(np.float32)
    assert not depthwise_applies(4, 4, (5, 5), (40, 40), f32, stride=(1, 1), dilation=(50, 1))  # zero band rows
    assert not depthwise_applies(4, 4, (5, 5), (8, 200), f32, stride=(1, 1), dilation=(1, 40))  # zero band columns
    _, rows, span, width = band_shape(4, (5, 9), (1, 1), (1, 8), (8, 200))  # few zeros, but strips 5x a tile
    assert rows * span <= MAX_WASTE * 45 and span > MAX_STRIP * width
    assert not depthwise_applies(4, 4, (5, 9), (8, 200), f32, stride=(1, 1), dilation=(1, 8))
    assert depthwise_applies(4, 4, (5, 9), (8, 30), f32, stride=(1, 1), dilation=(1, 8))  # one tile: no strips
    x = torch.randn(1, 2, 12, 400, dtype=torch.float64)
    w = torch.randn(2, 1, 5, 5, dtype=torch.float64)
    want = F.conv2d(x, w, dilation=(1, 40), groups=2).numpy()
    got = conv_nd(x.numpy(), w.numpy(), np.zeros(2), channel_axis=1, stride=(1, 1), padding=(0, 0),
                  padding_after=(0, 0), dilation=(1, 40), groups=2, out_spatial=want.shape[2:])
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    rng = np.random.default_rng(3)
    served = 0
    for _ in range(3000):
        kernel = (int(rng.integers(1, 8)), int(rng.integers(5, 10)))
        stride, dilation = tuple(int(v) for v in rng.integers(1, 4, 2)), tuple(int(v) for v in rng.integers(1, 30, 2))
        out_spatial = tuple(int(v) for v in rng.integers(1, 120, 2))
        if not depthwise_applies(3, 3, kernel, out_spatial, f32, stride=stride, dilation=dilation):
            continue
        served += 1
        _, rows, span, width = band_shape(3, kernel, stride, dilation, out_spatial)
        tiles = -(-out_spatial[1] // width)
        in_width = (out_spatial[1] - 1) * stride[1] + (kernel[1] - 1) * dilation[1] + 1
        padded = in_width + depthwise_extra_columns(in_width, kernel, stride, dilation, out_spatial[1])
        assert rows * span <= MAX_WASTE * math.prod(kernel)
        assert tiles == 1 or tiles * span <= 2 * MAX_STRIP * padded
    assert served > 100
