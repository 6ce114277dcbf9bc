"""ONNX ``Resize`` / ``Upsample`` in every mode the spec defines.

The targets (``scales`` or ``sizes``, ``axes``, ``keep_aspect_ratio_policy``, ``roi``) are read at import time
and turned into one extent and one exact rational scale per axis. A resize that is exact data movement
(nearest by integer factors that repeat each entry) lowers to reshape/expand; linear interpolation whose
scale is out/in lowers to ``resize_linear``; every other form is the ``resize`` ext op, whose semantics
is onnx's reference (``semantics.resample``). Refused by name: tf_half_pixel_for_nn (Resize-11 only, not
in onnx's reference), tf_crop_and_resize driven by ``scales`` with a roi other than [0, 1] (the spec sizes
the output by ``floor(n (end - start) s)``, onnx's reference by ``floor(n s)``), and cubic
pytorch_half_pixel to one cell (the spec's coordinate is 0, the reference's -1/2).
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Callable

import numpy as np

from torchlean_bridge.ops.ext_resize import COORDINATE_MODES, NEAREST_MODES, format_rationals

from . import ops_tensor
from .context import OnnxContext, Value

__all__ = ["HANDLERS", "OPSETS", "EMITS"]

Handler = Callable[[OnnxContext], list[Value]]


def _axes(ctx: OnnxContext, r: int) -> list[int]:
    given = ctx.attr("axes")
    if given is None:
        return list(range(r))
    axes = [ctx.axis(int(a), r) for a in given]
    if len(set(axes)) != len(axes):
        raise ctx.fail(f"axes {list(given)} repeat an axis")
    return axes


def _floats(ctx: OnnxContext, i: int, what: str) -> list[float] | None:
    if not ctx.has_input(i):
        return None
    value = np.asarray(ctx.static(i, what))
    return [float(v) for v in value.reshape(-1)] if value.size else None


def _targets(ctx: OnnxContext, s: tuple[int, ...], axes: list[int], legacy: bool
             ) -> tuple[list[int], list[Fraction], bool]:
    """Per axis the output extent and the scale the coordinates use; whether ``scales`` gave them."""
    r = len(s)
    scales_in = _floats(ctx, 1 if legacy else 2, "scales")
    if scales_in is not None:
        if len(scales_in) != len(axes) or any(not (0 < f < math.inf) for f in scales_in):
            raise ctx.fail(f"scales {scales_in} do not give one positive finite factor per axis {axes}")
        scales = [Fraction(1)] * r
        for ax, f in zip(axes, scales_in):
            scales[ax] = Fraction(f)
        return [math.floor(n * f) for n, f in zip(s, scales)], scales, True
    if legacy or not ctx.has_input(3):
        raise ctx.fail("neither scales nor sizes is given")
    given = ctx.ints(3, "sizes")
    if len(given) != len(axes) or any(v < 0 for v in given):
        raise ctx.fail(f"sizes {given} do not give one extent per axis {axes}")
    for ax in axes:
        if s[ax] == 0:
            raise ctx.fail(f"resize of an empty axis (input shape {list(s)})")
    sizes, scales = list(s), [Fraction(1)] * r
    policy = ctx.attr("keep_aspect_ratio_policy", "stretch")
    if policy == "stretch":
        for ax, o in zip(axes, given):
            sizes[ax], scales[ax] = o, Fraction(o, s[ax])
    elif policy in ("not_larger", "not_smaller"):
        ratios = [Fraction(o, s[ax]) for ax, o in zip(axes, given)]
        scale = min(ratios) if policy == "not_larger" else max(ratios)
        for ax in axes:  # round_int: the nearest integer, halves up
            sizes[ax], scales[ax] = math.floor(scale * s[ax] + Fraction(1, 2)), scale
    else:
        raise ctx.fail(f"keep_aspect_ratio_policy={policy!r}")
    return sizes, scales, False


def _roi(ctx: OnnxContext, r: int, axes: list[int]) -> list[Fraction]:
    values = _floats(ctx, 1, "roi")
    if values is None or len(values) != 2 * len(axes) or not all(math.isfinite(v) for v in values):
        raise ctx.fail(f"tf_crop_and_resize needs a finite roi of {2 * len(axes)} entries (starts, then ends), "
                       f"got {values}")
    roi = [Fraction(0)] * r + [Fraction(1)] * r
    for i, ax in enumerate(axes):
        roi[ax], roi[r + ax] = Fraction(values[i]), Fraction(values[len(axes) + i])
    return roi


def _resize(ctx: OnnxContext) -> list[Value]:
    s = ctx.shape(0)
    r = len(s)
    legacy = ctx.node.op_type == "Upsample" or ctx.opset == 10  # asymmetric coordinates, scales only
    mode = ctx.attr("mode", "nearest")
    mode = "linear" if mode == "bilinear" and legacy else mode
    if mode not in ("nearest", "linear", "cubic") or (legacy and mode == "cubic"):
        raise ctx.fail(f"mode={mode!r}")
    coord = "asymmetric" if legacy else ctx.attr("coordinate_transformation_mode", "half_pixel")
    if coord not in COORDINATE_MODES:
        raise ctx.fail(f"coordinate_transformation_mode={coord!r} (not in onnx's reference; supported: "
                       f"{', '.join(COORDINATE_MODES)})")
    rounding = "floor" if legacy else ctx.attr("nearest_mode", "round_prefer_floor")
    if rounding not in NEAREST_MODES:
        raise ctx.fail(f"nearest_mode={rounding!r}")
    antialias = bool(ctx.attr("antialias", 0))
    if antialias and mode == "nearest":
        raise ctx.fail("antialias=1 with mode=nearest (defined for linear and cubic only)")
    axes = _axes(ctx, r)
    sizes, scales, by_scales = _targets(ctx, s, axes, legacy)
    roi = _roi(ctx, r, axes) if coord == "tf_crop_and_resize" else []
    if roi and by_scales and any((roi[ax], roi[r + ax]) != (0, 1) for ax in axes):
        raise ctx.fail("tf_crop_and_resize with scales and a roi other than [0, 1]: the spec sizes the output by "
                       "floor(n (end - start) scale), onnx's reference by floor(n scale); give sizes")
    changed = [ax for ax in range(r) if (sizes[ax], scales[ax]) != (s[ax], 1)
               or (roi and (roi[ax], roi[r + ax]) != (0, 1))]
    if any(sizes[ax] == 0 or s[ax] == 0 for ax in changed):
        raise ctx.fail(f"resize from {list(s)} to {sizes} (empty extents are not supported)")
    if not changed:
        return [ctx.values[ctx.node.input[0]]]
    if mode == "cubic" and coord == "pytorch_half_pixel" and any(scales[ax] * s[ax] == 1 for ax in changed):
        raise ctx.fail("cubic pytorch_half_pixel resize to one cell: the spec's source coordinate is 0, onnx's "
                       "reference's -1/2")
    exclude = bool(ctx.attr("exclude_outside", 0))
    if mode == "nearest" and not roi:
        repeat = _repeat_factors(coord, rounding, s, sizes, scales)
        if repeat is not None:
            return [ops_tensor._repeat_each(ctx, ctx.operand(0), s, repeat)]
    if (mode == "linear" and not antialias and not exclude and not roi and coord in ops_tensor._LINEAR_COORDINATE_MODES
            and all(scales[ax] == Fraction(sizes[ax], s[ax]) for ax in changed)):
        return ops_tensor._resize_linear(ctx, s, coord, None, sizes)
    attrs = {"sizes": tuple(sizes), "scales": format_rationals(scales), "mode": mode, "coordinate_mode": coord,
             "nearest_mode": rounding, "cubic_coeff_a": float(ctx.attr("cubic_coeff_a", -0.75)),
             "exclude_outside": exclude, "antialias": antialias, "roi": format_rationals(roi),
             "extrapolation_value": float(ctx.attr("extrapolation_value", 0.0))}
    return [ctx.add("resize", [ctx.operand(0)], attrs)]


def _repeat_factors(coord: str, rounding: str, s: tuple[int, ...], sizes: list[int], scales: list[Fraction]
                    ) -> list[int] | None:
    """Integer factors when nearest resizing repeats each entry that many times (ops_tensor's table of
    exact pairs, each checked against onnxruntime), else None."""
    if (coord, rounding) not in ops_tensor._NEAREST_REPEAT_EXACT:
        return None
    factors = []
    for n, o, f in zip(s, sizes, scales):
        if f.denominator != 1 or o != n * f:
            return None
        factors.append(int(f))
    largest = ops_tensor._NEAREST_REPEAT_EXACT[(coord, rounding)]
    if largest is not None and max(factors) > largest:
        return None
    return factors


HANDLERS: dict[str, Handler] = {"Resize": _resize, "Upsample": _resize}
OPSETS: dict[str, tuple[int, int]] = {"Resize": (10, 19), "Upsample": (9, 10)}
EMITS = frozenset({"resize", "resize_linear", "reshape", "expand", "const"})
