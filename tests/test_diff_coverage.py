"""Diff coverage on attention blocks and real architectures: every IR node compared (coverage 100%,
stated in the verdict) through torch.fx, torch.export, a torch.onnx file and our own ONNX export."""

import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")

import torchlean_bridge as tlb  # noqa: E402
from tests.diff_routes import ROUTES, route  # noqa: E402
from tests.model_zoo import CASES, REAL  # noqa: E402
from tests.torchvision_cpu import define_missing_ops  # noqa: E402

define_missing_ops()  # torchvision's compiled ops do not load with the CPU torch (see tests/torchvision_cpu.py)


class GPT2Block(torch.nn.Module):
    """GPT-2's block written out: fused qkv projection split in three, heads by view/transpose, a causal
    mask from a non-persistent lower-triangular buffer, softmax, tanh-GELU MLP, pre-norm residuals."""

    def __init__(self, d: int = 16, heads: int = 2, n: int = 6) -> None:
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.c_attn, self.c_proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.fc, self.proj = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)
        self.register_buffer("bias", torch.tril(torch.ones(n, n, dtype=torch.bool)).view(1, 1, n, n),
                             persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(d // self.heads)
        scores = scores.masked_fill(~self.bias, float("-inf"))  # t == n: fx traces no slice by t
        attn = torch.softmax(scores, dim=-1) @ v
        x = x + self.c_proj(attn.transpose(1, 2).reshape(b, t, d))
        return x + self.proj(torch.nn.functional.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


def gpt2_block():
    torch.manual_seed(0)
    return GPT2Block().eval(), (torch.randn(2, 6, 16),)


def assert_every_node_compared(bundle, kw) -> None:
    report = tlb.diff(bundle, random=2, **kw)
    assert report.ok, str(report)
    n = len(bundle.graph.nodes)
    assert report.coverage["compared"] == n, str(report)
    assert f"agree at every node ({n} of {n})" in report.summary()


@pytest.mark.parametrize("block", ["encoder_layer", "gpt2_block"])
@pytest.mark.parametrize("via", ROUTES)
def test_every_node_of_an_attention_block_is_compared(block, via):
    module, inputs = CASES["encoder_layer_batch_first"].make() if block == "encoder_layer" else gpt2_block()
    assert_every_node_compared(*route(via, module, inputs))


# a representative subset: convolutions and batch norm, depthwise + squeeze-excitation, layer scale,
# patch attention, and a transformers encoder (its folded masks, index buffers and -inf fills)
SUBSET = ["tv_resnet18", "tv_mobilenet_v3", "tv_convnext", "timm_levit", "hf_bert"]


@pytest.mark.slow
@pytest.mark.parametrize("name", SUBSET)
@pytest.mark.parametrize("via", ROUTES)
def test_every_node_of_a_real_architecture_is_compared(name, via):
    case = REAL[name]
    if via == "fx" and not case.fx:
        pytest.skip("torch.fx cannot trace this model's Python")
    module, inputs = case.make()
    assert_every_node_compared(*route(via, module, inputs, traceable=case.fx))
