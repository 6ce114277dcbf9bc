"""Issue #15's spatial sampling ops (GridSample, AffineGrid, LpPool, Col2Im, CenterCropPad, DeformConv, RoiAlign)
on models of random shapes and attributes, against onnxruntime and onnx.reference.ReferenceEvaluator.

Tolerances: float32 evaluation, 2e-5 relative and absolute for interpolation and pooling (the taps' sums are
ordered differently), exact equality for CenterCropPad (data movement). Interval rules are checked for
soundness on sampled points and the box corners; what stays refused is checked by its message.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
from onnx import TensorProto as TP
from onnx import helper
from onnx.reference import ReferenceEvaluator

import torchlean_bridge as tlb
from torchlean_bridge.errors import BridgeError, ExportError, IntervalError
from tests.onnx_models import onnx_model

ort = pytest.importorskip("onnxruntime")
N = helper.make_node
RNG = np.random.default_rng(1515)
TOL = dict(rtol=2e-5, atol=2e-5)


_model = partial(onnx_model, opset=22)


def _ours(m, feeds):
    b = tlb.import_onnx(m)
    names = b.report["inputs"]
    return b, [np.asarray(v) for v in tlb.evaluate(b.graph, b.payload, [feeds[n] for n in names], dtype="float32")]


def _ort(m, feeds):
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def _reference(m, feeds):
    return ReferenceEvaluator(m).run(None, feeds)


def _check(m, feeds, peers=("ort", "ref"), exact=False):
    bundle, ours = _ours(m, feeds)
    for peer in peers:
        theirs = _ort(m, feeds) if peer == "ort" else _reference(m, feeds)
        for a, b in zip(ours, theirs):
            assert a.shape == b.shape, peer
            if exact:
                assert np.array_equal(a, b), peer
            else:
                np.testing.assert_allclose(a, b, err_msg=peer, **TOL)
    return bundle, ours


def _roundtrip(bundle, feeds, ours, peer="ort"):
    """Our export run by onnxruntime (or the reference) gives our values."""
    model = tlb.export_onnx(bundle)
    names = [i.name for i in model.graph.input]
    feeds = dict(zip(names, [feeds[n] for n in bundle.report["inputs"]]))
    got = _ort(model, feeds) if peer == "ort" else _reference(model, feeds)
    for a, b in zip(ours, got):
        np.testing.assert_allclose(a, b, **TOL)


def _sound(bundle, x, radius=0.05, samples=6, constant_inputs=()):
    """The interval box of the first input's box encloses the float64 values at corners and random points."""
    lo, hi = x - radius, x + radius
    lows = [lo] + [c for c in constant_inputs]
    highs = [hi] + [c for c in constant_inputs]
    boxes = tlb.interval_bounds(bundle.graph, bundle.payload, lows, highs)
    out = bundle.graph.outputs[0]
    blo, bhi = boxes[out]
    corners = [lo, hi] + [np.where(RNG.random(x.shape) < 0.5, lo, hi) for _ in range(2)]
    points = corners + [lo + (hi - lo) * RNG.random(x.shape) for _ in range(samples)]
    assert len(bundle.graph.inputs) == 1 + len(constant_inputs)
    for p in points:
        (y,) = tlb.evaluate(bundle.graph, bundle.payload, [p.astype(np.float64)] + [c for c in constant_inputs],
                            dtype="float64")
        assert np.all(blo <= y) and np.all(y <= bhi)


# -- GridSample ------------------------------------------------------------------------------------------------

GRID_CASES = [(mode, pad, ac) for mode in ("linear", "nearest", "cubic") for pad in ("zeros", "border", "reflection")
              for ac in (0, 1)]


def _grid_model(mode, pad, ac, xs, gs, opset=22):
    return _model([N("GridSample", ["x", "g"], ["y"], mode=mode, padding_mode=pad, align_corners=ac)],
                  [("x", TP.FLOAT, xs), ("g", TP.FLOAT, gs)], [("y", TP.FLOAT, None)], opset=opset)


@pytest.mark.parametrize("mode,pad,ac", GRID_CASES)
def test_grid_sample_2d_matches_onnxruntime_and_the_reference(mode, pad, ac):
    xs = (2, 3, int(RNG.integers(2, 6)), int(RNG.integers(2, 7)))  # (the reference divides by d - 1)
    gs = (2, int(RNG.integers(1, 5)), int(RNG.integers(1, 5)), 2)
    x = RNG.standard_normal(xs).astype(np.float32)
    g = (RNG.uniform(-1.6, 1.6, gs)).astype(np.float32)  # a third of the points outside the input
    g[0, 0, 0] = [-1.0, 1.0]  # the corners exactly
    m = _grid_model(mode, pad, ac, xs, gs)
    # onnxruntime's bicubic border/reflection fixes both coordinates when either lies outside (the spec and
    # the reference fix each axis on its own): the reference is the peer there
    peers = ("ort", "ref") if not (mode == "cubic" and pad != "zeros") else ("ref",)
    bundle, ours = _check(m, {"x": x, "g": g}, peers=peers)
    _roundtrip(bundle, {"x": x, "g": g}, ours, peer=peers[0])


@pytest.mark.parametrize("mode,pad,ac", [c for c in GRID_CASES if c[0] != "cubic"])
def test_grid_sample_3d_matches_onnxruntime_and_the_reference(mode, pad, ac):
    xs = (1, 2, 3, 4, 5)
    gs = (1, 2, 3, 2, 3)
    x = RNG.standard_normal(xs).astype(np.float32)
    g = RNG.uniform(-1.4, 1.4, gs).astype(np.float32)
    _check(_grid_model(mode, pad, ac, xs, gs), {"x": x, "g": g})


def test_grid_sample_16_spells_bilinear_and_bicubic():
    x = RNG.standard_normal((1, 2, 4, 4)).astype(np.float32)
    g = RNG.uniform(-1, 1, (1, 3, 3, 2)).astype(np.float32)
    for mode in ("bilinear", "bicubic", "nearest"):
        _check(_grid_model(mode, "zeros", 0, x.shape, g.shape, opset=16), {"x": x, "g": g}, peers=("ort",))


def test_grid_sample_refuses_a_nan_coordinate():
    x = np.ones((1, 1, 2, 2), np.float32)
    g = np.zeros((1, 1, 1, 2), np.float32)
    g[0, 0, 0, 0] = np.nan
    b = tlb.import_onnx(_grid_model("linear", "zeros", 0, x.shape, g.shape))
    with pytest.raises(BridgeError, match="grid_sample: the grid holds a NaN or infinite coordinate"):
        tlb.evaluate(b.graph, b.payload, [x, g])


# -- AffineGrid ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rank,ac", [(2, 0), (2, 1), (3, 0), (3, 1)])
def test_affine_grid_matches_onnxruntime_and_the_reference(rank, ac):
    size = [2, 3] + [int(v) for v in RNG.integers(1 + ac, 6, rank)]
    theta = RNG.standard_normal((2, rank, rank + 1)).astype(np.float32)
    m = _model([N("AffineGrid", ["t", "s"], ["y"], align_corners=ac)], [("t", TP.FLOAT, theta.shape)],
               [("y", TP.FLOAT, None)], inits=[("s", np.array(size, np.int64))], opset=20)
    _check(m, {"t": theta})


def test_affine_grid_refuses_align_corners_on_an_extent_of_one():
    m = _model([N("AffineGrid", ["t", "s"], ["y"], align_corners=1)], [("t", TP.FLOAT, (1, 2, 3))],
               [("y", TP.FLOAT, None)], inits=[("s", np.array([1, 1, 1, 4], np.int64))], opset=20)
    with pytest.raises(BridgeError, match=r"align_corners=1 with a spatial extent of 1 in size \[1, 1, 1, 4\]"):
        tlb.import_onnx(m)


def test_affine_grid_feeds_grid_sample_like_a_spatial_transformer():
    x = RNG.standard_normal((2, 3, 5, 6)).astype(np.float32)
    theta = (np.eye(2, 3) + 0.1 * RNG.standard_normal((2, 2, 3))).astype(np.float32)
    m = _model([N("AffineGrid", ["t", "s"], ["g"], align_corners=0),
                N("GridSample", ["x", "g"], ["y"], mode="linear", padding_mode="border")],
               [("x", TP.FLOAT, x.shape), ("t", TP.FLOAT, theta.shape)], [("y", TP.FLOAT, None)],
               inits=[("s", np.array([2, 3, 4, 4], np.int64))], opset=20)
    _check(m, {"x": x, "t": theta}, peers=("ort",))


# -- LpPool --------------------------------------------------------------------------------------------------

LP_CASES = [dict(kernel_shape=[3], p=2), dict(kernel_shape=[2, 3], p=1, strides=[2, 1], pads=[1, 0, 1, 2]),
            dict(kernel_shape=[2, 2], p=3, dilations=[2, 1]), dict(kernel_shape=[3, 2], p=2, auto_pad="SAME_UPPER"),
            dict(kernel_shape=[3, 3], p=4, auto_pad="SAME_LOWER", strides=[2, 2]),
            dict(kernel_shape=[2, 2], p=2, ceil_mode=1, strides=[2, 2]), dict(kernel_shape=[2, 2, 2], p=2)]


@pytest.mark.parametrize("attrs", LP_CASES)
def test_lp_pool_matches_onnxruntime(attrs):
    r = len(attrs["kernel_shape"])
    xs = (2, 3) + tuple(int(v) for v in RNG.integers(4, 8, r))
    x = RNG.standard_normal(xs).astype(np.float32)
    m = _model([N("LpPool", ["x"], ["y"], **attrs)], [("x", TP.FLOAT, xs)], [("y", TP.FLOAT, None)])
    # the ReferenceEvaluator's LpPool scales an average by the kernel size, which differs from the spec's sum
    # where padding is counted: it is a peer only without padding
    padded = attrs.get("pads") or attrs.get("auto_pad") or attrs.get("ceil_mode")
    bundle, ours = _check(m, {"x": x}, peers=("ort",) if padded else ("ort", "ref"))
    _roundtrip(bundle, {"x": x}, ours)
    _sound(bundle, x.astype(np.float64))


def test_lp_pool_with_a_non_integer_p_has_no_onnx_form():
    from dataclasses import replace

    from torchlean_bridge.graph import Graph
    b = tlb.import_onnx(_model([N("LpPool", ["x"], ["y"], kernel_shape=[2], p=2)], [("x", TP.FLOAT, (1, 1, 4))],
                               [("y", TP.FLOAT, None)]))
    nodes = [n.with_(attrs=dict(n.attrs, p=1.5)) if n.kind == "lp_pool_nd" else n for n in b.graph.nodes]
    changed = replace(b, graph=Graph(nodes, b.graph.inputs, b.graph.outputs))
    with pytest.raises(ExportError, match=r"lp_pool_nd: p=1.5 \(ONNX LpPool's p is an integer\)"):
        tlb.export_onnx(changed)


# -- Col2Im --------------------------------------------------------------------------------------------------

COL2IM_CASES = [dict(image=[5, 5], block=[2, 2]), dict(image=[6, 5], block=[3, 2], strides=[2, 1]),
                dict(image=[5, 6], block=[2, 2], dilations=[2, 1], pads=[1, 0, 0, 1]),
                dict(image=[3, 4, 3], block=[2, 1, 2], strides=[1, 2, 1])]


@pytest.mark.parametrize("case", COL2IM_CASES)
def test_col2im_matches_onnxruntime_and_the_reference(case):
    image, block = case["image"], case["block"]
    r = len(image)
    strides, dil = case.get("strides", [1] * r), case.get("dilations", [1] * r)
    pads = case.get("pads", [0] * (2 * r))
    blocks = [(n + pads[i] + pads[i + r] - d * (k - 1) - 1) // s + 1
              for i, (n, k, s, d) in enumerate(zip(image, block, strides, dil))]
    x = RNG.standard_normal((2, 3 * int(np.prod(block)), int(np.prod(blocks)))).astype(np.float32)
    attrs = {k: v for k, v in case.items() if k not in ("image", "block")}
    m = _model([N("Col2Im", ["x", "i", "b"], ["y"], **attrs)], [("x", TP.FLOAT, x.shape)], [("y", TP.FLOAT, None)],
               inits=[("i", np.array(image, np.int64)), ("b", np.array(block, np.int64))], opset=18)
    peers = ("ort", "ref") if r == 2 else ("ref",)
    bundle, ours = _check(m, {"x": x}, peers=peers)
    if r == 2:
        _roundtrip(bundle, {"x": x}, ours)
    _sound(bundle, x.astype(np.float64))


def test_col2im_refuses_a_block_count_that_does_not_match():
    m = _model([N("Col2Im", ["x", "i", "b"], ["y"])], [("x", TP.FLOAT, (1, 4, 5))], [("y", TP.FLOAT, None)],
               inits=[("i", np.array([3, 3], np.int64)), ("b", np.array([2, 2], np.int64))], opset=18)
    with pytest.raises(BridgeError, match=r"col2im: input \[1, 4, 5\] must be \[N, C \* 4, L\] with L the 2x2 "):
        tlb.import_onnx(m)


# -- CenterCropPad --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("axes", [None, [0, 2], [-1, -2]])
def test_center_crop_pad_is_data_movement(axes):
    xs = (5, 4, 7)
    x = RNG.standard_normal(xs).astype(np.float32)
    k = len(axes) if axes else 3
    shape = np.array([int(v) for v in RNG.integers(1, 10, k)], np.int64)
    kw = {} if axes is None else {"axes": axes}
    m = _model([N("CenterCropPad", ["x", "s"], ["y"], **kw)], [("x", TP.FLOAT, xs)], [("y", TP.FLOAT, None)],
               inits=[("s", shape)], opset=18)
    _check(m, {"x": x}, exact=True)


# -- DeformConv ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("group,offset_group,mask,bias", [(1, 1, False, False), (2, 1, True, True),
                                                          (1, 2, True, False), (2, 2, False, True)])
def test_deform_conv_matches_onnxruntime_and_the_reference(group, offset_group, mask, bias):
    n, c, h, w, oc, k = 2, 4, 5, 6, 4, (2, 3)
    stride, pads, dil = [1, 2], [1, 0, 0, 1], [1, 1]
    oh = (h + pads[0] + pads[2] - dil[0] * (k[0] - 1) - 1) // stride[0] + 1
    ow = (w + pads[1] + pads[3] - dil[1] * (k[1] - 1) - 1) // stride[1] + 1
    x = RNG.standard_normal((n, c, h, w)).astype(np.float32)
    wt = RNG.standard_normal((oc, c // group, *k)).astype(np.float32)
    off = (1.5 * RNG.standard_normal((n, offset_group * k[0] * k[1] * 2, oh, ow))).astype(np.float32)
    feeds = {"x": x, "off": off}
    ins, inputs = ["x", "w", "off"], [("x", TP.FLOAT, x.shape), ("off", TP.FLOAT, off.shape)]
    inits = [("w", wt)]
    if bias or mask:
        ins.append("b" if bias else "")
        if bias:
            inits.append(("b", RNG.standard_normal(oc).astype(np.float32)))
    if mask:
        mk = RNG.uniform(0, 1, (n, offset_group * k[0] * k[1], oh, ow)).astype(np.float32)
        ins.append("m")
        inputs.append(("m", TP.FLOAT, mk.shape))
        feeds["m"] = mk
    m = _model([N("DeformConv", ins, ["y"], group=group, offset_group=offset_group, strides=stride, pads=pads,
                  dilations=dil, kernel_shape=list(k))], inputs, [("y", TP.FLOAT, None)], inits=inits, opset=19)
    bundle, ours = _check(m, feeds, peers=("ort", "ref"))
    _roundtrip(bundle, feeds, ours)


def test_deform_conv_is_refused_in_interval_mode_by_name():
    m = _model([N("DeformConv", ["x", "w", "off"], ["y"], kernel_shape=[1, 1])],
               [("x", TP.FLOAT, (1, 1, 2, 2)), ("off", TP.FLOAT, (1, 2, 2, 2))], [("y", TP.FLOAT, None)],
               inits=[("w", np.ones((1, 1, 1, 1), np.float32))], opset=19)
    b = tlb.import_onnx(m)
    z = [np.zeros((1, 1, 2, 2)), np.zeros((1, 2, 2, 2))]
    with pytest.raises(IntervalError, match="no interval rule for deform_conv: its sampling positions are computed "
                                            "from the offset input"):
        tlb.interval_bounds(b.graph, b.payload, z, z)


# -- RoiAlign ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode,transform,ratio", [("avg", "half_pixel", 2), ("avg", "output_half_pixel", 0),
                                                  ("max", "half_pixel", 0), ("max", "output_half_pixel", 3)])
def test_roi_align_matches_the_reference_and_onnxruntime_16(mode, transform, ratio):
    x = RNG.standard_normal((2, 3, 7, 8)).astype(np.float32)
    starts = RNG.uniform(-1.5, 5, (5, 2))
    rois = np.concatenate([starts, starts + RNG.uniform(0.2, 6, (5, 2))], axis=1).astype(np.float32)
    batch = RNG.integers(0, 2, 5).astype(np.int64)
    feeds = {"x": x, "r": rois, "i": batch}
    inputs = [("x", TP.FLOAT, x.shape), ("r", TP.FLOAT, rois.shape), ("i", TP.INT64, batch.shape)]
    attrs = dict(mode=mode, output_height=3, output_width=4, sampling_ratio=ratio, spatial_scale=0.9,
                 coordinate_transformation_mode=transform)
    for opset, peers in ((22, ("ref",)), (16, ("ort",))):
        m = _model([N("RoiAlign", ["x", "r", "i"], ["y"], **attrs)], inputs, [("y", TP.FLOAT, None)], opset=opset)
        bundle, ours = _check(m, feeds, peers=peers)
    _roundtrip(bundle, feeds, ours)


def test_roi_align_refuses_a_batch_index_outside_the_input():
    m = _model([N("RoiAlign", ["x", "r", "i"], ["y"])], [("x", TP.FLOAT, (1, 1, 4, 4)), ("r", TP.FLOAT, (1, 4)),
                                                       ("i", TP.INT64, (1,))], [("y", TP.FLOAT, None)])
    b = tlb.import_onnx(m)
    with pytest.raises(BridgeError, match=r"roi_align: a batch index lies outside \[0, 1\)"):
        tlb.evaluate(b.graph, b.payload, [np.ones((1, 1, 4, 4), np.float32), np.ones((1, 4), np.float32),
                                          np.array([1], np.int64)])


def test_the_spatial_ops_block_v1_export_by_name():
    b = tlb.import_onnx(_grid_model("linear", "zeros", 0, (1, 1, 2, 2), (1, 1, 1, 2)))
    with pytest.raises(BridgeError, match="grid_sample"):
        tlb.export_torchlean(b, None)



# -- interval tightness ----------------------------------------------------------------------------------------


def _single_node_bundle(kind, attrs, in_shape):
    from importers.builder import GraphBuilder
    b = GraphBuilder("test")
    x = b.input(in_shape)
    return b.finish([b.add(kind, [x], attrs)], canonical=False)


def test_lp_pool_box_is_the_exact_range_up_to_rounding():
    attrs = {"spatial_rank": 2, "kernel": (2, 3), "stride": (1, 2), "padding": (1, 0), "padding_after": (0, 1),
             "dilation": (1, 1), "ceil_mode": False, "p": 3.0}
    bundle = _single_node_bundle("lp_pool_nd", attrs, (2, 3, 5, 6))
    x = RNG.standard_normal((2, 3, 5, 6))
    lo, hi = x - 0.3, x + 0.3
    blo, bhi = tlb.interval_bounds(bundle.graph, bundle.payload, lo, hi)[bundle.graph.outputs[0]]
    # |x| is smallest at the box's point nearest 0 and largest at its farthest end; the pool is monotone in |x|
    near = np.where((lo <= 0) & (hi >= 0), 0.0, np.minimum(np.abs(lo), np.abs(hi)))
    far = np.maximum(np.abs(lo), np.abs(hi))
    (exact_lo,), (exact_hi,) = (tlb.evaluate(bundle.graph, bundle.payload, [v]) for v in (near, far))
    assert np.all(blo <= exact_lo) and np.all(exact_hi <= bhi)
    np.testing.assert_allclose(blo, exact_lo, rtol=1e-12, atol=1e-300)
    np.testing.assert_allclose(bhi, exact_hi, rtol=1e-12, atol=1e-300)


def test_col2im_box_is_the_sum_of_the_ends_up_to_rounding():
    attrs = {"spatial_rank": 2, "image": (5, 6), "block": (2, 3), "stride": (1, 2), "padding": (1, 0),
             "padding_after": (0, 1), "dilation": (2, 1)}
    from torchlean_bridge.ops.spatial import col2im_blocks
    blocks = col2im_blocks(attrs)
    bundle = _single_node_bundle("col2im", attrs, (1, 2 * 6, blocks[0] * blocks[1]))
    x = RNG.standard_normal((1, 12, blocks[0] * blocks[1]))
    lo, hi = x - 0.25, x + 0.25
    blo, bhi = tlb.interval_bounds(bundle.graph, bundle.payload, lo, hi)[bundle.graph.outputs[0]]
    (exact_lo,), (exact_hi,) = (tlb.evaluate(bundle.graph, bundle.payload, [v]) for v in (lo, hi))
    assert np.all(blo <= exact_lo) and np.all(exact_hi <= bhi)
    np.testing.assert_allclose(blo, exact_lo, rtol=0, atol=1e-14)
    np.testing.assert_allclose(bhi, exact_hi, rtol=0, atol=1e-14)


def test_roi_align_is_refused_in_interval_mode_by_name():
    m = _model([N("RoiAlign", ["x", "r", "i"], ["y"])], [("x", TP.FLOAT, (1, 1, 4, 4)), ("r", TP.FLOAT, (1, 4))],
               [("y", TP.FLOAT, None)], inits=[("i", np.zeros(1, np.int64))])
    b = tlb.import_onnx(m)
    z = [np.zeros((1, 1, 4, 4)), np.ones((1, 4))]
    with pytest.raises(IntervalError, match="no interval rule for roi_align: its sampling positions are computed "
                                            "from the rois input"):
        tlb.interval_bounds(b.graph, b.payload, z, z)


def _grid_bundle(mode, pad, ac, convention, xs, gs):
    from importers.builder import GraphBuilder
    b = GraphBuilder("test")
    x, g = b.input(xs), b.input(gs)
    attrs = {"mode": mode, "padding_mode": pad, "align_corners": ac, "convention": convention}
    return b.finish([b.add("grid_sample", [x, g], attrs)], canonical=False)


@pytest.mark.parametrize("convention", ["onnx", "torch"])
@pytest.mark.parametrize("mode,pad,ac", GRID_CASES)
def test_grid_sample_box_at_a_point_grid_is_sound(mode, pad, ac, convention):
    """Grid points on a quarter lattice hit rounding ties, borders and exact pixel centers (the ambiguous cases)."""
    r = 2 if mode == "cubic" else int(RNG.integers(2, 4))
    xs = (2, 2) + tuple(int(v) for v in RNG.integers(1, 5, r))
    gs = (2,) + tuple(int(v) for v in RNG.integers(1, 4, r)) + (r,)
    grid = RNG.uniform(-2.2, 2.2, gs)
    grid[0] = np.round(grid[0] * 4) / 4
    bundle = _grid_bundle(mode, pad, bool(ac), convention, xs, gs)
    _sound(bundle, RNG.standard_normal(xs), radius=0.2, constant_inputs=[grid])


@pytest.mark.parametrize("mode", ["linear", "nearest"])
def test_grid_sample_box_is_the_exact_range_for_non_negative_weights(mode):
    xs, gs = (1, 3, 4, 5), (1, 3, 3, 2)
    grid = RNG.uniform(-1.3, 1.3, gs)
    bundle = _grid_bundle(mode, "border", False, "onnx", xs, gs)
    x = RNG.standard_normal(xs)
    lo, hi = x - 0.1, x + 0.1
    blo, bhi = tlb.interval_bounds(bundle.graph, bundle.payload, [lo, grid], [hi, grid])[bundle.graph.outputs[0]]
    (f_lo,), (f_hi,) = (tlb.evaluate(bundle.graph, bundle.payload, [v, grid]) for v in (lo, hi))
    np.testing.assert_allclose(blo, f_lo, rtol=0, atol=1e-12)
    np.testing.assert_allclose(bhi, f_hi, rtol=0, atol=1e-12)


def test_grid_sample_box_needs_a_point_grid():
    bundle = _grid_bundle("linear", "zeros", False, "onnx", (1, 1, 2, 2), (1, 1, 1, 2))
    x, g = np.zeros((1, 1, 2, 2)), np.zeros((1, 1, 1, 2))
    with pytest.raises(IntervalError, match=r"grid_sample: interval bounds need the grid as a point \(a constant "
                                            r"grid\); its box has width up to 0.5"):
        tlb.interval_bounds(bundle.graph, bundle.payload, [x, g], [x, g + 0.5])
