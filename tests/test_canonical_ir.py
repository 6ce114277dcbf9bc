"""One canonical IR (architecture decision 10, torchlean_bridge/passes/canonicalize.py).

Every zoo model gives the same kinds through torch.fx and torch.export, and through torch.onnx's file
the same kinds again except where that file computes differently (an exporter's fusion or
decomposition, listed below with what it does); layout steps never differ in spelling. The rules
themselves are checked on small graphs: each rewrite keeps every value, and the pass is idempotent.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

import torchlean_bridge as tlb
from importers.builder import GraphBuilder
from torchlean_bridge.ops import INT64
from torchlean_bridge.passes import canonicalize
from torchlean_bridge.passes.canonicalize import CANONICAL_FORMS

torch = pytest.importorskip("torch")
from tests.model_zoo import CASES, cases  # noqa: E402

# the two tracers record different programs for these (not a spelling difference)
TRACED_DIFFERENTLY = {
    # under fx, `query is key` is False for proxies, so MultiheadAttention takes its general path
    # (three projections from slices of in_proj_weight); torch.export sees one tensor and packs them
    "mha_batch_first": "fx traces MultiheadAttention's separate q/k/v projections, export the packed one",
    "mha_seq_first": "fx traces MultiheadAttention's separate q/k/v projections, export the packed one",
    # softsign is CompositeImplicit in ATen: torch.export records x / (|x| + 1), fx the call
    "kitchen_sink": "torch.export decomposes F.softsign into abs/add/div",
}

# where torch.onnx's file computes differently from the module (so its kinds may differ)
ONNX_COMPUTES_DIFFERENTLY = {
    "mlp_activations": "SiLU exported as Sigmoid * Mul",
    "group_norm": "SiLU as Sigmoid * Mul; GroupNorm as InstanceNormalization on a reshape, scaled after",
    "tiny_unet": "SiLU as Sigmoid * Mul; GroupNorm via InstanceNormalization; global pool as ReduceMean",
    "cnn1d": "batch norm folded into the preceding convolution",
    "cnn2d": "batch norm folded into the convolutions; adaptive pool as GlobalAveragePool",
    "cnn3d": "batch norm folded into the preceding convolution",
    "residual": "batch norm folded into the convolutions; adaptive pool as GlobalAveragePool",
    "unbatched_conv": "the unbatched convolution computed on a batch of one (Unsqueeze ... Reshape)",
    "decoder": "unbatched transposed convolution computed on a batch of one (Unsqueeze ... Squeeze)",
    "mha_batch_first": "attention as one packed MatMul, reshaped and transposed per head",
    "mha_seq_first": "attention as one packed MatMul, reshaped and transposed per head",
    "cross_attention": "projections as MatMul by initializers; the boolean mask as an additive float mask",
    "encoder_stack": "attention's scale applied as sqrt(scale) to q and to k^T (two Mul per layer, torch one)",
    "sdpa_causal": "the causal mask as an additive float mask",
    "sdpa_mask": "the mask as an additive float mask, with a NaN guard",
    "contractions": "x @ W with a weight initializer (MatMul by an initializer imports as linear)",
    "kitchen_sink": "mish, softsign, log1p and rsqrt exported as their elementary decompositions",
    "hf_bert": "the attention mask applied by multiplication instead of a select",
}
# torch.onnx's TorchScript exporter itself fails on these (hf_llama: aten::diff has no ONNX form)
TORCHSCRIPT_EXPORT_FAILS = {"encoder_layer_batch_first", "encoder_layer_seq_first", "hf_gpt2", "hf_llama"}
NOT_CANONICAL = frozenset(k for k, v in CANONICAL_FORMS.items() if " " not in v)  # always rewritten


def kinds(bundle: tlb.Bundle) -> Counter:
    return Counter(n.kind for n in bundle.graph)


def _torch_bundle(name: str) -> tlb.Bundle:
    case = CASES[name]
    module, inputs = case.make()
    return tlb.import_fx(module, inputs) if case.fx else tlb.import_export(module, inputs)


def _params(selected):
    return [pytest.param(c.name, marks=[pytest.mark.slow] if c.slow else []) for c in selected]


@pytest.mark.parametrize("name", _params(c for c in cases(importer="fx") if c.export))
def test_fx_and_export_give_the_same_kinds(name: str) -> None:
    module, inputs = CASES[name].make()
    fx, export = kinds(tlb.import_fx(module, inputs)), kinds(tlb.import_export(module, inputs))
    assert not NOT_CANONICAL & (set(fx) | set(export))
    if name in TRACED_DIFFERENTLY:
        assert fx != export, f"{name} now agrees: drop it from TRACED_DIFFERENTLY"
    else:
        assert fx == export, f"fx +{dict(fx - export)} export +{dict(export - fx)}"


@pytest.mark.parametrize("name", _params(c for c in CASES.values() if c.name not in TORCHSCRIPT_EXPORT_FAILS))
def test_onnx_differs_only_where_the_file_computes_differently(name: str) -> None:
    from tests.test_onnx_torch import torch_to_onnx
    module, inputs = CASES[name].make()
    onnx_kinds = kinds(tlb.import_onnx(torch_to_onnx(module, inputs, dynamo=False)))
    torch_kinds = kinds(_torch_bundle(name))
    assert not NOT_CANONICAL & set(onnx_kinds)
    if name in ONNX_COMPUTES_DIFFERENTLY:
        assert onnx_kinds != torch_kinds, f"{name} now agrees: drop it from ONNX_COMPUTES_DIFFERENTLY"
    else:
        assert onnx_kinds == torch_kinds, f"onnx +{dict(onnx_kinds - torch_kinds)} torch +{dict(torch_kinds - onnx_kinds)}"


# -- the rules on small graphs -------------------------------------------------------------------------
def _layout_graph() -> tuple[GraphBuilder, int]:
    b = GraphBuilder("builder")
    x = b.input((2, 3, 4))
    u = b.add("unsqueeze", [x], {"axes": [0]})  # [1, 2, 3, 4]
    s = b.add("squeeze", [u], {"axes": [0]})  # back to [2, 3, 4]: one identity after merging
    p = b.add("permute", [s], {"perm": [0, 2, 1]})  # a single swap: transpose(1, 2)
    e = b.add("expand", [b.add("unsqueeze", [p], {"axes": [0]})], {"to_shape": [5, 2, 4, 3]})
    g1 = b.add("gather", [e, b.const(np.array(1, dtype=np.int64))], {"axis": 2})  # select: slice + reshape
    g2 = b.add("gather", [g1, b.const(np.array([0, 2], dtype=np.int64))], {"axis": 2})  # step 2: slice
    g3 = b.add("gather", [g2, b.const(np.array([1, 0], dtype=np.int64))], {"axis": 1})  # not a progression
    r1 = b.add("reduce_sum_axes", [g3], {"axes": [0, 1, 2], "keepdim": False})  # every axis: sum
    r2 = b.add("reduce_mean_axes", [g3], {"axes": [1], "keepdim": False})  # one axis: reduce_mean
    f = b.add("flatten", [r2], {"value_shape": [5, 2]})
    m = b.add("max_pool_nd", [b.reshape(f, (1, 1, 10))],
              {"spatial_rank": 1, "kernel": [2], "stride": [2], "padding": [0], "padding_after": [0],
               "dilation": [1], "ceil_mode": False, "count_include_pad": True})  # v1 geometry: max_pool
    out = b.add("concat", [b.reshape(m, (5,)), b.reshape(b.broadcast(r1, (1,)), (1,))], {"axis": 0})
    return b, out


def test_each_rule_rewrites_to_its_canonical_form_and_keeps_every_value() -> None:
    b, out = _layout_graph()
    raw = b.finish([out], canonical=False)
    canon, note = canonicalize(raw)
    assert note.changed > 0
    got = kinds(canon)
    assert not NOT_CANONICAL & set(got)
    assert got["transpose"] == 1 and got["permute"] == 0 and got["sum"] == 1 and got["reduce_mean"] == 1
    assert got["max_pool"] == 1 and got["max_pool_nd"] == 0 and got["broadcast_to"] >= 1
    assert got["gather"] == 1 and got["slice"] == 2  # the permuted index stays a gather
    x = np.random.default_rng(0).normal(size=(2, 3, 4))
    for dtype in ("float64", "float32"):
        np.testing.assert_array_equal(tlb.evaluate(canon.graph, canon.payload, [x], dtype=dtype)[0],
                                      tlb.evaluate(raw.graph, raw.payload, [x], dtype=dtype)[0])
    again, note2 = canonicalize(canon)
    assert note2.changed == 0 and again == canon
    assert b.finish([out]) == canon  # finish runs the pass


def test_a_bound_index_is_data_and_stays_a_gather() -> None:
    b = GraphBuilder("builder")
    x = b.input((4, 3))
    idx = b.const(np.array([1, 2], dtype=np.int64), key="positions")
    out = b.add("gather", [x, idx], {"axis": 0})
    bundle = b.finish([out])
    assert kinds(bundle)["gather"] == 1 and "positions" in bundle.roles
    assert bundle.graph.nodes[bundle.roles["positions"].node].dtype == INT64


def test_a_chain_of_permutations_is_one() -> None:
    b = GraphBuilder("builder")
    x = b.input((2, 3, 4, 5))
    t1 = b.add("transpose", [x], {"axis1": 1, "axis2": 2})  # (2, 4, 3, 5)
    t2 = b.add("transpose", [t1], {"axis1": 2, "axis2": 3})  # (2, 4, 5, 3)
    p = b.add("permute", [t2], {"perm": [0, 1, 3, 2]})  # back to (2, 4, 3, 5): the swap of axes 1, 2
    raw = b.finish([b.add("permute", [b.add("relu", [p])], {"perm": [0, 1, 2, 3]})], canonical=False)
    canon, _ = canonicalize(raw)
    inner = [n for n in canon.graph if n.kind in ("transpose", "permute") and n.id not in canon.graph.outputs]
    assert [(n.kind, dict(n.attrs)) for n in inner] == [("transpose", {"axis1": 1, "axis2": 2})]
    assert canon.graph.nodes[canon.graph.outputs[0]].kind == "permute"  # an output keeps its node
    x0 = np.random.default_rng(1).normal(size=(2, 3, 4, 5))
    np.testing.assert_array_equal(tlb.evaluate(canon.graph, canon.payload, [x0])[0],
                                  tlb.evaluate(raw.graph, raw.payload, [x0])[0])
