"""An ``onnx.backend.base.Backend`` over ``tlb.import_onnx`` + ``tlb.evaluate`` (what onnx's backend test
suite drives, as it drives onnxruntime's backend module).

``prepare`` imports the model once. Operands that the importer needs at import time but the model
takes as graph inputs (Reshape's shape, Pad's pads, TopK's k, a Conv weight...) are *steering inputs*:
the importer names them, and ``run`` binds them with ``import_onnx(..., constants=...)`` (one import per
distinct bound value). The graph is evaluated in the model's declared float precision (float64 when a
graph input or output is double, else float32), and each output is returned in the element type the
model declares for it; an integer result that does not fit that type is an error, never wrapped.
Narrow-typed inputs (float16, bfloat16, float8, int4...) are read exactly as float32 / int64, and
narrow-typed outputs are written as their ml_dtypes arrays, checked to be on the type's grid
(docs/element-types.md).
"""

from __future__ import annotations

import hashlib
from typing import Any, Mapping, Sequence

import numpy as np

import onnx
import onnx.backend.base as base
import onnx.shape_inference
from onnx import helper

from importers.onnx import import_onnx, load_model
from semantics.evaluate import evaluate
from semantics.narrow import NarrowError, format_of, narrow_array, widen

from ..errors import BridgeError, UnsupportedError

__all__ = ["TorchLeanBackend", "TorchLeanRep", "prepare", "run_model", "run_node", "supports_device"]

_DOUBLE = 11


def _precision(model: Any) -> str:
    """float64 when the model computes in double anywhere it says so (a double graph input or output,
    a double initializer, a Cast to double), else float32: the model's declared precision."""
    graph = model.graph
    init = {t.name for t in graph.initializer}
    types = [vi.type.tensor_type.elem_type for vi in list(graph.input) + list(graph.output)
             if vi.name not in init and vi.type.HasField("tensor_type")]
    types += [t.data_type for t in graph.initializer]
    types += [a.i for n in graph.node if n.op_type == "Cast" for a in n.attribute if a.name == "to"]
    return "float64" if _DOUBLE in types else "float32"


def _needed_inputs(error: UnsupportedError, graph_inputs: set[str], model: Any) -> set[str]:
    """The graph inputs that the refused nodes need at import time (the steering inputs)."""
    wanted = {name for item in error.items for name in item.get("needs", ())}
    if not wanted:
        return set()
    producers = {o: n for n in model.graph.node for o in n.output}
    found: set[str] = set()
    stack, seen = list(wanted), set()
    while stack:  # a needed tensor computed from graph inputs needs those inputs
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in graph_inputs:
            found.add(name)
        elif name in producers:
            stack.extend(n for n in producers[name].input if n)
    return found


def _output_array(value: np.ndarray, elem_type: int, name: str) -> np.ndarray:
    """A result in the element type the model declares for output ``name``."""
    if elem_type == 0:
        return value
    try:
        want = np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))
    except (KeyError, TypeError, ValueError):
        raise BridgeError(f"ONNX backend: output `{name}` has element type {elem_type}, which has no numpy type") \
            from None
    if format_of(want) is not None:  # narrow types: the value must be on their grid
        try:
            return narrow_array(value, format_of(want))
        except NarrowError:
            raise BridgeError(f"ONNX backend: output `{name}` holds values that are not {format_of(want)} values") \
                from None
    if want.kind in "iu" and value.dtype.kind in "iub" and value.size:
        info = np.iinfo(want)
        lo, hi = int(value.min()), int(value.max())
        if lo < info.min or hi > info.max:
            raise BridgeError(f"ONNX backend: output `{name}` holds values in [{lo}, {hi}], outside {want.name}")
    return value.astype(want, copy=False)


class TorchLeanRep(base.BackendRep):
    """A prepared model: the imported bundle (or, with steering inputs, one per bound value)."""

    def __init__(self, model: Any, dtype: str | None = None, **import_kwargs: Any) -> None:
        self.model = load_model(model)
        self._kwargs = import_kwargs
        self.dtype = dtype or _precision(self.model)
        init = {t.name for t in self.model.graph.initializer}
        self.input_names = [vi.name for vi in self.model.graph.input if vi.name not in init]
        self.output_types = [_declared_elem_type(vi.type) for vi in self.model.graph.output]
        self.output_names = [vi.name for vi in self.model.graph.output]
        self.steering: list[str] = []
        self._bundles: dict[str, Any] = {}
        # sequence / optional inputs: their structure (item count and shapes) is fixed per run's feeds
        self.structured = [vi.name for vi in self.model.graph.input if vi.name not in init
                           and vi.type.WhichOneof("value") in ("sequence_type", "optional_type")]
        self._dynamic = [vi.name for vi in self.model.graph.input if vi.name not in init and vi.name not in
                         self.structured and any(not d.HasField("dim_value") for d in vi.type.tensor_type.shape.dim)]
        self.bundle = None
        if self.structured:
            return
        try:
            self.bundle = import_onnx(self.model, **import_kwargs)
        except UnsupportedError as e:
            needed = _needed_inputs(e, set(self.input_names), self.model)
            if not needed:
                raise
            self.steering = [n for n in self.input_names if n in needed]
            self.bundle = None

    def _bound_bundle(self, feeds: dict[str, np.ndarray]) -> Any:
        """The bundle with the steering inputs bound to these values; a node that lowers once its operands
        are known may need further inputs, so binding repeats until nothing new is needed."""
        while True:
            constants = {n: feeds[n] for n in self.steering}
            structure = {n: _structure(feeds[n]) for n in self.structured}
            key = hashlib.sha256(b"".join(n.encode() + np.ascontiguousarray(v).tobytes() + str((v.dtype, v.shape))
                                          .encode() for n, v in constants.items()) + repr(structure).encode()).hexdigest()
            if key in self._bundles:
                return self._bundles[key]
            kwargs = dict(self._kwargs)
            if structure or self.steering:  # dynamic extents as this run's feeds have them
                dynamic = {n: list(feeds[n].shape) for n in self._dynamic if n not in self.steering}
                kwargs["input_shapes"] = {**dynamic, **dict(kwargs.get("input_shapes") or {}), **structure}
            try:
                self._bundles[key] = import_onnx(self.model, constants=constants, **kwargs)
                return self._bundles[key]
            except UnsupportedError as e:
                more = _needed_inputs(e, set(self.input_names), self.model) - set(self.steering)
                if not more:
                    raise
                self.steering = [n for n in self.input_names if n in more or n in self.steering]

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        """Outputs in the model's output order and declared element types."""
        feeds = self._feeds(inputs)
        bundle = self.bundle if self.bundle is not None else self._bound_bundle(feeds)
        names = bundle.report.get("inputs", self.input_names)
        flat = _flat_feeds(feeds, self.structured)
        values = evaluate(bundle.graph, bundle.payload, [flat[n] for n in names], dtype=self.dtype)
        structure = bundle.report.get("output_structure", ["tensor"] * len(self.output_names))
        return tuple(_regroup(values, structure, self.output_types, self.output_names))

    def _feeds(self, inputs: Any) -> dict[str, np.ndarray]:
        if isinstance(inputs, Mapping):
            unknown = sorted(set(inputs) - set(self.input_names))
            if unknown:
                raise BridgeError(f"ONNX backend: unknown inputs {unknown}; the model's inputs are {self.input_names}")
            missing = [n for n in self.input_names if n not in inputs]
            if missing:
                raise BridgeError(f"ONNX backend: missing inputs {missing}")
            return {n: _feed(inputs[n]) for n in self.input_names}
        arrays = [inputs] if isinstance(inputs, np.ndarray) else list(inputs)
        if len(arrays) != len(self.input_names):
            raise BridgeError(f"ONNX backend: {len(arrays)} inputs given for the model's {len(self.input_names)} "
                              f"inputs {self.input_names}")
        return {n: _feed(a) for n, a in zip(self.input_names, arrays)}


def _feed(value: Any) -> Any:
    """An input value: an array, a list of arrays (a sequence) or None (an empty optional)."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return [widen(v) for v in value]
    return widen(value)  # narrow types (float16, float8, int4...) exactly as float32 / int64


def _structure(value: Any) -> Any:
    """What ``import_onnx``'s input_shapes says about a sequence/optional input: item shapes, a shape, None."""
    if value is None:
        return None
    if isinstance(value, list):
        return [list(v.shape) for v in value]
    return list(value.shape)


def _flat_feeds(feeds: dict[str, Any], structured: Sequence[str]) -> dict[str, np.ndarray]:
    """Feeds by IR input name: a sequence input's items are ``name[k]`` (importers/onnx/ops_sequence)."""
    flat = {}
    for name, value in feeds.items():
        if name in structured and isinstance(value, list):
            flat.update({f"{name}[{k}]": v for k, v in enumerate(value)})
        elif value is not None:
            flat[name] = value
    return flat


def _declared_elem_type(tp: Any) -> int:
    """The element type of a (possibly sequence or optional) ONNX type; 0 when unknown."""
    for _ in range(8):
        kind = tp.WhichOneof("value")
        if kind == "sequence_type":
            tp = tp.sequence_type.elem_type
        elif kind == "optional_type":
            tp = tp.optional_type.elem_type
        else:
            return tp.tensor_type.elem_type if kind == "tensor_type" else 0
    return 0


def _regroup(values: Sequence[Any], structure: Sequence[Any], types: Sequence[int], names: Sequence[str]) -> list:
    """The IR outputs regrouped into the model's outputs: tensors, lists (sequences), None (empty optionals)."""
    out: list[Any] = []
    k = 0
    for shape_of, elem, name in zip(structure, types, names):
        inner = shape_of["optional"] if isinstance(shape_of, dict) and "optional" in shape_of else shape_of
        if inner is None:
            out.append(None)
        elif isinstance(inner, dict):
            n = inner["sequence"]
            out.append([_output_array(np.asarray(v), elem, name) for v in values[k:k + n]])
            k += n
        else:
            out.append(_output_array(np.asarray(values[k]), elem, name))
            k += 1
    return out


def supports_device(device: str) -> bool:
    """CPU only (the evaluator is numpy)."""
    return str(device).upper().split(":")[0] == "CPU"


def prepare(model: Any, device: str = "CPU", **kwargs: Any) -> TorchLeanRep:
    """Import ``model`` (ModelProto, path or bytes); ``dtype`` overrides the model's precision, other
    keyword arguments go to ``import_onnx`` (``input_shapes``, ``constants``, ``max_elements``)."""
    if not supports_device(device):
        raise BridgeError(f"ONNX backend: device {device!r} is not supported (CPU only)")
    dtype = kwargs.pop("dtype", None)
    return TorchLeanRep(model, dtype, **kwargs)


def run_model(model: Any, inputs: Any, device: str = "CPU", **kwargs: Any) -> tuple[np.ndarray, ...]:
    return prepare(model, device, **kwargs).run(inputs)


def run_node(node: Any, inputs: Sequence[Any], device: str = "CPU", outputs_info: Sequence[tuple] | None = None,
             **kwargs: Any) -> tuple[np.ndarray, ...]:
    """One node on concrete inputs: a one-node model at the newest opset (or ``opset_version``)."""
    arrays = [np.asarray(x) for x in inputs]
    names = [n for n in node.input if n]
    if len(names) != len(arrays):
        raise BridgeError(f"ONNX backend: node `{node.name or node.op_type}` reads {len(names)} inputs, "
                          f"{len(arrays)} given")
    graph_inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
                    for n, a in zip(names, arrays)]
    if outputs_info:
        outs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(np.dtype(dt)), shape)
                for n, (dt, shape) in zip(node.output, outputs_info)]
    else:
        outs = [helper.make_empty_tensor_value_info(n) for n in node.output if n]
    opset = int(kwargs.pop("opset_version", onnx.defs.onnx_opset_version()))
    model = helper.make_model(helper.make_graph([node], "run_node", graph_inputs, outs),
                              opset_imports=[helper.make_opsetid(node.domain or "", opset)])
    if not outputs_info:
        inferred = onnx.shape_inference.infer_shapes(model)
        typed = {vi.name: vi for vi in list(inferred.graph.value_info) + list(inferred.graph.output)
                 if vi.type.WhichOneof("value") == "tensor_type" and vi.type.tensor_type.elem_type}
        for out in model.graph.output:
            if out.name in typed:
                out.CopyFrom(typed[out.name])
    return prepare(model, device, **kwargs).run(arrays)


class TorchLeanBackend(base.Backend):
    """onnx's Backend interface (classmethods) over this module's functions."""

    @classmethod
    def prepare(cls, model: Any, device: str = "CPU", **kwargs: Any) -> TorchLeanRep:
        return prepare(model, device, **kwargs)

    @classmethod
    def run_model(cls, model: Any, inputs: Any, device: str = "CPU", **kwargs: Any) -> tuple[np.ndarray, ...]:
        return run_model(model, inputs, device, **kwargs)

    @classmethod
    def run_node(cls, node: Any, inputs: Any, device: str = "CPU", outputs_info: Any = None,
                 **kwargs: Any) -> tuple[np.ndarray, ...]:
        return run_node(node, inputs, device, outputs_info, **kwargs)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return supports_device(device)
