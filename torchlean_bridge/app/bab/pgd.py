"""Projected gradient descent on a property's rows, for networks of affine layers, adds, (leaky) ReLUs and max pools.

Multi-restart PGD (Madry et al., 2018) in plain float64 over the dense DAG (``chain.dag_layers``: MLPs,
CNNs, residual blocks, pooling): from random points of the box (and the box centre), signed gradient
steps of the group's worst row ``max_k (c_k . y - d_k)``, projected back onto the box, the step
shrinking geometrically. All restarts run as one batch of matrix products. It only proposes points:
every candidate is re-checked by the caller (float64, float32 and onnxruntime, as every
counterexample verify reports).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

__all__ = ["pgd_candidates", "Dag", "RESTARTS", "STEPS"]

RESTARTS = 16
STEPS = 30


class Dag:
    """A network's DAG (``chain.dag_layers``) with its pools' window tables, for plain forward and
    backward passes over a batch of points ``[R, inputs]``; None-free: build it only where
    ``dag_layers`` gives a DAG."""

    def __init__(self, crown: Any, dag: tuple[list, int]) -> None:
        from semantics.linear_bounds.pieces import pool_geometry
        self.layers, self.input = dag
        self.output = self.layers[0][1]
        g = crown.graph
        self.pools = {v: pool_geometry(crown, g.nodes[v]) for kind, v, *_ in self.layers if kind == "max_pool"}

    def forward(self, x: np.ndarray) -> tuple[np.ndarray, dict[int, np.ndarray]]:
        """The output ``[R, outputs]`` at x and what the backward pass needs (ReLU masks, pool argmaxes)."""
        vals, keep = {self.input: x}, {}
        for kind, v, parents, w, b in reversed(self.layers):
            z = vals[parents[0]]
            if kind == "affine":
                vals[v] = z @ w.T + b
            elif kind == "scale":
                vals[v] = z * w + b
            elif kind == "identity":
                vals[v] = z
            elif kind in ("add", "sub"):
                vals[v] = z + vals[parents[1]] if kind == "add" else z - vals[parents[1]]
            elif kind == "relu":
                keep[v] = z > 0
                vals[v] = np.where(keep[v], z, w * z)
            else:
                idx, valid, lead, cells = self.pools[v]
                win = np.where(valid, z.reshape(z.shape[0], lead, cells)[..., idx], -np.inf)
                keep[v] = np.take_along_axis(np.broadcast_to(idx, win.shape), np.argmax(win, axis=-1)[..., None],
                                             axis=-1)[..., 0]
                vals[v] = win.max(axis=-1).reshape(z.shape[0], -1)
        return vals[self.output], keep

    def gradient(self, keep: dict[int, np.ndarray], g: np.ndarray) -> np.ndarray:
        """d(g . y)/dx ``[R, inputs]`` for output weights g ``[R, outputs]``."""
        grads = {self.output: g}
        for kind, v, parents, w, _ in self.layers:
            gv = grads.pop(v, None)
            if gv is None:
                continue
            if kind == "affine":
                outs = [(parents[0], gv @ w)]
            elif kind == "scale":
                outs = [(parents[0], gv * w)]
            elif kind == "identity":
                outs = [(parents[0], gv)]
            elif kind in ("add", "sub"):
                outs = [(parents[0], gv), (parents[1], gv if kind == "add" else -gv)]
            elif kind == "relu":
                outs = [(parents[0], gv * np.where(keep[v], 1.0, w))]
            else:
                _, _, lead, cells = self.pools[v]
                r = gv.shape[0]
                back = np.zeros((r, lead, cells))
                ri, li = np.ix_(np.arange(r), np.arange(lead))
                np.add.at(back, (ri[..., None], li[..., None], keep[v]), gv.reshape(r, lead, -1))
                outs = [(parents[0], back.reshape(r, -1))]
            for p, gp in outs:
                grads[p] = grads[p] + gp if p in grads else gp
        return grads.get(self.input, np.zeros((g.shape[0], 0)))


def pgd_candidates(dag: Dag, lo: np.ndarray, hi: np.ndarray, c: np.ndarray, d: np.ndarray,
                   rng: np.random.Generator, restarts: int = RESTARTS, steps: int = STEPS,
                   deadline: float | None = None) -> np.ndarray:
    """Points ``[R, inputs]`` of the box (flat ``lo``, ``hi``), best first by the worst row's violation;
    past ``deadline`` (``time.perf_counter``) the steps stop and the points reached so far are ranked (on
    VNN-COMP's collins_rul_cnn a step takes 0.4 s: 30 of them ran 12 s past a 10 s limit)."""
    width = hi - lo
    x = lo + rng.random((restarts, lo.size)) * width
    x[0] = 0.5 * (lo + hi)
    step = 0.25
    with np.errstate(all="ignore"):
        for _ in range(steps):
            if deadline is not None and time.perf_counter() > deadline:
                break
            y, keep = dag.forward(x)
            viol = y @ c.T - d  # [R, K]
            k = np.argmax(viol, axis=1)
            grad = dag.gradient(keep, c[k])
            x = np.clip(x - step * width * np.sign(grad), lo, hi)
            step *= 0.85
        y, _ = dag.forward(x)
        score = np.max(y @ c.T - d, axis=1)
    return x[np.argsort(np.where(np.isfinite(score), score, np.inf))]
