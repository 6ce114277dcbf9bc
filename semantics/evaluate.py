"""The reference evaluator: TorchLean's ``Graph.denoteAll`` over a float domain.

Nodes are evaluated left to right in one loop (no recursion, so depth is unlimited); each node's
value comes from ``FLOAT_RULES[kind]``. Without ``all_nodes`` a value is dropped right after its
last reader, so memory follows the live frontier, not the graph. ``float64`` is the reference
(TorchLean computes in binary64); ``float32`` mirrors PyTorch/onnxruntime (payload and inputs in
binary32, binary32 BLAS). Every failure is an ``EvalError`` naming the node.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from torchlean_bridge.check import check as check_graph
from torchlean_bridge.check import check_well_formed
from torchlean_bridge.errors import BridgeError, EvalError
from torchlean_bridge.graph import Graph, Node
from torchlean_bridge.ops import BOOL, INT64, fmt_shape
from torchlean_bridge.payload import Payload

from .float_rules import FLOAT_RULES
from .records import fail

__all__ = ["evaluate", "eval_node", "denote_all", "denote", "as_array", "input_list", "input_sets", "DTYPES"]

DTYPES = {"float64": np.dtype(np.float64), "float32": np.dtype(np.float32)}
_RESULT_KINDS = {INT64: np.dtype(np.int64), BOOL: np.dtype(bool)}


_DOMAINS = {**DTYPES, **{dt: dt for dt in DTYPES.values()}, np.float64: DTYPES["float64"],
            np.float32: DTYPES["float32"]}


def _domain(dtype: str | np.dtype) -> np.dtype:
    try:
        return _DOMAINS[dtype]
    except (KeyError, TypeError):
        raise BridgeError(f"IR eval: unsupported dtype {dtype!r} (use float64 or float32)") from None


def as_array(value: Any) -> np.ndarray:
    """numpy arrays as they are; torch tensors (duck-typed, torch is never imported) via numpy."""
    if hasattr(value, "detach") and hasattr(value, "cpu"):
        try:
            value = value.detach().cpu().numpy()
        except (TypeError, RuntimeError) as e:  # e.g. bfloat16 has no numpy type
            raise EvalError(f"IR eval: cannot read an input tensor of dtype {getattr(value, 'dtype', '?')} "
                            f"as an array ({e}); convert it to float32 first") from None
    try:
        return np.asarray(value)
    except (TypeError, ValueError) as e:
        raise EvalError(f"IR eval: cannot read an input as an array: {e}") from None


def _is_array(value: Any) -> bool:
    """numpy arrays and numpy scalars (0-d values) and tensors; a Python float or int is not one."""
    return isinstance(value, (np.ndarray, np.generic)) or (hasattr(value, "detach") and hasattr(value, "cpu"))


def _holds_arrays(value: Any) -> bool:
    """A list/tuple with an array or tensor among its items (or among its items' items)."""
    return isinstance(value, (list, tuple)) and any(_is_array(x) or _holds_arrays(x) for x in value)


def input_list(inputs: Any, count: int, context: str = "IR eval",
               error: type[BridgeError] = EvalError) -> list[np.ndarray]:
    """One input set as ``count`` arrays in graph-input order.

    A list or tuple is a list of inputs when it holds numpy values or tensors (``[x, idx]``) or is
    empty; anything else is ONE array, including a (nested) list of plain Python numbers:
    ``[0., 1.]`` is the array ``[0., 1.]`` for a one-input graph, never two scalar inputs.
    """
    if isinstance(inputs, (list, tuple)) and (not inputs or _holds_arrays(inputs)):
        arrays = [as_array(x) for x in inputs]
    else:
        arrays = [as_array(inputs)]
    if len(arrays) != count:
        raise error(f"{context}: expected {count} input(s), got {len(arrays)}")
    return arrays


def input_sets(g: Graph, inputs: Any, context: str = "IR eval") -> list[list[np.ndarray]]:
    """One input set (as ``input_list`` reads it) or a list of sets (a list whose items are lists
    holding arrays), each checked against the graph's input shapes; what audits and differential
    tests accept as ``inputs``."""
    n = len(g.inputs)
    if isinstance(inputs, (list, tuple)) and any(isinstance(x, (list, tuple)) and _holds_arrays(x) for x in inputs):
        sets = [input_list(one, n, context) for one in inputs]
    else:
        sets = [input_list(inputs, n, context)]
    for one in sets:
        for x, nid in zip(one, g.inputs):
            if tuple(x.shape) != g.nodes[nid].out_shape:
                raise EvalError(f"{context}: input for node {nid} has shape {list(x.shape)}, expected "
                                f"{list(g.nodes[nid].out_shape)}", node=nid)
    return sets


def eval_node(node: Node, parent_values: Sequence[np.ndarray], record: Any, dtype: str | np.dtype = "float64"
              ) -> np.ndarray:
    """One node's value from its parents' values and its payload record (``{role: ndarray}``).

    For an ``input`` node, ``parent_values`` is ``[the caller's array]``. The result has the
    node's declared shape and element type (float results in the domain ``dtype``). Importers use
    this to fold constants.
    """
    with np.errstate(all="ignore"):
        return _node_value(node, parent_values, record or {}, _domain(dtype))


def _node_value(node: Node, parent_values: Sequence[np.ndarray], record: Any, dt: np.dtype) -> np.ndarray:
    """``eval_node`` for a resolved domain, inside the caller's ``errstate`` (the evaluator's loop)."""
    rule = FLOAT_RULES.get(node.kind)
    if rule is None:
        raise fail(node, f"IR eval: node {node.id}: no float semantics for op kind `{node.kind}`")
    try:
        value = np.asarray(rule(node, parent_values, record, dt))
    except BridgeError:
        raise
    except (ValueError, TypeError, LookupError, ArithmeticError) as e:
        raise fail(node, f"IR eval: node {node.id}: {node.kind}: {e} ({node.summary()})") from None
    if value.shape != node.out_shape:
        raise fail(node, f"IR eval: node {node.id}: produced shape mismatch: produced={fmt_shape(value.shape)}, "
                         f"declared={fmt_shape(node.out_shape)} ({node.summary()})")
    want = _RESULT_KINDS.get(node.dtype, dt)
    return value if value.dtype == want else value.astype(want)


def evaluate(g: Graph, payload: Payload | None, inputs: Any, dtype: str = "float64", all_nodes: bool = False,
             check: bool = True) -> list[np.ndarray]:
    """Outputs in ``g.outputs`` order, or with ``all_nodes`` one value per node id.

    ``inputs``: arrays or torch tensors in ``g.inputs`` order, or one array (a list of plain
    numbers is one array) for a one-input graph; see ``input_list``.
    ``check`` validates structure and shapes first. With ``check=False`` only well-formedness is
    checked, as TorchLean's ``denoteAll`` does; each node then checks its own operands locally.
    """
    dt = _domain(dtype)
    if check:
        check_graph(g)
    else:
        check_well_formed(g)
    payload = payload if payload is not None else Payload()
    arrays = input_list(inputs, len(g.inputs))
    position = {nid: k for k, nid in enumerate(g.inputs)}
    values: list[np.ndarray | None] = [None] * len(g.nodes)
    frees: list[list[int]] = [[] for _ in g.nodes]
    if not all_nodes:
        for nid, last in enumerate(g.last_use()):
            if last < len(g.nodes):
                frees[last].append(nid)
    with np.errstate(all="ignore"):  # partial ops check their domains; overflow to inf is a value
        for node in g.nodes:
            if node.kind == "input":
                if node.id not in position:
                    raise fail(node, f"IR eval: node {node.id}: input node is not listed among the graph inputs")
                parents = [arrays[position[node.id]]]
            else:
                parents = [_parent(node, p, values) for p in node.parents]
            values[node.id] = _node_value(node, parents, payload.record(node.id), dt)
            for dead in frees[node.id]:
                values[dead] = None
    if all_nodes:
        return values  # type: ignore[return-value]
    out = []
    for o in g.outputs:
        if not 0 <= o < len(values):
            raise EvalError(f"IR eval: outputId out of bounds: {o}")
        out.append(values[o])
    return out


def _parent(node: Node, p: int, values: list[np.ndarray | None]) -> np.ndarray:
    value = values[p] if 0 <= p < len(values) else None
    if value is None:
        available = sum(v is not None for v in values)
        raise fail(node, f"IR eval: node {node.id}: parent {p} has not been evaluated "
                         f"(available values: {available}) ({node.summary()})")
    return value


def denote_all(g: Graph, payload: Payload | None, inputs: Any, dtype: str = "float64") -> list[np.ndarray]:
    """TorchLean's ``Graph.denoteAll``: the whole value table."""
    return evaluate(g, payload, inputs, dtype=dtype, all_nodes=True)


def denote(g: Graph, payload: Payload | None, inputs: Any, dtype: str = "float64") -> list[np.ndarray]:
    """TorchLean's ``Graph.denote``: the outputs."""
    return evaluate(g, payload, inputs, dtype=dtype)
