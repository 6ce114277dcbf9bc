"""Backward rules of the linear-bound domain: how a node passes its coefficients to its parents.

A backward pass keeps, for every node v it reached, coefficients ``A_v`` of shape
``[N, rows] + tail(v)`` (N the batch, ``tail`` the node's shape without the batch axis) such that
``target >= sum_v <A_v, z_v> + beta - err`` for every input in the box, row by row (the driver bounds
``-target`` the same way for the upper bounds). A rule replaces ``<A_v, z_v>`` by an expression in
v's parents. Linear ops are exact up to floating point: the computed ``A_p = fl(T(A_v))`` differs
from the exact adjoint by at most ``gamma_n |T|(|A_v|)`` (Higham's order-independent dot-product
bound), and its effect on the bound is at most ``gamma_n <|A_v|, |L|(M_p)>``, where ``|L|`` is the
forward map with absolute weights and ``M_p`` bounds ``|z_p|`` from p's box. So every rule costs its
adjoint product plus one matrix-vector product for the error term, never a second big product.

Rules are keyed by op kind (``BACKWARD``); each returns ``[(parent id, A_p), ...]`` and adds its
constant term and rounding error through ``Pass.add``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable

import numpy as np

from .. import interval_arith as ia
from ..conv import avg_pool_divisor, conv_nd, conv_transpose_nd, pool_nd, pool_out_spatial
from ..interval_round import U, Box, down, gamma, up
from ..rules.affine import batched_conv, rows_matmul
from ..signed_parts import negative_part, positive_part
from .conv_adjoint import conv_adjoint

if TYPE_CHECKING:
    from .crown import Pass

__all__ = ["BACKWARD", "Rule"]

Rule = Callable[["Pass", object, np.ndarray], list]
BACKWARD: dict[str, Rule] = {}

# relative growth allowed for an error term computed in floating point from non-negative terms
_ERR_SAFETY = 1.0 + 64 * U


def rule(*kinds: str):
    def deco(fn: Rule) -> Rule:
        for k in kinds:
            BACKWARD[k] = fn
        return fn
    return deco


def err_factor(n: int) -> float:
    """gamma_n, inflated so that it also covers the rounding of the error term's own computation."""
    g = gamma(n)
    return g * (1.0 + 2 * gamma(n)) * _ERR_SAFETY


# -- shape ops (exact: coefficients are only moved) ---------------------------------------------


@rule("detach")
def _identity(ps: "Pass", node, a: np.ndarray) -> list:
    return [(node.parents[0], a)]


@rule("reshape", "flatten", "squeeze", "unsqueeze")
def _reshape(ps, node, a):
    p = node.parents[0]
    return [(p, a.reshape(a.shape[:2] + ps.tail(p)))]


@rule("permute", "transpose")
def _permute(ps, node, a):
    rank = len(node.out_shape)
    if node.kind == "permute":
        perm = list(node.attrs["perm"])
    else:
        perm = list(range(rank))
        i, j = node.attrs["axis1"], node.attrs["axis2"]
        perm[i], perm[j] = perm[j], perm[i]
    inverse = np.argsort(perm)
    axes = [0, 1] + [ps.axis(int(x)) for x in inverse] if not ps.batched else \
        [0, 1] + [int(x) + 1 for x in inverse[1:]]
    return [(node.parents[0], a.transpose(axes))]


@rule("concat")
def _concat(ps, node, a):
    ax = ps.axis(node.attrs["axis"])
    out, start = [], 0
    for p in node.parents:
        size = ps.tail(p)[ax - 2]
        out.append((p, a[(slice(None),) * ax + (slice(start, start + size),)]))
        start += size
    return out


@rule("slice")
def _slice(ps, node, a):
    p = node.parents[0]
    grown = np.zeros(a.shape[:2] + ps.tail(p))
    index = [slice(None)] * grown.ndim
    for ax, st, en, sp in zip(*(node.attrs[k] for k in ("axes", "starts", "ends", "steps"))):
        index[ps.axis(ax)] = slice(st, en, sp)
    grown[tuple(index)] = a
    return [(p, grown)]


@rule("pad")
def _pad(ps, node, a):
    p = node.parents[0]
    before, after = node.attrs["pads_before"], node.attrs["pads_after"]
    rank = len(node.out_shape)
    keep = [slice(None)] * a.ndim
    for ax in range(rank):
        if ps.batched and ax == 0:
            continue
        keep[ps.axis(ax)] = slice(before[ax], a.shape[ps.axis(ax)] - after[ax])
    inner = a[tuple(keep)]
    value = float(node.attrs["value"])
    if value != 0.0:
        mask = np.ones(ps.tail(node.id))
        mask[tuple(keep[2:])] = 0.0
        ps.add_dot(a, np.broadcast_to(mask * value, (1,) + mask.shape), None, mask.size)
    return [(p, inner)]


@rule("broadcast_to", "expand")
def _broadcast(ps, node, a):
    """Sum over the broadcast axes: gamma_k <|A|, M_v> covers the rounding of the sums."""
    p = node.parents[0]
    src = ps.tail(p)
    lead = len(ps.tail(node.id)) - len(src)
    axes = tuple(range(2, 2 + lead)) + tuple(2 + lead + i for i, s in enumerate(src)
                                              if s == 1 and a.shape[2 + lead + i] != 1)
    if not axes:
        return [(p, a.reshape(a.shape[:2] + src))]
    k = math.prod(a.shape[x] for x in axes)
    ps.add_abs_err(a, ps.mag(node.id), err_factor(k))
    return [(p, a.sum(axis=axes).reshape(a.shape[:2] + src))]

# -- affine ops -------------------------------------------------------------------------------


def _nonzero_columns(a: np.ndarray) -> np.ndarray | None:
    """Indices of the last axis where some coefficient is nonzero, when that skips a quarter or more."""
    live = np.flatnonzero(np.any(a.reshape(-1, a.shape[-1]) != 0, axis=0))
    return live if live.size < 0.75 * a.shape[-1] else None


@rule("linear")
def _linear(ps, node, a):
    p = node.parents[0]
    w, abs_w, bias = ps.affine(node)
    out = w.shape[0]
    q = rows_matmul(ps.mag(p), abs_w.T)  # |W| M_p: bounds |W z_p| entrywise
    n = max(out, ps.numel(node.id)) + 1
    ps.add_dot(a, np.broadcast_to(bias, q.shape), q, n)
    live = ps.live.pop(node.id, None) if ps.live.get(node.id) is not None else _nonzero_columns(a)
    if a.shape[0] * a.shape[1] < 32:  # a few rows: multiplying the whole W beats gathering its rows
        live = None
    a_live, w_live = (a, w) if live is None else (a[..., live], w[live])
    paired = _paired_product(ps, a_live, w_live, q if live is None else q[..., live], p, n)
    return [(p, paired if paired is not None else rows_matmul(a_live, w_live))]


def _paired_product(ps, a: np.ndarray, w: np.ndarray, q: np.ndarray, parent: int, n: int) -> np.ndarray | None:
    """[X; Y] @ W as [X W; -(X W) + (X + Y) W] when X + Y is zero on most columns.

    A pass bounds rows [C; -C] together, and the halves stay negatives of each other except on the
    columns where a relaxation chose different lines for the two signs (the unstable units): there
    the sum is sparse, and one product of the narrow part replaces the second full product. The
    upper half then carries the errors of both products and of the subtraction:
    gamma <|X| + |X + Y|, q> + u <|result|, M_p>.
    """
    rows = a.shape[1]
    if rows % 2 or a.shape[0] * rows < 32 or a.shape[-1] == 0:  # a few rows: one whole product is cheaper
        return None
    r = rows // 2
    x, y = a[:, :r], a[:, r:]
    total = x + y
    cols = np.flatnonzero(np.any(total.reshape(-1, total.shape[-1]) != 0, axis=0))
    if cols.size > 0.6 * a.shape[-1]:
        return None
    top = rows_matmul(x, w)
    bottom = rows_matmul(total[..., cols], w[cols]) - top
    e = ps.dot(np.abs(x), q) + ps.dot(np.abs(total[..., cols]), q[..., cols])
    ps.add_row_err(slice(r, rows), e * err_factor(n) * (1.0 + err_factor(ps.numel_a(a))))
    m = ps.mag(parent)
    e2 = ps.dot(np.abs(bottom), m) * (2.0 * U * _ERR_SAFETY * (1.0 + err_factor(ps.numel_a(bottom))))
    ps.add_row_err(slice(r, rows), e2)
    return np.concatenate([top, bottom], axis=1)


@rule("matmul")
def _matmul(ps, node, a):
    """A product with one constant operand (the other's box is a point); else no rule (IBP box)."""
    x, y = node.parents
    if ps.is_const(y) and not ps.is_const(x):
        b = ps.const_value(y)
        if b is None or b.ndim != 2 or len(ps.graph.nodes[x].out_shape) < 2:
            return None
        q = ps.mag(x) @ np.abs(b)
        ps.add_abs_err(a, q, err_factor(b.shape[0] + 1))
        return [(x, a @ b.T)]
    if ps.is_const(x) and not ps.is_const(y):
        b = ps.const_value(x)
        if b is None or b.ndim != 2 or len(ps.graph.nodes[y].out_shape) < (3 if ps.batched else 2):
            return None
        q = np.abs(b) @ ps.mag(y)
        ps.add_abs_err(a, q, err_factor(b.shape[1] + 1))
        return [(y, b.T @ a)]
    if not ps.is_const(x) and not ps.is_const(y):
        return _mccormick_matmul(ps, node, a)
    return None


def _geometry(node, out_spatial):
    a = node.attrs
    return dict(channel_axis=1, stride=a["stride"], padding=a["padding"], dilation=a["dilation"], groups=a["groups"],
                out_spatial=tuple(out_spatial))


@rule("conv")
def _conv(ps, node, a):
    p = node.parents[0]
    w, abs_w, bias = ps.affine(node)
    at = node.attrs
    ca = at["channel_axis"]
    in_shape, out_shape = ps.graph.nodes[p].out_shape, node.out_shape
    m = ps.mag_value(p)
    q = batched_conv(m.reshape((-1,) + m.shape[ca:]), abs_w, at).reshape(m.shape[:ca] + tuple(out_shape[ca:]))
    b = np.broadcast_to(bias.reshape((-1,) + (1,) * (len(out_shape) - ca - 1)), q.shape)
    terms = at["out_channels"] // at["groups"] * math.prod(at["kernel"])
    ps.add_dot(a, ps.internal(b), ps.internal(q), max(terms, ps.numel(node.id)) + 1)
    flat = a.reshape((-1,) + tuple(out_shape[ca:]))
    back = conv_adjoint(flat, w, at["stride"], at["padding"], at["dilation"], at["groups"], tuple(in_shape[ca + 1:]))
    return [(p, back.reshape(a.shape[:2] + ps.tail(p)))]


@rule("conv_transpose")
def _conv_transpose(ps, node, a):
    p = node.parents[0]
    w, abs_w, bias = ps.affine(node)
    at = node.attrs
    ca = at["channel_axis"]
    in_shape, out_shape = ps.graph.nodes[p].out_shape, node.out_shape
    geo = _geometry(node, out_shape[ca + 1:])
    geo["channel_axis"] = ca
    q = conv_transpose_nd(ps.mag_value(p), abs_w, np.zeros(at["out_channels"]), **geo)
    b = np.broadcast_to(bias.reshape((-1,) + (1,) * (len(out_shape) - ca - 1)), q.shape)
    terms = at["in_channels"] // at["groups"] * math.prod(at["kernel"])
    ps.add_dot(a, ps.internal(b), ps.internal(q), max(terms, ps.numel(node.id)) + 1)
    flat = a.reshape((-1,) + tuple(out_shape[ca:]))
    # the adjoint of a transposed convolution is the convolution with the same weight; cells of the
    # uncropped output past its end read nothing, so the padding after makes every window fit
    spatial_in = in_shape[ca + 1:]
    after = [max(0, (i - 1) * s + (k - 1) * d + 1 - pb - o) for i, s, k, d, pb, o in
             zip(spatial_in, at["stride"], at["kernel"], at["dilation"], at["padding"], out_shape[ca + 1:])]
    back = conv_nd(flat, w, np.zeros(at["in_channels"]), channel_axis=1, stride=at["stride"], padding=at["padding"],
                   padding_after=after, dilation=at["dilation"], groups=at["groups"], out_spatial=tuple(spatial_in))
    return [(p, back.reshape(a.shape[:2] + ps.tail(p)))]


def _scale_rule(ps, node, a, parent: int, k: Box, b: Box | None) -> list:
    """z = k * z_p + b entrywise with k, b known only as boxes (batch norm, constants, divisions)."""
    c, r = _center(k)
    new = a * ps.internal(c)[:, None]
    err_vec = ps.internal(r) if np.any(r) else None
    m = ps.mag(parent)
    if err_vec is not None:
        ps.add_abs_err(a, err_vec * m, _ERR_SAFETY)
    ps.add_abs_err(new, m, 2.0 * U * _ERR_SAFETY)
    if b is not None:
        bc, br = _center(b)
        ps.add_dot(a, ps.internal(np.broadcast_to(bc, node.out_shape)), None, ps.numel(node.id),
                   radius=ps.internal(np.broadcast_to(br, node.out_shape)))
    return [(parent, new)]


def _center(k: Box) -> Box:
    lo, hi = (np.asarray(x, dtype=np.float64) for x in k)
    c = lo * 0.5 + hi * 0.5
    with np.errstate(all="ignore"):
        r = np.maximum(hi - c, c - lo)
        r = np.where(r > 0, r * (1.0 + 4 * U) + 2.0 ** -1070, 0.0)
    return c, r



def batch_norm_scale_shift(rec, eps: float, channel_shape: tuple[int, ...]) -> tuple[Box, Box] | None:
    """Outward-rounded boxes around eval batch norm's per-channel scale ``w / sqrt(var + eps)`` and
    shift ``b - mean * scale``, shaped ``channel_shape``; None when the denominator's box reaches 0."""
    ch = lambda v: np.asarray(v, dtype=np.float64).reshape(channel_shape)  # noqa: E731
    var = np.maximum(ch(rec.running_var), 0.0)
    v_lo, v_hi = ia.add_const((var, var), eps)
    with np.errstate(all="ignore"):
        den = np.maximum(down(np.sqrt(np.maximum(v_lo, 0.0))), 0.0), up(np.sqrt(v_hi))
    if np.any(den[0] <= 0):
        return None
    k = ia.div(ia.point(ch(rec.weight)), den)
    return k, ia.sub(ia.point(ch(rec.bias)), ia.mul(ia.point(ch(rec.running_mean)), k))

@rule("batch_norm_eval")
def _batch_norm(ps, node, a):
    p = node.parents[0]
    ax, rank = node.attrs["channel_axis"], len(node.out_shape)
    kb = batch_norm_scale_shift(ps.batch_norm(node), node.attrs["eps"], (-1,) + (1,) * (rank - ax - 1))
    if kb is None:
        return None
    k, b = kb
    full = lambda box: (np.broadcast_to(box[0], node.out_shape), np.broadcast_to(box[1], node.out_shape))  # noqa
    return _scale_rule(ps, node, a, p, full(k), full(b))


@rule("neg")
def _neg(ps, node, a):
    return [(node.parents[0], -a)]


@rule("add", "sub")
def _add(ps, node, a):
    x, y = node.parents
    out = []
    for p, sign in ((x, 1.0), (y, 1.0 if node.kind == "add" else -1.0)):
        if ps.is_const(p):
            ps.concretize(p, a if sign > 0 else -a)
        else:
            out.append((p, a if sign > 0 else -a))
    return out


@rule("mul_elem", "div")
def _mul(ps, node, a):
    x, y = node.parents
    if node.kind == "div":
        if not ps.is_const(y) or ps.is_const(x):
            return None
        box = ps.box_value(y)
        if np.any(ia.contains_zero(box)):
            return None
        return _scale_rule(ps, node, a, x, ia.inv(box), None)
    if ps.is_const(y) and not ps.is_const(x):
        return _scale_rule(ps, node, a, x, ps.box_value(y), None)
    if ps.is_const(x) and not ps.is_const(y):
        return _scale_rule(ps, node, a, y, ps.box_value(x), None)
    if not ps.is_const(x) and not ps.is_const(y):
        return _mccormick_mul(ps, node, a)
    return None


@rule("avg_pool", "avg_pool_nd")
def _avg_pool(ps, node, a):
    p = node.parents[0]
    at = node.attrs
    r = at["spatial_rank"]
    in_shape, out_shape = ps.graph.nodes[p].out_shape, node.out_shape
    out_sp, in_sp = pool_out_spatial(out_shape, r), tuple(in_shape[len(in_shape) - r:])
    if node.kind == "avg_pool":
        divisor = np.full(out_sp, float(math.prod(at["kernel"])))
        dil, after = (1,) * r, at["padding"]
    else:
        divisor = avg_pool_divisor(at, in_sp, out_sp).astype(np.float64)
        dil, after = at["dilation"], at["padding_after"]
        if np.any(divisor == 0):
            return None
    geometry = dict(kernel=at["kernel"], stride=at["stride"], padding=at["padding"], padding_after=after,
                    dilation=dil, out_spatial=out_sp)
    sums = pool_nd(ps.mag_value(p), mode="avg", divisor=1.0, **geometry)
    q = sums / divisor
    scaled = a / divisor
    ps.add_abs_err(a, ps.internal(q), err_factor(math.prod(at["kernel"]) + 2))
    flat = scaled.reshape((-1, 1) + out_sp)
    ones = np.ones((1, 1) + tuple(at["kernel"]))
    back = conv_adjoint(flat, ones, at["stride"], at["padding"], dil, 1, in_sp)
    return [(p, back.reshape(a.shape[:2] + ps.tail(p)))]


# -- reductions and products of two computed operands ------------------------------------------


@rule("reduce_sum", "reduce_mean")
def _reduce(ps, node, a):
    """The sum's adjoint copies each coefficient along the removed axis (exact); the mean's divides
    it by the extent, each entry rounded once: u <|A_p|, M_p> covers that."""
    p = node.parents[0]
    if ps.batched and node.attrs["axis"] == 0:
        return None
    ax = ps.axis(node.attrs["axis"])
    tail = ps.tail(p)
    new = np.ascontiguousarray(np.broadcast_to(np.expand_dims(a, ax), a.shape[:2] + tail))
    if node.kind == "reduce_mean":
        new = new / float(tail[ax - 2])
        ps.add_abs_err(new, ps.mag(p), 2.0 * U * _ERR_SAFETY)
    return [(p, new)]


def _finite_boxes(ps, *nodes: int) -> list[Box] | None:
    boxes = [ps.box(v) for v in nodes]
    if all(np.all(np.isfinite(lo)) and np.all(np.isfinite(hi)) for lo, hi in boxes):
        return boxes
    return None


def _mccormick_mul(ps, node, a):
    """z = x y elementwise, both computed, x in [lx, ux], y in [ly, uy]: McCormick's planes
    z >= ly x + lx y - lx ly (rows' nonnegative coefficients) and z <= uy x + lx y - lx uy (negative
    ones), exact for the real product on the box. Each new coefficient is one rounded product
    (u <|A_p|, M_p>); the constants lx ly, lx uy round once each (u |.|, in add_dot's q)."""
    x, y = node.parents
    boxes = _finite_boxes(ps, x, y)
    if boxes is None or tuple(ps.tail(x)) != tuple(ps.tail(y)):
        return None
    (lx, _), (ly, uy) = boxes
    pos, neg = positive_part(a), negative_part(a)
    a_x = pos * ly[:, None] + neg * uy[:, None]
    a_y = a * lx[:, None]
    ps.add_abs_err(a_x, ps.mag(x), 2.0 * U * _ERR_SAFETY)
    ps.add_abs_err(a_y, ps.mag(y), 2.0 * U * _ERR_SAFETY)
    numel = ps.numel(node.id) + 1
    for part, c in ((pos, lx * ly), (neg, lx * uy)):
        ps.add_dot(part, -c, np.abs(c) * (2.0 * U), numel)
    return [(x, a_x), (y, a_y)]


def _mccormick_matmul(ps, node, a):
    """Z = X Y with both operands computed: McCormick's planes on each product X_ij Y_jk, summed over
    the contraction, are matrix products: the lower bound's rows A take
    A_X = A+ ly^T + A- uy^T, A_Y = lx^T A and the constant -<A+, lx ly> - <A-, lx uy>.
    Rounding: A_X's entries are 2K-term sums, A_Y's I-term sums, each at most
    gamma <|A|, M_X M_Y> in effect; lx ly and lx uy are J-term sums, charged through add_dot's q."""
    x, y = node.parents
    tx, ty = ps.tail(x), ps.tail(y)
    if len(tx) < 2 or len(tx) != len(ty) or tx[:-2] != ty[:-2]:
        return None
    boxes = _finite_boxes(ps, x, y)
    if boxes is None:
        return None
    (lx, _), (ly, uy) = boxes
    i_, j_, k_ = tx[-2], tx[-1], ty[-1]
    pos, neg = positive_part(a), negative_part(a)
    sw = lambda m: np.swapaxes(m, -1, -2)[:, None]  # noqa: E731  [n, 1, ..., K, J] (or [.., J, I])
    with np.errstate(all="ignore"):
        a_x = pos @ sw(ly) + neg @ sw(uy)
        a_y = sw(lx) @ a
        q = (ps.mag(x) @ ps.mag(y)) * (1.0 + err_factor(j_ + 1))
        ps.add_abs_err(a, q, 2.0 * err_factor(max(2 * k_ + 1, i_) + 1))
        n = max(j_, ps.numel(node.id)) + 1
        abs_lx = np.abs(lx)
        for part, yb in ((pos, ly), (neg, uy)):
            c = lx @ yb
            ps.add_dot(part, -c, (abs_lx @ np.abs(yb)) * (1.0 + err_factor(j_ + 1)), n)
    return [(x, a_x), (y, a_y)]
