"""Mapping audits: swapped tensors that pass every key and shape check are found and named."""

import json
import subprocess

import numpy as np
import pytest
import torch
import torch.nn as nn

from exporters.folder import save
from importers.builder import GraphBuilder
from importers.checkpoints import load_checkpoint
from torchlean_bridge.app.audit import audit
from torchlean_bridge.errors import BridgeError
from torchlean_bridge.seed import BIAS_PAIR, bias_pair_bundle

SEED_FACTORY = '''
import torch, torch.nn as nn

def make():
    same = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 3))
    with torch.no_grad():
        same[0].weight.copy_(torch.eye(3))
        same[2].weight.copy_(torch.eye(3))
        same[0].bias.copy_(torch.tensor([-1.0, 0.0, 0.0]))
        same[2].bias.copy_(torch.tensor([1.0, 0.0, 0.0]))
    return same
'''


def seed_module() -> nn.Module:
    namespace: dict = {}
    exec(SEED_FACTORY, namespace)
    return namespace["make"]()


def swapped(state_dict, a, b):
    sd = {k: v.clone() for k, v in state_dict.items()}
    sd[a], sd[b] = sd[b].clone(), sd[a].clone()
    return sd


def kinds(report, kind):
    return [f for f in report.findings if f.kind == kind]


@pytest.fixture
def seed_files(tmp_path):
    """The chapter's swapped state_dict, saved as safetensors and as a weights-only .pt file."""
    from safetensors.torch import save_file
    same = seed_module()
    sd = swapped(same.state_dict(), "0.bias", "2.bias")
    save_file(sd, str(tmp_path / "swapped.safetensors"))
    torch.save(sd, tmp_path / "swapped.pt")
    return same, sd, tmp_path


def test_seed_swap_passes_load_state_dict(seed_files):
    same, sd, _ = seed_files
    z = torch.zeros(3)
    assert same(z).tolist() == [1.0, 0.0, 0.0]
    assert str(same.load_state_dict(sd)) == "<All keys matched successfully>"
    assert same(z).tolist() == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("name", ["swapped.safetensors", "swapped.pt"])
def test_seed_swap_is_named_on_the_zero_input(seed_files, name):
    same, _, tmp_path = seed_files
    ckpt = load_checkpoint(tmp_path / name)
    report = audit(bias_pair_bundle(), ckpt, reference=same, inputs=[np.zeros(3)], samples=0)
    assert not report.ok
    assert [f.message for f in report.swaps] == ["swap 0.bias <-> 2.bias: max error 1.000000 -> 0.000000"]
    assert report.swaps[0].keys == ("0.bias", "2.bias")
    (mismatch,) = kinds(report, "mismatch")
    assert mismatch.message.endswith("ours [0.000000, 0.000000, 0.000000], reference [1.000000, 0.000000, 0.000000]")


def test_seed_swap_is_found_with_the_default_inputs(seed_files):
    same, _, tmp_path = seed_files
    report = audit(bias_pair_bundle(), load_checkpoint(tmp_path / "swapped.safetensors"), reference=same)
    assert [f.keys for f in report.swaps] == [("0.bias", "2.bias")]
    assert report.error_after == 0.0 and report.inputs_used == 5
    # identity weights in both layers: no input can tell them apart, and the report says so
    assert [f.keys for f in kinds(report, "indistinguishable")] == [("0.weight", "2.weight")]
    assert "identical tensors" in kinds(report, "indistinguishable")[0].message


def test_golden_outputs_reference():
    sd = swapped({k: torch.tensor(v) for k, v in BIAS_PAIR.items()}, "0.bias", "2.bias")
    report = audit(bias_pair_bundle(), sd, reference=[np.array([1.0, 0.0, 0.0])], inputs=np.zeros(3))
    assert [f.message for f in report.swaps] == ["swap 0.bias <-> 2.bias: max error 1.000000 -> 0.000000"]


def test_correct_checkpoint_agrees_and_is_ok(seed_files):
    same, _, _ = seed_files
    report = audit(bias_pair_bundle(), same.state_dict(), reference=same)
    assert report.ok and report.swaps == [] and report.error_before == 0.0
    assert kinds(report, "agreement")


def test_a_swap_the_inputs_cannot_see_is_reported():
    """ReLU(x + b1) + b2 on a large positive input is x + b1 + b2: symmetric in the two biases."""
    sd = dict(BIAS_PAIR, **{"0.bias": np.array([1.0, 2.0, 3.0]), "2.bias": np.array([4.0, 5.0, 6.0])})
    x = np.full(3, 10.0)
    golden = [x + sd["0.bias"] + sd["2.bias"]]
    report = audit(bias_pair_bundle(), sd, reference=golden, inputs=[x])
    assert report.ok
    (f,) = [f for f in kinds(report, "indistinguishable") if f.keys == ("0.bias", "2.bias")]
    assert f.message == "swap 0.bias <-> 2.bias changes no output on the 1 input(s) used: these inputs cannot " \
                        "tell them apart"


def linear_relu_linear(outputs: int):
    """3 -> 3 -> ``outputs`` with zero placeholder weights under nn.Sequential's keys."""
    gb = GraphBuilder("builder")
    h = gb.add("linear", [gb.input([3])], shape=[3])
    gb.param(h, "weight", np.zeros((3, 3)), key="0.weight")
    gb.param(h, "bias", np.zeros(3), key="0.bias")
    y = gb.add("linear", [gb.add("relu", [h])], shape=[outputs])
    gb.param(y, "weight", np.zeros((outputs, 3)), key="2.weight")
    gb.param(y, "bias", np.zeros(outputs), key="2.bias")
    return gb.finish([y])


def test_transposed_square_weight_is_named():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 2))
    sd = {k: v.clone() for k, v in net.state_dict().items()}
    sd["0.weight"] = sd["0.weight"].T.contiguous()
    report = audit(linear_relu_linear(2), sd, reference=net)
    assert [(f.kind, f.keys) for f in report.swaps] == [("transpose", ("0.weight",))]
    assert report.swaps[0].message.startswith("transpose 0.weight: max error ")
    assert report.swaps[0].message.endswith(" -> 0.000000")


def cnn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(2, 2, 3, padding=1), nn.ReLU(), nn.Conv2d(2, 2, 3, padding=1))


def cnn_bundle():
    """The CNN above as IR (two conv nodes of identical geometry), keys bound as its state_dict."""
    conv = {"spatial_rank": 2, "kernel": (3, 3), "stride": (1, 1), "padding": (1, 1), "padding_after": (1, 1),
            "dilation": (1, 1), "groups": 1, "channel_axis": 1, "in_channels": 2, "out_channels": 2}
    gb = GraphBuilder("builder")
    x = gb.input([1, 2, 5, 5])
    c1 = gb.add("conv", [x], conv)
    gb.param(c1, "weight", np.zeros((2, 2, 3, 3)), key="0.weight")
    gb.param(c1, "bias", np.zeros(2), key="0.bias")
    c2 = gb.add("conv", [gb.add("relu", [c1])], conv)
    gb.param(c2, "weight", np.zeros((2, 2, 3, 3)), key="2.weight")
    gb.param(c2, "bias", np.zeros(2), key="2.bias")
    return gb.finish([c2])


def test_cnn_with_exchanged_conv_weights(tmp_path):
    from safetensors.torch import save_file
    net = cnn()
    sd = swapped(net.state_dict(), "0.weight", "2.weight")
    assert str(cnn().load_state_dict(sd)) == "<All keys matched successfully>"
    save_file(sd, str(tmp_path / "cnn.safetensors"))
    report = audit(cnn_bundle(), load_checkpoint(tmp_path / "cnn.safetensors"), reference=net)
    assert [f.keys for f in report.swaps] == [("0.weight", "2.weight")]
    assert report.error_before > 0.1 and report.error_after < 1e-12


def test_two_exchanged_layers_are_named_as_one_block_exchange():
    """With the trusted weights, weight and bias of layers 0 and 2 exchanged read as one block."""
    net = cnn()
    sd = swapped(swapped(net.state_dict(), "0.weight", "2.weight"), "0.bias", "2.bias")
    report = audit(cnn_bundle(), sd, reference=net)
    assert [(f.kind, f.keys) for f in report.swaps] == [("block_swap", ("0.bias", "0.weight", "2.bias", "2.weight"))]
    assert report.swaps[0].message.startswith("block 0 <-> 2 exchanged (4 tensors): max error ")
    assert report.error_before > 0.1 and report.error_after < 1e-12


def test_two_exchanged_layers_are_a_block_exchange_with_golden_outputs_too():
    net = cnn()
    sd = swapped(swapped(net.state_dict(), "0.weight", "2.weight"), "0.bias", "2.bias")
    xs = [np.random.default_rng(k).standard_normal((1, 2, 5, 5)) for k in range(3)]
    with torch.no_grad():
        golden = [[net.double()(torch.tensor(x)).numpy()] for x in xs]
    report = audit(cnn_bundle(), sd, reference=golden, inputs=[[x] for x in xs])
    assert [(f.kind, f.keys) for f in report.swaps] == [("block_swap", ("0.bias", "0.weight", "2.bias", "2.weight"))]
    assert report.swaps[0].message.startswith("block 0 <-> 2 exchanged (4 tensors): max error ")
    assert report.error_after < 1e-12 and report.to_json()["search"]["tried"] == 1


def test_two_independent_exchanges_are_both_found():
    """Golden outputs only, a bias exchange and a transposed weight: no structured hypothesis explains
    both, the greedy search finds them one after the other."""
    net, bundle = _three_layer()
    sd = swapped(net.state_dict(), "0.bias", "2.bias")
    sd["0.weight"] = sd["0.weight"].T.contiguous()
    xs = [np.random.default_rng(k).standard_normal(3) for k in range(3)]
    with torch.no_grad():
        golden = [[net(torch.tensor(x)).numpy()] for x in xs]
    report = audit(bundle, sd, reference=golden, inputs=[[x] for x in xs])
    assert sorted(f.keys for f in report.swaps) == [("0.bias", "2.bias"), ("0.weight",)]
    assert report.error_after < 1e-12
    before, after = zip(*[(f.data["error_before"], f.data["error_after"]) for f in report.swaps])
    assert before[1] == after[0]  # the steps chain: each starts where the previous one ended


def test_a_wrong_value_is_not_blamed_on_a_swap():
    net = cnn()
    sd = {k: v.clone() for k, v in net.state_dict().items()}
    sd["2.bias"] += 1.0
    report = audit(cnn_bundle(), sd, reference=net)
    assert not report.ok and report.swaps == [] and not kinds(report, "unresolved")
    (different,) = kinds(report, "different_values")
    assert different.keys == ("2.bias",) and different.message.startswith("2.bias: different values (2 of 2 differ")


def onnx_mlp(tmp_path, name, w1, b1, w2, b2):
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "W1", "B1"], ["h"], transB=1), helper.make_node("Relu", ["h"], ["r"]),
         helper.make_node("Gemm", ["r", "W2", "B2"], ["y"], transB=1)], "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [numpy_helper.from_array(a.astype(np.float32), n) for a, n in
         ((w1, "W1"), (b1, "B1"), (w2, "W2"), (b2, "B2"))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    onnx.save(model, tmp_path / name)
    return tmp_path / name


def test_onnx_model_with_exchanged_initializers(tmp_path, capsys):
    import onnxruntime as ort

    import torchlean_bridge as tlb
    rng = np.random.default_rng(0)
    w1, w2 = rng.standard_normal((4, 4)), rng.standard_normal((4, 4))
    b1, b2 = rng.standard_normal(4), rng.standard_normal(4)
    good = onnx_mlp(tmp_path, "good.onnx", w1, b1, w2, b2)
    bad = onnx_mlp(tmp_path, "bad.onnx", w2, b1, w1, b2)  # W1 and W2 exchanged
    bundle = tlb.import_onnx(good)
    session = ort.InferenceSession(str(good), providers=["CPUExecutionProvider"])
    inputs = [[rng.standard_normal((1, 4)).astype(np.float32).astype(np.float64)] for _ in range(3)]
    golden = [session.run(None, {"x": case[0].astype(np.float32)}) for case in inputs]
    report = audit(bundle, load_checkpoint(bad), reference=golden, inputs=inputs, tolerance=1e-5)
    assert [f.keys for f in report.swaps] == [("W1", "W2")]
    assert report.error_after < 1e-5 * max(1.0, np.abs(golden).max())
    assert audit(bundle, load_checkpoint(good), reference=golden, inputs=inputs, tolerance=1e-5).ok

    # the same through the command line: the .onnx file itself is the checkpoint, golden outputs from onnxruntime
    from torchlean_bridge.app.cli import main
    save(bundle, tmp_path / "bundle")
    np.save(tmp_path / "x.npy", inputs[0][0])
    np.save(tmp_path / "y.npy", golden[0][0])
    args = ["audit", str(tmp_path / "bundle"), "--checkpoint", str(bad), "--input", str(tmp_path / "x.npy"),
            "--golden", str(tmp_path / "y.npy"), "--tolerance", "1e-5"]
    assert main(args) == 1
    assert "swap W1 <-> W2: max error " in capsys.readouterr().out


def test_no_reference_checks_only_the_binding():
    report = audit(bias_pair_bundle(), BIAS_PAIR)
    assert report.ok and kinds(report, "no_reference") and report.swaps == []
    assert [f.keys for f in kinds(report, "ambiguity")] == [("0.weight", "2.weight"), ("0.bias", "2.bias")]


def test_golden_outputs_need_their_inputs():
    with pytest.raises(BridgeError,
                       match=r"^audit: golden outputs need the inputs they were computed on \(inputs=\.\.\.\)$"):
        audit(bias_pair_bundle(), BIAS_PAIR, reference=[np.zeros(3)])


def test_audit_command(seed_files, capsys):
    from torchlean_bridge.app.cli import main

    def run_cli(*args):
        status = main(["audit", *map(str, args)])
        out = capsys.readouterr()
        return subprocess.CompletedProcess(args, status, out.out, out.err)

    same, _, tmp_path = seed_files
    save(bias_pair_bundle(), tmp_path / "bundle")
    (tmp_path / "ref.py").write_text(SEED_FACTORY)
    np.save(tmp_path / "zero.npy", np.zeros(3))
    torch.save(same.state_dict(), tmp_path / "right.pt")

    out = run_cli(tmp_path / "bundle", "--checkpoint", tmp_path / "swapped.pt", "--reference",
                  f"{tmp_path / 'ref.py'}:make", "--input", tmp_path / "zero.npy", "--samples", "0")
    assert out.returncode == 1, out.stderr
    assert "swap 0.bias <-> 2.bias: max error 1.000000 -> 0.000000" in out.stdout

    out = run_cli(tmp_path / "bundle", "--checkpoint", tmp_path / "swapped.safetensors", "--reference",
                  f"{tmp_path / 'ref.py'}:make", "--json")
    assert out.returncode == 1
    doc = json.loads(out.stdout)
    assert doc["ok"] is False and doc["swaps"] == [["0.bias", "2.bias"]]

    out = run_cli(tmp_path / "bundle", "--checkpoint", tmp_path / "right.pt", "--reference",
                  f"{tmp_path / 'ref.py'}:make")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "outputs agree with the reference module Sequential" in out.stdout

    out = run_cli(tmp_path / "bundle", "--checkpoint", tmp_path / "missing.pt")
    assert out.returncode == 2 and "no such checkpoint file" in out.stderr


@pytest.mark.slow  # the first torch.fx import costs ~10 s; the audit itself ~1.5 s
def test_fx_imported_cnn_with_batchnorm_and_exchanged_conv_weights(tmp_path):
    import torchlean_bridge as tlb
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1),
                        nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1), nn.Flatten(), nn.Linear(4 * 6 * 6, 2)).eval()
    with torch.no_grad():
        net[1].running_mean.uniform_(-0.5, 0.5)
        net[1].running_var.uniform_(0.5, 1.5)
    bundle = tlb.import_fx(net, (torch.randn(1, 3, 6, 6),))
    torch.save(swapped(net.state_dict(), "3.weight", "5.weight"), tmp_path / "cnn.pt")
    report = audit(bundle, load_checkpoint(tmp_path / "cnn.pt"), reference=net)
    assert [f.message.split(":")[0] for f in report.swaps] == ["swap 3.weight <-> 5.weight"]
    assert report.error_after < 1e-12
    # BatchNorm's step counter is an integer buffer the graph never reads: listed, not an error
    assert [f.severity for f in kinds(report, "unused")] == ["info"]
    assert [g.keys for g in tlb.abi(bundle).ambiguity_groups()] == [
        ("0.bias", "1.weight", "1.bias", "1.running_mean", "1.running_var", "3.bias", "5.bias"),
        ("3.weight", "5.weight")]
    clean = audit(bundle, net.state_dict(), reference=net)
    assert clean.ok, str(clean)


# -- the report's fields (what --json consumers read) ---------------------------------------------
def test_swap_and_mismatch_findings_carry_their_figures(seed_files):
    same, sd, _ = seed_files
    report = audit(bias_pair_bundle(), sd, reference=same, inputs=[np.zeros(3)], samples=0)
    doc = report.to_json()
    by_kind = {f["kind"]: f for f in doc["findings"]}
    assert by_kind["swap"]["data"] == {"error_before": 1.0, "error_after": 0.0}
    assert by_kind["mismatch"]["data"]["max_error"] == 1.0
    assert by_kind["mismatch"]["data"]["limit"] == pytest.approx(1e-6)
    assert (doc["error_before"], doc["error_after"], doc["inputs_used"]) == (1.0, 0.0, 1)
    assert doc["swaps"] == [["0.bias", "2.bias"]]


def test_agreement_carries_its_error(seed_files):
    same, _, _ = seed_files
    (agreement,) = [f for f in audit(bias_pair_bundle(), same.state_dict(), reference=same).to_json()["findings"]
                    if f["kind"] == "agreement"]
    assert agreement["data"] == {"max_error": 0.0}


def test_too_many_candidates_are_truncated_and_said(seed_files):
    _, sd, _ = seed_files
    report = audit(bias_pair_bundle(), sd, reference=[np.array([1.0, 0.0, 0.0])], inputs=[np.zeros(3)],
                   max_candidates=1)
    (truncated,) = kinds(report, "truncated")
    assert truncated.severity == "warning"
    assert truncated.message == "2 possible exchanges; only the first 1 were tried"


def test_the_mismatch_names_the_worst_input(seed_files):
    """Three given inputs on which the exchanged biases cost 0, 0.5 and 1 (relu(x0 - 1) + 1 against
    relu(x0 + 1) - 1): the mismatch names the third."""
    same, sd, _ = seed_files
    xs = [np.array([2.0, 0.0, 0.0]), np.array([0.5, 0.0, 0.0]), np.array([0.0, 0.0, 0.0])]
    errors = [float(np.abs(same(torch.tensor(x, dtype=torch.float32)).detach().numpy()
                           - _swapped_module(same, sd)(torch.tensor(x, dtype=torch.float32)).detach().numpy()).max())
              for x in xs]
    worst = int(np.argmax(errors))
    assert len(set(errors)) > 1  # the inputs tell the cases apart
    report = audit(bias_pair_bundle(), sd, reference=same, inputs=[[x] for x in xs], samples=0)
    (mismatch,) = kinds(report, "mismatch")
    assert f"worst on the given input {worst}:" in mismatch.message


def _swapped_module(same: nn.Module, sd) -> nn.Module:
    import copy
    m = copy.deepcopy(same)
    m.load_state_dict(sd)
    return m


def _three_layer() -> tuple:
    """3 -> 3 -> 3 with random weights: both weights square (each may be transposed), both biases of
    length 3 (an ambiguity group each)."""
    torch.manual_seed(3)
    net = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 3)).double()
    return net, linear_relu_linear(3)


_XS = [np.array([0.3, -0.2, 0.9]), np.array([-1.0, 0.5, 0.25])]


def _torch_errors(net, sd) -> tuple[float, dict[str, float]]:
    """The error of ``sd`` and of each single exchange, computed independently in torch."""
    def error(state) -> float:
        m = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 3)).double()
        m.load_state_dict(state)
        with torch.no_grad():
            return max(float((m(torch.tensor(x)) - net(torch.tensor(x))).abs().max()) for x in _XS)

    exchanges = {"swap 0.bias <-> 2.bias": {"0.bias": sd["2.bias"], "2.bias": sd["0.bias"]},
                 "swap 0.weight <-> 2.weight": {"0.weight": sd["2.weight"], "2.weight": sd["0.weight"]},
                 "transpose 0.weight": {"0.weight": sd["0.weight"].T},
                 "transpose 2.weight": {"2.weight": sd["2.weight"].T}}
    return error(sd), {name: error({**sd, **change}) for name, change in exchanges.items()}


def _golden_audit(net, bundle, sd):
    with torch.no_grad():
        golden = [[net(torch.tensor(x)).numpy()] for x in _XS]
    return audit(bundle, sd, reference=golden, inputs=[[x] for x in _XS])


def test_unresolved_names_no_exchange_that_leaves_most_of_the_error():
    """Golden outputs only, wrong values (not an exchange): the report says so, and names no
    exchange, since none removes most of the error (checked here independently in torch)."""
    net, bundle = _three_layer()
    sd = {k: v.clone() for k, v in net.state_dict().items()}
    sd["0.bias"] = sd["0.bias"] + 0.75  # damage no exchange can undo
    before, errors = _torch_errors(net, sd)
    assert min(errors.values()) > before / 2
    report = _golden_audit(net, bundle, sd)
    (unresolved,) = kinds(report, "unresolved")
    assert unresolved.message == (
        "no exchange within the ambiguity groups and none of 4 structured hypotheses restores agreement; the "
        "difference lies elsewhere (different values, which golden outputs alone cannot place, or a role map or "
        "import error)")
    assert report.swaps == [] and not report.ok


def test_unresolved_names_the_best_single_exchange_when_it_removes_nearly_all_of_the_error():
    """Exchanged biases plus a small change of one weight: the exchange removes nearly all of the error
    (at least 90%), and is named with what it leaves."""
    net, bundle = _three_layer()
    sd = swapped(net.state_dict(), "0.bias", "2.bias")
    sd["2.weight"] = sd["2.weight"] + 0.01
    before, errors = _torch_errors(net, sd)
    best = min(errors, key=errors.get)
    assert best == "swap 0.bias <-> 2.bias" and errors[best] <= before / 10
    (unresolved,) = kinds(_golden_audit(net, bundle, sd), "unresolved")
    tried = unresolved.data["hypotheses"]
    # one round of the 4 hypotheses; when one removes half of the error, its two modules are screened
    # alone (2), the 4 single exchanges within them are checked for agreement, then a second round (4)
    assert tried in (4, 14)
    assert unresolved.message == (
        f"no exchange within the ambiguity groups and none of {tried} structured hypotheses restores agreement "
        f"(the best "
        f"single exchange, {best}, leaves {errors[best]:.6f}); the difference lies elsewhere (different values, "
        f"which golden outputs alone cannot place, or a role map or import error)")


def test_an_ambiguity_group_with_a_missing_key_is_not_searched():
    """A checkpoint lacking 2.bias (non-strict binding): the bias group cannot be exchanged, the
    audit still runs and reports the missing key."""
    net, bundle = _three_layer()
    sd = {k: v.clone() for k, v in net.state_dict().items() if k != "2.bias"}
    report = audit(bundle, sd, reference=net, inputs=[np.zeros(3)], samples=0, strict=False)
    assert all("2.bias" not in f.keys for f in report.swaps)
    assert any("2.bias" in f.message for f in report.findings)


# -- inputs at the boundary, exact limits, NaN and infinities, output structures --------------------
def test_a_plain_callable_is_not_a_reference_module():
    sd = {k: torch.tensor(v) for k, v in BIAS_PAIR.items()}
    with pytest.raises(BridgeError) as e:
        audit(bias_pair_bundle(), sd, reference=lambda x: x, inputs=np.zeros(3))
    assert str(e.value) == ("audit: the reference is a function; give an nn.Module holding the trusted weights, "
                            "trusted weights (a state_dict or checkpoint), or golden outputs (arrays)")


class _DictOutputs(nn.Module):
    """The seed network with its output inside a dict inside a tuple (what HF-style models return)."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x):
        return ({"logits": self.net(x)},)


def test_a_reference_module_returning_nested_dicts_is_compared_by_its_tensors(seed_files):
    same, sd, _ = seed_files
    report = audit(bias_pair_bundle(), sd, reference=_DictOutputs(same), inputs=[np.zeros(3)], samples=0)
    assert [f.keys for f in report.swaps] == [("0.bias", "2.bias")]
    assert report.error_before == 1.0 and report.error_after == 0.0


def _unbound_linear(unset: int):
    """x -> linear with ``unset`` of its two payload tensors never set and not in the role map."""
    gb = GraphBuilder("builder")
    h = gb.add("linear", [gb.input([3])], shape=[3])
    if unset < 2:
        gb.param(h, "weight", np.eye(3), key="0.weight")
    if unset < 1:
        gb.param(h, "bias", np.zeros(3), key="0.bias")
    return gb.finish([h])


@pytest.mark.parametrize("unset, message", [
    (1, "the bound graph cannot be evaluated: payload: node 1 (linear) is missing `bias`"),
    (2, "the bound graph cannot be evaluated: payload: node 1 (linear) is missing `weight` (and 1 more)"),
])
def test_an_unevaluable_binding_is_reported_with_the_count_of_problems(unset, message):
    report = audit(_unbound_linear(unset), {"0.weight": np.eye(3)}, reference=[np.zeros(3)], inputs=[np.zeros(3)],
                   strict=False)
    (f,) = kinds(report, "not_evaluable")
    assert f.message == message


def test_a_zero_tolerance_accepts_exact_agreement():
    """The limit is inclusive: with tolerance 0 an exchange that restores the outputs bit for bit
    is still found, and an exchange that changes nothing is still called indistinguishable."""
    sd = swapped({k: torch.tensor(v) for k, v in BIAS_PAIR.items()}, "0.bias", "2.bias")
    report = audit(bias_pair_bundle(), sd, reference=[np.array([1.0, 0.0, 0.0])], inputs=np.zeros(3), tolerance=0.0)
    assert [f.keys for f in report.swaps] == [("0.bias", "2.bias")] and report.error_after == 0.0
    biases = dict(BIAS_PAIR, **{"0.bias": np.array([1.0, 2.0, 3.0]), "2.bias": np.array([4.0, 5.0, 6.0])})
    x = np.full(3, 10.0)
    report = audit(bias_pair_bundle(), biases, reference=[x + biases["0.bias"] + biases["2.bias"]], inputs=[x],
                   tolerance=0.0)
    assert report.ok and any(f.keys == ("0.bias", "2.bias") for f in kinds(report, "indistinguishable"))


def test_nan_and_infinities_in_the_same_places_agree():
    """x = [inf, -inf, 0] through the identity weights gives inf*0 = NaN: NaN on both sides is
    agreement, and so is the same infinity on both sides."""
    import torchlean_bridge as tlb
    bundle = bias_pair_bundle()
    for x in (np.array([np.inf, -np.inf, 0.0]), np.array([np.inf, 0.0, 0.0])):
        golden = [np.asarray(v) for v in tlb.evaluate(bundle.graph, bundle.payload, x)]
        assert not np.isfinite(golden[0]).all()
        report = audit(bundle, dict(BIAS_PAIR), reference=golden, inputs=[x])
        assert report.ok and report.error_before == 0.0


def test_nan_on_one_side_only_is_an_infinite_error():
    x = np.array([np.inf, -np.inf, 0.0])
    report = audit(bias_pair_bundle(), dict(BIAS_PAIR), reference=[np.zeros(3)], inputs=[x])
    assert report.error_before == float("inf") and kinds(report, "mismatch")
    report = audit(bias_pair_bundle(), dict(BIAS_PAIR), reference=[np.full(3, np.nan)], inputs=[np.zeros(3)])
    assert report.error_before == float("inf") and kinds(report, "mismatch")


def _gather_by_key(n: int = 4):
    """y = x[position_ids]: an int64 index tensor from the checkpoint, as HF models hold them."""
    gb = GraphBuilder("builder")
    x = gb.input([n])
    idx = gb.const(np.array([0, 1]), key="position_ids")
    return gb.finish([gb.add("gather", [x, idx], {"axis": 0})])


def test_a_checkpoint_the_graph_cannot_evaluate_is_an_infinite_mismatch():
    """Indices out of range in the checkpoint as given: no output at all, so no worst input to name."""
    report = audit(_gather_by_key(), {"position_ids": np.array([0, 9])}, reference=[np.zeros(2)],
                   inputs=[np.arange(4.0)])
    (f,) = kinds(report, "mismatch")
    assert f.message == "outputs disagree with the golden outputs: max error inf on 1 input(s)"
    assert report.error_before == float("inf")


def _affine(n: int, outputs: int = 1):
    """x -> x + b (n wide), ``outputs`` times (the same sum listed again): b under the key ``b``."""
    gb = GraphBuilder("builder")
    x = gb.input([n])
    y = gb.add("add", [x, gb.const(np.zeros(n), key="b")])
    return gb.finish([y] * outputs)


def test_the_worst_input_shows_values_only_for_one_small_output():
    x = np.zeros(9)
    (f,) = kinds(audit(_affine(9), {"b": np.ones(9)}, reference=[np.zeros(9)], inputs=[x]), "mismatch")
    assert f.message.endswith("worst on the given input 0")  # 9 values: not listed
    (f,) = kinds(audit(_affine(2, outputs=2), {"b": np.ones(2)}, reference=[np.zeros(2)] * 2, inputs=[x[:2]]),
                 "mismatch")
    assert f.message.endswith("worst on the given input 0")  # two outputs: not listed
    (f,) = kinds(audit(_affine(2), {"b": np.ones(2)}, reference=[np.zeros(2)], inputs=[x[:2]]), "mismatch")
    assert f.message.endswith("worst on the given input 0: ours [1.000000, 1.000000], reference [0.000000, 0.000000]")
    (f,) = kinds(audit(_affine(8), {"b": np.ones(8)}, reference=[np.zeros(8)], inputs=[x[:8]]), "mismatch")
    assert f.message.endswith(f"ours [{', '.join(['1.000000'] * 8)}], reference [{', '.join(['0.000000'] * 8)}]")


def test_the_search_stops_evaluating_once_outputs_agree(monkeypatch):
    """One evaluation for the checkpoint as given, one per candidate exchange, and none after the
    exchange that restores agreement."""
    from torchlean_bridge.app import audit as audit_module
    calls = []
    original = audit_module._Evaluator.outputs
    monkeypatch.setattr(audit_module._Evaluator, "outputs",
                        lambda self, p, *a: calls.append(1) or original(self, p, *a))
    sd = swapped({k: torch.tensor(v) for k, v in BIAS_PAIR.items()}, "0.bias", "2.bias")
    report = audit(bias_pair_bundle(), sd, reference=[np.array([1.0, 0.0, 0.0])], inputs=np.zeros(3))
    assert [f.keys for f in report.swaps] == [("0.bias", "2.bias")]
    # the checkpoint as given, then the bias exchange; the two identity weights are identical (not
    # evaluated) and symmetric (no transpose candidate); after agreement, nothing more
    assert len(calls) == 2


def test_the_tolerance_is_relative_to_the_largest_reference_value():
    """limit = tolerance * max(1, max |reference|), NaN entries ignored: 0.5 off on a 1e6 output
    agrees at tolerance 1e-6, and so it does beside a NaN both sides share."""
    for x, golden in ((np.array([1e6, 0.0]), np.array([1e6, 0.5])),
                      (np.array([1e6 + 0.5, np.nan]), np.array([1e6, np.nan]))):
        report = audit(_affine(2), {"b": np.zeros(2)}, reference=[golden], inputs=[x])
        assert report.ok and report.error_before == 0.5
    report = audit(_affine(2), {"b": np.zeros(2)}, reference=[np.array([0.0, 0.5])], inputs=[np.zeros(2)])
    assert not report.ok and kinds(report, "mismatch")[0].data["limit"] == 1e-6


def test_nan_on_one_side_at_one_place_is_an_infinite_error():
    report = audit(_affine(3), {"b": np.zeros(3)}, reference=[np.array([np.nan, 0.0, 0.0])], inputs=[np.zeros(3)])
    assert report.error_before == float("inf")


def test_golden_outputs_as_a_bare_array():
    report = audit(_affine(3), {"b": np.ones(3)}, reference=np.ones(3), inputs=[np.zeros(3)])
    assert report.ok and report.error_before == 0.0


@pytest.mark.parametrize("reference, inputs, message", [
    ([[np.zeros(2)], [np.zeros(2)]], [np.zeros(2)], "audit: 2 golden output set(s) for 1 input set(s)"),
    ([np.zeros(2), np.zeros(2)], [np.zeros(2)], "audit: the golden outputs gives 2 output(s), the graph has 1"),
    ([np.zeros(3)], [np.zeros(2)], "audit: the golden outputs output 0 has shape [3], the graph's is [2]"),
])
def test_golden_outputs_that_do_not_fit_the_graph_are_refused(reference, inputs, message):
    with pytest.raises(BridgeError) as e:
        audit(_affine(2), {"b": np.zeros(2)}, reference=reference, inputs=inputs)
    assert str(e.value) == message


class _Fails(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.b = nn.Parameter(torch.zeros(2))

    def forward(self, x):
        raise ValueError("no")


def test_a_failing_reference_module_is_reported_with_its_error():
    with pytest.raises(BridgeError) as e:
        audit(_affine(2), {"b": np.zeros(2)}, reference=_Fails(), inputs=[np.zeros(2)], samples=0)
    assert str(e.value) == "audit: the reference module failed on input set 0 (run in float64): ValueError: no"


def test_integer_inputs_reach_the_reference_module_as_integers():
    """Token ids stay int64 (an nn.Embedding refuses float indices); float inputs run in float64."""
    import torchlean_bridge as tlb
    torch.manual_seed(0)
    net = nn.Sequential(nn.Embedding(5, 3), nn.Linear(3, 2)).eval()
    bundle = tlb.import_fx(net, (torch.tensor([1, 4]),))
    report = audit(bundle, net.state_dict(), reference=net, inputs=[np.array([1, 4])], samples=0)
    assert report.ok and report.error_before < 1e-12


def test_float32_and_strided_inputs_reach_the_reference_module_in_float64(seed_files):
    """The trusted copy runs in float64: float32 inputs are converted, a reversed (negative-stride)
    view is copied, and both agree with the correct checkpoint."""
    same, _, _ = seed_files
    for x in (np.array([0.5, -1.0, 2.0], np.float32), np.array([2.0, -1.0, 0.5])[::-1]):
        report = audit(bias_pair_bundle(), same.state_dict(), reference=same, inputs=[x], samples=0)
        assert report.ok and report.error_before < 1e-6


def test_an_onnx_bundle_audited_against_the_module_takes_the_module_keys(tmp_path):
    """The exporter named the initializers W1/B1/W2/B2; against the trusted module the bundle's keys
    are recovered by value from the file's own weights, so a swapped state_dict is named in the
    module's keys (and a file already in those keys is used as it is)."""
    import torchlean_bridge as tlb
    torch.manual_seed(1)
    net = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4)).eval()
    w = {k: v.detach().numpy().astype(np.float64) for k, v in net.state_dict().items()}
    renamed = tlb.import_onnx(onnx_mlp(tmp_path, "m.onnx", w["0.weight"], w["0.bias"], w["2.weight"], w["2.bias"]))
    assert set(renamed.roles) == {"W1", "B1", "W2", "B2"}
    sd = swapped(net.state_dict(), "0.bias", "2.bias")
    report = audit(renamed, sd, reference=net, inputs=[np.zeros((1, 4))], samples=3, tolerance=1e-5)
    assert [f.keys for f in report.swaps] == [("0.bias", "2.bias")]


class _DataParallelLike(nn.Module):
    """A wrapper whose state_dict keys carry DataParallel's ``module.`` prefix."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.module = net

    def forward(self, x):
        return self.module(x)


def test_suspects_are_the_keys_that_differ_from_the_trusted_module_without_its_module_prefix():
    from torchlean_bridge.app.audit import _suspects
    net, _ = _three_layer()
    sd = swapped(net.state_dict(), "0.bias", "2.bias")
    tensors = {k: v.numpy() for k, v in sd.items()}
    assert _suspects(_DataParallelLike(net), tensors, sd) == {"0.bias", "2.bias"}
    assert _suspects([np.zeros(3)], tensors, sd) == set(tensors)  # golden outputs: every key


def test_unresolved_carries_the_number_of_candidates():
    net, bundle = _three_layer()
    sd = {k: v.clone() for k, v in net.state_dict().items()}
    sd["0.bias"] = sd["0.bias"] + 0.75
    with torch.no_grad():
        golden = [net(torch.ones(3, dtype=torch.float64)).numpy()]
    (unresolved,) = kinds(audit(bundle, sd, reference=golden, inputs=[np.ones(3)]), "unresolved")
    # the bias and weight exchanges and two transposes; the layer exchange, both weights transposed, each
    assert unresolved.data == {"candidates": 4, "hypotheses": 4}


def test_the_zero_tolerance_search_stops_at_exact_agreement(monkeypatch):
    from torchlean_bridge.app import audit as audit_module
    calls = []
    original = audit_module._Evaluator.outputs
    monkeypatch.setattr(audit_module._Evaluator, "outputs",
                        lambda self, p, *a: calls.append(1) or original(self, p, *a))
    sd = swapped({k: torch.tensor(v) for k, v in BIAS_PAIR.items()}, "0.bias", "2.bias")
    report = audit(bias_pair_bundle(), sd, reference=[np.array([1.0, 0.0, 0.0])], inputs=np.zeros(3), tolerance=0.0)
    assert report.error_after == 0.0 and len(calls) == 2


def test_an_exchange_that_does_not_lower_the_error_ends_the_search(monkeypatch):
    """Golden outputs off by one everywhere and an exchange the inputs cannot see: the exchange
    leaves the error as it is, so it is not taken and nothing more is evaluated."""
    from torchlean_bridge.app import audit as audit_module
    calls = []
    original = audit_module._Evaluator.outputs
    monkeypatch.setattr(audit_module._Evaluator, "outputs",
                        lambda self, p, *a: calls.append(1) or original(self, p, *a))
    sd = dict(BIAS_PAIR, **{"0.bias": np.array([1.0, 2.0, 3.0]), "2.bias": np.array([4.0, 5.0, 6.0])})
    x = np.full(3, 10.0)
    report = audit(bias_pair_bundle(), sd, reference=[x + sd["0.bias"] + sd["2.bias"] + 1.0], inputs=[x])
    assert kinds(report, "unresolved") and report.swaps == [] and report.error_after == 1.0
    assert len(calls) == 2  # the checkpoint as given and the one visible candidate, nothing after


def test_a_trial_re_evaluated_from_its_first_changed_node_gives_the_full_evaluation():
    """The evaluator keeps the checkpoint's node values and re-runs a trial from the first node
    reading a changed key: the outputs equal a full evaluation's, bit for bit."""
    from torchlean_bridge.app import audit as audit_module
    from torchlean_bridge.app.abi import abi, bind_checkpoint
    net, bundle = _three_layer()
    bundle, _ = bind_checkpoint(bundle, {k: v.detach().numpy() for k, v in net.state_dict().items()})
    cases = [[np.array([0.5, -1.0, 2.0])], [np.array([3.0, 0.25, -0.5])]]
    evaluator = audit_module._Evaluator(bundle, abi(bundle), cases)
    rng = np.random.default_rng(0)
    for key in ("2.bias", "2.weight", "0.weight"):
        tensors = {key: rng.standard_normal(net.state_dict()[key].shape)}
        start = min(s.node for s in abi(bundle).for_key(key))
        assert start > 0 or key == "0.weight"
        full = evaluator.outputs(evaluator.payload(tensors, [key]))
        resumed = evaluator.trial(tensors, [key])
        assert all(np.array_equal(a, b) for fa, ra in zip(full, resumed) for a, b in zip(fa, ra))
        assert not all(np.array_equal(a, b) for fa, ba in zip(full, evaluator.outputs(bundle.payload))
                       for a, b in zip(fa, ba))  # the trial changed the outputs: a real comparison


def test_a_step_agreement_holds_without_is_dropped_from_the_explanation():
    """A minimal explanation: of [transpose a symmetric weight (changes nothing), the bias exchange],
    in either order, only the exchange is kept, with its errors measured again from the checkpoint as
    given."""
    from torchlean_bridge.app import audit as audit_module
    from torchlean_bridge.app.abi import abi, bind_checkpoint
    bundle = bias_pair_bundle()
    tensors = {k: np.asarray(v, np.float64) for k, v in swapped({k: torch.tensor(v) for k, v in BIAS_PAIR.items()},
                                                                  "0.bias", "2.bias").items()}
    bundle, _ = bind_checkpoint(bundle, tensors)  # the evaluator's payload is the checkpoint as given
    cases = [[np.zeros(3)]]
    evaluator = audit_module._Evaluator(bundle, abi(bundle), cases)
    ref = [[np.array([1.0, 0.0, 0.0])]]
    before = audit_module._max_error(evaluator.trial(tensors, sorted(tensors)), ref)
    Ex = audit_module.Exchange
    junk, real = Ex("0.weight"), Ex("0.bias", "2.bias")
    assert np.array_equal(tensors["0.weight"], tensors["0.weight"].T) and before == 1.0
    steps = [(junk, before, before), (real, before, 0.0)]
    kept = audit_module._minimal(steps, lambda t, ex: ex.apply(t), lambda ex: ex.keys, evaluator, tensors, ref,
                                 before, 1e-6)
    assert kept == [(real, 1.0, 0.0)]
    # the junk step last: the same
    assert audit_module._minimal(steps[::-1], lambda t, ex: ex.apply(t), lambda ex: ex.keys, evaluator, tensors,
                                 ref, before, 1e-6) == [(real, 1.0, 0.0)]
