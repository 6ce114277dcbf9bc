"""Sampled containment checks: concrete evaluations must land inside the propagated boxes.

``check_containment`` draws deterministic points of the input box (every corner when there are
few, otherwise random corners; the center; uniform points), evaluates the graph at each in float64
and float32 with the float evaluator, and checks every node's value against its box.

The boxes enclose the *exact real* value. A float evaluation differs from it by rounding, so a
value may leave a tight box by a rounding error (a corner attains the box's end exactly). We allow
``RTOL[dtype] * m`` where m is the node's largest box magnitude: 1e-10 for float64 (far above the
accumulated binary64 error of realistic graphs, far below any rule bug) and 1e-4 for float32
(binary32's 6e-8 unit roundoff accumulated over long chains, plus the rounding of the sample itself
to float32). Integer and bool nodes are compared exactly, in float64 only (a float32 argmax may
legitimately flip on a near tie). Anything beyond the allowance, a NaN, or an evaluation failure at
a point of the box is a counterexample: ``IntervalError`` names the node, the sample and the box.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from torchlean_bridge.errors import BridgeError, IntervalError
from torchlean_bridge.graph import Graph
from torchlean_bridge.ops import BOOL, FLOAT, INT64
from torchlean_bridge.payload import Payload

from .evaluate import evaluate
from .interval import input_boxes, interval_bounds
from .interval_round import Box

__all__ = ["check_containment", "ContainmentReport", "sample_points", "RTOL"]

RTOL = {"float64": 1e-10, "float32": 1e-4}
_ALL_CORNERS_LIMIT = 16  # at most 2**16 corners would be enumerated; beyond, corners are sampled


@dataclass
class ContainmentReport:
    """What was checked and how close to the box edges the samples came."""

    samples: int
    corners: int
    nodes: int
    # per dtype, the largest excursion of a sampled value beyond its exact-real box (0 when every
    # value is inside); only rounding-sized excursions are accepted (see RTOL)
    max_slack: dict[str, float] = field(default_factory=dict)
    tolerance: dict[str, float] = field(default_factory=lambda: dict(RTOL))

    def to_json(self) -> dict[str, Any]:
        return {"ok": True, "samples": self.samples, "corners": self.corners, "nodes": self.nodes,
                "max_slack": self.max_slack, "tolerance": self.tolerance}

    def __str__(self) -> str:
        excess = ", ".join(f"{k} {v:.3g}" for k, v in self.max_slack.items())
        return (f"containment: {self.samples} samples ({self.corners} corners) x {self.nodes} nodes inside "
                f"their boxes; largest excursion beyond a box (rounding allowance): {excess}")


def sample_points(boxes: list[Box], samples: int, seed: int) -> tuple[list[list[np.ndarray]], int]:
    """Deterministic points of the input boxes: corners, the center, uniform points.

    Returns the points (one array per input each) and how many of them are corners.
    """
    rng = np.random.default_rng(seed)
    free = [np.flatnonzero((hi > lo).reshape(-1)) for lo, hi in boxes]
    n_free = sum(len(f) for f in free)
    points: list[list[np.ndarray]] = []

    def corner(bits: np.ndarray) -> list[np.ndarray]:
        out, k = [], 0
        for (lo, hi), idx in zip(boxes, free):
            x = lo.copy().reshape(-1)
            x[idx] = np.where(bits[k:k + len(idx)], hi.reshape(-1)[idx], lo.reshape(-1)[idx])
            k += len(idx)
            out.append(x.reshape(lo.shape))
        return out

    n_corners = max(1, samples // 2)
    if n_free <= _ALL_CORNERS_LIMIT and 2 ** n_free <= n_corners:
        for m in range(2 ** n_free):
            points.append(corner(np.array([(m >> b) & 1 for b in range(n_free)], dtype=bool)))
    else:
        for _ in range(n_corners):
            points.append(corner(rng.random(n_free) < 0.5))
    corners = len(points)
    points.append([lo * 0.5 + hi * 0.5 for lo, hi in boxes])
    while len(points) < max(samples, corners + 1):
        points.append([np.clip(lo + rng.random(lo.shape) * (hi - lo), lo, hi) for lo, hi in boxes])
    return points, corners


def _describe(point: list[np.ndarray], limit: int = 8) -> str:
    parts = []
    for x in point:
        flat = x.reshape(-1)
        body = ", ".join(f"{v:.9g}" for v in flat[:limit])
        parts.append("[" + body + (", ..." if flat.size > limit else "") + "]")
    return parts[0] if len(parts) == 1 else "(" + ", ".join(parts) + ")"


def _typed(x: np.ndarray, dtype: str) -> np.ndarray:
    return x.astype(bool) if dtype == BOOL else x.astype(np.int64) if dtype == INT64 else x


def check_containment(g: Graph, payload: Payload | None, lower: Any, upper: Any, samples: int = 50,
                      seed: int = 0, boxes: list[Box] | None = None) -> ContainmentReport:
    """Evaluate sampled inputs in float64 and float32 and check every node against its box.

    ``boxes`` may pass precomputed ``interval_bounds`` (the CLI prints them first).
    """
    if samples < 1:
        raise IntervalError(f"containment: samples must be >= 1, got {samples}")
    seeds = input_boxes(g, lower, upper)
    if boxes is None:
        boxes = interval_bounds(g, payload, lower, upper)
    in_boxes = [seeds[nid] for nid in g.inputs]
    points, corners = sample_points(in_boxes, samples, seed)
    scale = [max(float(np.max(np.abs(lo), initial=0.0)), float(np.max(np.abs(hi), initial=0.0)))
             for lo, hi in boxes]
    excess = {"float64": 0.0, "float32": 0.0}
    for k, point in enumerate(points):
        inputs = [_typed(x, g.nodes[nid].dtype) for nid, x in zip(g.inputs, point)]
        for dtype in ("float64", "float32"):
            try:
                values = evaluate(g, payload, inputs, dtype=dtype, all_nodes=True)
            except BridgeError as e:
                raise IntervalError(f"containment: sample {k} {_describe(point)} is inside the input box but "
                                    f"{dtype} evaluation fails: {e}", node=e.node, op=e.op) from None
            for node in g.nodes:
                if node.dtype != FLOAT and dtype == "float32":
                    continue
                lo, hi = boxes[node.id]
                v = np.asarray(values[node.id], dtype=np.float64)
                allow = 0.0 if node.dtype != FLOAT else RTOL[dtype] * scale[node.id]
                with np.errstate(invalid="ignore"):
                    beyond = np.maximum(lo - v, v - hi)
                bad = np.isnan(v) | (beyond > allow)
                if np.any(bad):
                    i = int(np.flatnonzero(bad.reshape(-1))[0])
                    raise IntervalError(
                        f"containment: node {node.id} ({node.kind}): {dtype} sample {k} gives "
                        f"{v.reshape(-1)[i]!r} at flat index {i}, outside the box "
                        f"[{lo.reshape(-1)[i]!r}, {hi.reshape(-1)[i]!r}] (allowance {allow:.3g}); "
                        f"sample input: {_describe(point)}", node=node.id, op=node.kind)
                if beyond.size:
                    excess[dtype] = max(excess[dtype], float(np.max(beyond, initial=0.0)))
    return ContainmentReport(samples=len(points), corners=corners, nodes=len(g.nodes), max_slack=excess)
