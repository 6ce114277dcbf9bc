"""Random small ONNX models for the differential fuzz test (tests/test_onnx_differential_fuzz.py).

Each generator draws one model (shapes and attributes from the values the ONNX spec allows) and its feeds
from a numpy Generator. Data operands are graph inputs; operands the importer must know (k, pads, scales,
axes, trip counts) are initializers, as real exported models carry them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
from onnx import TensorProto as TP
from onnx import helper

N = helper.make_node
_NP = {TP.DOUBLE: np.float64, TP.FLOAT: np.float32, TP.INT64: np.int64, TP.INT32: np.int32, TP.BOOL: np.bool_,
       TP.INT8: np.int8, TP.UINT8: np.uint8, TP.INT16: np.int16, TP.UINT16: np.uint16}


@dataclass
class Case:
    model: object
    feeds: dict
    rtol: float = 1e-9
    atol: float = 1e-9
    note: str = ""
    interval: bool = False  # the op has an interval rule worth sampling
    extra: dict = field(default_factory=dict)


def model(nodes, inputs, outputs, inits=(), opset=19):
    """inputs: [(name, elem_type, shape)], outputs: [(name, elem_type)]; inits: [(name, ndarray)]."""
    g = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, None) for n, t in outputs],
        initializer=[helper.make_tensor(n, _tp(v), list(v.shape), v.flatten().tolist()) for n, v in inits])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 9 if opset < 21 else 10
    return m


def _tp(v: np.ndarray) -> int:
    for t, d in _NP.items():
        if v.dtype == d:
            return t
    raise ValueError(v.dtype)


def rand(rng, shape, lo=-2.0, hi=2.0, dtype=np.float64):
    return rng.uniform(lo, hi, shape).astype(dtype)


def _shape(rng, rank, lo=1, hi=5):
    return [int(v) for v in rng.integers(lo, hi + 1, rank)]


def _unary(rng, op, attrs, shape, opset=19, lo=-2.0, hi=2.0, interval=False, dtype=TP.DOUBLE, extra_inits=(),
           extra_inputs=(), n_out=1, out_types=None):
    x = rand(rng, shape, lo, hi, _NP[dtype])
    names = ["x"] + [n for n, _ in extra_inits] + list(extra_inputs)
    outs = [f"y{i}" for i in range(n_out)]
    m = model([N(op, names, outs, **attrs)], [("x", dtype, shape)],
              [(o, (out_types or [dtype] * n_out)[i]) for i, o in enumerate(outs)], extra_inits, opset)
    return Case(m, {"x": x}, note=f"{op} {shape} {attrs}", interval=interval)


# --- families -------------------------------------------------------------------------------------------

def gridsample(rng):
    opset = int(rng.choice([16, 20]))
    modes = ["bilinear", "nearest", "bicubic"] if opset == 16 else ["linear", "nearest", "cubic"]
    attrs = {"mode": str(rng.choice(modes)), "padding_mode": str(rng.choice(["zeros", "border", "reflection"])),
             "align_corners": int(rng.integers(0, 2))}
    n, c, h, w = _shape(rng, 4, 1, 4)
    ho, wo = _shape(rng, 2, 1, 4)
    x = rand(rng, [n, c, h, w])
    grid = rand(rng, [n, ho, wo, 2], -1.3, 1.3)
    m = model([N("GridSample", ["x", "grid"], ["y"], **attrs)], [("x", TP.DOUBLE, [n, c, h, w]),
                                                                  ("grid", TP.DOUBLE, [n, ho, wo, 2])],
              [("y", TP.DOUBLE)], opset=opset)
    return Case(m, {"x": x, "grid": grid}, note=f"GridSample {x.shape} {grid.shape} {attrs} opset {opset}",
                interval=True)


def _pool_attrs(rng, rank, shape, dilations=True):
    k = [int(rng.integers(1, min(4, s + 1) + 1)) for s in shape[2:]]
    attrs = {"kernel_shape": k, "strides": [int(v) for v in rng.integers(1, 4, rank)]}
    if rng.random() < 0.5:
        attrs["pads"] = [int(rng.integers(0, kk)) for kk in k] * 2
    elif rng.random() < 0.4:
        attrs["auto_pad"] = str(rng.choice(["SAME_UPPER", "SAME_LOWER", "VALID"]))
    if dilations and "auto_pad" not in attrs and rng.random() < 0.4:  # the reference zeroes SAME + dilations
        attrs["dilations"] = [int(v) for v in rng.integers(1, 3, rank)]
    if rng.random() < 0.3 and "auto_pad" not in attrs:
        attrs["ceil_mode"] = 1
    return attrs


def lppool(rng):
    rank = int(rng.integers(1, 3))
    shape = _shape(rng, 2, 1, 3) + _shape(rng, rank, 2, 7)
    attrs = _pool_attrs(rng, rank, shape)
    attrs["p"] = int(rng.choice([1, 2, 3]))
    return _unary(rng, "LpPool", attrs, shape, opset=18, interval=True)


def maxpool_indices(rng):
    rank = int(rng.integers(1, 3))
    shape = _shape(rng, 2, 1, 3) + _shape(rng, rank, 2, 7)
    attrs = _pool_attrs(rng, rank, shape)
    if rank == 2 and rng.random() < 0.4:
        attrs["storage_order"] = 1
    return _unary(rng, "MaxPool", attrs, shape, opset=12, n_out=2, out_types=[TP.DOUBLE, TP.INT64])


def avgpool(rng):
    rank = int(rng.integers(1, 3))
    shape = _shape(rng, 2, 1, 3) + _shape(rng, rank, 2, 7)
    attrs = _pool_attrs(rng, rank, shape)
    attrs["count_include_pad"] = int(rng.integers(0, 2))
    return _unary(rng, "AveragePool", attrs, shape, opset=19, interval=True)


def topk(rng):
    rank = int(rng.integers(1, 4))
    shape = _shape(rng, rank, 1, 5)
    axis = int(rng.integers(-rank, rank))
    k = int(rng.integers(0, shape[axis] + 1))
    attrs = {"axis": axis, "largest": int(rng.integers(0, 2)), "sorted": 1}
    x = rng.integers(-3, 4, shape).astype(np.float64)  # ties: the spec orders them by index
    m = model([N("TopK", ["x", "k"], ["v", "i"], **attrs)], [("x", TP.DOUBLE, shape)],
              [("v", TP.DOUBLE), ("i", TP.INT64)], [("k", np.array([k], np.int64))], opset=11)
    return Case(m, {"x": x}, note=f"TopK {shape} k={k} {attrs}")


def _act(rng, n):
    names = ["Relu", "Tanh", "Sigmoid", "Affine", "LeakyRelu", "ThresholdedRelu", "ScaledTanh", "HardSigmoid",
             "Elu", "Softsign", "Softplus"]
    acts = [str(rng.choice(names)) for _ in range(n)]
    alpha, beta = [], []
    defaults = {"Affine": (1.0, 0.0), "LeakyRelu": (0.01, 0.0), "ThresholdedRelu": (1.0, 0.0),
                "ScaledTanh": (1.0, 1.0), "HardSigmoid": (0.2, 0.5), "Elu": (1.0, 0.0)}
    for a in acts:
        d = defaults.get(a, (0.0, 0.0))
        alpha.append(float(np.round(rng.uniform(0.1, 1.5), 3)) if a in defaults else d[0])
        beta.append(float(np.round(rng.uniform(-0.5, 0.5), 3)) if a in ("Affine", "ScaledTanh", "HardSigmoid")
                    else d[1])
    return acts, alpha, beta


def recurrent(rng):
    op = str(rng.choice(["LSTM", "GRU", "RNN"]))
    gates = {"LSTM": 4, "GRU": 3, "RNN": 1}[op]
    direction = str(rng.choice(["forward", "reverse", "bidirectional"]))
    d = 2 if direction == "bidirectional" else 1
    seq, batch, inp, hid = _shape(rng, 4, 1, 3)
    layout = int(rng.integers(0, 2))
    attrs = {"hidden_size": hid, "direction": direction, "layout": layout}
    if rng.random() < 0.5:
        n_act = {"LSTM": 3, "GRU": 2, "RNN": 1}[op] * d
        acts, alpha, beta = _act(rng, n_act)
        attrs["activations"] = acts
        attrs["activation_alpha"] = alpha
        attrs["activation_beta"] = beta
    if rng.random() < 0.3:
        attrs["clip"] = float(rng.uniform(0.2, 2.0))
    if op == "GRU" and rng.random() < 0.5:
        attrs["linear_before_reset"] = 1
    if op == "LSTM" and rng.random() < 0.2:
        attrs["input_forget"] = 1
    xs = [seq, batch, inp] if layout == 0 else [batch, seq, inp]
    inits = [("W", rand(rng, [d, gates * hid, inp], -1, 1)), ("R", rand(rng, [d, gates * hid, hid], -1, 1))]
    names = ["x", "W", "R"]
    if rng.random() < 0.7:
        inits.append(("B", rand(rng, [d, 2 * gates * hid], -1, 1)))
        names.append("B")
    feeds = {"x": rand(rng, xs, -1, 1)}
    inputs = [("x", TP.DOUBLE, xs)]
    if rng.random() < 0.4:
        names += ["", "h0"] if "B" in names else ["", "", "h0"]
        hs = [d, batch, hid] if layout == 0 else [batch, d, hid]
        feeds["h0"] = rand(rng, hs, -1, 1)
        inputs.append(("h0", TP.DOUBLE, hs))
        if op == "LSTM" and rng.random() < 0.5:
            names.append("c0")
            feeds["c0"] = rand(rng, hs, -1, 1)
            inputs.append(("c0", TP.DOUBLE, hs))
    outs = ["y", "yh"] + (["yc"] if op == "LSTM" else [])
    m = model([N(op, names, outs, **attrs)], inputs, [(o, TP.DOUBLE) for o in outs], inits, opset=14)
    return Case(m, feeds, note=f"{op} x{xs} {attrs} inputs {names}")


def einsum(rng):
    letters = "abcde"
    n_in = int(rng.integers(1, 3))
    dims = {c: int(rng.integers(1, 4)) for c in letters}
    terms = []
    for _ in range(n_in):
        r = int(rng.integers(0, 4))
        terms.append("".join(rng.choice(list(letters), r)))
    used = sorted(set("".join(terms)))
    explicit = rng.random() < 0.7
    if explicit:
        out = "".join(rng.permutation([c for c in used if rng.random() < 0.5]))
        eq = ",".join(terms) + "->" + out
    else:
        eq = ",".join(terms)
    names = [f"x{i}" for i in range(n_in)]
    shapes = [[dims[c] for c in t] for t in terms]
    feeds = {n: rand(rng, s) for n, s in zip(names, shapes)}
    m = model([N("Einsum", names, ["y"], equation=eq)], [(n, TP.DOUBLE, s) for n, s in zip(names, shapes)],
              [("y", TP.DOUBLE)], opset=12)
    return Case(m, feeds, note=f"Einsum {eq} {shapes}")


def cumulative(rng):
    op = "CumSum" if rng.random() < 0.5 else "CumProd"
    rank = int(rng.integers(1, 4))
    shape = _shape(rng, rank, 1, 4)
    axis = int(rng.integers(-rank, rank))
    attrs = {"exclusive": int(rng.integers(0, 2)), "reverse": int(rng.integers(0, 2))}
    opset = 14 if op == "CumSum" else 26
    return _unary(rng, op, attrs, shape, opset=min(opset, 23) if op == "CumSum" else opset,
                  extra_inits=[("axis", np.array(axis, np.int64))], interval=True)


def hardmax(rng):
    rank = int(rng.integers(1, 4))
    shape = _shape(rng, rank, 1, 4)
    opset = int(rng.choice([11, 13]))
    axis = int(rng.integers(-rank, rank))
    c = _unary(rng, "Hardmax", {"axis": axis}, shape, opset=opset)
    if rng.random() < 0.5:  # ties: the first maximum wins
        c.feeds["x"] = np.round(c.feeds["x"]).astype(np.float64)
    return c


def dft(rng):
    opset = int(rng.choice([17, 20]))
    rank = int(rng.integers(2, 4))
    shape = _shape(rng, rank - 1, 1, 5)
    real = rng.random() < 0.5
    shape = shape + [1 if real else 2]
    axis = int(rng.integers(1, rank - 1)) if rank > 2 else 1
    onesided = int(rng.random() < 0.4) if real else 0
    inverse = int(rng.random() < 0.3) if not onesided else 0
    attrs = {"onesided": onesided, "inverse": inverse}
    inits, names = [], ["x"]
    length = None
    if rng.random() < 0.4:
        length = int(rng.integers(1, 7))
    if opset == 17:
        attrs["axis"] = axis
        if length is not None:
            inits.append(("len", np.array(length, np.int64)))
    else:
        if length is not None or rng.random() < 0.5:
            inits.append(("len", np.array(length if length is not None else shape[axis], np.int64)))
        inits.append(("ax", np.array(axis - rank if rng.random() < 0.3 else axis, np.int64)))
        if length is None and len(inits) == 1:
            inits.insert(0, ("len", np.array(shape[axis], np.int64)))
    names += [n for n, _ in inits]
    x = rand(rng, shape)
    m = model([N("DFT", names, ["y"], **attrs)], [("x", TP.DOUBLE, shape)], [("y", TP.DOUBLE)], inits, opset)
    return Case(m, {"x": x}, note=f"DFT opset {opset} {shape} {attrs} {[(n, v.tolist()) for n, v in inits]}")


def stft(rng):
    batch, sig = int(rng.integers(1, 3)), int(rng.integers(4, 12))
    real = rng.random() < 0.6
    shape = [batch, sig, 1 if real else 2]
    length = int(rng.integers(2, min(sig, 6) + 1))
    step = int(rng.integers(1, 4))
    onesided = int(real and rng.random() < 0.5)
    inits = [("step", np.array(step, np.int64))]
    names = ["x", "step"]
    if rng.random() < 0.5:
        inits.append(("win", rand(rng, [length], 0, 1)))
        names.append("win")
        if rng.random() < 0.5:
            inits.append(("len", np.array(length, np.int64)))
            names.append("len")
    else:
        inits.append(("len", np.array(length, np.int64)))
        names += ["", "len"]
    x = rand(rng, shape)
    m = model([N("STFT", names, ["y"], onesided=onesided)], [("x", TP.DOUBLE, shape)], [("y", TP.DOUBLE)], inits,
              17)
    return Case(m, {"x": x}, note=f"STFT {shape} step={step} len={length} onesided={onesided} {names}")


def quantize(rng):
    opset = int(rng.choice([13, 19, 21]))
    rank = int(rng.integers(1, 4))
    shape = _shape(rng, rank, 1, 5)
    qtype = int(rng.choice([TP.UINT8, TP.INT8] + ([TP.INT16, TP.UINT16] if opset >= 21 else [])))
    qnp = _NP[qtype]
    info = np.iinfo(qnp)
    mode = str(rng.choice(["tensor", "axis", "block"] if opset >= 21 else ["tensor", "axis"]))
    axis = int(rng.integers(-rank, rank))
    attrs = {}
    if mode == "tensor":
        sshape = []
    elif mode == "axis":
        sshape = [shape[axis]]
        attrs["axis"] = axis
    else:
        block = int(rng.integers(1, shape[axis] + 1))
        attrs["axis"], attrs["block_size"] = axis, block
        sshape = list(shape)
        sshape[axis] = -(-shape[axis] // block)
    scale = rng.uniform(0.01, 0.5, sshape).astype(np.float32)
    zp = rng.integers(max(info.min, -20), min(info.max, 20) + 1, sshape).astype(qnp)
    inits = [("s", np.asarray(scale)), ("z", np.asarray(zp))]
    if rng.random() < 0.5:  # Quantize
        x = rand(rng, shape, -40, 40, np.float32)
        if opset >= 21 and rng.random() < 0.3:
            attrs["saturate"] = 1
        m = model([N("QuantizeLinear", ["x", "s", "z"], ["y"], **attrs)], [("x", TP.FLOAT, shape)],
                  [("y", qtype)], inits, opset)
        return Case(m, {"x": x}, rtol=0, atol=0, note=f"QuantizeLinear opset {opset} {shape} {mode} {attrs} {qnp}")
    x = rng.integers(info.min, info.max + 1, shape).astype(qnp)
    m = model([N("DequantizeLinear", ["x", "s", "z"], ["y"], **attrs)], [("x", qtype, shape)],
              [("y", TP.FLOAT)], inits, opset)
    return Case(m, {"x": x}, rtol=1e-6, atol=1e-6, note=f"DequantizeLinear opset {opset} {shape} {mode} {attrs}")


def cast(rng):
    pairs = [(TP.DOUBLE, TP.FLOAT), (TP.DOUBLE, TP.INT64), (TP.DOUBLE, TP.INT32), (TP.DOUBLE, TP.INT8),
             (TP.DOUBLE, TP.UINT8), (TP.DOUBLE, TP.BOOL), (TP.FLOAT, TP.FLOAT16), (TP.FLOAT, TP.BFLOAT16),
             (TP.FLOAT, TP.FLOAT8E4M3FN), (TP.FLOAT, TP.FLOAT8E5M2), (TP.FLOAT, TP.FLOAT8E4M3FNUZ),
             (TP.FLOAT, TP.FLOAT8E5M2FNUZ), (TP.INT64, TP.DOUBLE), (TP.INT32, TP.INT8), (TP.INT64, TP.UINT8),
             (TP.FLOAT, TP.INT4), (TP.FLOAT, TP.UINT4), (TP.BOOL, TP.FLOAT)]
    src, dst = pairs[int(rng.integers(len(pairs)))]
    shape = _shape(rng, int(rng.integers(1, 3)), 1, 6)
    attrs = {"to": dst}
    opset = 19 if dst not in (TP.INT4, TP.UINT4) else 21
    if dst in (TP.FLOAT8E4M3FN, TP.FLOAT8E5M2, TP.FLOAT8E4M3FNUZ, TP.FLOAT8E5M2FNUZ) and rng.random() < 0.5:
        attrs["saturate"] = 0
    if src in (TP.DOUBLE, TP.FLOAT):
        x = rand(rng, shape, -600, 600, _NP[src])
        if dst in (TP.INT64, TP.INT32, TP.INT8, TP.UINT8, TP.INT4, TP.UINT4):
            lo, hi = {TP.INT8: (-128, 127), TP.UINT8: (0, 255), TP.INT4: (-8, 7), TP.UINT4: (0, 15)}.get(
                dst, (-1000, 1000))
            x = rand(rng, shape, lo, hi + 0.99, _NP[src])  # in range: out-of-range casts are undefined
    elif src == TP.BOOL:
        x = rng.random(shape) < 0.5
    else:
        x = rng.integers(-200, 200, shape).astype(_NP[src])
        if dst == TP.INT8:
            x = np.clip(x, -128, 127).astype(_NP[src])
        if dst == TP.UINT8:
            x = np.clip(x, 0, 255).astype(_NP[src])
    m = model([N("Cast", ["x"], ["y"], **attrs)], [("x", src, shape)], [("y", dst)], opset=opset)
    return Case(m, {"x": x}, rtol=0, atol=0, note=f"Cast {src}->{dst} {attrs}")


def control(rng):
    """If with a constant condition, Loop with a constant trip count (and a two-node body)."""
    shape = _shape(rng, 2, 1, 4)
    x = rand(rng, shape)
    if rng.random() < 0.5:
        cond = bool(rng.random() < 0.5)
        then_g = helper.make_graph([N("Mul", ["x", "x"], ["t"])], "then", [],
                                   [helper.make_tensor_value_info("t", TP.DOUBLE, None)])
        else_g = helper.make_graph([N("Neg", ["x"], ["e0"]), N("Exp", ["e0"], ["e"])], "else", [],
                                   [helper.make_tensor_value_info("e", TP.DOUBLE, None)])
        m = model([N("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)], [("x", TP.DOUBLE, shape)],
                  [("y", TP.DOUBLE)], [("c", np.array(cond))], opset=16)
        return Case(m, {"x": x}, note=f"If cond={cond}")
    trips = int(rng.integers(0, 5))
    use_cond = rng.random() < 0.5
    body = helper.make_graph(
        [N("Identity", ["cond_in"], ["cond_out"]), N("Add", ["acc_in", "x"], ["s"]), N("Sin", ["s"], ["acc_out"]),
         N("Cast", ["i"], ["fi"], to=TP.DOUBLE), N("Mul", ["acc_out", "fi"], ["scan_out"])], "body",
        [helper.make_tensor_value_info("i", TP.INT64, []), helper.make_tensor_value_info("cond_in", TP.BOOL, []),
         helper.make_tensor_value_info("acc_in", TP.DOUBLE, None)],
        [helper.make_tensor_value_info("cond_out", TP.BOOL, []),
         helper.make_tensor_value_info("acc_out", TP.DOUBLE, None),
         helper.make_tensor_value_info("scan_out", TP.DOUBLE, None)])
    inits = [("M", np.array(trips, np.int64)), ("c", np.array(True))]
    names = ["M", "c" if use_cond else "", "x"]
    m = model([N("Loop", names, ["y", "scan"], body=body)], [("x", TP.DOUBLE, shape)],
              [("y", TP.DOUBLE), ("scan", TP.DOUBLE)], inits, opset=16)
    return Case(m, {"x": x}, note=f"Loop trips={trips} cond={use_cond}")


def resize(rng):
    shape = _shape(rng, 4, 1, 4)
    mode = str(rng.choice(["nearest", "linear", "cubic"]))
    coords = ["half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
              "tf_crop_and_resize"]
    attrs = {"mode": mode, "coordinate_transformation_mode": str(rng.choice(coords))}
    if mode == "nearest":
        attrs["nearest_mode"] = str(rng.choice(["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]))
    else:
        attrs["antialias"] = int(rng.random() < 0.4)
    if mode != "nearest" and rng.random() < 0.3:
        attrs["exclude_outside"] = 1
    if rng.random() < 0.3:
        attrs["keep_aspect_ratio_policy"] = str(rng.choice(["not_larger", "not_smaller"]))
    axes = sorted(rng.choice(4, size=int(rng.integers(1, 5)), replace=False).tolist())
    if rng.random() < 0.5:
        attrs["axes"] = axes
    else:
        axes = [0, 1, 2, 3]
    inits = []
    names = ["x", "", ""]
    if attrs["coordinate_transformation_mode"] == "tf_crop_and_resize":
        lo = rng.uniform(0, 0.5, len(axes))
        inits.append(("roi", np.concatenate([lo, lo + rng.uniform(0.2, 0.8, len(axes))]).astype(np.float64)))
        names[1] = "roi"
        attrs["extrapolation_value"] = float(rng.uniform(-1, 1))
    if rng.random() < 0.5 or "keep_aspect_ratio_policy" in attrs:
        inits.append(("sizes", np.array([int(rng.integers(1, 7)) for _ in axes], np.int64)))
        names.append("sizes")
    else:
        inits.append(("scales", np.array([float(rng.choice([0.5, 0.6, 1.0, 1.5, 2.0, 3.0])) for _ in axes],
                                         np.float32)))
        names[2] = "scales"
    x = rand(rng, shape)
    m = model([N("Resize", names, ["y"], **attrs)], [("x", TP.DOUBLE, shape)], [("y", TP.DOUBLE)], inits, 19)
    return Case(m, {"x": x}, note=f"Resize {shape} {attrs} {[(n, v.tolist()) for n, v in inits]}", interval=True)


def reduce(rng):
    op = str(rng.choice(["ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
                         "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"]))
    rank = int(rng.integers(1, 4))
    shape = _shape(rng, rank, 0 if rng.random() < 0.15 else 1, 4)
    attrs = {"keepdims": int(rng.integers(0, 2))}
    inits = []
    r = rng.random()
    if r < 0.6:
        axes = sorted(set(int(a) for a in rng.integers(-rank, rank, int(rng.integers(1, rank + 1)))))
        axes = sorted({a % rank for a in axes})
        inits.append(("axes", np.array(axes, np.int64)))
    elif r < 0.8:
        inits.append(("axes", np.zeros([0], np.int64)))
        attrs["noop_with_empty_axes"] = int(rng.integers(0, 2))
    lo = 0.1 if op in ("ReduceLogSum",) else -2.0
    return _unary(rng, op, attrs, shape, opset=18, lo=lo, extra_inits=inits, interval=True)


def pad(rng):
    rank = int(rng.integers(1, 4))
    shape = _shape(rng, rank, 1, 4)
    mode = str(rng.choice(["constant", "reflect", "edge", "wrap"]))
    pads = [int(rng.integers(-1 if mode == "constant" else 0, 3)) for _ in range(2 * rank)]
    if mode == "reflect":
        pads = [min(p, shape[i % rank] - 1) for i, p in enumerate(pads)]
    inits = [("pads", np.array(pads, np.int64))]
    if mode == "constant" and rng.random() < 0.5:
        inits.append(("cv", np.array(float(rng.uniform(-3, 3)))))
    return _unary(rng, "Pad", {"mode": mode}, shape, opset=19, extra_inits=inits, interval=True)


def misc_unary(rng):
    op, attrs = [("Celu", {"alpha": float(rng.uniform(0.2, 2))}), ("Shrink", {"bias": float(rng.uniform(0, 1)),
                                                                             "lambd": float(rng.uniform(0, 1))}),
                 ("Selu", {"alpha": float(rng.uniform(0.5, 2)), "gamma": float(rng.uniform(0.5, 2))}),
                 ("Elu", {"alpha": float(rng.uniform(0.1, 2))}),
                 ("HardSigmoid", {"alpha": float(rng.uniform(0.1, 1)), "beta": float(rng.uniform(0, 1))}),
                 ("ThresholdedRelu", {"alpha": float(rng.uniform(-1, 1))}), ("Mish", {}), ("Softsign", {}),
                 ("LeakyRelu", {"alpha": float(rng.uniform(-1, 1))}), ("HardSwish", {}), ("Round", {}),
                 ("Sign", {}), ("Erf", {}), ("Acosh", {}), ("Atanh", {}), ("Asinh", {}), ("Cosh", {}),
                 ("Sinh", {}), ("Tan", {}), ("Asin", {}), ("Acos", {}), ("Atan", {}), ("Reciprocal", {}),
                 ("Softplus", {}), ("IsNaN", {}), ("IsInf", {}), ("Gelu", {"approximate": str(rng.choice(["none",
                                                                                                         "tanh"]))}),
                 ("Trilu", {"upper": int(rng.integers(0, 2))}), ("LpNormalization", {"p": int(rng.choice([1, 2])),
                                                                                    "axis": -1})][
        int(rng.integers(0, 29))]
    shape = _shape(rng, 2, 1, 5)
    lo, hi = {"Acosh": (1.0, 4.0), "Atanh": (-0.99, 0.99), "Asin": (-1, 1), "Acos": (-1, 1)}.get(op, (-3.0, 3.0))
    out = [TP.BOOL] if op in ("IsNaN", "IsInf") else None
    inits = []
    if op == "Trilu" and rng.random() < 0.6:
        inits.append(("k", np.array(int(rng.integers(-3, 4)), np.int64)))
    c = _unary(rng, op, attrs, shape, opset=20, lo=lo, hi=hi, interval=op not in ("IsNaN", "IsInf", "Round",
                                                                                    "Sign"),
               extra_inits=inits, out_types=out)
    if op == "Round":
        c.feeds["x"] = np.round(c.feeds["x"] * 2) / 2  # halves: ties to even
    return c


def index_ops(rng):
    pick = int(rng.integers(0, 6))
    if pick == 0:  # ArgMax / ArgMin with select_last_index and ties
        rank = int(rng.integers(1, 4))
        shape = _shape(rng, rank, 1, 4)
        attrs = {"axis": int(rng.integers(-rank, rank)), "keepdims": int(rng.integers(0, 2)),
                 "select_last_index": int(rng.integers(0, 2))}
        c = _unary(rng, str(rng.choice(["ArgMax", "ArgMin"])), attrs, shape, opset=13, out_types=[TP.INT64])
        c.feeds["x"] = np.round(c.feeds["x"])
        return c
    if pick == 1:  # OneHot
        depth = int(rng.integers(1, 6))
        shape = _shape(rng, int(rng.integers(1, 3)), 1, 4)
        idx = rng.integers(-depth, depth, shape).astype(np.int64)
        axis = int(rng.integers(-len(shape) - 1, len(shape) + 1))
        m = model([N("OneHot", ["i", "d", "v"], ["y"], axis=axis)], [("i", TP.INT64, shape)], [("y", TP.DOUBLE)],
                  [("d", np.array(depth, np.int64)), ("v", np.array([-1.5, 2.5]))], opset=11)
        return Case(m, {"i": idx}, note=f"OneHot {shape} depth {depth} axis {axis}")
    if pick == 2:  # GatherND with batch_dims
        b = int(rng.integers(0, 2))
        shape = _shape(rng, 3, 1, 4)
        last = int(rng.integers(1, 3 - b + 1))
        ishape = shape[:b] + _shape(rng, 1, 1, 3) + [last]
        idx = np.stack([rng.integers(-shape[b + j], shape[b + j], ishape[:-1]) for j in range(last)], -1)
        m = model([N("GatherND", ["x", "i"], ["y"], batch_dims=b)], [("x", TP.DOUBLE, shape)], [("y", TP.DOUBLE)],
                  [("i", idx.astype(np.int64))], opset=13)
        return Case(m, {"x": rand(rng, shape)}, note=f"GatherND {shape} {ishape} b={b}", interval=True)
    if pick == 3:  # ScatterElements with reductions
        rank = int(rng.integers(1, 3))
        shape = _shape(rng, rank, 1, 4)
        axis = int(rng.integers(-rank, rank))
        red = str(rng.choice(["none", "add", "mul", "max", "min"]))
        ushape = list(shape)
        ushape[axis] = int(rng.integers(1, shape[axis] + 1))
        if red == "none":  # unique targets along the axis
            idx = np.argsort(rng.random(shape), axis=axis)
            idx = np.take(idx, range(ushape[axis]), axis=axis)
        else:
            idx = rng.integers(-shape[axis], shape[axis], ushape)
        m = model([N("ScatterElements", ["x", "i", "u"], ["y"], axis=axis, reduction=red)],
                  [("x", TP.DOUBLE, shape), ("u", TP.DOUBLE, ushape)], [("y", TP.DOUBLE)],
                  [("i", idx.astype(np.int64))], opset=18)
        return Case(m, {"x": rand(rng, shape), "u": rand(rng, ushape)}, note=f"ScatterElements {shape} {red} {axis}")
    if pick == 4:  # ScatterND
        shape = _shape(rng, 3, 1, 4)
        last = int(rng.integers(1, 4))
        n = int(rng.integers(1, 4))
        red = str(rng.choice(["none", "add", "mul", "max", "min"]))
        flat = rng.choice(int(np.prod(shape[:last])), size=min(n, int(np.prod(shape[:last]))), replace=False)
        idx = np.stack(np.unravel_index(flat, shape[:last]), -1).astype(np.int64)
        ushape = [len(flat)] + shape[last:]
        m = model([N("ScatterND", ["x", "i", "u"], ["y"], reduction=red)],
                  [("x", TP.DOUBLE, shape), ("u", TP.DOUBLE, ushape)], [("y", TP.DOUBLE)], [("i", idx)], opset=18)
        return Case(m, {"x": rand(rng, shape), "u": rand(rng, ushape)}, note=f"ScatterND {shape} {idx.tolist()} {red}")
    # Mod with fmod on floats / ints
    shape = _shape(rng, 2, 1, 4)
    fmod = int(rng.integers(0, 2))
    if fmod or rng.random() < 0.5:
        a, b = rand(rng, shape, -9, 9), rand(rng, shape, 0.5, 3) * rng.choice([-1, 1], shape)
        tp = TP.DOUBLE
        if not fmod:
            m = None
        else:
            m = model([N("Mod", ["a", "b"], ["y"], fmod=1)], [("a", tp, shape), ("b", tp, shape)], [("y", tp)],
                      opset=13)
        if m is not None:
            return Case(m, {"a": a, "b": b}, note="Mod fmod float")
    a = rng.integers(-20, 20, shape).astype(np.int64)
    b = rng.integers(1, 7, shape).astype(np.int64) * rng.choice([-1, 1], shape)
    m = model([N("Mod", ["a", "b"], ["y"], fmod=fmod)], [("a", TP.INT64, shape), ("b", TP.INT64, shape)],
              [("y", TP.INT64)], opset=13)
    return Case(m, {"a": a, "b": b}, rtol=0, atol=0, note=f"Mod int fmod={fmod}")


def spatial(rng):
    pick = int(rng.integers(0, 4))
    if pick == 0:  # AffineGrid
        nd = int(rng.choice([2, 3]))
        n = int(rng.integers(1, 3))
        size = [n, int(rng.integers(1, 3))] + _shape(rng, nd, 1, 4)
        theta = rand(rng, [n, nd, nd + 1])
        ac = int(rng.integers(0, 2))
        m = model([N("AffineGrid", ["t", "s"], ["y"], align_corners=ac)], [("t", TP.DOUBLE, [n, nd, nd + 1])],
                  [("y", TP.DOUBLE)], [("s", np.array(size, np.int64))], opset=20)
        return Case(m, {"t": theta}, note=f"AffineGrid {size} ac={ac}", interval=True)
    if pick == 1:  # CenterCropPad
        rank = int(rng.integers(1, 4))
        shape = _shape(rng, rank, 1, 5)
        axes = sorted(rng.choice(rank, size=int(rng.integers(1, rank + 1)), replace=False).tolist())
        attrs = {"axes": axes} if rng.random() < 0.5 else {}
        if not attrs:
            axes = list(range(rank))
        inits = [("sh", np.array([int(rng.integers(1, 7)) for _ in axes], np.int64))]
        return _unary(rng, "CenterCropPad", attrs, shape, opset=18, extra_inits=inits, interval=True)
    if pick == 2:  # Col2Im
        c, bh, bw = int(rng.integers(1, 3)), int(rng.integers(1, 3)), int(rng.integers(1, 3))
        img = [int(rng.integers(bh, 6)), int(rng.integers(bw, 6))]
        strides = [int(v) for v in rng.integers(1, 3, 2)]
        dil = [int(v) for v in rng.integers(1, 2, 2)]
        pads = [int(v) for v in rng.integers(0, 2, 4)]
        eff = [(img[i] + pads[i] + pads[i + 2] - dil[i] * ([bh, bw][i] - 1) - 1) // strides[i] + 1 for i in range(2)]
        if min(eff) < 1:
            eff = [1, 1]
            pads = [0, 0, 0, 0]
            strides = [1, 1]
            img = [bh, bw]
        L = eff[0] * eff[1]
        shape = [1, c * bh * bw, L]
        inits = [("img", np.array(img, np.int64)), ("blk", np.array([bh, bw], np.int64))]
        return _unary(rng, "Col2Im", {"strides": strides, "dilations": dil, "pads": pads}, shape, opset=18,
                      extra_inits=inits, interval=True)
    # MaxUnpool from a MaxPool's indices (two nodes)
    shape = [1, int(rng.integers(1, 3))] + _shape(rng, 2, 2, 6)
    k = [2, 2]
    x = rand(rng, shape)
    m = model([N("MaxPool", ["x"], ["p", "i"], kernel_shape=k, strides=k),
               N("MaxUnpool", ["p", "i"], ["y"], kernel_shape=k, strides=k)], [("x", TP.DOUBLE, shape)],
              [("y", TP.DOUBLE)], opset=11)
    return Case(m, {"x": x}, note=f"MaxPool->MaxUnpool {shape}")


def two_node(rng):
    """A few two-node chains through the new handlers: TopK -> Gather, Einsum -> Hardmax, CumSum -> Resize."""
    pick = int(rng.integers(0, 3))
    shape = _shape(rng, 2, 2, 5)
    x = rand(rng, shape)
    if pick == 0:
        k = int(rng.integers(1, shape[1] + 1))
        nodes = [N("TopK", ["x", "k"], ["v", "i"], axis=1), N("GatherElements", ["x", "i"], ["y"], axis=1)]
        m = model(nodes, [("x", TP.DOUBLE, shape)], [("y", TP.DOUBLE)], [("k", np.array([k], np.int64))], 11)
        return Case(m, {"x": x}, note=f"TopK->GatherElements {shape} k={k}")
    if pick == 1:
        nodes = [N("Einsum", ["x", "x"], ["e"], equation="ij,kj->ik"), N("Hardmax", ["e"], ["y"], axis=-1)]
        m = model(nodes, [("x", TP.DOUBLE, shape)], [("y", TP.DOUBLE)], opset=13)
        return Case(m, {"x": x}, note=f"Einsum->Hardmax {shape}")
    nodes = [N("CumSum", ["x", "ax"], ["c"], reverse=1),
             N("Resize", ["c", "", "sc"], ["y"], mode="linear")]
    m = model(nodes, [("x", TP.DOUBLE, shape)], [("y", TP.DOUBLE)],
              [("ax", np.array(1, np.int64)), ("sc", np.array([1, 1.5], np.float32))], opset=18)
    return Case(m, {"x": x}, note=f"CumSum->Resize {shape}", interval=True)


FAMILIES: dict[str, Callable] = {
    "gridsample": gridsample, "lppool": lppool, "maxpool_indices": maxpool_indices, "avgpool": avgpool,
    "topk": topk, "recurrent": recurrent, "einsum": einsum, "cumulative": cumulative, "hardmax": hardmax,
    "dft": dft, "stft": stft, "quantize": quantize, "cast": cast, "control": control, "resize": resize,
    "reduce": reduce, "pad": pad, "misc_unary": misc_unary, "index_ops": index_ops, "spatial": spatial,
    "two_node": two_node,
}
