"""Spatial sampling lowerings (issue #15): F.grid_sample / aten.grid_sampler* (``grid_sample`` in torch's
convention), F.affine_grid / aten.affine_grid_generator (the base grid times theta, as PyTorch computes it),
F.fold / aten.col2im (``col2im``) and F.lp_pool1d/2d/3d (PyTorch's own composition: the average of x^p, times
the window size, through sign * relu(abs), to the power 1/p; torch.export already decomposes it that way).
"""

from __future__ import annotations

import math
from typing import Any

from torchlean_bridge.ops import FLOAT

from ..grids import affine_base_grid
from . import ops_elementwise as elementwise
from . import ops_layout as layout
from .common import NotLowerable
from .lowerer import Lowerer
from .ops_nn import AVG_POOL, _tuple
from .targets import lowers, register

Cx = Lowerer

_GRID_MODES = {"bilinear": "linear", "nearest": "nearest", "bicubic": "cubic"}
_ATEN_GRID_MODES = {0: "linear", 1: "nearest", 2: "cubic"}
_ATEN_PADDING = {0: "zeros", 1: "border", 2: "reflection"}


def _grid_sample(cx: Cx, input: Any, grid: Any, mode: str, padding_mode: str, align_corners: bool) -> Any:
    r = cx.rank(input) - 2
    if r not in (2, 3):
        raise NotLowerable(f"grid_sample of a rank-{cx.rank(input)} input (torch samples 4-D and 5-D inputs)")
    if mode == "cubic" and r != 2:
        raise NotLowerable("bicubic grid_sample of a 5-D input (torch samples bicubic in 2-D only)")
    attrs = {"mode": mode, "padding_mode": padding_mode, "align_corners": bool(align_corners), "convention": "torch"}
    return cx.add("grid_sample", [cx.node(input, FLOAT), cx.node(grid, FLOAT)], attrs)


@lowers(fx="F.grid_sample")
def grid_sample(cx: Cx, input: Any, grid: Any, mode: str = "bilinear", padding_mode: str = "zeros",
                align_corners: Any = None) -> Any:
    if mode not in _GRID_MODES or padding_mode not in _ATEN_PADDING.values():
        raise NotLowerable(f"grid_sample mode={mode!r} padding_mode={padding_mode!r}")
    return _grid_sample(cx, input, grid, _GRID_MODES[mode], padding_mode, bool(align_corners))


@lowers(aten="grid_sampler.default grid_sampler_2d.default grid_sampler_3d.default")
def aten_grid_sampler(cx: Cx, input: Any, grid: Any, interpolation_mode: int, padding_mode: int,
                      align_corners: bool) -> Any:
    if interpolation_mode not in _ATEN_GRID_MODES or padding_mode not in _ATEN_PADDING:
        raise NotLowerable(f"grid_sampler interpolation_mode={interpolation_mode} padding_mode={padding_mode}")
    return _grid_sample(cx, input, grid, _ATEN_GRID_MODES[interpolation_mode], _ATEN_PADDING[padding_mode],
                        align_corners)


@lowers(fx="F.affine_grid", aten="affine_grid_generator.default")
def affine_grid(cx: Cx, theta: Any, size: Any, align_corners: Any = None) -> Any:
    """grid[n, cell] = base[cell] @ theta[n]^T: PyTorch's ``base_grid.view(N, -1, r + 1).bmm(theta.transpose)``."""
    size = [int(v) for v in size]
    r = len(size) - 2
    ts = cx.shape(theta)
    if r not in (2, 3) or tuple(ts) != (size[0], r, r + 1):
        raise NotLowerable(f"affine_grid of theta {list(ts)} for size {size}")
    spatial = tuple(size[2:])
    cells = math.prod(spatial)
    if max(cells * (r + 1), size[0] * cells * r) > cx.builder.max_elements:
        raise NotLowerable(f"affine_grid for size {size} is above the element limit")
    t = cx.add("permute", [cx.node(theta, FLOAT)], {"perm": (0, 2, 1)})  # [N, r + 1, r]
    const = cx.builder.const(affine_base_grid(spatial, bool(align_corners)), source=cx.source(), folded=True)
    grid = cx.add("matmul", [const, cx.node(t)])  # [N, cells, r]
    return layout.reshape(cx, grid, [size[0], *spatial, r])


def _fold(cx: Cx, input: Any, output_size: Any, kernel_size: Any, dilation: Any, padding: Any, stride: Any) -> Any:
    image = _tuple(output_size, 2)
    s = cx.shape(input)
    if len(s) not in (2, 3):
        raise NotLowerable(f"fold of a rank-{len(s)} input (torch folds (N, C * prod(kernel), L) or unbatched)")
    pad = _tuple(padding, 2)
    attrs = {"spatial_rank": 2, "image": image, "block": _tuple(kernel_size, 2), "stride": _tuple(stride, 2),
             "padding": pad, "padding_after": pad, "dilation": _tuple(dilation, 2)}
    x = cx.node(input, FLOAT) if len(s) == 3 else cx.node(layout.reshape(cx, input, [1, *s]), FLOAT)
    y = cx.add("col2im", [x], attrs)
    return y if len(s) == 3 else layout.reshape(cx, y, list(cx.shape(y))[1:])


@lowers(fx="F.fold")
def fold(cx: Cx, input: Any, output_size: Any, kernel_size: Any, dilation: Any = 1, padding: Any = 0,
         stride: Any = 1) -> Any:
    return _fold(cx, input, output_size, kernel_size, dilation, padding, stride)


@lowers(aten="col2im.default")
def aten_col2im(cx: Cx, input: Any, output_size: Any, kernel_size: Any, dilation: Any, padding: Any,
                stride: Any) -> Any:
    return _fold(cx, input, output_size, kernel_size, dilation, padding, stride)


def lp_pool(r: int):
    """F.lp_pool{r}d as torch computes it (see the module docstring)."""

    def lower(cx: Cx, input: Any, norm_type: float, kernel_size: Any, stride: Any = None,
              ceil_mode: bool = False) -> Any:
        k = _tuple(kernel_size, r)
        powered = elementwise.power(cx, input, float(norm_type))
        out = AVG_POOL[r](cx, powered, k, stride, 0, ceil_mode)
        magnitude = cx.add("relu", [cx.node(cx.add("abs", [cx.node(out, FLOAT)]))])
        signed = elementwise.mul(cx, cx.add("sign", [cx.node(out, FLOAT)]), magnitude)
        return elementwise.power(cx, elementwise.mul(cx, signed, math.prod(k)), 1.0 / float(norm_type))

    return lower


for _r in (1, 2, 3):
    register(lp_pool(_r), fx=f"F.lp_pool{_r}d")
