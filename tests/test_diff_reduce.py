"""``diff --reduce``: the smallest subgraph that still diverges, verified, written atomically, and
its reproduction line really reproduces."""

import json
import shlex

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")

import torchlean_bridge as tlb  # noqa: E402
from tests.model_zoo import CASES  # noqa: E402
from tests.test_diff import with_node, with_payload  # noqa: E402


@pytest.fixture(scope="module")
def resnet():
    module, inputs = CASES["residual"].make()  # three residual blocks of convs and batch norms
    return module, inputs, tlb.import_fx(module, inputs)


def test_a_perturbed_weight_deep_in_a_resnet_reduces_to_its_conv(resnet, tmp_path):
    from torchlean_bridge.app.cli import main
    module, inputs, bundle = resnet
    deep = [n.id for n in bundle.graph.nodes if n.kind == "conv"][-1]
    bad = with_payload(bundle, {(deep, "weight"): bundle.payload.get(deep, "weight") * 1.01})
    folder = tmp_path / "reduced"
    report = tlb.diff(bad, against="torch", module=module, random=2, reduce=folder)
    assert report.first_divergence.node == deep
    info = json.loads((folder / "reduced.json").read_text())
    assert info == json.loads(json.dumps(report.reduced))
    assert info["node"] == deep and info["nodes"] <= 3 and info["reproduces_against_expected"]
    assert info["reproduces_with_onnxruntime"] is True
    reduced = tlb.load(folder / "bundle")
    assert [n.kind for n in reduced.graph.nodes] == ["input", "conv"]
    assert [t["diverges"] for t in info["tried"]][:1] == [True]  # the conv alone reproduces: nothing grown
    assert np.load(folder / "expected.npy").shape == tuple(bundle.graph.nodes[deep].out_shape)
    args = shlex.split(info["reproduce"])
    assert args[0] == "torchlean-bridge" and main([*args[1:], "--quiet"]) == 1  # it reproduces
    # the unperturbed bundle, same inputs and file: agrees (the reproduction is the weight, nothing else)
    good = with_payload(reduced, {(1, "weight"): bundle.payload.get(deep, "weight")})
    again = tlb.diff(good, against="onnxruntime", onnx_model=str(folder / "reduced.onnx"),
                     inputs=[np.load(folder / "input_0.npy")])
    assert again.ok, str(again)


def test_a_lowering_slip_reproduces_against_the_captured_value(resnet, tmp_path):
    module, inputs, bundle = resnet
    bn = next(n.id for n in bundle.graph.nodes if n.kind == "batch_norm_eval")
    bad = with_node(bundle, bn, eps=0.5)
    report = tlb.diff(bad, against="torch", module=module, random=1, reduce=tmp_path / "r")
    assert report.first_divergence.node == bn
    info = report.reduced
    assert info["reproduces_against_expected"] and info["nodes"] <= 3
    # onnxruntime runs our IR's (wrong) eps too: it agrees, and the report says why
    assert info["reproduces_with_onnxruntime"] is False and info["reproduce"] is None
    assert "expected.npy" in info["why_onnx_may_agree"]


def test_nothing_is_written_without_a_divergence(resnet, tmp_path):
    module, inputs, bundle = resnet
    report = tlb.diff(bundle, against="torch", module=module, random=1, reduce=tmp_path / "r")
    assert report.ok and report.reduced is None and not (tmp_path / "r").exists()
    assert report.of_kind("reduced")[0].message.startswith("nothing to reduce")


def test_a_foreign_folder_is_never_replaced(resnet, tmp_path):
    module, inputs, bundle = resnet
    deep = [n.id for n in bundle.graph.nodes if n.kind == "conv"][-1]
    bad = with_payload(bundle, {(deep, "weight"): bundle.payload.get(deep, "weight") * 1.01})
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "notes.txt").write_text("mine")
    report = tlb.diff(bad, against="torch", module=module, random=1, reduce=tmp_path / "r")
    assert report.reduced is None and "refusing to replace" in report.of_kind("reduce-failed")[0].message
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == ["notes.txt"]
    # an earlier reduce folder is replaced whole
    report = tlb.diff(bad, against="torch", module=module, random=1, reduce=tmp_path / "s")
    report = tlb.diff(bad, against="torch", module=module, random=1, reduce=tmp_path / "s")
    assert report.reduced is not None and (tmp_path / "s" / "reduced.json").is_file()


def test_cli_reduce_writes_the_folder_and_prints_the_reproduction(resnet, tmp_path, capsys):
    from torchlean_bridge.app.cli import main
    module, inputs, bundle = resnet
    deep = [n.id for n in bundle.graph.nodes if n.kind == "conv"][-1]
    bad = with_payload(bundle, {(deep, "weight"): bundle.payload.get(deep, "weight") * 1.01})
    tlb.save(bad, tmp_path / "bad")
    (tmp_path / "m.py").write_text("from tests.model_zoo import CASES\n"
                                   "def make():\n    return CASES['residual'].make()[0]\n")
    rc = main(["diff", str(tmp_path / "bad"), "--reference", f"{tmp_path / 'm.py'}:make", "--random", "1",
               "--reduce", str(tmp_path / "r"), "--quiet"])
    assert rc == 1
    out = capsys.readouterr().out
    assert "reduced to 2 node(s); reproduce: torchlean-bridge diff" in out
    assert json.loads((tmp_path / "r" / "reduced.json").read_text())["node"] == deep


def test_an_accumulated_divergence_grows_the_reduced_case_upstream(tmp_path):
    """Every weight of a linear/ReLU chain off by the same tiny factor: each linear stays within its
    budget fed the oracle's parent values, a later one exceeds it on what the earlier ones handed on.
    The node alone does not reproduce, so the reduction grows upstream until it does, prunes what is
    not needed, and the printed command reproduces against onnxruntime."""
    from torchlean_bridge.app.cli import main
    torch.manual_seed(0)
    layers = [layer for _ in range(4) for layer in (torch.nn.Linear(8, 8, bias=False), torch.nn.ReLU())]
    module = torch.nn.Sequential(*layers).eval()
    bundle = tlb.import_fx(module, (torch.zeros(2, 8),))
    linears = [n.id for n in bundle.graph.nodes if n.kind == "linear"]
    grown = None
    for k, factor in enumerate((6e-6, 8e-6, 1e-5)):  # the window where no single linear exceeds alone
        bad = with_payload(bundle, {(i, "weight"): bundle.payload.get(i, "weight") * (1 + factor) for i in linears})
        report = tlb.diff(bad, against="torch", module=module, random=2, reduce=tmp_path / f"r{k}")
        if report.reduced is not None and len(report.reduced["region"]) >= 2:
            grown, folder = report, tmp_path / f"r{k}"
            break
    assert grown is not None, "no factor gave an accumulated divergence"
    info = json.loads((folder / "reduced.json").read_text())
    first = grown.first_divergence.node
    assert info["node"] == first and info["region"][-1] == first and first != linears[0]
    assert info["tried"][0] == {**info["tried"][0], "nodes": 2, "diverges": False}  # the node alone: within budget
    assert info["comparison"]["max_abs"] > info["comparison"]["budget"] and info["nodes"] <= 6
    reduced = tlb.load(folder / "bundle")
    assert [n.kind for n in reduced.graph.nodes].count("linear") >= 2  # two perturbed linears are needed
    assert len(reduced.graph.inputs) == 1 and reduced.graph.nodes[reduced.graph.outputs[0]].kind == "linear"
    args = shlex.split(info["reproduce"])
    assert args[0] == "torchlean-bridge" and main([*args[1:], "--quiet"]) == 1  # it reproduces
    # every tried subgraph smaller than the result (the pruning's attempts) agreed
    assert all(not t["diverges"] for t in info["tried"] if t["nodes"] < info["nodes"])
