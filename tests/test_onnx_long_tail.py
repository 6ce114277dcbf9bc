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
