"""torch.topk / torch.sort indices, F.max_pool{1,2,3}d(return_indices=True), F.max_unpool{1,2,3}d and
torch.pow of two tensors through torch.fx and torch.export, against PyTorch (issue #15)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torchlean_bridge as tlb

IMPORTERS = {"fx": tlb.import_fx, "export": tlb.import_export}


class Fn(nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor):
        return self.fn(x)


def _agree(fn, x, via, exact=True):
    b = IMPORTERS[via](Fn(fn).eval(), (x,))
    outs = tlb.evaluate(b.graph, b.payload, [x.numpy()], dtype="float64")
    want = fn(x)
    want = want if isinstance(want, tuple) else (want,)
    for got, w in zip(outs, want):
        got, w = np.asarray(got), w.numpy()
        assert got.dtype.kind == w.dtype.kind and got.shape == w.shape
        if exact:
            np.testing.assert_array_equal(got, w)
        else:
            np.testing.assert_allclose(got, w, rtol=1e-12, atol=1e-12)
    return b


@pytest.mark.parametrize("via", ["fx", "export"])
def test_sort_and_topk_indices_are_int64_positions(via):
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.integers(-2, 3, (3, 7, 4)).astype(np.float64))  # ties: stable order
    for dim in (0, 1, -1):
        _agree(lambda t: torch.sort(t, dim=dim, descending=True, stable=True), x, via)
        _agree(lambda t: torch.sort(t, dim=dim, stable=True), x, via)
    y = torch.from_numpy(rng.normal(size=(3, 7, 4)))  # no ties: topk's order is the sorted one
    for k, largest in ((1, True), (3, False), (7, True)):
        _agree(lambda t: torch.topk(t, k, dim=1, largest=largest), y, via)


@pytest.mark.parametrize("via", ["fx", "export"])
@pytest.mark.parametrize("r", [1, 2, 3])
def test_max_pool_indices_and_unpooling_agree_with_pytorch(via, r):
    rng = np.random.default_rng(r)
    pool = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}[r]
    unpool = {1: F.max_unpool1d, 2: F.max_unpool2d, 3: F.max_unpool3d}[r]
    x = torch.from_numpy(rng.normal(size=(2, 3) + (6,) * r))
    for k, s, p, d, ceil in ((2, 2, 0, 1, False), (3, 2, 1, 1, True), (2, 1, 1, 2, False)):
        _agree(lambda t: pool(t, k, s, p, d, ceil_mode=ceil, return_indices=True), x, via)
    def round_trip(t):
        y, i = pool(t, 2, 2, return_indices=True)
        return unpool(y, i, 2, 2), unpool(y, i, 2, 2, output_size=[7] * r)
    _agree(round_trip, x, via)


@pytest.mark.parametrize("via", ["fx", "export"])
def test_pow_of_two_tensors(via):
    rng = np.random.default_rng(3)
    x = torch.from_numpy(rng.normal(size=(4, 5)))
    _agree(lambda t: torch.pow(t.abs() + 0.1, t), x, via, exact=False)
    _agree(lambda t: (t.abs() + 0.1) ** t[0], x, via, exact=False)
    _agree(lambda t: torch.pow((t * 4).long(), (t.abs() * 4).long()), x, via)
