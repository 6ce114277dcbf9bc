"""Deterministic initialization: TorchLean's seeded initializer (architecture chapter) and zeros."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import torchlean_bridge as tlb
from torchlean_bridge.bundle import Bundle
from torchlean_bridge.errors import BridgeError
from torchlean_bridge.graph import Graph, Node
from torchlean_bridge.seeded_init import splitmix64, unit_samples, xavier_uniform
from torchlean_bridge.app.commands.demo_init_plan import mlp_231_bundle

ROOT = Path(__file__).resolve().parents[1]
CHAPTER = {(1, "weight"): [[-0.435614, 0.404103], [-0.418974, -0.588339], [0.596124, -0.950010]],
           (1, "bias"): [0, 0, 0], (3, "weight"): [[-0.112675, -0.745444, 0.214802]], (3, "bias"): [0]}


def test_splitmix64_reference_values():
    # the first outputs of the splitmix64 generator seeded with 0 (Vigna's reference implementation)
    assert int(splitmix64(0)) == 0xE220A8397B1DCDAF
    assert int(splitmix64(0x9E3779B97F4A7C15)) == 0x6E789E6AA1B965F4
    assert int(splitmix64(2 ** 64 - 1)) == int(splitmix64(np.uint64(2 ** 64 - 1)))  # wraps, no error


def test_the_chapters_four_tensors():
    payload = tlb.init_params(mlp_231_bundle(), scheme="torchlean", seed=0)
    assert len(payload) == 4
    for (node, role), want in CHAPTER.items():
        got = payload.get(node, role)
        assert got.shape == np.shape(want)
        assert np.round(got, 6).tolist() == want
        if role == "bias":
            assert not got.any()  # exactly zero


def test_forward_and_loss_are_the_chapters():
    b = mlp_231_bundle()
    payload = tlb.init_params(b)
    y = tlb.evaluate(b.graph, payload, np.array([0.5, 0.8]))[0]
    assert f"{y[0]:.6f}" == "-0.011884"
    assert f"{(y[0] - 1.0) ** 2:.6f}" == "1.023910"


def test_pytorch_with_the_printed_tensors_agrees():
    torch = pytest.importorskip("torch")
    from torchlean_bridge.app.commands.demo_init_plan import _torch_forward
    payload = tlb.init_params(mlp_231_bundle())
    printed = [np.round(payload.get(n, r), 6) for n, r in CHAPTER]
    forward, mse = _torch_forward(printed)
    assert forward == -0.011884444393217564 and mse == 1.0239101648330688
    assert torch.get_default_dtype() == torch.float32


def test_occurrence_index_advances_only_at_layers_that_count():
    with_relu = mlp_231_bundle()
    without = Bundle(Graph([Node(0, [], "input", [2]), Node(1, [0], "linear", [3]), Node(2, [1], "linear", [1])],
                           inputs=[0], outputs=[2]))
    a, b = tlb.init_params(with_relu), tlb.init_params(without)
    assert np.array_equal(a.get(3, "weight"), b.get(2, "weight"))  # relu does not advance the index
    assert np.array_equal(a.get(3, "weight"), xavier_uniform(1, 3, 1))
    # a layer inserted in front moves every later layer to the next index
    deeper = Bundle(Graph([Node(0, [], "input", [2]), Node(1, [0], "linear", [2]), Node(2, [1], "linear", [3]),
                           Node(3, [2], "relu", [3]), Node(4, [3], "linear", [1])], inputs=[0], outputs=[4]))
    c = tlb.init_params(deeper)
    assert np.array_equal(c.get(4, "weight"), xavier_uniform(1, 3, 2))
    assert not np.array_equal(c.get(4, "weight"), a.get(3, "weight"))


def test_seed_offsets_each_layer_seed():
    p = tlb.init_params(mlp_231_bundle(), seed=5)
    assert np.array_equal(p.get(1, "weight"), xavier_uniform(3, 2, 5))
    assert np.array_equal(p.get(3, "weight"), xavier_uniform(1, 3, 6))
    assert tlb.init_params(mlp_231_bundle(), seed=5) == p  # reproducible
    limit = np.sqrt(6 / 5)
    w = p.get(1, "weight")
    assert np.all(np.abs(w) <= limit)
    u = unit_samples(7, 10000)
    assert u.min() >= 0 and u.max() < 1 and abs(u.mean() - 0.5) < 0.01
    with pytest.raises(BridgeError, match="seed"):
        tlb.init_params(mlp_231_bundle(), seed=-1)


def _conv_graph(groups: int = 1) -> Graph:
    return Graph([Node(0, [], "input", [2, 4, 4]),
                  Node(1, [0], "conv", [2, 4, 4], {"spatial_rank": 2, "kernel": [3, 3], "stride": [1, 1],
                                                   "padding": [1, 1], "padding_after": [1, 1], "dilation": [1, 1],
                                                   "groups": groups, "channel_axis": 0, "in_channels": 2,
                                                   "out_channels": 2}),
                  Node(2, [1], "batch_norm_eval", [2, 4, 4], {"channel_axis": 0, "channels": 2, "eps": 1e-5}),
                  Node(3, [2], "flatten", [32], {"value_shape": [2, 4, 4]}),
                  Node(4, [3], "linear", [3])], inputs=[0], outputs=[4])


def test_conv_and_batch_norm_follow_torchleans_spatial_primitives():
    g = _conv_graph()
    tlb.check(g)
    p = tlb.init_params(Bundle(g))
    # conv at occurrence 0: kernel uniform(-0.1, 0.1) from seed 2*0, row-major; bias zero
    kernel = p.get(1, "weight")
    assert kernel.shape == (2, 2, 3, 3)
    assert np.array_equal(kernel.reshape(-1), -0.1 + unit_samples(0, 36) * 0.2)
    assert np.all(np.abs(kernel) <= 0.1) and not p.get(1, "bias").any()
    # batch norm counts as a layer (occurrence 1): scale and running variance one, shift and mean zero
    assert p.get(2, "weight").tolist() == [1.0, 1.0] and p.get(2, "running_var").tolist() == [1.0, 1.0]
    assert p.get(2, "bias").tolist() == [0.0, 0.0] and p.get(2, "running_mean").tolist() == [0.0, 0.0]
    # so the linear head is occurrence 2
    assert np.array_equal(p.get(4, "weight"), xavier_uniform(3, 32, 2))
    # a conv at a later occurrence i draws from seed 2i
    shifted = tlb.init_params(Bundle(g), seed=3)
    assert np.array_equal(shifted.get(1, "weight").reshape(-1), -0.1 + unit_samples(6, 36) * 0.2)
    assert np.array_equal(shifted.get(4, "weight"), xavier_uniform(3, 32, 5))


def test_zeros_scheme_and_refusals():
    grouped = Bundle(_conv_graph(groups=2))
    tlb.check(grouped.graph)
    with pytest.raises(BridgeError, match=r"node 1 \(conv\): TorchLean's conv primitive has no groups") as e:
        tlb.init_params(grouped)
    assert e.value.node == 1 and e.value.op == "conv"
    zeros = tlb.init_params(grouped, scheme="zeros")
    assert zeros.get(1, "weight").shape == (2, 1, 3, 3) and not zeros.get(1, "weight").any()
    assert not zeros.get(2, "running_var").any() and zeros.get(4, "weight").shape == (3, 32)
    ln = Graph([Node(0, [], "input", [2, 4]), Node(1, [0], "layernorm", [2, 4], {"axis": 1, "eps": 1e-5})],
               inputs=[0], outputs=[1])
    ln_bundle = Bundle(ln, tlb.Payload({1: {"weight": np.ones(4), "bias": np.zeros(4)}}))
    with pytest.raises(BridgeError, match=r"node 1 \(layernorm\): no TorchLean initializer"):
        tlb.init_params(ln_bundle)
    with pytest.raises(BridgeError, match="unknown scheme"):
        tlb.init_params(grouped, scheme="kaiming")


def test_unbound_constants_are_kept():
    g = Graph([Node(0, [], "input", [2]), Node(1, [], "const", [2], {"value_shape": [2]}),
               Node(2, [0, 1], "add", [2]), Node(3, [2], "linear", [1])], inputs=[0], outputs=[3])
    b = Bundle(g, tlb.Payload({1: {"values": np.array([1.0, 2.0])}}))
    p = tlb.init_params(b)
    assert np.array_equal(p.get(1, "values"), [1.0, 2.0]) and p.get(3, "weight").shape == (1, 2)


def test_init_cli(tmp_path):
    from exporters.folder import save
    folder = save(mlp_231_bundle(), tmp_path / "b")
    r = subprocess.run([sys.executable, "-m", "torchlean_bridge", "init", str(folder), "-o", str(tmp_path / "i")],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "[[-0.435614, 0.404103], [-0.418974, -0.588339], [0.596124, -0.950010]]" in r.stdout
    loaded = tlb.load(tmp_path / "i")
    assert loaded.payload == tlb.init_params(mlp_231_bundle())
    r = subprocess.run([sys.executable, "-m", "torchlean_bridge", "init", str(folder), "-o", str(tmp_path / "z"),
                        "--scheme", "zeros", "--seed", "3"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0 and not tlb.load(tmp_path / "z").payload.get(1, "weight").any()
