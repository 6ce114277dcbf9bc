"""Pooling and resampling: max_pool, avg_pool (v1), max_pool_nd, avg_pool_nd, resize_linear.

The window arithmetic is ``semantics.conv``'s (``pool_nd``); resizing's taps are ``semantics.resize``'s.
Max pooling is exact on the ends; average pooling sums windows with the dot-product error bound.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from torchlean_bridge.graph import Node

from ..conv import EMPTY_WINDOW, avg_pool_divisor, pool_nd, pool_out_spatial
from ..interval_arith import DomainError, divide_exact
from ..interval_round import Box, clean, down, gamma, up
from ..resize import resize_linear, resize_linear_box
from .table import domain_error, exact_rule, float_rule, interval_rule, on_ends

__all__ = ["avg_pool_box"]


def _out_spatial(node: Node) -> tuple[int, ...]:
    return pool_out_spatial(node.out_shape, node.attrs["spatial_rank"])


@float_rule("max_pool")
def max_pool(node, xs, rec, dt):
    """TorchLean's ``maxPoolValue``: padded cells ignored, the first maximum wins (``cell > best``)."""
    a, r = node.attrs, node.attrs["spatial_rank"]
    return pool_nd(xs[0], mode="max_first", kernel=a["kernel"], stride=a["stride"], padding=a["padding"],
                   padding_after=a["padding"], dilation=(1,) * r, out_spatial=_out_spatial(node))


@float_rule("max_pool_nd")
def max_pool_nd(node, xs, rec, dt):
    """A window made only of padding (possible with dilation) gives -inf, as in PyTorch and ONNX."""
    a = node.attrs
    return pool_nd(xs[0], mode="max", kernel=a["kernel"], stride=a["stride"], padding=a["padding"],
                   padding_after=a["padding_after"], dilation=a["dilation"], out_spatial=_out_spatial(node))


on_ends("max_pool", "max_pool_nd")


@float_rule("avg_pool")
def avg_pool(node, xs, rec, dt):
    a, r = node.attrs, node.attrs["spatial_rank"]
    return pool_nd(xs[0], mode="avg", kernel=a["kernel"], stride=a["stride"], padding=a["padding"],
                   padding_after=a["padding"], dilation=(1,) * r, out_spatial=_out_spatial(node),
                   divisor=float(math.prod(a["kernel"])))


@exact_rule("avg_pool")
def avg_pool_exact(node, xs, rec, dt):
    """Every window summed cell by cell in row-major order from +0.0 (padded cells add +0.0, which
    changes nothing), whatever the window's size; then divided by prod(kernel)."""
    a, r = node.attrs, node.attrs["spatial_rank"]
    return pool_nd(xs[0], mode="avg", kernel=a["kernel"], stride=a["stride"], padding=a["padding"],
                   padding_after=a["padding"], dilation=(1,) * r, out_spatial=_out_spatial(node),
                   divisor=float(math.prod(a["kernel"])), sequential=True)


@float_rule("avg_pool_nd")
def avg_pool_nd(node, xs, rec, dt):
    """Divisor per window: cells inside the padded input (count_include_pad) or inside the input."""
    a, x = node.attrs, xs[0]
    out = _out_spatial(node)
    divisor = avg_pool_divisor(a, x.shape[x.ndim - a["spatial_rank"]:], out)
    if np.any(divisor == 0):
        raise domain_error(node, EMPTY_WINDOW)
    return pool_nd(x, mode="avg", kernel=a["kernel"], stride=a["stride"], padding=a["padding"],
                   padding_after=a["padding_after"], dilation=a["dilation"], out_spatial=out, divisor=divisor)


def avg_pool_box(a: Box, attrs: Mapping[str, Any], out_spatial: Sequence[int],
                 divisor: np.ndarray | float) -> Box:
    """Window sums (padded cells count as 0) with the dot-product error bound, then the division."""
    r = attrs["spatial_rank"]
    geometry = dict(kernel=attrs["kernel"], stride=attrs["stride"], padding=attrs["padding"],
                    padding_after=attrs.get("padding_after", attrs["padding"]),
                    dilation=attrs.get("dilation", (1,) * r), out_spatial=out_spatial)
    n = math.prod(attrs["kernel"])
    g = gamma(max(n - 1, 1))
    with np.errstate(all="ignore"):
        sums = [pool_nd(x, mode="avg", divisor=1.0, **geometry) for x in (a[0], a[1], np.abs(a[0]), np.abs(a[1]))]
        lo = down(sums[0] - up(sums[2] * g))
        hi = up(sums[1] + up(sums[3] * g))
    return divide_exact(clean(lo, hi), divisor)


@interval_rule("avg_pool")
def avg_pool_rule(node, ps, rec):
    out = pool_out_spatial(node.out_shape, node.attrs["spatial_rank"])
    return avg_pool_box(ps[0], node.attrs, out, float(math.prod(node.attrs["kernel"])))


@interval_rule("avg_pool_nd")
def avg_pool_nd_rule(node, ps, rec):
    """Divisor per window as PyTorch/ONNX: cells inside the padded input, or inside the input."""
    a, x = node.attrs, ps[0][0]
    out = pool_out_spatial(node.out_shape, a["spatial_rank"])
    divisor = avg_pool_divisor(a, x.shape[x.ndim - a["spatial_rank"]:], out)
    if np.any(divisor == 0):
        raise DomainError(f"avg_pool_nd: {EMPTY_WINDOW}")
    return avg_pool_box(ps[0], a, out, divisor.astype(np.float64))


@float_rule("resize_linear")
def resize(node, xs, rec, dt):
    a = node.attrs
    return resize_linear(xs[0], a["sizes"], a["coordinate_mode"])


@interval_rule("resize_linear")
def resize_box(node, ps, rec):
    return resize_linear_box(*ps[0], node.attrs["sizes"], node.attrs["coordinate_mode"])
