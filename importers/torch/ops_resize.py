"""Resizing lowerings: nearest upsampling by integer factors (exact repetition), linear, bilinear and
trilinear interpolation (``resize_linear``), and bicubic, antialiased and other nearest resizing (``resize``);
area is refused by name.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any, Sequence

import numpy as np

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
    bilinear and trilinear are ``resize_linear``; bicubic, antialiased bilinear/bicubic and nearest by other
    factors are the ``resize`` op; area is out of scope."""
    r = cx.rank(input) - 2
    if r < 1:
        raise NotLowerable(f"interpolate of a rank-{cx.rank(input)} input (needs (N, C, *spatial))")
    scales = None if recompute_scale_factor else scale_factor
    if mode in _LINEAR_MODES and not antialias:
        return resize_linear(cx, input, r, size, scales, bool(align_corners))
    if mode in ("bilinear", "bicubic"):
        return resize_filtered(cx, input, r, size, scales, mode, bool(align_corners), antialias)
    if mode in _LINEAR_MODES:
        raise NotLowerable(f"interpolate mode={mode!r} with antialias=True (PyTorch antialiases 2-d inputs only)")
    if mode not in ("nearest", "nearest-exact"):
        raise NotLowerable(f"interpolate mode={mode!r} (nearest, (bi/tri)linear or bicubic)")
    try:
        return repeat_each(cx, input, _integer_factors(cx, input, r, size, scale_factor))
    except NotLowerable:
        return resize_nearest(cx, input, r, size, scales if size is None else None, mode == "nearest-exact")


def _targets(cx: Cx, input: Any, r: int, size: Any, scales: Any) -> tuple[list[int], list[Fraction]]:
    """Output extents and the scale PyTorch's coordinates use per spatial axis: a given scale factor
    (floor(in * f) cells), else out/in."""
    spatial = list(cx.shape(input)[-r:])
    given = None if scales is None or all(v is None for v in _as_list(scales, r)) else _as_list(scales, r)
    if size is not None:
        sizes = [int(v) for v in _as_list(size, r)]
        if given is None:
            return sizes, [Fraction(o, i) for o, i in zip(sizes, spatial)]
        return sizes, [Fraction(o, i) if f is None else Fraction(float(f)) for o, i, f in zip(sizes, spatial, given)]
    if given is None:
        raise NotLowerable("interpolation without a size or scale factor")
    sizes = [int(math.floor(i * float(f))) for i, f in zip(spatial, given)]
    return sizes, [Fraction(float(f)) for f in given]


def _resize_node(cx: Cx, input: Any, r: int, sizes: Sequence[int], scales: Sequence[Fraction], **attrs: Any) -> Any:
    from torchlean_bridge.ops.ext_resize import format_rationals
    shape = list(cx.shape(input))
    lead = shape[:len(shape) - r]
    spatial = shape[len(lead):]
    if any(i == 0 or o == 0 for i, o in zip(spatial, sizes)):
        raise NotLowerable(f"interpolation from {spatial} to {list(sizes)} (empty extents are not supported)")
    if list(sizes) == spatial and all(f == 1 for f in scales):
        return input
    return cx.add("resize", [cx.node(input, FLOAT)],
                  {"sizes": lead + list(sizes), "scales": format_rationals([Fraction(1)] * len(lead) + list(scales)),
                   **attrs})


def resize_filtered(cx: Cx, input: Any, r: int, size: Any, scales: Any, mode: str, align_corners: bool,
                    antialias: bool) -> Any:
    """Bicubic (Keys' kernel with a = -0.75, taps clamped to the edge) and PyTorch's antialiased bilinear and
    bicubic (the filter stretched by 1/scale when downsampling, taps outside the input left out and the
    weights renormalized, bicubic with a = -0.5): ONNX Resize's cubic / antialias / exclude_outside."""
    if r != 2:
        raise NotLowerable(f"interpolate mode={mode!r} of a rank-{r + 2} input (PyTorch takes (N, C, H, W))")
    if antialias and align_corners:
        raise NotLowerable(f"interpolate mode={mode!r} with antialias=True and align_corners=True (PyTorch's "
                           "antialiased kernels then use (in - 1) / (out - 1) as the filter scale)")
    sizes, factors = _targets(cx, input, r, size, scales)
    if antialias:  # PyTorch's antialiased kernels skip an axis whose extent is kept, whatever the scale
        factors = [Fraction(1) if o == i else f for o, i, f in zip(sizes, cx.shape(input)[-r:], factors)]
    if antialias and sizes[-1] == 1 and sizes[-2] != cx.shape(input)[-2]:
        raise NotLowerable(f"interpolate mode={mode!r} with antialias=True to width 1 with a new height (PyTorch's "
                           "antialiased kernel then applies the first output row's weights to every row)")
    cubic = mode == "bicubic"
    return _resize_node(cx, input, r, sizes, factors, mode="cubic" if cubic else "linear",
                        coordinate_mode="align_corners" if align_corners else "half_pixel",
                        cubic_coeff_a=-0.5 if antialias else -0.75, exclude_outside=antialias, antialias=antialias)


def _torch_nearest_index(n: int, m: int, given: float | None, exact: bool) -> np.ndarray:
    """PyTorch's nearest source indices (UpSample.h): float32 scale, floorf(dst * scale) (nearest) or
    floorf((dst + 0.5) * scale) (nearest-exact), clamped; same extents copy, doubling halves (nearest)."""
    dst = np.arange(m, dtype=np.float32)
    if m == n:
        return np.arange(m)
    if not exact and m == 2 * n:
        return np.arange(m) // 2
    scale = np.float32(1.0 / given) if given is not None else np.float32(n) / np.float32(m)
    pos = (dst + np.float32(0.5)) * scale if exact else dst * scale
    return np.minimum(np.floor(pos).astype(np.int64), n - 1)


def resize_nearest(cx: Cx, input: Any, r: int, size: Any, scales: Any, exact: bool) -> Any:
    """Nearest by any factor: ONNX's asymmetric/floor (nearest) or half_pixel/round_prefer_ceil (nearest-exact)
    in exact rationals, lowered only when PyTorch's float32 index table is the same one (checked here)."""
    sizes, factors = _targets(cx, input, r, size, scales)
    # PyTorch copies an axis whose extent is kept and halves the index of a doubled one (nearest), whatever the scale
    factors = [Fraction(1) if o == i else Fraction(2) if o == 2 * i and not exact else f
               for o, i, f in zip(sizes, cx.shape(input)[-r:], factors)]
    given = [None] * r if scales is None else [None if f is None else float(f) for f in _as_list(scales, r)]
    for n, m, f, g in zip(cx.shape(input)[-r:], sizes, factors, given):
        y = np.arange(m, dtype=object)
        ours = (2 * y + 1) * f.denominator // (2 * f.numerator) if exact else y * f.denominator // f.numerator
        ours = np.asarray(ours, dtype=np.int64)
        if not np.array_equal(np.minimum(ours, n - 1), _torch_nearest_index(n, m, g, exact)):
            raise NotLowerable(f"nearest interpolation from {n} to {m} cells: PyTorch's float32 source index "
                               "differs from the exact one somewhere, so it is refused")
    return _resize_node(cx, input, r, sizes, factors, mode="nearest",
                        coordinate_mode="half_pixel" if exact else "asymmetric",
                        nearest_mode="round_prefer_ceil" if exact else "floor")


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


def upsample_filtered(mode: str, antialias: bool):
    """aten.upsample_bicubic2d and aten._upsample_{bilinear,bicubic}2d_aa: ``.vec`` passes (output_size,
    align_corners, scale_factors); ``.default`` passes output_size, align_corners and one optional scale per axis."""

    def lower(cx: Cx, input: Any, output_size: Any, align_corners: bool, *scales: Any) -> Any:
        if len(scales) == 1 and (scales[0] is None or isinstance(scales[0], (list, tuple))):
            return resize_filtered(cx, input, 2, output_size, scales[0], mode, bool(align_corners), antialias)
        return resize_filtered(cx, input, 2, output_size, list(scales) or None, mode, bool(align_corners), antialias)

    return lower


def upsample_nearest(r: int, exact: bool):
    """aten.upsample_nearest{r}d and _upsample_nearest_exact{r}d: ``.vec`` passes (output_size,
    scale_factors); ``.default`` passes output_size and one optional scale per axis. Integer factors repeat
    each entry; other factors are ``resize_nearest``'s (PyTorch reads a given scale as ``1 / scale``)."""

    def lower(cx: Cx, input: Any, output_size: Any, *scales: Any) -> Any:
        given = scales[0] if len(scales) == 1 and (scales[0] is None or isinstance(scales[0], (list, tuple))) \
            else (list(scales) or None)
        if given is not None and all(v is None for v in _as_list(given, r)):
            given = None
        try:
            factors = _integer_factors(cx, input, r, output_size, None if output_size is not None else given)
            if given is None or all(g is None or float(g) == f for g, f in zip(_as_list(given, r), factors)):
                return repeat_each(cx, input, factors)
        except NotLowerable:
            pass
        return resize_nearest(cx, input, r, output_size, given, exact)

    return lower


for _r in (1, 2, 3):
    register(upsample_nearest(_r, False), aten=f"upsample_nearest{_r}d.vec upsample_nearest{_r}d.default")
    register(upsample_nearest(_r, True), aten=f"_upsample_nearest_exact{_r}d.vec _upsample_nearest_exact{_r}d.default")
for _r, _op in ((1, "upsample_linear1d"), (2, "upsample_bilinear2d"), (3, "upsample_trilinear3d")):
    register(upsample_linear(_r), aten=f"{_op}.vec {_op}.default")
register(upsample_filtered("bicubic", False), aten="upsample_bicubic2d.vec upsample_bicubic2d.default")
register(upsample_filtered("bilinear", True), aten="_upsample_bilinear2d_aa.vec _upsample_bilinear2d_aa.default")
register(upsample_filtered("bicubic", True), aten="_upsample_bicubic2d_aa.vec _upsample_bicubic2d_aa.default")

