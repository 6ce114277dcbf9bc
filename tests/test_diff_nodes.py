"""Node coverage of the diff: our own ONNX export annotates every value with its IR node, so a
bundle diffed against its exported file compares every node (absorbed broadcasts through the finer
oracle), and a payload changed after the export is found at exactly its node."""

import json

import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")

import torchlean_bridge as tlb  # noqa: E402
from exporters.onnx import NODE_KINDS_KEY, NODE_VALUES_KEY, node_value_names  # noqa: E402
from tests.diff_routes import ROUTES, route as route_of  # noqa: E402
from tests.model_zoo import CASES  # noqa: E402
from tests.test_diff import with_node, with_payload  # noqa: E402

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
    """A GELU node stripped of its provenance: no counterpart, and no numpy primitive for erf."""
    from torchlean_bridge.graph import Graph
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.GELU(), torch.nn.Linear(5, 2)).eval()
    b = tlb.import_fx(m, (torch.zeros(3, 4),))
    gelu = next(n.id for n in b.graph.nodes if n.kind == "gelu")
    nodes = [n.with_(source=None) if n.id == gelu else n for n in b.graph.nodes]
    stripped = tlb.Bundle(Graph(nodes, b.graph.inputs, b.graph.outputs), b.payload, b.roles, b.report)
    report = tlb.diff(stripped, against="torch", module=m, random=1)
    c = report.coverage
    assert c["compared"] == c["nodes"] - 1, str(report)
    summary = report.summary()
    assert f"agree on the {c['compared']} of {c['nodes']} nodes compared" in summary
    assert "not compared: 1 node(s): no finer oracle for gelu" in summary


# -- the finer oracle on attention ----------------------------------------------------------------

@pytest.fixture(scope="module")
def encoder():
    module, inputs = CASES["encoder_layer_batch_first"].make()
    return module, inputs, tlb.import_export(module, inputs)


def test_the_attention_core_is_compared_through_the_finer_oracle(encoder):
    module, inputs, bundle = encoder
    report = tlb.diff(bundle, against="torch", module=module, random=2)
    assert report.ok, str(report)
    g = bundle.graph
    finer = {g.nodes[r.node].kind for r in report.nodes if r.via and r.status == "ok"}
    assert {"matmul", "softmax", "transpose"} <= finer | {g.nodes[r.node].kind for r in report.nodes
                                                         if r.status == "ok" and not r.via}
    left = [r for r in report.nodes if r.status == "no counterpart"]
    assert len(left) <= 1 and all(g.nodes[r.node].kind == "const" for r in left), str(report)


def test_a_wrong_softmax_axis_inside_attention_surfaces_at_the_attention_value(encoder):
    """The finer oracle recomputes an inner node's IR definition from the oracle's parent values: it
    checks our semantics node by node; an attribute the lowering got wrong surfaces at the node that
    holds the framework op's value (the first place the two executions part ways)."""
    module, inputs, bundle = encoder
    g = bundle.graph
    softmax = next(n for n in g.nodes if n.kind == "softmax")
    bad = with_node(bundle, softmax.id, axis=softmax.attrs["axis"] - 1)
    report = tlb.diff(bad, against="torch", module=module, random=1)
    first = report.first_divergence
    assert first is not None and first.node > softmax.id, str(report)
    assert g.nodes[first.node].source.name == g.nodes[softmax.id].source.target.split(".")[1]
    row = next(r for r in report.nodes if r.node == softmax.id)
    assert row.status == "ok" and row.counterpart == "finer oracle" and "numpy softmax" in row.via


def test_a_folded_constant_is_checked_against_the_literal_it_came_from():
    module, inputs = CASES["mha_batch_first"].make()
    bundle = tlb.import_export(module, inputs)
    report = tlb.diff(bundle, against="torch", module=module, random=1)
    assert report.ok, str(report)
    row = next(r for r in report.nodes if r.via and "literal argument" in r.via)
    assert bundle.graph.nodes[row.node].kind == "const" and row.status == "ok"
    # a wrong fold equals no literal: the constant is then not compared (a node has many unrelated
    # literals), and the divergence shows at its first compared consumer
    bad = with_payload(bundle, {(row.node, "values"): bundle.payload.get(row.node, "values") * 1.5})
    report = tlb.diff(bad, against="torch", module=module, random=1)
    const = next(r for r in report.nodes if r.node == row.node)
    assert const.status == "no counterpart" and "no reference tensor or equal framework literal" in const.problem
    first = report.first_divergence
    assert first is not None and first.node > row.node, str(report)


# -- every node, every route ----------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("name", ["encoder_layer_batch_first", "cnn2d", "residual"])
@pytest.mark.parametrize("route", ROUTES)
def test_every_node_is_compared_on_every_route(name, route):
    module, inputs = CASES[name].make()
    bundle, kw = route_of(route, module, inputs)
    report = tlb.diff(bundle, random=2, **kw)
    assert report.ok, str(report)
    n = len(bundle.graph.nodes)
    assert report.coverage["compared"] == n and f"agree at every node ({n} of {n})" in report.summary(), str(report)
