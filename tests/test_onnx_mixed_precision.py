"""Casts between float32 and float64 (importers/onnx/ops_math.refuse_mixed_precision_cast).

The evaluator computes one float precision per model. A cast that widens a graph input into it, or
narrows a value that only leaves the graph, is exact (checked against onnx's reference evaluator);
a cast in the middle of the computation means two precisions, and is refused by name rather than
evaluated with a rounding skipped.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import torchlean_bridge as tlb
from torchlean_bridge.errors import BridgeError

F32, F64 = TensorProto.FLOAT, TensorProto.DOUBLE


def model(nodes, x_type, y_type):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", x_type, [3])],
                              [helper.make_tensor_value_info("y", y_type, [3])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])


def run_both(m, x):
    b = tlb.import_onnx(m)
    ours = tlb.evaluate(b.graph, b.payload, [x], dtype=b.report["precision"])[0]
    (ref,) = ReferenceEvaluator(m).run(None, {"x": x})
    return ours, ref


def test_widening_an_input_and_narrowing_an_output_are_exact():
    x = np.array([1 / 3, 2 / 3, 1e-8], np.float32)
    widen = model([helper.make_node("Cast", ["x"], ["w"], to=F64), helper.make_node("Exp", ["w"], ["y"])], F32, F64)
    ours, ref = run_both(widen, x)
    np.testing.assert_array_equal(np.asarray(ours, np.float64), ref)
    xd = np.array([1 / 3, 2 / 3, 1e-8], np.float64)
    narrow = model([helper.make_node("Exp", ["x"], ["e"]), helper.make_node("Cast", ["e"], ["y"], to=F32)], F64, F32)
    ours, ref = run_both(narrow, xd)
    np.testing.assert_array_equal(np.asarray(ours, np.float32), ref)


@pytest.mark.parametrize("op", ["Cast", "CastLike"])
def test_a_float32_step_inside_a_float64_model_is_refused(op):
    like = [helper.make_node("Constant", [], ["t"], value=helper.make_tensor("t", F32, [1], [0.0]))] \
        if op == "CastLike" else []
    cast = helper.make_node(op, ["e"] + (["t"] if op == "CastLike" else []), ["c"], **({"to": F32} if op == "Cast" else {}))
    back = helper.make_node("Cast", ["c"], ["y"], to=F64)
    m = model([helper.make_node("Exp", ["x"], ["e"]), *like, cast, back], F64, F64)
    with pytest.raises(BridgeError, match="cast of a computed float64 tensor to float32 inside a model evaluated "
                                          "in float64: the model computes in two float precisions"):
        tlb.import_onnx(m)


def test_a_float32_computation_widened_late_is_refused():
    m = model([helper.make_node("Exp", ["x"], ["e"]), helper.make_node("Cast", ["e"], ["y"], to=F64)], F32, F64)
    with pytest.raises(BridgeError, match="cast of a computed float32 tensor to float64"):
        tlb.import_onnx(m)

