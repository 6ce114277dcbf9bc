"""Every zoo model through torch.fx and torch.export (as is and decomposed to core ATen).

Each import must validate, evaluate in float32 within 1e-5 (relative to the output's scale) of
the module's own float32 output, and in float64 within 1e-12 of the module run in float64 (the
lowering is the op's exact meaning, not an approximation). FX and torch.export bundles of one
model agree on outputs and on the role map's keys, which cover the whole state_dict.
"""

from __future__ import annotations

import copy
import functools
import warnings

import numpy as np
import pytest
import torch

import torchlean_bridge as tlb
from torchlean_bridge.roles import apply_transform
from importers.torch.common import Known, NotLowerable, Sym
from importers.torch.program import EMITTED_KINDS
from importers.torch.ops_index import gather_axis
from importers.torch.program import TorchLowerer
from tests.model_zoo import CASES, cases

warnings.filterwarnings("ignore", category=FutureWarning)

# decomposition is slow (~1-5 s a model); these representative cases run it in the fast suite
DECOMPOSED_FAST = ("functional_mlp", "cnn2d", "mha_seq_first")


def _flat(out) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    return [t for o in out for t in _flat(o)]


@functools.lru_cache(maxsize=None)
def reference(name: str) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The module's outputs in float32 and, for the same weights, in float64."""
    module, inputs = CASES[name].make()
    with torch.no_grad():
        ref32 = [t.numpy() for t in _flat(module(*inputs))]
        m64 = copy.deepcopy(module).double()
        ref64 = [t.numpy() for t in _flat(m64(*(x.double() if x.is_floating_point() else x for x in inputs)))]
    return ref32, ref64


@functools.lru_cache(maxsize=None)
def imported(name: str, via: str) -> tlb.Bundle:
    module, inputs = CASES[name].make()
    if via == "fx":
        return tlb.import_fx(module, inputs)
    return tlb.import_export(module, inputs, decompose=via == "decomposed")


def inputs_of(name: str) -> list[np.ndarray]:
    return [x.numpy() for x in CASES[name].make()[1]]


def scaled_error(got: np.ndarray, want: np.ndarray) -> float:
    assert got.shape == want.shape
    if want.size == 0:
        return 0.0
    return float(np.max(np.abs(got.astype(np.float64) - want)) / max(1.0, float(np.max(np.abs(want)))))


def check_bundle(name: str, via: str) -> None:
    b = imported(name, via)
    assert tlb.check(b.graph) == []
    assert set(b.graph.ops_used()) <= EMITTED_KINDS  # the op-support matrix lists what we emit
    ref32, ref64 = reference(name)
    out32 = tlb.evaluate(b.graph, b.payload, inputs_of(name), dtype="float32")
    out64 = tlb.evaluate(b.graph, b.payload, inputs_of(name), dtype="float64")
    assert len(out32) == len(ref32)
    for got, want in zip(out32, ref32):
        assert got.dtype == want.dtype or want.dtype.kind != "f"
        assert scaled_error(got, want) <= 1e-5
    for got, want in zip(out64, ref64):
        assert scaled_error(got, want) <= (1e-12 if CASES[name].float64 else 1e-5)
    # the role map binds every state_dict key the computation reads (constants may be bound too);
    # the rest are reported unused
    module = CASES[name].make()[0]
    keys = set(module.state_dict())
    unused = set(b.report.get("unused_tensors", []))
    assert keys <= set(b.roles) | unused and not unused & set(b.roles)
    # every binding replays: the transform turns the state_dict tensor into the payload tensor
    state = module.state_dict()
    for binding in b.roles.bindings():
        if binding.key in state:
            want = apply_transform(binding.transform, state[binding.key].numpy())
            np.testing.assert_array_equal(b.payload.get(binding.node, binding.role), want)
    assert all(k.endswith("num_batches_tracked") or k.startswith("model.pooler.") for k in unused)


def params(importer: str, decomposed: bool = False) -> list:
    """Zoo cases an importer accepts; slow ones (and most decompositions) carry the slow mark."""
    out = []
    for c in cases(importer=importer):
        if decomposed and not c.decompose:
            continue
        slow = c.slow or (decomposed and c.name not in DECOMPOSED_FAST)
        out.append(pytest.param(c.name, marks=pytest.mark.slow if slow else ()))
    return out


@pytest.mark.parametrize("name", params("fx"))
def test_fx_import_matches_module(name):
    check_bundle(name, "fx")


@pytest.mark.parametrize("name", params("export"))
def test_export_import_matches_module(name):
    check_bundle(name, "export")


@pytest.mark.parametrize("name", params("export", decomposed=True))
def test_decomposed_export_import_matches_module(name):
    check_bundle(name, "decomposed")


@pytest.mark.parametrize("name", [p for p in params("fx") if CASES[p.values[0]].export])
def test_fx_and_export_agree(name):
    fx, ex = imported(name, "fx"), imported(name, "export")
    assert set(fx.roles) == set(ex.roles)
    xs = inputs_of(name)
    for a, b in zip(tlb.evaluate(fx.graph, fx.payload, xs), tlb.evaluate(ex.graph, ex.payload, xs)):
        assert scaled_error(a, b) <= 1e-12


@pytest.mark.slow
@pytest.mark.parametrize("name", ["hf_bert", "hf_gpt2", "hf_llama"])
def test_transformers_models_are_real_sized(name):
    b = imported(name, "export")
    assert b.summary()["parameters"] > 10_000
    assert {"linear", "gather", "softmax"} <= set(b.graph.ops_used())


class Unary(torch.nn.Module):
    """A one-expression model, for op-level checks against torch itself."""

    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)


class Binary(Unary):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.fn(x, y)


def assert_matches_torch(fn, *inputs: torch.Tensor) -> None:
    """fx and export imports of ``fn`` evaluate (float64) to torch's own float64 output."""
    module = (Unary if len(inputs) == 1 else Binary)(fn).eval()
    xs = tuple(x.double() if x.is_floating_point() else x for x in inputs)
    want = fn(*xs).detach().numpy()
    for importer in (tlb.import_fx, tlb.import_export):
        b = importer(module, xs)
        got = tlb.evaluate(b.graph, b.payload, [x.numpy() for x in xs], dtype="float64")[0]
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("start, length", [(-3, 2), (-5, 5), (-1, 1), (2, 3)])
def test_narrow_with_negative_start_counts_from_the_end(start, length):
    assert_matches_torch(lambda x: x.narrow(1, start, length), torch.randn(2, 5))


@pytest.mark.parametrize("equation, shapes", [("i,i->", [(5,), (5,)]), ("bi,bi->b", [(3, 4), (3, 4)]),
                                              ("i,i->i", [(4,), (4,)]), ("ij,ij->", [(2, 3), (2, 3)])])
def test_einsum_with_equal_operand_specs_contracts_elementwise(equation, shapes):
    assert_matches_torch(lambda x, y: torch.einsum(equation, x, y), *(torch.randn(*s) for s in shapes))


@pytest.mark.parametrize("beta, threshold", [(1.0, 1.0), (2.0, 1.0), (0.5, -0.5), (1.0, 20.0), (3.0, 20.0)])
def test_softplus_returns_x_above_the_threshold_like_torch(beta, threshold):
    x = torch.linspace(-4, 4, 33)
    assert_matches_torch(lambda x: torch.nn.functional.softplus(x, beta, threshold), x)
    module = torch.nn.Softplus(beta, threshold).eval()
    b = tlb.import_fx(module, (x,))
    got = tlb.evaluate(b.graph, b.payload, x.numpy(), dtype="float32")[0]
    np.testing.assert_allclose(got, module(x).numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("index", [[-1, 0, -5], [4, -2], [2]])
def test_constant_indices_count_negatives_from_the_end(index):
    assert_matches_torch(lambda x: x.index_select(1, torch.tensor(index)) if min(index) >= 0
                         else x[:, torch.tensor(index)], torch.randn(3, 5))


@pytest.mark.parametrize("index", [[5], [-6], [0, 7]])
def test_constant_indices_out_of_range_are_refused_not_wrapped(index):
    """torch raises IndexError for these; the lowering (reached e.g. by a graph torch never ran) refuses too."""
    with pytest.raises(IndexError):
        torch.randn(3, 5)[:, torch.tensor(index)]
    cx = TorchLowerer("fx")
    x = Sym(cx.builder.input((3, 5)))
    with pytest.raises(NotLowerable, match=r"index \[-?\d+\] out of range for extent 5 on axis 1"):
        gather_axis(cx, x, 1, Known(torch.tensor(index), folded=True))
