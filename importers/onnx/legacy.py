"""Pre-opset-7 broadcast attributes made explicit, before the version converter and the handlers see them.

Until opset 7, ``Add``/``Sub``/``Mul``/``Div``/``Pow``/``And``/``Or``/``Xor``/``Equal``/``Greater``/``Less``
broadcast only with ``broadcast=1``, and ``axis`` aligns B's shape with A's dimensions from ``axis`` on (B of
shape [3, 4] on A of shape [2, 3, 4, 5] at axis 1 is B[None, :, :, None]). numpy broadcasting aligns at the
end, so an ``Unsqueeze`` appending B's missing trailing axes makes the two agree, and the attributes go.
(onnx.version_converter rejects such axis forms, and has no adapters for the comparisons and logic ops.)

``PRelu`` before opset 7 applies a one-dimensional slope of C values per channel: where numpy broadcasting
fails, the slope lies along the one dimension of X with C entries (onnx's reference reads it so); the slope
becomes [C, 1, ...] there. A slope matching several dimensions, or a rank unknown, is refused by name; a
symbolic dimension (a dynamic batch) never counts as a match.
"""

from __future__ import annotations

from typing import Any

from torchlean_bridge.errors import BridgeError

from .checks import DEFAULT_DOMAINS

__all__ = ["BROADCAST_OPS", "explicit_legacy_broadcasts"]

BROADCAST_OPS = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "And", "Or", "Xor", "Equal", "Greater", "Less"})


def _legacy(node: Any, opset: int) -> bool:
    from .opsets import since_version
    if node.domain not in DEFAULT_DOMAINS or (node.op_type not in BROADCAST_OPS and node.op_type != "PRelu"):
        return False
    version = since_version(node.op_type, opset)
    return version is not None and version < 7


def _shapes(model: Any) -> dict[str, tuple[int | None, ...]]:
    """Every tensor's shape onnx's shape inference finds (None for a symbolic dimension)."""
    import onnx
    inferred = onnx.shape_inference.infer_shapes(model)
    g = inferred.graph
    shapes = {t.name: tuple(int(d) for d in t.dims) for t in g.initializer}
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        t = vi.type.tensor_type
        if t.HasField("shape"):
            shapes.setdefault(vi.name, tuple(int(d.dim_value) if d.HasField("dim_value") else None
                                             for d in t.shape.dim))
    return shapes


def _fail(node: Any, what: str) -> BridgeError:
    label = f"`{node.name}`, " if node.name else ""
    return BridgeError(f"ONNX import: node ({label}{node.op_type}, before opset 7): {what}")


def _prelu_axes(node: Any, x: tuple, slope: tuple) -> list[int] | None:
    """Unsqueeze axes putting a [C] slope on X's one dimension of extent C; None when numpy broadcasts it."""
    if len(slope) != 1 or len(x) < 1:
        return None
    c = slope[0]
    trailing_ok = x[-1] == c or c == 1
    if trailing_ok:
        return None
    matches = [i for i, d in enumerate(x) if d == c]  # a symbolic dimension (a dynamic batch) is not C
    if len(matches) != 1:
        raise _fail(node, f"slope of shape [{c}] matches {len(matches)} dimensions of X {list(x)} (one is needed)")
    return list(range(1, len(x) - matches[0]))


def explicit_legacy_broadcasts(model: Any, opset: int) -> tuple[Any, list[str]]:
    """``model`` with every pre-opset-7 broadcast made explicit (a copy), and a note; as it is when none."""
    if opset >= 7 or not any(_legacy(n, opset) for n in model.graph.node):
        return model, []
    import onnx
    from onnx import helper
    shapes = _shapes(model)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    nodes, changed = [], 0
    for i, node in enumerate(out.graph.node):
        if not _legacy(node, opset):
            nodes.append(node)
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        a_shape, b_shape = (shapes.get(n) for n in node.input[:2])
        axes = None
        if node.op_type == "PRelu":
            if a_shape is None or b_shape is None:
                raise _fail(node, "the shapes of X and slope are unknown")
            axes = _prelu_axes(node, a_shape, b_shape)
        elif attrs.get("broadcast", 0) and "axis" in attrs:
            if a_shape is None or b_shape is None:
                raise _fail(node, "broadcast with `axis` where the operands' ranks are unknown")
            axis = int(attrs["axis"])
            axis = axis + len(a_shape) if axis < 0 else axis
            if not 0 <= axis <= len(a_shape) - len(b_shape):
                raise _fail(node, f"axis {attrs['axis']} for B of shape {list(b_shape)} on A of shape {list(a_shape)}")
            if axis + len(b_shape) < len(a_shape):
                axes = list(range(len(b_shape), len(a_shape) - axis))
        if axes:
            name = f"{node.input[1]}__legacy_broadcast_{i}"
            nodes.append(helper.make_node("Unsqueeze", [node.input[1]], [name], axes=axes))
            node.input[1] = name
            changed += 1
        keep = [a for a in node.attribute if a.name not in ("broadcast", "axis")]
        del node.attribute[:]
        node.attribute.extend(keep)
        nodes.append(node)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out, [f"pre-opset-7 broadcast attributes made explicit ({changed} operand(s) unsqueezed to numpy "
                 "broadcasting)"]
