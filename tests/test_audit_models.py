"""Weight audits on real architectures: Hugging Face GPT-2 (its own initialisation, so many tensors
are equal: layer-norm ones, zero biases), torchvision's ResNet-18 and a small ViT (fused in_proj,
layers named ``encoder_layer_N``). Each conversion bug is named exactly; the clean weights pass."""

import numpy as np
import pytest
import torch

from tests.torchvision_cpu import define_missing_ops
from torchlean_bridge.app.audit_weights import compare_weights

define_missing_ops()  # torchvision's compiled ops do not load with the CPU torch (see tests/torchvision_cpu.py)
pytestmark = pytest.mark.slow  # transformers' and torchvision's imports (~30 s here); the audits take < 1 s


def errors(report):
    return [(f.kind, f.message) for f in report.findings if f.severity == "error"]


def numpy_state(module) -> dict[str, np.ndarray]:
    return {k: v.detach().numpy().copy() for k, v in module.state_dict().items() if v.dtype.is_floating_point}


def exchange(sd, a: str, b: str) -> dict:
    """Every key under prefix ``a`` exchanged with the same key under ``b``."""
    out = dict(sd)
    for k in sd:
        if k.startswith(a + "."):
            other = b + k[len(a):]
            out[k], out[other] = sd[other], sd[k]
    return out


@pytest.fixture(scope="module")
def gpt2():
    from transformers import GPT2Config, GPT2Model
    torch.manual_seed(0)
    config = GPT2Config(n_layer=4, n_embd=32, n_head=4, n_positions=16, vocab_size=64)
    return numpy_state(GPT2Model(config))


def test_hf_gpt2_clean_and_blocks_exchanged(gpt2):
    assert compare_weights(gpt2, gpt2).findings == []
    report = compare_weights(exchange(gpt2, "h.1", "h.2"), gpt2)
    (f,) = report.findings
    # only the tensors that differ between the two blocks move (equal ones and zeros stay unseen)
    assert f.kind == "block_swap" and f.message.startswith("block h.1 <-> h.2 exchanged (")
    assert {k.split(".", 2)[2] for k in f.keys} == {"attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight",
                                                      "mlp.c_proj.weight"}


def test_hf_gpt2_q_and_k_exchanged(gpt2):
    w = gpt2["h.0.attn.c_attn.weight"]
    q, k, v = np.split(w, 3, axis=1)
    report = compare_weights(dict(gpt2, **{"h.0.attn.c_attn.weight": np.concatenate([k, q, v], axis=1)}), gpt2)
    assert errors(report) == [("reordered", "h.0.attn.c_attn.weight: thirds along axis 1 reordered: Q and K exchanged "
                                            "(stored as [K, Q, V], reference [Q, K, V]; 32 wide)")]


def test_resnet18_blocks_and_transposed_and_perturbed():
    from torchvision.models import resnet18
    torch.manual_seed(0)
    ref = numpy_state(resnet18(num_classes=10))
    sd = exchange(ref, "layer1.0", "layer1.1")
    report = compare_weights(sd, ref)
    assert [(f.kind, f.message.split(" (")[0]) for f in report.findings] == [("block_swap",
                                                                               "block layer1.0 <-> layer1.1 exchanged")]
    sd = dict(ref, **{"layer2.0.conv1.weight": ref["layer2.0.conv1.weight"] * 0.5,
                      "fc.bias": ref["fc.bias"] + np.float32(0.25)})
    assert [(f.kind, f.keys) for f in compare_weights(sd, ref).findings] == [
        ("scaled", ("layer2.0.conv1.weight",)), ("different_values", ("fc.bias",))]


def test_vit_layers_named_encoder_layer_n_and_fused_in_proj():
    from torchvision.models.vision_transformer import VisionTransformer
    torch.manual_seed(0)
    vit = VisionTransformer(image_size=16, patch_size=8, num_layers=3, num_heads=2, hidden_dim=8, mlp_dim=16)
    with torch.no_grad():
        for p in vit.parameters():
            p.copy_(torch.randn_like(p))
    ref = numpy_state(vit)
    layers = "encoder.layers.encoder_layer_"
    report = compare_weights(exchange(ref, layers + "0", layers + "2"), ref)
    assert [(f.kind, f.message) for f in report.findings] == [
        ("block_swap", f"block {layers}0 <-> {layers}2 exchanged (24 tensors)")]
    key = layers + "1.self_attention.in_proj_weight"
    q, k, v = np.split(ref[key], 3, axis=0)
    report = compare_weights(dict(ref, **{key: np.concatenate([q, v, k])}), ref)
    assert errors(report) == [("reordered", f"{key}: thirds along axis 0 reordered: K and V exchanged (stored as "
                                            f"[Q, V, K], reference [Q, K, V]; 8 wide)")]


def test_hf_gpt2_through_torch_export_with_the_module_and_with_golden_outputs_only():
    """The issue's case: two blocks exchanged in Hugging Face's GPT-2 imported through torch.export.
    Both audits name the same block with the same tensor count and restore agreement."""
    from transformers import GPT2Config, GPT2Model

    import torchlean_bridge as tlb
    from torchlean_bridge.app.audit import audit
    torch.manual_seed(0)
    config = GPT2Config(n_layer=4, n_embd=32, n_head=4, n_positions=16, vocab_size=64, use_cache=False,
                        bos_token_id=0, eos_token_id=0)
    model = GPT2Model(config).eval()
    bundle = tlb.import_export(model, (torch.randint(0, 64, (1, 8)),))
    ref = numpy_state(model)
    sd = exchange(ref, "h.1", "h.2")
    with_module = audit(bundle, sd, reference=model)
    xs = [np.random.default_rng(k).integers(0, 64, (1, 8)) for k in range(2)]
    with torch.no_grad():
        golden = [[model(torch.tensor(x)).last_hidden_state.numpy()] for x in xs]
    golden_only = audit(bundle, sd, reference=golden, inputs=[[x] for x in xs], tolerance=1e-5)  # float32 model
    for report in (with_module, golden_only):
        (f,) = report.swaps
        assert f.kind == "block_swap" and f.message.startswith("block h.1 <-> h.2 exchanged (8 tensors): max error ")
        assert report.error_after <= 1e-5 * max(1.0, float(np.abs(golden[0][0]).max()))
    assert golden_only.search["tried"] <= 10 and golden_only.search["time_s"] < 5.0
    (where,) = with_module.of_kind("first_departure")
    assert all(k.startswith("h.1.") for k in where.keys)


def test_hf_gpt2_k_bias_difference_is_said_to_change_no_output():
    """Hugging Face GPT-2 with a different K bias in one fused c_attn: the weight audit names the
    different values, and the audit says in words that they change no output (softmax cancels a K
    bias), never "max error 0.000000 -> 0.000000"."""
    from transformers import GPT2Config, GPT2Model

    import torchlean_bridge as tlb
    from torchlean_bridge.app.audit import audit
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=32, n_head=4, n_positions=16, vocab_size=64, use_cache=False,
                        bos_token_id=0, eos_token_id=0)
    model = GPT2Model(config).eval()
    bundle = tlb.import_export(model, (torch.randint(0, 64, (1, 8)),))
    ref = numpy_state(model)
    key = "h.1.attn.c_attn.bias"
    bias = ref[key].copy()
    bias[32:64] = np.random.default_rng(1).standard_normal(32).astype(np.float32)  # the K third
    report = audit(bundle, dict(ref, **{key: bias}), reference=model)
    (f,) = report.of_kind("different_values")
    assert f.keys == (key,) and f.message.startswith(f"{key}: different values (32 of 96 differ, ")
    assert f.message.endswith(f": the difference does not change the outputs on the {report.inputs_used} "
                              f"input(s) used") and "max error" not in f.message
    assert report.of_kind("agreement") and not report.ok
    # a Q bias does change them: the figures are given
    bias = ref[key].copy()
    bias[:32] = np.random.default_rng(1).standard_normal(32).astype(np.float32)
    (f,) = audit(bundle, dict(ref, **{key: bias}), reference=model).of_kind("different_values")
    assert ": max error " in f.message and f.message.endswith(" -> 0.000000")


def test_hf_gpt2_q_and_k_exchanged_in_c_attn_with_the_module_and_with_golden_outputs_only():
    """The issue's second case: Q and K exchanged inside one fused ``c_attn`` (weight and bias thirds,
    the Megatron-vs-Hugging-Face layout bug), Hugging Face's GPT-2 in float64 through torch.export.
    Both audits name the thirds' order of exactly those tensors and restore agreement; undoing the
    weight alone (its bias still exchanged) is not said to change no output."""
    from transformers import GPT2Config, GPT2Model

    import torchlean_bridge as tlb
    from torchlean_bridge.app.audit import audit
    torch.manual_seed(0)
    config = GPT2Config(n_layer=4, n_embd=32, n_head=4, n_positions=16, vocab_size=64, use_cache=False,
                        bos_token_id=0, eos_token_id=0)
    model = GPT2Model(config).double().eval()
    with torch.no_grad():  # nonzero biases, so the bias thirds differ too
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.copy_(torch.randn_like(p) * 0.1)
    bundle = tlb.import_export(model, (torch.randint(0, 64, (1, 8)),))
    ref = {k: v.detach().numpy().copy() for k, v in model.state_dict().items() if v.dtype.is_floating_point}
    w, b = ref["h.1.attn.c_attn.weight"], ref["h.1.attn.c_attn.bias"]
    (q, k, v), (bq, bk, bv) = np.split(w, 3, axis=1), np.split(b, 3)
    sd = dict(ref, **{"h.1.attn.c_attn.weight": np.concatenate([k, q, v], axis=1),
                      "h.1.attn.c_attn.bias": np.concatenate([bk, bq, bv])})
    order = "Q and K exchanged (stored as [K, Q, V], reference [Q, K, V]; 32 wide)"
    with_module = audit(bundle, sd, reference=model)
    assert [(f.kind, f.message.split(": max error")[0].split(": undoing")[0]) for f in with_module.swaps] == [
        ("reordered", f"h.1.attn.c_attn.weight: thirds along axis 1 reordered: {order}"),
        ("reordered", f"h.1.attn.c_attn.bias: thirds along axis 0 reordered: {order}")]
    assert not any("does not change the outputs" in f.message for f in with_module.swaps)
    assert with_module.error_after < 1e-9
    xs = [np.random.default_rng(s).integers(0, 64, (1, 8)) for s in range(2)]
    with torch.no_grad():
        golden = [[model(torch.tensor(x)).last_hidden_state.numpy()] for x in xs]
    golden_only = audit(bundle, sd, reference=golden, inputs=[[x] for x in xs])
    (f,) = golden_only.swaps
    assert (f.kind, f.message.split(": max error")[0]) == (
        "reordered", f"h.1.attn.c_attn.bias, h.1.attn.c_attn.weight: thirds reordered: {order}")
    assert golden_only.error_after < 1e-9 and golden_only.search["time_s"] < 5.0
