"""Typed payload records, each checked against its node with TorchLean's evaluation messages.

TorchLean's payload is five optional lookups by node id (``const?``, ``linear?``, ``conv?``,
``batchNormEval?``, ``layerNorm?``) whose records carry their own dimensions; evaluation then checks
each record against the node it is keyed by (spec section 4.8). Every domain (float, interval)
reads parameters through these functions, so a swapped or malformed payload fails the same way
everywhere, e.g. ``IR eval: linear 1: declared outShape mismatch: [5] vs expected [3]``.
The arrays are returned as stored; the domain decides the arithmetic.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, NamedTuple

import numpy as np

from torchlean_bridge.errors import EvalError
from torchlean_bridge.graph import Node
from torchlean_bridge.ops import Shape, fmt_shape, numel
from torchlean_bridge.payload import role_shape

__all__ = ["LinearRecord", "ConvRecord", "BatchNormRecord", "LayerNormRecord", "const_values",
           "linear_record", "conv_record", "batch_norm_record", "layernorm_record", "fail", "READERS", "PREPARED",
           "in_dtype", "read_payload", "domain_records"]

Record = Mapping[str, np.ndarray]


def fail(node: Node, message: str) -> EvalError:
    """An evaluation error that names the node, its op and its provenance."""
    return EvalError(message, node=node.id, op=node.kind, source=str(node.source) if node.source else None)


class LinearRecord(NamedTuple):
    weight: np.ndarray  # [out, in]
    bias: np.ndarray  # [out]


class ConvRecord(NamedTuple):
    weight: np.ndarray  # grouped [out, in/groups, *kernel]
    bias: np.ndarray  # [out]


class BatchNormRecord(NamedTuple):
    weight: np.ndarray  # gamma [C]
    bias: np.ndarray  # beta [C]
    running_mean: np.ndarray
    running_var: np.ndarray


class LayerNormRecord(NamedTuple):
    weight: np.ndarray | None  # gamma over the normalized suffix, None = ones
    bias: np.ndarray | None  # beta, None = zeros


def const_values(node: Node, rec: Record) -> np.ndarray:
    """``ConstFlat``: row-major values of the node's shape (stored flat or already shaped)."""
    values = rec.get("values")
    if values is None:
        raise fail(node, f"IR eval: missing const payload for node {node.id}")
    want = numel(node.out_shape)
    if values.size != want:
        raise fail(node, f"IR eval: const {node.id}: flat length mismatch: have {values.size}, expected {want}")
    return values.reshape(node.out_shape)


def linear_record(node: Node, rec: Record, parent: Shape) -> LinearRecord:
    """``LinearWB``: declared output checked first (the seed chapter's swapped-key message)."""
    w, b = rec.get("weight"), rec.get("bias")
    if w is None or b is None:
        raise fail(node, f"IR eval: missing linear payload for node {node.id}")
    if w.ndim != 2 or b.shape != (w.shape[0],):
        raise fail(node, f"IR eval: linear {node.id}: payload weight {fmt_shape(w.shape)} and bias "
                         f"{fmt_shape(b.shape)} do not form a [out, in] / [out] record")
    out_dim, in_dim = w.shape
    declared = tuple(node.out_shape)
    expected = declared[:-1] + (out_dim,)
    if declared != expected:
        raise fail(node, f"IR eval: linear {node.id}: declared outShape mismatch: {fmt_shape(declared)} "
                         f"vs expected {fmt_shape(expected)}")
    want_in = tuple(parent[:-1]) + (in_dim,)
    if tuple(parent) != want_in:
        raise fail(node, f"IR eval: shape mismatch: expected {fmt_shape(want_in)}, got {fmt_shape(parent)}")
    return LinearRecord(w, b)


def conv_record(node: Node, rec: Record) -> ConvRecord:
    """``ConvParams``: grouped weight ``[out, in/groups, *kernel]`` and bias ``[out]``; for
    ``conv_transpose`` (PyTorch/ONNX layout) the weight is ``[in, out/groups, *kernel]``."""
    w, b = rec.get("weight"), rec.get("bias")
    if w is None or b is None:
        raise fail(node, f"IR eval: missing {node.kind} payload for node {node.id}")
    want, want_bias = role_shape(node, "weight", ()), role_shape(node, "bias", ())  # from the node's attrs
    if tuple(w.shape) != want or tuple(b.shape) != want_bias:
        raise fail(node, f"IR eval: {node.kind} {node.id}: payload does not match the node configuration "
                         f"(weight {fmt_shape(w.shape)}, bias {fmt_shape(b.shape)}; expected "
                         f"{fmt_shape(want)}, {fmt_shape(want_bias)})")
    return ConvRecord(w, b)


def batch_norm_record(node: Node, rec: Record) -> BatchNormRecord:
    """``BatchNormEvalParams``: gamma, beta, running mean and variance, one entry per channel."""
    roles = [rec.get(r) for r in BatchNormRecord._fields]
    if any(r is None for r in roles):
        raise fail(node, f"IR eval: missing batch_norm_eval payload for node {node.id}")
    if any(r.shape != role_shape(node, name, ()) for name, r in zip(BatchNormRecord._fields, roles)):
        raise fail(node, f"IR eval: batch_norm_eval {node.id}: payload and node channel counts differ")
    return BatchNormRecord(*roles)


def layernorm_record(node: Node, rec: Record, parent: Shape) -> LayerNormRecord:
    """``LayerNormParams``: optional gamma/beta over ``parent[axis:]`` (a flat vector also fits)."""
    suffix = role_shape(node, "weight", (parent,))
    out = []
    for role in LayerNormRecord._fields:
        arr = rec.get(role)
        if arr is not None and tuple(arr.shape) != suffix:
            if arr.ndim != 1:
                raise fail(node, f"IR eval: node {node.id}: layernorm payload shape {fmt_shape(arr.shape)} "
                                 f"does not match normalized suffix {fmt_shape(suffix)}")
            if arr.size != numel(suffix):
                raise fail(node, f"IR eval: node {node.id}: layernorm payload has inconsistent suffix size")
            arr = arr.reshape(suffix)
        out.append(arr)
    return LayerNormRecord(*out)


# kind -> reader(node, record, parent shape): every payload kind, one uniform signature
READERS: dict[str, Callable[[Node, Record, Shape], Any]] = {
    "const": lambda node, rec, parent: const_values(node, rec),
    "linear": linear_record,
    "conv": lambda node, rec, parent: conv_record(node, rec),
    "conv_transpose": lambda node, rec, parent: conv_record(node, rec),
    "layernorm": layernorm_record,
    "batch_norm_eval": lambda node, rec, parent: batch_norm_record(node, rec),
}

# record key under which an evaluator stores a node's parameters, read and converted once
PREPARED = "prepared"


def in_dtype(record: Any, dt: np.dtype) -> Any:
    """A typed record (or one array) with every array in ``dt`` (no copy when it already is)."""
    if isinstance(record, np.ndarray):
        return record.astype(dt, copy=False)
    return type(record)(*(None if a is None else a.astype(dt, copy=False) for a in record))


def read_payload(g: Any, payload: Any) -> list[Any]:
    """Every payload node's record read and checked in node order (failing as evaluation would),
    ``None`` for the other nodes: the typed records a prepared graph converts once per domain."""
    typed: list[Any] = []
    for node in g.nodes:
        if node.kind in READERS:
            parent = g.nodes[node.parents[0]].out_shape if node.parents else ()
            typed.append(READERS[node.kind](node, payload.record(node.id), tuple(parent)))
        else:
            typed.append(None)
    return typed


def domain_records(g: Any, typed: list[Any], convert: Mapping[str, Callable[..., Any]], *args: Any) -> list[dict]:
    """Per node the record a domain's rules receive: ``{PREPARED: converted}`` for payload nodes
    (``convert[kind](node, typed, *args)``, or the typed record as it is), ``{}`` for the others."""
    out: list[dict] = []
    for node, record in zip(g.nodes, typed):
        if record is None:
            out.append({})
            continue
        fn = convert.get(node.kind)
        out.append({PREPARED: record if fn is None else fn(node, record, *args)})
    return out
