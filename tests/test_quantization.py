"""Quantization ops (importers/onnx/ops_quant.py) against onnx's reference evaluator bit for bit, and
onnxruntime where it runs them; the exact integer products and their refusals."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper
from onnx.reference import ReferenceEvaluator

import torchlean_bridge as tlb
from torchlean_bridge.errors import UnsupportedError
from torchlean_bridge.app import onnx_backend as backend
from tests.onnx_models import onnx_model

N = helper.make_node
RNG = np.random.default_rng(1515)


_model = partial(onnx_model, opset=21)


def _exact(m, feeds, ort=False):
    ours = backend.run_model(m, [feeds[i.name] for i in m.graph.input if i.name in feeds])
    ref = ReferenceEvaluator(m).run(None, feeds)
    for a, b in zip(ours, ref):
        assert a.dtype == b.dtype and a.shape == b.shape and _same(a, b), (a, b)
    if ort:
        import onnxruntime
        sess = onnxruntime.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        for a, b in zip(ours, sess.run(None, feeds)):
            assert _same(a, np.asarray(b))
    return ours


def _same(a, b) -> bool:
    """Equal values with equal signs of zero; NaNs equal whatever their sign bit (FNUZ types have one NaN)."""
    a, b = np.asarray(a).astype(np.float64), np.asarray(b).astype(np.float64)
    return bool(np.all(((a == b) & (np.signbit(a) == np.signbit(b))) | (np.isnan(a) & np.isnan(b))))


def _x_with_ties(shape, scale):
    """Values on and next to the rounding ties of x / scale, and far out of range."""
    k = RNG.integers(-300, 300, shape).astype(np.float32)
    x = (k + RNG.choice([0.0, 0.5, -0.5, 0.25], shape)).astype(np.float32) * np.float32(scale)
    return x.astype(np.float32)


@pytest.mark.parametrize("to, zp", [(TP.UINT8, 128), (TP.INT8, -3), (TP.INT16, 1000), (TP.UINT16, 7),
                                    (TP.INT4, 1), (TP.UINT4, 8), (TP.INT2, 0), (TP.UINT2, 1)])
def test_quantize_and_dequantize_per_tensor_are_onnx_exactly(to, zp):
    npdt = helper.tensor_dtype_to_np_dtype(to)
    x = _x_with_ties((4, 6), 0.5)
    scale, zero = np.array(0.5, np.float32), np.array(zp).astype(npdt)
    m = _model([N("QuantizeLinear", ["x", "s", "z"], ["q"]), N("DequantizeLinear", ["q", "s", "z"], ["y"])],
               [("x", TP.FLOAT, [4, 6])], [("q", to, [4, 6]), ("y", TP.FLOAT, [4, 6])],
               [("s", scale), ("z", zero)], opset=25)
    _exact(m, {"x": x}, ort=to in (TP.UINT8, TP.INT8))


@pytest.mark.parametrize("block", [0, 2, 3])
def test_per_axis_and_blocked_parameters_are_onnx_exactly(block):
    x = _x_with_ties((3, 6), 0.25)
    n = 6 if not block else -(-6 // block)
    scale = (RNG.random((3, n) if block else (6,)) + 0.1).astype(np.float32)
    zero = RNG.integers(-5, 5, scale.shape).astype(np.int8)
    attrs = {"axis": 1, **({"block_size": block} if block else {})}
    m = _model([N("QuantizeLinear", ["x", "s", "z"], ["q"], **attrs),
                N("DequantizeLinear", ["q", "s", "z"], ["y"], **attrs)],
               [("x", TP.FLOAT, [3, 6])], [("q", TP.INT8, [3, 6]), ("y", TP.FLOAT, [3, 6])],
               [("s", scale), ("z", zero)])
    _exact(m, {"x": x})


@pytest.mark.parametrize("to", [TP.FLOAT8E4M3FN, TP.FLOAT8E5M2, TP.FLOAT8E4M3FNUZ])
@pytest.mark.parametrize("saturate", [1, 0])
def test_float8_quantization_is_onnx_exactly(to, saturate):
    x = (RNG.standard_normal((2, 8)) * 300).astype(np.float32)
    zero = np.zeros((), helper.tensor_dtype_to_np_dtype(to))
    m = _model([N("QuantizeLinear", ["x", "s", "z"], ["q"], saturate=saturate),
                N("DequantizeLinear", ["q", "s", "z"], ["y"])],
               [("x", TP.FLOAT, [2, 8])], [("q", to, [2, 8]), ("y", TP.FLOAT, [2, 8])],
               [("s", np.array(0.75, np.float32)), ("z", zero)])
    _exact(m, {"x": x})


def test_dynamic_quantize_linear_is_onnx_exactly():
    for x in (RNG.standard_normal((3, 5)).astype(np.float32), np.abs(RNG.standard_normal(7)).astype(np.float32),
              np.zeros(4, np.float32)):
        m = _model([N("DynamicQuantizeLinear", ["x"], ["y", "s", "z"])], [("x", TP.FLOAT, list(x.shape))],
                   [("y", TP.UINT8, list(x.shape)), ("s", TP.FLOAT, []), ("z", TP.UINT8, [])], opset=11)
        _exact(m, {"x": x}, ort=bool(np.any(x)))  # all zeros: onnxruntime's scale is 1, the spec's (1 - 0) / 255


def test_matmul_integer_and_qlinear_matmul_are_onnx_exactly():
    a = RNG.integers(0, 256, (3, 4, 5)).astype(np.uint8)
    b = RNG.integers(-128, 128, (5, 6)).astype(np.int8)
    m = _model([N("MatMulInteger", ["a", "b", "az", "bz"], ["y"])], [("a", TP.UINT8, [3, 4, 5])],
               [("y", TP.INT32, [3, 4, 6])], [("b", b), ("az", np.array(12, np.uint8)), ("bz", np.array(-3, np.int8))],
               opset=10)
    ours = _exact(m, {"a": a})
    # ONNX defines the exact int32 product. onnxruntime is not compared here: its u8 x s8 kernel sums
    # pairs of products in saturating int16 on CPUs without VNNI (seen on a fresh machine: one entry of
    # 72 came out -41015 instead of -38473), so only exact integer arithmetic is the oracle.
    exact = (a.astype(np.int64) - 12) @ (b.astype(np.int64) + 3)
    assert np.array_equal(ours[0], exact.astype(np.int32))
    m = _model([N("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"], ["y"])],
               [("a", TP.UINT8, [3, 4, 5])], [("y", TP.UINT8, [3, 4, 6])],
               [("as", np.array(0.02, np.float32)), ("az", np.array(100, np.uint8)), ("b", b),
                ("bs", np.array(0.01, np.float32)), ("bz", np.array(0, np.int8)), ("ys", np.array(0.05, np.float32)),
                ("yz", np.array(120, np.uint8))], opset=10)
    _exact(m, {"a": a})


def test_conv_integer_and_qlinear_conv_are_onnx_exactly():
    x = RNG.integers(0, 256, (1, 2, 5, 5)).astype(np.uint8)
    w = RNG.integers(0, 256, (3, 2, 3, 3)).astype(np.uint8)
    m = _model([N("ConvInteger", ["x", "w", "xz", "wz"], ["y"], pads=[1, 1, 1, 1])], [("x", TP.UINT8, [1, 2, 5, 5])],
               [("y", TP.INT32, [1, 3, 5, 5])], [("w", w), ("xz", np.array(9, np.uint8)), ("wz", np.array(3, np.uint8))],
               opset=10)
    _exact(m, {"x": x}, ort=True)
    bias = RNG.integers(-500, 500, 3).astype(np.int32)
    m = _model([N("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "B"], ["y"], strides=[2, 2])],
               [("x", TP.UINT8, [1, 2, 5, 5])], [("y", TP.UINT8, [1, 3, 2, 2])],
               [("xs", np.array(0.03, np.float32)), ("xz", np.array(7, np.uint8)), ("w", w),
                ("ws", np.array([0.01, 0.02, 0.005], np.float32)), ("wz", np.array(0, np.uint8)),
                ("ys", np.array(0.2, np.float32)), ("yz", np.array(5, np.uint8)), ("B", bias)], opset=10)
    _exact(m, {"x": x})


def test_integer_products_refuse_sums_that_could_round():
    g = tlb.Graph([tlb.Node(0, [], "input", (1, 2), dtype="int64"), tlb.Node(1, [], "input", (2, 1), dtype="int64"),
                   tlb.Node(2, [0, 1], "int_matmul", (1, 1), dtype="int64")], inputs=[0, 1], outputs=[2])
    ok = tlb.evaluate(g, None, [np.array([[3, -4]]), np.array([[5], [6]])])[0]
    assert ok.tolist() == [[-9]]
    with pytest.raises(tlb.BridgeError, match="could reach .* >= 2\\^53; refused"):
        tlb.evaluate(g, None, [np.array([[2 ** 30, 1]]), np.array([[2 ** 30], [1]])])
    with pytest.raises(tlb.BridgeError, match="int_matmul: integer products of quantized models have no interval"):
        tlb.interval_bounds(g, None, [np.ones((1, 2)), np.ones((2, 1))], [np.ones((1, 2)), np.ones((2, 1))])


def test_a_float_cast_to_int8_out_of_range_is_refused_at_evaluation():
    m = _model([N("Cast", ["x"], ["y"], to=TP.INT8)], [("x", TP.FLOAT, [2])], [("y", TP.INT8, [2])])
    (y,) = backend.run_model(m, [np.array([-128.7, 127.9], np.float32)])
    assert y.tolist() == [-128, 127]
    with pytest.raises(tlb.BridgeError, match="value 300 is outside int8 .* refused"):
        backend.run_model(m, [np.array([1.0, 300.5], np.float32)])


def test_per_axis_parameters_given_as_graph_inputs_are_bound_at_import():
    x = _x_with_ties((2, 3), 0.5)
    m = _model([N("QuantizeLinear", ["x", "s", "z"], ["q"], axis=1)],
               [("x", TP.FLOAT, [2, 3]), ("s", TP.FLOAT, [3]), ("z", TP.UINT8, [3])], [("q", TP.UINT8, [2, 3])])
    with pytest.raises(UnsupportedError, match="input 1 \\(a per-axis or blocked scale / zero point\\) must be a "
                                                   "constant known at import time"):
        tlb.import_onnx(m)
    feeds = {"x": x, "s": np.array([0.5, 1.0, 2.0], np.float32), "z": np.array([0, 10, 250], np.uint8)}
    _exact(m, feeds)
