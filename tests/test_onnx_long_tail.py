"""Issue #32's long tail of ONNX import against onnxruntime and onnx's reference.

Classes: duplicate opset_import headers, Pow of a negative base (NaN), integer arithmetic on the data
path (exact int64), dynamic-offset slices, pre-opset-7 broadcast attributes, and data-dependent shapes
refused by name. Each builds small models with onnx.helper on generated data.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper
from onnx.reference import ReferenceEvaluator

import torchlean_bridge as tlb
from torchlean_bridge.errors import BridgeError
from tests.onnx_models import evaluate_onnx, onnx_model

ort = pytest.importorskip("onnxruntime")
N = helper.make_node
RNG = np.random.default_rng(32)


def _ort(m, feeds):
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def _ref(m, feeds):
    return ReferenceEvaluator(m).run(None, feeds)


def _relu_model(opsets):
    m = onnx_model([N("Relu", ["x"], ["y"])], [("x", TP.FLOAT, [2, 3])], [("y", TP.FLOAT, [2, 3])], opset=13,
                   ir_version=8)
    del m.opset_import[:]
    for domain, version in opsets:
        m.opset_import.add(domain=domain, version=version)
    return m


# -- 3: headers onnxruntime accepts

@pytest.mark.parametrize("opsets", [[("", 13), ("", 13)], [("", 13), ("ai.onnx", 13)],
                                    [("", 13), ("com.microsoft", 1), ("", 13), ("com.microsoft", 1)]])
def test_duplicate_opset_imports_that_agree_are_accepted(opsets):
    m = _relu_model(opsets)
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    (ours,) = evaluate_onnx(m, {"x": x})
    np.testing.assert_array_equal(ours, _ort(m, {"x": x})[0])
    assert tlb.import_onnx(m).report["opset"] == 13
    assert tlb.import_onnx(m).report["opset"] == 13


@pytest.mark.parametrize("opsets", [[("", 13), ("", 14)], [("ai.onnx", 12), ("", 13)],
                                    [("", 13), ("com.microsoft", 1), ("com.microsoft", 2)]])
def test_duplicate_opset_imports_that_disagree_are_refused_naming_both_versions(opsets):
    with pytest.raises(BridgeError, match=r"twice with different versions \((\d+) and (\d+)\)"):
        tlb.import_onnx(_relu_model(opsets))


def test_duplicate_old_opset_is_upgraded_once():
    """An old model listed twice is upgraded as one opset (the converter alone would leave a stale entry)."""
    m = onnx_model([N("Add", ["x", "x"], ["y"])], [("x", TP.FLOAT, [2, 3])], [("y", TP.FLOAT, [2, 3])],
                   opset=6, ir_version=7)
    m.opset_import.add(domain="", version=6)
    x = RNG.standard_normal((2, 3)).astype(np.float32)
    (ours,) = evaluate_onnx(m, {"x": x})
    np.testing.assert_array_equal(ours, _ref(m, {"x": x})[0])
    assert tlb.import_onnx(m).report["opset"] == 7


# -- 5: NaN is an answer

def _same_with_nan(a, b):
    assert a.shape == b.shape
    np.testing.assert_array_equal(np.isnan(a), np.isnan(b))
    np.testing.assert_allclose(np.nan_to_num(a), np.nan_to_num(b).astype(np.float64), rtol=2e-6)


@pytest.mark.parametrize("exponent", [0.5, -1.5, 2.25, 1 / 3])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_pow_of_a_negative_base_by_a_constant_non_integer_exponent_is_nan(exponent, dtype):
    tp = TP.FLOAT if dtype == np.float32 else TP.DOUBLE
    m = onnx_model([N("Pow", ["x", "e"], ["y"])], [("x", tp, [3, 4])], [("y", tp, [3, 4])],
                   [("e", np.array(exponent, dtype))], opset=15, ir_version=8)
    x = (RNG.standard_normal((3, 4)) * 3).astype(dtype)
    x[0, 0] = 0.0 if exponent > 0 else 1.0
    (ours,) = evaluate_onnx(m, {"x": x})
    assert np.isnan(ours).any() and not np.isnan(ours).all()
    _same_with_nan(ours, _ort(m, {"x": x})[0])
    _same_with_nan(ours, _ref(m, {"x": x})[0])


def test_pow_with_a_computed_exponent_gives_nan_where_the_base_is_negative():
    m = onnx_model([N("Pow", ["x", "e"], ["y"])], [("x", TP.FLOAT, [2, 5]), ("e", TP.FLOAT, [5])],
                   [("y", TP.FLOAT, [2, 5])], opset=15, ir_version=8)
    feeds = {"x": RNG.standard_normal((2, 5)).astype(np.float32),
             "e": np.array([0.5, 2.0, -1.5, 3.0, 0.7], np.float32)}
    (ours,) = evaluate_onnx(m, feeds)
    assert np.isnan(ours).any()
    _same_with_nan(ours, _ort(m, feeds)[0])


def test_pow_interval_refuses_boxes_reaching_below_zero_and_stays_sound_above():
    m = onnx_model([N("Pow", ["x", "e"], ["y"])], [("x", TP.DOUBLE, [4])], [("y", TP.DOUBLE, [4])],
                   [("e", np.array(0.5))], opset=15, ir_version=8)
    b = tlb.import_onnx(m)
    with pytest.raises(BridgeError, match=r"pow: box reaches below 0 and the exponent 0.5 is not an integer"):
        tlb.interval_bounds(b.graph, b.payload, [np.array([-0.1, 0.0, 1.0, 2.0])], [np.array([1.0, 1.0, 2.0, 3.0])])
    lo, hi = np.array([0.0, 0.1, 1.0, 2.0]), np.array([1.0, 1.0, 2.0, 3.0])
    tlb.check_containment(b.graph, b.payload, [lo], [hi], samples=50, seed=0)
