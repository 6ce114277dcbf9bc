"""alpha-CROWN: the ReLU lower slopes optimized per output row, the final bounds computed soundly.

For ``relu(z) >= alpha z`` every alpha in [0, 1] is a valid lower line on the whole real line, so the
slopes are a free choice: CROWN picks them by a rule (slope 1 when the chord is steeper than 1/2),
alpha-CROWN (Xu et al., "Fast and Complete", ICLR 2021) maximizes the bound over them. Here the slopes
are optimized by projected gradient ascent (Adam, as auto_LiRPA: 20 steps, learning rate 0.5) in plain
float64 for every output row and side separately, starting from CROWN's choice; only the heuristic runs
in plain arithmetic. Each row's final bound is then a backward pass of the outward-rounded CROWN
(``crown._Pass``) with that row's slopes, intersected with the CROWN bound, so it is sound and never
looser than CROWN. The intermediate bounds are CROWN's (auto_LiRPA also optimizes slopes for them).

Optimized: graphs whose outputs are chains of linear layers, convolutions and ReLUs from the input
(MLPs and plain CNNs, input normalizations and reshapes included: ``chain_to_input``); on other graphs
the result is the CROWN bound and says so (``method == "crown"``).
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

import numpy as np


if TYPE_CHECKING:
    from .crown import _Run

__all__ = ["ITERATIONS", "LEARNING_RATE", "chain", "chain_to_input", "optimize_slopes", "with_slopes"]

ITERATIONS = 20
LEARNING_RATE = 0.5
_SNAP = 2.0 ** -60


def chain(run: "_Run", t: int) -> list[tuple[str, int]] | None:
    """``chain_to_input``'s layers."""
    got = chain_to_input(run, t)
    return None if got is None else got[0]


def chain_to_input(run: "_Run", t: int) -> tuple[list[tuple[str, int]], int] | None:
    """The nodes from t down to the graph input as ``[("linear" | "relu" | "scale", id), ...]``, or None
    when t's ancestors are not such a chain (one input-dependent parent each: linear layers on
    ``[N, features]`` and convolutions with channel axis 1, as ``chain.affine_of`` gives them, relaxed
    ReLUs, elementwise affine maps by constants: an input normalization, ``chain.ELEMENTWISE_AFFINE``).
    Reshapes and flattens are skipped: they keep the flat order."""
    from .chain import ELEMENTWISE_AFFINE, _elementwise_affine
    crown, g = run.crown, run.graph
    if not crown.batched:
        return None
    out, v = [], t
    while g.nodes[v].kind != "input":
        node = g.nodes[v]
        if crown.const[v]:
            return None
        if node.kind in ("reshape", "flatten"):
            v = node.parents[0]
            continue
        if node.kind in ELEMENTWISE_AFFINE:
            got = _elementwise_affine(crown, node, v)
            if got is None:
                return None
            out.append(("scale", v))
            v = got[0]
            continue
        if node.kind in ("linear", "conv"):
            if any(not crown.const[q] for q in node.parents[1:]) or affine_of(crown, v) is None:
                return None
            out.append(("linear", v))
        elif node.kind == "relu" and v in run.lines:
            out.append(("relu", v))
        else:
            return None
        v = node.parents[0]
    return (out, v) if any(kind == "relu" for kind, _ in out) else None


def affine_of(crown, v: int):
    """``chain.affine_of`` (imported late: chain imports crown, which imports this module)."""
    from .chain import affine_of as get
    return get(crown, v)


def _bound_and_grads(run: "_Run", layers, rows: np.ndarray, alphas: dict[int, np.ndarray], c: np.ndarray,
                     r: np.ndarray) -> tuple[np.ndarray, dict[int, np.ndarray]]:
    """Plain-float CROWN lower bounds of ``rows`` ([N, K, outputs]) with lower slopes ``alphas``
    ([N, K, units] per ReLU) and their gradients with respect to the slopes."""
    a = rows
    const = np.zeros(rows.shape[:2])
    saved = []
    for kind, v in layers:
        if kind == "linear":
            w, bias = affine_of(run.crown, v)
            const = const + a @ bias
            saved.append(("linear", v, w, bias))
            a = a @ w
        elif kind == "scale":
            from .chain import _elementwise_affine
            _, w, bias = _elementwise_affine(run.crown, run.graph.nodes[v], v)
            const = const + a @ bias
            saved.append(("scale", v, w, bias))
            a = a * w
        else:
            _, _, a_u, b_u = (x.reshape(x.shape[0], -1) for x in run.lines[v])
            pos = a >= 0
            slopes = np.where(pos, alphas[v], a_u[:, None])
            const = const + np.einsum("nku,nu->nk", np.where(pos, 0.0, a), b_u)
            saved.append(("relu", v, pos, a))
            a = a * slopes
    bound = const + np.einsum("nki,ni->nk", a, c) - np.einsum("nki,ni->nk", np.abs(a), r)
    grad_a = c[:, None, :] - np.sign(a) * r[:, None, :]
    grads: dict[int, np.ndarray] = {}
    for item in reversed(saved):
        if item[0] == "linear":
            _, v, w, bias = item
            grad_a = grad_a @ w.T + bias
        elif item[0] == "scale":
            _, v, w, bias = item
            grad_a = grad_a * w + bias
        else:
            _, v, pos, a_in = item
            _, _, a_u, b_u = (x.reshape(x.shape[0], -1) for x in run.lines[v])
            grads[v] = np.where(pos, grad_a * a_in, 0.0)
            grad_a = np.where(pos, grad_a * alphas[v], grad_a * a_u[:, None] + b_u[:, None])
    return bound, grads


def optimize_slopes(run: "_Run", t: int, rows: np.ndarray, iterations: int = ITERATIONS,
                    lr: float = LEARNING_RATE) -> dict[int, np.ndarray] | None:
    """Per ReLU on t's chain, lower slopes ``[N, K, units]`` maximizing each row's plain-float bound
    (``rows`` is ``[N, K, outputs of t]``), projected to [0, 1] on unstable units (stable units keep
    their exact slope). None when t is not a supported chain."""
    got = chain_to_input(run, t)
    if got is None:
        return None
    layers, inp = got
    lo, hi = run.boxes[inp]
    n = lo.shape[0]
    lo, hi = lo.reshape(n, -1), hi.reshape(n, -1)
    if not (np.all(np.isfinite(lo)) and np.all(np.isfinite(hi))):
        return None
    c, r = (lo + hi) * 0.5, (hi - lo) * 0.5
    k = rows.shape[1]
    alphas, free = {}, {}
    for kind, v in layers:
        if kind == "relu":
            a_l, _, a_u, _ = (x.reshape(n, -1) for x in run.lines[v])
            free[v] = (a_l != a_u)[:, None, :] & np.ones((1, k, 1), dtype=bool)
            alphas[v] = np.broadcast_to(a_l[:, None, :], (n, k, a_l.shape[1])).copy()
    m = {v: np.zeros_like(x) for v, x in alphas.items()}
    s = {v: np.zeros_like(x) for v, x in alphas.items()}
    b1, b2, eps = 0.9, 0.999, 1e-8
    with np.errstate(all="ignore"):
        for step in range(1, iterations + 1):
            run.on_time()
            _, grads = _bound_and_grads(run, layers, rows, alphas, c, r)
            for v, gr in grads.items():
                gr = np.where(free[v] & np.isfinite(gr), gr, 0.0)
                m[v] = b1 * m[v] + (1 - b1) * gr
                s[v] = b2 * s[v] + (1 - b2) * gr * gr
                step_v = lr * (m[v] / (1 - b1 ** step)) / (np.sqrt(s[v] / (1 - b2 ** step)) + eps)
                new = np.clip(alphas[v] + step_v, 0.0, 1.0)
                new[new < _SNAP] = 0.0  # any slope in [0, 1] is valid: keep subnormal ones out of the products
                alphas[v] = np.where(free[v], new, alphas[v])
                s[v][s[v] < _SNAP ** 2] = 0.0
    return alphas


def with_slopes(run: "_Run", alphas: dict[int, np.ndarray], row: int) -> "_Run":
    """A shallow copy of the run whose ReLU lower lines have the slopes ``alphas[v][:, row]``."""
    alt = copy.copy(run)
    alt.lines = dict(run.lines)
    for v, a in alphas.items():
        a_l, b_l, a_u, b_u = run.lines[v]
        slope = np.clip(a[:, row], 0.0, 1.0).reshape(a_l.shape)  # b_l is 0 wherever a_l != a_u
        alt.lines[v] = (slope, b_l, a_u, b_u)
    return alt
