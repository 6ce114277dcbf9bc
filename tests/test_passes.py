"""The passes on small graphs: each keeps every value, moves bindings with their tensors, and leaves a
graph it has nothing to do for exactly as it was."""

from __future__ import annotations

import numpy as np
import pytest

import torchlean_bridge as tlb
from importers.builder import GraphBuilder
from torchlean_bridge.passes import (eliminate_common_subexpressions, eliminate_dead_code, fuse_linear_bias,
                                     rewrite_to_v1)
from torchlean_bridge.passes.base import Note

RNG = np.random.default_rng(0)


def _same_values(a: tlb.Bundle, b: tlb.Bundle, x: np.ndarray) -> None:
    for dtype in ("float64", "float32"):
        np.testing.assert_allclose(tlb.evaluate(a.graph, a.payload, [x], dtype=dtype)[0],
                                   tlb.evaluate(b.graph, b.payload, [x], dtype=dtype)[0],
                                   rtol=1e-6 if dtype == "float32" else 1e-12)


def _matmul_bias(two_readers: bool = False) -> tuple[tlb.Bundle, np.ndarray, np.ndarray]:
    b = GraphBuilder("builder")
    x = b.input((3, 4))
    w, bias = RNG.normal(size=(4, 5)), RNG.normal(size=(1, 5))
    product = b.add("matmul", [x, b.const(w, key="w", transform="transpose")])
    out = b.elementwise("add", [product, b.const(bias, key="b")])
    if two_readers:
        out = b.add("concat", [out, product], {"axis": 0})
    return b.finish([out], canonical=False), w, bias


def test_matmul_by_a_constant_plus_a_bias_row_is_one_linear() -> None:
    raw, w, bias = _matmul_bias()
    fused, note = fuse_linear_bias(raw)
    assert note.changed == 1 and [n.kind for n in fused.graph] == ["input", "linear"]
    assert fused.roles["w"].role == "weight" and fused.roles["w"].transform is None  # transpose∘transpose
    assert fused.roles["b"].role == "bias" and fused.roles["b"].transform == "reshape:5"
    np.testing.assert_array_equal(bias.reshape(5), fused.payload.get(1, "bias"))
    _same_values(raw, fused, RNG.normal(size=(3, 4)))


def test_a_product_read_elsewhere_is_left_alone() -> None:
    raw, _, _ = _matmul_bias(two_readers=True)
    out, note = fuse_linear_bias(raw)
    assert note == Note("fuse_linear_bias") and out is raw


def test_a_bias_free_linear_takes_the_bias() -> None:
    b = GraphBuilder("builder")
    x = b.input((2, 3))
    lin = b.add("linear", [x], shape=(2, 4))
    b.param(lin, "weight", RNG.normal(size=(4, 3)), key="fc.w")
    b.param(lin, "bias", np.zeros(4))
    out = b.elementwise("add", [b.const(RNG.normal(size=4), key="fc.b"), lin])
    raw = b.finish([out], canonical=False)
    fused, note = fuse_linear_bias(raw)
    assert note.changed == 1 and [n.kind for n in fused.graph] == ["input", "linear"]
    assert (fused.roles["fc.w"].role, fused.roles["fc.b"].role) == ("weight", "bias")
    _same_values(raw, fused, RNG.normal(size=(2, 3)))


def test_dead_code_reports_the_tensors_it_unbinds() -> None:
    b = GraphBuilder("builder")
    x = b.input((3,))
    b.const(np.ones(3), key="unused")
    out = b.add("relu", [x])
    bundle = b.finish([out], keep_dead=True)
    pruned, note = eliminate_dead_code(bundle)
    assert note.changed == 1 and len(pruned.graph) == 2 and pruned.report["unused_tensors"] == ["unused"]
    assert eliminate_dead_code(pruned)[0] is pruned


def test_repeated_computations_merge_but_constants_do_not() -> None:
    b = GraphBuilder("builder")
    x = b.input((2, 3))
    t1, t2 = b.add("transpose", [x], {"axis1": 0, "axis2": 1}), b.add("transpose", [x], {"axis1": 0, "axis2": 1})
    c1, c2 = b.const(np.ones((3, 2))), b.const(np.ones((3, 2)))
    out = b.add("concat", [b.add("add", [t1, c1]), b.add("add", [t2, c2])], {"axis": 0})
    raw = b.finish([out], canonical=False)
    merged, note = eliminate_common_subexpressions(raw)
    assert note.changed == 1 and merged.graph.ops_used()["transpose"] == 1 and merged.graph.ops_used()["const"] == 2
    _same_values(raw, merged, RNG.normal(size=(2, 3)))


def test_v1_rewrite_lists_what_blocks() -> None:
    b = GraphBuilder("builder")
    x = b.input((2, 3))
    out = b.add("gelu", [b.add("unsqueeze", [x], {"axes": [0]})], {"approximate": "none"})
    v1, note = rewrite_to_v1(b.finish([out], canonical=False))
    assert [n.kind for n in v1.graph] == ["input", "reshape", "gelu"]
    assert [item["kind"] for item in note.facts["blocking"]] == ["gelu"]


def test_broadcasts_an_onnx_op_does_itself_are_absorbed_once() -> None:
    from torchlean_bridge.passes import absorb_broadcasts
    b = GraphBuilder("builder")
    x = b.input((2, 3))
    bias = b.broadcast(b.const(np.ones(3)), (2, 3))
    added = b.add("add", [x, bias])
    shown = b.add("relu", [b.broadcast(b.const(np.ones(3)), (2, 3))])  # relu does not broadcast
    bundle = b.finish([b.add("concat", [added, shown], {"axis": 0})], canonical=False)
    same, note = absorb_broadcasts(bundle)
    assert same is bundle
    by_kind = {n.kind: n.id for n in bundle.graph if n.kind in ("add", "relu")}
    assert list(note.facts["operands"]) == [(by_kind["add"], 1)]
    assert note.facts["absorbed"] == {bundle.graph.nodes[by_kind["add"]].parents[1]}


def test_a_graph_is_validated_once_and_carries_the_fact() -> None:
    from torchlean_bridge.check import check
    from torchlean_bridge.errors import GraphError
    from torchlean_bridge.ops import REGISTRY
    b = GraphBuilder("builder")
    x = b.input((2, 3))
    g = b.finish([b.add("relu", [b.add("tanh", [x])])]).graph
    assert g.validated_under is not None  # finish validated it
    calls = []
    spec = REGISTRY["relu"]
    rule = spec.infer
    object.__setattr__(spec, "infer", lambda *a: calls.append(a) or rule(*a))
    try:
        check(g)
        tlb.evaluate(g, None, [np.zeros((2, 3))])
        tlb.interval_bounds(g, None, np.zeros((2, 3)), np.ones((2, 3)))
        assert calls == []  # nothing re-ran the rules
        check(g, max_elements=6)  # a smaller limit than the one it passed under is checked again
        assert calls and g.validated_under == 6
        with pytest.raises(GraphError, match="above the limit of 5"):
            check(g, max_elements=5)
    finally:
        object.__setattr__(spec, "infer", rule)
    same = tlb.Graph(g.nodes, g.inputs, g.outputs)
    assert same == g and same.validated_under is None  # the fact belongs to the checked object
