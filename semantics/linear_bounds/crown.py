"""CROWN: backward linear bound propagation, sound in floating point.

``linear_bounds(g, payload, lower, upper, method="crown")`` bounds every graph output over the input
box (``method="alpha-crown"`` then optimizes the ReLU lower slopes of the output passes, see ``alpha``).
For each output (and, first, for the input of every relaxed nonlinear node: the intermediate
bounds) a backward pass carries linear coefficients from the node to the graph inputs through the
rules of ``rules.BACKWARD`` and the relaxations of ``relax``; the inputs' box then concretizes them.
Intermediate bounds are computed only for the entries whose relaxation they can change (ReLU-like
units that IBP leaves unstable; every entry of a smooth activation's input) and intersected with the
IBP box. A node without a backward rule or relaxation is replaced by its box (IBP, or CROWN when it
was refined): the result lists these nodes in ``fallback``.

Soundness: every bound encloses the exact real value of the output for every real input in the
box. IBP supplies sound boxes of every node; the coefficients are computed in binary64 and each
rounding is charged to an error term per row (see ``rules``), the constant terms are summed with
their rounding bound, and the final value is rounded outward. Boxes with infinite ends give
infinite bounds, never NaN.

Rows whose pass reaches the input right after a linear layer (or a relu and a linear layer fused)
are bounded there block by block (``_Pass.ends_at``): their coefficients over the inputs are never
built whole. Convolutional intermediate bounds use patch-form passes (``patches``).

The first axis is treated as a batch axis when every node keeps samples apart (as auto_LiRPA
assumes); the coefficients are then ``[N, rows, ...]`` per sample instead of one block-diagonal
matrix. Otherwise the whole graph is one sample.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from torchlean_bridge.check import check
from torchlean_bridge.errors import BridgeError
from torchlean_bridge.graph import Graph, Node
from torchlean_bridge.ops import FLOAT
from torchlean_bridge.payload import Payload

from ..domains import node_value
from ..interval import IntervalPropagator
from ..interval_round import MIN_NORMAL, U, Box, center_radius, clean, down, up
from ..memory import exceeds_working_memory
from ..records import PREPARED
from ..scratch import scratch
from ..signed_parts import by_sign, negative_part, positive_part
from ..conv import pool_out_spatial
from ..rules.affine import rows_matmul
from .batch_axis import BATCH_SAFE_ELEMENTWISE
from .expand import expand
from .softmax_planes import softmax_planes
from .relax import POSITIVE_ONLY, Lines, max_pool_relaxation, relu_lines, smooth_for, smooth_lines, window_indices
from .pieces import breakpoints, pwl_lines
from .patches import PatchMismatch, PatchPass, patchable
from .radius32 import concretized32, input_step32
from .rules import _ERR_SAFETY, BACKWARD, err_factor

__all__ = ["linear_bounds", "LinearBounds", "Crown", "METHODS", "DeadlineExceeded"]

METHODS = ("crown", "ibp", "alpha-crown")
_BUDGET = 1 << 22  # coefficient entries per backward chunk (32 MiB of float64)
_RELU_LIKE = frozenset({"relu", "leaky_relu", "prelu"})
_MAX_POOLS = frozenset({"max_pool", "max_pool_nd"})
_PIECEWISE = frozenset({"abs", "clamp"})  # relaxed by pieces.pwl_lines
# the most bytes of boxes ``Crown.shared_ibp`` keeps per batch size (an MNIST 256x6 network at batch 512
# takes 29 MiB; a CIFAR ResNet's boxes at that batch would take gigabytes, and are not kept)
MAX_SHARED_IBP_BYTES = 32 << 20
FLOAT32_INPUT_STEP = True  # the fused ReLU-linear step's rows that end at the input: float32 radius products
_FEW_ROWS = 32  # below this many coefficient rows a pass multiplies whole weights instead of gathering columns
_BLOCK = 1 << 17  # coefficient entries per row block of a product that is concretized at once (1 MiB, in cache)


class DeadlineExceeded(Exception):
    """The caller's deadline (``Crown(...)(..., deadline=t)``, a ``time.perf_counter()`` value) passed;
    it is looked at before every backward pass, at every node of one, at every node of the relaxations'
    preparation and before every optimization step, so a call overruns it by at most one node's step."""


@dataclass
class LinearBounds:
    """Bounds of each graph output (arrays of the output's shape), optionally of every node.

    ``fallback`` maps the nodes that were replaced by their box (no linear relaxation) to their kind.
    With a ``spec`` matrix C, ``spec_lower``/``spec_upper`` bound ``C y`` per sample (``[N, K]``) and
    ``spec_coefficients`` holds, per graph input, the coefficients of the lower bound of each row
    (``[N, K] + input tail``): a direction in which the row decreases, for counterexample search.
    """

    lower: list[np.ndarray]
    upper: list[np.ndarray]
    method: str
    fallback: dict[int, str] = field(default_factory=dict)
    boxes: list[Box] | None = None
    spec_lower: np.ndarray | None = None
    spec_upper: np.ndarray | None = None
    spec_coefficients: list[np.ndarray] | None = None
    # the lower bound ``[N, K]`` of the linear function whose input coefficients are ``spec_coefficients``
    # (``spec_lower`` may be tighter: it also takes the output box and alpha-CROWN): for x in the box,
    # row(x) >= spec_line_lower + a.x - min over the box of a.x
    spec_line_lower: np.ndarray | None = None
    # with ``keep_refined=True``: the CROWN-refined boxes of the run, by node of the Crown's own graph, to seed
    # a later run of the same Crown on the same box (``bound_domains(..., seeds=)``) without its backward passes
    refined_boxes: dict[int, Box] | None = None

    # per output (lo, hi), as ``interval_bounds`` gives per node: ``lo, hi = lb[0]``, ``for lo, hi in lb``
    def __len__(self) -> int:
        return len(self.lower)

    def __getitem__(self, i: int) -> Box:
        return self.lower[i], self.upper[i]

    def __iter__(self):
        return iter(zip(self.lower, self.upper))

    def to_json(self) -> dict[str, Any]:
        return {"method": self.method, "lower": [x.tolist() for x in self.lower],
                "upper": [x.tolist() for x in self.upper],
                "fallback": {str(k): v for k, v in sorted(self.fallback.items())}}


_BILINEAR = frozenset({"mul_elem", "matmul"})  # relaxed (McCormick) when both operands are computed
_VIEWS = frozenset({"reshape", "transpose", "broadcast_to"})  # a box moves through these exactly


def _view_of(node: Node, x: np.ndarray) -> np.ndarray:
    """The value of view node ``node`` applied to its parent's array x (a box end)."""
    if node.kind == "reshape":
        return x.reshape(node.out_shape)
    if node.kind == "transpose":
        return np.swapaxes(x, node.attrs["axis1"], node.attrs["axis2"])
    return np.broadcast_to(x, node.out_shape)


def _keeps_batch(g: Graph, node: Node, n: int) -> bool:
    """Whether node treats the first axis as independent samples of size n."""
    k, a, shape = node.kind, node.attrs, node.out_shape
    if len(shape) < 2 or shape[0] != n:
        return False
    parents = [g.nodes[p].out_shape for p in node.parents]
    if k in BATCH_SAFE_ELEMENTWISE:
        return all(tuple(s) == tuple(shape) for s in parents)
    if k == "linear":
        return True
    if k in ("conv", "conv_transpose", "batch_norm_eval"):
        return a["channel_axis"] >= 1
    if k in ("max_pool", "avg_pool", "max_pool_nd", "avg_pool_nd"):
        return a["spatial_rank"] < len(shape)
    if k in ("reshape", "flatten", "squeeze", "unsqueeze"):
        return len(parents[0]) >= 1 and parents[0][0] == n
    if k == "permute":
        return a["perm"][0] == 0
    if k == "transpose":
        return a["axis1"] != 0 and a["axis2"] != 0
    if k == "concat":
        return a["axis"] != 0
    if k == "slice":
        return 0 not in a["axes"]
    if k == "pad":
        return a["pads_before"][0] == 0 and a["pads_after"][0] == 0
    if k in ("broadcast_to", "expand"):
        return len(parents[0]) == len(shape) and parents[0][0] == n
    if k == "matmul":
        return len(parents[0]) >= 2 and len(parents[1]) >= 2
    if k in ("reduce_sum", "reduce_mean", "softmax"):
        return a["axis"] != 0
    return False


class Crown:
    """A checked graph with its payload read once (weights in float64, |W| precomputed), for many
    boxes: ``Crown(g, payload)(lower, upper)``."""

    def __init__(self, g: Graph, payload: Payload | None) -> None:
        check(g)
        # softmax and layernorm are bounded through their decompositions (``expand``); the caller's
        # graph keeps its own IBP, whose boxes are intersected into the expanded graph's
        self.expanded = expand(g, payload)
        self.source_ibp = None
        if self.expanded is not None:
            self.source_ibp = IntervalPropagator(g, payload, products="float64")
            g, payload = self.expanded.graph, self.expanded.payload
            check(g)
        self.graph = g
        self.ibp = IntervalPropagator(g, payload, products="float64")  # intermediate boxes as tight as CROWN's own
        self.payload = payload  # of ``graph`` (the expanded one where softmax or layernorm were expanded)
        nodes = g.nodes
        depends = [False] * len(nodes)
        for node in nodes:
            depends[node.id] = node.kind == "input" or any(depends[p] for p in node.parents)
        self.const = [not d for d in depends]
        self.float_nodes = all(node.dtype == FLOAT for node in nodes if depends[node.id])
        n = nodes[g.inputs[0]].out_shape[0] if g.inputs and nodes[g.inputs[0]].out_shape else None
        self.batched = n is not None and all(
            self.const[node.id] or (node.kind == "input" and node.out_shape and node.out_shape[0] == n)
            or _keeps_batch(g, node, n) for node in nodes)
        self.n = n if self.batched else 1
        self._ancestors: dict[int, list[int]] = {}
        self._fusable: dict[tuple[int, int], bool] = {}
        self._shared_ibp: tuple[tuple[bytes, bytes], list[Box]] | None = None
        self._shared_mags: dict[int, np.ndarray] = {}

    def shared_ibp(self, lower: np.ndarray, upper: np.ndarray) -> list[Box]:
        """``ibp(lower, upper)``, where a batch whose samples all share one box (branch and bound over
        activations: every subdomain lies on the property's box) is propagated once and its boxes,
        read-only, serve the next batch on the same box (a tenth of an MNIST search went to
        repeating that propagation)."""
        shared = (self.batched and self.n > 1 and isinstance(lower, np.ndarray) and isinstance(upper, np.ndarray)
                  and lower.shape[0] == self.n
                  and bool(np.all(lower == lower[:1])) and bool(np.all(upper == upper[:1])))
        if not shared:
            return self.ibp(lower, upper)
        key = (np.ascontiguousarray(lower[:1]).tobytes(), np.ascontiguousarray(upper[:1]).tobytes())
        if self._shared_ibp is None or self._shared_ibp[0] != key:
            boxes = self.ibp(lower, upper)
            if sum(end.nbytes for box in boxes for end in box) > MAX_SHARED_IBP_BYTES:
                return boxes  # too large to keep beside the search's own memory: propagated each time
            for v, box in enumerate(boxes):
                for end in box if not self.const[v] else ():
                    end.setflags(write=False)
            self._shared_ibp = (key, boxes)
            self._shared_mags = {}
        return self._shared_ibp[1]

    def shared_mag(self, v: int, lo: np.ndarray, hi: np.ndarray) -> np.ndarray | None:
        """max(|lo|, |hi|) when (lo, hi) is node v's box of the kept shared IBP (``shared_ibp``): its
        first row, computed once, broadcast read-only along the batch (every row is the same; a
        product with it then costs one row: ``rows_matmul``). None for any other box."""
        shared = self._shared_ibp
        if shared is None or shared[1][v][0] is not lo or shared[1][v][1] is not hi or lo.ndim == 0 or lo.shape[0] < 2:
            return None
        m = self._shared_mags.get(v)
        if m is None:
            m = self._shared_mags[v] = np.broadcast_to(np.maximum(np.abs(lo[:1]), np.abs(hi[:1])), lo.shape)
        return m

    def ishape(self, v: int) -> tuple[int, ...]:
        s = tuple(self.graph.nodes[v].out_shape)
        return s if self.batched else (1,) + s

    def ancestors(self, t: int) -> list[int]:
        """Non-constant ancestors of t (t included), last first: the order of a backward pass."""
        got = self._ancestors.get(t)
        if got is None:
            mark = np.zeros(len(self.graph.nodes), dtype=bool)
            mark[t] = True
            for v in range(t, -1, -1):
                if mark[v]:
                    for p in self.graph.nodes[v].parents:
                        mark[p] = True
            got = [v for v in np.flatnonzero(mark)[::-1].tolist()]
            self._ancestors[t] = got
        return got

    def fusable(self, t: int, v: int) -> bool:
        """Whether a backward pass from linear node t can carry its rows through its parent v (an
        elementwise relaxed node) and v's parent u (a linear layer) in one step: t is v's only
        reader and v is u's only reader among t's ancestors, u's input is batched and varies."""
        key = (t, v)
        got = self._fusable.get(key)
        if got is None:
            g = self.graph
            node_v = g.nodes[v]
            got = node_v.kind in _RELU_LIKE and len(node_v.parents) >= 1
            if got:
                u = node_v.parents[0]
                node_u = g.nodes[u]
                got = (node_u.kind == "linear" and not self.const[u] and not self.const[node_u.parents[0]]
                       and len(self.ishape(u)) == 2 and len(self.ishape(node_u.parents[0])) == 2
                       and tuple(node_v.out_shape) == tuple(node_u.out_shape))
                if got:
                    readers = {x: [w for w in self.ancestors(t) if x in g.nodes[w].parents] for x in (u, v)}
                    got = (readers[v] == [t] and g.nodes[t].parents.count(v) == 1 and readers[u] == [v]
                           and node_v.parents.count(u) == 1)
            self._fusable[key] = got
        return got

    def __call__(self, lower: Any, upper: Any, method: str = "crown", spec: np.ndarray | None = None,
                 all_nodes: bool = False, deadline: float | None = None, keep_refined: bool = False) -> LinearBounds:
        if method not in METHODS:
            raise BridgeError(f"linear_bounds: unknown method {method!r} (use one of {', '.join(METHODS)})")
        g = self.graph
        boxes = self._boxes(lower, upper)
        if len(g.outputs) != 1 and spec is not None:
            raise BridgeError("linear_bounds: a spec matrix needs a graph with one output")
        if method == "ibp" or not self.float_nodes:
            result = LinearBounds([boxes[o][0] for o in g.outputs], [boxes[o][1] for o in g.outputs], "ibp",
                                  boxes=self._source_boxes(boxes) if all_nodes else None)
            if spec is not None:
                result.spec_lower, result.spec_upper = _spec_box(self, boxes[g.outputs[0]], spec)
            return result
        run = _Run(self, boxes, deadline)
        run.optimize = method == "alpha-crown" and self.n == 1  # one box: its intermediate bounds too
        run.prepare(all_nodes)
        lowers, uppers = [], []
        spec_out = None
        for o in g.outputs:
            if spec is not None:
                spec_out = run.bound(o, None, spec=_spec_matrix(spec, math.prod(self.ishape(o)[1:])))
                line_lower = spec_out[0]
                lo, hi = run.boxes[o]
            else:
                lo, hi = run.refine(o, None)
            lowers.append(lo)
            uppers.append(hi)
        label = "crown"
        if method == "alpha-crown":
            for i, o in enumerate(g.outputs):
                got = _alpha(run, o, spec if spec_out is not None else None)
                if got is None:
                    continue
                label = "alpha-crown"
                if spec_out is not None:
                    spec_out = (np.maximum(spec_out[0], got[0]), np.minimum(spec_out[1], got[1]), spec_out[2])
                else:
                    shape = lowers[i].shape
                    lowers[i] = np.maximum(lowers[i], got[0].reshape(shape))
                    uppers[i] = np.minimum(uppers[i], got[1].reshape(shape))
        fallback = run.fallback
        if self.expanded is not None:  # in the caller's numbering: the node a sub-chain stands for
            source = self.expanded.origin
            kinds = {v: k for v, k in fallback.items()}
            fallback = {source[v]: self.source_ibp.graph.nodes[source[v]].kind for v in kinds}
        result = LinearBounds(lowers, uppers, label, fallback=dict(sorted(fallback.items())),
                              boxes=self._source_boxes(run.boxes) if all_nodes else None)
        if keep_refined:
            result.refined_boxes = {v: run.boxes[v] for v, done in enumerate(run.refined) if done}
        if spec_out is not None:
            s_lo, s_hi = _spec_box(self, run.boxes[g.outputs[0]], spec)  # never looser than the output box
            result.spec_lower, result.spec_upper = np.maximum(spec_out[0], s_lo), np.minimum(spec_out[1], s_hi)
            result.spec_coefficients, result.spec_line_lower = spec_out[2], line_lower
        return result

    def _boxes(self, lower: Any, upper: Any) -> list[Box]:
        """IBP boxes of the (expanded) graph; with an expansion, each node that stands for a caller's
        node is intersected with that node's own IBP box (layernorm's and softmax's are tighter than
        their decompositions')."""
        boxes = self.ibp(lower, upper)
        if self.expanded is None:
            return boxes
        boxes = list(boxes)
        for v, (lo, hi) in enumerate(self.source_ibp(lower, upper)):
            w = self.expanded.new_of[v]
            b_lo, b_hi = boxes[w]
            boxes[w] = np.maximum(b_lo, lo), np.minimum(b_hi, hi)
        return boxes

    def _source_boxes(self, boxes: list[Box]) -> list[Box]:
        """The boxes of the caller's nodes."""
        if self.expanded is None:
            return boxes
        return [boxes[w] for w in self.expanded.new_of]


def _alpha(run: "_Run", t: int, spec: np.ndarray | None) -> Box | None:
    """alpha-CROWN bounds ``[N, K]`` of t's rows (the spec's, or every entry) with optimized ReLU
    lower slopes, each row's final pass in the outward-rounded arithmetic; None when t's graph is not
    a supported chain (see ``alpha``)."""
    from .alpha import optimize_slopes, with_slopes
    crown = run.crown
    n = crown.n
    width = math.prod(crown.ishape(t)[1:])
    c = np.eye(width) if spec is None else _spec_matrix(spec, width)
    k = c.shape[0]
    rows = np.broadcast_to(np.concatenate([c, -c])[None], (n, 2 * k, width))
    alphas = optimize_slopes(run, t, rows)
    if alphas is None:
        return None
    lower, upper = np.empty((n, k)), np.empty((n, k))
    for j in range(2 * k):
        run.on_time()
        alt = with_slopes(run, alphas, j)
        i = j % k
        if spec is None:
            low, neg_up = _Pass(alt, t, 0, n, rows=np.array([i])).run()
        else:
            low, neg_up = _Pass(alt, t, 0, n, spec=c[i:i + 1]).run()
        if j < k:
            lower[:, i] = low[:, 0]
        else:
            upper[:, i] = -neg_up[:, 0]
    return lower, upper


def _spec_matrix(spec: Any, width: int) -> np.ndarray:
    c = np.asarray(spec, dtype=np.float64)
    if c.ndim != 2 or c.shape[1] != width or not np.all(np.isfinite(c)):
        raise BridgeError(f"linear_bounds: spec must be a finite [K, {width}] matrix, got shape {list(c.shape)}")
    return c


def _spec_box(crown: Crown, box: Box, spec: Any) -> Box:
    """Interval bounds of C y from the output box (C rows applied per sample, outward rounded)."""
    from ..rules.affine import AffineParams, linear_box
    c = _spec_matrix(spec, math.prod(crown.ishape(crown.graph.outputs[0])[1:]))
    lo, hi = (x.reshape(crown.n, -1) for x in box)
    return linear_box((lo, hi), AffineParams.of(c, np.zeros(c.shape[0])))


def _one_row_if_shared(lo: np.ndarray, hi: np.ndarray) -> Box:
    """A box as ``[samples, entries]``, one row when every sample has the same box (branch and bound's
    subdomains sharing the property's input box): their concretizations then read it once."""
    lo, hi = lo.reshape(lo.shape[0], -1), hi.reshape(hi.shape[0], -1)
    if lo.shape[0] > 1 and bool(np.all(lo == lo[:1])) and bool(np.all(hi == hi[:1])):
        return lo[:1], hi[:1]
    return lo, hi


class _Run:
    """One call: the node boxes (refined as intermediate bounds are computed), relaxations, fallbacks."""

    def __init__(self, crown: Crown, boxes: list[Box], deadline: float | None = None) -> None:
        self.crown = crown
        self.deadline = deadline
        self.graph = crown.graph
        self.boxes = list(boxes)
        self.lines: dict[int, Lines] = {}
        self.pools: dict[int, tuple[np.ndarray, ...]] = {}
        self.planes: dict[int, tuple[np.ndarray, ...]] = {}  # softmax: see softmax_planes
        self.fallback: dict[int, str] = {}
        self.refined = [False] * len(boxes)
        self.seeds: dict[int, Box] = {}  # sound boxes from an earlier run on the same box: no backward pass
        self.optimize = False  # relaxed nodes' inputs also by alpha-CROWN after CROWN (``alpha_intermediate``)
        self.tightened: set[int] = set()  # nodes whose box is tighter than IBP's first one
        self._mag: dict[int, np.ndarray] = {}
        self._vectors: dict[int, tuple[np.ndarray, np.ndarray, bool]] = {}
        self._patchable: dict[int, bool] = {}

    def on_time(self) -> None:
        """Raise ``DeadlineExceeded`` once the caller's deadline has passed."""
        if self.deadline is not None and time.perf_counter() > self.deadline:
            raise DeadlineExceeded

    def mag(self, v: int) -> np.ndarray:
        """max(|lo|, |hi|) of v's box in the internal layout: bounds |z_v| entrywise. A box of the
        shared IBP (every sample on one box) gives one row, read-only and broadcast along the batch."""
        m = self._mag.get(v)
        if m is None:
            lo, hi = self.boxes[v]
            m = self.crown.shared_mag(v, lo, hi)
            if m is None:
                m = np.maximum(np.abs(lo), np.abs(hi))
            m = m.reshape(self.crown.ishape(v))
            self._mag[v] = m
        return m

    def box_vectors(self, v: int) -> tuple[np.ndarray, np.ndarray, bool]:
        """v's box as concretization vectors for every sample at once (a pass per sample would otherwise
        round them for its own box: 15 numpy calls a sample), ``[rows, entries]`` with one row when every
        sample has the same box: the center c, the stack [rows, entries, 2 or 3] of r (0 where infinite),
        |c| + r and, when some radius is infinite, where; and whether one is. Every entry's values are its
        own, so a pass reads its samples' rows, the values it would have computed for itself."""
        got = self._vectors.get(v)
        if got is None:
            shape = self.crown.ishape(v)
            c, r = center_radius(*_one_row_if_shared(*(x.reshape(shape) for x in self.boxes[v])))
            inf = ~np.isfinite(r)
            has_inf = bool(inf.any())
            r_fin = np.where(inf, 0.0, r)
            stack = np.stack([r_fin, np.abs(c) + r_fin] + ([inf.astype(np.float64)] if has_inf else []), axis=-1)
            got = self._vectors[v] = c, stack, has_inf
        return got

    def set_box(self, v: int, box: Box) -> None:
        self.boxes[v] = box
        self._mag.pop(v, None)
        self._vectors.pop(v, None)
        self.tightened.add(v)

    def _repropagate(self, node: Node) -> None:
        """The node's IBP box again from its parents' current (refined) boxes, intersected with its
        own: later relaxations and the choice of unstable units start from the tighter box."""
        ibp = self.crown.ibp
        with np.errstate(all="ignore"):
            lo, hi = node_value(ibp.domain, node, [self.boxes[p] for p in node.parents], ibp.records[node.id])
        old_lo, old_hi = self.boxes[node.id]
        new_lo, new_hi = np.maximum(old_lo, lo), np.minimum(old_hi, hi)
        if not (np.array_equal(new_lo, old_lo) and np.array_equal(new_hi, old_hi)):
            self.set_box(node.id, (new_lo, new_hi))

    def prepare(self, all_nodes: bool) -> None:
        """Intermediate bounds and relaxations, in node order."""
        g, crown = self.graph, self.crown
        for node in g.nodes:
            v = node.id
            if crown.const[v] or node.kind == "input":
                continue
            self.on_time()  # per node: the relaxations of a batch of subdomains of a CIFAR ResNet take seconds
            if not self.refined[v] and any(p in self.tightened for p in node.parents):
                self._repropagate(node)
            relaxed = node.kind in _RELU_LIKE or node.kind in _PIECEWISE or smooth_for(node.kind, node.attrs) is not None
            if node.kind == "prelu" and not crown.const[node.parents[1]]:
                relaxed = False
            if node.kind in _MAX_POOLS and not crown.const[node.parents[0]]:
                p = node.parents[0]
                if not (g.nodes[p].kind == "input" or self.refined[p]):
                    self.refine(p, self.boxes[p][0] < self.boxes[p][1])
                self.pools[v] = self._pool(node)
            if node.kind == "softmax" and not crown.const[node.parents[0]]:
                self._refine_view(node.parents[0])
                self._repropagate(node)  # the upper planes are as tight as the output box
                shape = crown.ishape(v)
                lo, hi = (x.reshape(shape) for x in self.boxes[node.parents[0]])
                out_lo, out_hi = (x.reshape(shape) for x in self.boxes[v])
                self.planes[v] = softmax_planes(lo, hi, out_lo, out_hi)
            if node.kind in _BILINEAR and not any(crown.const[p] for p in node.parents):
                for p in node.parents:  # McCormick's planes are as tight as both operands' boxes
                    self._refine_view(p)
            if relaxed:
                p = node.parents[0]
                if not (crown.const[p] or g.nodes[p].kind == "input" or self.refined[p] or self._first_affine(p)):
                    lo, hi = self.boxes[p]
                    if node.kind in _RELU_LIKE:
                        need = (lo < 0) & (hi > 0)
                    elif node.kind in _PIECEWISE:
                        need = np.zeros(lo.shape, dtype=bool)
                        for t in breakpoints(node):
                            need |= (lo < t) & (hi > t)
                    else:
                        need = lo < hi
                    self.refine(p, need)
                self.lines[v] = self._relax(node)
            if all_nodes:
                self.refine(v, None)

    def _refine_view(self, v: int) -> None:
        """Refine v, or when v only moves or copies another node's entries (reshape, transpose,
        broadcast), that node, and carry its box through the moves: one row per distinct entry."""
        g, crown = self.graph, self.crown
        chain = [v]
        while g.nodes[chain[-1]].kind in _VIEWS and not crown.const[g.nodes[chain[-1]].parents[0]]:
            chain.append(g.nodes[chain[-1]].parents[0])
        src = chain[-1]
        if not (g.nodes[src].kind == "input" or self.refined[src] or self._first_affine(src)):
            lo, hi = self.boxes[src]
            self.refine(src, lo < hi)
        for w in reversed(chain[:-1]):
            if self.refined[w]:
                continue
            node = g.nodes[w]
            moved = (_view_of(node, x) for x in self.boxes[node.parents[0]])
            lo, hi = self.boxes[w]
            self.set_box(w, (np.maximum(lo, next(moved)), np.minimum(hi, next(moved))))
            self.refined[w] = True

    def _first_affine(self, v: int) -> bool:
        """Whether v is a linear layer or convolution of a graph input: its IBP box (center-radius, up
        to rounding) is already the exact range of an affine map over the box, so a backward pass
        would only repeat it."""
        node = self.graph.nodes[v]
        return (node.kind in ("linear", "conv") and self.graph.nodes[node.parents[0]].kind == "input"
                and all(self.crown.const[q] for q in node.parents[1:]))

    def _relax(self, node: Node) -> Lines:
        lo, hi = (x.reshape(self.crown.ishape(node.id)) for x in self.boxes[node.parents[0]])
        out_lo, out_hi = (x.reshape(self.crown.ishape(node.id)) for x in self.boxes[node.id])
        finite = np.isfinite(lo) & np.isfinite(hi)
        safe_lo, safe_hi = np.where(finite, lo, 0.0), np.where(finite, hi, 0.0)
        if node.kind == "relu":
            lines = relu_lines(safe_lo, safe_hi, 0.0)
        elif node.kind == "leaky_relu":
            lines = relu_lines(safe_lo, safe_hi, float(node.attrs["negative_slope"]))
        elif node.kind == "prelu":
            s_lo, s_hi = self.boxes[node.parents[1]]
            slope = s_lo.reshape(lo.shape)
            lines = relu_lines(safe_lo, safe_hi, slope)
            exact = (s_lo == s_hi).reshape(lo.shape)
            finite &= exact
        elif node.kind in _PIECEWISE:
            lines = pwl_lines(node, safe_lo, safe_hi)
        else:
            if node.kind in POSITIVE_ONLY:  # relaxed on x > 0 only: the other entries keep their box
                finite &= lo > 0
                safe_lo, safe_hi = np.where(finite, safe_lo, 1.0), np.where(finite, safe_hi, 1.0)
            lines = smooth_lines(smooth_for(node.kind, node.attrs), safe_lo, safe_hi)
        if np.all(finite):
            return lines
        # entries with an unbounded input (or an inexact slope) keep their box: constant lines
        a_l, b_l, a_u, b_u = lines
        return (np.where(finite, a_l, 0.0), np.where(finite, b_l, out_lo), np.where(finite, a_u, 0.0),
                np.where(finite, b_u, out_hi))

    def _pool(self, node: Node) -> tuple[np.ndarray, ...]:
        """Max pooling's relaxation per (sample, leading index, output cell): see relax.max_pool_relaxation."""
        a, r = node.attrs, node.attrs["spatial_rank"]
        p = node.parents[0]
        tail = self.crown.ishape(p)[1:]
        spatial, out_sp = tuple(tail[len(tail) - r:]), pool_out_spatial(node.out_shape, r)
        # the window tables (int64 index, bool mask) and five float64 gathers per sample and leading index
        entries = math.prod(out_sp) * math.prod(a["kernel"])
        lead = math.prod(tail[:len(tail) - r])
        refusal = exceeds_working_memory(entries * (9 + 40 * self.crown.n * lead), "its max-pool relaxation")
        if refusal:
            raise BridgeError(f"linear_bounds: node {node.id} ({node.kind}): {refusal}")
        idx, valid = window_indices(spatial, out_sp, a["kernel"], a["stride"], a["padding"],
                                    a.get("dilation", (1,) * r))
        n = self.crown.n
        lo, hi = (x.reshape(n, -1, int(np.prod(spatial))) for x in self.boxes[p])
        jstar, decided, umax = max_pool_relaxation(lo, hi, idx, valid)
        return jstar, decided, umax, np.int64(np.prod(spatial))

    def refine(self, v: int, need: np.ndarray | None) -> Box:
        """CROWN bounds of v's entries where ``need`` (all when None), intersected with v's box."""
        crown = self.crown
        seed = self.seeds.get(v)
        if seed is not None:
            lo, hi = self.boxes[v]
            self.set_box(v, (np.maximum(lo, seed[0].reshape(lo.shape)), np.minimum(hi, seed[1].reshape(hi.shape))))
            return self._mark_refined(v)
        lo, hi = (x.reshape(crown.ishape(v)).copy() for x in self.boxes[v])
        tail = crown.ishape(v)[1:]
        width = math.prod(tail)
        flat_need = None if need is None else need.reshape(crown.n, width)
        if flat_need is not None and not flat_need.any():
            self.refined[v] = True
            return self.boxes[v]
        largest = self._widest(v)
        for b0, b1, rows in self._chunks(flat_need, width, largest, math.prod(tail[1:])):
            low, up_ = self.bound(v, rows, batch=(b0, b1))[:2]
            lf, hf = lo[b0:b1].reshape(b1 - b0, width), hi[b0:b1].reshape(b1 - b0, width)
            lf[:, rows] = np.maximum(lf[:, rows], low)
            hf[:, rows] = np.minimum(hf[:, rows], up_)
            lo[b0:b1], hi[b0:b1] = lf.reshape(lo[b0:b1].shape), hf.reshape(hi[b0:b1].shape)
        shape = self.graph.nodes[v].out_shape
        self.set_box(v, (lo.reshape(shape), hi.reshape(shape)))
        return self._mark_refined(v)

    def _mark_refined(self, v: int) -> Box:
        """Mark v's box refined, after alpha-CROWN's tightening when the run optimizes."""
        self.refined[v] = True
        if self.optimize:
            from .alpha_intermediate import tighten_unstable
            tighten_unstable(self, v, _Run, _Pass)
        return self.boxes[v]

    def _widest(self, t: int) -> int:
        """The most entries per sample of a node a backward pass from t carries coefficients over."""
        return max(math.prod(self.crown.ishape(p)[1:]) for p in self.crown.ancestors(t))

    def _chunks(self, need: np.ndarray | None, width: int, largest: int, cells: int):
        """(batch start, batch end, rows) pieces with at most _BUDGET coefficient entries each; a piece
        longer than a channel's ``cells`` is whole channels, so that a map's rows (channel-major) stay whole
        channels at every position, which patch passes read through a broadcast view instead of a gather."""
        n = self.crown.n
        per_sample = width if need is None else int(need.sum(axis=1).max())
        group = 1 if 2 * per_sample * largest >= 1 << 16 else max(1, _BUDGET // max(1, 2 * per_sample * largest))
        for b0 in range(0, n, group):
            b1 = min(n, b0 + group)
            rows = np.arange(width) if need is None else np.flatnonzero(need[b0:b1].any(axis=0))
            if rows.size == 0:
                continue
            step = max(1, _BUDGET // max(1, 2 * (b1 - b0) * largest))
            step = step // cells * cells if step > cells else step
            for r0 in range(0, rows.size, step):
                yield b0, b1, rows[r0:r0 + step]

    def bound(self, t: int, rows: np.ndarray | None, batch: tuple[int, int] | None = None,
              spec: np.ndarray | None = None):
        """Lower and upper bounds ``[n, R]`` of the rows of t (flat tail indices, or spec rows)."""
        crown = self.crown
        self.on_time()
        b0, b1 = batch if batch is not None else (0, crown.n)
        if spec is None:
            if self._patchable.setdefault(t, patchable(self, t)):
                try:
                    low, neg_up = PatchPass(self, t, b0, b1, rows).run()
                    return low, -neg_up
                except PatchMismatch:
                    self._patchable[t] = False
            low, neg_up = _Pass(self, t, b0, b1, rows=rows).run()
            return low, -neg_up
        # samples in groups of at most _BUDGET coefficient entries (2K rows over the widest node), one pass each
        k = spec.shape[-2]
        largest = self._widest(t)
        group = max(1, _BUDGET // max(1, 2 * k * largest))
        lows, ups, parts = [], [], []
        for s0 in range(0, crown.n, group):
            self.on_time()
            s1 = min(crown.n, s0 + group)
            ps = _Pass(self, t, s0, s1, spec=spec, keep_inputs=True)
            low, neg_up = ps.run()
            lows.append(low)
            ups.append(-neg_up)
            parts.append([ps.input_coeffs.get(i, np.zeros((s1 - s0, 2 * k) + crown.ishape(i)[1:]))[:, :k]
                          for i in self.graph.inputs])
        coeffs = [np.concatenate(per_input) for per_input in zip(*parts)]
        # also the plain output bounds, for the report
        self.refine(t, None)
        return np.concatenate(lows), np.concatenate(ups), coeffs


class _Pass:
    """One backward pass from node t for a batch slice, lower bounds of [C; -C] rows at once."""

    def __init__(self, run: _Run, t: int, b0: int, b1: int, rows: np.ndarray | None = None,
                 spec: np.ndarray | None = None, keep_inputs: bool = False) -> None:
        self.run_ = run
        self.crown = run.crown
        self.graph = run.graph
        self.batched = self.crown.batched
        self.t, self.b0, self.b1 = t, b0, b1
        n = b1 - b0
        self.n_rows = n
        self.row_ids = rows if spec is None else None
        self.spec = spec
        r = rows.size if spec is None else spec.shape[-2]  # spec [K, outputs], or [samples, K, outputs]
        self.rows = r
        self.beta = np.zeros((n, 2 * r))
        self.err = np.zeros((n, 2 * r))
        self.keep_inputs = keep_inputs
        self.live: dict[int, np.ndarray] = {}
        self.input_coeffs: dict[int, np.ndarray] = {}
        self._centers: dict[tuple[int, int], tuple] = {}  # per box concretized: center, radius vectors

    # -- helpers for the rules ----------------------------------------------------------------

    def tail(self, v: int) -> tuple[int, ...]:
        return self.crown.ishape(v)[1:]

    def axis(self, a: int) -> int:
        """The coefficient axis of value axis a (a >= 1 when batched)."""
        return a + (1 if self.batched else 2)

    def numel(self, v: int) -> int:
        return math.prod(self.tail(v))

    def _slice(self, x: np.ndarray) -> np.ndarray:
        if self.crown.n > 1 and x.shape[0] == self.crown.n:
            return x[self.b0:self.b1]
        return x

    def internal(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        return self._slice(x) if self.batched else x[None]

    def mag(self, v: int) -> np.ndarray:
        return self._slice(self.run_.mag(v))

    def mag_value(self, v: int) -> np.ndarray:
        m = self.mag(v)
        return m if self.batched else m[0]

    def box(self, v: int) -> Box:
        lo, hi = self.run_.boxes[v]
        s = self.crown.ishape(v)
        return self._slice(lo.reshape(s)), self._slice(hi.reshape(s))

    def box_value(self, v: int) -> Box:
        return self.run_.boxes[v]

    def is_const(self, v: int) -> bool:
        return self.crown.const[v]

    def const_value(self, v: int) -> np.ndarray | None:
        lo, hi = self.run_.boxes[v]
        return lo if np.array_equal(lo, hi) else None

    def affine(self, node: Node):
        p = self.crown.ibp.records[node.id][PREPARED]
        return p.weight, p.abs_weight, p.bias

    def batch_norm(self, node: Node):
        return self.crown.ibp.records[node.id][PREPARED]

    # -- accumulation -------------------------------------------------------------------------

    def _flat(self, a: np.ndarray) -> np.ndarray:
        return a.reshape(a.shape[0], a.shape[1], -1)

    def dot(self, a: np.ndarray, vec: np.ndarray) -> np.ndarray:
        """<a_row, vec> for each row: [n, rows] (vec broadcasts against a sample's tail)."""
        n = a.shape[0]
        v = np.broadcast_to(vec, (n,) + a.shape[2:]).reshape(n, -1, 1)
        with np.errstate(all="ignore"):
            return np.matmul(self._flat(a), v)[..., 0]

    def _acc(self, value: np.ndarray, error: np.ndarray) -> None:
        with np.errstate(all="ignore"):
            self.beta = self.beta + value
            self.err = up(up(self.err + error) + up(np.abs(self.beta) * (2 * U)) + MIN_NORMAL)

    def add_dot(self, a: np.ndarray, vec: np.ndarray, q: np.ndarray | None, n: int,
                radius: np.ndarray | None = None) -> None:
        """beta += <a, vec>; err += gamma_n <|a|, |vec| + q> (+ <|a|, radius>)."""
        f = err_factor(n)
        w = np.abs(vec) if q is None else np.abs(vec) + q
        w = w * f
        if radius is not None:
            w = w + radius * _ERR_SAFETY
        val = self.dot(a, vec)
        e = self.dot(np.abs(a), w)
        self._acc(clean(val, val)[0], e * (1.0 + err_factor(self.numel_a(a))) + MIN_NORMAL)

    def add_row_err(self, rows: slice, error: np.ndarray) -> None:
        """err[:, rows] += error, beta unchanged (an error bound of some rows, or of all with ``slice(None)``)."""
        with np.errstate(all="ignore"):
            self.err[:, rows] = up(up(self.err[:, rows] + error) + MIN_NORMAL)

    def numel_a(self, a: np.ndarray) -> int:
        return math.prod(a.shape[2:])

    def add_abs_err(self, a: np.ndarray, m: np.ndarray, factor: float) -> None:
        """err += factor <|a|, m> (m >= 0)."""
        e = self.dot(np.abs(a), m)
        self.add_row_err(slice(None), e * (factor * (1.0 + err_factor(self.numel_a(a)))) + MIN_NORMAL)

    def concretize(self, v: int, a: np.ndarray) -> None:
        """min over v's box of <a, z_v>: <a, c> - <|a|, r> for [c - r, c + r] covering the box."""
        ac, ar, e = self.concretized(v, a)
        with np.errstate(all="ignore"):
            self._acc(ac - ar, e)
        if self.keep_inputs and self.graph.nodes[v].kind == "input":
            self.input_coeffs[v] = a

    def ends_at(self, v: int) -> bool:
        """Whether coefficients reaching v are concretized there and nothing else (no input
        coefficients kept): a step may then bound its rows directly instead of handing them on."""
        return (self.crown.const[v] or self.graph.nodes[v].kind == "input") and not self.keep_inputs

    def flat_box(self, v: int) -> Box:
        """This pass's slice of v's box as ``[samples, entries]`` (``_one_row_if_shared``)."""
        return _one_row_if_shared(*self.box(v))

    def concretized(self, v: int, a: np.ndarray, abs_a: np.ndarray | None = None) -> tuple[np.ndarray, ...]:
        """Per row of a (``[n, rows] + tail(v)``): <a, c>, <|a|, r> and the rounding bound of
        <a, c> - <|a|, r>, 2 gamma_(k+1) <|a|, |c| + r> (+ MIN_NORMAL), for [c - r, c + r] covering v's
        box; <|a|, r> is inf for a row that meets an infinite radius. Large arrays are taken in row
        blocks, so that |a| is never a full-size temporary."""
        n_rows, rows = a.shape[:2]
        k = self.numel_a(a)
        got = self._centers.get((v, n_rows))
        if got is None:
            c, stack, has_inf = (self._slice(x) if isinstance(x, np.ndarray) else x for x in self.run_.box_vectors(v))
            vec_c = np.ascontiguousarray(np.broadcast_to(c, (n_rows, k)))[:, :, None]
            stack = np.ascontiguousarray(np.broadcast_to(stack, (n_rows, k, stack.shape[-1])))
            got = self._centers[(v, n_rows)] = vec_c, stack, has_inf
        vec_c, stack, has_inf = got
        flat = a.reshape(n_rows, rows, k)
        ac, t = np.empty((n_rows, rows)), np.empty((n_rows, rows, stack.shape[-1]))
        step = max(1, _BLOCK // max(1, n_rows * k))
        with np.errstate(all="ignore"):
            for r0 in range(0, rows, step):
                part = flat[:, r0:r0 + step]
                np.matmul(part, vec_c, out=ac[:, r0:r0 + step, None])
                if abs_a is None:
                    mag = np.abs(part, out=scratch("crown.abs", part.shape))
                else:
                    mag = abs_a.reshape(-1, rows, k)[:, r0:r0 + step]
                np.matmul(mag, stack, out=t[:, r0:r0 + step])
            ar = t[..., 0]
            if has_inf:
                ar = np.where(t[..., 2] > 0, np.inf, ar)
            e = t[..., 1] * (2.0 * err_factor(k + 1)) + MIN_NORMAL
        return ac, ar, e

    # -- the pass -----------------------------------------------------------------------------

    def _relaxed(self, v: int, a: np.ndarray) -> list:
        """Lines a_l z + b_l <= f(z) <= a_u z + b_u: the lower bound takes a_l where a >= 0, a_u elsewhere.

        Only the columns where the two lines differ need the sign test, only those with a nonzero
        intercept add to the constant, and only those with a slope other than 0 or 1 round.
        """
        a_l, b_l, a_u, b_u = (self._slice(x).reshape(self._slice(x).shape[0], -1) for x in self.run_.lines[v])
        p = self.graph.nodes[v].parents[0]
        n, rows = a.shape[0], a.shape[1]
        flat = a.reshape(n, rows, -1)
        width = flat.shape[-1]
        cols_any = lambda mask: np.flatnonzero(mask.any(axis=0))  # noqa: E731
        differ = (a_l != a_u) | (b_l != b_u)
        icpt = (b_l != 0) | (b_u != 0)
        inexact = ~(((a_l == 0) | (a_l == 1)) & ((a_u == 0) | (a_u == 1)))
        special = cols_any(differ | icpt | inexact)  # one gather of these columns serves all three
        dense = special.size == width  # smooth layers: every column is special, so no gather or scatter
        if dense:
            new, val, e = _apply_lines_dense(flat, a_l, b_l, a_u, b_u)
            new_part = new
        else:
            new = flat * a_l[:, None]
        if special.size and not dense:  # the gathered special columns only
            part = flat[:, :, special]
            sl, su = a_l[:, None, special], a_u[:, None, special]
            il, iu = b_l[:, None, special], b_u[:, None, special]
            with np.errstate(all="ignore"):
                if all(np.isfinite(f).all() for f in (sl, su, il, iu)):  # by_sign's values are np.where's
                    pos, neg = positive_part(part), negative_part(part)
                    new_part, prod = by_sign(pos, neg, sl, su), by_sign(pos, neg, il, iu)
                else:
                    pos = part >= 0
                    new_part, prod = np.where(pos, part * sl, part * su), np.where(pos, part * il, part * iu)
                new[:, :, special] = new_part
                val = prod.sum(axis=-1)
                e = np.abs(prod).sum(axis=-1) * err_factor(width + 1)
        if special.size:
            self._acc(np.where(np.isnan(val), -np.inf, val), e)
            m = self.mag(p).reshape(self.mag(p).shape[0], -1)
            m = m if dense else m[:, special]
            self.add_abs_err(new_part, m, 2.0 * U * _ERR_SAFETY)
        live = cols_any((a_l != 0) | (a_u != 0))
        if live.size < 0.75 * width and len(self.tail(p)) == 1:
            self.live[p] = live  # the columns a linear parent must read (the others are exactly 0)
        return [(p, new.reshape(a.shape))]

    def _planar(self, v: int, a: np.ndarray) -> list:
        """Softmax's planes (``softmax_planes``): the lower plane of each output under nonnegative
        coefficients, the upper one under negative ones. The new coefficients are 2T-term sums per
        input, at most gamma <|A|, max(|J_l|, |J_u|) M_x> in effect."""
        j_l, b_l, j_u, b_u = (self._slice(x) for x in self.run_.planes[v])
        p = self.graph.nodes[v].parents[0]
        t = j_l.shape[-1]
        pos, neg = positive_part(a), negative_part(a)
        with np.errstate(all="ignore"):
            new = (pos[..., None, :] @ j_l[:, None])[..., 0, :] + (neg[..., None, :] @ j_u[:, None])[..., 0, :]
            q = (np.maximum(np.abs(j_l), np.abs(j_u)) @ self.mag(p)[..., None])[..., 0]
        self.add_abs_err(a, q * (1.0 + err_factor(t + 1)), err_factor(2 * t + 2))
        numel = self.numel(v) + 1
        self.add_dot(pos, b_l, None, numel)
        self.add_dot(neg, b_u, None, numel)
        return [(p, new)]

    def _initial(self) -> np.ndarray:
        """[C; -C] per sample: C the spec, or the identity rows picked by row_ids."""
        n, r, tail = self.n_rows, self.rows, self.tail(self.t)
        if self.spec is not None:
            spec = self.spec[None] if self.spec.ndim == 2 else self._slice(self.spec)  # per sample: its own rows
            a = np.broadcast_to(np.concatenate([spec, -spec], axis=1), (n, 2 * r, spec.shape[-1]))
            return a.reshape((n, 2 * r) + tail)
        a = np.zeros((n, 2 * r, math.prod(tail)))
        a[:, np.arange(r), self.row_ids] = 1.0
        a[:, r + np.arange(r), self.row_ids] = -1.0
        return a.reshape((n, 2 * r) + tail)

    def _pooled(self, v: int, a: np.ndarray) -> list:
        """max >= x_j* for the lower side; max <= x_j* where j* decides the window, else <= max u.
        The coefficients move to the cells j* (scattered, summing where windows share a cell)."""
        jstar, decided, umax, cells = (self._slice(x) if np.ndim(x) else x for x in self.run_.pools[v])
        p = self.graph.nodes[v].parents[0]
        n, rows = a.shape[:2]
        flat = a.reshape(n, rows, jstar.shape[1], jstar.shape[2])
        pos = flat >= 0
        to_cell = np.where(pos | decided[:, None], flat, 0.0)
        with np.errstate(all="ignore"):
            const = np.where(pos | decided[:, None], 0.0, flat * umax[:, None])
            val = const.reshape(n, rows, -1).sum(axis=-1)
            e = np.abs(const).reshape(n, rows, -1).sum(axis=-1) * err_factor(const[0, 0].size + 1)
        self._acc(np.where(np.isnan(val), -np.inf, val), e)
        out = np.zeros((n, rows, jstar.shape[1], int(cells)))
        ni = np.arange(n)[:, None, None, None]
        ri = np.arange(rows)[None, :, None, None]
        li = np.arange(jstar.shape[1])[None, None, :, None]
        np.add.at(out, (ni, ri, li, jstar[:, None]), to_cell)
        # the scatter's sums round: gamma_k <|coefficients|, M at their cells>, k windows per cell at most
        m = self.mag(p).reshape(n, 1, jstar.shape[1], int(cells))
        m_at = np.take_along_axis(np.broadcast_to(m, (n, 1) + m.shape[2:]), jstar[:, None], axis=-1)
        k = int(np.bincount(jstar.reshape(-1)).max()) if jstar.size else 1
        err = (np.abs(to_cell) * m_at).reshape(n, rows, -1).sum(axis=-1) * err_factor(k + 1)
        self.add_row_err(slice(None), err)
        return [(p, out.reshape((n, rows) + self.tail(p)))]

    def _start(self) -> dict[int, np.ndarray]:
        """The first step: rows of the identity through a linear target are rows of W (exact, no product)."""
        node = self.graph.nodes[self.t]
        if self.row_ids is None or node.kind != "linear" or math.prod(self.tail(self.t)[:-1]) != 1:
            return {self.t: self._initial()}
        w, abs_w, bias = self.affine(node)
        p = node.parents[0]
        every = self.row_ids.size == w.shape[0] and np.array_equal(self.row_ids, np.arange(w.shape[0]))
        picked = w if every else w[self.row_ids]
        n = self.n_rows
        if self.crown.fusable(self.t, p) and p in self.run_.lines:
            self.beta = self.beta + np.concatenate([bias[self.row_ids], -bias[self.row_ids]])[None]
            return self._relu_linear(p, picked, abs_w if every else abs_w[self.row_ids])
        self.beta = self.beta + np.concatenate([bias[self.row_ids], -bias[self.row_ids]])[None]
        if self.ends_at(p):  # [W; -W] on a box: one half's products serve both (|-W| = |W|)
            shape = (n, picked.shape[0]) + self.tail(p)
            ac, ar, e = self.concretized(p, np.broadcast_to(picked[None], (n,) + picked.shape).reshape(shape),
                                         abs_a=abs_w if every else abs_w[self.row_ids])
            with np.errstate(all="ignore"):
                self._acc(np.concatenate([ac - ar, -ac - ar], axis=1), np.concatenate([e, e], axis=1))
            return {}
        both = np.empty((2 * picked.shape[0], picked.shape[1]))
        both[:picked.shape[0]] = picked
        np.negative(picked, out=both[picked.shape[0]:])
        a = np.broadcast_to(both[None], (n,) + both.shape)
        return {p: a.reshape((n, a.shape[1]) + self.tail(p))}

    def _relu_linear(self, v: int, x: np.ndarray, abs_x: np.ndarray) -> dict[int, np.ndarray]:
        """Rows [X; -X] at a relaxed node v whose parent u is a linear layer read only by v, carried
        through both to u's parent at once, without building the 2R-row arrays in between.

        Off the columns where v's lines differ, carry intercepts or round (``special``), both halves
        keep X times a 0/1 slope, so they share one product P = X_plain W_plain; on the special
        columns each half has its own slopes: top = P + L W_s, bottom = -(P + H W_s), where L and
        -H are the halves' coefficients there. Each half is one product A W summed in some order,
        so its rounding is gamma_n <|A|, |W| M_w + |b|> (M_w bounding u's input), as in the linear rule.

        The rows are taken in blocks, every array of a block in cache-sized buffers; when u's parent
        is the input (``ends_at``) each block is concretized at once, so the [2R, inputs] products
        never exist whole.
        """
        run, g = self.run_, self.graph
        u = g.nodes[v].parents[0]
        node_u = g.nodes[u]
        w_parent = node_u.parents[0]
        weight, abs_weight, bias = self.affine(node_u)
        lines = [self._slice(z) for z in run.lines[v]]
        n = lines[0].shape[0]
        a_l, b_l, a_u, b_u = (z.reshape(n, -1) for z in lines)
        width, k_out = a_l.shape[1], weight.shape[1]
        r = x.shape[0]
        inexact = ~(((a_l == 0) | (a_l == 1)) & ((a_u == 0) | (a_u == 1)))
        special_mask = ((a_l != a_u) | (b_l != 0) | (b_u != 0) | inexact).any(axis=0)
        live_mask = ((a_l != 0) | (a_u != 0)).any(axis=0)
        special = np.flatnonzero(special_mask)
        plain = np.flatnonzero(live_mask & ~special_mask)
        m_w = self.mag(w_parent).reshape(n, -1)
        few = n * r < _FEW_ROWS  # a few rows: products over every column beat gathering rows of W
        ends = self.ends_at(w_parent)
        with np.errstate(all="ignore"):
            q = rows_matmul(m_w, abs_weight.T)  # [n, width]: |W| M_w bounds |W z_w| entrywise
            f = err_factor(width + 1)
            err_vec = (np.abs(bias)[None] + q) * f  # per unit of |coefficient| at u
            mask = a_l[:, plain]  # 0 or 1 per sample
            ones = n == 1 and bool(np.all(mask == 1))
            sl, su = a_l[:, special], a_u[:, special]
            fs = err_factor(special.size + 1)
            prod_factor = 2.0 * U * _ERR_SAFETY * (1.0 + err_factor(special.size))
            # per unit of |coefficient|: the slope product's rounding (times |z_u|) and u's product and bias
            weight_err = self.mag(u).reshape(n, -1)[:, special] * prod_factor + err_vec[:, special] * (1.0 + fs)
            il, iu = b_l[:, special], b_u[:, special]
            vecs = np.stack([il, iu, np.abs(il), np.abs(iu), np.abs(sl) * weight_err, np.abs(su) * weight_err], axis=-1)
            b_s, b_plain = bias[special], bias[plain]
            on_plain = None
            if n == 1:  # over every column with the others' weights 0: no gather of |X|'s columns
                on_plain = np.zeros(width)
                on_plain[plain] = err_vec[0, plain]
            w_plain, w_s = (None, None) if few else (weight[plain], weight[special])
            # rows that end at the input: float32 products for their radius terms (``radius32``)
            step32 = None
            if ends and not few and FLOAT32_INPUT_STEP:
                step32 = input_step32(self.crown.ibp.records[u][PREPARED], *self.flat_box(w_parent), plain, special)
            sums = {key: np.empty((n, 2 * r)) for key in ("int", "e_int", "bias", "e_bias", "box", "e_box")}
            out = None if ends else np.empty((n, 2 * r, k_out))
            step = r if few else max(32, _BLOCK // max(1, n * k_out))
            for r0 in range(0, r, step):
                r1 = min(r, r0 + step)
                top, bottom = slice(r0, r1), slice(r + r0, r + r1)
                xb = x[r0:r1]
                # the plain columns: X times the 0/1 slope (exact), shared by both halves
                x_plain = np.take(xb, plain, axis=1, out=scratch("crown.x_plain", (r1 - r0, plain.size)))[None]
                if not ones:
                    x_plain = x_plain * mask[:, None, :]
                shared_val = x_plain @ b_plain  # [n, rows]
                if on_plain is not None:
                    shared_err = (abs_x[r0:r1] @ on_plain)[None]
                else:
                    shared_err = ((abs_x[r0:r1, plain][None] * mask[:, None, :]) @ err_vec[:, plain, None])[..., 0]
                shared_err = shared_err * (1.0 + err_factor(plain.size))
                # the special columns: each half takes its slope and intercept by the sign of its coefficient.
                # With xp = max(X, 0) and xn = min(X, 0) (one of them 0 per entry) the lower half's coefficients
                # are xp a_l + xn a_u and the upper half's -(xn a_l + xp a_u); their intercept sums and every
                # error sum (of |coefficient| times a weight) are products of xp and xn with a few vectors
                xs = np.take(xb, special, axis=1, out=scratch("crown.xs", (r1 - r0, special.size)))[None]
                xp = positive_part(xs, out=scratch("crown.xp", xs.shape))
                xn = negative_part(xs, out=scratch("crown.xn", xs.shape))
                shape = (n, r1 - r0, special.size)
                low = np.multiply(xp, sl[:, None], out=scratch("crown.low", shape))
                tmp = np.multiply(xn, su[:, None], out=scratch("crown.tmp", shape))
                low += tmp
                high = np.multiply(xn, sl[:, None], out=scratch("crown.high", shape))
                high += np.multiply(xp, su[:, None], out=tmp)  # the upper half's coefficients are -high
                on_p, on_n = xp @ vecs, xn @ vecs  # [n, rows, 6]
                sums["int"][:, top] = on_p[..., 0] + on_n[..., 1]
                sums["int"][:, bottom] = -(on_n[..., 0] + on_p[..., 1])
                sums["e_int"][:, top] = (on_p[..., 2] - on_n[..., 3]) * fs
                sums["e_int"][:, bottom] = (on_p[..., 3] - on_n[..., 2]) * fs
                # u's bias: <A, b> for each half, one dot product in two parts (its rounding is in err_vec)
                sums["bias"][:, top], sums["bias"][:, bottom] = shared_val + low @ b_s, -(shared_val + high @ b_s)
                sums["e_bias"][:, top] = shared_err + on_p[..., 4] - on_n[..., 5] + MIN_NORMAL
                sums["e_bias"][:, bottom] = shared_err + on_p[..., 5] - on_n[..., 4] + MIN_NORMAL
                # the rows at u's parent: [P + L W_s; P + H W_s], the second half negated below
                got = None if step32 is None else concretized32(step32, x_plain, low, high)
                if got is not None:
                    sums["box"][:, top], sums["box"][:, bottom], sums["e_box"][:, top], sums["e_box"][:, bottom] = got
                    continue
                both = scratch("crown.rows", (n, 2 * (r1 - r0), k_out))
                if few:
                    full = np.zeros((n, 2 * (r1 - r0), width))
                    full[:, :r1 - r0, plain] = x_plain
                    full[:, r1 - r0:, plain] = x_plain
                    full[:, :r1 - r0, special] = low
                    full[:, r1 - r0:, special] = high
                    np.matmul(full, weight, out=both)
                else:
                    shared = np.matmul(x_plain, w_plain, out=scratch("crown.shared", x_plain.shape[:2] + (k_out,)))
                    np.matmul(low, w_s, out=both[:, :r1 - r0])
                    both[:, :r1 - r0] += shared
                    np.matmul(high, w_s, out=both[:, r1 - r0:])
                    both[:, r1 - r0:] += shared
                if ends:
                    ac, ar, e = self.concretized(w_parent, both.reshape((n, 2 * (r1 - r0)) + self.tail(w_parent)))
                    half = r1 - r0
                    sums["box"][:, top] = ac[:, :half] - ar[:, :half]
                    sums["box"][:, bottom] = -ac[:, half:] - ar[:, half:]  # the second half is -both there
                    sums["e_box"][:, top], sums["e_box"][:, bottom] = e[:, :half], e[:, half:]
                else:
                    out[:, top], out[:, bottom] = both[:, :r1 - r0], -both[:, r1 - r0:]
            self._acc(np.where(np.isnan(sums["int"]), -np.inf, sums["int"]), sums["e_int"])
            self._acc(sums["bias"], sums["e_bias"])
            if ends:
                self._acc(sums["box"], sums["e_box"])
                return {}
        return {w_parent: out.reshape((n, 2 * r) + self.tail(w_parent))}

    def run(self) -> tuple[np.ndarray, np.ndarray]:
        run, g = self.run_, self.graph
        coeffs: dict[int, np.ndarray] = self._start()
        for v in self.crown.ancestors(self.t):
            a = coeffs.pop(v, None)
            if a is None:
                continue
            run.on_time()  # per node: one pass through a deep net can take seconds
            node = g.nodes[v]
            if self.crown.const[v] or node.kind == "input":
                self.concretize(v, a)
                continue
            if v in run.lines:
                out = self._relaxed(v, a)
            elif v in run.pools:
                out = self._pooled(v, a)
            elif v in run.planes:
                out = self._planar(v, a)
            else:
                rule = BACKWARD.get(node.kind)
                out = None if rule is None else rule(self, node, a)
            if out is None:
                run.fallback[v] = node.kind
                self.concretize(v, a)
                continue
            for p, ap in out:
                if p in coeffs:
                    self.live.pop(p, None)
                    coeffs[p] = coeffs[p] + ap
                    self.add_abs_err(coeffs[p], self.mag(p), 2.0 * U * _ERR_SAFETY)
                else:
                    coeffs[p] = ap
        with np.errstate(all="ignore"):
            low = down(down(self.beta - self.err))
        low = np.where(np.isnan(low), -np.inf, low)
        r = self.rows
        return low[:, :r], low[:, r:]


def linear_bounds(g: Graph, payload: Payload | None, lower: Any, upper: Any, method: str = "crown",
                  spec: Any = None, all_nodes: bool = False, deadline: float | None = None) -> LinearBounds:
    """Sound linear (CROWN) or interval (``method="ibp"``) bounds of every output over the input box.

    ``lower``/``upper`` as for ``interval_bounds``. ``spec``: an optional ``[K, outputs per sample]``
    matrix C; ``spec_lower``/``spec_upper`` then bound ``C y`` (tighter than bounding y first).
    ``all_nodes=True`` refines and returns every node's box. ``deadline`` (a ``time.perf_counter()``
    value): ``DeadlineExceeded`` once it has passed. For many boxes, build ``Crown(g, payload)`` once
    and call it.
    """
    return Crown(g, payload)(lower, upper, method=method, spec=spec, all_nodes=all_nodes, deadline=deadline)


def _apply_lines_dense(flat: np.ndarray, a_l: np.ndarray, b_l: np.ndarray, a_u: np.ndarray, b_u: np.ndarray
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The lines on every column: the lower line under nonnegative coefficients, the upper one under
    negative ones. With P = max(a, 0) and N = min(a, 0) (one of them is 0 in each entry), P a_l + N a_u
    is bit for bit the per-entry choice, and the intercepts' sum <P, b_l> + <N, b_u> and its magnitude
    <P, |b_l|> - <N, |b_u|> are two products with [width, 2] matrices in place of three temporaries and
    two reductions; the sum's rounding error is at most gamma_{width + 1} times that magnitude, in any
    summation order."""
    width = flat.shape[-1]
    with np.errstate(all="ignore"):
        # P and N in scratch: at batch 64 the dense A is 32 MB, and fresh temporaries were paged in on
        # every pass
        pos = positive_part(flat, out=scratch("crown.lines.pos", flat.shape))
        neg = negative_part(flat, out=scratch("crown.lines.neg", flat.shape))
        new = np.multiply(pos, a_l[:, None])
        new += np.multiply(neg, a_u[:, None], out=scratch("crown.lines.term", flat.shape))
        both = np.matmul(pos, np.stack([b_l, np.abs(b_l)], axis=-1))
        both += np.matmul(neg, np.stack([b_u, -np.abs(b_u)], axis=-1))
    return new, both[..., 0], both[..., 1] * err_factor(width + 1)
