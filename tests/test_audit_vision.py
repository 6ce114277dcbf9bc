"""The audit's test matrix on vision models built with random weights, imported through
torch.export: torchvision's ViT (fused ``in_proj_weight``/``in_proj_bias``, layers named
``encoder_layer_N``) and a ResNet (BasicBlocks, batch norm). Each conversion bug is named exactly,
the same in the text report and its JSON, with the trusted module and with golden outputs only.
Bundles are imported from differently seeded models, so their payloads hold no trusted value."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tests.torchvision_cpu import define_missing_ops

define_missing_ops()  # torchvision's compiled ops do not load with the CPU torch (see tests/torchvision_cpu.py)

import torchlean_bridge as tlb  # noqa: E402
from torchlean_bridge.app.audit import audit  # noqa: E402
from tests.test_audit_models import exchange  # noqa: E402

pytestmark = pytest.mark.slow  # torchvision and two torch.export imports; the file takes ~15 s here
BOUND_S = 10.0  # golden-only search on these models: at most 70 hypotheses, under 0.2 s per named case measured
L = "encoder.layers.encoder_layer_"
W, B = L + "1.self_attention.in_proj_weight", L + "1.self_attention.in_proj_bias"
OUT = L + "2.self_attention.out_proj.weight"
HEADS, HD = 2, 4


def vit(seed: int):
    from torchvision.models.vision_transformer import VisionTransformer
    torch.manual_seed(seed)
    model = VisionTransformer(image_size=16, patch_size=8, num_layers=3, num_heads=HEADS, hidden_dim=HEADS * HD,
                              mlp_dim=16, num_classes=5)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
    return model.double().eval()


def resnet(seed: int):
    from torchvision.models.resnet import BasicBlock, ResNet

    from tests.model_zoo import _randomize_bn
    torch.manual_seed(seed)
    return _randomize_bn(ResNet(BasicBlock, [2, 2, 1, 1], num_classes=10)).double().eval()


def built(make):
    model = make(0)
    bundle = tlb.import_export(make(1), (torch.zeros(1, 3, 16, 16, dtype=torch.float64),))
    ref = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    xs = [np.random.default_rng(k).standard_normal((1, 3, 16, 16)) for k in range(2)]
    with torch.no_grad():
        golden = [[model(torch.tensor(x)).numpy()] for x in xs]
    return model, bundle, ref, xs, golden


@pytest.fixture(scope="module")
def vit_setup():
    return built(vit)


@pytest.fixture(scope="module")
def resnet_setup():
    return built(resnet)


def rotated(sd: dict) -> dict:
    out = dict(sd)
    for k in sd:
        if k.startswith(L):
            i = int(k[len(L)])
            out[k] = sd[f"{L}{(i - 1) % 3}{k[len(L) + 1:]}"]
    return out


def thirds(a: np.ndarray, order: tuple[int, int, int]) -> np.ndarray:
    parts = np.split(a, 3, axis=0)
    return np.concatenate([parts[i] for i in order], axis=0)


def interleaved(a: np.ndarray) -> np.ndarray:
    """[Q, K, V] with heads inside each -> [Q0, K0, V0, Q1, K1, V1] (rows, axis 0)."""
    return a.reshape((3, HEADS, HD) + a.shape[1:]).swapaxes(0, 1).reshape(a.shape)


def q_heads_exchanged(a: np.ndarray) -> np.ndarray:
    out = a.copy()
    out[:HD], out[HD:2 * HD] = a[HD:2 * HD], a[:HD]
    return out


def keys_of(sd: dict, *prefixes: str) -> tuple[str, ...]:
    return tuple(sorted(k for k in sd if any(k.startswith(p + ".") for p in prefixes)))


def vit_case(ref: dict, case: str) -> dict:
    if case == "blocks":
        return exchange(ref, L + "0", L + "2")
    if case == "rotated":
        return rotated(ref)
    if case == "qkv":
        return dict(ref, **{W: thirds(ref[W], (0, 2, 1)), B: thirds(ref[B], (0, 2, 1))})
    if case == "interleave":
        return dict(ref, **{W: interleaved(ref[W]), B: interleaved(ref[B])})
    if case == "heads":
        return dict(ref, **{W: q_heads_exchanged(ref[W]), B: q_heads_exchanged(ref[B])})
    if case == "transposed":
        return dict(ref, **{OUT: ref[OUT].T.copy()})
    raise AssertionError(case)


KV = "thirds{} reordered: K and V exchanged (stored as [Q, V, K], reference [Q, K, V]; 8 wide)"
INTERLEAVE = ("interleaved{}: per-head interleave, [Q0, K0, V0, Q1, ...] for the reference's [Q0..Q1, K.., V..] (6 "
              "slices, 4 wide)")
HEAD_PAIR = "Q heads 0 <-> 1 exchanged{} (2 heads per third, 4 wide)"
# case -> (kind, [message up to its figures, with trusted weights (one per key) | golden only])
VIT_NAMED = {
    "blocks": ("block_swap", [f"block {L}0 <-> {L}2 exchanged (24 tensors)"] * 2),
    "rotated": ("layer_shift", [f"every layer of encoder.layers.encoder_layer rotated by +1: layer i holds the "
                                f"reference's layer (i - 1) mod 3 (36 tensors)"] * 2),
    "qkv": ("reordered", [f"{W}: {KV.format(' along axis 0')}", f"{B}: {KV.format(' along axis 0')}",
                          f"{B}, {W}: {KV.format('')}"]),
    "interleave": ("reordered", [f"{W}: {INTERLEAVE.format(' along axis 0')}",
                                 f"{B}: {INTERLEAVE.format(' along axis 0')}", f"{B}, {W}: {INTERLEAVE.format('')}"]),
    "heads": ("reordered", [f"{W}: {HEAD_PAIR.format(' along axis 0')}", f"{B}: {HEAD_PAIR.format(' along axis 0')}",
                            f"{B}, {W}: {HEAD_PAIR.format('')}"]),
    "transposed": ("transpose", [f"transpose {OUT}"] * 2),
}


def audited(setup, sd, mode: str, **kw):
    model, bundle, _, xs, golden = setup
    if mode == "module":
        return audit(bundle, sd, reference=model, **kw)
    return audit(bundle, sd, reference=golden, inputs=[[x] for x in xs], **kw)


def assert_named(report, kind: str, messages: list[str], mode: str) -> None:
    """The findings naming the bug, in the text and the JSON, with agreement once all are undone."""
    assert [(f.kind, f.message.split(": max error")[0]) for f in report.swaps] == [(kind, m) for m in messages]
    assert report.error_before > 1e-3 and report.error_after < 1e-9 and report.swaps[-1].data["error_after"] < 1e-9
    text = str(report)
    assert all(f"[error] {kind}: {m}: max error " in text for m in messages) and "unresolved" not in text
    doc = json.loads(json.dumps(report.to_json()))
    assert [f["message"] for f in doc["findings"] if f["kind"] == kind] == [f.message for f in report.swaps]
    assert doc["swaps"] == [list(f.keys) for f in report.swaps]
    if mode == "golden":
        assert not report.search["bounded"] and report.search["time_s"] < BOUND_S, report.search


@pytest.mark.parametrize("mode", ["module", "golden"])
@pytest.mark.parametrize("case", sorted(VIT_NAMED))
def test_vit_conversion_bugs_are_named_exactly(vit_setup, case, mode):
    kind, messages = VIT_NAMED[case]
    if len(messages) == 3:  # one finding per key by hash; one for the module's tensors by evaluation
        messages = messages[:2] if mode == "module" else messages[2:]
    else:
        messages = messages[:1]
    report = audited(vit_setup, vit_case(vit_setup[2], case), mode)
    assert_named(report, kind, messages, mode)
    if case == "blocks":
        assert report.swaps[0].keys == keys_of(vit_setup[2], L + "0", L + "2")


@pytest.mark.parametrize("mode", ["module", "golden"])
def test_vit_clean_passes_and_a_perturbed_tensor_is_different_values(vit_setup, mode):
    ref = vit_setup[2]
    assert audited(vit_setup, ref, mode).ok
    key = L + "1.mlp.0.bias"
    sd = dict(ref, **{key: ref[key] + np.random.default_rng(3).standard_normal(16) * 0.05})
    report = audited(vit_setup, sd, mode)
    assert report.swaps == [] and not report.ok and not report.of_kind("partial")
    if mode == "module":
        (f,) = report.of_kind("different_values")
        assert f.keys == (key,) and f.message.startswith(f"{key}: different values (16 of 16 differ, max |diff| ")
    else:
        (f,) = report.of_kind("unresolved")
        assert "different values, which golden outputs alone cannot place" in f.message
        assert "(the best single exchange" not in f.message


@pytest.mark.parametrize("mode", ["module", "golden"])
def test_resnet_blocks_exchanged(resnet_setup, mode):
    ref = resnet_setup[2]
    report = audited(resnet_setup, exchange(ref, "layer1.0", "layer1.1"), mode)
    assert_named(report, "block_swap", ["block layer1.0 <-> layer1.1 exchanged (20 tensors)"], mode)
    assert report.swaps[0].keys == tuple(k for k in keys_of(ref, "layer1.0", "layer1.1")
                                         if not k.endswith("num_batches_tracked"))


@pytest.mark.parametrize("mode", ["module", "golden"])
def test_resnet_clean_passes_and_its_observability_check_keeps_the_time_limit(resnet_setup, mode):
    assert audited(resnet_setup, resnet_setup[2], mode, time_limit=2.0).ok
    if mode == "golden":  # many same-shape batch-norm tensors: the exchanges' observability check is bounded
        report = audited(resnet_setup, resnet_setup[2], mode, time_limit=0.0)
        (bounded,) = report.of_kind("search_bounded")
        assert report.ok and bounded.data["tried"] == 0 and bounded.data["of"] > 0


@pytest.mark.parametrize("mode", ["module", "golden"])
def test_resnet_perturbed_conv_is_different_values_and_no_invented_exchange(resnet_setup, mode):
    ref = resnet_setup[2]
    key = "layer2.0.conv1.weight"
    sd = dict(ref, **{key: ref[key] + np.random.default_rng(3).standard_normal(ref[key].shape) * 0.01})
    report = audited(resnet_setup, sd, mode, time_limit=3.0)  # golden: single exchanges stop at the bound
    assert report.swaps == [] and not report.ok and not report.of_kind("partial")
    if mode == "module":
        (f,) = report.of_kind("different_values")
        assert f.keys == (key,) and f.data["error_after"] < 1e-9
        (where,) = report.of_kind("first_departure")
        assert where.keys == (key,)
    else:
        (f,) = report.of_kind("unresolved")
        assert "(the best single exchange" not in f.message
