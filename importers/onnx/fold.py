"""Import-time constant folding for ONNX: anything that does not depend on a graph input.

A node whose inputs are all known is computed with onnx's reference evaluator (so every op and
opset folds with onnx's own semantics: Shape arithmetic, Range, ConstantOfShape, Cast...).
``Shape``/``Size`` fold from static shapes even when their input is computed. Layout-only ops on an
initializer keep the initializer's name and append the matching role transform, so a weight
reached through ``Transpose`` or ``Reshape`` is still bound exactly.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from torchlean_bridge.errors import BridgeError
from torchlean_bridge.check import check_size
from torchlean_bridge.ops.contracts import broadcast_shapes

from .context import Const, OnnxContext, attr_value
from .fold_sizes import GENERATED_SHAPES

__all__ = ["NONDETERMINISTIC", "LAYOUT_OPS", "fold_node", "fold_shape", "check_fold_size"]

NONDETERMINISTIC = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                              "Multinomial", "Bernoulli"})
_RESHAPES = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Flatten"})
# ops that only move or retype a tensor: folding them keeps the initializer's binding (with a transform)
LAYOUT_OPS = _RESHAPES | {"Transpose", "Cast", "Identity", "Dropout"}


def _squeeze_axes(node: Any, opset: int, feeds: dict[str, np.ndarray]) -> list[int] | None:
    if opset >= 13:
        return [int(a) for a in feeds[node.input[1]].reshape(-1)] if len(node.input) > 1 and node.input[1] else None
    return attr_value(node, "axes")


def _gather_elements(node: Any, feeds: dict[str, np.ndarray]) -> np.ndarray:
    data, idx = feeds[node.input[0]], feeds[node.input[1]].astype(np.int64)
    axis = int(attr_value(node, "axis", 0)) % data.ndim
    return np.take_along_axis(data, np.where(idx < 0, idx + data.shape[axis], idx), axis)


def _run_reference(node: Any, opset: int, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """onnx's reference implementation, except where it fails on valid input: (Un)squeeze in their
    opset < 13 attribute forms and GatherElements, computed here directly."""
    if node.op_type in ("Squeeze", "Unsqueeze"):
        x = feeds[node.input[0]]
        axes = _squeeze_axes(node, opset, feeds)
        if node.op_type == "Squeeze":
            return [np.squeeze(x, axis=tuple(axes)) if axes else np.squeeze(x)]
        return [np.expand_dims(x, tuple(axes))]
    if node.op_type == "GatherElements":
        return [_gather_elements(node, feeds)]
    if node.op_type == "Unique":
        return _unique(node, feeds)
    from onnx.reference import ReferenceEvaluator
    evaluator = ReferenceEvaluator(node, opsets={"": opset})
    return [np.asarray(v) for v in evaluator.run(None, feeds)]


def _unique(node: Any, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Unique computed here: onnx's reference (1.23) indexes the unflattened input when sorted=0 and no
    axis is given (IndexError on a rank >= 2 input). sorted=0 orders by first occurrence."""
    x, axis = feeds[node.input[0]], attr_value(node, "axis")
    if axis is None:
        x = x.reshape(-1)
    y, first, inverse, counts = np.unique(x, return_index=True, return_inverse=True, return_counts=True,
                                          axis=None if axis is None else int(axis))
    inverse = inverse.reshape(-1)
    if not attr_value(node, "sorted", 1):
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        y = np.take(y, order, axis=0 if axis is None else int(axis))
        first, counts, inverse = first[order], counts[order], rank[inverse]
    return [y, first.astype(np.int64), inverse.astype(np.int64), counts.astype(np.int64)][:len(node.output)]


def _layout_step(node: Any, data: Const, result: np.ndarray) -> str | None:
    """The role-transform step a layout-only op applies to its data input, else None."""
    op = node.op_type
    if op == "Transpose":
        perm = attr_value(node, "perm") or list(range(data.value.ndim))[::-1]
        return "transpose" if list(perm) == [1, 0] else "permute:" + ",".join(map(str, perm))
    if op in _RESHAPES:
        return "reshape:" + ",".join(map(str, result.shape))
    if op == "Cast":
        return f"cast:{result.dtype.name}"
    return None


def _generated_shape(node: Any, feeds: dict[str, np.ndarray], where: str) -> tuple[int, ...] | None:
    """The output shape of an op whose size is set by input values rather than input sizes."""
    op, v = node.op_type, [feeds.get(n) for n in node.input]
    if op in GENERATED_SHAPES:
        return GENERATED_SHAPES[op](node, feeds)
    if len(v) < {"ConstantOfShape": 1, "Range": 3, "Tile": 2, "Expand": 2}.get(op, 0) or any(x is None for x in v):
        return None  # the handler refuses the missing operand by name
    if op == "ConstantOfShape":
        return tuple(int(d) for d in v[0].reshape(-1))
    if op == "Range":
        if any(np.asarray(x).size != 1 for x in v[:3]):
            return None  # not scalars: the reference evaluator's error names them
        start, limit, delta = (float(np.asarray(x).reshape(-1)[0]) for x in v[:3])
        if not delta:
            raise BridgeError(f"{where}: delta is 0, so the range has no end")
        return (max(int(np.ceil((limit - start) / delta)), 0),)
    if op == "Tile":
        return tuple(int(d) * int(r) for d, r in zip(v[0].shape, v[1].reshape(-1)))
    if op == "Expand":
        return broadcast_shapes(v[0].shape, tuple(int(d) for d in v[1].reshape(-1)), "Expand")
    return None


def check_fold_size(ctx: OnnxContext, node: Any) -> None:
    """Refuse a fold whose result would exceed ``ctx.max_elements``, before computing it.

    The size comes from the input values for the generators (ConstantOfShape, Range, Tile, Expand),
    else from onnx's shape inference when it knows the output shapes.
    """
    feeds = {n: ctx.values[n].value for n in node.input if n}
    where = f"ONNX import: node `{node.name or (node.output[0] if node.output else '?')}` ({node.op_type})"
    generators = ("ConstantOfShape", "Range", "Tile", "Expand", *GENERATED_SHAPES)
    shapes = [_generated_shape(node, feeds, where)] if node.op_type in generators \
        else [ctx.declared.get(o) for o in node.output if o]
    for shape in shapes:
        if shape is not None:
            check_size(shape, ctx.max_elements, where)


def _refuse_undefined_cast(ctx: OnnxContext, node: Any, feeds: dict[str, np.ndarray]) -> None:
    """A constant float cast to an integer type out of its range: ONNX leaves the result undefined, so the
    fold is refused by value instead of taking onnx's reference's choice."""
    if node.op_type not in ("Cast", "CastLike") or not node.input:
        return
    from onnx.helper import np_dtype_to_tensor_dtype
    from .ops_cast import undefined_cast
    to = attr_value(node, "to") if node.op_type == "Cast" else np_dtype_to_tensor_dtype(feeds[node.input[1]].dtype)
    reason = undefined_cast(np.asarray(feeds[node.input[0]]), int(to))
    if reason:
        raise ctx.fail(reason)


def fold_node(ctx: OnnxContext, node: Any) -> list[Const]:
    """Values of every output of a node whose inputs are all constants."""
    inputs = [ctx.values[n] if n else None for n in node.input]
    if node.op_type in ("Identity", "Dropout") and isinstance(inputs[0], Const):
        outs = [inputs[0]]
        if len(node.output) > 1:
            outs.append(Const(np.ones(inputs[0].value.shape, dtype=bool), folded=True))
        return outs
    feeds = {n: v.value for n, v in zip(node.input, inputs) if n}
    _refuse_undefined_cast(ctx, node, feeds)
    try:
        results = _run_reference(node, ctx.opset, feeds)
    except MemoryError:  # sized within max_elements (check_fold_size), yet more than this machine holds
        raise BridgeError(f"ONNX import: node `{node.name or (node.output[0] if node.output else '?')}` "
                          f"({node.op_type}): folding its constant result at import time needs more memory than "
                          f"is available") from None
    if node.op_type == "Constant":
        return [Const(results[0], key=node.output[0], initializer=False)]
    data = inputs[0] if inputs else None
    if isinstance(data, Const) and data.key is not None and len(results) == 1:
        step = _layout_step(node, data, results[0])
        if step is not None:
            return [data.derived(results[0], step)]
    return [Const(r, folded=True) for r in results]


def fold_shape(ctx: OnnxContext, node: Any) -> list[Const] | None:
    """``Shape``/``Size`` of a computed tensor: its static shape is known at import time."""
    if node.op_type not in ("Shape", "Size"):
        return None
    shape = ctx.shape(0)
    if node.op_type == "Size":
        return [Const(np.asarray(int(np.prod(shape)), dtype=np.int64), folded=True)]
    start, end = attr_value(node, "start", 0), attr_value(node, "end")
    return [Const(np.asarray(shape[slice(start, end)], dtype=np.int64), folded=True)]
