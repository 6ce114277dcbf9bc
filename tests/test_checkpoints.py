"""load_checkpoint: every format, wrappers, prefixes, and refusal of pickles that would run code."""

import json
import os
import pickle

import numpy as np
import pytest
import torch
import torch.nn as nn

from importers.checkpoints import Checkpoint, as_checkpoint, load_checkpoint
from torchlean_bridge.errors import CheckpointError


def kinds(ckpt, kind):
    return [f for f in ckpt.findings if f.kind == kind]


@pytest.fixture
def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))


def assert_same_as(ckpt, state_dict):
    assert sorted(ckpt) == sorted(state_dict)  # safetensors stores keys sorted
    for k, v in state_dict.items():
        assert ckpt.shape(k) == tuple(v.shape)
        assert ckpt[k].dtype == v.numpy().dtype
        np.testing.assert_array_equal(ckpt[k], v.numpy())


def test_safetensors_is_lazy_and_exact(tmp_path, net):
    from safetensors.torch import save_file
    path = tmp_path / "w.safetensors"
    save_file(net.state_dict(), str(path))
    ckpt = load_checkpoint(path)
    assert ckpt.format == "safetensors" and isinstance(ckpt, Checkpoint)
    reads = []
    original = ckpt._read
    ckpt._read = lambda k: reads.append(k) or original(k)
    assert ckpt.shape("0.weight") == (4, 3) and ckpt.dtype("1.num_batches_tracked") == np.int64
    assert ckpt.num_parameters() == sum(v.numel() for v in net.state_dict().values())
    assert [f.kind for f in ckpt.notes] == ["integer"]  # num_batches_tracked
    assert reads == []  # shapes, dtypes, totals and notes come from the header alone
    assert_same_as(ckpt, net.state_dict())
    assert "0.weight" in reads


def test_integer_and_bool_tensors_are_reported_and_kept(tmp_path, net):
    from safetensors.torch import save_file
    save_file({**net.state_dict(), "mask": torch.tensor([True, False])}, str(tmp_path / "w.safetensors"))
    ckpt = load_checkpoint(tmp_path / "w.safetensors")
    ints = kinds(ckpt, "integer")
    assert [f.keys for f in ints] == [("1.num_batches_tracked",)]
    assert ckpt["1.num_batches_tracked"].dtype == np.int64
    assert [f.keys for f in kinds(ckpt, "bool")] == [("mask",)]
    assert ckpt["mask"].tolist() == [True, False]


def test_checkpoint_is_a_read_only_mapping(tmp_path, net):
    torch.save(net.state_dict(), tmp_path / "w.pt")
    ckpt = load_checkpoint(tmp_path / "w.pt")
    with pytest.raises(TypeError):
        ckpt["0.weight"] = np.zeros((4, 3))  # type: ignore[index]
    with pytest.raises(ValueError):
        ckpt["0.weight"][0, 0] = 1.0
    with pytest.raises(KeyError):
        ckpt["nope"]


def test_caller_arrays_stay_writeable():
    mine = np.ones(3)
    ckpt = as_checkpoint({"a": mine})
    assert not ckpt["a"].flags.writeable and mine.flags.writeable


def test_torch_file_wrappers_prefix_and_non_tensor_entries(tmp_path, net):
    sd = {f"module.{k}": v for k, v in net.state_dict().items()}
    sd["module.note"] = "not a tensor"
    for wrapper in ("state_dict", "model_state_dict"):
        torch.save({wrapper: sd, "epoch": 7, "optimizer": {"lr": 0.1}}, tmp_path / "w.pt")
        ckpt = load_checkpoint(tmp_path / "w.pt")
        assert ckpt.format == "torch"
        assert_same_as(ckpt, net.state_dict())
        assert kinds(ckpt, "wrapper")[0].data == {"wrapper": wrapper, "ignored": ["epoch", "optimizer"]}
        assert kinds(ckpt, "prefix")[0].data["count"] == len(net.state_dict())
        assert [f.keys for f in kinds(ckpt, "non_tensor")] == [("module.note",)]
    kept = load_checkpoint(tmp_path / "w.pt", strip_prefix=None)
    assert "module.0.weight" in kept


def test_prefix_is_stripped_only_when_every_key_has_it(tmp_path):
    # a model whose own submodule is called `module` keeps its keys
    torch.save({"module.a": torch.ones(1), "a": torch.zeros(1)}, tmp_path / "w.pt")
    assert sorted(load_checkpoint(tmp_path / "w.pt")) == ["a", "module.a"]


def test_malformed_json_checkpoint_entries_are_reported_not_crashes(tmp_path):
    doc = {"params": {"w": None, "v": [1.0, [2.0]], "u": "text", "t": [1.0, 2.0]}}
    (tmp_path / "c.json").write_text(json.dumps(doc))
    ckpt = load_checkpoint(tmp_path / "c.json")
    assert list(ckpt) == ["t"]
    assert sorted(k for f in kinds(ckpt, "non_tensor") for k in f.keys) == ["u", "v", "w"]
    doc["meta"] = {"t": {"shape": 7}}  # a damaged meta record refuses the file, naming the field
    (tmp_path / "c.json").write_text(json.dumps(doc))
    with pytest.raises(CheckpointError, match=r"meta\.t\.shape: 7 is not a list"):
        load_checkpoint(tmp_path / "c.json")


def test_non_finite_values_are_reported_not_changed(tmp_path):
    from safetensors.numpy import save_file
    save_file({"w": np.array([1.0, np.nan, np.inf, -np.inf], np.float32)}, str(tmp_path / "w.safetensors"))
    ckpt = load_checkpoint(tmp_path / "w.safetensors")
    (f,) = kinds(ckpt, "non_finite")
    assert f.keys == ("w",) and f.data == {"nan": 1, "inf": 2, "size": 4}
    assert np.isnan(ckpt["w"][1]) and np.isposinf(ckpt["w"][2])


def test_bfloat16_is_widened_exactly_and_reported(tmp_path):
    t = torch.tensor([1.5, -2.25, 3.0e38], dtype=torch.bfloat16)
    torch.save({"w": t}, tmp_path / "w.pt")
    from safetensors.torch import save_file
    save_file({"w": t}, str(tmp_path / "w.safetensors"))
    for name in ("w.pt", "w.safetensors"):
        ckpt = load_checkpoint(tmp_path / name)
        assert ckpt["w"].dtype == np.float32
        np.testing.assert_array_equal(ckpt["w"], t.float().numpy())
        assert kinds(ckpt, "widened")[0].keys == ("w",)


class _Payload:
    """Unpickling this would create a marker file: exactly what a weights-only load must refuse."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("protocol", [2, pickle.HIGHEST_PROTOCOL])
def test_malicious_pickle_is_refused_and_never_runs(tmp_path, protocol):
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pt"
    with open(path, "wb") as f:
        pickle.dump({"0.weight": _Payload(marker)}, f, protocol=protocol)
    with pytest.raises(CheckpointError, match="not a weights-only file") as e:
        load_checkpoint(path)
    assert "torch.save(model.state_dict()" in str(e.value)
    assert not marker.exists()


def test_malicious_pickle_inside_a_torch_zip_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    torch.save({"x": _Payload(marker)}, tmp_path / "evil.pt")  # torch's zip container, pickled payload
    with pytest.raises(CheckpointError, match="posix.system|os.system|system"):
        load_checkpoint(tmp_path / "evil.pt")
    assert not marker.exists()


def test_a_whole_pickled_module_is_refused_with_the_class_named(tmp_path, net):
    torch.save(net, tmp_path / "model.pt")
    with pytest.raises(CheckpointError, match="Sequential"):
        load_checkpoint(tmp_path / "model.pt")


def test_onnx_initializers_are_a_checkpoint(tmp_path):
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.array([0.5, -1.0], np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "W", "B"], ["y"], transB=1)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")])
    onnx.save(helper.make_model(graph), tmp_path / "m.onnx")
    ckpt = load_checkpoint(tmp_path / "m.onnx")
    assert ckpt.format == "onnx" and list(ckpt) == ["W", "B"]
    np.testing.assert_array_equal(ckpt["W"], w)
    np.testing.assert_array_equal(ckpt["B"], b)


def test_torchlean_state_dict_json(tmp_path):
    doc = {"params": {"layer.weight": [[1, 2, 3], [4, 5, 6]], "layer.bias": [0.5, 0.25], "steps": 3,
                      "name": "x"},
           "meta": {"layer.weight": {"shape": [2, 3], "dtype": "torch.float32"},
                    "steps": {"shape": [], "dtype": "torch.int64"}}}
    (tmp_path / "w.json").write_text(json.dumps(doc))
    ckpt = load_checkpoint(tmp_path / "w.json")
    assert ckpt.format == "torchlean-json"
    np.testing.assert_array_equal(ckpt["layer.weight"], [[1, 2, 3], [4, 5, 6]])
    assert ckpt["steps"].dtype == np.int64 and ckpt.shape("steps") == ()
    assert [f.keys for f in kinds(ckpt, "non_tensor")] == [("name",)]
    (tmp_path / "bad.json").write_text("[1, 2]")
    with pytest.raises(CheckpointError, match="expected a JSON object"):
        load_checkpoint(tmp_path / "bad.json")


def test_unreadable_inputs_are_checkpoint_errors(tmp_path):
    with pytest.raises(CheckpointError, match="no such checkpoint"):
        load_checkpoint(tmp_path / "missing.pt")
    (tmp_path / "junk.safetensors").write_bytes(b"\x00" * 20)
    with pytest.raises(CheckpointError, match="cannot read safetensors"):
        load_checkpoint(tmp_path / "junk.safetensors")
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match=r"^refused to load .*junk\.pt: "):
        load_checkpoint(tmp_path / "junk.pt")
    torch.save([torch.ones(1)], tmp_path / "list.pt")
    with pytest.raises(CheckpointError, match="expected a state_dict"):
        load_checkpoint(tmp_path / "list.pt")


def test_state_dict_in_memory(net):
    ckpt = as_checkpoint(net.state_dict())
    assert_same_as(ckpt, net.state_dict())
    assert as_checkpoint(ckpt) is ckpt
