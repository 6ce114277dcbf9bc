"""Interval linear and conv with float32 matrix products (``products="float32"``), still sound.

The float64 rules (``affine``) cost two float64 GEMMs per layer; BLAS runs float32 products up to
twice as fast, which is what auto_LiRPA's IBP uses (without any rounding allowance). Here both
products of the center-radius form run in float32 and their rounding is bounded rigorously (Higham's
order-independent dot-product bound with u = 2**-24, gamma32(n) for n terms per output):

- c = fl((lo + hi) / 2), r = fl((hi - lo) / 2) in float64 (each within 3u64 of exact, covered below);
  c32 = fl32(c) is within 2**-24 |c| + 2**-150 of c;
- mid32 = fl32(W c32) is within gamma32(n) |W| |c32| + A of W c32, with A = n 2**-126 (2 + max|W|)
  covering float32 underflow (flush-to-zero included);
- so the exact image of the box lies in mid32 +- (|W| v + A) for v = r (1 + 3u64) + g' |c| + tiny with
  g' = gamma32(n) (1 + 2**-24) + 2**-24 + 1.01 u64, v rounded up to float32 (v32);
- t32 = fl32(|W| v32) bounds |W| v32 within a factor 1 + gamma32(n), plus A;
- in float64, s = fl(mid32 + b) and the ends fl(s -+ T) with T = K t32 + kappa: K and the per-channel
  kappa cover the two float64 roundings, using |s| <= (|W| v) (1 + g) / g + |b| (every |c32| term
  is at most |W| v / g), so no further pass over the output is needed.

The bounds are wider than the float64 rules' by about gamma32(n) |W| |c| (n the terms per output): a
relative 1e-5 to 1e-3 of the width on typical layers, the price of the speed. A node keeps its
float64 rule when its weight is not exactly a float32 array (a float64 checkpoint), when n >= 2**20,
when float32 would overflow, and when the input radius is uniform per sample (an l-inf ball at the
first layer: there the float64 rule needs a single product).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..interval_round import MIN_NORMAL, U, Box
from ..scratch import scratch
from .affine import _NEAR_UNIFORM, AffineParams, batched_conv, conv_box, linear_box
from .table import INTERVAL_RULES, read_params

__all__ = ["FLOAT32_OVERRIDES", "Float32Weights", "float32_weights", "linear_box32", "conv_box32", "gamma32"]

U32 = 2.0 ** -24
F32 = np.dtype(np.float32)
_MAX_TERMS = 1 << 20
_F32_MIN_NORMAL = 2.0 ** -126
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


def float32_weights(p: AffineParams, n_terms: int) -> Float32Weights | None:
    """The float32 forms of ``p``'s weight and its bound's constants (cached on ``p``), or None when
    the weight is not exactly representable in float32 or an output sums too many terms."""
    key = ("float32", n_terms)
    if key not in p.cache:
        w32 = p.weight.astype(F32)
        got = None
        if n_terms < _MAX_TERMS and bool(np.array_equal(w32.astype(np.float64), p.weight)):
            g = gamma32(n_terms)
            w_max = float(np.max(np.abs(p.weight))) if p.weight.size else 0.0
            underflow = n_terms * _F32_MIN_NORMAL * (2.0 + w_max)
            scale = (1.0 + g) * (1.0 + 16 * U) + 16 * U * (1.0 + g) ** 2 / g
            floor = (2.0 * underflow + MIN_NORMAL) * (1.0 + 1.0 / g) * 4.0
            got = Float32Weights(w32, np.abs(w32), g, (g * (1.0 + U32) + U32 + 1.01 * U) * (1.0 + 4 * U), scale, floor)
        p.cache[key] = got
    return p.cache[key]


Apply32 = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]


def _box32(lo: np.ndarray, hi: np.ndarray, samples: int, apply: Apply32, w: Float32Weights, bias: np.ndarray,
           out_shape: tuple[int, ...]) -> Box | None:
    """The box of ``W x + bias`` over [lo, hi] (``[samples, ...]``) from two float32 products
    (``apply(weight32, x32, out)`` writes the float32 linear map into ``out``), or None when the
    float64 rule is the better choice (uniform radius) or float32 overflows."""
    with np.errstate(all="ignore"):
        c = np.add(lo, hi, out=scratch("affine.c", lo.shape))
        c *= 0.5
        r = np.subtract(hi, lo, out=scratch("affine.r", lo.shape))
        r *= 0.5
        flat_r = r.reshape(samples, -1)
        if not flat_r.shape[1] or np.all(flat_r.min(axis=1) >= flat_r.max(axis=1) * _NEAR_UNIFORM):
            return None
        c32 = scratch("affine32.c", c.shape, F32)
        np.copyto(c32, c, casting="same_kind")
        v = np.abs(c, out=scratch("affine32.v", c.shape))
        v *= w.g_center
        v += r
        v *= _TO_F32_UP * (1.0 + 3 * U)  # r's own float64 rounding (3u), then up to float32
        v += _TO_F32_TINY + 2.0 ** -1072
        v32 = scratch("affine32.v32", c.shape, F32)
        np.copyto(v32, v, casting="same_kind")
        mid32 = apply(w.weight, c32, scratch("affine32.mid", out_shape, F32))
        t32 = apply(w.abs_weight, v32, scratch("affine32.t", out_shape, F32))
        if not (np.isfinite(np.sum(mid32)) and np.isfinite(np.sum(t32))):
            return None  # also a center or radius beyond float32's range
        s = np.add(mid32, bias, out=scratch("affine.mid", out_shape))
        t = np.multiply(t32, w.scale, out=scratch("affine.t", out_shape))
        t += w.floor + 4.01 * U * np.abs(bias)
        return np.subtract(s, t), np.add(s, t)


def linear_box32(a: Box, p: AffineParams) -> Box:
    """``linear_box`` with float32 products, or ``linear_box`` itself where float32 is not used."""
    lo, hi = a
    w = float32_weights(p, p.weight.shape[1])
    if w is not None and lo.ndim:
        samples = math.prod(lo.shape[:-1])
        got = _box32(lo, hi, samples, lambda weight, x, out: np.matmul(x, weight.T, out=out), w, p.bias,
                     lo.shape[:-1] + p.weight.shape[:1])
        if got is not None:
            return got
    return linear_box(a, p)


def conv_box32(a: Box, p: AffineParams, attrs: Mapping[str, Any], out_shape: Sequence[int]) -> Box:
    """``conv_box`` (not transposed) with float32 products, or ``conv_box`` where float32 is not used."""
    ca = attrs["channel_axis"]
    lo, hi = a
    lead, in_tail = lo.shape[:ca], lo.shape[ca:]
    n = math.prod(lead)
    w = float32_weights(p, attrs["in_channels"] // attrs["groups"] * math.prod(attrs["kernel"]))
    if w is not None and n:
        bias = p.bias.reshape((-1,) + (1,) * (len(in_tail) - 1))
        got = _box32(lo.reshape((n,) + in_tail), hi.reshape((n,) + in_tail), n,
                     lambda weight, x, out: batched_conv(x, weight, attrs, out=out), w, bias,
                     (n,) + tuple(out_shape[ca:]))
        if got is not None:
            return got[0].reshape(tuple(out_shape)), got[1].reshape(tuple(out_shape))
    return conv_box(a, p, attrs, out_shape)


def _linear_rule32(node, ps, rec):
    return linear_box32(ps[0], read_params(INTERVAL_RULES, node, rec, ps[0][0].shape))


def _conv_rule32(node, ps, rec):
    return conv_box32(ps[0], read_params(INTERVAL_RULES, node, rec, ps[0][0].shape), node.attrs, node.out_shape)


# the interval rules that ``products="float32"`` replaces (conv_transpose and matmul keep float64)
FLOAT32_OVERRIDES: dict[str, Callable] = {"linear": _linear_rule32, "conv": _conv_rule32}
