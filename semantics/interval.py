"""Interval bound propagation (IBP) over the IR: a sound float64 box for every node.

``interval_bounds(g, payload, lower, upper)`` returns one ``(lo, hi)`` pair per node whose
endpoints enclose the node's *exact real* value for every real input in the box: every operation is
outward rounded (see ``interval_round``), library transcendentals are widened by their error bound.
The rules (``semantics.rules``, next to each op's float rule) are tight where it is cheap to be:
affine ops in center-radius form (exact ranges before rounding), monotone functions at the
endpoints, gelu/silu/mish/sin/cos through their true extrema, per-entry exact softmax ranges. Every
op of the registry has a rule; the ops in ``NO_RULE`` raise ``IntervalError`` naming the node.

Enclosures that are sound but not exact ranges (documented where they live): layernorm (forgets
the correlation of the centered entries), mul_elem/div/matmul between two non-point boxes (each
term exact, the dependency between terms lost), ``rand_uniform`` ([0, 1], TorchLean's rule),
``bernoulli_mask`` ([0, 1] unless the keep probability's box decides it), argmax/argmin (from the
first to the last index that can win), sqrt/rsqrt/pow on a box reaching below 0 (clipped to the
domain, as TorchLean does), inv on a box containing 0 ([-inf, inf]: the float inv gives +-inf at
+-0), and affine images of boxes with an infinite end (unbounded).

Element types: int64 and bool values are boxes too (float64 endpoints; bools as 0/1; int64 is
exact up to 2**53). Ops that need exact integers (gather indices) demand point boxes. Domain
violations (log at <= 0, division by a box containing 0) raise ``IntervalError`` naming the node;
no box end is ever NaN (a NaN from inf - inf becomes the trivial bound).

``interval_bounds`` reads the payload on every call; ``IntervalPropagator(g, payload)`` (or
``tlb.prepare``) reads it once (affine weights in float64 with |W| precomputed) and then propagates
many boxes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from torchlean_bridge.check import check
from torchlean_bridge.errors import IntervalError
from torchlean_bridge.graph import Graph
from torchlean_bridge.ops import BOOL, INT64, fmt_shape
from torchlean_bridge.payload import Payload

from .arena import ThreadArenas, result_array
from .domains import DEFAULT_PRODUCTS, PRODUCTS, IntervalDomain, run
from .evaluate import input_list
from .interval_round import Box
from .records import domain_records, read_payload
from .scratch import scratch
from .rules import INTERVAL_RULES, NO_INTERVAL_RULE

__all__ = ["interval_bounds", "IntervalPropagator", "INTERVAL_RULES", "NO_RULE", "input_boxes", "DOMAIN",
           "interval_domain"]

NO_RULE = NO_INTERVAL_RULE
DOMAIN = IntervalDomain()
_DOMAINS = {"float64": DOMAIN, "float32": IntervalDomain("float32")}
_error = DOMAIN.fail


def interval_domain(products: str) -> IntervalDomain:
    """The interval domain whose linear/conv products run in ``products`` (float64 or float32)."""
    domain = _DOMAINS.get(products) if isinstance(products, str) else None
    if domain is None:
        raise IntervalError(f"interval: products must be one of {', '.join(PRODUCTS)}, got {products!r}")
    return domain


def input_boxes(g: Graph, lower: Any, upper: Any) -> dict[int, Box]:
    """The seeded boxes of the graph inputs, checked: shape, order, finiteness, point int/bool boxes."""
    n = len(g.inputs)
    los = input_list(lower, n, "interval: lower bounds", IntervalError)
    his = input_list(upper, n, "interval: upper bounds", IntervalError)
    boxes = {}
    for nid, lo, hi in zip(g.inputs, los, his):
        node = g.nodes[nid]
        for name, arr in (("lower", lo), ("upper", hi)):
            if tuple(arr.shape) != tuple(node.out_shape):
                raise _error(node, f"{name} bound has shape {fmt_shape(arr.shape)}, "
                                   f"expected {fmt_shape(node.out_shape)}")
            if arr.dtype.kind not in "fiub":
                raise _error(node, f"{name} bound has element type {arr.dtype}, expected numbers")
        lo, hi = _float64_copy(lo), _float64_copy(hi)
        # one pass for both checks: lo <= hi is False where either end is NaN or the two are out of order
        if not np.less_equal(lo, hi, out=scratch("interval.inputs_ordered", lo.shape, np.bool_)).all():
            if np.isnan(lo).any() or np.isnan(hi).any():
                raise _error(node, "bounds contain NaN")
            k = int(np.argmax((lo > hi).reshape(-1)))
            raise _error(node, f"lower bound exceeds upper bound at flat index {k}: "
                               f"{float(lo.reshape(-1)[k])!r} > {float(hi.reshape(-1)[k])!r}")
        if node.dtype in (INT64, BOOL) and not np.array_equal(lo, hi):
            raise _error(node, f"{node.dtype} inputs need a point box (lower == upper)")
        if node.dtype == BOOL and not np.all((lo == 0) | (lo == 1)):
            raise _error(node, "bool inputs must be 0 or 1")
        if node.dtype == INT64 and not np.all(lo == np.trunc(lo)):
            raise _error(node, "int64 inputs must be integers")
        boxes[nid] = lo, hi
    return boxes


def _float64_copy(arr: np.ndarray) -> np.ndarray:
    """``arr.astype(np.float64)`` in result memory (a box never aliases the caller's array)."""
    out = result_array(arr.shape)
    np.copyto(out, arr, casting="unsafe")
    return out


class IntervalPropagator:
    """A checked graph whose payload is read once, in node order, through the float evaluator's
    record readers (so it fails exactly as ``evaluate`` does; affine weights are converted to
    float64 with their absolute values precomputed), for propagating many boxes through one model."""

    def __init__(self, g: Graph, payload: Payload | None, checked: bool = False,
                 products: str = DEFAULT_PRODUCTS) -> None:
        self.domain = interval_domain(products)
        if not checked:
            check(g)
        self.graph = g
        typed = read_payload(g, payload if payload is not None else Payload())
        self.records = domain_records(g, typed, INTERVAL_RULES.params)
        self._arenas = ThreadArenas()

    def __call__(self, lower: Any, upper: Any, all_nodes: bool = True) -> list[Box]:
        """One box per node, or with ``all_nodes=False`` the output boxes only (every other box is
        dropped after its last reader).

        The hot rules' results live in memory the propagator keeps (``semantics.arena``, at most
        ``MAX_ARENA_BYTES`` per thread) and reuses on the next call once no box of this one is alive."""
        with self._arenas.active():
            seeds = input_boxes(self.graph, lower, upper)
            return run(self.graph, self.domain, seeds, self.records.__getitem__, all_nodes=all_nodes)


def interval_bounds(g: Graph, payload: Payload | None, lower: Any, upper: Any, all_nodes: bool = True,
                    products: str = DEFAULT_PRODUCTS) -> list[Box]:
    """One ``(lo, hi)`` pair of float64 arrays per node (the node's shape), outward rounded; with
    ``all_nodes=False`` the outputs' boxes only, in ``g.outputs`` order, in memory that follows the
    live frontier.

    ``lower``/``upper``: one array each for a one-input graph (a list of plain numbers is one
    array), or lists of arrays in ``g.inputs`` order; read as ``evaluate`` reads its inputs.
    For many boxes through one model, build an ``IntervalPropagator`` (or ``tlb.prepare``) once.
    ``products``: ``"float32"`` (the default) runs linear and conv products in float32 BLAS with rigorous
    error bounds (``semantics.rules.affine32``): up to twice as fast on large layers, wider by about
    n 2**-24 |W| |x| per layer (n the terms per output), and used on a layer only where that costs at
    most 2**-9 of its width; weights not exactly float32 keep float64. ``"float64"`` runs every product
    in float64 (widths within a few ulps of the exact interval image).
    """
    domain = interval_domain(products)
    check(g)
    payload = payload if payload is not None else Payload()
    seeds = input_boxes(g, lower, upper)
    return run(g, domain, seeds, payload.record, all_nodes=all_nodes)
