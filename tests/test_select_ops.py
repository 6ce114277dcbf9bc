"""TopK and MaxPool Indices, MaxUnpool, Slice with negative steps and Pow of every type pair (issue #15):
against onnxruntime and onnx's reference on random models, ONNX export round trips, and the refusals."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import torchlean_bridge as tlb
from torchlean_bridge.errors import EvalError, IntervalError, UnsupportedError

N = helper.make_node


def _model(nodes, inputs, outputs, inits=(), opset=19):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                          [helper.make_tensor_value_info(n, t, None) for n, t in outputs],
                          [numpy_helper.from_array(v, n) for n, v in inits])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 9
    return m


def _ours(m, feeds, dtype="float32"):
    b = tlb.import_onnx(m)
    return [np.asarray(v) for v in tlb.evaluate(b.graph, b.payload, [feeds[n] for n in b.report["inputs"]],
                                               dtype=dtype)], b


def _ort(m, feeds):
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def _exported(b, feeds):
    m = tlb.export_onnx(b)
    return _ort(m, {i.name: feeds[n] for i, n in zip(m.graph.input, b.report["inputs"])})


@pytest.mark.parametrize("largest", [0, 1])
@pytest.mark.parametrize("seed", range(3))
def test_topk_values_and_indices_match_onnxruntime_with_ties(largest, seed):
    """Values and int64 indices exactly; small integers make ties (equal values: the lower index first)."""
    rng = np.random.default_rng(seed)
    for _ in range(6):
        shape = [int(v) for v in rng.integers(1, 6, int(rng.integers(1, 4)))]
        axis = int(rng.integers(-len(shape), len(shape)))
        k = int(rng.integers(0, shape[axis] + 1))
        m = _model([N("TopK", ["x", "k"], ["v", "i"], axis=axis, largest=largest)], [("x", TP.FLOAT, shape)],
                   [("v", TP.FLOAT), ("i", TP.INT64)], [("k", np.array([k], np.int64))])
        feeds = {"x": rng.integers(-3, 4, shape).astype(np.float32)}
        (v, i), b = _ours(m, feeds)
        rv, ri = _ort(m, feeds)
        assert i.dtype == np.int64 and b.graph.nodes[b.graph.outputs[1]].dtype == "int64"
        np.testing.assert_array_equal(v, rv)
        np.testing.assert_array_equal(i, ri)
        for got, want in zip(_exported(b, feeds), (rv, ri)):
            np.testing.assert_array_equal(got, want)


def test_topk_of_integers_sorts_exactly_and_indices_are_refused_in_interval_mode():
    x = np.array([[5, 1, 5, 2, 9]], np.int64)
    m = _model([N("TopK", ["x", "k"], ["v", "i"])], [("x", TP.INT64, [1, 5])], [("v", TP.INT64), ("i", TP.INT64)],
               [("k", np.array([3], np.int64))])
    (v, i), b = _ours(m, {"x": x})
    assert v.tolist() == [[9, 5, 5]] and i.tolist() == [[4, 0, 2]]
    m = _model([N("TopK", ["x", "k"], ["v", "i"])], [("x", TP.FLOAT, [2, 5])], [("v", TP.FLOAT), ("i", TP.INT64)],
               [("k", np.array([2], np.int64))])
    b = tlb.import_onnx(m)
    with pytest.raises(IntervalError, match=r"\(topk_indices\): no interval rule for topk_indices: positions of the "
                                            r"sorted values jump where two values cross"):
        tlb.interval_bounds(b.graph, b.payload, np.zeros((2, 5)), np.ones((2, 5)))


@pytest.mark.parametrize("seed", range(4))
def test_max_pool_indices_match_onnxruntime(seed):
    """Random windows, strides, dilations, pads, ceil mode and storage order; ties resolved to the first cell."""
    rng = np.random.default_rng(10 + seed)
    for _ in range(5):
        r = int(rng.integers(1, 3))
        spatial = [int(v) for v in rng.integers(5, 8, r)]
        kernel = [int(v) for v in rng.integers(1, 4, r)]
        attrs = {"kernel_shape": kernel, "strides": [int(v) for v in rng.integers(1, 3, r)],
                 "dilations": [int(v) for v in rng.integers(1, 3, r)],  # (k - 1) d + 1 <= 5: every window fits
                 "pads": [int(rng.integers(0, k)) for k in kernel] * 2, "ceil_mode": int(rng.integers(0, 2)),
                 "storage_order": int(rng.integers(0, 2))}
        shape = [2, 3] + spatial
        m = _model([N("MaxPool", ["x"], ["y", "i"], **attrs)], [("x", TP.FLOAT, shape)],
                   [("y", TP.FLOAT), ("i", TP.INT64)], opset=12)
        feeds = {"x": rng.integers(-2, 3, shape).astype(np.float32)}
        try:
            want = _ort(m, feeds)
            got, b = _ours(m, feeds)
        except Exception as e:  # ceil mode with a last window inside the padding: onnx's shape inference and
            assert "differs from the window rule" in str(e) or "onnxruntime" in type(e).__module__, e  # noqa: PT017
            continue  # onnxruntime disagree on the extent (and we refuse the node)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w, err_msg=str(attrs))
        for g, w in zip(_exported(b, feeds), want):
            np.testing.assert_array_equal(g, w, err_msg=str(attrs))


@pytest.mark.parametrize("with_shape", [False, True])
def test_max_pool_then_unpool_matches_onnx_reference(with_shape):
    rng = np.random.default_rng(5)
    x = rng.normal(size=(2, 3, 6, 4)).astype(np.float32)
    nodes = [N("MaxPool", ["x"], ["y", "i"], kernel_shape=[2, 2], strides=[2, 2]),
             N("MaxUnpool", ["y", "i"] + (["s"] if with_shape else []), ["z"], kernel_shape=[2, 2], strides=[2, 2])]
    inits = [("s", np.array([2, 3, 7, 6], np.int64))] if with_shape else []
    m = _model(nodes, [("x", TP.FLOAT, list(x.shape))], [("z", TP.FLOAT)], inits)
    (z,), b = _ours(m, {"x": x})
    (ref,) = ReferenceEvaluator(m).run(None, {"x": x})
    np.testing.assert_array_equal(z, ref)
    np.testing.assert_array_equal(_exported(b, {"x": x})[0], ref)


def test_max_unpool_refuses_clashing_and_out_of_range_indices():
    m = _model([N("MaxUnpool", ["y", "i"], ["z"], kernel_shape=[2], strides=[2])],
               [("y", TP.FLOAT, [1, 1, 2]), ("i", TP.INT64, [1, 1, 2])], [("z", TP.FLOAT)])
    b = tlb.import_onnx(m)
    with pytest.raises(EvalError, match="max_unpool: index 1 is given two different values"):
        tlb.evaluate(b.graph, b.payload, [np.array([[[1.0, 2.0]]]), np.array([[[1, 1]]])])
    with pytest.raises(EvalError, match=r"max_unpool: an index is outside \[0, 4\)"):
        tlb.evaluate(b.graph, b.payload, [np.array([[[1.0, 2.0]]]), np.array([[[1, 4]]])])


@pytest.mark.parametrize("seed", range(3))
def test_slice_with_negative_steps_matches_numpy(seed):
    rng = np.random.default_rng(20 + seed)
    for _ in range(10):
        shape = [int(v) for v in rng.integers(1, 7, 3)]
        axes = sorted(rng.choice(3, size=int(rng.integers(1, 4)), replace=False).tolist())
        starts = [int(rng.integers(-8, 8)) for _ in axes]
        ends = [int(rng.choice([rng.integers(-9, 9), -2 ** 63, 2 ** 63 - 1])) for _ in axes]
        steps = [int(rng.choice([-3, -2, -1, 1, 2])) for _ in axes]
        m = _model([N("Slice", ["x", "s", "e", "a", "t"], ["y"])], [("x", TP.FLOAT, shape)], [("y", TP.FLOAT)],
                   [(n, np.array(v, np.int64)) for n, v in (("s", starts), ("e", ends), ("a", axes), ("t", steps))])
        x = rng.normal(size=shape).astype(np.float32)
        if any(t < 0 and s < -shape[a] for a, s, t in zip(axes, starts, steps)):
            with pytest.raises(UnsupportedError, match=r"with step -\d on axis \d: the spec clamps it to 0"):
                tlb.import_onnx(m)
            continue
        index = [slice(None)] * 3
        for a, s, e, t in zip(axes, starts, ends, steps):
            index[a] = slice(s, e, t)
        (y,), _ = _ours(m, {"x": x})
        np.testing.assert_array_equal(y, x[tuple(index)])
        np.testing.assert_array_equal(ReferenceEvaluator(m).run(None, {"x": x})[0], y)  # (onnxruntime clamps
        # some INT64_MIN ends differently from onnx's shape inference and numpy)


_TYPES = {"float32": TP.FLOAT, "int64": TP.INT64, "int32": TP.INT32}


@pytest.mark.parametrize("base, exp", [("float32", "float32"), ("float32", "int64"), ("float32", "int32"),
                                       ("int64", "float32"), ("int32", "float32"), ("int64", "int64"),
                                       ("int32", "int32")])
def test_pow_of_every_type_pair_matches_onnx_reference(base, exp):
    rng = np.random.default_rng(3)
    if base.startswith("float"):
        x = rng.uniform(0.1, 3, (3, 4)).astype(base)
    else:
        x = rng.integers(-6, 7, (3, 4)).astype(base)
    y = (rng.uniform(-2, 3, (4,)) if exp.startswith("float") else rng.integers(0, 6, (4,))).astype(exp)
    if base.startswith("int") and exp.startswith("float"):
        x = np.abs(x) + 1
    m = _model([N("Pow", ["x", "y"], ["z"])], [("x", _TYPES[base], [3, 4]), ("y", _TYPES[exp], [4])],
               [("z", _TYPES[base])], opset=15)
    feeds = {"x": x, "y": y}
    (z,), b = _ours(m, feeds, dtype="float64")
    (ref,) = ReferenceEvaluator(m).run(None, feeds)
    if base.startswith("int"):
        assert b.graph.nodes[b.graph.outputs[0]].dtype == "int64"
        np.testing.assert_array_equal(z, ref)
    else:
        np.testing.assert_allclose(z, ref, rtol=1e-6)


def test_pow_boxes_enclose_samples_and_refusals_are_named():
    m = _model([N("Pow", ["x", "y"], ["z"])], [("x", TP.DOUBLE, [5]), ("y", TP.DOUBLE, [5])], [("z", TP.DOUBLE)],
               opset=15)
    b = tlb.import_onnx(m)
    rng = np.random.default_rng(0)
    lo_x, hi_x, lo_y, hi_y = (np.array(v, float) for v in ([0.2, 0.5, 1, 2, 0.9], [0.4, 1.5, 1, 3, 1.1],
                                                            [-1, -2, 0.5, 1, -0.5], [1, 2, 0.5, 2, 0.5]))
    lo, hi = tlb.interval_bounds(b.graph, b.payload, [lo_x, lo_y], [hi_x, hi_y])[b.graph.outputs[0]]
    for _ in range(50):
        px, py = rng.uniform(lo_x, hi_x), rng.uniform(lo_y, hi_y)
        z = tlb.evaluate(b.graph, b.payload, [px, py], dtype="float64")[0]
        assert np.all(lo <= z) and np.all(z <= hi)
    with pytest.raises(IntervalError, match="pow_elem: the base box reaches 0 or below"):
        tlb.interval_bounds(b.graph, b.payload, [lo_x - 1, lo_y], [hi_x, hi_y])
    assert np.isnan(tlb.evaluate(b.graph, b.payload, [np.full(5, -2.0), np.full(5, 0.5)])[0]).all()  # as torch
    m = _model([N("Pow", ["x", "y"], ["z"])], [("x", TP.INT32, [2]), ("y", TP.INT32, [2])], [("z", TP.INT32)],
               opset=15)
    b = tlb.import_onnx(m)
    with pytest.raises(EvalError, match="int_pow: result 4294967296 is outside int32"):
        tlb.evaluate(b.graph, b.payload, [np.array([2, 2]), np.array([3, 32])])
    with pytest.raises(EvalError, match="int_pow: integer power with a negative exponent"):
        tlb.evaluate(b.graph, b.payload, [np.array([2, 2]), np.array([3, -1])])


def test_index_outputs_unpooling_and_integer_powers_refuse_boxes_by_name():
    from semantics.rules.select import INTERVAL_REFUSALS
    cases = {
        "max_pool_indices": _model([N("MaxPool", ["x"], ["y", "i"], kernel_shape=[2])], [("x", TP.FLOAT, [1, 1, 4])],
                                   [("i", TP.INT64)]),
        "max_unpool": _model([N("MaxUnpool", ["x", "i"], ["y"], kernel_shape=[2], strides=[2])],
                             [("x", TP.FLOAT, [1, 1, 2])], [("y", TP.FLOAT)], [("i", np.array([[[0, 3]]], np.int64))]),
        "int_pow": _model([N("Pow", ["x", "y"], ["z"])], [("x", TP.INT64, [2])], [("z", TP.INT64)],
                          [("y", np.array([2, 3], np.int64))], opset=15),
    }
    for kind, m in cases.items():
        b = tlb.import_onnx(m)
        shape = b.graph.nodes[b.graph.inputs[0]].out_shape
        with pytest.raises(IntervalError, match=rf"\({kind}\): no interval rule for {kind}: "
                                                + INTERVAL_REFUSALS[kind][:30]):
            tlb.interval_bounds(b.graph, b.payload, np.zeros(shape), np.zeros(shape) if kind == "int_pow" else
                                np.ones(shape))  # (an int64 input box must be a point)
