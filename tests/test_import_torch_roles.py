"""Role maps, provenance, folding and the errors of the torch importers."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torchlean_bridge as tlb
from torchlean_bridge.errors import UnsupportedError
from torchlean_bridge.roles import Binding
from torchlean_bridge.seed import SEED_WEIGHTS, seed_mlp_graph
from tests.model_zoo import CASES, cases
from tests.test_core_seed import SEED_LISTING

warnings.filterwarnings("ignore", category=FutureWarning)

IMPORTERS = {"fx": tlb.import_fx, "export": tlb.import_export,
             "decomposed": lambda m, x: tlb.import_export(m, x, decompose=True)}


@pytest.mark.parametrize("via", ["fx", "export"])
def test_seed_mlp_is_the_chapter_graph_with_its_role_map(via):
    module, inputs = CASES["seed_mlp"].make()
    b = IMPORTERS[via](module, inputs)
    assert tlb.listing(b.graph) == SEED_LISTING
    assert b.graph == seed_mlp_graph()
    assert b.roles.bindings() == [Binding("l1.weight", 1, "weight"), Binding("l1.bias", 1, "bias"),
                                  Binding("l2.weight", 3, "weight"), Binding("l2.bias", 3, "bias")]
    for key, binding in b.roles.items():
        np.testing.assert_array_equal(b.payload.get(binding.node, binding.role),
                                      SEED_WEIGHTS[key].astype(np.float32))
    assert tlb.evaluate(b.graph, b.payload, inputs[0].numpy())[0] == pytest.approx(
        float(module(inputs[0]).detach()), abs=1e-7)


def test_decomposed_seed_mlp_binds_the_same_keys_through_permute_and_addmm():
    module, inputs = CASES["seed_mlp"].make()
    b = IMPORTERS["decomposed"](module, inputs)
    assert [(x.key, x.role, x.transform, b.graph[x.node].kind) for x in b.roles.bindings()] == [
        ("l1.weight", "weight", None, "linear"), ("l1.bias", "bias", None, "linear"),
        ("l2.weight", "weight", None, "linear"), ("l2.bias", "bias", None, "linear")]


class Conv1DStyle(nn.Module):
    """GPT-2's Conv1D: weight stored [in, out], applied with addmm; plus x @ W.t() + b."""

    def __init__(self) -> None:
        super().__init__()
        self.c_fc = nn.Parameter(torch.randn(4, 6))
        self.c_bias = nn.Parameter(torch.randn(6))
        self.proj = nn.Parameter(torch.randn(3, 6))
        self.proj_bias = nn.Parameter(torch.randn(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.addmm(self.c_bias, x, self.c_fc)
        return torch.tanh(h) @ self.proj.t() + self.proj_bias


@pytest.mark.parametrize("via", ["fx", "export", "decomposed"])
def test_weights_used_through_transposes_are_bound_with_their_transform(via):
    b = IMPORTERS[via](Conv1DStyle().eval(), (torch.randn(2, 4),))
    assert b.graph.ops_used() == {"input": 1, "linear": 2, "tanh": 1}
    assert [(x.key, x.role, x.transform) for x in b.roles.bindings()] == [
        ("c_fc", "weight", "transpose"), ("c_bias", "bias", None),
        ("proj", "weight", None), ("proj_bias", "bias", None)]
    assert b.payload.get(b.roles["c_fc"].node, "weight").shape == (6, 4)


@pytest.mark.parametrize("via", ["fx", "export"])
def test_tied_weights_are_bound_once_per_use_under_every_key(via):
    module, inputs = CASES["tied_lm"].make()
    b = IMPORTERS[via](module, inputs)
    uses = b.roles.uses("wte.weight")
    assert [(u.role, b.graph[u.node].kind) for u in uses] == [("values", "const"), ("weight", "linear")]
    assert [(u.node, u.role) for u in b.roles.uses("lm_head.weight")] == [(u.node, u.role) for u in uses]
    assert b.report["tied_tensors"] == [["lm_head.weight", "wte.weight"]]


@pytest.mark.parametrize("via", ["fx", "export"])
def test_constants_fold_and_broadcasts_are_explicit(via):
    module, inputs = CASES["embedding"].make()
    b = IMPORTERS[via](module, inputs)
    consts = [n for n in b.graph if n.kind == "const"]
    folded = [n for n in consts if n.source.folded]
    assert [n.dtype for n in folded] == ["int64"]  # the position ids, computed at import time
    assert all(b.roles.for_node(n.id) == [] for n in folded)
    assert {n.kind for n in b.graph} <= {"input", "const", "gather", "add", "broadcast_to", "reduce_mean",
                                         "linear"}
    adds = [n for n in b.graph if n.kind == "add"]
    assert all(b.graph[p].out_shape == n.out_shape for n in adds for p in n.parents)
    assert any(n.kind == "broadcast_to" for n in b.graph)


def test_scalars_and_tensor_attributes_become_consts():
    module, inputs = CASES["arithmetic"].make()
    b = tlb.import_fx(module, inputs)
    scalars = [n for n in b.graph if n.kind == "const" and n.out_shape == ()]
    assert len(scalars) >= 4 and all(n.source.folded for n in scalars)
    assert [b.graph[x.node].kind for x in b.roles.bindings()] == ["const"] * 2
    assert set(b.roles) == set(module.state_dict()) == {"scale", "offset"}  # `const` is no state_dict key
    assert b.report["constants"] == ["const"]


@pytest.mark.parametrize("via", ["fx", "export"])
def test_role_keys_are_state_dict_keys_so_the_module_state_dict_binds_strictly(via):
    for case in cases(importer=via, slow=False):
        module, inputs = case.make()
        b = IMPORTERS[via](module, inputs)
        state = module.state_dict()
        assert set(b.roles) <= set(state), case.name
        _, report = tlb.bind_checkpoint(b, state)
        assert report.ok, (case.name, str(report))


class NonPersistent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("scale", torch.tensor([1.0, 2.0, 3.0, 4.0]), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * self.scale


@pytest.mark.parametrize("via", ["fx", "export"])
def test_non_persistent_buffers_fold_into_unkeyed_consts(via):
    module, x = NonPersistent().eval(), torch.randn(2, 4)
    b = IMPORTERS[via](module, (x,))
    assert set(b.roles) == {"lin.weight", "lin.bias"}
    assert b.report["constants"] == ["scale"]
    bound, report = tlb.bind_checkpoint(b, module.state_dict())
    assert report.ok, str(report)
    got = tlb.evaluate(bound.graph, bound.payload, x.numpy(), dtype="float32")[0]
    np.testing.assert_allclose(got, module(x).detach().numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("via", ["fx", "export"])
def test_dropout_and_identity_disappear_in_eval_mode(via):
    module, inputs = CASES["mlp_activations"].make()
    b = IMPORTERS[via](module, inputs)
    assert sum(1 for n in b.graph if n.kind == "linear") == 8
    assert len(b.graph) == 1 + 8 + 8  # input, eight linears, eight activations (dropout/identity gone)


def test_every_ir_node_keeps_its_provenance():
    module, inputs = CASES["residual"].make()
    fx, ex = tlb.import_fx(module, inputs), tlb.import_export(module, inputs)
    for b, framework in ((fx, "fx"), (ex, "export")):
        assert all(n.source is not None and n.source.framework == framework for n in b.graph)
    conv = [n for n in fx.graph if n.kind == "conv"]
    assert [n.source.name for n in conv] == ["_0", "_1_conv1", "_1_conv2", "_2_conv1", "_2_conv2"]
    assert [n.source.module for n in conv] == ["0", "1.conv1", "1.conv2", "2.conv1", "2.conv2"]
    ex_conv = [n for n in ex.graph if n.kind == "conv"]
    assert [n.source.module for n in ex_conv] == ["0", "1.conv1", "1.conv2", "2.conv1", "2.conv2"]
    assert all(n.source.target == "aten.conv2d.default" for n in ex_conv)
    adds = [n for n in ex.graph if n.kind == "add"]
    assert all(n.source.location and "model_zoo.py:" in n.source.location for n in adds)


class Unsupported(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        return (torch.i0(y) + torch.logcumsumexp(y, 1)).xlogy(2)  # xlogy reads the other two


@pytest.mark.parametrize("via, targets", [
    ("fx", ["torch._VariableFunctionsClass.i0", "torch._VariableFunctionsClass.logcumsumexp", "Tensor.xlogy"]),
    ("export", ["aten.i0.default", "aten.logcumsumexp.default", "aten.xlogy.Scalar_Other"])])
def test_unsupported_targets_are_reported_together(via, targets):
    with pytest.raises(UnsupportedError) as e:
        IMPORTERS[via](Unsupported().eval(), (torch.randn(2, 4),))
    assert [item["target"] for item in e.value.items] == targets
    assert [item["name"] for item in e.value.items] == ["i0", "logcumsumexp", "xlogy"]
    assert all(item["location"].endswith(f"test_import_torch_roles.py:{line}")
               for item, line in zip(e.value.items, [_line("torch.i0")] * 3))
    assert str(e.value).startswith(f"{via} import: 3 unsupported targets:\n  i0: {targets[0]}")


def _line(text: str) -> int:
    with open(__file__) as f:
        return next(i for i, line in enumerate(f, 1) if text in line and "return" in line)


def test_unlowerable_arguments_name_the_module_and_reason():
    module = nn.Sequential(nn.Linear(4, 8), nn.Unflatten(1, (2, 4)), nn.Conv1d(2, 2, 3, padding=1,
                                                                                 padding_mode="circular"))
    with pytest.raises(UnsupportedError) as e:
        tlb.import_fx(module.eval(), (torch.randn(1, 4),))
    assert e.value.items[0]["module"] == "2"
    assert "convolution padding_mode='circular' (only 'zeros' is supported)" in e.value.items[0]["reason"]


@pytest.mark.parametrize("layer, named", [(nn.Dropout(), "1 (Dropout)"), (nn.BatchNorm1d(2), "1 (BatchNorm1d)"),
                                          (nn.InstanceNorm1d(2, track_running_stats=True), "1 (InstanceNorm1d)")])
def test_training_mode_is_refused_naming_the_layers_that_depend_on_it(layer, named):
    module = nn.Sequential(nn.Linear(2, 2), layer)
    for importer in (tlb.import_fx, tlb.import_export):
        with pytest.raises(tlb.BridgeError, match=rf"training mode, where {re.escape(named)} compute something "
                                                  rf"else; call model\.eval\(\)"):
            importer(module, (torch.randn(3, 2, 4) if "Instance" in named else torch.randn(3, 2),))


def test_training_mode_without_a_mode_dependent_layer_imports_with_a_note():
    module = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Dropout(p=0.0), nn.Linear(3, 1))
    x = torch.randn(4, 2)
    for importer in (tlb.import_fx, tlb.import_export):
        b = importer(module, (x,))
        assert module.training and any("training mode; no layer of it depends on the mode" in n
                                       for n in b.report["notes"])
        np.testing.assert_allclose(tlb.evaluate(b.graph, b.payload, [x.double().numpy()])[0],
                                   module.double()(x.double()).detach().numpy(), rtol=1e-12)
        module.float()


class Counter(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("calls", torch.zeros(1))
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.lin(x) * self.calls


def test_mutated_buffers_are_refused():
    module = Counter().eval()
    with pytest.raises(tlb.BridgeError, match="mutates calls"):
        tlb.import_fx(module, (torch.randn(2, 4),))
    assert float(module.calls) == 0.0  # the trace's own update was undone
    with pytest.raises(tlb.BridgeError, match="in-place update of `calls`"):
        tlb.import_export(module, (torch.randn(2, 4),))


def test_dynamic_shapes_are_refused():
    module = nn.Sequential(nn.Linear(4, 4)).eval()
    ep = torch.export.export(module, (torch.randn(3, 4),), dynamic_shapes=({0: torch.export.Dim("batch")},))
    with pytest.raises(tlb.BridgeError, match=r"is dynamic; export with static shapes"):
        tlb.import_export(ep)


def test_untraceable_control_flow_points_to_torch_export():
    class Flow(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x if x.sum() > 0 else -x

    with pytest.raises(tlb.BridgeError, match="use import_export"):
        tlb.import_fx(Flow().eval(), (torch.randn(2),))


def test_exported_program_imports_as_is_and_decomposed():
    module, inputs = CASES["cnn1d"].make()
    ep = torch.export.export(module, inputs)
    plain, core = tlb.import_export(ep), tlb.import_export(ep, decompose=True)
    assert set(plain.roles) == set(core.roles)
    want = module(*inputs).detach().numpy()
    for b in (plain, core):
        got = tlb.evaluate(b.graph, b.payload, [x.numpy() for x in inputs], dtype="float32")[0]
        assert np.max(np.abs(got - want)) <= 1e-5 * max(1.0, float(np.abs(want).max()))


def test_inplace_relu_on_a_shared_value_is_seen_by_later_readers():
    class M(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = x * 1.0
            F.relu(y, inplace=True)
            return y + x

    x = torch.randn(3, 4)
    b = tlb.import_fx(M().eval(), (x,))
    got = tlb.evaluate(b.graph, b.payload, x.numpy(), dtype="float32")[0]
    np.testing.assert_allclose(got, (torch.relu(x) + x).numpy(), rtol=1e-6)


@pytest.mark.parametrize("via", ["fx", "export"])
def test_imports_are_deterministic(via, tmp_path):
    module, inputs = CASES["sdpa_mask"].make()
    first, second = IMPORTERS[via](module, inputs), IMPORTERS[via](module, inputs)
    assert first == second
    assert [n.source for n in first.graph] == [n.source for n in second.graph]
    tlb.save(first, tmp_path / "a")
    tlb.save(second, tmp_path / "b")
    for name in ("graph.json", "payload.safetensors", "roles.json", "report.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


@pytest.mark.parametrize("via", ["fx", "export", "decomposed"])
def test_a_layer_applied_twice_binds_its_keys_once_per_use(via):
    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.shared = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.shared(torch.tanh(self.shared(x)))

    b = IMPORTERS[via](Twice().eval(), (torch.randn(2, 4),))
    linears = [n.id for n in b.graph if n.kind == "linear"]
    assert len(linears) == 2
    for key, role in (("shared.weight", "weight"), ("shared.bias", "bias")):
        assert [(u.node, u.role) for u in b.roles.uses(key)] == [(linears[0], role), (linears[1], role)]
