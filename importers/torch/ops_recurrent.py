"""``nn.LSTM``, ``nn.GRU`` and ``nn.RNN`` unrolled over their static sequence length (as the ONNX importer's
recurrent layers are): per layer and direction, the input projection of every step is one ``linear``
(``weight_ih_l{k}``/``bias_ih_l{k}``, bound to their state_dict keys) and each step adds the recurrent
``linear`` (``weight_hh_l{k}``/``bias_hh_l{k}``) before PyTorch's gate equations (LSTM gates i, f, g, o;
GRU r, z, n with the reset gate applied to ``W_hn h + b_hn``). ``batch_first``, ``num_layers``,
``bidirectional``, unbatched inputs, ``bias=False``, ``nonlinearity='relu'`` and initial states are
lowered; ``proj_size`` and training-mode dropout between layers are refused by name, and a
``PackedSequence`` never reaches a tensor lowering.
"""

from __future__ import annotations

from typing import Any

import torch.nn as nn

from . import ops_elementwise as elementwise
from . import ops_layout as layout
from . import ops_nn as nn_ops
from .common import NotLowerable
from .lowerer import Lowerer
from .targets import lowers

__all__: list[str] = []

Cx = Lowerer
_MAX_STEPS = 100_000  # time steps x layers x directions unrolled by one module call


def _sigmoid(cx: Cx, v: Any) -> Any:
    return elementwise.unary("sigmoid")(cx, v)


def _tanh(cx: Cx, v: Any) -> Any:
    return elementwise.unary("tanh")(cx, v)


def _cell(cx: Cx, kind: str, xt: Any, h: Any, c: Any, w_hh: Any, b_hh: Any, hidden: int) -> tuple[Any, Any]:
    """One step: the new hidden state (and cell state for LSTM) from the projected input ``xt``."""
    rec = None if h is None else nn_ops.linear(cx, h, w_hh, b_hh)
    if rec is None and b_hh is not None:
        rec = b_hh
    if kind == "GRU":
        gi = [layout.slice_axis(cx, xt, -1, k * hidden, (k + 1) * hidden) for k in range(3)]
        gh = None if rec is None else [layout.slice_axis(cx, rec, -1, k * hidden, (k + 1) * hidden) for k in range(3)]
        r = _sigmoid(cx, gi[0] if gh is None else elementwise.add(cx, gi[0], gh[0]))
        z = _sigmoid(cx, gi[1] if gh is None else elementwise.add(cx, gi[1], gh[1]))
        n = _tanh(cx, gi[2] if gh is None else elementwise.add(cx, gi[2], elementwise.mul(cx, r, gh[2])))
        new = elementwise.mul(cx, elementwise.sub(cx, 1.0, z), n)
        return (new if h is None else elementwise.add(cx, new, elementwise.mul(cx, z, h))), None
    pre = xt if rec is None else elementwise.add(cx, xt, rec)
    if kind == "LSTM":
        i, f, g, o = (layout.slice_axis(cx, pre, -1, k * hidden, (k + 1) * hidden) for k in range(4))
        i, f, g, o = _sigmoid(cx, i), _sigmoid(cx, f), _tanh(cx, g), _sigmoid(cx, o)
        c_new = elementwise.mul(cx, i, g)
        if c is not None:
            c_new = elementwise.add(cx, elementwise.mul(cx, f, c), c_new)
        return elementwise.mul(cx, o, _tanh(cx, c_new)), c_new
    act = _tanh if kind == "RNN_TANH" else elementwise.unary("relu")
    return act(cx, pre), None


def unroll(cx: Cx, kind: str, input: Any, h0: Any, c0: Any, params: list[tuple[Any, Any, Any, Any]], num_layers: int,
           bidirectional: bool, batch_first: bool, hidden: int) -> tuple[Any, Any, Any]:
    """The layer stack over every step: (output, h_n, c_n); ``params`` per layer and direction
    (w_ih, w_hh, b_ih, b_hh), biases None without them; ``kind`` LSTM, GRU, RNN_TANH or RNN_RELU."""
    rank = cx.rank(input)
    if rank not in (2, 3):
        raise NotLowerable(f"{kind} input of rank {rank} (2 or 3)")
    unbatched = rank == 2
    x = layout.unsqueeze(cx, input, 1) if unbatched else layout.transpose(cx, input, 0, 1) if batch_first else input
    steps = cx.shape(x)[0]
    dirs = 2 if bidirectional else 1
    if steps * num_layers * dirs > _MAX_STEPS:
        raise NotLowerable(f"{kind} over {steps} steps x {num_layers} layers x {dirs} directions exceeds the limit of "
                           f"{_MAX_STEPS} unrolled steps")
    if unbatched:
        h0 = None if h0 is None else layout.unsqueeze(cx, h0, 1)
        c0 = None if c0 is None else layout.unsqueeze(cx, c0, 1)
    finals_h, finals_c = [], []
    for layer in range(num_layers):
        outs = []
        for d in range(dirs):
            k = layer * dirs + d
            w_ih, w_hh, b_ih, b_hh = params[k]
            proj = nn_ops.linear(cx, x, w_ih, b_ih)  # [steps, batch, gates * hidden]
            h = None if h0 is None else layout.select(cx, h0, 0, k)
            c = None if c0 is None else layout.select(cx, c0, 0, k)
            ys: list[Any] = [None] * steps
            for t in (range(steps - 1, -1, -1) if d else range(steps)):
                h, c = _cell(cx, kind, layout.select(cx, proj, 0, t), h, c, w_hh, b_hh, hidden)
                ys[t] = h
            outs.append(layout.stack(cx, ys, 0))
            finals_h.append(h)
            finals_c.append(c)
        x = outs[0] if dirs == 1 else layout.cat(cx, outs, -1)
    out = layout.squeeze(cx, x, 1) if unbatched else layout.transpose(cx, x, 0, 1) if batch_first else x
    h_n = layout.stack(cx, finals_h, 0)
    c_n = layout.stack(cx, finals_c, 0) if kind == "LSTM" else None
    if unbatched:
        h_n = layout.squeeze(cx, h_n, 1)
        c_n = None if c_n is None else layout.squeeze(cx, c_n, 1)
    return out, h_n, c_n


def _kind(m: nn.RNNBase) -> str:
    if isinstance(m, nn.RNN):
        return "RNN_TANH" if m.nonlinearity == "tanh" else "RNN_RELU"
    return type(m).__name__ if isinstance(m, (nn.LSTM, nn.GRU)) else m.mode


@lowers(modules=[nn.LSTM, nn.GRU, nn.RNN])
def _recurrent(cx: Cx, m: nn.RNNBase, path: str, input: Any, hx: Any = None) -> Any:
    if getattr(m, "proj_size", 0):
        raise NotLowerable(f"{type(m).__name__} with proj_size={m.proj_size} is not lowered")
    if m.training and m.dropout and m.num_layers > 1:
        raise NotLowerable(f"{type(m).__name__} in training mode with dropout={m.dropout} between layers")
    kind = _kind(m)
    h0, c0 = hx if kind == "LSTM" and hx is not None else (hx, None)
    params = []
    for layer in range(m.num_layers):
        for d in range(2 if m.bidirectional else 1):
            sfx = f"_l{layer}" + ("_reverse" if d else "")
            biases = (cx.param(path, "bias_ih" + sfx), cx.param(path, "bias_hh" + sfx)) if m.bias else (None, None)
            params.append((cx.param(path, "weight_ih" + sfx), cx.param(path, "weight_hh" + sfx), *biases))
    out, h_n, c_n = unroll(cx, kind, input, h0, c0, params, m.num_layers, m.bidirectional, m.batch_first,
                           m.hidden_size)
    return (out, (h_n, c_n)) if kind == "LSTM" else (out, h_n)


def _aten(kind: str):
    def lower(cx: Cx, input: Any, hx: Any, params: Any, has_biases: bool, num_layers: int, dropout: float,
              train: bool, bidirectional: bool, batch_first: bool) -> Any:
        if train and dropout and num_layers > 1:
            raise NotLowerable(f"{kind} in training mode with dropout={dropout} between layers")
        per = 4 if has_biases else 2
        groups = [tuple(params[i:i + per]) + ((None, None) if not has_biases else ())
                  for i in range(0, len(params), per)]
        if len(groups) != num_layers * (2 if bidirectional else 1):
            raise NotLowerable(f"{kind}: {len(params)} parameter tensors for {num_layers} layers")
        if kind == "LSTM" and cx.shape(groups[0][1])[-1] != cx.shape(hx[0])[-1]:
            raise NotLowerable("LSTM with proj_size is not lowered")
        hidden = cx.shape(groups[0][1])[-1]
        h0, c0 = (hx[0], hx[1]) if kind == "LSTM" else (hx, None)
        out, h_n, c_n = unroll(cx, kind, input, h0, c0, groups, num_layers, bidirectional, batch_first, hidden)
        return (out, h_n, c_n) if kind == "LSTM" else (out, h_n)
    return lower


lowers(aten="lstm.input")(_aten("LSTM"))
lowers(aten="gru.input")(_aten("GRU"))
lowers(aten="rnn_tanh.input")(_aten("RNN_TANH"))
lowers(aten="rnn_relu.input")(_aten("RNN_RELU"))
