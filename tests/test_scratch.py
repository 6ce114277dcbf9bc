"""Scratch buffers and the in-place outward rounding of the interval hot paths.

The in-place forms must give the same bits as the allocating forms (held boxes surviving later calls:
tests/test_arena.py).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn

import torchlean_bridge as tlb
from semantics.interval_round import down, down_, up, up_
from semantics.scratch import MAX_SCRATCH_BYTES, scratch

SPECIAL = np.array([0.0, -0.0, 5e-324, -5e-324, 2.0 ** -1022, 1.0, -1.0, 1e308, -1e308, np.inf, -np.inf,
                    np.finfo(np.float64).max, -np.finfo(np.float64).max, np.nan, 3.5, -7.25e-300])


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return np.array_equal(a.view(np.uint64), b.view(np.uint64))


@pytest.mark.parametrize("rounded, in_place", [(down, down_), (up, up_)])
def test_in_place_rounding_matches_allocating_form(rounded, in_place):
    rng = np.random.default_rng(0)
    x = np.concatenate([SPECIAL, rng.standard_normal(500) * 10.0 ** rng.integers(-300, 300, 500)])
    expected = rounded(x)
    got = x.copy()
    assert in_place(got) is got
    assert _same_bits(got, expected)
    # and independently of the shared code: at or beyond the next float outward, finite for infinite x
    sign = -1.0 if rounded is down else 1.0
    finite = np.isfinite(x)
    beyond = np.nextafter(x[finite], sign * np.inf)
    assert np.all(got[finite] <= beyond) if sign < 0 else np.all(got[finite] >= beyond)
    inner = x == -sign * np.inf
    assert np.all(got[inner] == -sign * np.finfo(np.float64).max)
    assert np.all(got[x == sign * np.inf] == sign * np.inf) and np.all(np.isnan(got[np.isnan(x)]))
    assert down(np.array([np.inf]))[0] == np.finfo(np.float64).max  # an exact value is finite
    assert up(np.array([-np.inf]))[0] == -np.finfo(np.float64).max


def test_scratch_reuses_per_name_and_caps_size():
    a = scratch("test.a", (10, 10))
    b = scratch("test.a", (5, 4))
    assert np.shares_memory(a, b)
    assert not np.shares_memory(a, scratch("test.b", (10, 10)))
    big = MAX_SCRATCH_BYTES // 8 + 1
    assert not np.shares_memory(scratch("test.big", (big,)), scratch("test.big", (big,)))


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 3, stride=2), nn.ReLU(),
                         nn.Flatten(), nn.Linear(4 * 3 * 3, 6), nn.ReLU(), nn.Linear(6, 3))


def test_boxes_enclose_sampled_points():
    x = torch.rand(4, 2, 8, 8)
    net = _net().eval().double()
    bundle = tlb.import_fx(net, (x.double(),))
    c = x.double().numpy()
    lo, hi = tlb.interval_bounds(bundle.graph, bundle.payload, c - 0.05, c + 0.05)[bundle.graph.outputs[0]]
    rng = np.random.default_rng(2)
    for _ in range(20):
        point = c + rng.uniform(-0.05, 0.05, c.shape)
        if _ % 5 == 0:
            point = c + 0.05 * rng.choice([-1.0, 1.0], c.shape)  # corners
        y = net(torch.from_numpy(point)).detach().numpy()
        assert np.all(lo <= y) and np.all(y <= hi)
