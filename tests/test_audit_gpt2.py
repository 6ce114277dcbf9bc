"""End to end: the GPT-2-like model imported through torch.export, audited against its trusted
module or trusted weights; each conversion bug is named with the output error it causes and the
error left once it is undone (0 for a full explanation)."""

import json

import numpy as np
import pytest
import torch

import torchlean_bridge as tlb
from exporters.folder import save
from tests.test_audit_weights import D, GPT2Like, block_keys, exchange_blocks, shifted, thirds
from torchlean_bridge.app.audit import audit

pytestmark = pytest.mark.slow  # one torch.export import of a 4-layer model (~5 s)


@pytest.fixture(scope="module")
def imported():
    model = GPT2Like().double().eval()
    bundle = tlb.import_export(model, (torch.zeros(5, D, dtype=torch.float64),))
    return model, bundle, {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


def named(report):
    return [(f.kind, f.message.split(": max error")[0]) for f in report.findings if f.severity == "error"]


def test_the_clean_checkpoint_passes(imported):
    model, bundle, ref = imported
    report = audit(bundle, ref, reference=model)
    assert report.ok and report.error_before < 1e-9 and report.swaps == []


def test_exchanged_blocks_against_the_module(imported):
    model, bundle, ref = imported
    report = audit(bundle, exchange_blocks(ref, 1, 2), reference=model)
    assert [kind for kind, _ in named(report)] == ["mismatch", "block_swap"]
    assert named(report)[1] == ("block_swap", "block h.1 <-> h.2 exchanged (24 tensors)")
    (swap,) = report.swaps
    assert swap.keys == block_keys(ref, 1, 2)
    short = report.short().splitlines()
    assert short[0] == "audit of <state_dict>: FAILED" and len(short) == 4
    assert short[2].startswith("  block_swap: block h.1 <-> h.2 exchanged (24 tensors): max error ")
    assert short[3].startswith("  first_departure: first departure at node ")
    assert swap.data["error_before"] > 0.05 and swap.data["error_after"] < 1e-9 and report.error_after < 1e-9


def test_q_and_k_exchanged_against_the_module(imported):
    model, bundle, ref = imported
    sd = dict(ref, **{"h.0.attn.c_attn.weight": thirds(ref["h.0.attn.c_attn.weight"], (1, 0, 2)),
                      "h.0.attn.c_attn.bias": thirds(ref["h.0.attn.c_attn.bias"], (1, 0, 2))})
    report = audit(bundle, sd, reference=model)
    assert [(f.kind, f.keys) for f in report.swaps] == [("reordered", ("h.0.attn.c_attn.weight",)),
                                                        ("reordered", ("h.0.attn.c_attn.bias",))]
    first, second = report.swaps
    assert first.data["error_before"] > 1e-3 and first.data["error_after"] == second.data["error_before"]
    assert second.data["error_after"] < 1e-9
    assert not report.of_kind("unresolved")


def test_a_layer_shift_against_trusted_weights_alone(imported, tmp_path, capsys):
    """The reference is a checkpoint (no module): the command line, text and --json."""
    from safetensors.numpy import save_file

    from torchlean_bridge.app.cli import main
    _, bundle, ref = imported
    save(bundle, tmp_path / "bundle")
    save_file(ref, str(tmp_path / "trusted.safetensors"))
    save_file(shifted(ref, "rotate"), str(tmp_path / "shifted.safetensors"))
    args = ["audit", str(tmp_path / "bundle"), "--checkpoint", str(tmp_path / "shifted.safetensors"),
            "--reference", str(tmp_path / "trusted.safetensors"), "--samples", "2"]
    assert main(args) == 1
    out = capsys.readouterr().out
    assert "[error] layer_shift: every layer of h rotated by +1: layer i holds the reference's layer (i - 1) mod 4 " \
           "(48 tensors): max error " in out
    assert main(args + ["--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    (shift,) = [f for f in doc["findings"] if f["kind"] == "layer_shift"]
    assert shift["data"]["shift"] == 1 and shift["data"]["error_after"] < 1e-9
    assert doc["weights"] == {"compared": len(ref), "same": len(ref) - 48}


def test_a_perturbed_tensor_is_named_without_an_invented_exchange(imported):
    model, bundle, ref = imported
    sd = dict(ref, **{"h.3.mlp.c_fc.bias": ref["h.3.mlp.c_fc.bias"] + 0.01})
    report = audit(bundle, sd, reference=model)
    assert report.swaps == [] and not report.of_kind("unresolved")
    (different,) = report.of_kind("different_values")
    assert different.keys == ("h.3.mlp.c_fc.bias",) and different.data["error_after"] < 1e-9


def test_the_first_departure_points_at_the_layer_of_a_perturbed_tensor(imported):
    model, bundle, ref = imported
    noise = np.random.default_rng(3).standard_normal(ref["h.2.mlp.c_fc.weight"].shape) * 0.01
    report = audit(bundle, dict(ref, **{"h.2.mlp.c_fc.weight": ref["h.2.mlp.c_fc.weight"] + noise}), reference=model)
    (where,) = report.of_kind("first_departure")
    assert where.keys[0] == "h.2.mlp.c_fc.weight" and where.severity == "info"
    assert bundle.roles.for_node(where.node)[0].key == "h.2.mlp.c_fc.weight"
    assert where.message.startswith(f"first departure at node {where.node} (")
    # every node before it agrees exactly: nothing upstream of the perturbed tensor moved
    assert all(all(b.key != "h.2.mlp.c_fc.weight" for b in bundle.roles.for_node(n.id))
               for n in bundle.graph.nodes if n.id < where.node)


def test_the_first_departure_of_exchanged_blocks_is_in_the_first_of_them(imported):
    model, bundle, ref = imported
    (where,) = audit(bundle, exchange_blocks(ref, 1, 2), reference=model).of_kind("first_departure")
    assert where.keys and all(k.startswith("h.1.") for k in where.keys)


# -- the rest of the matrix with the module as reference (test_audit_search has them golden-only) -------
HD = D // 4


def interleaved(ref):
    w, b = ref["h.1.attn.c_attn.weight"], ref["h.1.attn.c_attn.bias"]
    return dict(ref, **{"h.1.attn.c_attn.weight": w.reshape(D, 3, 4, HD).transpose(0, 2, 1, 3).reshape(D, 3 * D),
                        "h.1.attn.c_attn.bias": b.reshape(3, 4, HD).transpose(1, 0, 2).reshape(3 * D)})


def k_heads(ref):
    w = ref["h.3.attn.c_attn.weight"].copy()
    k1, k2 = slice(D + HD, D + 2 * HD), slice(D + 2 * HD, D + 3 * HD)
    w[:, k1], w[:, k2] = ref["h.3.attn.c_attn.weight"][:, k2], ref["h.3.attn.c_attn.weight"][:, k1]
    return dict(ref, **{"h.3.attn.c_attn.weight": w})


def every_layer_pair(ref):
    sd = dict(ref)
    for i in range(4):
        a, b = f"h.{i}.ln_2.weight", f"h.{i}.attn.c_proj.bias"
        sd[a], sd[b] = ref[b], ref[a]
    return sd


INTERLEAVE = ("interleaved along axis {}: per-head interleave, [Q0, K0, V0, Q1, ...] for the reference's [Q0..Q3, "
              "K.., V..] (12 slices, 4 wide)")
MODULE_CASES = {
    "rotated": (lambda ref: shifted(ref, "rotate"), [
        ("layer_shift", "every layer of h rotated by +1: layer i holds the reference's layer (i - 1) mod 4 "
                        "(48 tensors)")]),
    "interleave": (interleaved, [("reordered", "h.1.attn.c_attn.weight: " + INTERLEAVE.format(1)),
                                 ("reordered", "h.1.attn.c_attn.bias: " + INTERLEAVE.format(0))]),
    "two_heads": (k_heads, [("reordered", "h.3.attn.c_attn.weight: K heads 1 <-> 2 exchanged along axis 1 (4 heads "
                                          "per third, 4 wide)")]),
    "transposed": (lambda ref: dict(ref, **{"h.0.attn.c_proj.weight": ref["h.0.attn.c_proj.weight"].T.copy()}),
                   [("transpose", "transpose h.0.attn.c_proj.weight")]),
    "every_layer": (every_layer_pair, [("swap", "attn.c_proj.bias <-> ln_2.weight exchanged in every layer of h "
                                                "(4 pairs)")]),
    "dropped_last": (lambda ref: shifted(ref, "fresh"), [
        ("layer_shift", "every layer of h shifted by +1: h.1..h.3 hold the reference's h.0..h.2 (36 tensors); the "
                        "reference's h.3 is absent from the checkpoint (none of its tensors is under any key)")]),
}


@pytest.mark.parametrize("case", sorted(MODULE_CASES))
def test_each_bug_is_named_against_the_module_in_text_and_json(imported, case):
    model, bundle, ref = imported
    corrupt, expected = MODULE_CASES[case]
    report = audit(bundle, corrupt(ref), reference=model)
    assert [(f.kind, f.message.split(": max error")[0]) for f in report.swaps] == expected
    assert report.error_after < 1e-9 and not report.of_kind("unresolved")
    text = str(report)
    assert all(f"[error] {kind}: {message}: max error " in text for kind, message in expected)
    doc = json.loads(json.dumps(report.to_json()))
    assert doc["swaps"] == [list(f.keys) for f in report.swaps] and doc["error_after"] < 1e-9


def test_a_k_bias_difference_is_said_not_to_change_the_outputs(imported):
    """Softmax cancels a K bias (it adds q.b_k to every score of a query): the difference is named,
    and said in words to change no output, not as "max error 0.000000 -> 0.000000"."""
    model, bundle, ref = imported
    key = "h.1.attn.c_attn.bias"
    bias = ref[key].copy()
    bias[D:2 * D] += np.random.default_rng(2).standard_normal(D)
    report = audit(bundle, dict(ref, **{key: bias}), reference=model)
    (f,) = report.of_kind("different_values")
    assert f.keys == (key,) and f.message.startswith(f"{key}: different values (16 of 48 differ, max |diff| ")
    assert f.message.endswith(f": the difference does not change the outputs on the {report.inputs_used} input(s) used")
    assert "max error" not in f.message and f.data["error_before"] == f.data["error_after"] < 1e-9
    assert report.of_kind("agreement") and not report.ok
