"""Promises at the edges: unbounded and NaN boxes, 20,000-node graphs, and JSON without NaN/Infinity.

* Boxes with an infinite end through linear, conv, matmul, softmax, log_softmax, layernorm and exp:
  no end is ever NaN, every finite sample stays inside, outputs that do not read the unbounded entry
  stay exact, and bounded ops stay bounded (softmax in [0, 1], layernorm within sqrt(E - 1)).
  NaN bounds are refused naming the input.
* A 20,000-node chain is checked, evaluated, bounded and written/read with a recursion limit far
  below its depth.
* ``bounds --json``, ``audit --json``, the bundle's report.json and the torchlean export are strict
  JSON (no NaN/Infinity tokens) even when the numbers they carry are not finite.
"""

from __future__ import annotations

import json
import math
import sys

import numpy as np
import pytest

import torchlean_bridge as tlb
from tests.test_interval_tightness import Net
from torchlean_bridge.errors import IntervalError
from torchlean_bridge.graph import Graph, Node

INF = math.inf


def strict_json(text: str):
    """json.loads that refuses the NaN/Infinity extensions Python's json module writes by default."""
    def refuse(token):
        raise AssertionError(f"non-standard JSON token {token}")
    return json.loads(text, parse_constant=refuse)


# -- unbounded boxes ------------------------------------------------------------------------------

X_LO = np.array([[-INF, 0.0, 1.0, -1.0, -INF]])
X_HI = np.array([[0.0, INF, 1.0, 2.0, INF]])
CONV = dict(spatial_rank=1, kernel=[2], stride=[1], padding=[0], padding_after=[0], dilation=[1], groups=1,
            channel_axis=0, in_channels=1, out_channels=2)


def _net(kind: str) -> Net:
    rng = np.random.default_rng(0)
    net = Net()
    x = net.input((1, 5))
    if kind == "linear":
        net.add(kind, [x], shape=(1, 3), weight=rng.normal(size=(3, 5)), bias=np.ones(3))
    elif kind == "matmul":
        net.add("matmul", [x, net.add("const", [], {}, shape=(5, 3), values=rng.normal(size=(5, 3)))])
    elif kind == "conv":
        net.add(kind, [x], CONV, weight=np.array([[[1.0, 0.0]], [[0.0, -1.0]]]), bias=np.array([0.5, 0.0]))
    elif kind in ("softmax", "log_softmax", "layernorm"):
        net.add(kind, [x], {"axis": 1})
        if kind == "layernorm":
            net.payload.set(1, "weight", np.array([1.0, -2.0, 0.5, 1.0, 3.0]))
            net.payload.set(1, "bias", np.array([0.0, 1.0, 0.0, -1.0, 0.0]))
    else:
        net.add(kind, [x])
    return net


def _finite_samples(lo, hi, rng, n=40):
    """Points of the box with the infinite ends replaced by large finite values."""
    big = 1e6
    a, b = np.maximum(lo, -big), np.minimum(hi, big)
    pts = [a, b]
    for _ in range(n):
        pts.append(a + rng.random(a.shape) * (b - a))
    return pts


@pytest.mark.parametrize("kind", ["linear", "conv", "matmul", "softmax", "log_softmax", "layernorm", "exp", "tanh",
                                  "relu"])
def test_unbounded_boxes_give_no_nan_and_stay_sound(kind):
    net = _net(kind)
    boxes = net.boxes(X_LO, X_HI)
    lo, hi = boxes[-1]
    assert not np.any(np.isnan(lo)) and not np.any(np.isnan(hi)), (lo, hi)
    assert np.all(lo <= hi)
    rng = np.random.default_rng(1)
    for x in _finite_samples(X_LO, X_HI, rng):
        y = net.values([x])[-1]
        assert np.all((lo <= y) & (y <= hi)), (kind, x, y, lo, hi)


def test_bounded_ops_stay_bounded_on_unbounded_boxes():
    lo, hi = _net("softmax").boxes(X_LO, X_HI)[1]
    assert np.all(lo >= 0) and np.all(hi <= 1)
    assert hi[0, 1] == 1.0 and lo[0, 0] == 0.0   # entry 1 may dominate; entry 0 may vanish
    lo, hi = _net("log_softmax").boxes(X_LO, X_HI)[1]
    assert np.all(hi <= 0) and hi[0, 1] == 0.0 and lo[0, 0] == -INF
    # |x_i - mean| / sqrt(var + eps) <= sqrt(E - 1) for every x: the bound holds on any box
    lo, hi = _net("layernorm").boxes(X_LO, X_HI)[1]
    gamma, beta = np.array([1.0, -2.0, 0.5, 1.0, 3.0]), np.array([0.0, 1.0, 0.0, -1.0, 0.0])
    bound = math.sqrt(4) * np.abs(gamma)
    assert np.all(np.isfinite(lo)) and np.all(np.isfinite(hi))
    assert np.all(hi <= beta + bound * (1 + 1e-12)) and np.all(lo >= beta - bound * (1 + 1e-12))
    lo, hi = _net("exp").boxes(X_LO, X_HI)[1]
    assert lo[0, 0] == 0.0 and hi[0, 1] == INF and hi[0, 0] >= 1.0 and lo[0, 4] == 0.0 and hi[0, 4] == INF


def test_conv_outputs_that_do_not_read_an_unbounded_entry_stay_exact():
    """Window 2 reads x2 = 1 and x3 in [-1, 2] only: 1 * x2 + 0.5 and -x3 exactly."""
    lo, hi = _net("conv").boxes(X_LO, X_HI)[1]
    ulps = 1e-14  # outward rounding of the centre-radius form, a few ulps
    assert abs(lo[0, 2] - 1.5) <= ulps and abs(hi[0, 2] - 1.5) <= ulps
    assert abs(lo[1, 2] + 2.0) <= ulps and abs(hi[1, 2] - 1.0) <= ulps
    assert lo[0, 0] == -INF and hi[1, 0] == INF


@pytest.mark.parametrize("bad", ["lower", "upper"])
def test_nan_bounds_are_refused_naming_the_input(bad):
    lo, hi = np.zeros((1, 5)), np.ones((1, 5))
    (lo if bad == "lower" else hi)[0, 3] = np.nan
    with pytest.raises(IntervalError) as e:
        _net("exp").boxes(lo, hi)
    assert str(e.value) == "interval: node 0 (input): bounds contain NaN" and e.value.node == 0


def test_unbounded_boxes_through_a_whole_model_never_produce_nan():
    """inf - inf and 0 * inf inside a rule become the trivial bound, never NaN, in every node."""
    rng = np.random.default_rng(2)
    net = Net()
    x = net.input((2, 5))
    h = net.add("linear", [x], shape=(2, 4), weight=rng.normal(size=(4, 5)), bias=rng.normal(size=4))
    h = net.add("layernorm", [h], {"axis": 1})
    h = net.add("mul_elem", [h, h])
    s = net.add("softmax", [net.add("sub", [h, net.add("exp", [h])])], {"axis": 0})
    net.add("matmul", [s, net.add("const", [], {}, shape=(4, 3), values=rng.normal(size=(4, 3)))])
    lo = np.full((2, 5), -INF)
    for nid, (a, b) in enumerate(net.boxes(lo, -lo)):
        assert not np.any(np.isnan(a)) and not np.any(np.isnan(b)), nid


# -- deep graphs -------------------------------------------------------------------------------------

def _chain(n: int) -> Graph:
    kinds = ("relu", "neg", "tanh", "abs")
    nodes = [Node(0, [], "input", (3,))]
    for i in range(1, n):
        nodes.append(Node(i, [i - 1], kinds[i % 4], (3,)) if i % 5 else Node(i, [i - 1, i - 2 if i > 1 else 0],
                                                                             "add", (3,)))
    return Graph(nodes)


def test_a_20000_node_chain_is_checked_evaluated_bounded_and_written_without_recursion():
    g = _chain(20_000)
    x = np.array([0.3, -0.2, 0.1])
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(200 + len(__import__("inspect").stack()))  # far below the graph's depth
    try:
        assert tlb.check(g) == []
        (value,) = tlb.evaluate(g, None, x)
        lo, hi = tlb.interval_bounds(g, None, x - 1e-3, x + 1e-3)[-1]
        g2 = tlb.load_graph(tlb.dump_graph(g))
    finally:
        sys.setrecursionlimit(limit)
    assert np.all(lo <= value) and np.all(value <= hi) and np.all(np.isfinite(lo))
    assert g2.nodes == g.nodes and len(tlb.listing(g).splitlines()) >= 20_000


# -- JSON outputs ------------------------------------------------------------------------------------

def test_bounds_json_is_strict_json_when_boxes_are_unbounded(tmp_path, capsys):
    from torchlean_bridge.app.cli import main
    g = Graph([Node(0, [], "input", (3,)), Node(1, [0], "exp", (3,)), Node(2, [1], "sum", ())])
    tlb.save(tlb.Bundle(g), tmp_path / "b")
    np.save(tmp_path / "c.npy", np.array([0.0, 800.0, -800.0]))
    assert main(["bounds", str(tmp_path / "b"), "--center", str(tmp_path / "c.npy"), "--radius", "1",
                 "--json", "--samples", "4"]) == 0
    doc = strict_json(capsys.readouterr().out)
    assert doc["nodes"][1]["hi"][1] == "inf" and doc["nodes"][2]["hi"] == "inf"
    assert doc["nodes"][1]["lo"][2] == 0.0 and doc["containment"]["ok"] is True


def test_audit_json_is_strict_json_when_errors_are_not_finite(tmp_path, capsys):
    from safetensors.numpy import save_file

    from torchlean_bridge.app.cli import main
    from torchlean_bridge.seed import BIAS_PAIR, bias_pair_bundle
    b = bias_pair_bundle()
    tlb.save(b, tmp_path / "b")
    x = np.array([0.5, -1.0, 2.0])
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "golden.npy", tlb.evaluate(b.graph, b.payload, x)[0])
    broken = {k: np.array(v, dtype=np.float64) for k, v in BIAS_PAIR.items()}
    broken["0.bias"][0], broken["2.bias"][1] = np.inf, np.nan
    save_file(broken, str(tmp_path / "ckpt.safetensors"))
    for out in ("-", str(tmp_path / "report.json")):
        status = main(["audit", str(tmp_path / "b"), "--checkpoint", str(tmp_path / "ckpt.safetensors"), "--golden",
                       str(tmp_path / "golden.npy"), "--input", str(tmp_path / "x.npy"), "--json", out])
        text = capsys.readouterr().out if out == "-" else (tmp_path / "report.json").read_text()
        if out != "-":
            capsys.readouterr()
        doc = strict_json(text)
        assert status == 1 and doc["ok"] is False


def test_report_json_is_strict_json_when_the_report_holds_non_finite_numbers(tmp_path):
    g = Graph([Node(0, [], "input", (2,)), Node(1, [0], "relu", (2,))])
    report = {"max_error": float("nan"), "tolerances": [1e-6, float("inf")], "notes": ["ok"]}
    tlb.save(tlb.Bundle(g, report=report), tmp_path / "b")
    doc = strict_json((tmp_path / "b" / "report.json").read_text())
    assert doc == {"max_error": "nan", "tolerances": [1e-6, "inf"], "notes": ["ok"]}


def test_torchlean_export_is_strict_json_and_refuses_non_finite_weights_naming_the_node(tmp_path):
    from torchlean_bridge.seed import seed_mlp_bundle
    b = seed_mlp_bundle()
    tlb.export_torchlean(b, tmp_path / "ok.json")
    strict_json((tmp_path / "ok.json").read_text())
    w = b.payload.get(3, "weight").copy()
    w[0, 0] = np.nan
    records = {n: dict(b.payload.record(n)) for n in b.payload.nodes()}
    records[3]["weight"] = w
    bad = tlb.Bundle(b.graph, tlb.Payload(records), b.roles)
    with pytest.raises(tlb.BridgeError) as e:
        tlb.export_torchlean(bad, tmp_path / "bad.json")
    assert e.value.node == 3 and e.value.op == "linear"
    assert e.value.message == "node 3 (linear): payload tensor contains NaN or Infinity, which JSON cannot hold"
    assert not (tmp_path / "bad.json").exists()
