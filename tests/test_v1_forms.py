"""The v1 forms of ext ops (passes/v1_forms.py): one test per rewrite family.

Each case builds a one-op graph, exports it to torchlean.ir.v1, reads the document back in strict mode
(TorchLean's rules: v1 kinds only, one float input, payload inline) and evaluates it in the exact
float64 mode; the result must equal our own float64 semantics of the original op: bit for bit for the
forms whose deviation class says so, within a few ulps for the rounding class. Inputs include the
values a form is most likely to get wrong (0, -0.0, the clamp bounds, ties in max pools).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import torchlean_bridge as tlb
from exporters.torchlean_json import export_torchlean, torchlean_blocking_nodes
from importers.builder import GraphBuilder
from torchlean_bridge.passes.v1_forms import V1_FORMS
from torchlean_bridge.wire import parse_document

RNG = np.random.default_rng(7)
EDGES = np.array([0.0, -0.0, 1.0, -1.0, 6.0, -3.0, 3.0, 0.5, -0.5, 1e-300, -1e-300, 40.0, -40.0])


def _x(shape, scale=3.0):
    x = RNG.standard_normal(shape) * scale
    flat = x.reshape(-1)
    flat[:min(len(EDGES), flat.size)] = EDGES[:flat.size]
    return x


def one_op(kind, attrs, shape, consts=(), dtype_consts=None):
    """input -> kind(input, *consts) as a bundle (consts are extra constant parents)."""
    b = GraphBuilder("test")
    x = b.input(shape)
    parents = [x] + [b.const(c) for c in consts]
    return b.finish([b.add(kind, parents, attrs)], canonical=False)


def exported_values(bundle, x, approximate=None):
    doc = json.loads(json.dumps(export_torchlean(bundle, None, approximate=approximate), allow_nan=False))
    g, payload = parse_document(doc, strict=True)
    return tlb.evaluate(g, payload, [x], exact=True)[0], doc


EXACT = [  # (kind, attrs, shape, extra constant parents)
    ("neg", {}, (4, 5), ()),
    ("clamp", {"min": 0.0, "max": 6.0}, (4, 5), ()),
    ("clamp", {"min": None, "max": 0.5}, (3, 5), ()),
    ("leaky_relu", {"negative_slope": 0.2}, (4, 5), ()),
    ("leaky_relu", {"negative_slope": 3.0}, (4, 5), ()),
    ("prelu", {}, (2, 3, 4), (np.abs(RNG.standard_normal((2, 3, 4))) * 0.3,)),
    ("slice", {"axes": [1], "starts": [1], "ends": [5], "steps": [2]}, (3, 6), ()),
    ("slice", {"axes": [0, 2], "starts": [1, 0], "ends": [3, 2], "steps": [1, 1]}, (3, 4, 5), ()),
    ("pad", {"pads_before": [0, 2], "pads_after": [1, 0], "value": 0.0}, (3, 4), ()),
    ("pad", {"pads_before": [1, 1], "pads_after": [1, 3], "value": -2.5}, (2, 3), ()),
    ("max_pool_nd", {"spatial_rank": 2, "kernel": [3, 2], "stride": [2, 2], "padding": [1, 0],
                     "padding_after": [0, 1], "dilation": [1, 1], "ceil_mode": True}, (1, 2, 7, 6), ()),
    ("max_pool_nd", {"spatial_rank": 1, "kernel": [2], "stride": [2], "padding": [0], "padding_after": [0],
                     "dilation": [1], "ceil_mode": True}, (2, 3, 7), ()),
    ("reduce_max", {"axes": [1], "keepdim": False}, (3, 4, 5), ()),
    ("reduce_max", {"axes": [0, 2], "keepdim": True}, (3, 4, 5), ()),
    ("reduce_min", {"axes": [2], "keepdim": True}, (3, 4, 5), ()),
    ("pow", {"exponent": 2.0}, (4, 5), ()),
    ("pow", {"exponent": 1.0}, (4, 5), ()),
    ("pow", {"exponent": 0.0}, (4, 5), ()),
]

ROUNDED = [
    ("div", {}, (4, 5), (RNG.uniform(0.5, 3.0, (4, 5)),)),
    ("rsqrt", {}, (4, 5), ()),
    ("silu", {}, (4, 5), ()),
    ("hardsigmoid", {"alpha": 0.2, "beta": 0.5}, (4, 5), ()),
    ("hardswish", {}, (4, 5), ()),
    ("elu", {"alpha": 0.7}, (4, 5), ()),
    ("selu", {}, (4, 5), ()),
    ("celu", {"alpha": 1.3}, (4, 5), ()),
    ("softsign", {}, (4, 5), ()),
    ("mish", {}, (4, 5), ()),
    ("expm1", {}, (4, 5), ()),
    ("tan", {}, (4, 5), ()),
    ("sinh", {}, (4, 5), ()),
    ("cosh", {}, (4, 5), ()),
    ("exp2", {}, (4, 5), ()),
    ("pow", {"exponent": 3.0}, (4, 5), ()),
    ("pow", {"exponent": -2.0}, (4, 5), ()),
    ("pow", {"exponent": 0.5}, (4, 5), ()),
    ("gelu", {"approximate": "tanh"}, (4, 5), ()),
    ("log_softmax", {"axis": 1}, (3, 6, 2), ()),
    ("cumsum", {"axis": 1, "exclusive": False, "reverse": False}, (3, 6), ()),
    ("cumsum", {"axis": 0, "exclusive": True, "reverse": True}, (5, 2), ()),
]


def _input_for(kind, shape):
    x = _x(shape)
    if kind in ("rsqrt", "log1p", "log2") or (kind == "pow" and x is not None):
        x = np.abs(x) + 0.25 if kind != "pow" else x
    if kind == "pow":
        x = np.where(x == 0, 0.75, x)  # 0 ** -2 is refused by the evaluator
    if kind == "tan":
        x = np.clip(x, -1.4, 1.4)
    return x


@pytest.mark.parametrize("kind, attrs, shape, consts", EXACT, ids=lambda v: v if isinstance(v, str) else None)
def test_exact_forms_agree_bit_for_bit(kind, attrs, shape, consts):
    b = one_op(kind, attrs, shape, consts)
    x = _input_for(kind, shape)
    ours = tlb.evaluate(b.graph, b.payload, [x])[0]
    theirs, doc = exported_values(b, x)
    np.testing.assert_array_equal(theirs, ours)
    assert [r["kind"] for r in doc["torchlean_bridge"]["rewrites"]] == [kind]


@pytest.mark.parametrize("kind, attrs, shape, consts", ROUNDED, ids=lambda v: v if isinstance(v, str) else None)
def test_rounding_forms_agree_within_a_few_ulps(kind, attrs, shape, consts):
    if kind == "pow" and attrs["exponent"] == 0.5:
        x = np.abs(_x(shape)) + 0.1
    else:
        x = _input_for(kind, shape)
    b = one_op(kind, attrs, shape, consts)
    ours = tlb.evaluate(b.graph, b.payload, [x])[0]
    theirs, doc = exported_values(b, x)
    np.testing.assert_allclose(theirs, ours, rtol=1e-13, atol=1e-15)
    (rewrite,) = doc["torchlean_bridge"]["rewrites"]
    assert rewrite["kind"] == kind and rewrite["deviation"] == V1_FORMS[kind].deviation


def test_every_listed_form_is_tested():
    tested = {k for k, *_ in EXACT + ROUNDED} | {"where", "gather", "log1p", "log2", "avg_pool_nd", "conv_transpose", "resize_linear"}
    assert set(V1_FORMS) <= tested, set(V1_FORMS) - tested


@pytest.mark.parametrize("kind", ["log1p", "log2"])
def test_log_forms_on_their_domain(kind):
    x = np.abs(_x((4, 5))) + 0.01
    b = one_op(kind, {}, (4, 5))
    np.testing.assert_allclose(exported_values(b, x)[0], tlb.evaluate(b.graph, b.payload, [x])[0], rtol=1e-13)


def test_gather_by_constant_indices_is_a_selection():
    b = GraphBuilder("test")
    x = b.input((5, 3))
    idx = b.const(np.array([[4, 0], [-1, 2]], dtype=np.int64))
    bundle = b.finish([b.add("gather", [x, idx], {"axis": 0})], canonical=False)
    data = _x((5, 3))
    theirs, _ = exported_values(bundle, data)
    np.testing.assert_array_equal(theirs, tlb.evaluate(bundle.graph, bundle.payload, [data])[0])


def test_a_constant_mask_where_is_exact_after_softmax_and_states_the_lowest_float():
    b = GraphBuilder("test")
    x = b.input((2, 4, 4))
    mask = b.broadcast(b.const(np.tril(np.ones((4, 4), dtype=bool))), (2, 4, 4))
    fill = b.broadcast(b.const(np.array(-np.inf)), (2, 4, 4))
    scores = b.add("where", [mask, x, fill])
    bundle = b.finish([b.add("softmax", [scores], {"axis": 2})], canonical=False)
    data = _x((2, 4, 4))
    theirs, doc = exported_values(bundle, data)
    # both in the exact mode: the rewrite is what is compared (the default mode's softmax may round
    # differently by an ulp, on about a third of random inputs, whichever graph it runs)
    np.testing.assert_array_equal(theirs, tlb.evaluate(bundle.graph, bundle.payload, [data], exact=True)[0])
    assert "-1.797e308" in doc["torchlean_bridge"]["rewrites"][0]["deviation"]
    kinds = {n["kind"] for n in doc["nodes"]}
    assert "where" not in kinds and all(n.get("kind") != "const" or -np.inf not in n.get("values", [])
                                        for n in doc["nodes"])


def test_what_has_no_form_is_refused_with_the_option_that_would_export_it():
    gelu = one_op("gelu", {"approximate": "none"}, (3, 4))
    (item,) = torchlean_blocking_nodes(gelu)
    assert item["kind"] == "gelu" and "--approximate gelu=tanh" in item["reason"]
    x = _x((3, 4))
    approx, doc = exported_values(gelu, x, approximate={"gelu": "tanh"})
    np.testing.assert_allclose(approx, tlb.evaluate(gelu.graph, gelu.payload, [x])[0], atol=1e-3)
    assert doc["torchlean_bridge"]["rewrites"][0]["approximation"] == "tanh"
    (item,) = torchlean_blocking_nodes(one_op("pow", {"exponent": 1.5}, (3, 4)))
    assert "pow with exponent 1.5 has no exact v1 form" in item["reason"]
    b = GraphBuilder("test")
    x = b.input((3,))
    cond = b.add("gt", [x, b.const(np.zeros(3))])
    where = one = b.add("where", [cond, x, b.const(np.ones(3))])
    reasons = {i["kind"]: i["reason"] for i in torchlean_blocking_nodes(b.finish([where], canonical=False))}
    assert reasons["where"].startswith("where over a computed condition") and "gt" in reasons
    del one


def test_an_unknown_approximation_is_refused():
    with pytest.raises(tlb.BridgeError, match="no approximation gelu=cubic"):
        export_torchlean(one_op("gelu", {"approximate": "none"}, (2,)), None, approximate={"gelu": "cubic"})


AVG_POOLS = [
    {"kernel_size": 3, "stride": 2, "padding": 1, "count_include_pad": False, "ceil_mode": True},
    {"kernel_size": 2, "stride": 2, "padding": 0, "ceil_mode": True},
    {"kernel_size": (3, 2), "stride": (1, 2), "padding": (1, 1), "count_include_pad": True},
]
CONV_TRANSPOSES = [
    ("ConvTranspose2d", dict(in_channels=4, out_channels=6, kernel_size=3, stride=2, padding=1,
                                           output_padding=1), (1, 4, 5, 6)),
    ("ConvTranspose2d", dict(in_channels=4, out_channels=2, kernel_size=2, stride=2, groups=2), (2, 4, 3, 3)),
    ("ConvTranspose1d", dict(in_channels=3, out_channels=5, kernel_size=4, stride=3, padding=2, dilation=2), (2, 3, 7)),
    ("ConvTranspose3d", dict(in_channels=2, out_channels=2, kernel_size=2, stride=(1, 2, 2)), (1, 2, 3, 4, 4)),
]


def _via_torch(module, shape):
    import torch
    torch.manual_seed(0)
    x = torch.randn(*shape)
    b = tlb.import_export(module.eval(), (x,))
    return b, x.double().numpy(), module.double()(x.double()).detach().numpy()


@pytest.mark.parametrize("params", AVG_POOLS)
def test_average_pools_with_their_divisors(params):
    import torch
    b, x, expected = _via_torch(torch.nn.AvgPool2d(**params), (2, 3, 7, 6))
    theirs, doc = exported_values(b, x)
    np.testing.assert_allclose(theirs, tlb.evaluate(b.graph, b.payload, [x])[0], rtol=1e-14)
    np.testing.assert_allclose(theirs, expected, rtol=1e-12)


@pytest.mark.parametrize("name, params, shape", CONV_TRANSPOSES)
def test_transposed_convolutions_as_v1_convs(name, params, shape):
    import torch
    b, x, expected = _via_torch(getattr(torch.nn, name)(**params), shape)
    theirs, doc = exported_values(b, x)
    assert [r["kind"] for r in doc["torchlean_bridge"]["rewrites"]] == ["conv_transpose"]
    np.testing.assert_allclose(theirs, tlb.evaluate(b.graph, b.payload, [x])[0], rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(theirs, expected, rtol=1e-10, atol=1e-12)


def test_the_docs_tables_are_current():
    import importlib.util
    from tests.conftest import ROOT
    spec = importlib.util.spec_from_file_location("make_md", ROOT / "docs" / "make_torchlean_export_md.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    render = module.render
    text = (ROOT / "docs" / "torchlean-export.md").read_text()
    assert render(text) == text, "run python docs/make_torchlean_export_md.py"
    assert all(f"| `{kind}` |" in text for kind in V1_FORMS)


@pytest.mark.parametrize("mode", ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"])
@pytest.mark.parametrize("sizes", [(9, 4), (3, 14), (5, 5)])
def test_linear_resizes_are_bit_identical(mode, sizes):
    b = one_op("resize_linear", {"spatial_rank": 2, "sizes": list(sizes), "coordinate_mode": mode}, (2, 3, 5, 7))
    x = _x((2, 3, 5, 7))
    theirs, _ = exported_values(b, x)
    np.testing.assert_array_equal(theirs, tlb.evaluate(b.graph, b.payload, [x], exact=True)[0])


def test_an_approximation_is_used_only_where_no_exact_form_applies():
    b = GraphBuilder("test")
    x = b.input((3, 4))
    exact = b.add("gelu", [x], {"approximate": "tanh"})
    erf = b.add("gelu", [exact], {"approximate": "none"})
    _, doc = exported_values(b.finish([erf], canonical=False), _x((3, 4)), approximate={"gelu": "sigmoid"})
    assert [r["approximation"] for r in doc["torchlean_bridge"]["rewrites"]] == [None, "sigmoid"]


def test_a_rewritten_node_no_output_reads_is_dropped_not_a_crash():
    b = GraphBuilder("test")
    x = b.input((3,))
    b.add("neg", [x])  # dead: nothing reads it
    bundle = b.finish([b.add("relu", [x])], canonical=False, keep_dead=True)
    doc = export_torchlean(bundle, None)
    assert [n["kind"] for n in doc["nodes"]] == ["input", "relu"]
    assert doc["torchlean_bridge"]["rewrites"][0]["now"] is None


def test_a_form_whose_constant_matrix_would_be_too_large_is_refused_by_name():
    from torchlean_bridge.passes import v1_forms
    b = one_op("slice", {"axes": [1], "starts": [1], "ends": [4000], "steps": [1]}, (2, 5000))
    (item,) = torchlean_blocking_nodes(b)
    assert item["kind"] == "slice" and "4999 x 5000" not in item["reason"]  # sized before it is built
    assert item["reason"] == (f"selecting 3999 of 5000 entries on axis 1 would need a 5000 x 3999 constant matrix "
                              f"({5000 * 3999} entries, above the limit of {v1_forms.MATRIX_LIMIT})")


@pytest.mark.parametrize("kind, attrs", [("pad", {"pads_before": [1], "pads_after": [0], "value": float("nan")}),
                                         ("clamp", {"min": float("nan"), "max": None})])
def test_a_form_that_would_need_a_nan_constant_is_refused(kind, attrs):
    (item,) = torchlean_blocking_nodes(one_op(kind, attrs, (3,)))
    assert item["kind"] == kind and "which torchlean.ir.v1's JSON cannot spell" in item["reason"]
