"""Bundle folders: graph.json + payload.safetensors (sha256 per tensor) + roles.json (+ report.json)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import torchlean_bridge as tlb
from exporters.folder import GRAPH_FILE, PAYLOAD_FILE, ROLES_FILE
from torchlean_bridge.seed import seed_mlp_bundle
from tests.test_onnx_import import CASES


def bundles() -> dict[str, tlb.Bundle]:
    return {"seed_mlp": seed_mlp_bundle(),
            "conv": tlb.import_onnx(CASES["Conv_grouped_dilated_asym"]),
            "embedding_int64": tlb.import_onnx(CASES["Gather_embedding_int64_ids"]),
            "where_bool": tlb.import_onnx(CASES["Where_Greater"]),
            "instance_norm_transforms": tlb.import_onnx(CASES["InstanceNormalization"]),
            "scalar_initializer": tlb.import_onnx(CASES["Round"])}


@pytest.mark.parametrize("name", sorted(bundles()))
def test_folder_round_trips_to_an_equal_bundle(name: str, tmp_path) -> None:
    b = bundles()[name]
    tlb.save(b, tmp_path / "b")
    back = tlb.load(tmp_path / "b")
    assert back == b
    assert back.payload.hashes() == b.payload.hashes()
    assert {k: v.shape for k, v in back.payload.flat().items()} == {k: v.shape for k, v in b.payload.flat().items()}
    assert [n.dtype for n in back.graph] == [n.dtype for n in b.graph]
    assert [n.source for n in back.graph] == [n.source for n in b.graph]
    assert back.roles.bindings() == b.roles.bindings()
    assert back.report == json.loads(json.dumps(b.report))


def test_saving_over_a_folder_replaces_everything(tmp_path) -> None:
    tlb.save(tlb.import_onnx(CASES["BatchNormalization"]), tmp_path / "b")
    seed = seed_mlp_bundle()
    seed.report = {}
    tlb.save(seed, tmp_path / "b")
    back = tlb.load(tmp_path / "b")
    assert back == seed and back.report == {}


def test_folder_files_are_deterministic(tmp_path) -> None:
    tlb.save(tlb.import_onnx(CASES["BatchNormalization"]), tmp_path / "a")
    tlb.save(tlb.import_onnx(CASES["BatchNormalization"]), tmp_path / "b")
    for f in (GRAPH_FILE, PAYLOAD_FILE, ROLES_FILE):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes()


def test_modified_tensor_is_rejected(tmp_path) -> None:
    tlb.save(seed_mlp_bundle(), tmp_path / "b")
    path = tmp_path / "b" / PAYLOAD_FILE
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01  # one bit of the last tensor's last value
    path.write_bytes(bytes(data))
    with pytest.raises(tlb.BridgeError, match=r"tensor `3\.weight` does not match its recorded sha256"):
        tlb.load(tmp_path / "b")


def saved_payload(tmp_path) -> tuple:
    """A saved seed bundle's payload file, its tensors and its metadata (to rewrite them)."""
    from safetensors import safe_open
    tlb.save(seed_mlp_bundle(), tmp_path / "b")
    path = tmp_path / "b" / PAYLOAD_FILE
    with safe_open(str(path), framework="numpy") as f:
        meta = f.metadata()
    return path, load_file(str(path)), meta


def test_tensor_swapped_for_another_of_the_same_shape_is_rejected(tmp_path) -> None:
    path, tensors, meta = saved_payload(tmp_path)
    tensors["1.bias"] = tensors["1.bias"][::-1].copy()
    save_file(tensors, str(path), metadata=meta)
    with pytest.raises(tlb.BridgeError, match=r"tensor `1\.bias` does not match"):
        tlb.load(tmp_path / "b")


def test_added_or_missing_tensors_are_rejected(tmp_path) -> None:
    path, tensors, meta = saved_payload(tmp_path)
    save_file({**tensors, "2.weight": np.zeros(3)}, str(path), metadata=meta)
    with pytest.raises(tlb.BridgeError, match="without a recorded sha256"):
        tlb.load(tmp_path / "b")
    del tensors["3.bias"]
    save_file(tensors, str(path), metadata=meta)
    with pytest.raises(tlb.BridgeError, match=r"missing: \['3\.bias'\]"):
        tlb.load(tmp_path / "b")


def test_unreadable_folders_are_bridge_errors(tmp_path) -> None:
    with pytest.raises(tlb.BridgeError, match="no such file or folder"):
        tlb.load(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(tlb.BridgeError, match="graph.json is missing"):
        tlb.load(tmp_path / "empty")
    tlb.save(seed_mlp_bundle(), tmp_path / "b")
    (tmp_path / "b" / PAYLOAD_FILE).write_bytes(b"\x00" * 5)
    with pytest.raises(tlb.BridgeError, match="cannot read payload"):
        tlb.load(tmp_path / "b")


def test_payload_without_hash_metadata_is_rejected(tmp_path) -> None:
    path, tensors, _ = saved_payload(tmp_path)
    save_file(tensors, str(path))  # same tensors, metadata stripped
    with pytest.raises(tlb.BridgeError, match="cannot be verified"):
        tlb.load(tmp_path / "b")
