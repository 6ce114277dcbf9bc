"""alpha-CROWN: the ReLU lower slopes optimized per output row, the final bounds computed soundly.

For ``relu(z) >= alpha z`` every alpha in [0, 1] is a valid lower line on the whole real line, so the
slopes are a free choice: CROWN picks them by a rule (slope 1 when the chord is steeper than 1/2),
alpha-CROWN (Xu et al., "Fast and Complete", ICLR 2021) maximizes the bound over them. Here the slopes
are optimized by projected gradient ascent (Adam, as auto_LiRPA: 20 steps, learning rate 0.5) in plain
float64 for every output row and side separately, starting from CROWN's choice; only the heuristic runs
in plain arithmetic. Each row's final bound is then a backward pass of the outward-rounded CROWN
(``crown._Pass``) with that row's slopes, intersected with the CROWN bound, so it is sound and never
looser than CROWN. On a single box the intermediate bounds are optimized too (``alpha_intermediate``).

Sigmoid and tanh are optimized too: any slope s gives a valid lower (upper) line with the rigorous
intercept min (max) of f(z) - s z over the node's input box (``relax.intercepts``), so both slopes are
free in [0, max f' on the box]; the plain pass uses the plain-float extremum, whose derivative in s is
minus the point where it is attained.

Optimized: graphs whose outputs are chains of linear layers, convolutions, ReLUs, sigmoids and tanhs
from the input (MLPs and plain CNNs, input normalizations and reshapes included: ``chain_to_input``);
on other graphs the result is the CROWN bound and says so (``method == "crown"``).
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

import numpy as np


from .chain import ELEMENTWISE_AFFINE, _elementwise_affine, affine_of
from .relax import intercepts, smooth_for

if TYPE_CHECKING:
    from .crown import _Run

__all__ = ["ITERATIONS", "LEARNING_RATE", "chain", "chain_to_input", "optimize_slopes", "with_slopes"]

ITERATIONS = 20
LEARNING_RATE = 0.5
# a smooth node's slope moves by up to this share of its useful range per step (on ERAN's sigmoid
# 6x200 net, 0.02 gave the best bound at 20 steps among 0.01-0.5)
SMOOTH_STEP = 0.02
SMOOTH_OPTIMIZED = frozenset({"sigmoid", "tanh"})  # S-shaped, closed-form points where f' = s
_SNAP = 2.0 ** -60


def chain(run: "_Run", t: int) -> list[tuple[str, int]] | None:
    """``chain_to_input``'s layers."""
    got = chain_to_input(run, t)
    return None if got is None else got[0]


def chain_to_input(run: "_Run", t: int) -> tuple[list[tuple[str, int]], int] | None:
    """The nodes from t down to the graph input as ``[("linear" | "relu" | "smooth" | "scale", id), ...]``
    and the input's id, or None when t's ancestors are not such a chain (one input-dependent parent each:
    linear layers on ``[N, features]`` and convolutions with channel axis 1, as ``chain.affine_of`` gives
    them, relaxed ReLUs, relaxed sigmoids and tanhs (``SMOOTH_OPTIMIZED``), elementwise affine maps by
    constants: an input normalization, ``chain.ELEMENTWISE_AFFINE``) or has none of those activations.
    Reshapes and flattens are skipped: they keep the flat order."""
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
        elif node.kind in SMOOTH_OPTIMIZED and v in run.lines:
            out.append(("smooth", v))
        else:
            return None
        v = node.parents[0]
    return (out, v) if any(kind in ("relu", "smooth") for kind, _ in out) else None


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
            _, w, bias = _elementwise_affine(run.crown, run.graph.nodes[v], v)
            const = const + a @ bias
            saved.append(("scale", v, w, bias))
            a = a * w
        elif kind == "smooth":
            s_l, s_u = alphas[v]
            fn, lo, hi = _smooth_input(run, v)
            g_l, z_l = _plain_extremum(fn, lo[:, None], hi[:, None], s_l, -1)
            g_u, z_u = _plain_extremum(fn, lo[:, None], hi[:, None], s_u, 1)
            pos = a >= 0
            slopes, icpt = np.where(pos, s_l, s_u), np.where(pos, g_l, g_u)
            const = const + (a * icpt).sum(axis=-1)
            saved.append(("smooth", v, pos, a, slopes, icpt, z_l, z_u))
            a = a * slopes
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
        elif item[0] == "smooth":
            # bound += a (s z + b(s)) with b(s) = min (max) of f(z) - s z over the box: b'(s) = -z*(s)
            _, v, pos, a_in, slopes, icpt, z_l, z_u = item
            grads[v] = (np.where(pos, a_in * (grad_a - z_l), 0.0), np.where(pos, 0.0, a_in * (grad_a - z_u)))
            grad_a = grad_a * slopes + icpt
        else:
            _, v, pos, a_in = item
            _, _, a_u, b_u = (x.reshape(x.shape[0], -1) for x in run.lines[v])
            grads[v] = np.where(pos, grad_a * a_in, 0.0)
            grad_a = np.where(pos, grad_a * alphas[v], grad_a * a_u[:, None] + b_u[:, None])
    return bound, grads


def optimize_slopes(run: "_Run", t: int, rows: np.ndarray, iterations: int = ITERATIONS,
                    lr: float = LEARNING_RATE) -> dict | None:
    """Per ReLU on t's chain, lower slopes ``[N, K, units]`` maximizing each row's plain-float bound
    (``rows`` is ``[N, K, outputs of t]``), projected to [0, 1] on unstable units (stable units keep
    their exact slope); per sigmoid or tanh, the pair (lower, upper) of such slopes, in [0, max f' on
    the box]. None when t is not a supported chain or a smooth node's box is not finite."""
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
    # one slope array per key: (ReLU, None), or (smooth node, 0 for the lower slope / 1 for the upper)
    slopes, free, top = {}, {}, {}
    for kind, v in layers:
        if kind == "relu":
            a_l, _, a_u, _ = (x.reshape(n, -1) for x in run.lines[v])
            free[v] = (a_l != a_u)[:, None, :] & np.ones((1, k, 1), dtype=bool)
            slopes[(v, None)] = np.broadcast_to(a_l[:, None, :], (n, k, a_l.shape[1])).copy()
            top[v] = 1.0
        elif kind == "smooth":
            fn, s_lo, s_hi = _smooth_input(run, v)
            if not (np.all(np.isfinite(s_lo)) and np.all(np.isfinite(s_hi))):
                return None
            a_l, _, a_u, _ = (x.reshape(n, -1) for x in run.lines[v])
            free[v] = (s_hi > s_lo)[:, None, :] & np.ones((1, k, 1), dtype=bool)
            for j, x in enumerate((a_l, a_u)):
                slopes[(v, j)] = np.broadcast_to(x[:, None, :], (n, k, x.shape[1])).copy()
            # any slope is valid with its own intercept; useful ones lie in [0, max f' on the box]
            centre = np.clip(0.0, s_lo, s_hi)  # sigmoid and tanh: f' peaks at 0
            top[v] = np.maximum(np.maximum(fn.df_mid(s_lo), fn.df_mid(s_hi)), fn.df_mid(centre))[:, None, :]
    m = {key: np.zeros_like(x) for key, x in slopes.items()}
    s = {key: np.zeros_like(x) for key, x in slopes.items()}
    b1, b2, eps = 0.9, 0.999, 1e-8
    with np.errstate(all="ignore"):
        for step in range(1, iterations + 1):
            run.on_time()
            _, grads = _bound_and_grads(run, layers, rows, _grouped(slopes), c, r)
            for key, value in slopes.items():
                v, j = key
                gr = grads[v] if j is None else grads[v][j]
                gr = np.where(free[v] & np.isfinite(gr), gr, 0.0)
                m[key] = b1 * m[key] + (1 - b1) * gr
                s[key] = b2 * s[key] + (1 - b2) * gr * gr
                # ReLU slopes move by up to lr per step; smooth ones by SMOOTH_STEP of their useful range
                scale = lr if j is None else SMOOTH_STEP * top[v]
                step_v = scale * (m[key] / (1 - b1 ** step)) / (np.sqrt(s[key] / (1 - b2 ** step)) + eps)
                new = np.clip(value + step_v, 0.0, top[v])
                new[new < _SNAP] = 0.0  # any slope in [0, top] is valid: keep subnormal ones out of the products
                slopes[key] = np.where(free[v], new, value)
                s[key][s[key] < _SNAP ** 2] = 0.0
    return _grouped(slopes)


def _grouped(slopes: dict) -> dict:
    """``optimize_slopes``' per-key slopes as its result: a ReLU's array, a smooth node's (lower, upper)."""
    out: dict = {}
    for (v, j), x in slopes.items():
        out[v] = x if j is None else out.get(v, ()) + (x,)
    return out


def with_slopes(run: "_Run", alphas: dict, row: int) -> "_Run":
    """A shallow copy of the run whose optimized nodes have the lines of row ``row``'s slopes."""
    alt = copy.copy(run)
    alt.lines = dict(run.lines)
    for v, a in alphas.items():
        pick = tuple(x[:, row] for x in a) if isinstance(a, tuple) else a[:, row]
        alt.lines[v] = lines_for(run, v, pick, run.lines[v][0].shape[0])
    return alt


def lines_for(run: "_Run", v: int, slopes, m: int) -> tuple:
    """Sound lines of node v for ``m`` samples (the run's box of v's input repeated when the run has one
    sample) with optimized ``slopes`` ``[m, units]``: a ReLU's lower slope (clipped to [0, 1]; its
    intercept is 0, stable units keep their exact lines), or a smooth node's ``(lower, upper)`` slopes with
    rigorous intercepts for them (``relax.intercepts``)."""
    shape = (m,) + tuple(run.lines[v][0].shape[1:])
    rows = lambda x: np.ascontiguousarray(np.broadcast_to(x.reshape(-1, *shape[1:]), shape))  # noqa: E731
    a_l, b_l, a_u, b_u = (rows(x) for x in run.lines[v])
    if not isinstance(slopes, tuple):
        slope = np.where(a_l != a_u, np.clip(slopes.reshape(shape), 0.0, 1.0), a_l)
        return slope, b_l, a_u, b_u
    fn, lo, hi = _smooth_input(run, v)
    lo, hi = (np.ascontiguousarray(np.broadcast_to(x, (m, x.shape[1]))).reshape(-1) for x in (lo, hi))
    s_l, s_u = (np.ascontiguousarray(np.broadcast_to(x, (m, x.shape[-1]))).reshape(-1) for x in slopes)
    c_l, c_u = intercepts(fn, lo, hi, s_l, s_u)
    ok = np.isfinite(c_l) & np.isfinite(c_u)  # else the CROWN line stays
    pick = lambda new, old: np.where(ok, new, old.reshape(-1)).reshape(shape)  # noqa: E731
    return pick(s_l, a_l), pick(c_l, b_l), pick(s_u, a_u), pick(c_u, b_u)


def _smooth_input(run: "_Run", v: int):
    """(the function of smooth node v, its input box ``[N, units]`` flat)."""
    node = run.graph.nodes[v]
    n = run.crown.n
    lo, hi = (np.asarray(x, dtype=np.float64).reshape(n, -1) for x in run.boxes[node.parents[0]])
    return smooth_for(node.kind, node.attrs), lo, hi


def _plain_extremum(fn, lo: np.ndarray, hi: np.ndarray, s: np.ndarray, side: int) -> tuple[np.ndarray, np.ndarray]:
    """Plain-float min (side -1) or max (+1) of g(z) = f(z) - s z over [lo, hi] and where it is: the
    intercept and its derivative's negation. For an S-shaped f the candidates are the ends and the point
    where f'(z) = s on the convex side for a min (g's local minimum there), the concave side for a max;
    f at the ends is evaluated once per unit, not per slope."""
    with np.errstate(all="ignore"):
        d = fn.stationary(s, side < 0)
        d = np.clip(np.where(np.isnan(d), lo, d), lo, hi)
        best_z, best_g = np.broadcast_to(lo, s.shape), fn.f_mid(lo) - s * lo
        for z, g in ((np.broadcast_to(hi, s.shape), fn.f_mid(hi) - s * hi), (d, fn.f_mid(d) - s * d)):
            better = g < best_g if side < 0 else g > best_g
            better |= np.isnan(best_g)
            best_g, best_z = np.where(better, g, best_g), np.where(better, z, best_z)
    return best_g, best_z
