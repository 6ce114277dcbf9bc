"""Resizing lowerings: nearest upsampling by integer factors (exact repetition) and linear, bilinear
and trilinear interpolation (``resize_linear``); other modes are refused by name.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any, Sequence

from torchlean_bridge.ops import FLOAT

from .common import NotLowerable
from .lowerer import Lowerer
from .ops_layout import expand, reshape
from .targets import lowers, register

Cx = Lowerer


# -- nearest upsampling ----------------------------------------------------------------------------
def _integer_factors(cx: Cx, input: Any, r: int, size: Any, scales: Any) -> list[int]:
    """Per spatial axis the factor f such that PyTorch reads input index ``o // f``: an integer
    scale factor, or an output size that is an integer multiple of the input's."""
    spatial = list(cx.shape(input)[-r:])
    if scales is not None and not all(v is None for v in _as_list(scales, r)):
        values = [float(v) for v in _as_list(scales, r)]
        if any(v < 1 or v != int(v) for v in values):
            raise NotLowerable(f"nearest upsampling with scale factors {values} (only integer factors >= 1)")
        return [int(v) for v in values]
    if size is None:
        raise NotLowerable("nearest upsampling without a size or scale factor")
    sizes = [int(v) for v in _as_list(size, r)]
    if any(o < i or o % i for o, i in zip(sizes, spatial)):
        raise NotLowerable(f"nearest upsampling from {spatial} to {sizes} (only integer multiples)")
    return [o // i for o, i in zip(sizes, spatial)]


def _as_list(v: Any, r: int) -> list[Any]:
    if isinstance(v, (int, float)) or v is None:
        return [v] * r
    v = list(v)
    return v * r if len(v) == 1 else v


def repeat_each(cx: Cx, input: Any, factors: Sequence[int]) -> Any:
    """Every entry of the trailing axes repeated ``factors[i]`` times (the ONNX importer's nearest
    Resize): reshape to (e, 1) pairs, broadcast to (e, f), merge."""
    s = list(cx.shape(input))
    lead = s[:len(s) - len(factors)]
    tail = s[len(lead):]
    if all(f == 1 for f in factors):
        return input
    x = reshape(cx, input, lead + [d for e in tail for d in (e, 1)])
    x = expand(cx, x, lead + [d for e, f in zip(tail, factors) for d in (e, f)])
    return reshape(cx, x, lead + [e * f for e, f in zip(tail, factors)])


_LINEAR_MODES = {"linear": 1, "bilinear": 2, "trilinear": 3}


@lowers(fx="F.interpolate F.upsample")
def interpolate(cx: Cx, input: Any, size: Any = None, scale_factor: Any = None, mode: str = "nearest",
                align_corners: Any = None, recompute_scale_factor: Any = None, antialias: bool = False) -> Any:
    """F.interpolate: nearest (and nearest-exact) with integer factors repeat each entry; linear,
    bilinear and trilinear are ``resize_linear``; bicubic and area are out of scope."""
    r = cx.rank(input) - 2
    if r < 1:
        raise NotLowerable(f"interpolate of a rank-{cx.rank(input)} input (needs (N, C, *spatial))")
    if mode in _LINEAR_MODES:
        if antialias:
            raise NotLowerable(f"interpolate mode={mode!r} with antialias=True")
        scales = None if recompute_scale_factor else scale_factor
        return resize_linear(cx, input, r, size, scales, bool(align_corners))
    if mode not in ("nearest", "nearest-exact"):
        raise NotLowerable(f"interpolate mode={mode!r} (nearest with integer scale factors, or (bi/tri)linear)")
    return repeat_each(cx, input, _integer_factors(cx, input, r, size, scale_factor))


def resize_linear(cx: Cx, input: Any, r: int, size: Any, scales: Any, align_corners: bool) -> Any:
    """Linear interpolation of the trailing ``r`` axes. Without align_corners PyTorch's source
    coordinate uses a given scale factor, and ours uses out/in: they must be equal (as rationals)."""
    spatial = list(cx.shape(input)[-r:])
    given = None if scales is None or all(v is None for v in _as_list(scales, r)) else _as_list(scales, r)
    if size is not None:
        sizes = [int(v) for v in _as_list(size, r)]
    elif given is not None:
        sizes = [int(math.floor(i * float(f))) for i, f in zip(spatial, given)]
    else:
        raise NotLowerable("linear interpolation without a size or scale factor")
    if not align_corners and given is not None:
        for i, o, f in zip(spatial, sizes, given):
            if f is not None and Fraction(float(f)) != Fraction(o, i):
                raise NotLowerable(f"linear interpolation with scale factor {f} from {i} to {o} cells (PyTorch's "
                                   "coordinates then use the scale, not out/in; pass a size or "
                                   "recompute_scale_factor=True)")
    if sizes == spatial:  # PyTorch copies (its kernels special-case equal sizes)
        return input
    mode = "align_corners" if align_corners else "half_pixel"
    return cx.add("resize_linear", [cx.node(input, FLOAT)],
                  {"spatial_rank": r, "sizes": sizes, "coordinate_mode": mode})


@lowers(fx="F.upsample_nearest")
def f_upsample_nearest(cx: Cx, input: Any, size: Any = None, scale_factor: Any = None) -> Any:
    return interpolate(cx, input, size, scale_factor)


def upsample_linear(r: int):
    """aten.upsample_{linear1d,bilinear2d,trilinear3d}: ``.vec`` passes (output_size, align_corners,
    scale_factors); ``.default`` passes output_size, align_corners and one optional scale per axis."""

    def lower(cx: Cx, input: Any, output_size: Any, align_corners: bool, *scales: Any) -> Any:
        if len(scales) == 1 and (scales[0] is None or isinstance(scales[0], (list, tuple))):
            return resize_linear(cx, input, r, output_size, scales[0], bool(align_corners))
        return resize_linear(cx, input, r, output_size, list(scales) or None, bool(align_corners))

    return lower


def upsample_interpolating(mode: str):
    """aten.upsample_bicubic2d (and other interpolating modes without an IR form): refused with the reason."""

    def lower(cx: Cx, *args: Any, **kwargs: Any) -> Any:
        raise NotLowerable(f"upsampling mode={mode!r} (nearest with integer scale factors, or (bi/tri)linear)")

    return lower


def upsample_nearest(r: int):
    """aten.upsample_nearest{r}d and _upsample_nearest_exact{r}d: ``.vec`` passes (output_size,
    scale_factors); ``.default`` passes output_size and one optional scale per axis, which PyTorch
    reads as ``floor(o / scale)``, so a given scale must be the integer factor the size implies."""

    def lower(cx: Cx, input: Any, output_size: Any, *scales: Any) -> Any:
        if len(scales) == 1 and (scales[0] is None or isinstance(scales[0], (list, tuple))):
            return repeat_each(cx, input, _integer_factors(cx, input, r, output_size, scales[0]))
        factors = _integer_factors(cx, input, r, output_size, None)
        for f, sc in zip(factors, scales):
            if sc is not None and float(sc) != f:
                raise NotLowerable(f"nearest upsampling with scale {sc} for an output {f} times larger")
        return repeat_each(cx, input, factors)

    return lower


for _r in (1, 2, 3):
    register(upsample_nearest(_r), aten=f"upsample_nearest{_r}d.vec upsample_nearest{_r}d.default "
             f"_upsample_nearest_exact{_r}d.vec _upsample_nearest_exact{_r}d.default")
for _r, _op in ((1, "upsample_linear1d"), (2, "upsample_bilinear2d"), (3, "upsample_trilinear3d")):
    register(upsample_linear(_r), aten=f"{_op}.vec {_op}.default")
register(upsample_interpolating("bicubic"), aten="upsample_bicubic2d.vec upsample_bicubic2d.default")

