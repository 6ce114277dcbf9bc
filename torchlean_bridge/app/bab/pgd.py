"""Projected gradient descent on a property's rows, for networks that are chains of affine layers and ReLUs.

Multi-restart PGD (Madry et al., 2018) in plain float64 over the dense chain (``chain.chain_layers``):
from random points of the box (and the box centre), signed gradient steps of the group's worst row
``max_k (c_k . y - d_k)``, projected back onto the box, the step shrinking geometrically. All restarts
run as one batch of matrix products. It only proposes points: every candidate is re-checked by the
caller (float64, float32 and onnxruntime, as every counterexample verify reports).
"""

from __future__ import annotations

import numpy as np

__all__ = ["pgd_candidates", "RESTARTS", "STEPS"]

RESTARTS = 16
STEPS = 30


def _forward(layers, x: np.ndarray) -> tuple[np.ndarray, list]:
    """The chain's output ``[R, outputs]`` at x ``[R, inputs]`` and the ReLU masks for the backward pass."""
    masks = []
    for kind, _, w, b in reversed(layers):
        if kind == "affine":
            x = x @ w.T + b
        else:
            masks.append(x > 0)
            x = np.maximum(x, 0.0)
    return x, masks


def _gradient(layers, masks: list, g: np.ndarray) -> np.ndarray:
    """d(g . y)/dx ``[R, inputs]`` for output weights g ``[R, outputs]``."""
    m = len(masks)
    for kind, _, w, _ in layers:
        if kind == "affine":
            g = g @ w
        else:
            m -= 1
            g = g * masks[m]
    return g


def pgd_candidates(layers, lo: np.ndarray, hi: np.ndarray, c: np.ndarray, d: np.ndarray,
                   rng: np.random.Generator, restarts: int = RESTARTS, steps: int = STEPS) -> np.ndarray:
    """Points ``[R, inputs]`` of the box (flat ``lo``, ``hi``), best first by the worst row's violation."""
    width = hi - lo
    x = lo + rng.random((restarts, lo.size)) * width
    x[0] = 0.5 * (lo + hi)
    step = 0.25
    with np.errstate(all="ignore"):
        for _ in range(steps):
            y, masks = _forward(layers, x)
            viol = y @ c.T - d  # [R, K]
            k = np.argmax(viol, axis=1)
            grad = _gradient(layers, masks, c[k])
            x = np.clip(x - step * width * np.sign(grad), lo, hi)
            step *= 0.85
        y, _ = _forward(layers, x)
        score = np.max(y @ c.T - d, axis=1)
    return x[np.argsort(np.where(np.isfinite(score), score, np.inf))]
