"""Checkpoints as users have them: Hugging Face shard indexes (safetensors and .bin), checkpoint folders,
torch.distributed.checkpoint folders; hostile indexes and metadata refused by name."""

from __future__ import annotations

import json
import os
import pickle

import numpy as np
import pytest
import torch

import torchlean_bridge as tlb
from torchlean_bridge.errors import CheckpointError
from tests.torchvision_cpu import define_missing_ops

define_missing_ops()  # transformers imports torchvision when installed (see tests/torchvision_cpu.py)


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=16)).eval()


def _same_as(ckpt, state):
    assert set(ckpt) <= set(state) and len(ckpt) > 0
    for k in ckpt:
        np.testing.assert_array_equal(ckpt[k], state[k].detach().float().numpy())


def _bin_shards(model, folder):
    """pytorch_model.bin.index.json and three weights-only shards, as save_pretrained writes them."""
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    keys = list(state)
    weight_map = {}
    for i in range(3):
        name = f"pytorch_model-0000{i + 1}-of-00003.bin"
        part = keys[i::3]
        torch.save({k: state[k] for k in part}, folder / name)
        weight_map.update({k: name for k in part})
    (folder / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


@pytest.mark.parametrize("safe", [True, False])
def test_a_sharded_save_pretrained_reads_as_one_checkpoint(tmp_path, safe):
    model = _gpt2()
    if safe:
        model.save_pretrained(tmp_path, max_shard_size="20KB")
    else:
        _bin_shards(model, tmp_path)
    index = tmp_path / ("model.safetensors.index.json" if safe else "pytorch_model.bin.index.json")
    assert index.exists() and len(set(json.loads(index.read_text())["weight_map"].values())) > 2
    for source in (tmp_path, index):
        ckpt = tlb.load_checkpoint(source)
        assert ckpt.format.startswith("sharded") and set(ckpt) == set(json.loads(index.read_text())["weight_map"])
        _same_as(ckpt, model.state_dict())


def test_a_folder_with_one_checkpoint_file_reads_that_file(tmp_path):
    from safetensors.numpy import save_file
    save_file({"w": np.ones((2, 3), np.float32)}, str(tmp_path / "model.safetensors"))
    assert tlb.load_checkpoint(tmp_path)["w"].shape == (2, 3)
    (tmp_path / "other.safetensors").write_bytes((tmp_path / "model.safetensors").read_bytes())
    assert tlb.load_checkpoint(tmp_path).source.endswith("model.safetensors")  # the conventional name wins
    os.remove(tmp_path / "model.safetensors")
    (tmp_path / "third.pt").write_bytes(b"")
    with pytest.raises(CheckpointError, match="expected one shard index or one checkpoint file, found other.safetensors, third.pt"):
        tlb.load_checkpoint(tmp_path)


def test_a_distributed_checkpoint_reads_tensor_by_tensor(tmp_path):
    import torch.distributed.checkpoint as dcp
    state = {"a.weight": torch.randn(3, 4), "b": torch.randn(5).to(torch.bfloat16), "step": 7}
    dcp.save(state, checkpoint_id=str(tmp_path))
    ckpt = tlb.load_checkpoint(tmp_path)
    assert ckpt.format == "torch.distributed.checkpoint" and set(ckpt) == {"a.weight", "b"}
    np.testing.assert_array_equal(ckpt["a.weight"], state["a.weight"].numpy())
    np.testing.assert_array_equal(ckpt["b"], state["b"].float().numpy())
    assert any(f.kind == "non_tensor" and "step" in f.message for f in ckpt.notes)


class _Boom:
    def __reduce__(self):
        return (os.system, ("touch PWNED",))


def test_distributed_metadata_that_would_run_code_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / ".metadata").write_bytes(pickle.dumps(_Boom()))
    with pytest.raises(CheckpointError, match=r"its \.metadata is not DCP metadata .*posix\.system is not part"):
        tlb.load_checkpoint(tmp_path / "ck")
    assert not (tmp_path / "PWNED").exists()


@pytest.mark.parametrize("index, message", [
    ({"weight_map": {"w": "../outside.safetensors"}}, "must be a file beside the index"),
    ({"weight_map": {"w": "missing.safetensors"}}, "shard missing.safetensors is missing"),
    ({"weight_map": {"w": "s.safetensors", "v": "s.safetensors"}}, r"1 key\(s\) the index puts in s.safetensors "
                                                                   r"are not there \(first: v\)"),
    ({"metadata": {}}, "expected"),
    ([1, 2], "expected"),
])
def test_bad_shard_indexes_are_refused_by_name(tmp_path, index, message):
    from safetensors.numpy import save_file
    save_file({"w": np.ones(2, np.float32)}, str(tmp_path / "s.safetensors"))
    save_file({"w": np.ones(2, np.float32)}, str(tmp_path.parent / "outside.safetensors"))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match=message):
        tlb.load_checkpoint(tmp_path / "model.safetensors.index.json")


@pytest.mark.parametrize("text", ['{"name": "not a checkpoint", "version": 3}', "[]", "{}"])
def test_a_json_file_that_is_not_a_checkpoint_is_refused(tmp_path, text):
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(CheckpointError, match="(is not a checkpoint|expected a JSON object)"):
        tlb.load_checkpoint(tmp_path / "config.json")


def test_audit_reads_a_sharded_checkpoint_folder(tmp_path):
    from transformers import GPT2Config  # noqa: F401 - the model's own package
    model = _gpt2()
    model.save_pretrained(tmp_path / "ck", max_shard_size="20KB")
    ids = torch.randint(0, 64, (1, 6))

    class Logits(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, x):
            return self.m(input_ids=x).logits

    wrapped = Logits(model).eval()
    b = tlb.import_export(wrapped, (ids,))
    ckpt = tlb.load_checkpoint(tmp_path / "ck")
    keyed = {f"m.{k}": ckpt[k] for k in ckpt}
    report = tlb.audit(b, keyed, reference=wrapped, inputs=[ids.numpy()])
    assert report.ok, str(report)
