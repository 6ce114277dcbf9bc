"""Scratch buffers and the in-place outward rounding of the interval hot paths.

The scratch forms must give the same bits as the allocating forms, and no box a propagation returns
may live in a scratch buffer (a later call would overwrite it).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn

import torchlean_bridge as tlb
from semantics.interval import IntervalPropagator
from semantics.interval_round import center_radius, down, down_, up, up_
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


def test_center_radius_into_scratch_matches_fresh_form():
    rng = np.random.default_rng(1)
    lo = rng.standard_normal((7, 33))
    hi = lo + np.abs(rng.standard_normal((7, 33))) * (rng.random((7, 33)) < 0.7)  # some point entries
    lo[0, :3], hi[0, :3] = -np.inf, np.inf
    lo[1, 0], hi[1, 0] = 1.0, np.inf
    c0, r0 = center_radius(lo, hi)
    c1, r1 = center_radius(lo, hi, into="test")
    assert _same_bits(c0, c1) and _same_bits(r0, r1)
    assert np.all((c1 - r1 <= lo) & (hi <= c1 + r1))
    assert np.all(r1[lo == hi] == 0.0)  # point entries keep an exactly zero radius


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


def test_returned_boxes_survive_later_calls():
    """Boxes of one call keep their values through a second call with another box."""
    x = torch.rand(3, 2, 8, 8)
    bundle = tlb.import_fx(_net().eval(), (x,))
    prop = IntervalPropagator(bundle.graph, bundle.payload)
    c = x.double().numpy()
    first = prop(c - 0.1, c + 0.1)
    snapshot = [(lo.copy(), hi.copy()) for lo, hi in first]
    prop(c - 0.3, c + 0.2)
    for (lo, hi), (lo0, hi0) in zip(first, snapshot):
        assert _same_bits(lo, lo0) and _same_bits(hi, hi0)


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
