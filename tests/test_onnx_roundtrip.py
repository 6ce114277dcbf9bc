"""ONNX export and the ONNX -> IR -> ONNX -> IR round trip.

For every import case: the exported model passes ``onnx.checker.check_model(full_check=True)``,
onnxruntime on it equals our float32 evaluation within 1e-5 relative (normwise per output), every
node's value (``expose_all_nodes``) agrees the same way, importing it again gives an equal bundle
(graph, role map, tensor hashes), and onnxruntime gives the same outputs on both ONNX files (within 1e-6).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper as nh

import torchlean_bridge as tlb
from exporters.onnx import ONNX_EXPORTERS, OPSET, to_onnx_model
from torchlean_bridge.errors import ExportError
from torchlean_bridge.graph import Graph, Node
from torchlean_bridge.ops import REGISTRY
from torchlean_bridge.payload import Payload
from torchlean_bridge.seed import SEED_X0, bias_pair_bundle, seed_mlp_bundle
from tests.test_onnx_import import CASES, assert_close, random_feeds, run_ort

# onnxruntime may pick other kernels for the re-exported model (opset 21; InstanceNormalization becomes
# LayerNormalization + scale + shift), so "the same outputs" means equal within 1e-6, not bit for bit
SAME_RTOL = 1e-6


def feeds_for(m: onnx.ModelProto, values: list[np.ndarray]) -> dict[str, np.ndarray]:
    inits = {t.name for t in m.graph.initializer}
    names = [vi.name for vi in m.graph.input if vi.name not in inits]
    return dict(zip(names, values, strict=True))


@pytest.mark.parametrize("name", sorted(CASES))
def test_onnx_ir_onnx_ir_round_trip(name: str) -> None:
    m1 = CASES[name]
    b1 = tlb.import_onnx(m1)
    m2 = tlb.export_onnx(b1)
    onnx.checker.check_model(m2, full_check=True)
    b2 = tlb.import_onnx(m2)
    assert b2.graph == b1.graph
    assert b2.roles == b1.roles
    assert b2.payload.hashes() == b1.payload.hashes()
    x = list(random_feeds(m1).values())
    r1, r2 = run_ort(m1, feeds_for(m1, x)), run_ort(m2, feeds_for(m2, x))
    assert_close(r2, r1, rtol=SAME_RTOL)
    assert_close(tlb.evaluate(b1.graph, b1.payload, x, dtype="float32"), r2)


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_node_value_matches_onnxruntime(name: str) -> None:
    b = tlb.import_onnx(CASES[name])
    m = to_onnx_model(b, expose_all_nodes=True)
    onnx.checker.check_model(m, full_check=True)
    assert [o.name for o in m.graph.output] == [f"node_{i}" for i in range(len(b.graph))]
    x = list(random_feeds(CASES[name]).values())
    ours = tlb.evaluate(b.graph, b.payload, x, dtype="float32", all_nodes=True)
    assert_close(ours, run_ort(m, feeds_for(m, x)))


def test_initializers_carry_role_map_names_in_their_external_layout() -> None:
    m1 = CASES["Gemm_row_bias"]  # W stored [in, out] (transB=0), bias [1, out]
    m2 = tlb.export_onnx(tlb.import_onnx(m1))
    before = {t.name: nh.to_array(t) for t in m1.graph.initializer}
    after = {t.name: nh.to_array(t) for t in m2.graph.initializer}
    assert before.keys() == after.keys()
    assert all(np.array_equal(before[k], after[k]) for k in before)
    assert [(n.op_type, dict((a.name, a.i) for a in n.attribute)) for n in m2.graph.node] == [("Gemm", {"transB": 0})]


def test_export_is_deterministic_and_atomic(tmp_path) -> None:
    b = tlb.import_onnx(CASES["Conv_grouped_dilated_asym"])
    p1, p2 = tmp_path / "a.onnx", tmp_path / "b.onnx"
    returned = tlb.export_onnx(b, p1)
    tlb.export_onnx(tlb.import_onnx(CASES["Conv_grouped_dilated_asym"]), p2)
    assert p1.read_bytes() == p2.read_bytes() == returned.SerializeToString()
    assert sorted(f.name for f in tmp_path.iterdir()) == ["a.onnx", "b.onnx"]  # no temporary left behind
    m = onnx.load(str(p1))
    assert m.opset_import[0].version == OPSET and m.producer_name == "torchlean-bridge"


@pytest.mark.parametrize("make", [seed_mlp_bundle, bias_pair_bundle])
def test_builder_bundles_with_float64_payload_export(make) -> None:
    b = make()
    m = tlb.export_onnx(b)
    onnx.checker.check_model(m, full_check=True)
    x = np.asarray(SEED_X0 if b.graph.nodes[0].out_shape == (4,) else [0.5, -1.0, 2.0], np.float32)
    ours = tlb.evaluate(b.graph, b.payload, [x], dtype="float32")
    assert_close(ours, run_ort(m, {m.graph.input[0].name: x}))
    assert sorted(t.name for t in m.graph.initializer) == sorted(b.roles)


def test_outputs_that_are_inputs_constants_or_repeated_get_identities() -> None:
    g = Graph([Node(0, [], "input", [2]), Node(1, [], "const", [2]), Node(2, [0, 1], "add", [2])],
              inputs=[0], outputs=[2, 0, 1, 2])
    b = tlb.Bundle(g, Payload({1: {"values": np.array([1.0, 2.0])}}))
    m = tlb.export_onnx(b)
    onnx.checker.check_model(m, full_check=True)
    out = run_ort(m, {m.graph.input[0].name: np.array([3.0, 4.0], np.float32)})
    assert [o.tolist() for o in out] == [[4.0, 6.0], [3.0, 4.0], [1.0, 2.0], [4.0, 6.0]]


def test_ops_without_an_onnx_form_are_all_listed() -> None:
    g = Graph([Node(0, [], "input", [2]), Node(1, [], "rand_uniform", [2], {"seed": 1}),
               Node(2, [0, 1], "add", [2]), Node(3, [2], "custom", [2],
                                                 {"name": "f", "input_shapes": [[2]], "output_shape": [2]})],
              inputs=[0], outputs=[3])
    with pytest.raises(ExportError) as e:
        tlb.export_onnx(tlb.Bundle(g))
    assert "2 node(s)" in str(e.value) and "node 1: rand_uniform" in str(e.value) and "node 3: custom" in str(e.value)


@pytest.mark.parametrize("kind", ["expm1", "log1p"])
def test_expm1_and_log1p_are_refused_by_name_since_onnx_has_no_exact_form(kind: str) -> None:
    g = Graph([Node(0, [], "input", [3]), Node(1, [0], kind, [3])], inputs=[0], outputs=[1])
    with pytest.raises(ExportError, match=f"node 1: {kind}"):
        tlb.export_onnx(tlb.Bundle(g))


def test_exporter_table_covers_every_registered_kind_with_an_onnx_meaning() -> None:
    no_onnx_form = {"input", "custom", "rand_uniform", "bernoulli_mask", "hard_masked_softmax", "expm1", "log1p",
                    "exp2", "log2", "trunc", "cumprod", "bitcast"}  # CumProd/BitCast are opset 26 (export: 21)
    assert set(REGISTRY) - no_onnx_form - set(ONNX_EXPORTERS) == set()
