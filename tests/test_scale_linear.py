"""Scale (issue 17): long graphs in linear time, and the fast paths give what the general paths give.

Linear time is asserted by counting Python-level calls (the profiler's call events, C functions
included), never by the clock: on chains of n, 2n and 4n nodes each entry point makes the same number
of calls per added node, and at most a few dozen of them.
"""

import json
import sys
from dataclasses import fields

import numpy as np
import pytest

import torchlean_bridge as tlb
from torchlean_bridge.errors import BridgeError
from torchlean_bridge.graph import Node
from torchlean_bridge.wire import dumps_document, parse_document


def _chain_doc(n: int) -> dict:
    return {"format": "torchlean.ir.v1", "input_id": 0, "output_ids": [n - 1],
            "nodes": [{"id": 0, "kind": "input", "parents": [], "shape": [4]}]
            + [{"id": i, "kind": "relu" if i % 2 else "tanh", "parents": [i - 1], "shape": [4]} for i in range(1, n)]}


def _calls(fn, *args):
    count = [0]

    def profile(frame, event, arg):
        if event in ("call", "c_call"):
            count[0] += 1
    sys.setprofile(profile)
    try:
        out = fn(*args)
    finally:
        sys.setprofile(None)
    return count[0], out


def _per_node(entry, n=150):
    """Calls per added node between n and 2n nodes, and between 2n and 4n (per node) nodes."""
    counts = [entry(k) for k in (n, 2 * n, 4 * n)]
    return (counts[1] - counts[0]) / n, (counts[2] - counts[1]) / (2 * n)


def _load(n):
    return _calls(tlb.load_graph, dumps_document(_chain_doc(n)))[0]


def _check(n):
    g = tlb.load_graph(_chain_doc(n))
    return _calls(tlb.check, g)[0]


def _evaluate(n):
    g = tlb.load_graph(_chain_doc(n))
    tlb.evaluate(g, None, [np.zeros(4)])  # the first call computes the graph's schedule (linear too)
    return _calls(tlb.evaluate, g, None, [np.zeros(4)])[0]


def _first_evaluate(n):
    g = tlb.load_graph(_chain_doc(n))
    return _calls(tlb.evaluate, g, None, [np.zeros(4)])[0]


def _dump(n):
    g = tlb.load_graph(_chain_doc(n))
    return _calls(tlb.dump_graph, g)[0]


def _save_load(tmp_path):
    def entry(n):
        g = tlb.load_graph(_chain_doc(n))
        saved, _ = _calls(tlb.save, tlb.Bundle(g), tmp_path / f"b{n}")
        loaded, b = _calls(tlb.load, tmp_path / f"b{n}")
        assert b.graph == g
        return saved + loaded
    return entry


@pytest.mark.parametrize("entry, bound", [(_load, 30), (_check, 10), (_evaluate, 16), (_first_evaluate, 18),
                                          (_dump, 8)], ids=["load_graph", "check", "evaluate", "first_evaluate",
                                                            "dump_graph"])
def test_long_chain_entry_points_make_a_constant_number_of_calls_per_node(entry, bound):
    first, second = _per_node(entry)
    assert first == pytest.approx(second, rel=0.02)  # linear: no per-node cost growing with the graph
    assert second <= bound


def test_bundle_save_and_load_are_linear(tmp_path):
    first, second = _per_node(_save_load(tmp_path))
    assert first == pytest.approx(second, rel=0.02)
    assert second <= 60


def _fields(node: Node) -> dict:
    return {f.name: getattr(node, f.name) for f in fields(Node)}


MIXED = {"format": "torchlean.ir.v1", "input_id": 0, "output_ids": [7], "nodes": [
    {"id": 0, "kind": "input", "parents": [], "shape": [2, 3], "source": {"framework": "onnx", "name": "x"}},
    {"id": 1, "kind": "relu", "parents": [0], "shape": [2, 3], "debug_target": "aten.relu"},
    {"id": 2, "kind": "reduce_sum", "parents": [1], "shape": [2], "axes": [1], "keepdim": False},
    {"id": 3, "kind": "reduce_sum", "parents": [1], "shape": [1, 1], "axes": [0, 1], "keepdim": True},
    {"id": 4, "kind": "const", "parents": [], "shape": [2], "values": [1.0, 2.0]},
    {"id": 5, "kind": "add", "parents": [2, 4], "shape": [2]},
    {"id": 6, "kind": "linear", "parents": [5], "shape": [3], "out_dim": 3, "in_dim": 2,
     "weight": [[1, 2], [3, 4], [5, 6]], "bias": [0, 0, 1]},
    {"id": 7, "kind": "softmax", "parents": [6], "shape": [3], "axis": 0},
]}


def test_nodes_read_by_the_fast_paths_equal_nodes_built_field_by_field():
    g, payload = parse_document(MIXED)
    tlb.check(g)
    for node in g.nodes:
        rebuilt = Node(node.id, list(node.parents), node.kind, list(node.out_shape), dict(node.attrs), node.dtype,
                       node.source)
        assert _fields(node) == _fields(rebuilt)
        assert type(node.attrs) is dict and all(type(d) is int for d in node.out_shape + node.parents)
    assert g.nodes[3].kind == "reduce_sum_axes" and g.nodes[3].attrs == {"axes": (0, 1), "keepdim": True}
    assert str(g.nodes[1].source) == "torchlean (aten.relu)"
    # round trip: the dumped document reads back to the same graph and payload
    text = dumps_document(tlb.wire.graph_to_wire(g, payload))
    g2, payload2 = parse_document(tlb.wire.loads_document(text))
    assert g2 == g and payload2 == payload and dumps_document(tlb.wire.graph_to_wire(g2, payload2)) == text


@pytest.mark.parametrize("bad, message", [
    ([4.0], "node[2].shape: expected natural number, got 4.0"),
    ([True], "node[2].shape: expected natural number, got true"),
    ([-4], "node[2].shape: expected natural number, got -4"),
])
def test_a_shape_seen_before_is_not_trusted_for_a_lookalike(bad, message):
    """(4.0,) and (True,) equal (4,) and (1,) as tuples: the shape cache must not let them through."""
    doc = _chain_doc(4)
    doc["nodes"][1]["shape"] = [1] if bad == [True] else [4]
    doc["nodes"][2]["shape"] = bad
    with pytest.raises(BridgeError) as e:
        tlb.load_graph(doc)
    assert e.value.message == "PyTorch graph import: " + message


def test_stage_order_survives_the_fast_paths():
    """A document-level problem late in the list is reported before an unknown kind early in it."""
    doc = _chain_doc(6)
    doc["nodes"][1]["kind"] = "no_such_op"
    doc["nodes"][4]["parents"] = [2.5]
    with pytest.raises(BridgeError) as e:
        tlb.load_graph(doc)
    assert e.value.message == "PyTorch graph import: node[4].parents: expected natural number, got 2.5"
    doc["nodes"][4]["parents"] = [5]
    with pytest.raises(BridgeError) as e:
        tlb.load_graph(doc)
    assert e.value.message == "PyTorch graph import: node[4]: parent id 5 is not < 4"


def test_evaluation_schedule_frees_values_and_is_kept_on_the_graph():
    g = tlb.load_graph(_chain_doc(6))
    x = np.array([-1.0, 0.5, 2.0, -0.0])
    every = tlb.evaluate(g, None, [x], all_nodes=True)
    assert all(v is not None for v in every)
    out = tlb.evaluate(g, None, [x])
    np.testing.assert_array_equal(out[0], every[-1])
    schedule = g.evaluation_schedule
    assert schedule.last_reader == [1, 2, 3, 4, 5, 6] and schedule.parents_in_range
    tlb.evaluate(g, None, [x])
    assert g.evaluation_schedule is schedule


def test_a_negative_parent_id_is_refused_by_the_evaluator_not_read_from_the_end():
    nodes = [Node(0, (), "input", (2,)), Node(1, (0,), "relu", (2,)), Node(2, (-2,), "relu", (2,))]
    g = tlb.Graph(nodes, [0], [1, 2])  # node 1 stays alive: values[-2] would be it
    with pytest.raises(BridgeError, match=r"parent -2 has not been evaluated"):
        tlb.evaluate(g, None, [np.zeros(2)], check=False)


def test_bind_checkpoint_copies_only_what_it_binds():
    """Bound slots hold the checkpoint's tensors (a transposing binding its one necessary copy); every
    other tensor is the bundle's own, shared read-only, and the input bundle is left as it was."""
    from torchlean_bridge.app.abi import bind_checkpoint
    from torchlean_bridge.roles import Binding, RoleMap
    doc = {"format": "torchlean.ir.v1", "input_id": 0, "output_ids": [3],
           "nodes": [{"id": 0, "kind": "input", "parents": [], "shape": [3]},
                     {"id": 1, "kind": "linear", "parents": [0], "shape": [2]},
                     {"id": 2, "kind": "linear", "parents": [1], "shape": [2]},
                     {"id": 3, "kind": "linear", "parents": [2], "shape": [2]}]}
    rng = np.random.default_rng(0)
    payload = tlb.Payload({1: {"weight": rng.standard_normal((2, 3)), "bias": rng.standard_normal(2)},
                           2: {"weight": rng.standard_normal((2, 2)), "bias": rng.standard_normal(2)},
                           3: {"weight": rng.standard_normal((2, 2)), "bias": rng.standard_normal(2)}})
    roles = RoleMap([Binding("a.weight", 1, "weight"), Binding("a.bias", 1, "bias"),
                     Binding("b.weight", 3, "weight", "transpose")])
    bundle = tlb.Bundle(tlb.load_graph(doc), payload, roles)
    before = {(n, r): a.copy() for n, r, a in payload.items()}
    ckpt = {"a.weight": rng.standard_normal((2, 3)), "a.bias": rng.standard_normal(2),
            "b.weight": rng.standard_normal((2, 2))}
    bound, report = bind_checkpoint(bundle, ckpt, strict=False)
    got = bound.payload
    assert np.shares_memory(got.get(1, "weight"), ckpt["a.weight"]) and np.shares_memory(got.get(1, "bias"),
                                                                                          ckpt["a.bias"])
    np.testing.assert_array_equal(got.get(3, "weight"), ckpt["b.weight"].T)
    for role in ("weight", "bias"):  # node 2 is bound to nothing: the bundle's tensors, not copies
        assert np.shares_memory(got.get(2, role), payload.get(2, role)) and not got.get(2, role).flags.writeable
    assert np.shares_memory(got.get(3, "bias"), payload.get(3, "bias"))
    assert all(np.array_equal(payload.get(n, r), a) for (n, r), a in before.items())
    assert payload.get(2, "weight").flags.writeable  # the caller's own arrays keep their flags


@pytest.mark.parametrize("node", [
    {"id": 3, "kind": "relu", "parents": [2], "shape": [4]},
    {"shape": [], "parents": [], "id": 0, "kind": "in\"pu\u00e9t\u2028\\"},
    {"id": 10**30, "kind": "x", "parents": [1, 2, 10**20], "shape": [0, 3]},
    {"id": True, "kind": "x", "parents": [], "shape": []},
    {"id": 1, "kind": "x", "parents": [True], "shape": [1.0]},
    {"id": 1, "kind": "x", "parents": [-1], "shape": [2]},
    {"id": 1, "kind": "x", "parents": [], "shape": [], "dtype": "int64"},
])
def test_node_lines_are_the_json_encoders_text(node):
    doc = {"format": "torchlean.ir.v1", "nodes": [node, node]}
    enc = [json.dumps(node, sort_keys=True, allow_nan=False, ensure_ascii=True)] * 2
    assert dumps_document(doc) == '{\n  "format": "torchlean.ir.v1",\n  "nodes": [\n    ' + ",\n    ".join(enc) \
        + "\n  ]\n}\n"


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_relu_is_where_x_le_0_bit_for_bit(dtype):
    from semantics.rules import FLOAT_RULES
    dt = np.dtype(dtype)
    rng = np.random.default_rng(1)
    x = rng.standard_normal(1001)
    x[::7] = -0.0
    x[1::7] = 0.0
    x[2::7] = np.nan
    x[3::7] = -np.nan
    x[4::7] = np.inf
    x[5::7] = -np.inf
    x[6::14] = 5e-324
    x = x.astype(dt)
    node = Node(1, (0,), "relu", x.shape)
    for v in (x, x[::3], x[:1].reshape(()), x.reshape(7, 143)):
        got = FLOAT_RULES["relu"](node, [v], {}, dt)
        want = np.where(v <= 0, dt.type(0), v)
        assert type(got) is np.ndarray and got.dtype == want.dtype and got.shape == want.shape
        assert got.tobytes() == want.tobytes()
