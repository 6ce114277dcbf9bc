"""ONNX integer arithmetic, Mod, BitShift, bitwise and logical ops.

The IR holds every integer tensor as int64. ``Add``/``Sub``/``Mul``/``Div``/``Max``/``Min``/``Mod`` on
integer operands lower to the ``int_*`` / ``mod`` ext ops, which compute exactly in int64 and carry the
ONNX element type (int8..uint64) whose range the result must fit: a result ONNX would wrap is refused
at evaluation. Float operands keep the existing lowerings (``Mod`` on floats is the ``mod`` op: numpy's
fmod / mod, as onnx's reference computes it). ``Xor`` on bools is ``ne``. Integer ``Neg``/``Abs`` are ``0 - x`` /
``max(x, 0 - x)`` (issue #32).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from torchlean_bridge.ops import BOOL, INT64
from torchlean_bridge.ops.contracts import broadcast_shapes

from . import ops_math
from .context import Const, OnnxContext, Value

__all__ = ["HANDLERS", "OPSETS", "EMITS"]

Handler = Callable[[OnnxContext], list[Value]]

_INT_TYPES = {f"{p}int{b}": (b, p == "") for p in ("", "u") for b in (8, 16, 32, 64)}


def _int_type(ctx: OnnxContext) -> dict:
    """``bits``/``signed`` of the node's integer operands (their ONNX element type)."""
    names = [n for n in ctx.node.input if n]
    computed = [n for n in names if not isinstance(ctx.values[n], Const)] or names
    types = {ctx.onnx_type(n) for n in computed}
    if len(types) != 1 or next(iter(types)) not in _INT_TYPES:
        raise ctx.fail(f"integer operands of element types {sorted(types)}")
    bits, signed = _INT_TYPES[types.pop()]
    return {"bits": bits, "signed": signed}


def _integer(op: str, kind: str) -> Handler:
    float_lowering = ops_math.HANDLERS.get(op)

    def lower(ctx: OnnxContext) -> list[Value]:
        if ctx.dtype(0) != INT64:
            if float_lowering is None:
                raise ctx.fail(f"{op} of {ctx.onnx_type(ctx.node.input[0])} operands")
            return float_lowering(ctx)
        attrs = _int_type(ctx)
        ops = ctx.operands()
        if len(ops) == 1 and op in ("Max", "Min"):
            return [ctx.values[ctx.node.input[0]]]
        acc = ops[0]
        for o in ops[1:]:  # Max/Min are variadic
            acc = _broadcast_add(ctx, kind, acc, o, attrs)
        return [acc]
    return lower


def _broadcast_add(ctx: OnnxContext, kind: str, a: int, b: int, attrs: dict) -> int:
    """A binary node with its operands broadcast explicitly (numpy rules) and its attributes set."""
    target = broadcast_shapes(ctx.b.shape(a), ctx.b.shape(b), ctx.node.op_type)
    return ctx.add(kind, [ctx.b.broadcast(a, target, ctx.source), ctx.b.broadcast(b, target, ctx.source)], attrs)


def _binary_int(ctx: OnnxContext, kind: str, attrs: dict) -> int:
    return _broadcast_add(ctx, kind, ctx.operand(0), ctx.operand(1), attrs)


def _mod(ctx: OnnxContext) -> list[Value]:
    fmod = bool(ctx.attr("fmod", 0))
    if ctx.dtype(0) == INT64:
        attrs = {"fmod": fmod, **_int_type(ctx)}
    elif ctx.dtype(0) == BOOL:
        raise ctx.fail("Mod of bool operands")
    else:
        import onnx.defs
        if not fmod and onnx.defs.get_schema("Mod", ctx.opset, "").since_version < 28:
            raise ctx.fail("fmod=0 with float operands (before Mod-28, ONNX requires fmod=1 for floats)")
        attrs = {"fmod": fmod}
    return [_binary_int(ctx, "mod", attrs)]


def _bitshift(ctx: OnnxContext) -> list[Value]:
    direction = str(ctx.attr("direction", ""))
    if direction not in ("LEFT", "RIGHT"):
        raise ctx.fail(f"direction={direction!r}")
    return [_binary_int(ctx, "bitshift", {"left": direction == "LEFT", **_int_type(ctx)})]


def _bitwise(kind: str) -> Handler:
    def lower(ctx: OnnxContext) -> list[Value]:
        if kind == "bitwise_not":
            return [ctx.add(kind, [ctx.operand(0)], _int_type(ctx))]
        return [_binary_int(ctx, kind, _int_type(ctx))]
    return lower


def _signed_unary(op: str) -> Handler:
    """Integer ``Neg`` is ``0 - x`` and ``Abs`` is ``max(x, 0 - x)`` (``x`` when unsigned), exact in the type."""
    float_lowering = ops_math.HANDLERS[op]

    def lower(ctx: OnnxContext) -> list[Value]:
        if ctx.dtype(0) != INT64:
            return float_lowering(ctx)
        attrs = _int_type(ctx)
        x = ctx.operand(0)
        if op == "Abs" and not attrs["signed"]:
            return [x]
        zero = ctx.b.const(np.zeros(ctx.shape(0), dtype=np.int64), source=ctx.source, folded=True)
        negated = ctx.add("int_sub", [zero, x], attrs)
        return [negated if op == "Neg" else ctx.add("int_max", [x, negated], attrs)]
    return lower


def _xor(ctx: OnnxContext) -> list[Value]:
    return [ctx.elementwise("ne", [ctx.operand(0), ctx.operand(1)])]


HANDLERS: dict[str, Handler] = {
    "Add": _integer("Add", "int_add"), "Sub": _integer("Sub", "int_sub"), "Mul": _integer("Mul", "int_mul"),
    "Div": _integer("Div", "int_div"), "Max": _integer("Max", "int_max"), "Min": _integer("Min", "int_min"),
    "Neg": _signed_unary("Neg"), "Abs": _signed_unary("Abs"),
    "Mod": _mod, "BitShift": _bitshift, "BitwiseAnd": _bitwise("bitwise_and"), "BitwiseOr": _bitwise("bitwise_or"),
    "BitwiseXor": _bitwise("bitwise_xor"), "BitwiseNot": _bitwise("bitwise_not"), "Xor": _xor,
}
# the arithmetic ops keep ops_math's ranges; Mod-10/-13 (types), -28 (float fmod=0: numpy.mod);
# BitShift-11 (unsigned), -28 (signed: arithmetic right shift, two's complement left shift); Bitwise*-18; Xor-1/-7
OPSETS: dict[str, tuple[int, int]] = {
    **{op: ops_math.OPSETS[op] for op in ("Add", "Sub", "Mul", "Div", "Max", "Min", "Neg", "Abs")},
    "Mod": (10, 28), "BitShift": (11, 28), "BitwiseAnd": (18, 18), "BitwiseOr": (18, 18), "BitwiseXor": (18, 18),
    "BitwiseNot": (18, 18), "Xor": (1, 7),  # Xor-1: its broadcast attributes are made explicit (legacy.py)
}
EMITS = frozenset({"int_add", "int_sub", "int_mul", "int_div", "int_max", "int_min", "mod", "bitshift",
                   "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not", "ne", "broadcast_to", "const"})
