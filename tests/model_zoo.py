"""Small PyTorch models covering the families the importers support, with example inputs.

Shared by the importer tests, the ONNX round trips and the differential tests::

    from tests.model_zoo import CASES, cases
    for case in cases(importer="fx"):
        module, inputs = case.make()      # module in eval mode, a tuple of example tensors

Each ``ZooCase`` says which importers accept it (``fx``, ``export``) and whether it is ``slow``
(a real architecture from ``transformers``). Weights are seeded, so ``make()`` is deterministic.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from tests.torchvision_cpu import define_missing_ops

define_missing_ops()  # transformers imports torchvision when installed (see tests/torchvision_cpu.py)

__all__ = ["ZooCase", "CASES", "cases"]

Made = tuple[nn.Module, tuple[torch.Tensor, ...]]


@dataclass(frozen=True)
class ZooCase:
    name: str
    build: Callable[[], Made] = field(repr=False)
    fx: bool = True  # torch.fx symbolic tracing accepts it
    export: bool = True  # torch.export accepts it
    decompose: bool = True  # its core-ATen decomposition is importable too
    float64: bool = True  # .double() makes it compute in float64 throughout (no internal float32 casts)
    slow: bool = False
    tags: tuple[str, ...] = ()

    def make(self) -> Made:
        torch.manual_seed(0)
        module, inputs = self.build()
        return module.eval(), inputs


def _x(*shape: int) -> torch.Tensor:
    return torch.randn(*shape)


# -- MLPs --------------------------------------------------------------------------------------------
class SeedMLP(nn.Module):
    """The seed chapter's MLP: tanh(sum(l2(relu(l1(x)))))."""

    def __init__(self) -> None:
        super().__init__()
        self.l1, self.l2 = nn.Linear(4, 5), nn.Linear(5, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.l2(torch.relu(self.l1(x))).sum())


def seed_mlp() -> Made:
    from torchlean_bridge.seed import SEED_WEIGHTS, SEED_X0
    m = SeedMLP()
    m.load_state_dict({k: torch.tensor(v, dtype=torch.float32) for k, v in SEED_WEIGHTS.items()})
    return m, (torch.tensor(SEED_X0, dtype=torch.float32),)


def mlp_activations() -> Made:
    m = nn.Sequential(nn.Linear(6, 16), nn.GELU(), nn.Linear(16, 16), nn.SiLU(), nn.Dropout(0.3),
                      nn.Linear(16, 16), nn.LeakyReLU(0.2), nn.Linear(16, 16), nn.ELU(0.7), nn.Linear(16, 12),
                      nn.Softplus(), nn.Linear(12, 12), nn.Hardtanh(-0.5, 0.5), nn.Identity(),
                      nn.Linear(12, 8), nn.GELU(approximate="tanh"), nn.Linear(8, 5), nn.LogSoftmax(dim=-1))
    return m, (_x(3, 6),)


class FunctionalMLP(nn.Module):
    """Weights used through F.linear, x @ W.t() + b and torch.addmm."""

    def __init__(self) -> None:
        super().__init__()
        self.w1, self.b1 = nn.Parameter(torch.randn(8, 4)), nn.Parameter(torch.randn(8))
        self.w2, self.b2 = nn.Parameter(torch.randn(8, 8)), nn.Parameter(torch.randn(8))
        self.w3, self.b3 = nn.Parameter(torch.randn(8, 3)), nn.Parameter(torch.randn(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(F.linear(x, self.w1, self.b1))
        h = torch.sigmoid(h @ self.w2.t() + self.b2)
        return torch.softmax(torch.addmm(self.b3, h, self.w3), dim=1)


# -- CNNs --------------------------------------------------------------------------------------------
def cnn1d() -> Made:
    m = nn.Sequential(nn.Conv1d(4, 8, 3, padding="same", dilation=2, groups=2), nn.BatchNorm1d(8), nn.ReLU(),
                      nn.MaxPool1d(2), nn.Conv1d(8, 8, 3, stride=2, padding=1, bias=False), nn.AvgPool1d(2),
                      nn.Flatten(), nn.Linear(16, 3))
    return _randomize_bn(m), (_x(2, 4, 20),)


def cnn2d() -> Made:
    m = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.BatchNorm2d(8), nn.ReLU(inplace=True),
                      nn.MaxPool2d(2, padding=1), nn.Conv2d(8, 8, 3, groups=4, dilation=1, padding=1),
                      nn.BatchNorm2d(8), nn.Hardtanh(), nn.AvgPool2d(2, stride=1, padding=1),
                      nn.Conv2d(8, 6, 2, padding="same"), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                      nn.Linear(6, 4), nn.Softmax(dim=1))
    return _randomize_bn(m), (_x(2, 3, 16, 16),)


def cnn3d() -> Made:
    m = nn.Sequential(nn.Conv3d(2, 4, 3, padding=(1, 2, 1), dilation=(1, 2, 1)), nn.BatchNorm3d(4), nn.ReLU(),
                      nn.AvgPool3d(2), nn.Conv3d(4, 4, (1, 3, 3), padding="same", groups=2),
                      nn.AdaptiveAvgPool3d((1, 2, 2)), nn.Flatten(), nn.Linear(16, 2))
    return _randomize_bn(m), (_x(1, 2, 6, 8, 8),)


class UnbatchedConv(nn.Module):
    """Conv1d on an unbatched [C, L] input, then BatchNorm1d on a [N, C] matrix."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm1d(10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.conv(x).reshape(2, 10))


def unbatched_conv() -> Made:
    return _randomize_bn(UnbatchedConv()), (_x(3, 5),)


def pooling() -> Made:
    m = nn.Sequential(nn.MaxPool2d(3, stride=2, padding=1, ceil_mode=True), nn.AvgPool2d(3, 1, 1,
                      count_include_pad=False), nn.MaxPool2d(2, dilation=2), nn.AdaptiveMaxPool2d((3, 1)))
    return m, (_x(1, 2, 13, 13),)


class Decoder(nn.Module):
    """Transposed convolutions: 2-d with output_padding (then batch norm), 2-d grouped, dilated and
    bias-free, 3-d grouped, and the functional 1-d form on an unbatched [C, L] input."""

    def __init__(self) -> None:
        super().__init__()
        self.up1 = nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1)
        self.bn = nn.BatchNorm2d(6)
        self.up2 = nn.ConvTranspose2d(6, 4, (2, 3), stride=(2, 1), padding=(0, 1), dilation=(1, 2), groups=2,
                                      bias=False)
        self.up3 = nn.ConvTranspose3d(2, 4, 2, stride=2, groups=2)
        self.w1d = nn.Parameter(torch.randn(3, 2, 4))

    def forward(self, x: torch.Tensor, z: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = self.up2(torch.relu(self.bn(self.up1(x))))
        return y, self.up3(z), F.conv_transpose1d(s, self.w1d, stride=3, padding=1)


class TinyUNet(nn.Module):
    """An encoder-decoder: group and instance norm, a transposed convolution beside bilinear upsampling,
    a skip connection, pixel shuffle, and normalize / logsumexp / std heads."""

    def __init__(self) -> None:
        super().__init__()
        self.down1 = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.GroupNorm(2, 8), nn.SiLU())
        self.down2 = nn.Sequential(nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.InstanceNorm2d(16, affine=True),
                                   nn.ReLU())
        self.up = nn.ConvTranspose2d(16, 8, 2, stride=2)
        self.fuse = nn.Conv2d(16, 8, 3, padding=1)
        self.head = nn.Conv2d(8, 2, 1)
        self.shuffle = nn.PixelShuffle(2)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        a = self.down1(x)
        b = self.down2(a)
        v = F.interpolate(b, scale_factor=2, mode="bilinear", align_corners=False)[:, :8]
        y = self.fuse(torch.cat([a, self.up(b) + v], 1))
        return F.normalize(self.head(y), dim=1), torch.logsumexp(y, dim=1), self.shuffle(y).std(dim=(2, 3))


def decoder() -> Made:
    return _randomize_bn(Decoder()), (_x(2, 4, 5, 6), _x(1, 2, 2, 3, 2), _x(3, 7))


class ResidualBlock(nn.Module):
    def __init__(self, c: int = 6) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += identity
        return self.relu(out)


def group_norm() -> Made:
    m = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.GroupNorm(4, 8), nn.SiLU(), nn.Conv2d(8, 6, 1),
                      nn.GroupNorm(3, 6, affine=False))
    with torch.no_grad():
        m[1].weight.uniform_(0.5, 1.5)
        m[1].bias.uniform_(-0.5, 0.5)
    return m, (_x(2, 3, 5, 5),)


def residual() -> Made:
    m = nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), ResidualBlock(), ResidualBlock(), nn.AdaptiveAvgPool2d(1),
                      nn.Flatten(), nn.Linear(6, 2))
    return _randomize_bn(m), (_x(2, 3, 8, 8),)


def _randomize_bn(m: nn.Module) -> nn.Module:
    """Give batch norms non-trivial running statistics and affine parameters."""
    for mod in m.modules():
        if isinstance(mod, nn.modules.batchnorm._BatchNorm):
            with torch.no_grad():
                mod.running_mean.uniform_(-0.5, 0.5)
                mod.running_var.uniform_(0.5, 2.0)
                mod.weight.uniform_(0.5, 1.5)
                mod.bias.uniform_(-0.3, 0.3)
    return m


# -- normalization, softmax, embedding -----------------------------------------------------------------
class NormHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(8)
        self.ln2 = nn.LayerNorm([4, 8], elementwise_affine=False, eps=1e-3)
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.ln(x)
        h = self.ln2(self.proj(h))
        return F.softmax(h, dim=-1), F.log_softmax(h, dim=1)


class EmbeddingBag(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(20, 8, padding_idx=0)
        self.pos = nn.Embedding(6, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1]).unsqueeze(0)
        h = self.emb(ids) + self.pos(positions)
        return self.head(h.mean(dim=1))


class TiedLM(nn.Module):
    """Embedding and output projection share one weight (two state_dict keys, one tensor)."""

    def __init__(self) -> None:
        super().__init__()
        self.wte = nn.Embedding(16, 8)
        self.mix = nn.Linear(8, 8)
        self.lm_head = nn.Linear(8, 16, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lm_head(torch.tanh(self.mix(self.wte(ids))))


# -- attention -------------------------------------------------------------------------------------------
class MHA(nn.Module):
    def __init__(self, batch_first: bool) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(16, 4, batch_first=batch_first)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, weights = self.attn(x, x, x)
        return out


class SDPA(nn.Module):
    def __init__(self, causal: bool, seq: int = 5) -> None:
        super().__init__()
        self.qkv = nn.Linear(8, 24)
        self.causal = causal
        self.register_buffer("mask", torch.ones(seq, seq, dtype=torch.bool).triu(-1), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.qkv(x).reshape(b, s, 3, 2, 4).permute(2, 0, 3, 1, 4).unbind(0)
        mask = None if self.causal else self.mask
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=self.causal)
        return o.transpose(1, 2).reshape(b, s, 8)


class CrossAttention(nn.Module):
    """Queries attend to a memory of another width (kdim/vdim), with a constant attention mask."""

    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True, kdim=6, vdim=6)
        self.register_buffer("mask", torch.triu(torch.ones(3, 4, dtype=torch.bool), 2))

    def forward(self, q: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        return self.attn(q, memory, memory, attn_mask=self.mask, need_weights=False)[0]


def encoder_stack() -> Made:
    layer = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)
    return nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm(8), enable_nested_tensor=False), (_x(2, 5, 8),)


def encoder_layer(batch_first: bool, norm_first: bool = False) -> Callable[[], Made]:
    def build() -> Made:
        m = nn.TransformerEncoderLayer(16, 4, 32, dropout=0.1, batch_first=batch_first, norm_first=norm_first)
        return m, (_x(2, 5, 16) if batch_first else _x(5, 2, 16),)
    return build


# -- tensor arithmetic and layout ------------------------------------------------------------------------
class Arithmetic(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.randn(4))
        self.register_buffer("offset", torch.randn(3, 1))
        self.const = torch.tensor([0.5, -1.0, 2.0, 0.25])  # a plain tensor attribute

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        a = x * self.scale + self.offset  # [3, 4] broadcasts
        b = 2.0 - a / (y.abs() + 1.5)
        c = torch.maximum(b, self.const) ** 2 + torch.sqrt(x.abs() + 1) * 0.5
        d = torch.where(torch.tensor([True, False, True, False]), c, -c).clamp(-3, 3)
        e = torch.exp(-d) - torch.sigmoid(d) * torch.tanh(x)
        return e.sum(dim=1, keepdim=True) + e.mean() - e.amax(dim=0)


class Layout(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        a = x.view(2, 3, 4).permute(2, 0, 1).reshape(4, 6)  # [4, 6]
        b = a.transpose(0, 1).flatten().unsqueeze(0).squeeze(0)  # [24]
        c = torch.cat([b[:12], b[12::2], b[-3:]], dim=0)  # [21]
        d = x[:, 1:3].unsqueeze(1).expand(3, 2, 3, 2)  # x is [2, 12]
        e = torch.stack(x.chunk(3, dim=1), dim=0)[..., None, 1]  # [3, 2, 1]
        f = x[1, [0, 5, 7]] * x[0, 2:5]
        return c, d, e.squeeze(-1), f, x.t()[2:4]


class Indexing(nn.Module):
    """Basic and advanced indexing: None, Ellipsis, negative bounds, constant and input index tensors."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("keep", torch.tensor([True, False, True, True, False, True]), persistent=False)

    def forward(self, x: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, ...]:
        a = x[..., None, -4:-1]  # [3, 6, 1, 3]
        b = x[:, self.keep] * 2  # boolean mask of a constant buffer
        c = x[idx]  # rows chosen by an int64 input
        d = x[1:, [5, 0, 5]].transpose(0, 1)
        e = torch.index_select(x, 1, idx) + x.unsqueeze(1).expand(-1, 2, -1)[:, 1, ::2].sum(1, keepdim=True)
        return a, b, c, d, e, x.flatten()[torch.tensor([-1, 0, 7])]


class Contractions(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(6, 5))
        self.b = nn.Parameter(torch.randn(5))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        h = x @ self.w + self.b  # [2, 3, 5]
        g = torch.bmm(h, h.transpose(1, 2))  # [2, 3, 3]
        e = torch.einsum("bij,bjk->bik", g, h)
        f = torch.einsum("bik,kd->bid", y, self.w.t())
        t = torch.einsum("bij->bji", e)
        return torch.matmul(e.transpose(-1, -2), f), t, torch.mm(x[0], self.w)


class InPlace(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.l(x)
        z = y * 1.0
        y.mul_(2.0)
        y.add_(z)
        return F.relu(y, inplace=True) - z


class KitchenSink(nn.Module):
    """Activations, reductions, masks, padding and gathers not covered elsewhere."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        a = F.mish(x) + F.hardswish(x) + F.hardsigmoid(x) + F.relu6(x * 4) + F.elu(x, 0.5)
        b = F.softsign(x) + torch.erf(x) + torch.log1p(x.abs()) + torch.rsqrt(x * x + 1) + torch.reciprocal(x + 4)
        c = torch.sin(x) * torch.cos(x) - torch.log(x.exp() + 1) + x.clamp_min(-0.5) + x.clamp_max(0.5)
        inside = (x > -1) & (x < 1)
        d = torch.where(inside, a, b).masked_fill(~inside, 0.25) + torch.minimum(c, x.square())
        e = F.pad(d, (1, 2)).repeat(1, 2)[:, ::3]
        picked = x.index_select(1, torch.tensor([4, 0, 2])).narrow(1, 1, 2) + x.select(0, 1)[:2] + x.narrow(1, -3, 2)
        first, second = x.split([3, 2], dim=1)
        values, indices = x.max(dim=1)
        return (e, picked, first.sum(1) - second.amin(1), values, indices, x.argmin(dim=0, keepdim=True),
                torch.pow(x, 3).mean((0, 1), keepdim=True))


class ExpM1Family(nn.Module):
    """SELU and CELU: their core-ATen decompositions use expm1 (the ext op)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.selu(x) + F.celu(x, 0.5)


# -- real architectures from transformers ----------------------------------------------------------------
def hf_bert() -> Made:
    from transformers import BertConfig, BertModel
    cfg = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                     vocab_size=100, max_position_embeddings=64)
    return _HFWrap(BertModel(cfg)), (torch.randint(0, 100, (2, 8)),)


def hf_gpt2() -> Made:
    from transformers import GPT2Config, GPT2Model
    cfg = GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=100, n_positions=64, use_cache=False)
    return _HFWrap(GPT2Model(cfg)), (torch.randint(0, 100, (1, 8)),)


def hf_llama() -> Made:
    """Grouped-query attention, rotary embeddings, RMSNorm, SiLU-gated MLP.

    RMSNorm and the rotary tables cast to float32 explicitly, so ``.double()`` does not make the
    module a float64 computation (``float64=False``).
    """
    from transformers import LlamaConfig, LlamaModel
    cfg = LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, use_cache=False)
    return _HFWrap(LlamaModel(cfg)), (torch.randint(0, 100, (1, 8)),)


class _HFWrap(nn.Module):
    """The last hidden state of a transformers model (no cache, plain tensor output)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, use_cache=False, return_dict=True).last_hidden_state


# -- real architectures from torchvision and timm (small configs, random weights) ---------------------------
def _torchvision():
    from tests.torchvision_cpu import import_torchvision
    return import_torchvision()


def tv_alexnet() -> Made:
    """Adaptive average pooling 1x1 -> 6x6 at this input size (variable windows)."""
    return _torchvision().models.alexnet(weights=None, num_classes=10), (_x(1, 3, 63, 63),)


def tv_resnet18() -> Made:
    return _randomize_bn(_torchvision().models.resnet18(weights=None, num_classes=10)), (_x(1, 3, 32, 32),)


def tv_mobilenet_v3() -> Made:
    return _randomize_bn(_torchvision().models.mobilenet_v3_small(weights=None, num_classes=10)), (_x(1, 3, 32, 32),)


def tv_efficientnet() -> Made:
    """Squeeze-excitation, SiLU, and torchvision's fx-wrapped ``stochastic_depth``."""
    return _randomize_bn(_torchvision().models.efficientnet_b0(weights=None, num_classes=10)), (_x(1, 3, 32, 32),)


def tv_convnext() -> Made:
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt
    _torchvision()
    blocks = [CNBlockConfig(16, 32, 1), CNBlockConfig(32, None, 1)]
    return ConvNeXt(blocks, stochastic_depth_prob=0.1, layer_scale=0.5, num_classes=10), (_x(1, 3, 32, 32),)


def tv_swin() -> Made:
    """Shifted windows: the attention mask built by slice assignment inside the fx-wrapped
    ``shifted_window_attention``, ``roll``, ``_patch_merging_pad``."""
    _torchvision()
    from torchvision.models.swin_transformer import SwinTransformer
    model = SwinTransformer(patch_size=[4, 4], embed_dim=16, depths=[2, 2], num_heads=[2, 2], window_size=[4, 4],
                            stochastic_depth_prob=0.1, num_classes=10)
    return model, (_x(1, 3, 32, 32),)


def tv_maxvit() -> Made:
    """Block and grid attention (``swapaxes``), MBConv with squeeze-excitation."""
    _torchvision()
    from torchvision.models.maxvit import MaxVit
    model = MaxVit(input_size=(32, 32), stem_channels=8, partition_size=2, block_channels=[16, 32],
                   block_layers=[1, 1], head_dim=8, stochastic_depth_prob=0.1, num_classes=10)
    return _randomize_bn(model), (_x(1, 3, 32, 32),)


def timm_levit() -> Made:
    """Attention biases cached in a dict attribute by forward (the import must leave it as it was)."""
    _torchvision()
    from timm.models.levit import Levit
    model = Levit(img_size=64, embed_dim=(32, 48), key_dim=8, depth=(1, 1), num_heads=(2, 2), num_classes=10)
    return _randomize_bn(model), (_x(1, 3, 64, 64),)


def timm_vit() -> Made:
    _torchvision()
    from timm.models.vision_transformer import VisionTransformer
    model = VisionTransformer(img_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=10)
    return model, (_x(1, 3, 32, 32),)


def tv_squeezenet() -> Made:
    return _torchvision().models.squeezenet1_1(weights=None, num_classes=10), (_x(1, 3, 64, 64),)


def tv_shufflenet() -> Made:
    """Channel shuffle (view/transpose/view) and chunk."""
    return _randomize_bn(_torchvision().models.shufflenet_v2_x0_5(weights=None, num_classes=10)), (_x(1, 3, 32, 32),)


def tv_densenet() -> Made:
    from torchvision.models.densenet import DenseNet
    _torchvision()
    model = DenseNet(growth_rate=8, block_config=(2, 2), num_init_features=8, num_classes=10)
    return _randomize_bn(model), (_x(1, 3, 32, 32),)


def tv_googlenet() -> Made:
    """Inception branches concatenated; the input transform off (``transform_input=False``)."""
    model = _torchvision().models.googlenet(weights=None, num_classes=10, aux_logits=False, init_weights=False)
    return _randomize_bn(model), (_x(1, 3, 64, 64),)


def tv_regnet() -> Made:
    return _randomize_bn(_torchvision().models.regnet_y_400mf(weights=None, num_classes=10)), (_x(1, 3, 32, 32),)


def tv_r3d() -> Made:
    """A video model: 3-D convolutions, batch norm and pooling over (time, height, width)."""
    return _randomize_bn(_torchvision().models.video.r3d_18(weights=None, num_classes=10)), (_x(1, 3, 4, 32, 32),)


def timm_mobilevit() -> Made:
    """Unfolded patches attended as tokens; its forward branches on a tensor's value, so fx refuses."""
    _torchvision()
    import timm
    return _randomize_bn(timm.create_model("mobilevit_xxs", pretrained=False, num_classes=10)), (_x(1, 3, 64, 64),)


def timm_poolformer() -> Made:
    _torchvision()
    import timm
    return timm.create_model("poolformer_s12", pretrained=False, num_classes=10), (_x(1, 3, 64, 64),)


def hf_roberta() -> Made:
    """Position ids from a running count of the non-padding tokens (integer cumsum and arithmetic)."""
    from transformers import RobertaConfig, RobertaModel
    cfg = RobertaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                        vocab_size=100, max_position_embeddings=64)
    ids = torch.randint(2, 100, (2, 8))
    ids[1, -3:] = cfg.pad_token_id
    return _HFWrap(RobertaModel(cfg)), (ids,)


REAL_ARCHITECTURES = ("tv_alexnet", "tv_resnet18", "tv_mobilenet_v3", "tv_efficientnet", "tv_convnext", "tv_swin",
                      "tv_maxvit", "tv_squeezenet", "tv_shufflenet", "tv_densenet", "tv_googlenet", "tv_regnet", "tv_r3d",
                      "timm_levit", "timm_vit", "timm_poolformer")


# -- the catalogue -----------------------------------------------------------------------------------------
CASES: dict[str, ZooCase] = {c.name: c for c in [
    ZooCase("seed_mlp", seed_mlp, tags=("mlp",)),
    ZooCase("mlp_activations", mlp_activations, tags=("mlp", "activations")),
    ZooCase("functional_mlp", lambda: (FunctionalMLP(), (_x(3, 4),)), tags=("mlp", "addmm")),
    ZooCase("cnn1d", cnn1d, tags=("cnn",)),
    ZooCase("cnn2d", cnn2d, tags=("cnn",)),
    ZooCase("cnn3d", cnn3d, tags=("cnn",)),
    ZooCase("unbatched_conv", unbatched_conv, tags=("cnn", "batchnorm")),
    ZooCase("decoder", decoder, tags=("cnn", "conv_transpose")),
    ZooCase("tiny_unet", lambda: (TinyUNet(), (_x(1, 3, 16, 16),)), tags=("cnn", "conv_transpose", "resize")),
    ZooCase("pooling", pooling, tags=("pool",)),
    ZooCase("group_norm", group_norm, tags=("cnn", "normalization")),
    ZooCase("residual", residual, tags=("cnn", "residual", "inplace")),
    ZooCase("norm_head", lambda: (NormHead(), (_x(2, 4, 8),)), tags=("layernorm", "softmax")),
    ZooCase("embedding", lambda: (EmbeddingBag(), (torch.randint(0, 20, (2, 6)),)), tags=("embedding",)),
    ZooCase("tied_lm", lambda: (TiedLM(), (torch.randint(0, 16, (2, 5)),)), tags=("embedding", "tied")),
    ZooCase("mha_batch_first", lambda: (MHA(True), (_x(2, 5, 16),)), tags=("attention",)),
    ZooCase("mha_seq_first", lambda: (MHA(False), (_x(5, 2, 16),)), tags=("attention",)),
    ZooCase("sdpa_causal", lambda: (SDPA(True), (_x(2, 5, 8),)), tags=("attention",)),
    ZooCase("sdpa_mask", lambda: (SDPA(False), (_x(2, 5, 8),)), tags=("attention",)),
    ZooCase("cross_attention", lambda: (CrossAttention(), (_x(2, 3, 8), _x(2, 4, 6))), tags=("attention",)),
    ZooCase("encoder_stack", encoder_stack, slow=True, tags=("attention", "transformer")),
    ZooCase("encoder_layer_batch_first", encoder_layer(True), tags=("attention", "transformer")),
    ZooCase("encoder_layer_seq_first", encoder_layer(False, norm_first=True), tags=("attention", "transformer")),
    ZooCase("arithmetic", lambda: (Arithmetic(), (_x(3, 4), _x(3, 4))), tags=("elementwise",)),
    ZooCase("layout", lambda: (Layout(), (_x(2, 12),)), tags=("layout", "indexing")),
    ZooCase("indexing", lambda: (Indexing(), (_x(3, 6), torch.tensor([2, 0]))), tags=("indexing",)),
    ZooCase("contractions", lambda: (Contractions(), (_x(2, 3, 6), _x(2, 3, 5))), tags=("matmul", "einsum")),
    ZooCase("inplace", lambda: (InPlace(), (_x(3, 4),)), tags=("inplace",)),
    ZooCase("selu_celu", lambda: (ExpM1Family(), (_x(3, 5),)), tags=("activations",)),
    ZooCase("kitchen_sink", lambda: (KitchenSink(), (_x(4, 5),)), tags=("elementwise", "activations", "indexing")),
    ZooCase("hf_bert", hf_bert, fx=False, slow=True, tags=("transformers",)),
    ZooCase("hf_gpt2", hf_gpt2, fx=False, slow=True, tags=("transformers",)),
    ZooCase("hf_llama", hf_llama, fx=False, slow=True, float64=False, tags=("transformers",)),
]}
# real architectures nobody here wrote (torchvision, timm): slow, and only where those are installed
# (tests/test_import_torch_real.py); kept out of CASES, whose routes include the ONNX round trips
REAL: dict[str, ZooCase] = {name: ZooCase(name, globals()[name], slow=True, tags=("real",))
                            for name in REAL_ARCHITECTURES}
REAL["timm_mobilevit"] = ZooCase("timm_mobilevit", timm_mobilevit, fx=False, slow=True, tags=("real",))
REAL["hf_roberta"] = ZooCase("hf_roberta", hf_roberta, fx=False, slow=True, tags=("real", "transformers"))
REAL["hf_bert"] = ZooCase("hf_bert", hf_bert, fx=False, slow=True, tags=("real", "transformers"))


def cases(importer: str | None = None, slow: bool | None = None, tag: str | None = None) -> list[ZooCase]:
    """Cases an importer (``"fx"`` / ``"export"``) accepts, optionally filtered by slowness or tag."""
    out = []
    for c in CASES.values():
        if importer is not None and not getattr(c, importer):
            continue
        if slow is not None and c.slow != slow:
            continue
        if tag is not None and tag not in c.tags:
            continue
        out.append(c)
    return out
