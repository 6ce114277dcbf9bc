"""Where a checkpoint's difference first shows: the first node whose value departs from the value
the trusted weights give, and the keys feeding it.

Even a difference no transformation explains ("different values") then points at the right layer.
Both value tables come from the same graph on the same input (float64), one with the checkpoint
bound and one with the trusted weights, so only the weights differ; golden outputs alone hold no
intermediate values, so this needs trusted weights.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..bundle import Bundle
from ..errors import BridgeError
from ..report import Finding
from .abi import bind_checkpoint
from .diff import feeding_keys, provenance

__all__ = ["first_departure"]


def _departs(a: Any, r: Any, tolerance: float) -> float | None:
    """max |a - r| when it exceeds ``tolerance * max(1, max |r|)`` (NaN placement differing counts)."""
    a, r = np.asarray(a), np.asarray(r)
    if a.shape != r.shape:
        return float("inf")
    if a.dtype.kind not in "fc" or r.dtype.kind not in "fc":
        return None if np.array_equal(a, r) else float("inf")
    a, r = a.astype(np.float64), r.astype(np.float64)
    nan = np.isnan(a)
    if (nan != np.isnan(r)).any():
        return float("inf")
    with np.errstate(invalid="ignore"):
        d = np.where(nan | (a == r), 0.0, np.abs(a - r))
    worst = float(d.max(initial=0.0))
    scale = max(1.0, float(np.max(np.abs(r[~nan]), initial=0.0)))
    return worst if worst > tolerance * scale else None


def first_departure(bundle: Bundle, ckpt: Any, trusted: Any, case: list[np.ndarray],
                    tolerance: float) -> Finding | None:
    """The first node (in graph order) whose float64 value on ``case`` departs, or None."""
    from semantics.evaluate import evaluate
    ours, _ = bind_checkpoint(bundle, ckpt, strict=False)
    theirs, _ = bind_checkpoint(bundle, trusted, strict=False)
    try:
        a = evaluate(ours.graph, ours.payload, case, "float64", all_nodes=True, check=False)
        r = evaluate(theirs.graph, theirs.payload, case, "float64", all_nodes=True, check=False)
    except BridgeError:
        return None  # one of the two cannot be evaluated: the audit already says so
    g = bundle.graph
    for node in g.nodes:  # ids are in dataflow order: the first departure is the earliest
        nid = node.id
        d = _departs(a[nid], r[nid], tolerance)
        if d is None:
            continue
        own = [b.key for b in bundle.roles.for_node(nid)]
        keys = own or feeding_keys(bundle, nid)[:4]
        where = provenance(node)
        fed = "its keys" if own else "the nearest keys feeding it"
        return Finding("first_departure", f"first departure at node {nid} ({node.kind}{', ' + where if where else ''})"
                       f": max |diff| {d:.3g} on the first input; {fed}: {', '.join(keys)}", node=nid,
                       keys=tuple(keys), severity="info", data={"max_abs_diff": d})
    return None
