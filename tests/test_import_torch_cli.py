"""``torchlean-bridge import``: PyTorch factories via export/fx, checkpoints, ONNX files, usage errors."""

from __future__ import annotations

import textwrap
import warnings

import numpy as np
import pytest
import torch

import torchlean_bridge as tlb
from torchlean_bridge.app.cli import main

warnings.filterwarnings("ignore", category=FutureWarning)

MODEL = textwrap.dedent("""
    import torch
    import torch.nn as nn

    def make():
        torch.manual_seed(1)
        return nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 2))

    def tokens():
        torch.manual_seed(2)
        return nn.Sequential(nn.Embedding(10, 4), nn.Flatten(), nn.Linear(12, 2))

    def not_a_module():
        return 3
""")


@pytest.fixture()
def model_file(tmp_path):
    path = tmp_path / "model.py"
    path.write_text(MODEL)
    return path


def test_import_via_export_writes_the_bundle_and_prints_the_summary(model_file, tmp_path, capsys):
    out = tmp_path / "bundle"
    assert main(["import", f"{model_file}:make", "--input-shape", "3,4", "-o", str(out)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"imported {model_file}:make via export",
        "nodes: 4 (1 input(s), 1 output(s))",
        "parameters: 58 values in 4 tensors (the ABI's slots), 4 keys bound",
        "ops used: gelu, input, linear×2",
        "torchlean.ir.v1 export: blocked by gelu (GELU with erf has no exact v1 form (v1 has no erf): "
        "--approximate gelu=tanh or gelu=sigmoid exports an approximation and states its deviation)",
        f"wrote {out}"]
    assert sorted(p.name for p in out.iterdir()) == ["graph.json", "manifest.json", "payload.safetensors",
                                                      "report.json", "roles.json"]
    bundle = tlb.load(out)
    assert set(bundle.roles) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    torch.manual_seed(1)
    module = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 2)).eval()
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    got = tlb.evaluate(bundle.graph, bundle.payload, x, dtype="float32")[0]
    np.testing.assert_allclose(got, module(torch.from_numpy(x)).detach().numpy(), rtol=1e-5, atol=1e-6)


def test_import_via_fx_with_integer_inputs(model_file, tmp_path, capsys):
    out = tmp_path / "tokens"
    assert main(["import", f"{model_file}:tokens", "--via", "fx", "--input-shape", "2,3:int64", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "ops used: const, gather, input, linear, reshape" in text
    bundle = tlb.load(out)
    assert bundle.graph[bundle.graph.inputs[0]].dtype == "int64"
    assert bundle.graph[bundle.graph.inputs[0]].out_shape == (2, 3)


def test_checkpoint_weights_are_bound_through_the_role_map(model_file, tmp_path, capsys):
    from safetensors.torch import save_file
    weights = {"0.weight": torch.full((8, 4), 0.5), "0.bias": torch.zeros(8), "2.weight": torch.ones(2, 8),
               "2.bias": torch.tensor([1.0, -1.0])}
    save_file(weights, str(tmp_path / "w.safetensors"))
    out = tmp_path / "bound"
    assert main(["import", f"{model_file}:make", "--input-shape", "1,4", "--checkpoint",
                 str(tmp_path / "w.safetensors"), "-o", str(out)]) == 0
    bundle = tlb.load(out)
    for key, tensor in weights.items():
        b = bundle.roles[key]
        np.testing.assert_array_equal(bundle.payload.get(b.node, b.role), tensor.numpy())


def test_onnx_source_goes_to_the_onnx_importer(tmp_path, capsys):
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(tmp_path / "relu.onnx"))
    out = tmp_path / "relu"
    assert main(["import", str(tmp_path / "relu.onnx"), "-o", str(out)]) == 0
    assert "ops used: input, relu" in capsys.readouterr().out
    assert tlb.listing(tlb.load(out).graph) == "0: input parents=[] out=[1, 4]\n1: relu parents=[0] out=[1, 4]"


@pytest.mark.parametrize("argv, message", [
    (["{file}:make", "-o", "{out}"], "needs example inputs: give --input-shape once per input"),
    (["{file}:missing", "--input-shape", "1,4", "-o", "{out}"], "has no callable `missing`"),
    (["{file}:not_a_module", "--input-shape", "1,4", "-o", "{out}"], "returned int, not an nn.Module"),
    (["{file}:make", "--input-shape", "1,x", "-o", "{out}"], "expected comma-separated integers"),
    (["{file}:make", "--input-shape", "1,4:half", "-o", "{out}"], "element type must be one of"),
    (["{dir}/nope.py:make", "--input-shape", "1,4", "-o", "{out}"], "no such file"),
    (["{file}", "-o", "{out}"], "SOURCE must be model.onnx or path/to/file.py:factory"),
])
def test_usage_errors_exit_2_with_a_message(model_file, tmp_path, capsys, argv, message):
    args = [a.format(file=model_file, out=tmp_path / "o", dir=tmp_path) for a in argv]
    assert main(["import", *args]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
