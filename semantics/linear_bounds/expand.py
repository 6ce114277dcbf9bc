"""CROWN's view of softmax and layernorm: the same real function as a chain of ops it can relax.

CROWN has no relaxation of layernorm (nor of softmax over a middle axis); both are compositions of ops it does
relax (sums, differences, exp, 1/x, x^2, 1/sqrt(x), products of two bounded terms), so ``expand``
rewrites them once, per graph, into such a sub-chain. Every node of the sub-chain is then an ordinary
node: IBP gives it a box, CROWN refines the input of each of its nonlinear steps, exactly as for any
other activation (the auto_LiRPA method, none of its code).

* softmax over an axis a other than the last (the last has its own planes, ``softmax_planes``):
  ``y_i = 1 / sum_j exp(x_j - x_i)`` (the real identity; the differences are
  taken by broadcasting x against itself, so the diagonal d_ii is refined to 0 by CROWN).
* layernorm over the trailing axes from a (E entries): ``d = x - mean(x)``, ``var = mean(d^2)``,
  ``y = d * rsqrt(var + eps)``, then ``y * weight + bias``: TorchLean's layernorm in exact arithmetic
  (its second centring is exactly zero there).

``Expanded.origin`` maps each new node to the original node it computes (the last node of a
sub-chain) or belongs to, so boxes and fallbacks are reported in the caller's numbering.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from torchlean_bridge.graph import Graph, Node
from torchlean_bridge.payload import Payload

__all__ = ["Expanded", "expand"]



@dataclass
class Expanded:
    graph: Graph
    payload: Payload | None
    new_of: list[int]  # original node id -> the new node holding its value
    origin: list[int]  # new node id -> the original node it computes or belongs to


class _Builder:
    def __init__(self) -> None:
        self.nodes: list[Node] = []
        self.origin: list[int] = []
        self.payload = Payload()
        self.owner = -1

    def add(self, kind: str, parents: tuple[int, ...], shape: tuple[int, ...], attrs: dict | None = None,
            source=None) -> int:
        nid = len(self.nodes)
        self.nodes.append(Node(nid, tuple(parents), kind, tuple(shape), dict(attrs or {}), source=source))
        self.origin.append(self.owner)
        return nid

    def const(self, values: np.ndarray) -> int:
        values = np.asarray(values, dtype=np.float64)
        nid = self.add("const", (), values.shape, {"value_shape": tuple(values.shape)})
        self.payload.set(nid, "values", values)
        return nid

    def reshape(self, x: int, shape: tuple[int, ...]) -> int:
        src = self.nodes[x].out_shape
        if tuple(src) == tuple(shape):
            return x
        return self.add("reshape", (x,), shape, {"in_shape": tuple(src), "out_shape": tuple(shape)})

    def broadcast(self, x: int, shape: tuple[int, ...]) -> int:
        src = self.nodes[x].out_shape
        if tuple(src) == tuple(shape):
            return x
        return self.add("broadcast_to", (x,), shape, {"from_shape": tuple(src), "to_shape": tuple(shape)})


def _softmax(b: _Builder, x: int, shape: tuple[int, ...], axis: int) -> int:
    t = shape[axis]
    pair = shape[:axis] + (t, t) + shape[axis + 1:]
    xi = b.broadcast(b.reshape(x, shape[:axis + 1] + (1,) + shape[axis + 1:]), pair)  # x_i at [.., i, j, ..]
    xj = b.broadcast(b.reshape(x, shape[:axis] + (1,) + shape[axis:]), pair)  # x_j at [.., i, j, ..]
    d = b.add("sub", (xj, xi), pair)
    e = b.add("exp", (d,), pair)
    s = b.add("reduce_sum", (e,), shape, {"axis": axis + 1})
    return b.add("inv", (s,), shape)


def _layernorm(b: _Builder, x: int, shape: tuple[int, ...], axis: int, eps: float,
               weight: np.ndarray | None, bias: np.ndarray | None) -> int:
    lead = shape[:axis]
    e = math.prod(shape[axis:])
    flat, keep = lead + (e,), lead + (1,)
    xf = b.reshape(x, flat)
    mean = b.broadcast(b.reshape(b.add("reduce_mean", (xf,), lead, {"axis": axis}), keep), flat)
    d = b.add("sub", (xf, mean), flat)
    var = b.add("reduce_mean", (b.add("pow", (d,), flat, {"exponent": 2.0}),), lead, {"axis": axis})
    ve = b.add("add", (var, b.const(np.full(lead, float(eps)))), lead)
    r = b.broadcast(b.reshape(b.add("rsqrt", (ve,), lead), keep), flat)
    y = b.reshape(b.add("mul_elem", (d, r), flat), shape)
    if weight is not None:
        y = b.add("mul_elem", (y, b.const(np.broadcast_to(np.asarray(weight, dtype=np.float64).reshape(shape[axis:]),
                                                          shape))), shape)
    if bias is not None:
        y = b.add("add", (y, b.const(np.broadcast_to(np.asarray(bias, dtype=np.float64).reshape(shape[axis:]),
                                                     shape))), shape)
    return y


def expand(g: Graph, payload: Payload | None) -> Expanded | None:
    """The graph with every layernorm and every softmax over a middle axis rewritten (None when it has none)."""
    if not any(n.kind == "layernorm" or (n.kind == "softmax" and n.attrs["axis"] != len(n.out_shape) - 1)
               for n in g.nodes):
        return None
    b = _Builder()
    new_of: list[int] = []
    for node in g.nodes:
        b.owner = node.id
        parents = tuple(new_of[p] for p in node.parents)
        shape = tuple(node.out_shape)
        if node.kind == "softmax" and int(node.attrs["axis"]) != len(shape) - 1:  # the last axis: planes
            out = _softmax(b, parents[0], shape, int(node.attrs["axis"]))
        elif node.kind == "layernorm":
            rec = payload.record(node.id) if payload is not None and node.id in payload else {}
            out = _layernorm(b, parents[0], shape, int(node.attrs["axis"]), float(node.attrs["eps"]),
                             rec.get("weight"), rec.get("bias"))
        else:
            out = b.add(node.kind, parents, shape, dict(node.attrs), node.source)
            b.nodes[out] = Node(out, parents, node.kind, shape, dict(node.attrs), node.dtype, node.source)
            if payload is not None and node.id in payload:
                for role, arr in payload.record(node.id).items():
                    b.payload.set(out, role, arr)
        new_of.append(out)
    graph = Graph(b.nodes, [new_of[i] for i in g.inputs], [new_of[o] for o in g.outputs])
    return Expanded(graph, b.payload, new_of, b.origin)
