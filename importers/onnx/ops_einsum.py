"""ONNX Einsum in implicit mode (no ``->``): the output is every letter that occurs once, in alphabetical
order (the spec's rule), which makes it the explicit equation the existing lowering handles."""

from __future__ import annotations

from collections import Counter
from typing import Callable

from onnx import helper

from . import ops_nn
from .context import OnnxContext, Value

__all__ = ["HANDLERS", "OPSETS", "EMITS", "explicit_equation"]

Handler = Callable[[OnnxContext], list[Value]]


def explicit_equation(eq: str) -> str:
    """``ij,jk`` -> ``ij,jk->ik``; an explicit equation (or one with an ellipsis) is returned as it is."""
    eq = eq.replace(" ", "")
    if "->" in eq or "." in eq:
        return eq
    counts = Counter(c for c in eq if c.isalpha())
    return eq + "->" + "".join(sorted(c for c, n in counts.items() if n == 1))


def _einsum(ctx: OnnxContext) -> list[Value]:
    eq = str(ctx.attr("equation"))
    explicit = explicit_equation(eq)
    if explicit == eq.replace(" ", ""):
        return ops_nn.HANDLERS["Einsum"](ctx)
    original = ctx.node
    node = type(original)()
    node.CopyFrom(original)
    del node.attribute[:]
    node.attribute.extend([a for a in original.attribute if a.name != "equation"]
                          + [helper.make_attribute("equation", explicit)])
    ctx.node = node
    try:
        return ops_nn.HANDLERS["Einsum"](ctx)
    finally:
        ctx.node = original


HANDLERS: dict[str, Handler] = {"Einsum": _einsum}
OPSETS: dict[str, tuple[int, int]] = {"Einsum": ops_nn.OPSETS["Einsum"]}
EMITS = ops_nn.EMITS
