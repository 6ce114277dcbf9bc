"""Cut a graph so that one node's value becomes its single input, or freeze inputs to constants.

torchlean.ir.v1 graphs have one float input; a language model's input is token ids (int64) looked up
in embedding tables. Cutting at the embeddings gives TorchLean the part it can take: everything after
the lookup. ``eval --at NODE --save`` computes the cut input from token ids with the full graph.
``embeddings_node`` finds the preset cut: the first float node through which every path from the
integer inputs to the outputs runs. ``freeze_inputs`` turns graph inputs into constants (a model with
several inputs, the others given). Both report the nodes left behind and the old -> new ids.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from ..bundle import Bundle
from ..errors import BridgeError
from ..graph import Graph
from ..ops import FLOAT
from .base import GraphEdit, Note

__all__ = ["cut_at", "embeddings_node", "freeze_inputs"]


def _needed(g: Graph, stop: int | None) -> set[int]:
    """Every node an output reads, not looking past ``stop``."""
    seen = set(g.outputs)
    stack = list(g.outputs)
    while stack:
        nid = stack.pop()
        if nid == stop:
            continue
        for p in g.nodes[nid].parents:
            if p not in seen:
                seen.add(p)
                stack.append(p)
    return seen


def embeddings_node(g: Graph) -> int:
    """The first float node through which every path from the integer inputs to the outputs runs.

    One sweep in topological order: after node ``i`` the tainted values still needed later (read by a
    later needed node, or an output) are the only edges a path can cross; node ``i`` separates the
    integer inputs from the outputs exactly when it is the only one of them.
    """
    integer_inputs = {i for i in g.inputs if g.nodes[i].dtype != FLOAT}
    if not integer_inputs:
        raise BridgeError("--input-at embeddings: the graph has no integer input (token ids) to cut away")
    needed = _needed(g, None)
    outputs = set(g.outputs)
    last_read = {nid: len(g.nodes) if nid in outputs else -1 for nid in needed}
    for node in g.nodes:
        if node.id in needed:
            for p in node.parents:
                last_read[p] = max(last_read[p], node.id)
    dying: dict[int, list[int]] = {}
    live = integer_inputs & needed  # an input is a source wherever it sits in the order
    for i in live:
        dying.setdefault(last_read[i], []).append(i)
    tainted = set(integer_inputs)
    for node in g.nodes:
        for p in dying.pop(node.id, ()):
            live.discard(p)
        if node.id in tainted or not any(p in tainted for p in node.parents):
            continue
        tainted.add(node.id)
        if node.id in needed:
            live.add(node.id)
            dying.setdefault(last_read[node.id], []).append(node.id)
            if live == {node.id} and node.dtype == FLOAT:
                return node.id
    raise BridgeError("--input-at embeddings: no single float node separates the integer inputs from the outputs "
                      "(name one with --input-at NODE)")


def cut_at(bundle: Bundle, node_id: int) -> tuple[Bundle, Note]:
    """``node_id``'s value becomes the graph's first input; what only it needed is dropped."""
    g = bundle.graph
    if not 0 <= node_id < len(g):
        raise BridgeError(f"--input-at {node_id}: the graph has nodes 0..{len(g) - 1}")
    cut = g.nodes[node_id]
    if cut.dtype != FLOAT:
        raise BridgeError(f"--input-at {node_id}: node {node_id} ({cut.kind}) holds {cut.dtype} values; "
                          f"torchlean.ir.v1 inputs are float")
    needed = _needed(g, node_id)
    if node_id not in needed:
        raise BridgeError(f"--input-at {node_id}: no output depends on node {node_id} ({cut.kind})")
    edit = GraphEdit(bundle)
    new_input = edit.emit("input", (), {}, cut.out_shape, FLOAT, cut.source)
    edit.new_id[node_id] = new_input
    for node in g.nodes:
        if node.id in needed and node.id != node_id:
            edit.keep(node)
    others = [i for i in g.inputs if i in needed and i != node_id]
    out = edit.result(inputs=[new_input] + [edit.new_id[i] for i in others])
    prefix = sorted(set(range(len(g))) - needed)
    return out, Note("cut_at", 1, (f"node {node_id} ({cut.kind} {list(cut.out_shape)}) is the input; "
                                   f"{len(prefix)} node(s) before it dropped",),
                     {"cut": node_id, "prefix": prefix, "ids": dict(edit.new_id)})


def freeze_inputs(bundle: Bundle, values: Mapping[int, np.ndarray]) -> tuple[Bundle, Note]:
    """Graph inputs named by id become constants holding ``values`` (shapes and element types checked)."""
    g = bundle.graph
    for nid, value in values.items():
        if nid not in g.inputs:
            raise BridgeError(f"--constant-input {nid}: node {nid} is not a graph input (inputs: {list(g.inputs)})")
        node = g.nodes[nid]
        if tuple(np.shape(value)) != node.out_shape:
            raise BridgeError(f"--constant-input {nid}: the value has shape {list(np.shape(value))}, the input "
                              f"{list(node.out_shape)}")
    edit = GraphEdit(bundle)
    for node in g.nodes:
        if node.id in values:
            nid = edit.emit("const", (), {}, node.out_shape, node.dtype, node.source)
            kind = np.float64 if node.dtype == FLOAT else (np.bool_ if node.dtype == "bool" else np.int64)
            edit.payload[nid] = {"values": np.asarray(values[node.id], dtype=kind)}
            edit.new_id[node.id] = nid
        else:
            edit.keep(node)
    return (edit.result(inputs=[edit.new_id[i] for i in g.inputs if i not in values]),
            Note("freeze_inputs", len(values), tuple(f"input {i} is a constant" for i in sorted(values)),
                 {"ids": dict(edit.new_id)}))

