"""Interval linear and conv with float32 matrix products (``products="float32"``), still sound.

The float64 rules (``affine``) cost two float64 GEMMs per layer; BLAS runs float32 products up to
twice as fast, which is what auto_LiRPA's IBP uses (without any rounding allowance). Here the
products run in float32 and their rounding is bounded rigorously (Higham's order-independent
dot-product bound with u = 2**-24, gamma32(n) for n terms per output).

A radius that varies (every layer after the first):

- c = fl((lo + hi) / 2), r = fl((hi - lo) / 2) in float64 (each within 3u64 of exact, covered below);
  c32 = fl32(c) is within 2**-24 |c| + 2**-150 of c;
- mid32 = fl32(W c32') is within gamma32(n) |W| |c32| + A of W c32, with A = n 2**-126 (2 + 2 max|W|)
  (see "No subnormal reaches a GEMM" below);
- so the exact image of the box lies in mid32 +- (|W| v + A) for v = r (1 + 3u64) + g' |c| + tiny with
  g' = gamma32(n) (1 + 2**-24) + 2**-24 + 1.01 u64, v rounded up to float32 (v32);
- t32 = fl32(|W| v32') bounds |W| v32 within a factor 1 + gamma32(n), plus A;
- in float64, s = fl(mid32 + b) and the ends fl(s -+ T) with T = K t32 + kappa: K and the per-channel
  kappa cover the two float64 roundings, using |s| <= (|W| v) (1 + g) / g + |b| (every |c32| term
  is at most |W| v / g), so no further pass over the output is needed.
- linear and conv run this on 2c = fl(lo + hi) and 2r = fl(hi - lo) against W / 2 and |W| / 2 (exact
  scalings, the same roundings; a weight whose half would be a float32 subnormal keeps the float64
  rule), without two halving passes over the input, and round v to nearest instead of up:
  2v <= K1 fl32(2v') + 2**-149 for the v' computed without v's last two steps (K1 the factor those
  steps apply), so T uses K K1 and A + n max|W| 2**-144.

No subnormal reaches a GEMM. x86 BLAS kernels slow down about 40x on subnormal float32 operands, and
IBP makes them: a unit pinned by a ReLU has c = r = 0, so a spread rounded up is the tiny term alone
(2**-147, a float32 subnormal; a third of a layer's inputs on a trained MLP; the doubled spread rounded
to nearest leaves it 0, but tiny centers and radii still round to float32 subnormals). So every
float32 operand is flushed: x' = 0 where |x| < 2**-126, else x' = x (c32' from c32, v32' from v32, and
the staged conv inputs the same way), and a weight with a float32 subnormal entry keeps the float64
rule. Proof of the allowance A = n 2**-126 (2 + 2 max|W|) for one output of n terms:
- the flush moves each operand entry by less than 2**-126, so |W x - W x'| < n max|W| 2**-126, and
  |W| x' <= |W| x for x >= 0 (the spread), |W| |x'| <= |W| |x|;
- the GEMM itself, in any order, with gradual underflow or with flush-to-zero of its results and
  denormals-are-zero on its inputs: each product and each partial sum is rounded with relative error
  at most 2**-24 (gamma32(n) bounds their accumulation) plus an absolute error below 2**-126 (a result
  flushed, or an input sum below 2**-126 read as 0): at most 2n 2**-126 per output; no operand entry is
  subnormal (x' by construction, W by the check), so denormals-are-zero changes nothing else;
- so |fl32(W x') - W x| <= gamma32(n) |W| |x| + n 2**-126 (2 + max|W|), and |W| v32 <=
  (1 + gamma32(n)) fl32(|W| v32') + n 2**-126 (2 + max|W|) (all within A, which also covers the
  halved weights of the conv path, max|W / 2| <= max|W|). The earlier A, n 2**-126 (2 + max|W|),
  needed the max|W| term only for a BLAS that reads subnormal inputs as zero; now it is charged for
  the flush, and the GEMM's own term stays.
Flushing costs three passes over the float32 operands (|x|, the mask, a product by it: a small fraction
of the product on any layer of ``MIN_OUT_FLOAT32`` outputs) and at most 2 n max|W| 2**-126 of width per
output.

A radius uniform per sample (an l-inf ball at the first layer): one float32 product for the center
(2c against W / 2, as above; the maxima of |2c| and 2r halved exactly, a subnormal's rounding covered
by the 2**-1022 floor of ``affine._affine_ends``), rows of more than ``_PIECE_TERMS`` terms cut into
pieces summed in float64 (so gamma32 is a piece's), |W| r = max(r) |W| 1, and the center's rounding
bounded by gamma max|c| |W| 1; the float64 rule's finishing step (``affine._affine_ends``) with that
gamma.

Float32 is used only where its rounding costs at most ``_WIDTH_COST`` (2**-9) of the width; the bounds
are then wider than the float64 rules' by a relative 1e-4 to 2e-3 on the bench models, the price of
the speed. A node keeps its float64 rule when its weight is not exactly a float32 array (a float64
checkpoint) or has an infinite entry, when n >= 2**20, when float32 would overflow, where float32
rounding would dominate the width (a radius tiny next to the center), and (linear) below
``MIN_OUT_FLOAT32`` outputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..arena import result_array
from ..conv_gemm import conv_plan, conv_products, stage
from ..interval_round import MIN_NORMAL, U, Box, CleanBox, all_finite, gamma
from ..scratch import scratch
from .affine import (AffineParams, _abs_max, _affine_ends, _uniform_radius, conv_box,
                     in_bounds_abs_sums, linear_box)
from .table import INTERVAL_RULES, read_params

__all__ = ["FLOAT32_OVERRIDES", "MIN_OUT_FLOAT32", "Float32Weights", "float32_weights", "flush_subnormals",
           "linear_box32", "conv_box32", "gamma32"]

U32 = 2.0 ** -24
F32 = np.dtype(np.float32)
_MAX_TERMS = 1 << 20
# a float32 product saves about 40% of a float64 one per multiply-add, and the float32 path makes about a
# dozen more passes over the input (the spread, two conversions): below this many outputs per input
# entry, the float64 rule is faster
MIN_OUT_FLOAT32 = 64
_F32_MIN_NORMAL = 2.0 ** -126
_F32_TINIEST_NORMAL = np.float32(_F32_MIN_NORMAL)
# fl32(v (1 + 2**-22) + 2**-147) >= v for every non-negative float64 v below the float32 range's top
_TO_F32_UP, _TO_F32_TINY = (1.0 + 2.0 ** -22) * (1.0 + 4 * U), 2.0 ** -147


def gamma32(n: int) -> float:
    """An upper bound of gamma_n / (1 - gamma_n) for float32 (u = 2**-24), with the 1.01 safety
    factor of ``interval_round.gamma``."""
    n = max(int(n), 1)
    g = n * U32 / (1.0 - n * U32)
    return 1.01 * g / (1.0 - g)


@dataclass(frozen=True)
class Float32Weights:
    """A node's weight and |weight| as float32 arrays (equal to the float64 weight), and the
    constants of its error bound for n terms per output."""

    weight: np.ndarray
    abs_weight: np.ndarray
    g: float          # gamma32(n)
    g_center: float   # g': the factor of |c| in v
    scale: float      # K
    floor: float      # the bias-free part of kappa
    underflow: float  # A: float32 underflow in one output's products and sums
    abs_row_max: float  # the largest sum of |W| over one output's terms
    scale_nearest: float  # K and kappa's floor for a spread rounded to nearest (``_doubled_spread``)
    floor_nearest: float


def float32_weights(p: AffineParams, n_terms: int) -> Float32Weights | None:
    """The float32 forms of ``p``'s weight and its bound's constants (cached on ``p``), or None when
    the weight is not exactly representable in float32 or an output sums too many terms."""
    key = ("float32", n_terms)
    if key not in p.cache:
        w32 = p.weight.astype(F32)
        got = None
        w_max = float(np.max(np.abs(p.weight))) if p.weight.size else 0.0
        # an infinite weight would make the underflow allowance A infinite for every output: float64 keeps
        # the outputs that do not read it finite
        # (a float32-subnormal weight would reach the GEMM: the float64 rule keeps such a node)
        if (n_terms < _MAX_TERMS and math.isfinite(w_max) and bool(np.array_equal(w32.astype(np.float64), p.weight))
                and not _has_subnormal(w32)):
            g = gamma32(n_terms)
            underflow = n_terms * _F32_MIN_NORMAL * (2.0 + 2.0 * w_max)  # the GEMM's underflow and the flush
            scale = (1.0 + g) * (1.0 + 16 * U) + 16 * U * (1.0 + g) ** 2 / g
            floor = (2.0 * underflow + MIN_NORMAL) * (1.0 + 1.0 / g) * 4.0
            row_max = float(np.max(p.abs_row_sum, initial=0.0))
            # a spread rounded to nearest: its own roundings and float32's (at most the factor that
            # rounding up applied) move into K, its float32 underflow (2**-150 a term) into A
            scale_nearest = scale * _TO_F32_UP * (1.0 + 3 * U)
            floor_nearest = (2.0 * (underflow + n_terms * w_max * 2.0 ** -144) + MIN_NORMAL) * (1.0 + 1.0 / g) * 4.0
            got = Float32Weights(w32, np.abs(w32), g, (g * (1.0 + U32) + U32 + 1.01 * U) * (1.0 + 4 * U), scale,
                                 floor, underflow, row_max, scale_nearest, floor_nearest)
        p.cache[key] = got
    return p.cache[key]


def _has_subnormal(x32: np.ndarray) -> bool:
    return bool(np.any((x32 != 0) & (np.abs(x32) < _F32_TINIEST_NORMAL)))


def flush_subnormals(x32: np.ndarray) -> np.ndarray:
    """``x32`` (float32, any strides) with every subnormal entry set to zero, in place: a GEMM never
    reads a subnormal (the allowance is in ``float32_weights``' A; see the module docstring)."""
    keep = np.greater_equal(np.abs(x32, out=scratch("affine32.flush", x32.shape, F32)), _F32_TINIEST_NORMAL,
                            out=scratch("affine32.flush_mask", x32.shape, np.bool_))
    # a product by the 0/1 mask, not a masked copy: copyto(where=) branches per entry and ran 5x slower
    # on ReLU-zeroed inputs (an irregular mask); x * 0 is 0 for a subnormal x, NaN and inf are kept
    return np.multiply(x32, keep, out=x32)


def _doubled(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """2c = fl(lo + hi) and 2r = fl(hi - lo) in scratch buffers: the float32 rules run on them against the
    halved weights (exact), without ``box_halves``' two halving passes. Not checked here: each path's
    own reductions of them are finite only if every entry is (a NaN or an infinity reaches a sum or a
    maximum), and a path that finds one returns None for the float64 rule."""
    return (np.add(lo, hi, out=scratch("affine.c", lo.shape)), np.subtract(hi, lo, out=scratch("affine.r", lo.shape)))


def _halved_weights(p: AffineParams, w: Float32Weights) -> tuple[np.ndarray, np.ndarray] | None:
    """W / 2 and |W| / 2 in float32 (cached on ``p``), or None when a weight is too small to halve
    exactly (below twice float32's smallest normal)."""
    key = ("float32.halves",)
    if key not in p.cache:
        tiny = (w.abs_weight > 0) & (w.abs_weight < _F32_MIN_NORMAL * 2)
        p.cache[key] = None if np.any(tiny) else (w.weight * np.float32(0.5), w.abs_weight * np.float32(0.5))
    return p.cache[key]


def _doubled_spread(c2: np.ndarray, r2: np.ndarray, w: Float32Weights) -> tuple[np.ndarray, bool] | None:
    """``_spread`` from 2c = fl(lo + hi) and 2r = fl(hi - lo), as 2v' = fl(fl(g' |2c|) + 2r), to be
    rounded to float32 to nearest: 2v <= K1 fl32(2v') + 2**-149 with K1 = ``_TO_F32_UP`` (1 + 3u), the
    factor and the term that ``_spread`` applies to v, here carried by ``Float32Weights.scale_nearest``
    and ``floor_nearest``. Also whether float32 provably cannot overflow in either product (from the
    sums taken here, each entry being at most its sum). None when an end is not finite or float32
    rounding would cost more than ``_WIDTH_COST`` of the width."""
    v = np.abs(c2, out=scratch("affine32.v", c2.shape))
    total_c, total_r = float(np.add.reduce(v, axis=None)), float(np.add.reduce(r2, axis=None))
    if not (math.isfinite(total_c) and math.isfinite(total_r)) or w.g_center * total_c > _WIDTH_COST * total_r:
        return None
    v *= w.g_center
    v += r2
    v_total = (w.g_center * total_c + total_r) * (1.0 + 8 * U)
    safe = max(total_c, v_total) * max(w.abs_row_max, 1.0) < _F32_SAFE
    return v, safe


# float32 products are used when their rounding costs at most this much of the width (gamma |W| |c|
# against |W| r); for a uniform radius, a longer row is cut into pieces of at most _PIECE_TERMS terms, each
# summed in float32 and the pieces in float64, so that gamma is that of a piece
_WIDTH_COST = 2.0 ** -9
_PIECE_TERMS = 256
_F32_SAFE = 2.0 ** 120  # centers beyond this keep float64 products (float32 overflow)


def _center_gamma(terms: int, pieces: int) -> float:
    """The relative rounding error of a center product in float32: ``pieces`` dot products of ``terms``
    terms each, summed in float64 with the bias, on a center rounded to float32 (2**-24 |c|, with margin)."""
    return gamma32(terms + 1) + gamma(pieces + 2) + 2.0 ** -22


def _uniform_pays(g: float, c_max: np.ndarray, r_max: np.ndarray) -> bool:
    """Whether the center's float32 rounding costs at most ``_WIDTH_COST`` of the width, with every
    per-sample maximum finite (False for a NaN: its comparisons are False)."""
    e_c = (g + 4 * U) * (1.0 + g)
    return bool(np.all(c_max < _F32_SAFE) and np.all(r_max < np.inf) and np.all(e_c * c_max <= _WIDTH_COST * r_max))


def _weight_pieces(p: AffineParams, half_w: np.ndarray, pieces: int, terms: int) -> np.ndarray:
    """``W.T / 2`` in float32, zero-padded to ``pieces * terms`` rows and cut into ``[pieces, terms, out]``."""
    key = ("float32.pieces", pieces, terms)
    got = p.cache.get(key)
    if got is None:
        n, out = p.weight.shape[1], p.weight.shape[0]
        got = np.zeros((pieces * terms, out), F32)
        got[:n] = half_w.T
        got = p.cache[key] = got.reshape(pieces, terms, out)
    return got


def _uniform_linear32(c2: np.ndarray, r2_max: np.ndarray, p: AffineParams, w: Float32Weights, half_w: np.ndarray,
                      shape: tuple[int, ...]) -> Box | None:
    """``linear_box`` for a radius uniform per sample (``r2_max``: each row's largest 2r), the center
    product (2c against W / 2) in float32 pieces; None when its rounding would cost more than
    ``_WIDTH_COST`` of the width or a maximum is not finite. Halving c's and r's maxima is exact (a
    subnormal's rounding is covered by ``_affine_ends``' 2**-1022 floor, as in ``linear_box``)."""
    n = p.weight.shape[1]
    pieces = -(-n // _PIECE_TERMS)
    terms = -(-n // pieces)
    g = _center_gamma(terms, pieces)
    lead = c2.shape[:-1] + (1,)
    c_max = _abs_max(c2, axis=-1, keepdims=True) * 0.5
    r_max = r2_max.reshape(lead) * 0.5
    if not _uniform_pays(g, c_max, r_max):
        return None
    rows = math.prod(c2.shape[:-1])
    c32 = scratch("affine32.c", (rows, pieces * terms), F32)
    c32[:, n:] = 0.0
    np.copyto(c32[:, :n], c2.reshape(rows, n), casting="same_kind")
    flush_subnormals(c32[:, :n])
    parts = np.matmul(c32.reshape(rows, pieces, terms).transpose(1, 0, 2), _weight_pieces(p, half_w, pieces, terms),
                      out=scratch("affine32.parts", (pieces, rows, p.weight.shape[0]), F32))
    mid = np.sum(parts, axis=0, dtype=np.float64, out=scratch("affine.mid", (rows, p.weight.shape[0])))
    mid += p.bias
    floor = MIN_NORMAL + 2.0 * w.underflow + 2.0 ** -149 * float(np.max(p.abs_row_sum, initial=0.0))
    return _affine_ends(mid.reshape(shape), c_max, r_max, None, p.abs_row_sum, p.bias, g, True, shape, floor,
                        gamma(pieces + 2))


def _uniform_conv32(c2: np.ndarray, r2_max: np.ndarray, p: AffineParams, w: Float32Weights, half_w: np.ndarray,
                    attrs: Mapping[str, Any], out_shape: tuple[int, ...]) -> Box | None:
    """``conv_box`` for a radius uniform per sample with the center product (2c against W / 2) in
    float32 (at most ``_PIECE_TERMS`` terms per output), or None where it does not pay (see
    ``_uniform_linear32``)."""
    terms = attrs["in_channels"] // attrs["groups"] * math.prod(attrs["kernel"])
    if terms > _PIECE_TERMS:
        return None
    n = c2.shape[0]
    ones = (1,) * (c2.ndim - 2)
    g = _center_gamma(terms, 1)
    c_max = (_abs_max(c2.reshape(n, -1), axis=1) * 0.5).reshape((n, 1) + ones)
    r_max = (r2_max * 0.5).reshape((n, 1) + ones)
    if not _uniform_pays(g, c_max, r_max):
        return None
    plan = conv_plan(c2.shape, attrs)
    sums = in_bounds_abs_sums(p, attrs, c2.shape[1:])
    bias = p.bias.reshape((-1,) + ones)
    mid = conv_products(flush_subnormals(stage(c2, plan, F32, "affine32.staged")), plan, half_w, attrs["groups"],
                        "affine32.mid")
    mid = _widened(mid, "affine.mid", (n,) + sums.shape)
    mid += bias
    floor = MIN_NORMAL + 2.0 * w.underflow + 2.0 ** -149 * float(np.max(sums, initial=0.0))
    return _affine_ends(mid, c_max, r_max, None, sums, bias, g, True, out_shape, floor, gamma(3))


def _widened(x32: np.ndarray, name: str, shape: tuple[int, ...]) -> np.ndarray:
    """A float32 result (any strides) as float64 in the scratch buffer ``name`` (exact): a casting copy,
    which numpy runs faster than an arithmetic ufunc that casts its operand."""
    out = scratch(name, shape)
    np.copyto(out, x32)
    return out


def _ends32(mid32: np.ndarray, t32: np.ndarray, bias: np.ndarray, w: Float32Weights, shape: tuple[int, ...],
            check: bool = True, nearest: bool = False) -> Box | None:
    """The box ``mid32 + bias -+ T`` (``mid32 = fl32(W c32)``, ``t32 = fl32(|W| v32)``, any strides)
    in result memory, or None when float32 overflowed (a center or spread beyond its range; not looked
    for when ``check`` is False: the caller has proven it cannot happen). ``nearest``: v32 was rounded
    to nearest (``_doubled_spread``)."""
    s, t = _widened(mid32, "affine.mid", shape), _widened(t32, "affine.t", shape)
    s += bias
    t *= w.scale_nearest if nearest else w.scale
    if check and not (all_finite(s) and all_finite(t)):
        return None
    t += (w.floor_nearest if nearest else w.floor) + 4.01 * U * np.abs(bias)
    return CleanBox((np.subtract(s, t, out=result_array(shape)), np.add(s, t, out=result_array(shape))))


def linear_box32(a: Box, p: AffineParams) -> Box:
    """``linear_box`` with float32 products, or ``linear_box`` itself where float32 is not used. Both
    paths run on 2c and 2r against the halved float32 weights (``_doubled``)."""
    lo, hi = a
    w = float32_weights(p, p.weight.shape[1])
    halved = _halved_weights(p, w) if w is not None and lo.ndim and lo.size else None
    if halved is not None:
        shape = lo.shape[:-1] + p.weight.shape[:1]
        with np.errstate(all="ignore"):
            c2, r2 = _doubled(lo, hi)
            r2_max = _uniform_radius(r2.reshape(-1, r2.shape[-1]))
            if r2_max is not None:
                got = _uniform_linear32(c2, r2_max, p, w, halved[0], shape)
            else:
                got = None
                spread = _doubled_spread(c2, r2, w)
                if spread is not None:
                    c32 = flush_subnormals(_narrowed(c2, "affine32.c"))
                    v32 = flush_subnormals(_narrowed(spread[0], "affine32.v32"))
                    mid32 = np.matmul(c32, halved[0].T, out=scratch("affine32.mid", shape, F32))
                    t32 = np.matmul(v32, halved[1].T, out=scratch("affine32.t", shape, F32))
                    got = _ends32(mid32, t32, p.bias, w, shape, check=not spread[1], nearest=True)
            if got is not None:
                return got
    return linear_box(a, p)


def _narrowed(x: np.ndarray, name: str) -> np.ndarray:
    """``x`` rounded to float32 (to nearest) in the scratch buffer ``name``."""
    out = scratch(name, x.shape, F32)
    np.copyto(out, x, casting="same_kind")
    return out


def conv_box32(a: Box, p: AffineParams, attrs: Mapping[str, Any], out_shape: Sequence[int]) -> Box:
    """``conv_box`` (not transposed) with float32 products, or ``conv_box`` where float32 is not used.
    Both paths run on 2c and 2r against the halved float32 weights (``_doubled``)."""
    ca = attrs["channel_axis"]
    lo, hi = a
    lead, in_tail = lo.shape[:ca], lo.shape[ca:]
    n = math.prod(lead)
    w = float32_weights(p, attrs["in_channels"] // attrs["groups"] * math.prod(attrs["kernel"]))
    halved = _halved_weights(p, w) if w is not None and n and lo.size else None
    if halved is None:
        return conv_box(a, p, attrs, out_shape)
    x_shape = (n,) + in_tail
    with np.errstate(all="ignore"):
        c2, r2 = _doubled(lo.reshape(x_shape), hi.reshape(x_shape))
        r2_max = _uniform_radius(r2.reshape(n, -1))
        if r2_max is not None:
            got = _uniform_conv32(c2, r2_max, p, w, halved[0], attrs, tuple(out_shape))
        else:
            got = None
            spread = _doubled_spread(c2, r2, w)
            if spread is not None:
                plan = conv_plan(x_shape, attrs)
                groups = attrs["groups"]
                t32 = conv_products(flush_subnormals(stage(spread[0], plan, F32, "affine32.staged")), plan, halved[1],
                                    groups, "affine32.t")
                mid32 = conv_products(flush_subnormals(stage(c2, plan, F32, "affine32.staged")), plan, halved[0],
                                      groups, "affine32.mid")
                bias = p.bias.reshape((-1,) + (1,) * (len(in_tail) - 1))
                got = _ends32(mid32, t32, bias, w, (n,) + tuple(out_shape[ca:]), check=not spread[1], nearest=True)
                if got is not None:
                    got = CleanBox((got[0].reshape(tuple(out_shape)), got[1].reshape(tuple(out_shape))))
    return got if got is not None else conv_box(a, p, attrs, out_shape)


def _linear_rule32(node, ps, rec):
    """Float32 products for layers of at least ``MIN_OUT_FLOAT32`` outputs; on narrower ones the products
    are cheap and the float32 path's extra passes over the input would cost more than they save."""
    p = read_params(INTERVAL_RULES, node, rec, ps[0][0].shape)
    return (linear_box32 if p.weight.shape[0] >= MIN_OUT_FLOAT32 else linear_box)(ps[0], p)


def _conv_rule32(node, ps, rec):
    return conv_box32(ps[0], read_params(INTERVAL_RULES, node, rec, ps[0][0].shape), node.attrs, node.out_shape)


# the interval rules that ``products="float32"`` replaces (conv_transpose and matmul keep float64)
FLOAT32_OVERRIDES: dict[str, Callable] = {"linear": _linear_rule32, "conv": _conv_rule32}
