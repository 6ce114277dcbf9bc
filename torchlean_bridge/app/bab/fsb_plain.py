"""Filtered smart branching's candidate bounds on ReLU chains, in plain float32.

FSB only ranks candidate units: the children of each candidate split are bounded once to see which
split helps most, and only the chosen children are then bounded soundly (beta-CROWN, which is never
looser than CROWN). So the ranking needs no rounding discipline, and the sound CROWN pass it used
(outward rounding, a magnitude product beside every product, float64) cost twice the search's own
bounding: on MNIST 256x2 ``prop_1_0.03`` 51 ms per round of 512 children, 53% of the search.

Here a child is its parent's relaxation with one unit fixed: CROWN's lines from the parent's split
nodes' input boxes (the splits applied), the lower slope by CROWN's rule (1 where ``u > -l``), and the
candidate unit's lines replaced by its piece's (active: ``z``; inactive: ``0``). The children's
bounds are one plain backward pass through the chain (``chain.chain_layers``) in float32, taken in
blocks of at most ``MAX_BLOCK_ENTRIES`` coefficient entries. The bounds are not sound and are used
for nothing but the choice.
"""

from __future__ import annotations

import math

import numpy as np

from semantics.linear_bounds.beta import PLAIN_DTYPE, plain_array
from semantics.rules.affine import rows_matmul
from semantics.scratch import scratch
from semantics.signed_parts import by_sign, negative_part, positive_part

__all__ = ["PlainChain", "MAX_BLOCK_ENTRIES"]

MAX_BLOCK_ENTRIES = 1 << 23  # children x rows x the widest layer per block (32 MiB of coefficients)


class PlainChain:
    """A ReLU chain (``chain.chain_layers``, from the output down) over branch and bound's units
    (``offsets`` per split node of ``nodes``: every ReLU of the chain is one; a split node off the
    output's chain changes no bound here)."""

    def __init__(self, layers, nodes: list[int], offsets: np.ndarray) -> None:
        self.layers = [(kind, v, plain_array(w), plain_array(b)) for kind, v, w, b in layers]
        self.slices = {v: slice(int(offsets[i]), int(offsets[i + 1])) for i, v in enumerate(nodes)}
        widths = [int(offsets[-1])] + [w.shape[-1] if isinstance(w, np.ndarray) else math.prod(w.tail_in)
                                       for kind, _, w, _ in layers if kind == "affine"]  # dense or ConvOperator
        self.width = max(widths)
        self.has_conv = any(kind == "affine" and not isinstance(w, np.ndarray) for kind, _, w, _ in layers)

    @staticmethod
    def lines(lo: np.ndarray, hi: np.ndarray, splits: np.ndarray) -> tuple[np.ndarray, ...]:
        """CROWN's ReLU lines on boxes ``[M, units]`` with split codes: the lower slope, the upper
        slope and the upper intercept, each ``[M, units]`` in float32."""
        active = (splits > 0) | (lo >= 0)
        inactive = ~active & ((splits < 0) | (hi <= 0))
        unstable = ~active & ~inactive
        with np.errstate(all="ignore"):
            chord = np.where(unstable, hi / np.where(unstable, hi - lo, 1.0), 0.0)
        upper = np.where(active, 1.0, chord)
        lower = np.where(active, 1.0, np.where(unstable & (hi > -lo), 1.0, 0.0))
        intercept = np.where(unstable, -lo * chord, 0.0)
        return lower.astype(PLAIN_DTYPE), upper.astype(PLAIN_DTYPE), intercept.astype(PLAIN_DTYPE)

    def child_lower(self, c: np.ndarray, lines: tuple[np.ndarray, ...], units: np.ndarray, in_lo: np.ndarray,
                    in_hi: np.ndarray) -> np.ndarray:
        """Plain lower bounds ``[M, 2, k, K]`` of the rows ``c`` on the children of the candidates
        ``units[i, j]`` of M parents (rows of ``lines``, ``in_lo``, ``in_hi``): child ``[i, 0, j]`` with the
        unit active, ``[i, 1, j]`` inactive. A child's relaxation is its parent's but at its unit, so the
        parent's lines are broadcast and each child's one unit is patched after its ReLU's step."""
        m, k = units.shape
        per = max(1, MAX_BLOCK_ENTRIES // max(1, 2 * k * c.shape[0] * self.width))  # parents per block
        out = np.empty((m, 2, k, c.shape[0]))
        for s in range(0, m, per):
            b = slice(s, min(s + per, m))
            out[b] = self._backward(c, tuple(x[b] for x in lines), units[b], in_lo[b], in_hi[b])
        return out

    def _backward(self, c, lines, units, in_lo, in_hi) -> np.ndarray:
        lower, upper, icpt = lines
        m, k = units.shape
        rows = c.shape[0]
        n = m * 2 * k  # children, in [parent, side, candidate] order
        a = np.broadcast_to(plain_array(c)[None], (n, rows, c.shape[1])).reshape(n * rows, c.shape[1])
        const = np.zeros((m, 2 * k * rows), PLAIN_DTYPE)
        # the coefficients reach 32 MiB a block: they live in reused buffers (fresh ones cost their page
        # faults), the products of consecutive layers in alternate ones
        slot = 0  # the buffer the next product goes to: never the one holding a
        for kind, v, w, b in self.layers:
            if kind == "affine":
                const += rows_matmul(a, b).reshape(m, -1)
                if isinstance(w, np.ndarray) and w.dtype == PLAIN_DTYPE and a.ndim == 2:
                    a = np.matmul(a, w, out=scratch(f"fsb.products{slot}", (a.shape[0], w.shape[1]), PLAIN_DTYPE))
                    slot = 1 - slot
                else:
                    a = rows_matmul(a, w).astype(PLAIN_DTYPE, copy=False)
                continue
            if kind == "scale":
                const += rows_matmul(a, b).reshape(m, -1)
                a = a * w
                continue
            sl = self.slices[v]
            a3 = a.reshape(m, 2 * k * rows, -1)
            # each child's own unit takes its piece's line (z active, 0 inactive) in place of the parent's:
            # its coefficients, read before a3's buffer is reused below
            local = units - sl.start
            here = (local >= 0) & (local < sl.stop - sl.start)
            i, j = np.nonzero(here)
            before = a3.reshape(m, 2, k, rows, -1)[i, :, j, :, local[i, j]]  # [hits, side, rows]
            # a >= 0 takes the lower slope, a < 0 the upper one (``by_sign``: 0.45x np.where's time on MNIST
            # 256x4's blocks); a3's buffer takes the second product
            neg = negative_part(a3, out=scratch("fsb.negative", a3.shape, PLAIN_DTYPE))
            new = positive_part(a3, out=scratch(f"fsb.products{slot}", a3.shape, PLAIN_DTYPE))
            slot = 1 - slot
            # (a3 is the spec's read-only broadcast when this ReLU is the first step back and a group has one row)
            new = by_sign(new, neg, lower[:, None, sl], upper[:, None, sl], out=new,
                          work=a3 if a3.flags.writeable else None)
            const += np.matmul(neg, icpt[:, sl, None])[..., 0]
            if i.size:
                new4, u = new.reshape(m, 2, k, rows, -1), local[i, j]
                new4[i, 0, j, :, u] = before[:, 0]
                new4[i, 1, j, :, u] = 0.0
                const.reshape(m, 2, k, rows)[i, :, j] -= negative_part(before) * icpt[i, units[i, j], None, None]
            a = new.reshape(n * rows, -1)
        a4 = a.reshape(m, 2 * k * rows, -1)
        center, radius = plain_array((in_lo + in_hi) * 0.5), plain_array((in_hi - in_lo) * 0.5)
        magnitude = np.abs(a4, out=scratch("fsb.negative", a4.shape, PLAIN_DTYPE))
        bound = np.matmul(a4, center[:, :, None])[..., 0] - np.matmul(magnitude, radius[:, :, None])[..., 0]
        return (bound + const).astype(np.float64).reshape(m, 2, k, rows)
