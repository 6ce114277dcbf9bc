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


def _masked_scores(q: torch.Tensor, k: torch.Tensor, shift: int) -> torch.Tensor:
    """A Swin-like helper FX keeps as one call: its mask and scale are built inside the body."""
    n = q.shape[-2]
    rows, cols = torch.arange(n)[:, None], torch.arange(n)
    mask = torch.where((rows < shift) & (cols >= shift), -100.0, 0.0)
    scores = q @ k.transpose(-2, -1) * (q.shape[-1] ** -0.5)
    return torch.softmax(scores + mask, dim=-1)


torch.fx.wrap("_masked_scores")


class WrappedAttention(torch.nn.Module):
    def __init__(self, d: int = 8) -> None:
        super().__init__()
        self.q, self.k, self.v = (torch.nn.Linear(d, d) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _masked_scores(self.q(x), self.k(x), 2) @ self.v(x)


def test_the_body_of_a_wrapped_function_is_compared_node_by_node():
    """fx keeps ``_masked_scores`` as one call; the importer inlines its exported body, and the oracle
    exports the same body, so each inlined node (its folded mask and scale among them) is read from it."""
    torch.manual_seed(0)
    module = WrappedAttention().eval()
    bundle, kw = route("fx", module, (torch.randn(2, 5, 8),))
    report = tlb.diff(bundle, random=2, **kw)
    body = [n.id for n in bundle.graph.nodes if n.source and (n.source.name or "").startswith("_masked_scores.")]
    assert body, "the importer inlined no body"
    rows = {r.node: r for r in report.nodes}
    assert all(rows[i].counterpart.startswith("_masked_scores.") and rows[i].via is None for i in body), str(report)
    assert report.ok and report.coverage["compared"] == len(bundle.graph.nodes), str(report)


class PlainSDPA(torch.nn.Module):
    def __init__(self, d: int = 8) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(d, 3 * d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).reshape(2, 5, 3, 2, 4).permute(2, 0, 3, 1, 4).unbind(0)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)


def test_sdpa_default_scale_is_compared_through_plain_fx():
    """plain symbolic_trace records no shapes: the default scale 1/sqrt(E) comes from the recorded query."""
    torch.manual_seed(0)
    bundle, kw = route("fx", PlainSDPA().eval(), (torch.randn(2, 5, 8),))
    scale = [n.id for n in bundle.graph.nodes if n.kind == "const" and n.out_shape == ()
             and abs(float(bundle.payload.get(n.id, "values")) - 0.5) < 1e-7]
    assert scale, "no folded 1/sqrt(4) constant"
    report = tlb.diff(bundle, random=2, **kw)
    rows = {r.node: r for r in report.nodes}
    assert all(rows[i].status == "ok" and "literal" in rows[i].via for i in scale), str(report)
    assert report.coverage["compared"] == len(bundle.graph.nodes), str(report)


def _gather_nd_model(batch_dims: int):
    """x (2, 3, 4) -> GatherND with constant indices -> Relu, through onnx.helper."""
    from onnx import TensorProto, helper, numpy_helper
    import numpy as np
    ind = np.array([[[2], [0]], [[1], [-1]]]) if batch_dims else np.array([[[1, 2], [0, -1]], [[1, 0], [0, 0]]])
    graph = helper.make_graph(
        [helper.make_node("GatherND", ["x", "ind"], ["g"], name="gnd", batch_dims=batch_dims),
         helper.make_node("Relu", ["g"], ["y"], name="relu")], "gnd",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(ind.astype(np.int64), "ind")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("batch_dims", [0, 1])
def test_gather_nd_index_table_is_compared(batch_dims):
    """the importer folds GatherND's indices into flat positions of one gather: that table is compared
    against the positions the ONNX definition reads, and a wrong table diverges there."""
    model = _gather_nd_model(batch_dims)
    bundle = tlb.import_onnx(model)
    table = [n.id for n in bundle.graph.nodes if n.kind == "const" and n.source and n.source.name == "gnd"]
    assert len(table) == 1
    report = tlb.diff(bundle, against="onnxruntime", onnx_model=model, random=2)
    row = next(r for r in report.nodes if r.node == table[0])
    assert row.status == "ok" and "index table of gnd" in row.via, str(report)
    assert report.coverage["compared"] == len(bundle.graph.nodes), str(report)
    wrong = bundle.payload.get(table[0], "values").copy()
    wrong.flat[0] = (wrong.flat[0] + 1) % 3
    bundle.payload.set(table[0], "values", wrong)
    broken = tlb.diff(bundle, against="onnxruntime", onnx_model=model, random=2)
    assert not broken.ok
    assert next(r for r in broken.nodes if r.node == table[0]).status == "diverged", str(broken)


@pytest.mark.slow
@pytest.mark.parametrize("name, via", [("tv_swin", "fx"), ("timm_vit", "fx"), ("tv_alexnet", "torch.onnx")])
def test_the_routes_that_missed_nodes_compare_every_node(name, via):
    """swin's wrapped helpers (fx), vit's sdpa default scale (plain fx), alexnet's GatherND table (torch.onnx)."""
    case = REAL[name]
    module, inputs = case.make()
    assert_every_node_compared(*route(via, module, inputs, traceable=case.fx))
