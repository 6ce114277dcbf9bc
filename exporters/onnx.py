"""Bundles as ONNX models (``export_onnx``, ``to_onnx_model``), the inverse of the ONNX importer.

One small function per IR kind in ``ONNX_EXPORTERS`` writes the ONNX nodes for it. Payload tensors
bound in the role map become initializers under their external names, in their external layout
(the binding's transform is undone and replayed as ONNX ``Transpose``/``Reshape``/``Cast`` nodes,
or folded into ``Gemm``'s ``transB``), so importing the result gives back the same role map.
Explicit ``broadcast_to`` nodes feeding elementwise ops are left to ONNX's implicit broadcasting
(decided by ``passes.absorb_broadcasts``), which is what the importer turns back into them. Auxiliary constants (shapes, axes, scalars) are
``Constant`` nodes, never initializers. Output is deterministic: same bundle, same bytes.

Every file carries, in its metadata, which ONNX value holds each IR node's value
(``torchlean_bridge.node_values``: a JSON list, entry ``i`` the value name of node ``i`` or null for
an absorbed broadcast) and the node kinds (``torchlean_bridge.node_kinds``), so a differential test
of a bundle against its own export compares every node, not only the outputs.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable

import numpy as np

from torchlean_bridge.bundle import Bundle
from torchlean_bridge.errors import ExportError
from torchlean_bridge.fileio import atomic_write_bytes
from torchlean_bridge.graph import Node
from torchlean_bridge.ops import BOOL, INT64
from torchlean_bridge.passes.absorb_broadcasts import absorb_broadcasts
from torchlean_bridge.roles import transform_shape

from .onnx_spatial import SPATIAL_EXPORTERS

__all__ = ["export_onnx", "to_onnx_model", "ONNX_EXPORTERS", "OPSET", "IR_VERSION", "blocking_nodes",
           "NODE_VALUES_KEY", "NODE_KINDS_KEY", "node_value_names"]

OPSET, IR_VERSION = 21, 10
NODE_VALUES_KEY, NODE_KINDS_KEY = "torchlean_bridge.node_values", "torchlean_bridge.node_kinds"


def _elem_type(dtype: str) -> int:
    from onnx import TensorProto
    return {INT64: TensorProto.INT64, BOOL: TensorProto.BOOL}.get(dtype, TensorProto.FLOAT)


def _as_onnx_array(a: np.ndarray) -> np.ndarray:
    """Payload tensors in the model's element types: float32, int64, bool."""
    a = np.asarray(a)
    if a.dtype.kind == "f" and a.dtype != np.float32:
        return a.astype(np.float32)
    if a.dtype.kind in "iu":
        return a.astype(np.int64)
    return a


class OnnxWriter:
    """Accumulates ONNX nodes, initializers and value names while the IR is walked in order."""

    def __init__(self, bundle: Bundle, expose_all_nodes: bool) -> None:
        self.bundle = bundle
        self.g = bundle.graph
        self.expose_all = expose_all_nodes
        self.nodes: list[Any] = []
        self.initializers: dict[str, Any] = {}
        self._init_values: dict[str, np.ndarray] = {}
        self.used: set[str] = set()
        self.names: dict[int, str] = {}
        self.bindings: dict[tuple[int, str], list[Any]] = {}
        for b in bundle.roles.bindings():
            self.bindings.setdefault((b.node, b.role), []).append(b)
        shapes = bundle.report.get("external_shapes", {}) if isinstance(bundle.report, dict) else {}
        self.external_shapes = shapes if isinstance(shapes, dict) else {}
        _, absorption = absorb_broadcasts(bundle)
        self.absorbed_operands: dict[tuple[int, int], int] = absorption.facts["operands"]
        # with every node exposed, each broadcast's own value is written too
        self.absorbed: frozenset[int] = frozenset() if expose_all_nodes else absorption.facts["absorbed"]
        self.output_names = self._output_names()

    # -- naming -------------------------------------------------------------------------------
    def unique(self, base: str) -> str:
        name, k = base, 1
        while name in self.used:
            name, k = f"{base}_{k}", k + 1
        self.used.add(name)
        return name

    def _output_names(self) -> dict[int, str]:
        out: dict[int, str] = {}
        reserved = {b.key for b in self.bundle.roles.bindings()}
        self.used |= reserved
        for nid in self.g.inputs:
            src = self.g.nodes[nid].source
            self.names[nid] = self.unique(src.tensor or src.name if src and (src.tensor or src.name)
                                          else f"input_{len(self.names)}")
        ids = range(len(self.g.nodes)) if self.expose_all else self.g.outputs
        for k, nid in enumerate(ids):
            if nid in out:
                continue
            src = self.g.nodes[nid].source
            base = f"node_{nid}" if self.expose_all else (src.tensor if src and src.tensor else f"output_{k}")
            out[nid] = self.unique(base)
        return out

    def value(self, nid: int) -> str:
        """The ONNX name of node ``nid``'s value (absorbed broadcasts resolve to their source)."""
        return self.names[nid]

    def out(self, node: Node) -> str:
        """The name this node's ONNX output gets (its graph-output name when it is one)."""
        name = self.output_names.get(node.id) or self.unique(f"v{node.id}")
        self.names[node.id] = name
        return name

    def bind_name(self, node: Node, name: str) -> None:
        """Node's value already exists under ``name``: reuse it, adding Identity for an output."""
        if node.id in self.output_names:
            self.emit("Identity", [name], self.output_names[node.id], node)
            self.names[node.id] = self.output_names[node.id]
        else:
            self.names[node.id] = name

    # -- emission -----------------------------------------------------------------------------
    def emit(self, op: str, inputs: list[str], output: str | None, node: Node, unused_outputs: int = 0,
             **attrs: Any) -> str:
        """One ONNX node; ``unused_outputs`` more outputs get fresh names nothing reads (TopK's Indices)."""
        from onnx import helper
        output = output or self.unique(f"v{node.id}_{op.lower()}")
        name = self.unique(f"n{node.id}_{op}")
        extra = [self.unique(f"v{node.id}_unused") for _ in range(unused_outputs)]
        self.nodes.append(helper.make_node(op, inputs, [output, *extra], name=name, **attrs))
        return output

    def constant(self, value: Any, node: Node, dtype: Any = np.int64) -> str:
        from onnx import helper, numpy_helper
        arr = _as_onnx_array(np.asarray(value, dtype=dtype) if dtype is not None else np.asarray(value))
        out = self.unique(f"v{node.id}_const")
        self.nodes.append(helper.make_node("Constant", [], [out], name=self.unique(f"n{node.id}_Constant"),
                                           value=numpy_helper.from_array(arr, out)))
        return out

    def initializer(self, name: str, value: np.ndarray) -> str:
        """An initializer under ``name``; a second, different tensor under one key gets a new name."""
        from onnx import numpy_helper
        arr = np.asarray(_as_onnx_array(value), order="C")  # (ascontiguousarray would make 0-d tensors 1-d)
        if name in self._init_values:
            prev = self._init_values[name]
            if prev.dtype == arr.dtype and prev.shape == arr.shape and np.array_equal(prev, arr):
                return name
            name = self.unique(name)
        self.used.add(name)
        self._init_values[name] = arr
        self.initializers[name] = numpy_helper.from_array(arr, name)
        return name

    # -- payload tensors ----------------------------------------------------------------------
    def _external(self, key: str, transform: str | None, payload: np.ndarray) -> tuple[np.ndarray, list[str]]:
        """Undo a binding transform: the external tensor and the steps that remake the payload."""
        steps = [s for s in (transform or "").split(";") if s]
        if not steps:
            return payload, []
        shape = self.external_shapes.get(key)
        before: list[tuple[int, ...] | None] = []
        cur = tuple(shape) if shape is not None else None
        for s in steps:
            before.append(cur)
            cur = transform_shape(s, cur) if cur is not None else None
        x = payload
        for s, prev in zip(reversed(steps), reversed(before)):
            name, _, arg = s.partition(":")
            if name == "transpose":
                x = x.T
            elif name == "permute":
                x = np.transpose(x, np.argsort([int(v) for v in arg.split(",")]))
            elif name == "reshape" and prev is not None and math.prod(prev) == x.size:
                x = x.reshape(prev)
            else:
                return payload, []  # not invertible without the original: store the payload as is
        return x, steps

    def payload_input(self, node: Node, role: str, allow_transposed: bool = False,
                      allow_leading_ones: bool = False) -> tuple[str, bool]:
        """Name of a tensor equal to payload ``role``; when allowed, its transpose or the same values
        with leading 1-axes (what ``Gemm`` and broadcasting ``Add`` read directly)."""
        value = self.bundle.payload.get(node.id, role)
        binding = next(iter(self.bindings.get((node.id, role), ())), None)
        if binding is None:
            return self.initializer(self.unique(f"{node.kind}_{node.id}.{role}"), value), False
        x, steps = self._external(binding.key, binding.transform, value)
        transposed = False
        if allow_transposed and steps and steps[-1] == "transpose":
            steps, transposed = steps[:-1], True
        if allow_leading_ones and len(steps) == 1 and steps[0].startswith("reshape:") \
                and x.shape[x.ndim - value.ndim:] == value.shape and all(d == 1 for d in x.shape[:x.ndim - value.ndim]):
            steps = []
        name = self.initializer(binding.key, x)
        for s in steps:
            op, _, arg = s.partition(":")
            if op in ("transpose", "permute"):
                perm = [1, 0] if op == "transpose" else [int(v) for v in arg.split(",")]
                name = self.emit("Transpose", [name], None, node, perm=perm)
            else:  # reshape (``_external`` returns no other steps)
                name = self.emit("Reshape", [name, self.constant([int(v) for v in arg.split(",") if v], node)],
                                 None, node)
        return name, transposed

    def has_role(self, node: Node, role: str, zero_default: bool) -> bool:
        """Whether a payload role must be written (an unbound all-zero default need not be)."""
        value = self.bundle.payload.get(node.id, role)
        if value is None:
            return False
        bound = (node.id, role) in self.bindings
        return bound or not (zero_default and not np.any(value))

    # -- broadcasting (decided once by passes.absorb_broadcasts) -------------------------------------
    def operands(self, node: Node) -> list[str]:
        """Parent value names; an absorbed broadcast reads its source (ONNX broadcasts implicitly)."""
        return [self.value(self.absorbed_operands.get((node.id, i), p)) for i, p in enumerate(node.parents)]


Exporter = Callable[[OnnxWriter, Node], None]


# -- handlers ---------------------------------------------------------------------------------

def _simple(op: str, **fixed: Any) -> Exporter:
    def export(w: OnnxWriter, node: Node) -> None:
        w.emit(op, w.operands(node), w.out(node), node, **fixed)
    return export


def _with_attrs(op: str, **mapping: str) -> Exporter:
    """``onnx_attr=ir_attr`` copied from the node."""
    def export(w: OnnxWriter, node: Node) -> None:
        w.emit(op, w.operands(node), w.out(node), node, **{o: node.attrs[i] for o, i in mapping.items()})
    return export


def _const(w: OnnxWriter, node: Node) -> None:
    if (node.id, "values") in w.bindings:
        name, _ = w.payload_input(node, "values")
        w.bind_name(node, name)
        return
    value = w.bundle.payload.get(node.id, "values")
    if value is None:
        raise ExportError(f"ONNX export: const node {node.id} has no payload `values`", node=node.id, op="const")
    w.bind_name(node, w.constant(value, node, dtype=None))


def _linear(w: OnnxWriter, node: Node) -> None:
    x = w.operands(node)[0]
    rank = len(w.g.nodes[node.parents[0]].out_shape)
    weight, transposed = w.payload_input(node, "weight", allow_transposed=True)
    with_bias = w.has_role(node, "bias", zero_default=True)
    bias = [w.payload_input(node, "bias", allow_leading_ones=True)[0]] if with_bias else []
    if rank == 2:
        w.emit("Gemm", [x, weight, *bias], w.out(node), node, transB=0 if transposed else 1)
        return
    if not transposed:
        weight = w.emit("Transpose", [weight], None, node, perm=[1, 0])
    if not bias:
        w.emit("MatMul", [x, weight], w.out(node), node)
        return
    mm = w.emit("MatMul", [x, weight], None, node)
    w.emit("Add", [mm, bias[0]], w.out(node), node)


def _batched(w: OnnxWriter, node: Node, make: Callable[[str, str | None], str], lead_ok: int) -> None:
    """Run ``make`` on an input with one leading batch axis, adding it (and removing it) if absent."""
    x = w.operands(node)[0]
    rank = len(w.g.nodes[node.parents[0]].out_shape)
    if rank == lead_ok:
        make(x, w.out(node))
        return
    if rank != lead_ok - 1:
        raise ExportError(f"ONNX export: node {node.id} ({node.kind}): input rank {rank} is not supported",
                          node=node.id, op=node.kind)
    y = make(w.emit("Unsqueeze", [x, w.constant([0], node)], None, node), None)
    w.emit("Squeeze", [y, w.constant([0], node)], w.out(node), node)


def _conv(w: OnnxWriter, node: Node) -> None:
    """``Conv``, or ``ConvTranspose`` (same geometry attributes plus ``output_padding``)."""
    a = node.attrs
    if a["channel_axis"] > 1:
        raise ExportError(f"ONNX export: {node.kind} node {node.id}: channel_axis {a['channel_axis']} is not "
                          f"supported", node=node.id, op=node.kind)
    weight, _ = w.payload_input(node, "weight")
    bias = [w.payload_input(node, "bias")[0]] if w.has_role(node, "bias", zero_default=True) else []
    op, extra = "Conv", {}
    if node.kind == "conv_transpose":
        op, extra = "ConvTranspose", {"output_padding": list(a["output_padding"])}

    def make(x: str, out: str | None) -> str:
        return w.emit(op, [x, weight, *bias], out, node, kernel_shape=list(a["kernel"]),
                      strides=list(a["stride"]), pads=list(a["padding"]) + list(a["padding_after"]),
                      dilations=list(a["dilation"]), group=a["groups"], **extra)
    _batched(w, node, make, a["spatial_rank"] + 2)


def _cumsum(w: OnnxWriter, node: Node) -> None:
    a = node.attrs
    w.emit("CumSum", [w.operands(node)[0], w.constant(a["axis"], node)], w.out(node), node,
           exclusive=int(a["exclusive"]), reverse=int(a["reverse"]))


def _sort(w: OnnxWriter, node: Node) -> None:
    """``TopK`` with sorted=1 (its Indices output unused)."""
    a = node.attrs
    w.emit("TopK", [w.operands(node)[0], w.constant([a["k"]], node)], w.out(node), node, unused_outputs=1,
           axis=a["axis"], largest=int(a["descending"]), sorted=1)


def _resize_linear(w: OnnxWriter, node: Node) -> None:
    """``Resize`` in linear mode with the full output shape as ``sizes`` (onnxruntime then derives
    each scale as out/in, the ratio our coordinates use)."""
    (x,) = w.operands(node)
    w.emit("Resize", [x, "", "", w.constant(list(node.out_shape), node)], w.out(node), node, mode="linear",
           coordinate_transformation_mode=node.attrs["coordinate_mode"])


def _batch_norm(w: OnnxWriter, node: Node) -> None:
    if node.attrs["channel_axis"] > 1:
        raise ExportError(f"ONNX export: batch_norm_eval node {node.id}: channel_axis {node.attrs['channel_axis']} "
                          f"is not supported", node=node.id, op="batch_norm_eval")
    params = [w.payload_input(node, r)[0] for r in ("weight", "bias", "running_mean", "running_var")]
    rank = len(w.g.nodes[node.parents[0]].out_shape)

    def make(x: str, out: str | None) -> str:
        return w.emit("BatchNormalization", [x, *params], out, node, epsilon=float(node.attrs["eps"]))
    _batched(w, node, make, rank if node.attrs["channel_axis"] == 1 else rank + 1)


def _layernorm(w: OnnxWriter, node: Node) -> None:
    suffix = w.g.nodes[node.parents[0]].out_shape[node.attrs["axis"]:]
    if w.bundle.payload.get(node.id, "weight") is not None:
        scale = w.payload_input(node, "weight")[0]
    else:
        scale = w.constant(np.ones(suffix, np.float32), node, dtype=None)
    bias = [w.payload_input(node, "bias")[0]] if w.bundle.payload.get(node.id, "bias") is not None else []
    w.emit("LayerNormalization", [w.operands(node)[0], scale, *bias], w.out(node), node,
           axis=node.attrs["axis"], epsilon=float(node.attrs["eps"]))


def _pool(op: str, v1: bool) -> Exporter:
    def export(w: OnnxWriter, node: Node) -> None:
        a = node.attrs
        r = a["spatial_rank"]
        attrs: dict[str, Any] = {"kernel_shape": list(a["kernel"]), "strides": list(a["stride"])}
        after = a["padding"] if v1 else a["padding_after"]
        attrs["pads"] = list(a["padding"]) + list(after)
        if not v1:
            attrs["dilations"] = list(a["dilation"])
            attrs["ceil_mode"] = int(a["ceil_mode"])
        if op == "AveragePool":
            attrs["count_include_pad"] = 1 if v1 else int(a["count_include_pad"])
        x = w.operands(node)[0]
        s = w.g.nodes[node.parents[0]].out_shape
        if len(s) == r + 2:
            w.emit(op, [x], w.out(node), node, **attrs)
            return
        lead = s[:len(s) - r]
        x4 = w.emit("Reshape", [x, w.constant([math.prod(lead), 1, *s[len(s) - r:]], node)], None, node)
        y = w.emit(op, [x4], None, node, **attrs)
        w.emit("Reshape", [y, w.constant(list(node.out_shape), node)], w.out(node), node)
    return export


def _reduce(op: str) -> Exporter:
    def export(w: OnnxWriter, node: Node) -> None:
        if "axis" in node.attrs:
            axes, keep = [node.attrs["axis"]], 0
        else:
            axes, keep = list(node.attrs["axes"]), int(node.attrs["keepdim"])
        w.emit(op, [w.operands(node)[0], w.constant(axes, node)], w.out(node), node, keepdims=keep)
    return export


def _sum(w: OnnxWriter, node: Node) -> None:
    w.emit("ReduceSum", [w.operands(node)[0]], w.out(node), node, keepdims=0)


def _reshape(w: OnnxWriter, node: Node) -> None:
    shape = list(node.out_shape)
    w.emit("Reshape", [w.operands(node)[0], w.constant(shape, node)], w.out(node), node,
           **({"allowzero": 1} if 0 in shape else {}))


def _transpose(w: OnnxWriter, node: Node) -> None:
    perm = list(range(len(node.out_shape)))
    a1, a2 = node.attrs["axis1"], node.attrs["axis2"]
    perm[a1], perm[a2] = perm[a2], perm[a1]
    w.emit("Transpose", w.operands(node), w.out(node), node, perm=perm)


def _axes_input(op: str) -> Exporter:
    def export(w: OnnxWriter, node: Node) -> None:
        w.emit(op, [w.operands(node)[0], w.constant(list(node.attrs["axes"]), node)], w.out(node), node)
    return export


def _expand(w: OnnxWriter, node: Node) -> None:
    w.emit("Expand", [w.value(node.parents[0]), w.constant(list(node.out_shape), node)], w.out(node), node)


def _slice(w: OnnxWriter, node: Node) -> None:
    a = node.attrs
    ins = [w.constant(list(a[k]), node) for k in ("starts", "ends", "axes", "steps")]
    w.emit("Slice", [w.operands(node)[0], *ins], w.out(node), node)


def _pad(w: OnnxWriter, node: Node) -> None:
    a = node.attrs
    pads = w.constant(list(a["pads_before"]) + list(a["pads_after"]), node)
    value = w.constant(np.asarray(a["value"], np.float32), node, dtype=None)
    w.emit("Pad", [w.operands(node)[0], pads, value], w.out(node), node, mode="constant")


def _pow(w: OnnxWriter, node: Node) -> None:
    e = w.constant(np.asarray(node.attrs["exponent"], np.float32), node, dtype=None)
    w.emit("Pow", [w.operands(node)[0], e], w.out(node), node)


def _clamp(w: OnnxWriter, node: Node) -> None:
    bounds = [w.constant(np.asarray(node.attrs[k], np.float32), node, dtype=None) if node.attrs[k] is not None
              else "" for k in ("min", "max")]
    while bounds and bounds[-1] == "":
        bounds.pop()
    w.emit("Clip", [w.operands(node)[0], *bounds], w.out(node), node)


def _cast(w: OnnxWriter, node: Node) -> None:
    w.emit("Cast", w.operands(node), w.out(node), node, to=_elem_type(node.attrs["dtype"]))


def _ne(w: OnnxWriter, node: Node) -> None:
    eq = w.emit("Equal", w.operands(node), None, node)
    w.emit("Not", [eq], w.out(node), node)


def _silu(w: OnnxWriter, node: Node) -> None:
    x = w.operands(node)[0]
    w.emit("Mul", [x, w.emit("Sigmoid", [x], None, node)], w.out(node), node)


def _rsqrt(w: OnnxWriter, node: Node) -> None:
    w.emit("Reciprocal", [w.emit("Sqrt", w.operands(node), None, node)], w.out(node), node)


def _safe_log(w: OnnxWriter, node: Node) -> None:
    x, eps = w.operands(node)
    w.emit("Log", [w.emit("Add", [w.emit("Softplus", [x], None, node), eps], None, node)], w.out(node), node)


def _mse_loss(w: OnnxWriter, node: Node) -> None:
    d = w.emit("Sub", w.operands(node), None, node)
    w.emit("ReduceMean", [w.emit("Mul", [d, d], None, node)], w.out(node), node, keepdims=0)


def _flatten(w: OnnxWriter, node: Node) -> None:
    w.emit("Reshape", [w.operands(node)[0], w.constant(list(node.out_shape), node)], w.out(node), node)


def _concat(w: OnnxWriter, node: Node) -> None:
    w.emit("Concat", w.operands(node), w.out(node), node, axis=node.attrs["axis"])


# exp2, log2 and trunc have no ONNX op and are blocking nodes (Pow(2, x) and Log(x) / ln 2 round differently).
# expm1 and log1p have no entry on purpose: ONNX has no Expm1 op, and Exp(x) - 1 (or Elu/Celu, which
# onnxruntime computes that way) cancels for |x| << 1 (relative error up to eps / |x|), as does
# Log(1 + x) for log1p, so an expm1 or log1p node is a blocking node, refused by name like the other kinds
# without an exact ONNX form.
ONNX_EXPORTERS: dict[str, Exporter] = {
    "const": _const, "linear": _linear, "conv": _conv, "conv_transpose": _conv, "batch_norm_eval": _batch_norm,
    "layernorm": _layernorm, "resize_linear": _resize_linear, "cumsum": _cumsum, "sort": _sort,
    "add": _simple("Add"), "sub": _simple("Sub"), "mul_elem": _simple("Mul"), "div": _simple("Div"),
    "max_elem": _simple("Max"), "min_elem": _simple("Min"), "matmul": _simple("MatMul"), "prelu": _simple("PRelu"),
    "abs": _simple("Abs"), "sqrt": _simple("Sqrt"), "inv": _simple("Reciprocal"), "relu": _simple("Relu"),
    "tanh": _simple("Tanh"), "sigmoid": _simple("Sigmoid"), "exp": _simple("Exp"), "log": _simple("Log"),
    "sin": _simple("Sin"), "cos": _simple("Cos"), "tan": _simple("Tan"), "softplus": _simple("Softplus"),
    "neg": _simple("Neg"), "erf": _simple("Erf"), "softsign": _simple("Softsign"), "sign": _simple("Sign"),
    "floor": _simple("Floor"), "ceil": _simple("Ceil"), "hardswish": _simple("HardSwish"), "mish": _simple("Mish"),
    "selu": _simple("Selu"), "detach": _simple("Identity"), "round": _simple("Round"), "atan": _simple("Atan"),
    "asin": _simple("Asin"), "acos": _simple("Acos"), "sinh": _simple("Sinh"), "cosh": _simple("Cosh"),
    "asinh": _simple("Asinh"), "acosh": _simple("Acosh"), "atanh": _simple("Atanh"),
    "gelu": _with_attrs("Gelu", approximate="approximate"),
    "leaky_relu": _with_attrs("LeakyRelu", alpha="negative_slope"),
    "elu": _with_attrs("Elu", alpha="alpha"), "celu": _with_attrs("Celu", alpha="alpha"),
    "hardsigmoid": _with_attrs("HardSigmoid", alpha="alpha", beta="beta"),
    "softmax": _with_attrs("Softmax", axis="axis"), "log_softmax": _with_attrs("LogSoftmax", axis="axis"),
    "silu": _silu, "rsqrt": _rsqrt, "safe_log": _safe_log, "mse_loss": _mse_loss,
    "pow": _pow, "clamp": _clamp, "cast": _cast, "where": _simple("Where"),
    "eq": _simple("Equal"), "ne": _ne, "lt": _simple("Less"), "le": _simple("LessOrEqual"),
    "gt": _simple("Greater"), "ge": _simple("GreaterOrEqual"), "logical_and": _simple("And"),
    "logical_or": _simple("Or"), "logical_not": _simple("Not"), "isnan": _simple("IsNaN"),
    "reduce_sum": _reduce("ReduceSum"), "reduce_mean": _reduce("ReduceMean"),
    "reduce_sum_axes": _reduce("ReduceSum"), "reduce_mean_axes": _reduce("ReduceMean"),
    "reduce_max": _reduce("ReduceMax"), "reduce_min": _reduce("ReduceMin"), "reduce_prod": _reduce("ReduceProd"),
    "sum": _sum,
    "argmax": lambda w, n: w.emit("ArgMax", w.operands(n), w.out(n), n, axis=n.attrs["axis"],
                                  keepdims=int(n.attrs["keepdim"])),
    "argmin": lambda w, n: w.emit("ArgMin", w.operands(n), w.out(n), n, axis=n.attrs["axis"],
                                  keepdims=int(n.attrs["keepdim"])),
    "permute": lambda w, n: w.emit("Transpose", w.operands(n), w.out(n), n, perm=list(n.attrs["perm"])),
    "transpose": _transpose, "reshape": _reshape, "flatten": _flatten, "squeeze": _axes_input("Squeeze"),
    "unsqueeze": _axes_input("Unsqueeze"), "expand": _expand, "broadcast_to": _expand, "concat": _concat,
    "slice": _slice, "pad": _pad, "gather": _with_attrs("Gather", axis="axis"),
    "gather_elements": _with_attrs("GatherElements", axis="axis"),
    "max_pool": _pool("MaxPool", True), "avg_pool": _pool("AveragePool", True),
    "max_pool_nd": _pool("MaxPool", False), "avg_pool_nd": _pool("AveragePool", False),
}


def _mod(w: OnnxWriter, node: Node) -> None:
    """Mod-13 (the exported opset) needs fmod=1 on floats; a float numpy.mod node is a blocking node."""
    if node.dtype != "int64" and not node.attrs["fmod"]:
        raise ExportError(f"ONNX export: node {node.id}: mod with fmod=0 on floats needs Mod-28 (opset {OPSET} "
                          f"has none)", node=node.id, op=node.kind)
    w.emit("Mod", w.operands(node), w.out(node), node, fmod=int(node.attrs["fmod"]))


def _bitwise_not(w: OnnxWriter, node: Node) -> None:
    """int64 BitwiseNot is ~x: the node's value only for a signed type (unsigned ~x is 2^bits - 1 - x)."""
    if not node.attrs["signed"]:
        raise ExportError(f"ONNX export: node {node.id}: bitwise_not of a uint{node.attrs['bits']} value has no "
                          f"int64 ONNX form", node=node.id, op=node.kind)
    w.emit("BitwiseNot", w.operands(node), w.out(node), node)


def _bitshift(w: OnnxWriter, node: Node) -> None:
    """Unsigned types only (BitShift-11): on uint{bits} with the shift clamped to bits - 1, and 0 where the
    shift is bits or more (what the IR defines; C++ leaves such shifts undefined)."""
    from onnx import TensorProto
    bits = int(node.attrs["bits"])
    if node.attrs["signed"] or bits == 64:
        raise ExportError(f"ONNX export: node {node.id}: bitshift on {'int' if node.attrs['signed'] else 'uint'}"
                          f"{bits} needs BitShift-28 (opset {OPSET} has none)", node=node.id, op=node.kind)
    utype = {8: TensorProto.UINT8, 16: TensorProto.UINT16, 32: TensorProto.UINT32}[bits]
    x, s = w.operands(node)
    top = w.constant(np.asarray(bits - 1, np.int64), node)
    shifted = w.emit("BitShift", [w.emit("Cast", [x], None, node, to=utype),
                                  w.emit("Cast", [w.emit("Min", [s, top], None, node)], None, node, to=utype)],
                     None, node, direction="LEFT" if node.attrs["left"] else "RIGHT")
    wide = w.emit("Cast", [shifted], None, node, to=TensorProto.INT64)
    w.emit("Where", [w.emit("Greater", [s, top], None, node), w.constant(np.asarray(0, np.int64), node), wide],
           w.out(node), node)


# integer ops (issue #15): int64 Add/Sub/... compute the same values wherever the IR's node is defined (the IR
# refuses results outside the node's element type; ONNX int64 wraps only beyond int64).
ONNX_EXPORTERS.update({
    "int_add": _simple("Add"), "int_sub": _simple("Sub"), "int_mul": _simple("Mul"), "int_div": _simple("Div"),
    "int_max": _simple("Max"), "int_min": _simple("Min"), "bitwise_and": _simple("BitwiseAnd"),
    "bitwise_or": _simple("BitwiseOr"), "bitwise_xor": _simple("BitwiseXor"), "bitwise_not": _bitwise_not,
    "mod": _mod, "bitshift": _bitshift,
})

# det, int_cumsum (issue #15, ops): Det-11, CumSum-14 on int64. cumprod and bitcast are blocking nodes: CumProd and BitCast are opset 26.
ONNX_EXPORTERS.update({"det": _simple("Det"), "int_cumsum": _cumsum})


# -- resize (issue #15): ONNX Resize with the node's own scales (float32) or its sizes (scale out/in) --------


def _resize(w: OnnxWriter, node: Node) -> None:
    """``Resize`` with the node's attributes; the coordinates' scales are given as float32 ``scales`` when
    each is one (and floors to the node's extent), else as ``sizes`` when each is out/in; otherwise refused."""
    from fractions import Fraction

    from torchlean_bridge.ops.ext_resize import parse_rationals
    a = node.attrs
    (x,) = w.operands(node)
    in_shape = w.g.nodes[node.parents[0]].out_shape
    scales, roi = parse_rationals(a["scales"], "scales"), parse_rationals(a["roi"], "roi")
    as_f32 = [Fraction(float(np.float32(f))) == f for f in scales]
    if all(as_f32) and all(int(n * f) == m for n, f, m in zip(in_shape, scales, node.out_shape)):
        targets = [w.constant(np.asarray([float(f) for f in scales], np.float32), node, dtype=None)]
    elif all(f == Fraction(m, n) for n, f, m in zip(in_shape, scales, node.out_shape)):
        targets = ["", w.constant(list(node.out_shape), node)]
    else:
        raise ExportError(f"ONNX export: node {node.id}: resize with scales {a['scales']} that are neither float32 "
                          f"values nor out/in for sizes {list(node.out_shape)}", node=node.id, op=node.kind)
    roi_in = ""
    if roi:
        exact32 = all(Fraction(float(np.float32(v))) == v for v in roi)
        if not all(Fraction(float(v)) == v for v in roi):
            raise ExportError(f"ONNX export: node {node.id}: resize roi {a['roi']} is not a list of binary64 values",
                              node=node.id, op=node.kind)
        roi_in = w.constant(np.asarray([float(v) for v in roi], np.float32 if exact32 else np.float64), node,
                            dtype=None)
    w.emit("Resize", [x, roi_in, *targets], w.out(node), node, mode=a["mode"],
           coordinate_transformation_mode=a["coordinate_mode"], nearest_mode=a["nearest_mode"],
           cubic_coeff_a=float(a["cubic_coeff_a"]), exclude_outside=int(a["exclude_outside"]),
           antialias=int(a["antialias"]), extrapolation_value=float(a["extrapolation_value"]))


ONNX_EXPORTERS.update({"resize": _resize})


# -- index outputs, unpooling and powers (issue #15): the second output of TopK / MaxPool, MaxUnpool, Pow ------

def _second_output(w: OnnxWriter, node: Node, op: str, inputs: list[str], **attrs: Any) -> None:
    """``op`` with its first output unused and its second the node's value."""
    from onnx import helper
    w.nodes.append(helper.make_node(op, inputs, [w.unique(f"v{node.id}_unused"), w.out(node)],
                                    name=w.unique(f"n{node.id}_{op}"), **attrs))


def _topk_indices(w: OnnxWriter, node: Node) -> None:
    a = node.attrs
    _second_output(w, node, "TopK", [w.operands(node)[0], w.constant([a["k"]], node)], axis=a["axis"],
                   largest=int(a["descending"]), sorted=1)


def _max_pool_indices(w: OnnxWriter, node: Node) -> None:
    a = node.attrs
    if len(w.g.nodes[node.parents[0]].out_shape) != a["spatial_rank"] + 2:
        raise ExportError(f"ONNX export: node {node.id}: max_pool_indices of an input without exactly two leading "
                          "axes", node=node.id, op=node.kind)
    _second_output(w, node, "MaxPool", [w.operands(node)[0]], kernel_shape=list(a["kernel"]),
                   strides=list(a["stride"]), pads=list(a["padding"]) + list(a["padding_after"]),
                   dilations=list(a["dilation"]), ceil_mode=int(a["ceil_mode"]), storage_order=int(a["storage_order"]))


def _max_unpool(w: OnnxWriter, node: Node) -> None:
    """MaxUnpool to the scatter shape (stride 1, a kernel or an end pad that gives it), then a zero Pad at the
    ends up to the output shape (onnxruntime reads MaxUnpool's output_shape differently from onnx's reference)."""
    x, idx = w.operands(node)
    s, grid, out = w.g.nodes[node.parents[0]].out_shape, node.attrs["scatter_shape"], node.out_shape
    kernel = [max(g - n + 1, 1) for n, g in zip(s[2:], grid[2:])]
    ends = [max(n - g, 0) for n, g in zip(s[2:], grid[2:])]
    y = w.emit("MaxUnpool", [x, idx], None if tuple(out) != tuple(grid) else w.out(node), node, kernel_shape=kernel,
               strides=[1] * len(kernel), pads=[0] * len(kernel) + ends)
    if tuple(out) != tuple(grid):
        w.emit("Pad", [y, w.constant([0] * len(out) + [o - g for o, g in zip(out, grid)], node)], w.out(node), node)


ONNX_EXPORTERS.update({"topk_indices": _topk_indices, "max_pool_indices": _max_pool_indices,
                       "max_unpool": _max_unpool, "pow_elem": _simple("Pow"), "int_pow": _simple("Pow")})

# spatial sampling ops (issue #15): exporters/onnx_spatial.py
ONNX_EXPORTERS.update(SPATIAL_EXPORTERS)


def blocking_nodes(bundle: Bundle) -> list[Node]:
    """Nodes ONNX export cannot write (no exporter for their kind)."""
    return [n for n in bundle.graph.nodes if n.kind != "input" and n.kind not in ONNX_EXPORTERS]


def _value_info(name: str, node: Node) -> Any:
    from onnx import helper
    return helper.make_tensor_value_info(name, _elem_type(node.dtype), list(node.out_shape))


def to_onnx_model(bundle: Bundle, expose_all_nodes: bool = False) -> Any:
    """The bundle as an ``onnx.ModelProto`` (opset 21).

    With ``expose_all_nodes`` every node's value is also a graph output, output ``i`` being node
    ``i``'s value, so a differential test can read every intermediate from onnxruntime.
    """
    from onnx import helper
    blocked = blocking_nodes(bundle)
    if blocked:
        lines = [f"  node {n.id}: {n.kind}" + (f" ({n.source})" if n.source else "") for n in blocked]
        raise ExportError(f"ONNX export: {len(blocked)} node(s) have no ONNX form:\n" + "\n".join(lines),
                          node=blocked[0].id, op=blocked[0].kind)
    w = OnnxWriter(bundle, expose_all_nodes)
    g = bundle.graph
    for node in g.nodes:
        if node.kind == "input":
            if node.id in w.output_names:
                w.emit("Identity", [w.names[node.id]], w.output_names[node.id], node)
            continue
        if node.id in w.absorbed:
            continue
        ONNX_EXPORTERS[node.kind](w, node)
    inputs = [_value_info(w.names[i], g.nodes[i]) for i in g.inputs]
    out_ids = range(len(g.nodes)) if expose_all_nodes else g.outputs
    outputs, seen = [], set()
    for k, nid in enumerate(out_ids):
        name = w.output_names[nid]
        if name in seen:  # the same node listed twice among the outputs
            name = w.emit("Identity", [name], w.unique(f"output_{k}"), g.nodes[nid])
        seen.add(name)
        outputs.append(_value_info(name, g.nodes[nid]))
    graph = helper.make_graph(w.nodes, "torchlean_bridge", inputs, outputs, list(w.initializers.values()))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="torchlean-bridge", producer_version=_version())
    model.ir_version = IR_VERSION
    _annotate(model, g, w)
    return model


def _annotate(model: Any, g: Any, w: OnnxWriter) -> None:
    """Record which ONNX value holds each IR node's value, and the node kinds (metadata, JSON)."""
    import json
    from onnx import helper
    values = [None if n.id in w.absorbed else w.names.get(n.id) for n in g.nodes]
    helper.set_model_props(model, {NODE_VALUES_KEY: json.dumps(values, separators=(",", ":")),
                                   NODE_KINDS_KEY: json.dumps([n.kind for n in g.nodes], separators=(",", ":"))})


def node_value_names(model: Any) -> tuple[list[str | None], list[str]] | None:
    """The annotation ``to_onnx_model`` writes: (value name per IR node id, kind per node id), or None
    for a file without it (or with a malformed one: the file then matches by provenance only)."""
    import json
    props = {p.key: p.value for p in model.metadata_props}
    if NODE_VALUES_KEY not in props or NODE_KINDS_KEY not in props:
        return None
    try:
        values, kinds = json.loads(props[NODE_VALUES_KEY]), json.loads(props[NODE_KINDS_KEY])
    except ValueError:
        return None
    if not (isinstance(values, list) and isinstance(kinds, list) and len(values) == len(kinds)
            and all(v is None or isinstance(v, str) for v in values) and all(isinstance(k, str) for k in kinds)):
        return None
    return values, kinds


def _version() -> str:
    from torchlean_bridge import __version__
    return __version__


def export_onnx(bundle: Bundle, file: str | Path | None = None, expose_all_nodes: bool = False) -> Any:
    """Write (atomically, when ``file`` is given) and return the ONNX model; checked by onnx.checker."""
    import onnx
    model = to_onnx_model(bundle, expose_all_nodes)
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as e:
        raise ExportError(f"ONNX export: the model fails onnx.checker: {e}") from None
    if file is not None:
        atomic_write_bytes(file, model.SerializeToString())
    return model


# narrow element types (issue #15): a rounding onto a narrow grid is a Cast there and back, exactly
_NARROW_SINCE = {"float4e2m1": 23, "float8e8m0": 24, "float6e2m3": 27, "float6e3m2": 27}


def _round_float(w: OnnxWriter, node: Node) -> None:
    from onnx import TensorProto
    fmt = node.attrs["format"]
    if _NARROW_SINCE.get(fmt, 0) > OPSET:
        raise ExportError(f"ONNX export: node {node.id}: round_float to {fmt} needs Cast-{_NARROW_SINCE[fmt]} "
                          f"(the exported opset is {OPSET})", node=node.id, op=node.kind)
    saturate = {"saturate": int(node.attrs["saturate"])} if fmt.startswith("float8") else {}
    narrow = w.emit("Cast", w.operands(node), None, node, to=TensorProto.DataType.Value(fmt.upper()), **saturate)
    w.emit("Cast", [narrow], w.out(node), node, to=TensorProto.FLOAT)


def _int_wrap(w: OnnxWriter, node: Node) -> None:
    from onnx import TensorProto
    bits, signed = int(node.attrs["bits"]), bool(node.attrs["signed"])
    if bits == 2:
        raise ExportError(f"ONNX export: node {node.id}: int_wrap to 2 bits needs Cast-25 (the exported opset is "
                          f"{OPSET})", node=node.id, op=node.kind)
    narrow = w.emit("Cast", w.operands(node), None, node,
                    to=TensorProto.DataType.Value(f"{'' if signed else 'U'}INT{bits}"))
    w.emit("Cast", [narrow], w.out(node), node, to=TensorProto.INT64)


def _int_conv(w: OnnxWriter, node: Node) -> None:
    """A binary64 Conv of the operands, back to int64: exact, since the IR refuses sums that could reach 2^53."""
    from onnx import TensorProto
    a = node.attrs
    x, k = (w.emit("Cast", [v], None, node, to=TensorProto.DOUBLE) for v in w.operands(node))
    conv = w.emit("Conv", [x, k], None, node, kernel_shape=list(a["kernel"]), strides=list(a["stride"]),
                  pads=list(a["padding"]) + list(a["padding_after"]), dilations=list(a["dilation"]), group=a["groups"])
    w.emit("Cast", [conv], w.out(node), node, to=TensorProto.INT64)


ONNX_EXPORTERS.update({"round_float": _round_float, "int_wrap": _int_wrap, "int_matmul": _simple("MatMul"),
                       "int_conv": _int_conv})


def _dynamic_slice(w, node):
    """Slice with ends = starts + sizes: wherever the IR node is defined, ONNX reads the same cells."""
    x, s = w.operands(node)
    ends = w.emit("Add", [s, w.constant(np.asarray(node.attrs["sizes"], np.int64), node)], None, node)
    w.emit("Slice", [x, s, ends, w.constant(np.asarray(node.attrs["axes"], np.int64), node)], w.out(node), node)


ONNX_EXPORTERS.update({"int_reduce_sum": _reduce("ReduceSum"), "int_reduce_prod": _reduce("ReduceProd"),
                       "int_reduce_max": _reduce("ReduceMax"), "int_reduce_min": _reduce("ReduceMin"),
                       "dynamic_slice": _dynamic_slice})
