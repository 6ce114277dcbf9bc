"""ONNX's stateful sequence ops (opset 27) as exact compositions of existing IR ops.

``CausalConvWithState`` is onnx's reference step by step: the past state (or zeros) concatenated
before the input, a depthwise ``conv`` without padding, the optional SiLU, and the last k - 1
positions of the padded input as the present state. ``LinearAttention`` unrolls the reference's
recurrence over the static sequence length, one step per position: decay the state by exp(g_t)
(gated rules), correct the value by beta_t * (v_t - S^T k_t) (delta rules), add k_t v_t^T, read
scale * q_t S with the key/value heads repeated for grouped queries.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from torchlean_bridge.ops import FLOAT

from .context import OnnxContext, Value

__all__ = ["HANDLERS", "OPSETS", "EMITS"]

Handler = Callable[[OnnxContext], list[Value]]

_MAX_STEPS = 4096  # positions unrolled by LinearAttention (each adds a handful of nodes)


def _slice(ctx: OnnxContext, x: int, axis: int, start: int, end: int) -> int:
    return ctx.add("slice", [x], {"axes": (axis,), "starts": (start,), "ends": (end,), "steps": (1,)})


def _float_inputs(ctx: OnnxContext) -> None:
    for i in range(len(ctx.node.input)):
        if ctx.has_input(i) and ctx.dtype(i) != FLOAT:
            raise ctx.fail(f"input {i} is {ctx.onnx_type(ctx.node.input[i])} (float tensors only)")


# -- CausalConvWithState ----------------------------------------------------------------------

def _causal_conv(ctx: OnnxContext) -> list[Value]:
    _float_inputs(ctx)
    activation = str(ctx.attr("activation", "none"))
    if activation not in ("none", "silu", "swish"):
        raise ctx.fail(f"activation={activation!r}")
    xs = ctx.shape(0)
    weight = ctx.needed(1, "weight")
    if len(xs) != 3 or weight.value.ndim != 3 or weight.value.shape[:2] != (xs[1], 1):
        raise ctx.fail(f"input {list(xs)} and weight {list(weight.value.shape)} (expected [B, C, L] and [C, 1, k])")
    b, c, length = xs
    k = int(weight.value.shape[2])
    if k < 1:
        raise ctx.fail(f"kernel size {k}")
    if ctx.has_input(3) and ctx.shape(3) != (b, c, k - 1):
        raise ctx.fail(f"past_state {list(ctx.shape(3))}, expected {[b, c, k - 1]}")
    if k == 1:  # nothing to carry: the padded input is the input, the present state is empty
        padded = ctx.operand(0)
    else:
        pad = ctx.operand(3) if ctx.has_input(3) else \
            ctx.b.const(np.zeros((b, c, k - 1)), source=ctx.source, folded=True)
        padded = ctx.add("concat", [pad, ctx.operand(0)], {"axis": 2})
    attrs = {"spatial_rank": 1, "kernel": (k,), "stride": (1,), "padding": (0,), "padding_after": (0,),
             "dilation": (1,), "groups": c, "channel_axis": 1, "in_channels": c, "out_channels": c}
    conv = ctx.add("conv", [padded], attrs)
    ctx.param_const(conv, "weight", weight)
    if ctx.has_input(2):
        ctx.param(conv, "bias", 2, reshape_to=(c,))
    else:
        ctx.b.param(conv, "bias", np.zeros(c, dtype=weight.value.dtype))
    out = ctx.add("silu", [conv]) if activation in ("silu", "swish") else conv
    total = length + k - 1
    if k == 1:
        return [out, ctx.b.const(np.zeros((b, c, 0)), source=ctx.source, folded=True)]
    return [out, _slice(ctx, padded, 2, total - (k - 1), total)]


# -- LinearAttention --------------------------------------------------------------------------

def _heads(ctx: OnnxContext, x: int, heads: int, what: str) -> tuple[int, int]:
    """[B, T, H * D] -> [B, H, T, D] and D."""
    b, t, hd = ctx.b.shape(x)
    if heads <= 0 or hd % heads:
        raise ctx.fail(f"{what} last axis {hd} is not a multiple of {heads} heads")
    d = hd // heads
    return ctx.add("permute", [ctx.b.reshape(x, (b, t, heads, d), ctx.source)], {"perm": (0, 2, 1, 3)}), d


def _linear_attention(ctx: OnnxContext) -> list[Value]:
    _float_inputs(ctx)
    rule = str(ctx.attr("update_rule", "gated_delta"))
    if rule not in ("linear", "gated", "delta", "gated_delta"):
        raise ctx.fail(f"update_rule={rule!r}")
    hq, hkv = int(ctx.attr("q_num_heads", 0)), int(ctx.attr("kv_num_heads", 0))
    if hq <= 0 or hkv <= 0 or hq % hkv:
        raise ctx.fail(f"q_num_heads={hq} must be a positive multiple of kv_num_heads={hkv}")
    gating, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
    for i, name, wanted in ((4, "decay", gating), (5, "beta", delta)):
        if ctx.has_input(i) != wanted:
            raise ctx.fail(f"update_rule={rule} {'requires' if wanted else 'forbids'} the {name} input")
    if any(len(ctx.shape(i)) != 3 for i in range(3)):
        raise ctx.fail(f"query/key/value shaped {[list(ctx.shape(i)) for i in range(3)]} (rank 3: [B, T, H * D])")
    b, t, _ = ctx.shape(0)
    if t > _MAX_STEPS:
        raise ctx.fail(f"sequence length {t}: at most {_MAX_STEPS} steps are unrolled")
    q, dk = _heads(ctx, ctx.operand(0), hq, "query")
    k, dk_k = _heads(ctx, ctx.operand(1), hkv, "key")
    v, dv = _heads(ctx, ctx.operand(2), hkv, "value")
    if dk_k != dk or ctx.shape(1)[:2] != (b, t) or ctx.shape(2)[:2] != (b, t):
        raise ctx.fail(f"key {list(ctx.shape(1))} / value {list(ctx.shape(2))} do not match query {list(ctx.shape(0))}")
    state_shape = (b, hkv, dk, dv)
    if ctx.has_input(3):
        if ctx.shape(3) != state_shape:
            raise ctx.fail(f"past_state {list(ctx.shape(3))}, expected {list(state_shape)}")
        state = ctx.operand(3)
    else:
        state = ctx.b.const(np.zeros(state_shape), source=ctx.source, folded=True)
    decay = beta = None
    if gating:
        ds = ctx.shape(4)
        if len(ds) != 3 or ds[:2] != (b, t) or ds[2] not in (hkv, hkv * dk):
            raise ctx.fail(f"decay {list(ds)}, expected [{b}, {t}, {hkv}] or [{b}, {t}, {hkv * dk}]")
        per_key = dk if ds[2] == hkv * dk else 1
        decay = ctx.add("permute", [ctx.b.reshape(ctx.operand(4), (b, t, hkv, per_key), ctx.source)],
                        {"perm": (0, 2, 1, 3)})  # [B, Hkv, T, dk or 1]
    if delta:
        bs = ctx.shape(5)
        if len(bs) != 3 or bs[:2] != (b, t) or bs[2] not in (hkv, 1):
            raise ctx.fail(f"beta {list(bs)}, expected [{b}, {t}, {hkv}] or [{b}, {t}, 1]")
        beta = ctx.add("permute", [ctx.b.reshape(ctx.operand(5), (b, t, bs[2], 1), ctx.source)],
                       {"perm": (0, 2, 1, 3)})  # [B, Hkv or 1, T, 1]
    scale = float(ctx.attr("scale", 0.0)) or 1.0 / math.sqrt(dk)
    group = hq // hkv
    repeat = ctx.b.const(np.repeat(np.arange(hkv), group).astype(np.int64), source=ctx.source, folded=True)
    mul = lambda p, r: ctx.elementwise("mul_elem", [p, r])  # noqa: E731
    outs = []
    for i in range(t):
        k_t = _slice(ctx, k, 2, i, i + 1)  # [B, Hkv, 1, dk]
        v_t = _slice(ctx, v, 2, i, i + 1)  # [B, Hkv, 1, dv]
        if gating:
            g = ctx.add("exp", [_slice(ctx, decay, 2, i, i + 1)])  # [B, Hkv, 1, dk or 1]
            g = ctx.add("permute", [g], {"perm": (0, 1, 3, 2)})  # [B, Hkv, dk or 1, 1]
            state = mul(state, g)
        if delta:
            retrieved = ctx.add("matmul", [k_t, state])  # [B, Hkv, 1, dv]
            v_t = mul(_slice(ctx, beta, 2, i, i + 1), ctx.elementwise("sub", [v_t, retrieved]))
        k_col = ctx.add("permute", [k_t], {"perm": (0, 1, 3, 2)})  # [B, Hkv, dk, 1]
        state = ctx.elementwise("add", [state, mul(k_col, v_t)])
        read = state if group == 1 else ctx.add("gather", [state, repeat], {"axis": 1})
        o = ctx.add("matmul", [_slice(ctx, q, 2, i, i + 1), read])  # [B, Hq, 1, dv]
        outs.append(mul(o, ctx.scalar(scale)))
    y = outs[0] if t == 1 else ctx.add("concat", outs, {"axis": 2})  # [B, Hq, T, dv]
    y = ctx.b.reshape(ctx.add("permute", [y], {"perm": (0, 2, 1, 3)}), (b, t, hq * dv), ctx.source)
    return [y, state]


HANDLERS: dict[str, Handler] = {"CausalConvWithState": _causal_conv, "LinearAttention": _linear_attention}
OPSETS: dict[str, tuple[int, int]] = {"CausalConvWithState": (27, 27), "LinearAttention": (27, 27)}
EMITS = frozenset({"concat", "conv", "silu", "slice", "const", "permute", "reshape", "exp", "mul_elem", "sub", "add",
                   "matmul", "gather", "broadcast_to"})
