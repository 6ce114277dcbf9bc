"""The bulk entry points pause the cyclic collector and always restore it (issue 17, long graphs)."""

import gc

import numpy as np
import pytest

import torchlean_bridge as tlb
from torchlean_bridge.gcpause import gc_paused


def _chain(n: int) -> dict:
    return {"format": "torchlean.ir.v1", "input_id": 0, "output_ids": [n - 1],
            "nodes": [{"id": 0, "kind": "input", "parents": [], "shape": [3]}]
            + [{"id": i, "kind": "relu", "parents": [i - 1], "shape": [3]} for i in range(1, n)]}


def test_paused_inside_restored_after_return_and_raise():
    seen = []

    @gc_paused
    def probe(fail: bool) -> int:
        seen.append(gc.isenabled())
        if fail:
            raise ValueError("boom")
        return 7

    assert gc.isenabled()
    assert probe(False) == 7
    with pytest.raises(ValueError):
        probe(True)
    assert seen == [False, False] and gc.isenabled()


def test_nested_and_already_disabled_stay_as_found():
    inner = gc_paused(lambda: gc.isenabled())
    outer = gc_paused(lambda: (inner(), gc.isenabled()))
    assert outer() == (False, False) and gc.isenabled()
    gc.disable()
    try:
        assert inner() is False
        assert not gc.isenabled()  # a caller's own pause is not undone
    finally:
        gc.enable()


def test_entry_points_leave_collector_enabled(tmp_path):
    g = tlb.load_graph(_chain(5))
    assert gc.isenabled()
    tlb.check(g)
    out = tlb.evaluate(g, tlb.Payload(), [np.array([-1.0, 0.5, 2.0])])
    np.testing.assert_array_equal(out[0], [0.0, 0.5, 2.0])
    assert tlb.dump_graph(g)["nodes"][4]["parents"] == [3]
    tlb.save(tlb.Bundle(g, tlb.Payload()), tmp_path / "b")
    assert tlb.load(tmp_path / "b").graph == g
    assert gc.isenabled()
    with pytest.raises(tlb.BridgeError):
        tlb.load_graph({"format": "torchlean.ir.v1"})
    assert gc.isenabled()


@pytest.mark.parametrize("bad, message", [
    ([1, True], "expected natural number, got true"),
    ([1, -2], "expected natural number, got -2"),
    ([1.0], "expected natural number, got 1.0"),
    ("0", "expected array"),
])
def test_fast_nat_lists_still_refuse_what_the_slow_path_refuses(bad, message):
    doc = _chain(3)
    doc["nodes"][2]["parents"] = bad
    with pytest.raises(tlb.BridgeError, match=message):
        tlb.load_graph(doc)


def test_node_fields_are_int_tuples_whatever_the_caller_passes():
    node = tlb.Node(1, [np.int64(0)], "relu", (np.int64(3),))
    assert node.parents == (0,) and type(node.parents[0]) is int and type(node.out_shape[0]) is int
    assert tlb.load_graph(_chain(3))[2].parents == (1,)
