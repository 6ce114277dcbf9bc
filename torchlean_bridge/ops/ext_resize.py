"""The ``resize`` ext op: ONNX Resize in every mode, with its scales and region of interest as exact rationals.

``resize`` covers what ``resize_linear`` cannot: nearest with any rounding, cubic, antialiasing filters,
``exclude_outside``, the ``half_pixel_symmetric`` and ``tf_crop_and_resize`` coordinates, and scales that
differ from out/in. Per axis it carries the output extent (``sizes``), the scale the coordinates use
(``scales``) and, for ``tf_crop_and_resize``, the region of interest (``roi``: every start, then every
end, as ONNX orders them). Scales and roi are space-separated rationals in ``fractions.Fraction``'s
canonical spelling (``3/5``, ``-1/4``, ``2``): ONNX gives them as binary floats and sizes imply out/in,
and both are exact rationals, so the source coordinates are too (see ``semantics.resample``).
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import Any, Mapping, Sequence

from ..errors import ShapeRuleError
from .contracts import Shape, check_buffer, fmt_shape, numel
from .registry import Attr, OpSpec, register

__all__ = ["RESIZE_MODES", "COORDINATE_MODES", "NEAREST_MODES", "parse_rationals", "format_rationals",
           "tap_count", "resized_axes", "resize_plan"]

RESIZE_MODES = ("nearest", "linear", "cubic")
COORDINATE_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
                    "tf_crop_and_resize")
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")

_RATIONAL = re.compile(r"-?[0-9]+(/[0-9]+)?")


def format_rationals(values: Sequence[Fraction]) -> str:
    return " ".join(str(Fraction(v)) for v in values)


def parse_rationals(text: str, what: str) -> list[Fraction]:
    """The rationals of a ``scales``/``roi`` attribute, each in its canonical spelling."""
    out = []
    for tok in text.split():
        if not _RATIONAL.fullmatch(tok) or str(Fraction(tok)) != tok:
            raise ShapeRuleError(f"resize: {what} entry {tok!r} is not a rational in lowest terms (like 3/5)")
        out.append(Fraction(tok))
    return out


def tap_count(mode: str, scale: Fraction, antialias: bool) -> int:
    """Source cells one output cell reads along an axis: 1 (nearest), 2 (linear), 4 (cubic); an antialiasing
    filter is stretched by 1/scale when downsampling (onnx's reference: ``2 - 2 (floor(-support/scale) + 1)``)."""
    if mode == "nearest":
        return 1
    support = 1 if mode == "linear" else 2
    if not antialias or scale >= 1:
        return 2 * support
    return 2 - 2 * (math.floor(-support / scale) + 1)


def resized_axes(attrs: Mapping[str, Any], in_shape: Shape) -> list[int]:
    """The axes the op changes, last first (the order the rules resize them): an axis with scale 1, its
    extent kept and (tf_crop_and_resize) roi [0, 1] is the identity in every mode."""
    scales = parse_rationals(attrs["scales"], "scales")
    roi = parse_rationals(attrs["roi"], "roi")
    r = len(in_shape)
    out = []
    for ax in range(r - 1, -1, -1):
        full_roi = not roi or (roi[ax], roi[r + ax]) == (0, 1)
        if not (scales[ax] == 1 and attrs["sizes"][ax] == in_shape[ax] and full_roi):
            out.append(ax)
    return out


def resize_plan(attrs: Mapping[str, Any], p: Sequence[Shape]) -> tuple[list[Fraction], list[Fraction]]:
    """The checked scales and roi of a node (the shape rule's checks, reused by the semantics)."""
    s, sizes = tuple(p[0]), tuple(attrs["sizes"])
    r = len(s)
    if len(sizes) != r:
        raise ShapeRuleError(f"resize: sizes {fmt_shape(sizes)} must give one extent per axis of {fmt_shape(s)}")
    scales = parse_rationals(attrs["scales"], "scales")
    roi = parse_rationals(attrs["roi"], "roi")
    if len(scales) != r or any(f <= 0 for f in scales):
        raise ShapeRuleError(f"resize: scales {attrs['scales']!r} must give one positive factor per axis of "
                             f"{fmt_shape(s)}")
    crop = attrs["coordinate_mode"] == "tf_crop_and_resize"
    if crop and len(roi) != 2 * r:
        raise ShapeRuleError(f"resize: tf_crop_and_resize needs a roi of {2 * r} entries, got {attrs['roi']!r}")
    if not crop and roi:
        raise ShapeRuleError(f"resize: a roi is only read by tf_crop_and_resize, not {attrs['coordinate_mode']}")
    return scales, roi


def _resize(attrs: Mapping[str, Any], p: Sequence[Shape], d: Shape) -> Shape:
    s, sizes = tuple(p[0]), tuple(attrs["sizes"])
    scales, _ = resize_plan(attrs, p)
    axes = resized_axes(attrs, s)
    for ax in axes:
        if s[ax] <= 0 or sizes[ax] <= 0:
            raise ShapeRuleError(f"resize: axis {ax} of extent {s[ax]} resized to {sizes[ax]} (both must be "
                                 "positive)")
    # evaluation resizes one axis at a time, last first: every intermediate, and each axis's tap table
    current = list(s)
    for ax in axes:
        taps = tap_count(attrs["mode"], scales[ax], bool(attrs["antialias"]))
        check_buffer(sizes[ax] * taps, "a tap table", "resize")
        current[ax] = sizes[ax]
        check_buffer(numel(current), "an intermediate result", "resize")
    return sizes


register(OpSpec(
    "resize", "ext", 1, 1, _resize,
    attrs=(Attr("sizes", "shape"), Attr("scales", "str"),
           Attr("mode", "str", "nearest", choices=RESIZE_MODES),
           Attr("coordinate_mode", "str", "half_pixel", choices=COORDINATE_MODES),
           Attr("nearest_mode", "str", "round_prefer_floor", choices=NEAREST_MODES),
           Attr("cubic_coeff_a", "float", -0.75), Attr("exclude_outside", "bool", False),
           Attr("antialias", "bool", False), Attr("roi", "str", ""), Attr("extrapolation_value", "float", 0.0)),
    doc="ONNX Resize (every mode, coordinate transformation and filter option) to the extents `sizes`, with "
        "exact rational `scales` (and `roi` for tf_crop_and_resize); one axis at a time, last first"))
