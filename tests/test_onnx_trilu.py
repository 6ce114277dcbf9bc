"""ONNX Trilu with k computed at run time: the mask compares constant column-minus-row offsets with
k, so one imported graph serves every k; agreement with onnxruntime bit for bit (infinities too)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper

import torchlean_bridge as tlb
from tests.onnx_models import onnx_model

ort = pytest.importorskip("onnxruntime")


@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("shape", [(3, 4), (2, 4, 3), (1, 1)])
def test_trilu_with_a_runtime_k_agrees_with_onnxruntime_for_every_k(upper, shape):
    m = onnx_model([helper.make_node("Trilu", ["x", "k"], ["y"], upper=upper)],
                   [("x", TP.FLOAT, list(shape)), ("k", TP.INT64, [])], [("y", TP.FLOAT, list(shape))], opset=17)
    b = tlb.import_onnx(m)
    assert {n.kind for n in b.graph} >= {"ge" if upper else "le", "where"}
    session = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(7).standard_normal(shape).astype(np.float32)
    x.flat[0], x.flat[-1] = np.inf, -np.inf
    for k in range(-6, 7):
        ours = tlb.evaluate(b.graph, b.payload, [x, np.array(k)])[0]
        np.testing.assert_array_equal(ours, session.run(None, {"x": x, "k": np.array(k)})[0])


def test_trilu_k_must_be_one_integer():
    m = onnx_model([helper.make_node("Trilu", ["x", "k"], ["y"])], [("x", TP.FLOAT, [3, 3]), ("k", TP.INT64, [2])],
                   [("y", TP.FLOAT, [3, 3])], opset=17)
    with pytest.raises(tlb.BridgeError, match=r"k of shape \[2\] \(a single integer\)"):
        tlb.import_onnx(m)
