"""The state one ONNX import carries: known values, the graph builder, and helpers handlers share.

An ONNX tensor name resolves to either an IR node id (a value computed from the inputs) or a
``Const`` (a value known at import time: an initializer, a ``Constant`` node, or something folded
from them). A ``Const`` remembers which initializer it came from and the role transform that turns
that initializer into it, so a weight reached through ``Transpose``/``Reshape``/``Cast`` is still
bound in the role map with the exact transform.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Sequence

import numpy as np

from torchlean_bridge.errors import BridgeError, UnsupportedError
from torchlean_bridge.graph import Source
from torchlean_bridge.ops import Shape
from torchlean_bridge.roles import Step, Transform
from semantics.narrow import widen

from ..builder import GraphBuilder
from ..errors import NotLowerable

__all__ = ["Const", "OnnxContext", "NodeUnsupported", "Opt", "Seq", "Value", "attr_value", "data_dependent",
           "unsupported_error"]


class NodeUnsupported(NotLowerable):
    """A handler cannot lower this node exactly (collected, reported with all others at once): the
    importers' shared ``NotLowerable``, with the tensors that would make it lowerable.

    ``needs`` names the ONNX tensors that would let it lower if they were known at import time
    (``import_onnx(..., constants=...)`` binds graph inputs; the ONNX backend binds them itself).
    """

    def __init__(self, message: str, needs: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.needs = tuple(needs)


@dataclass(frozen=True)
class Const:
    """A tensor known at import time; ``key``/``transform`` say which initializer it is."""

    value: np.ndarray
    key: str | None = None
    transform: str | None = None
    folded: bool = False
    initializer: bool = True  # False for a weight carried by a ``Constant`` node (bound only as a parameter)

    def derived(self, value: np.ndarray, step: str | None) -> "Const":
        """The result of a layout-only op on this constant: same key, one more transform step."""
        if self.key is None or step is None:
            return Const(value, folded=True)
        return Const(value, self.key, Transform.parse(self.transform).then(step).text, True, self.initializer)


Value = int | Const


@dataclass(frozen=True)
class Seq:
    """An ONNX sequence resolved at import time: its length is known, its items are tensor values;
    ``elem_type`` (an ONNX element type number, 0 unknown) types an empty one."""

    items: tuple[Value, ...]
    elem_type: int = 0

    @property
    def kind(self) -> str:
        return f"a sequence (of {len(self.items)} tensors)"


@dataclass(frozen=True)
class Opt:
    """An ONNX optional resolved at import time: ``value`` is its element (a tensor or a ``Seq``), or None."""

    value: "Value | Seq | None"
    elem_type: int = 0

    @property
    def kind(self) -> str:
        return "an optional" + (" without an element" if self.value is None else "")


def attr_value(node: Any, name: str, default: Any = None) -> Any:
    """An ONNX node attribute as a Python value (lists for repeated fields, str for strings)."""
    from onnx import helper
    for a in node.attribute:
        if a.name == name:
            v = helper.get_attribute_value(a)
            if isinstance(v, bytes):
                return _text(v, node, name)
            if isinstance(v, list):
                return [_text(x, node, name) if isinstance(x, bytes) else x for x in v]
            return v
    return default


def _text(value: bytes, node: Any, name: str) -> str:
    try:
        return value.decode()
    except UnicodeDecodeError:
        raise BridgeError(f"ONNX import: attribute `{name}` of a {node.op_type!r} node is not valid UTF-8 "
                          f"({value[:40]!r})") from None


class OnnxContext:
    """Values by ONNX name, the builder, the opset, and helpers for handlers."""

    def __init__(self, builder: GraphBuilder, opset: int, declared_shapes: dict[str, Shape],
                 consumers: dict[str, int]) -> None:
        self.b = builder
        self.opset = opset
        self.values: dict[str, Value] = {}
        self.declared = declared_shapes
        self.consumers = consumers
        self._materialized: dict[str, int] = {}
        self.node: Any = None  # the ONNX node being lowered
        self.used_keys: set[str] = set()
        self.max_elements = builder.max_elements  # the size cap of nodes and of import-time folds
        self.graph_inputs: set[str] = set()  # the model's (unbound) graph inputs
        self.onnx_types: dict[str, int] = {}  # ONNX element types by tensor name (shape inference's)
        self.graph_outputs: list[str] = []  # the model's output names, in order
        self.precision = "float32"  # the float precision the model evaluates in (float64 if it declares a double)
        # control flow (ops_control): how subgraph nodes are lowered, the renames of the enclosing bodies'
        # tensors (innermost last), and how many body nodes unrolling has lowered so far
        self.lower_node: Any = None
        self.scopes: list[dict[str, str]] = []
        self.unrolled = 0

    def consumer_count(self, name: str) -> int:
        """How many node inputs and graph outputs read an ONNX tensor."""
        return self.consumers.get(name, 0)

    def retag(self, nid: int, tensor: str | None = None) -> None:
        """Record on IR node ``nid`` the ONNX tensor whose value it produces."""
        node = self.b.nodes[nid]
        src = node.source or self.source
        self.b.nodes[nid] = node.with_(source=replace(src, tensor=tensor or self.node.output[0]))

    # -- the node being lowered ---------------------------------------------------------------
    @property
    def source(self) -> Source:
        n = self.node
        return Source(framework="onnx", name=n.name or None, target=n.op_type)

    def attr(self, name: str, default: Any = None) -> Any:
        """An attribute, or the default; float defaults are rounded to binary32 like stored ONNX floats."""
        if isinstance(default, float):
            default = float(np.float32(default))
        return attr_value(self.node, name, default)

    def fail(self, reason: str) -> NodeUnsupported:
        return NodeUnsupported(reason)

    # -- inputs -------------------------------------------------------------------------------
    def has_input(self, i: int) -> bool:
        return len(self.node.input) > i and self.node.input[i] != ""

    def const(self, i: int) -> Const | None:
        """Input ``i`` if it is known at import time."""
        if not self.has_input(i):
            return None
        v = self.values[self.node.input[i]]
        return v if isinstance(v, Const) else None

    def needed(self, i: int, what: str) -> Const:
        """Input ``i`` that must be known at import time (shapes, axes, pads, weights...)."""
        c = self.const(i)
        if c is None:
            name = self.node.input[i] if self.has_input(i) else ""
            if what in SHAPE_OPERANDS and name:
                raise data_dependent(self, [name], f"input {i} ({what}) must be a constant known at import time",
                                     f"make `{what}` a constant")
            raise NodeUnsupported(f"input {i} ({what}) must be a constant known at import time (bind graph input "
                                  f"`{name}` with constants=... or --bind)" if name in self.graph_inputs else
                                  f"input {i} ({what}) must be a constant known at import time", needs=[name])
        return c

    def static(self, i: int, what: str) -> np.ndarray:
        """The value of input ``i`` that must be known at import time (shapes, axes, pads...)."""
        return self.needed(i, what).value

    def ints(self, i: int, what: str) -> list[int] | None:
        if not self.has_input(i):
            return None
        return [int(v) for v in np.asarray(self.static(i, what)).reshape(-1)]

    def operand(self, i: int) -> int:
        """Input ``i`` as an IR node id; a constant becomes a (shared) ``const`` node."""
        return self.tensor(self.node.input[i])

    def tensor(self, name: str) -> int:
        v = self.values[name]
        if isinstance(v, int):
            return v
        if not isinstance(v, Const):
            raise NodeUnsupported(f"`{name}` is {v.kind}, where a tensor is expected")
        if name not in self._materialized:
            value = widen(v.value)  # narrow values exactly as float32 / int64 (docs/element-types.md)
            if value.dtype.kind not in "biuf":
                raise NodeUnsupported(f"constant `{name}` has element type {v.value.dtype}, which the IR does not "
                                      "support")
            key = v.key if v.initializer else None
            if key is not None:
                self.used_keys.add(key)
            self._materialized[name] = self.b.const(value, key=key, transform=v.transform if key else None,
                                                    source=Source(framework="onnx", name=name, tensor=name),
                                                    folded=v.folded)
        return self._materialized[name]

    def operands(self) -> list[int]:
        return [self.operand(i) for i in range(len(self.node.input)) if self.node.input[i] != ""]

    def shape(self, i: int) -> Shape:
        v = self.values[self.node.input[i]]
        if not isinstance(v, (int, Const)):
            raise NodeUnsupported(f"input {i} (`{self.node.input[i]}`) is {v.kind}, where a tensor is expected")
        return tuple(v.value.shape) if isinstance(v, Const) else self.b.shape(v)

    def rank(self, i: int) -> int:
        return len(self.shape(i))

    def dtype(self, i: int) -> str:
        from ..builder import element_type_of
        v = self.values[self.node.input[i]]
        return element_type_of(widen(v.value)) if isinstance(v, Const) else self.b.dtype(v)

    def onnx_type(self, name: str) -> str:
        """The ONNX element type of a tensor by ONNX's name for it (``uint8``, not the IR's int64)."""
        from .inputs import element_type_name
        v = self.values.get(name)
        if isinstance(v, Const):
            return str(v.value.dtype)
        t = self.onnx_types.get(name)
        return element_type_name(t) if t else self.b.dtype(v) if isinstance(v, int) else "unknown"

    def axis(self, axis: int, rank: int) -> int:
        """A possibly negative ONNX axis made non-negative (and checked)."""
        a = axis + rank if axis < 0 else axis
        if not 0 <= a < rank:
            raise self.fail(f"axis {axis} is out of range for rank {rank}")
        return a

    # -- payload ------------------------------------------------------------------------------
    def param(self, nid: int, role: str, i: int, reshape_to: Sequence[int] | None = None,
              transpose: bool = False) -> None:
        """Store constant input ``i`` as payload ``role`` of node ``nid``, bound to its initializer."""
        self.param_const(nid, role, self.needed(i, role), reshape_to, transpose)

    def param_const(self, nid: int, role: str, c: Const, reshape_to: Sequence[int] | None = None,
                    transpose: bool = False) -> None:
        value, transform = c.value, c.transform
        if transpose:
            value = value.T
            transform = Transform.parse(transform).then("transpose").text
        if reshape_to is not None and tuple(value.shape) != tuple(reshape_to):
            if value.size != math.prod(reshape_to):
                raise NodeUnsupported(f"{role} has shape {list(value.shape)}, expected {list(reshape_to)}")
            value = value.reshape(tuple(reshape_to))
            transform = Transform.parse(transform).then(Step("reshape", tuple(reshape_to))).text
        value = widen(value)  # narrow values exactly as float32 / int64 (docs/element-types.md)
        if c.key is not None:
            self.used_keys.add(c.key)
        self.b.param(nid, role, np.asarray(value, order="C"), key=c.key, transform=transform if c.key else None)

    def add(self, kind: str, parents: Sequence[int], attrs: dict | None = None, **kw: Any) -> int:
        return self.b.add(kind, parents, attrs, source=self.source, **kw)

    def elementwise(self, kind: str, operands: Sequence[int]) -> int:
        return self.b.elementwise(kind, operands, source=self.source)

    def scalar(self, value: float, dtype: Any = np.float32) -> int:
        """A folded scalar constant (alpha/beta factors, divisors)."""
        return self.b.const(np.asarray(value, dtype=dtype), source=self.source, folded=True)


def unsupported_error(items: list[dict], opset: int) -> UnsupportedError:
    """One error listing every node that could not be lowered (name, op type, opset, reason)."""
    lines = [f"  {it['op']} (node `{it['name']}`, opset {opset}): {it['reason']}" for it in items]
    ops = sorted({it["op"] for it in items})
    return UnsupportedError(f"ONNX import: {len(items)} node(s) cannot be lowered ({', '.join(ops)}):\n"
                            + "\n".join(lines), items=[{**it, "opset": opset} for it in items])


# operands whose value sets the output's extent: computed at run time, they make a data-dependent shape
SHAPE_OPERANDS = frozenset({"shape", "sizes", "scales", "repeats", "pads", "split", "K", "k", "output_shape", "size",
                            "depth", "starts", "ends", "steps", "image_shape", "block_shape"})


def data_dependent(ctx: "OnnxContext", names: Sequence[str], what: str, fix: str) -> NodeUnsupported:
    """The refusal of a node whose output shape depends on input values (issue #32): ``what`` says which
    values and why, then the remedies: bind the graph inputs among ``names``, ``fix`` (the op's own way to a
    static shape), or export with static shapes. ``needs`` keeps ``names`` (the ONNX backend binds them)."""
    names = list(names)
    bind = [n for n in names if n in ctx.graph_inputs]
    hint = f"; bind graph inputs {bind} with constants=... or --bind" if bind else ""
    return NodeUnsupported(f"{what} (a data-dependent shape: the output's extent depends on the values of "
                           f"{names}){hint}; or {fix}, or export with static shapes", needs=names)
