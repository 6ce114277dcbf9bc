"""The diff engine on real imports: torch.fx, torch.export and ONNX bundles against PyTorch,
onnxruntime and onnx's ReferenceEvaluator, node by node through the provenance the importers record."""

import io
import warnings

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import torchlean_bridge as tlb  # noqa: E402
from tests.test_diff import net_module, with_node, with_payload  # noqa: E402

X = torch.zeros(1, 2, 6, 6)


def node_named(bundle, name: str) -> int:
    return next(n.id for n in bundle.graph.nodes if n.source and n.source.name == name)


def onnx_bytes(m: nn.Module, x: torch.Tensor) -> bytes:
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(m, (x,), f, dynamo=False, input_names=["x"], output_names=["y"])
    return f.getvalue()


@pytest.fixture(scope="module")
def net():
    return net_module()


@pytest.mark.parametrize("importer,names", [("fx", ["conv", "norm", "fc1", "fc2"]),
                                            ("export", ["conv2d", "layer_norm", "linear", "linear_1"])])
def test_torch_imports_match_every_node_and_catch_swapped_biases(net, importer, names):
    bundle = tlb.import_fx(net, (X,)) if importer == "fx" else tlb.import_export(net, (X,))
    report = tlb.diff(bundle, against="torch", module=net)
    assert report.ok, str(report)
    assert all(r.status == "ok" for r in report.nodes), str(report)
    assert report.against == f"torch ({importer})"

    conv, norm, fc1, fc2 = (node_named(bundle, n) for n in names)
    swapped = with_payload(bundle, {(fc1, "bias"): bundle.payload.get(fc2, "bias"),
                                    (fc2, "bias"): bundle.payload.get(fc1, "bias")})
    report = tlb.diff(swapped, against="torch", module=net)
    assert report.first_divergence.node == fc1
    assert [f.keys for f in report.of_kind("parameter-mismatch")] == [("fc1.bias", "fc2.bias")]

    assert tlb.diff(with_node(bundle, norm, eps=1e-2), against="torch", module=net).first_divergence.node == norm
    shifted = with_node(bundle, conv, padding=(0, 0), padding_after=(2, 2))
    assert tlb.diff(shifted, against="torch", module=net).first_divergence.node == conv


class Affine(nn.Module):
    """Broadcasts and a Python scalar: the importer inserts nodes PyTorch has no value for."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, 8))
        self.shift = nn.Parameter(torch.linspace(-1, 1, 8))

    def forward(self, x):
        return torch.relu(x * self.scale + self.shift) * 2.0


def test_inserted_broadcasts_are_compared_through_the_finer_oracle():
    m = Affine().eval()
    bundle = tlb.import_fx(m, (torch.zeros(3, 8),))
    report = tlb.diff(bundle, against="torch", module=m)
    assert report.ok, str(report)
    inserted = [r for r in report.nodes if r.via]
    assert inserted and all(bundle.graph.nodes[r.node].kind in ("broadcast_to", "const") for r in inserted)
    assert all(r.status == "ok" and r.counterpart == "finer oracle" for r in inserted)
    assert all(r.via.startswith(("finer oracle: numpy broadcast_to", "constant")) for r in inserted)
    assert report.coverage["compared"] == len(bundle.graph.nodes), str(report)
    assert {r.counterpart for r in report.nodes if r.status == "ok"} >= {"x", "mul", "add", "relu", "mul_1"}


class Tokens(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb, self.out = nn.Embedding(11, 4), nn.Linear(4, 2)

    def forward(self, ids):
        return self.out(torch.tanh(self.emb(ids)))


def test_token_ids_are_drawn_from_the_embedding_range():
    torch.manual_seed(0)
    m = Tokens().eval()
    bundle = tlb.import_fx(m, (torch.zeros(2, 5, dtype=torch.long),))
    report = tlb.diff(bundle, against="torch", module=m, random=6)  # an index >= 11 would make torch raise
    assert report.ok, str(report)
    assert report.nodes[0].counterpart == "ids" and report.nodes[0].max_abs == 0


@pytest.mark.parametrize("against", ["onnxruntime", "reference-evaluator"])
def test_onnx_import_against_both_onnx_oracles(net, against):
    model = onnx_bytes(net, X)
    bundle = tlb.import_onnx(model)
    report = tlb.diff(bundle, against=against, onnx_model=model)
    assert report.ok and all(r.status == "ok" for r in report.nodes), str(report)
    conv = next(n.id for n in bundle.graph.nodes if n.kind == "conv")
    bad = with_payload(bundle, {(conv, "bias"): bundle.payload.get(conv, "bias") + 0.01})
    report = tlb.diff(bad, against=against, onnx_model=model)
    assert report.first_divergence.node == conv
    assert report.first_divergence.keys[:2] == ("conv.weight", "conv.bias")
    assert [f.keys for f in report.of_kind("parameter-mismatch")] == [("conv.bias",)]


def test_our_own_onnx_export_matches_node_by_node(net):
    bundle = tlb.import_fx(net, (X,))
    report = tlb.diff(bundle, against="onnxruntime")
    assert report.against == "onnxruntime (our ONNX export)"
    assert report.ok and all(r.status == "ok" for r in report.nodes), str(report)
    norm = node_named(bundle, "norm")
    # our export writes the attribute we got wrong, so both sides agree: the diff tests our semantics
    # and exporter against onnxruntime, not the import against the model
    assert tlb.diff(with_node(bundle, norm, eps=1e-2), against="onnxruntime").ok


def test_cli_against_onnx_files(net, tmp_path, capsys):
    from torchlean_bridge.app.cli import main
    model = onnx_bytes(net, X)
    (tmp_path / "net.onnx").write_bytes(model)
    bundle = tlb.import_onnx(model)
    tlb.save(bundle, tmp_path / "good")
    conv = next(n.id for n in bundle.graph.nodes if n.kind == "conv")
    tlb.save(with_node(bundle, conv, padding=(2, 2), padding_after=(0, 0)), tmp_path / "bad")
    args = ["--against", "onnxruntime", "--onnx", str(tmp_path / "net.onnx"), "--quiet"]
    assert main(["diff", str(tmp_path / "good"), *args]) == 0
    assert "diff against onnxruntime: agree" in capsys.readouterr().out
    assert main(["diff", str(tmp_path / "bad"), *args]) == 1
    assert f"DIVERGED: node {conv} (conv, onnx" in capsys.readouterr().out
    assert main(["diff", str(tmp_path / "good"), "--against", "reference-evaluator", "--random", "2"]) == 0


@pytest.mark.slow
@pytest.mark.parametrize("importer", ["fx", "export"])
def test_transformer_encoder_layer(importer):
    """Symbolic tracing fails on this module, so the FX importer lowers it through torch.export and
    the diff runs the same capture; the attention's inserted helper nodes have no counterpart."""
    torch.manual_seed(0)
    m = nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, batch_first=True, dropout=0.0).eval()
    x = torch.randn(1, 5, 16)
    bundle = tlb.import_export(m, (x,)) if importer == "export" else tlb.import_fx(m, (x,))
    report = tlb.diff(bundle, against="torch", module=m, random=3)
    assert report.ok, str(report)
    assert report.outputs[0].status == "ok"
    matched = [r for r in report.nodes if r.status == "ok"]
    assert {"linear", "layer_norm", "layer_norm_1"} <= {r.counterpart for r in matched}
    assert len(matched) >= len(report.nodes) // 2
    norm = node_named(bundle, "layer_norm")
    assert tlb.diff(with_node(bundle, norm, eps=0.5), against="torch", module=m).first_divergence.node == norm
