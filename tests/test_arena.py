"""The result arena: reused only when nothing made from it is alive, never shared with a live box."""

from __future__ import annotations

import threading

import numpy as np
import torch
import torch.nn as nn

import torchlean_bridge as tlb
from semantics.arena import ResultArena, result_array
from semantics.interval import IntervalPropagator


def _addresses(arena: ResultArena) -> list[int]:
    return [chunk.ctypes.data for chunk in arena._chunks]


def test_chunks_are_reused_only_after_every_array_from_them_died():
    arena = ResultArena()
    with arena.active():
        a, b = result_array((100,)), result_array((300, 300))
    first = _addresses(arena)
    view = b[10:20].reshape(-1)[::2]  # a view of a view still holds the chunk
    del a, b
    with arena.active():
        c = result_array((100,))
    assert not set(_addresses(arena)) & set(first)  # `view` was alive: new memory
    view[:] = 7.0
    del view
    with arena.active():
        d = result_array((100,))
    assert d.ctypes.data != c.ctypes.data  # `c` is alive
    del c, d
    with arena.active():
        e = result_array((100,))
    before = _addresses(arena)
    del e
    with arena.active():
        result_array((100,))
    assert _addresses(arena) == before  # nothing alive: the same chunks again


def test_outside_an_arena_and_nested_blocks_get_plain_arrays():
    arena = ResultArena()
    x = result_array((4,))
    assert x.base is None
    with arena.active():
        inner_owner = result_array((4,)).base
        with arena.active():
            y = result_array((4,))
        assert y.base is None or y.base is not inner_owner
    assert arena._active is False


def test_a_cap_on_the_arena_falls_back_to_plain_arrays():
    arena = ResultArena(max_bytes=1 << 20)
    with arena.active():
        small = result_array((1000,))
        big = result_array((1 << 18,))  # 2 MiB
    assert small.base is not None and big.base is None


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 70), nn.ReLU(),
                         nn.Linear(70, 5)).eval()


def test_held_boxes_are_never_overwritten_by_the_next_call():
    x = torch.rand(3, 1, 6, 6)
    bundle = tlb.import_fx(_net(), (x,))
    c = x.double().numpy()
    for products in ("float64", "float32"):
        prop = IntervalPropagator(bundle.graph, bundle.payload, products=products)
        first = prop(c - 0.1, c + 0.1)
        kept = [(lo.copy(), hi.copy()) for lo, hi in first]
        second = prop(c - 0.3, c + 0.2)  # `first` is alive: it must keep its values
        for (lo, hi), (klo, khi) in zip(first, kept):
            assert np.array_equal(lo, klo) and np.array_equal(hi, khi)
        want = [(lo.copy(), hi.copy()) for lo, hi in second]
        del first, second
        for _ in range(3):  # now the arena is reused: the same answers
            again = prop(c - 0.3, c + 0.2)
            for (lo, hi), (wlo, whi) in zip(again, want):
                assert np.array_equal(lo, wlo) and np.array_equal(hi, whi)
            del again
        direct = tlb.interval_bounds(bundle.graph, bundle.payload, c - 0.3, c + 0.2, products=products)
        for (lo, hi), (wlo, whi) in zip(direct, want):
            assert np.array_equal(lo, wlo) and np.array_equal(hi, whi)


def test_threads_sharing_a_propagator_get_their_own_memory():
    x = torch.rand(2, 1, 6, 6)
    bundle = tlb.import_fx(_net(), (x,))
    c = x.double().numpy()
    prop = IntervalPropagator(bundle.graph, bundle.payload)
    radii = [0.01 * (k + 1) for k in range(4)]
    want = {r: tlb.interval_bounds(bundle.graph, bundle.payload, c - r, c + r)[-1] for r in radii}
    errors: list[str] = []

    def work(r: float) -> None:
        for _ in range(20):
            lo, hi = prop(c - r, c + r)[-1]
            if not (np.array_equal(lo, want[r][0]) and np.array_equal(hi, want[r][1])):
                errors.append(f"radius {r}")
    threads = [threading.Thread(target=work, args=(r,)) for r in radii]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_prepared_interval_bounds_keep_held_boxes_too():
    x = torch.rand(2, 1, 6, 6)
    bundle = tlb.import_fx(_net(), (x,))
    c = x.double().numpy()
    prepared = tlb.prepare(bundle.graph, bundle.payload)
    first = prepared.interval_bounds(c - 0.1, c + 0.1)
    kept = [(lo.copy(), hi.copy()) for lo, hi in first]
    prepared.interval_bounds(c - 0.4, c + 0.4)
    for (lo, hi), (klo, khi) in zip(first, kept):
        assert np.array_equal(lo, klo) and np.array_equal(hi, khi)
