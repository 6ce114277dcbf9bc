"""Issue #15's small ONNX ops (importers/onnx/ops_misc, ops_signal, ops_state) on models of our own.

Each case builds a model with random shapes and attributes, imports it with tlb.import_onnx and
evaluates it with tlb.evaluate; the result must agree with onnx's reference evaluator (and with
onnxruntime where it implements the op): bit-for-bit for data movement and folds, within binary32
rounding (rtol 1e-5, atol 1e-5 unless stated) for arithmetic. Interval bounds of the compositions must
enclose sampled points; forms that are not lowered exactly are refused by name.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper
from onnx.reference import ReferenceEvaluator

import torchlean_bridge as tlb
from torchlean_bridge.errors import BridgeError, UnsupportedError
from torchlean_bridge.onnx_backend import prepare
from tests.onnx_models import evaluate_onnx, onnx_model

N = helper.make_node
RNG = np.random.default_rng(1515)


_model = partial(onnx_model, opset=22)


_ours = evaluate_onnx


def _reference(m, feeds):
    return [np.asarray(v) for v in ReferenceEvaluator(m).run(None, feeds)]


def _ort(m, feeds):
    ort = pytest.importorskip("onnxruntime")
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def _close(ours, theirs, exact=False, tol=1e-5):
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert a.shape == b.shape
        if exact:
            assert np.array_equal(a.astype(b.dtype), b)
        else:
            np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64), rtol=tol, atol=tol)


def _backend(m, feeds):
    """Through the ONNX backend: steering inputs (the values a fold needs) are bound at run time."""
    return [np.asarray(v) for v in prepare(m).run(feeds)]


def _sound(m, feeds, radius=0.05, samples=64):
    """Interval bounds on a box around the feeds enclose the outputs at random points and corners."""
    b = tlb.import_onnx(m)
    names = b.report["inputs"]
    lo = [feeds[n] - radius for n in names]
    hi = [feeds[n] + radius for n in names]
    boxes = tlb.interval_bounds(b.graph, b.payload, lo, hi, all_nodes=False)
    for k in range(samples + 2):
        if k < 2:
            pts = lo if k == 0 else hi
        else:
            pts = [lo_i + RNG.random(lo_i.shape).astype(lo_i.dtype) * (hi_i - lo_i) for lo_i, hi_i in zip(lo, hi)]
        outs = tlb.evaluate(b.graph, b.payload, pts, dtype="float64")
        for (blo, bhi), y in zip(boxes, outs):
            assert np.all(np.asarray(blo) <= y) and np.all(y <= np.asarray(bhi))


# -- Hardmax / Swish / SwiGLU / MVN -----------------------------------------------------------

@pytest.mark.parametrize("opset,axis", [(13, -1), (13, 0), (13, 1), (11, 1), (11, 0), (11, 2)])
def test_hardmax_is_the_first_maximum_one_hot(opset, axis):
    x = RNG.integers(0, 3, (3, 4, 5)).astype(np.float32)  # ties: the first maximum wins
    m = _model([N("Hardmax", ["x"], ["y"], axis=axis)], [("x", TP.FLOAT, x.shape)], [("y", TP.FLOAT, None)],
               opset=opset)
    if opset >= 13:  # onnx's reference implements only Hardmax-13 (it ignores the older 2-D coercion)
        _close(_ours(m, {"x": x}), _reference(m, {"x": x}), exact=True)
    _close(_ours(m, {"x": x}), _ort(m, {"x": x}), exact=True)


@pytest.mark.parametrize("alpha", [1.0, 0.5, 1.702, -2.0])
def test_swish_and_swiglu_against_the_reference(alpha):
    a = RNG.standard_normal((2, 3, 7)).astype(np.float32) * 4
    b = RNG.standard_normal((2, 3, 7)).astype(np.float32)
    sw = _model([N("Swish", ["a"], ["y"], alpha=alpha)], [("a", TP.FLOAT, a.shape)], [("y", TP.FLOAT, None)],
                opset=24)
    _close(_ours(sw, {"a": a}), _reference(sw, {"a": a}))
    glu = _model([N("SwiGLU", ["a", "b"], ["y"], alpha=alpha)], [("a", TP.FLOAT, a.shape), ("b", TP.FLOAT, b.shape)],
                 [("y", TP.FLOAT, None)], opset=28)
    _close(_ours(glu, {"a": a, "b": b}), _reference(glu, {"a": a, "b": b}))
    _sound(glu, {"a": a, "b": b})


def test_swiglu_refuses_broadcasting_operands():
    m = _model([N("SwiGLU", ["a", "b"], ["y"])], [("a", TP.FLOAT, [2, 3]), ("b", TP.FLOAT, [1, 3])],
               [("y", TP.FLOAT, None)], opset=28)
    with pytest.raises(UnsupportedError, match="SwiGLU does not broadcast"):
        tlb.import_onnx(m)


@pytest.mark.parametrize("axes", [None, [0, 2], [1], [0, 1, 2, 3]])
def test_mean_variance_normalization_follows_the_function_body(axes):
    x = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32) * 3 + 1
    kw = {} if axes is None else {"axes": axes}
    m = _model([N("MeanVarianceNormalization", ["x"], ["y"], **kw)], [("x", TP.FLOAT, x.shape)],
               [("y", TP.FLOAT, None)], opset=13)
    _close(_ours(m, {"x": x}), _reference(m, {"x": x}), tol=1e-4)
    _close(_ours(m, {"x": x}), _ort(m, {"x": x}), tol=1e-4)


# -- EyeLike / Compress / TensorScatter -------------------------------------------------------

@pytest.mark.parametrize("shape,k,dtype", [((3, 3), 0, None), ((4, 6), 2, TP.INT32), ((5, 2), -1, TP.DOUBLE),
                                           ((3, 4), 7, TP.FLOAT)])
def test_eye_like_is_a_constant_of_the_input_shape(shape, k, dtype):
    x = RNG.standard_normal(shape).astype(np.float32)
    kw = {"k": k} if dtype is None else {"k": k, "dtype": dtype}
    m = _model([N("EyeLike", ["x"], ["y"], **kw)], [("x", TP.FLOAT, shape)],
               [("y", dtype if dtype is not None else TP.FLOAT, None)])
    ours = _backend(m, {"x": x})
    _close(ours, _reference(m, {"x": x}), exact=True)
    assert ours[0].dtype == _reference(m, {"x": x})[0].dtype


@pytest.mark.parametrize("axis", [None, 0, 1, -1])
def test_compress_with_a_known_condition_is_a_gather(axis):
    x = RNG.standard_normal((4, 5, 3)).astype(np.float32)
    extent = x.size if axis is None else x.shape[axis]
    cond = RNG.random(extent - 1) < 0.5  # shorter than the axis: positions past its end are dropped
    cond[0] = True
    kw = {} if axis is None else {"axis": axis}
    m = _model([N("Compress", ["x", "c"], ["y"], **kw)], [("x", TP.FLOAT, x.shape)], [("y", TP.FLOAT, None)],
               inits=[("c", cond)])
    _close(_ours(m, {"x": x}), _reference(m, {"x": x}), exact=True)


def test_compress_with_a_computed_condition_names_it():
    m = _model([N("Compress", ["x", "c"], ["y"], axis=0)], [("x", TP.FLOAT, [4, 2]), ("c", TP.BOOL, [4])],
               [("y", TP.FLOAT, None)])
    with pytest.raises(UnsupportedError, match=r"input 1 \(condition\) must be a constant known at import time"):
        tlb.import_onnx(m)
    x, c = RNG.standard_normal((4, 2)).astype(np.float32), np.array([True, False, True, True])
    _close(_backend(m, {"x": x, "c": c}), _reference(m, {"x": x, "c": c}), exact=True)


@pytest.mark.parametrize("mode", ["linear", "circular"])
@pytest.mark.parametrize("axis", [-2, 1, 2])
def test_tensor_scatter_writes_the_update_at_each_batchs_index(mode, axis):
    past = RNG.standard_normal((3, 4, 6, 5)).astype(np.float32)
    ushape = list(past.shape)
    ushape[axis] = 2
    upd = RNG.standard_normal(ushape).astype(np.float32)
    m_len = past.shape[axis]
    idx = np.array([0, m_len - 2, 1 if mode == "linear" else m_len - 1], np.int64)
    m = _model([N("TensorScatter", ["p", "u", "i"], ["y"], mode=mode, axis=axis)],
               [("p", TP.FLOAT, past.shape), ("u", TP.FLOAT, upd.shape), ("i", TP.INT64, [3])],
               [("y", TP.FLOAT, None)], opset=24)
    feeds = {"p": past, "u": upd, "i": idx}
    _close(_backend(m, feeds), _reference(m, feeds), exact=True)


def test_tensor_scatter_refuses_writes_past_the_cache_in_linear_mode():
    m = _model([N("TensorScatter", ["p", "u", "i"], ["y"])], [("p", TP.FLOAT, [1, 4, 2]), ("u", TP.FLOAT, [1, 2, 2])],
               [("y", TP.FLOAT, None)], inits=[("i", np.array([3], np.int64))], opset=24)
    with pytest.raises(UnsupportedError, match="leave the cache of length 4"):
        tlb.import_onnx(m)


# -- folded generators and value-dependent shapes ---------------------------------------------

@pytest.mark.parametrize("op", ["HannWindow", "HammingWindow", "BlackmanWindow"])
@pytest.mark.parametrize("periodic", [0, 1])
def test_windows_fold_when_the_size_is_known(op, periodic):
    n = int(RNG.integers(2, 40))
    m = _model([N(op, ["n"], ["y"], periodic=periodic)], [("n", TP.INT64, [])], [("y", TP.FLOAT, None)], opset=17)
    with pytest.raises(UnsupportedError, match="the window length is the input's value"):
        tlb.import_onnx(m)
    feeds = {"n": np.array(n, np.int64)}
    _close(_backend(m, feeds), _reference(m, feeds), exact=True)


def test_a_huge_window_or_constant_of_shape_is_refused_before_allocation():
    m = _model([N("HannWindow", ["n"], ["y"])], [], [("y", TP.FLOAT, None)],
               inits=[("n", np.array(10 ** 12, np.int64))], opset=17)
    with pytest.raises(BridgeError, match="HannWindow"):
        tlb.import_onnx(m)
    m = _model([N("MelWeightMatrix", ["b", "d", "r", "lo", "hi"], ["y"])], [], [("y", TP.FLOAT, None)],
               inits=[("b", np.array(10 ** 6, np.int64)), ("d", np.array(10 ** 7, np.int64)),
                      ("r", np.array(8000, np.int64)), ("lo", np.float32(0)), ("hi", np.float32(4000))], opset=17)
    with pytest.raises(BridgeError, match="MelWeightMatrix"):
        tlb.import_onnx(m)
    m = _model([N("ConstantOfShape", ["s"], ["y"])], [], [("y", TP.FLOAT, None)],
               inits=[("s", np.array([10 ** 6, 10 ** 6], np.int64))])
    with pytest.raises(BridgeError, match="ConstantOfShape"):
        tlb.import_onnx(m)


def test_nonmaxsuppression_and_unique_fold_once_their_inputs_are_bound():
    boxes = RNG.random((2, 6, 4)).astype(np.float32)
    boxes[..., 2:] += boxes[..., :2]
    scores = RNG.random((2, 3, 6)).astype(np.float32)
    m = _model([N("NonMaxSuppression", ["b", "s", "k", "iou", "th"], ["y"])],
               [("b", TP.FLOAT, boxes.shape), ("s", TP.FLOAT, scores.shape)], [("y", TP.INT64, None)],
               inits=[("k", np.array([3], np.int64)), ("iou", np.array([0.4], np.float32)),
                      ("th", np.array([0.2], np.float32))], opset=11)
    with pytest.raises(UnsupportedError, match="the number of selected boxes depends on their values"):
        tlb.import_onnx(m)
    feeds = {"b": boxes, "s": scores}
    _close(_backend(m, feeds), _reference(m, feeds), exact=True)
    x = RNG.integers(0, 4, (4, 3)).astype(np.float32)
    u = _model([N("Unique", ["x"], ["y", "i", "inv", "c"], axis=0, sorted=1)], [("x", TP.FLOAT, x.shape)],
               [("y", TP.FLOAT, None), ("i", TP.INT64, None), ("inv", TP.INT64, None), ("c", TP.INT64, None)],
               opset=11)
    _close(_backend(u, {"x": x}), _reference(u, {"x": x}), exact=True)


# -- training-mode Dropout and BatchNormalization ---------------------------------------------

def test_training_dropout_with_ratio_zero_is_the_identity_and_other_ratios_are_refused():
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    def model(ratio):
        return _model([N("Dropout", ["x", "r", "t"], ["y", "mask"], seed=3)], [("x", TP.FLOAT, x.shape)],
                      [("y", TP.FLOAT, None), ("mask", TP.BOOL, None)],
                      inits=[("r", np.float32(ratio)), ("t", np.bool_(True))])
    _close(_ours(model(0.0), {"x": x}), _reference(model(0.0), {"x": x}), exact=True)
    with pytest.raises(UnsupportedError, match=r"training_mode=1 with ratio=0.5 \(random"):
        tlb.import_onnx(model(0.5))


@pytest.mark.parametrize("shape,momentum", [((4, 3, 5, 2), 0.9), ((6, 2), 0.3), ((2, 4, 3), 0.0)])
def test_batchnorm_training_mode_uses_the_batch_statistics(shape, momentum):
    c = shape[1]
    feeds = {"x": RNG.standard_normal(shape).astype(np.float32) * 2 + 0.5,
             "s": RNG.standard_normal(c).astype(np.float32), "bias": RNG.standard_normal(c).astype(np.float32),
             "mean": RNG.standard_normal(c).astype(np.float32), "var": RNG.random(c).astype(np.float32) + 0.5}
    m = _model([N("BatchNormalization", ["x", "s", "bias", "mean", "var"], ["y", "rm", "rv"], training_mode=1,
                  momentum=momentum, epsilon=1e-3)],
               [(k, TP.FLOAT, v.shape) for k, v in feeds.items()],
               [("y", TP.FLOAT, None), ("rm", TP.FLOAT, None), ("rv", TP.FLOAT, None)], opset=15)
    _close(_ours(m, feeds), _reference(m, feeds), tol=1e-4)
    _close(_ours(m, feeds), _ort(m, feeds), tol=1e-4)


# -- CausalConvWithState / LinearAttention ----------------------------------------------------

@pytest.mark.parametrize("k,past,bias,activation", [(4, True, True, "silu"), (3, False, False, "none"),
                                                    (1, False, True, "swish"), (2, True, False, "none")])
def test_causal_conv_with_state_against_the_reference(k, past, bias, activation):
    b, c, length = int(RNG.integers(1, 4)), int(RNG.integers(1, 5)), int(RNG.integers(1, 9))
    feeds = {"x": RNG.standard_normal((b, c, length)).astype(np.float32)}
    inits = [("w", RNG.standard_normal((c, 1, k)).astype(np.float32))]
    names = ["x", "w", "", ""]
    if bias:
        inits.append(("bias", RNG.standard_normal(c).astype(np.float32)))
        names[2] = "bias"
    if past:
        feeds["past"] = RNG.standard_normal((b, c, k - 1)).astype(np.float32)
        names[3] = "past"
    m = _model([N("CausalConvWithState", names, ["y", "state"], activation=activation)],
               [(n, TP.FLOAT, v.shape) for n, v in feeds.items()], [("y", TP.FLOAT, None), ("state", TP.FLOAT, None)],
               inits=inits, opset=27)
    _close(_ours(m, feeds), _reference(m, feeds))
    if k > 1:
        _sound(m, feeds)


@pytest.mark.parametrize("rule", ["linear", "gated", "delta", "gated_delta"])
@pytest.mark.parametrize("hq,hkv,past,per_key", [(2, 2, False, False), (4, 2, True, True), (3, 1, True, False)])
def test_linear_attention_unrolls_the_reference_recurrence(rule, hq, hkv, past, per_key):
    b, t, dk, dv = 2, int(RNG.integers(1, 6)), 3, 2
    feeds = {"q": RNG.standard_normal((b, t, hq * dk)).astype(np.float32),
             "k": RNG.standard_normal((b, t, hkv * dk)).astype(np.float32) * 0.5,
             "v": RNG.standard_normal((b, t, hkv * dv)).astype(np.float32)}
    names = ["q", "k", "v", "", "", ""]
    if past:
        feeds["s"] = RNG.standard_normal((b, hkv, dk, dv)).astype(np.float32)
        names[3] = "s"
    if rule in ("gated", "gated_delta"):
        feeds["g"] = -RNG.random((b, t, hkv * dk if per_key else hkv)).astype(np.float32)
        names[4] = "g"
    if rule in ("delta", "gated_delta"):
        feeds["beta"] = RNG.random((b, t, hkv if per_key else 1)).astype(np.float32)
        names[5] = "beta"
    while names and not names[-1]:
        names.pop()
    m = _model([N("LinearAttention", names, ["y", "state"], update_rule=rule, q_num_heads=hq, kv_num_heads=hkv,
                  scale=0.0 if past else 0.7)],
               [(n, TP.FLOAT, v.shape) for n, v in feeds.items()], [("y", TP.FLOAT, None), ("state", TP.FLOAT, None)],
               opset=27)
    _close(_ours(m, feeds), _reference(m, feeds), tol=1e-4)


def test_linear_attention_refuses_a_missing_decay_by_name():
    m = _model([N("LinearAttention", ["q", "k", "v"], ["y", "s"], update_rule="gated", q_num_heads=1,
                  kv_num_heads=1)], [(n, TP.FLOAT, [1, 2, 4]) for n in "qkv"], [("y", TP.FLOAT, None)], opset=27)
    with pytest.raises(UnsupportedError, match="update_rule=gated requires the decay input"):
        tlb.import_onnx(m)


# -- DFT / STFT -------------------------------------------------------------------------------

@pytest.mark.parametrize("opset", [17, 20])
@pytest.mark.parametrize("complex_in,inverse,onesided,length", [
    (False, False, False, None), (False, False, True, None), (True, False, False, 7), (True, True, False, None),
    (True, True, True, None), (True, True, True, 9), (False, False, True, 12), (True, False, False, 3)])
def test_dft_matches_numpy_fft_through_the_reference(opset, complex_in, inverse, onesided, length):
    x = RNG.standard_normal((2, 6, 5, 2 if complex_in else 1))
    feeds = {"x": x}
    inits = [] if length is None else [("n", np.array(length, np.int64))]
    names = ["x", "n" if length is not None else ""]
    kw = {"inverse": int(inverse), "onesided": int(onesided)}
    if opset >= 20:
        inits.append(("axis", np.array(1, np.int64)))
        names.append("axis")
    else:
        kw["axis"] = 1
    m = _model([N("DFT", names, ["y"], **kw)], [("x", TP.DOUBLE, x.shape)], [("y", TP.DOUBLE, None)], inits=inits,
               opset=opset)
    _close(_ours(m, feeds), _reference(m, feeds), tol=1e-10)
    if not (inverse and onesided):
        _sound(m, feeds, samples=16)


@pytest.mark.parametrize("window,onesided", [(True, 1), (False, 1), (True, 0)])
def test_stft_frames_windows_and_transforms(window, onesided):
    sig = RNG.standard_normal((2, 40, 1)).astype(np.float32)
    feeds = {"x": sig}
    inits = [("step", np.array(6, np.int64))]
    names = ["x", "step"]
    if window:
        inits.append(("w", np.hanning(10).astype(np.float32)))
        names += ["w"]
    else:
        inits.append(("len", np.array(10, np.int64)))
        names += ["", "len"]
    m = _model([N("STFT", names, ["y"], onesided=onesided)], [("x", TP.FLOAT, sig.shape)], [("y", TP.FLOAT, None)],
               inits=inits, opset=17)
    _close(_ours(m, feeds), _reference(m, feeds), tol=1e-4)
    _close(_ours(m, feeds), _ort(m, feeds), tol=1e-4)


# -- CumProd / Det / BitCast (ext ops) --------------------------------------------------------

@pytest.mark.parametrize("axis,exclusive,reverse", [(0, 0, 0), (1, 1, 0), (-1, 0, 1), (2, 1, 1)])
def test_cumprod_float_against_the_reference_and_sound(axis, exclusive, reverse):
    x = (RNG.standard_normal((3, 4, 5)) + 0.2).astype(np.float32)
    m = _model([N("CumProd", ["x", "a"], ["y"], exclusive=exclusive, reverse=reverse)], [("x", TP.FLOAT, x.shape)],
               [("y", TP.FLOAT, None)], inits=[("a", np.array(axis, np.int64))], opset=26)
    _close(_ours(m, {"x": x}), _reference(m, {"x": x}))
    _sound(m, {"x": x}, radius=0.2)


@pytest.mark.parametrize("dtype,tp", [(np.int32, TP.INT32), (np.int64, TP.INT64), (np.uint8, TP.UINT8)])
def test_cumprod_on_integers_is_exact_and_refuses_wrapping(dtype, tp):
    x = RNG.integers(1, 4, (2, 6)).astype(dtype)
    m = _model([N("CumProd", ["x", "a"], ["y"], exclusive=1)], [("x", tp, x.shape)], [("y", tp, None)],
               inits=[("a", np.array(1, np.int64))], opset=26)
    _close(_backend(m, {"x": x}), _reference(m, {"x": x}), exact=True)
    big = np.full((1, 70), 3, dtype)
    m = _model([N("CumProd", ["x", "a"], ["y"])], [("x", tp, big.shape)], [("y", tp, None)],
               inits=[("a", np.array(1, np.int64))], opset=26)
    with pytest.raises(BridgeError, match="refused, not wrapped"):
        _backend(m, {"x": big})


def test_cumprod_interval_bounds_are_the_exact_products_of_the_ends_outward_rounded():
    from fractions import Fraction
    lo = np.array([[0.5, -2.0, 1.5, -0.25]])
    hi = np.array([[0.75, -1.0, 3.0, 0.5]])
    m = _model([N("CumProd", ["x", "a"], ["y"])], [("x", TP.DOUBLE, lo.shape)], [("y", TP.DOUBLE, None)],
               inits=[("a", np.array(1, np.int64))], opset=26)
    b = tlb.import_onnx(m)
    (blo, bhi), = tlb.interval_bounds(b.graph, b.payload, lo, hi, all_nodes=False)
    run = (Fraction(1), Fraction(1))
    for i in range(lo.shape[1]):
        ends = [run[j] * Fraction(e) for j in (0, 1) for e in (lo[0, i], hi[0, i])]
        run = (min(ends), max(ends))
        assert Fraction(float(blo[0, i])) <= run[0] and run[1] <= Fraction(float(bhi[0, i]))
        assert run[0] - Fraction(float(blo[0, i])) <= abs(run[0]) * Fraction(2 ** -48) + Fraction(2 ** -1070)
        assert Fraction(float(bhi[0, i])) - run[1] <= abs(run[1]) * Fraction(2 ** -48) + Fraction(2 ** -1070)


@pytest.mark.parametrize("shape", [(3, 3), (2, 4, 4), (2, 1, 2, 2)])
def test_det_against_the_reference_and_refused_in_interval_mode(shape):
    x = RNG.standard_normal(shape).astype(np.float32)
    m = _model([N("Det", ["x"], ["y"])], [("x", TP.FLOAT, shape)], [("y", TP.FLOAT, None)])
    _close(_ours(m, {"x": x}), _reference(m, {"x": x}), tol=1e-4)
    _close(_ours(m, {"x": x}), _ort(m, {"x": x}), tol=1e-4)
    b = tlb.import_onnx(m)
    with pytest.raises(BridgeError, match="no interval rule for det: a determinant computed by pivoted elimination"):
        tlb.interval_bounds(b.graph, b.payload, x - 0.1, x + 0.1)
    from exporters.onnx import to_onnx_model
    exported = to_onnx_model(b)
    assert [n.op_type for n in exported.graph.node] == ["Det"]
    _close(_ort(exported, {exported.graph.input[0].name: x}), _ours(m, {"x": x}), tol=1e-5)


@pytest.mark.parametrize("src,dst", [(np.float32, np.int32), (np.int32, np.float32), (np.float32, np.uint32),
                                     (np.uint16, np.int16), (np.int8, np.uint8), (np.float64, np.int64),
                                     (np.int64, np.float64), (np.bool_, np.uint8)])
def test_bitcast_reads_the_same_bits(src, dst):
    raw = RNG.integers(0, 255, (3, 8), dtype=np.uint8)
    if src == np.bool_:
        x = raw[:, :1] % 2 == 1
    else:
        x = raw.view(src).copy()
        if np.dtype(src).kind == "f":
            x[~np.isfinite(x)] = 1.5
    m = _model([N("BitCast", ["x"], ["y"], to=helper.np_dtype_to_tensor_dtype(np.dtype(dst)))],
               [("x", helper.np_dtype_to_tensor_dtype(x.dtype), x.shape)],
               [("y", helper.np_dtype_to_tensor_dtype(np.dtype(dst)), None)], opset=26)
    ours = _backend(m, {"x": x})
    assert ours[0].dtype == np.dtype(dst)
    assert np.array_equal(ours[0].view(np.uint8), x.view(dst).view(np.uint8))


def test_bitcast_refusals_name_the_reason():
    m = _model([N("BitCast", ["x"], ["y"], to=TP.INT64)], [("x", TP.FLOAT, [2])], [("y", TP.INT64, None)], opset=26)
    with pytest.raises(UnsupportedError, match="float32 and int64 differ in width"):
        tlb.import_onnx(m)
    m = _model([N("BitCast", ["x"], ["y"], to=TP.INT32)], [("x", TP.FLOAT, [2])], [("y", TP.INT32, None)], opset=26)
    b = tlb.import_onnx(m)
    with pytest.raises(BridgeError, match="no interval rule for bitcast"):
        tlb.interval_bounds(b.graph, b.payload, np.zeros(2), np.ones(2))
    with pytest.raises(BridgeError, match="is not a float32 value"):
        tlb.evaluate(b.graph, b.payload, [np.array([0.1, 0.2])], dtype="float64")
    m = _model([N("BitCast", ["x"], ["y"], to=TP.DOUBLE)], [("x", TP.INT64, [2])], [("y", TP.DOUBLE, None)], opset=26)
    b = tlb.import_onnx(m)
    with pytest.raises(BridgeError, match="a float64 bit pattern in a float32 evaluation"):
        tlb.evaluate(b.graph, b.payload, [np.array([1, 2])], dtype="float32")


def test_torch_cumprod_and_det_agree_with_pytorch_through_both_importers():
    torch = pytest.importorskip("torch")

    class M(torch.nn.Module):
        def forward(self, x):
            return torch.cumprod(x, 1) * x.cumprod(dim=-1), torch.linalg.det(x[..., :3, :3]), x[0, :2, :2].det()

    model, x = M().eval(), torch.randn(2, 3, 4)
    want = [t.numpy() for t in model(x)]
    for importer in (tlb.import_fx, tlb.import_export):
        b = importer(model, (x,))
        assert {"cumprod", "det"} <= {n.kind for n in b.graph.nodes}
        got = tlb.evaluate(b.graph, b.payload, [x.numpy()], dtype="float32")
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


# -- empty and bool reductions, integer Clip / MaxPool / CumSum -------------------------------

@pytest.mark.parametrize("op", ["ReduceSum", "ReduceSumSquare", "ReduceL1", "ReduceL2", "ReduceProd", "ReduceMax",
                                "ReduceMin", "ReduceLogSum", "ReduceLogSumExp"])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_a_reduction_over_an_empty_set_is_its_identity(op, keepdims):
    x = np.zeros((3, 0, 2), np.float32)
    m = _model([N(op, ["x", "axes"], ["y"], keepdims=keepdims)], [("x", TP.FLOAT, x.shape)], [("y", TP.FLOAT, None)],
               inits=[("axes", np.array([1], np.int64))], opset=18)
    _close(_ours(m, {"x": x}), _reference(m, {"x": x}), exact=True)


def test_reduce_mean_over_an_empty_set_is_refused_by_name():
    m = _model([N("ReduceMean", ["x", "axes"], ["y"])], [("x", TP.FLOAT, [3, 0])], [("y", TP.FLOAT, None)],
               inits=[("axes", np.array([1], np.int64))], opset=18)
    with pytest.raises(UnsupportedError, match="ReduceMean over an empty set of float values"):
        tlb.import_onnx(m)


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
@pytest.mark.parametrize("axes,keepdims", [([0], 1), ([1, 2], 0), ([], 1)])
def test_bool_max_and_min_are_any_and_all(op, axes, keepdims):
    x = RNG.random((3, 4, 2)) < 0.4
    m = _model([N(op, ["x", "axes"], ["y"], keepdims=keepdims)], [("x", TP.BOOL, x.shape)], [("y", TP.BOOL, None)],
               inits=[("axes", np.array(axes, np.int64))], opset=20)
    _close(_backend(m, {"x": x}), _reference(m, {"x": x}), exact=True)


@pytest.mark.parametrize("dtype", [np.int8, np.uint16, np.int32, np.int64])
def test_integer_clip_is_exact_in_the_inputs_type(dtype):
    info = np.iinfo(dtype)
    x = RNG.integers(max(info.min, -1000), min(info.max, 1000), (4, 5)).astype(dtype)
    lo, hi = np.array(max(info.min, -50), dtype), np.array(60, dtype)
    tp = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    for names, feeds in ((["x", "lo", "hi"], {"x": x, "lo": lo, "hi": hi}), (["x", "", "hi"], {"x": x, "hi": hi}),
                         (["x", "lo"], {"x": x, "lo": lo})):
        m = _model([N("Clip", names, ["y"])], [(n, tp, v.shape) for n, v in feeds.items()], [("y", tp, None)],
                   opset=13)
        _close(_backend(m, feeds), _reference(m, feeds), exact=True)
        if dtype != np.uint16:  # onnxruntime has no uint16 Clip kernel
            _close(_backend(m, feeds), _ort(m, feeds), exact=True)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.uint16])
def test_small_integer_max_pool_pools_exactly(dtype):
    info = np.iinfo(dtype)
    x = RNG.integers(info.min, info.max, (1, 2, 6, 5)).astype(dtype)
    tp = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    m = _model([N("MaxPool", ["x"], ["y"], kernel_shape=[3, 2], strides=[2, 1], pads=[1, 0, 1, 1])],
               [("x", tp, x.shape)], [("y", tp, None)])
    _close(_backend(m, {"x": x}), _reference(m, {"x": x}), exact=True)
    m32 = _model([N("MaxPool", ["x"], ["y"], kernel_shape=[2, 2])], [("x", TP.INT32, x.shape)], [("y", TP.INT32, None)])
    with pytest.raises(UnsupportedError, match="only 8- and 16-bit integers are held exactly"):
        tlb.import_onnx(m32)


@pytest.mark.parametrize("exclusive,reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_integer_cumsum_is_exact_and_refuses_wrapping(exclusive, reverse):
    x = RNG.integers(-100, 100, (3, 7)).astype(np.int32)
    m = _model([N("CumSum", ["x", "a"], ["y"], exclusive=exclusive, reverse=reverse)], [("x", TP.INT32, x.shape)],
               [("y", TP.INT32, None)], inits=[("a", np.array(1, np.int64))], opset=14)
    _close(_backend(m, {"x": x}), _reference(m, {"x": x}), exact=True)
    big = np.full((3, 7), 2 ** 30, np.int32)
    with pytest.raises(BridgeError, match="outside int32 \\(ONNX would wrap it\\); refused, not wrapped"):
        _backend(m, {"x": big})
    b = tlb.import_onnx(m)
    with pytest.raises(BridgeError, match="no interval rule for int_cumsum"):
        tlb.interval_bounds(b.graph, b.payload, x.astype(np.float64), x.astype(np.float64))


@pytest.mark.parametrize("p,axis", [(2, 0), (2, -1), (1, 1)])
def test_lp_normalization_is_zero_where_the_norm_is_zero(p, axis):
    x = RNG.standard_normal((3, 4, 2)).astype(np.float32)
    x[:, 1, :] = 0.0  # a zero norm along axis 0 and 2, zero entries along axis 1
    x[0] = 0.0
    m = _model([N("LpNormalization", ["x"], ["y"], p=p, axis=axis)], [("x", TP.FLOAT, x.shape)],
               [("y", TP.FLOAT, None)])
    if p == 2:  # onnx's reference sums x ** p without |.|: its p=1 norm of negative entries is not a norm
        _close(_ours(m, {"x": x}), _reference(m, {"x": x}))
    _close(_ours(m, {"x": x}), _ort(m, {"x": x}))
    y = RNG.standard_normal((3, 4, 2)).astype(np.float32) + 3.0
    _sound(m, {"x": y}, radius=0.01)


def test_a_dft_matrix_beyond_the_cap_is_refused_before_it_is_built():
    m = _model([N("DFT", ["x", "n"], ["y"])], [("x", TP.FLOAT, [1, 4096, 1])], [("y", TP.FLOAT, None)],
               inits=[("n", np.array(4096, np.int64))], opset=20)
    with pytest.raises(UnsupportedError, match=r"a DFT of length 4096 over 4096 inputs and 4096 bins"):
        tlb.import_onnx(m)
