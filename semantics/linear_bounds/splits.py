"""CROWN bounds of subdomains defined by split constraints, many subdomains in one pass.

A subdomain of branch and bound is the input box together with split constraints on units of
piecewise-linear ops (``pieces``: a ReLU fixed active, input ``z >= 0``, or inactive, ``z <= 0``; a
leaky ReLU or abs on one side of 0; a clamp on one side of one of its breakpoints or between them; a
max pool's window with its maximum fixed to one cell or that cell excluded). On the subdomain the
split node's input box is narrowed by its constraints (``lo := max(lo, 0)`` for an active ReLU, ...),
applied to the IBP box before any intermediate bound is computed and again to every refined box, so
a unit left on one piece is relaxed by that piece's exact line (a pool with a fixed maximum by that
cell) and every later intermediate bound and the final bound use every split above them. With
``method="crown"`` the split constraints act through the boxes and relaxations only, which is sound
(the box still encloses z on the subdomain) but ignores them when the final coefficients are
concretized over the whole input box; ``method="beta-crown"`` adds ReLU splits on chains as
Lagrangian terms (``beta``).

When a constraint contradicts a sound box (active with ``hi < 0``, inactive with ``lo > 0``, a fixed
maximum whose upper end is below another cell's lower end) no input of the box satisfies the
constraints: the subdomain is empty and ``DomainBounds.empty`` says so; its bounds are meaningless and
a caller treats it as refuted.

Subdomain i is sample i of the batch axis (``Crown.batched``; see ``batch_axis.with_batch`` for a graph
exported with batch 1). The bound of each row of the spec is CROWN's (``method="alpha-crown"`` then
optimizes the free ReLUs' lower slopes, fixed ones being exact; ``method="beta-crown"`` optimizes the
slopes and the split constraints' multipliers for the lower bounds, see ``beta``), intersected with the
output box.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from torchlean_bridge.errors import BridgeError

from ..interval_round import Box
from .beta import Slopes, beta_bounds
from .crown import Crown, DeadlineExceeded, _alpha, _Pass, _Run, _spec_box, _spec_matrix
from .pieces import (ELEMENTWISE, POOLS, breakpoints, clip_elementwise, clip_pool, constraint_interval,
                     elementwise_scores, pool_geometry, pool_relaxation, pool_scores)

__all__ = ["DomainBounds", "bound_domains", "relu_nodes", "split_nodes", "split_units", "unstable_units",
           "DOMAIN_METHODS"]

DOMAIN_METHODS = ("crown", "alpha-crown", "beta-crown")

# per split node id: int8 [N, units] codes (see pieces: for a ReLU +1 input >= 0, -1 input <= 0, 0 free)
Splits = dict[int, np.ndarray]


@dataclass
class DomainBounds:
    """Per subdomain: lower and upper bounds ``[N, K]`` of the spec rows, whether a split made it
    empty, and each split node's input box ``[N, input entries]`` on it (the splits applied), for branching."""

    lower: np.ndarray
    upper: np.ndarray
    empty: np.ndarray
    pre: dict[int, Box]
    method: str
    points: np.ndarray | None = None  # [N, K, inputs]: each row's plain-bound minimizer (beta-crown only)
    slopes: Slopes | None = None  # beta-crown's optimized alpha and beta per ReLU node (``beta.Slopes``)


def relu_nodes(crown: Crown) -> list[int]:
    """The ReLU nodes whose input depends on the graph input, in graph order."""
    g = crown.graph
    return [n.id for n in g.nodes if n.kind == "relu" and not crown.const[n.id] and not crown.const[n.parents[0]]]


def split_nodes(crown: Crown) -> list[int]:
    """The nodes branch and bound can split, in graph order: piecewise-linear elementwise ops with a
    breakpoint (``pieces.ELEMENTWISE``) and max pools, whose input depends on the graph input."""
    g = crown.graph
    out = []
    for n in g.nodes:
        if crown.const[n.id] or not n.parents or crown.const[n.parents[0]]:
            continue
        if (n.kind in ELEMENTWISE and breakpoints(n)) or n.kind in POOLS:
            out.append(n.id)
    return out


def split_units(crown: Crown, v: int) -> int:
    """Units of a split node per sample: its output entries (one per window for a pool)."""
    return math.prod(crown.ishape(v)[1:])


def unstable_units(crown: Crown, boxes: list[Box]) -> int:
    """Units of the split nodes that a split would change on these node boxes (IBP's, say): an
    elementwise unit with a breakpoint strictly inside its input box, a pool window whose maximum
    the box leaves undecided."""
    g = crown.graph
    count = 0
    for v in split_nodes(crown):
        node = g.nodes[v]
        lo, hi = (x.reshape(crown.n, -1) for x in boxes[node.parents[0]])
        codes = np.zeros((crown.n, split_units(crown, v)), dtype=np.int8)
        if node.kind in POOLS:
            idx, valid, lead, cells = pool_geometry(crown, node)
            score, _ = pool_scores(lo.reshape(crown.n, lead, cells), hi.reshape(crown.n, lead, cells), codes, idx, valid)
        else:
            score, _ = elementwise_scores(node, lo, hi, codes)
        count += int(np.isfinite(score).sum())
    return count


class _SplitRun(_Run):
    """A CROWN run whose split nodes' input boxes are narrowed by the subdomains' constraints."""

    def __init__(self, crown: Crown, boxes: list[Box], splits: Splits, deadline: float | None,
                 known: dict[int, Box] | None = None, optimize: bool = False) -> None:
        super().__init__(crown, boxes, deadline)
        self.known = known or {}
        self.optimize = optimize
        g = crown.graph
        candidates = set(split_nodes(crown))
        self.split_of: dict[int, np.ndarray] = {}
        self.split_at: dict[int, list[int]] = {}  # input node -> the split nodes reading it
        self.geometry: dict[int, tuple] = {}
        for v, s in splits.items():
            node = g.nodes[v]
            if v not in candidates:
                raise BridgeError(f"bound_domains: node {v} ({node.kind}) is not a split candidate")
            units = split_units(crown, v)
            s = np.asarray(s)
            if s.shape != (crown.n, units) or s.dtype != np.int8:
                raise BridgeError(f"bound_domains: the splits of node {v} must be int8 [{crown.n}, {units}], "
                                  f"got {s.dtype} {list(s.shape)}")
            if node.kind in POOLS:
                self.geometry[v] = pool_geometry(crown, node)
                k = self.geometry[v][0].shape[1]
                if np.any(np.abs(s.astype(np.int64)) > k):
                    raise BridgeError(f"bound_domains: node {v} ({node.kind}) has windows of {k} cells; "
                                      f"a split code beyond +-{k} names none")
            else:
                m = len(breakpoints(node))
                allowed = (-1, 0, 1) if m == 1 else (-2, -1, 0, 1, 2, 3)
                if not np.all(np.isin(s, allowed)):
                    raise BridgeError(f"bound_domains: node {v} ({node.kind}) takes split codes {allowed}")
            self.split_of[v] = s
            self.split_at.setdefault(node.parents[0], []).append(v)
        self.empty = np.zeros(crown.n, dtype=bool)
        for p in self.split_at:
            self._clip(p)

    def _clip(self, p: int) -> None:
        """Narrow p's box by every split constraint on it; a contradiction marks the subdomain empty."""
        n = self.crown.n
        shape = self.boxes[p][0].shape
        lo, hi = (x.reshape(n, -1) for x in self.boxes[p])
        for v in self.split_at[p]:
            node, s = self.graph.nodes[v], self.split_of[v]
            if node.kind in POOLS:
                idx, valid, lead, cells = self.geometry[v]
                lo3, hi3, bad = clip_pool(lo.reshape(n, lead, cells), hi.reshape(n, lead, cells), s, idx, valid)
                lo, hi = lo3.reshape(n, -1), hi3.reshape(n, -1)
            else:
                lo, hi, bad_units = clip_elementwise(lo, hi, s, breakpoints(node))
                bad = bad_units.any(axis=1)
            self.empty |= bad  # the box is kept well formed; the subdomain's bound is not used
        self.set_box(p, (lo.reshape(shape), hi.reshape(shape)))

    def _settled(self, p: int) -> np.ndarray | None:
        """Entries of p whose constraint leaves one piece of an elementwise reader (no refinement can
        change their relaxation), or None when no elementwise split reads p."""
        out = None
        for v in self.split_at[p]:
            node = self.graph.nodes[v]
            if node.kind in POOLS:
                continue
            knots = breakpoints(node)
            c_lo, c_hi = constraint_interval(self.split_of[v], knots)
            one = np.ones(c_lo.shape, dtype=bool)
            for t in knots:
                one &= ~((c_lo < t) & (c_hi > t))
            out = one if out is None else out & one
        return out

    def _pool(self, node):
        jstar, decided, umax, cells = super()._pool(node)  # also the working-memory check
        codes = self.split_of.get(node.id)
        if codes is None:
            return jstar, decided, umax, cells
        idx, valid, lead, n_cells = self.geometry[node.id]
        n = self.crown.n
        lo, hi = (x.reshape(n, lead, n_cells) for x in self.boxes[node.parents[0]])
        jstar, decided, umax = pool_relaxation(lo, hi, codes, idx, valid)
        return jstar, decided, umax, cells

    def refine(self, v: int, need: np.ndarray | None) -> Box:
        readers = self.split_at.get(v)
        got = self.known.get(v)
        if got is not None:  # sound boxes the caller already has (a parent subdomain's): no backward pass
            shape = self.boxes[v][0].shape
            lo, hi = (x.reshape(self.crown.n, -1) for x in self.boxes[v])
            k_lo, k_hi = (np.asarray(x, dtype=np.float64).reshape(lo.shape) for x in got)
            self.set_box(v, (np.maximum(lo, k_lo).reshape(shape), np.minimum(hi, k_hi).reshape(shape)))
            self.refined[v] = True
            if readers is not None:
                self._clip(v)
            return self.boxes[v]
        if readers is None:
            return super().refine(v, need)
        self._clip(v)
        settled = self._settled(v)
        if settled is not None:
            free = ~settled.reshape(self.crown.ishape(v))
            need = free if need is None else need.reshape(free.shape) & free
        super().refine(v, need)
        self._clip(v)  # the refined box was intersected with the clipped one; clip again for the record
        return self.boxes[v]


def bound_domains(crown: Crown, lower: np.ndarray, upper: np.ndarray, splits: Splits, spec: np.ndarray,
                  method: str = "crown", deadline: float | None = None,
                  known: dict[int, Box] | None = None, warm: Slopes | None = None,
                  seeds: dict[int, Box] | None = None) -> DomainBounds:
    """Sound bounds of ``spec @ y`` on each subdomain (sample i of the batch: box ``lower[i], upper[i]``
    with the splits' row i). ``known``: per split node, boxes ``[N, input entries]`` of its input that hold on
    each subdomain (a parent subdomain's ``pre``); they replace the intermediate CROWN passes for that
    input (the caller vouches for them: a superset of each subdomain keeps them sound). ``warm``:
    beta-crown's starting slopes (``beta.beta_bounds``; a parent's ``DomainBounds.slopes``). ``seeds``:
    ``LinearBounds.refined_boxes`` of an earlier run of this Crown on this one box (branch and bound's root after the
    first CROWN pass): those boxes stand in for their CROWN passes, alpha-CROWN still tightens them.
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
    # one subdomain without known boxes (branch and bound's root, which its children reuse): the split
    # nodes' inputs by alpha-CROWN too, when the method optimizes slopes
    optimize = method != "crown" and not given and crown.n == 1
    if deadline is not None and time.perf_counter() > deadline:  # before the batch's IBP, which takes seconds
        raise DeadlineExceeded
    run = _SplitRun(crown, crown.shared_ibp(lower, upper), splits, deadline, given, optimize)
    if seeds:
        if crown.n != 1:
            raise ValueError("bound_domains: seeds are one box's, the batch holds several")
        run.seeds = dict(seeds)
    run.prepare(False)
    points = slopes = None
    low, neg_up = _Pass(run, o, 0, crown.n, spec=c).run()
    up_ = -neg_up
    label = "crown"
    if method == "alpha-crown":
        got = _alpha(run, o, c)
        if got is not None:
            low, up_ = np.maximum(low, got[0]), np.minimum(up_, got[1])
            label = "alpha-crown"
    elif method == "beta-crown":
        got = beta_bounds(run, o, c, run.split_of, warm=warm)
        if got is not None:
            low, points, slopes = np.maximum(low, got[0]), got[1], got[2]
            label = "beta-crown"
    s_lo, s_hi = _spec_box(crown, run.boxes[o], c)
    pre = {v: tuple(x.reshape(crown.n, -1) for x in run.boxes[g.nodes[v].parents[0]]) for v in split_nodes(crown)}
    return DomainBounds(np.maximum(low, s_lo), np.minimum(up_, s_hi), run.empty.copy(), pre, label, points, slopes)
