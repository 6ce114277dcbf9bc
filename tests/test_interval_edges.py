"""Interval rules at their edges: domain refusals, input-box checks, overflow and underflow, point
boxes where the rounding direction decides soundness, and two-box products.

Written against the survivors of ``tools/mutate.py --preset interval`` (docs/mutation-testing.md):
each test fails under a mutant that changes behaviour on these inputs.
"""

from __future__ import annotations

import math
from fractions import Fraction

import mpmath as mp
import numpy as np
import pytest

from tests.test_interval_tightness import Net, ulp, unary_net
from torchlean_bridge.errors import IntervalError

mp.mp.dps = 40


def refusal(kind, lo, hi, attrs=None) -> str:
    with pytest.raises(IntervalError) as e:
        unary_net(kind, (2,), attrs).boxes(np.array([lo, 0.5]), np.array([hi, 0.6]))
    assert e.value.node == 1 and e.value.op == kind
    return str(e.value)


@pytest.mark.parametrize("kind,lo,hi,attrs,message", [
    ("log", -1.0, 1.0, None, "log: box reaches -1.0 <= 0, where log is undefined"),
    ("log", 0.0, 1.0, None, "log: box reaches 0.0 <= 0, where log is undefined"),
    ("log2", -1.0, 1.0, None, "log2: box reaches -1.0 <= 0, where log2 is undefined"),
    ("log2", 0.0, 1.0, None, "log2: box reaches 0.0 <= 0, where log2 is undefined"),
    ("log1p", -2.0, 0.0, None, "log1p: box reaches -2.0 <= -1, where log1p is undefined"),
    ("acosh", 0.0, 2.0, None, "acosh: box reaches outside [1.0, inf], where acosh is undefined"),
    ("asin", -2.0, 0.0, None, "asin: box reaches outside [-1.0, 1.0], where asin is undefined"),
    ("asin", 0.0, 2.0, None, "asin: box reaches outside [-1.0, 1.0], where asin is undefined"),
    ("acos", 0.0, 1.5, None, "acos: box reaches outside [-1.0, 1.0], where acos is undefined"),
    ("acos", -1.5, 0.0, None, "acos: box reaches outside [-1.0, 1.0], where acos is undefined"),
    ("atanh", 0.5, 1.5, None, "atanh: box reaches outside [-1.0, 1.0], where atanh is undefined"),
    ("pow", -1.0, 1.0, {"exponent": -1.0}, "pow: box contains 0 and the exponent -1.0 is negative"),
    ("pow", 0.0, 1.0, {"exponent": -2.0}, "pow: box contains 0 and the exponent -2.0 is negative"),
    ("pow", 0.0, 1.0, {"exponent": -1.5}, "pow: box reaches 0 and the exponent -1.5 is negative"),
    ("pow", -1.0, -0.5, {"exponent": 0.5}, "pow: box lies below 0 and the exponent 0.5 is not an integer"),
])
def test_boxes_leaving_the_domain_are_refused_with_the_exact_message(kind, lo, hi, attrs, message):
    assert refusal(kind, lo, hi, attrs) == f"interval: node 1 ({kind}): {message}"


@pytest.mark.parametrize("kind,lo,hi,attrs", [("acosh", 1.0, 1.5, None), ("asin", -1.0, 1.0, None),
                                              ("acos", -1.0, 1.0, None), ("atanh", -0.5, 0.5, None),
                                              ("log1p", -0.5, 1.0, None), ("pow", 0.0, 1.0, {"exponent": 0.5})])
def test_boxes_touching_the_domain_edge_are_accepted(kind, lo, hi, attrs):
    out = unary_net(kind, (2,), attrs).boxes(np.array([lo, lo]), np.array([hi, lo]))[1]
    assert np.all(np.isfinite(out[0])) and np.all(np.isfinite(out[1]))


def test_input_boxes_are_checked_with_exact_messages():
    net = Net()
    net.add("logical_not", [net.input((3,), "bool")])
    lo, hi = net.boxes(np.array([0.0, 1.0, 0.0]), np.array([0.0, 1.0, 0.0]))[1]
    assert lo.tolist() == hi.tolist() == [1.0, 0.0, 1.0]
    cases = [
        ((np.array([0.0, 2.0, 0.0]),) * 2, "interval: node 0 (input): bool inputs must be 0 or 1"),
        ((np.array([0.0, 0.0, 0.0]), np.array([0.0, 1.0, 0.0])),
         "interval: node 0 (input): bool inputs need a point box (lower == upper)"),
        ((np.zeros(2), np.zeros(2)), "interval: node 0 (input): lower bound has shape [2], expected [3]"),
        ((np.array([0.0, 1.0, 0.0]), np.array([0.0, 0.0, 0.0])),
         "interval: node 0 (input): lower bound exceeds upper bound at flat index 1: 1.0 > 0.0"),
    ]
    for (lo, hi), message in cases:
        with pytest.raises(IntervalError) as e:
            net.boxes(lo, hi)
        assert str(e.value) == message and e.value.node == 0
    ints = Net()
    ints.add("cast", [ints.input((2,), "int64")], {"dtype": "float"})
    with pytest.raises(IntervalError, match=r"^interval: node 0 \(input\): int64 inputs must be integers$"):
        ints.boxes(np.array([1.0, 2.5]), np.array([1.0, 2.5]))


LIBRARY_REFS = {"exp": mp.exp, "expm1": mp.expm1, "sinh": mp.sinh, "cosh": mp.cosh, "exp2": lambda x: mp.power(2, x)}


@pytest.mark.parametrize("kind", sorted(LIBRARY_REFS))
def test_library_functions_stay_sound_next_to_an_overflowed_entry(kind):
    """One entry overflows to inf: the finite entries of the same array keep enclosing ends."""
    x = np.array([1100.0, 1.0, -1.0, 0.3])
    lo, hi = unary_net(kind, x.shape).boxes(x, x)[1]
    assert hi[0] == math.inf
    for v, a, b in zip(x[1:], lo[1:], hi[1:]):
        exact = LIBRARY_REFS[kind](mp.mpf(float(v)))
        assert mp.mpf(float(a)) <= exact <= mp.mpf(float(b)), (kind, v)
        assert b - a <= 64 * ulp(float(exact))


def test_products_and_quotients_that_underflow_still_enclose_the_exact_value():
    net = Net()
    a, b = net.input((4,)), net.input((4,))
    mul, div = net.add("mul_elem", [a, b]), net.add("div", [a, b])
    x = np.array([1e-200, -1e-200, 3e-170, 5e-324])
    y = np.array([1e-200, 1e-200, -7e-160, 0.5])
    z = np.array([1e200, -1e200, 1e170, 3.0])
    boxes = net.boxes([x, y], [x, y])
    boxes_div = net.boxes([x, z], [x, z])
    for i in range(4):
        exact = Fraction(x[i]) * Fraction(y[i])
        assert Fraction(boxes[mul][0][i]) <= exact <= Fraction(boxes[mul][1][i]), i
        exact = Fraction(x[i]) / Fraction(z[i])
        assert Fraction(boxes_div[div][0][i]) <= exact <= Fraction(boxes_div[div][1][i]), i


def _mp_softmax(row):
    e = [mp.exp(mp.mpf(float(v))) for v in row]
    return [v / sum(e) for v in e]


@pytest.mark.parametrize("row", [[0.0, 0.0], [1.0, 1.0, 1.0], [0.0, math.log(3.0)], [-3.0, 2.0, 0.5, 0.5],
                                 [40.0, -40.0], [0.0]])
def test_softmax_point_boxes_enclose_and_are_within_a_few_ulps(row):
    x = np.array([row])
    for kind in ("softmax", "log_softmax"):
        lo, hi = unary_net(kind, x.shape, {"axis": 1}).boxes(x, x)[1]
        for i, p in enumerate(_mp_softmax(row)):
            exact = p if kind == "softmax" else mp.log(p)
            assert mp.mpf(float(lo[0, i])) <= exact <= mp.mpf(float(hi[0, i])), (kind, row, i)
            # the rule rounds in t = logsumexp(others) - x_i: errors relative to |t|, absolute for log_softmax
            scale = 128 * 2.0 ** -52 * (1 + max(abs(v) for v in row)) * (abs(float(exact)) if kind == "softmax" else 1)
            tol = 64 * ulp(float(exact)) + scale
            assert hi[0, i] - lo[0, i] <= tol + 1e-300, (kind, row, i, lo[0, i], hi[0, i])


@pytest.mark.parametrize("shapes", [((2, 3), (3, 2)), ((2, 3), (3,)), ((3,), (3, 2)), ((3,), (3,)),
                                    ((2, 1, 3), (2, 3, 2))], ids=str)
def test_matmul_of_two_boxes_is_the_exact_sum_of_term_ranges(shapes):
    """Each output sums distinct products a_ik b_kj: its exact range is the sum of the term ranges."""
    a_shape, b_shape = shapes
    rng = np.random.default_rng(sum(map(sum, shapes)))
    ca, cb = rng.normal(size=a_shape), rng.normal(size=b_shape)
    ra, rb = rng.uniform(0, 1, a_shape), rng.uniform(0, 1, b_shape)
    net = Net()
    net.add("matmul", [net.input(a_shape), net.input(b_shape)])
    lo, hi = net.boxes([ca - ra, cb - rb], [ca + ra, cb + rb])[2]
    assert lo.shape == np.matmul(ca, cb).shape
    a_ends = [np.atleast_2d(e) for e in (ca - ra, ca + ra)]
    b_ends = [e[:, None] if e.ndim == 1 else e for e in (cb - rb, cb + rb)]
    batch = np.broadcast_shapes(a_ends[0].shape[:-2], b_ends[0].shape[:-2])
    a_ends = [np.broadcast_to(e, batch + e.shape[-2:]) for e in a_ends]
    b_ends = [np.broadcast_to(e, batch + e.shape[-2:]) for e in b_ends]
    m, k, n = a_ends[0].shape[-2], a_ends[0].shape[-1], b_ends[0].shape[-1]
    for flat, idx in enumerate(np.ndindex(batch + (m, n))):
        *bt, i, j = idx
        terms = [[Fraction(x[tuple(bt) + (i, q)]) * Fraction(y[tuple(bt) + (q, j)]) for x in a_ends for y in b_ends]
                 for q in range(k)]
        exact_lo, exact_hi = sum(min(t) for t in terms), sum(max(t) for t in terms)
        got_lo, got_hi = Fraction(lo.reshape(-1)[flat]), Fraction(hi.reshape(-1)[flat])
        assert got_lo <= exact_lo and exact_hi <= got_hi, idx
        tol = Fraction(1e-14) * (1 + sum(max(abs(v) for v in t) for t in terms))
        assert exact_lo - got_lo <= tol and got_hi - exact_hi <= tol, idx


def test_batch_norm_point_boxes_enclose_the_exact_value():
    rng = np.random.default_rng(12)
    x = rng.normal(size=(4, 3, 5))
    rec = {"weight": rng.normal(size=3), "bias": rng.normal(size=3), "running_mean": rng.normal(size=3),
           "running_var": np.array([0.3, 1e-7, 2.5])}
    net = unary_net("batch_norm_eval", x.shape, {"channel_axis": 1, "channels": 3, "eps": 1e-5})
    for role, value in rec.items():
        net.payload.set(1, role, value)
    lo, hi = net.boxes(x, x)[1]
    for idx in np.ndindex(x.shape):
        c = idx[1]
        exact = ((mp.mpf(float(x[idx])) - mp.mpf(float(rec["running_mean"][c])))
                 / mp.sqrt(mp.mpf(float(rec["running_var"][c])) + mp.mpf(1e-5))
                 * mp.mpf(float(rec["weight"][c])) + mp.mpf(float(rec["bias"][c])))
        assert mp.mpf(float(lo[idx])) <= exact <= mp.mpf(float(hi[idx])), idx
        assert hi[idx] - lo[idx] <= 1e-12 * (1 + abs(float(exact)))


@pytest.mark.parametrize("kind,attrs", [("sum", {}), ("reduce_sum", {"axis": 1}), ("reduce_mean", {"axis": 0}),
                                        ("reduce_mean_axes", {"axes": [0, 1], "keepdim": True}),
                                        ("cumsum", {"axis": 1, "exclusive": False, "reverse": True})])
def test_sums_of_point_boxes_enclose_the_exact_sum(kind, attrs):
    x = np.array([[0.1, 0.2, 0.3, 1e16, -1e16, 0.7], [1 / 3, 2 / 3, 1e-17, 5e-324, 0.1, -0.3]])
    lo, hi = unary_net(kind, x.shape, attrs).boxes(x, x)[1]
    f = np.vectorize(Fraction, otypes=[object])(x)
    exact = {"sum": lambda: np.array(f.sum()), "reduce_sum": lambda: f.sum(axis=1),
             "reduce_mean": lambda: f.sum(axis=0) / 2, "reduce_mean_axes": lambda: np.array([[f.sum() / 12]]),
             "cumsum": lambda: np.flip(np.cumsum(np.flip(f, 1), axis=1), 1)}[kind]()
    for e, a, b in zip(np.ravel(exact), np.ravel(lo), np.ravel(hi)):
        assert Fraction(a) <= e <= Fraction(b), (kind, e, a, b)
        assert b - a <= 1e-12 * (1 + float(np.abs(x).sum())), (kind, a, b)


def test_prelu_and_where_and_compare_on_two_input_boxes_broadcast():
    """Broadcast slope and condition boxes (a scalar box against a vector)."""
    net = Net()
    x, s = net.input((4,)), net.input(())
    net.add("prelu", [x, net.add("expand", [s], {"to_shape": [4]})])
    lo, hi = net.boxes([np.array([-2.0, -1.0, 0.5, -1.0]), np.array(0.25)],
                       [np.array([-1.0, 1.0, 2.0, -1.0]), np.array(0.5)])[-1]
    want_lo = [min(Fraction(-2) * Fraction(1, 2), Fraction(-2) * Fraction(1, 4)), Fraction(-1, 2), Fraction(1, 2),
               Fraction(-1, 2)]
    want_hi = [Fraction(-1, 4), Fraction(1), Fraction(2), Fraction(-1, 4)]
    for a, b, wa, wb in zip(lo, hi, want_lo, want_hi):
        assert abs(Fraction(a) - wa) <= Fraction(1e-15) and abs(Fraction(b) - wb) <= Fraction(1e-15)
        assert Fraction(a) <= wa and wb <= Fraction(b)


def _cancelling_rows(n: int = 6) -> np.ndarray:
    """Rows whose float dot products with ones lose the small terms: 1e16 + 1 - 1e16 + ... ."""
    rng = np.random.default_rng(3)
    rows = []
    for _ in range(n):
        big = 10.0 ** rng.integers(15, 18)
        row = np.array([big, 1.0, -big, 0.75, 3.0 * big, -3.0 * big, 1e-3, 0.5])
        rows.append(rng.permutation(row))
    return np.array(rows)


def test_affine_rounding_margins_cover_catastrophic_cancellation():
    """The exact images of point boxes whose float sums cancel: the gamma_n (|W| |c| + |b|) term is what
    keeps them inside (a margin cut by a constant factor or by |c| leaves them out)."""
    x = _cancelling_rows()
    w = np.vstack([np.ones(8), np.linspace(-1, 1, 8), (-1.0) ** np.arange(8)])
    b = np.array([0.1, -0.3, 1e16])
    exact_of = lambda xs, ws, bs: [[sum(Fraction(v) * Fraction(u) for v, u in zip(row, wr)) + Fraction(bb)  # noqa: E731
                                    for wr, bb in zip(ws, bs)] for row in xs]
    lin = Net()
    lin.add("linear", [lin.input(x.shape)], shape=(x.shape[0], 3), weight=w, bias=b)
    mm = Net()
    mm.add("matmul", [mm.input(x.shape), mm.add("const", [], {}, shape=(8, 3), values=w.T)])
    conv = Net()
    conv.add("conv", [conv.input((1, 8))], dict(spatial_rank=1, kernel=[8], stride=[1], padding=[0], padding_after=[0],
                                                dilation=[1], groups=1, channel_axis=0, in_channels=1, out_channels=3),
             weight=w.reshape(3, 1, 8), bias=b)
    for net, bias in ((lin, b), (mm, np.zeros(3))):
        lo, hi = net.boxes(x, x)[-1]
        for r, row in enumerate(exact_of(x, w, bias)):
            for j, e in enumerate(row):
                assert Fraction(lo[r, j]) <= e <= Fraction(hi[r, j]), (net.nodes[-1].kind, r, j)
    for row in x:
        lo, hi = conv.boxes(row[None, :], row[None, :])[-1]
        for j, e in enumerate(exact_of([row], w, b)[0]):
            assert Fraction(lo[j, 0]) <= e <= Fraction(hi[j, 0]), ("conv", j)
    # the cancellation in the weights instead, at the centre 1 (a product that is exact, in a sum that is not)
    ones, w2 = np.ones((2, 8)), _cancelling_rows(3)
    lin2 = Net()
    lin2.add("linear", [lin2.input((2, 8))], shape=(2, 3), weight=w2, bias=np.zeros(3))
    lo, hi = lin2.boxes(ones, ones)[-1]
    for j, e in enumerate(exact_of(ones[:1], w2, np.zeros(3))[0]):
        assert Fraction(lo[0, j]) <= e <= Fraction(hi[0, j]) and Fraction(lo[1, j]) <= e <= Fraction(hi[1, j]), j
    conv2 = Net()
    conv2.add("conv", [conv2.input((1, 8))], dict(spatial_rank=1, kernel=[8], stride=[1], padding=[0],
                                                  padding_after=[0], dilation=[1], groups=1, channel_axis=0,
                                                  in_channels=1, out_channels=3),
              weight=w2.reshape(3, 1, 8), bias=np.zeros(3))
    mm2 = Net()
    mm2.add("matmul", [mm2.input((2, 8)), mm2.add("const", [], {}, shape=(8, 3), values=w2.T)])
    for j, e in enumerate(exact_of(ones[:1], w2, np.zeros(3))[0]):
        lo, hi = conv2.boxes(ones[:1], ones[:1])[-1]
        assert Fraction(lo[j, 0]) <= e <= Fraction(hi[j, 0]), ("conv", j)
        lo, hi = mm2.boxes(ones, ones)[-1]
        assert Fraction(lo[0, j]) <= e <= Fraction(hi[0, j]), ("matmul", j)
    pool = unary_net("avg_pool", (1, 8), dict(spatial_rank=1, kernel=[8], stride=[1], padding=[0]))
    for row in x:
        lo, hi = pool.boxes(row[None, :], row[None, :])[-1]
        e = sum(Fraction(v) for v in row) / 8
        assert Fraction(lo[0, 0]) <= e <= Fraction(hi[0, 0])


def test_safe_log_refuses_an_eps_box_reaching_below_zero_and_accepts_one_above():
    net = Net()
    net.add("safe_log", [net.input((2, 3)), net.input(())])
    with pytest.raises(IntervalError) as e:
        net.boxes([np.zeros((2, 3)), np.array(-1.0)], [np.ones((2, 3)), np.array(0.5)])
    assert str(e.value) == ("interval: node 2 (safe_log): safe_log: softplus(x) + eps may be <= 0 "
                            "(eps box reaches 0 or below)")
    lo, hi = net.boxes([np.full((2, 3), -30.0), np.array(1e-3)], [np.zeros((2, 3)), np.array(1e-3)])[2]
    assert np.all(lo <= math.log(1e-3 + math.log1p(math.exp(-30.0)))) and np.all(hi >= math.log(1e-3 + math.log(2)))


def test_linear_over_an_empty_input_axis_is_its_bias():
    net = Net()
    net.add("linear", [net.input((2, 0))], shape=(2, 3), weight=np.zeros((3, 0)), bias=np.array([1.0, -2.0, 0.5]))
    lo, hi = net.boxes(np.zeros((2, 0)), np.zeros((2, 0)))[-1]
    bias = np.array([[1.0, -2.0, 0.5]] * 2)
    assert np.all(lo <= bias) and np.all(bias <= hi) and np.max(hi - lo) <= 1e-14


def test_interval_bounds_checks_the_graph_first():
    from torchlean_bridge.errors import GraphError
    from torchlean_bridge.graph import Graph, Node
    import torchlean_bridge as tlb
    g = Graph([Node(0, [], "input", (2,)), Node(1, [0], "relu", (3,))])
    with pytest.raises(GraphError, match=r"^IR graph: node 1: outShape mismatch: inferred=\[2\], declared=\[3\]"):
        tlb.interval_bounds(g, None, np.zeros(2), np.zeros(2))
    from semantics.interval import IntervalPropagator
    with pytest.raises(GraphError):
        IntervalPropagator(g, None)
    ok = Graph([Node(0, [], "input", (2,)), Node(1, [0], "relu", (2,)), Node(2, [1], "neg", (2,))])
    boxes = IntervalPropagator(ok, None)(np.array([-1.0, 2.0]), np.array([1.0, 3.0]))
    assert len(boxes) == 3 and boxes[2][0].tolist() == [-1.0, -3.0] and boxes[2][1].tolist() == [0.0, -2.0]
