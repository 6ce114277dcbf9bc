"""A 4-layer GPT-2-like model under Hugging Face's state_dict keys (fused c_attn in Conv1D layout:
weight [in, 3 * out]), written out so the audit tests need no transformers import."""

from __future__ import annotations

import math

import torch
import torch.nn as nn


class Conv1D(nn.Module):
    """Hugging Face's GPT-2 projection: y = x @ weight + bias with weight [in, out]."""

    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_in, n_out))
        self.bias = nn.Parameter(torch.randn(n_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight + self.bias


class Attention(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.c_attn = Conv1D(d, 3 * d)
        self.c_proj = Conv1D(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t, d = x.shape[-2], x.shape[-1]
        q, k, v = self.c_attn(x).split(d, dim=-1)
        q, k, v = (a.reshape(t, self.heads, d // self.heads).transpose(0, 1) for a in (q, k, v))
        scores = q @ k.transpose(-1, -2) / math.sqrt(d // self.heads)
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
        att = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
        return self.c_proj((att @ v).transpose(0, 1).reshape(t, d))


class MLP(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.c_fc = Conv1D(d, 4 * d)
        self.c_proj = Conv1D(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(torch.nn.functional.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(d)
        self.attn = Attention(d, heads)
        self.ln_2 = nn.LayerNorm(d)
        self.mlp = MLP(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2Like(nn.Module):
    """Input: a [T, d] sequence of embeddings (token lookup left out: the blocks are what matter)."""

    def __init__(self, d: int = 16, heads: int = 4, layers: int = 4, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.h = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        with torch.no_grad():  # random layer norms too, so no two tensors are equal by construction
            for name, p in self.named_parameters():
                if "ln" in name:
                    p.copy_(torch.randn_like(p))
            for p in self.parameters():
                p.mul_(0.3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.h:
            x = block(x)
        return self.ln_f(x)
