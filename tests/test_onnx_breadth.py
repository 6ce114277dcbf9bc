"""Issue #15's ONNX ops (importers/onnx/ops_cast, ops_index, ops_norm, ...) against onnxruntime.

Each case builds a small model with random data, imports it with tlb.import_onnx and evaluates it
with tlb.evaluate; the result must equal onnxruntime's (bit-for-bit for data movement, within
binary32 rounding for arithmetic). Forms that are not lowered exactly must be refused by name.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper

import torchlean_bridge as tlb
from torchlean_bridge.errors import UnsupportedError
from tests.onnx_models import evaluate_onnx, onnx_model

ort = pytest.importorskip("onnxruntime")
N = helper.make_node
RNG = np.random.default_rng(15)


_model = partial(onnx_model, opset=18, ir_version=8)


_ours = evaluate_onnx


def _ort(m, feeds):
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def _agree(m, feeds, exact=False, **kw):
    for a, b in zip(_ours(m, feeds, **kw), _ort(m, feeds)):
        assert a.shape == b.shape
        if exact:
            assert np.array_equal(a.astype(b.dtype), b)
        else:
            np.testing.assert_allclose(a, b, rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("mode", ["edge", "reflect", "wrap", "constant"])
def test_pad_modes_gather_the_positions_onnxruntime_reads(mode):
    x = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    pads = np.array([0, 1, 2, 3, 1, 0, 1, 2], np.int64)
    m = _model([N("Pad", ["x", "p"], ["y"], mode=mode)], [("x", TP.FLOAT, x.shape)], [("y", TP.FLOAT, None)],
               inits=[("p", pads)])
    _agree(m, {"x": x}, exact=True)


def test_pad_refuses_negative_pads_outside_constant_mode():
    m = _model([N("Pad", ["x", "p"], ["y"], mode="edge")], [("x", TP.FLOAT, [4])], [("y", TP.FLOAT, None)],
               inits=[("p", np.array([-1, 1], np.int64))])
    with pytest.raises(UnsupportedError, match="negative pads"):
        tlb.import_onnx(m)


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_elements_with_constant_indices_follows_write_order(reduction):
    data = RNG.standard_normal((4, 5)).astype(np.float32)
    upd = RNG.standard_normal((3, 5)).astype(np.float32)
    idx = np.array([[0, 1, 2, 3, 0], [1, 2, 3, 0, 1], [3, 3, 0, 1, 2]], np.int64)  # distinct per column
    if reduction != "none":
        idx = np.array([[0, 1, 1, 3, 0], [0, 1, 3, 0, 0], [0, 3, 1, 1, 2]], np.int64)  # repeated writes
    m = _model([N("ScatterElements", ["d", "i", "u"], ["y"], axis=0, reduction=reduction)],
               [("d", TP.FLOAT, data.shape), ("u", TP.FLOAT, upd.shape)], [("y", TP.FLOAT, None)],
               inits=[("i", idx)])
    _agree(m, {"d": data, "u": upd})


def test_scatter_nd_blocks_and_repeated_adds():
    data = RNG.standard_normal((4, 3, 2)).astype(np.float32)
    idx = np.array([[[1], [3]], [[1], [-4]]], np.int64)
    upd = RNG.standard_normal((2, 2, 3, 2)).astype(np.float32)
    m = _model([N("ScatterND", ["d", "i", "u"], ["y"], reduction="add")],
               [("d", TP.FLOAT, data.shape), ("u", TP.FLOAT, upd.shape)], [("y", TP.FLOAT, None)],
               inits=[("i", idx)])
    _agree(m, {"d": data, "u": upd})


def test_scatter_refuses_repeated_positions_without_reduction_and_computed_indices():
    m = _model([N("ScatterND", ["d", "i", "u"], ["y"])], [("d", TP.FLOAT, [4]), ("u", TP.FLOAT, [2])],
               [("y", TP.FLOAT, None)], inits=[("i", np.array([[1], [1]], np.int64))])
    with pytest.raises(UnsupportedError, match="repeat a position with reduction=none"):
        tlb.import_onnx(m)
    m = _model([N("ScatterND", ["d", "i", "u"], ["y"])],
               [("d", TP.FLOAT, [4]), ("i", TP.INT64, [2, 1]), ("u", TP.FLOAT, [2])], [("y", TP.FLOAT, None)])
    with pytest.raises(UnsupportedError, match="must be a constant known at import time"):
        tlb.import_onnx(m)


@pytest.mark.parametrize("opset,axis", [(11, -1), (11, 0), (9, 1)])
def test_one_hot_matches_onnxruntime_including_negative_and_out_of_range(opset, axis):
    idx = np.array([[0, -1, 3], [5, -6, 2]], np.int64)
    m = _model([N("OneHot", ["i", "d", "v"], ["y"], axis=axis)], [("i", TP.INT64, idx.shape)],
               [("y", TP.FLOAT, None)], inits=[("d", np.array(4, np.int64)), ("v", np.array([-2.0, 7.0], np.float32))],
               opset=opset)
    _agree(m, {"i": idx}, exact=True)


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("keepdims", [0, 1])
def test_arg_select_last_index_picks_the_last_of_ties(op, keepdims):
    x = RNG.integers(0, 3, (3, 6)).astype(np.float32)  # many ties
    m = _model([N(op, ["x"], ["y"], axis=1, keepdims=keepdims, select_last_index=1)],
               [("x", TP.FLOAT, x.shape)], [("y", TP.INT64, None)])
    _agree(m, {"x": x}, exact=True)


def test_gather_nd_batch_dims():
    x = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    idx = np.array([[[0, 1], [2, -1]], [[1, 0], [0, 3]]], np.int64)
    m = _model([N("GatherND", ["x", "i"], ["y"], batch_dims=1)], [("x", TP.FLOAT, x.shape)],
               [("y", TP.FLOAT, None)], inits=[("i", idx)])
    _agree(m, {"x": x}, exact=True)


def test_range_and_nonzero_fold_when_known_and_name_their_inputs_otherwise():
    m = _model([N("Range", ["a", "b", "c"], ["y"])], [("a", TP.FLOAT, []), ("b", TP.FLOAT, []), ("c", TP.FLOAT, [])],
               [("y", TP.FLOAT, None)])
    with pytest.raises(UnsupportedError, match="Range.*must be constants known at import time") as e:
        tlb.import_onnx(m)
    assert e.value.items[0]["needs"] == ["a", "b", "c"]
    b = tlb.import_onnx(m, constants={"a": np.float32(1), "b": np.float32(4), "c": np.float32(0.5)})
    assert np.array_equal(tlb.evaluate(b.graph, b.payload, [])[0], np.arange(1, 4, 0.5, dtype=np.float32))
    m = _model([N("NonZero", ["x"], ["y"])], [("x", TP.FLOAT, [3])], [("y", TP.INT64, None)])
    with pytest.raises(UnsupportedError, match="NonZero.*must be constants"):
        tlb.import_onnx(m)


@pytest.mark.parametrize("axis", [-1, 1, 0])
def test_rms_normalization(axis):
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    scale = RNG.standard_normal(x.shape[axis:] if axis >= 0 else x.shape[axis:]).astype(np.float32)
    m = _model([N("RMSNormalization", ["x", "s"], ["y"], axis=axis, epsilon=1e-3)], [("x", TP.FLOAT, x.shape)],
               [("y", TP.FLOAT, None)], inits=[("s", scale)], opset=23)
    from onnx.reference import ReferenceEvaluator
    (want,) = ReferenceEvaluator(m).run(None, {"x": x})
    np.testing.assert_allclose(_ours(m, {"x": x})[0], want, rtol=1e-5, atol=1e-6)


def test_layer_normalization_mean_and_inv_std_dev_outputs():
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    w, bias = RNG.standard_normal((3, 4)).astype(np.float32), RNG.standard_normal((3, 4)).astype(np.float32)
    m = _model([N("LayerNormalization", ["x", "w", "b"], ["y", "mean", "inv"], axis=1)], [("x", TP.FLOAT, x.shape)],
               [("y", TP.FLOAT, None), ("mean", TP.FLOAT, None), ("inv", TP.FLOAT, None)],
               inits=[("w", w), ("b", bias)], opset=17)
    for a, b in zip(_ours(m, {"x": x}), _ort(m, {"x": x})):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_selu_with_any_constants():
    x = RNG.standard_normal((3, 4)).astype(np.float32) * 3
    m = _model([N("Selu", ["x"], ["y"], alpha=2.5, gamma=0.75)], [("x", TP.FLOAT, x.shape)], [("y", TP.FLOAT, None)])
    _agree(m, {"x": x})


def test_cast_like_computed_and_constant_operands():
    x = (RNG.standard_normal((5,)) * 10).astype(np.float32)
    m = _model([N("CastLike", ["x", "t"], ["y"]), N("CastLike", ["c", "x"], ["k"]), N("Add", ["x", "k"], ["z"])],
               [("x", TP.FLOAT, x.shape)], [("y", TP.INT64, None), ("z", TP.FLOAT, None)],
               inits=[("t", np.array([1], np.int64)), ("c", np.array(3, np.int64))])
    _agree(m, {"x": x}, exact=True)
    m = _model([N("CastLike", ["x", "t"], ["y"])], [("x", TP.FLOAT, [5])], [("y", TP.FLOAT16, None)],
               inits=[("t", np.array([1], np.float16))])
    assert _ours(m, {"x": x})[0].tolist() == x.astype(np.float16).astype(np.float32).tolist()


def _reference(m, feeds):
    from onnx.reference import ReferenceEvaluator
    return ReferenceEvaluator(m).run(None, feeds)


@pytest.mark.parametrize("interleaved,rot", [(0, 0), (1, 0), (0, 4), (1, 4)])
def test_rotary_embedding_against_onnx_reference(interleaved, rot):
    x = RNG.standard_normal((2, 3, 5, 8)).astype(np.float32)  # [B, H, S, D]
    half = (rot or 8) // 2
    cos, sin = RNG.standard_normal((7, half)).astype(np.float32), RNG.standard_normal((7, half)).astype(np.float32)
    pos = np.array([[0, 1, 2, 3, 4], [6, 5, 4, 3, 2]], np.int64)
    m = _model([N("RotaryEmbedding", ["x", "c", "s", "p"], ["y"], interleaved=interleaved,
                  rotary_embedding_dim=rot)],
               [("x", TP.FLOAT, x.shape), ("c", TP.FLOAT, cos.shape), ("s", TP.FLOAT, sin.shape),
                ("p", TP.INT64, pos.shape)], [("y", TP.FLOAT, None)], opset=23)
    feeds = {"x": x, "c": cos, "s": sin, "p": pos}
    np.testing.assert_allclose(_ours(m, feeds)[0], _reference(m, feeds)[0], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("causal,mask,softcap,mode", [(1, None, 0.0, 0), (0, "bool", 2.0, 2), (1, "float", 0.0, 3),
                                                      (0, None, 0.0, 1)])
def test_attention_gqa_with_past_against_onnx_reference(causal, mask, softcap, mode):
    q = RNG.standard_normal((2, 4, 3, 8)).astype(np.float32)
    k, v = RNG.standard_normal((2, 2, 3, 8)).astype(np.float32), RNG.standard_normal((2, 2, 3, 6)).astype(np.float32)
    pk, pv = RNG.standard_normal((2, 2, 2, 8)).astype(np.float32), RNG.standard_normal((2, 2, 2, 6)).astype(np.float32)
    feeds = {"q": q, "k": k, "v": v, "pk": pk, "pv": pv}
    ins = [("q", TP.FLOAT, q.shape), ("k", TP.FLOAT, k.shape), ("v", TP.FLOAT, v.shape)]
    names = ["q", "k", "v", ""]
    if mask == "bool":
        feeds["m"] = RNG.random((3, 4)) < 0.7  # shorter than kv: padded with False
        feeds["m"][1] = False  # a fully masked row
        ins.append(("m", TP.BOOL, (3, 4)))
        names[3] = "m"
    elif mask == "float":
        feeds["m"] = RNG.standard_normal((2, 1, 3, 5)).astype(np.float32)
        ins.append(("m", TP.FLOAT, (2, 1, 3, 5)))
        names[3] = "m"
    ins += [("pk", TP.FLOAT, pk.shape), ("pv", TP.FLOAT, pv.shape)]
    attrs = {"is_causal": causal, "qk_matmul_output_mode": mode, **({"softcap": softcap} if softcap else {})}
    m = _model([N("Attention", names + ["pk", "pv"], ["y", "pres_k", "pres_v", "qk"], **attrs)], ins,
               [(n, TP.FLOAT, None) for n in ("y", "pres_k", "pres_v", "qk")], opset=23)
    for a, b in zip(_ours(m, feeds), _reference(m, feeds)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_attention_refuses_a_softmax_precision_it_cannot_honour():
    m = _model([N("Attention", ["q", "k", "v"], ["y"], softmax_precision=TP.DOUBLE)],
               [(n, TP.FLOAT, (1, 1, 2, 4)) for n in "qkv"], [("y", TP.FLOAT, None)], opset=23)
    with pytest.raises(UnsupportedError, match="softmax_precision=11"):
        tlb.import_onnx(m)


_INT_OPS = [("Add", {}), ("Sub", {}), ("Mul", {}), ("Div", {}), ("Max", {}), ("Min", {}), ("Mod", {"fmod": 0}),
            ("Mod", {"fmod": 1})]


@pytest.mark.parametrize("op,attrs", _INT_OPS)
@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.uint16, np.int64])
def test_integer_arithmetic_is_exact_in_the_models_type(op, attrs, dtype):
    info = np.iinfo(dtype)
    a = RNG.integers(max(info.min, -9) if op != "Sub" else 0, 10, (3, 4)).astype(dtype)
    b = RNG.integers(1, 5, (4,)).astype(dtype)
    if op == "Sub":
        a = a + b.max()
    t = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    m = _model([N(op, ["a", "b"], ["y"], **attrs)], [("a", t, a.shape), ("b", t, b.shape)], [("y", t, None)],
               opset=18)
    (want,) = _reference(m, {"a": a, "b": b})
    (got,) = _ours(m, {"a": a, "b": b})
    assert got.dtype == np.int64 and np.array_equal(got, want.astype(np.int64))


def test_integer_results_outside_the_type_are_refused_never_wrapped():
    m = _model([N("Add", ["a", "b"], ["y"])], [("a", TP.INT8, [2]), ("b", TP.INT8, [2])], [("y", TP.INT8, None)])
    b = tlb.import_onnx(m)
    assert tlb.evaluate(b.graph, b.payload, [np.array([1, 2], np.int8), np.array([3, 4], np.int8)])[0].tolist() == [4, 6]
    with pytest.raises(tlb.BridgeError, match=r"result 200 is outside int8 \(ONNX would wrap it\)"):
        tlb.evaluate(b.graph, b.payload, [np.array([100, 2], np.int8), np.array([100, 4], np.int8)])
    m = _model([N("Mul", ["a", "b"], ["y"])], [("a", TP.INT64, [1]), ("b", TP.INT64, [1])], [("y", TP.INT64, None)])
    b = tlb.import_onnx(m)
    with pytest.raises(tlb.BridgeError, match="beyond int64"):
        tlb.evaluate(b.graph, b.payload, [np.array([2 ** 40]), np.array([2 ** 40])])
    m = _model([N("Div", ["a", "b"], ["y"])], [("a", TP.INT32, [1]), ("b", TP.INT32, [1])], [("y", TP.INT32, None)])
    b = tlb.import_onnx(m)
    with pytest.raises(tlb.BridgeError, match="integer division by zero"):
        tlb.evaluate(b.graph, b.payload, [np.array([3], np.int32), np.array([0], np.int32)])


@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
@pytest.mark.parametrize("dtype", [np.uint8, np.uint32, np.int8, np.int64])
def test_bitshift_matches_onnx_reference_including_out_of_range_shifts(direction, dtype):
    info = np.iinfo(dtype)
    x = RNG.integers(info.min, min(info.max, 2 ** 62), (12,), endpoint=False).astype(dtype)
    s = np.array([0, 1, 3, 7, 8, 9, 31, 33, 63, 64, -1, 2])
    if np.dtype(dtype).kind == "u":
        s = np.abs(s)
    t = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    m = _model([N("BitShift", ["x", "s"], ["y"], direction=direction)], [("x", t, x.shape), ("s", t, s.shape)],
               [("y", t, None)], opset=28)
    feeds = {"x": x, "s": s.astype(dtype)}
    (want,) = _reference(m, feeds)
    assert np.array_equal(_ours(m, feeds)[0], want.astype(np.int64))


@pytest.mark.parametrize("op", ["BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot"])
@pytest.mark.parametrize("dtype", [np.uint8, np.int16])
def test_bitwise_ops(op, dtype):
    info = np.iinfo(dtype)
    a, b = (RNG.integers(info.min, info.max, (6,), endpoint=True).astype(dtype) for _ in range(2))
    t = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    names = ["a"] if op == "BitwiseNot" else ["a", "b"]
    m = _model([N(op, names, ["y"])], [(n, t, (6,)) for n in names], [("y", t, None)])
    feeds = {"a": a, "b": b} if op != "BitwiseNot" else {"a": a}
    (want,) = _reference(m, feeds)
    assert np.array_equal(_ours(m, feeds)[0], want.astype(np.int64))


def test_float_mod_and_xor():
    a = RNG.standard_normal(8).astype(np.float32) * 5
    b = RNG.standard_normal(8).astype(np.float32)
    m = _model([N("Mod", ["a", "b"], ["y"], fmod=1)], [("a", TP.FLOAT, [8]), ("b", TP.FLOAT, [8])],
               [("y", TP.FLOAT, None)])
    _agree(m, {"a": a, "b": b})
    m = _model([N("Mod", ["a", "b"], ["y"], fmod=0)], [("a", TP.FLOAT, [8]), ("b", TP.FLOAT, [8])],
               [("y", TP.FLOAT, None)], opset=13)
    with pytest.raises(UnsupportedError, match="fmod=0 with float operands"):
        tlb.import_onnx(m)
    x, y = RNG.random(6) < 0.5, RNG.random(6) < 0.5
    m = _model([N("Xor", ["x", "y"], ["z"])], [("x", TP.BOOL, [6]), ("y", TP.BOOL, [6])], [("z", TP.BOOL, None)])
    _agree(m, {"x": x, "y": y}, exact=True)


def test_integer_ops_export_to_onnx_and_refuse_interval_bounds():
    m = _model([N("Add", ["a", "b"], ["s"]), N("Mod", ["s", "b"], ["y"])], [("a", TP.INT64, [4]), ("b", TP.INT64, [4])],
               [("y", TP.INT64, None)])
    bundle = tlb.import_onnx(m)
    feeds = {"a": np.array([5, -7, 9, 2]), "b": np.array([3, 3, -4, 5])}
    exported = tlb.export_onnx(bundle)
    got = ort.InferenceSession(exported.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    assert np.array_equal(got, _ort(m, feeds)[0])
    with pytest.raises(tlb.BridgeError, match="no interval rule for int_add"):
        tlb.interval_bounds(bundle.graph, bundle.payload, [feeds["a"], feeds["b"]], [feeds["a"], feeds["b"]])


def test_every_integer_kind_refuses_interval_bounds_by_name():
    from semantics.rules.integer import INTERVAL_REFUSALS
    from torchlean_bridge.graph import Graph, Node
    for kind in sorted(INTERVAL_REFUSALS):
        arity = 1 if kind == "bitwise_not" else 2
        dtype = "float" if kind == "mod" else "int64"
        attrs = {"left": True} if kind == "bitshift" else {}
        nodes = [Node(i, (), "input", (3,), {}, dtype=dtype) for i in range(arity)]
        nodes.append(Node(arity, tuple(range(arity)), kind, (3,), attrs, dtype=dtype))
        g = Graph(nodes, list(range(arity)), [arity])
        x = [np.zeros(3, np.int64 if dtype == "int64" else np.float64)] * arity
        with pytest.raises(tlb.BridgeError, match=f"no interval rule for {kind}: "):
            tlb.interval_bounds(g, None, x, x)


@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
def test_unsigned_bitshift_exports_to_onnxruntime(direction):
    x = np.array([1, 200, 255, 7, 128, 3], np.uint8)
    s = np.array([0, 1, 7, 8, 9, 3], np.uint8)
    m = _model([N("BitShift", ["x", "s"], ["y"], direction=direction)], [("x", TP.UINT8, [6]), ("s", TP.UINT8, [6])],
               [("y", TP.UINT8, None)], opset=18)
    exported = tlb.export_onnx(tlb.import_onnx(m))
    feeds = {exported.graph.input[0].name: x.astype(np.int64), exported.graph.input[1].name: s.astype(np.int64)}
    got = ort.InferenceSession(exported.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    assert np.array_equal(got, _reference(m, {"x": x, "s": s})[0].astype(np.int64))


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("op", ["NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"])
def test_losses_with_weights_and_ignore_index_match_onnxruntime(op, weighted, reduction):
    x = RNG.standard_normal((3, 5, 2)).astype(np.float32)
    t = np.array([[0, 4], [2, 2], [1, 3]], np.int64)
    ins = [("x", TP.FLOAT, x.shape), ("t", TP.INT64, t.shape)]
    inits = [("w", RNG.random(5).astype(np.float32))] if weighted else []
    names = ["x", "t"] + (["w"] if weighted else [])
    m = _model([N(op, names, ["y"], reduction=reduction, ignore_index=2)], ins, [("y", TP.FLOAT, None)],
               inits=inits, opset=13)
    for a, b in zip(_ours(m, {"x": x, "t": t}), _ort(m, {"x": x, "t": t})):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_loss_target_out_of_range_is_an_error_not_a_clipped_read():
    m = _model([N("NegativeLogLikelihoodLoss", ["x", "t"], ["y"])], [("x", TP.FLOAT, (2, 3)), ("t", TP.INT64, (2,))],
               [("y", TP.FLOAT, None)], opset=13)
    b = tlb.import_onnx(m)
    with pytest.raises(tlb.BridgeError, match="out of range"):
        tlb.evaluate(b.graph, b.payload, [np.zeros((2, 3), np.float32), np.array([0, 3])])


@pytest.mark.parametrize("eq", ["i,i", "ij,jk", "ba", "ij,kj"])
def test_einsum_implicit_output_is_the_letters_seen_once_in_order(eq):
    terms = eq.split(",")
    dims = {"i": 3, "j": 4, "k": 2, "a": 2, "b": 5}
    xs = [RNG.standard_normal([dims[c] for c in t]).astype(np.float32) for t in terms]
    names = [f"x{i}" for i in range(len(xs))]
    m = _model([N("Einsum", names, ["y"], equation=eq)], [(n, TP.FLOAT, x.shape) for n, x in zip(names, xs)],
               [("y", TP.FLOAT, None)], opset=12)
    np.testing.assert_allclose(_ours(m, dict(zip(names, xs)))[0], np.einsum(eq, *xs), rtol=1e-5, atol=1e-6)
