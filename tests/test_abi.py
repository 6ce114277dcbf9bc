"""The parameter ABI (the seed chapter's MLP 2-3-1) and checkpoint binding with its report."""

import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn as nn

from exporters.folder import save
from importers.builder import GraphBuilder
from semantics.evaluate import evaluate
from torchlean_bridge.app.abi import abi, bind_checkpoint, format_abi
from torchlean_bridge.bundle import Bundle
from torchlean_bridge.graph import Graph, Node
from torchlean_bridge.roles import Binding, RoleMap
from torchlean_bridge.seed import BIAS_PAIR, bias_pair_bundle
from tests.conftest import ROOT


def mlp_2_3_1() -> Bundle:
    """nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1)) as IR, its state_dict keys bound."""
    g = Graph([Node(0, [], "input", [2]), Node(1, [0], "linear", [3]), Node(2, [1], "relu", [3]),
               Node(3, [2], "linear", [1])])
    roles = RoleMap([Binding("0.weight", 1, "weight"), Binding("0.bias", 1, "bias"),
                     Binding("2.weight", 3, "weight"), Binding("2.bias", 3, "bias")])
    return Bundle(g, roles=roles)


def kinds(report, kind):
    return [f for f in report.findings if f.kind == kind]


def test_seed_mlp_abi_matches_the_chapter_and_torch():
    slots = abi(mlp_2_3_1())
    assert slots.shapes == [[3, 2], [3], [1, 3], [1]]  # the chapter's parameter ABI
    assert slots.num_parameters == 13
    net = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1))
    assert [s.shape for s in slots] == [tuple(p.shape) for p in net.parameters()]
    assert [s.key for s in slots] == list(net.state_dict())  # ['0.weight', '0.bias', '2.weight', '2.bias']
    assert [(s.node, s.op, s.role, s.dtype) for s in slots] == [
        (1, "linear", "weight", "float"), (1, "linear", "bias", "float"),
        (3, "linear", "weight", "float"), (3, "linear", "bias", "float")]
    assert slots.ambiguity_groups() == []


def test_seed_abi_table(tmp_path):
    text = format_abi(abi(mlp_2_3_1()))
    assert text.splitlines()[0].split() == ["slot", "node", "op", "role", "shape", "dtype", "params", "key"]
    assert text.splitlines()[1].split() == ["0", "1", "linear", "weight", "[3,", "2]", "float", "6", "0.weight"]
    assert "total: 4 slots, 13 parameters" in text


def test_abi_command_prints_the_table(tmp_path):
    save(bias_pair_bundle(), tmp_path / "b")
    out = subprocess.run([sys.executable, "-m", "torchlean_bridge", "abi", str(tmp_path / "b")], cwd=ROOT,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "total: 4 slots, 24 parameters" in out.stdout
    assert "[3] float: 0.bias, 2.bias" in out.stdout
    assert "[3, 3] float: 0.weight, 2.weight" in out.stdout


def test_bias_pair_ambiguity_groups():
    groups = abi(bias_pair_bundle()).ambiguity_groups()
    assert [g.keys for g in groups] == [("0.weight", "2.weight"), ("0.bias", "2.bias")]


def test_seed_swap_in_abi_order_and_exchanged():
    """ReLU(x + b1) + b2, identity weights, zero input: [1, 0, 0] in ABI order, [0, 0, 0] exchanged."""
    b = bias_pair_bundle()
    swapped = dict(BIAS_PAIR, **{"0.bias": BIAS_PAIR["2.bias"], "2.bias": BIAS_PAIR["0.bias"]})
    right, r1 = bind_checkpoint(b, BIAS_PAIR)
    wrong, r2 = bind_checkpoint(b, swapped)
    z = np.zeros(3)
    assert evaluate(right.graph, right.payload, z)[0].tolist() == [1.0, 0.0, 0.0]
    assert evaluate(wrong.graph, wrong.payload, z)[0].tolist() == [0.0, 0.0, 0.0]
    assert r1.ok and r2.ok  # keys, shapes and dtypes cannot see the swap ...
    for r in (r1, r2):  # ... which is why the ambiguity groups are always listed
        assert [f.keys for f in kinds(r, "ambiguity")] == [("0.weight", "2.weight"), ("0.bias", "2.bias")]
        assert [g.keys for g in r.ambiguity_groups] == [("0.weight", "2.weight"), ("0.bias", "2.bias")]


def test_binding_a_torch_state_dict_reproduces_torch():
    torch.manual_seed(1)
    net = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1))
    bound, report = bind_checkpoint(mlp_2_3_1(), net.state_dict())
    assert report.ok, str(report)
    x = np.array([0.5, 0.8])
    want = net.double()(torch.from_numpy(x)).detach().numpy()
    np.testing.assert_allclose(evaluate(bound.graph, bound.payload, x)[0], want, rtol=1e-12)


def test_every_mismatch_is_reported():
    sd = {k: torch.tensor(v) for k, v in BIAS_PAIR.items()}
    del sd["2.weight"]
    sd["0.weight"] = torch.ones(3, 2)
    sd["2.bias"] = torch.tensor([1.0, float("nan"), float("inf")])
    sd["extra.weight"] = torch.ones(2)
    b = bias_pair_bundle()
    bound, report = bind_checkpoint(b, sd)
    assert not report.ok
    assert [f.keys for f in kinds(report, "missing")] == [("2.weight",)]
    assert [f.keys for f in kinds(report, "unexpected")] == [("extra.weight",)]
    (shape,) = kinds(report, "shape")
    assert shape.message.startswith("`0.weight` has shape [3, 2], slot 0 (node 1 linear `weight` [3, 3]) expects [3, 3]")
    (bad,) = kinds(report, "non_finite")
    assert bad.keys == ("2.bias",) and bad.data == {"nan": 1, "inf": 1}
    # slots that could not be bound keep the previous tensor, and the report says so
    np.testing.assert_array_equal(bound.payload.get(1, "weight"), b.payload.get(1, "weight"))
    assert "kept the bundle's previous tensor" in shape.message
    # the original bundle is untouched
    np.testing.assert_array_equal(b.payload.get(3, "bias"), BIAS_PAIR["2.bias"])


def test_strict_false_downgrades_only_key_findings():
    sd = {k: v for k, v in BIAS_PAIR.items() if k != "2.bias"}
    sd["extra"] = np.ones(1)
    _, strict = bind_checkpoint(bias_pair_bundle(), sd)
    _, lenient = bind_checkpoint(bias_pair_bundle(), sd, strict=False)
    assert not strict.ok and lenient.ok
    assert {f.kind for f in lenient.findings if f.severity == "warning"} == {"missing", "unexpected"}
    sd["0.bias"] = np.ones(4)
    assert not bind_checkpoint(bias_pair_bundle(), sd, strict=False)[1].ok  # shape errors stay errors


def test_integer_tensor_for_a_float_slot_is_refused_not_converted():
    sd = dict(BIAS_PAIR, **{"0.bias": np.array([1, 2, 3], np.int64)})
    bound, report = bind_checkpoint(bias_pair_bundle(), sd)
    (f,) = kinds(report, "dtype")
    assert f.keys == ("0.bias",) and not report.ok
    assert bound.payload.get(1, "bias").dtype == np.float64  # the previous float tensor, not a cast


def test_dtype_changes_are_listed():
    sd = {k: v.astype(np.float32) for k, v in BIAS_PAIR.items()}
    bound, report = bind_checkpoint(bias_pair_bundle(), sd)
    (f,) = kinds(report, "dtype_change")
    assert f.data == {"before": "float64", "after": "float32"} and set(f.keys) == set(BIAS_PAIR)
    assert bound.payload.get(1, "weight").dtype == np.float32 and report.ok


def test_transform_is_considered_in_the_shape_check():
    """An ONNX-style [in, out] weight bound with `transpose` lands as [out, in]."""
    g = Graph([Node(0, [], "input", [2]), Node(1, [0], "linear", [3])])
    b = Bundle(g, roles=RoleMap([Binding("W", 1, "weight", "transpose"), Binding("B", 1, "bias")]))
    w = np.arange(6.0).reshape(2, 3)
    bound, report = bind_checkpoint(b, {"W": w, "B": np.zeros(3)})
    assert report.ok, str(report)
    np.testing.assert_array_equal(bound.payload.get(1, "weight"), w.T)
    _, report = bind_checkpoint(b, {"W": w.T, "B": np.zeros(3)})
    assert "(after transform `transpose`: [2, 3])" in kinds(report, "shape")[0].message


def test_bound_consts_are_slots_and_folded_consts_are_not():
    gb = GraphBuilder("builder")
    x = gb.input([3])
    scale = gb.const(np.array([1.0, 2.0, 3.0]), key="scale")
    two = gb.const(np.array([2.0, 2.0, 2.0]), folded=True)
    y = gb.elementwise("add", [gb.elementwise("mul_elem", [x, scale]), two])
    ln = gb.add("layernorm", [y], {"axis": 0})
    gb.param(ln, "weight", np.ones(3), key="ln.weight")
    bundle = gb.finish([ln])
    slots = abi(bundle)
    assert [(s.op, s.role, s.key) for s in slots] == [("const", "values", "scale"),
                                                    ("layernorm", "weight", "ln.weight")]
    assert slots.num_parameters == 6  # the folded const and the absent optional bias are not parameters


def test_tied_weights_fill_every_slot_they_bind():
    g = Graph([Node(0, [], "input", [3]), Node(1, [0], "linear", [3]), Node(2, [1], "linear", [3])])
    b = Bundle(g, roles=RoleMap([Binding("w", 1, "weight"), Binding("b1", 1, "bias"), Binding("w", 2, "weight"),
                                 Binding("b2", 2, "bias")]))
    w = np.arange(9.0).reshape(3, 3)
    bound, report = bind_checkpoint(b, {"w": w, "b1": np.zeros(3), "b2": np.ones(3)})
    assert report.ok and abi(b).keys == ["w", "b1", "b2"]
    np.testing.assert_array_equal(bound.payload.get(2, "weight"), w)


def test_binding_to_a_role_the_node_lacks_is_reported():
    b = bias_pair_bundle()
    b = Bundle(b.graph, b.payload, b.roles.with_binding(Binding("ghost", 2, "weight")))
    _, report = bind_checkpoint(b, dict(BIAS_PAIR, ghost=np.ones(3)))
    assert [f.keys for f in kinds(report, "binding")] == [("ghost",)]
    assert not report.ok


def test_report_json_round_trips_through_json():
    import json
    _, report = bind_checkpoint(bias_pair_bundle(), {"0.bias": np.ones(3)})
    doc = json.loads(json.dumps(report.to_json()))
    assert doc["ok"] is False and {f["kind"] for f in doc["findings"]} >= {"missing"}
    assert str(report).startswith("binding <state_dict>: 4 slots, 24 parameters: FAILED")


@pytest.mark.parametrize("strip", [True, False])
def test_module_prefix_from_data_parallel(tmp_path, strip):
    from importers.checkpoints import load_checkpoint
    torch.save({"module." + k: torch.tensor(v) for k, v in BIAS_PAIR.items()}, tmp_path / "dp.pt")
    ckpt = load_checkpoint(tmp_path / "dp.pt", strip_prefix="module." if strip else None)
    assert bind_checkpoint(bias_pair_bundle(), ckpt)[1].ok is strip


def test_public_names_work_even_after_the_submodules_are_imported():
    import torchlean_bridge as tlb
    import torchlean_bridge.app.abi  # noqa: F401  (must not shadow the public function)
    import torchlean_bridge.app.audit  # noqa: F401
    b = bias_pair_bundle()
    assert tlb.abi(b).shapes == [[3, 3], [3], [3, 3], [3]]
    b2, report = tlb.bind_checkpoint(b, BIAS_PAIR)
    assert report.ok and b2 == b
    assert tlb.audit(b, BIAS_PAIR, reference=[np.array([1.0, 0.0, 0.0])], inputs=np.zeros(3)).ok


def test_tied_keys_saved_twice_must_agree():
    g = Graph([Node(0, [], "input", [3]), Node(1, [0], "linear", [3])])
    b = Bundle(g, roles=RoleMap([Binding("embed.weight", 1, "weight"), Binding("head.weight", 1, "weight"),
                                 Binding("head.bias", 1, "bias")]))
    w = np.eye(3)
    assert bind_checkpoint(b, {"embed.weight": w, "head.weight": w, "head.bias": np.zeros(3)})[1].ok
    _, report = bind_checkpoint(b, {"embed.weight": w, "head.weight": 2 * w, "head.bias": np.zeros(3)})
    assert [f.keys for f in kinds(report, "tied")] == [("embed.weight", "head.weight")] and not report.ok
