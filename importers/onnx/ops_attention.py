"""ONNX RotaryEmbedding and Attention (opset 23..25) as exact compositions of existing IR ops.

Both follow onnx's reference step by step. RotaryEmbedding: gather the cos/sin caches at the position
ids, split the rotated head dimensions (halves, or even/odd entries when interleaved), cos * x1 -
sin * x2 and sin * x1 + cos * x2, reassemble. Attention: heads split from 3-D inputs, the past cache
concatenated, K/V heads repeated for grouped queries, (Q * sqrt(scale)) @ (K^T * sqrt(scale)), the
optional softcap, the bias (the mask, with the causal, sliding-window and padding masks built at import
from the static shapes), the reference's softmax (a fully masked row gives zeros, never NaN), @ V.
Masks derived from runtime values (``nonpad_kv_seqlen``) need those values at import.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from torchlean_bridge.ops import BOOL

from .context import OnnxContext, Value

__all__ = ["HANDLERS", "OPSETS", "EMITS"]

Handler = Callable[[OnnxContext], list[Value]]
_NEG_INF = -np.inf


def _f64(ctx: OnnxContext, value) -> int:
    """A float constant kept in binary64 (rounded once to the evaluation precision, as the reference
    rounds it to the model's float type)."""
    return ctx.b.const(np.asarray(value, dtype=np.float64), source=ctx.source, folded=True)


def _slice(ctx: OnnxContext, x: int, axis: int, start: int, end: int, step: int = 1) -> int:
    return ctx.add("slice", [x], {"axes": (axis,), "starts": (start,), "ends": (end,), "steps": (step,)})


def _heads(ctx: OnnxContext, x: int, heads: int) -> int:
    """[B, S, H * D] -> [B, H, S, D]."""
    b, s, hd = ctx.b.shape(x)
    if heads <= 0 or hd % heads:
        raise ctx.fail(f"hidden size {hd} is not a multiple of {heads} heads")
    return ctx.add("permute", [ctx.b.reshape(x, (b, s, heads, hd // heads), ctx.source)], {"perm": (0, 2, 1, 3)})


# -- RotaryEmbedding --------------------------------------------------------------------------

def _rotary(ctx: OnnxContext) -> list[Value]:
    s = ctx.shape(0)
    x = ctx.operand(0)
    if len(s) == 4:
        x = ctx.add("permute", [x], {"perm": (0, 2, 1, 3)})  # [B, S, H, D]
    elif len(s) == 3:
        heads = int(ctx.attr("num_heads", 0))
        if heads <= 0 or s[2] % heads:
            raise ctx.fail(f"3-D input needs num_heads dividing the hidden size {s[2]} (num_heads={heads})")
        x = ctx.b.reshape(x, (s[0], s[1], heads, s[2] // heads), ctx.source)
    else:
        raise ctx.fail(f"input rank {len(s)} (3 or 4)")
    b, seq, h, d = ctx.b.shape(x)
    rot = int(ctx.attr("rotary_embedding_dim", 0)) or d
    if rot > d or rot % 2:
        raise ctx.fail(f"rotary_embedding_dim={rot} for head size {d}")
    half = rot // 2
    cos, sin = ctx.operand(1), ctx.operand(2)
    if ctx.has_input(3):
        cos = ctx.add("gather", [cos, ctx.operand(3)], {"axis": 0})
        sin = ctx.add("gather", [sin, ctx.operand(3)], {"axis": 0})
    cs = ctx.b.shape(cos)
    if cs[-1] != half or len(cs) not in (2, 3):
        raise ctx.fail(f"cos/sin caches shaped {list(cs)}, expected [..., {half}]")
    lead = cs[:-1]
    cos = ctx.b.reshape(cos, tuple(lead) + (1, half), ctx.source)
    sin = ctx.b.reshape(sin, tuple(lead) + (1, half), ctx.source)
    if ctx.attr("interleaved", 0):
        x1, x2 = _slice(ctx, x, 3, 0, rot, 2), _slice(ctx, x, 3, 1, rot, 2)
    else:
        x1, x2 = _slice(ctx, x, 3, 0, half), _slice(ctx, x, 3, half, rot)
    mul = lambda p, q: ctx.elementwise("mul_elem", [p, q])  # noqa: E731
    real = ctx.elementwise("sub", [mul(cos, x1), mul(sin, x2)])
    imag = ctx.elementwise("add", [mul(sin, x1), mul(cos, x2)])
    if ctx.attr("interleaved", 0):
        pairs = ctx.add("concat", [ctx.b.reshape(real, (b, seq, h, half, 1), ctx.source),
                                   ctx.b.reshape(imag, (b, seq, h, half, 1), ctx.source)], {"axis": 4})
        rotated = ctx.b.reshape(pairs, (b, seq, h, rot), ctx.source)
    else:
        rotated = ctx.add("concat", [real, imag], {"axis": 3})
    y = rotated if rot == d else ctx.add("concat", [rotated, _slice(ctx, x, 3, rot, d)], {"axis": 3})
    if len(s) == 3:
        return [ctx.b.reshape(y, s, ctx.source)]
    return [ctx.add("permute", [y], {"perm": (0, 2, 1, 3)})]


# -- Attention --------------------------------------------------------------------------------

def _static_bias(q: int, kv: int, causal: bool, left: int, right: int, offset: np.ndarray | int,
                 batch: int) -> np.ndarray | None:
    """The causal and sliding-window masks as 0 / -inf, [q, kv] or [B, 1, q, kv] (per-batch offsets)."""
    if not causal and left < 0 and right < 0:
        return None
    i = np.arange(q).reshape(q, 1)
    j = np.arange(kv).reshape(1, kv)
    off = np.asarray(offset).reshape(-1, 1, 1) if np.ndim(offset) else int(offset)
    diff = i + off - j
    allowed = np.ones(np.shape(diff), dtype=bool)
    if causal:
        allowed &= diff >= 0
    if left >= 0:
        allowed &= diff <= left
    if right >= 0:
        allowed &= -diff <= right
    bias = np.where(allowed, 0.0, _NEG_INF)
    return bias.reshape(batch, 1, q, kv) if np.ndim(offset) else bias


def _softmax_like_reference(ctx: OnnxContext, x: int) -> int:
    """exp(x - m) / sum with m = 0 for a row whose max is -inf and the sum 1 where it is 0."""
    rank = len(ctx.b.shape(x))
    top = ctx.add("reduce_max", [x], {"axes": (rank - 1,), "keepdim": True})
    safe = ctx.elementwise("where", [ctx.elementwise("eq", [top, _f64(ctx, _NEG_INF)]), _f64(ctx, 0.0), top])
    e = ctx.elementwise("exp", [ctx.elementwise("sub", [x, safe])])
    total = ctx.add("reduce_sum_axes", [e], {"axes": (rank - 1,), "keepdim": True})
    total = ctx.elementwise("where", [ctx.elementwise("eq", [total, _f64(ctx, 0.0)]), _f64(ctx, 1.0), total])
    return ctx.elementwise("div", [e, total])


def _attention(ctx: OnnxContext) -> list[Value]:
    qs = ctx.shape(0)
    rank = len(qs)
    if rank not in (3, 4) or ctx.rank(1) != rank or ctx.rank(2) != rank:
        raise ctx.fail(f"Q, K, V of ranks {qs!r}, {ctx.shape(1)!r}, {ctx.shape(2)!r} (all 3-D or all 4-D)")
    q, k, v = ctx.operand(0), ctx.operand(1), ctx.operand(2)
    if rank == 3:
        qh, kvh = ctx.attr("q_num_heads"), ctx.attr("kv_num_heads")
        if qh is None or kvh is None:
            raise ctx.fail("3-D inputs need q_num_heads and kv_num_heads")
        q, k, v = _heads(ctx, q, int(qh)), _heads(ctx, k, int(kvh)), _heads(ctx, v, int(kvh))
    precision = ctx.attr("softmax_precision")
    q_type = ctx.onnx_types.get(ctx.node.input[0])
    if precision is not None and q_type is not None and int(precision) != int(q_type):
        raise ctx.fail(f"softmax_precision={precision} differs from Q's element type {q_type}")
    mode = int(ctx.attr("qk_matmul_output_mode", 0))
    if mode not in (0, 1, 2, 3):
        raise ctx.fail(f"qk_matmul_output_mode={mode}")
    batch, heads, q_len, head = ctx.b.shape(q)
    past = ctx.has_input(4) or ctx.has_input(5)
    if past and not (ctx.has_input(4) and ctx.has_input(5)):
        raise ctx.fail("past_key and past_value must be given together")
    past_len = ctx.shape(4)[2] if past else 0
    if past:
        k = ctx.add("concat", [ctx.operand(4), k], {"axis": 2})
        v = ctx.add("concat", [ctx.operand(5), v], {"axis": 2})
    present_k, present_v = k, v
    kv_heads, kv_len = ctx.b.shape(k)[1], ctx.b.shape(k)[2]
    nonpad = None
    if ctx.has_input(6):
        if past:
            raise ctx.fail("nonpad_kv_seqlen cannot be combined with a past cache")
        nonpad = np.asarray(ctx.static(6, "nonpad_kv_seqlen")).astype(np.int64).reshape(-1)
        if nonpad.size != batch:
            raise ctx.fail(f"nonpad_kv_seqlen has {nonpad.size} entries for batch {batch}")
    causal = bool(ctx.attr("is_causal", 0))
    left, right = int(ctx.attr("left_window_size", -1)), int(ctx.attr("right_window_size", -1))
    offset = nonpad - q_len if nonpad is not None else past_len
    static = _static_bias(q_len, kv_len, causal, left, right, offset, batch)
    if nonpad is not None:
        pad = np.where(np.arange(kv_len)[None, :] < nonpad[:, None], 0.0, _NEG_INF).reshape(batch, 1, 1, kv_len)
        static = pad if static is None else static + pad
    bias = None  # IR node of the bias, when it depends on a computed mask
    if ctx.has_input(3):
        m = ctx.operand(3)
        if ctx.dtype(3) == BOOL:
            m = ctx.elementwise("where", [m, _f64(ctx, 0.0), _f64(ctx, _NEG_INF)])
        ms = ctx.b.shape(m)
        if ms[-1] < kv_len:
            zeros = (0,) * len(ms)
            m = ctx.add("pad", [m], {"pads_before": zeros, "pads_after": zeros[:-1] + (kv_len - ms[-1],),
                                     "value": _NEG_INF})
        bias = m if static is None else ctx.elementwise("add", [m, _f64(ctx, static)])
    elif static is not None:
        bias = _f64(ctx, static)
    if heads != kv_heads:
        if kv_heads == 0 or heads % kv_heads:
            raise ctx.fail(f"{heads} query heads for {kv_heads} key/value heads")
        rep = np.repeat(np.arange(kv_heads), heads // kv_heads)
        table = ctx.b.const(rep.astype(np.int64), source=ctx.source, folded=True)
        k = ctx.add("gather", [k, table], {"axis": 1})
        v = ctx.add("gather", [v, table], {"axis": 1})
    scale = ctx.attr("scale")
    scale = 1 / np.sqrt(head) if scale is None else float(scale)
    root = _f64(ctx, np.sqrt(scale))
    kt = ctx.add("permute", [k], {"perm": (0, 1, 3, 2)})
    qk = ctx.add("matmul", [ctx.elementwise("mul_elem", [q, root]), ctx.elementwise("mul_elem", [kt, root])])
    softcap = ctx.attr("softcap")
    if softcap is not None and float(softcap) > 0:
        cap = _f64(ctx, float(softcap))
        qk = ctx.elementwise("mul_elem", [ctx.elementwise("tanh", [ctx.elementwise("div", [qk, cap])]), cap])
    with_bias = qk if bias is None else ctx.elementwise("add", [qk, bias])
    probs = _softmax_like_reference(ctx, with_bias)
    if bias is not None:
        bs = ctx.b.shape(bias)
        top = ctx.add("reduce_max", [bias], {"axes": (len(bs) - 1,), "keepdim": True})
        masked = ctx.elementwise("eq", [top, _f64(ctx, _NEG_INF)])
        probs = ctx.elementwise("where", [masked, _f64(ctx, 0.0), probs])
    y = ctx.add("matmul", [probs, v])
    if rank == 3:
        y = ctx.b.reshape(ctx.add("permute", [y], {"perm": (0, 2, 1, 3)}), (batch, q_len, heads * ctx.b.shape(v)[3]),
                          ctx.source)
    qk_out = {0: qk, 1: qk, 2: with_bias, 3: probs}[mode]
    return [y, present_k, present_v, qk_out][:len(ctx.node.output)]


HANDLERS: dict[str, Handler] = {"RotaryEmbedding": _rotary, "Attention": _attention}
# Attention-23 (first), -24 (nonpad_kv_seqlen, offset-aligned causal mask), -25 (sliding windows)
OPSETS: dict[str, tuple[int, int]] = {"RotaryEmbedding": (23, 23), "Attention": (23, 25)}
EMITS = frozenset({"permute", "reshape", "slice", "gather", "mul_elem", "sub", "add", "concat", "matmul", "div",
                   "tanh", "exp", "reduce_max", "reduce_sum_axes", "where", "eq", "pad", "const", "broadcast_to"})
