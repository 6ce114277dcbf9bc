"""RNN / GRU / LSTM unrolled at import (importers/onnx/ops_recurrent.py) against onnxruntime.

Models with weights as initializers, every direction, both layouts, activation lists with parameters,
clip, GRU's linear_before_reset, LSTM's peepholes, initial states, constant sequence_lens shorter than
the sequence, and subsets of the outputs: results agree with onnxruntime within binary32 rounding
(rtol 1e-5, atol 1e-6). Interval bounds through an unrolled LSTM enclose sampled outputs. What is not
lowered exactly (computed sequence_lens, input_forget) is refused with exact messages.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP
from onnx import helper

import torchlean_bridge as tlb
from torchlean_bridge.errors import UnsupportedError

ort = pytest.importorskip("onnxruntime")
N = helper.make_node
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}


def _layer(op, seq=4, batch=3, width=5, hidden=6, direction="forward", layout=0, outputs=("Y", "Y_h", "Y_c"),
           initial=True, lens=None, peepholes=False, seed=0, **attrs):
    rng = np.random.default_rng(seed)
    nd = 2 if direction == "bidirectional" else 1
    g = GATES[op]
    inits = {"W": rng.standard_normal((nd, g * hidden, width)) * 0.5, "R": rng.standard_normal((nd, g * hidden, hidden)) * 0.5,
             "B": rng.standard_normal((nd, 2 * g * hidden)) * 0.3}
    state = (batch, nd, hidden) if layout else (nd, batch, hidden)
    names = ["X", "W", "R", "B", "", "", "", ""]
    if lens is not None:
        inits["L"] = np.asarray(lens, np.int32)
        names[4] = "L"
    if initial:
        inits["H0"] = rng.standard_normal(state)
        names[5] = "H0"
        if op == "LSTM":
            inits["C0"] = rng.standard_normal(state)
            names[6] = "C0"
    if peepholes:
        inits["P"] = rng.standard_normal((nd, 3 * hidden)) * 0.5
        names[7] = "P"
    while names[-1] == "":
        names.pop()
    outs = [o if o in outputs else "" for o in (("Y", "Y_h", "Y_c") if op == "LSTM" else ("Y", "Y_h"))]
    while outs[-1] == "":
        outs.pop()
    node = N(op, names, outs, hidden_size=hidden, direction=direction, layout=layout, **attrs)
    xshape = (batch, seq, width) if layout else (seq, batch, width)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("X", TP.FLOAT, xshape)],
                              [helper.make_tensor_value_info(o, TP.FLOAT, None) for o in outs if o],
                              [onnx.numpy_helper.from_array(v if v.dtype.kind == "i" else v.astype(np.float32), k)
                               for k, v in inits.items()])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])
    m.ir_version = 10
    return m, rng.standard_normal(xshape).astype(np.float32)


def _agree(m, x):
    b = tlb.import_onnx(m)
    ours = tlb.evaluate(b.graph, b.payload, [x], dtype="float32")
    theirs = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"X": x})
    assert len(ours) == len(theirs)
    for a, t in zip(ours, theirs):
        assert np.asarray(a).shape == t.shape
        np.testing.assert_allclose(np.asarray(a), t, rtol=1e-5, atol=1e-6)
    return b


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_directions_agree_with_onnxruntime(op, direction):
    _agree(*_layer(op, direction=direction))


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
def test_shorter_constant_sequence_lens_mask_the_steps(op):
    _agree(*_layer(op, direction="bidirectional", lens=[4, 2, 1]))


def test_gru_linear_before_reset_with_and_without_initial_state():
    for initial in (True, False):
        _agree(*_layer("GRU", direction="bidirectional", linear_before_reset=1, initial=initial))


def test_lstm_peepholes_clip_and_output_subsets():
    _agree(*_layer("LSTM", peepholes=True, clip=0.7))
    _agree(*_layer("LSTM", outputs=("Y_c",), direction="reverse", peepholes=True))
    _agree(*_layer("LSTM", outputs=("Y_h",), initial=False, seq=1))


def test_parameterized_activation_lists():
    _agree(*_layer("RNN", direction="bidirectional", activations=["LeakyRelu", "HardSigmoid"],
                   activation_alpha=[0.3, 0.25], activation_beta=[0.4]))
    _agree(*_layer("GRU", activations=["HardSigmoid", "Softsign"], activation_alpha=[0.3], activation_beta=[0.45]))
    _agree(*_layer("LSTM", activations=["Sigmoid", "Elu", "Relu"], activation_alpha=[0.7]))


def _as_layout0(m):
    """The same layer in layout 0 (onnxruntime implements only that): states and X transposed."""
    m0 = onnx.ModelProto()
    m0.CopyFrom(m)
    node = m0.graph.node[0]
    for a in node.attribute:
        if a.name == "layout":
            a.i = 0
    for t in m0.graph.initializer:
        if t.name in ("H0", "C0"):
            t.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(t).transpose(1, 0, 2).copy(), t.name))
    dims = m0.graph.input[0].type.tensor_type.shape.dim
    dims[0].dim_value, dims[1].dim_value = dims[1].dim_value, dims[0].dim_value
    return m0


@pytest.mark.parametrize("op,direction,lens", [("LSTM", "forward", None), ("GRU", "bidirectional", [3, 1]),
                                               ("RNN", "reverse", [2, 3])])
def test_batch_first_layout_agrees_with_the_transposed_layer(op, direction, lens):
    m, x = _layer(op, layout=1, direction=direction, seq=3, batch=2, lens=lens)
    b = tlb.import_onnx(m)
    ours = [np.asarray(v) for v in tlb.evaluate(b.graph, b.payload, [x], dtype="float32")]
    theirs = ort.InferenceSession(_as_layout0(m).SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"X": x.transpose(1, 0, 2).copy()})
    np.testing.assert_allclose(ours[0], theirs[0].transpose(2, 0, 1, 3), rtol=1e-5, atol=1e-6)
    for a, t in zip(ours[1:], theirs[1:]):
        np.testing.assert_allclose(a, t.transpose(1, 0, 2), rtol=1e-5, atol=1e-6)


def test_single_direction_weights_stay_bound_to_their_initializers():
    b = _agree(*_layer("LSTM", seq=3, batch=2))
    keys = {binding.key for binding in b.roles.bindings()}
    assert {"W", "R", "H0", "C0"} <= keys


def test_interval_bounds_through_an_unrolled_lstm_enclose_samples():
    m, x = _layer("LSTM", direction="bidirectional", seq=3, batch=2, width=3, hidden=4, peepholes=True)
    b = tlb.import_onnx(m)
    eps = 0.05
    boxes = tlb.interval_bounds(b.graph, b.payload, x - eps, x + eps, all_nodes=False)
    rng = np.random.default_rng(3)
    for _ in range(20):
        sample = (x + rng.uniform(-eps, eps, x.shape)).astype(np.float64)
        for (lo, hi), v in zip(boxes, tlb.evaluate(b.graph, b.payload, [sample])):
            assert np.all(lo <= v) and np.all(v <= hi)


def test_refusals_name_the_reason():
    m, _ = _layer("LSTM", input_forget=1)
    with pytest.raises(UnsupportedError) as e:
        tlb.import_onnx(m)
    assert str(e.value).endswith("LSTM (node `Y`, opset 22): input_forget=1 (coupled input and forget gates) is not "
                                 "lowered")
    m, _ = _layer("GRU", lens=[4, 4, 4])
    m.graph.initializer.pop(3)  # sequence_lens becomes a graph input
    m.graph.input.append(helper.make_tensor_value_info("L", TP.INT32, [3]))
    with pytest.raises(UnsupportedError) as e:
        tlb.import_onnx(m)
    assert str(e.value).endswith("GRU (node `Y`, opset 22): sequence_lens `L` is computed at run time: the steps each "
                                 "row takes must be known at import time")
