"""``resize`` (ONNX Resize in every mode): the float rule and the interval rule side by side; the
arithmetic is ``semantics.resample``'s."""

from __future__ import annotations

from ..resample import resize, resize_box
from .table import float_rule, interval_rule

__all__: list[str] = []


@float_rule("resize")
def resize_rule(node, xs, rec, dt):
    return resize(xs[0], node.attrs)


@interval_rule("resize")
def resize_box_rule(node, ps, rec):
    return resize_box(*ps[0], node.attrs)
