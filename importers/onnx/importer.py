"""ONNX models into IR + payload + role map (``import_onnx``).

The walk is TorchLean's ONNX adapter done fully: every node is folded (all inputs known at import
time), or lowered by the handler its op type maps to in ``HANDLERS`` (opset-aware), or recorded as
unsupported; all unsupported nodes are reported together before anything is built. Static shapes
come from the graph inputs (or ``input_shapes``); onnx's shape inference supplies the declared
shapes the lowering is checked against. Each IR node's ``Source`` names the ONNX node and op type;
the last IR node of a lowering also carries the ONNX output tensor it computes.
"""

from __future__ import annotations

import operator
import os
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from torchlean_bridge.bundle import Bundle
from torchlean_bridge.check import DEFAULT_MAX_ELEMENTS
from torchlean_bridge.errors import BridgeError
from torchlean_bridge.graph import Source
from torchlean_bridge.ops import fmt_shape
from torchlean_bridge.passes.canonicalize import canonical_kinds

from . import ops_math, ops_nn, ops_tensor
from ..builder import GraphBuilder
from .context import Const, NodeUnsupported, OnnxContext, unsupported_error
from .fold import LAYOUT_OPS, NONDETERMINISTIC, check_fold_size, fold_node, fold_shape
from .ops_math import onnx_element_type

__all__ = ["import_onnx", "load_model", "HANDLERS", "EMITTED_KINDS", "MIN_OPSET", "MAX_OPSET"]

HANDLERS = {**ops_math.HANDLERS, **ops_tensor.HANDLERS, **ops_nn.HANDLERS}
# what the handlers emit, after builder.finish's canonicalization (torchlean_bridge.passes.canonicalize)
EMITTED_KINDS: frozenset[str] = canonical_kinds({"input", "const"} | ops_math.EMITS | ops_tensor.EMITS | ops_nn.EMITS)
MIN_OPSET, MAX_OPSET = 9, 21

InputShapes = Mapping[str, Sequence[int]] | Sequence[Sequence[int]] | None


def load_model(path_or_model: Any) -> Any:
    """A ModelProto from a path, bytes or a ModelProto; anything unreadable is a BridgeError."""
    import onnx
    if isinstance(path_or_model, onnx.ModelProto):
        return path_or_model
    if isinstance(path_or_model, (bytes, bytearray)):
        try:
            return onnx.load_from_string(bytes(path_or_model))
        except Exception as e:  # noqa: BLE001 - protobuf raises several unrelated types
            raise BridgeError(f"ONNX import: not a valid ONNX model: {e}") from None
    if isinstance(path_or_model, (str, os.PathLike)):
        path = Path(path_or_model)
        if not path.is_file():
            raise BridgeError(f"ONNX import: no such file: {path}")
        try:
            return onnx.load(str(path))
        except Exception as e:  # noqa: BLE001
            raise BridgeError(f"ONNX import: cannot read {path}: {e}") from None
    raise BridgeError(f"ONNX import: expected a path, bytes or onnx.ModelProto, got {type(path_or_model).__name__}")


def _default_opset(model: Any) -> int:
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx"):
            return int(o.version)
    raise BridgeError("ONNX import: the model imports no default-domain opset")


def _static_shape(value_info: Any) -> tuple[int, ...] | None:
    t = value_info.type.tensor_type
    if not t.HasField("shape"):
        return None
    dims = []
    for d in t.shape.dim:
        if not d.HasField("dim_value"):
            return None
        dims.append(int(d.dim_value))
    return tuple(dims)


def _given_shape(name: str, dims: Any) -> tuple[int, ...]:
    """A caller's shape for input ``name``: a sequence of non-negative ints, else a BridgeError."""
    try:
        shape = tuple(operator.index(d) for d in dims)
    except TypeError:
        shape = None
    if shape is None or isinstance(dims, (str, bytes)) or any(isinstance(d, bool) for d in dims) \
            or any(d < 0 for d in shape):
        raise BridgeError(f"ONNX import: input_shapes for `{name}` must be a sequence of non-negative ints, "
                          f"got {dims!r}"[:300])
    return shape


def _initializer_array(t: Any) -> np.ndarray:
    """An initializer's values; external data that cannot be read is a BridgeError naming it."""
    from onnx import numpy_helper
    try:
        return numpy_helper.to_array(t)
    except Exception as e:  # noqa: BLE001 - onnx raises ValidationError, OSError, ValueError here
        where = {kv.key: kv.value for kv in t.external_data}.get("location")
        detail = f" (external data `{where}`: load the model from its path, next to that file)" if where else ""
        raise BridgeError(f"ONNX import: cannot read initializer `{t.name}`{detail}: {type(e).__name__}: "
                          f"{str(e).splitlines()[0] if str(e) else ''}"[:400]) from None


def _input_shapes(graph_inputs: list[Any], input_shapes: InputShapes) -> dict[str, tuple[int, ...]]:
    """Every real input's static shape, from the model or the caller; a dynamic dim is an error."""
    given: dict[str, tuple[int, ...]] = {}
    if isinstance(input_shapes, Mapping):
        unknown = sorted(set(input_shapes) - {i.name for i in graph_inputs})
        if unknown:
            raise BridgeError(f"ONNX import: input_shapes names unknown inputs {unknown}; the model's inputs are "
                              f"{[i.name for i in graph_inputs]}")
        given = {k: _given_shape(k, v) for k, v in input_shapes.items()}
    elif input_shapes is not None:
        shapes = list(input_shapes)
        if len(shapes) != len(graph_inputs):
            raise BridgeError(f"ONNX import: {len(shapes)} input shapes given for {len(graph_inputs)} inputs")
        given = {i.name: _given_shape(i.name, s) for i, s in zip(graph_inputs, shapes)}
    out = {}
    for vi in graph_inputs:
        if vi.name in given:
            out[vi.name] = given[vi.name]
            continue
        dims = vi.type.tensor_type.shape.dim
        if not vi.type.tensor_type.HasField("shape"):
            raise BridgeError(f"ONNX import: input `{vi.name}` has no shape; pass input_shapes={{'{vi.name}': (...)}} "
                              f"(CLI: --input-shape)")
        for axis, d in enumerate(dims):
            if not d.HasField("dim_value"):
                label = f"`{d.dim_param}`" if d.dim_param else "unknown"
                raise BridgeError(f"ONNX import: input `{vi.name}` has a dynamic dimension at axis {axis} ({label}); "
                                  f"pass input_shapes={{'{vi.name}': (...)}} (CLI: --input-shape) to fix it")
        out[vi.name] = tuple(int(d.dim_value) for d in dims)
    return out


def _declared_shapes(model: Any, shapes: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """Static shapes onnx's shape inference finds once the inputs' shapes are fixed."""
    import onnx
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for vi in m.graph.input:
        if vi.name in shapes:
            vi.type.tensor_type.shape.Clear()
            for d in shapes[vi.name]:
                vi.type.tensor_type.shape.dim.add().dim_value = d
    del m.graph.value_info[:]
    try:
        inferred = onnx.shape_inference.infer_shapes(m, data_prop=True)
    except Exception:  # noqa: BLE001 - inference is advisory: our rules still compute every shape
        return {}
    out = {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
        s = _static_shape(vi)
        if s is not None:
            out[vi.name] = s
    return out


def _consumers(graph: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            if name:
                counts[name] = counts.get(name, 0) + 1
    for o in graph.output:
        counts[o.name] = counts.get(o.name, 0) + 1
    return counts


def import_onnx(path_or_model: Any, input_shapes: InputShapes = None,
                max_elements: int = DEFAULT_MAX_ELEMENTS) -> Bundle:
    """An ONNX model (path, bytes or ModelProto) as a checked bundle.

    ``input_shapes`` fixes dynamic input dimensions: ``{"x": (1, 3, 32, 32)}`` or a list in input order.
    ``max_elements`` caps every node's size and every import-time fold, checked before computing it.
    """
    model = load_model(path_or_model)
    opset = _default_opset(model)
    if opset < MIN_OPSET:
        raise BridgeError(f"ONNX import: opset {opset} is older than the supported {MIN_OPSET}..{MAX_OPSET}; "
                          f"convert it with onnx.version_converter first")
    graph = model.graph
    init_names = {t.name for t in graph.initializer}
    real_inputs = [vi for vi in graph.input if vi.name not in init_names]
    shapes = _input_shapes(real_inputs, input_shapes)
    b = GraphBuilder("onnx", max_elements)
    ctx = OnnxContext(b, opset, _declared_shapes(model, shapes), _consumers(graph))
    for t in graph.initializer:
        ctx.values[t.name] = Const(_initializer_array(t), key=t.name)
    for vi in real_inputs:
        etype = onnx_element_type(vi.type.tensor_type.elem_type)
        if etype is None:
            raise BridgeError(f"ONNX import: input `{vi.name}` has unsupported element type "
                              f"{vi.type.tensor_type.elem_type}")
        ctx.values[vi.name] = b.input(shapes[vi.name], etype,
                                      source=Source(framework="onnx", name=vi.name, tensor=vi.name))
    problems = _lower_nodes(ctx, graph)
    missing = [o.name for o in graph.output if o.name not in ctx.values]
    if problems or missing:
        raise unsupported_error(problems, opset) if problems else \
            BridgeError(f"ONNX import: graph outputs {missing} are produced by no node")
    outputs = [ctx.tensor(o.name) for o in graph.output]
    for o, nid in zip(graph.output, outputs):
        src = b.nodes[nid].source
        if src is not None and src.tensor is None:
            b.nodes[nid] = b.nodes[nid].with_(source=replace(src, tensor=o.name))
    static = sorted(init_names - ctx.used_keys)
    report: dict[str, Any] = {
        "framework": "onnx", "opset": opset, "producer": f"{model.producer_name} {model.producer_version}".strip(),
        "inputs": [vi.name for vi in real_inputs], "outputs": [o.name for o in graph.output],
        "external_shapes": {t.name: list(t.dims) for t in graph.initializer if t.name in ctx.used_keys},
    }
    if static:
        report["static_initializers"] = static
    if opset > MAX_OPSET:
        report["warnings"] = [f"opset {opset} is newer than {MAX_OPSET}; lowered with opset-{MAX_OPSET} rules"]
    return b.finish(outputs, report)


def _lower_nodes(ctx: OnnxContext, graph: Any) -> list[dict]:
    """Fold or lower every node in order; collect every node that cannot be lowered."""
    problems: list[dict] = []
    poisoned: set[str] = set()
    for node in graph.node:
        ctx.node = node
        item = {"name": node.name or (node.output[0] if node.output else "?"), "op": node.op_type,
                "domain": node.domain or "ai.onnx"}
        if any(n in poisoned for n in node.input if n):
            poisoned.update(node.output)
            continue
        unknown = [n for n in node.input if n and n not in ctx.values]
        if unknown:
            problems.append({**item, "reason": f"reads undefined tensors {unknown}"})
            poisoned.update(node.output)
            continue
        try:
            outs = _lower_one(ctx, node)
        except BridgeError as e:  # NodeUnsupported, or a shape rule rejecting the lowered operands
            problems.append({**item, "reason": e.message})
            poisoned.update(node.output)
            continue
        except (ValueError, TypeError, IndexError, KeyError) as e:  # a malformed node (missing attribute...)
            problems.append({**item, "reason": f"malformed node: {type(e).__name__}: {e}"})
            poisoned.update(node.output)
            continue
        for name, value in zip(node.output, outs):
            if name:
                ctx.values[name] = value
        mismatch = _shape_mismatch(ctx, node)
        if mismatch:
            problems.append({**item, "reason": mismatch})
    return problems


def _lower_one(ctx: OnnxContext, node: Any) -> list:
    if node.domain not in ("", "ai.onnx"):
        raise NodeUnsupported(f"custom domain `{node.domain}`")
    inputs = [ctx.values[n] for n in node.input if n]
    if all(isinstance(v, Const) for v in inputs) and node.op_type not in NONDETERMINISTIC \
            and not _reads_parameter(node, inputs):
        check_fold_size(ctx, node)
        try:
            return fold_node(ctx, node)
        except Exception as e:  # noqa: BLE001 - the reference evaluator raises assorted errors
            if node.op_type not in HANDLERS:
                raise NodeUnsupported(f"cannot fold: {e}") from None
    shape_fold = fold_shape(ctx, node)
    if shape_fold is not None:
        return shape_fold
    handler = HANDLERS.get(node.op_type)
    if handler is None:
        raise NodeUnsupported("no lowering for this op type")
    start = len(ctx.b.nodes)
    outs = handler(ctx)
    for name, value in zip(node.output, outs):
        if name and isinstance(value, int) and value >= start:
            ctx.retag(value, name)
    return outs


def _reads_parameter(node: Any, inputs: list) -> bool:
    """Computing on a float initializer (not just relayouting it) stays in the graph, keeping it bound."""
    return node.op_type in HANDLERS and node.op_type not in LAYOUT_OPS and any(
        v.key is not None and v.initializer and v.value.dtype.kind == "f" for v in inputs)


def _shape_mismatch(ctx: OnnxContext, node: Any) -> str | None:
    for name in node.output:
        declared = ctx.declared.get(name)
        value = ctx.values.get(name)
        if declared is None or value is None:
            continue
        ours = tuple(value.value.shape) if isinstance(value, Const) else ctx.b.shape(value)
        if ours != declared:
            return f"output `{name}` has shape {fmt_shape(ours)} by our rules but onnx infers {fmt_shape(declared)}"
    return None
