"""The same graph with a batch of N samples: branch and bound bounds N subdomains in one CROWN pass.

CROWN treats the first axis as independent samples when every node keeps samples apart
(``Crown.batched``). A network exported for one sample (input ``[1, ...]``) is rebuilt here with
``[N, ...]`` on every value that depends on the input (shape attributes with the leading 1 follow), then
checked by the registry's shape rules: any graph the rules reject is refused (None), and the caller
bounds one subdomain per pass instead. The node ids are unchanged, so the payload serves both graphs.

Elementwise ops take equal shapes, so a constant they combine with an input-dependent value (an ONNX
model's input normalization, ``(x - mean) / std``) needs the batch too: a ``broadcast_to`` of a
constant that only such ops read is rebuilt to broadcast to ``[N, ...]`` (its source keeps its
shape), and ``with_batch_payload`` also repeats N times the constants of leading axis 1 that only such
ops read directly, returning the payload with those records repeated.
"""

from __future__ import annotations

import numpy as np

from torchlean_bridge.check import check
from torchlean_bridge.errors import BridgeError
from torchlean_bridge.graph import Graph
from torchlean_bridge.payload import Payload

__all__ = ["BATCH_SAFE_ELEMENTWISE", "with_batch", "with_batch_payload"]

# elementwise ops that keep the samples of a batch apart (CROWN's ``Crown.batched`` test reads them too)
BATCH_SAFE_ELEMENTWISE = frozenset({
    "relu", "leaky_relu", "prelu", "sigmoid", "tanh", "gelu", "softplus", "exp", "pow", "neg", "add", "sub",
    "mul_elem", "div", "detach", "abs", "sqrt", "log", "sin", "cos", "erf", "silu", "max_elem", "min_elem", "clamp",
    "inv", "rsqrt",
})

# attributes that carry a value's full shape, leading (batch) axis included
_SHAPE_ATTRS = ("in_shape", "out_shape", "shape", "from_shape", "to_shape", "value_shape")


def with_batch(g: Graph, n: int) -> Graph | None:
    """g with a leading axis of n on every input-dependent value, or None when g's first axis is not a
    batch axis of 1 that the shape rules accept at n."""
    return _rebatch(g, n, _depends(g), frozenset())


def with_batch_payload(g: Graph, payload: Payload | None, n: int) -> tuple[Graph, Payload | None] | None:
    """``with_batch`` that also batches the constants elementwise ops combine with input-dependent
    values (see the module docstring), with the payload those constants' records need."""
    depends = _depends(g)
    readers = g.consumers()
    tile = frozenset(
        node.id for node in g.nodes
        if node.kind == "const" and len(node.out_shape) >= 2 and node.out_shape[0] == 1
        and payload is not None and payload.get(node.id, "values") is not None
        and _only_elementwise_readers(g, node.id, depends, readers))
    batched = _rebatch(g, n, depends, tile)
    if batched is None:
        return None
    if not tile:
        return batched, payload
    out = payload.copy()
    for v in tile:
        out.set(v, "values", np.repeat(payload.get(v, "values"), n, axis=0))
    return batched, out


def _depends(g: Graph) -> np.ndarray:
    depends = np.zeros(len(g.nodes), dtype=bool)
    for node in g.nodes:
        depends[node.id] = node.kind == "input" or any(depends[p] for p in node.parents)
    return depends


def _only_elementwise_readers(g: Graph, v: int, depends: np.ndarray, readers: list[list[int]]) -> bool:
    """Whether every reader of v (``readers``: ``g.consumers()``) depends on the input and is an
    elementwise op that keeps samples apart."""
    return bool(readers[v]) and all(depends[r] and g.nodes[r].kind in BATCH_SAFE_ELEMENTWISE for r in readers[v])


def _rebatch(g: Graph, n: int, depends: np.ndarray, tile: frozenset[int]) -> Graph | None:
    if n < 1 or len(g.inputs) != 1:
        return None
    nodes = g.nodes
    readers = g.consumers()
    out = []
    for node in nodes:
        if not depends[node.id] and node.id not in tile:
            shape = tuple(node.out_shape)
            if (node.kind in ("broadcast_to", "expand") and len(shape) >= 2 and shape[0] == 1
                    and _only_elementwise_readers(g, node.id, depends, readers)):
                node = node.with_(out_shape=(n,) + shape[1:], attrs={**node.attrs, "to_shape": (n,) + shape[1:]})
            out.append(node)
            continue
        shape = tuple(node.out_shape)
        if not shape or shape[0] != 1:
            return None
        attrs = dict(node.attrs)
        for key in _SHAPE_ATTRS:
            value = attrs.get(key)
            if isinstance(value, tuple) and value and value[0] == 1:
                attrs[key] = (n,) + value[1:]
        out.append(node.with_(out_shape=(n,) + shape[1:], attrs=attrs))
    try:
        batched = Graph(out, g.inputs, g.outputs)
        check(batched)
    except BridgeError:
        return None
    return batched
