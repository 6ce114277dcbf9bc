"""Branch and bound over piecewise-linear activations (``verify --method bab-relu``).

One group of property rows ``C y <= d`` (a conjunction) is refuted on a subdomain when some row's sound
lower bound exceeds its right-hand side by the margin verify uses everywhere (``verify._margin``).
A subdomain is the property's input box plus split constraints on units of piecewise-linear ops
(``semantics.linear_bounds.pieces``: ReLU, leaky ReLU and abs at 0, clamp at its one or two
breakpoints, a max pool's window at which cell is its maximum); ``splits.bound_domains`` bounds many
of them in one batched CROWN pass. The search, in the style of alpha-beta-CROWN's BaB:

* a priority queue of open subdomains by their best row gap (``max_k lower_k - d_k - margin_k``),
  the worst first; up to ``batch`` of them are split per round, each on one unit, and their ``2 batch``
  children bounded in one pass;
* scores rank the units: on ReLU chains a BaBSR-style score (Bunel et al., "Branch and bound for
  piecewise linear neural network verification", JMLR 2020): the gain in the best row's CROWN bound
  from removing the unit's relaxation, from one plain-float backward pass through the chain; elsewhere
  the height of the unit's relaxation triangle at its breakpoint (``-u l / (u - l)`` for a ReLU; a
  pool's gap between its upper end and its largest lower end);
* branching (``BRANCHING``): ``fsb`` (filtered smart branching, the default) bounds both children of
  each subdomain's ``FSB_CANDIDATES`` (``FSB_CONV_CANDIDATES`` on chains with a convolution) best-scored
  units reusing the parent's intermediate boxes and splits the unit whose worse child has the largest
  gap: on ReLU chains by a plain float32 CROWN pass (``fsb_plain``: a ranking only; 51 -> 5 ms for 512
  children on MNIST 256x2), elsewhere by one batched sound CROWN pass (fewer candidates where the
  working-memory limit refuses that batch); ``babsr`` splits the best-scored unit;
* children start beta-CROWN's optimization from their parent's optimized slopes and multipliers
  (alpha-beta-CROWN's warm start: ``WARM_START``), kept per open subdomain in float32 within
  ``MAX_WARM_BYTES`` (past it a child starts cold, as the root does);
* a child's bound is the maximum of its own, its parent's and the sound FSB pass's (all sound on the child), and a
  child a split makes empty (``DomainBounds.empty``) is refuted; where beta applies (graphs of affine
  layers, input normalizations, ReLUs, adds and max pools: ``chain.dag_layers``) children start from their parent's
  split nodes' input boxes (``reuse``: no intermediate CROWN passes after the root) and are bounded
  with ``method="beta-crown"``; elsewhere their intermediate bounds are recomputed with the splits;
* the caller's attack (PGD over the plain DAG, ``pgd``; verify's CROWN-guided descent only where there is
  no DAG) runs before the search and again after ``attack_every`` rounds, then at twice the rounds of the
  last (8, 16, 32, ...: on an unsat MNIST 256x2 property every 8 rounds took a fifth of the time), so
  ``sat`` comes fast and a long search is not taxed by it, and every
  round the point minimizing the worst row's linear bound on the ``TRY_POINTS`` most promising open
  children (beta-CROWN's plain pass gives it) is re-checked as a counterexample;
* a subdomain with no splittable unit left that stays open has its input box halved along its widest
  side instead: the final concretization over the whole box ignores the constraints beta does not
  carry, so splits alone cannot close such a subdomain;
* ``unknown`` when the deadline passes, when the open subdomains exceed the memory cap, or when a box
  cannot be halved in floating point.

``unsat`` therefore rests on CROWN's sound bounds on subdomains whose union is the whole box: every
split produces both closed halves (``z <= t`` and ``z >= t``; a pool cell the maximum or not; an input
split both halves of the box), and a subdomain is dropped only when refuted.
"""

from __future__ import annotations

import heapq
import math
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ...errors import BridgeError
from .fsb_plain import PlainChain

__all__ = ["ReluBab", "BabOutcome", "MAX_QUEUE_BYTES", "MAX_WARM_BYTES", "BATCH", "BRANCHING", "BRANCHINGS",
           "FSB_CANDIDATES", "FSB_CONV_CANDIDATES", "FSB_SOUND_CANDIDATES", "WARM_START"]

MAX_QUEUE_BYTES = 1 << 30  # the open subdomains' splits and bounds; beyond it the answer is unknown
MAX_WARM_BYTES = 512 << 20  # the open subdomains' warm-start slopes; beyond it children start cold
WARM_START = True  # children's beta-CROWN starts from the parent's optimized alpha and beta
BATCH = 128  # subdomains split per round (256 children per pass; a batch the memory limit refuses is halved).
# Every subdomain of an unsat search is bounded whatever the order, so the batch only sets the throughput: on MNIST
# 256x2 prop_1_0.03 (49,634 domains) 39.7 s at 32, 31.3 s at 64, 30.3 s at 128
TRY_POINTS = 4  # open children per round whose linear-bound minimizer is checked as a counterexample
BRANCHINGS = ("fsb", "babsr")
BRANCHING = "fsb"  # the default branching rule (bench/bab_bench.py compares both)
# units per subdomain whose children FSB bounds. On ReLU chains (the plain float32 pass, ``fsb_plain``) 32: MNIST 256x2
# prop_1_0.03 takes 7,306 domains (10.1 s) against 49,638 (34.3 s) at 8 and 15,846 at 16, 256x4 prop_5_0.03 is decided
# in 16.1 s (unknown at 30 s with 8), 256x2 prop_3_0.03 1,992 domains against 2,686; 256x4 prop_0_0.03 5,324 against
# 4,414 (12.9 s against 10.0). Elsewhere (one batched sound CROWN pass, halved where the working-memory limit
# refuses that batch) 8: on bench/bab_bench.py 8 decides the same 28 instances as 4 in 4,084 domains against 6,528
FSB_CANDIDATES = 32
# on ReLU chains with a convolution: the plain pass's conv adjoints cost as much per row as the sound pass's, and
# 32 candidates made FSB 55% of the search on oval21 (2022) cifar_base_kw img876. Domains per gap reached with 8
# match 32's (cifar_wide_kw img9916: the same 865 domains to gap -0.809, in 20.0 s against 27.6 s; cifar_base_kw:
# 1,929 domains to -0.044 against 2,045 to -0.043) and a round costs about a third less; 4 needs more domains
FSB_CONV_CANDIDATES = 8
FSB_SOUND_CANDIDATES = 8


def _warm_size(kept) -> int:
    return 0 if kept is None else sum(a.nbytes + b.nbytes for a, b in kept.values())


@dataclass
class BabOutcome:
    result: str  # "unsat", "sat" or "unknown"
    counterexample: dict[str, Any] | None
    domains: int  # subdomains bounded
    best_lower: float  # the smallest gap over the open subdomains (>0 once refuted; -inf when unknown)
    reason: str = ""
    root_boxes: tuple[np.ndarray, np.ndarray] | None = None  # the split nodes' input boxes on the whole box


class ReluBab:
    """Branch and bound for one group of rows on one input box (see the module docstring)."""

    def __init__(self, model: Any, lo: np.ndarray, hi: np.ndarray, c: np.ndarray, d: np.ndarray,
                 margin: np.ndarray, deadline: float, method: str = "beta-crown",
                 attack: Callable[[], dict[str, Any] | None] | None = None, attack_every: int = 8,
                 batch: int = BATCH, max_queue_bytes: int = MAX_QUEUE_BYTES, progress: bool | None = None,
                 reuse: bool = True, check: Callable[[np.ndarray], dict[str, Any] | None] | None = None,
                 branching: str | None = None, root_boxes: tuple[np.ndarray, np.ndarray] | None = None,
                 seeds: dict[int, Any] | None = None) -> None:
        from semantics.linear_bounds.chain import chain_layers, dag_layers
        from semantics.linear_bounds.pieces import POOLS, pool_geometry
        from semantics.linear_bounds.splits import split_nodes, split_units
        if batch < 1:
            raise BridgeError(f"bab: the batch must be at least 1, got {batch}")
        branching = BRANCHING if branching is None else branching
        if branching not in BRANCHINGS:
            raise BridgeError(f"bab: unknown branching {branching!r} (use {', '.join(BRANCHINGS)})")
        self.branching = branching
        self.model, self.lo, self.hi = model, lo, hi
        self.c, self.d, self.margin = c, d, margin
        self.deadline, self.method = deadline, method
        self.attack, self.attack_every = attack, attack_every
        self.batch = batch
        self.check = check  # re-checks a candidate point: the counterexample, or None
        self.root_boxes = root_boxes  # another group's root ``BabOutcome.root_boxes`` on the same box: reused
        # the caller's CROWN pass on the same box (``LinearBounds.refined_boxes``): the root's intermediate boxes start
        # there instead of a second CROWN pass (on a CIFAR ResNet that pass took 16 of 30 s)
        self.seeds = seeds
        self.max_queue_bytes = max_queue_bytes
        self.progress = sys.stderr.isatty() if progress is None else progress
        base = model.crown
        self.nodes = split_nodes(base)
        g = base.graph
        self.units = [split_units(base, v) for v in self.nodes]
        self.offsets = np.concatenate([[0], np.cumsum(self.units)]).astype(np.int64)
        in_units = [math.prod(base.ishape(g.nodes[v].parents[0])[1:]) for v in self.nodes]
        self.in_offsets = np.concatenate([[0], np.cumsum(in_units)]).astype(np.int64)
        self.pools = {v: pool_geometry(base, g.nodes[v]) for v in self.nodes if g.nodes[v].kind in POOLS}
        chain = chain_layers(base)
        self.layers = None if chain is None else chain[0]
        # FSB's candidate bounds in plain float32 where every split node is a ReLU of the chain
        self.plain = None if chain is None else PlainChain(self.layers, self.nodes, self.offsets)
        dag = dag_layers(base)
        # without beta (graphs beyond beta's DAGs) splits act only through the intermediate bounds: recompute them
        self.reuse = reuse and dag is not None and any(kind == "relu" for kind, *_ in dag[0])
        self.warm_bytes = 0  # bytes of warm-start slopes held by open subdomains
        self.domains = 0
        self.fsb_domains = 0  # children FSB bounded to choose a branch (not counted in ``domains``)
        self.proved = math.inf  # the smallest gap of a refuted (non-empty) subdomain
        self.start = time.perf_counter()

    # -- bounding --------------------------------------------------------------------------------

    def _crown(self, n: int):
        """A Crown over the graph with batch n (the model's, cached), or None when the graph does not rebatch."""
        return self.model.crown if n == 1 else self.model.batched_crown(n)

    def _bound(self, splits: np.ndarray, lo: np.ndarray, hi: np.ndarray, known=None, method: str | None = None,
               warm=None, seeds=None):
        """Gaps ``[M, K]``, emptiness ``[M]``, ReLU input boxes, attack points and beta-CROWN's slopes
        (``beta.Slopes`` or None) of M subdomains (rows of splits, with their input boxes ``[M, inputs]``);
        ``warm``: the slopes to start from (``[M, K, units]`` per ReLU node, NaN where none); ``seeds``: the
        root's (one subdomain, the whole box) boxes from the caller's CROWN pass. A batch the
        graph does not take (it does not rebatch, or the working-memory limit refuses it) is halved."""
        m = splits.shape[0]
        size = 1 << max(0, (m - 1).bit_length())  # powers of two: a few cached graphs serve every round
        crown = self._crown(size)
        if crown is not None and crown.batched and crown.n == size:
            try:
                return self._bound_with(crown, splits, lo, hi, size, known, method, warm, seeds)
            except BridgeError:  # a relaxation the memory limit refuses at this batch
                if size == 1:
                    raise
                self.model.refuse_batch(size)
        if m == 1:
            return self._bound_with(self.model.crown, splits, lo, hi, 1, known, method, warm, seeds)
        half = size // 2
        take = lambda x, s: None if x is None else (x[0][s], x[1][s])  # noqa: E731
        parts = [self._bound(splits[s], lo[s], hi[s], take(known, s), method,
                             None if warm is None else {v: take(w, s) for v, w in warm.items()})
                 for s in (slice(0, half), slice(half, m))]
        points = None if any(p[3] is None for p in parts) else np.concatenate([p[3] for p in parts])
        slopes = None if any(p[4] is None for p in parts) else {
            v: tuple(np.concatenate([p[4][v][j] for p in parts]) for j in range(2)) for v in parts[0][4]}
        return (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]),
                [np.concatenate([p[2][j] for p in parts]) for j in range(2)], points, slopes)

    def _bound_with(self, crown, splits: np.ndarray, lo: np.ndarray, hi: np.ndarray, size: int, known=None,
                    method: str | None = None, warm=None, seeds=None):
        """``_bound`` on one graph of batch ``size``; ``method`` other than the search's (FSB's cheap
        pass) always reuses ``known``."""
        from semantics.linear_bounds.splits import bound_domains
        m = splits.shape[0]
        pad = lambda x: np.concatenate([x, np.repeat(x[-1:], size - m, axis=0)]) if size > m else x  # noqa: E731
        splits, lo, hi = pad(splits), pad(lo), pad(hi)
        shape = (size,) + tuple(self.lo.shape[1:]) if crown.batched else tuple(self.lo.shape)
        per = {v: splits[:, self.offsets[i]:self.offsets[i + 1]] for i, v in enumerate(self.nodes)}
        given = None
        if known is not None and (self.reuse or method is not None):
            k_lo, k_hi = pad(known[0]), pad(known[1])
            io = self.in_offsets
            given = {v: (k_lo[:, io[i]:io[i + 1]], k_hi[:, io[i]:io[i + 1]]) for i, v in enumerate(self.nodes)}
        if warm is not None:
            warm = {v: (pad(a), pad(b)) for v, (a, b) in warm.items()}
        r = bound_domains(crown, lo.reshape(shape), hi.reshape(shape), per, self.c,
                          method=method or self.method, deadline=self.deadline, known=given, warm=warm,
                          seeds=seeds if given is None else None)
        self.domains += m
        gap = r.lower[:m] - self.d[None] - self.margin[None]
        # no split node at all (a sigmoid net under --method bab-relu): no boxes, the search halves the input
        pre_lo = np.concatenate([np.zeros((m, 0))] + [r.pre[v][0][:m] for v in self.nodes], axis=1)
        pre_hi = np.concatenate([np.zeros((m, 0))] + [r.pre[v][1][:m] for v in self.nodes], axis=1)
        slopes = None if r.slopes is None else {v: (a[:m], b[:m]) for v, (a, b) in r.slopes.items()}
        return gap, r.empty[:m], (pre_lo, pre_hi), None if r.points is None else r.points[:m], slopes

    # -- branching -------------------------------------------------------------------------------

    def _scores(self, gap: np.ndarray, pre: tuple[np.ndarray, np.ndarray], splits: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray]:
        """Branching scores ``[M, units]`` (-inf on units that cannot be split: one piece left, or a pool
        window decided or already split) and per unit the breakpoint (1-based) or window cell to split at.
        Elementwise units score the height of their relaxation's triangle (``pieces.elementwise_scores``),
        pools the gap of theirs; on ReLU chains the BaBSR gain replaces the ReLUs' scores."""
        from semantics.linear_bounds.pieces import elementwise_scores, pool_scores
        g = self.model.crown.graph
        m = splits.shape[0]
        score = np.full(splits.shape, -np.inf)
        choice = np.zeros(splits.shape, dtype=np.int64)
        for i, v in enumerate(self.nodes):
            sl, sl_in = slice(self.offsets[i], self.offsets[i + 1]), slice(self.in_offsets[i], self.in_offsets[i + 1])
            lo, hi = pre[0][:, sl_in], pre[1][:, sl_in]
            if v in self.pools:
                idx, valid, lead, cells = self.pools[v]
                score[:, sl], choice[:, sl] = pool_scores(lo.reshape(m, lead, cells), hi.reshape(m, lead, cells),
                                                          splits[:, sl], idx, valid)
            else:
                score[:, sl], choice[:, sl] = elementwise_scores(g.nodes[v], lo, hi, splits[:, sl])
        if self.layers is not None:  # every split node is a ReLU of the chain
            splittable = np.isfinite(score)
            with np.errstate(all="ignore"):
                chain = self._chain_scores(gap, pre[0], pre[1], splits, splittable, np.where(splittable, score, 0.0))
            # a unit whose gain is not finite keeps a zero score (never lost)
            score = np.where(splittable, np.where(np.isfinite(chain), chain, 0.0), -np.inf)
        return score, choice

    def _chain_scores(self, gap, lo, hi, splits, unstable, intercept) -> np.ndarray:
        """The gain of the best row's plain-float CROWN bound from splitting each unit."""
        k = np.argmax(gap, axis=1)
        a = self.c[k]  # [M, outputs]
        score = np.zeros_like(lo)
        index = {v: i for i, v in enumerate(self.nodes)}
        for kind, v, w, _ in self.layers:
            if kind == "affine":
                a = a @ w
                continue
            if kind == "scale":
                a = a * w
                continue
            i = index[v]
            sl = slice(self.offsets[i], self.offsets[i + 1])
            l, u, s, un = lo[:, sl], hi[:, sl], splits[:, sl], unstable[:, sl]
            active = (s > 0) | (l >= 0)
            chord = np.where(un, u / np.where(un, u - l, 1.0), 0.0)
            lower_slope = np.where(u > -l, 1.0, 0.0)
            score[:, sl] = np.where(a < 0, -a * intercept[:, sl], a * np.minimum(u, -l) * 0.25)
            slope = np.where(active, 1.0, np.where(un, np.where(a >= 0, lower_slope, chord), 0.0))
            a = a * slope
        return score

    def _children(self, splits: np.ndarray, rows: np.ndarray, units: np.ndarray, at: np.ndarray) -> np.ndarray:
        """``[2 M, units]`` codes: every subdomain twice, ``rows`` split on ``units`` at breakpoint (window
        cell) ``at``, the first half on one side, the second on the other (``pieces``)."""
        from semantics.linear_bounds.pieces import breakpoints, split_codes
        g = self.model.crown.graph
        m = splits.shape[0]
        children = np.concatenate([splits, splits])
        node_of = np.searchsorted(self.offsets, units, side="right") - 1
        for i in np.unique(node_of):
            sel = node_of == i
            r, u, k = rows[sel], units[sel], at[sel]
            v = self.nodes[i]
            if v in self.pools:
                first, second = (k + 1).astype(np.int8), (-(k + 1)).astype(np.int8)
            else:
                first, second = split_codes(splits[r, u], k, len(breakpoints(g.nodes[v])))
            children[r, u], children[m + r, u] = first, second
        return children

    def _fsb(self, splits, gaps, pre, los, his, score, choice) -> tuple[np.ndarray, np.ndarray | None]:
        """Filtered smart branching: per subdomain the ``FSB_CANDIDATES`` (``FSB_CONV_CANDIDATES`` on chains
        with a convolution, ``FSB_SOUND_CANDIDATES`` off ReLU chains) best units by score, both children of
        each candidate bounded, and the unit whose worse child has the largest gap. On ReLU chains the
        children's bounds are plain float32 CROWN (``fsb_plain``: a ranking, not sound) and the units ``[M]``
        are returned with None; elsewhere they are one batched sound CROWN pass reusing the parent's boxes
        (``_fsb_sound``), whose children's gaps ``[2 M, K]`` are returned too."""
        m = splits.shape[0]
        order = np.argsort(-score, axis=1, kind="stable")
        if self.plain is None:
            k = min(FSB_SOUND_CANDIDATES, splits.shape[1])
            return self._fsb_sound(splits, gaps, pre, los, his, score, choice, order, k)
        k = min(FSB_CONV_CANDIDATES if self.plain.has_conv else FSB_CANDIDATES, splits.shape[1])
        top = order[:, :k]
        live = np.isfinite(np.take_along_axis(score, top, axis=1))
        with np.errstate(all="ignore"):
            lower = self.plain.child_lower(self.c, self.plain.lines(pre[0], pre[1], splits), top, los, his)
        self.fsb_domains += 2 * int(live.sum())
        worst = (lower - self.d - self.margin).max(axis=-1).min(axis=1)  # [M, k]: the worse child's best row
        worst = np.where(np.isnan(worst), -np.inf, worst)
        rows, slot = np.nonzero(live)
        pick = self._pick(m, k, rows, slot, worst[rows, slot])
        return top[np.arange(m), pick], None

    @staticmethod
    def _pick(m: int, k: int, rows: np.ndarray, slot: np.ndarray, worst: np.ndarray) -> np.ndarray:
        """Per subdomain the candidate slot whose worse child has the largest gap (the first, best-scored,
        of equals; slot 0 where a subdomain has no candidate)."""
        table = np.full((m, k), -np.inf)
        table[rows, slot] = worst
        return np.argmax(table, axis=1)

    def _fsb_sound(self, splits, gaps, pre, los, his, score, choice, order, k) -> tuple[np.ndarray, np.ndarray]:
        """FSB by one batched sound CROWN pass over the candidates' children (halved while the
        working-memory limit refuses the batch they make). Returns the units ``[M]`` and those children's
        gaps ``[2 M, K]`` (the parent's where a row has no candidate: no unit to split), or the
        best-scored units and None when not even one candidate's children can be bounded in one batched
        pass (a graph that does not rebatch, or a batch the limit refuses): one pass per child would
        cost more than the choice saves."""
        m = splits.shape[0]
        while True:  # as many candidates as one batched pass holds: halved while the memory limit refuses
            top = order[:, :k]  # [M, k]
            live = np.isfinite(np.take_along_axis(score, top, axis=1))
            rows, slot = np.nonzero(live)
            size = 1 << max(0, (2 * rows.size - 1).bit_length())
            crown = self._crown(size)
            if crown is not None and crown.batched and crown.n == size:
                units = top[rows, slot]
                sub = self._children(splits[rows], np.arange(rows.size), units, choice[rows, units])
                lo2, hi2 = np.concatenate([los[rows], los[rows]]), np.concatenate([his[rows], his[rows]])
                known = (np.concatenate([pre[0][rows], pre[0][rows]]),
                         np.concatenate([pre[1][rows], pre[1][rows]]))
                counted = self.domains
                try:
                    gap, empty, *_ = self._bound_with(crown, sub, lo2, hi2, size, known, method="crown")
                except BridgeError:  # a relaxation the memory limit refuses at this batch
                    self.model.refuse_batch(size)
                    crown = None
                self.fsb_domains += self.domains - counted  # candidates' children: not subdomains of the tree
                self.domains = counted
                if crown is not None:
                    break
            if k == 1:
                return np.argmax(score, axis=1), None
            k //= 2
        # candidates compare by their own cheap bounds (the parent's, often from beta, would tie them all)
        value = np.where(empty, np.inf, gap.max(axis=1))
        gap = np.maximum(gap, np.concatenate([gaps[rows], gaps[rows]]))
        pick = self._pick(m, k, rows, slot, np.minimum(value[:rows.size], value[rows.size:]))
        unit = top[np.arange(m), pick]
        out = np.concatenate([gaps, gaps])
        where = np.full((m, k), -1)
        where[rows, slot] = np.arange(rows.size)
        j = where[np.arange(m), pick]
        has = j >= 0
        out[np.flatnonzero(has)] = np.where(empty[j[has], None], np.inf, gap[j[has]])
        out[m + np.flatnonzero(has)] = np.where(empty[rows.size + j[has], None], np.inf, gap[rows.size + j[has]])
        return unit, out

    def _try_points(self, gap: np.ndarray, empty: np.ndarray, points: np.ndarray) -> dict[str, Any] | None:
        """The attack on promising subdomains: the point minimizing the worst row's linear bound, for
        the ``TRY_POINTS`` open children with the lowest gaps."""
        best = np.where(empty, np.inf, gap.max(axis=1))
        order = np.argsort(best)[:TRY_POINTS]
        for j in order:
            if not best[j] <= 0:
                break
            k = int(np.argmin(gap[j]))
            found = self.check(points[j, k].reshape(self.lo.shape))
            if found is not None:
                return found
        return None

    # -- the search ------------------------------------------------------------------------------

    def run(self, root_gap: np.ndarray) -> BabOutcome:
        """Search from the whole box, whose CROWN gaps ``[K]`` are ``root_gap`` (the caller bounded it)."""
        from semantics.linear_bounds.crown import DeadlineExceeded
        total = int(self.offsets[-1])
        # per open subdomain: int8 splits, float64 split nodes' input boxes (lo, hi), gaps, the entry; an input
        # box of its own (float64 lo, hi) only after an input split: the others share the property's
        per_domain = total + 16 * int(self.in_offsets[-1]) + 8 * self.c.shape[0] + 64
        root = np.zeros((1, total), dtype=np.int8)
        box_lo, box_hi = self.lo.reshape(1, -1).astype(np.float64), self.hi.reshape(1, -1).astype(np.float64)
        own_box = 16 * box_lo.shape[1]
        root_lo, root_hi = box_lo[0], box_hi[0]  # one object each, shared by the subdomains that keep the box
        held = 0  # bytes the open subdomains hold
        try:
            gap, empty, pre, _, slopes = self._bound(root, box_lo, box_hi, self.root_boxes, seeds=self.seeds)
        except DeadlineExceeded:  # the caller's bound of the whole box stands
            return BabOutcome("unknown", None, self.domains, float(np.max(root_gap, initial=-math.inf)), "timeout")
        self.root_boxes = (pre[0], pre[1])
        gap = np.maximum(gap, root_gap[None])
        if empty[0] or gap[0].max() > 0:
            return self._outcome("unsat", None, float(gap[0].max()) if not empty[0] else math.inf)
        queue: list[tuple[float, int, np.ndarray, np.ndarray, tuple]] = []
        order = 0
        heapq.heappush(queue, (float(gap[0].max()), order, root[0], gap[0], (pre[0][0], pre[1][0]),
                               root_lo, root_hi, self._keep_warm(slopes, 0)))
        held = per_domain
        rounds, next_attack = 0, self.attack_every
        while queue:
            best = min(queue[0][0], self.proved)
            if time.perf_counter() > self.deadline:
                return self._outcome("unknown", None, best, "timeout")
            if held > self.max_queue_bytes and len(queue) > 1:  # (the whole box is always searched)
                return self._outcome("unknown", None, best,
                                     f"memory cap: {len(queue)} open subdomains exceed {self.max_queue_bytes} bytes")
            rounds += 1
            if self.attack is not None and rounds >= next_attack:
                next_attack = 2 * rounds
                try:
                    found = self.attack()
                except DeadlineExceeded:
                    return self._outcome("unknown", None, best, "timeout")
                if found is not None:
                    return self._outcome("sat", found, best)
            picked = [heapq.heappop(queue) for _ in range(min(self.batch, len(queue)))]
            held -= sum(per_domain + (0 if p[5] is root_lo else own_box) for p in picked)
            self.warm_bytes -= sum(_warm_size(p[7]) for p in picked)
            warm = self._warm_children([p[7] for p in picked])
            splits = np.stack([p[2] for p in picked])
            gaps = np.stack([p[3] for p in picked])
            pre = (np.stack([p[4][0] for p in picked]), np.stack([p[4][1] for p in picked]))
            los, his = np.stack([p[5] for p in picked]), np.stack([p[6] for p in picked])
            score, choice = self._scores(gaps, pre, splits)
            rows = np.arange(len(picked))
            on_input = ~np.isfinite(np.max(score, axis=1, initial=-np.inf))
            fsb_gap = None
            try:
                if self.branching == "fsb" and not on_input.all():
                    unit, fsb_gap = self._fsb(splits, gaps, pre, los, his, score, choice)
                else:  # (no unit at all: every row splits its input box, the units are not read)
                    unit = np.argmax(score, axis=1) if score.shape[1] else np.zeros(len(picked), dtype=np.int64)
            except DeadlineExceeded:
                return self._outcome("unknown", None, best, "timeout")
            # no splittable unit left: the splits act only through the relaxations, so halve the input box instead
            dim = np.argmax(his - los, axis=1)
            mid = los[rows, dim] * 0.5 + his[rows, dim] * 0.5
            if np.any(on_input & ~((los[rows, dim] < mid) & (mid < his[rows, dim]))):
                return self._outcome("unknown", None, best, "a subdomain cannot be split further")
            relu_rows = rows[~on_input]
            children = self._children(splits, relu_rows, unit[relu_rows], choice[relu_rows, unit[relu_rows]])
            child_lo, child_hi = np.concatenate([los, los]), np.concatenate([his, his])
            in_rows = rows[on_input]
            child_hi[in_rows, dim[in_rows]] = mid[in_rows]
            child_lo[len(picked) + in_rows, dim[in_rows]] = mid[in_rows]
            try:
                gap, empty, cpre, points, slopes = self._bound(
                    children, child_lo, child_hi, (np.concatenate([pre[0], pre[0]]), np.concatenate([pre[1], pre[1]])),
                    warm=warm)
            except DeadlineExceeded:
                return self._outcome("unknown", None, best, "timeout")
            if fsb_gap is not None:  # FSB's cheap bounds of the same children: sound too
                gap = np.maximum(gap, fsb_gap)
            gap = np.maximum(gap, np.concatenate([gaps, gaps]))
            if self.check is not None and points is not None:
                try:
                    found = self._try_points(gap, empty, points)
                except DeadlineExceeded:
                    return self._outcome("unknown", None, best, "timeout")
                if found is not None:
                    return self._outcome("sat", found, best)
            shared = np.all(child_lo == box_lo, axis=1) & np.all(child_hi == box_hi, axis=1)
            for j in range(children.shape[0]):
                if empty[j]:
                    continue
                if gap[j].max() > 0:
                    self.proved = min(self.proved, float(gap[j].max()))
                    continue
                order += 1
                own = not shared[j]
                held += per_domain + (own_box if own else 0)
                # copies, not views: a view would keep its whole round's array alive past what ``held`` counts
                heapq.heappush(queue, (float(gap[j].max()), order, children[j].copy(), gap[j].copy(),
                                       (cpre[0][j].copy(), cpre[1][j].copy()),
                                       child_lo[j].copy() if own else root_lo, child_hi[j].copy() if own else root_hi,
                                       self._keep_warm(slopes, j)))
            if self.progress:
                low = queue[0][0] if queue else 0.0
                print(f"\rbab: {self.domains} domains, {len(queue)} open, worst gap {low:.4g}, "
                      f"{time.perf_counter() - self.start:.1f} s", end="", file=sys.stderr, flush=True)
        if self.progress:
            print(file=sys.stderr)
        return self._outcome("unsat", None, self.proved)

    # -- warm starts ------------------------------------------------------------------------------

    def _keep_warm(self, slopes, j: int):
        """Subdomain j's optimized slopes as float32 copies, or None (no beta pass, warm starts off, or
        ``MAX_WARM_BYTES`` reached)."""
        if slopes is None or not WARM_START:
            return None
        size = sum(a[j].size + b[j].size for a, b in slopes.values()) * 4
        if self.warm_bytes + size > MAX_WARM_BYTES:
            return None
        self.warm_bytes += size
        return {v: (a[j].astype(np.float32), b[j].astype(np.float32)) for v, (a, b) in slopes.items()}

    def _warm_children(self, kept: list):
        """The starting slopes of the children of ``kept``'s subdomains (each twice, as ``_children``
        lays them out): ``[2 M, K, units]`` per ReLU node, NaN for a parent without any; None when none has."""
        have = [w for w in kept if w is not None]
        if not have:
            return None
        out = {}
        for v, (a0, b0) in have[0].items():
            alpha = np.full((len(kept),) + a0.shape, np.nan, np.float32)
            beta = np.full((len(kept),) + b0.shape, np.nan, np.float32)
            for i, w in enumerate(kept):
                if w is not None:
                    alpha[i], beta[i] = w[v]
            out[v] = (np.concatenate([alpha, alpha]), np.concatenate([beta, beta]))
        return out

    def _outcome(self, result: str, found: dict[str, Any] | None, best: float, reason: str = "") -> BabOutcome:
        return BabOutcome(result, found, self.domains, best, reason, self.root_boxes)
