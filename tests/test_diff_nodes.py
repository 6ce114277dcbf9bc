"""Node coverage of the diff: our own ONNX export annotates every value with its IR node, so a
bundle diffed against its exported file compares every node (absorbed broadcasts through the finer
oracle), and a payload changed after the export is found at exactly its node."""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")

import torchlean_bridge as tlb  # noqa: E402
from exporters.onnx import NODE_KINDS_KEY, NODE_VALUES_KEY, node_value_names  # noqa: E402
from tests.model_zoo import CASES  # noqa: E402
from tests.test_diff import with_payload  # noqa: E402

FAST = ["seed_mlp", "cnn2d", "residual", "layout", "mha_batch_first", "arithmetic", "norm_head"]


def compared(report) -> int:
    return sum(r.status != "no counterpart" for r in report.nodes)


@pytest.fixture(scope="module", params=FAST)
def exported(request, tmp_path_factory):
    module, inputs = CASES[request.param].make()
    bundle = tlb.import_fx(module, inputs)
    path = tmp_path_factory.mktemp("own") / "model.onnx"
    tlb.export_onnx(bundle, path)
    return bundle, path


def test_export_annotates_every_node_with_its_value(exported):
    bundle, path = exported
    model = onnx.load(str(path))
    values, kinds = node_value_names(model)
    assert kinds == [n.kind for n in bundle.graph.nodes]
    produced = {o for n in model.graph.node for o in n.output} | {i.name for i in model.graph.input} \
        | {t.name for t in model.graph.initializer}
    assert all(v in produced for v in values if v is not None)
    assert json.loads({p.key: p.value for p in model.metadata_props}[NODE_VALUES_KEY]) == values
    assert tlb.export_onnx(bundle).SerializeToString() == model.SerializeToString()  # deterministic


@pytest.mark.parametrize("against", ["onnxruntime", "reference-evaluator"])
def test_diff_against_our_own_file_compares_every_node(exported, against):
    bundle, path = exported
    report = tlb.diff(bundle, against=against, onnx_model=str(path), random=2)
    assert report.ok, str(report)
    assert "our ONNX export of this graph" in report.against
    assert compared(report) == len(bundle.graph.nodes), str(report)
    finer = [r for r in report.nodes if r.via]
    assert all(bundle.graph.nodes[r.node].kind == "broadcast_to" and "finer oracle" in r.via for r in finer)


def test_a_weight_changed_after_export_diverges_at_its_node(exported):
    bundle, path = exported
    pid = next((n.id for n in bundle.graph.nodes if n.kind in ("linear", "conv")), None)
    if pid is None:
        pytest.skip("no weighted node")
    b2 = with_payload(bundle, {(pid, "weight"): bundle.payload.get(pid, "weight") * 1.01})
    report = tlb.diff(b2, against="onnxruntime", onnx_model=str(path), random=2)
    assert report.first_divergence is not None and report.first_divergence.node == pid


def test_a_file_of_another_graph_is_matched_by_provenance_only(exported):
    bundle, path = exported
    model = onnx.load(str(path))
    kinds = json.loads({p.key: p.value for p in model.metadata_props}[NODE_KINDS_KEY])
    onnx.helper.set_model_props(model, {NODE_VALUES_KEY: {p.key: p.value for p in model.metadata_props}[NODE_VALUES_KEY],
                                        NODE_KINDS_KEY: json.dumps(kinds[::-1] + ["x"])})
    report = tlb.diff(bundle, against="onnxruntime", onnx_model=model, random=1)
    assert "this graph" not in report.against


# -- coverage in every report -------------------------------------------------------------------

def test_every_report_states_its_coverage(exported):
    bundle, path = exported
    report = tlb.diff(bundle, against="onnxruntime", onnx_model=str(path), random=1)
    c = report.to_dict()["coverage"]
    assert c["compared"] == c["direct"] + c["finer"] == len(bundle.graph.nodes) - sum(c["not_compared"].values())
    json.dumps(report.to_dict(), allow_nan=False)
    n = len(bundle.graph.nodes)
    assert f"compared {n} of {n} IR nodes" in report.summary()
    assert f"agree at every node ({n} of {n})" in report.summary()


def test_an_outputs_only_verdict_says_so():
    module, inputs = CASES["cnn2d"].make()
    bundle = tlb.import_fx(module, inputs)
    report = tlb.diff(bundle, against="torch", module=module, random=1, per_node=False)
    assert report.ok and report.coverage["compared"] == 0
    verdict = report.summary().splitlines()[0]
    assert verdict.endswith("outputs agree (only the outputs were compared)")


def test_a_partial_verdict_names_what_it_left_out():
    module, inputs = CASES["layout"].make()  # a folded index constant: the oracle holds no tensor for it
    bundle = tlb.import_fx(module, inputs)
    report = tlb.diff(bundle, against="torch", module=module, random=1)
    c = report.coverage
    if c["compared"] == c["nodes"]:
        pytest.skip("every node reached")
    assert f"agree on the {c['compared']} of {c['nodes']} nodes compared" in report.summary()
    assert "not compared: " in report.summary()
