"""The reference evaluator: TorchLean's ``Graph.denoteAll`` over a float domain.

``float64`` is the reference (TorchLean computes in binary64); ``float32`` mirrors PyTorch and
onnxruntime (payload and inputs in binary32, binary32 BLAS). The loop, dead-value freeing and error
context are ``semantics.domains.run``'s, shared with the interval domain; the rules are
``semantics.rules``'. Inputs are read here, once, for every domain (``input_list``). Every refusal
is an ``EvalError`` naming the node.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from torchlean_bridge.check import check as check_graph
from torchlean_bridge.check import check_well_formed
from torchlean_bridge.errors import BridgeError, EvalError
from torchlean_bridge.graph import Graph, Node
from torchlean_bridge.payload import Payload

from .domains import DTYPES, ExactDomain, FloatDomain, node_value, run
from .rules.rng import stream_records

__all__ = ["evaluate", "eval_node", "denote_all", "denote", "as_array", "input_list", "input_sets", "DTYPES",
           "float_domain"]

_DOMAINS = {name: FloatDomain(dt) for name, dt in DTYPES.items()}
_ALIASES = {**{dt: name for name, dt in DTYPES.items()}, np.float64: "float64", np.float32: "float32"}
EXACT = ExactDomain()


def float_domain(dtype: str | np.dtype | type, exact: bool = False) -> FloatDomain:
    """The float domain named by ``dtype`` ("float64", "float32", or the numpy dtype); with
    ``exact`` the exact float64 mode (TorchLean's fold orders and libm)."""
    try:
        domain = _DOMAINS[_ALIASES.get(dtype, dtype)]
    except (KeyError, TypeError):
        raise BridgeError(f"IR eval: unsupported dtype {dtype!r} (use float64 or float32)") from None
    if exact:
        if domain.name != "float64":
            raise BridgeError(f"IR eval: exact mode computes in float64 (TorchLean's Float), not {domain.name}")
        return EXACT
    return domain


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


def eval_node(node: Node, parent_values: Sequence[np.ndarray], record: Any, dtype: str | np.dtype = "float64",
              exact: bool = False) -> np.ndarray:
    """One node's value from its parents' values and its payload record (``{role: ndarray}``).

    For an ``input`` node, ``parent_values`` is ``[the caller's array]``. The result has the
    node's declared shape and element type (float results in the domain ``dtype``). Importers use
    this to fold constants.
    """
    domain = float_domain(dtype, exact)
    with np.errstate(all="ignore"):
        return node_value(domain, node, parent_values, record or {})


def evaluate(g: Graph, payload: Payload | None, inputs: Any, dtype: str = "float64", all_nodes: bool = False,
             check: bool = True, exact: bool = False, resume: tuple[int, Sequence[Any]] | None = None
             ) -> list[np.ndarray]:
    """Outputs in ``g.outputs`` order, or with ``all_nodes`` one value per node id.

    ``inputs``: arrays or torch tensors in ``g.inputs`` order, or one array (a list of plain
    numbers is one array) for a one-input graph; see ``input_list``.
    ``check`` validates structure and shapes first. With ``check=False`` only well-formedness is
    checked, as TorchLean's ``denoteAll`` does; each node then checks its own operands locally.
    ``exact`` (float64 only) reproduces TorchLean's accumulation orders (sequential folds from +0.0)
    and C libm, so the v1 kinds' values are bit-identical to TorchLean's ``Graph.denoteAll`` at Float;
    the default float64 mode uses BLAS, pairwise sums and numpy's functions (a few ulps apart).
    ``resume``: see ``semantics.domains.run`` (nodes before its start keep an earlier run's values).
    """
    domain = float_domain(dtype, exact)
    if check:
        check_graph(g)
    else:
        check_well_formed(g)
    payload = payload if payload is not None else Payload()
    seeds = dict(zip(g.inputs, input_list(inputs, len(g.inputs))))
    return run(g, domain, seeds, stream_records(g, payload.record), all_nodes=all_nodes, local_checks=not check,
               resume=resume)


def denote_all(g: Graph, payload: Payload | None, inputs: Any, dtype: str = "float64", exact: bool = False
               ) -> list[np.ndarray]:
    """TorchLean's ``Graph.denoteAll``: the whole value table."""
    return evaluate(g, payload, inputs, dtype=dtype, all_nodes=True, exact=exact)


def denote(g: Graph, payload: Payload | None, inputs: Any, dtype: str = "float64") -> list[np.ndarray]:
    """TorchLean's ``Graph.denote``: the outputs."""
    return evaluate(g, payload, inputs, dtype=dtype)
