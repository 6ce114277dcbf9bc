"""The v1 kinds against an independent scalar emulation of TorchLean's definitions
(tests/torchlean_emulation.py): the exact float64 mode bit for bit, the default mode within its
stated budget, on hypothesis-drawn random graphs over every v1 kind; and the seven v1 fixes."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import torchlean_bridge as tlb
from semantics.evaluate import eval_node
from torchlean_bridge.errors import EvalError
from torchlean_bridge.graph import Graph, Node
from torchlean_bridge.ops import REGISTRY
from torchlean_bridge.payload import Payload

import torchlean_emulation as emu

U = 2.0 ** -53
TINY = 2.0 ** -1074
SETTINGS = settings(max_examples=40, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
BUDGET_SETTINGS = settings(SETTINGS, max_examples=25)

ELEMENTWISE = ["abs", "sqrt", "inv", "relu", "tanh", "sigmoid", "exp", "log", "sin", "cos", "softplus", "detach"]
BINARY = ["add", "sub", "mul_elem", "max_elem", "min_elem"]
KINDS = (ELEMENTWISE + BINARY + ["safe_log", "const", "permute", "transpose", "broadcast_to", "reshape", "flatten",
                                 "concat", "sum", "reduce_sum", "reduce_mean", "reduce_sum_axes", "reduce_mean_axes",
                                 "matmul", "linear", "conv", "max_pool", "avg_pool", "batch_norm_eval", "softmax",
                                 "hard_masked_softmax", "layernorm", "mse_loss", "rand_uniform", "bernoulli_mask"])
NOT_GENERATED = {"input", "custom"}  # input starts every graph; custom has no body to run


def test_the_generator_covers_every_v1_kind():
    v1 = {k for k, s in REGISTRY.items() if s.dialect in ("v1", "v1-wire")}
    assert v1 - NOT_GENERATED == set(KINDS)


SPECIAL = [0.0, -0.0, 1.0, -1.0, 0.5, 1e-300, -1e-300, 5e-324, 1e300, -745.5, 710.0, -40.0, math.inf, -math.inf,
           math.nan]
FLOATS = st.one_of(st.floats(-4, 4), st.floats(-4, 4), st.floats(-60, 60), st.sampled_from(SPECIAL))


def _values(draw, shape, elements=FLOATS) -> np.ndarray:
    n = math.prod(shape)
    return np.array(draw(st.lists(elements, min_size=n, max_size=n)), dtype=np.float64).reshape(shape)


class _Graph:
    def __init__(self) -> None:
        self.nodes: list[Node] = []
        self.records: dict[int, dict] = {}

    def add(self, parents, kind, shape, attrs=None, record=None) -> int:
        nid = len(self.nodes)
        self.nodes.append(Node(nid, list(parents), kind, tuple(shape), attrs or {}))
        if record:
            self.records[nid] = record
        return nid

    def const(self, draw, shape, elements=FLOATS) -> int:
        return self.add([], "const", shape, {"value_shape": list(shape)}, {"values": _values(draw, shape, elements)})


MODERATE = st.floats(-3, 3)


def _random_prefix(data) -> tuple["_Graph", np.ndarray]:
    """An input of a drawn shape (and its drawn value) followed by up to three random v1 nodes."""
    g = _Graph()
    shape = tuple(data.draw(st.lists(st.integers(1, 4), min_size=0, max_size=4)))
    g.add([], "input", shape)
    x = _values(data.draw, shape)
    for _ in range(data.draw(st.integers(0, 3))):
        _grow(data.draw, g, data.draw(st.sampled_from(KINDS)))
    return g, x


def _grow(draw, g: _Graph, kind: str) -> None:
    """Append ``kind`` fed by a random earlier float node (and whatever operands it needs)."""
    x = draw(st.integers(0, len(g.nodes) - 1))
    s = g.nodes[x].out_shape
    r = len(s)
    if kind in ELEMENTWISE:
        g.add([x], kind, s)
    elif kind in BINARY:
        same = [n.id for n in g.nodes if n.out_shape == s]
        g.add([x, draw(st.sampled_from(same))], kind, s)
    elif kind == "safe_log":
        eps = g.const(draw, (), st.floats(0.1, 2))
        g.add([x, eps], kind, s)
    elif kind == "const":
        g.const(draw, s)
    elif kind == "permute":
        perm = draw(st.permutations(range(r)))
        g.add([x], kind, [s[p] for p in perm], {"perm": list(perm)})
    elif kind == "transpose" and r:
        a1, a2 = draw(st.integers(0, r - 1)), draw(st.integers(0, r - 1))
        t = list(s)
        t[a1], t[a2] = t[a2], t[a1]
        g.add([x], kind, t, {"axis1": a1, "axis2": a2})
    elif kind == "broadcast_to":
        to = [draw(st.integers(1, 3)) if e == 1 else e for e in s]
        to = [draw(st.integers(1, 2))] + to if draw(st.booleans()) else to
        g.add([x], kind, to, {"from_shape": list(s), "to_shape": to})
    elif kind == "reshape":
        to = [math.prod(s)] if draw(st.booleans()) else [1] + list(s)
        g.add([x], kind, to, {"in_shape": list(s), "out_shape": to})
    elif kind == "flatten":
        g.add([x], kind, [max(math.prod(s), 1)] if r else [1], {"value_shape": list(s)})
    elif kind == "concat" and r:
        axis = draw(st.integers(0, r - 1))
        same = [n.id for n in g.nodes if n.out_shape == s]
        t = list(s)
        t[axis] *= 2
        g.add([x, draw(st.sampled_from(same))], kind, t, {"axis": axis})
    elif kind == "sum":
        g.add([x], kind, ())
    elif kind in ("reduce_sum", "reduce_mean") and r:
        axis = draw(st.integers(0, r - 1))
        g.add([x], kind, s[:axis] + s[axis + 1:], {"axis": axis})
    elif kind in ("reduce_sum_axes", "reduce_mean_axes") and r:
        axes = sorted(draw(st.sets(st.integers(0, r - 1), min_size=1)))
        keep = draw(st.booleans())
        out = [1 if i in axes else e for i, e in enumerate(s)] if keep else [e for i, e in enumerate(s) if i not in axes]
        g.add([x], kind, out, {"axes": axes, "keepdim": keep})
    elif kind == "matmul" and r:
        n, p = s[-1], draw(st.integers(1, 3))
        right_shape = (n,) if draw(st.booleans()) else (n, p)
        w = g.const(draw, right_shape, MODERATE)
        out = s[:-1] + right_shape[1:]
        if r == 1 and len(right_shape) == 1:
            out = ()
        g.add([x, w], kind, out)
    elif kind == "linear" and r:
        out_dim = draw(st.integers(1, 4))
        rec = {"weight": _values(draw, (out_dim, s[-1]), MODERATE), "bias": _values(draw, (out_dim,), MODERATE)}
        g.add([x], kind, s[:-1] + (out_dim,), record=rec)
    elif kind == "conv" and r >= 2:
        sr = draw(st.integers(1, min(2, r - 1)))
        ca = r - sr - 1
        cin = s[ca]
        groups = draw(st.sampled_from([d for d in range(1, cin + 1) if cin % d == 0]))
        cout = groups * draw(st.integers(1, 2))
        kernel, stride, dil, pb, pa, out_sp = [], [], [], [], [], []
        for n in s[ca + 1:]:
            k, d = draw(st.integers(1, 3)), draw(st.integers(1, 2))
            b, a = draw(st.integers(0, 1)), draw(st.integers(0, 1))
            eff = d * (k - 1) + 1
            if n + b + a < eff:
                k, d, eff = 1, 1, 1
            st_ = draw(st.integers(1, 2))
            kernel.append(k), stride.append(st_), dil.append(d), pb.append(b), pa.append(a)
            out_sp.append((n + b + a - eff) // st_ + 1)
        attrs = {"spatial_rank": sr, "kernel": kernel, "stride": stride, "padding": pb, "padding_after": pa,
                 "dilation": dil, "groups": groups, "channel_axis": ca, "in_channels": cin, "out_channels": cout}
        rec = {"weight": _values(draw, (cout, cin // groups, *kernel), MODERATE),
               "bias": _values(draw, (cout,), MODERATE)}
        g.add([x], kind, s[:ca] + (cout,) + tuple(out_sp), attrs, rec)
    elif kind in ("max_pool", "avg_pool") and r >= 1 and all(e > 0 for e in s):
        sr = draw(st.integers(1, min(2, r)))
        kernel, stride, pad, out_sp = [], [], [], []
        for n in s[r - sr:]:
            k = draw(st.integers(1, min(3, n)))
            p = draw(st.integers(0, k // 2))
            st_ = draw(st.integers(1, 2))
            kernel.append(k), stride.append(st_), pad.append(p)
            out_sp.append((n + 2 * p - k) // st_ + 1)
        g.add([x], kind, s[:r - sr] + tuple(out_sp), {"spatial_rank": sr, "kernel": kernel, "stride": stride,
                                                       "padding": pad})
    elif kind == "batch_norm_eval" and r:
        ca = draw(st.integers(0, r - 1))
        c = s[ca]
        rec = {"weight": _values(draw, (c,), MODERATE), "bias": _values(draw, (c,), MODERATE),
               "running_mean": _values(draw, (c,), MODERATE), "running_var": _values(draw, (c,), st.floats(-1, 3))}
        g.add([x], kind, s, {"channel_axis": ca, "channels": c, "eps": 1e-5}, rec)
    elif kind == "softmax" and r:
        g.add([x], kind, s, {"axis": draw(st.integers(0, r - 1))})
    elif kind == "hard_masked_softmax":
        allowed = draw(st.lists(st.booleans(), min_size=math.prod(s), max_size=math.prod(s)))
        g.add([x], kind, s, {"mask_shape": list(s), "allowed": allowed})
    elif kind == "layernorm" and r and all(e > 0 for e in s):
        axis = draw(st.integers(0, r - 1))
        rec = {}
        if draw(st.booleans()):
            rec = {"weight": _values(draw, s[axis:], MODERATE), "bias": _values(draw, s[axis:], MODERATE)}
        g.add([x], kind, s, {"axis": axis, "eps": 1e-5}, rec)
    elif kind == "mse_loss":
        same = [n.id for n in g.nodes if n.out_shape == s]
        g.add([x, draw(st.sampled_from(same))], kind, ())
    elif kind == "rand_uniform":
        g.add([], kind, s, {"seed": draw(st.integers(0, 2 ** 64 - 1))})
    elif kind == "bernoulli_mask":
        q = g.const(draw, (), st.one_of(st.floats(-0.5, 1.5), st.just(math.nan)))
        g.add([q], kind, s, {"seed": draw(st.integers(0, 2 ** 32))})


@st.composite
def random_graphs(draw, kinds=st.sampled_from(KINDS)):
    g = _Graph()
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=0, max_size=4)))
    g.add([], "input", shape)
    x = _values(draw, shape)
    for _ in range(draw(st.integers(1, 6))):
        _grow(draw, g, draw(kinds))
    graph = Graph(g.nodes, inputs=[0], outputs=[len(g.nodes) - 1])
    tlb.check(graph)
    return graph, Payload(g.records), x


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal values with equal signs of zero; NaN matches NaN."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape:
        return False
    both_nan = np.isnan(a) & np.isnan(b)
    return bool(np.all(both_nan | ((a == b) & (np.signbit(a) == np.signbit(b)))))


def _emulated(g, payload, x):
    try:
        return emu.denote_all(g, payload, [x]), None
    except emu.EvalFailure as e:
        return None, e


@pytest.mark.parametrize("kind", KINDS)
def test_exact_mode_is_bit_identical_to_the_emulation(kind):
    """Random graphs whose last node is ``kind`` (and random nodes before it)."""
    def run(g, payload, x):
        emulated, failure = _emulated(g, payload, x)
        if failure is not None:
            with pytest.raises(EvalError, match="log: input contains values <= 0"):
                tlb.evaluate(g, payload, x, all_nodes=True, exact=True)
            return
        ours = tlb.evaluate(g, payload, x, all_nodes=True, exact=True)
        for node, value, (shape, ref) in zip(g.nodes, ours, emulated):
            assert value.shape == shape, (node, value.shape, shape)
            assert same_bits(value.reshape(-1), np.array(ref, np.float64)), (node, value.reshape(-1), ref)

    @SETTINGS
    @given(st.data())
    def check_kind(data):
        g, x = _random_prefix(data)
        before = len(g.nodes)
        for _ in range(4):  # a kind that does not fit the drawn shapes adds nothing; try a few parents
            _grow(data.draw, g, kind)
            if len(g.nodes) > before:
                break
        graph = Graph(g.nodes, inputs=[0], outputs=[len(g.nodes) - 1])
        tlb.check(graph)
        run(graph, Payload(g.records), x)

    check_kind()


# -- the default float64 mode: within its stated budget of the exact mode ---------------------------
# Per node, the default rule is run on the exact mode's parent values and compared with the exact
# value, so the budget is the op's own: bit-identical for ops made of correctly rounded steps;
# 8 ulps (of max(|y|, 1)) for the libm functions (numpy's SIMD exp/log/tanh vs glibc, both within an
# ulp of the truth); for sums of n terms 2 gamma_n sum|terms| (any summation order, Higham 3.1);
# softmax 2 (n + 4) u y; layernorm its first-order error through 1/sd.

BIT_IDENTICAL = {"input", "const", "permute", "transpose", "detach", "rand_uniform", "bernoulli_mask", "add", "sub",
                 "mul_elem", "abs", "sqrt", "inv", "max_elem", "min_elem", "max_pool", "broadcast_to", "relu",
                 "reshape", "flatten", "concat", "batch_norm_eval"}
LIBM = {"exp": 8, "log": 8, "tanh": 8, "sin": 8, "cos": 8, "sigmoid": 8, "softplus": 8, "safe_log": 64}
FOLDS = {"sum", "reduce_sum", "reduce_mean", "reduce_sum_axes", "reduce_mean_axes", "matmul", "linear", "conv",
         "avg_pool", "mse_loss"}


def _terms(node: Node, parents) -> int:
    a = node.attrs
    if node.kind in ("sum", "mse_loss"):
        return max(parents[0].size, 1)
    if node.kind in ("reduce_sum", "reduce_mean"):
        return parents[0].shape[a["axis"]]
    if node.kind.endswith("_axes"):
        return math.prod(parents[0].shape[i] for i in a["axes"])
    if node.kind == "matmul":
        return parents[0].shape[-1]
    if node.kind == "linear":
        return parents[0].shape[-1] + 1
    if node.kind == "conv":
        return a["in_channels"] // a["groups"] * math.prod(a["kernel"]) + 1
    return math.prod(a["kernel"]) + 1  # avg_pool, then the division


def default_budget(node: Node, parents, record, exact: np.ndarray) -> np.ndarray:
    """How far the default float64 value may lie from the exact one, per entry."""
    y = np.abs(exact)
    if node.kind in BIT_IDENTICAL:
        return np.zeros_like(y)
    if node.kind in LIBM:
        return LIBM[node.kind] * np.spacing(np.maximum(y, 1.0))
    if node.kind in FOLDS:
        n = _terms(node, parents)
        g = 2 * n * U / (1 - n * U)
        if node.kind == "mse_loss":
            magnitude = y
        else:  # the same fold over |terms|: |x| and |W|, |b|
            magnitude = np.abs(eval_node(node, [np.abs(p) for p in parents],
                                         {k: np.abs(v) for k, v in record.items()}, exact=True))
        return g * magnitude + 2 * np.spacing(y) + TINY
    if node.kind in ("softmax", "hard_masked_softmax"):
        n = parents[0].shape[node.attrs.get("axis", -1)] if parents[0].ndim else 1
        return 2 * (n + 4) * U * y + TINY
    if node.kind == "layernorm":
        x, ax = parents[0], node.attrs["axis"]
        e = math.prod(x.shape[ax:])
        rows = x.reshape(-1, e)
        with np.errstate(all="ignore"):
            c = rows - rows.mean(axis=1, keepdims=True)
            sd = np.sqrt(np.maximum((c * c).mean(axis=1, keepdims=True), 0) + node.attrs["eps"])
        gamma = np.abs(record["weight"]).max() if record.get("weight") is not None else 1.0
        per_row = 8 * e * U * gamma * (np.abs(rows).max(axis=1, keepdims=True) / sd + math.sqrt(e))
        return (np.broadcast_to(per_row, rows.shape).reshape(x.shape) + 4 * np.spacing(y) + TINY)
    raise AssertionError(f"no budget stated for {node.kind}")


def ulps_apart(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.abs(a - b) / np.spacing(np.maximum(np.abs(b), TINY))


@pytest.mark.parametrize("kind", KINDS)
def test_default_mode_stays_within_its_budget_of_the_exact_mode(kind):
    @BUDGET_SETTINGS
    @given(st.data())
    def check(data):
        g, x = _random_prefix(data)
        before = len(g.nodes)
        for _ in range(4):
            _grow(data.draw, g, kind)
            if len(g.nodes) > before:
                break
        graph, payload = Graph(g.nodes, inputs=[0], outputs=[len(g.nodes) - 1]), Payload(g.records)
        tlb.check(graph)
        try:
            exact = tlb.evaluate(graph, payload, x, all_nodes=True, exact=True)
        except EvalError:
            return  # log of a non-positive value: both modes refuse (the exact test checks the message)
        default_table = tlb.evaluate(graph, payload, x, all_nodes=True)
        for node in graph.nodes:
            parents = [exact[p] for p in node.parents]
            record = payload.record(node.id)
            if node.kind in ("rand_uniform", "bernoulli_mask", "input"):
                value = default_table[node.id]  # the stream index comes from the whole graph
            else:
                value = eval_node(node, parents, record)
            e = exact[node.id]
            nan = np.isnan(e) | np.isnan(value)
            assert np.array_equal(np.isnan(e), np.isnan(value)), node
            with np.errstate(invalid="ignore"):
                infinite = np.isinf(e) | np.isinf(value)
                assert np.all(np.where(infinite & ~nan, value == e, True)), node
                budget = default_budget(node, parents, record, e)
                ok = nan | infinite | (np.abs(value - e) <= budget)
            assert np.all(ok), (node, value, e, budget, ulps_apart(value, e))
            if node.kind in BIT_IDENTICAL:
                assert same_bits(value, e), node

    check()


# -- the seven v1 fixes (issue 20), default mode, each against the emulation ----------------------


def _unary(kind: str, x: np.ndarray) -> tuple[Graph, np.ndarray]:
    return Graph([Node(0, [], "input", x.shape), Node(1, [0], kind, x.shape)]), x


def _emulate(g: Graph, x: np.ndarray, payload: Payload | None = None) -> np.ndarray:
    shape, values = emu.denote_all(g, payload, [x])[-1]
    return np.array(values, np.float64).reshape(shape)


def test_sigmoid_has_torchleans_two_branches():
    x = np.concatenate([np.linspace(-40, 0, 2001), [-709.0, -720.0, -745.0, -746.0, 30.0, -0.0, np.nan]])
    g, x = _unary("sigmoid", x)
    ours, ref = tlb.evaluate(g, None, x)[0], _emulate(g, x)
    assert np.all(ulps_apart(ours[:-1], ref[:-1]) <= 2) and np.isnan(ours[-1])
    assert ours[2001 + 1] > 0 and ours[2001 + 1] == pytest.approx(math.exp(-720.0), rel=1e-15)  # a subnormal, not 0
    assert same_bits(tlb.evaluate(g, None, x, exact=True)[0], ref)


def test_sqrt_clips_below_zero_instead_of_failing():
    g, x = _unary("sqrt", np.array([-4.0, -0.0, 0.0, 2.0, np.nan, -np.inf]))
    ours = tlb.evaluate(g, None, x)[0]
    assert same_bits(ours, _emulate(g, x)) and ours.tolist()[:3] == [0.0, 0.0, 0.0] and not np.signbit(ours[1])


def test_max_min_relu_and_max_pool_follow_leans_order_with_nan_and_signed_zeros():
    a = np.array([1.0, np.nan, 0.0, -0.0, np.nan])
    b = np.array([np.nan, 1.0, -0.0, 0.0, np.nan])
    for kind, want in (("max_elem", [1.0, np.nan, -0.0, 0.0, np.nan]), ("min_elem", [np.nan, 1.0, 0.0, -0.0, np.nan])):
        g = Graph([Node(0, [], "input", (5,)), Node(1, [], "input", (5,)), Node(2, [0, 1], kind, (5,))])
        ours = tlb.evaluate(g, None, [a, b])[0]
        ref = np.array(emu.denote_all(g, None, [a, b])[-1][1])
        assert same_bits(ours, ref) and same_bits(ours, np.array(want)), kind
    g, x = _unary("relu", np.array([-0.0, np.nan, -1.0, 2.0]))
    assert same_bits(tlb.evaluate(g, None, x)[0], np.array([0.0, np.nan, 0.0, 2.0]))
    x = np.array([[1.0, np.nan, 3.0, np.nan], [np.nan, 5.0, -0.0, 0.0]])
    g = Graph([Node(0, [], "input", (2, 4)),
               Node(1, [0], "max_pool", (2, 2), {"spatial_rank": 1, "kernel": [2], "stride": [2], "padding": [0]})])
    ours = tlb.evaluate(g, None, x)[0]
    assert same_bits(ours, _emulate(g, x)) and same_bits(ours, np.array([[1.0, 3.0], [np.nan, -0.0]]))


def test_layernorm_variance_is_two_pass_over_the_centred_row():
    rng = np.random.default_rng(0)
    x = 1e4 + rng.standard_normal((1, 768))
    g = Graph([Node(0, [], "input", x.shape), Node(1, [0], "layernorm", x.shape, {"axis": 1, "eps": 1e-5})])
    ref = _emulate(g, x)
    assert same_bits(tlb.evaluate(g, None, x, exact=True)[0], ref)
    default = tlb.evaluate(g, None, x)[0]
    assert np.all(np.abs(default - ref) <= default_budget(g.nodes[1], [x], {}, ref))
    # the emulated one-pass variance (TorchLean's orders otherwise) is not TorchLean's value
    row = x[0].tolist()
    mean = emu.fold_sum(row) / 768
    c = [t - mean for t in row]
    sd = math.sqrt(emu.fold_sum([t * t for t in c]) / 768 + 1e-5)
    assert not same_bits(np.array([t / sd for t in c]), ref[0])


def test_bernoulli_mask_with_a_nan_keep_probability_is_all_zeros():
    g = Graph([Node(0, [], "input", ()), Node(1, [0], "bernoulli_mask", (3, 2), {"seed": 7})])
    for q in (math.nan, -0.5, 0.0, 0.3, 1.0, 2.0):
        ours = tlb.evaluate(g, None, np.array(q))[0]
        assert same_bits(ours, _emulate(g, np.array(q))), q
    assert tlb.evaluate(g, None, np.array(math.nan))[0].tolist() == [[0.0, 0.0]] * 3


def test_random_streams_are_keyed_by_the_lowered_node_index():
    """A two-axis reduction with keepdim lowers to 4 TorchLean nodes: the later draws use id + 3."""
    g = Graph([Node(0, [], "input", (2, 3)),
               Node(1, [0], "reduce_sum_axes", (1, 1), {"axes": [0, 1], "keepdim": True}),
               Node(2, [], "rand_uniform", (4,), {"seed": 11})], inputs=[0], outputs=[1, 2])
    x = np.ones((2, 3))
    ours = tlb.evaluate(g, None, x, all_nodes=True)[2]
    assert same_bits(ours, _emulate(g, x)) and ours.tolist() == emu.uniform(11, 5, 4)
    assert same_bits(tlb.prepare(g, None).evaluate(x, all_nodes=True)[2], ours)


def test_safe_log_with_eps_at_or_below_zero_computes_and_hard_mask_on_a_scalar_works():
    g = Graph([Node(0, [], "input", (3,)), Node(1, [], "input", ()), Node(2, [0, 1], "safe_log", (3,))])
    x = np.array([-800.0, 0.0, 5.0])
    for eps in (0.0, -1.0):
        ours = tlb.evaluate(g, None, [x, np.array(eps)])[0]
        ref = np.array(emu.denote_all(g, None, [x, np.array(eps)])[-1][1])
        with np.errstate(invalid="ignore"):
            close = (ours == ref) | (ulps_apart(ours, ref) <= 64)
        assert np.array_equal(np.isnan(ours), np.isnan(ref)) and np.all(close[~np.isnan(ref)])
    assert np.isneginf(tlb.evaluate(g, None, [x, np.array(0.0)])[0][0])
    for allowed in (True, False):
        g = Graph([Node(0, [], "input", ()),
                   Node(1, [0], "hard_masked_softmax", (), {"mask_shape": [], "allowed": [allowed]})])
        for exact in (False, True):
            assert tlb.evaluate(g, None, np.array(3.0), exact=exact)[0].tolist() == (1.0 if allowed else 0.0)


def test_exact_mode_uses_the_c_library_where_numpy_differs():
    """numpy's SIMD exp and tanh differ from glibc's on some inputs; the exact mode does not."""
    from semantics.folds import libm
    x = np.random.default_rng(1).uniform(-30, 30, 20000)
    for name in ("exp", "tanh", "sin", "cos", "log"):
        arg = np.abs(x) if name == "log" else x
        assert same_bits(libm(name, arg), np.array([getattr(math, name)(v) for v in arg.tolist()])), name
    specials = np.array([1000.0, -np.inf, np.inf, np.nan, 0.0, -0.0, -1.0])
    assert same_bits(libm("exp", specials[:4]), np.array([np.inf, 0.0, np.inf, np.nan]))
    assert same_bits(libm("log", specials[4:]), np.array([-np.inf, -np.inf, np.nan]))
    with pytest.raises(tlb.BridgeError, match="exact mode computes in float64"):
        g, x = _unary("exp", np.zeros(2))
        tlb.evaluate(g, None, x, dtype="float32", exact=True)


# -- the application layer: eval --exact, diff's per-node comparison with the exact mode -------------


def test_eval_prints_the_value_table_of_either_mode(tmp_path, capsys):
    from torchlean_bridge.app.cli import main
    from torchlean_bridge.seed import SEED_X0, seed_mlp_bundle
    tlb.save(seed_mlp_bundle(), tmp_path / "seed")
    np.save(tmp_path / "x.npy", SEED_X0)
    args = ["eval", str(tmp_path / "seed"), "--input", str(tmp_path / "x.npy"), "--all-nodes"]
    assert main(args) == 0
    default = capsys.readouterr().out
    assert main(args + ["--exact"]) == 0
    assert capsys.readouterr().out == default  # the seed MLP is bit-identical in both modes at x0
    assert main(args + ["--exact", "--json"]) == 0
    import json
    doc = json.loads(capsys.readouterr().out)
    table = tlb.evaluate(seed_mlp_bundle().graph, seed_mlp_bundle().payload, SEED_X0, all_nodes=True, exact=True)
    assert doc["exact"] is True and [n["value"] for n in doc["nodes"]] == [np.asarray(v).tolist() for v in table]
    assert main(args + ["--exact", "--dtype", "float32"]) == 2


def test_ulp64_distance_counts_representable_steps():
    from torchlean_bridge.app.diff import ulp64_distance
    one = np.array([1.0])
    assert ulp64_distance(one, one) == 0
    assert ulp64_distance(one, np.nextafter(one, 2)) == 1
    assert ulp64_distance(np.array([0.0]), np.array([-0.0])) == 1
    assert ulp64_distance(np.array([5e-324]), np.array([-5e-324])) == 3
    assert ulp64_distance(np.array([np.nan]), np.array([np.nan])) == 0
    assert ulp64_distance(np.array([np.nan]), one) == math.inf


def test_diff_says_per_node_whether_default_is_bit_identical_to_exact():
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Tanh(), torch.nn.Linear(32, 3)).eval()
    bundle = tlb.import_fx(module, (torch.randn(2, 64),))
    report = tlb.diff(bundle, against="torch", module=module, random=2)
    rows = {r.node: r for r in report.nodes}
    assert all(r.exact_ulps is not None for r in rows.values())
    x = [arr for _, arr in __import__("torchlean_bridge.app.diff", fromlist=["make_inputs"]).make_inputs(
        bundle.graph, 2, 0)]
    from torchlean_bridge.app.diff import ulp64_distance
    worst = {n.id: 0.0 for n in bundle.graph.nodes}
    for arrays in x:
        arrays = [a.astype(np.float32).astype(np.float64) for a in arrays]  # as the torch oracle rounds them
        d = tlb.evaluate(bundle.graph, bundle.payload.astype("float64"), arrays, all_nodes=True)
        e = tlb.evaluate(bundle.graph, bundle.payload.astype("float64"), arrays, all_nodes=True, exact=True)
        for n in bundle.graph.nodes:
            worst[n.id] = max(worst[n.id], ulp64_distance(d[n.id], e[n.id]))
    assert {nid: r.exact_ulps for nid, r in rows.items()} == worst
    assert any(v > 0 for v in worst.values())  # a 64-term BLAS dot product is not the sequential fold
    text = str(report)
    assert "vs exact" in text and "bit-identical" in report.summary()
    assert report.to_json()["nodes"][0]["exact_ulps"] == 0


# -- the fold kernels: einsum where this numpy is checked to compute the steps, else the steps ------


def _steps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The fold written out over Python floats: acc = 0.0; acc = acc + a[k, m] * b[k, n] in k order."""
    k, m, n = a.shape[-2], a.shape[-1], b.shape[-1]
    out = np.zeros(a.shape[:-2] + (m, n))
    for idx in np.ndindex(*a.shape[:-2]):
        for i in range(m):
            for j in range(n):
                acc = 0.0
                for t in range(k):
                    acc = acc + float(a[idx + (t, i)]) * float(b[idx + (t, j)])
                out[idx + (i, j)] = acc
    return out


FOLD_SHAPES = [((3, 2), (3, 5)), ((4, 5), (4, 1)), ((4, 1), (4, 6)), ((5, 1), (5, 1)), ((1, 3), (1, 4)),
               ((0, 3), (0, 2)), ((3, 0), (3, 2)), ((2, 6, 3), (2, 6, 4)), ((2, 6, 1), (2, 6, 1)),
               ((3, 7, 1), (3, 7, 2)), ((2, 9, 4), (2, 9, 1)), ((33, 17), (33, 41))]


@pytest.mark.parametrize("einsum", [True, False], ids=["einsum", "steps"])
@pytest.mark.parametrize("shapes", FOLD_SHAPES, ids=str)
def test_fold_matmul_is_the_sequential_fold_from_plus_zero(shapes, einsum, monkeypatch):
    from semantics import folds
    if not einsum:
        monkeypatch.setattr(folds, "einsum_folds_in_order", lambda: False)
    elif not folds.einsum_folds_in_order():
        pytest.skip("this numpy's einsum does not compute the fold (the steps are used)")
    rng = np.random.default_rng(len(str(shapes)))
    (sa, sb) = shapes
    a = rng.standard_normal(sa) * np.exp2(rng.integers(-40, 40, sa))
    b = rng.standard_normal(sb) * np.exp2(rng.integers(-40, 40, sb))
    specials = np.array([np.inf, -np.inf, np.nan, -0.0, 0.0, 5e-324, 1e308, -1e308])
    for arr in (a, b):  # a few special values in some entries
        flat = arr.reshape(-1)
        flat[rng.integers(0, max(flat.size, 1), min(flat.size, 3))] = rng.choice(specials, min(flat.size, 3))
    with np.errstate(all="ignore"):
        got = folds.fold_matmul(a, b)
    assert same_bits(got, _steps(a, b)), shapes
    assert got.shape == sa[:-2] + (sa[-1], sb[-1])


def test_einsum_check_rejects_a_reordered_or_fused_einsum(monkeypatch):
    """The once-per-process check sees a contraction that sums in another order, or rounds a*b + acc
    once (fused multiply-add, emulated exactly with fractions)."""
    from fractions import Fraction

    from semantics import folds
    real = np.einsum
    fma = np.vectorize(lambda a, b, c: float(Fraction(a) * Fraction(b) + Fraction(c)))

    def fused(subscripts, a, b, optimize=False):
        if subscripts != "km,kn->mn":
            return real(subscripts, a, b, optimize=False)
        acc = np.zeros((a.shape[1], b.shape[1]))
        for k in range(a.shape[0]):
            acc = fma(a[k][:, None], b[k][None, :], acc)
        return acc

    for fake in (lambda s, a, b, optimize=False: real(s, a, b, optimize=True), fused):
        monkeypatch.setattr(np, "einsum", fake)
        folds.einsum_folds_in_order.cache_clear()
        try:
            assert folds.einsum_folds_in_order() is False
        finally:
            monkeypatch.setattr(np, "einsum", real)
            folds.einsum_folds_in_order.cache_clear()


@pytest.mark.parametrize("kind", ["matmul", "linear", "conv"])
def test_exact_contractions_match_the_emulation_with_the_step_kernel(kind, monkeypatch):
    """The fallback (explicit steps) gives the same bits as the emulation on random graphs."""
    from semantics import folds
    monkeypatch.setattr(folds, "einsum_folds_in_order", lambda: False)
    test_exact_mode_is_bit_identical_to_the_emulation(kind)


@pytest.mark.parametrize("einsum", [True, False], ids=["einsum", "steps"])
@pytest.mark.parametrize("left, right", [((2, 3, 4), (2, 4, 5)), ((3, 1, 2, 4), (2, 4, 3)), ((4,), (2, 3, 4, 2)),
                                          ((2, 1, 3, 4), (1, 3, 4, 1)), ((2, 3, 4), (4,)), ((1, 4), (3, 4, 2)),
                                          ((2, 5, 1), (2, 1, 3))], ids=str)
def test_exact_batched_matmul_matches_the_emulation(left, right, einsum, monkeypatch):
    """Batch axes on both sides (broadcast), rank-1 operands: the generator's right operand is 1-D or 2-D."""
    from semantics import folds
    if not einsum:
        monkeypatch.setattr(folds, "einsum_folds_in_order", lambda: False)
    out = np.broadcast_shapes(left[:-2], right[:-2]) + left[-2:-1] * (len(left) > 1) + right[-1:] * (len(right) > 1)
    g = Graph([Node(0, [], "input", left), Node(1, [], "input", right), Node(2, [0, 1], "matmul", out)])
    tlb.check(g)
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal(left) * 1e3, rng.standard_normal(right)
    ours = tlb.evaluate(g, None, [x, y], exact=True)[0]
    shape, ref = emu.denote_all(g, None, [x, y])[-1]
    assert ours.shape == shape and same_bits(ours.reshape(-1), np.array(ref))
