"""torchlean.ir.v1 export: one document TorchLean's importer accepts, or every blocking node listed.

Acceptance is checked by reading the document back in strict mode (TorchLean's rules only: v1 kinds,
one input, float values, payload inline) and evaluating it: it must compute what the bundle computes.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import torchlean_bridge as tlb
from exporters.torchlean_json import export_torchlean, payload_file_for, torchlean_blocking_nodes
from torchlean_bridge.app.cli import main
from torchlean_bridge.errors import ExportError
from torchlean_bridge.seed import SEED_X0, seed_mlp_bundle
from torchlean_bridge.wire import parse_document
from tests.test_onnx_import import CASES

V1_CASES = ["Gemm_transB", "Gemm_row_bias", "MatMul_Add_rank3", "Conv_grouped_dilated_asym", "Conv1d_same_upper",
            "BatchNormalization", "LayerNormalization_last", "LayerNormalization_axis1_no_bias", "MaxPool_v1",
            "AveragePool_v1", "AveragePool_pad_included", "GlobalAveragePool", "Softmax_opset11_flattens",
            "Squeeze_opset13_input", "Unsqueeze_opset11_attr", "ReduceSum_opset13_input", "ReduceMean_opset13_attr",
            "Flatten_axis2", "Transpose", "Add_broadcast_const", "Reshape_zero_and_minus_one", "InstanceNormalization"]


def _inputs(b: tlb.Bundle) -> list[np.ndarray]:
    rng = np.random.default_rng(3)
    return [rng.standard_normal(b.graph.nodes[i].out_shape) for i in b.graph.inputs]


@pytest.mark.parametrize("name", V1_CASES)
def test_export_is_accepted_in_strict_mode_and_computes_the_same(name: str) -> None:
    b = tlb.import_onnx(CASES[name])
    doc = export_torchlean(b, None)
    g, payload = parse_document(json.loads(json.dumps(doc)), strict=True)
    tlb.check(g)
    x = _inputs(b)
    ours, theirs = tlb.evaluate(b.graph, b.payload, x), tlb.evaluate(g, payload, x)
    assert all(np.array_equal(a, c) for a, c in zip(ours, theirs, strict=True))


def test_seed_mlp_document_matches_the_committed_fixture(tmp_path) -> None:
    from tests.conftest import FIXTURES
    export_torchlean(seed_mlp_bundle(), tmp_path / "seed.json")
    assert (tmp_path / "seed.json").read_bytes() == (FIXTURES / "seed_mlp.json").read_bytes()
    g, p = parse_document(json.loads((tmp_path / "seed.json").read_text()), strict=True)
    # the document holds the weights exactly (shortest round-trip decimals): the same float64 result
    np.testing.assert_array_equal(tlb.evaluate(g, p, [SEED_X0])[0],
                                  tlb.evaluate(seed_mlp_bundle().graph, seed_mlp_bundle().payload, [SEED_X0])[0])


def test_grouped_conv_weight_is_written_dense_and_block_diagonal() -> None:
    b = tlb.import_onnx(CASES["Conv_grouped_dilated_asym"])
    node = next(n for n in export_torchlean(b, None)["nodes"] if n["kind"] == "conv")
    w = np.array(node["weight"])
    grouped = b.payload.get(1, "weight")
    assert w.shape == (6, 4, 3, 3) and node["groups"] == 2 and node["input_spatial"] == [7, 8]
    assert np.array_equal(w[:3, :2], grouped[:3]) and np.array_equal(w[3:, 2:], grouped[3:])
    assert not np.any(w[:3, 2:]) and not np.any(w[3:, :2])


def test_reductions_are_written_in_axes_keepdim_form_and_ext_ops_rewritten() -> None:
    nodes = export_torchlean(tlb.import_onnx(CASES["ReduceSum_opset13_input"]), None)["nodes"]
    assert {k: nodes[1][k] for k in ("kind", "axes", "keepdim")} == {"kind": "reduce_sum", "axes": [0, 2],
                                                                     "keepdim": True}
    nodes = export_torchlean(tlb.import_onnx(CASES["Squeeze_opset13_input"]), None)["nodes"]
    assert {k: nodes[1][k] for k in ("kind", "in_shape", "out_shape")} == {
        "kind": "reshape", "in_shape": [2, 1, 4], "out_shape": [2, 4]}
    nodes = export_torchlean(tlb.import_onnx(CASES["GlobalAveragePool"]), None)["nodes"]
    assert nodes[1]["kind"] == "reduce_mean" and nodes[1]["axes"] == [2, 3] and nodes[1]["keepdim"] is True


def test_every_blocking_node_is_listed() -> None:
    b = tlb.import_onnx(CASES["Where_Greater"])  # two inputs, a bool comparison, an ext `where`
    blocking = torchlean_blocking_nodes(b)
    assert [(x["id"], x["kind"]) for x in blocking] == [(1, "input"), (2, "gt"), (3, "where")]
    with pytest.raises(ExportError) as e:
        export_torchlean(b, None)
    msg = str(e.value)
    assert e.value.items == blocking
    assert "3 node(s) block the export" in msg
    assert "node 1: input (onnx z): graph input #2" in msg and "node 2: gt (onnx (Greater))" in msg
    b = tlb.import_onnx(CASES["Gather_embedding_int64_ids"])
    reasons = {x["id"]: x["reason"] for x in torchlean_blocking_nodes(b)}
    assert reasons[0] == ("element type int64 (torchlean.ir.v1 is float-only): cut the graph after it with "
                          "--input-at NODE (--input-at embeddings for token ids)")
    assert all(x["kind"] != "max_pool" for x in torchlean_blocking_nodes(tlb.import_onnx(CASES["MaxPool_v1"])))
    assert torchlean_blocking_nodes(tlb.import_onnx(CASES["MaxPool_ceil"])) == []  # lowered (tests/test_v1_forms.py)


def test_separate_payload_file_round_trips(tmp_path) -> None:
    b = tlb.import_onnx(CASES["BatchNormalization"])
    doc = export_torchlean(b, tmp_path / "m.json", inline_payload=False)
    assert "gamma" not in doc["nodes"][1]
    assert payload_file_for(tmp_path / "m.json") == tmp_path / "m.payload.safetensors"
    from exporters.payload_safetensors import payload_from_file
    assert payload_from_file(tmp_path / "m.payload.safetensors") == b.payload


def test_export_command(tmp_path, capsys) -> None:
    tlb.save(tlb.import_onnx(CASES["Conv_grouped_dilated_asym"]), tmp_path / "b")
    assert main(["export", str(tmp_path / "b"), "--to", "torchlean", "-o", str(tmp_path / "m.json"),
                 "--inline-payload"]) == 0
    g, p = parse_document(json.loads((tmp_path / "m.json").read_text()), strict=True)
    assert len(p) == 2 and "payload inline" in capsys.readouterr().out
    assert main(["export", str(tmp_path / "b"), "--to", "onnx", "-o", str(tmp_path / "m.onnx")]) == 0
    assert tlb.import_onnx(tmp_path / "m.onnx") == tlb.load(tmp_path / "b")
    tlb.save(tlb.import_onnx(CASES["Where_Greater"]), tmp_path / "w")
    assert main(["export", str(tmp_path / "w"), "--to", "torchlean", "-o", str(tmp_path / "w.json")]) == 1
    assert "3 node(s) block the export" in capsys.readouterr().err
    assert not (tmp_path / "w.json").exists()
    assert main(["export", str(tmp_path / "missing"), "--to", "onnx", "-o", str(tmp_path / "x.onnx")]) == 2


def test_a_graph_without_input_is_refused(tmp_path) -> None:
    g = tlb.Graph([tlb.Node(0, [], "const", [2])], inputs=[], outputs=[0])
    b = tlb.Bundle(g, tlb.Payload({0: {"values": np.ones(2)}}))
    with pytest.raises(ExportError, match="the graph has no input"):
        export_torchlean(b, tmp_path / "g.json")
