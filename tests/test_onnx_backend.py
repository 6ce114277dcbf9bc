"""The ONNX backend (torchlean_bridge.onnx_backend) and onnx's backend test suite run through it.

The suite test runs every CPU case of the installed onnx's backend tests and compares the outcome
with tests/onnx_expected_failures.txt: an unlisted failure and a listed case that passes both fail.
The small tests pin the backend's behaviours against onnxruntime / onnx's reference evaluator.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper
from onnx.reference import ReferenceEvaluator

import torchlean_bridge as tlb
from torchlean_bridge.errors import UnsupportedError
from torchlean_bridge import onnx_backend as backend

import onnx_conformance

N = helper.make_node


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                          [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
                          [onnx.numpy_helper.from_array(v, n) for n, v in inits])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _reference(m, feeds):
    return ReferenceEvaluator(m).run(None, feeds)


# -- the backend interface -------------------------------------------------------------------

def test_backend_class_implements_onnx_backend_interface():
    import onnx.backend.base as base
    assert issubclass(backend.TorchLeanBackend, base.Backend)
    assert backend.TorchLeanBackend.supports_device("CPU") and not backend.TorchLeanBackend.supports_device("CUDA")
    rep = backend.TorchLeanBackend.prepare(_model([N("Relu", ["x"], ["y"])], [("x", TP.FLOAT, [2, 3])],
                                                  [("y", TP.FLOAT, [2, 3])]))
    assert isinstance(rep, base.BackendRep)
    x = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)
    (y,) = rep.run([x])
    assert y.dtype == np.float32 and np.array_equal(y, np.maximum(x, 0))


def test_float64_models_evaluate_and_answer_in_float64():
    m = _model([N("Div", ["x", "z"], ["y"])], [("x", TP.DOUBLE, [3]), ("z", TP.DOUBLE, [3])], [("y", TP.DOUBLE, [3])])
    x, z = np.array([1.0, 2.0, 1.0]), np.array([3.0, 7.0, 1e-300])
    (y,) = backend.run_model(m, [x, z])
    assert y.dtype == np.float64 and np.array_equal(y, x / z)  # binary32 would round 1/3 and overflow 1/1e-300
    assert backend.prepare(m).dtype == "float64" and tlb.import_onnx(m).report["precision"] == "float64"


def test_outputs_have_the_models_integer_types_and_narrowing_casts_wrap_as_onnx_says():
    m = _model([N("Cast", ["x"], ["y"], to=TP.INT64)], [("x", TP.FLOAT, [3])], [("y", TP.INT64, [3])])
    (y,) = backend.run_model(m, [np.array([1.5, -2.5, 7.0], np.float32)])
    assert y.dtype == np.int64 and y.tolist() == [1, -2, 7]
    # fixed point to a narrower fixed point discards the higher bits (Cast's spec: 200 as int16 -> -56 as int8)
    m = _model([N("Cast", ["x"], ["y"], to=TP.UINT8)], [("x", TP.INT64, [3])], [("y", TP.UINT8, [3])])
    x = np.array([300, -1, 5], np.int64)
    (y,) = backend.run_model(m, [x])
    assert y.dtype == np.uint8 and y.tolist() == _reference(m, {"x": x})[0].tolist() == [44, 255, 5]
    # a float out of range is undefined in ONNX: refused at evaluation, never wrapped
    m = _model([N("Cast", ["x"], ["y"], to=TP.UINT8)], [("x", TP.FLOAT, [3])], [("y", TP.UINT8, [3])])
    assert backend.run_model(m, [np.array([0.5, 255.9, 3.0], np.float32)])[0].tolist() == [0, 255, 3]
    with pytest.raises(tlb.BridgeError, match="value 256 is outside uint8"):
        backend.run_model(m, [np.array([0.0, 256.0, 3.0], np.float32)])
    from torchlean_bridge.app.onnx_backend import _output_array
    assert _output_array(np.array([3, 200]), TP.UINT8, "y").dtype == np.uint8
    with pytest.raises(tlb.BridgeError, match=r"output `y` holds values in \[3, 300\], outside uint8"):
        _output_array(np.array([3, 300]), TP.UINT8, "y")


def test_run_node_builds_a_one_node_model():
    node = N("LeakyRelu", ["x"], ["y"], alpha=0.5)
    x = np.array([-2.0, 3.0], np.float32)
    (y,) = backend.run_node(node, [x])
    assert y.dtype == np.float32 and y.tolist() == [-1.0, 3.0]


def test_steering_inputs_are_bound_when_the_backend_runs():
    m = _model([N("Reshape", ["x", "s"], ["r"]), N("ReduceSum", ["r", "a"], ["y"], keepdims=0)],
               [("x", TP.FLOAT, [2, 6]), ("s", TP.INT64, [2]), ("a", TP.INT64, [1])], [("y", TP.FLOAT, None)],
               opset=18)
    rep = backend.prepare(m)
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    for shape, axes in (([3, 4], [0]), ([4, -1], [1])):
        feeds = {"x": x, "s": np.array(shape), "a": np.array(axes)}
        (y,) = rep.run(feeds)
        np.testing.assert_array_equal(y, _reference(m, feeds)[0])
    assert rep.steering == ["s", "a"]


def test_constants_freeze_graph_inputs_and_fold_what_follows():
    w = np.arange(6, dtype=np.float32).reshape(3, 2)
    m = _model([N("Transpose", ["w"], ["wt"]), N("MatMul", ["x", "wt"], ["y"])],
               [("x", TP.FLOAT, [1, 2]), ("w", TP.FLOAT, [3, 2])], [("y", TP.FLOAT, [1, 3])])
    b = tlb.import_onnx(m, constants={"w": w})
    assert b.report["inputs"] == ["x"] and b.report["bound_inputs"] == ["w"]
    x = np.array([[1.0, -1.0]], np.float32)
    np.testing.assert_allclose(tlb.evaluate(b.graph, b.payload, [x])[0], x @ w.T)
    with pytest.raises(tlb.BridgeError, match=r"bound to `w` has shape \[2, 3\]; the model declares \[3, 2\]"):
        tlb.import_onnx(m, constants={"w": w.T})
    with pytest.raises(tlb.BridgeError, match="constants names \\['v'\\], which are not graph inputs"):
        tlb.import_onnx(m, constants={"v": w})


# -- what the importer refuses, and how ---------------------------------------------------------

def test_narrow_floats_are_held_exactly_and_rounded_where_onnx_rounds():
    x = np.array([1.0 + 2.0 ** -11, -3.1, 70000.0], np.float32)  # a tie, an inexact value, an overflow
    for et, dt in ((TP.FLOAT16, np.float16), (TP.BFLOAT16, onnx.helper.tensor_dtype_to_np_dtype(TP.BFLOAT16))):
        m = _model([N("Relu", ["x"], ["y"])], [("x", et, [3])], [("y", et, [3])])
        (y,) = backend.run_model(m, [x.astype(dt)])
        assert y.dtype == dt and y.tobytes() == _reference(m, {"x": x.astype(dt)})[0].tobytes()
        m = _model([N("Cast", ["x"], ["h"], to=et), N("Cast", ["h"], ["y"], to=TP.FLOAT)],
                   [("x", TP.FLOAT, [3])], [("y", TP.FLOAT, [3])])
        (y,) = backend.run_model(m, [x])
        assert y.tolist() == x.astype(dt).astype(np.float32).tolist()


def test_messages_name_the_onnx_element_type_and_non_tensor_inputs():
    m = _model([N("Sign", ["x"], ["y"])], [("x", TP.INT8, [2])], [("y", TP.INT8, [2])], opset=14)
    with pytest.raises(UnsupportedError, match="operands of element types int8:"):
        tlb.import_onnx(m)
    m = _model([N("Identity", ["x"], ["y"])], [("x", TP.STRING, [2])], [("y", TP.STRING, [2])])
    with pytest.raises(tlb.BridgeError, match="input `x` has element type string"):
        tlb.import_onnx(m)
    seq = helper.make_tensor_sequence_value_info("s", TP.FLOAT, [2])
    g = helper.make_graph([N("SequenceLength", ["s"], ["n"])], "g", [seq],
                          [helper.make_tensor_value_info("n", TP.INT64, [])])
    with pytest.raises(tlb.BridgeError, match=r"input `s` is a sequence \(seq\(tensor\(float\)"):
        tlb.import_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))


@pytest.mark.parametrize("op", ["SpaceToDepth", "DepthToSpace"])
@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_space_depth_modes_match_onnx_reference(op, mode):
    shape = (2, 3, 4, 6) if op == "SpaceToDepth" else (2, 12, 2, 3)
    m = _model([N(op, ["x"], ["y"], blocksize=2, mode=mode)], [("x", TP.FLOAT, shape)], [("y", TP.FLOAT, None)],
               opset=28)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    (y,) = backend.run_model(m, [x])
    np.testing.assert_array_equal(y, _reference(m, {"x": x})[0])


def test_old_opsets_are_upgraded_with_a_note():
    m = _model([N("Add", ["x", "b"], ["y"], broadcast=1)], [("x", TP.FLOAT, [2, 3])], [("y", TP.FLOAT, [2, 3])],
               [("b", np.array([1.0, 2.0, 3.0], np.float32))], opset=6)
    b = tlb.import_onnx(m)
    assert b.report["opset"] == 7 and any("upgraded from opset 6 to 7" in n for n in b.report["notes"])
    x = np.ones((2, 3), np.float32)
    np.testing.assert_array_equal(tlb.evaluate(b.graph, b.payload, [x])[0], x + [1, 2, 3])


def test_an_op_version_newer_than_its_handler_is_refused_by_name(monkeypatch):
    from importers.onnx import opsets
    monkeypatch.setitem(opsets.OPSETS, "Relu", (6, 13))  # as if Relu-14 had changed semantics
    with pytest.raises(UnsupportedError, match=r"Relu-14 \(in effect at opset 17\) changed semantics after the "
                                                   r"versions the handler implements \(Relu-6..Relu-13\)"):
        tlb.import_onnx(_model([N("Relu", ["x"], ["y"])], [("x", TP.FLOAT, [2])], [("y", TP.FLOAT, [2])]))


def test_every_handler_states_real_operator_versions():
    import onnx.defs

    from importers.onnx import HANDLERS
    from importers.onnx.opsets import OPSETS
    assert set(OPSETS) == set(HANDLERS)
    for op, (first, last) in OPSETS.items():
        versions = {s.since_version for s in onnx.defs.get_all_schemas_with_history() if s.name == op and not s.domain}
        assert first in versions and last in versions, op


# -- the conformance run ---------------------------------------------------------------------

def test_expected_failures_file_is_well_formed():
    entries = onnx_conformance.read_expected()
    assert entries and all(e.category in onnx_conformance.CATEGORIES for e in entries)
    assert len({e.pattern.pattern for e in entries}) == len(entries)


@pytest.mark.slow
def test_onnx_backend_suite_matches_the_expected_failures():
    results = onnx_conformance.run_suite()
    unexpected, stale = onnx_conformance.compare(results, onnx_conformance.read_expected())
    assert len(results) > 2000
    assert not unexpected, "unlisted failures:\n" + "\n".join(f"{r.name}: {r.message}" for r in unexpected)
    assert not stale, "listed in onnx_expected_failures.txt but passing: " + ", ".join(r.name for r in stale)


def test_cli_bind_freezes_an_input_from_a_npy_file(tmp_path, capsys):
    from torchlean_bridge.app.cli import main
    m = _model([N("Reshape", ["x", "s"], ["y"])], [("x", TP.FLOAT, ["batch", 6]), ("s", TP.INT64, [2])],
               [("y", TP.FLOAT, None)])
    onnx.save(m, str(tmp_path / "m.onnx"))
    np.save(tmp_path / "s.npy", np.array([3, 2]))
    out = tmp_path / "b"
    assert main(["import", str(tmp_path / "m.onnx"), "--bind", f"s={tmp_path / 's.npy'}", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "note: input `x`: dynamic dimension `batch` at axis 0 (batch) set to 1" in text
    b = tlb.load(out)
    assert b.graph.nodes[b.graph.outputs[0]].out_shape == (3, 2)
    assert main(["import", str(tmp_path / "m.onnx"), "--bind", "s", "-o", str(tmp_path / "c")]) == 2
    assert "--bind 's': expected NAME=FILE.npy" in capsys.readouterr().err


# -- external data ---------------------------------------------------------------------------

def _external_model(tmp_path, location="weights.bin"):
    w = np.random.default_rng(1).standard_normal((64, 32)).astype(np.float32)
    m = _model([N("MatMul", ["x", "W"], ["h"]), N("Relu", ["h"], ["y"])], [("x", TP.FLOAT, [2, 64])],
               [("y", TP.FLOAT, [2, 32])], [("W", w)])
    onnx.save(m, str(tmp_path / "m.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
              location=location, size_threshold=0)
    return tmp_path / "m.onnx", w


def test_external_data_is_memory_mapped_and_evaluates_and_saves(tmp_path):
    path, w = _external_model(tmp_path)
    b = tlb.import_onnx(path)
    x = np.random.default_rng(2).standard_normal((2, 64)).astype(np.float32)
    np.testing.assert_allclose(tlb.evaluate(b.graph, b.payload, [x], dtype="float32")[0], np.maximum(x @ w, 0),
                               rtol=1e-5)
    tlb.save(b, tmp_path / "bundle")
    again = tlb.load(tmp_path / "bundle")
    np.testing.assert_array_equal(tlb.evaluate(again.graph, again.payload, [x])[0], tlb.evaluate(b.graph, b.payload,
                                                                                                [x])[0])


def test_external_data_outside_the_model_folder_is_refused(tmp_path):
    path, _ = _external_model(tmp_path)
    m = onnx.load(str(path), load_external_data=False)
    for location in ("../weights.bin", "/etc/passwd"):
        for kv in m.graph.initializer[0].external_data:
            if kv.key == "location":
                kv.value = location
        onnx.save(m, str(tmp_path / "evil.onnx"))
        with pytest.raises(tlb.BridgeError, match="must be a relative path inside the model's folder"):
            tlb.import_onnx(tmp_path / "evil.onnx")
    for kv in m.graph.initializer[0].external_data:
        if kv.key == "length":
            kv.value = "12"
        if kv.key == "location":
            kv.value = "weights.bin"
    onnx.save(m, str(tmp_path / "short.onnx"))
    with pytest.raises(tlb.BridgeError, match=r"length 12 do not hold \[64, 32\] x float32"):
        tlb.import_onnx(tmp_path / "short.onnx")


def test_layer_normalization_mean_and_inv_std_dev_outputs_match_onnx_reference():
    m = _model([N("LayerNormalization", ["x", "s", "b"], ["y", "mean", "inv"], axis=1, epsilon=1e-3)],
               [("x", TP.FLOAT, [2, 3, 4])], [("y", TP.FLOAT, None), ("mean", TP.FLOAT, None),
                                              ("inv", TP.FLOAT, None)],
               [("s", np.full((3, 4), 2.0, np.float32)), ("b", np.full((3, 4), 0.5, np.float32))])
    x = np.random.default_rng(3).standard_normal((2, 3, 4)).astype(np.float32)
    ours = backend.run_model(m, [x])
    for a, r in zip(ours, _reference(m, {"x": x})):
        assert a.shape == r.shape
        np.testing.assert_allclose(a, r, rtol=1e-5, atol=1e-6)
