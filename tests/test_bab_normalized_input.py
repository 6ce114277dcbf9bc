"""ReLU branch and bound on networks that normalize their input first (ERAN's and MNIST ONNX files:
``(x - mean) / std`` with scalar constants broadcast to the image, then a flatten): the broadcast
constants are rebatched so many subdomains share one CROWN pass, the elementwise affine maps are
``scale`` layers of the plain-float DAG (beta-CROWN, PGD and the branching scores go through them),
the plain DAG is the network, and the bounds beta-CROWN gives on split subdomains enclose every sampled
output."""

from __future__ import annotations

import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from semantics.evaluate import evaluate
from semantics.linear_bounds import Crown
from semantics.linear_bounds.batch_axis import with_batch
from semantics.linear_bounds.chain import chain_layers, dag_layers
from semantics.linear_bounds.splits import bound_domains, relu_nodes
from torchlean_bridge.app.bab import Dag, ReluBab
from torchlean_bridge.app.verify import load_model

SIDE, HIDDEN, N_OUT = 4, 12, 3
PREFIXES = {
    # ERAN: (x - mean) / std with scalar constants
    "normalize": [("Sub", "X", "mean", "a"), ("Div", "a", "std", "b")],
    # the other affine forms: a product, a constant minus x, a negation, an added constant
    "affine": [("Mul", "X", "k", "a"), ("Sub", "mean", "a", "t0"), ("Neg", "t0", None, "t1"), ("Add", "t1", "std", "b")],
}


def normalized_mlp(tmp_path, prefix: str, seed: int = 0):
    """X [1, 1, 4, 4] -> the prefix with [1, 1, 1, 1] constants -> flatten -> Gemm, Relu, Gemm, Relu, Gemm."""
    rng = np.random.default_rng(seed)
    n_in = SIDE * SIDE
    consts = {"mean": np.full((1, 1, 1, 1), 0.1307), "std": np.full((1, 1, 1, 1), 0.3081),
              "k": np.full((1, 1, 1, 1), -1.75),
              "w1": rng.standard_normal((HIDDEN, n_in)) / 2, "b1": rng.standard_normal(HIDDEN) * 0.3,
              "w2": rng.standard_normal((HIDDEN, HIDDEN)) / 3, "b2": rng.standard_normal(HIDDEN) * 0.3,
              "w3": rng.standard_normal((N_OUT, HIDDEN)) / 3, "b3": rng.standard_normal(N_OUT) * 0.3}
    nodes = [helper.make_node(op, [x] + ([y] if y else []), [out]) for op, x, y, out in PREFIXES[prefix]]
    nodes += [helper.make_node("Flatten", ["b"], ["f"]),
              helper.make_node("Gemm", ["f", "w1", "b1"], ["h1"], transB=1), helper.make_node("Relu", ["h1"], ["r1"]),
              helper.make_node("Gemm", ["r1", "w2", "b2"], ["h2"], transB=1), helper.make_node("Relu", ["h2"], ["r2"]),
              helper.make_node("Gemm", ["r2", "w3", "b3"], ["Y"], transB=1)]
    graph = helper.make_graph(
        nodes, "normalized_mlp", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 1, SIDE, SIDE])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, N_OUT])],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in consts.items()])
    path = tmp_path / f"normalized_{prefix}_{seed}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))
    return load_model(path)


def _outputs(model, xs: np.ndarray) -> np.ndarray:
    return np.stack([model.evaluate(x.reshape(model.input_shape), "float64").reshape(-1) for x in xs])


@pytest.mark.parametrize("prefix", sorted(PREFIXES))
def test_the_broadcast_constants_rebatch_and_the_prefix_is_a_chain_of_scale_layers(tmp_path, prefix):
    model = normalized_mlp(tmp_path, prefix)
    g = model.bundle.graph
    assert any(n.kind == "broadcast_to" and not n.parents == () for n in g.nodes)  # the scalar constants
    gb = with_batch(g, 6)
    assert gb is not None  # no payload change: the broadcast's target gets the batch
    xs = np.random.default_rng(1).uniform(0, 1, (6, 1, SIDE, SIDE))
    batched = np.asarray(evaluate(gb, model.bundle.payload, [xs], dtype="float64")[0])
    np.testing.assert_allclose(batched, _outputs(model, xs), rtol=1e-12, atol=1e-12)
    assert model.batched_crown(8) is not None
    dag, chain = dag_layers(model.crown), chain_layers(model.crown)
    assert dag is not None and chain is not None
    want = len(PREFIXES[prefix])
    assert sum(kind == "scale" for kind, *_ in dag[0]) == want == sum(kind == "scale" for kind, *_ in chain[0])


@pytest.mark.parametrize("prefix", sorted(PREFIXES))
def test_the_plain_dag_is_the_network_and_its_gradient_is_the_derivative(tmp_path, prefix):
    model = normalized_mlp(tmp_path, prefix)
    dag = Dag(model.crown, dag_layers(model.crown))
    xs = np.random.default_rng(2).uniform(0, 1, (7, SIDE * SIDE))
    y, keep = dag.forward(xs)
    np.testing.assert_allclose(y, _outputs(model, xs), rtol=1e-5, atol=1e-5)  # the file's float32 weights
    w = np.random.default_rng(3).standard_normal((7, N_OUT))
    grad = dag.gradient(keep, w)
    h = 1e-6
    for i in range(3):  # central differences along a few coordinates (the pattern is constant nearby)
        e = np.zeros(SIDE * SIDE)
        e[5 * i] = h
        fd = ((dag.forward(xs + e)[0] - dag.forward(xs - e)[0]) * w).sum(axis=1) / (2 * h)
        np.testing.assert_allclose(grad[:, 5 * i], fd, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("prefix", sorted(PREFIXES))
def test_beta_crown_on_split_subdomains_encloses_every_sampled_output(tmp_path, prefix):
    model = normalized_mlp(tmp_path, prefix, seed=4)
    n = 16
    crown = Crown(*_batched(model, n))
    relus = relu_nodes(crown)
    rng = np.random.default_rng(5)
    xs = rng.uniform(0.3, 0.4, (4000, SIDE * SIDE))
    dag = Dag(model.crown, dag_layers(model.crown))
    pre = _pre_activations(dag, xs, relus)
    # each subdomain fixes a random third of the units on the side one sample point has: never empty
    anchor = rng.choice(len(xs), n, replace=False)
    splits = {v: np.where(rng.random((n, HIDDEN)) < 1 / 3, np.where(pre[v][anchor] >= 0, 1, -1), 0).astype(np.int8)
              for v in relus}
    lo = np.full((n, 1, SIDE, SIDE), 0.3)
    hi = lo + 0.1
    c = rng.integers(-2, 3, (4, N_OUT)).astype(np.float64)
    r = bound_domains(crown, lo, hi, splits, c, method="beta-crown")
    assert r.method == "beta-crown"  # the multipliers apply through the scale layers
    ys = _outputs(model, xs) @ c.T
    checked = 0
    for i in range(n):
        inside = np.ones(len(xs), dtype=bool)
        for v in relus:
            s = splits[v][i]
            inside &= np.all(np.where(s > 0, pre[v] >= 0, np.where(s < 0, pre[v] <= 0, True)), axis=1)
        assert inside[anchor[i]] and not r.empty[i], i
        if inside.any():
            checked += 1
            assert np.all(r.lower[i] <= ys[inside].min(axis=0) + 1e-9), i
            assert np.all(r.upper[i] >= ys[inside].max(axis=0) - 1e-9), i
    assert checked == n


def _batched(model, n: int):
    from semantics.linear_bounds.batch_axis import with_batch_payload
    got = with_batch_payload(model.bundle.graph, model.bundle.payload, n)
    assert got is not None
    return got


def _pre_activations(dag: Dag, xs: np.ndarray, relus: list[int]) -> dict[int, np.ndarray]:
    """Each ReLU's input at the points, from the plain DAG (whose forward pass keeps them)."""
    vals = {dag.input: xs}
    for kind, v, parents, w, b in reversed(dag.layers):
        z = vals[parents[0]]
        vals[v] = {"affine": lambda: z @ w.T + b, "scale": lambda: z * w + b, "identity": lambda: z,
                   "relu": lambda: np.maximum(z, 0.0)}[kind]()
    return {v: vals[dict((u, p) for _, u, p, *_ in dag.layers)[v][0]] for v in relus}


def test_relu_bab_reuses_the_root_boxes_and_decides_both_ways(tmp_path):
    model = normalized_mlp(tmp_path, "normalize", seed=6)
    lo, hi = np.full((1, 1, SIDE, SIDE), 0.2), np.full((1, 1, SIDE, SIDE), 0.6)
    c = np.array([[1.0, -1.0, 0.0]])
    xs = np.random.default_rng(7).uniform(0.2, 0.6, (3000, SIDE * SIDE))
    sampled = float((_outputs(model, xs) @ c.T).min())
    root = float(model.crown(lo, hi, spec=c).spec_lower[0, 0])
    assert root < sampled
    below = root + 0.5 * (sampled - root)  # beyond one CROWN pass, below every sample
    search = ReluBab(model, lo, hi, c, np.array([below]), np.zeros(1), time.perf_counter() + 30, progress=False)
    assert search.reuse  # beta's DAG: children start from their parents' boxes
    out = search.run(np.array([root - below]))
    assert out.result == "unsat" and out.domains > 1, out
    above = sampled + 0.01 * abs(sampled)
    found = ReluBab(model, lo, hi, c, np.array([above]), np.zeros(1), time.perf_counter() + 30, progress=False,
                    check=lambda x: {"x": x} if float((_outputs(model, x.reshape(1, -1)) @ c.T)[0, 0]) <= above
                    else None).run(np.array([root - above]))
    assert found.result == "sat", found
    x = found.counterexample["x"].reshape(-1)
    assert np.all((x >= 0.2) & (x <= 0.6))


class _SmallCnn:
    """A 1x6x6 image -> conv 3x3 (4 channels, stride 1, pad 1) -> ReLU -> conv 3x3 stride 2 -> ReLU ->
    flatten -> linear 3, through torch.fx; its two convolutions as DAG layers."""

    @staticmethod
    def model():
        import torch
        import torch.nn as nn
        import torchlean_bridge as tlb
        from exporters.onnx import export_onnx
        from torchlean_bridge.app.verify import _Model
        torch.manual_seed(0)
        net = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 3, stride=2, padding=(1, 0)),
                            nn.ReLU(), nn.Flatten(), nn.Linear(4 * 3 * 2, 3)).eval()
        b = tlb.import_fx(net, (torch.zeros(1, 1, 6, 6),))
        return _Model(b, export_onnx(b).SerializeToString())


def test_a_convolution_too_large_to_densify_is_an_operator_with_the_dense_matrix_products(monkeypatch):
    import semantics.linear_bounds.chain as chain
    model = _SmallCnn.model()
    dense = chain.dag_layers.__wrapped__(model.crown, None)  # uncached: the two builds differ
    monkeypatch.setattr(chain, "MAX_DENSE", 16)
    model.crown.__dict__.pop("_affine_cache")  # the layers' matrices are built once per Crown
    ops = chain.dag_layers.__wrapped__(model.crown, None)
    convs = [(d, o) for d, o in zip(dense[0], ops[0]) if isinstance(o[3], chain.ConvOperator)]
    assert len(convs) == 2
    rng = np.random.default_rng(0)
    for d, o in convs:
        w = d[3]
        a = rng.standard_normal((2, 5, w.shape[0]))
        x = rng.standard_normal((7, w.shape[1]))
        np.testing.assert_allclose(a @ o[3], a @ w, rtol=1e-12, atol=1e-12)  # the transpose, on coefficient rows
        np.testing.assert_allclose(x @ o[3].T, x @ w.T, rtol=1e-12, atol=1e-12)  # the convolution, on values
        np.testing.assert_array_equal(o[4], d[4])
    xs = rng.uniform(-1, 1, (5, 36))
    y, _ = Dag(model.crown, ops).forward(xs)
    np.testing.assert_allclose(y, _outputs(model, xs), rtol=1e-10, atol=1e-10)


def test_bab_on_a_cnn_through_conv_operators_is_sound_and_attacks_without_crown_descent(monkeypatch):
    import semantics.linear_bounds.chain as chain
    from torchlean_bridge.app.verify import _Search, verify
    from torchlean_bridge.app.vnnlib import Case, Property
    monkeypatch.setattr(chain, "MAX_DENSE", 16)  # every convolution an operator
    model = _SmallCnn.model()
    # the CROWN-guided descent costs a CROWN pass per step: with a DAG, PGD replaces it
    monkeypatch.setattr(_Search, "_descend", lambda *a, **k: pytest.fail("CROWN descent with a plain DAG at hand"))
    lo, hi = np.full(36, -0.4), np.full(36, 0.4)
    xs = np.random.default_rng(1).uniform(lo, hi, (3000, 36))
    c = np.array([[1.0, -1.0, 0.0]])
    m = (_outputs(model, xs) @ c.T)[:, 0]
    root = float(model.crown(lo.reshape(1, 1, 6, 6), hi.reshape(1, 1, 6, 6), spec=c).spec_lower[0, 0])
    for t, want in ((root + 0.5 * (m.min() - root), ("unsat",)), (float(np.quantile(m, 0.01)), ("sat",))):
        prop = Property(36, 3, [Case(lo, hi, [(c, np.array([t]), np.zeros(1, dtype=bool))])])
        r = verify(model, prop, method="bab-relu", timeout=20)
        assert r.result in want, (t, r)
        if r.result == "sat":
            x = np.asarray(r.counterexample["x"])
            assert float((_outputs(model, x[None]) @ c.T)[0, 0]) <= t


@pytest.mark.parametrize("cfg", [
    dict(cin=1, cout=4, spatial=(6, 6), kernel=(3, 3), stride=(1, 1), padding=(1, 1), padding_after=(1, 1), dilation=(1, 1), groups=1),
    dict(cin=4, cout=6, spatial=(7, 5), kernel=(3, 2), stride=(2, 1), padding=(1, 0), padding_after=(0, 1), dilation=(1, 2), groups=2),
    dict(cin=3, cout=3, spatial=(5, 4), kernel=(5, 4), stride=(1, 1), padding=(0, 0), padding_after=(0, 0), dilation=(1, 1), groups=3),
    dict(cin=2, cout=5, spatial=(9,), kernel=(4,), stride=(3,), padding=(2,), padding_after=(1,), dilation=(1,), groups=1),
    dict(cin=2, cout=2, spatial=(3, 3), kernel=(1, 1), stride=(2, 2), padding=(0, 0), padding_after=(0, 0), dilation=(1, 1), groups=1),
])
def test_the_dense_matrix_of_a_convolution_is_its_identity_convolution(cfg):
    """chain._dense_conv writes the weights where each output's taps read; before, the matrix was the
    convolution of the identity, which on VNN-COMP 2022 collins_rul_cnn's full_window_40 (a 5x26x20 ->
    100x1x1 kernel over its whole input) ran for minutes past verify's deadline."""
    import semantics.linear_bounds.chain as chain
    from semantics.rules.affine import batched_conv
    rng = np.random.default_rng(0)
    r = len(cfg["spatial"])
    attrs = {"kernel": cfg["kernel"], "stride": cfg["stride"], "padding": cfg["padding"],
             "padding_after": cfg["padding_after"], "dilation": cfg["dilation"], "groups": cfg["groups"]}
    weight = rng.standard_normal((cfg["cout"], cfg["cin"] // cfg["groups"]) + cfg["kernel"])
    tail_in = (cfg["cin"],) + cfg["spatial"]
    n_in = int(np.prod(tail_in))
    eye = batched_conv(np.eye(n_in).reshape((n_in,) + tail_in), weight, attrs)
    tail_out = tuple(eye.shape[1:])
    assert len(tail_out) == r + 1
    want = eye.reshape(n_in, -1).T
    np.testing.assert_array_equal(chain._dense_conv(weight, attrs, tail_in, tail_out), want)


def test_a_kernel_as_large_as_its_input_densifies_at_once():
    """collins_rul_cnn's last convolution shape (5x26x20 -> 100x1x1): the identity convolution took
    minutes (verify's deadline is not checked while the layers are built); written from the weights, the
    layer is the flattened weight itself."""
    import torch
    import torch.nn as nn
    import semantics.linear_bounds.chain as chain
    import torchlean_bridge as tlb
    from torchlean_bridge.app.verify import _Model
    net = nn.Sequential(nn.Conv2d(5, 100, (26, 20)), nn.ReLU(), nn.Flatten(), nn.Linear(100, 2)).eval()
    b = tlb.import_fx(net, (torch.zeros(1, 5, 26, 20),))
    model = _Model(b, None)
    layers = chain.dag_layers(model.crown)
    conv = next(entry for entry in layers[0] if entry[0] == "affine" and entry[3].shape == (100, 2600))
    np.testing.assert_array_equal(conv[3], net[0].weight.detach().double().numpy().reshape(100, 2600))
