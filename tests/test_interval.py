"""The seed chapter's interval table, containment checks, the bounds command and error reporting."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import semantics.interval as interval_module
import torchlean_bridge as tlb
from importers.builder import GraphBuilder
from torchlean_bridge.app.cli import main
from torchlean_bridge.app.commands.common import format_vector
from torchlean_bridge.errors import IntervalError
from torchlean_bridge.graph import Graph, Node
from torchlean_bridge.ops import REGISTRY
from torchlean_bridge.seed import SEED_X0, seed_mlp_bundle, seed_mlp_graph, seed_mlp_payload

# executable-graph-types-and-lowering.txt, "Interval Bound Propagation" (node 5 there is [-1, 1])
CHAPTER_BOXES = """node 0: [0.250000, -0.250000, 0.050000, 0.350000] .. [0.350000, -0.150000, 0.150000, 0.450000]
node 1: [0.087000, -0.031500, -0.007500, 0.067500, -0.015000] .. [0.127000, -0.002500, 0.015500, 0.094500, 0.009000]
node 2: [0.087000, 0.000000, 0.000000, 0.067500, 0.000000] .. [0.127000, 0.000000, 0.015500, 0.094500, 0.009000]
node 3: [0.025445, -0.016025, 0.011355] .. [0.029815, -0.012220, 0.018045]
node 4: [0.020775] .. [0.035640]"""


def seed_boxes():
    return tlb.interval_bounds(seed_mlp_graph(), seed_mlp_payload(), SEED_X0 - 0.05, SEED_X0 + 0.05)


def test_every_registry_op_has_a_rule_or_a_documented_refusal():
    assert set(REGISTRY) - {"input"} <= set(interval_module.INTERVAL_RULES)
    assert set(interval_module.NO_RULE) == {"custom"}


def test_seed_boxes_match_the_chapter_and_tanh_is_tight():
    boxes = seed_boxes()
    lines = [f"node {i}: {format_vector(np.atleast_1d(lo))} .. {format_vector(np.atleast_1d(hi))}"
             for i, (lo, hi) in enumerate(boxes)]
    assert "\n".join(lines[:5]) == CHAPTER_BOXES
    assert lines[5] == "node 5: [0.020772] .. [0.035625]"  # the chapter's tight (0.020772, 0.035625)
    lo, hi = boxes[5]
    assert lo <= math.tanh(0.020775) and hi >= math.tanh(0.035640) and hi - lo < 0.01486
    assert all(b[0].dtype == np.float64 and b[0].shape == n.out_shape for b, n in zip(boxes, seed_mlp_graph()))
    # the center's value (0.027720 after the sum) lies inside
    assert boxes[4][0] <= 0.02772 <= boxes[4][1]


def test_seed_box_contains_every_corner_and_the_center():
    report = tlb.check_containment(seed_mlp_graph(), seed_mlp_payload(), SEED_X0 - 0.05, SEED_X0 + 0.05)
    assert report.samples == 50 and report.corners == 16 and report.nodes == 6
    assert report.max_slack["float64"] == 0.0
    assert report.to_json()["ok"] is True


def _broken_tanh(node, parents, record):
    lo, hi = parents[0]
    return np.tanh(hi), np.tanh(hi)  # only the upper end: every sample below it is a counterexample


def test_counterexample_names_node_sample_and_box(monkeypatch):
    monkeypatch.setitem(interval_module.INTERVAL_RULES, "tanh", _broken_tanh)
    with pytest.raises(IntervalError) as e:
        tlb.check_containment(seed_mlp_graph(), seed_mlp_payload(), SEED_X0 - 0.05, SEED_X0 + 0.05)
    message = str(e.value)
    assert e.value.node == 5 and "node 5 (tanh)" in message
    assert "sample" in message and "outside the box [" in message and "sample input: [" in message


@pytest.fixture()
def seed_folder(tmp_path):
    tlb.save(seed_mlp_bundle(), tmp_path / "seed")
    np.save(tmp_path / "c.npy", SEED_X0)
    return tmp_path


def test_bounds_command_prints_the_chapter_table(seed_folder, capsys):
    status = main(["bounds", str(seed_folder / "seed"), "--center", str(seed_folder / "c.npy"), "--radius", "0.05",
                   "--all-nodes", "--full"])
    out = capsys.readouterr().out.splitlines()
    assert status == 0
    assert "\n".join(out[:5]) == CHAPTER_BOXES
    assert out[5] == "node 5: [0.020772] .. [0.035625]"
    assert out[6].startswith("containment: 50 samples (16 corners) x 6 nodes")


def test_bounds_command_json_and_counterexample_exit_1(seed_folder, capsys, monkeypatch):
    args = ["bounds", str(seed_folder / "seed"), "--center", str(seed_folder / "c.npy"), "--radius", "0.05"]
    assert main(args + ["--json", "--samples", "5", "--seed", "3"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["nodes"][4]["lo"] == pytest.approx(0.020775, abs=5e-7) and doc["containment"]["samples"] == 5
    assert doc["products"] == "float32"  # the default, reported; the chapter's 4-wide layers take float64 anyway
    assert main(args + ["--json", "--samples", "5", "--seed", "3", "--products", "float64"]) == 0
    doc64 = json.loads(capsys.readouterr().out)
    assert doc64["products"] == "float64" and doc64["nodes"] == doc["nodes"]
    monkeypatch.setitem(interval_module.INTERVAL_RULES, "tanh", _broken_tanh)
    assert main(args) == 1
    captured = capsys.readouterr()
    assert "counterexample: containment: node 5 (tanh)" in captured.err and "sample input" in captured.err


def test_bounds_command_bad_input_exit_2(seed_folder, capsys):
    folder, center = str(seed_folder / "seed"), str(seed_folder / "c.npy")
    np.save(seed_folder / "bad.npy", np.zeros(3))
    assert main(["bounds", folder, "--center", center, "--radius", "-1"]) == 2
    assert main(["bounds", folder, "--center", str(seed_folder / "missing.npy"), "--radius", "0.1"]) == 2
    assert main(["bounds", folder, "--center", str(seed_folder / "bad.npy"), "--radius", "0.1"]) == 2
    assert main(["bounds", folder, "--center", center, "--center", center, "--radius", "0.1"]) == 2
    err = capsys.readouterr().err
    assert "--radius must be a finite number >= 0" in err and "expected [4]" in err


def test_bad_boxes_are_refused_with_the_node_named():
    g, p = seed_mlp_graph(), seed_mlp_payload()
    with pytest.raises(IntervalError, match=r"node 0 \(input\): lower bound exceeds upper bound"):
        tlb.interval_bounds(g, p, SEED_X0 + 0.1, SEED_X0)
    with pytest.raises(IntervalError, match="NaN"):
        tlb.interval_bounds(g, p, np.full(4, np.nan), SEED_X0)
    with pytest.raises(IntervalError, match=r"shape \[3\], expected \[4\]"):
        tlb.interval_bounds(g, p, np.zeros(3), np.zeros(3))


def test_domain_errors_and_missing_rules_name_the_node():
    g = Graph([Node(0, [], "input", [3]), Node(1, [0], "log", [3])])
    with pytest.raises(IntervalError, match=r"interval: node 1 \(log\): log: box reaches -1.0 <= 0") as e:
        tlb.interval_bounds(g, None, np.array([-1.0, 1, 2]), np.array([1.0, 2, 3]))
    assert e.value.node == 1 and e.value.op == "log"
    lo, hi = tlb.interval_bounds(g, None, np.array([1.0, 2, 3]), np.array([1.0, 2, 3]))[1]
    assert np.all(lo <= np.log([1.0, 2, 3])) and np.all(hi >= np.log([1.0, 2, 3])) and lo[0] <= 0 <= hi[0]
    g = Graph([Node(0, [], "input", [2]), Node(1, [0], "custom", [2], {"name": "f", "input_shapes": [[2]],
                                                                       "output_shape": [2]})])
    with pytest.raises(IntervalError, match=r"node 1 \(custom\): no interval rule for custom"):
        tlb.interval_bounds(g, None, np.zeros(2), np.ones(2))
    g = Graph([Node(0, [], "input", [2]), Node(1, [], "input", [2]), Node(2, [0, 1], "div", [2])])
    with pytest.raises(IntervalError, match=r"node 2 \(div\): div: the denominator's box contains 0"):
        tlb.interval_bounds(g, None, [np.ones(2), np.array([-1.0, 1])], [np.ones(2), np.array([1.0, 2])])


def test_integer_inputs_need_point_boxes_and_gather_reads_them():
    b = GraphBuilder("builder")
    table = b.input((4, 2))
    idx = b.input((3,), dtype="int64")
    out = b.add("gather", [table, idx], {"axis": 0})
    bundle = b.finish([out])
    g = bundle.graph
    lo_t, hi_t = np.arange(8.0).reshape(4, 2), np.arange(8.0).reshape(4, 2) + 0.5
    with pytest.raises(IntervalError, match="int64 inputs need a point box"):
        tlb.interval_bounds(g, bundle.payload, [lo_t, np.array([0, 1, 2])], [hi_t, np.array([0, 1, 3])])
    boxes = tlb.interval_bounds(g, bundle.payload, [lo_t, np.array([3, 0, 3])], [hi_t, np.array([3, 0, 3])])
    np.testing.assert_array_equal(boxes[-1][0], lo_t[[3, 0, 3]])
    np.testing.assert_array_equal(boxes[-1][1], hi_t[[3, 0, 3]])
    tlb.check_containment(g, bundle.payload, [lo_t, np.array([3, 0, 3])], [hi_t, np.array([3, 0, 3])], samples=8)


def test_swapped_linear_payload_keys_fail_with_the_evaluators_chapter_message():
    """Spec 4.8: the interval domain reads records like the float evaluator, message included."""
    p = seed_mlp_payload()
    swapped = tlb.Payload({1: p.record(3), 3: p.record(1)})
    message = "IR eval: linear 1: declared outShape mismatch: [5] vs expected [3]"
    with pytest.raises(tlb.BridgeError) as float_error:
        tlb.evaluate(seed_mlp_graph(), swapped, SEED_X0)
    with pytest.raises(tlb.BridgeError) as interval_error:
        tlb.interval_bounds(seed_mlp_graph(), swapped, SEED_X0 - 0.05, SEED_X0 + 0.05)
    assert str(float_error.value) == str(interval_error.value) == message
    assert interval_error.value.node == 1 and interval_error.value.op == "linear"


def test_payloads_the_evaluator_accepts_are_accepted_by_the_interval_domain():
    """Flat const values and a flat layernorm gamma over a [2, 3] suffix (records.py reshapes them)."""
    g = Graph([Node(0, [], "input", [2, 2, 3]), Node(1, [], "const", [2, 3], {"value_shape": [2, 3]}),
               Node(2, [1], "broadcast_to", [2, 2, 3], {"from_shape": [2, 3], "to_shape": [2, 2, 3]}),
               Node(3, [0, 2], "add", [2, 2, 3]), Node(4, [3], "layernorm", [2, 2, 3], {"axis": 1, "eps": 1e-5})])
    p = tlb.Payload({1: {"values": np.arange(6.0)}, 4: {"weight": np.linspace(0.5, 1.5, 6)}})
    x = np.linspace(-1, 1, 12).reshape(2, 2, 3)
    value = tlb.evaluate(g, p, x)[0]
    lo, hi = tlb.interval_bounds(g, p, x, x)[-1]
    assert np.all(lo <= value) and np.all(value <= hi) and np.max(hi - lo) < 1e-12
    short = tlb.Payload({1: {"values": np.arange(5.0)}})
    message = "IR eval: const 1: flat length mismatch: have 5, expected 6"
    for run in (lambda: tlb.evaluate(g, short, x), lambda: tlb.interval_bounds(g, short, x, x)):
        with pytest.raises(tlb.BridgeError) as e:
            run()
        assert str(e.value) == message
