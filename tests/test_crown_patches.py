"""CROWN's patch-form passes (semantics/linear_bounds/patches.py) and the convolution adjoint.

The patch passes carry one half of [rows; -rows] until the first relaxation, leave a sum's rounding
pending for the next step, skip the mask on patches known to be zero outside the map, and take a
one-cell patch's adjoint as one product with W. Each path is checked against the dense passes (same
algebra, other summation order: equal up to rounding, 1e-12 of the scale) and for soundness on
sampled points with corners in float64 and float32; the adjoint against torch's transposed
convolution.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn as nn

import torchlean_bridge as tlb
import semantics.linear_bounds.crown as crown_mod
import semantics.linear_bounds.patches as patches_mod
from semantics.evaluate import evaluate
import semantics.linear_bounds.conv_adjoint as adjoint_mod
from semantics.linear_bounds.conv_adjoint import conv_adjoint
from test_linear_bounds import assert_contains


class ConvChain(nn.Module):
    """conv -> conv with no activation between (the mask path), then a dilated conv."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(2, 4, 3, padding=1)
        self.b = nn.Conv2d(4, 4, 3, stride=2, padding=1)
        self.c = nn.Conv2d(4, 3, 3, padding=2, dilation=2)
        self.head = nn.Linear(3 * 4 * 4, 2)

    def forward(self, x):
        h = torch.relu(self.b(self.a(x)))
        return self.head(torch.flatten(torch.relu(self.c(h)), 1))


class Grouped(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(2, 4, 3, padding=2, dilation=2)
        self.b = nn.Conv2d(4, 6, 3, padding=1, groups=2)
        self.head = nn.Linear(6 * 6 * 6, 3)

    def forward(self, x):
        h = torch.relu(self.b(torch.relu(self.a(x))))
        return self.head(torch.flatten(h, 1))


class TwoBranches(nn.Module):
    """Two convolutions of one activation summed: two one-half patches meet before any relaxation;
    then a skip joins a relaxed branch (one half meets two)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(1, 4, 4, stride=2, padding=1)
        self.p = nn.Conv2d(4, 4, 3, padding=1)
        self.q = nn.Conv2d(4, 4, 1)
        self.r = nn.Conv2d(4, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.head = nn.Linear(4 * 5 * 5, 3)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-0.5, 0.5)
            self.bn.running_var.uniform_(0.5, 2.0)
            self.bn.weight.uniform_(-1, 1)

    def forward(self, x):
        h = torch.relu(self.stem(x))
        h = torch.relu(self.p(h) + self.q(h))
        h = torch.relu(self.bn(self.r(h)) + h)
        return self.head(torch.flatten(h, 1))


class StridedResidual(nn.Module):
    """The benchmark's residual shape, small."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(1, 3, 4, stride=2, padding=1)
        self.c1 = nn.Conv2d(3, 3, 3, padding=1)
        self.c2 = nn.Conv2d(3, 3, 3, padding=1)
        self.head = nn.Linear(3 * 5 * 5, 2)

    def forward(self, x):
        h = torch.relu(self.stem(x))
        h = torch.relu(self.c2(torch.relu(self.c1(h))) + h)
        return self.head(torch.flatten(h, 1))


class Normalized(nn.Module):
    """Input normalization (x - mean) / std per channel before the first conv, as VNN-COMP's CIFAR nets
    have it; then per-channel constant shifts and scales on either side (c - x, x * c, c * x, x + c)
    and a difference of two live maps."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("mean", torch.tensor([0.3, -0.2]).reshape(1, 2, 1, 1))
        self.register_buffer("std", torch.tensor([0.5, 2.0]).reshape(1, 2, 1, 1))
        self.register_buffer("scale", torch.tensor([1.5, -0.75, 0.3]).reshape(1, 3, 1, 1))
        self.a = nn.Conv2d(2, 3, 3, padding=1)
        self.b = nn.Conv2d(3, 3, 3, stride=2, padding=1)
        self.c = nn.Conv2d(3, 3, 1)
        self.head = nn.Linear(3 * 4 * 4, 2)

    def forward(self, x):
        h = torch.relu(self.a((x - self.mean) / self.std))
        h = torch.relu(self.scale * (0.25 - self.b(h)))
        h = torch.relu(self.c(h) * self.scale + 0.5 - h)
        return self.head(torch.flatten(h, 1))


NETS = {
    "normalized": (Normalized, (2, 2, 8, 8), 0.1),
    "conv chain": (ConvChain, (2, 2, 8, 8), 0.15),
    "grouped dilated": (Grouped, (1, 2, 6, 6), 0.2),
    "two branches": (TwoBranches, (3, 1, 10, 10), 0.2),
    "strided residual": (StridedResidual, (2, 1, 10, 10), 0.2),
}


def _bundle(name: str):
    make, shape, eps = NETS[name]
    torch.manual_seed(0)
    b = tlb.import_fx(make().eval(), (torch.zeros(shape),))
    c = np.random.default_rng(7).uniform(-1, 1, shape)
    return b, c - eps, c + eps


def _counting_patch_runs(monkeypatch) -> list[int]:
    calls: list[int] = []
    run = patches_mod.PatchPass.run

    def counted(self):
        calls.append(self.t)
        return run(self)
    monkeypatch.setattr(patches_mod.PatchPass, "run", counted)
    return calls


@pytest.mark.parametrize("name", sorted(NETS))
def test_patch_passes_equal_dense_passes_to_rounding(name, monkeypatch):
    b, lo, hi = _bundle(name)
    calls = _counting_patch_runs(monkeypatch)
    patched = tlb.linear_bounds(b.graph, b.payload, lo, hi, all_nodes=True)
    assert calls, "the patch passes were not used"
    monkeypatch.setattr(crown_mod, "patchable", lambda run, t: False)
    dense = tlb.linear_bounds(b.graph, b.payload, lo, hi, all_nodes=True)
    assert not patched.fallback and not dense.fallback
    for (plo, phi), (dlo, dhi) in zip(patched.boxes, dense.boxes):
        scale = 1e-12 * (1 + np.abs(dlo).max() + np.abs(dhi).max())
        np.testing.assert_allclose(plo, dlo, rtol=0, atol=scale)
        np.testing.assert_allclose(phi, dhi, rtol=0, atol=scale)


@pytest.mark.parametrize("name", sorted(NETS))
def test_patch_pass_bounds_hold_at_sampled_points(name):
    b, lo, hi = _bundle(name)
    res = assert_contains(b, lo, hi, samples=30, seed=1)
    ibp = tlb.interval_bounds(b.graph, b.payload, lo, hi)
    for o in b.graph.outputs:  # never looser than IBP
        assert np.all(res.boxes[o][0] >= ibp[o][0]) and np.all(res.boxes[o][1] <= ibp[o][1])


def test_an_infinite_input_end_gives_infinite_bounds_not_nan(monkeypatch):
    b, lo, hi = _bundle("strided residual")
    lo = lo.copy()
    lo[0, 0, 3, 4] = -np.inf
    calls = _counting_patch_runs(monkeypatch)
    res = tlb.linear_bounds(b.graph, b.payload, lo, hi, all_nodes=True)
    assert calls
    for blo, bhi in res.boxes:
        assert not np.any(np.isnan(blo)) and not np.any(np.isnan(bhi))
    assert np.all(np.isfinite(res.lower[0][1])) and np.all(np.isfinite(res.upper[0][1]))  # the other sample
    x = np.where(np.isfinite(lo), lo, hi - 50.0)
    y = evaluate(b.graph, b.payload, [x])[0]
    assert np.all(res.lower[0] <= y) and np.all(y <= res.upper[0])


@pytest.mark.parametrize("stride, padding, dilation, groups, kernel, out_sp, in_sp", [
    ((1, 1), (1, 1), (1, 1), 1, (3, 3), (6, 6), (6, 6)),
    ((2, 2), (1, 1), (1, 1), 1, (4, 4), (5, 5), (10, 10)),
    ((2, 1), (0, 2), (2, 1), 2, (3, 2), (2, 8), (8, 5)),
    ((1, 1), (0, 0), (1, 1), 1, (3, 3), (3, 3), (5, 5)),  # a patch step: no padding, the full extent
    ((1, 1), (2, 0), (1, 1), 2, (3, 2), (6, 5), (4, 6)),  # stride 1 through the staged correlation, grouped
    ((1, 1), (3, 1), (1, 1), 1, (3, 3), (9, 5), (5, 5)),  # a padding beyond k - 1: the strided adds
    ((2, 3), (0, 2), (1, 1), 2, (3, 4), (3, 4), (7, 9)),  # strided, grouped, uneven
    ((2, 2), (0, 1), (1, 1), 1, (3, 2), (3, 4), (8, 6)),  # a trailing cell no window reads
])
def test_conv_adjoint_is_the_transposed_convolution(stride, padding, dilation, groups, kernel, out_sp, in_sp):
    rng = np.random.default_rng(0)
    c_out, c_in, m = 4, 2 * groups, 5
    a = rng.normal(size=(m, c_out) + out_sp)
    w = rng.normal(size=(c_out, c_in // groups) + kernel)
    got = conv_adjoint(a, w, stride, padding, dilation, groups, in_sp)
    x = torch.zeros((m, c_in) + in_sp, dtype=torch.float64, requires_grad=True)
    y = nn.functional.conv2d(x, torch.from_numpy(w), stride=stride, padding=padding, dilation=dilation,
                             groups=groups)
    assert tuple(y.shape[2:]) == out_sp
    (want,) = torch.autograd.grad(y, x, grad_outputs=torch.from_numpy(a))
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-12, atol=1e-12)


def test_conv_adjoint_matches_autograd_on_random_geometries():
    """Both paths (the staged correlation at stride 1, the strided adds elsewhere) on random geometries:
    strides, paddings beyond the kernel, groups, trailing cells no window reads."""
    rng = np.random.default_rng(3)
    checked = 0
    while checked < 60:
        kernel, stride, padding = (tuple(int(x) for x in rng.integers(lo, hi, 2))
                                   for lo, hi in ((1, 5), (1, 4), (0, 4)))
        groups = int(rng.integers(1, 3))
        in_sp = tuple(int(x) for x in rng.integers(1, 9, 2))
        if any(i + 2 * p < k for i, p, k in zip(in_sp, padding, kernel)):
            continue
        w = rng.normal(size=(2 * groups, 2) + kernel)
        x = torch.zeros((3, 2 * groups) + in_sp, dtype=torch.float64, requires_grad=True)
        y = nn.functional.conv2d(x, torch.from_numpy(w), stride=stride, padding=padding, groups=groups)
        a = rng.normal(size=tuple(y.shape))
        (want,) = torch.autograd.grad(y, x, grad_outputs=torch.from_numpy(a))
        got = conv_adjoint(a, w, stride, padding, (1, 1), groups, in_sp)
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-12, atol=1e-12, err_msg=str((kernel, stride, padding)))
        checked += 1


@pytest.mark.parametrize("stride, padding, groups, kernel, in_sp", [
    ((2, 2), (1, 1), 1, (3, 3), (16, 16)),  # a ResNet downsampling conv: phases of 4, 2, 2 and 1 taps
    ((2, 2), (0, 0), 1, (1, 1), (9, 9)),    # a 1x1 shortcut: one phase reads, three stay zero
    ((2, 3), (1, 0), 2, (3, 4), (25, 26)),  # uneven strides and kernels, grouped
    ((3, 3), (2, 1), 1, (5, 2), (35, 23)),  # a phase with no tap on one axis (kernel 2 < stride 3)
])
def test_the_phase_split_adjoint_is_the_transposed_convolution(stride, padding, groups, kernel, in_sp, monkeypatch):
    """Strided convolutions wide enough for the phase split (``_phases_pay``): each phase's stride-1
    adjoint written into its strided view equals autograd's transposed convolution."""
    calls = []
    split = adjoint_mod._phase_split_adjoint
    monkeypatch.setattr(adjoint_mod, "_phase_split_adjoint", lambda *args: calls.append(1) or split(*args))
    rng = np.random.default_rng(5)
    c_in, c_out = 16 * groups, 8 * groups
    w = rng.normal(size=(c_out, c_in // groups) + kernel)
    x = torch.zeros((3, c_in) + in_sp, dtype=torch.float64, requires_grad=True)
    y = nn.functional.conv2d(x, torch.from_numpy(w), stride=stride, padding=padding, groups=groups)
    a = rng.normal(size=tuple(y.shape))
    (want,) = torch.autograd.grad(y, x, grad_outputs=torch.from_numpy(a))
    got = conv_adjoint(a, w, stride, padding, (1, 1), groups, in_sp)
    assert calls, "the phase split did not run"
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("stride, padding, dilation, groups, kernel, in_sp, block_rows", [
    ((2, 2), (1, 1), (1, 1), 1, (4, 4), (14, 14), 1),        # one output row per block
    ((2, 2), (1, 1), (1, 1), 1, (4, 4), (14, 14), 3),        # 3 rows per block, the last block shorter
    ((2, 3), (0, 2), (2, 1), 2, (3, 2), (15, 11), 2),        # strided, dilated, grouped, uneven
    ((1, 1), (3, 1), (1, 1), 1, (3, 3), (7, 6), 4),          # padding beyond the kernel
    ((2,), (1,), (2,), 2, (3,), (19,), 2),                   # 1-D
    ((2, 2, 1), (1, 0, 1), (1, 2, 1), 2, (3, 2, 2), (11, 13, 5), 2),  # 3-D
])
def test_the_strided_adds_in_row_blocks_are_the_transposed_convolution(stride, padding, dilation, groups, kernel,
                                                                        in_sp, block_rows, monkeypatch):
    """Products too large for the cache go through ``_strided_adds`` in blocks of output rows, every
    offset per GEMM (the budget is shrunk to ``block_rows`` rows' products so that these small maps take
    several blocks): each block's adds land at its own rows of the input, the same transposed
    convolution as autograd's, and the same as the whole map in one block."""
    rng = np.random.default_rng(7)
    c_in, c_out, m = 3 * groups, 4 * groups, 6
    w = rng.normal(size=(c_out, c_in // groups) + kernel)
    conv = {1: nn.functional.conv1d, 2: nn.functional.conv2d, 3: nn.functional.conv3d}[len(kernel)]
    x = torch.zeros((m, c_in) + in_sp, dtype=torch.float64, requires_grad=True)
    y = conv(x, torch.from_numpy(w), stride=stride, padding=padding, dilation=dilation, groups=groups)
    a = rng.normal(size=tuple(y.shape))
    (want,) = torch.autograd.grad(y, x, grad_outputs=torch.from_numpy(a))
    out_sp, taps = tuple(y.shape[2:]), math.prod(kernel)
    tap_row_bytes = groups * (c_in // groups) * math.prod(out_sp[1:]) * m * 8
    monkeypatch.setattr(adjoint_mod, "_COLS_BYTES", block_rows * tap_row_bytes * taps)
    schedule = adjoint_mod._adds_schedule(tap_row_bytes, out_sp[0], taps, c_in // groups)
    assert schedule == (block_rows, taps) and block_rows < out_sp[0], "the geometry must take several row blocks"
    got = adjoint_mod._strided_adds(a, w, stride, padding, dilation, groups, in_sp)
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-12, atol=1e-12)
    monkeypatch.setattr(adjoint_mod, "_COLS_BYTES", 1 << 40)  # one block, offsets grouped: the same sums
    np.testing.assert_allclose(adjoint_mod._strided_adds(a, w, stride, padding, dilation, groups, in_sp), got,
                               rtol=1e-13, atol=1e-13)


def test_the_strided_adds_blocks_stay_small():
    """A block of the strided adds holds at most 4 MiB of products: a map whose single output row would
    hold more keeps the offset groups over the whole map; small products stay one block."""
    mib = 1 << 20
    assert adjoint_mod._adds_schedule(mib // 16, 7, 16, 8) == (1, 16)        # 1 MiB a row: one-row blocks
    assert adjoint_mod._adds_schedule(mib // 64, 20, 16, 8) == (4, 16)      # 256 KiB a row: 4 rows a block
    assert adjoint_mod._adds_schedule(mib, 7, 16, 8) == (7, 1)              # 16 MiB a row: offsets grouped
    assert adjoint_mod._adds_schedule(1024, 7, 16, 1) == (7, 16)            # 112 KiB in all: one block
    a = np.ones((2, 4, 0, 3))  # no output row: nothing reaches the input
    got = adjoint_mod._strided_adds(a, np.ones((4, 2, 3, 3)), (1, 1), (0, 0), (1, 1), 1, (5, 5))
    assert got.shape == (2, 2, 5, 5) and not got.any()


@pytest.mark.parametrize("stride, padding, dilation, groups, c_in, kernel, out_sp, in_sp", [
    ((2, 2), (0, 0), (1, 1), 1, 3, (4, 4), (4, 4), (10, 10)),  # a 4x4 patch back through a 4x4 stride-2 conv
    ((1, 1), (0, 0), (1, 1), 1, 8, (3, 3), (3, 3), (5, 5)),    # a 3x3 patch through a 3x3 stride-1 conv
    ((2, 1), (1, 0), (1, 2), 2, 4, (3, 2), (2, 2), (4, 4)),    # uneven, dilated, grouped, padded
    ((2, 2), (1, 1), (1, 1), 1, 3, (3, 3), (3, 3), (5, 5)),    # a padded map: border taps read padding
])
def test_the_dense_adjoint_is_the_transposed_convolution(stride, padding, dilation, groups, c_in, kernel, out_sp,
                                                         in_sp, monkeypatch):
    """Small maps with many rows take the transposed convolution's dense matrix (``_dense_pays``): equal to
    autograd's adjoint in float64, to float32 rounding in float32 (and float32 out), a fresh writable
    result, and a weight changed in place gives a new matrix (the cache is keyed by the weight's bytes)."""
    calls = []
    dense = adjoint_mod._dense_adjoint
    monkeypatch.setattr(adjoint_mod, "_dense_adjoint", lambda *args: calls.append(1) or dense(*args))
    rng = np.random.default_rng(11)
    c_out, m = 4 * groups, 2 * adjoint_mod._DENSE_MIN_ROWS
    w = rng.normal(size=(c_out, c_in // groups) + kernel)
    for _ in range(2):
        a = rng.normal(size=(m, c_out) + out_sp)
        x = torch.zeros((m, c_in) + in_sp, dtype=torch.float64, requires_grad=True)
        y = nn.functional.conv2d(x, torch.from_numpy(w), stride=stride, padding=padding, dilation=dilation,
                                 groups=groups)
        assert tuple(y.shape[2:]) == out_sp
        (want,) = torch.autograd.grad(y, x, grad_outputs=torch.from_numpy(a))
        got = conv_adjoint(a, w, stride, padding, dilation, groups, in_sp)
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-12, atol=1e-12)
        assert got.flags.writeable and got.dtype == np.float64
        got32 = conv_adjoint(a.astype(np.float32), w.astype(np.float32), stride, padding, dilation, groups, in_sp)
        assert got32.dtype == np.float32
        np.testing.assert_allclose(got32, want.numpy(), rtol=0, atol=1e-5 * np.abs(want.numpy()).max())
        w *= -0.5  # in place: the same array object, other values
    assert len(calls) == 4, "the dense matrix did not run"


@pytest.mark.parametrize("stride, padding, c_in, kernel, in_sp", [
    ((1, 1), (1, 1), 2, (3, 3), (6, 6)),     # stride 1: the staged correlation
    ((2, 2), (1, 1), 3, (4, 4), (12, 12)),   # strided, few channels: the strided adds
    ((2, 2), (1, 1), 16, (3, 3), (16, 16)),  # strided, wide: the phase split
])
def test_conv_adjoint_and_operator_run_in_float32_for_plain_passes(stride, padding, c_in, kernel, in_sp):
    """Plain (heuristic) passes hand float32 rows and weights: every path computes and returns float32,
    equal to the float64 adjoint to float32 rounding; ``ConvOperator.astype`` carries that dtype both ways,
    and float64 stays float64 (the sound passes)."""
    from semantics.linear_bounds.beta import plain_array
    from semantics.linear_bounds.chain import ConvOperator
    rng = np.random.default_rng(6)
    w = rng.normal(size=(8, c_in) + kernel)
    out_sp = tuple((i + 2 * p - k) // s + 1 for i, p, k, s in zip(in_sp, padding, kernel, stride))
    a = rng.normal(size=(3, 8) + out_sp)
    want = conv_adjoint(a, w, stride, padding, (1, 1), 1, in_sp)
    got = conv_adjoint(a.astype(np.float32), w.astype(np.float32), stride, padding, (1, 1), 1, in_sp)
    assert want.dtype == np.float64 and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())
    attrs = {"kernel": kernel, "stride": stride, "padding": padding, "padding_after": padding, "dilation": (1, 1),
             "groups": 1}
    op = ConvOperator(w, attrs, (c_in,) + in_sp, (8,) + out_sp)
    assert plain_array(op).weight.dtype == np.float32  # what beta's and FSB's plain passes multiply with
    for dtype in (np.float64, np.float32):
        typed = op.astype(dtype)
        back = a.reshape(3, -1) @ typed
        forward = rng.normal(size=(3, c_in * math.prod(in_sp))) @ typed.T
        assert back.dtype == dtype and forward.dtype == dtype
        np.testing.assert_allclose(back, want.reshape(3, -1), rtol=0, atol=1e-5 * np.abs(want).max())


def test_refine_pieces_are_whole_channels():
    """A conv map refined in several pieces is cut at channel boundaries (rows channel-major), so each piece
    is whole channels at every position, which a patch pass reads through a broadcast view (``tile``)
    instead of a gather; every row is bounded exactly once, within the coefficient budget."""
    from types import SimpleNamespace
    run = SimpleNamespace(crown=SimpleNamespace(n=1))
    width, cells, largest = 16 * 8 * 8, 8 * 8, 3 * 32 * 32
    pieces = list(crown_mod._Run._chunks(run, None, width, largest, cells))
    assert len(pieces) > 1
    np.testing.assert_array_equal(np.concatenate([rows for _, _, rows in pieces]), np.arange(width))
    for b0, b1, rows in pieces:
        assert (b0, b1) == (0, 1) and rows.size % cells == 0 and rows[0] % cells == 0
        assert 2 * rows.size * largest <= crown_mod._BUDGET
    need = np.zeros((1, width), bool)
    need[0, ::3] = True  # a subset: pieces of the needed rows only, each once
    got = np.concatenate([rows for _, _, rows in crown_mod._Run._chunks(run, need, width, largest, cells)])
    np.testing.assert_array_equal(got, np.flatnonzero(need[0]))


def test_conv_adjoint_results_are_not_overwritten_by_the_next_call():
    """Its temporaries live in reusable buffers; what it returns must not be one of them (one row and
    no padding: the cropped buffer would be contiguous already)."""
    rng = np.random.default_rng(1)
    w = rng.normal(size=(3, 2, 3, 3))
    first = conv_adjoint(rng.normal(size=(1, 3, 4, 4)), w, (1, 1), (0, 0), (1, 1), 1, (6, 6))
    kept = first.copy()
    conv_adjoint(rng.normal(size=(1, 3, 4, 4)), w, (1, 1), (0, 0), (1, 1), 1, (6, 6))
    np.testing.assert_array_equal(first, kept)


def _patchable_convs(name: str):
    """A prepared CROWN run on net ``name`` and its conv nodes that patch passes serve."""
    b, lo, hi = _bundle(name)
    crown = crown_mod.Crown(b.graph, b.payload)
    run = crown_mod._Run(crown, crown.ibp(lo, hi))
    run.prepare(False)
    targets = [v for v in crown.ancestors(b.graph.outputs[0]) if b.graph.nodes[v].kind == "conv"
               and patches_mod.patchable(run, v)]
    assert targets
    return run, targets


@pytest.mark.parametrize("name", sorted(NETS))
def test_rows_at_distinct_positions_out_of_position_order(name):
    """Rows are ordered by flat index (channel first), so one row per position need not come in the
    order of the positions (channel 0 at a late cell, channel 1 at cell 0): each row must still read
    its own window. The patch pass must equal the dense pass row for row."""
    run, targets = _patchable_convs(name)
    for t in targets:
        c, h, w = run.graph.nodes[t].out_shape[1:]
        rows = np.array([h * w - 1, h * w + 1, 2 * h * w % (c * h * w)])[:min(3, c)]
        rows = np.unique(rows)
        got = patches_mod.PatchPass(run, t, 0, run.crown.n, rows).run()
        want = crown_mod._Pass(run, t, 0, run.crown.n, rows=rows).run()
        for g_half, w_half in zip(got, want):
            scale = 1e-12 * (1 + np.abs(w_half).max())
            np.testing.assert_allclose(g_half, w_half, rtol=0, atol=scale)


@pytest.mark.parametrize("name", sorted(NETS))
def test_tiled_rows_read_broadcast_maps_and_equal_the_dense_pass(name):
    """Rows that are k channels at the same positions (channel-major) read the relaxation maps through a
    broadcast view instead of a per-row gather; rows without that shape keep the gather. Both must equal
    the dense pass row for row: whole channels, a few positions in two channels, and an irregular set."""
    run, targets = _patchable_convs(name)
    for t in targets:
        c, h, w = run.graph.nodes[t].out_shape[1:]
        hw = h * w
        two = min(2, c)
        cases = [(np.arange(two * hw), two),  # whole channels
                 (np.array([q * hw + cell for q in range(two) for cell in (1, hw - 1)]), two),  # 2 cells each
                 (np.array([1, hw - 1, hw + 1]) if c > 1 else np.array([0, 1, 3]), None if c > 1 else 1)]
        for rows, tile in cases:
            patch = patches_mod.PatchPass(run, t, 0, run.crown.n, rows)
            assert patch.tile == tile, (t, rows, patch.tile)
            got = patch.run()
            dense = crown_mod._Pass(run, t, 0, run.crown.n, rows=rows).run()
            for g_half, d_half in zip(got, dense):
                np.testing.assert_allclose(g_half, d_half, rtol=0, atol=1e-12 * (1 + np.abs(d_half).max()))
