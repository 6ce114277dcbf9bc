"""Whole models through the evaluator: small versions of the benchmark models, against PyTorch.

Each model is imported (ONNX or torch.export), evaluated in float64 and float32, and compared with the
module run in torch.float64 and torch.float32. Agreement is normwise, ``max|ours - torch| <=
rtol * max|torch|`` with rtol 1e-10 (float64: dozens of accumulated dot products) and 1e-5
(float32), and the float32 evaluation must also agree with onnxruntime where the model went
through ONNX.
"""

from __future__ import annotations

import io

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import torchlean_bridge as tlb  # noqa: E402

pytestmark = pytest.mark.slow  # real exports and imports: about 10 s


def _close(ours: np.ndarray, ref: np.ndarray, rtol: float) -> None:
    assert ours.shape == ref.shape
    scale = float(np.max(np.abs(ref)))
    err = float(np.max(np.abs(ours.astype(np.float64) - ref.astype(np.float64))))
    assert err <= rtol * scale, f"max error {err:.3g} > {rtol:g} * {scale:.3g}"


class Block(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.a = nn.Conv2d(c, c, 3, padding=2, dilation=2, groups=2, bias=False)
        self.bn = nn.BatchNorm2d(c)
        self.b = nn.Conv2d(c, c, 3, padding=1)

    def forward(self, x):
        return torch.relu(x + self.b(torch.relu(self.bn(self.a(x)))))


def small_cnn() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 5, stride=2, padding=2), nn.ReLU(), nn.MaxPool2d(3, 2, 1), Block(8),
                          nn.AvgPool2d(2), nn.Conv2d(8, 16, 1), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(16, 10))
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.2, 0.2)
            m.running_var.uniform_(0.5, 1.5)
    return model.eval()


def _onnx(model: nn.Module, x: torch.Tensor) -> bytes:
    buf = io.BytesIO()
    with torch.no_grad():
        # no constant folding: batch norm stays a node instead of being folded into float32 conv weights,
        # so the float64 module is the same function as the exported graph
        torch.onnx.export(model, (x,), buf, input_names=["x"], output_names=["y"], opset_version=17, dynamo=False,
                          do_constant_folding=False)
    return buf.getvalue()


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_cnn_through_onnx_matches_torch_and_onnxruntime():
    ort = pytest.importorskip("onnxruntime")
    onnx = pytest.importorskip("onnx")
    model, x = small_cnn(), torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    data = _onnx(model, x)
    bundle = tlb.import_onnx(onnx.load_from_string(data))
    assert {"conv", "batch_norm_eval", "max_pool", "avg_pool", "reduce_mean_axes"} <= set(bundle.graph.ops_used())
    with torch.no_grad():
        ref32, ref64 = model(x).numpy(), model.double()(x.double()).numpy()
    ours64 = tlb.evaluate(bundle.graph, bundle.payload, x.numpy(), dtype="float64")[0]
    ours32 = tlb.evaluate(bundle.graph, bundle.payload, x.numpy(), dtype="float32")[0]
    assert ours32.dtype == np.float32 and ours64.dtype == np.float64
    _close(ours64, ref64, 1e-10)
    _close(ours32, ref32, 1e-5)
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    _close(ours32, session.run(None, {"x": x.numpy()})[0], 1e-5)


class EncoderLayer(nn.Module):
    """Post-norm attention + GELU feed-forward, written with Linear/LayerNorm/softmax."""

    def __init__(self, d: int = 32, heads: int = 4, ff: int = 64) -> None:
        super().__init__()
        self.heads = heads
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.ff1, self.ff2 = nn.Linear(d, ff), nn.Linear(ff, d)
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = (t.reshape(b, s, self.heads, d // self.heads).transpose(1, 2) for t in self.qkv(x).split(d, -1))
        attention = torch.softmax(q @ k.transpose(-2, -1) * (d // self.heads) ** -0.5, dim=-1)
        x = self.norm1(x + self.proj((attention @ v).transpose(1, 2).reshape(b, s, d)))
        return self.norm2(x + self.ff2(nn.functional.gelu(self.ff1(x))))


def test_transformer_layer_through_torch_export_matches_torch():
    torch.manual_seed(0)
    model = nn.Sequential(EncoderLayer(), EncoderLayer()).eval()
    x = torch.randn(1, 16, 32, generator=torch.Generator().manual_seed(2))
    bundle = tlb.import_export(model, (x,))
    kinds = set(bundle.graph.ops_used())
    assert {"layernorm", "softmax", "gelu", "matmul", "linear"} <= kinds
    with torch.no_grad():
        ref32, ref64 = model(x).numpy(), model.double()(x.double()).numpy()
    _close(tlb.evaluate(bundle.graph, bundle.payload, x.numpy(), dtype="float64")[0], ref64, 1e-10)
    _close(tlb.evaluate(bundle.graph, bundle.payload, x.numpy(), dtype="float32")[0], ref32, 1e-5)
