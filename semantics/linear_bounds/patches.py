"""Backward passes in patch form for the intermediate bounds of convolutional layers.

A row of a backward pass from a node of a convolutional network (one entry of a feature map) depends
on each earlier feature map only through a window: its coefficients there are a patch
``[C, Kh, Kw]`` placed at ``(y S - P, x S - P)``, (y, x) the row's position, S and P the stride and
padding accumulated along the way (as auto_LiRPA's patches mode). Carrying patches instead of
whole maps makes a row's cost its receptive field, not the layer size. Cells of a window outside the
map (padding) get coefficient 0: every map is unfolded with zero padding. The rounding is charged as
in ``rules`` (the same error terms, with the maps unfolded like the coefficients).

Used by ``crown`` for targets whose ancestors are convolutions, batch norms, residual additions and
differences, per-channel constant shifts and scales (input normalization) and relaxed elementwise
activations on ``[N, C, H, W]`` maps; any other graph uses the dense pass.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from .. import interval_arith as ia
from ..interval_round import MIN_NORMAL, U, Box, center_radius, down, up
from ..records import PREPARED
from ..rules.affine import batched_conv
from ..scratch import scratch
from ..signed_parts import negative_part, positive_part
from .conv_adjoint import conv_adjoint
from .rules import _ERR_SAFETY, _center, batch_norm_scale_shift, err_factor

if TYPE_CHECKING:
    from .crown import _Run

__all__ = ["patchable", "PatchPass", "PatchMismatch"]

_KINDS = frozenset({"input", "conv", "batch_norm_eval", "add", "sub", "detach"})
_SCALINGS = frozenset({"add", "sub", "mul_elem", "div"})  # with a per-channel constant operand: z = k x + b


def _constant_operand(run: "_Run", node) -> tuple[int, np.ndarray] | None:
    """(the live parent, the constant operand as a ``[1, C, 1, 1]`` array) for an add, sub, mul or div
    of a map by a constant that is the same at every position of every sample (input normalization,
    per-channel scales); None otherwise."""
    const = run.crown.const
    x, y = node.parents
    if const[x] == const[y] or (node.kind == "div" and const[x]):
        return None
    live, operand = (y, x) if const[x] else (x, y)
    lo, hi = run.boxes[operand]
    if not np.array_equal(lo, hi):
        return None
    value = np.broadcast_to(np.asarray(lo, dtype=np.float64), node.out_shape)
    first = value[:1, :, :1, :1]
    if not np.all(value == first) or not np.all(np.isfinite(first)) or (node.kind == "div" and np.any(first == 0)):
        return None
    return live, np.array(first)


def patchable(run: "_Run", t: int) -> bool:
    crown, g = run.crown, run.graph
    if not crown.batched:
        return False
    for v in crown.ancestors(t):
        node = g.nodes[v]
        if crown.const[v]:
            continue
        if len(node.out_shape) != 4:
            return False
        if node.kind in _SCALINGS and any(crown.const[p] for p in node.parents):
            if _constant_operand(run, node) is None:
                return False
        elif node.kind not in _KINDS and v not in run.lines:
            return False
        if node.kind in ("conv", "batch_norm_eval") and node.attrs["channel_axis"] != 1:
            return False
        if v in run.lines and any(crown.const[p] for p in node.parents[:1]):
            return False
    return g.nodes[t].kind != "input"


class PatchPass:
    """Lower bounds of [rows; -rows] of target t for a batch slice, coefficients as patches.

    Coefficients are ``[n, h, rows, C, Kh, Kw]``: h = 2 holds the two halves (rows, -rows); h = 1 says
    the second half is still exactly the negative of the first (no relaxation reached yet), so only
    one is carried and every step before the first relaxation costs half. A patch also records
    whether its cells outside the node's map are zero (``clean``: the start and any relaxation's
    output are), in which case a convolution need not mask them, and an error-weight map still to be
    charged against its absolute values (``pending``: a sum's rounding, charged together with the
    next step's own error terms in one product).

    Per-row sums are ``matmul`` row dot products; the relaxation picks each side's line by the sign
    of the coefficient as ``max(p, 0) a_l + min(p, 0) a_u`` (exact: one term is 0) rather than with
    ``np.where``, which is several times slower on these arrays.
    """

    def __init__(self, run: "_Run", t: int, b0: int, b1: int, rows: np.ndarray) -> None:
        self.run_, self.crown, self.graph = run, run.crown, run.graph
        self.t, self.b0, self.b1 = t, b0, b1
        n = b1 - b0
        c, h, w = self.graph.nodes[t].out_shape[1:]
        r = rows.size
        self.rows = r
        cells, self.inverse = np.unique(rows % (h * w), return_inverse=True)
        # rows that are k channels each at the same P positions, channel-major (a whole map, or whole
        # channels of a part: rows sorted, every channel at every position), read the maps through a
        # broadcast [.., k, P, ..] view of the rows axis (``_grouped``), never gathered once per row:
        # on VNN-COMP's resnet_4b a gather wrote 578 MB for 512 rows at 16 positions
        k = r // max(cells.size, 1)
        tiled = k * cells.size == r and bool(np.array_equal(self.inverse, np.tile(np.arange(cells.size), k)))
        self.tile = k if tiled else None
        self.ys, self.xs = cells // w, cells % w  # the distinct positions of the rows
        p = np.zeros((n, 1, r, c, 1, 1))
        p[:, 0, np.arange(r), rows // (h * w), 0, 0] = 1.0
        self.start = _Patch(p, ((1, 1), (0, 0), (1, 1)), True, None)
        self.beta = np.zeros((n, 2, r))
        self.err = np.zeros((n, 2, r))

    # -- helpers ------------------------------------------------------------------------------

    def _slice(self, x: np.ndarray) -> np.ndarray:
        return x[self.b0:self.b1] if self.crown.n > 1 and x.shape[0] == self.crown.n else x

    def unfold(self, maps: list[np.ndarray], geo, name: str = "patch.unfold") -> list[np.ndarray]:
        """Each map ``[n or 1, C, H, W]`` read through each row's window, flat: ``[n', 1, rows, C Kh Kw]``
        (0 outside the map). The maps are stacked and gathered once, at the distinct positions, into
        the scratch buffer ``name``: the result is a temporary of the calling step."""
        (sy, sx), (py, px), (kh, kw) = geo
        lead = max(m.shape[0] for m in maps)
        h, w = maps[0].shape[2:]
        after_y = max(0, int(self.ys.max()) * sy + kh - h - py)
        after_x = max(0, int(self.xs.max()) * sx + kw - w - px)
        sizes = [m.shape[1] for m in maps]
        padded = np.zeros((lead, sum(sizes), py + h + after_y, px + w + after_x))
        c0 = 0
        for m, size in zip(maps, sizes):
            padded[:, c0:c0 + size, py:py + h, px:px + w] = m
            c0 += size
        win = sliding_window_view(padded, (kh, kw), axis=(2, 3)).transpose(0, 2, 3, 1, 4, 5)
        picked = win[:, self.ys * sy, self.xs * sx]  # [n', positions, C, kh, kw]
        if self.tile is not None:  # [n', 1, 1, positions, C' Kh Kw]: broadcast against _grouped rows
            lead_axes = (lead, 1, 1)
        else:
            picked = np.take(picked, self.inverse, axis=1, out=scratch(name, (lead, self.rows) + picked.shape[2:]))
            lead_axes = (lead, 1)
        out, c0 = [], 0
        for size in sizes:
            part = picked[:, :, c0:c0 + size]
            out.append(part.reshape(lead_axes + (part.shape[1], -1)))
            c0 += size
        return out

    def _grouped(self, x: np.ndarray) -> np.ndarray:
        """A rows-axis array ``[n, h, rows, ...]`` in the shape ``unfold``'s maps broadcast against:
        ``[n, h, k, positions, ...]`` for tiled rows (a view of a contiguous array), else itself."""
        if self.tile is None:
            return x
        return x.reshape(x.shape[:2] + (self.tile, -1) + x.shape[3:])

    def _ungrouped(self, x: np.ndarray) -> np.ndarray:
        """``_grouped``'s inverse: ``[n, h, k, positions, ...]`` back to ``[n, h, rows, ...]``."""
        return x if self.tile is None else x.reshape(x.shape[:2] + (-1,) + x.shape[4:])

    def _dot(self, flat: np.ndarray, map_u: np.ndarray) -> np.ndarray:
        """Per row sums of ``flat`` ``[n, h, rows, F]`` times an unfolded map: ``[n, h, rows]``."""
        return self._ungrouped(_rowdot(self._grouped(flat), map_u))

    def mag(self, v: int) -> np.ndarray:
        return self._slice(self.run_.mag(v))

    def _acc(self, value: np.ndarray | None, error: np.ndarray) -> None:
        """beta += value, err += error per half (a value of one half: the other's is its negative)."""
        with np.errstate(all="ignore"):
            if value is not None:
                if value.shape[1] == 1:
                    value = np.concatenate([value, -value], axis=1)
                self.beta = self.beta + np.where(np.isnan(value), -np.inf, value)
            self.err = up(up(self.err + error) + up(np.abs(self.beta) * (2 * U)) + MIN_NORMAL)

    def _charge(self, abs_p: np.ndarray, weights_u: np.ndarray) -> None:
        """err += <|p|, weights> (weights >= 0 per unit of |coefficient|, computed in floating point)."""
        with np.errstate(all="ignore"):
            e = self._dot(abs_p, weights_u) * ((1.0 + err_factor(abs_p.shape[-1])) * _ERR_SAFETY) + MIN_NORMAL
        self._acc(None, e)

    def _flush(self, item: "_Patch") -> "_Patch":
        """Charge a patch's pending error weights now (before a step that does not take them)."""
        if item.pending is None:
            return item
        flat = _flat(item.p)
        self._charge(np.abs(flat, out=scratch("patch.abs", flat.shape)), self.unfold([item.pending], item.geo)[0])
        return item._replace(pending=None)

    @staticmethod
    def _both(p: np.ndarray) -> np.ndarray:
        return np.concatenate([p, -p], axis=1) if p.shape[1] == 1 else p

    def _merge(self, a: "_Patch", b: "_Patch", mag: np.ndarray) -> "_Patch":
        """Two patches of one node in a common frame (same strides required), summed; the sum's
        rounding (u <|sum|, M> for M bounding the node's values) is left pending."""
        ga, gb = a.geo, b.geo
        if ga[0] != gb[0]:
            raise PatchMismatch
        a, b = self._flush(a), self._flush(b)
        pad = tuple(max(x, y) for x, y in zip(ga[1], gb[1]))
        end = tuple(max(ka - xa, kb - xb) for ka, xa, kb, xb in zip(ga[2], ga[1], gb[2], gb[1]))
        k = tuple(p + e for p, e in zip(pad, end))
        halves = max(a.p.shape[1], b.p.shape[1])
        ps = []
        for item in (a, b):
            patch = self._both(item.p) if halves == 2 else item.p
            oy, ox = pad[0] - item.geo[1][0], pad[1] - item.geo[1][1]
            if (oy, ox) != (0, 0) or tuple(item.geo[2]) != k:
                big = np.zeros(patch.shape[:4] + k)
                big[..., oy:oy + item.geo[2][0], ox:ox + item.geo[2][1]] = patch
                patch = big
            ps.append(patch)
        return _Patch(ps[0] + ps[1], (ga[0], pad, k), a.clean and b.clean, mag * (2.0 * U * _ERR_SAFETY))

    # -- the pass -----------------------------------------------------------------------------

    def run(self) -> tuple[np.ndarray, np.ndarray]:
        g, run = self.graph, self.run_
        coeffs = {self.t: self.start}
        for v in self.crown.ancestors(self.t):
            item = coeffs.pop(v, None)
            if item is None:
                continue
            run.on_time()  # per node: one pass through a deep net can take seconds
            node = g.nodes[v]
            if node.kind == "input":
                self._concretize(v, item)
                continue
            if v in run.lines:
                out = [self._relaxed(v, item)]
            elif node.kind == "conv":
                out = [self._conv(node, item)]
            elif node.kind == "batch_norm_eval":
                out = [self._batch_norm(node, self._flush(item))]
            elif node.kind in _SCALINGS and any(self.crown.const[q] for q in node.parents):
                out = [self._with_constant(node, self._flush(item))]
            elif node.kind == "sub":
                item = self._flush(item)
                out = [(node.parents[0], item), (node.parents[1], item._replace(p=-item.p))]
            else:  # add, detach
                item = self._flush(item)
                out = [(q, item) for q in node.parents]
            for q, val in out:
                coeffs[q] = self._merge(coeffs[q], val, self.mag(q)) if q in coeffs else val
        with np.errstate(all="ignore"):
            low = down(down(self.beta - self.err))
        low = np.where(np.isnan(low), -np.inf, low)
        return low[:, 0], low[:, 1]

    def _concretize(self, v: int, item: "_Patch") -> None:
        """min over the box of <p, x>: <p, c> - <|p|, r>, rounding 2 gamma <|p|, |c| + r>."""
        p, geo = _flat(item.p), item.geo
        lo, hi = (self._slice(x) for x in self.run_.boxes[v])
        c, r = center_radius(lo, hi)
        inf = ~np.isfinite(r)
        r = np.where(inf, 0.0, r)
        weights = (np.abs(c) + r) * (2.0 * err_factor(p.shape[-1] + 1))
        if item.pending is not None:
            weights = weights + item.pending
        maps = [c, r, weights] + ([inf.astype(np.float64)] if inf.any() else [])
        c_u, r_u, w_u, *inf_u = self.unfold(maps, geo)
        ap = np.abs(p, out=scratch("patch.abs", p.shape))
        with np.errstate(all="ignore"):
            pc, ar = self._dot(p, c_u), self._dot(ap, r_u)
            value = pc - ar if p.shape[1] == 2 else np.concatenate([pc - ar, -pc - ar], axis=1)
            if inf_u:
                value = np.where(self._dot(ap, inf_u[0]) > 0, -np.inf, value)
        self._acc(value, np.zeros(value.shape))
        self._charge(ap, w_u)

    def _relaxed(self, v: int, item: "_Patch"):
        """a_l z + b_l <= f(z) <= a_u z + b_u: a coefficient takes the lower line where it is >= 0."""
        parent = self.graph.nodes[v].parents[0]
        a_l, b_l, a_u, b_u = (self._slice(x) for x in self.run_.lines[v])
        if not (np.all(np.isfinite(b_l)) and np.all(np.isfinite(b_u))):
            return self._relaxed_unbounded(v, self._flush(item))
        p = self._both(item.p)
        shape = p.shape
        cells = _cells(p)
        m = self.mag(parent)
        # error weights per unit of |coefficient| on each side: the intercepts' sum and each slope
        # product's rounding (u |a| |z_parent|, twice for safety as in rules)
        f_int, f_slope = err_factor(cells + 1), 2.0 * U * _ERR_SAFETY
        w_l = np.abs(b_l) * f_int + np.abs(a_l) * m * f_slope
        w_u = np.abs(b_u) * f_int + np.abs(a_u) * m * f_slope
        if item.pending is not None:
            w_l, w_u = w_l + item.pending, w_u + item.pending
        has_l, has_u = bool(np.any(b_l)), bool(np.any(b_u))
        maps = [a_l, a_u, w_l, w_u] + [b_l] * has_l + [b_u] * has_u
        al_u, au_u, wl_u, wu_u, *b_us = self.unfold(maps, item.geo)
        flat = _flat(p)
        pp = positive_part(flat, out=scratch("patch.pp", flat.shape))
        pn = negative_part(flat, out=scratch("patch.pn", flat.shape))
        gp, gn = self._grouped(pp), self._grouped(pn)
        new = gp * al_u
        new += np.multiply(gn, au_u, out=scratch("patch.tmp", gn.shape))
        with np.errstate(all="ignore"):
            val = None
            if has_l:
                val = self._dot(pp, b_us[0])
            if has_u:
                on_u = self._dot(pn, b_us[-1])
                val = on_u if val is None else val + on_u
            e = (self._dot(pp, wl_u) - self._dot(pn, wu_u)) * ((1.0 + err_factor(cells)) * _ERR_SAFETY) + MIN_NORMAL
        self._acc(val, e)
        return parent, _Patch(new.reshape(shape), item.geo, True, None)

    def _relaxed_unbounded(self, v: int, item: "_Patch"):
        """The relaxation where some intercept is infinite (a box with an infinite end): each side's
        products taken separately, so that a 0 coefficient never meets an infinite intercept."""
        parent = self.graph.nodes[v].parents[0]
        maps = [self._slice(x) for x in self.run_.lines[v]] + [self.mag(parent)]
        a_l, b_l, a_u, b_u, m_u = self.unfold(maps, item.geo)
        p = self._both(item.p)
        flat = self._grouped(_flat(p))
        pos = flat >= 0
        new = np.where(pos, flat * a_l, flat * a_u)
        with np.errstate(all="ignore"):
            prod = np.where(pos, flat * b_l, flat * b_u)
            val = self._ungrouped(prod.sum(axis=-1))
            e = self._ungrouped(np.abs(prod).sum(axis=-1)) * err_factor(flat.shape[-1] + 1)
        new = self._ungrouped(new)
        self._acc(val, e)
        self._charge(np.abs(new), m_u * (2.0 * U * _ERR_SAFETY))
        return parent, _Patch(new.reshape(p.shape), item.geo, True, None)

    def _conv(self, node, item: "_Patch"):
        parent = node.parents[0]
        params = self.crown.ibp.records[node.id][PREPARED]
        at = node.attrs
        geo = item.geo
        q = batched_conv(self.mag(parent), params.abs_weight, at)
        terms = at["out_channels"] // at["groups"] * math.prod(at["kernel"])
        p = item.p
        cells = _cells(p)
        weights = (np.abs(params.bias.reshape(1, -1, 1, 1)) + q) * err_factor(max(terms, cells) + 1)
        if item.pending is not None:
            weights = weights + item.pending
        maps = [weights] + ([] if item.clean else [np.ones((1, 1) + tuple(node.out_shape[2:]))])
        w_u, *inside = self.unfold(maps, geo)
        if inside:  # cells outside the map do not exist
            p = self._ungrouped(self._grouped(p) * inside[0].reshape(inside[0].shape[:-1] + (1,) + geo[2]))
        with np.errstate(all="ignore"):
            # <p, bias> with p zero outside the map: the bias per channel times the channel's sum
            val = p.reshape(p.shape[:4] + (-1,)).sum(axis=-1) @ params.bias
        self._acc(val, np.zeros(val.shape))
        flat = _flat(p)
        self._charge(np.abs(flat, out=scratch("patch.abs", flat.shape)), w_u)
        kh, kw = geo[2]
        s, d, k = at["stride"], at["dilation"], at["kernel"]
        full = tuple((kk - 1) * st + (ke - 1) * dd + 1 for kk, st, ke, dd in zip((kh, kw), s, k, d))
        lead = p.shape[:3]
        flat = p.reshape((-1,) + p.shape[3:])
        if (kh, kw) == (1, 1) and at["groups"] == 1 and all(dd == 1 for dd in d):
            # a one-cell patch (a pass's first step): its adjoint is one product with W
            weight = params.weight
            back = (flat[:, :, 0, 0] @ weight.reshape(weight.shape[0], -1)).reshape((-1, weight.shape[1]) + full)
        else:
            back = conv_adjoint(flat, params.weight, s, (0, 0), d, at["groups"], full)
        new_geo = (tuple(a * b for a, b in zip(geo[0], s)),
                   tuple(a * b + c for a, b, c in zip(geo[1], s, at["padding"])), full)
        return parent, _Patch(back.reshape(lead + back.shape[1:]), new_geo, False, None)

    def _batch_norm(self, node, item: "_Patch"):
        rec = self.crown.ibp.records[node.id][PREPARED]
        kb = batch_norm_scale_shift(rec, node.attrs["eps"], (1, -1, 1, 1))
        if kb is None:
            raise PatchMismatch
        return self._scale_shift(node, item, node.parents[0], *kb)

    def _with_constant(self, node, item: "_Patch"):
        """x + m, x - m, m - x, x * m, m * x and x / m for a per-channel constant m, as z = k x + b."""
        parent, m = _constant_operand(self.run_, node)
        point = (m, m)
        one = (np.ones_like(m), np.ones_like(m))
        if node.kind == "add":
            return self._scale_shift(node, item, parent, one, point)
        if node.kind == "sub":
            if parent == node.parents[0]:
                return self._scale_shift(node, item, parent, one, (-m, -m))
            return self._scale_shift(node, item, parent, (-one[0], -one[1]), point)
        if node.kind == "mul_elem":
            return self._scale_shift(node, item, parent, point, (np.zeros_like(m), np.zeros_like(m)))
        return self._scale_shift(node, item, parent, ia.inv(point), (np.zeros_like(m), np.zeros_like(m)))

    def _scale_shift(self, node, item: "_Patch", parent: int, k: Box, b: Box):
        """z = k x + b per channel, with k and b known as ``[1, C, 1, 1]`` boxes (their exact values inside)."""
        kc, kr = _center(k)
        bc, br = _center(b)
        shape = (1,) + tuple(node.out_shape[1:])
        p = item.p
        cells = _cells(p)
        m = self.mag(parent)
        # |k - kc| |z|, the product's rounding u |kc| |z|, and the shift's sum and radius
        weights = (np.abs(kr) * m + np.abs(kc) * m * (2.0 * U)) * _ERR_SAFETY \
            + np.abs(bc) * err_factor(cells) + br * _ERR_SAFETY
        b_u, w_u = self.unfold([np.broadcast_to(bc, shape), np.broadcast_to(weights, m.shape)], item.geo)
        new = p * kc.reshape(1, 1, 1, -1, 1, 1)
        flat = _flat(p)
        with np.errstate(all="ignore"):
            val = self._dot(flat, b_u)
        self._acc(val, np.zeros(val.shape))
        self._charge(np.abs(flat), w_u)
        return parent, _Patch(new, item.geo, item.clean, None)


def _flat(p: np.ndarray) -> np.ndarray:
    """A patch array ``[n, h, rows, C, Kh, Kw]`` as ``[n, h, rows, C Kh Kw]`` (a view)."""
    return p.reshape(p.shape[:3] + (-1,))


def _cells(p: np.ndarray) -> int:
    """Coefficients per row of a patch array ``[n, h, rows, C, Kh, Kw]``."""
    return math.prod(p.shape[3:])


def _rowdot(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Per row sums of x * y over the last axis, the leading axes broadcast (a matmul of 1-vectors)."""
    return (x[..., None, :] @ y[..., :, None])[..., 0, 0]


class _Patch(NamedTuple):
    p: np.ndarray
    geo: tuple
    clean: bool
    pending: np.ndarray | None


class PatchMismatch(Exception):
    """The patches of two paths cannot share a frame (different strides): use the dense pass."""
