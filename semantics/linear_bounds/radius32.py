"""CROWN's last step onto the input box with float32 radius products, still sound.

The fused ReLU-linear step (``crown._Pass._relu_linear``) builds, per half, the rows a = A W at the
linear layer's input; where that input is the network's input the rows are only concretized:
``<a, c> - <|a|, r>`` over the box [c -+ r]. On an MLP this product is most of a CROWN pass (25 of 31
ms on 784-1024-1024-10 at batch 1). ``<a, c> = <A, W c>`` needs no product at all (two matrix-vector
products in float64); only ``<|a|, r>`` needs a itself. Its rounding is charged against the radius
term alone, so float32 products cost about (m + 2) 2**-24 of the width (m live units), where a float32
a used for the center too would cost that much of |A| |W| |c| (on an l-inf ball of radius 0.01 around
inputs of magnitude 1, about 0.6% of the width).

Bound for one half's row (A over the m live units, W the layer's weight, exactly float32 and without a
float32-subnormal entry: ``affine32.float32_weights``), with u = 2**-53, u32 = 2**-24, g = gamma32(m + 1):

* A32 = flush(fl32(A)) (no subnormal reaches the GEMM: ``affine32.flush_subnormals``):
  |A32 - A| <= u32 |A| + tau entrywise, tau = 2**-126 (1 + u32);
* L32, the plain and split units' float32 products and their float32 sum, in any order, with gradual
  underflow or flush-to-zero: |L32 - A32 W| <= g |A32| |W| + 2 (m + 1) 2**-126 (``affine32``'s proof);
* so |L32 - A W| <= F |A| |W| + tau (1 + g) 1'|W| + 2 (m + 1) 2**-126 with F = u32 + g (1 + u32), and
  <|a|, r> <= <|L32|, r> + F <|A|, |W| r> + tau (1 + g) sum(|W| r) + 2 (m + 1) 2**-126 sum(r);
* <|L32|, r> is a float64 product (gamma_k relative, k inputs);
* the center: wc = fl(W c) is within gamma_k |W| |c| of W c, and fl(<A, wc>) (two products and a sum:
  m + 1 terms) within gamma_(m+1) <|A|, |wc|>: (gamma_k + gamma_(m+1) (1 + gamma_k)) <|A|, |W| |c|>;
* the last subtraction rounds by u (|<a, c>| + <|a|, r>).

The vectors |W| |c| and |W| r are float64 sums of non-negative terms, taken rounded up (``err_factor``
covers their own rounding); every error term is a non-negative sum inflated the same way. Float32 is
used only where its terms cost at most ``WIDTH_COST`` of the radius term (summed over the block's rows;
a row whose coefficients cancel heavily can make F <|A|, |W| r> large next to <|a|, r>); otherwise, on a
float32 overflow, and for a weight float32 does not hold exactly, the caller keeps its float64 product.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..interval_round import MIN_NORMAL, U, all_finite, center_radius, up
from ..rules.affine32 import F32, U32, flush_subnormals, float32_weights, gamma32
from .rules import err_factor

__all__ = ["InputStep32", "input_step32", "WIDTH_COST", "MIN_PRODUCT32"]

WIDTH_COST = 2.0 ** -9  # the most float32 rounding may add to a block's radius terms (relative)
# float32 pays where the products are large: below this many multiply-adds per row the casts, flushes and the
# extra matrix-vector products cost more than the float64 product they replace
MIN_PRODUCT32 = 1 << 14
_TAU = 2.0 ** -126 * (1.0 + U32)
_F32_UNDERFLOW = 2.0 * 2.0 ** -126


@dataclass(frozen=True)
class InputStep32:
    """One layer's float32 weights and the input box's vectors, split into plain and split units (per call)."""

    w_plain: np.ndarray    # float32 [plain, k]
    w_split: np.ndarray    # float32 [special, k]
    wc_plain: np.ndarray   # [n_box, plain, 1]: fl(W c)
    wc_split: np.ndarray   # [n_box, special, 1]
    up_plain: np.ndarray   # [n_box, plain, 2]: |W| |c| and |W| r, rounded up
    up_split: np.ndarray   # [n_box, special, 2]
    r: np.ndarray          # [n_box, k, 1]
    floor: np.ndarray      # [n_box, 1]: the flush's and float32 underflow's part of <|a|, r>'s error
    f: float               # F
    g_k: float             # gamma_k (float64, k inputs)
    g_m: float             # gamma_(m+1) (float64)


def input_step32(p, lo: np.ndarray, hi: np.ndarray, plain: np.ndarray, special: np.ndarray
                 ) -> InputStep32 | None:
    """The float32 step for linear layer ``p`` (``AffineParams``: weight [width, k]) onto the box
    ``[lo, hi]`` ([n_box, k]), or None where it does not apply (see the module docstring)."""
    width, k = p.weight.shape
    m = plain.size + special.size
    if m * k < MIN_PRODUCT32:
        return None
    w = float32_weights(p, width + 1)
    if w is None:
        return None
    with np.errstate(all="ignore"):
        c, r = center_radius(lo, hi)
        if not (all_finite(c) and all_finite(r)):
            return None
        grow = 1.0 + 2.0 * err_factor(k)
        wc = (c @ p.weight.T)[:, :, None]
        upper = np.stack([up((np.abs(c) @ p.abs_weight.T) * grow), up((r @ p.abs_weight.T) * grow)], axis=-1)
        sum_wr = up(upper[..., 1].sum(axis=1, keepdims=True) * (1.0 + 2.0 * err_factor(width)))
        sum_r = up(r.sum(axis=1, keepdims=True) * (1.0 + 2.0 * err_factor(k)))
    g = gamma32(m + 1)
    floor = _TAU * (1.0 + g) * sum_wr + _F32_UNDERFLOW * (m + 1) * sum_r
    return InputStep32(w.weight[plain], w.weight[special], wc[:, plain], wc[:, special], upper[:, plain],
                       upper[:, special], r[:, :, None], floor, (U32 + g * (1.0 + U32)) * (1.0 + 4 * U),
                       err_factor(k), err_factor(m + 1))


def _float32(x: np.ndarray) -> np.ndarray:
    return flush_subnormals(x.astype(F32))


def concretized32(step: InputStep32, x_plain: np.ndarray, low: np.ndarray, high: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """Lower bounds over the box of the rows [P + L W_s] (first half) and -[P + H W_s] (second), with
    their error bounds: ``(box_top, box_bottom, e_top, e_bottom)``, each [n, rows]. ``x_plain``
    ``[n or 1, rows, plain]`` and ``low``/``high`` ``[n, rows, special]`` are the rows' coefficients on the
    plain and split units (float64). None when float32 overflows or costs more than ``WIDTH_COST``."""
    with np.errstate(all="ignore"):
        shared = np.matmul(_float32(x_plain), step.w_plain)
        halves = []
        for part in (low, high):
            rows = np.matmul(_float32(part), step.w_split)
            rows += shared
            if not all_finite(rows):
                return None
            np.abs(rows, out=rows)
            halves.append(np.matmul(rows, step.r)[..., 0])  # <|L32|, r>, in float64
        center_plain = np.matmul(x_plain, step.wc_plain)[..., 0]
        abs_plain = np.matmul(np.abs(x_plain), step.up_plain)
        g_k, g_m = step.g_k, step.g_m
        out = []
        cost = rounding = 0.0
        for part, ar in zip((low, high), halves):
            ac = center_plain + np.matmul(part, step.wc_split)[..., 0]
            # <|A|, |W| |c|> and <|A|, |W| r>, rounded up
            s = (abs_plain + np.matmul(np.abs(part), step.up_split)) * (1.0 + 2.0 * g_m)
            radius_err = step.f * s[..., 1] + step.floor
            e_center = (g_k + g_m * (1.0 + g_k)) * s[..., 0]
            bound_ar = ar * (1.0 + g_k) + radius_err
            err = (e_center + g_k * ar + radius_err + U * (np.abs(ac) + bound_ar)) * (1.0 + 8 * U) + MIN_NORMAL
            cost += float(np.sum(radius_err))
            rounding += float(np.sum(ar))
            out.append((ac, ar, err))
        if not cost <= WIDTH_COST * rounding:
            return None
    (ac_l, ar_l, e_l), (ac_h, ar_h, e_h) = out
    return ac_l - ar_l, -ac_h - ar_h, e_l, e_h
