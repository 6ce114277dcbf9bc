"""The decompositions the importers share (importers/decompositions.py): einsum in every form the
spec allows, and group/instance normalization. Each is checked against numpy/torch/onnxruntime, and
the torch and ONNX spellings of one computation must give the same kinds (one decomposition)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import torchlean_bridge as tlb

torch = pytest.importorskip("torch")

# (equation, operand shapes): diagonals, traces, ellipses with broadcasting, implicit outputs,
# several operands, upper-case letters, outer products and plain contractions
EQUATIONS = [
    ("ii->", [(4, 4)]), ("ii->i", [(3, 3)]), ("ii", [(5, 5)]), ("bii->bi", [(2, 3, 3)]),
    ("iii->i", [(3, 3, 3)]), ("iij->ji", [(2, 2, 4)]), ("ijji->ij", [(2, 3, 3, 2)]),
    ("ii,i->i", [(3, 3), (3,)]), ("ij,jj->i", [(2, 3), (3, 3)]),
    ("...ij,...jk->...ik", [(2, 1, 3, 4), (5, 4, 6)]), ("...ij,...jk", [(3, 2, 4), (3, 4, 5)]),
    ("...i,i->...", [(2, 3, 4), (4,)]), ("i...->...", [(3, 2, 2)]), ("...ii->...i", [(2, 3, 3)]),
    ("ij...,jk...->ik...", [(2, 3, 4), (3, 5, 1)]), ("...", [(2, 3)]),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]), ("a,b,c->abc", [(2,), (3,), (4,)]),
    ("ab,bc,cd,de->ae", [(2, 3), (3, 2), (2, 4), (4, 2)]), ("bi,bj,bk->b", [(2, 3), (2, 4), (2, 5)]),
    ("Ab,bC->AC", [(2, 3), (3, 4)]), ("aB,Ba", [(3, 4), (4, 3)]), ("i,j->ij", [(3,), (4,)]),
    ("ij->", [(3, 4)]), ("ab,ab->ab", [(2, 3), (2, 3)]), ("bij,bjk", [(2, 3, 4), (2, 4, 5)]),
    ("ji,kj->ik", [(3, 2), (4, 3)]), ("i,i", [(6,), (6,)]), ("ijk,ikj->i", [(2, 3, 4), (2, 4, 3)]),
]


def _rng_arrays(shapes, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s) for s in shapes]


def _onnx_einsum(equation, shapes, dtype=TensorProto.DOUBLE):
    names = [f"x{i}" for i in range(len(shapes))]
    g = helper.make_graph([helper.make_node("Einsum", names, ["y"], equation=equation)], "g",
                          [helper.make_tensor_value_info(n, dtype, s) for n, s in zip(names, shapes)],
                          [helper.make_tensor_value_info("y", dtype, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m


def _Einsum(equation, arity):
    """A module computing ``torch.einsum(equation, ...)`` with ``arity`` named inputs (fx cannot
    trace ``*args``)."""
    names = ", ".join(f"x{i}" for i in range(arity))
    namespace = {"torch": torch}
    exec(f"def forward(self, {names}):\n    return torch.einsum({equation!r}, {names})", namespace)
    return type("Einsum", (torch.nn.Module,), {"forward": namespace["forward"]})().eval()


@pytest.mark.parametrize("equation, shapes", EQUATIONS)
def test_onnx_einsum_agrees_with_numpy_exactly_in_structure(equation, shapes):
    xs = _rng_arrays(shapes)
    b = tlb.import_onnx(_onnx_einsum(equation, shapes))
    got = tlb.evaluate(b.graph, b.payload, xs)[0]
    want = np.einsum(equation, *xs)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("equation, shapes", EQUATIONS)
def test_torch_einsum_agrees_with_torch_and_gives_the_onnx_kinds(equation, shapes):
    xs = [torch.from_numpy(x) for x in _rng_arrays(shapes, seed=1)]
    fx = tlb.import_fx(_Einsum(equation, len(shapes)), tuple(xs))
    got = tlb.evaluate(fx.graph, fx.payload, [x.numpy() for x in xs])[0]
    np.testing.assert_allclose(got, torch.einsum(equation, *xs).numpy(), rtol=1e-12, atol=1e-12)
    onnx_kinds = Counter(n.kind for n in tlb.import_onnx(_onnx_einsum(equation, shapes)).graph)
    assert Counter(n.kind for n in fx.graph) == onnx_kinds


def test_einsum_diagonal_is_exact_on_infinities_and_nan():
    """A diagonal is a strided slice, not a product with an identity mask: inf and NaN off the
    diagonal never leak into it."""
    x = np.array([[1.0, np.inf, np.nan], [-np.inf, 2.0, np.nan], [np.nan, np.inf, -0.0]])
    b = tlb.import_onnx(_onnx_einsum("ii->i", [(3, 3)]))
    got = tlb.evaluate(b.graph, b.payload, [x])[0]
    np.testing.assert_array_equal(got, [1.0, 2.0, -0.0])
    assert np.signbit(got[2])


@pytest.mark.parametrize("equation, shapes", [e for e in EQUATIONS if len(e[1]) <= 2][:12])
def test_einsum_interval_bounds_enclose_samples(equation, shapes):
    b = tlb.import_onnx(_onnx_einsum(equation, shapes))
    rng = np.random.default_rng(3)
    centers = _rng_arrays(shapes, seed=2)
    lows, highs = [c - 0.25 for c in centers], [c + 0.25 for c in centers]
    lo, hi = tlb.interval_bounds(b.graph, b.payload, lows, highs, all_nodes=False)[0]
    for _ in range(20):
        xs = [rng.uniform(low, high) for low, high in zip(lows, highs)]
        y = np.einsum(equation, *xs)
        assert np.all(lo <= y) and np.all(y <= hi)


@pytest.mark.parametrize("equation, shapes, message", [
    ("ij,jk->ik", [(2, 3), (4, 5)], "index j has extents 3 and 4"),
    ("ij->k", [(2, 3)], "output letter(s) k occur in no term"),
    ("ij,jk->ii", [(2, 3), (3, 4)], "the output repeats a letter"),
    ("ii->i", [(2, 3)], "index i has extents 2 and 3"),
    ("ijk->i", [(2, 3)], "term `ijk` does not match an operand of rank 2"),
])
def test_einsum_refusals_name_the_reason(equation, shapes, message):
    """(torch rejects these equations itself before the importer sees them.)"""
    with pytest.raises(tlb.BridgeError) as e:
        tlb.import_onnx(_onnx_einsum(equation, shapes))
    assert message in str(e.value)


def _onnx_norm(op, shape, groups=None):
    c = shape[1]
    rng = np.random.default_rng(4)
    scale, bias = rng.standard_normal(c), rng.standard_normal(c)
    attrs = {"epsilon": 1e-5, **({"num_groups": groups} if groups else {})}
    g = helper.make_graph([helper.make_node(op, ["x", "s", "b"], ["y"], **attrs)], "g",
                          [helper.make_tensor_value_info("x", TensorProto.DOUBLE, shape)],
                          [helper.make_tensor_value_info("y", TensorProto.DOUBLE, None)],
                          [onnx.numpy_helper.from_array(scale, "s"), onnx.numpy_helper.from_array(bias, "b")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    m.ir_version = 10
    return m, scale, bias


@pytest.mark.parametrize("shape, groups", [((2, 6, 5), 3), ((2, 4, 3, 3), 2), ((1, 4, 2, 2, 2), 4), ((3, 6, 4), 1)])
def test_group_norm_onnx_and_torch_agree_kind_for_kind(shape, groups):
    m, scale, bias = _onnx_norm("GroupNormalization", shape, groups)
    x = np.random.default_rng(5).standard_normal(shape)
    ob = tlb.import_onnx(m)
    gn = torch.nn.GroupNorm(groups, shape[1]).double()
    with torch.no_grad():
        gn.weight.copy_(torch.from_numpy(scale))
        gn.bias.copy_(torch.from_numpy(bias))
    tb = tlb.import_fx(gn.eval(), (torch.from_numpy(x),))
    want = gn(torch.from_numpy(x)).detach().numpy()
    for b in (ob, tb):
        np.testing.assert_allclose(tlb.evaluate(b.graph, b.payload, [x])[0], want, rtol=1e-10, atol=1e-12)
    assert Counter(n.kind for n in ob.graph) == Counter(n.kind for n in tb.graph)


@pytest.mark.parametrize("shape", [(2, 3, 5), (2, 4, 3, 3), (1, 2, 2, 3, 2)])
def test_instance_norm_onnx_and_torch_agree_kind_for_kind(shape):
    m, scale, bias = _onnx_norm("InstanceNormalization", shape)
    x = np.random.default_rng(6).standard_normal(shape)
    ob = tlb.import_onnx(m)
    inorm = getattr(torch.nn, f"InstanceNorm{len(shape) - 2}d")(shape[1], affine=True).double()
    with torch.no_grad():
        inorm.weight.copy_(torch.from_numpy(scale))
        inorm.bias.copy_(torch.from_numpy(bias))
    tb = tlb.import_fx(inorm.eval(), (torch.from_numpy(x),))
    want = inorm(torch.from_numpy(x)).detach().numpy()
    for b in (ob, tb):
        np.testing.assert_allclose(tlb.evaluate(b.graph, b.payload, [x])[0], want, rtol=1e-10, atol=1e-12)
    assert Counter(n.kind for n in ob.graph) == Counter(n.kind for n in tb.graph)
    assert "reshape" not in {n.kind for n in tb.graph}  # one group per channel: one layernorm, no reshapes


def test_group_norm_refuses_groups_that_do_not_divide_the_channels():
    m, _, _ = _onnx_norm("GroupNormalization", (2, 6, 4), 4)
    with pytest.raises(tlb.BridgeError, match=r"4 groups of an input shaped \[2, 6, 4\]"):
        tlb.import_onnx(m)
