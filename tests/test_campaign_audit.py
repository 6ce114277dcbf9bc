"""``audit BUNDLE --checkpoints GLOB|LIST``: one row per checkpoint, each the single-checkpoint audit's
verdict (ok, the swapped pair named, missing and extra keys), an unreadable checkpoint an ``error``
row, and a summary; ``--json`` has every row with its full audit report."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

import torchlean_bridge as tlb
from exporters.folder import save
from torchlean_bridge.app.campaign.audit_campaign import checkpoint_list
from torchlean_bridge.app.cli import main
from torchlean_bridge.seed import bias_pair_bundle
from tests.test_audit import SEED_FACTORY, seed_module

FACTORY = SEED_FACTORY  # the demo's trusted module (tests/test_audit.py)
reference = seed_module


@pytest.fixture
def run_folder(tmp_path):
    """A training run's checkpoints: right, two biases swapped, a key missing, a key extra, a broken file."""
    sd = {k: v.clone() for k, v in reference().state_dict().items()}
    run = tmp_path / "run"
    run.mkdir()
    save_file(sd, str(run / "ckpt-0-right.safetensors"))
    swapped = dict(sd, **{"0.bias": sd["2.bias"].clone(), "2.bias": sd["0.bias"].clone()})
    save_file(swapped, str(run / "ckpt-1-swapped.safetensors"))
    save_file({k: v for k, v in sd.items() if k != "2.bias"}, str(run / "ckpt-2-missing.safetensors"))
    save_file(dict(sd, **{"head.extra": torch.zeros(2)}), str(run / "ckpt-3-extra.safetensors"))
    (run / "ckpt-4-broken.safetensors").write_bytes(b"\x00" * 10)
    save(bias_pair_bundle(), tmp_path / "bundle")
    (tmp_path / "ref.py").write_text(FACTORY)
    return tmp_path


@pytest.mark.slow  # the workers import torch for the reference module (~15 s on 2 busy cores)
def test_checkpoint_rows_match_the_single_audit(run_folder, capsys):
    tmp = run_folder
    status = main(["audit", str(tmp / "bundle"), "--checkpoints", str(tmp / "run" / "ckpt-*.safetensors"),
                   "--reference", f"{tmp / 'ref.py'}:make", "--workers", "2", "--json"])
    assert status == 1
    doc = json.loads(capsys.readouterr().out)
    rows = {r["checkpoint"].rsplit("/", 1)[-1]: r for r in doc["rows"]}
    assert [r["checkpoint"] for r in doc["rows"]] == sorted(r["checkpoint"] for r in doc["rows"])
    assert {k: r["status"] for k, r in rows.items()} == {
        "ckpt-0-right.safetensors": "ok", "ckpt-1-swapped.safetensors": "swapped",
        "ckpt-2-missing.safetensors": "missing", "ckpt-3-extra.safetensors": "extra",
        "ckpt-4-broken.safetensors": "error"}
    assert rows["ckpt-1-swapped.safetensors"]["swaps"] == "0.bias<->2.bias"
    assert rows["ckpt-2-missing.safetensors"]["missing"] == "2.bias"
    assert rows["ckpt-3-extra.safetensors"]["extra"] == "head.extra"
    assert doc["counts"] == {"ok": 1, "swapped": 1, "missing": 1, "extra": 1, "error": 1}
    # each row is what the single-checkpoint audit says about that file
    bundle = tlb.load(tmp / "bundle")
    for name, row in rows.items():
        if row["status"] == "error":
            with pytest.raises(tlb.BridgeError) as e:
                tlb.load_checkpoint(tmp / "run" / name)
            assert row["message"] == str(e.value)
            continue
        single = tlb.audit(bundle, tlb.load_checkpoint(tmp / "run" / name), reference=reference())
        assert row["report"] == json.loads(json.dumps(single.to_json())), name
        assert (row["status"] == "ok") == single.ok


def test_list_file_text_output_and_usage_errors(run_folder, capsys):
    tmp = run_folder
    (tmp / "run" / "ckpts.txt").write_text("# two of them\nckpt-0-right.safetensors\n\nckpt-9-gone.safetensors\n")
    assert checkpoint_list(str(tmp / "run" / "ckpts.txt")) == [str(tmp / "run" / "ckpt-0-right.safetensors"),
                                                               str(tmp / "run" / "ckpt-9-gone.safetensors")]
    status = main(["audit", str(tmp / "bundle"), "--checkpoints", str(tmp / "run" / "ckpts.txt"), "--workers", "1"])
    out = capsys.readouterr().out
    assert status == 1
    assert f"{tmp / 'run' / 'ckpt-0-right.safetensors'}: ok" in out
    assert "ckpt-9-gone.safetensors: error" in out and "no such checkpoint file" in out
    assert "audit campaign of 2 checkpoint(s)" in out

    assert main(["audit", str(tmp / "bundle"), "--checkpoints", str(tmp / "none-*.pt")]) == 2
    assert "no file matches" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["audit", str(tmp / "bundle"), "--checkpoints", "x", "--checkpoint", "y"])
    assert "not allowed with argument" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["audit", str(tmp / "bundle")])
    assert "one of the arguments --checkpoint --checkpoints is required" in capsys.readouterr().err
