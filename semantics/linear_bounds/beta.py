"""beta-CROWN: the split constraints of a subdomain as Lagrangian terms, optimized with alpha.

On a subdomain a ReLU fixed active has ``z >= 0`` and one fixed inactive ``z <= 0``, so for any
``beta >= 0`` the minimum of ``f`` over the subdomain is at least the minimum of
``f + sum_j beta_j sigma_j z_j`` (``sigma = -1`` active, ``+1`` inactive; each added term is <= 0 there).
In the backward pass the term adds ``beta_j sigma_j`` to the coefficient of ``z_j`` (Wang et al.,
"Beta-CROWN", NeurIPS 2021). Here beta and the free ReLUs' lower slopes (alpha) are optimized per
subdomain and row by projected Adam steps in plain float32 (``PLAIN_DTYPE``: the bound's gradient
through the DAG of affine layers, elementwise affine maps, adds, ReLUs and max pools,
``chain.dag_layers``); only the heuristic runs in plain arithmetic. A subdomain's children start from
its optimized values (``warm``, alpha-beta-CROWN's warm start) and take fewer steps.

The final bound is a sound backward pass of the outward-rounded CROWN (``crown._Pass``) in which the
beta term is carried by the fixed unit's lines, for the coefficient ``a`` the plain pass found at the
ReLU's output: ``a relu(z) + beta sigma z = (a + beta sigma) z`` on the active side, ``beta sigma z`` on the
inactive side. So an active unit takes the slope ``1 - beta / a`` on the side its coefficient selects
(a lower line ``s z`` with ``s <= 1`` or an upper line with ``s >= 1``: both hold for ``relu`` on
``z >= 0``), an inactive one ``beta / a`` (a lower line with ``s >= 0`` or an upper line with ``s <= 0``,
valid on ``z <= 0``). A leaky ReLU with slope ``q`` below 0 is the same with ``q + beta / a`` on the
inactive side (``s >= q`` below, ``s <= q`` above, on ``z <= 0``) and its free lower slopes in
``[q, 1]``. The plain pass runs over the DAG of ``chain.dag_layers`` (residual adds and max pools
included). Every such line holds on the subdomain whatever the sound pass's own coefficient,
so the bound is sound for any beta; it is intersected with CROWN's, never looser.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Callable

import numpy as np

from ..rules.affine import rows_matmul
from ..signed_parts import negative_part, positive_part
from .chain import ConvOperator

if TYPE_CHECKING:
    from .crown import _Run

__all__ = ["ITERATIONS", "WARM_ITERATIONS", "LR_ALPHA", "LR_BETA", "PLAIN_DTYPE", "Slopes", "beta_bounds",
           "plain_array"]

# per ReLU node: alpha (lower slopes) and beta (multipliers), each ``[N, K, units]``
Slopes = dict[int, tuple[np.ndarray, np.ndarray]]

ITERATIONS = 20
# steps from a warm start (a parent's slopes). On 7 VNN-COMP 2021 MNIST 256x2/256x4 instances that
# alpha-beta-CROWN proved in 15-80 s, at 30 s on 2 loaded cores: cold 20 steps proved 3, warm 20 steps 4,
# warm 8 steps 5 (256x2 prop_3 in 27.7 s, 256x4 prop_0 in 27.4 s), warm 4 steps 4
WARM_ITERATIONS = 8
LR_ALPHA = 0.5
LR_BETA = 0.05
_TINY = 1e-12  # a plain coefficient this small gets no beta term (its slope would be huge)
_SNAP = 2.0 ** -60
_MAX_WARM_BETA = 1e6  # a warm start's beta is capped (a stored value may have overflowed to inf)
# the heuristic's arithmetic: the plain passes and Adam find slopes and multipliers, the sound pass
# bounds with whatever they found, so float32 (half the memory traffic of the backward and gradient
# passes) costs only how well they are found
PLAIN_DTYPE = np.float32


def plain_array(x):
    """An array or operator (``chain.ConvOperator``) in ``PLAIN_DTYPE``; anything else as it is."""
    if isinstance(x, np.ndarray):
        return x.astype(PLAIN_DTYPE) if x.dtype.kind == "f" else x
    return x.astype(PLAIN_DTYPE) if isinstance(x, ConvOperator) else x


def _plain(upper, pools, layers, inp: int, rows, alphas, betas, sigma, c, r, on_time: Callable[[], None]):
    """Plain-float lower bounds ``[N, K]`` of ``rows`` through the DAG ``layers`` (``chain.dag_layers``),
    the gradients for alpha and beta (reverse mode over the backward pass: each node's gradient from its
    parents', in increasing id), and the coefficient at each ReLU's output and at the input. ``upper``:
    per ReLU its upper lines' slopes and intercepts ``[N, units]``; ``pools``: ``_Run.pools``. ``on_time``
    is called at every node of both passes: one of them takes seconds on a CIFAR ResNet's batch of
    subdomains, and the deadline must not wait for it."""
    n, k = rows.shape[:2]
    coeff = {layers[0][1]: rows}
    const = np.zeros((n, k), rows.dtype)
    seen = []
    for kind, v, parents, weight, bias in layers:
        a = coeff.pop(v, None)
        if a is None:
            continue
        on_time()
        if kind == "affine":
            const = const + rows_matmul(a, bias)
            outs = [(parents[0], rows_matmul(a, weight))]
        elif kind == "scale":
            const = const + rows_matmul(a, bias)
            outs = [(parents[0], a * weight)]
        elif kind in ("add", "sub"):
            outs = [(parents[0], a), (parents[1], a if kind == "add" else -a)]
        elif kind == "identity":
            outs = [(parents[0], a)]
        elif kind == "relu":
            a_u, b_u = upper[v]
            # the slope and intercept each coefficient's sign selects, by products with a 0/1 mask: the same
            # values as np.where, whose branch per entry mispredicts on mixed signs (7x the time here)
            lower_side = (a >= 0).astype(rows.dtype)
            upper_side = 1.0 - lower_side
            slope = alphas[v] * lower_side
            slope += a_u[:, None] * upper_side
            const = const + np.einsum("nku,nu->nk", negative_part(a), b_u)
            outs = [(parents[0], a * slope + betas[v] * sigma[v])]
            a = (a, slope, b_u[:, None] * upper_side)
        else:  # max_pool: max >= x_j*; max <= x_j* where j* decides the window, else <= the largest upper end
            jstar, decided, umax, cells = pools[v]
            lead = jstar.shape[1]
            a4 = a.reshape(n, k, lead, -1)
            to_cell = (a4 >= 0) | decided[:, None]
            const = const + np.where(to_cell, 0.0, a4 * umax[:, None]).reshape(n, k, -1).sum(axis=-1)
            moved = np.zeros((n, k, lead, int(cells)), rows.dtype)
            ni, ki, li = np.ix_(np.arange(n), np.arange(k), np.arange(lead))
            np.add.at(moved, (ni[..., None], ki[..., None], li[..., None], jstar[:, None]), np.where(to_cell, a4, 0.0))
            outs = [(parents[0], moved.reshape(n, k, -1))]
            a = (a, to_cell)
        seen.append((kind, v, parents, weight, bias, a))
        for p, ap in outs:
            coeff[p] = coeff[p] + ap if p in coeff else ap
    a_in = coeff.get(inp, np.zeros((n, k, c.shape[1]), rows.dtype))
    bound = const + np.einsum("nki,ni->nk", a_in, c) - np.einsum("nki,ni->nk", np.abs(a_in), r)
    grads = {inp: c[:, None, :] - np.sign(a_in) * r[:, None, :]}
    at_out = {"input": a_in}
    g_alpha, g_beta = {}, {}
    for kind, v, parents, weight, bias, a in reversed(seen):
        on_time()
        gp = [grads[p] for p in parents]
        if kind == "affine":
            grads[v] = rows_matmul(gp[0], weight.T) + bias
        elif kind == "scale":
            grads[v] = gp[0] * weight + bias
        elif kind in ("add", "sub"):
            grads[v] = gp[0] + gp[1] if kind == "add" else gp[0] - gp[1]
        elif kind == "identity":
            grads[v] = gp[0]
        elif kind == "relu":
            a, slope, shift = a
            at_out[v] = a
            g_beta[v] = gp[0] * sigma[v]
            g_alpha[v] = gp[0] * positive_part(a)  # 0 where a < 0 (NaN where gp is not finite: Adam drops it)
            grads[v] = gp[0] * slope + shift
        else:
            jstar, decided, umax, _ = pools[v]
            a, to_cell = a
            lead = jstar.shape[1]
            g4 = gp[0].reshape(n, k, lead, -1)
            picked = np.take_along_axis(g4, np.broadcast_to(jstar[:, None], (n, k) + jstar.shape[1:]), axis=-1)
            grads[v] = np.where(to_cell, picked, umax[:, None]).reshape(n, k, -1)
    return bound, g_alpha, g_beta, at_out


def beta_bounds(run: "_Run", t: int, c: np.ndarray, split_of: dict[int, np.ndarray],
                iterations: int | None = None, warm: Slopes | None = None
                ) -> tuple[np.ndarray, np.ndarray, Slopes] | None:
    """Sound lower bounds ``[N, K]`` of the rows ``c`` of t with optimized alpha and beta, the input
    points ``[N, K, inputs]`` (flat) minimizing each row's plain linear bound over the box (where a
    counterexample is most likely: attack candidates), and the optimized slopes (``Slopes``, to start
    the subdomain's children from); None when t's graph is not a DAG of affine layers, adds, (leaky)
    ReLUs and max pools (``chain.dag_layers``) with a ReLU. ``split_of`` maps a split node to its codes
    ``[N, units]`` (for a ReLU +1 active, -1 inactive).

    ``warm``: slopes to start from (a parent subdomain's, as alpha-beta-CROWN warm-starts its
    children; NaN where there are none): alpha where the unit is free here, beta where it is fixed
    here, each projected on its valid range; the other units start as without ``warm``. The bound is
    sound whatever the start (see the module note), so a start only changes how tight it gets.
    ``iterations``: Adam steps, by default ``WARM_ITERATIONS`` with ``warm`` and ``ITERATIONS`` without."""
    if iterations is None:
        iterations = ITERATIONS if warm is None else WARM_ITERATIONS
    from .crown import _Pass
    from .chain import dag_layers
    got = dag_layers(run.crown, t)
    if got is None or not any(kind == "relu" for kind, *_ in got[0]) or any(
            kind == "relu" and v not in run.lines or kind == "max_pool" and v not in run.pools
            for kind, v, *_ in got[0]):
        return None
    layers, inp = got
    lo, hi = run.boxes[inp]
    n = lo.shape[0]
    lo, hi = lo.reshape(n, -1), hi.reshape(n, -1)
    if not (np.all(np.isfinite(lo)) and np.all(np.isfinite(hi))):
        return None
    cx, rx = plain_array((lo + hi) * 0.5), plain_array((hi - lo) * 0.5)
    k = c.shape[0]
    rows = np.broadcast_to(plain_array(c)[None], (n, k, c.shape[1]))
    plain_layers = [(kind, v, parents, plain_array(w), plain_array(b)) for kind, v, parents, w, b in layers]
    upper = {v: tuple(plain_array(x.reshape(n, -1)) for x in run.lines[v][2:]) for kind, v, *_ in layers
             if kind == "relu"}
    pools = {v: (j, decided, plain_array(umax), cells) for v, (j, decided, umax, cells) in run.pools.items()}
    alphas, free, betas, sigma, fixed, floor = {}, {}, {}, {}, {}, {}
    for kind, v, _, slope_below, _ in layers:
        if kind != "relu":
            continue
        floor[v] = slope_below  # a lower line s z is valid on the whole line for s in [slope below 0, 1]
        a_l, _, a_u, _ = (x.reshape(n, -1) for x in run.lines[v])
        units = a_l.shape[1]
        free[v] = np.broadcast_to(((a_l != a_u))[:, None, :], (n, k, units))
        alphas[v] = np.broadcast_to(plain_array(a_l)[:, None, :], (n, k, units)).copy()
        s = split_of.get(v)
        s = np.zeros((n, units), dtype=np.int8) if s is None else s.reshape(n, units)
        sigma[v] = np.broadcast_to(np.where(s > 0, -1.0, np.where(s < 0, 1.0, 0.0)).astype(PLAIN_DTYPE)[:, None, :],
                                   (n, k, units))
        fixed[v] = sigma[v] != 0
        betas[v] = np.zeros((n, k, units), PLAIN_DTYPE)
        start = None if warm is None else warm.get(v)
        if start is not None:
            w_alpha, w_beta = (np.asarray(x, dtype=PLAIN_DTYPE).reshape(n, k, units) for x in start)
            take = free[v] & np.isfinite(w_alpha)
            alphas[v] = np.where(take, np.clip(np.where(take, w_alpha, 0.0), floor[v], 1.0), alphas[v])
            take = fixed[v] & np.isfinite(w_beta)
            betas[v] = np.where(take, np.clip(np.where(take, w_beta, 0.0), 0.0, _MAX_WARM_BETA), 0.0)
    # Adam's moments live only at the entries each step may change: alpha at the free units, beta at the
    # fixed ones (a subdomain's splits: a few per row, where dense updates swept every unit of every row)
    # (as flat indices: a take and a put cost a third of indexing by the tuple of nonzero's index arrays)
    at = {("a", v): np.flatnonzero(x) for v, x in free.items()}
    at.update({("b", v): np.flatnonzero(x) for v, x in fixed.items()})
    state = {key: (np.zeros(where.size, PLAIN_DTYPE), np.zeros(where.size, PLAIN_DTYPE)) for key, where in at.items()}
    b1, b2, eps = 0.9, 0.999, 1e-8
    at_out = {}
    with np.errstate(all="ignore"):
        for step in range(1, iterations + 1):
            run.on_time()
            _, g_alpha, g_beta, at_out = _plain(upper, pools, plain_layers, inp, rows, alphas, betas, sigma, cx, rx,
                                                run.on_time)
            for key, grads, values, lr in (("a", g_alpha, alphas, LR_ALPHA), ("b", g_beta, betas, LR_BETA)):
                for v, gr in grads.items():
                    where = at[(key, v)]
                    lim = (floor[v], 1.0) if key == "a" else (0.0, np.inf)
                    gr = np.ravel(gr).take(where)
                    gr = np.where(np.isfinite(gr), gr, 0.0)
                    m, s2 = state[(key, v)]
                    m = b1 * m + (1 - b1) * gr
                    s2 = b2 * s2 + (1 - b2) * gr * gr
                    s2[s2 < _SNAP ** 2] = 0.0
                    state[(key, v)] = (m, s2)
                    new = np.clip(values[v].take(where) + lr * (m / (1 - b1 ** step)) / (np.sqrt(s2 / (1 - b2 ** step))
                                                                                     + eps), *lim)
                    new[(new < _SNAP) & (lim[0] == 0.0)] = 0.0
                    values[v].put(where, new)
        _, _, _, at_out = _plain(upper, pools, plain_layers, inp, rows, alphas, betas, sigma, cx, rx, run.on_time)
    points = np.where(at_out["input"] > 0, lo[:, None, :], hi[:, None, :])
    lower = np.empty((n, k))
    for j in range(k):
        run.on_time()
        alt = copy.copy(run)
        alt.lines = dict(run.lines)
        for v in alphas:
            a_l, b_l, a_u, b_u = run.lines[v]
            shape = a_l.shape
            a = at_out[v][:, j]
            beta, sig = betas[v][:, j], sigma[v][:, j]
            use = (sig != 0) & (beta > 0) & (np.abs(a) > _TINY)
            with np.errstate(all="ignore"):
                plain = np.where(sig < 0, a, floor[v] * a)  # a f(z) on the fixed side: a z or a q z
                slope = np.where(use, (plain + beta * sig) / np.where(use, a, 1.0), 0.0)
            new_l = a_l.reshape(n, -1).copy()
            new_u = a_u.reshape(n, -1).copy()
            free_j = free[v][:, j]
            new_l = np.where(free_j, np.clip(alphas[v][:, j], floor[v], 1.0), new_l)
            # the beta line on the side the plain coefficient selects (both sides hold on the subdomain),
            # held to the side of the fixed piece's slope p where it is valid whatever the rounding of
            # plain + beta sigma (for a leaky ReLU fl(q a) + beta can land below q a): on z >= 0 a lower
            # line needs s <= 1 and an upper one s >= 1, on z <= 0 a lower line s >= q, an upper one s <= q
            p = np.where(sig < 0, 1.0, floor[v])
            below = np.where(sig < 0, np.minimum(slope, p), np.maximum(slope, p))
            above = np.where(sig < 0, np.maximum(slope, p), np.minimum(slope, p))
            new_l = np.where(use & (a > 0), below, new_l)
            new_u = np.where(use & (a < 0), above, new_u)
            alt.lines[v] = (new_l.reshape(shape), b_l, new_u.reshape(shape), b_u)
        low, _ = _Pass(alt, t, 0, n, spec=c[j:j + 1]).run()
        lower[:, j] = low[:, 0]
    return lower, points, {v: (alphas[v], betas[v]) for v in alphas}
