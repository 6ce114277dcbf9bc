"""Runs one differential case: ours (import + evaluate at the model's precision) against onnx's reference."""

from __future__ import annotations

import traceback

import numpy as np
from onnx.reference import ReferenceEvaluator

from torchlean_bridge.errors import BridgeError


def _ours(model, feeds):
    from torchlean_bridge.app.onnx_backend import TorchLeanRep
    rep = TorchLeanRep(model)
    return rep.run(feeds), rep


def _close(a, b, rtol, atol) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return False
    if a.dtype.kind in "biu" or b.dtype.kind in "biu" or a.dtype == bool:
        return np.array_equal(a.astype(np.float64), b.astype(np.float64))
    af, bf = a.astype(np.float64), b.astype(np.float64)
    return bool(np.allclose(af, bf, rtol=rtol, atol=atol, equal_nan=True))


def _ort(model, feeds):
    """onnxruntime's outputs, or None when it cannot run the model (an op or type it lacks)."""
    import onnxruntime as ort
    ort.set_default_logger_severity(4)
    try:
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        return sess.run(None, feeds)
    except Exception:  # noqa: BLE001 - no kernel for this op/type: no second oracle
        return None


def as_float32(model, feeds):
    """The same model computing in float32 (onnxruntime has float-only kernels for many ops)."""
    import copy

    import onnx
    from onnx import numpy_helper
    m = copy.deepcopy(model)
    for vi in list(m.graph.input) + list(m.graph.output):
        if vi.type.tensor_type.elem_type == onnx.TensorProto.DOUBLE:
            vi.type.tensor_type.elem_type = onnx.TensorProto.FLOAT
    for i, t in enumerate(m.graph.initializer):
        if t.data_type == onnx.TensorProto.DOUBLE:
            m.graph.initializer[i].CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float32),
                                                                    t.name))
    for n in m.graph.node:
        for a in n.attribute:
            if a.name == "to" and a.i == onnx.TensorProto.DOUBLE:
                a.i = onnx.TensorProto.FLOAT
    return m, {k: v.astype(np.float32) if v.dtype == np.float64 else v for k, v in feeds.items()}


def _agrees(got, want, rtol, atol) -> str:
    if len(got) != len(want):
        return f"{len(got)} outputs, want {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        if not _close(g, w, rtol, atol):
            g, w = np.asarray(g), np.asarray(w)
            return f"output {i}: got {g.shape} {g.dtype} {g.ravel()[:6]} want {w.shape} {w.dtype} {w.ravel()[:6]}"
    return ""


def _second_opinion(case, got) -> bool:
    """onnxruntime agrees with us where onnx's reference did not (the reference has known slips: float32
    arithmetic inside some double kernels, Loop scan outputs concatenated, LpNormalization p=1 without abs)."""
    layout = [a for n in case.model.graph.node for a in n.attribute if a.name == "layout" and a.i == 1]
    if layout and len(case.model.graph.node) == 1:  # onnxruntime lacks layout=1: check the layout-0 twin
        return _batch_major_twin_agrees(case, got)
    theirs = _ort(case.model, case.feeds)
    if theirs is not None:
        return not _agrees(got, theirs, case.rtol, case.atol)
    m32, f32 = as_float32(case.model, case.feeds)
    theirs = _ort(m32, f32)
    if theirs is None:
        return False
    ours32, _ = _ours(m32, f32)
    return not _agrees(ours32, theirs, max(case.rtol, 2e-5), max(case.atol, 2e-5))


def _batch_major_twin_agrees(case, got) -> bool:
    """A layout=1 recurrent node equals its layout=0 twin on transposed operands; the twin is checked
    against onnxruntime in float32."""
    import copy
    m = copy.deepcopy(case.model)
    node = m.graph.node[0]
    for a in node.attribute:
        if a.name == "layout":
            a.i = 0
    swap = {"x", "h0", "c0"}
    feeds = {k: np.swapaxes(v, 0, 1) if k in swap else v for k, v in case.feeds.items()}
    for vi in m.graph.input:
        if vi.name in swap:
            d = vi.type.tensor_type.shape.dim
            a0, a1 = d[0].dim_value, d[1].dim_value
            d[0].dim_value, d[1].dim_value = a1, a0
    twin = type(case)(m, feeds, case.rtol, case.atol)
    twin_got, _ = _ours(m, feeds)
    expect = [np.transpose(twin_got[0], (2, 0, 1, 3))] + [np.swapaxes(t, 0, 1) for t in twin_got[1:]]
    if _agrees(got, expect, case.rtol, case.atol):
        return False
    return _second_opinion(twin, twin_got)


def run_case(case) -> tuple[str, str]:
    """('ok'|'refused'|'invalid'|'crash'|'wrong'|'badrefusal', detail)."""
    op_types = {n.op_type for n in case.model.graph.node}
    try:
        want = ReferenceEvaluator(case.model).run(None, case.feeds)
    except Exception as e:  # noqa: BLE001 - the reference rejects the draw: not a case
        return "invalid", f"reference: {type(e).__name__}: {e}"
    if any(np.asarray(w).dtype == object for w in want):
        return "invalid", "reference returned objects"
    try:
        got, _ = _ours(case.model, case.feeds)
    except BridgeError as e:
        msg = str(e)
        if any(op in msg for op in op_types):
            return "refused", msg.splitlines()[0][:200]
        return "badrefusal", msg[:300]
    except Exception:  # noqa: BLE001
        return "crash", traceback.format_exc()[-1500:]
    problem = _agrees(got, want, case.rtol, case.atol)
    if not problem:
        return "ok", ""
    try:
        if _second_opinion(case, got):
            return "ok_ort", problem
    except BridgeError:
        pass
    return "wrong", problem
