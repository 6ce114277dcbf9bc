"""The one-pass wire reader agrees with the staged reader on every document.

``parse_document`` reads a problem-free document in one pass and falls back to the staged reader
(TorchLean's stage order and messages) at the first sign of trouble. These tests hold the two to the
same outcome: the same graph node for node (exact-int tuples included) and inline payload, or the
same error; and a graph the one-pass reader marks well formed has no structure error at all.
"""

from __future__ import annotations

import copy
import json

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import torchlean_bridge as tlb
from torchlean_bridge import wire as W
from torchlean_bridge.check import check_well_formed
from torchlean_bridge.graph import Graph
from torchlean_bridge.wire import dump_graph, graph_to_wire

from test_wire import corrupted_seed, random_graphs

LIMIT = W.DEFAULT_MAX_ELEMENTS


def staged(doc, strict: bool = False):
    """The staged reader alone (what parse_document did before the one-pass reader)."""
    d, parsed, outputs = W._stage_a(doc, LIMIT)
    inputs, outputs = W._stage_b(d, parsed, outputs, strict)
    nodes = W._stage_c(parsed, strict, LIMIT)
    return Graph(nodes, inputs, outputs), W._inline_payload([n[W._RAW] for n in parsed], nodes, LIMIT)


def outcome(reader, doc, strict: bool = False):
    """What a reader makes of ``doc`` and what check_well_formed then says: comparable values."""
    try:
        g, payload = reader(copy.deepcopy(doc), strict=strict)
    except tlb.BridgeError as e:
        return ("error", type(e).__name__, e.message)
    nodes = [(n.id, n.parents, tuple(map(type, n.parents)), n.kind, n.out_shape, tuple(map(type, n.out_shape)),
              sorted(n.attrs.items()), n.dtype, n.source) for n in g]
    records = {nid: {k: v.tolist() for k, v in payload.record(nid).items()} for nid in range(len(g))}
    structure = [e.message for e in check_well_formed(Graph(list(g), g.inputs, g.outputs), collect=True)]
    if getattr(g, "well_formed", False):
        assert structure == [], "marked well formed, yet check_well_formed finds problems"
    return ("graph", nodes, g.inputs, g.outputs, records, structure)


def assert_same(doc, strict: bool = False) -> None:
    assert outcome(W.parse_document, doc, strict) == outcome(staged, doc, strict)
    try:
        text = json.dumps(doc, allow_nan=False)
    except ValueError:  # a document holding NaN/Infinity has no JSON text: the text reader refuses it first
        return
    assert loaded(text, strict) == loaded(copy.deepcopy(doc), strict)


def loaded(source, strict: bool):
    """load_graph's outcome: from text it decodes the document itself (and consumes it while
    reading), from a dict it reads the caller's document as it is."""
    try:
        g = tlb.load_graph(source, strict=strict)
    except tlb.BridgeError as e:
        return ("error", type(e).__name__, e.message)
    return [(n.id, n.parents, n.kind, n.out_shape, sorted(n.attrs.items()), n.dtype, n.source) for n in g]


@settings(max_examples=120, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(random_graphs())
def test_valid_documents_give_the_staged_readers_graph(g):
    doc = json.loads(json.dumps(dump_graph(g)))
    assert_same(doc)
    assert_same(doc, strict=True)


@settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_corrupted_documents_give_the_staged_readers_outcome(data):
    doc = corrupted_seed(data)
    assert_same(doc)
    assert_same(doc, strict=True)


def _chain(n: int) -> dict:
    return {"format": W.FORMAT, "input_id": 0, "output_ids": [n - 1],
            "nodes": [{"id": 0, "kind": "input", "parents": [], "shape": [3]}]
            + [{"id": i, "kind": "relu", "parents": [i - 1], "shape": [3]} for i in range(1, n)]}


def test_structural_problems_keep_their_messages():
    arity = _chain(6)
    arity["nodes"][3]["parents"] = [1, 2]  # relu with two parents: the wire stages accept it
    assert_same(arity)
    try:
        tlb.load_graph(arity)
    except tlb.BridgeError as e:
        assert e.message == "IR graph: node 3: bad parent count for relu: expected 1..1, got 2 " \
                            "(Node(id=3, kind=relu, parents=#[1, 2], outShape=[3]))"
    else:
        raise AssertionError("a relu with two parents was accepted")
    unlisted = _chain(6)
    unlisted["nodes"][4] = {"id": 4, "kind": "input", "parents": [], "shape": [3]}
    unlisted["input_ids"] = [0]
    assert_same(unlisted)
    ordered = _chain(12)  # an unknown kind at node 5 and a bad shape at node 9: stage A's error first
    ordered["nodes"][5]["kind"] = "no_such_op"
    ordered["nodes"][9]["shape"] = [3, True]
    assert outcome(W.parse_document, ordered)[2] == "PyTorch graph import: node[9].shape: expected natural number, " \
                                                    "got true"
    assert_same(ordered)


def test_nodes_with_attributes_payload_and_provenance():
    torch = __import__("torch")
    net = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(8, 3),
                              torch.nn.LayerNorm(3))
    bundle = tlb.import_fx(net.eval(), (torch.rand(1, 1, 4, 4),))
    doc = json.loads(json.dumps(graph_to_wire(bundle.graph, bundle.payload)))
    assert_same(doc)
    g, payload = W.parse_document(doc)
    assert getattr(g, "well_formed", False)
    for nid in range(len(g)):
        for role, value in payload.record(nid).items():
            assert np.array_equal(value, np.asarray(bundle.payload.record(nid)[role], dtype=np.float64))


def test_a_callers_document_is_left_as_it_was():
    doc = _chain(50)
    before = json.dumps(doc)
    tlb.load_graph(doc)
    W.parse_document(doc)
    assert json.dumps(doc) == before
