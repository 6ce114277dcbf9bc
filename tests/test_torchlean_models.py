"""Models reach TorchLean: export --to torchlean on real architectures, read back by the TorchLean-rule
reader, evaluated in the exact mode and compared with torch within the deviations the export states.

Token models go through ``--input-at embeddings``: ``eval --at embeddings --save`` gives the cut input,
and the exported graph on it must compute what the whole model computes on the token ids.
"""

from __future__ import annotations

import contextlib
import functools
import json

import numpy as np
import pytest
import torch

import torchlean_bridge as tlb
from torchlean_bridge.app.cli import main
from torchlean_bridge.app.torchlean_export import export_for_torchlean
from torchlean_bridge.wire import parse_document
from tests.model_zoo import CASES, REAL

FAST = [name for name, c in CASES.items() if not c.slow]
# what still has no exact v1 form, by model, with the reason the refusal must give
REFUSED = {
    "decoder": "graph input #2", "arithmetic": "graph input #2", "cross_attention": "graph input #2",
    "indexing": "graph input #2", "contractions": "graph input #2", "kitchen_sink": "ext op without",
    "tiny_unet": "where over a computed condition", "pooling": "max pooling with dilation",
}


def _import(case):
    module, inputs = case.make()
    b = tlb.import_export(module, inputs) if case.export else tlb.import_fx(module, inputs)
    return module, inputs, b


def _check_arrival(case, tmp_path, inline: bool = True):
    """Export, re-read with TorchLean's rules, evaluate exactly, compare. ``inline=False`` keeps the payload
    in its safetensors file (big models: the inline form spells every weight, grouped convs dense, in JSON)."""
    module, inputs, b = _import(case)
    token = any(not t.dtype.is_floating_point for t in inputs)
    report = export_for_torchlean(b, tmp_path / "m.json", input_at="embeddings" if token else None,
                                  approximate={"gelu": "tanh"}, inline_payload=inline,
                                  samples=[[t.numpy() for t in inputs]])
    doc = json.loads((tmp_path / "m.json").read_text())
    g, payload = parse_document(doc, strict=True)
    if not inline:
        from exporters.torchlean_json import read_companion_payload
        payload = read_companion_payload(tmp_path / "m.json", doc["payload_file"])
    x = [t.double().numpy() if t.dtype.is_floating_point else t.numpy() for t in inputs]
    table = tlb.evaluate(b.graph, b.payload, x, all_nodes=True)
    cut_input = table[report.cut["node"]] if report.cut else x[0]
    theirs = tlb.evaluate(g, payload, [cut_input], exact=True)
    ours = [table[o] for o in b.graph.outputs]
    stated = max(report.outputs, default=0.0)
    for a, c in zip(theirs, ours, strict=True):
        scale = max(1.0, float(np.max(np.abs(c), initial=0.0)))
        assert np.max(np.abs(a - c), initial=0.0) <= 4 * stated + 1e-9 * scale, case.name
    approximations = {(r["kind"], r["approximation"]) for r in report.rewrites if r["approximation"]}
    assert approximations <= {("gelu", "tanh")}, approximations
    with torch.no_grad(), _gelu_as_tanh(module, on=bool(approximations)):
        expected = module(*inputs)
    expected = [expected] if isinstance(expected, torch.Tensor) else list(expected)
    for a, e in zip(theirs, expected, strict=True):
        e = e.double().numpy()
        scale = max(1.0, float(np.max(np.abs(e), initial=0.0)))
        assert np.max(np.abs(a - e), initial=0.0) <= 1e-3 * scale, case.name
    return report


@contextlib.contextmanager
def _gelu_as_tanh(module: torch.nn.Module, on: bool):
    """torch's forward with every GELU in its tanh form: the oracle for an export that approximated
    gelu by its tanh formula is torch computing that same formula, not the exact GELU within a loose
    tolerance. Patches torch.nn.functional.gelu and module attributes that hold it (HF's activations)."""
    if not on:
        yield
        return
    exact = torch.nn.functional.gelu
    tanh_gelu = functools.partial(exact, approximate="tanh")
    held = [(m, k) for m in module.modules() for k, v in vars(m).items() if v is exact]
    torch.nn.functional.gelu = lambda x, approximate="none": exact(x, approximate="tanh")
    for m, k in held:
        setattr(m, k, tanh_gelu)
    try:
        yield
    finally:
        torch.nn.functional.gelu = exact
        for m, k in held:
            setattr(m, k, exact)


@pytest.mark.parametrize("name", FAST)
def test_every_fast_zoo_model_arrives_or_is_refused_by_name(name, tmp_path):
    if name in REFUSED:
        _, _, b = _import(CASES[name])
        with pytest.raises(tlb.BridgeError, match=REFUSED[name]) as e:
            export_for_torchlean(b, tmp_path / "m.json", approximate={"gelu": "tanh"})
        assert not (tmp_path / "m.json").exists()
        assert "block the export" in str(e.value)
        return
    _check_arrival(CASES[name], tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(set(REAL) | {n for n, c in CASES.items() if c.slow}))
def test_real_architectures_arrive(name, tmp_path):
    case = REAL.get(name) or CASES[name]
    try:
        case.make()
    except ImportError as e:
        pytest.skip(f"{name}: {e}")
    _check_arrival(case, tmp_path, inline=False)


class TiedLM(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(20, 8)
        self.block = torch.nn.Sequential(torch.nn.LayerNorm(8), torch.nn.Linear(8, 16), torch.nn.GELU(),
                                         torch.nn.Linear(16, 8))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.block(self.emb(ids)) @ self.emb.weight.T


def test_a_token_model_through_the_command_line(tmp_path, capsys):
    torch.manual_seed(0)
    module = TiedLM().eval()
    ids = torch.randint(0, 20, (2, 5))
    tlb.save(tlb.import_export(module, (ids,)), tmp_path / "b")
    np.save(tmp_path / "ids.npy", ids.numpy())
    args = ["export", str(tmp_path / "b"), "--to", "torchlean", "-o", str(tmp_path / "m.json"), "--inline-payload",
            "--input-at", "embeddings", "--sample", str(tmp_path / "ids.npy")]
    assert main(args) == 1  # GELU with erf: refused, naming the option
    err = capsys.readouterr().err
    assert "gelu" in err and "--approximate gelu=tanh" in err and not (tmp_path / "m.json").exists()
    assert main(args + ["--approximate", "gelu=tanh"]) == 0
    out = capsys.readouterr().out
    assert "cut: node" in out and "rewrote 1 gelu node(s)" in out and "approximation (gelu=tanh)" in out
    assert main(["eval", str(tmp_path / "b"), "--input", str(tmp_path / "ids.npy"), "--at", "embeddings",
                 "--save", str(tmp_path / "emb.npy")]) == 0
    g, payload = parse_document(json.loads((tmp_path / "m.json").read_text()), strict=True)
    got = tlb.evaluate(g, payload, [np.load(tmp_path / "emb.npy")], exact=True)[0]
    with torch.no_grad():
        expected = module.double()(ids).numpy()
    doc = json.loads((tmp_path / "m.json").read_text())
    stated = doc["torchlean_bridge"]["deviation_by_kind"]["gelu"]["interval_deviation"]
    assert 0 < stated < 1e-3
    np.testing.assert_allclose(got, expected, atol=50 * stated)


@pytest.mark.parametrize("flags, message", [
    (["--approximate", "gelu"], "expected KIND=NAME"),
    (["--approximate", "gelu=cubic"], "no such approximation"),
    (["--input-at", "99"], "the graph has nodes 0..")
    , (["--input-at", "nothing"], "give a node id or `embeddings`"),
    (["--constant-input", "x=a.npy"], "ID must be a graph input's node id"),
    (["--sample", "x.npy", "--sample", "x.npy"], "give one array per graph input of the bundle (1), got 2"),
])
def test_bad_export_flags_are_named(tmp_path, capsys, flags, message):
    module = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.GELU())
    tlb.save(tlb.import_export(module.eval(), (torch.randn(1, 3),)), tmp_path / "b")
    np.save(tmp_path / "x.npy", np.zeros((1, 3)))
    flags = [str(tmp_path / f) if f.endswith(".npy") and f.startswith("x") else f for f in flags]
    assert main(["export", str(tmp_path / "b"), "--to", "torchlean", "-o", str(tmp_path / "m.json")] + flags) == 2
    assert message in capsys.readouterr().err


def test_a_second_input_frozen_to_a_constant_exports(tmp_path):
    module, (x, y), b = _import(CASES["arithmetic"])
    with pytest.raises(tlb.BridgeError, match=r"--constant-input 1=FILE.npy"):
        export_for_torchlean(b, None)
    frozen = y.double().numpy()
    report = export_for_torchlean(b, tmp_path / "m.json", constants={1: frozen}, samples=[[x.numpy(), y.numpy()]])
    assert report.frozen == [1]
    g, payload = parse_document(json.loads((tmp_path / "m.json").read_text()), strict=True)
    ours = tlb.evaluate(b.graph, b.payload, [x.double().numpy(), frozen])
    theirs = tlb.evaluate(g, payload, [x.double().numpy()], exact=True)
    for a, c in zip(theirs, ours, strict=True):
        np.testing.assert_allclose(a, c, rtol=1e-12, atol=4 * max(report.outputs) + 1e-12)


def test_samples_outside_the_models_domain_leave_the_deviation_unmeasured_not_the_export(tmp_path):
    class LogNet(torch.nn.Module):
        def forward(self, x):
            return torch.log(torch.nn.functional.relu6(x) + 0.0)

    b = tlb.import_export(LogNet().eval(), (torch.rand(2, 3) + 0.5,))
    report = export_for_torchlean(b, tmp_path / "m.json")  # standard-normal samples: log of 0 fails
    assert "not measured: the samples cannot be evaluated" in "\n".join(report.lines())
    good = export_for_torchlean(b, tmp_path / "m2.json", samples=[[np.full((2, 3), 0.7)]])
    assert good.by_kind["clamp"]["max_deviation"] == 0.0
