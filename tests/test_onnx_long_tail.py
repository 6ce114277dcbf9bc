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


# -- 5: NaN is an answer

def _same_with_nan(a, b):
    assert a.shape == b.shape
    np.testing.assert_array_equal(np.isnan(a), np.isnan(b))
    np.testing.assert_allclose(np.nan_to_num(a), np.nan_to_num(b).astype(np.float64), rtol=2e-6)


@pytest.mark.parametrize("exponent", [0.5, -1.5, 2.25, 1 / 3])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_pow_of_a_negative_base_by_a_constant_non_integer_exponent_is_nan(exponent, dtype):
    tp = TP.FLOAT if dtype == np.float32 else TP.DOUBLE
    m = onnx_model([N("Pow", ["x", "e"], ["y"])], [("x", tp, [3, 4])], [("y", tp, [3, 4])],
                   [("e", np.array(exponent, dtype))], opset=15, ir_version=8)
    x = (RNG.standard_normal((3, 4)) * 3).astype(dtype)
    x[0, 0] = 0.0 if exponent > 0 else 1.0
    (ours,) = evaluate_onnx(m, {"x": x})
    assert np.isnan(ours).any() and not np.isnan(ours).all()
    _same_with_nan(ours, _ort(m, {"x": x})[0])
    _same_with_nan(ours, _ref(m, {"x": x})[0])


def test_pow_with_a_computed_exponent_gives_nan_where_the_base_is_negative():
    m = onnx_model([N("Pow", ["x", "e"], ["y"])], [("x", TP.FLOAT, [2, 5]), ("e", TP.FLOAT, [5])],
                   [("y", TP.FLOAT, [2, 5])], opset=15, ir_version=8)
    feeds = {"x": RNG.standard_normal((2, 5)).astype(np.float32),
             "e": np.array([0.5, 2.0, -1.5, 3.0, 0.7], np.float32)}
    (ours,) = evaluate_onnx(m, feeds)
    assert np.isnan(ours).any()
    _same_with_nan(ours, _ort(m, feeds)[0])


def test_pow_interval_refuses_boxes_reaching_below_zero_and_stays_sound_above():
    m = onnx_model([N("Pow", ["x", "e"], ["y"])], [("x", TP.DOUBLE, [4])], [("y", TP.DOUBLE, [4])],
                   [("e", np.array(0.5))], opset=15, ir_version=8)
    b = tlb.import_onnx(m)
    with pytest.raises(BridgeError, match=r"pow: box reaches below 0 and the exponent 0.5 is not an integer"):
        tlb.interval_bounds(b.graph, b.payload, [np.array([-0.1, 0.0, 1.0, 2.0])], [np.array([1.0, 1.0, 2.0, 3.0])])
    lo, hi = np.array([0.0, 0.1, 1.0, 2.0]), np.array([1.0, 1.0, 2.0, 3.0])
    tlb.check_containment(b.graph, b.payload, [lo], [hi], samples=50, seed=0)


# -- 1: integer arithmetic on the data path

_INT_TP = {np.int8: TP.INT8, np.int32: TP.INT32, np.int64: TP.INT64, np.uint8: TP.UINT8}


def _reduce_model(op, dtype, axes, keepdims, opset):
    tp = _INT_TP[dtype]
    axes_input = opset >= (13 if op == "ReduceSum" else 18)
    if axes is None:
        node = N(op, ["x"], ["y"], keepdims=keepdims)
        inits = []
    elif axes_input:
        node, inits = N(op, ["x", "axes"], ["y"], keepdims=keepdims), [("axes", np.array(axes, np.int64))]
    else:
        node, inits = N(op, ["x"], ["y"], keepdims=keepdims, axes=axes), []
    return onnx_model([node], [("x", tp, [2, 3, 4])], [("y", tp, None)], inits, opset=opset, ir_version=8)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceProd", "ReduceMax", "ReduceMin", "ReduceL1", "ReduceSumSquare"])
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.int8, np.uint8])
@pytest.mark.parametrize("axes,keepdims,opset", [([1], 0, 18), ([0, -1], 1, 18), (None, 0, 18), ([2], 1, 13)])
def test_integer_reductions_are_exact_in_the_models_type(op, dtype, axes, keepdims, opset):
    m = _reduce_model(op, dtype, axes, keepdims, opset)
    lo = 0 if dtype == np.uint8 else -2
    x = RNG.integers(lo, 3, (2, 3, 4)).astype(dtype)  # every sum of squares of 24 values fits int8
    if op == "ReduceProd":  # products of +-1 and one 2
        x = np.where(x % 2 == 0, 1, -1 if lo else 1).astype(dtype)
        x[0, 0, 0] = 2
    b = tlb.import_onnx(m)
    assert any(n.kind.startswith("int_reduce_") for n in b.graph.nodes)
    (ours,) = evaluate_onnx(m, {"x": x})
    (ref,) = _ref(m, {"x": x})
    assert ours.shape == ref.shape and np.array_equal(ours, ref.astype(np.int64))
    try:
        (theirs,) = _ort(m, {"x": x})
    except Exception:  # noqa: BLE001 - onnxruntime has no kernel for some (op, type) pairs
        return
    assert np.array_equal(ours, theirs.astype(np.int64))


def test_integer_reductions_of_a_computed_index_tensor_match_onnxruntime():
    """Index arithmetic as exporters write it: Shape -> Mul -> ReduceProd / ReduceSum -> Div, all int64."""
    nodes = [N("Shape", ["x"], ["s"]), N("Mul", ["s", "two"], ["s2"]), N("ReduceProd", ["s2"], ["p"], keepdims=0),
             N("ReduceSum", ["i"], ["t"], keepdims=1), N("Div", ["t", "p"], ["q"]), N("Mod", ["t", "three"], ["r"]),
             N("Less", ["i", "q"], ["lt"]), N("Where", ["lt", "i", "r"], ["y"])]
    m = onnx_model(nodes, [("x", TP.FLOAT, [2, 3]), ("i", TP.INT64, [5])], [("y", TP.INT64, [5])],
                   [("two", np.array(2, np.int64)), ("three", np.array(3, np.int64))], opset=18, ir_version=8)
    feeds = {"x": np.zeros((2, 3), np.float32), "i": np.array([40, -7, 13, 2, 9], np.int64)}
    (ours,) = evaluate_onnx(m, feeds)
    assert np.array_equal(ours, _ort(m, feeds)[0])


def test_integer_reductions_refuse_results_outside_the_type_and_empty_sets_are_the_identity():
    m = _reduce_model("ReduceSum", np.int8, [1], 0, 18)
    x = np.full((2, 3, 4), 100, np.int8)
    with pytest.raises(BridgeError, match=r"int_reduce_sum: result 300 is outside int8 \(ONNX would wrap it\)"):
        evaluate_onnx(m, {"x": x})
    m = _reduce_model("ReduceProd", np.int64, None, 0, 18)
    with pytest.raises(BridgeError, match="int_reduce_prod: a product may leave int64"):
        evaluate_onnx(m, {"x": np.full((2, 3, 4), 7, np.int64)})
    for op in ("ReduceSum", "ReduceProd", "ReduceMax", "ReduceMin"):
        m = onnx_model([N(op, ["x", "axes"], ["y"], keepdims=0)], [("x", TP.INT32, [2, 0])], [("y", TP.INT32, None)],
                       [("axes", np.array([1], np.int64))], opset=18, ir_version=8)
        (ours,) = evaluate_onnx(m, {"x": np.zeros((2, 0), np.int32)})
        assert np.array_equal(ours, _ref(m, {"x": np.zeros((2, 0), np.int32)})[0].astype(np.int64))


def test_every_integer_reduction_refuses_interval_bounds_by_name():
    from semantics.rules.integer import INT_REDUCTIONS
    from torchlean_bridge.graph import Graph, Node
    x = np.zeros((2, 3), np.int64)
    for kind in INT_REDUCTIONS:
        g = Graph([Node(0, (), "input", (2, 3), {}, dtype="int64"),
                   Node(1, (0,), kind, (2,), {"axes": (1,), "keepdim": False}, dtype="int64")], [0], [1])
        assert np.array_equal(tlb.evaluate(g, None, [x + 1])[0], [3 if kind == "int_reduce_sum" else 1] * 2)
        with pytest.raises(BridgeError, match=f"no interval rule for {kind}: integer arithmetic"):
            tlb.interval_bounds(g, None, [x], [x])


@pytest.mark.parametrize("op,arity", [("Neg", 1), ("Abs", 1), ("Max", 3)])
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.int8])
def test_integer_neg_abs_and_max_match_onnxruntime(op, arity, dtype):
    names = [f"x{i}" for i in range(arity)]
    tp = _INT_TP[dtype]
    m = onnx_model([N(op, names, ["y"])], [(n, tp, [3, 4]) for n in names], [("y", tp, [3, 4])], opset=13,
                   ir_version=8)
    feeds = {n: RNG.integers(-40, 40, (3, 4)).astype(dtype) for n in names}
    (ours,) = evaluate_onnx(m, feeds)
    assert np.array_equal(ours, _ort(m, feeds)[0].astype(np.int64))


def test_integer_neg_of_the_least_value_is_refused_not_wrapped():
    m = onnx_model([N("Neg", ["x"], ["y"])], [("x", TP.INT8, [2])], [("y", TP.INT8, [2])], opset=13, ir_version=8)
    with pytest.raises(BridgeError, match=r"result 128 is outside int8"):
        evaluate_onnx(m, {"x": np.array([-128, 3], np.int8)})


# -- 2: slices whose start comes from an input

def _patch_model(k=(3, 2), axes=(2, 3), start_type=TP.INT64, ends=None):
    """x[..., r:r+k0, c:c+k1] with the start vector a graph input, ends = starts + k (as exporters write it)."""
    nodes = [N("Add", ["s", "k"], ["e"]) if ends is None else ends,
             N("Slice", ["x", "s", "e", "axes"], ["y"]), N("Mul", ["y", "two"], ["z"])]
    dt = np.int64 if start_type == TP.INT64 else np.int32
    return onnx_model(nodes, [("x", TP.FLOAT, [1, 2, 6, 5]), ("s", start_type, [len(axes)])],
                      [("z", TP.FLOAT, [1, 2] + [None] * 2)],
                      [("k", np.array(k, dt)), ("axes", np.array(axes, dt)), ("two", np.array(2.0, np.float32))],
                      opset=18, ir_version=8)


@pytest.mark.parametrize("start_type", [TP.INT64, TP.INT32])
def test_slice_at_a_computed_start_matches_onnxruntime_and_the_reference_at_every_feasible_start(start_type):
    m = _patch_model(start_type=start_type)
    b = tlb.import_onnx(m)
    assert [n.attrs["sizes"] for n in b.graph.nodes if n.kind == "dynamic_slice"] == [(3, 2)]
    x = RNG.standard_normal((1, 2, 6, 5)).astype(np.float32)
    dt = np.int64 if start_type == TP.INT64 else np.int32
    starts = [(r, c) for r in list(range(0, 4)) + list(range(-6, -3)) for c in list(range(0, 4)) + [-5, -4, -3]]
    for r, c in starts:
        feeds = {"x": x, "s": np.array([r, c], dt)}
        (ours,) = evaluate_onnx(m, feeds)
        assert np.array_equal(ours, _ort(m, feeds)[0]) and np.array_equal(ours, _ref(m, feeds)[0])


@pytest.mark.slow
def test_torch_exported_patch_slice_imports_and_matches_onnxruntime(tmp_path):
    torch = pytest.importorskip("torch")

    class Patch(torch.nn.Module):
        def forward(self, x, r, c):
            return torch.tanh(x[:, :, r:r + 3, c:c + 2])

    path = tmp_path / "patch.onnx"
    torch.onnx.export(Patch(), (torch.randn(1, 2, 6, 5), torch.tensor(1), torch.tensor(2)), str(path),
                      dynamo=False, opset_version=17)
    m = onnx.load(str(path))
    names = [i.name for i in m.graph.input]
    x = RNG.standard_normal((1, 2, 6, 5)).astype(np.float32)
    for r, c in [(0, 0), (3, 3), (2, 1), (-6, -5)]:
        feeds = dict(zip(names, [x, np.array(r), np.array(c)]))
        (ours,) = evaluate_onnx(m, feeds)
        np.testing.assert_allclose(ours, _ort(m, feeds)[0], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("add_first", [False, True])
def test_slice_starts_picked_from_a_location_vector_as_torch_dynamo_writes_them(add_first):
    """starts = Reshape(Gather(Reshape(Gather(rc, i)), 0)), ends the same of rc[i] + k (torch.onnx dynamo=True), or
    the Add before the Gather."""
    nodes = []
    for axis, (i, k) in enumerate([(0, 3), (1, 2)]):
        t = f"_{axis}"
        nodes += [N("Gather", ["rc", f"i{i}"], ["g" + t], axis=0)]
        if add_first:
            nodes += [N("Add", ["rc", "k"], ["a" + t]), N("Gather", ["a" + t, f"i{i}"], ["ga" + t], axis=0)]
        else:
            nodes += [N("Add", ["g" + t, f"k{i}"], ["ga" + t])]
        for name in ("g", "ga"):
            nodes += [N("Reshape", [name + t, "one"], [name + "r" + t]),
                      N("Gather", [name + "r" + t, "i0"], [name + "s" + t], axis=0),
                      N("Reshape", [name + "s" + t, "one"], [name + "v" + t])]
        src = "x" if axis == 0 else "y0"
        nodes += [N("Slice", [src, "gv" + t, "gav" + t, f"ax{axis}", "one"], [f"y{axis}"])]
    m = onnx_model(nodes, [("x", TP.FLOAT, [1, 2, 6, 5]), ("rc", TP.INT64, [2])], [("y1", TP.FLOAT, None)],
                   [("i0", np.array(0)), ("i1", np.array(1)), ("k0", np.array(3)), ("k1", np.array(2)),
                    ("k", np.array([3, 2])), ("one", np.array([1])), ("ax0", np.array([2])), ("ax1", np.array([3]))],
                   opset=18, ir_version=8)
    assert sum(n.kind == "dynamic_slice" for n in tlb.import_onnx(m).graph.nodes) == 2
    x = RNG.standard_normal((1, 2, 6, 5)).astype(np.float32)
    for rc in [(1, 2), (3, 3), (0, 0), (-6, -5)]:
        feeds = {"x": x, "rc": np.array(rc)}
        assert np.array_equal(evaluate_onnx(m, feeds)[0], _ort(m, feeds)[0])


@pytest.mark.parametrize("static", [(0, 2 ** 63 - 1), (-2, 2 ** 63 - 1), (1, -1)])
def test_slice_mixing_constant_and_computed_entries(static):
    """starts = [c0, r], ends = [c1, r + 3] on axes [1, 2]: a static slice of axis 1, a dynamic one of axis 2."""
    nodes = [N("Unsqueeze", ["r", "zero"], ["ru"]), N("Add", ["r", "three"], ["e"]),
             N("Unsqueeze", ["e", "zero"], ["eu"]),
             N("Concat", ["c0", "ru"], ["starts"], axis=0), N("Concat", ["c1", "eu"], ["ends"], axis=0),
             N("Slice", ["x", "starts", "ends", "axes"], ["y"])]
    m = onnx_model(nodes, [("x", TP.FLOAT, [2, 4, 6]), ("r", TP.INT64, [])], [("y", TP.FLOAT, None)],
                   [("zero", np.array([0])), ("three", np.array(3)), ("c0", np.array([static[0]])),
                    ("c1", np.array([static[1]])), ("axes", np.array([1, 2]))], opset=18, ir_version=8)
    assert [n.kind for n in tlb.import_onnx(m).graph.nodes].count("dynamic_slice") == 1
    x = RNG.standard_normal((2, 4, 6)).astype(np.float32)
    for r in (0, 2, 3, -6, -4):
        feeds = {"x": x, "r": np.array(r)}
        assert np.array_equal(evaluate_onnx(m, feeds)[0], _ort(m, feeds)[0])


def test_slice_at_a_computed_start_refuses_a_window_onnx_would_shorten():
    m = _patch_model()
    x = np.zeros((1, 2, 6, 5), np.float32)
    for r, c, read in [(4, 0, 2), (0, 4, 1), (-2, 0, 0), (-7, 0, 2)]:
        start, axis, extent = (r, 2, 6) if c == 0 else (c, 3, 5)
        with pytest.raises(BridgeError, match=rf"dynamic_slice: start {start} on axis {axis} \(extent {extent}\): "
                                              rf"ONNX's Slice would read {read} of"):
            evaluate_onnx(m, {"x": x, "s": np.array([r, c])})


@pytest.mark.parametrize("ends,message", [
    (N("Constant", [], ["e"], value=helper.make_tensor("e", TP.INT64, [2], [6, 5])),
     r"constant ends \(a data-dependent shape: the output's extent depends on the values of \['s'\]\); bind graph "
     r"inputs \['s'\]"),
    (N("Mul", ["s", "k"], ["e"]), r"the length ends - starts is not a constant the importer can prove "
                                  r"\(a data-dependent shape: .* \['s', 'e'\]\).*write the end as the start plus a "
                                  r"constant length"),
])
def test_slice_at_a_computed_start_without_a_provable_length_is_refused_by_name(ends, message):
    with pytest.raises(BridgeError, match=r"Slice \(node `[^`]*`, opset 18\): Slice with starts computed at run time"):
        tlb.import_onnx(_patch_model(ends=ends))
    with pytest.raises(BridgeError, match=message):
        tlb.import_onnx(_patch_model(ends=ends))


def test_dynamic_slice_interval_is_the_hull_over_feasible_offsets_and_refuses_unbounded_ones():
    """The start is a float input cast to int64 (integer inputs take point boxes only), so its box is a range."""
    m = _patch_model()
    m.graph.node.insert(0, N("Cast", ["sf"], ["s"], to=TP.INT64))
    m.graph.input[1].CopyFrom(helper.make_tensor_value_info("sf", TP.FLOAT, [2]))
    b = tlb.import_onnx(m)
    x_lo = RNG.standard_normal((1, 2, 6, 5))
    x_hi = x_lo + RNG.uniform(0, 0.5, (1, 2, 6, 5))
    s_lo, s_hi = np.array([1, 0]), np.array([3, 2])
    tlb.check_containment(b.graph, b.payload, [x_lo, s_lo], [x_hi, s_hi], samples=40, seed=0)
    boxes = tlb.interval_bounds(b.graph, b.payload, [x_lo, s_lo], [x_hi, s_hi])
    (node,) = [n for n in b.graph.nodes if n.kind == "dynamic_slice"]
    lo_in, hi_in = boxes[node.parents[0]]
    lo, hi = boxes[node.id]
    for got, end, pick in ((lo, lo_in, np.min), (hi, hi_in, np.max)):  # the hull, not a looser box
        windows = [end[:, :, r:r + 3, c:c + 2] for r in range(1, 4) for c in range(0, 3)]
        np.testing.assert_array_equal(got, pick(windows, axis=0))
    with pytest.raises(BridgeError, match=r"dynamic_slice: the start box \[2.0, 4.0\] on axis 2 reaches outside "
                                          r"\[0, 3\]"):
        tlb.interval_bounds(b.graph, b.payload, [x_lo, np.array([2, 0])], [x_hi, np.array([4, 0])])


# -- 4: legacy semantics (pre-opset-7 broadcast attributes)

def _legacy_model(nodes, inputs, outputs, inits, opset=6):
    """An IR-3 model as old exporters wrote it: initializers are also graph inputs."""
    m = onnx_model(nodes, inputs, outputs, inits, opset=opset, ir_version=3)
    for name, v in inits:
        v = np.asarray(v)
        m.graph.input.append(helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape))
    return m


@pytest.mark.parametrize("slope_shape", [(3,), (3, 1, 1), (1,), (5,)])
def test_opset6_prelu_per_channel_slope_matches_onnx_reference(slope_shape):
    x = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    w = RNG.standard_normal(slope_shape).astype(np.float32)
    m = _legacy_model([N("PRelu", ["x", "w"], ["y"])], [("x", TP.FLOAT, [2, 3, 4, 5])], [("y", TP.FLOAT, None)],
                      [("w", w)])
    (ours,) = evaluate_onnx(m, {"x": x})
    np.testing.assert_allclose(ours, _ref(m, {"x": x})[0], rtol=1e-6)  # float64 evaluation, binary32 reference
    if slope_shape == (3,):  # the per-channel reading, spelled out
        np.testing.assert_allclose(ours, np.where(x > 0, x, x * w[:, None, None]), rtol=1e-6)


def test_opset6_prelu_per_channel_slope_with_a_dynamic_batch():
    w = RNG.standard_normal(3).astype(np.float32)
    m = _legacy_model([N("PRelu", ["x", "w"], ["y"])], [("x", TP.FLOAT, ["N", 3, 4])], [("y", TP.FLOAT, None)],
                      [("w", w)])
    x = RNG.standard_normal((3, 3, 4)).astype(np.float32)
    (ours,) = evaluate_onnx(m, {"x": x}, input_shapes={"x": (3, 3, 4)})
    np.testing.assert_allclose(ours, np.where(x > 0, x, x * w[:, None]), rtol=1e-6)


def test_opset6_prelu_slope_matching_several_dimensions_is_refused_by_name():
    m = _legacy_model([N("PRelu", ["x", "w"], ["y"], name="act")], [("x", TP.FLOAT, [2, 3, 3, 5])],
                      [("y", TP.FLOAT, None)], [("w", np.ones(3, np.float32))])
    with pytest.raises(BridgeError, match=r"node \(`act`, PRelu, before opset 7\): slope of shape \[3\] matches 2 "
                                          r"dimensions"):
        tlb.import_onnx(m)


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Pow"])
@pytest.mark.parametrize("b_shape,axis", [((3, 4), 1), ((2,), 0), ((4, 5), 2), ((5,), None), ((1,), None),
                                          ((3,), -3)])
def test_pre_opset7_broadcast_axis_follows_the_spec(op, b_shape, axis):
    """B's dimensions align with A's from ``axis`` on (trailing when no axis), as Add-6's spec defines."""
    x = RNG.uniform(0.5, 2.0, (2, 3, 4, 5)).astype(np.float32)
    w = RNG.uniform(0.5, 2.0, b_shape).astype(np.float32)
    attrs = {"broadcast": 1} if axis is None else {"broadcast": 1, "axis": axis}
    m = _legacy_model([N(op, ["x", "w"], ["y"], **attrs)], [("x", TP.FLOAT, [2, 3, 4, 5])], [("y", TP.FLOAT, None)],
                      [("w", w)], opset=6 if op != "Pow" else 1)
    (ours,) = evaluate_onnx(m, {"x": x})
    start = 4 - len(b_shape) if axis is None else axis % 4
    aligned = w.reshape((1,) * start + b_shape + (1,) * (4 - start - len(b_shape)))
    want = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide, "Pow": np.power}[op](x, aligned)
    np.testing.assert_allclose(ours, want, rtol=1e-6)


@pytest.mark.parametrize("op", ["Equal", "Greater", "Less", "And", "Or", "Xor"])
def test_opset1_comparisons_and_logic_with_broadcast_axis(op):
    logic = op in ("And", "Or", "Xor")
    if logic:
        x, w, tp = RNG.random((2, 3, 4)) > 0.5, RNG.random(3) > 0.5, TP.BOOL
    else:
        x, w, tp = RNG.integers(0, 3, (2, 3, 4)), RNG.integers(0, 3, 3), TP.INT64
    m = _legacy_model([N(op, ["x", "w"], ["y"], broadcast=1, axis=1)], [("x", tp, [2, 3, 4])], [("y", TP.BOOL, None)],
                      [("w", w)], opset=6)
    (ours,) = evaluate_onnx(m, {"x": x})
    fn = {"Equal": np.equal, "Greater": np.greater, "Less": np.less, "And": np.logical_and, "Or": np.logical_or,
          "Xor": np.logical_xor}[op]
    assert np.array_equal(ours, fn(x, w[:, None]))


def test_legacy_broadcast_with_an_axis_past_a_is_refused_by_name():
    m = _legacy_model([N("Add", ["x", "w"], ["y"], broadcast=1, axis=3)], [("x", TP.FLOAT, [2, 3, 4, 5])],
                      [("y", TP.FLOAT, None)], [("w", np.ones((4, 5), np.float32))])
    with pytest.raises(BridgeError, match=r"Add, before opset 7\): axis 3 for B of shape \[4, 5\] on A of shape"):
        tlb.import_onnx(m)


@pytest.mark.parametrize("c_shape", [(4,), (1,), (2, 4)])
def test_opset6_gemm_broadcast_c_follows_its_definition(c_shape):
    a = RNG.standard_normal((2, 3)).astype(np.float32)
    inits = [("b", RNG.standard_normal((3, 4)).astype(np.float32)),
             ("c", RNG.standard_normal(c_shape).astype(np.float32))]
    m = _legacy_model([N("Gemm", ["a", "b", "c"], ["y"], broadcast=int(c_shape != (2, 4)), alpha=0.5, beta=2.0)],
                      [("a", TP.FLOAT, [2, 3])], [("y", TP.FLOAT, None)], inits)
    (ours,) = evaluate_onnx(m, {"a": a})
    want = 0.5 * a.astype(np.float64) @ inits[0][1] + 2.0 * inits[1][1]  # Gemm-6's definition
    np.testing.assert_allclose(ours, want, rtol=1e-6, atol=1e-7)
    if c_shape != (2, 4):  # onnx's reference Gemm-6 with broadcast=0 drops alpha and beta
        np.testing.assert_allclose(ours, _ref(m, {"a": a})[0], rtol=1e-5, atol=1e-6)


# -- 6: data-dependent shapes, said clearly

_X = ("x", TP.FLOAT, [2, 3])
_COUNT = [N("Cast", ["x"], ["xi"], to=TP.INT64), N("ReduceMax", ["xi"], ["k"], keepdims=0),
          N("Unsqueeze", ["k", "zero"], ["k1"])]  # a count computed from the input's values
_DD_CASES = {
    "NonZero": ([N("NonZero", ["x"], ["y"], name="nz")], "nz", "['x']", "fix the count"),
    "mask": ([N("Greater", ["x", "c"], ["m"]), N("NonZero", ["m"], ["i"], name="where_true"),
              N("Transpose", ["i"], ["it"]), N("GatherND", ["x", "it"], ["y"])],
             "where_true", "['m']", "fix the count"),
    "Compress": ([N("Greater", ["x", "c"], ["m"]), N("Compress", ["x", "m"], ["y"], name="masked")], "masked", "['m']",
                 "keep the shape"),
    "NMS": ([N("Concat", ["x", "x"], ["xx"], axis=1), N("Reshape", ["xx", "box"], ["b"]),
             N("Reshape", ["x", "sc"], ["s"]),
             N("NonMaxSuppression", ["b", "s", "kk"], ["y"], name="nms")], "nms", "['b', 's']", "fix the count"),
    "TopK": (_COUNT + [N("TopK", ["x", "k1"], ["y", "idx"], name="top")], "top", "['k1']", "give a constant K"),
    "Reshape": (_COUNT + [N("Concat", ["k1", "minus"], ["sh"], axis=0), N("Reshape", ["x", "sh"], ["y"], name="rs")],
                "rs", "['sh']", "make `shape` a constant"),
    "Range": (_COUNT[:2] + [N("Range", ["zero0", "k", "one"], ["y"], name="rg")], "rg", "['k']", "fix the length"),
}


@pytest.mark.parametrize("case", sorted(_DD_CASES))
def test_data_dependent_shapes_are_refused_naming_the_node_the_values_and_the_fix(case):
    nodes, node_name, names, fix = _DD_CASES[case]
    inits = [("c", np.zeros((2, 3), np.float32)), ("zero", np.array([0])), ("zero0", np.array(0)),
             ("one", np.array(1)), ("minus", np.array([-1])), ("box", np.array([1, 3, 4])), ("sc", np.array([1, 1, 6])),
             ("kk", np.array([2]))]
    used = {i for n in nodes for i in n.input}
    m = onnx_model(nodes, [_X], [("y", TP.FLOAT, None)], [t for t in inits if t[0] in used], opset=18, ir_version=8)
    with pytest.raises(BridgeError) as e:
        tlb.import_onnx(m)
    text = str(e.value)
    assert f"(node `{node_name}`, opset 18)" in text
    assert f"(a data-dependent shape: the output's extent depends on the values of {names})" in text
    assert fix in text and "export with static shapes" in text


# -- ONNX export of the new kinds (exporters/onnx.py: int_reduce_* as Reduce*, dynamic_slice as Slice with
#    ends = starts + sizes)

@pytest.mark.parametrize("op", ["ReduceSum", "ReduceProd", "ReduceMax", "ReduceMin", "ReduceL1", "ReduceSumSquare"])
def test_integer_reductions_export_to_onnxruntime(op):
    m = _reduce_model(op, np.int64, [0, 2], 1, 18)
    exported = tlb.export_onnx(tlb.import_onnx(m))
    x = RNG.integers(-3, 4, (2, 3, 4)).astype(np.int64)
    assert np.array_equal(_ort(exported, {exported.graph.input[0].name: x})[0], _ort(m, {"x": x})[0])


def test_dynamic_slice_exports_to_onnxruntime():
    m = _patch_model()
    b = tlb.import_onnx(m)
    exported = tlb.export_onnx(b)
    x = RNG.standard_normal((1, 2, 6, 5)).astype(np.float32)
    for start in [(0, 0), (3, 3), (-6, -5), (1, 2)]:
        feeds = {"x": x, "s": np.array(start)}
        ours = _ort(exported, {vi.name: feeds[n] for vi, n in zip(exported.graph.input, b.report["inputs"])})[0]
        assert np.array_equal(ours, _ort(m, feeds)[0])
