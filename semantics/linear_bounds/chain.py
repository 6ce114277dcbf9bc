"""A graph as a chain of affine layers and ReLUs, with dense matrices, for plain-float optimizations.

beta-CROWN's multipliers and the branching scores of branch and bound are computed by plain backward
passes through the network (no soundness claim: the bounds they lead to are computed by the sound
CROWN passes). Those passes need each affine layer as one ``[out, in]`` matrix over flattened values.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..records import PREPARED
from .crown import Crown

__all__ = ["ELEMENTWISE_AFFINE", "MAX_DENSE", "chain_layers", "const_boxes", "dag_layers"]

MAX_DENSE = 1 << 22  # entries of a convolution's dense matrix in a chain (32 MiB of float64)
ELEMENTWISE_AFFINE = frozenset({"add", "sub", "mul_elem", "div", "neg"})  # with a constant: ``scale`` layers


def _target(crown: Crown, t: int | None) -> int | None:
    """The node a plain-float pass starts from: ``t``, or the single output; None on an unbatched run
    (the passes work along the batch axis) or when there are several outputs and none was named."""
    if not crown.batched:
        return None
    if t is None:
        return crown.graph.outputs[0] if len(crown.graph.outputs) == 1 else None
    return t


def chain_layers(crown: Crown, t: int | None = None) -> tuple[list[tuple[str, int, Any, Any]], int] | None:
    """t's ancestors (the output by default) as ``([(kind, id, weight, bias)], input id)`` from t down, when
    they are a chain of affine layers (``linear`` on ``[N, features]``, ``conv`` with its channel axis 1,
    as dense ``[out, in]`` matrices over the flattened values; reshapes are skipped: they keep the flat
    order), elementwise affine maps by constants (``("scale", id, scale, shift)``: an input
    normalization ``(x - mean) / std``, see ``_elementwise_affine``) and ReLUs (``("relu", id, None, None)``); None otherwise or when a dense matrix would exceed
    MAX_DENSE entries. For plain-float heuristics and optimizations (no soundness claim)."""
    g = crown.graph
    t = _target(crown, t)
    if t is None:
        return None
    out, v = [], t
    while g.nodes[v].kind != "input":
        node = g.nodes[v]
        if crown.const[v] or not node.parents:
            return None
        if node.kind in ELEMENTWISE_AFFINE:
            got = _elementwise_affine(crown, node, v)
            if got is None:
                return None
            out.append(("scale", v) + got[1:])
            v = got[0]
            continue
        if any(not crown.const[q] for q in node.parents[1:]):
            return None
        if node.kind in ("linear", "conv"):
            got = _affine(crown, node, v)
            if got is None:
                return None
            out.append(("affine", v) + got)
        elif node.kind == "relu":
            out.append(("relu", v, None, None))
        elif node.kind not in ("reshape", "flatten"):
            return None
        v = node.parents[0]
    return out, v


def dag_layers(crown: Crown, t: int | None = None
               ) -> tuple[list[tuple[str, int, tuple[int, ...], Any, Any]], int] | None:
    """t's ancestors (the output by default) as a DAG for plain-float passes: ``([(kind, id, parents,
    weight, bias)], input id)`` in decreasing id (a backward pass's order), kinds ``affine`` (linear,
    or conv as a dense matrix, as ``chain_layers``), ``identity`` (reshape, flatten), ``scale`` (an elementwise
    affine map by constants, weight and bias flat per unit), ``add`` / ``sub`` of two input-dependent
    values of one shape, ``relu`` (also a leaky ReLU with slope in [0, 1]: its
    weight is that slope, 0 for a ReLU) and ``max_pool`` (its relaxation is the run's,
    ``_Run.pools``); None when another op, a second graph input or a dense matrix over MAX_DENSE
    entries is met. A chain (``chain_layers``) is the case of one parent each. No soundness claim."""
    g = crown.graph
    t = _target(crown, t)
    if t is None:
        return None
    out, inputs = [], set()
    for v in crown.ancestors(t):
        node = g.nodes[v]
        if crown.const[v]:
            continue
        parents = tuple(p for p in node.parents if not crown.const[p])
        if node.kind == "input":
            inputs.add(v)
            continue
        if node.kind in ELEMENTWISE_AFFINE and len(parents) == 1:
            got = _elementwise_affine(crown, node, v)
            if got is None:
                return None
            out.append(("scale", v, (got[0],)) + got[1:])
            continue
        if node.kind in ("add", "sub"):
            if len(parents) != 2 or len(node.parents) != 2 or any(
                    tuple(g.nodes[p].out_shape) != tuple(node.out_shape) for p in parents):
                return None
            out.append((node.kind, v, parents, None, None))
            continue
        if len(parents) != 1 or node.parents[0] != parents[0]:
            return None
        if node.kind == "relu":
            out.append(("relu", v, parents, 0.0, None))
        elif node.kind == "leaky_relu" and 0.0 <= float(node.attrs["negative_slope"]) <= 1.0:
            out.append(("relu", v, parents, float(node.attrs["negative_slope"]), None))  # the slope below 0
        elif node.kind in ("max_pool", "max_pool_nd"):
            out.append(("max_pool", v, parents, None, None))
        elif node.kind in ("reshape", "flatten"):
            out.append(("identity", v, parents, None, None))
        else:
            got = _affine(crown, node, v)
            if got is None:
                return None
            out.append(("affine", v, parents) + got)
    if len(inputs) != 1:
        return None
    return out, inputs.pop()


def _elementwise_affine(crown: Crown, node, v: int) -> tuple[int, np.ndarray, np.ndarray] | None:
    """``(input-dependent parent, scale, shift)`` (flat over one sample's units) of ``z = scale * x + shift``
    for a ``neg`` or an add, sub, mul or div of x by a constant that is the same for every sample; None
    otherwise (a constant divided by x is not affine)."""
    if node.kind == "neg":
        n_units = math.prod(crown.ishape(v)[1:])
        return node.parents[0], np.full(n_units, -1.0), np.zeros(n_units)
    if len(node.parents) != 2:
        return None
    (x, y) = node.parents
    first_varies = not crown.const[x]
    p, q = (x, y) if first_varies else (y, x)
    if crown.const[p] or not crown.const[q] or (node.kind == "div" and not first_varies):
        return None
    k = _per_unit(crown, q, v)
    if k is None:
        return None
    ones, zeros = np.ones_like(k), np.zeros_like(k)
    if node.kind == "add":
        return p, ones, k
    if node.kind == "sub":
        return (p, ones, -k) if first_varies else (p, -ones, k)
    if node.kind == "mul_elem":
        return p, k, zeros
    with np.errstate(all="ignore"):
        inv = 1.0 / k
    return (p, inv, zeros) if np.all(np.isfinite(inv)) else None


def _per_unit(crown: Crown, q: int, v: int) -> np.ndarray | None:
    """Constant q's value broadcast to one sample of v, flat (its box's midpoint: these passes are
    heuristics), or None when the samples' values differ or are not finite."""
    lo, hi = const_boxes(crown)[q]
    shape = crown.ishape(v)
    mid = np.broadcast_to((np.asarray(lo, dtype=np.float64) * 0.5 + np.asarray(hi, dtype=np.float64) * 0.5)
                          .reshape(crown.ishape(q)), shape).reshape(shape[0], -1)
    if not np.all(np.isfinite(mid)) or np.any(mid != mid[:1]):
        return None
    return mid[0].copy()


def const_boxes(crown: Crown) -> list:
    """Every node's interval box at the zero input (exact for the constant ones), once per Crown."""
    got = getattr(crown, "_const_boxes", None)
    if got is None:
        shape = crown.graph.nodes[crown.graph.inputs[0]].out_shape
        zero = np.zeros(shape)
        got = crown.ibp(zero, zero)
        crown._const_boxes = got
    return got


def _affine(crown: Crown, node, v: int):
    """(dense weight ``[out, in]``, bias ``[out]``) of a linear layer or convolution, or None."""
    if node.kind == "linear" and len(node.out_shape) == 2:
        p = crown.ibp.records[v][PREPARED]
        return p.weight, p.bias
    if node.kind == "conv" and node.attrs["channel_axis"] == 1:
        tail_in = crown.ishape(node.parents[0])[1:]
        n_in, n_out = math.prod(tail_in), math.prod(crown.ishape(v)[1:])
        if n_in * n_out > MAX_DENSE:
            return None
        from ..rules.affine import batched_conv
        p = crown.ibp.records[v][PREPARED]
        eye = np.eye(n_in).reshape((n_in,) + tuple(tail_in))
        dense = batched_conv(eye, p.weight, node.attrs).reshape(n_in, n_out).T
        return np.ascontiguousarray(dense), np.repeat(p.bias, n_out // p.bias.size)
    return None
