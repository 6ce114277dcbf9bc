"""ONNX sequences and optionals resolved at import, and ReverseSequence.

A sequence whose length is known at import time is a tuple of tensor values (``Seq``), an optional a
value or nothing (``Opt``): SequenceConstruct/Empty/Insert/Erase/At/Length, SplitToSequence,
ConcatFromSequence, SequenceMap (its body once per item, ops_control.run_body), Optional,
OptionalHasElement and OptionalGetElement then only rearrange values, and no IR kind is needed. Positions
must be known at import time (a computed one is refused by name); a graph output that is a sequence or
an optional becomes its items' outputs, which ``output_structure`` in the report regroups (the ONNX
backend returns lists). Graph inputs that are sequences or optionals take their structure from
``input_shapes`` (a list of item shapes, a shape, or None for an empty optional).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from torchlean_bridge.errors import BridgeError

from .context import Const, NodeUnsupported, OnnxContext, Opt, Seq, Value, attr_value
from .ops_control import elem_type, materialize, run_body, stack, tensor_value

__all__ = ["HANDLERS", "OPSETS", "EMITS", "NOT_FOLDED", "flatten_output", "structured_input", "type_text"]

Handler = Callable[[OnnxContext], list[Any]]


def _seq(ctx: OnnxContext, i: int) -> Seq:
    v = ctx.values[ctx.node.input[i]]
    if isinstance(v, Opt) and isinstance(v.value, Seq):
        v = v.value
    if not isinstance(v, Seq):
        raise ctx.fail(f"input {i} (`{ctx.node.input[i]}`) is {_kind(v)}, where a sequence is expected")
    return v


def _kind(v: Any) -> str:
    return v.kind if isinstance(v, (Seq, Opt)) else "a tensor"


def _position(ctx: OnnxContext, i: int, default: int, n: int, upper: int) -> int:
    """A position input (known at import), made non-negative and checked against [-n, upper]."""
    if not ctx.has_input(i):
        return default
    c = ctx.const(i)
    if c is None:
        name = ctx.node.input[i]
        raise NodeUnsupported(f"position `{name}` is computed at run time: which item is meant must be known at "
                              "import time", needs=[name])
    pos = int(np.asarray(c.value).reshape(-1)[0])
    if not -n <= pos <= upper:
        raise ctx.fail(f"position {pos} is out of range for a sequence of {n} items")
    return pos + n if pos < 0 else pos


def _item_type(ctx: OnnxContext, i: int) -> int:
    return elem_type(ctx, ctx.node.input[i], ctx.values[ctx.node.input[i]])


def _shape(ctx: OnnxContext, v: Value) -> tuple[int, ...]:
    return tuple(v.value.shape) if isinstance(v, Const) else ctx.b.shape(v)


# -- sequences ------------------------------------------------------------------------------

def _sequence_empty(ctx: OnnxContext) -> list[Any]:
    return [Seq((), int(ctx.attr("dtype", 1)))]


def _sequence_construct(ctx: OnnxContext) -> list[Any]:
    items = tuple(tensor_value(ctx, ctx.values[n], f"input `{n}`") for n in ctx.node.input if n)
    return [Seq(items, _item_type(ctx, 0))]


def _sequence_insert(ctx: OnnxContext) -> list[Any]:
    s = _seq(ctx, 0)
    item = tensor_value(ctx, ctx.values[ctx.node.input[1]], "the tensor to insert")
    pos = _position(ctx, 2, len(s.items), len(s.items), len(s.items))
    return [Seq(s.items[:pos] + (item,) + s.items[pos:], s.elem_type or _item_type(ctx, 1))]


def _sequence_erase(ctx: OnnxContext) -> list[Any]:
    s = _seq(ctx, 0)
    if not s.items:
        raise ctx.fail("erasing from an empty sequence")
    pos = _position(ctx, 1, len(s.items) - 1, len(s.items), len(s.items) - 1)
    return [Seq(s.items[:pos] + s.items[pos + 1:], s.elem_type)]


def _sequence_at(ctx: OnnxContext) -> list[Any]:
    s = _seq(ctx, 0)
    if not s.items:
        raise ctx.fail("reading an item of an empty sequence")
    return [s.items[_position(ctx, 1, 0, len(s.items), len(s.items) - 1)]]


def _sequence_length(ctx: OnnxContext) -> list[Any]:
    return [Const(np.asarray(len(_seq(ctx, 0).items), dtype=np.int64), folded=True)]


def _split_to_sequence(ctx: OnnxContext) -> list[Any]:
    s = ctx.shape(0)
    axis = ctx.axis(int(ctx.attr("axis", 0)), len(s))
    x = ctx.values[ctx.node.input[0]]
    if ctx.has_input(1):
        split = np.asarray(ctx.static(1, "split")).astype(np.int64)
        if split.ndim == 0:
            chunk = int(split)
            if chunk <= 0:
                raise ctx.fail(f"split {chunk} (a chunk length is positive)")
            sizes = [min(chunk, s[axis] - k) for k in range(0, s[axis], chunk)]
        else:
            sizes = [int(k) for k in split]
        squeeze = False
    else:
        sizes, squeeze = [1] * s[axis], not int(ctx.attr("keepdims", 1))
    if sum(sizes) != s[axis] or any(k < 0 for k in sizes):
        raise ctx.fail(f"split sizes {sizes} do not partition extent {s[axis]}")
    items, start = [], 0
    for size in sizes:
        if isinstance(x, Const):
            part: Value = Const(np.take(x.value, range(start, start + size), axis=axis), folded=True)
            if squeeze:
                part = Const(np.squeeze(part.value, axis=axis), folded=True)
        else:
            part = x if size == s[axis] else ctx.add("slice", [x], {"axes": (axis,), "starts": (start,),
                                                                  "ends": (start + size,), "steps": (1,)})
            if squeeze:
                part = ctx.add("squeeze", [part], {"axes": (axis,)})
        items.append(part)
        start += size
    return [Seq(tuple(items), _item_type(ctx, 0))]


def _concat_from_sequence(ctx: OnnxContext) -> list[Any]:
    s = _seq(ctx, 0)
    if not s.items:
        raise ctx.fail("concatenating an empty sequence (its result has no shape)")
    rank = len(_shape(ctx, s.items[0]))
    new_axis = bool(ctx.attr("new_axis", 0))
    axis = ctx.axis(int(ctx.attr("axis")), rank + 1 if new_axis else rank)
    if new_axis:
        return [stack(ctx, s.items, axis)]
    if all(isinstance(v, Const) for v in s.items):
        return [Const(np.concatenate([v.value for v in s.items], axis=axis), folded=True)]
    if len(s.items) == 1:
        return [s.items[0]]
    return [ctx.add("concat", [materialize(ctx, v) for v in s.items], {"axis": axis})]


def _sequence_map(ctx: OnnxContext) -> list[Any]:
    """The body once per item; sequence inputs give their item, tensor inputs themselves."""
    body = attr_value(ctx.node, "body")
    inputs = [ctx.values[n] for n in ctx.node.input if n]
    first = _seq(ctx, 0)
    lengths = {len(v.items) for v in inputs if isinstance(v, Seq)}
    if len(lengths) != 1:
        raise ctx.fail(f"the input sequences have different lengths {sorted(lengths)}")
    from .ops_control import charge, node_count
    per_item: list[list[Value]] = [[] for _ in body.output]
    names = [n for n in ctx.node.input if n]
    for k in range(len(first.items)):
        charge(ctx, 1 + node_count(body), f"item {k}")
        feeds = [v.items[k] if isinstance(v, Seq) else v for v in inputs]
        feed_names = [None if isinstance(v, Seq) else n for v, n in zip(inputs, names)]
        outs, _ = run_body(ctx, body, feeds, f"{ctx.node.output[0]}/{k}/", feed_names)
        for j, v in enumerate(outs):
            per_item[j].append(tensor_value(ctx, v, f"body output {j}"))
    types = [vi.type.sequence_type.elem_type.tensor_type.elem_type if vi.type.WhichOneof("value") == "sequence_type"
             else vi.type.tensor_type.elem_type for vi in body.output]
    return [Seq(tuple(items), t) for items, t in zip(per_item, types)]


# -- optionals ------------------------------------------------------------------------------

def _optional(ctx: OnnxContext) -> list[Any]:
    if not ctx.has_input(0):
        return [Opt(None)]
    v = ctx.values[ctx.node.input[0]]
    return [Opt(v, 0 if isinstance(v, Seq) else _item_type(ctx, 0))]


def _optional_has_element(ctx: OnnxContext) -> list[Any]:
    present = ctx.has_input(0) and not (isinstance(v := ctx.values[ctx.node.input[0]], Opt) and v.value is None)
    return [Const(np.asarray(present), folded=True)]


def _optional_get_element(ctx: OnnxContext) -> list[Any]:
    v = ctx.values[ctx.node.input[0]]
    if isinstance(v, Opt):
        if v.value is None:
            raise ctx.fail(f"optional `{ctx.node.input[0]}` has no element")
        return [v.value]
    return [v]


# -- ReverseSequence ------------------------------------------------------------------------

def _reverse_sequence(ctx: OnnxContext) -> list[Any]:
    """Each batch row's first ``sequence_lens[b]`` steps reversed: a gather along the time axis by
    import-time indices."""
    s = ctx.shape(0)
    if len(s) < 2:
        raise ctx.fail(f"input rank {len(s)} (at least 2)")
    time_axis, batch_axis = int(ctx.attr("time_axis", 0)), int(ctx.attr("batch_axis", 1))
    if {time_axis, batch_axis} not in ({0, 1},):
        raise ctx.fail(f"time_axis={time_axis}, batch_axis={batch_axis} (one is 0, the other 1)")
    lens = np.asarray(ctx.static(1, "sequence_lens")).reshape(-1).astype(np.int64)
    steps, batch = s[time_axis], s[batch_axis]
    if lens.shape != (batch,) or np.any(lens < 0) or np.any(lens > steps):
        raise ctx.fail(f"sequence_lens {lens.tolist()[:8]} for batch {batch} and {steps} steps")
    t = np.arange(steps)[:, None]
    order = np.where(t < lens[None, :], lens[None, :] - 1 - t, t)  # [time, batch]
    if time_axis == 1:
        order = order.T
    index = np.broadcast_to(order.reshape(order.shape + (1,) * (len(s) - 2)), s).astype(np.int64)
    x = ctx.values[ctx.node.input[0]]
    if isinstance(x, Const):
        return [Const(np.take_along_axis(x.value, index, axis=time_axis), folded=True)]
    idx = ctx.b.const(np.ascontiguousarray(index), source=ctx.source, folded=True)
    return [ctx.add("gather_elements", [ctx.operand(0), idx], {"axis": time_axis})]


# -- graph inputs and outputs ---------------------------------------------------------------

def type_text(tp: Any) -> str:
    from .inputs import _type_text
    return _type_text(tp)


def _check_item_type(tp: Any, what: str) -> int:
    from .inputs import NARROW_FLOATS, element_type_name
    if tp.WhichOneof("value") != "tensor_type":
        raise BridgeError(f"ONNX import: {what} is {type_text(tp)}; only sequences and optionals of tensors are "
                          "supported")
    et = tp.tensor_type.elem_type
    if et in NARROW_FLOATS or et not in (0, 1, 2, 3, 4, 5, 6, 7, 9, 11, 12, 13):
        raise BridgeError(f"ONNX import: {what} has element type {element_type_name(et)}, which the IR does not "
                          "support here")
    return et


def structured_input(ctx: OnnxContext, vi: Any, given: Any) -> tuple[Any, list[tuple[str, int]]]:
    """A sequence/optional graph input from the structure ``given`` in ``input_shapes`` (a list of item shapes,
    a shape, None); its value and its IR inputs (name, node id) in order."""
    from torchlean_bridge.graph import Source

    from .ops_math import onnx_element_type
    from .inputs import _given_shape
    tp = vi.type
    made: list[tuple[str, int]] = []

    def tensor(name: str, item_type: Any, shape: Any) -> int:
        et = _check_item_type(item_type, f"input `{vi.name}`")
        nid = ctx.b.input(_given_shape(vi.name, shape), onnx_element_type(et or 1),
                          source=Source(framework="onnx", name=name, tensor=name))
        ctx.onnx_types[name] = et or 1
        made.append((name, nid))
        return nid

    def sequence(seq_type: Any, shapes: Any) -> Seq:
        if not isinstance(shapes, (list, tuple)) or any(not isinstance(s, (list, tuple)) for s in shapes):
            raise BridgeError(f"ONNX import: input `{vi.name}` is {type_text(tp)}: input_shapes must give it a list of "
                              f"item shapes, got {shapes!r}"[:300])
        et = _check_item_type(seq_type.elem_type, f"input `{vi.name}`")
        return Seq(tuple(tensor(f"{vi.name}[{k}]", seq_type.elem_type, s) for k, s in enumerate(shapes)), et or 1)

    kind = tp.WhichOneof("value")
    if kind == "sequence_type":
        return sequence(tp.sequence_type, given), made
    if kind == "optional_type":
        inner = tp.optional_type.elem_type
        if given is None:
            return Opt(None), made
        if inner.WhichOneof("value") == "sequence_type":
            return Opt(sequence(inner.sequence_type, given)), made
        return Opt(tensor(vi.name, inner, given), inner.tensor_type.elem_type), made
    raise BridgeError(f"ONNX import: input `{vi.name}` is {type_text(tp)}; only tensors, sequences and optionals "
                      "are supported")


def flatten_output(ctx: OnnxContext, vi: Any) -> tuple[list[tuple[str, int, int]], Any]:
    """A graph output as IR outputs (name, node id, ONNX element type) and its structure: ``"tensor"``,
    ``{"sequence": n}``, ``{"optional": None | "tensor" | {"sequence": n}}``."""
    v = ctx.values[vi.name]
    tp = vi.type
    kind = tp.WhichOneof("value")

    def declared(t: Any) -> int:
        while t.WhichOneof("value") in ("sequence_type", "optional_type"):
            t = t.sequence_type.elem_type if t.WhichOneof("value") == "sequence_type" else t.optional_type.elem_type
        return t.tensor_type.elem_type if t.WhichOneof("value") == "tensor_type" else 0

    et = declared(tp) if kind else 0

    def items(s: Seq) -> list[tuple[str, int, int]]:
        return [(f"{vi.name}[{k}]", materialize(ctx, tensor_value(ctx, item, f"item {k} of `{vi.name}`")),
                 et or s.elem_type or elem_type(ctx, None, item)) for k, item in enumerate(s.items)]

    if isinstance(v, Opt):
        if kind not in ("optional_type", None):
            raise BridgeError(f"ONNX import: graph output `{vi.name}` is declared {type_text(tp)} but is an optional")
        if v.value is None:
            return [], {"optional": None}
        if isinstance(v.value, Seq):
            return items(v.value), {"optional": {"sequence": len(v.value.items)}}
        return [(vi.name, materialize(ctx, tensor_value(ctx, v.value, f"`{vi.name}`")), et)], {"optional": "tensor"}
    if isinstance(v, Seq):
        if kind not in ("sequence_type", "optional_type", None):
            raise BridgeError(f"ONNX import: graph output `{vi.name}` is declared {type_text(tp)} but is a sequence")
        structure = {"sequence": len(v.items)}
        return items(v), structure if kind != "optional_type" else {"optional": structure}
    if kind == "sequence_type":
        raise BridgeError(f"ONNX import: graph output `{vi.name}` is declared {type_text(tp)} but is a tensor")
    return [(vi.name, ctx.tensor(vi.name), et)], ("tensor" if kind != "optional_type" else {"optional": "tensor"})


HANDLERS: dict[str, Handler] = {
    "SequenceEmpty": _sequence_empty, "SequenceConstruct": _sequence_construct, "SequenceInsert": _sequence_insert,
    "SequenceErase": _sequence_erase, "SequenceAt": _sequence_at, "SequenceLength": _sequence_length,
    "SplitToSequence": _split_to_sequence, "ConcatFromSequence": _concat_from_sequence,
    "SequenceMap": _sequence_map, "Optional": _optional, "OptionalHasElement": _optional_has_element,
    "OptionalGetElement": _optional_get_element, "ReverseSequence": _reverse_sequence,
}
OPSETS = {"SequenceEmpty": (11, 11), "SequenceConstruct": (11, 11), "SequenceInsert": (11, 11),
          "SequenceErase": (11, 11), "SequenceAt": (11, 11), "SequenceLength": (11, 11),
          "SplitToSequence": (11, 24), "ConcatFromSequence": (11, 11), "SequenceMap": (17, 17),
          "Optional": (15, 28), "OptionalHasElement": (15, 28), "OptionalGetElement": (15, 28),
          "ReverseSequence": (10, 28)}
EMITS = {"slice", "squeeze", "unsqueeze", "concat", "gather_elements", "const"}
NOT_FOLDED = frozenset(HANDLERS) - {"ReverseSequence"}
