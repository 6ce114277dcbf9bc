"""Projected gradient descent on a property's rows, for networks of affine layers, adds, (leaky) ReLUs and max pools.

Multi-restart PGD (Madry et al., 2018) in plain float64 over the dense DAG (``chain.dag_layers``: MLPs,
CNNs, residual blocks, pooling): from random points of the box (and the box centre), Adam steps on the
group's worst row ``max_k (c_k . y - d_k)`` (alpha-beta-CROWN's attack: step one eighth of the box's
widest side, decaying 2% a step), projected back onto the box. A restart that stops moving (pinned in a
corner by the projection) starts again from a random point, its best point kept. All restarts run as
one batch of matrix products. Signed steps with a shrinking step, before, settled in one local optimum
on ACAS Xu 1_9 prop_7 (worst row +0.0006 from 10,000 restarts); these reach -0.0001 from 2,000 restarts
in 30 steps. It only proposes points: every candidate is re-checked by the caller (float64, float32
and onnxruntime, as every counterexample verify reports).
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np

__all__ = ["pgd_candidates", "Dag", "RESTARTS", "STEPS", "ROOT_MACS", "ROOT_VALUES", "MAX_RESTARTS"]

RESTARTS = 16
STEPS = 30
_BETA1, _BETA2, _DECAY = 0.9, 0.999, 0.98  # Adam's moment decays; the step's decay per step
# the attack on a property's whole box (``Dag.restarts``): about 0.3 s on ACAS Xu (2,500 restarts), 64
# restarts on MNIST 256x6, RESTARTS on a CIFAR ResNet; at most 8M kept values (64 MB)
ROOT_MACS = 2 * 10**9
ROOT_VALUES = 8 << 20
MAX_RESTARTS = 4096


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
        # per point: multiply-adds of a forward pass, and the values it keeps for the backward one (with the
        # point itself and its Adam moments)
        self.macs = sum(_macs(w) for kind, _, _, w, _ in self.layers if kind == "affine")
        self.values = (sum(math.prod(g.nodes[v].out_shape[1:]) for _, v, *_ in self.layers)
                       + 4 * math.prod(g.nodes[self.input].out_shape[1:]))

    def restarts(self, macs: int = ROOT_MACS, values: int = ROOT_VALUES, steps: int = STEPS) -> int:
        """Restarts that spend about ``macs`` multiply-adds in ``steps`` forward and backward passes and
        keep at most ``values`` float64 values of a pass: at least RESTARTS, at most MAX_RESTARTS."""
        fit = min(macs // (2 * steps * max(self.macs, 1)), values // max(self.values, 1))
        return int(min(MAX_RESTARTS, max(RESTARTS, fit)))

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


def _macs(weight: Any) -> int:
    """Multiply-adds of one point through an affine layer: a dense matrix's entries, or a ``ConvOperator``'s
    kernel entries at each position of its larger side (an upper estimate)."""
    if isinstance(weight, np.ndarray):
        return weight.size
    return weight.weight.size * max(math.prod(weight.tail_in[1:]), math.prod(weight.tail_out[1:]))


def pgd_candidates(dag: Dag, lo: np.ndarray, hi: np.ndarray, c: np.ndarray, d: np.ndarray,
                   rng: np.random.Generator, restarts: int = RESTARTS, steps: int = STEPS,
                   deadline: float | None = None) -> np.ndarray:
    """Each restart's best point ``[R, inputs]`` of the box (flat ``lo``, ``hi``), best first by the worst
    row's violation; the steps stop past ``deadline`` (``time.perf_counter``; on VNN-COMP's collins_rul_cnn
    a step takes 0.4 s: 30 of them ran 12 s past a 10 s limit)."""
    width = hi - lo
    x = lo + rng.random((restarts, lo.size)) * width
    x[0] = 0.5 * (lo + hi)
    rows = np.arange(restarts)
    lr = 0.125 * float(np.max(width, initial=0.0))
    moment, second = np.zeros_like(x), np.zeros_like(x)
    best_x, best = x.copy(), np.full(restarts, np.inf)
    with np.errstate(all="ignore"):
        for t in range(1, steps + 2):
            y, keep = dag.forward(x)
            viol = y @ c.T - d  # [R, K]
            k = np.argmax(viol, axis=1)
            score = viol[rows, k]
            better = score < best  # NaN never is
            best[better], best_x[better] = score[better], x[better]
            if t > steps or (deadline is not None and time.perf_counter() > deadline):
                break
            grad = dag.gradient(keep, c[k])
            moment += (1.0 - _BETA1) * (grad - moment)
            second += (1.0 - _BETA2) * (grad * grad - second)
            step = (lr * _DECAY ** t / (1.0 - _BETA1 ** t)) * moment / (np.sqrt(second / (1.0 - _BETA2 ** t)) + 1e-12)
            moved = np.clip(x - step, lo, hi)
            stuck = np.all(moved == x, axis=1)
            if np.any(stuck):
                moved[stuck] = lo + rng.random((int(stuck.sum()), lo.size)) * width
                moment[stuck], second[stuck] = 0.0, 0.0
            x = moved
    return best_x[np.argsort(np.where(np.isfinite(best), best, np.inf), kind="stable")]
