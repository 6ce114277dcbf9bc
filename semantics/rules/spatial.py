"""Spatial sampling ops: grid_sample, lp_pool_nd, col2im, deform_conv, roi_align (kernels in ``semantics.spatial``).

Interval rules: lp_pool_nd is |x|^p (monotone), a window sum with the dot-product error bound and a
monotone root; col2im is a scatter-add with the same error bound; grid_sample with a point grid is linear
in the image (``semantics.spatial_box``). deform_conv and roi_align are refused in interval mode by name:
their sampling positions are computed from an input.
"""

from __future__ import annotations

import math

import numpy as np

from torchlean_bridge.ops.contracts import current_element_limit
from torchlean_bridge.ops.spatial import col2im_blocks

from .. import interval_arith as ia
from ..conv import pool_out_spatial
from ..interval_round import clean, down, gamma, up
from ..spatial import col2im, deform_conv, grid_sample, lp_pool, roi_align, roi_grid
from ..spatial_box import grid_sample_box
from .elementwise import pow_box
from .pooling import avg_pool_box
from .table import domain_error, float_rule, interval_rule

__all__ = ["NO_SPATIAL_INTERVAL_RULE"]

NO_SPATIAL_INTERVAL_RULE = {
    "deform_conv": "its sampling positions are computed from the offset input",
    "roi_align": "its sampling positions are computed from the rois input",
}


@float_rule("grid_sample")
def grid_sample_value(node, xs, rec, dt):
    """A NaN or infinite grid coordinate has no pixel to read: refused, not given a made-up value."""
    x, grid = xs
    if not np.all(np.isfinite(grid)):
        raise domain_error(node, "the grid holds a NaN or infinite coordinate")
    a = node.attrs
    return grid_sample(x, grid, a["mode"], a["padding_mode"], a["align_corners"], a["convention"])


@interval_rule("grid_sample")
def grid_sample_interval(node, ps, rec):
    """Linear in the image for a point grid (a constant, or an input given a zero-width box)."""
    (lo, hi), (glo, ghi) = ps
    if not np.array_equal(glo, ghi):
        raise ia.DomainError("grid_sample: interval bounds need the grid as a point (a constant grid); its box has "
                             f"width up to {float(np.max(ghi - glo)):g}")
    if not np.all(np.isfinite(glo)):
        raise ia.DomainError("grid_sample: the grid holds a NaN or infinite coordinate")
    a = node.attrs
    return grid_sample_box(lo, hi, glo, a["mode"], a["padding_mode"], a["align_corners"], a["convention"])


@float_rule("lp_pool_nd")
def lp_pool_value(node, xs, rec, dt):
    return lp_pool(xs[0], node.attrs, pool_out_spatial(node.out_shape, node.attrs["spatial_rank"]))


@interval_rule("lp_pool_nd")
def lp_pool_interval(node, ps, rec):
    a = node.attrs
    p = float(a["p"])
    powered = pow_box(ia.abs_box(ps[0]), {"exponent": p})
    sums = avg_pool_box(powered, a, pool_out_spatial(node.out_shape, a["spatial_rank"]), 1.0)
    sums = (np.maximum(sums[0], 0.0), np.maximum(sums[1], 0.0))  # a sum of non-negative terms
    return pow_box(sums, {"exponent": 1.0 / p}) if p != 1 else sums


@float_rule("col2im")
def col2im_value(node, xs, rec, dt):
    return col2im(xs[0], node.attrs, col2im_blocks(node.attrs))


@interval_rule("col2im")
def col2im_interval(node, ps, rec):
    """Each image cell sums at most prod(block) columns (from 0): the ends' sums, widened by gamma(k - 1)
    times the sum of magnitudes."""
    a, (lo, hi) = node.attrs, ps[0]
    blocks = col2im_blocks(a)
    g = gamma(max(math.prod(a["block"]) - 1, 1))
    with np.errstate(all="ignore"):
        s_lo, s_hi = col2im(lo, a, blocks), col2im(hi, a, blocks)
        m_lo, m_hi = col2im(np.abs(lo), a, blocks), col2im(np.abs(hi), a, blocks)
        return clean(down(s_lo - up(m_lo * g)), up(s_hi + up(m_hi * g)))


@float_rule("deform_conv")
def deform_conv_value(node, xs, rec, dt):
    x, w, offset, bias, mask = xs
    if not (np.all(np.isfinite(offset))):
        raise domain_error(node, "the offsets hold a NaN or infinite value")
    return deform_conv(x, w, offset, bias, mask, node.attrs, node.out_shape[2:])


@float_rule("roi_align")
def roi_align_value(node, xs, rec, dt):
    """Sample counts per bin may come from the rois' extents: the buffers they imply are sized first."""
    x, rois, batch = xs
    if not np.all(np.isfinite(rois)):
        raise domain_error(node, "the rois hold a NaN or infinite coordinate")
    if np.any((batch < 0) | (batch >= x.shape[0])):
        raise domain_error(node, f"a batch index lies outside [0, {x.shape[0]})")
    gh, gw = roi_grid(rois, node.attrs, np.dtype(dt))
    cells = math.prod(node.out_shape) * gh * gw
    if cells > current_element_limit():
        raise domain_error(node, f"the rois need {gh} x {gw} samples per bin ({cells} sample reads), above the "
                                 f"element limit of {current_element_limit()}")
    return roi_align(x, rois.astype(dt, copy=False), batch.astype(np.int64, copy=False), node.attrs, gh, gw)


@interval_rule(*NO_SPATIAL_INTERVAL_RULE)
def spatial_no_interval(node, ps, rec):
    raise ia.DomainError(f"no interval rule for {node.kind}: {NO_SPATIAL_INTERVAL_RULE[node.kind]}")
