"""A Llama-style decoder under Hugging Face's keys, for the audit tests: grouped-query attention
with separate ``q_proj``/``k_proj``/``v_proj`` (fewer K/V heads than Q heads), rotary embeddings
(HF's rotate-half form), RMSNorm and a SiLU-gated MLP (``gate_proj``/``up_proj``/``down_proj``).
Written out so it computes in float64 throughout and every tensor is random; and the conversion
bugs these tests apply, as functions of the trusted state_dict."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn

D, HEADS, KV_HEADS, HIDDEN, LAYERS, T = 24, 6, 2, 32, 4, 5
HD = D // HEADS
PREFIX = "model.layers"


class RMSNorm(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * self.weight


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q_proj = nn.Linear(D, HEADS * HD, bias=False)
        self.k_proj = nn.Linear(D, KV_HEADS * HD, bias=False)
        self.v_proj = nn.Linear(D, KV_HEADS * HD, bias=False)
        self.o_proj = nn.Linear(D, D, bias=False)
        angles = torch.arange(T, dtype=torch.float64)[:, None] * (10000.0 ** (-torch.arange(0, HD, 2) / HD))[None]
        angles = torch.cat([angles, angles], dim=-1)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[0]
        q = self.q_proj(x).reshape(t, HEADS, HD).transpose(0, 1)
        k = self.k_proj(x).reshape(t, KV_HEADS, HD).transpose(0, 1)
        v = self.v_proj(x).reshape(t, KV_HEADS, HD).transpose(0, 1)
        q = q * self.cos + _rotate_half(q) * self.sin
        k = k * self.cos + _rotate_half(k) * self.sin
        k = k.repeat_interleave(HEADS // KV_HEADS, dim=0)
        v = v.repeat_interleave(HEADS // KV_HEADS, dim=0)
        scores = q @ k.transpose(-1, -2) / HD ** 0.5
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
        att = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
        return self.o_proj((att @ v).transpose(0, 1).reshape(t, D))


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(D, HIDDEN, bias=False)
        self.up_proj = nn.Linear(D, HIDDEN, bias=False)
        self.down_proj = nn.Linear(HIDDEN, D, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(torch.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(D)
        self.self_attn = Attention()
        self.post_attention_layernorm = RMSNorm(D)
        self.mlp = MLP()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class Decoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Layer() for _ in range(LAYERS))
        self.norm = RMSNorm(D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


class LlamaLike(nn.Module):
    """Input: a [T, D] sequence of embeddings; keys ``model.layers.N....`` as in Hugging Face."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.model = Decoder()
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn_like(p) * (0.3 if p.ndim == 2 else 1.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)


# -- conversion bugs -------------------------------------------------------------------------------------
def key(i: int, rest: str) -> str:
    return f"{PREFIX}.{i}.{rest}"


def layer_keys(sd: dict, *layers: int) -> tuple[str, ...]:
    return tuple(sorted(k for k in sd if any(k.startswith(f"{PREFIX}.{i}.") for i in layers)))


def exchange_layers(sd: dict, a: int, b: int) -> dict:
    out = dict(sd)
    for k in layer_keys(sd, a):
        other = key(b, k[len(key(a, "")):])
        out[k], out[other] = sd[other], sd[k]
    return out


def rotate_layers(sd: dict) -> dict:
    """Checkpoint layer i holds the reference's layer (i - 1) mod LAYERS."""
    out = dict(sd)
    for k in layer_keys(sd, *range(LAYERS)):
        i, rest = int(k.split(".")[2]), k.split(".", 3)[3]
        out[k] = sd[key((i - 1) % LAYERS, rest)]
    return out


def rotary_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """convert_llama_weights' permute: w.view(heads, rows/heads/2, 2, cols).transpose(1, 2)."""
    rows = w.shape[0]
    return w.reshape(heads, rows // heads // 2, 2, -1).transpose(0, 2, 1, 3).reshape(w.shape)


def heads_exchanged(w: np.ndarray, i: int, j: int, width: int = HD) -> np.ndarray:
    out = w.copy()
    out[i * width:(i + 1) * width], out[j * width:(j + 1) * width] = w[j * width:(j + 1) * width], \
        w[i * width:(i + 1) * width]
    return out
