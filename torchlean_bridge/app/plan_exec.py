"""Executing a kernel plan: each node runs with the provider its planned capsule names.

Reference capsules run through the reference evaluator's rule for the node (``semantics``),
CPU libtorch capsules through torch's functional ops (``app/torch_kernels.py``); nodes that need no
runtime work (input, const, detach) take the reference path, which only moves data. Before anything
runs, the plan is checked against the graph (same graph digest, one kernel per runtime node) and
every kernel must be executable here; a capsule this library cannot run is refused by name.

``PlanRunner`` is the differential-testing runner over a plan, so ``diff(bundle, against="plan",
plan=...)`` compares a plan's execution with the reference node by node.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from torchlean_bridge.errors import BridgeError, EvalError
from torchlean_bridge.gcpause import gc_paused
from torchlean_bridge.graph import Graph, Node
from torchlean_bridge.ops import BOOL, INT64, fmt_shape
from torchlean_bridge.payload import Payload

from .kernel_plan import KernelPlan, KernelPolicy, PlannedKernel, load_plan, plan_kernels
from .torch_kernels import TORCH_RULES

__all__ = ["evaluate", "execute_plan", "as_plan", "PlanRunner"]

_RESULT_KINDS = {INT64: np.dtype(np.int64), BOOL: np.dtype(bool)}


def as_plan(plan: Any, g: Graph) -> KernelPlan:
    """A ``KernelPlan``, a ``KernelPolicy`` (planned now) or a saved plan's path, checked against ``g``."""
    if isinstance(plan, KernelPolicy):
        plan = plan_kernels(g, plan)
    elif isinstance(plan, (str, bytes)) or hasattr(plan, "__fspath__"):
        plan = load_plan(plan)
    if not isinstance(plan, KernelPlan):
        raise BridgeError(f"evaluate: plan must be a KernelPlan, a KernelPolicy or a saved plan's path, "
                          f"got {type(plan).__name__}")
    plan.validate(g)
    blocked = [k for k in plan if not k.executable]
    if blocked:
        listed = ", ".join(f"node {k.node} ({k.capsule.name} on {k.capsule.device})" for k in blocked)
        raise BridgeError(f"evaluate: this library cannot execute the planned capsule(s) {listed}",
                          node=blocked[0].node)
    return plan


def _contiguous(a: np.ndarray) -> np.ndarray:
    """C order without np.ascontiguousarray, which turns a 0-d array into shape [1]."""
    a = np.asarray(a)
    return a if a.flags.c_contiguous and a.flags.writeable else a.copy()


def _torch_node(node: Node, kernel: PlannedKernel, parents: Sequence[np.ndarray], record: Any,
                dt: np.dtype) -> np.ndarray:
    import torch
    from semantics.records import fail
    xs = [torch.from_numpy(_contiguous(p)) for p in parents]
    with torch.no_grad():
        try:
            y = TORCH_RULES[node.kind](node, xs, record or {})
        except BridgeError:
            raise
        except (RuntimeError, ValueError, TypeError, IndexError) as e:
            raise fail(node, f"IR eval: node {node.id}: {kernel.capsule.name}: {e} ({node.summary()})") from None
    value = y.detach().cpu().numpy()
    if value.dtype.kind == "f" and np.isnan(value).any() and not any(
            p.dtype.kind == "f" and np.isnan(p).any() for p in parents):
        raise fail(node, f"IR eval: node {node.id}: {kernel.capsule.name} produced NaN from NaN-free operands "
                         f"({node.summary()})")
    return value


def execute_plan(g: Graph, payload: Payload | None, inputs: Any, plan: Any, dtype: str = "float64",
                 all_nodes: bool = False, check: bool = True) -> list[np.ndarray]:
    """``evaluate`` with each node run by its planned provider; same arguments and results."""
    from semantics.evaluate import DTYPES, eval_node, input_list
    from torchlean_bridge.check import check as check_graph
    from torchlean_bridge.check import check_well_formed
    if dtype not in DTYPES and dtype not in DTYPES.values():
        raise BridgeError(f"IR eval: unsupported dtype {dtype!r} (use float64 or float32)")
    dt = np.dtype(dtype)
    check_graph(g) if check else check_well_formed(g)
    plan = as_plan(plan, g)
    payload = payload if payload is not None else Payload()
    arrays = input_list(inputs, len(g.inputs))
    position = {nid: k for k, nid in enumerate(g.inputs)}
    values: list[np.ndarray | None] = [None] * len(g.nodes)
    frees: list[list[int]] = [[] for _ in g.nodes]
    if not all_nodes:
        for nid, last in enumerate(g.last_use()):
            if last < len(g.nodes):
                frees[last].append(nid)
    for node in g.nodes:
        if node.kind == "input":
            if node.id not in position:
                raise EvalError(f"IR eval: node {node.id}: input node is not listed among the graph inputs",
                                node=node.id)
            parents = [arrays[position[node.id]]]
        else:
            parents = [values[p] for p in node.parents]  # well formed: every parent is earlier and alive
        kernel = plan.kernel_for(node.id)
        if kernel is None or kernel.capsule.provider == "reference":
            value = eval_node(node, parents, payload.record(node.id), dt)
        else:
            floats = [p.astype(dt, copy=False) if p.dtype.kind == "f" else p for p in parents]
            value = _torch_node(node, kernel, floats, payload.record(node.id), dt)
            if value.shape != node.out_shape:
                raise EvalError(f"IR eval: node {node.id}: {kernel.capsule.name} produced shape "
                                f"{fmt_shape(value.shape)}, declared {fmt_shape(node.out_shape)}", node=node.id)
            want = _RESULT_KINDS.get(node.dtype, dt)
            value = value if value.dtype == want else value.astype(want)
        values[node.id] = value
        for dead in frees[node.id]:
            values[dead] = None
    if all_nodes:
        return values  # type: ignore[return-value]
    return [values[o] for o in g.outputs]


@gc_paused
def evaluate(g: Graph, payload: Payload | None, inputs: Any, dtype: str = "float64", all_nodes: bool = False,
             check: bool = True, plan: Any = None, exact: bool = False) -> list[np.ndarray]:
    """``tlb.evaluate``: the reference evaluator (``semantics.evaluate.evaluate``, ``exact`` its
    TorchLean-exact float64 mode), or with ``plan`` (a ``KernelPlan``, a ``KernelPolicy`` or a saved
    plan's path) each node run by its planned provider."""
    if plan is None:
        from semantics.evaluate import evaluate as reference_evaluate
        return reference_evaluate(g, payload, inputs, dtype=dtype, all_nodes=all_nodes, check=check, exact=exact)
    if exact:
        raise BridgeError("evaluate: exact=True is the reference evaluator's mode; it does not apply to a plan")
    return execute_plan(g, payload, inputs, plan, dtype=dtype, all_nodes=all_nodes, check=check)


class PlanRunner:
    """A diff runner: the plan's execution at one precision, every node's value keyed by node id."""

    def __init__(self, bundle: Any, plan: Any, dtype: str = "float32") -> None:
        from torchlean_bridge.check import check
        check(bundle.graph)
        self.graph, self.dtype = bundle.graph, dtype
        self.plan = as_plan(plan, bundle.graph)
        self.payload = bundle.payload.astype(dtype)
        self.input_precision = np.float32 if dtype == "float32" else np.float64
        providers = "+".join(self.plan.providers_used()) or "no kernels"
        self.name = f"kernel plan ({providers}, {dtype})"
        self.output_keys = [self.key(o) for o in bundle.graph.outputs]

    @staticmethod
    def key(node: int) -> str:
        return f"node {node}"

    def rounded(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        return [x.astype(self.input_precision).astype(np.float64) if x.dtype.kind == "f" else x for x in inputs]

    def run(self, inputs: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
        table = execute_plan(self.graph, self.payload, list(inputs), self.plan, dtype=self.dtype, all_nodes=True,
                             check=False)
        return {self.key(i): np.asarray(v) for i, v in enumerate(table)}
