"""Scale (issue 17): hashing and verifying tensors make no resident copy; values are unchanged."""

import hashlib

import numpy as np
import pytest

import torchlean_bridge as tlb
from torchlean_bridge.payload import tensor_sha256


def _old_sha256(a: np.ndarray) -> str:
    a = np.asarray(a, order="C")
    h = hashlib.sha256(f"{a.dtype.str}|{','.join(map(str, a.shape))}|".encode())
    h.update(a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes())
    return h.hexdigest()


@pytest.mark.parametrize("a", [
    np.arange(12, dtype=np.float32).reshape(3, 4),
    np.arange(12, dtype=np.float64).reshape(3, 4).T,          # not contiguous
    np.arange(6, dtype=">f8").reshape(2, 3),                  # big-endian
    np.array(2.5), np.zeros((0, 3), np.float32), np.array([True, False]),
    np.arange(5, dtype=np.int64)[::2], np.arange(4, dtype=np.float16),
])
def test_tensor_sha256_is_the_documented_hash(a):
    assert tensor_sha256(a) == _old_sha256(a)


def _bundle() -> tlb.Bundle:
    doc = {"format": "torchlean.ir.v1", "input_id": 0, "output_ids": [1],
           "nodes": [{"id": 0, "kind": "input", "parents": [], "shape": [3]},
                     {"id": 1, "kind": "linear", "parents": [0], "shape": [2]}]}
    g = tlb.load_graph(doc)
    rng = np.random.default_rng(0)
    return tlb.Bundle(g, tlb.Payload({1: {"weight": rng.standard_normal((2, 3)), "bias": rng.standard_normal(2)}}))


def test_loaded_payload_is_verified_from_the_file_and_stays_a_mapped_view(tmp_path):
    b = _bundle()
    out = tlb.save(b, tmp_path / "b")
    loaded = tlb.load(out)
    w = loaded.payload.get(1, "weight")
    assert not w.flags.owndata and not w.flags.writeable  # a view of the mapping, not a copy
    np.testing.assert_array_equal(w, b.payload.get(1, "weight"))
    # one flipped byte in a tensor is still caught by the block-wise verification
    files = [p for p in out.iterdir() if p.suffix == ".safetensors"]
    assert len(files) == 1
    data = bytearray(files[0].read_bytes())
    data[-1] ^= 0x01
    files[0].write_bytes(bytes(data))
    with pytest.raises(tlb.BridgeError, match="does not match its recorded sha256"):
        tlb.load(out)


@pytest.mark.parametrize("importer", ["import_fx", "import_export"])
def test_torch_import_shares_float32_parameter_storage(importer):
    torch = pytest.importorskip("torch")
    m = torch.nn.Sequential(torch.nn.Conv2d(2, 3, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                            torch.nn.Linear(3 * 4 * 4, 5)).float().eval()
    x = torch.randn(1, 2, 6, 6)
    b = getattr(tlb, importer)(m, (x,) if importer == "import_export" else x)
    params = dict(m.named_parameters())
    shared = {name for name, p in params.items()
              if any(np.shares_memory(a, p.detach().numpy()) for a in b.payload.flat().values())}
    assert shared == set(params)  # every float32 weight and bias is a view, none copied
    want = m(x).detach().numpy()
    got = tlb.evaluate(b.graph, b.payload, [x.numpy()], dtype="float32")[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_onnx_external_data_import_is_a_view_of_the_mapping(tmp_path):
    onnx = pytest.importorskip("onnx")
    import mmap
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    w, bias = rng.standard_normal((6, 4), dtype=np.float32), rng.standard_normal(6, dtype=np.float32)
    graph = helper.make_graph([helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1)], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6])],
                              [numpy_helper.from_array(w, "w"), numpy_helper.from_array(bias, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save_model(model, str(tmp_path / "m.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="m.data", size_threshold=0)
    b = tlb.import_onnx(tmp_path / "m.onnx")
    arrays = list(b.payload.flat().values())
    assert len(arrays) == 2
    for a in arrays:
        base = a
        while isinstance(getattr(base, "base", None), (np.ndarray, mmap.mmap)):
            base = base.base
        assert isinstance(base, mmap.mmap) and a.dtype == np.float32
    x = rng.standard_normal((1, 4), dtype=np.float32)
    got = tlb.evaluate(b.graph, b.payload, [x], dtype="float32")[0]
    np.testing.assert_allclose(got, x @ w.T + bias, rtol=1e-5, atol=1e-5)
