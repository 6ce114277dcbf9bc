"""ONNX RNN, GRU and LSTM unrolled over their static sequence length into existing IR kinds.

Each step is the spec's cell equations (onnx.defs, RNN-14/GRU-14/LSTM-14 and -22) written with matmul,
add, mul, slice, the activations and, for ``clip``, clamp: the input projection of every step is one
matmul ``X @ W^T`` plus the bias, the recurrent one ``H @ R^T`` per step. Every direction
(forward/reverse/bidirectional), activation lists (with activation_alpha/beta consumed in order by the
activations that take them, onnxruntime's rule), ``clip``, GRU's ``linear_before_reset``, LSTM's
peepholes, ``layout`` 0 and 1, the optional outputs Y/Y_h/Y_c and initial states are lowered. Constant
``sequence_lens`` shorter than the sequence mask the steps past each row's length (``where``: the state
holds, Y is 0, as the spec and onnxruntime define it); computed ones are refused by name, as is LSTM's
``input_forget``. The unrolled size is bounded like control flow (ops_control.charge).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from torchlean_bridge.errors import BridgeError

from .context import Const, NodeUnsupported, OnnxContext, Value
from .ops_control import charge, materialize, stack, take

__all__ = ["HANDLERS", "OPSETS", "EMITS", "ACTIVATIONS"]

Handler = Callable[[OnnxContext], list[Any]]

_GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
_DEFAULT_ACTIVATIONS = {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}
# activation -> (takes alpha, takes beta, default alpha, default beta): the defaults are the ONNX ops'
ACTIVATIONS: dict[str, tuple[bool, bool, float, float]] = {
    "Sigmoid": (False, False, 0.0, 0.0), "Tanh": (False, False, 0.0, 0.0), "Relu": (False, False, 0.0, 0.0),
    "Softsign": (False, False, 0.0, 0.0), "Softplus": (False, False, 0.0, 0.0),
    "LeakyRelu": (True, False, 0.01, 0.0), "Elu": (True, False, 1.0, 0.0), "ThresholdedRelu": (True, False, 1.0, 0.0),
    "HardSigmoid": (True, True, 0.2, 0.5), "Affine": (True, True, 1.0, 0.0), "ScaledTanh": (True, True, 1.0, 1.0),
}
_CASE = {name.lower(): name for name in ACTIVATIONS}


class _Cell:
    """Helpers that build one recurrent layer's nodes."""

    def __init__(self, ctx: OnnxContext) -> None:
        self.ctx = ctx

    def node(self, kind: str, parents: list[int], attrs: dict | None = None) -> int:
        return self.ctx.add(kind, parents, attrs)

    def ew(self, kind: str, *operands: int) -> int:
        return self.ctx.elementwise(kind, list(operands))

    def scalar(self, value: float) -> int:
        return self.ctx.scalar(value, np.float64 if self.ctx.precision == "float64" else np.float32)

    def cols(self, x: int, start: int, stop: int) -> int:
        width = self.ctx.b.shape(x)[-1]
        if (start, stop) == (0, width):
            return x
        axis = len(self.ctx.b.shape(x)) - 1
        return self.node("slice", [x], {"axes": (axis,), "starts": (start,), "ends": (stop,), "steps": (1,)})

    def activation(self, name: str, alpha: float, beta: float, x: int) -> int:
        if name in ("Sigmoid", "Tanh", "Relu", "Softsign", "Softplus"):
            return self.node(name.lower(), [x])
        if name == "LeakyRelu":
            return self.node("leaky_relu", [x], {"negative_slope": alpha})
        if name == "Elu":
            return self.node("elu", [x], {"alpha": alpha})
        if name == "HardSigmoid":
            return self.node("hardsigmoid", [x], {"alpha": alpha, "beta": beta})
        if name == "Affine":
            return self.ew("add", self.ew("mul_elem", x, self.scalar(alpha)), self.scalar(beta))
        if name == "ScaledTanh":
            return self.ew("mul_elem", self.node("tanh", [self.ew("mul_elem", x, self.scalar(beta))]),
                           self.scalar(alpha))
        if name == "ThresholdedRelu":
            return self.ew("where", self.ew("gt", x, self.scalar(alpha)), x, self.scalar(0.0))
        raise AssertionError(name)


def _activations(ctx: OnnxContext, op: str, directions: int) -> list[list[tuple[str, float, float]]]:
    """Per direction, the cell's activations with their alpha and beta."""
    per_direction = len(_DEFAULT_ACTIVATIONS[op])
    names = ctx.attr("activations")
    if names is None:
        names = _DEFAULT_ACTIVATIONS[op] * directions
    names = [_CASE.get(str(n).lower(), str(n)) for n in names]
    if len(names) == per_direction and directions == 2:
        names = names * 2
    if len(names) != per_direction * directions:
        raise ctx.fail(f"activations lists {len(names)} functions; {op} with {directions} direction(s) takes "
                       f"{per_direction * directions}")
    unknown = [n for n in names if n not in ACTIVATIONS]
    if unknown:
        raise ctx.fail(f"activation {unknown[0]} is not one of {', '.join(ACTIVATIONS)}")
    alphas = list(ctx.attr("activation_alpha") or [])
    betas = list(ctx.attr("activation_beta") or [])
    out = []
    for name in names:
        takes_alpha, takes_beta, alpha, beta = ACTIVATIONS[name]
        if takes_alpha and alphas:
            alpha = float(alphas.pop(0))
        if takes_beta and betas:
            beta = float(betas.pop(0))
        out.append((name, alpha, beta))
    return [out[d * per_direction:(d + 1) * per_direction] for d in range(directions)]


def _shape(ctx: OnnxContext, v: Value) -> tuple[int, ...]:
    return tuple(v.value.shape) if isinstance(v, Const) else ctx.b.shape(v)


def _input(ctx: OnnxContext, i: int, what: str, shape: tuple[int, ...]) -> Value | None:
    """Optional input ``i`` (a constant or a computed tensor), checked to have ``shape``."""
    if not ctx.has_input(i):
        return None
    v = ctx.values[ctx.node.input[i]]
    if not isinstance(v, (int, Const)):
        raise ctx.fail(f"{what} is {v.kind}, where a tensor is expected")
    if _shape(ctx, v) != shape:
        raise ctx.fail(f"{what} has shape {list(_shape(ctx, v))}, expected {list(shape)}")
    if isinstance(v, int) and ctx.b.dtype(v) != "float" or isinstance(v, Const) and v.value.dtype.kind != "f":
        raise ctx.fail(f"{what} is not a float tensor")
    return v


def _matrix(ctx: OnnxContext, v: Value, d: int, rows: tuple[int, int] | None = None, transpose: bool = True) -> int:
    """``v[d][rows]`` (transposed): a direction's weight block, as an IR node. A constant that is a whole
    initializer stays bound to it (with a reshape/transpose transform) when the layer has one direction."""
    if isinstance(v, Const):
        c = take(ctx, v, 0, d)
        if rows is not None and (rows[0], rows[1]) != (0, c.value.shape[0]):
            c = Const(c.value[rows[0]:rows[1]], folded=True)
        if transpose and c.value.ndim == 2:
            c = c.derived(np.ascontiguousarray(c.value.T), "transpose")
        return materialize(ctx, c)
    part = take(ctx, v, 0, d)
    if rows is not None and (rows[0], rows[1]) != (0, ctx.b.shape(part)[0]):
        part = ctx.add("slice", [part], {"axes": (0,), "starts": (rows[0],), "ends": (rows[1],), "steps": (1,)})
    if transpose and len(ctx.b.shape(part)) == 2:
        part = ctx.add("permute", [part], {"perm": (1, 0)})
    return part


def _masks(ctx: OnnxContext, seq: int, batch: int) -> np.ndarray | None:
    """Per step, which batch rows are inside their sequence ([seq, batch] bools), or None when all are."""
    if not ctx.has_input(4):
        return None
    c = ctx.const(4)
    if c is None:
        name = ctx.node.input[4]
        raise NodeUnsupported(f"sequence_lens `{name}` is computed at run time: the steps each row takes must be "
                              "known at import time", needs=[name])
    lens = np.asarray(c.value).reshape(-1).astype(np.int64)
    if lens.shape != (batch,) or np.any(lens < 0) or np.any(lens > seq):
        raise ctx.fail(f"sequence_lens {lens.tolist()[:8]} for batch {batch} and sequence length {seq}")
    if np.all(lens == seq):
        return None
    return np.arange(seq)[:, None] < lens[None, :]


def _recurrent(op: str) -> Handler:
    def lower(ctx: OnnxContext) -> list[Any]:
        cell = _Cell(ctx)
        gates = _GATES[op]
        direction = str(ctx.attr("direction", "forward"))
        if direction not in ("forward", "reverse", "bidirectional"):
            raise ctx.fail(f"direction {direction!r}")
        nd = 2 if direction == "bidirectional" else 1
        layout = int(ctx.attr("layout", 0))
        if layout not in (0, 1):
            raise ctx.fail(f"layout={layout}")
        if op == "LSTM" and int(ctx.attr("input_forget", 0)):
            raise ctx.fail("input_forget=1 (coupled input and forget gates) is not lowered")
        xs = ctx.shape(0)
        if len(xs) != 3:
            raise ctx.fail(f"X has rank {len(xs)}, expected 3")
        x = ctx.operand(0)
        if ctx.dtype(0) != "float":
            raise ctx.fail("X is not a float tensor")
        if layout == 1:
            x = ctx.add("permute", [x], {"perm": (1, 0, 2)})
        seq, batch, width = ctx.b.shape(x)
        rs = ctx.shape(2)
        hidden = int(ctx.attr("hidden_size", rs[-1] if len(rs) == 3 else 0))
        w = _input(ctx, 1, "W", (nd, gates * hidden, width))
        r = _input(ctx, 2, "R", (nd, gates * hidden, hidden))
        b = _input(ctx, 3, "B", (nd, 2 * gates * hidden))
        state_shape = (batch, nd, hidden) if layout else (nd, batch, hidden)
        h0 = _input(ctx, 5, "initial_h", state_shape)
        c0 = _input(ctx, 6, "initial_c", state_shape) if op == "LSTM" else None
        p = _input(ctx, 7, "P", (nd, 3 * hidden)) if op == "LSTM" else None
        if seq == 0 or batch == 0 or hidden == 0:
            raise ctx.fail(f"empty extents (sequence {seq}, batch {batch}, hidden {hidden})")
        masks = _masks(ctx, seq, batch)
        acts = _activations(ctx, op, nd)
        clip = ctx.attr("clip")
        lbr = bool(ctx.attr("linear_before_reset", 0)) if op == "GRU" else False
        charge(ctx, seq * nd * 24, f"{op} over {seq} steps")
        states0 = []
        for init in (h0, c0):
            if init is not None and layout == 1:
                init = ctx.add("permute", [materialize(ctx, init)], {"perm": (1, 0, 2)})
            states0.append(init)
        ys, finals_h, finals_c = [], [], []
        for d in range(nd):
            reverse = direction == "reverse" or d == 1
            h = None if states0[0] is None else take(ctx, states0[0], 0, d)
            c = None if states0[1] is None else take(ctx, states0[1], 0, d)
            step = _Step(ctx, cell, op, d, w, r, b, p, x, hidden, acts[d], clip, lbr)
            outs: list[Any] = [None] * seq
            for t in (range(seq - 1, -1, -1) if reverse else range(seq)):
                h_new, c_new = step(t, h, c)
                if masks is not None and not masks[t].all():
                    keep = ctx.b.const(masks[t].reshape(batch, 1), source=ctx.source, folded=True)
                    h_new = cell.ew("where", keep, h_new, materialize(ctx, h) if h is not None else cell.scalar(0.0))
                    if c_new is not None:
                        c_new = cell.ew("where", keep, c_new, materialize(ctx, c) if c is not None else cell.scalar(0.0))
                    outs[t] = cell.ew("where", keep, h_new, cell.scalar(0.0))
                else:
                    outs[t] = h_new
                h, c = h_new, c_new
            ys.append(stack(ctx, outs, 0))
            finals_h.append(h)
            finals_c.append(c)
        results: list[Any] = []
        names = list(ctx.node.output) + [""] * 3
        if names[0]:
            y = stack(ctx, ys, 1)
            results.append(ctx.add("permute", [materialize(ctx, y)], {"perm": (2, 0, 1, 3)}) if layout else y)
        else:
            results.append(None)
        for finals, name in ((finals_h, names[1]), (finals_c, names[2])):
            if not name:
                results.append(None)
                continue
            final = stack(ctx, finals, 0)
            results.append(ctx.add("permute", [materialize(ctx, final)], {"perm": (1, 0, 2)}) if layout else final)
        return results[:len(ctx.node.output)]
    return lower


class _Step:
    """One direction's cell: the input projection of every step at once, then one step at a time."""

    def __init__(self, ctx: OnnxContext, cell: _Cell, op: str, d: int, w: Value, r: Value, b: Value | None,
                 p: Value | None, x: int, hidden: int, acts: list[tuple[str, float, float]], clip: float | None,
                 lbr: bool) -> None:
        self.ctx, self.cell, self.op, self.hidden, self.acts, self.clip, self.lbr = ctx, cell, op, hidden, acts, clip, lbr
        g = _GATES[op] * hidden
        proj = cell.node("matmul", [x, _matrix(ctx, w, d)])  # [seq, batch, G*hidden]
        self.rb_h = None
        if b is not None:
            wb = _matrix(ctx, b, d, (0, g), transpose=False)
            rb = _matrix(ctx, b, d, (g, 2 * g), transpose=False)
            if op == "GRU":  # Rb_h sits inside the reset gate's product (linear_before_reset) or after it
                self.rb_h = cell.cols(rb, 2 * hidden, 3 * hidden)
                rb = cell.cols(rb, 0, 2 * hidden)
                bias = cell.ew("add", cell.cols(wb, 0, 2 * hidden), rb)
                bias = ctx.add("concat", [bias, cell.cols(wb, 2 * hidden, 3 * hidden)], {"axis": 0})
            else:
                bias = cell.ew("add", wb, rb)
            proj = cell.ew("add", proj, bias)
        self.proj = proj
        if op == "GRU":
            self.r_zr = _matrix(ctx, r, d, (0, 2 * hidden))
            self.r_h = _matrix(ctx, r, d, (2 * hidden, 3 * hidden))
        else:
            self.r_all = _matrix(ctx, r, d)
        self.p = None if p is None else [_matrix(ctx, p, d, (k * hidden, (k + 1) * hidden), transpose=False)
                                         for k in range(3)]

    def pre(self, x: int) -> int:
        if self.clip is None:
            return x
        return self.cell.node("clamp", [x], {"min": -float(self.clip), "max": float(self.clip)})

    def act(self, k: int, x: int) -> int:
        name, alpha, beta = self.acts[k]
        return self.cell.activation(name, alpha, beta, self.pre(x))

    def __call__(self, t: int, h: Value | None, c: Value | None) -> tuple[int, int | None]:
        ctx, cell, n = self.ctx, self.cell, self.hidden
        xt = take(ctx, self.proj, 0, t)
        hn = None if h is None else materialize(ctx, h)
        if self.op == "RNN":
            z = xt if hn is None else cell.ew("add", xt, cell.node("matmul", [hn, self.r_all]))
            return self.act(0, z), None
        if self.op == "GRU":
            zr = cell.cols(xt, 0, 2 * n)
            if hn is not None:
                zr = cell.ew("add", zr, cell.node("matmul", [hn, self.r_zr]))
            z, rg = self.act(0, cell.cols(zr, 0, n)), self.act(0, cell.cols(zr, n, 2 * n))
            xh = cell.cols(xt, 2 * n, 3 * n)
            if hn is None:  # H_{t-1} = 0: the recurrent term is Rb_h alone (times r when linear_before_reset)
                rec = None if self.rb_h is None else (cell.ew("mul_elem", rg, self.rb_h) if self.lbr else self.rb_h)
            elif self.lbr:
                inner = cell.node("matmul", [hn, self.r_h])
                if self.rb_h is not None:
                    inner = cell.ew("add", inner, self.rb_h)
                rec = cell.ew("mul_elem", rg, inner)
            else:
                rec = cell.node("matmul", [cell.ew("mul_elem", rg, hn), self.r_h])
                if self.rb_h is not None:
                    rec = cell.ew("add", rec, self.rb_h)
            cand = self.act(1, xh if rec is None else cell.ew("add", xh, rec))
            one_minus_z = cell.ew("sub", cell.scalar(1.0), z)
            new = cell.ew("mul_elem", one_minus_z, cand)
            if hn is not None:
                new = cell.ew("add", new, cell.ew("mul_elem", z, hn))
            return new, None
        # LSTM, gates i, o, f, c
        gates = xt if hn is None else cell.ew("add", xt, cell.node("matmul", [hn, self.r_all]))
        cn = None if c is None else materialize(ctx, c)
        i, o, f, g = (cell.cols(gates, k * n, (k + 1) * n) for k in range(4))
        if self.p is not None and cn is not None:
            i = cell.ew("add", i, cell.ew("mul_elem", self.p[0], cn))
            f = cell.ew("add", f, cell.ew("mul_elem", self.p[2], cn))
        i, f, g = self.act(0, i), self.act(0, f), self.act(1, g)
        c_new = cell.ew("mul_elem", i, g)
        if cn is not None:
            c_new = cell.ew("add", cell.ew("mul_elem", f, cn), c_new)
        if self.p is not None:
            o = cell.ew("add", o, cell.ew("mul_elem", self.p[1], c_new))
        o = self.act(0, o)
        name, alpha, beta = self.acts[2]
        return cell.ew("mul_elem", o, cell.activation(name, alpha, beta, c_new)), c_new


def _guarded(op: str) -> Handler:
    lower = _recurrent(op)

    def run(ctx: OnnxContext) -> list[Any]:
        try:
            return lower(ctx)
        except NodeUnsupported:
            raise
        except BridgeError as e:  # a shape rule rejecting the operands: name the layer
            raise NodeUnsupported(f"{op}: {e.message}") from None
    return run


HANDLERS: dict[str, Handler] = {op: _guarded(op) for op in _GATES}
OPSETS = {"RNN": (7, 22), "GRU": (7, 22), "LSTM": (7, 22)}
EMITS = {"matmul", "add", "sub", "mul_elem", "slice", "squeeze", "unsqueeze", "concat", "permute", "clamp", "where",
         "gt", "sigmoid", "tanh", "relu", "softsign", "softplus", "leaky_relu", "elu", "hardsigmoid", "const"}
NOT_FOLDED = frozenset(HANDLERS)
