"""Narrow element types (docs/element-types.md): the roundings onto float16 / bfloat16 / float8 / float4 /
float6 / e8m0 grids against onnx's reference Cast on exhaustive grids, their binary64 correctness, the
int4/int2 wrap, narrow-typed models against onnxruntime and onnx's reference, interval enclosures,
ONNX export, and the refusals by name."""

from __future__ import annotations

import re
from functools import partial

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper
from onnx.reference import ReferenceEvaluator
from onnx.reference.ops.op_cast import cast_to

import torchlean_bridge as tlb
from semantics.narrow import FORMATS, NarrowError, numpy_dtype, round_box, round_to, widen, wrap
from torchlean_bridge.app import onnx_backend as backend
from tests.onnx_models import onnx_model

N = helper.make_node
RNG = np.random.default_rng(15)
CODES = {"float16": TP.FLOAT16, "bfloat16": TP.BFLOAT16, "float8e4m3fn": TP.FLOAT8E4M3FN,
         "float8e4m3fnuz": TP.FLOAT8E4M3FNUZ, "float8e5m2": TP.FLOAT8E5M2, "float8e5m2fnuz": TP.FLOAT8E5M2FNUZ,
         "float4e2m1": TP.FLOAT4E2M1, "float6e2m3": TP.FLOAT6E2M3, "float6e3m2": TP.FLOAT6E3M2}


def _same(a, b) -> np.ndarray:
    """Elementwise: equal with equal sign (so -0 != +0), or both NaN."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return ((a == b) & (np.signbit(a) == np.signbit(b))) | (np.isnan(a) & np.isnan(b))


def _grid(fmt: str) -> np.ndarray:
    """Every value of the format (all bit patterns), as float64."""
    dt = numpy_dtype(fmt)
    bits = np.arange(1 << (8 * dt.itemsize), dtype=np.uint16 if dt.itemsize == 2 else np.uint8)
    if fmt.startswith(("float4", "float6")):
        bits = bits[:1 << int(fmt[5])]
    return bits.view(dt).astype(np.float64)


def _probes(fmt: str) -> np.ndarray:
    """binary32 probes: the grid, every midpoint between neighbours and its binary32 neighbours (the ties
    and the values just off them), beyond the range, specials, tiny values."""
    g = np.unique(_grid(fmt)[np.isfinite(_grid(fmt))])
    mids = ((g[1:] + g[:-1]) / 2).astype(np.float32)
    big = np.float32(FORMATS[fmt].max) * np.float32(1.5)
    return np.concatenate([g.astype(np.float32), mids, np.nextafter(mids, np.float32(np.inf)),
                           np.nextafter(mids, np.float32(-np.inf)),
                           np.array([np.inf, -np.inf, big, -big, 1e-30, -1e-30, 0.0, -0.0], np.float32)])


HALF_PATTERNS = np.arange(1 << 16, dtype=np.uint16).view(np.float16)


@pytest.mark.parametrize("fmt", sorted(CODES))
@pytest.mark.parametrize("saturate", [True, False])
def test_round_to_is_onnx_cast_on_exhaustive_grids(fmt, saturate):
    for source in (_probes(fmt), HALF_PATTERNS.astype(np.float32)):
        if FORMATS[fmt].finite_only:
            source = source[~np.isnan(source)]  # NaN has no float4/float6 value: refused (test below)
        with np.errstate(all="ignore"):
            reference = cast_to(source, CODES[fmt], saturate).astype(np.float64)
        ours = round_to(source, fmt, saturate)
        assert ours.dtype == np.float32
        bad = ~_same(ours, reference)
        assert not bad.any(), (fmt, source[bad][:5], ours[bad][:5], reference[bad][:5])


@pytest.mark.parametrize("fmt", sorted(CODES))
def test_casts_from_every_narrow_value_are_exact(fmt):
    values = _grid(fmt)
    narrow = values.astype(numpy_dtype(fmt))
    assert _same(widen(narrow), values).all() and widen(narrow).dtype == np.float32
    assert _same(round_to(widen(narrow), fmt, saturate=False), values).all()  # each value is its own rounding


@pytest.mark.parametrize("fmt", ["float16", "bfloat16", "float8e4m3fn", "float8e5m2", "float4e2m1"])
def test_binary64_operands_round_once_not_through_binary32(fmt):
    g = np.unique(_grid(fmt)[np.isfinite(_grid(fmt))])
    g = g[np.abs(g) < FORMATS[fmt].max / 2]
    mids = (g[1:] + g[:-1]) / 2
    keep = mids != 0
    mids, below, above = mids[keep], g[:-1][keep], g[1:][keep]
    off = np.abs(mids) * 2.0 ** -40  # off the tie by far less than a binary32 ulp: binary32 would make it a tie
    assert np.array_equal(round_to(mids + off, fmt), above) and np.array_equal(round_to(mids - off, fmt), below)
    assert round_to(mids + off, fmt).dtype == np.float64


@pytest.mark.parametrize("saturate", [True, False])
@pytest.mark.parametrize("mode", ["up", "down", "nearest"])
def test_e8m0_against_onnx_reference_on_the_binary32_normal_range(saturate, mode):
    from onnx.numpy_helper import to_float8e8m0
    exponents = np.arange(-126, 128)
    mantissas = np.array([1.0, 1.0 + 2.0 ** -23, 1.25, 1.5 - 2.0 ** -23, 1.5, 1.5 + 2.0 ** -23, 1.75, 2 - 2.0 ** -23])
    x = (mantissas[None, :] * np.ldexp(1.0, exponents)[:, None]).astype(np.float32).ravel()
    x = np.concatenate([x, [np.nan]]).astype(np.float32)
    reference = to_float8e8m0(x, saturate, mode).astype(np.float64)
    ours = round_to(x, "float8e8m0", saturate, mode)
    assert _same(ours, reference).all()
    if saturate:
        assert round_to(np.zeros(1, np.float32), "float8e8m0", True, mode)[0] == 2.0 ** -127


@pytest.mark.parametrize("value, saturate, what", [
    (-1.0, True, "negative values"), (1e-39, True, "values below 2"), (np.inf, True, "inf with saturate"),
    (0.0, False, "0 without saturate")])
def test_e8m0_refuses_where_onnx_leaves_it_unspecified(value, saturate, what):
    with pytest.raises(NarrowError, match=f"float8e8m0: {what}"):
        round_to(np.array([value], np.float32), "float8e8m0", saturate, "up")


def test_int_wrap_is_onnx_fixed_point_narrowing():
    x = np.arange(-300, 300, dtype=np.int64)
    for name, bits, signed in (("int8", 8, True), ("uint8", 8, False), ("int4", 4, True), ("uint4", 4, False),
                               ("int2", 2, True), ("uint2", 2, False), ("int16", 16, True)):
        code = TP.DataType.Value(name.upper())
        assert wrap(x, bits, signed).tolist() == cast_to(x, code, False).astype(np.int64).tolist(), name


# -- models --------------------------------------------------------------------------------

_model = partial(onnx_model, opset=23)


@pytest.mark.parametrize("fmt", ["float8e4m3fn", "float8e5m2", "float8e4m3fnuz", "float8e5m2fnuz", "int4", "uint4"])
def test_narrow_inputs_and_outputs_through_the_backend(fmt):
    code = TP.DataType.Value(fmt.upper())
    x = (RNG.standard_normal((3, 5)) * 6).astype(np.float32)
    if fmt in ("int4", "uint4"):  # a float outside the integer range is undefined in ONNX (refused, tested below)
        x = np.clip(x, *((-8.9, 7.9) if fmt == "int4" else (-0.9, 15.9))).astype(np.float32)
    m = _model([N("Cast", ["x"], ["n"], to=code), N("Cast", ["n"], ["y"], to=TP.FLOAT)],
               [("x", TP.FLOAT, [3, 5])], [("n", code, [3, 5]), ("y", TP.FLOAT, [3, 5])])
    ours, ref = backend.run_model(m, [x]), ReferenceEvaluator(m).run(None, {"x": x})
    for a, b in zip(ours, ref):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes()
    m = _model([N("Cast", ["n"], ["y"], to=TP.FLOAT)], [("n", code, [3, 5])], [("y", TP.FLOAT, [3, 5])])
    (y,) = backend.run_model(m, [ref[0]])
    assert y.tobytes() == ref[1].tobytes()


def _mlp16(dt: int):
    """A float16 (or bfloat16) two-layer perceptron with a softmax head."""
    npdt = helper.tensor_dtype_to_np_dtype(dt)
    w1 = (RNG.standard_normal((8, 16)) * 0.3).astype(npdt)
    b1 = (RNG.standard_normal(16) * 0.1).astype(npdt)
    w2 = (RNG.standard_normal((16, 4)) * 0.3).astype(npdt)
    nodes = [N("MatMul", ["x", "w1"], ["h"]), N("Add", ["h", "b1"], ["a"]), N("Relu", ["a"], ["r"]),
             N("MatMul", ["r", "w2"], ["z"]), N("Softmax", ["z"], ["y"], axis=-1)]
    return _model(nodes, [("x", dt, [5, 8])], [("y", dt, [5, 4])], [("w1", w1), ("b1", b1), ("w2", w2)],
                  opset=17)


def test_a_float16_model_agrees_with_onnxruntime_and_the_reference():
    import onnxruntime as ort
    m = _mlp16(TP.FLOAT16)
    x = RNG.standard_normal((5, 8)).astype(np.float16)
    (ours,) = backend.run_model(m, [x])
    (ref,) = ReferenceEvaluator(m).run(None, {"x": x})
    (rt,) = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert ours.dtype == np.float16
    # binary32 inside each node, one float16 rounding per node: within a few float16 ulps of both
    np.testing.assert_allclose(ours.astype(np.float32), rt.astype(np.float32), rtol=4e-3, atol=1e-3)
    np.testing.assert_allclose(ours.astype(np.float32), ref.astype(np.float32), rtol=4e-3, atol=1e-3)
    b = tlb.import_onnx(m)
    kinds = [n.kind for n in b.graph.nodes]
    assert kinds.count("round_float") == 5  # one rounding per ONNX node (MatMul+Add stay unfused: two roundings)


def test_a_bfloat16_model_agrees_with_the_reference():
    m = _mlp16(TP.BFLOAT16)
    x = RNG.standard_normal((5, 8)).astype(ml_dtypes.bfloat16)
    (ours,) = backend.run_model(m, [x])
    (ref,) = ReferenceEvaluator(m).run(None, {"x": x})
    assert ours.dtype == ref.dtype
    np.testing.assert_allclose(ours.astype(np.float32), ref.astype(np.float32), rtol=3e-2, atol=1e-2)


def test_float16_elementwise_results_are_the_correctly_rounded_binary16_results():
    a, b = (RNG.standard_normal(4096) * 50).astype(np.float16), (RNG.standard_normal(4096) * 50).astype(np.float16)
    for op in ("Add", "Sub", "Mul", "Div"):
        m = _model([N(op, ["a", "b"], ["y"])], [("a", TP.FLOAT16, [4096]), ("b", TP.FLOAT16, [4096])],
                   [("y", TP.FLOAT16, [4096])])
        (y,) = backend.run_model(m, [a, b])
        assert y.tobytes() == ReferenceEvaluator(m).run(None, {"a": a, "b": b})[0].tobytes(), op


# -- intervals and export ------------------------------------------------------------------

def _round_graph(fmt, saturate=True):
    g = tlb.Graph([tlb.Node(0, [], "input", (64,)),
                   tlb.Node(1, [0], "round_float", (64,), {"format": fmt, "saturate": saturate,
                                                           "round_mode": "nearest"})], inputs=[0], outputs=[1])
    return g


@pytest.mark.parametrize("fmt", ["float16", "bfloat16", "float8e4m3fn", "float8e5m2", "float4e2m1"])
def test_round_float_boxes_enclose_and_are_the_hull(fmt):
    lo = RNG.standard_normal(64) * 3
    hi = lo + RNG.random(64)
    boxes = tlb.interval_bounds(_round_graph(fmt), None, lo, hi)
    blo, bhi = boxes[-1] if isinstance(boxes, list) else boxes
    blo, bhi = np.asarray(blo), np.asarray(bhi)
    for t in np.linspace(0, 1, 9):
        v = round_to(lo + t * (hi - lo), fmt)
        assert np.all(blo <= v) and np.all(v <= bhi)
    assert np.array_equal(blo, round_to(lo, fmt)) and np.array_equal(bhi, round_to(hi, fmt))  # both attained


def test_round_float_refuses_boxes_that_reach_nan():
    with pytest.raises(tlb.BridgeError, match="turns into NaN"):
        tlb.interval_bounds(_round_graph("float8e4m3fn", saturate=False), None, np.zeros(64), np.full(64, 1000.0))
    with pytest.raises(NarrowError, match="turns into NaN"):
        round_box(np.zeros(1), np.array([500.0]), "float8e4m3fn", False, "nearest")


def test_round_float_exports_as_cast_there_and_back():
    import onnxruntime as ort
    x = (RNG.standard_normal(64) * 100).astype(np.float32)
    for fmt in ("float16", "bfloat16", "float8e4m3fn", "float8e5m2"):
        m = tlb.export_onnx(tlb.Bundle(_round_graph(fmt)))
        model = m if isinstance(m, onnx.ModelProto) else onnx.load_from_string(m)
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        (y,) = sess.run(None, {model.graph.input[0].name: x})
        assert y.tolist() == round_to(x, fmt).tolist(), fmt


def test_v1_export_refuses_the_narrow_roundings_by_name(tmp_path):
    with pytest.raises(tlb.BridgeError, match="round_float"):
        tlb.export_torchlean(tlb.Bundle(_round_graph("float16")), tmp_path / "g.json")


# -- refusals ------------------------------------------------------------------------------

def test_nan_to_float4_is_refused_by_name():
    m = _model([N("Cast", ["x"], ["y"], to=TP.FLOAT4E2M1)], [("x", TP.FLOAT, [2])], [("y", TP.FLOAT4E2M1, [2])])
    with pytest.raises(tlb.BridgeError, match="round_float: NaN has no float4e2m1 value"):
        backend.run_model(m, [np.array([1.0, np.nan], np.float32)])


@pytest.mark.parametrize("name, low, high", [("int8", -128, 127), ("uint8", 0, 255), ("int4", -8, 7),
                                              ("uint4", 0, 15), ("int2", -2, 1), ("uint2", 0, 3),
                                              ("int16", -32768, 32767), ("uint32", 0, 2 ** 32 - 1)])
def test_float_to_fixed_point_out_of_range_is_refused_at_evaluation_never_wrapped(name, low, high):
    code = TP.DataType.Value(name.upper())
    m = _model([N("Cast", ["x"], ["y"], to=code)], [("x", TP.FLOAT, [3])], [("y", code, [3])])
    # in range (after truncation toward zero) casts exactly, as every peer agrees
    top = min(high, 2 ** 23)  # + 0.5 stays exact in float32
    inside = np.array([low - 0.5 if low else -0.5, top + 0.5, 0.0], np.float32)
    assert backend.run_model(m, [inside])[0].tolist() == [low, top, 0]
    for bad, shown in ((low - 1, low - 1), (high + 1, high + 1)):
        x = np.array([0.0, float(bad), 3.0], np.float32)
        with pytest.raises(tlb.BridgeError, match=rf"int_wrap: value {shown} is outside {name}"):
            backend.run_model(m, [x])
    for bad in (np.nan, np.inf, 1e30):  # beyond every integer type: the first offending value is named
        with pytest.raises(tlb.BridgeError, match="cast: value " + re.escape(repr(float(np.float32(bad)))) + " is NaN, infinite or outside"):
            backend.run_model(m, [np.array([0.0, bad, np.nan], np.float32)])


@pytest.mark.parametrize("name", ["INT4", "UINT2", "INT8", "UINT64", "INT64"])
def test_a_constant_float_cast_out_of_range_is_refused_at_import(name):
    code = getattr(TP, name)
    m = _model([N("Cast", ["c"], ["y"], to=code)], [], [("y", code, [2])], [("c", np.array([1.0, 1e30], np.float32))])
    with pytest.raises(tlb.BridgeError, match=r"constant input 0 holds 1.0000000150474662e\+30, outside"):
        tlb.import_onnx(m)


def test_an_output_off_its_declared_grid_is_an_error_never_rounded():
    with pytest.raises(tlb.BridgeError, match="output `y` holds values that are not float8e4m3fn values"):
        backend._output_array(np.array([0.1], np.float32), TP.FLOAT8E4M3FN, "y")
    assert backend._output_array(np.array([0.5], np.float32), TP.FLOAT8E4M3FN, "y").dtype == ml_dtypes.float8_e4m3fn
