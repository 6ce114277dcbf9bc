"""tlb.prepare: the payload read and converted once, then the same values and boxes as the one-shot calls."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

import semantics.domains as domains
import torchlean_bridge as tlb
from torchlean_bridge.seed import SEED_X0, seed_mlp_graph, seed_mlp_payload

torch = pytest.importorskip("torch")


def _bundle(module, example):
    return tlb.import_fx(module.eval(), (example,))


@pytest.fixture(scope="module")
def cnn():
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Conv2d(2, 4, 3, padding=1), torch.nn.BatchNorm2d(4), torch.nn.ReLU(),
                                 torch.nn.Flatten(), torch.nn.Linear(4 * 5 * 5, 3), torch.nn.LayerNorm(3))
    with torch.no_grad():
        module[1].running_mean.uniform_(-1, 1)
        module[1].running_var.uniform_(0.5, 2)
    x = torch.randn(1, 2, 5, 5)
    return _bundle(module, x), x.numpy()


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_prepared_evaluation_is_bit_identical_to_evaluate(cnn, dtype):
    b, x = cnn
    prep = tlb.prepare(b.graph, b.payload)
    for _ in range(2):  # repeated calls reuse the converted records
        ours = prep.evaluate(x, dtype=dtype, all_nodes=True)
        ref = tlb.evaluate(b.graph, b.payload, x, dtype=dtype, all_nodes=True)
        assert len(ours) == len(ref)
        for a, r in zip(ours, ref):
            assert a.dtype == r.dtype and a.tobytes() == r.tobytes()
    out = prep.evaluate(x, dtype=dtype)
    assert [o.tobytes() for o in out] == [r.tobytes() for r in tlb.evaluate(b.graph, b.payload, x, dtype=dtype)]


def test_prepared_boxes_equal_interval_bounds_and_outputs_only_frees_the_rest(cnn):
    b, x = cnn
    prep = tlb.prepare(b.graph, b.payload)
    lo, hi = x - 0.01, x + 0.01
    ref = tlb.interval_bounds(b.graph, b.payload, lo, hi)
    for _ in range(2):
        boxes = prep.interval_bounds(lo, hi)
        assert all(p[0].tobytes() == q[0].tobytes() and p[1].tobytes() == q[1].tobytes() for p, q in zip(boxes, ref))
    outs = prep.interval_bounds(lo, hi, all_nodes=False)
    assert [o[0].tobytes() for o in outs] == [ref[o][0].tobytes() for o in b.graph.outputs]
    assert [o[0].tobytes() for o in tlb.interval_bounds(b.graph, b.payload, lo, hi, all_nodes=False)] == \
        [ref[o][0].tobytes() for o in b.graph.outputs]


def test_every_domain_drops_values_after_their_last_reader(monkeypatch):
    g, p = seed_mlp_graph(), seed_mlp_payload()
    refs = []
    node_value = domains.node_value

    def spy(domain, node, parents, record):
        v = node_value(domain, node, parents, record)
        refs.append(weakref.ref(v[0] if isinstance(v, tuple) else v))
        return v

    monkeypatch.setattr(domains, "node_value", spy)
    prep = tlb.prepare(g, p)
    for run in (lambda: prep.evaluate(SEED_X0.copy()), lambda: prep.evaluate(SEED_X0, dtype="float32"),
                lambda: prep.interval_bounds(SEED_X0 - 0.05, SEED_X0 + 0.05, all_nodes=False),
                lambda: tlb.interval_bounds(g, p, SEED_X0 - 0.05, SEED_X0 + 0.05, all_nodes=False)):
        refs.clear()
        out = run()
        gc.collect()
        assert [r() is not None for r in refs] == [False] * (len(g.nodes) - 1) + [True]
        del out


def test_payload_is_converted_once_per_domain():
    """The float64 copies of a float32 payload are made at first use, then reused (the same arrays)."""
    g, p = seed_mlp_graph(), seed_mlp_payload().astype("float32")
    prep = tlb.prepare(g, p)
    first = prep.evaluate(SEED_X0)
    weights = [rec.get("prepared") for rec in prep._records["float64"]]
    assert weights[1].weight.dtype == np.float64 and weights[1].weight is not p.record(1)["weight"]
    again = prep.evaluate(SEED_X0)
    assert [rec.get("prepared") for rec in prep._records["float64"]] == weights
    assert weights[1].weight is prep._records["float64"][1]["prepared"].weight
    assert first[0].tobytes() == again[0].tobytes() == tlb.evaluate(g, p, SEED_X0)[0].tobytes()


def test_payload_errors_surface_at_prepare_with_the_evaluator_message():
    p = seed_mlp_payload()
    swapped = tlb.Payload({1: p.record(3), 3: p.record(1)})
    with pytest.raises(tlb.BridgeError) as e:
        tlb.prepare(seed_mlp_graph(), swapped)
    assert str(e.value) == "IR eval: linear 1: declared outShape mismatch: [5] vs expected [3]"
    with pytest.raises(tlb.BridgeError, match="unsupported dtype"):
        tlb.prepare(seed_mlp_graph(), p).evaluate(SEED_X0, dtype="float16")
