"""ONNX models into IR + payload + role map (``import_onnx``).

The walk is TorchLean's ONNX adapter done fully: every node is folded (all inputs known at import
time), or lowered by the handler its op type maps to in ``HANDLERS`` (opset-aware), or recorded as
unsupported; all unsupported nodes are reported together before anything is built. Static shapes
come from the graph inputs (or ``input_shapes``); onnx's shape inference supplies the declared
shapes the lowering is checked against. Each IR node's ``Source`` names the ONNX node and op type;
the last IR node of a lowering also carries the ONNX output tensor it computes.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from torchlean_bridge.bundle import Bundle
from torchlean_bridge.check import DEFAULT_MAX_ELEMENTS
from torchlean_bridge.errors import BridgeError
from torchlean_bridge.graph import Source
from torchlean_bridge.ops import fmt_shape
from torchlean_bridge.passes.canonicalize import canonical_kinds

from . import ops_math, ops_nn, ops_tensor
from .breadth import BREADTH_MODULES  # issue #15's handlers, one module per family
from ..builder import GraphBuilder
from ..errors import add_node_note
from .checks import DEFAULT_DOMAINS, check_model, newest_opset, unique_opsets
from .external import initializer_array, sparse_initializer_array
from .context import Const, NodeUnsupported, OnnxContext, unsupported_error
from .fold import LAYOUT_OPS, NONDETERMINISTIC, check_fold_size, fold_node, fold_shape
from .inputs import InputShapes, bound_constants, check_tensor_type, element_type_name, static_input_shapes
from .ops_control import references
from .ops_math import onnx_element_type
from .ops_cast import round_narrow_outputs
from .ops_sequence import flatten_output, structured_input, type_text
from .legacy import explicit_legacy_broadcasts
from .opsets import upgrade, upgrade_target, version_problem

__all__ = ["import_onnx", "load_model", "HANDLERS", "EMITTED_KINDS", "MIN_OPSET", "MAX_OPSET"]

HANDLERS = {**ops_math.HANDLERS, **ops_tensor.HANDLERS, **ops_nn.HANDLERS,
            **{op: h for m in BREADTH_MODULES for op, h in m.HANDLERS.items()}}
# what the handlers emit, after builder.finish's canonicalization (torchlean_bridge.passes.canonicalize)
EMITTED_KINDS: frozenset[str] = canonical_kinds({"input", "const"} | ops_math.EMITS | ops_tensor.EMITS | ops_nn.EMITS
                                                 | {k for m in BREADTH_MODULES for k in m.EMITS})
# never folded by onnx's reference evaluator: random ops, and ops whose handler resolves them at import
# (control flow unrolled body node by body node, sequences and optionals)
NOT_FOLDED = NONDETERMINISTIC | {op for m in BREADTH_MODULES for op in getattr(m, "NOT_FOLDED", ())}
MIN_OPSET, MAX_OPSET = 1, newest_opset()  # every opset the installed onnx defines


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


def _read_model(path_or_model: Any) -> tuple[Any, Path | None]:
    """The model and, when read from a path, its folder; external data stays on disk (mapped later)."""
    if isinstance(path_or_model, (str, os.PathLike)):
        import onnx
        path = Path(path_or_model)
        if not path.is_file():
            raise BridgeError(f"ONNX import: no such file: {path}")
        try:
            return onnx.load(str(path), load_external_data=False), path.parent
        except Exception as e:  # noqa: BLE001 - protobuf raises several unrelated types
            raise BridgeError(f"ONNX import: cannot read {path}: {e}") from None
    return load_model(path_or_model), None


_SMALL_INITIALIZER = 4096  # elements: shape inference sees the values of initializers up to this size


def _declared_shapes(model: Any, shapes: dict[str, tuple[int, ...]], bound: dict[str, np.ndarray]
                     ) -> tuple[dict[str, tuple[int, ...]], dict[str, int]]:
    """Static shapes (and element types) onnx's shape inference finds once the inputs' shapes are fixed.

    Inference runs on a copy without the weight data: small initializers (shape operands) keep
    their values, large ones become typed graph inputs, so no weight is copied or read.
    """
    import onnx
    from onnx import helper, numpy_helper
    src = model.graph
    m = onnx.ModelProto()
    m.ir_version = max(model.ir_version, 4)  # initializers need not be graph inputs
    m.opset_import.extend(model.opset_import)
    m.functions.extend(model.functions)
    g = m.graph
    g.node.extend(src.node)
    g.output.extend(src.output)
    listed = set()
    for vi in src.input:
        listed.add(vi.name)
        if vi.name in bound:
            g.initializer.append(numpy_helper.from_array(bound[vi.name], vi.name))
            continue
        new = g.input.add()
        new.CopyFrom(vi)
        if vi.name in shapes:
            new.type.tensor_type.shape.Clear()
            for d in shapes[vi.name]:
                new.type.tensor_type.shape.dim.add().dim_value = d
    for t in src.initializer:
        small = not t.external_data and math.prod(t.dims) <= _SMALL_INITIALIZER
        if small:
            g.initializer.append(t)
        elif t.name not in listed:
            g.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    try:
        inferred = onnx.shape_inference.infer_shapes(m)  # no data_prop: it computes Range etc. unbounded
    except Exception:  # noqa: BLE001 - inference is advisory: our rules still compute every shape
        return {}, {}
    out, types = {}, {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.output) + list(src.input):
        if vi.type.WhichOneof("value") != "tensor_type":
            continue
        types[vi.name] = vi.type.tensor_type.elem_type
        s = _static_shape(vi)
        if s is not None and vi.name not in shapes:
            out[vi.name] = s
    return out, types


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


def _consumers(graph: Any) -> dict[str, int]:
    """How often each tensor is read: node inputs (inside subgraphs too) and graph outputs."""
    return references(graph, {})


def _upgraded(model: Any, opset: int) -> tuple[Any, int, list[str]]:
    """The model upgraded when some node predates its handler (with a note), else as it is."""
    target = upgrade_target(model.graph, opset)
    if target is None:
        return model, opset, []
    model = upgrade(model, opset, target)
    return model, target, [f"upgraded from opset {opset} to {target} with onnx.version_converter (the handlers "
                           f"implement the newer operator versions)"]


def import_onnx(path_or_model: Any, input_shapes: InputShapes = None,
                max_elements: int = DEFAULT_MAX_ELEMENTS, constants: Mapping[str, Any] | None = None,
                reference: Any = None) -> Bundle:
    """An ONNX model (path, bytes or ModelProto) as a checked bundle.

    ``input_shapes`` fixes dynamic input dimensions: ``{"x": (1, 3, 32, 32)}`` or a list in input order
    (a dynamic batch axis alone defaults to 1). ``constants`` freezes graph inputs to values
    (``{"shape": np.array([1, -1])}``): shapes, axes, pads, scales, even weights given as inputs; what
    follows from them folds. ``max_elements`` caps every node's size and every import-time fold,
    checked before computing it. ``reference`` (an ``nn.Module``, a state_dict or a checkpoint path)
    names the weights: bindings the exporter renamed (``onnx::MatMul_14``) take the reference's keys
    where the values prove them (``tlb.recover_keys``; the report lists what stays unproven).
    """
    model, base = _read_model(path_or_model)
    opset = check_model(model)
    model, legacy_notes = explicit_legacy_broadcasts(unique_opsets(model), opset)
    model, opset, notes = _upgraded(model, opset)
    notes = legacy_notes + notes
    graph = model.graph
    init_names = {t.name for t in graph.initializer}
    real_inputs = [vi for vi in graph.input if vi.name not in init_names]
    bound = bound_constants(real_inputs, constants)
    free_inputs = [vi for vi in real_inputs if vi.name not in bound]
    structured = {vi.name for vi in free_inputs if vi.type.WhichOneof("value") in _STRUCTURED}
    for vi in free_inputs:
        if vi.name not in structured:
            check_tensor_type(vi, "input")
    for vi in graph.output:
        if vi.type.WhichOneof("value") not in _STRUCTURED:
            check_tensor_type(vi, "graph output")
    input_shapes, structures = _split_structures(free_inputs, structured, input_shapes)
    shapes, batch_notes = static_input_shapes([vi for vi in free_inputs if vi.name not in structured], input_shapes)
    b = GraphBuilder("onnx", max_elements)
    declared, onnx_types = _declared_shapes(model, shapes, bound)
    ctx = OnnxContext(b, opset, declared, _consumers(graph))
    ctx.onnx_types = onnx_types
    ctx.lower_node = _lower_one
    ctx.graph_inputs = {vi.name for vi in free_inputs}
    ctx.graph_outputs = [o.name for o in graph.output]
    ctx.precision = "float64" if any(vi.type.tensor_type.elem_type == 11
                                     for vi in list(free_inputs) + list(graph.output)) else "float32"
    for t in graph.initializer:
        ctx.values[t.name] = Const(initializer_array(t, base), key=t.name)
    for sparse in graph.sparse_initializer:
        ctx.values[sparse.values.name] = Const(sparse_initializer_array(sparse, base, max_elements),
                                               key=sparse.values.name)
    for name, value in bound.items():
        ctx.values[name] = Const(value, initializer=False)
    ir_inputs = []
    for vi in free_inputs:
        if vi.name in structured:  # a sequence or optional: one IR input per item (ops_sequence)
            ctx.values[vi.name], made = structured_input(ctx, vi, structures[vi.name])
            ir_inputs += [name for name, _ in made]
            continue
        etype = onnx_element_type(vi.type.tensor_type.elem_type)
        ctx.values[vi.name] = b.input(shapes[vi.name], etype,
                                      source=Source(framework="onnx", name=vi.name, tensor=vi.name))
        ir_inputs.append(vi.name)
    problems = _lower_nodes(ctx, graph)
    missing = [o.name for o in graph.output if o.name not in ctx.values]
    if problems or missing:
        raise unsupported_error(problems, opset) if problems else \
            BridgeError(f"ONNX import: graph outputs {missing} are produced by no node")
    flat, structure = [], []
    for o in graph.output:  # a sequence or optional output is its items' outputs (ops_sequence)
        items, shape_of_output = flatten_output(ctx, o)
        flat += items
        structure.append(shape_of_output)
    outputs = [nid for _, nid, _ in flat]
    for name, nid, _ in flat:
        src = b.nodes[nid].source
        if src is not None and src.tensor is None:
            b.nodes[nid] = b.nodes[nid].with_(source=replace(src, tensor=name))
    static = sorted(init_names - ctx.used_keys)
    report: dict[str, Any] = {
        "framework": "onnx", "opset": opset, "producer": f"{model.producer_name} {model.producer_version}".strip(),
        "inputs": ir_inputs, "outputs": [name for name, _, _ in flat],
        "output_types": [element_type_name(t) if t else None for _, _, t in flat],
        "precision": ctx.precision,
        "external_shapes": {t.name: list(t.dims) for t in graph.initializer if t.name in ctx.used_keys},
    }
    if any(st != "tensor" for st in structure):
        report["output_structure"] = structure
    if bound:
        report["bound_inputs"] = sorted(bound)
    if static:
        report["static_initializers"] = static
    if notes or batch_notes:
        report["notes"] = notes + batch_notes
    bundle = b.finish(outputs, report)
    if reference is not None:
        from importers.onnx_keys import recover_keys, reference_tensors
        bundle = recover_keys(bundle, reference_tensors(reference), model)
    return bundle


_STRUCTURED = ("sequence_type", "optional_type")


def _split_structures(free_inputs: list[Any], structured: set[str], input_shapes: InputShapes
                      ) -> tuple[InputShapes, dict[str, Any]]:
    """``input_shapes`` without the sequence/optional inputs, and their structures (item shapes, a shape, or
    None for an empty optional), which the caller must give by name."""
    if not structured:
        return input_shapes, {}
    if not isinstance(input_shapes, Mapping) or not structured <= set(input_shapes):
        name = sorted(structured - set(input_shapes or {}) if isinstance(input_shapes, Mapping) else structured)[0]
        vi = next(v for v in free_inputs if v.name == name)
        label = "a sequence" if vi.type.WhichOneof("value") == "sequence_type" else "an optional"
        raise BridgeError(f"ONNX import: input `{name}` is {label} ({type_text(vi.type)}): its structure must be fixed "
                          f"at import with input_shapes={{'{name}': [...]}} (a list of item shapes for a sequence, a "
                          "shape or None for an optional)")
    return ({k: v for k, v in input_shapes.items() if k not in structured},
            {k: v for k, v in input_shapes.items() if k in structured})


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
        except BridgeError as e:  # NotLowerable, or a shape rule rejecting the lowered operands
            needs = getattr(e, "needs", ())
            problems.append({**item, "reason": _reason(ctx, node, e), **({"needs": list(needs)} if needs else {})})
            poisoned.update(node.output)
            continue
        for name, value in zip(node.output, outs):
            if name:
                ctx.values[name] = value
        mismatch = _shape_mismatch(ctx, node)
        if mismatch:
            problems.append({**item, "reason": mismatch})
    return problems


_IR_TYPE_REJECTION = re.compile(r"operand \d+ has element type \w+, expected float|element types differ|"
                                r"branches differ in element type")


def _reason(ctx: OnnxContext, node: Any, error: BridgeError) -> str:
    """The problem's message; an element-type rejection names the operands' ONNX element types (the IR
    holds every integer type as int64, which the user never wrote)."""
    if isinstance(error, NodeUnsupported) or not _IR_TYPE_REJECTION.search(error.message):
        return error.message
    types = [ctx.onnx_type(n) for n in node.input if n]
    return (f"operands of element types {', '.join(types)}: the IR's lowering of {node.op_type} computes on "
            f"float tensors ({error.message})")


def _lower_one(ctx: OnnxContext, node: Any) -> list:
    if node.domain not in DEFAULT_DOMAINS:
        raise NodeUnsupported(f"custom domain `{node.domain}`")
    inputs = [ctx.values[n] for n in node.input if n]
    if all(isinstance(v, Const) for v in inputs) and node.op_type not in NOT_FOLDED \
            and not _reads_parameter(node, inputs):
        check_fold_size(ctx, node)
        try:
            return fold_node(ctx, node)
        except Exception as e:  # noqa: BLE001 - the reference evaluator raises assorted errors
            if node.op_type not in HANDLERS:
                subgraphs = [a.name for a in node.attribute if a.type in (5, 10)]  # GRAPH, GRAPHS
                if subgraphs:
                    raise NodeUnsupported(f"control flow (subgraph attribute `{subgraphs[0]}`) has no IR op, and "
                                          "it does not fold: its subgraphs read tensors computed at run time") \
                        from None
                raise NodeUnsupported(f"cannot fold (onnx's reference evaluator: {type(e).__name__}: {e})"[:300]) \
                    from None
    shape_fold = fold_shape(ctx, node)
    if shape_fold is not None:
        return shape_fold
    handler = HANDLERS.get(node.op_type)
    if handler is None:
        raise NodeUnsupported("no lowering for this op type")
    problem = version_problem(node.op_type, ctx.opset)
    if problem is not None:
        raise NodeUnsupported(problem)
    start = len(ctx.b.nodes)
    try:
        outs = handler(ctx)
    except BridgeError:
        raise
    except Exception as e:  # a bug in a handler: keep its traceback, say which node it met
        add_node_note(e, f"ONNX node `{node.name or node.output[0]}` ({node.op_type}, opset {ctx.opset})")
        raise
    outs = round_narrow_outputs(ctx, node, list(outs), start)  # narrow-typed outputs: one rounding each
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
