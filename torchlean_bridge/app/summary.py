"""The GraphSpec view of a bundle: its parameter ABI read back per layer, in TorchLean's format.

TorchLean's model summary prints ``Sequential: [2] -> [1], layers=3, params=13, state=13`` and one
line per layer, ``[0] Linear(2, 3): [2] -> [3] params=9, state=9 [[3, 2], [3]]``: the layer's input
and output shapes, its trainable scalars (``params``), all its stored scalars (``state``: params plus
buffers such as BatchNorm's running statistics) and its state shapes in ABI order. Every node but the
graph inputs is a layer. A graph whose layers form one path from its single input to its single
output prints as ``Sequential``; any other graph as ``DAG`` with all its inputs and outputs.
"""

from __future__ import annotations

import math

from torchlean_bridge.bundle import Bundle
from torchlean_bridge.graph import Graph, Node
from torchlean_bridge.ops import fmt_shape

from .abi import abi

__all__ = ["summary", "layer_name", "BUFFER_ROLES"]

# payload roles that are stored state but not trained (PyTorch buffers)
BUFFER_ROLES = frozenset({"running_mean", "running_var"})

_SIMPLE_NAMES = {"relu": "ReLU", "tanh": "Tanh", "sigmoid": "Sigmoid", "flatten": "Flatten", "gelu": "GELU",
                 "softplus": "Softplus", "exp": "Exp", "log": "Log", "abs": "Abs", "sum": "Sum", "add": "Add",
                 "sub": "Sub", "mul_elem": "Mul", "detach": "Detach", "silu": "SiLU"}


def layer_name(g: Graph, node: Node) -> str:
    """TorchLean's layer kind where it has one (``Linear(2, 3)``, ``ReLU``, ``Conv(rank=2,in=1,out=3)``,
    ``MaxPool(rank=2)``, ``BatchNorm(channels=3,rank=2)``), else the node's own description."""
    a = node.attrs
    if node.kind == "linear":
        return f"Linear({g.nodes[node.parents[0]].out_shape[-1]}, {node.out_shape[-1]})"
    if node.kind == "conv":
        return f"Conv(rank={a['spatial_rank']},in={a['in_channels']},out={a['out_channels']})"
    if node.kind in ("max_pool", "avg_pool"):
        return f"{'MaxPool' if node.kind == 'max_pool' else 'AvgPool'}(rank={a['spatial_rank']})"
    if node.kind == "batch_norm_eval":
        return f"BatchNorm(channels={a['channels']},rank={len(node.out_shape) - a['channel_axis'] - 1})"
    if node.kind == "softmax":
        return f"Softmax(axis={a['axis']})"
    return _SIMPLE_NAMES.get(node.kind, node.describe())


def _is_chain(g: Graph) -> bool:
    if len(g.inputs) != 1 or len(g.outputs) != 1 or g.outputs[0] != len(g.nodes) - 1:
        return False
    layers = [n for n in g.nodes if n.kind != "input"]
    return all(list(n.parents) == [n.id - 1] for n in layers) and g.inputs[0] == 0


def summary(bundle: Bundle) -> str:
    """The GraphSpec summary text (one header line, one line per layer)."""
    g = bundle.graph
    per_node: dict[int, list[tuple[tuple[int, ...], bool]]] = {}
    for slot in abi(bundle):
        per_node.setdefault(slot.node, []).append((slot.shape, slot.role not in BUFFER_ROLES))
    lines = []
    total_params = total_state = 0
    layers = [n for n in g.nodes if n.kind != "input"]
    for k, node in enumerate(layers):
        slots = per_node.get(node.id, [])
        params = sum(math.prod(shape) for shape, trainable in slots if trainable)
        state = sum(math.prod(shape) for shape, _ in slots)
        total_params, total_state = total_params + params, total_state + state
        ins = ", ".join(fmt_shape(g.nodes[p].out_shape) for p in node.parents) or "()"
        shapes = "[" + ", ".join(fmt_shape(shape) for shape, _ in slots) + "]"
        lines.append(f"  [{k}] {layer_name(g, node)}: {ins} -> {fmt_shape(node.out_shape)} "
                     f"params={params}, state={state} {shapes}")
    title = "Sequential" if _is_chain(g) else "DAG"
    ins = ", ".join(fmt_shape(g.nodes[i].out_shape) for i in g.inputs) or "()"
    outs = ", ".join(fmt_shape(g.nodes[o].out_shape) for o in g.outputs) or "()"
    head = f"{title}: {ins} -> {outs}, layers={len(layers)}, params={total_params}, state={total_state}"
    return "\n".join([head] + lines)
