"""CROWN bounds of subdomains defined by ReLU splits, many subdomains in one pass.

A subdomain of branch and bound is the input box together with split constraints: some ReLUs fixed
active (their input ``z >= 0``) or inactive (``z <= 0``). On the subdomain the fixed ReLU's input box is
the intersection of its box with the half-line of the split (``lo := max(lo, 0)`` or ``hi := min(hi, 0)``),
applied to the IBP box before any intermediate bound is computed and again to every refined box, so a
fixed ReLU is relaxed by its exact line (identity or 0) and every later intermediate bound and the final
bound use every split above them. With ``method="crown"`` the split constraints act through the
boxes and relaxations only, which is sound (the box still encloses z on the subdomain) but ignores them
when the final coefficients are concretized over the whole input box; ``method="beta-crown"`` adds
them as Lagrangian terms (``beta``).

When a split contradicts a sound box (active with ``hi < 0``, inactive with ``lo > 0``) no input of the
box satisfies the constraints: the subdomain is empty and ``DomainBounds.empty`` says so; its bounds are
meaningless and a caller treats it as refuted.

Subdomain i is sample i of the batch axis (``Crown.batched``; see ``batch_axis.with_batch`` for a graph
exported with batch 1). The bound of each row of the spec is CROWN's (``method="alpha-crown"`` then
optimizes the free ReLUs' lower slopes, fixed ones being exact; ``method="beta-crown"`` optimizes the
slopes and the split constraints' multipliers for the lower bounds, see ``beta``), intersected with the
output box.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from torchlean_bridge.errors import BridgeError

from ..interval_round import Box
from .crown import Crown, _alpha, _Pass, _Run, _spec_box, _spec_matrix

__all__ = ["DomainBounds", "bound_domains", "relu_nodes", "DOMAIN_METHODS"]

DOMAIN_METHODS = ("crown", "alpha-crown", "beta-crown")

# per ReLU node id: int8 [N, units] with +1 (input >= 0), -1 (input <= 0) or 0 (free)
Splits = dict[int, np.ndarray]


@dataclass
class DomainBounds:
    """Per subdomain: lower and upper bounds ``[N, K]`` of the spec rows, whether a split made it
    empty, and each ReLU's input box ``[N, units]`` on it (the splits applied), for branching."""

    lower: np.ndarray
    upper: np.ndarray
    empty: np.ndarray
    pre: dict[int, Box]
    method: str
    points: np.ndarray | None = None  # [N, K, inputs]: each row's plain-bound minimizer (beta-crown only)


def relu_nodes(crown: Crown) -> list[int]:
    """The ReLU nodes whose input depends on the graph input, in graph order (the split candidates)."""
    g = crown.graph
    return [n.id for n in g.nodes if n.kind == "relu" and not crown.const[n.id] and not crown.const[n.parents[0]]]


class _SplitRun(_Run):
    """A CROWN run whose ReLU input boxes are intersected with the subdomains' splits."""

    def __init__(self, crown: Crown, boxes: list[Box], splits: Splits, deadline: float | None,
                 known: dict[int, Box] | None = None) -> None:
        super().__init__(crown, boxes, deadline)
        self.known = known or {}
        g = crown.graph
        self.split_at: dict[int, np.ndarray] = {}
        for v, s in splits.items():
            node = g.nodes[v]
            if node.kind != "relu" or crown.const[v]:
                raise BridgeError(f"bound_domains: node {v} ({node.kind}) is not a split candidate ReLU")
            units = math.prod(crown.ishape(v)[1:])
            s = np.asarray(s)
            if s.shape != (crown.n, units):
                raise BridgeError(f"bound_domains: the splits of node {v} must be [{crown.n}, {units}], "
                                  f"got {list(s.shape)}")
            self.split_at[node.parents[0]] = s
        self.empty = np.zeros(crown.n, dtype=bool)
        for p in self.split_at:
            self._clip(p)

    def _clip(self, p: int) -> None:
        """Intersect p's box with the split half-lines; a contradiction marks the subdomain empty."""
        s = self.split_at[p]
        n = self.crown.n
        shape = self.boxes[p][0].shape
        lo, hi = (x.reshape(n, -1) for x in self.boxes[p])
        lo2 = np.where(s > 0, np.maximum(lo, 0.0), lo)
        hi2 = np.where(s < 0, np.minimum(hi, 0.0), hi)
        bad = lo2 > hi2
        if bad.any():
            self.empty |= bad.any(axis=1)
            hi2 = np.where(bad, lo2, hi2)  # keep a well-formed box; the subdomain's bound is not used
        self.set_box(p, (lo2.reshape(shape), hi2.reshape(shape)))

    def refine(self, v: int, need: np.ndarray | None) -> Box:
        s = self.split_at.get(v)
        got = self.known.get(v)
        if got is not None:  # sound boxes the caller already has (a parent subdomain's): no backward pass
            shape = self.boxes[v][0].shape
            lo, hi = (x.reshape(self.crown.n, -1) for x in self.boxes[v])
            k_lo, k_hi = (np.asarray(x, dtype=np.float64).reshape(lo.shape) for x in got)
            self.set_box(v, (np.maximum(lo, k_lo).reshape(shape), np.minimum(hi, k_hi).reshape(shape)))
            self.refined[v] = True
            if s is not None:
                self._clip(v)
            return self.boxes[v]
        if s is None:
            return super().refine(v, need)
        self._clip(v)
        free = (s == 0).reshape(self.crown.ishape(v))
        need = free if need is None else need.reshape(free.shape) & free
        super().refine(v, need)
        self._clip(v)  # the refined box was intersected with the clipped one; clip again for the record
        return self.boxes[v]


def bound_domains(crown: Crown, lower: np.ndarray, upper: np.ndarray, splits: Splits, spec: np.ndarray,
                  method: str = "crown", deadline: float | None = None,
                  known: dict[int, Box] | None = None) -> DomainBounds:
    """Sound bounds of ``spec @ y`` on each subdomain (sample i of the batch: box ``lower[i], upper[i]``
    with the splits' row i). ``known``: per ReLU node, boxes ``[N, units]`` of its input that hold on
    each subdomain (a parent subdomain's ``pre``); they replace the intermediate CROWN passes for that
    input (the caller vouches for them: a superset of each subdomain keeps them sound).
    ``DeadlineExceeded`` once the deadline has passed."""
    if method not in DOMAIN_METHODS:
        raise BridgeError(f"bound_domains: unknown method {method!r} (use {', '.join(DOMAIN_METHODS)})")
    g = crown.graph
    if len(g.outputs) != 1:
        raise BridgeError("bound_domains: the graph must have one output")
    if not crown.float_nodes:
        raise BridgeError("bound_domains: CROWN needs float values on every input-dependent node")
    o = g.outputs[0]
    c = _spec_matrix(spec, math.prod(crown.ishape(o)[1:]))
    given = {g.nodes[v].parents[0]: box for v, box in (known or {}).items()}
    run = _SplitRun(crown, crown.ibp(lower, upper), splits, deadline, given)
    run.prepare(False)
    points = None
    low, neg_up = _Pass(run, o, 0, crown.n, spec=c).run()
    up_ = -neg_up
    label = "crown"
    if method == "alpha-crown":
        got = _alpha(run, o, c)
        if got is not None:
            low, up_ = np.maximum(low, got[0]), np.minimum(up_, got[1])
            label = "alpha-crown"
    elif method == "beta-crown":
        from .beta import beta_bounds
        got = beta_bounds(run, o, c, run.split_at)
        if got is not None:
            low, points = np.maximum(low, got[0]), got[1]
            label = "beta-crown"
    s_lo, s_hi = _spec_box(crown, run.boxes[o], c)
    pre = {v: tuple(x.reshape(crown.n, -1) for x in run.boxes[g.nodes[v].parents[0]]) for v in relu_nodes(crown)}
    return DomainBounds(np.maximum(low, s_lo), np.minimum(up_, s_hi), run.empty.copy(), pre, label, points)
