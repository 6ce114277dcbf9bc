"""Checkpoint keys recovered for the role map of torch-exported ONNX files (importers/onnx_keys.py).

Both torch.onnx exporters rename the weights they transpose (``onnx::MatMul_12``, ``val_0``); with
the reference module's state_dict every binding must name a state_dict key whose tensor, under the
binding's transform, is exactly the payload the node reads. Equal-valued tensors are told apart by
the names the file carries, and what the values cannot prove stays as it was, reported.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch.nn as nn

import torchlean_bridge as tlb
from torchlean_bridge.roles import apply_transform

warnings.filterwarnings("ignore")


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1 = nn.Linear(4, 8)
        self.block = nn.Sequential(nn.Linear(8, 6), nn.ReLU(), nn.Linear(6, 6))
        self.head = nn.Linear(6, 6)
        for layer in (self.block[0], self.block[2], self.head):  # equal values: zero biases
            nn.init.zeros_(layer.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(torch.relu(self.l1(x))))


@pytest.fixture(scope="module", params=[False, True], ids=["torchscript", "dynamo"])
def exported(request, tmp_path_factory):
    torch.manual_seed(0)
    module = Net().eval()
    path = tmp_path_factory.mktemp("onnx") / "net.onnx"
    torch.onnx.export(module, (torch.randn(2, 3, 4),), str(path), dynamo=request.param)
    return module, path, tlb.import_onnx(str(path))


def test_exporters_rename_transposed_weights(exported):
    module, _, bundle = exported
    assert not set(module.state_dict()) >= set(bundle.roles)


def test_every_binding_names_a_state_dict_key_whose_tensor_is_the_payload(exported):
    module, path, bundle = exported
    state = module.state_dict()
    recovered = tlb.recover_keys(bundle, state, str(path))
    assert set(recovered.roles) == set(state)  # merged equal constants (zero biases) too: one key per use
    for b in recovered.roles.bindings():
        want = recovered.payload.get(b.node, b.role)
        np.testing.assert_array_equal(apply_transform(b.transform, state[b.key].numpy()), want)
    assert recovered.graph == bundle.graph and recovered.payload == bundle.payload
    assert "unrecovered_keys" not in recovered.report, recovered.report
    assert set(recovered.report["recovered_keys"].values()) <= set(state)
    for key in state:  # each layer's tensors bound to that layer's node
        nodes = {b.node for b in recovered.roles.uses(key)}
        assert len(nodes) == 1, (key, nodes)
    layer_of = {b.key.rsplit(".", 1)[0]: b.node for b in recovered.roles.bindings() if b.key.endswith("weight")}
    assert all(layer_of[b.key.rsplit(".", 1)[0]] == b.node for b in recovered.roles.bindings())


def test_without_the_files_names_equal_values_stay_ambiguous_and_are_reported(exported):
    module, _, bundle = exported
    state = dict(module.state_dict())
    state["spare.bias"] = torch.zeros(6)  # a fourth zero vector no name points at
    recovered = tlb.recover_keys(bundle, state)  # no file: only the bundle's node names
    ambiguous = recovered.report.get("unrecovered_keys", {})
    layer_of = {b.node: b.key.rsplit(".", 1)[0] for b in recovered.roles.bindings() if b.key.endswith("weight")}
    assert set(layer_of.values()) == {"l1", "block.0", "block.2", "head"}  # weights are told apart by value
    for b in recovered.roles.bindings():
        np.testing.assert_array_equal(apply_transform(b.transform, state[b.key].numpy()),
                                      recovered.payload.get(b.node, b.role))
        if b.key.endswith("bias") and b.key != layer_of[b.node] + ".bias":
            assert "tensors of the reference have this value" in ambiguous[b.key], (b, ambiguous)


def test_a_tensor_the_reference_lacks_keeps_its_name_and_is_reported(exported):
    module, path, bundle = exported
    state = {k: v for k, v in module.state_dict().items() if k != "l1.weight"}
    recovered = tlb.recover_keys(bundle, state, str(path))
    missing = [k for k, why in recovered.report["unrecovered_keys"].items() if why.startswith("no tensor")]
    assert len(missing) == 1 and missing[0] in bundle.roles


class Mlp(nn.Module):
    """Two same-shaped biases a checkpoint can exchange unnoticed (the seed chapter's case)."""

    def __init__(self) -> None:
        super().__init__()
        self.l1, self.l2 = nn.Linear(4, 6), nn.Linear(6, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l2(torch.relu(self.l1(x)))


@pytest.fixture(scope="module", params=[False, True], ids=["torchscript", "dynamo"])
def mlp_onnx(request, tmp_path_factory):
    torch.manual_seed(1)
    module = Mlp().eval()
    path = tmp_path_factory.mktemp("mlp") / "mlp.onnx"
    torch.onnx.export(module, (torch.randn(2, 3, 4),), str(path), dynamo=request.param)  # 3-d: MatMul renames
    return module, path


def test_import_with_a_reference_names_the_state_dict_keys(mlp_onnx):
    module, path = mlp_onnx
    state = module.state_dict()
    assert not set(state) >= set(tlb.import_onnx(str(path)).roles)
    bundle = tlb.import_onnx(str(path), reference=module)
    assert set(bundle.roles) == set(state)
    for key in state:
        b = bundle.roles[key]
        expected = apply_transform(b.transform, state[key].numpy())
        np.testing.assert_array_equal(bundle.payload.get(b.node, b.role), expected)


def test_audit_of_an_onnx_bundle_names_the_swapped_keys(mlp_onnx):
    module, path = mlp_onnx
    swapped = {k: v.clone() for k, v in module.state_dict().items()}
    swapped["l1.bias"], swapped["l2.bias"] = swapped["l2.bias"].clone(), swapped["l1.bias"].clone()
    report = tlb.audit(tlb.import_onnx(str(path)), swapped, reference=module)
    assert [f.keys for f in report.swaps] == [("l1.bias", "l2.bias")]


def test_cli_import_with_a_checkpoint_binds_an_onnx_file_by_its_keys(mlp_onnx, tmp_path):
    import subprocess
    import sys
    from pathlib import Path
    from safetensors.torch import save_file
    module, path = mlp_onnx
    ckpt = tmp_path / "w.safetensors"
    save_file(module.state_dict(), str(ckpt))
    out = tmp_path / "bundle"
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run([sys.executable, "-m", "torchlean_bridge", "import", str(path), "-o", str(out),
                           "--checkpoint", str(ckpt), "--quiet"], capture_output=True, text=True, cwd=root)
    assert proc.returncode == 0, proc.stderr
    assert set(tlb.load(out).roles) == set(module.state_dict())
