"""Audits with golden outputs only: structured hypotheses name a conversion bug by evaluation.

The GPT-2-like model of test_audit_weights, imported through torch.export; golden outputs are the
trusted module's on two input sets. Each bug must be named exactly (the same words as the weight
audit), with the error it leaves (0: agreement), within a stated bound of hypotheses and time.
"""

import time

import numpy as np
import pytest
import torch

import torchlean_bridge as tlb
from tests.test_audit_weights import D, HEADS, GPT2Like, block_keys, exchange_blocks, shifted, thirds
from torchlean_bridge.app.audit import audit
from torchlean_bridge.app.audit_search import _reorder, hypotheses, search
from torchlean_bridge.app.audit_weights import compare_weights

HD = D // HEADS
BOUND_S = 5.0  # each named case below is found in well under this (0.05 to 0.4 s measured)


@pytest.fixture(scope="module")
def imported():
    model = GPT2Like().double().eval()
    bundle = tlb.import_export(model, (torch.zeros(5, D, dtype=torch.float64),))
    ref = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    xs = [np.random.default_rng(k).standard_normal((5, D)) for k in range(2)]
    with torch.no_grad():
        golden = [[model(torch.tensor(x)).numpy()] for x in xs]
    return bundle, ref, xs, golden


def golden_audit(imported, sd):
    bundle, _, xs, golden = imported
    start = time.perf_counter()
    report = audit(bundle, sd, reference=golden, inputs=[[x] for x in xs])
    return report, time.perf_counter() - start


def named(imported, sd) -> tuple:
    """The one finding naming the bug: (kind, message up to the figures, keys); checks the bound."""
    report, seconds = golden_audit(imported, sd)
    (f,) = report.swaps
    assert report.error_before > 1e-3 and f.data["error_after"] < 1e-9 and report.error_after < 1e-9
    assert not report.search["bounded"] and report.search["time_s"] < BOUND_S, report.search
    assert f.message.endswith(" -> 0.000000")
    return f.kind, f.message.split(": max error")[0], f.keys


pytestmark = pytest.mark.slow  # one torch.export import (~5 s); the cases then take 0.05 to 0.4 s each


def test_the_clean_checkpoint_passes(imported):
    report, _ = golden_audit(imported, imported[1])
    assert report.ok and report.error_before < 1e-9 and report.search is None


def test_two_blocks_exchanged(imported):
    ref = imported[1]
    assert named(imported, exchange_blocks(ref, 1, 2)) == (
        "block_swap", "block h.1 <-> h.2 exchanged (24 tensors)", block_keys(ref, 1, 2))


def test_every_layer_rotated_by_one(imported):
    ref = imported[1]
    assert named(imported, shifted(ref, "rotate")) == (
        "layer_shift", "every layer of h rotated by +1: layer i holds the reference's layer (i - 1) mod 4 "
                       "(48 tensors)", block_keys(ref, 0, 1, 2, 3))


def qk(ref, layers):
    return {f"h.{i}.attn.c_attn.{leaf}": thirds(ref[f"h.{i}.attn.c_attn.{leaf}"], (1, 0, 2))
            for i in layers for leaf in ("weight", "bias")}


def test_q_and_k_exchanged_in_one_layer(imported):
    ref = imported[1]
    assert named(imported, dict(ref, **qk(ref, [2]))) == (
        "reordered", "h.2.attn.c_attn.bias, h.2.attn.c_attn.weight: thirds reordered: Q and K exchanged (stored as "
                     "[K, Q, V], reference [Q, K, V]; 16 wide)", ("h.2.attn.c_attn.bias", "h.2.attn.c_attn.weight"))


def test_q_and_k_exchanged_in_every_layer(imported):
    ref = imported[1]
    kind, message, keys = named(imported, dict(ref, **qk(ref, range(4))))
    assert (kind, message) == ("reordered", "every fused projection (8 tensors): thirds reordered: Q and K exchanged "
                                            "(stored as [K, Q, V], reference [Q, K, V]; 16 wide)")
    assert sorted(keys) == sorted(qk(ref, range(4)))


def test_per_head_interleave(imported):
    ref = imported[1]
    w, b = ref["h.1.attn.c_attn.weight"], ref["h.1.attn.c_attn.bias"]
    sd = dict(ref, **{"h.1.attn.c_attn.weight": w.reshape(D, 3, HEADS, HD).transpose(0, 2, 1, 3).reshape(D, 3 * D),
                      "h.1.attn.c_attn.bias": b.reshape(3, HEADS, HD).transpose(1, 0, 2).reshape(3 * D)})
    assert named(imported, sd)[:2] == (
        "reordered", "h.1.attn.c_attn.bias, h.1.attn.c_attn.weight: interleaved: per-head interleave, [Q0, K0, V0, Q1, "
                     "...] for the reference's [Q0..Q3, K.., V..] (12 slices, 4 wide)")


def test_two_heads_exchanged(imported):
    ref = imported[1]
    w = ref["h.3.attn.c_attn.weight"].copy()
    k1, k2 = slice(D + HD, D + 2 * HD), slice(D + 2 * HD, D + 3 * HD)
    w[:, k1], w[:, k2] = ref["h.3.attn.c_attn.weight"][:, k2], ref["h.3.attn.c_attn.weight"][:, k1]
    assert named(imported, dict(ref, **{"h.3.attn.c_attn.weight": w}))[:2] == (
        "reordered", "h.3.attn.c_attn.bias, h.3.attn.c_attn.weight: K heads 1 <-> 2 exchanged (4 heads per third, "
                     "4 wide)")


def test_the_same_exchange_in_every_layer(imported):
    ref = imported[1]
    sd = dict(ref)
    for i in range(4):
        a, b = f"h.{i}.ln_2.weight", f"h.{i}.attn.c_proj.bias"
        sd[a], sd[b] = ref[b], ref[a]
    kind, message, keys = named(imported, sd)
    assert (kind, message) == ("swap", "attn.c_proj.bias <-> ln_2.weight exchanged in every layer of h (4 pairs)")
    assert len(keys) == 8
    assert compare_weights(sd, ref).findings[0].message == message  # the weight audit's words


def test_a_transposed_square_weight(imported):
    ref = imported[1]
    sd = dict(ref, **{"h.0.attn.c_proj.weight": ref["h.0.attn.c_proj.weight"].T.copy()})
    assert named(imported, sd) == ("transpose", "transpose h.0.attn.c_proj.weight", ("h.0.attn.c_proj.weight",))


def test_a_perturbed_tensor_gets_no_invented_explanation(imported):
    ref = imported[1]
    noise = np.random.default_rng(5).standard_normal(D) * 0.05
    report, _ = golden_audit(imported, dict(ref, **{"h.2.attn.c_proj.bias": ref["h.2.attn.c_proj.bias"] + noise}))
    assert not report.ok and report.swaps == [] and not report.of_kind("partial")
    (unresolved,) = report.of_kind("unresolved")
    assert "best" not in unresolved.message and unresolved.data["hypotheses"] == report.search["tried"] > 100


# -- the search itself, without a model -----------------------------------------------------------
def test_slice_restoration_inverts_the_stored_order():
    rng = np.random.default_rng(0)
    true = rng.standard_normal((4, 12))
    perm = [2, 0, 1]
    stored = np.concatenate([np.split(true, 3, axis=1)[p] for p in perm], axis=1)
    assert np.array_equal(_reorder(stored, 1, perm), true)


def test_hypotheses_are_generated_cheapest_first_and_the_bound_is_reported(imported):
    ref = imported[1]
    kinds = [h.kind for h in hypotheses(ref)]
    first = {k: kinds.index(k) for k in ("block_swap", "layer_shift", "swap", "reordered", "transpose")}
    assert first["block_swap"] < first["layer_shift"] < first["swap"] < first["reordered"] < first["transpose"]
    assert kinds.count("block_swap") == 6  # C(4, 2) layer pairs
    calls = []

    def error_of(trial, changed, screening):
        calls.append(screening)
        return 1.0
    result = search(dict(ref), error_of, 1.0, 1e-6, max_hypotheses=10)
    assert result.bounded and result.tried == 10 and result.steps == [] and calls.count(True) == 10


def test_the_command_with_golden_outputs(imported, tmp_path, capsys):
    import json

    from safetensors.numpy import save_file

    from exporters.folder import save
    from torchlean_bridge.app.cli import main
    bundle, ref, xs, golden = imported
    save(bundle, tmp_path / "bundle")
    save_file(exchange_blocks(ref, 0, 3), str(tmp_path / "bad.safetensors"))
    np.save(tmp_path / "x.npy", xs[0])
    np.save(tmp_path / "y.npy", golden[0][0])
    args = ["audit", str(tmp_path / "bundle"), "--checkpoint", str(tmp_path / "bad.safetensors"),
            "--input", str(tmp_path / "x.npy"), "--golden", str(tmp_path / "y.npy")]
    assert main(args) == 1
    out = capsys.readouterr().out
    assert "[error] block_swap: block h.0 <-> h.3 exchanged (24 tensors): max error " in out
    assert main(args + ["--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["swaps"] == [list(block_keys(ref, 0, 3))] and doc["search"]["bounded"] is False
    # a time limit of 0 s stops the structured search and the single exchanges at once, and says so
    start = time.perf_counter()
    assert main(args + ["--time-limit", "0", "--json"]) == 1
    assert time.perf_counter() - start < 3.0
    doc = json.loads(capsys.readouterr().out)
    assert doc["search"]["tried"] == 0 and doc["search"]["bounded"] is True and doc["swaps"] == []
    bounded = [f["message"] for f in doc["findings"] if f["kind"] == "search_bounded"]
    assert len(bounded) == 2 and bounded[0].startswith("the structured search stopped at its bound: 0 hypotheses")
    assert bounded[1].startswith("the time limit (0.0 s) stopped the single exchanges after 0 of ")
    assert main(args + ["--time-limit", "nan"]) == 2
    assert "--time-limit must be a finite number" in capsys.readouterr().err


# -- every layer shifted by one without wrapping: the reference's last layer is absent -----------------
def dropped_last(ref, vacated: str, scale: float = 1.0) -> dict:
    """ckpt h.i holds the reference's h.(i-1); the reference's h.3 is nowhere; h.0 holds ``vacated``:
    "fresh" values, "original" (its own tensors, hence equal to h.1's) or is "missing"."""
    out = dict(ref)
    for k in ref:
        if k.startswith("h."):
            i, rest = int(k.split(".")[1]), k.split(".", 2)[2]
            if i > 0:
                out[k] = ref[f"h.{i - 1}.{rest}"]
            elif vacated == "missing":
                del out[k]
            elif vacated == "fresh":
                out[k] = np.random.default_rng(7).standard_normal(ref[k].shape) * scale
    return out


SHIFTED = "every layer of h shifted by +1: h.1..h.3 hold the reference's h.0..h.2 (36 tensors)"


def test_a_shift_that_drops_the_last_layer_is_named_with_the_error_it_leaves(imported):
    """h.0 holds values of its own: restoring the shift (h.3 skipped) removes most of the output
    error; the rest, the absent h.3's, is stated."""
    report, _ = golden_audit(imported, dropped_last(imported[1], "fresh"))
    (f,) = report.swaps
    assert f.kind == "layer_shift" and f.message.startswith(
        f"{SHIFTED}; the reference's h.3 is absent from the checkpoint and h.0 holds tensors of its own; h.3 stood "
        f"in by zeros (the layer skipped): max error ")
    assert "(the error left is that of the absent h.3, which no rearrangement of the checkpoint restores; the " \
           "shift removes 61% of the error; the outputs alone cannot tell it from a wrong h.0: zeroing h.0 instead " \
           "leaves " in f.message
    assert f.data["absent"] == "h.3" and f.data["shift"] == 1
    assert f.data["error_after"] < f.data["error_before"] / 2 and report.error_after == f.data["error_after"] > 1e-3
    assert not report.of_kind("unresolved") and report.search["time_s"] < BOUND_S


def test_a_shift_that_removes_little_of_the_error_is_not_named(imported):
    """h.0 holds small values of its own: restoring the shift removes 13% of the error, not most of it."""
    report, _ = golden_audit(imported, dropped_last(imported[1], "fresh", scale=0.3))
    assert report.swaps == [] and not report.of_kind("partial") and not report.of_kind("duplicate_layer")
    assert report.of_kind("unresolved")


@pytest.mark.parametrize("vacated, kind, holds", [
    ("original", "duplicate_layer", "h.0 holds the same tensors as h.1 (equal by value)"),
    ("missing", "missing_layer", "h.0's keys are missing")])
def test_a_shift_the_outputs_cannot_confirm_is_named_by_its_hash_mark_claiming_no_error_removed(imported, vacated,
                                                                                                  kind, holds):
    """h.0 duplicates h.1 or is missing: restoring the shift with h.3 skipped computes the same layers
    as skipping h.0, so the outputs cannot confirm it; the finding says so and is no exchange."""
    report, _ = golden_audit(imported, dropped_last(imported[1], vacated))
    assert report.swaps == [] and not report.of_kind("unresolved") and not report.ok
    (f,) = report.of_kind(kind)
    assert f.message.startswith(f"{holds}: the mark of every layer of h shifted by +1 with the reference's h.3 "
                                f"dropped (h.1..h.3 hold the reference's h.0..h.2 (36 tensors)); the outputs cannot "
                                f"confirm it, since restoring the shift with h.3 skipped computes the same layers as "
                                f"skipping h.0: max error ")
    assert f.data["error_after"] <= f.data["error_before"] and f.message.endswith("(the rest is the absent layer's)")


def test_a_duplicated_layer_is_no_rotation(imported):
    """A rotation moves distinct layers; with two layers equal by value none is proposed."""
    kinds = [h.message for h in hypotheses(dropped_last(imported[1], "original"))]
    assert not any("rotated" in m for m in kinds) and any(m.startswith(SHIFTED) for m in kinds)


def test_a_missing_layer_with_no_value_in_the_bundle_gets_zero_stand_ins(imported):
    """The bundle holds no tensors for h.0 and the checkpoint lacks them: the graph could not be
    evaluated; zeros stand in (said), and the shift's mark is named."""
    from dataclasses import replace

    from torchlean_bridge.app.abi import abi
    from torchlean_bridge.payload import Payload
    bundle, ref, xs, golden = imported
    gone = {(s.node, s.role) for s in abi(bundle) if s.key and s.key.startswith("h.0.")}
    payload = Payload({n: {r: a for r, a in bundle.payload.record(n).items() if (n, r) not in gone}
                       for n in bundle.payload.nodes()})
    report = audit(replace(bundle, payload=payload), dropped_last(ref, "missing"), reference=golden,
                   inputs=[[x] for x in xs])
    (stand_in,) = report.of_kind("stand_in")
    assert stand_in.severity == "warning" and set(stand_in.keys) == {k for k in ref if k.startswith("h.0.")}
    assert not report.of_kind("not_evaluable") and report.swaps == []
    (f,) = report.of_kind("missing_layer")
    # zeros in h.0 skip it, as restoring the shift skips h.3: the same layers, the same error
    assert abs(f.data["error_after"] - f.data["error_before"]) < 1e-9
