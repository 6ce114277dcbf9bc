"""Weight audits against trusted weights: each conversion bug named exactly, by hash, no evaluation.

The model is a 4-layer GPT-2-like network under Hugging Face's keys (fused c_attn in Conv1D layout,
weight [in, 3 * out]), written out here so these tests stay fast (no transformers import) and every
tensor is random (no two equal by construction); test_audit_models runs Hugging Face's own GPT-2."""

from __future__ import annotations

import math

import torch
import torch.nn as nn


class Conv1D(nn.Module):
    """Hugging Face's GPT-2 projection: y = x @ weight + bias with weight [in, out]."""

    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_in, n_out))
        self.bias = nn.Parameter(torch.randn(n_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight + self.bias


class Attention(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.c_attn = Conv1D(d, 3 * d)
        self.c_proj = Conv1D(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t, d = x.shape[-2], x.shape[-1]
        q, k, v = self.c_attn(x).split(d, dim=-1)
        q, k, v = (a.reshape(t, self.heads, d // self.heads).transpose(0, 1) for a in (q, k, v))
        scores = q @ k.transpose(-1, -2) / math.sqrt(d // self.heads)
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
        att = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
        return self.c_proj((att @ v).transpose(0, 1).reshape(t, d))


class MLP(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.c_fc = Conv1D(d, 4 * d)
        self.c_proj = Conv1D(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(torch.nn.functional.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(d)
        self.attn = Attention(d, heads)
        self.ln_2 = nn.LayerNorm(d)
        self.mlp = MLP(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2Like(nn.Module):
    """Input: a [T, d] sequence of embeddings (token lookup left out: the blocks are what matter)."""

    def __init__(self, d: int = 16, heads: int = 4, layers: int = 4, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.h = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        with torch.no_grad():  # random layer norms too, so no two tensors are equal by construction
            for name, p in self.named_parameters():
                if "ln" in name:
                    p.copy_(torch.randn_like(p))
            for p in self.parameters():
                p.mul_(0.3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.h:
            x = block(x)
        return self.ln_f(x)


# -- the tests --------------------------------------------------------------------------------------
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from torchlean_bridge.app.audit_weights import _round_bfloat16, compare_weights, tensor_hash  # noqa: E402
from torchlean_bridge.seed import BIAS_PAIR  # noqa: E402

D, HEADS, LAYERS = 16, 4, 4


@pytest.fixture(scope="module")
def model() -> GPT2Like:
    return GPT2Like(D, HEADS, LAYERS).double().eval()


@pytest.fixture
def ref(model) -> dict[str, np.ndarray]:
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


def errors(report) -> list[tuple[str, str]]:
    return [(f.kind, f.message) for f in report.findings if f.severity == "error"]


def exchange_blocks(sd: dict, a: int, b: int) -> dict:
    out = dict(sd)
    for k in sd:
        if k.startswith(f"h.{a}."):
            rest = k[len(f"h.{a}."):]
            out[k], out[f"h.{b}.{rest}"] = sd[f"h.{b}.{rest}"], sd[k]
    return out


def block_keys(sd: dict, *layers: int) -> tuple[str, ...]:
    return tuple(sorted(k for k in sd if any(k.startswith(f"h.{i}.") for i in layers)))


def test_the_clean_checkpoint_passes(ref):
    report = compare_weights(ref, ref)
    assert report.ok and report.findings == [] and report.same == report.compared == len(ref)
    assert report.to_dict()["same"] == len(ref)


def test_float32_and_float64_copies_and_signed_zeros_hash_alike():
    a = np.array([[0.5, -0.0], [1.25, 3.0]])
    assert tensor_hash(a) == tensor_hash(a.astype(np.float32)) == tensor_hash(np.abs(a))
    assert tensor_hash(a) != tensor_hash(a.T) and tensor_hash(a) != tensor_hash(a.reshape(4))


def test_two_exchanged_blocks_are_one_finding(ref):
    report = compare_weights(exchange_blocks(ref, 1, 2), ref)
    assert errors(report) == [("block_swap", "block h.1 <-> h.2 exchanged (24 tensors)")]
    assert report.short() == ("weights: 26 of 50 tensor(s) identical to the reference\n"
                              "  block_swap: block h.1 <-> h.2 exchanged (24 tensors)")
    assert report.findings[0].keys == block_keys(ref, 1, 2)
    assert report.findings[0].data["map"] == {"1": 2, "2": 1}


def test_two_pairs_of_exchanged_blocks_are_two_findings(ref):
    report = compare_weights(exchange_blocks(exchange_blocks(ref, 0, 1), 2, 3), ref)
    assert errors(report) == [("block_swap", "block h.0 <-> h.1 exchanged (24 tensors)"),
                              ("block_swap", "block h.2 <-> h.3 exchanged (24 tensors)")]


def shifted(sd: dict, fill: str) -> dict:
    """ckpt h.i holds the reference's h.(i-1); h.0 holds fresh values or (fill="rotate") h.3."""
    rng = np.random.default_rng(7)
    out = dict(sd)
    for k in sd:
        if k.startswith("h."):
            i, rest = int(k.split(".")[1]), k.split(".", 2)[2]
            src = f"h.{(i - 1) % LAYERS}.{rest}"
            out[k] = sd[src] if i > 0 or fill == "rotate" else rng.standard_normal(sd[k].shape)
    return out


def test_every_layer_shifted_by_one(ref):
    report = compare_weights(shifted(ref, "fresh"), ref)
    (shift, fresh) = [f for f in report.findings if f.severity == "error"]
    assert shift.kind == "layer_shift"
    assert shift.message == ("every layer of h shifted by +1: h.1..h.3 hold the reference's h.0..h.2 (36 tensors); "
                             "the reference's h.3 is absent from the checkpoint (none of its tensors is under any key)")
    assert shift.keys == block_keys(ref, 1, 2, 3) and shift.data["shift"] == 1
    assert fresh.kind == "different_values" and fresh.keys == tuple(k for k in ref if k.startswith("h.0."))
    assert fresh.message.startswith("h.0: 12 tensors have different values")


def test_every_layer_rotated_by_one(ref):
    report = compare_weights(shifted(ref, "rotate"), ref)
    assert errors(report) == [("layer_shift", "every layer of h rotated by +1: layer i holds the reference's "
                                              "layer (i - 1) mod 4 (48 tensors)")]


def thirds(a: np.ndarray, order: tuple[int, ...], axis: int = -1) -> np.ndarray:
    parts = np.split(a, 3, axis=axis)
    return np.concatenate([parts[i] for i in order], axis=axis)


def test_q_and_k_exchanged_in_the_fused_projection(ref):
    sd = dict(ref)
    sd["h.2.attn.c_attn.weight"] = thirds(ref["h.2.attn.c_attn.weight"], (1, 0, 2))
    sd["h.2.attn.c_attn.bias"] = thirds(ref["h.2.attn.c_attn.bias"], (1, 0, 2))
    report = compare_weights(sd, ref)
    assert errors(report) == [
        ("reordered", "h.2.attn.c_attn.weight: thirds along axis 1 reordered: Q and K exchanged (stored as "
                      "[K, Q, V], reference [Q, K, V]; 16 wide)"),
        ("reordered", "h.2.attn.c_attn.bias: thirds along axis 0 reordered: Q and K exchanged (stored as "
                      "[K, Q, V], reference [Q, K, V]; 16 wide)")]
    assert report.findings[0].data == {"axis": 1, "slices": 3, "order": [1, 0, 2]}


def test_a_qkv_rotation_is_named_by_its_order(ref):
    sd = dict(ref, **{"h.0.attn.c_attn.bias": thirds(ref["h.0.attn.c_attn.bias"], (2, 0, 1))})
    (f,) = compare_weights(sd, ref).findings
    assert f.message == ("h.0.attn.c_attn.bias: thirds along axis 0 reordered: order VQK (stored as [V, Q, K], "
                         "reference [Q, K, V]; 16 wide)")


def test_per_head_interleave_and_two_heads_exchanged(ref):
    w = ref["h.1.attn.c_attn.weight"]
    hd = D // HEADS
    interleaved = w.reshape(D, 3, HEADS, hd).transpose(0, 2, 1, 3).reshape(D, 3 * D)
    w3 = ref["h.3.attn.c_attn.weight"]
    heads = w3.copy()
    k1, k2 = slice(D + hd, D + 2 * hd), slice(D + 2 * hd, D + 3 * hd)
    heads[:, k1], heads[:, k2] = w3[:, k2], w3[:, k1]
    sd = dict(ref, **{"h.1.attn.c_attn.weight": interleaved, "h.3.attn.c_attn.weight": heads})
    assert errors(compare_weights(sd, ref)) == [
        ("reordered", "h.1.attn.c_attn.weight: interleaved along axis 1: per-head interleave, [Q0, K0, V0, Q1, ...] "
                      "for the reference's [Q0..Q3, K.., V..] (12 slices, 4 wide)"),
        ("reordered", "h.3.attn.c_attn.weight: K heads 1 <-> 2 exchanged along axis 1 (4 heads per third, 4 wide)")]


def test_gate_and_up_halves_exchanged():
    rng = np.random.default_rng(0)
    ref = {"mlp.gate_up.weight": rng.standard_normal((8, 4))}
    sd = {"mlp.gate_up.weight": np.concatenate(np.split(ref["mlp.gate_up.weight"], 2)[::-1])}
    assert errors(compare_weights(sd, ref)) == [
        ("reordered", "mlp.gate_up.weight: halves along axis 0 exchanged (e.g. gate/up or K/V order; 4 wide)")]


def test_transposed_weights_square_or_not(ref):
    sd = dict(ref)
    sd["h.0.attn.c_proj.weight"] = ref["h.0.attn.c_proj.weight"].T.copy()
    sd["h.3.mlp.c_fc.weight"] = ref["h.3.mlp.c_fc.weight"].T.copy()
    assert errors(compare_weights(sd, ref)) == [("transpose", "transpose h.0.attn.c_proj.weight"),
                                                ("transpose", "transpose h.3.mlp.c_fc.weight")]


def test_bfloat16_and_float16_rounding_and_a_scale(ref):
    sd = dict(ref)
    ln = ref["h.1.ln_2.weight"].astype(np.float32)
    sd["h.1.ln_2.weight"] = torch.from_numpy(ln).bfloat16().float().numpy()
    sd["h.1.ln_2.bias"] = ref["h.1.ln_2.bias"].astype(np.float16)
    sd["h.2.mlp.c_proj.weight"] = ref["h.2.mlp.c_proj.weight"] * 0.125
    report = compare_weights(sd, dict(ref, **{"h.1.ln_2.weight": ln}))
    assert [(f.kind, f.keys) for f in report.findings] == [("rounded", ("h.1.ln_2.weight",)),
                                                           ("rounded", ("h.1.ln_2.bias",)),
                                                           ("scaled", ("h.2.mlp.c_proj.weight",))]
    assert report.findings[0].message.startswith("h.1.ln_2.weight rounded to bfloat16 (16 of 16 values changed")
    assert report.findings[1].message.startswith("h.1.ln_2.bias rounded to float16 (16 of 16 values changed")
    assert report.findings[2].message == "h.2.mlp.c_proj.weight scaled by 0.125"


def test_bfloat16_rounding_matches_torch_including_ties():
    rng = np.random.default_rng(1)
    a = np.concatenate([rng.standard_normal(10000).astype(np.float32) * 10.0 ** rng.integers(-30, 30, 10000),
                        np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 2 ** -8), 3.0e38, np.inf, -np.inf],
                                 np.float32)])
    expected = torch.from_numpy(a).bfloat16().float().numpy()
    assert np.array_equal(_round_bfloat16(a), expected)


def test_a_perturbed_tensor_is_different_values_and_nothing_else(ref):
    sd = dict(ref, **{"h.2.attn.c_proj.bias": ref["h.2.attn.c_proj.bias"] + 1e-3})
    (f,) = compare_weights(sd, ref).findings
    assert f.kind == "different_values" and f.keys == ("h.2.attn.c_proj.bias",)
    assert f.message.startswith("h.2.attn.c_proj.bias: different values (16 of 16 differ, max |diff| 0.001")


def test_the_demos_swapped_biases_and_a_three_cycle():
    ref = {k: np.asarray(v, np.float64) for k, v in BIAS_PAIR.items()}
    sd = dict(ref, **{"0.bias": ref["2.bias"], "2.bias": ref["0.bias"]})
    assert errors(compare_weights(sd, ref)) == [("swap", "swap 0.bias <-> 2.bias")]
    rng = np.random.default_rng(0)
    ref = {k: rng.standard_normal(3) for k in ("a.bias", "b.bias", "c.bias")}
    sd = {"a.bias": ref["b.bias"], "b.bias": ref["c.bias"], "c.bias": ref["a.bias"]}
    assert errors(compare_weights(sd, ref)) == [
        ("cycle", "cycle a.bias <- b.bias <- c.bias <- a.bias (each holds the next one's tensor)")]


def test_keys_only_one_side_has_are_warnings(ref):
    sd = {k: v for k, v in ref.items() if k != "ln_f.bias"}
    sd["extra.weight"] = np.zeros(2)
    report = compare_weights(sd, ref)
    assert report.ok and [f.kind for f in report.findings] == ["not_in_reference", "not_in_checkpoint"]
    assert report.findings[1].keys == ("ln_f.bias",)


def test_the_command_takes_a_checkpoint_as_the_reference(tmp_path, capsys):
    """--reference FILE.safetensors: trusted weights alone; the graph bound to them gives the outputs."""
    import json

    from safetensors.numpy import save_file

    from exporters.folder import save
    from torchlean_bridge.app.cli import main
    from torchlean_bridge.seed import bias_pair_bundle
    ref = {k: np.asarray(v, np.float64) for k, v in BIAS_PAIR.items()}
    save_file(ref, str(tmp_path / "trusted.safetensors"))
    save_file(dict(ref, **{"0.bias": ref["2.bias"], "2.bias": ref["0.bias"]}), str(tmp_path / "bad.safetensors"))
    save(bias_pair_bundle(), tmp_path / "bundle")
    args = ["audit", str(tmp_path / "bundle"), "--reference", str(tmp_path / "trusted.safetensors")]
    assert main(args + ["--checkpoint", str(tmp_path / "bad.safetensors")]) == 1
    out = capsys.readouterr().out
    (line,) = [x for x in out.splitlines() if "[error] swap:" in x]
    assert line.startswith("  [error] swap: swap 0.bias <-> 2.bias: max error ") and line.endswith(" -> 0.000000")
    assert "graph with the reference weights" in out
    assert main(args + ["--checkpoint", str(tmp_path / "bad.safetensors"), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["swaps"] == [["0.bias", "2.bias"]] and doc["weights"] == {"compared": 4, "same": 2}
    assert main(args + ["--checkpoint", str(tmp_path / "trusted.safetensors")]) == 0
    capsys.readouterr()
    missing = tmp_path / "nowhere.safetensors"
    assert main(["audit", str(tmp_path / "bundle"), "--checkpoint", str(tmp_path / "bad.safetensors"),
                 "--reference", str(missing)]) == 2
    assert f"audit: --reference: no such checkpoint file: {missing} (or give path/to/file.py:factory)" in \
        capsys.readouterr().err


def llama_like(layers: int = 3, d: int = 8, kv: int = 4, hidden: int = 12) -> dict[str, np.ndarray]:
    """A Llama-style state_dict with grouped-query attention (separate q/k/v, k and v narrower)."""
    rng = np.random.default_rng(11)
    sd = {}
    for i in range(layers):
        p = f"model.layers.{i}"
        shapes = {"self_attn.q_proj.weight": (d, d), "self_attn.k_proj.weight": (kv, d),
                  "self_attn.v_proj.weight": (kv, d), "self_attn.o_proj.weight": (d, d),
                  "mlp.gate_proj.weight": (hidden, d), "mlp.up_proj.weight": (hidden, d),
                  "mlp.down_proj.weight": (d, hidden), "input_layernorm.weight": (d,),
                  "post_attention_layernorm.weight": (d,)}
        sd.update({f"{p}.{k}": rng.standard_normal(s) for k, s in shapes.items()})
    return sd


def test_gate_and_up_exchanged_in_every_layer_is_one_finding():
    ref = llama_like()
    sd = dict(ref)
    for i in range(3):
        g, u = f"model.layers.{i}.mlp.gate_proj.weight", f"model.layers.{i}.mlp.up_proj.weight"
        sd[g], sd[u] = ref[u], ref[g]
    report = compare_weights(sd, ref)
    assert errors(report) == [("swap", "mlp.gate_proj.weight <-> mlp.up_proj.weight exchanged in every layer of "
                                       "model.layers (3 pairs)")]
    assert len(report.findings[0].keys) == 6


def test_k_and_v_exchanged_in_one_layer_of_a_gqa_model_and_gate_up_in_two():
    ref = llama_like()
    sd = dict(ref)
    k, v = "model.layers.1.self_attn.k_proj.weight", "model.layers.1.self_attn.v_proj.weight"
    sd[k], sd[v] = ref[v], ref[k]
    for i in (0, 2):
        g, u = f"model.layers.{i}.mlp.gate_proj.weight", f"model.layers.{i}.mlp.up_proj.weight"
        sd[g], sd[u] = ref[u], ref[g]
    assert errors(compare_weights(sd, ref)) == [
        ("swap", "mlp.gate_proj.weight <-> mlp.up_proj.weight exchanged in layers model.layers.0, model.layers.2 "
                 "(2 pairs)"),
        ("swap", f"swap {k} <-> {v}")]


def test_a_key_overwritten_by_another_keys_tensor_is_a_move():
    rng = np.random.default_rng(2)
    ref = {"enc.weight": rng.standard_normal((4, 4)), "dec.weight": rng.standard_normal((4, 4))}
    sd = {"enc.weight": ref["enc.weight"], "dec.weight": ref["enc.weight"]}
    assert errors(compare_weights(sd, ref)) == [("moved", "dec.weight holds the reference's enc.weight")]


def test_slice_orders_of_a_large_tensor_are_found_quickly():
    """A [1024, 3072] fused projection with Q and K exchanged, among 3072's many divisors."""
    import time
    rng = np.random.default_rng(0)
    ref = {"attn.c_attn.weight": rng.standard_normal((1024, 3072)).astype(np.float32)}
    sd = {"attn.c_attn.weight": thirds(ref["attn.c_attn.weight"], (1, 0, 2))}
    start = time.perf_counter()
    (f,) = compare_weights(sd, ref).findings
    assert f.data == {"axis": 1, "slices": 3, "order": [1, 0, 2]}
    assert time.perf_counter() - start < 5.0


def test_hashes_are_chunked_and_a_tensor_too_large_for_slice_orders_says_so(monkeypatch):
    from torchlean_bridge.app import audit_weights
    rng = np.random.default_rng(4)
    a = rng.standard_normal((7, 5))
    whole = tensor_hash(a)
    monkeypatch.setattr(audit_weights, "HASH_CHUNK", 3)  # 35 elements in 12 chunks: the same bytes hashed
    f32 = a.astype(np.float32)
    assert tensor_hash(a) == whole and tensor_hash(f32) == tensor_hash(f32.astype(np.float64)) != whole
    monkeypatch.setattr(audit_weights, "MAX_REORDER_ELEMENTS", 10)
    ref = {"qkv.weight": rng.standard_normal((6, 4))}
    (f,) = compare_weights({"qkv.weight": thirds(ref["qkv.weight"], (1, 0, 2), axis=0)}, ref).findings
    assert f.kind == "different_values" and "(slice orders not searched above 10 elements)" in f.message
