"""Differential testing: agreement with PyTorch/ONNX oracles, and deliberately wrong payloads caught
at exactly the node that was changed.

The bundles here are built with the graph builder and carry the provenance an FX import records
(``Source.name`` = the FX node name), so these tests exercise the engine independently of the
importers; tests/test_diff_imports.py runs it on real imports.
"""

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import torchlean_bridge as tlb  # noqa: E402
from importers.builder import GraphBuilder  # noqa: E402
from torchlean_bridge.bundle import Bundle  # noqa: E402
from torchlean_bridge.app.commands.demo import torch_onnx_bytes  # noqa: E402
from torchlean_bridge.app.diff import make_inputs, match_nodes, ulp_distance  # noqa: E402
from torchlean_bridge.graph import Graph, Source  # noqa: E402
from torchlean_bridge.seed import SEED_WEIGHTS, SEED_X0, seed_mlp_bundle  # noqa: E402
from tests.conftest import ROOT  # noqa: E402


# -- models and their hand-lowered bundles ------------------------------------------------------

class SeedMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1, self.l2 = nn.Linear(4, 5), nn.Linear(5, 3)

    def forward(self, x):
        return torch.tanh(torch.sum(self.l2(torch.relu(self.l1(x)))))


def seed_module() -> nn.Module:
    m = SeedMLP().eval()
    m.load_state_dict({k: torch.tensor(v, dtype=torch.float32) for k, v in SEED_WEIGHTS.items()})
    return m


def seed_fx_bundle() -> Bundle:
    """The seed bundle with the FX node names symbolic_trace gives SeedMLP."""
    b = seed_mlp_bundle()
    names = ["x", "l1", "relu", "l2", "sum_1", "tanh"]
    g = Graph([n.with_(source=Source("fx", name=nm)) for n, nm in zip(b.graph.nodes, names)],
              b.graph.inputs, b.graph.outputs)
    return Bundle(g, b.payload, b.roles, {"framework": "fx"})


class Net(nn.Module):
    """conv -> layernorm -> relu -> flatten -> fc1 -> relu -> fc2, with two same-shaped biases."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3, padding=1)
        self.norm = nn.LayerNorm([4, 6, 6])
        self.fc1, self.fc2 = nn.Linear(144, 8), nn.Linear(8, 8)

    def forward(self, x):
        h = torch.flatten(torch.relu(self.norm(self.conv(x))), 1)
        return self.fc2(torch.relu(self.fc1(h)))


def net_module() -> nn.Module:
    torch.manual_seed(0)
    m = Net().eval()
    with torch.no_grad():  # a non-trivial affine layernorm, so its payload matters
        m.norm.weight.uniform_(0.5, 1.5)
        m.norm.bias.uniform_(-0.5, 0.5)
    return m


def net_bundle(m: nn.Module) -> tuple[Bundle, dict[str, int]]:
    """Net lowered by hand, as an FX importer would; returns the bundle and FX name -> node id."""
    sd = {k: v.detach().numpy().astype(np.float64) for k, v in m.state_dict().items()}
    b = GraphBuilder("fx")
    ids = {"x": b.input([1, 2, 6, 6], source={"name": "x"})}
    conv = dict(spatial_rank=2, kernel=(3, 3), stride=(1, 1), padding=(1, 1), padding_after=(1, 1),
                dilation=(1, 1), groups=1, channel_axis=1, in_channels=2, out_channels=4)
    ids["conv"] = b.add("conv", [ids["x"]], conv, source={"name": "conv", "module": "conv"})
    b.param(ids["conv"], "weight", sd["conv.weight"], key="conv.weight")
    b.param(ids["conv"], "bias", sd["conv.bias"], key="conv.bias")
    ids["norm"] = b.add("layernorm", [ids["conv"]], {"axis": 1, "eps": 1e-5}, source={"name": "norm"})
    b.param(ids["norm"], "weight", sd["norm.weight"], key="norm.weight")
    b.param(ids["norm"], "bias", sd["norm.bias"], key="norm.bias")
    ids["relu"] = b.add("relu", [ids["norm"]], source={"name": "relu"})
    ids["flatten"] = b.reshape(ids["relu"], (1, 144), source={"name": "flatten"})
    for name, parent, width in (("fc1", "flatten", 8), ("fc2", "relu_1", 8)):
        ids[name] = b.add("linear", [ids[parent]], shape=(1, width), source={"name": name})
        b.param(ids[name], "weight", sd[f"{name}.weight"], key=f"{name}.weight")
        b.param(ids[name], "bias", sd[f"{name}.bias"], key=f"{name}.bias")
        if name == "fc1":
            ids["relu_1"] = b.add("relu", [ids["fc1"]], source={"name": "relu_1"})
    return b.finish([ids["fc2"]]), ids


def with_node(bundle: Bundle, nid: int, **attrs) -> Bundle:
    nodes = list(bundle.graph.nodes)
    nodes[nid] = nodes[nid].with_(attrs={**nodes[nid].attrs, **attrs})
    return Bundle(Graph(nodes, bundle.graph.inputs, bundle.graph.outputs), bundle.payload, bundle.roles,
                  bundle.report)


def with_payload(bundle: Bundle, changes: dict[tuple[int, str], np.ndarray]) -> Bundle:
    p = bundle.payload.copy()
    for (nid, role), value in changes.items():
        p.set(nid, role, value)
    return Bundle(bundle.graph, p, bundle.roles, bundle.report)


@pytest.fixture(scope="module")
def net():
    m = net_module()
    bundle, ids = net_bundle(m)
    return m, bundle, ids


# -- agreement ----------------------------------------------------------------------------------

def test_seed_mlp_agrees_with_torch_at_every_node():
    report = tlb.diff(seed_fx_bundle(), against="torch", module=seed_module(), random=6)
    assert report.ok and report.first_divergence is None, str(report)
    assert [r.counterpart for r in report.nodes] == ["x", "l1", "relu", "l2", "sum_1", "tanh"]
    assert all(r.status == "ok" for r in report.nodes + report.outputs)
    assert report.inputs == ["input 0 (normal)", "input 1 (uniform)", "input 2 (zeros)", "input 3 (edge)",
                             "input 4 (normal)", "input 5 (uniform)"]
    # float32 PyTorch against the float64 reference: a few float32 ulps, far inside the budgets
    assert max(r.max_ulp for r in report.nodes) <= 16
    assert all(r.max_abs <= r.budget for r in report.nodes)


def test_seed_value_table_matches_torch_at_x0():
    """The chapter's x0 through both: torch's l2 output is the chapter's node 3 to six decimals."""
    report = tlb.diff(seed_fx_bundle(), against="torch", module=seed_module(), inputs=SEED_X0)
    assert report.ok
    with torch.no_grad():
        out = seed_module()(torch.tensor(SEED_X0, dtype=torch.float32))
    assert f"{float(out):.6f}" == "0.027713"


def test_net_agrees_with_torch(net):
    m, bundle, ids = net
    report = tlb.diff(bundle, against="torch", module=m, random=4)
    assert report.ok, str(report)
    matched = {r.node: r.counterpart for r in report.nodes if r.status == "ok"}
    assert set(matched.values()) == {"x", "conv", "norm", "relu", "flatten", "fc1", "relu_1", "fc2"}
    assert not report.of_kind("parameter-mismatch")


# -- deliberately wrong bundles: the first divergent node is the changed one -------------------

def _first(report) -> int:
    assert not report.ok
    assert report.first_divergence is not None, str(report)
    return report.first_divergence.node


def test_scaled_weight_is_caught_at_its_node(net):
    m, bundle, ids = net
    conv = ids["conv"]
    bad = with_payload(bundle, {(conv, "weight"): bundle.payload.get(conv, "weight") * 1.01})
    report = tlb.diff(bad, against="torch", module=m)
    assert _first(report) == conv
    assert report.first_divergence.keys[:2] == ("conv.weight", "conv.bias")
    mismatch = report.of_kind("parameter-mismatch")
    assert [f.keys for f in mismatch] == [("conv.weight",)]


def test_swapped_biases_are_caught_at_the_first_and_both_keys_named(net):
    m, bundle, ids = net
    fc1, fc2 = ids["fc1"], ids["fc2"]
    bad = with_payload(bundle, {(fc1, "bias"): bundle.payload.get(fc2, "bias"),
                                (fc2, "bias"): bundle.payload.get(fc1, "bias")})
    report = tlb.diff(bad, against="torch", module=m)
    assert _first(report) == fc1
    assert "fc1.bias" in report.first_divergence.keys
    assert [f.keys for f in report.of_kind("parameter-mismatch")] == [("fc1.bias", "fc2.bias")]
    by_node = {r.node: r.status for r in report.nodes}
    assert by_node[fc2] == "downstream"
    assert "fc1.bias and fc2.bias look exchanged" in str(report)


def test_wrong_layernorm_epsilon_is_caught_at_its_node(net):
    m, bundle, ids = net
    report = tlb.diff(with_node(bundle, ids["norm"], eps=1e-2), against="torch", module=m)
    assert _first(report) == ids["norm"]
    assert not report.of_kind("parameter-mismatch")  # the tensors are right; the attribute is not
    assert all(r.status == "ok" for r in report.nodes if r.node < ids["norm"])


def test_wrong_conv_padding_is_caught_at_its_node(net):
    """Padding moved from both sides to one side: same output shape, shifted values."""
    m, bundle, ids = net
    bad = with_node(bundle, ids["conv"], padding=(2, 2), padding_after=(0, 0))
    tlb.check(bad.graph)
    report = tlb.diff(bad, against="torch", module=m)
    assert _first(report) == ids["conv"]
    assert report.outputs[0].status == "diverged"


def test_tiny_epsilon_change_below_float32_resolution_is_not_flagged(net):
    """1e-5 -> 1.0001e-5 changes the normalized values by ~1e-10 relative: within budget."""
    m, bundle, ids = net
    assert tlb.diff(with_node(bundle, ids["norm"], eps=1.0001e-5), against="torch", module=m).ok


# -- ONNX oracles: outputs compared by position, nodes without provenance are not guessed -------

@pytest.mark.parametrize("against", ["onnxruntime", "reference-evaluator"])
def test_onnx_oracles_compare_outputs_and_report_unmatched_nodes(net, against):
    m, bundle, ids = net
    model = torch_onnx_bytes(m, np.zeros((1, 2, 6, 6)))
    report = tlb.diff(bundle, against=against, onnx_model=model, random=2)
    assert report.ok, str(report)
    assert report.outputs[0].counterpart == "y" and report.outputs[0].status == "ok"
    # FX names are not ONNX tensor names: nothing is read directly; only the finer oracle reaches nodes
    # (the input the oracle was fed, and what numpy recomputes from it before the first conv)
    assert all(r.status == "no counterpart" or r.via for r in report.nodes)
    assert any(r.status == "no counterpart" for r in report.nodes)
    assert report.of_kind("no-counterpart")[0].severity == "info"
    bad = with_node(bundle, ids["norm"], eps=1e-2)
    report = tlb.diff(bad, against=against, onnx_model=model, random=2)
    assert not report.ok and report.first_divergence.kind == "output-divergence"


def test_onnx_tensor_provenance_matches_intermediates():
    """A bundle whose nodes carry ONNX tensor names is compared node by node with onnxruntime."""
    m = seed_module()
    model = torch_onnx_bytes(m, SEED_X0)
    import onnx
    proto = onnx.load_from_string(model)
    produced = {n.op_type: [] for n in proto.graph.node}
    for n in proto.graph.node:
        produced[n.op_type].append(n.output[0])
    # linear = MatMul + Add (the Add's output is the linear's value; the MatMul has no IR node)
    tensors = [proto.graph.input[0].name, produced["Add"][0], produced["Relu"][0], produced["Add"][1],
               produced["ReduceSum"][0], produced["Tanh"][0]]
    b = seed_mlp_bundle()
    g = Graph([n.with_(source=Source("onnx", tensor=t)) for n, t in zip(b.graph.nodes, tensors)],
              b.graph.inputs, b.graph.outputs)
    good = Bundle(g, b.payload, b.roles, {"framework": "onnx"})
    report = tlb.diff(good, against="onnxruntime", onnx_model=model)
    assert report.ok and all(r.status == "ok" for r in report.nodes), str(report)
    bad = with_payload(good, {(3, "bias"): b.payload.get(3, "bias") + np.array([0.0, 0.01, 0.0])})
    assert _first(tlb.diff(bad, against="reference-evaluator", onnx_model=model)) == 3


# -- matching, inputs, ulps, report formats ------------------------------------------------------

def test_lowering_helpers_share_a_name_but_only_the_last_holds_its_value():
    b = GraphBuilder("fx")
    x = b.input([3], source={"name": "x"})
    c = b.const(np.ones(1), source={"name": "_tensor_constant0"})
    out = b.elementwise("add", [x, c], source={"name": "add"})
    g = b.finish([out]).graph
    matched, unmatched = match_nodes(g, "fx")
    broadcast = next(n.id for n in g.nodes if n.kind == "broadcast_to")
    assert matched[out] == "add" and "part of the lowering of add" in unmatched[broadcast]


def test_random_inputs_respect_element_types_and_gather_ranges():
    b = GraphBuilder("fx")
    ids = b.input([2, 5], dtype="int64", source={"name": "ids"})
    table = b.const(np.arange(21.0).reshape(7, 3), source={"name": "emb"})
    flat = b.reshape(ids, (10,))
    out = b.add("gather", [table, flat], {"axis": 0})
    g = b.finish([out]).graph
    sets = make_inputs(g, 6, seed=3)
    assert [k for k, _ in sets] == ["normal", "uniform", "zeros", "edge", "normal", "uniform"]
    for _, (arr,) in sets:
        assert arr.dtype == np.int64 and arr.shape == (2, 5) and arr.min() >= 0 and arr.max() < 7
    assert sets[3][1][0].max() == 6  # edge values reach the last row
    again = make_inputs(g, 6, seed=3)
    assert all(np.array_equal(a[1][0], b[1][0]) for a, b in zip(sets, again))


def test_ulp_distance():
    one = np.float32(1.0)
    assert ulp_distance(np.array([one]), np.array([np.nextafter(one, np.float32(2))]))[0] == 1
    assert ulp_distance(np.array([0.0]), np.array([-0.0]))[0] == 0
    tiny = np.float32(np.finfo(np.float32).smallest_subnormal)
    assert ulp_distance(np.array([tiny]), np.array([-tiny]))[0] == 2
    assert ulp_distance(np.array([np.nan]), np.array([1.0]))[0] == np.inf


def test_report_json_and_table(net):
    m, bundle, ids = net
    report = tlb.diff(with_node(bundle, ids["norm"], eps=1e-2), against="torch", module=m, random=2)
    doc = json.loads(json.dumps(report.to_json(), allow_nan=False))
    assert doc["ok"] is False and doc["first_divergence"]["node"] == ids["norm"]
    assert {"node", "op", "counterpart", "max_abs", "max_rel", "max_ulp", "budget", "status"} <= set(doc["nodes"][0])
    text = str(report)
    assert f"node {ids['norm']}" in text and "diverged on input 0 (normal)" in text and "downstream" in text
    many = tlb.diff(bundle, against="torch", module=m, random=9)
    assert "9 input set(s): 4 normal, 3 uniform, 1 zeros, 1 edge;" in many.summary()


def test_given_inputs_are_checked():
    with pytest.raises(tlb.BridgeError, match="expected \\[4\\]"):
        tlb.diff(seed_fx_bundle(), against="torch", module=seed_module(), inputs=np.zeros(3))
    with pytest.raises(tlb.BridgeError, match="unknown oracle"):
        tlb.diff(seed_fx_bundle(), against="tensorflow")


# -- the command line -----------------------------------------------------------------------------

def _reference_file(tmp_path, m: nn.Module) -> str:
    torch.save(m.state_dict(), tmp_path / "net.pt")
    src = (f"import sys, torch\nsys.path.insert(0, {str(ROOT)!r})\nfrom tests.test_diff import Net\n\n"
           f"def make():\n    m = Net()\n    m.load_state_dict(torch.load({str(tmp_path / 'net.pt')!r}, weights_only=True))\n"
           f"    return m\n")
    (tmp_path / "ref.py").write_text(src)
    return f"{tmp_path / 'ref.py'}:make"


def test_cli_diff_exit_codes_table_and_json(net, tmp_path, capsys):
    from torchlean_bridge.app.cli import main
    m, bundle, ids = net
    ref = _reference_file(tmp_path, m)
    tlb.save(bundle, tmp_path / "good")
    tlb.save(with_node(bundle, ids["norm"], eps=1e-2), tmp_path / "bad")
    np.save(tmp_path / "x.npy", np.linspace(-1, 1, 72).reshape(1, 2, 6, 6))

    assert main(["diff", str(tmp_path / "good"), "--reference", ref, "--random", "3", "--per-node"]) == 0
    out = capsys.readouterr().out
    assert "diff against torch (fx): agree" in out and "node 1" in out and "fc2" in out

    code = main(["diff", str(tmp_path / "bad"), "--against", "torch", "--reference", ref,
                 "--input", str(tmp_path / "x.npy"), "--json", str(tmp_path / "r.json")])
    assert code == 1
    out = capsys.readouterr().out
    assert f"DIVERGED: node {ids['norm']} (layernorm, fx norm)" in out
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["first_divergence"]["node"] == ids["norm"] and doc["inputs"] == ["input 0"]

    assert main(["diff", str(tmp_path / "good"), "--against", "torch"]) == 2  # no reference
    assert "needs --reference" in capsys.readouterr().err
    assert main(["diff", str(tmp_path / "good"), "--against", "torch", "--reference", "nowhere.py:f"]) == 2


class Log(nn.Module):
    def forward(self, x):
        return torch.log(x)


def test_inputs_outside_our_domain_are_skipped_and_reported():
    """log of a non-positive value is undefined in our semantics (an error, never NaN)."""
    b = GraphBuilder("fx")
    x = b.input([8], source={"name": "x"})
    bundle = b.finish([b.add("log", [x], source={"name": "log"})])
    report = tlb.diff(bundle, against="torch", module=Log(), random=3)  # normal, uniform, zeros
    assert not report.ok and report.of_kind("no-inputs")
    assert len(report.of_kind("input-skipped")) == 3
    assert all(f.severity == "warning" and f.node == 1 for f in report.of_kind("input-skipped"))
    positive, mixed = np.linspace(0.5, 4.0, 8), np.linspace(-1.0, 2.0, 8)
    report = tlb.diff(bundle, against="torch", module=Log(), inputs=[[positive], [mixed]])
    assert report.ok and report.inputs == ["input 0", "input 1"]
    assert [f.message.split(":")[0] for f in report.of_kind("input-skipped")] == ["input 1"]


def test_a_node_scale_reaches_its_grandparents_and_behind_unshown_nodes():
    """An add of a product that cancels to 1e-13 inherits the product's rounding, made at its 1e-4
    operands: the add's budget floor is relative to them (a false divergence on timm's efficientvit
    otherwise). Beyond grandparents only nodes without a framework counterpart are looked through."""
    from torchlean_bridge.app.diff import _scale
    from torchlean_bridge.graph import Graph, Node
    nodes = [Node(0, [], "input", (2,)), Node(1, [0], "relu", (2,)), Node(2, [1], "relu", (2,)),
             Node(3, [2], "relu", (2,)), Node(4, [3], "relu", (2,))]
    g = Graph(nodes, [0], [4])
    ref = {0: np.array([5e-1, 0.0]), 1: np.array([1e-4, 0.0]), 2: np.array([1e-13, 0.0]),
           3: np.array([1e-13, 0.0]), 4: np.array([1e-13, 0.0])}
    assert _scale(g, 4, ref, {0, 1, 2, 3}, {}) == 1e-13  # parent 3 and grandparent 2 are tiny
    assert _scale(g, 3, ref, {0, 1, 2, 3}, {}) == 1e-4  # the grandparent 1
    assert _scale(g, 4, ref, {0, 1, 3}, {}) == 1e-4  # through 2, which the framework does not show
    assert _scale(g, 4, ref, {0, 3}, {}) == 5e-1
