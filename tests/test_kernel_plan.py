"""Kernel planning (TorchLean's GraphKernelPlan), plan execution and plan diffs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import torchlean_bridge as tlb
from torchlean_bridge.app import kernel_plan as kp
from torchlean_bridge.app.kernel_plan import CATALOG, KernelPlan, KernelPolicy, PlanError, backend_op, plan_kernels
from torchlean_bridge.app.torch_kernels import TORCH_RULES
from torchlean_bridge.errors import BridgeError
from torchlean_bridge.graph import Graph, Node
from torchlean_bridge.ops.registry import REGISTRY
from torchlean_bridge.seed import SEED_X0, seed_mlp_bundle, seed_mlp_graph

ROOT = Path(__file__).resolve().parents[1]
SEED_PLAN = ([1, 2, 3, 4, 5], ["reference.linear", "reference.relu", "reference.linear", "reference.reduce_sum",
                               "reference.tanh"])


def test_seed_mlp_plan_is_the_chapters():
    plan = tlb.plan_kernels(seed_mlp_graph(), KernelPolicy())
    assert (plan.node_ids, plan.capsule_names) == SEED_PLAN
    assert str(plan) == ('(#[1, 2, 3, 4, 5], #["reference.linear", "reference.relu", "reference.linear", '
                         '"reference.reduce_sum", "reference.tanh"])')
    for k in plan:
        assert k.states == {"registered": True, "selectable": True, "executable": True, "proved": False}


# the spec's appendix A table: IR op -> reference capsule
APPENDIX_A = {"add": "add", "sub": "sub", "mul_elem": "mul", "abs": "abs", "sqrt": "sqrt", "inv": "inv",
              "max_elem": "max", "min_elem": "min", "relu": "relu", "tanh": "tanh", "sigmoid": "sigmoid",
              "softplus": "softplus", "exp": "exp", "log": "log", "sin": "sin", "cos": "cos", "safe_log": "safe_log",
              "mse_loss": "mse_loss", "matmul": "matmul", "linear": "linear", "conv": "conv", "max_pool": "max_pool",
              "avg_pool": "avg_pool", "broadcast_to": "broadcast", "reduce_sum": "reduce_sum", "sum": "reduce_sum",
              "reduce_mean": "reduce_mean", "softmax": "softmax", "hard_masked_softmax": "hard_masked_softmax",
              "layernorm": "layer_norm", "reshape": "reshape", "flatten": "reshape", "concat": "concat",
              "transpose": "permute", "permute": "permute", "batch_norm_eval": "batch_norm",
              "rand_uniform": "rand_uniform", "bernoulli_mask": "bernoulli_mask"}


def _reference_capsule(op: str) -> kp.KernelCapsule:
    found = [c for c in CATALOG if c.op == op and c.provider == "reference" and c.device == "cpu"]
    assert len(found) == 1, op
    return found[0]


def test_every_registry_op_has_a_mapping():
    for kind in ("input", "const", "detach"):
        assert backend_op(kind) is None
    for kind, op in APPENDIX_A.items():
        assert backend_op(kind) == op
        assert _reference_capsule(op).name == f"reference.{op}" and not _reference_capsule(op).ext
    for kind, spec in REGISTRY.items():
        op = backend_op(kind)
        if spec.dialect == "ext":
            capsule = _reference_capsule(op)
            assert op == kind and capsule.name == f"reference.{kind}" and capsule.ext
        elif op is not None and kind != "custom":
            _reference_capsule(op)


def test_no_admissible_capsule_error_text():
    g = seed_mlp_graph()
    with pytest.raises(PlanError) as e:
        plan_kernels(g, KernelPolicy(device="cuda", devices=("cpu",)))
    assert str(e.value) == "no admissible kernel capsule for op linear on device cuda"
    custom = Graph([Node(0, [], "input", [2]),
                    Node(1, [0], "custom", [2], {"name": "f", "input_shapes": [[2]], "output_shape": [2]})],
                   inputs=[0], outputs=[1])
    with pytest.raises(PlanError, match=r"^no admissible kernel capsule for op custom on device cpu$"):
        plan_kernels(custom)
    with pytest.raises(BridgeError, match="unknown device quantum"):
        plan_kernels(g, device="quantum")


def test_preferring_a_provider_this_build_lacks_fails_at_the_backend_boundary():
    g = seed_mlp_graph()
    tlb.check(g)  # the graph itself is fine
    policy = KernelPolicy(prefer="libtorch", providers=("reference",))
    with pytest.raises(PlanError) as e:
        plan_kernels(g, policy)
    assert str(e.value).startswith("no admissible kernel capsule for op linear on device cpu")
    assert "libtorch is not available" in str(e.value) and e.value.node == 1
    with pytest.raises(PlanError, match="provider cudnn is not available"):
        plan_kernels(g, prefer="cudnn")


def test_prefer_searches_first_and_falls_back_only_refuses():
    g = Graph([Node(0, [], "input", [3]), Node(1, [0], "relu", [3]), Node(2, [], "rand_uniform", [3], {"seed": 1}),
               Node(3, [1, 2], "add", [3])], inputs=[0], outputs=[3])
    plan = plan_kernels(g, prefer="libtorch")
    assert plan.capsule_names == ["libtorch.relu", "reference.rand_uniform", "libtorch.add"]  # no torch stream
    with pytest.raises(PlanError, match="op rand_uniform on device cpu"):
        plan_kernels(g, KernelPolicy(prefer="libtorch", only=True))


def test_registered_is_not_selectable():
    policy = KernelPolicy(devices=("cpu",))
    cuda = [c for c in CATALOG if c.device == "cuda"]
    assert {c.module for c in cuda} == {"attention", "libtorch"}
    for c in cuda:
        states = kp.capsule_states(c, "linear", policy)
        assert states["registered"] and not states["selectable"] and not states["executable"] and not states["proved"]
    attention_ops = {c.op for c in CATALOG if c.module == "attention"}
    assert not attention_ops & set(kp.BACKEND_OPS.values())  # registered, never selected by an IR node


def test_plan_json_round_trip_and_saved_beside_a_bundle(tmp_path):
    from exporters.folder import save
    b = seed_mlp_bundle()
    folder = save(b, tmp_path / "b")
    plan = plan_kernels(b.graph, prefer="libtorch")
    target = tlb.save_plan(plan, folder)
    assert target == folder / "kernel_plan.json"
    again = tlb.load_plan(folder, b.graph)
    assert again == plan and again.capsule_names == plan.capsule_names
    other = Graph([Node(0, [], "input", [4]), Node(1, [0], "relu", [4])], inputs=[0], outputs=[1])
    with pytest.raises(BridgeError, match="different graph"):
        tlb.load_plan(folder, other)
    doc = json.loads(target.read_text())
    doc["kernels"][0]["capsule"] = "fast.linear"
    with pytest.raises(BridgeError, match="not registered"):
        KernelPlan.from_json(doc)


def test_evaluate_with_the_reference_plan_is_the_reference_bit_for_bit():
    b = seed_mlp_bundle()
    plan = plan_kernels(b.graph)
    for dtype in ("float64", "float32"):
        ref = tlb.evaluate(b.graph, b.payload, SEED_X0, dtype=dtype, all_nodes=True)
        got = tlb.evaluate(b.graph, b.payload, SEED_X0, dtype=dtype, all_nodes=True, plan=plan)
        for r, v in zip(ref, got):
            assert r.dtype == v.dtype and np.array_equal(r, v)


def _torch_mlp():
    torch = pytest.importorskip("torch")
    from torchlean_bridge.app.commands.demo import seed_module
    return torch, seed_module()


def test_libtorch_plan_runs_through_torch_and_agrees_with_it():
    torch, module = _torch_mlp()
    b = seed_mlp_bundle()
    plan = plan_kernels(b.graph, prefer="libtorch")
    assert set(plan.providers_used()) == {"libtorch"}
    got = tlb.evaluate(b.graph, b.payload, SEED_X0, dtype="float32", plan=plan)[0]
    want = module(torch.tensor(SEED_X0, dtype=torch.float32)).detach().numpy()
    assert got.dtype == np.float32 and got == want  # the same torch kernels on the same float32 operands


UNARY_DOMAIN = {"sqrt": (0.1, 3), "rsqrt": (0.1, 3), "log": (0.1, 3), "log2": (0.1, 3), "log1p": (-0.5, 3),
                "asin": (-0.9, 0.9), "acos": (-0.9, 0.9), "atanh": (-0.9, 0.9), "acosh": (1.1, 3)}


def test_each_torch_rule_agrees_with_the_reference():
    pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    checked = 0
    for kind in sorted(TORCH_RULES):
        spec = REGISTRY[kind]
        if spec.min_parents != 1 or spec.max_parents != 1 or spec.attrs or spec.params:
            continue
        lo, hi = UNARY_DOMAIN.get(kind, (-3, 3))
        out = spec.infer({}, [(3, 4)], (3, 4))
        g = Graph([Node(0, [], "input", [3, 4]), Node(1, [0], kind, out)], inputs=[0], outputs=[1])
        if kind in ("logical_not", "isnan"):  # bool operands or results
            continue
        x = rng.uniform(lo, hi, (3, 4))
        ref = tlb.evaluate(g, None, x)[0]
        got = tlb.evaluate(g, None, x, plan=plan_kernels(g, prefer="libtorch"))[0]
        assert got.dtype == ref.dtype
        np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-14, err_msg=kind)
        checked += 1
    assert checked >= 30


def test_torch_rules_on_a_convolutional_model():
    torch = pytest.importorskip("torch")
    from torch import nn
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(2, 3, 3, padding=1, stride=2), nn.BatchNorm2d(3), nn.ReLU(), nn.MaxPool2d(2),
                      nn.Conv2d(3, 4, 1), nn.AvgPool2d(2, padding=1), nn.Flatten(), nn.LayerNorm(16),
                      nn.Linear(16, 5), nn.Softmax(dim=-1)).eval()
    with torch.no_grad():
        m[1].running_mean.uniform_(-1, 1)
        m[1].running_var.uniform_(0.5, 2)
    b = tlb.import_fx(m, (torch.zeros(2, 2, 9, 9),))
    plan = plan_kernels(b.graph, prefer="libtorch")
    assert all(k.capsule.provider == "libtorch" for k in plan)
    x = np.random.default_rng(1).standard_normal((2, 2, 9, 9))
    ref = tlb.evaluate(b.graph, b.payload, x, all_nodes=True)
    got = tlb.evaluate(b.graph, b.payload, x, all_nodes=True, plan=plan)
    for i, (r, v) in enumerate(zip(ref, got)):
        np.testing.assert_allclose(v, r, rtol=1e-10, atol=1e-12, err_msg=f"node {i}")
    with torch.no_grad():
        np.testing.assert_allclose(got[-1], m(torch.tensor(x, dtype=torch.float32)).numpy(), atol=1e-5)


def test_libtorch_refuses_what_the_reference_refuses():
    pytest.importorskip("torch")
    g = Graph([Node(0, [], "input", [3]), Node(1, [0], "log", [3])], inputs=[0], outputs=[1])
    x = np.array([1.0, -1.0, 2.0])
    with pytest.raises(BridgeError) as ref:
        tlb.evaluate(g, None, x)
    with pytest.raises(BridgeError) as lib:
        tlb.evaluate(g, None, x, plan=plan_kernels(g, prefer="libtorch"))
    assert str(lib.value) == str(ref.value) and lib.value.node == 1


def test_a_stale_plan_is_refused():
    b = seed_mlp_bundle()
    plan = plan_kernels(b.graph)
    other = Graph([Node(0, [], "input", [4]), Node(1, [0], "relu", [4])], inputs=[0], outputs=[1])
    with pytest.raises(BridgeError, match="different graph"):
        tlb.evaluate(other, None, np.zeros(4), plan=plan)


def test_diff_two_plans_catches_a_provider_disagreement_where_it_starts(monkeypatch):
    torch = pytest.importorskip("torch")
    b = seed_mlp_bundle()
    libtorch = plan_kernels(b.graph, prefer="libtorch")
    assert tlb.diff(b, against="plan", plan=libtorch, random=4).ok
    # a libtorch relu that leaks negative values: the report must point at node 2, not downstream
    monkeypatch.setitem(TORCH_RULES, "relu", lambda node, xs, rec: torch.nn.functional.leaky_relu(xs[0], 0.5))
    report = tlb.diff(b, against="plan", plan=libtorch, random=4)
    assert not report.ok and report.first_divergence.node == 2
    assert [r.status for r in report.nodes[3:]] == ["downstream"] * 3


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "torchlean_bridge", *args], cwd=ROOT, capture_output=True, text=True)


def test_plan_cli(tmp_path):
    from exporters.folder import save
    folder = save(seed_mlp_bundle(), tmp_path / "b")
    r = _cli("plan", str(folder), "--json", "--save")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert (doc["node_ids"], doc["capsule_names"]) == SEED_PLAN
    assert json.loads((folder / "kernel_plan.json").read_text())["capsule_names"] == SEED_PLAN[1]
    r = _cli("plan", str(folder))
    assert r.returncode == 0 and str(plan_kernels(seed_mlp_graph())) in r.stdout
    r = _cli("plan", str(folder), "--prefer", "cudnn")
    assert r.returncode == 1 and "no admissible kernel capsule for op linear on device cpu" in r.stderr
    r = _cli("plan", str(folder), "--prefer", "nonsense")
    assert r.returncode == 2 and "unknown provider" in r.stderr


def test_a_plan_saved_beside_a_bundle_survives_loading_and_goes_with_a_new_save(tmp_path):
    from exporters.folder import save
    b = seed_mlp_bundle()
    folder = save(b, tmp_path / "b")
    tlb.save_plan(plan_kernels(b.graph), folder)
    assert tlb.load(folder) == b  # the plan is not a bundle file
    save(b, folder)  # replacing the bundle replaces its folder, stale plan included
    assert not (folder / "kernel_plan.json").exists()


def test_eval_cli_with_a_saved_plan(tmp_path):
    from exporters.folder import save
    b = seed_mlp_bundle()
    folder = save(b, tmp_path / "b")
    np.save(tmp_path / "x.npy", SEED_X0)
    assert _cli("plan", str(folder), "--prefer", "libtorch", "--save").returncode == 0
    r = _cli("eval", str(folder), "--input", str(tmp_path / "x.npy"), "--plan", str(folder), "--all-nodes",
             "--full")
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[4:] == ["node 4: 0.027720", "node 5: 0.027713"]


def test_policy_forms_and_plan_comparison_with_torchleans_pair():
    g = seed_mlp_graph()
    plan = plan_kernels(g)
    assert plan == SEED_PLAN and plan == (tuple(SEED_PLAN[0]), tuple(SEED_PLAN[1]))
    assert plan_kernels(g, "cpu") == plan == plan_kernels(g, {"device": "cpu"})
    assert plan_kernels(g, {"preferred": "libtorch"}).capsule_names[0] == "libtorch.linear"
    with pytest.raises(BridgeError, match="unknown policy field"):
        plan_kernels(g, {"backend": "libtorch"})
    k = plan.kernels[0]
    assert (k.registered, k.selectable, k.executable, k.proved) == (True, True, True, False)
