"""ONNX sequences and optionals resolved at import (importers/onnx/ops_sequence.py), through tlb.import_onnx
and the ONNX backend (which returns sequence outputs as lists), against onnxruntime (exact: these ops only
move data, apart from the Add inside a SequenceMap body, compared within 1e-6). Positions computed at
run time are refused with exact messages.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper

import torchlean_bridge as tlb
from torchlean_bridge.errors import BridgeError, UnsupportedError
from torchlean_bridge.onnx_backend import prepare

ort = pytest.importorskip("onnxruntime")
N = helper.make_node
RNG = np.random.default_rng(11)


def _const(name, value):
    return N("Constant", [], [name], value=onnx.numpy_helper.from_array(np.asarray(value), name + "_v"))


def _model(nodes, inputs, outputs, opset=18):
    m = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs), opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def _seq_vi(name, shape=("d0", "d1"), t=TP.FLOAT):
    return helper.make_tensor_sequence_value_info(name, t, shape)


def _ort(m, feeds):
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def test_split_insert_erase_concat_agree_with_onnxruntime():
    nodes = [_const("sizes", np.array([1, 3, 2], np.int64)), _const("p1", np.int64(-1)), _const("p0", np.int64(0)),
             N("SplitToSequence", ["x", "sizes"], ["s"], axis=1), N("Relu", ["y"], ["ry"]),
             N("SequenceInsert", ["s", "ry", "p1"], ["s2"]), N("SequenceErase", ["s2", "p0"], ["s3"]),
             N("ConcatFromSequence", ["s3"], ["cat"], axis=1), N("SequenceLength", ["s3"], ["n"]),
             N("SequenceAt", ["s3", "p1"], ["last"])]
    m = _model(nodes, [helper.make_tensor_value_info("x", TP.FLOAT, [2, 6]), helper.make_tensor_value_info(
        "y", TP.FLOAT, [2, 4])], [helper.make_tensor_value_info("cat", TP.FLOAT, [2, 9]),
                                  helper.make_tensor_value_info("n", TP.INT64, []),
                                  helper.make_tensor_value_info("last", TP.FLOAT, [2, 2]), _seq_vi("s3")])
    feeds = {"x": RNG.standard_normal((2, 6)).astype(np.float32), "y": RNG.standard_normal((2, 4)).astype(np.float32)}
    ours = prepare(m).run(feeds)
    theirs = _ort(m, feeds)
    for a, t in zip(ours[:3], theirs[:3]):
        assert np.array_equal(a, t)
    assert isinstance(ours[3], list) and len(ours[3]) == len(theirs[3]) == 3
    for a, t in zip(ours[3], theirs[3]):
        assert np.array_equal(a, t)


def test_sequence_input_and_sequence_map_agree_with_onnxruntime():
    body = helper.make_graph([N("Add", ["item", "bias"], ["out"]), N("Shape", ["item"], ["shape"])], "body",
                             [helper.make_tensor_value_info("item", TP.FLOAT, ["a", "b"]),
                              helper.make_tensor_value_info("bias", TP.FLOAT, [1, 3])],
                             [helper.make_tensor_value_info("out", TP.FLOAT, ["a", 3]),
                              helper.make_tensor_value_info("shape", TP.INT64, [2])])
    m = _model([N("SequenceMap", ["xs", "bias"], ["ys", "shapes"], body=body)],
               [_seq_vi("xs", ["a", 3]), helper.make_tensor_value_info("bias", TP.FLOAT, [1, 3])],
               [_seq_vi("ys", ["a", 3]), _seq_vi("shapes", [2], TP.INT64)])
    xs = [RNG.standard_normal((k, 3)).astype(np.float32) for k in (1, 4, 2)]
    bias = RNG.standard_normal((1, 3)).astype(np.float32)
    ys, shapes = prepare(m).run({"xs": xs, "bias": bias})
    theirs = _ort(m, {"xs": xs, "bias": bias})
    for a, t in zip(ys, theirs[0]):
        np.testing.assert_allclose(a, t, rtol=1e-6)
    for a, t in zip(shapes, theirs[1]):
        assert a.dtype == np.int64 and np.array_equal(a, t)
    b = tlb.import_onnx(m, input_shapes={"xs": [(1, 3), (4, 3), (2, 3)]})
    assert b.report["inputs"] == ["xs[0]", "xs[1]", "xs[2]", "bias"]
    assert b.report["output_structure"] == [{"sequence": 3}, {"sequence": 3}]


def test_loop_builds_a_sequence_and_optionals_resolve():
    body = helper.make_graph(
        [_const("one", np.int64(1)), N("Add", ["i", "one"], ["end"]), _const("zero", np.array([0], np.int64)),
         N("Unsqueeze", ["end", "zero"], ["end1"]), N("Slice", ["x", "zero", "end1"], ["part"]),
         N("SequenceInsert", ["s_in", "part"], ["s_out"]), N("Identity", ["c_in"], ["c_out"])], "body",
        [helper.make_tensor_value_info("i", TP.INT64, []), helper.make_tensor_value_info("c_in", TP.BOOL, []),
         _seq_vi("s_in", ["k"])], [helper.make_tensor_value_info("c_out", TP.BOOL, []), _seq_vi("s_out", ["k"])])
    nodes = [_const("M", np.int64(3)), _const("c", np.bool_(True)), N("SequenceEmpty", [], ["s0"]),
             N("Loop", ["M", "c", "s0"], ["parts"], body=body), N("Optional", ["parts"], ["opt"]),
             N("OptionalHasElement", ["opt"], ["has"]), N("OptionalGetElement", ["opt"], ["got"]),
             N("ConcatFromSequence", ["got"], ["flat"], axis=0)]
    m = _model(nodes, [helper.make_tensor_value_info("x", TP.FLOAT, [5])],
               [helper.make_tensor_value_info("has", TP.BOOL, []), helper.make_tensor_value_info("flat", TP.FLOAT, [6])])
    x = RNG.standard_normal(5).astype(np.float32)
    has, flat = prepare(m).run({"x": x})
    theirs = _ort(m, {"x": x})
    assert bool(has) is True and np.array_equal(flat, theirs[1])
    np.testing.assert_array_equal(flat, np.concatenate([x[:1], x[:2], x[:3]]))


@pytest.mark.parametrize("batch_axis,time_axis", [(1, 0), (0, 1)])
def test_reverse_sequence_agrees_with_onnxruntime(batch_axis, time_axis):
    shape = [5, 3, 2] if time_axis == 0 else [3, 5, 2]
    m = _model([_const("lens", np.array([5, 2, 1], np.int64)),
                N("ReverseSequence", ["x", "lens"], ["y"], batch_axis=batch_axis, time_axis=time_axis)],
               [helper.make_tensor_value_info("x", TP.FLOAT, shape)], [helper.make_tensor_value_info("y", TP.FLOAT, shape)])
    x = RNG.standard_normal(shape).astype(np.float32)
    (ours,) = prepare(m).run({"x": x})
    assert np.array_equal(ours, _ort(m, {"x": x})[0])


def test_runtime_position_and_missing_structure_are_refused():
    m = _model([N("SequenceConstruct", ["x", "x"], ["s"]), N("SequenceAt", ["s", "k"], ["y"], name="at")],
               [helper.make_tensor_value_info("x", TP.FLOAT, [2]), helper.make_tensor_value_info("k", TP.INT64, [])],
               [helper.make_tensor_value_info("y", TP.FLOAT, [2])])
    with pytest.raises(UnsupportedError) as e:
        tlb.import_onnx(m)
    assert str(e.value).endswith("SequenceAt (node `at`, opset 18): position `k` is computed at run time: which item "
                                 "is meant must be known at import time")
    m = _model([N("ConcatFromSequence", ["xs"], ["y"], axis=0)], [_seq_vi("xs", [2])],
               [helper.make_tensor_value_info("y", TP.FLOAT, ["n"])])
    with pytest.raises(BridgeError) as e:
        tlb.import_onnx(m)
    assert str(e.value) == ("ONNX import: input `xs` is a sequence (seq(tensor(float))): its structure must be fixed at "
                            "import with input_shapes={'xs': [...]} (a list of item shapes for a sequence, a shape or None for an "
                            "optional)")
