"""Backward passes in patch form for the intermediate bounds of convolutional layers.

A row of a backward pass from a node of a convolutional network (one entry of a feature map) depends
on each earlier feature map only through a window: its coefficients there are a patch
``[C, Kh, Kw]`` placed at ``(y S - P, x S - P)``, (y, x) the row's position, S and P the stride and
padding accumulated along the way (as auto_LiRPA's patches mode). Carrying patches instead of
whole maps makes a row's cost its receptive field, not the layer size. Cells of a window outside the
map (padding) get coefficient 0: every map is unfolded with zero padding. The rounding is charged as
in ``rules`` (the same error terms, with the maps unfolded like the coefficients).

Used by ``crown`` for targets whose ancestors are convolutions, batch norms, residual additions and
relaxed elementwise activations on ``[N, C, H, W]`` maps; any other graph uses the dense pass.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..interval_round import MIN_NORMAL, U, center_radius, down, up
from ..rules.affine import batched_conv
from .rules import _ERR_SAFETY, _center, batch_norm_scale_shift, conv_adjoint, err_factor

if TYPE_CHECKING:
    from .crown import _Run

__all__ = ["patchable", "PatchPass", "PatchMismatch"]

_KINDS = frozenset({"input", "conv", "batch_norm_eval", "add", "detach"})


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
        if node.kind not in _KINDS and v not in run.lines:
            return False
        if node.kind in ("conv", "batch_norm_eval") and node.attrs["channel_axis"] != 1:
            return False
        if node.kind == "add" and any(crown.const[p] for p in node.parents):
            return False
        if v in run.lines and any(crown.const[p] for p in node.parents[:1]):
            return False
    return g.nodes[t].kind != "input"


class PatchPass:
    """Lower bounds of [rows; -rows] of target t for a batch slice, coefficients as patches."""

    def __init__(self, run: "_Run", t: int, b0: int, b1: int, rows: np.ndarray) -> None:
        self.run_, self.crown, self.graph = run, run.crown, run.graph
        self.t, self.b0, self.b1 = t, b0, b1
        n = b1 - b0
        c, h, w = self.graph.nodes[t].out_shape[1:]
        r = rows.size
        self.rows = r
        both = np.concatenate([rows, rows])
        self.ys, self.xs = (both // w) % h, both % w
        p = np.zeros((n, 2 * r, c, 1, 1))
        p[:, np.arange(r), rows // (h * w), 0, 0] = 1.0
        p[:, r + np.arange(r), rows // (h * w), 0, 0] = -1.0
        self.start = p, ((1, 1), (0, 0), (1, 1))
        self.beta = np.zeros((n, 2 * r))
        self.err = np.zeros((n, 2 * r))

    # -- helpers ------------------------------------------------------------------------------

    def _slice(self, x: np.ndarray) -> np.ndarray:
        return x[self.b0:self.b1] if self.crown.n > 1 and x.shape[0] == self.crown.n else x

    def unfold(self, m: np.ndarray, geo) -> np.ndarray:
        """``m`` [n or 1, C, H, W] read through each row's window: [n, rows, C, Kh, Kw] (0 outside)."""
        (sy, sx), (py, px), (kh, kw) = geo
        _, _, h, w = m.shape
        after_y = max(0, int(self.ys.max()) * sy + kh - h - py)
        after_x = max(0, int(self.xs.max()) * sx + kw - w - px)
        padded = np.pad(m, ((0, 0), (0, 0), (py, after_y), (px, after_x)))
        win = sliding_window_view(padded, (kh, kw), axis=(2, 3))  # [n, C, H', W', kh, kw]
        picked = win[:, :, self.ys * sy, self.xs * sx]  # [n, C, rows, kh, kw]
        return np.moveaxis(picked, 2, 1)

    def mag(self, v: int) -> np.ndarray:
        return self._slice(self.run_.mag(v))

    def _acc(self, value: np.ndarray, error: np.ndarray) -> None:
        with np.errstate(all="ignore"):
            self.beta = self.beta + value
            self.err = up(up(self.err + error) + up(np.abs(self.beta) * (2 * U)) + MIN_NORMAL)

    @staticmethod
    def _sum(x: np.ndarray) -> np.ndarray:
        return x.reshape(x.shape[0], x.shape[1], -1).sum(axis=-1)

    def _dot(self, p: np.ndarray, vec_u: np.ndarray, err_vec_u: np.ndarray, n_terms: int) -> None:
        with np.errstate(all="ignore"):
            val = self._sum(p * vec_u)
            e = self._sum(np.abs(p) * err_vec_u) * (1.0 + err_factor(n_terms)) + MIN_NORMAL
        self._acc(np.where(np.isnan(val), -np.inf, val), e)

    def _abs_err(self, p: np.ndarray, m_u: np.ndarray, factor: float) -> None:
        with np.errstate(all="ignore"):
            e = self._sum(np.abs(p) * m_u) * (factor * (1.0 + err_factor(p[0, 0].size))) + MIN_NORMAL
        self._acc(np.zeros_like(self.beta), e)

    @staticmethod
    def _align(a, b):
        """Two patches of one node in a common frame (same strides required)."""
        (pa, ga), (pb, gb) = a, b
        if ga[0] != gb[0]:
            raise PatchMismatch
        pad = tuple(max(x, y) for x, y in zip(ga[1], gb[1]))
        end = tuple(max(ka - xa, kb - xb) for ka, xa, kb, xb in zip(ga[2], ga[1], gb[2], gb[1]))
        k = tuple(p + e for p, e in zip(pad, end))
        out = []
        for patch, geo in ((pa, ga), (pb, gb)):
            oy, ox = pad[0] - geo[1][0], pad[1] - geo[1][1]
            if (oy, ox) == (0, 0) and tuple(geo[2]) == k:
                out.append(patch)
                continue
            big = np.zeros(patch.shape[:3] + k)
            big[..., oy:oy + geo[2][0], ox:ox + geo[2][1]] = patch
            out.append(big)
        return out[0], out[1], (ga[0], pad, k)

    # -- the pass -----------------------------------------------------------------------------

    def run(self) -> tuple[np.ndarray, np.ndarray]:
        g, run = self.graph, self.run_
        coeffs = {self.t: self.start}
        for v in self.crown.ancestors(self.t):
            item = coeffs.pop(v, None)
            if item is None:
                continue
            p, geo = item
            node = g.nodes[v]
            if node.kind == "input":
                self._concretize(v, p, geo)
                continue
            if v in run.lines:
                out = [self._relaxed(v, p, geo)]
            elif node.kind == "conv":
                out = [self._conv(node, p, geo)]
            elif node.kind == "batch_norm_eval":
                out = [self._batch_norm(node, p, geo)]
            else:  # add, detach
                out = [(q, (p, geo)) for q in node.parents]
            for q, val in out:
                if q in coeffs:
                    a, b, geo_q = self._align(coeffs[q], val)
                    total = a + b
                    self._abs_err(total, self.unfold(self.mag(q), geo_q), 2.0 * U * _ERR_SAFETY)
                    coeffs[q] = total, geo_q
                else:
                    coeffs[q] = val
        with np.errstate(all="ignore"):
            low = down(down(self.beta - self.err))
        low = np.where(np.isnan(low), -np.inf, low)
        return low[:, :self.rows], low[:, self.rows:]

    def _concretize(self, v: int, p: np.ndarray, geo) -> None:
        lo, hi = (self._slice(x) for x in self.run_.boxes[v])
        c, r = center_radius(lo, hi)
        inf = ~np.isfinite(r)
        r = np.where(inf, 0.0, r)
        c_u, r_u = self.unfold(c, geo), self.unfold(r, geo)
        ap = np.abs(p)
        with np.errstate(all="ignore"):
            value = self._sum(p * c_u) - self._sum(ap * r_u)
            if inf.any():
                value = np.where(self._sum(ap * self.unfold(inf.astype(np.float64), geo)) > 0, -np.inf, value)
            e = self._sum(ap * (np.abs(c_u) + r_u)) * (2.0 * err_factor(p[0, 0].size + 1)) + MIN_NORMAL
        self._acc(value, e)

    def _relaxed(self, v: int, p: np.ndarray, geo):
        a_l, b_l, a_u, b_u = (self.unfold(self._slice(x), geo) for x in self.run_.lines[v])
        parent = self.graph.nodes[v].parents[0]
        pos = p >= 0
        new = np.where(pos, p * a_l, p * a_u)
        with np.errstate(all="ignore"):
            prod = np.where(pos, p * b_l, p * b_u)
            val = self._sum(prod)
            e = self._sum(np.abs(prod)) * err_factor(p[0, 0].size + 1)
        self._acc(np.where(np.isnan(val), -np.inf, val), e)
        self._abs_err(new, self.unfold(self.mag(parent), geo), 2.0 * U * _ERR_SAFETY)
        return parent, (new, geo)

    def _conv(self, node, p: np.ndarray, geo):
        parent = node.parents[0]
        prep = self.crown.ibp.records[node.id]
        from ..records import PREPARED
        params = prep[PREPARED]
        at = node.attrs
        n, rows = p.shape[:2]
        inside = self.unfold(np.ones((1, 1) + tuple(node.out_shape[2:])), geo)
        p = p * inside  # cells outside the map do not exist
        q = batched_conv(self.mag(parent), params.abs_weight, at)
        bias = np.broadcast_to(params.bias.reshape(1, -1, 1, 1), q.shape)
        terms = at["out_channels"] // at["groups"] * math.prod(at["kernel"])
        f = err_factor(max(terms, p[0, 0].size) + 1)
        self._dot(p, self.unfold(bias, geo), self.unfold((np.abs(bias) + q) * f, geo), p[0, 0].size)
        kh, kw = geo[2]
        s, d, k = at["stride"], at["dilation"], at["kernel"]
        full = tuple((kk - 1) * st + (ke - 1) * dd + 1 for kk, st, ke, dd in zip((kh, kw), s, k, d))
        back = conv_adjoint(p.reshape((n * rows,) + p.shape[2:]), params.weight, s, (0, 0), d, at["groups"], full)
        new_geo = (tuple(a * b for a, b in zip(geo[0], s)),
                   tuple(a * b + c for a, b, c in zip(geo[1], s, at["padding"])), full)
        return parent, (back.reshape((n, rows) + back.shape[1:]), new_geo)

    def _batch_norm(self, node, p: np.ndarray, geo):
        from ..records import PREPARED
        rec = self.crown.ibp.records[node.id][PREPARED]
        parent = node.parents[0]
        kb = batch_norm_scale_shift(rec, node.attrs["eps"], (1, -1, 1, 1))
        if kb is None:
            raise PatchMismatch
        k, b = kb
        kc, kr = _center(k)
        bc, br = _center(b)
        shape = (1,) + tuple(node.out_shape[1:])
        m_u = self.unfold(self.mag(parent), geo)
        new = p * kc.reshape(1, 1, -1, 1, 1)
        self._abs_err(p * kr.reshape(1, 1, -1, 1, 1), m_u, _ERR_SAFETY)
        self._abs_err(new, m_u, 2.0 * U * _ERR_SAFETY)
        b_u = self.unfold(np.broadcast_to(bc, shape), geo)
        br_u = self.unfold(np.broadcast_to(br, shape), geo)
        self._dot(p, b_u, err_factor(p[0, 0].size) * np.abs(b_u) + br_u * _ERR_SAFETY, p[0, 0].size)
        return parent, (new, geo)


class PatchMismatch(Exception):
    """The patches of two paths cannot share a frame (different strides): use the dense pass."""
