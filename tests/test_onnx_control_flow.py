"""ONNX control flow lowered at import (importers/onnx/ops_control.py): If selected, Loop and Scan unrolled.

Models beyond the backend suite's (nested If in Loop, loop-carried state with scan outputs, Scan with
reversed directions and non-zero axes, outer-scope references) are compared with onnxruntime and onnx's
ReferenceEvaluator (within binary32 rounding: rtol 1e-5); what depends on run-time data, and unrolls
that are too large, are refused with exact messages.
"""

from __future__ import annotations

import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper
from onnx.reference import ReferenceEvaluator

import torchlean_bridge as tlb
from importers.onnx.ops_control import MAX_UNROLLED_NODES
from torchlean_bridge.errors import UnsupportedError

ort = pytest.importorskip("onnxruntime")
N = helper.make_node
RNG = np.random.default_rng(1515)


def _vi(name, t=TP.FLOAT, shape=None):
    return helper.make_tensor_value_info(name, t, shape)


def _const(name, value):
    return N("Constant", [], [name], value=onnx.numpy_helper.from_array(np.asarray(value), name + "_v"))


def _model(nodes, inputs, outputs, opset=17):
    m = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs), opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def _ours(m, feeds, **kw):
    b = tlb.import_onnx(m, **kw)
    return [np.asarray(v) for v in tlb.evaluate(b.graph, b.payload, [feeds[n] for n in b.report["inputs"]],
                                                dtype="float32")]


def _agree(m, feeds, reference=True, **kw):
    ours = _ours(m, feeds, **kw)
    rt = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    ref = ReferenceEvaluator(m).run(None, feeds) if reference else rt
    assert len(ours) == len(ref) == len(rt)
    for a, r, o in zip(ours, ref, rt):
        assert a.shape == r.shape == o.shape
        np.testing.assert_allclose(a, r, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(a, o, rtol=1e-5, atol=1e-6)
    return ours


def _refusal(m, **kw) -> str:
    with pytest.raises(UnsupportedError) as e:
        tlb.import_onnx(m, **kw)
    return str(e.value)


def _loop_with_nested_if(trips: int):
    """acc <- acc * w + (x if i is even else -x); scan output: acc after each step (If inside Loop,
    reading the outer `x` and `w` from inside the branch and the body)."""
    then_g = helper.make_graph([N("Identity", ["x"], ["t_out"])], "then", [], [_vi("t_out")])
    else_g = helper.make_graph([N("Neg", ["x"], ["e_out"])], "else", [], [_vi("e_out")])
    body = helper.make_graph(
        [_const("two", np.int64(2)), _const("zero", np.int64(0)),
         N("Mod", ["i", "two"], ["parity"]), N("Equal", ["parity", "zero"], ["even"]),
         N("If", ["even"], ["term"], then_branch=then_g, else_branch=else_g),
         N("Mul", ["acc_in", "w"], ["scaled"]), N("Add", ["scaled", "term"], ["acc_out"]),
         N("Identity", ["cond_in"], ["cond_out"]), N("Identity", ["acc_out"], ["acc_seen"])],
        "body", [_vi("i", TP.INT64, []), _vi("cond_in", TP.BOOL, []), _vi("acc_in", TP.FLOAT, [2, 3])],
        [_vi("cond_out", TP.BOOL, []), _vi("acc_out", TP.FLOAT, [2, 3]), _vi("acc_seen", TP.FLOAT, [2, 3])])
    nodes = [_const("M", np.int64(trips)), _const("c", np.bool_(True)),
             N("Loop", ["M", "c", "acc0"], ["acc", "history"], body=body)]
    return _model(nodes, [_vi("x", shape=[2, 3]), _vi("w", shape=[2, 3]), _vi("acc0", shape=[2, 3])],
                  [_vi("acc", shape=[2, 3]), _vi("history", shape=[trips, 2, 3])])


@pytest.mark.parametrize("trips", [1, 2, 5])
def test_loop_with_nested_if_agrees_with_onnxruntime(trips):
    feeds = {k: RNG.standard_normal((2, 3)).astype(np.float32) for k in ("x", "w", "acc0")}
    # onnx's ReferenceEvaluator concatenates a Loop's scan outputs along their axis 0 instead of stacking them
    # on a new one (the spec and onnxruntime stack): onnxruntime alone is the oracle here
    acc, history = _agree(_loop_with_nested_if(trips), feeds, reference=False)
    assert history.shape == (trips, 2, 3)


def test_loop_condition_computed_from_constants_ends_the_loop_early():
    """while i < 3 (the body's condition folds each iteration), with a trip count far larger."""
    body = helper.make_graph(
        [_const("lim", np.int64(2)), N("Less", ["i", "lim"], ["cond_out"]), N("Add", ["s_in", "x"], ["s_out"])],
        "body", [_vi("i", TP.INT64, []), _vi("cond_in", TP.BOOL, []), _vi("s_in", shape=[4])],
        [_vi("cond_out", TP.BOOL, []), _vi("s_out", shape=[4])])
    m = _model([_const("M", np.int64(10**12)), _const("c", np.bool_(True)), N("Loop", ["M", "c", "s0"], ["s"], body=body)],
               [_vi("x", shape=[4]), _vi("s0", shape=[4])], [_vi("s", shape=[4])])
    feeds = {"x": RNG.standard_normal(4).astype(np.float32), "s0": RNG.standard_normal(4).astype(np.float32)}
    (s,) = _agree(m, feeds)
    np.testing.assert_allclose(s, feeds["s0"] + 3 * feeds["x"], rtol=1e-6)


def test_if_selects_the_branch_its_folded_condition_names():
    then_g = helper.make_graph([N("Relu", ["x"], ["a"])], "then", [], [_vi("a", shape=[3])])
    else_g = helper.make_graph([N("Sigmoid", ["x"], ["b"])], "else", [], [_vi("b", shape=[3])])
    for flag in (True, False):
        m = _model([_const("n", np.float32(2.0)), _const("lim", np.float32(1.0)),
                    N("Greater", ["n", "lim"] if flag else ["lim", "n"], ["c"]),
                    N("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)],
                   [_vi("x", shape=[3])], [_vi("y", shape=[3])])
        (y,) = _agree(m, {"x": np.array([-1.0, 0.5, 2.0], np.float32)})
        kinds = {n.kind for n in tlb.import_onnx(m).graph.nodes}
        assert ("relu" in kinds) == flag and ("sigmoid" in kinds) != flag


@pytest.mark.parametrize("in_dir,out_dir,in_axis,out_axis", [(0, 0, 0, 0), (1, 0, 1, 0), (0, 1, 1, 1), (1, 1, 0, 2)])
def test_scan_directions_and_axes_agree_with_onnxruntime(in_dir, out_dir, in_axis, out_axis):
    """A running product-sum over one axis of a [4, 5, 3] input, with state [3] and a scan output."""
    x = RNG.standard_normal((4, 5, 3)).astype(np.float32)
    step = (5, 3) if in_axis == 0 else (4, 3)
    s0 = RNG.standard_normal(step).astype(np.float32)
    ys_shape = list(step[:out_axis]) + [x.shape[in_axis]] + list(step[out_axis:])
    body = helper.make_graph(
        [N("Mul", ["s_in", "x_t"], ["p"]), N("Add", ["p", "x_t"], ["s_out"]), N("Tanh", ["s_out"], ["y_t"])],
        "body", [_vi("s_in", shape=step), _vi("x_t", shape=step)], [_vi("s_out", shape=step), _vi("y_t", shape=step)])
    m = _model([N("Scan", ["s0", "x"], ["s", "ys"], body=body, num_scan_inputs=1, scan_input_directions=[in_dir],
                  scan_output_directions=[out_dir], scan_input_axes=[in_axis], scan_output_axes=[out_axis])],
               [_vi("s0", shape=s0.shape), _vi("x", shape=x.shape)], [_vi("s", shape=step), _vi("ys", shape=ys_shape)])
    # onnx's reference Scan implements only forward directions and axis 0
    _agree(m, {"s0": s0, "x": x}, reference=(in_dir, out_dir, in_axis, out_axis) == (0, 0, 0, 0))


def test_loop_trip_count_from_a_graph_input_is_refused_by_name():
    body = helper.make_graph([N("Identity", ["c_in"], ["c_out"]), N("Add", ["v_in", "v_in"], ["v_out"])], "body",
                             [_vi("i", TP.INT64, []), _vi("c_in", TP.BOOL, []), _vi("v_in", shape=[2])],
                             [_vi("c_out", TP.BOOL, []), _vi("v_out", shape=[2])])
    m = _model([_const("c", np.bool_(True)), N("Loop", ["n", "c", "v"], ["out"], body=body, name="L")],
               [_vi("n", TP.INT64, []), _vi("v", shape=[2])], [_vi("out", shape=[2])])
    assert _refusal(m) == (
        "ONNX import: 1 node(s) cannot be lowered (Loop):\n  Loop (node `L`, opset 17): trip count `n` is computed "
        "at run time: Loop is lowered only when its trip count is known at import time (bind graph input `n` with "
        "constants=... or --bind)")
    v = np.array([1.0, -2.0], np.float32)
    (out,) = _ours(m, {"v": v}, constants={"n": np.int64(3)})
    np.testing.assert_array_equal(out, v * 8)


def test_loop_condition_computed_from_data_is_refused_by_name():
    body = helper.make_graph(
        [N("ReduceSum", ["v_in"], ["total"], keepdims=0), _const("lim", np.float32(10.0)),
         N("Less", ["total", "lim"], ["c_out"]), N("Add", ["v_in", "v_in"], ["v_out"])], "body",
        [_vi("i", TP.INT64, []), _vi("c_in", TP.BOOL, []), _vi("v_in", shape=[2])],
        [_vi("c_out", TP.BOOL, []), _vi("v_out", shape=[2])])
    m = _model([_const("M", np.int64(5)), _const("c", np.bool_(True)), N("Loop", ["M", "c", "v"], ["out"], body=body,
                                                                          name="L")],
               [_vi("v", shape=[2])], [_vi("out", shape=[2])])
    assert _refusal(m) == (
        "ONNX import: 1 node(s) cannot be lowered (Loop):\n  Loop (node `L`, opset 17): the condition the body "
        "computes (`c_out`) depends on run-time data at iteration 0, so the number of iterations is not known at "
        "import time")


def test_if_condition_computed_from_data_is_refused_by_name():
    g = helper.make_graph([N("Identity", ["x"], ["o"])], "b", [], [_vi("o", shape=[2])])
    m = _model([N("ReduceSum", ["x"], ["s"], keepdims=0), _const("z", np.float32(0)), N("Greater", ["s", "z"], ["c"]),
                N("If", ["c"], ["y"], then_branch=g, else_branch=g, name="I")], [_vi("x", shape=[2])],
               [_vi("y", shape=[2])])
    assert _refusal(m) == ("ONNX import: 1 node(s) cannot be lowered (If):\n  If (node `I`, opset 17): condition `c` "
                           "is computed at run time: If is lowered only when its condition is known at import time")


def test_huge_trip_count_is_refused_before_anything_is_built():
    body = helper.make_graph([N("Identity", ["c_in"], ["c_out"]), N("Add", ["v_in", "v_in"], ["v_out"])], "body",
                             [_vi("i", TP.INT64, []), _vi("c_in", TP.BOOL, []), _vi("v_in", shape=[2])],
                             [_vi("c_out", TP.BOOL, []), _vi("v_out", shape=[2])])
    m = _model([_const("M", np.int64(10**12)), _const("c", np.bool_(True)),
                N("Loop", ["M", "c", "v"], ["out"], body=body, name="L")], [_vi("v", shape=[2])],
               [_vi("out", shape=[2])])
    start = time.perf_counter()
    message = _refusal(m)
    assert time.perf_counter() - start < 5
    assert message == ("ONNX import: 1 node(s) cannot be lowered (Loop):\n  Loop (node `L`, opset 17): trip count "
                       f"1000000000000 x 2 body nodes exceeds the limit of {MAX_UNROLLED_NODES} unrolled body nodes, "
                       "so it is refused")


def test_endless_loop_with_an_early_exit_that_never_comes_is_refused_at_the_limit(monkeypatch):
    """No trip count, a condition that folds to true every iteration: stopped by the unroll budget (4 per
    iteration: 3 body nodes and the iteration itself)."""
    body = helper.make_graph([_const("t", np.bool_(True)), N("Identity", ["t"], ["c_out"]),
                              N("Identity", ["v_in"], ["v_out"])], "body",
                             [_vi("i", TP.INT64, []), _vi("c_in", TP.BOOL, []), _vi("v_in", shape=[2])],
                             [_vi("c_out", TP.BOOL, []), _vi("v_out", shape=[2])])
    m = _model([_const("c", np.bool_(True)), N("Loop", ["", "c", "v"], ["out"], body=body, name="L")],
               [_vi("v", shape=[2])], [_vi("out", shape=[2])])
    import importers.onnx.ops_control as control
    monkeypatch.setattr(control, "MAX_UNROLLED_NODES", 300)
    message = _refusal(m)
    assert message.endswith("Loop (node `L`, opset 17): iteration 75: unrolling would lower more than "
                            "300 body nodes in this import (the limit), so it is refused")


def test_body_node_refusal_names_the_body_node():
    body = helper.make_graph([N("Identity", ["c_in"], ["c_out"]), N("NoSuchOp", ["v_in"], ["v_out"], name="bad")],
                             "body", [_vi("i", TP.INT64, []), _vi("c_in", TP.BOOL, []), _vi("v_in", shape=[2])],
                             [_vi("c_out", TP.BOOL, []), _vi("v_out", shape=[2])])
    g = helper.make_graph([_const("M", np.int64(2)), _const("c", np.bool_(True)),
                           N("Loop", ["M", "c", "v"], ["out"], body=body, name="L")], "g", [_vi("v", shape=[2])],
                          [_vi("out", shape=[2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    assert _refusal(m).endswith("Loop (node `L`, opset 17): body node `bad` (NoSuchOp): no lowering for this op type")
