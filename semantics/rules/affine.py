"""Affine maps: linear, matmul, conv, conv_transpose.

Float: one BLAS product (conv through ``semantics.conv``'s im2col).

Interval, in center-radius form. For y = A x + b over the box [c - r, c + r] the exact image is
A c + b +- |A| r (each output's range is exact, not just enclosed). Linear and conv take
c = fl((lo + hi) / 2) and r = fl((hi - lo) / 2) (``box_halves``), compute fl(A c) + b and fl(|A| r) with
BLAS (conv: ``conv_gemm``'s staged GEMM over the whole batch), or max(r) |A| 1 when r is uniform per
sample (an l-inf ball: one product), and widen by a radius that covers every rounding on the way,
including that of the ends themselves (``_affine_ends``): two matrix products per layer, the same
count as auto_LiRPA's IBP, and no outward-rounding passes. matmul with a constant operand and
conv_transpose use ``affine_box`` (the order-independent dot-product bound, ends rounded outward).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import numpy as np

from .. import interval_arith as ia
from ..conv import conv_nd, conv_transpose_nd
from ..interval_round import (MIN_NORMAL, U, Box, CleanBox, all_finite, center_radius, clean, dot_radius, down, gamma,
                              sum_bounds, up)
from ..arena import result_array
from ..conv_depthwise import depthwise_applies, depthwise_band
from ..conv_gemm import conv_plan, conv_products, stage
from ..scratch import scratch
from ..records import in_dtype
from ..folds import fold_matmul
from .table import FLOAT_RULES, INTERVAL_RULES, exact_rule, float_params, float_rule, interval_rule, read_params

__all__ = ["AffineParams", "affine_box", "linear_box", "conv_box", "matmul_box", "batched_conv", "box_halves", "Halves"]


def affine_box(a: Box, apply: Callable[[np.ndarray], np.ndarray], apply_abs: Callable[[np.ndarray], np.ndarray],
               n_terms: int, bias: np.ndarray | None = None) -> Box:
    """Image of a box under x -> apply(x) + bias, apply linear with n_terms products per output
    (count the bias as one more term). NaN ends (inf - inf) become the trivial bound."""
    c, r = center_radius(*a)
    with np.errstate(all="ignore"):
        mid = apply(c)
        if bias is not None:
            mid += bias
        rad = dot_radius(apply_abs, c, r, n_terms, None if bias is None else np.abs(bias))
        return clean(down(mid - rad), up(mid + rad))


@dataclass(frozen=True)
class AffineParams:
    """A linear or conv node's float64 weight, its absolute value, bias and (linear) an upper bound
    of each output's row sum of |W|: prepared once per node (``IntervalPropagator``) and reused by
    every propagation."""

    weight: np.ndarray
    abs_weight: np.ndarray
    bias: np.ndarray
    abs_row_sum: np.ndarray  # >= sum_j |W[i, j]| exactly, for linear weights [out, in]
    cache: dict = field(default_factory=dict, compare=False, repr=False)  # derived forms, per input shape

    @classmethod
    def of(cls, weight: np.ndarray, bias: np.ndarray) -> "AffineParams":
        w = np.asarray(weight, dtype=np.float64)
        wabs = np.abs(w)
        flat = wabs.reshape(w.shape[0], -1)
        with np.errstate(all="ignore"):
            row_sum = up(flat.sum(axis=1) * (1.0 + gamma(flat.shape[1])))
        return cls(w, wabs, np.asarray(bias, dtype=np.float64), row_sum)


# an l-inf ball's radii differ by rounding (r = up(hi - c) per entry): within this factor of their
# maximum they are treated as uniform, trading the radius GEMM for row sums of |W|
_NEAR_UNIFORM = 1.0 - 2.0 ** -40


def linear_box(a: Box, p: AffineParams, halves: Halves | None = None) -> Box:
    """x @ W.T + b over the last axis, any leading axes, in center-radius form (``_affine_ends``).

    The radius is |W| r (one BLAS product, or max(r) * row sums when r is the same along the input
    axis up to rounding, as for an l-inf ball) plus the rounding bound gamma_n (|W| |c| + |b|), where
    |W| |c| is bounded by max|c| times the row sums (cheap, and only 1e-13 relative looser).
    ``halves``: the input's ``halves`` when the caller has them. Without them the products run on
    2c = fl(lo + hi) and 2r = fl(hi - lo) and their (smaller) results are halved: the same values as
    ``box_halves`` gives (halving is exact; a subnormal's rounding is covered by T's 2**-1022 floor),
    without two passes over the input.
    """
    scale = 1.0
    if halves is not None:
        c, r, finite = halves
    else:
        c, r, finite = _doubled_halves(*a)
        scale = 0.5 if finite else 1.0
    g = gamma(p.weight.shape[1] + 1)
    out_shape = c.shape[:-1] + p.weight.shape[:1]
    with np.errstate(all="ignore"):
        mid = np.matmul(c, p.weight.T, out=scratch("affine.mid", out_shape))
        mid *= scale
        mid += p.bias
        lead = c.shape[:-1] + (1,)
        r_max = _uniform_radius(r.reshape(-1, r.shape[-1])) if r.size else None
        spread = None
        if r_max is None:
            spread = np.matmul(r, p.abs_weight.T, out=scratch("affine.spread", out_shape))
            spread *= scale
        else:
            r_max = r_max.reshape(lead) * scale
        c_max = (_abs_max(c, axis=-1, keepdims=True) if c.shape[-1] else np.zeros(lead)) * scale
        return _affine_ends(mid, c_max, r_max, spread, p.abs_row_sum, p.bias, g, finite, out_shape)


def _abs_max(x: np.ndarray, axis: Any, keepdims: bool = False) -> np.ndarray:
    """``max(|x|)`` along ``axis``: for rows of at most ``_SHORT_ROW`` entries |x| in scratch memory and one
    reduction (a reduction pays per row: 0.5-0.6x the time of two on rows of 16-256); longer rows from
    two reductions, without the |x| pass over memory (0.5x on rows of 3,072)."""
    if x.ndim and axis in (-1, x.ndim - 1) and x.shape[-1] <= _SHORT_ROW:
        return np.abs(x, out=scratch("affine.abs_max", x.shape)).max(axis=axis, keepdims=keepdims)
    return np.maximum(np.max(x, axis=axis, keepdims=keepdims), -np.min(x, axis=axis, keepdims=keepdims))


_SHORT_ROW = 1024


def conv_box(a: Box, p: AffineParams, attrs: Mapping[str, Any], out_shape: Sequence[int], transposed: bool = False,
             halves: Halves | None = None) -> Box:
    """Convolution (grouped, dilated, padded, any channel axis) in center-radius form over the whole
    batch (``conv_gemm``: one staged copy and one GEMM per group and operand), or transposed
    convolution through the float evaluator's scatter. An output sums at most
    ``in/groups * prod(kernel)`` products.

    As in ``linear_box``, the radius is |W| r (or, for an input radius that is uniform per sample,
    as an l-inf ball's is, max(r) times the in-bounds sums of |W|, computed once per input shape),
    plus the rounding bound gamma_n (|W| |c| + |b|) with |W| |c| <= max|c| |W| 1 (per sample).
    """
    ca = attrs["channel_axis"]
    if transposed:
        zero = np.zeros(out_shape[ca])
        geometry = dict(channel_axis=ca, stride=attrs["stride"], padding=attrs["padding"],
                        dilation=attrs["dilation"], groups=attrs["groups"], out_spatial=tuple(out_shape[ca + 1:]))
        b = p.bias.reshape((-1,) + (1,) * (len(out_shape) - ca - 1))
        terms = attrs["in_channels"] // attrs["groups"] * math.prod(attrs["kernel"]) + 1
        return affine_box(a, lambda v: conv_transpose_nd(v, p.weight, zero, **geometry),
                          lambda v: conv_transpose_nd(v, p.abs_weight, zero, **geometry), terms, b)
    lo, hi = a
    lead, in_tail = lo.shape[:ca], lo.shape[ca:]
    n = math.prod(lead)
    if n == 0:  # an empty batch: an empty box (the reshapes below cannot infer a size from 0 elements)
        return clean(np.zeros(tuple(out_shape)), np.zeros(tuple(out_shape)))
    g = gamma(attrs["in_channels"] // attrs["groups"] * math.prod(attrs["kernel"]) + 1)
    spatial_ones = (1,) * (len(in_tail) - 1)
    groups = attrs["groups"]
    c, r, finite = halves if halves is not None else box_halves(lo, hi)
    with np.errstate(all="ignore"):
        c, r = c.reshape((n,) + in_tail), r.reshape((n,) + in_tail)
        plan = conv_plan(c.shape, attrs)
        sums = in_bounds_abs_sums(p, attrs, in_tail)  # |W| applied to 1 in bounds, rounded up
        shape = (n,) + sums.shape
        bias = p.bias.reshape((-1,) + spatial_ones)
        mid = conv_products(stage(c, plan, np.float64, "affine.staged"), plan, p.weight, groups, "affine.products")
        mid = np.add(mid, bias, out=scratch("affine.mid", shape))
        r_max = _uniform_radius(r.reshape(n, -1))
        spread = None
        if r_max is None:
            spread = conv_products(stage(r, plan, np.float64, "affine.staged"), plan, p.abs_weight, groups,
                                   "affine.products")
        else:
            r_max = r_max.reshape((n, 1) + spatial_ones)
        flat_c = c.reshape(n, -1)
        c_max = (_abs_max(flat_c, axis=1) if flat_c.shape[1] else np.zeros(n)).reshape((n, 1) + spatial_ones)
        return _affine_ends(mid, c_max, r_max, spread, sums, bias, g, finite, tuple(out_shape))


Halves = tuple[np.ndarray, np.ndarray, bool]


def box_halves(lo: np.ndarray, hi: np.ndarray) -> Halves:
    """c = fl((lo + hi) / 2) and r = fl((hi - lo) / 2) in scratch buffers, and whether both are finite;
    for a box with an infinite or huge end, ``center_radius``'s finite center and exact cover instead."""
    with np.errstate(all="ignore"):
        c = np.add(lo, hi, out=scratch("affine.c", np.shape(lo)))
        c *= 0.5
        r = np.subtract(hi, lo, out=scratch("affine.r", np.shape(lo)))
        r *= 0.5
        if all_finite(c) and all_finite(r):
            return c, r, True
        c, r = center_radius(lo, hi)
        return c, r, False


def _doubled_halves(lo: np.ndarray, hi: np.ndarray) -> Halves:
    """``box_halves`` without the halving: 2c and 2r (or, for a box with an infinite or huge end,
    ``center_radius``'s c and r, and False)."""
    with np.errstate(all="ignore"):
        c2 = np.add(lo, hi, out=scratch("affine.c", np.shape(lo)))
        r2 = np.subtract(hi, lo, out=scratch("affine.r", np.shape(lo)))
        if all_finite(c2) and all_finite(r2):
            return c2, r2, True
        c, r = center_radius(lo, hi)
        return c, r, False


def _affine_ends(mid: np.ndarray, c_max: np.ndarray, r_max: np.ndarray | None, spread: np.ndarray | None,
                 sums: np.ndarray, bias: np.ndarray, g: float, finite: bool, shape: tuple[int, ...],
                 floor: float = MIN_NORMAL, g_bias: float | None = None) -> Box:
    """The box ``mid -+ T`` of an affine map over [c -+ r] (``box_halves``), in result memory.

    ``mid`` = fl(W c) + b; ``sums`` >= |W| 1 (per output); ``c_max`` and ``r_max`` (None unless the
    radius is uniform) per sample, broadcasting against ``mid``; ``spread`` = fl(|W| r) unless the
    radius is uniform. T = S ((1 + g)(1 + 3u) |W| r + (e_c max|c| + tiny) |W| 1 + e_c |b| + tiny), with
    |W| r <= max(r) |W| 1 for a uniform radius, S = ``_SAFETY_ROUNDED`` applied to each term (its
    few roundings are each of a non-negative sum or product; see the note at ``_SAFETY_ROUNDED``).
    ``g`` bounds the relative rounding error of ``mid``'s products (gamma_n); ``floor`` (per output,
    at least 2**-1022) any absolute part of it; ``g_bias`` (default ``g``) that of the bias's addition
    (smaller when the products ran in float32 and the bias was added in float64).
    """
    e_c = (g + 4 * U) * (1.0 + g)
    e_b = e_c if g_bias is None else (g_bias + 4 * U) * (1.0 + g)
    per_sample = (e_c * c_max + MIN_NORMAL) * _SAFETY_ROUNDED
    t = scratch("affine.t", mid.shape)
    if spread is None:
        per_sample += r_max * ((1.0 + 3 * U) * _SAFETY_ROUNDED)
        np.multiply(per_sample, sums, out=t)
    else:
        np.multiply(spread, (1.0 + g) * (1.0 + 3 * U) * _SAFETY_ROUNDED, out=t)
        t += np.multiply(per_sample, sums, out=scratch("affine.term", mid.shape))
    t += (e_b * np.abs(bias) + floor) * _SAFETY_ROUNDED
    out_lo = np.subtract(mid, t, out=result_array(mid.shape))
    out_hi = np.add(mid, t, out=result_array(mid.shape))
    if finite and all_finite(mid):
        # finite c, r and center: T >= 0 is a sum of non-negative terms (at worst +inf), so no end is NaN
        return CleanBox((out_lo.reshape(shape), out_hi.reshape(shape)))
    if not all_finite(mid):
        # an overflowed center says nothing: a partial sum can overflow while the exact value is finite
        lost = ~np.isfinite(mid)
        out_lo[lost], out_hi[lost] = -np.inf, np.inf
    return clean(out_lo.reshape(shape), out_hi.reshape(shape))


def _uniform_radius(flat_r: np.ndarray) -> np.ndarray | None:
    """Each sample's largest radius ``[n]`` when every sample's radii are equal up to rounding (an
    l-inf ball's), else None. The first sample is looked at alone first: usually it decides."""
    if not flat_r.size:
        return None
    first = flat_r[0]
    if first.min() < first.max() * _NEAR_UNIFORM:
        return None
    r_max = flat_r.max(axis=1)
    return r_max if bool(np.all(flat_r.min(axis=1) >= r_max * _NEAR_UNIFORM)) else None


# the last steps of conv_box round to nearest instead of outward, covered by the radius. With the center
# c = fl((lo + hi) / 2) and r = fl((hi - lo) / 2), the box lies in [c -+ (r (1 + 3u) + 1.01 u |c| + 2**-1072)],
# so |W| applied to that cover is (1 + 3u) |W| r + 1.01 u |W| |c| + 2**-1072 |W| 1. The final fl(m -+ T) is
# within u (|m| + T) of m -+ T, and |m| <= (1 + g)(|W| |c| + |b|): hence the 4u in e_c, and T's own 2u
# (with up to 8 roundings of its computation, each of a sum or product of non-negative numbers) in this
# factor, which is applied to each of T's terms before they are summed.
_SAFETY_ROUNDED = 1.0 + 24 * U


def batched_conv(x: np.ndarray, weight: np.ndarray, attrs: Mapping[str, Any], out: np.ndarray | None = None
                 ) -> np.ndarray:
    """``x`` ``[n, C, *spatial]`` (float64, or float32 with a float32 weight; any axes before a node's
    channel axis flattened into n) convolved with ``weight`` (no bias): ``[n, out, *out_spatial]``,
    a fresh array or written into ``out`` (``conv_gemm``'s staged GEMM, copied out)."""
    plan = conv_plan(x.shape, attrs)
    view = conv_products(stage(x, plan, x.dtype, "batched_conv.staged"), plan, weight, attrs["groups"],
                         "batched_conv.products")
    if out is None:
        out = np.empty(view.shape, view.dtype)
    np.copyto(out.reshape(view.shape), view)
    return out.reshape(view.shape)


def in_bounds_abs_sums(p: AffineParams, attrs: Mapping[str, Any], in_tail: tuple[int, ...]) -> np.ndarray:
    """Per output channel and position, an upper bound of the sum of |W| over the window cells that
    lie inside the input (padded cells carry no radius): ``[out, *out_spatial]``, cached per input
    shape on the prepared parameters."""
    key = ("in_bounds_abs_sums", in_tail)
    got = p.cache.get(key)
    if got is None:
        ones = np.ones((1,) + tuple(in_tail))
        terms = attrs["in_channels"] // attrs["groups"] * math.prod(attrs["kernel"])
        with np.errstate(all="ignore"):
            got = up(batched_conv(ones, p.abs_weight, attrs)[0] * (1.0 + gamma(terms)))
        p.cache[key] = got
    return got


def _is_point(a: Box) -> bool:
    return bool(np.array_equal(a[0], a[1]))


def _four_product_matmul(a: Box, b: Box) -> Box:
    """General interval matmul: per-term exact ranges (the extremes of the 4 endpoint products), then
    bounded sums.

    Works on [..., m, n] @ [..., n, p] (rank-1 operands promoted like torch.matmul), with the inner
    axis last and contiguous ([..., m, p, k] products: numpy's inner loops run along k, not along a
    short p) and chunked so the product tensors stay small. The products are not rounded one by one:
    a term's end is the rounded extreme product (rounding is monotone), and Higham's dot-product bound
    gamma_n sum |term| covers the products' and the sum's roundings together (``_term_sums``). When p
    is longer than k, p runs innermost instead ([..., k, m, p], summed over k)."""
    (alo, ahi), (blo, bhi) = a, b
    squeeze_m, squeeze_p = alo.ndim == 1, blo.ndim == 1
    if squeeze_m:
        alo, ahi = alo[None, :], ahi[None, :]
    if squeeze_p:
        blo, bhi = blo[:, None], bhi[:, None]
    m, n, p = alo.shape[-2], alo.shape[-1], blo.shape[-1]
    batch = np.broadcast_shapes(alo.shape[:-2], blo.shape[:-2])
    inner_k = n >= p  # the longer of k and p runs innermost
    if inner_k:
        blo, bhi = (np.ascontiguousarray(np.swapaxes(e, -1, -2)) for e in (blo, bhi))  # [..., p, n]
    else:
        alo, ahi = (np.ascontiguousarray(np.swapaxes(e, -1, -2)) for e in (alo, ahi))  # [..., n, m]
    lead = batch[0] if batch else 1
    step = max(1, _PRODUCTS_CHUNK // max(1, math.prod(batch[1:]) * m * p * n))  # leading indices per piece
    if not batch or step >= lead:
        lo, hi = _k_chunked_sums((alo, ahi), (blo, bhi), inner_k, batch, n)
    else:  # pieces of the leading axis (broadcast operands keep their length-1 axis): the same sums
        lo, hi = np.empty(batch + (m, p)), np.empty(batch + (m, p))
        for i0 in range(0, lead, step):
            pick = slice(i0, min(lead, i0 + step))
            part = [tuple(e[pick] if e.ndim == len(batch) + 2 and e.shape[0] != 1 else e for e in box)
                    for box in ((alo, ahi), (blo, bhi))]
            lo[pick], hi[pick] = _k_chunked_sums(part[0], part[1], inner_k, (pick.stop - i0,) + batch[1:], n)
    if squeeze_p:
        lo, hi = lo[..., 0], hi[..., 0]
    if squeeze_m:
        row = (Ellipsis, 0) if squeeze_p else (Ellipsis, 0, slice(None))
        lo, hi = lo[row], hi[row]
    return lo, hi


# the leading axis is cut into pieces of at most this many products (their six buffers stay in a core's
# L2 cache: 0.8x the time of one 2**18 piece on batch-64 attention products); k is cut into pieces of at
# most _K_CHUNK products (each piece's sums are added with outward rounding: fewer, larger pieces)
_PRODUCTS_CHUNK = 1 << 15
_K_CHUNK = 1 << 18


def _k_chunked_sums(a: Box, b: Box, inner_k: bool, batch: tuple[int, ...], n: int) -> Box:
    """``_four_product_matmul``'s sums for operands already laid out (``inner_k``: a ``[..., m, k]`` and b
    ``[..., p, k]``; else a ``[..., k, m]`` and b ``[..., k, p]``), over pieces of k whose products stay
    within ``_K_CHUNK`` terms, each piece's sums added with outward rounding."""
    (alo, ahi), (blo, bhi) = a, b
    m = alo.shape[-2] if inner_k else alo.shape[-1]
    p = blo.shape[-2] if inner_k else blo.shape[-1]
    chunk = max(1, _K_CHUNK // max(1, math.prod(batch) * m * p))
    lo = hi = None
    for k0 in range(0, n, chunk):
        sl = slice(k0, min(n, k0 + chunk))
        if inner_k:
            x, y = (alo[..., :, None, sl], ahi[..., :, None, sl]), (blo[..., None, :, sl], bhi[..., None, :, sl])
        else:
            x, y = (alo[..., sl, :, None], ahi[..., sl, :, None]), (blo[..., sl, None, :], bhi[..., sl, None, :])
        s_lo, s_hi = _term_sums(x, y, -1 if inner_k else -3)
        lo, hi = (s_lo, s_hi) if lo is None else ia.add((lo, hi), (s_lo, s_hi))
    if lo is None:
        lo = hi = np.zeros(batch + (m, p))
    return lo, hi


def _term_sums(x: Box, y: Box, axis: int) -> Box:
    """Bounds of sum_k x_k y_k over ``axis`` for boxes x, y (broadcast): each term's range is
    [min, max] of its 4 rounded endpoint products, which are fl of the exact extremes; the float sums
    of those ends are within gamma_k sum |end| (1 + u) of the exact ones (Higham, Lemma 3.1 and
    section 3.1, products included; ``gamma`` covers the 1 + u), and an underflowed product's absolute
    error (2**-1075 each) is inside the final outward step's 2**-1022. Non-finite products (0 * inf,
    overflow) take ``ia.mul``'s careful path and ``sum_bounds``."""
    shape = np.broadcast_shapes(*(e.shape for e in (*x, *y)))
    t_lo, t_hi = scratch("matmul.lo", shape), scratch("matmul.hi", shape)
    ia.corner_extremes(x, y, t_lo, t_hi, check=False)
    with np.errstate(all="ignore"):
        s_lo, s_hi = t_lo.sum(axis=axis), t_hi.sum(axis=axis)
        if not (all_finite(s_lo) and all_finite(s_hi)):  # a product was not finite, or a partial sum overflowed
            return sum_bounds(*ia.mul(x, y), axis=axis)
        g = gamma(shape[axis])
        e_lo = up(np.abs(t_lo, out=t_lo).sum(axis=axis) * g)
        e_hi = up(np.abs(t_hi, out=t_hi).sum(axis=axis) * g)
        return clean(down(s_lo - e_lo), up(s_hi + e_hi))


def matmul_box(a: Box, b: Box) -> Box:
    """Exact-range center-radius form when one operand is a point (a constant), else 4 products."""
    n = a[0].shape[-1]
    if _is_point(b):
        w = b[0]
        wabs = np.abs(w)
        return affine_box(a, lambda v: np.matmul(v, w), lambda v: np.matmul(v, wabs), n)
    if _is_point(a):
        w = a[0]
        wabs = np.abs(w)
        return affine_box(b, lambda v: np.matmul(w, v), lambda v: np.matmul(wabs, v), n)
    return _four_product_matmul(a, b)


# -- the rules --------------------------------------------------------------------------------

for _kind in ("linear", "conv", "conv_transpose"):
    FLOAT_RULES.params[_kind] = lambda node, record, dt: in_dtype(record, dt)
    INTERVAL_RULES.params[_kind] = lambda node, record: AffineParams.of(*record)


class FloatConvParams(NamedTuple):
    """A conv's float parameters: weight and bias in the evaluation dtype, and the depthwise path's
    band matrices when that path serves the node's geometry (built with the parameters, so once per
    prepared graph and domain; a non-finite input still takes im2col)."""

    weight: np.ndarray
    bias: np.ndarray
    band: np.ndarray | None


def _float_conv_params(node, record, dt) -> FloatConvParams:
    w, b = in_dtype(record, dt)
    a, ca = node.attrs, node.attrs["channel_axis"]
    out_spatial = tuple(node.out_shape[ca + 1:])
    band = None
    if depthwise_applies(a["in_channels"], a["groups"], a["kernel"], out_spatial, np.dtype(dt), out_channels=w.shape[0],
                         stride=a["stride"], dilation=a["dilation"]):
        band = depthwise_band(w, a["stride"], a["dilation"], out_spatial)
    return FloatConvParams(w, b, band)


FLOAT_RULES.params["conv"] = _float_conv_params


def rows_matmul(x: np.ndarray, m: np.ndarray) -> np.ndarray:
    """``x @ m`` for a 1-D or 2-D ``m``: the leading axes of ``x`` folded into one GEMM's rows. numpy's
    matmul on a stack runs one small GEMM per leading index (ConvNeXt's 1x7x7x768 activations
    through a 768x3072 linear: 10.9 ms against 3.4 ms as one 49-row GEMM; 64 subdomains' rows
    ``[64, 1, 256]`` through a 256x784 layer: 1.06 against 0.46 ms). A leading axis of stride 0 (one row
    broadcast, as branch and bound's shared input magnitudes) costs one row's product, repeated."""
    if not isinstance(m, np.ndarray) or m.ndim not in (1, 2) or x.ndim < 2:  # an operator object, a stack
        return x @ m
    if x.shape[0] > 1 and x.strides[0] == 0:  # one row broadcast along the leading axis: its product, repeated
        row = rows_matmul(x[:1], m)
        return np.repeat(row, x.shape[0], axis=0)
    if x.ndim == 2:
        return x @ m
    lead = x.shape[:-1]
    return np.matmul(x.reshape(math.prod(lead), x.shape[-1]), m).reshape(lead + m.shape[1:])


@float_rule("matmul")
def matmul(node, xs, rec, dt):
    return rows_matmul(xs[0], xs[1])


interval_rule("matmul")(lambda node, ps, rec: matmul_box(ps[0], ps[1]))


@float_rule("linear")
def linear(node, xs, rec, dt):
    x = xs[0]
    w, b = float_params(node, rec, x.shape, dt)
    y = rows_matmul(x, w.T)
    y += b
    return y


@interval_rule("linear")
def linear_rule(node, ps, rec):
    return linear_box(ps[0], read_params(INTERVAL_RULES, node, rec, ps[0][0].shape))


@float_rule("conv", "conv_transpose")
def conv(node, xs, rec, dt):
    a = node.attrs
    params = float_params(node, rec, xs[0].shape, dt)
    w, b = params[0], params[1]
    geometry = dict(channel_axis=a["channel_axis"], stride=a["stride"], padding=a["padding"], dilation=a["dilation"],
                    groups=a["groups"], out_spatial=node.out_shape[a["channel_axis"] + 1:])
    if node.kind == "conv_transpose":
        return conv_transpose_nd(xs[0], w, b, **geometry)
    return conv_nd(xs[0], w, b, padding_after=a["padding_after"], band=params.band, **geometry)


@interval_rule("conv", "conv_transpose")
def conv_rule(node, ps, rec):
    return conv_box(ps[0], read_params(INTERVAL_RULES, node, rec, ps[0][0].shape), node.attrs, node.out_shape,
                    transposed=node.kind == "conv_transpose")


# -- exact mode: TorchLean's folds (``matmulFlat``, ``linearLeading``, ``groupedConvSpec``) ----------


@exact_rule("matmul")
def matmul_exact(node, xs, rec, dt):
    """Each output ``acc = 0; for j: acc = acc + L[.., i, j] * R[.., j, k]``, rank-1 operands promoted
    (``matmulFlat``); batch axes broadcast. The contracted axis is moved to lead both operands."""
    left, right = xs
    n = left.shape[-1]
    lhs = left.reshape((1, n)) if left.ndim == 1 else left
    rhs = right.reshape((n, 1)) if right.ndim == 1 else right
    m, p = lhs.shape[-2], rhs.shape[-1]
    if rhs.ndim == 2:  # every left row against one matrix: the left rows are one long M
        out = fold_matmul(lhs.reshape((-1, n)).T, rhs)
    else:
        batch = np.broadcast_shapes(lhs.shape[:-2], rhs.shape[:-2])
        a = np.broadcast_to(np.swapaxes(lhs, -1, -2), batch + (n, m)).reshape((-1, n, m))
        b = np.broadcast_to(rhs, batch + (n, p)).reshape((-1, n, p))
        out = fold_matmul(a, b)
    return out.reshape(node.out_shape)


@exact_rule("linear")
def linear_exact(node, xs, rec, dt):
    """Per output ``acc = 0; for k: acc = acc + W[o, k] * x[k]`` (``linearLeading``), then ``acc + b[o]``."""
    x = xs[0]
    w, b = float_params(node, rec, x.shape, dt)
    y = fold_matmul(x.reshape((-1, w.shape[1])).T, w.T)
    y += b
    return y.reshape(node.out_shape)


@exact_rule("conv")
def conv_exact(node, xs, rec, dt):
    """``groupedConvSpec``: per output, ``acc = 0``, outer loop over the group's input channels, inner
    loop over kernel offsets in row-major order, ``acc = acc + x * w`` with padded cells read as +0.0;
    the bias added last. The windows are gathered once (im2col) with the (channel, offset) steps
    leading, in that order, then folded like a matrix product."""
    a = node.attrs
    w, b, _ = float_params(node, rec, xs[0].shape, dt)
    x, ca, groups = xs[0], a["channel_axis"], a["groups"]
    lead, spatial = x.shape[:ca], x.shape[ca + 1:]
    out_spatial = tuple(node.out_shape[ca + 1:])
    n, length = math.prod(lead), math.prod(out_spatial)
    cin_g, cout_g = a["in_channels"] // groups, a["out_channels"] // groups
    pad = [(0, 0), (0, 0)] + list(zip(a["padding"], a["padding_after"]))
    xp = np.pad(x.reshape((n, a["in_channels"]) + spatial), pad)
    xp = xp.reshape((n, groups, cin_g) + xp.shape[2:])
    offsets = list(itertools.product(*(range(k) for k in a["kernel"])))
    # cols[g, j, offset, sample, *out]: channel j's cell at `offset` of every output's window
    cols = np.empty((groups, cin_g, len(offsets), n) + out_spatial)
    for i, offs in enumerate(offsets):
        window = tuple(slice(o * d, o * d + (m - 1) * s + 1, s)
                       for o, d, m, s in zip(offs, a["dilation"], out_spatial, a["stride"]))
        cols[:, :, i] = np.moveaxis(xp[(slice(None),) * 3 + window], 0, 2)
    steps = cin_g * len(offsets)
    weights = np.swapaxes(w.reshape((groups, cout_g, steps)), 1, 2)  # [g, step, cout_g]
    acc = fold_matmul(weights, cols.reshape((groups, steps, n * length)))  # [g, cout_g, n * length]
    acc = np.moveaxis(acc.reshape((a["out_channels"], n, length)), 1, 0)
    acc = acc + b.reshape((-1, 1))
    return acc.reshape(node.out_shape)
