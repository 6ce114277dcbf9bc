"""Tightness of every interval rule, through the public ``tlb.interval_bounds``.

Soundness alone passes for ``sigmoid -> [0, 1]`` or a ``mul_elem`` widened by 1. Here every rule's
box is compared with the exact range it promises:

* point boxes: within a few ulps of the mpmath value (unary ops) or of the exact/float value;
* monotone ops: the ends are the exact images of the ends (float-exact ops: equal to the float
  evaluator at lo and hi; rounding ops: within a rounding bound of it);
* elementwise binary ops: the ends are the exact extreme corner values, in Fraction;
* affine ops: c +- |W| r, computed by the evaluator on the same op with |W|;
* decided conditions (comparisons, where, casts, bernoulli_mask, argmax) give decided boxes;
* softmax / log_softmax / layernorm / batch norm and the other axis-taking rules on every axis.

``test_every_rule_has_a_tightness_check`` fails when an op gains a rule without a case here.
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import mpmath as mp
import numpy as np
import pytest

import torchlean_bridge as tlb
from semantics.interval import INTERVAL_RULES, NO_RULE
from tests.test_interval_rules import UNARY, _kind, in_domain
from torchlean_bridge.errors import IntervalError
from torchlean_bridge.graph import Node
from torchlean_bridge.ops import REGISTRY

mp.mp.dps = 40
EPS = 2.0 ** -52


class Net:
    """A tiny graph builder on the public Node/Graph/Payload (shapes by the registry's rules)."""

    def __init__(self) -> None:
        self.nodes: list[Node] = []
        self.payload = tlb.Payload()

    def input(self, shape, dtype: str = "float") -> int:
        self.nodes.append(Node(len(self.nodes), [], "input", tuple(shape), dtype=dtype))
        return len(self.nodes) - 1

    def add(self, kind: str, parents, attrs=None, shape=None, **record) -> int:
        nid = len(self.nodes)
        probe = Node(nid, parents, kind, tuple(shape or ()), attrs or {})
        spec = REGISTRY[kind]
        ps = [self.nodes[p] for p in parents]
        out = tuple(spec.infer(probe.attrs, [p.out_shape for p in ps], probe.out_shape)) if shape is None else shape
        dtype = spec.element_type(probe.attrs, [p.dtype for p in ps], "float")
        self.nodes.append(Node(nid, parents, kind, out, probe.attrs, dtype=dtype))
        for role, value in record.items():
            self.payload.set(nid, role, np.asarray(value))
        return nid

    def graph(self) -> tlb.Graph:
        return tlb.Graph(self.nodes)

    def boxes(self, lows, highs):
        return tlb.interval_bounds(self.graph(), self.payload, lows, highs)

    def values(self, xs):
        return tlb.evaluate(self.graph(), self.payload, xs, dtype="float64", all_nodes=True)


def unary_net(kind: str, shape, attrs=None) -> Net:
    net = Net()
    net.add(kind, [net.input(shape)], attrs)
    return net


def ulp(x) -> float:
    return float(np.spacing(abs(np.float64(x)))) if math.isfinite(float(x)) else math.inf


def assert_near(end: float, exact, tol: float, what) -> None:
    assert abs(mp.mpf(float(end)) - exact) <= tol, (what, float(end), exact, tol)


# -- unary ops: point boxes and exact ranges against mpmath --------------------------------------

# where boxes are drawn (inside the domain, away from tan's poles and atanh's infinities)
RANGES = {"sqrt": (0, 8), "pow0.5": (0, 8), "pow1.5": (0, 8), "rsqrt": (0.01, 8), "log": (0.01, 8),
          "log2": (0.01, 8), "log1p": (-0.99, 8), "acosh": (1, 8), "asin": (-1, 1), "acos": (-1, 1),
          "atanh": (-0.99, 0.99), "tan": (-1.5, 1.5), "inv": (0.05, 8), "pow-1": (0.05, 8), "pow-2": (0.05, 8)}


def _critical(f, guess: float) -> mp.mpf:
    return mp.findroot(lambda t: mp.diff(f, t), guess)


def critical_points(name: str, attrs) -> list:
    """Where a non-monotone unary op turns (all other unary ops are monotone on their domain)."""
    ref = UNARY[name][1]
    f = lambda t: ref(t, attrs)  # noqa: E731
    if name in ("abs", "pow2", "cosh", "leaky_relu_neg", "elu_neg"):
        return [mp.mpf(0)]
    if name == "sin":
        return [mp.pi / 2 + k * mp.pi for k in range(-4, 4)]
    if name == "cos":
        return [k * mp.pi for k in range(-3, 4)]
    if name == "hardswish":
        return [mp.mpf(-1.5)]
    if name in ("gelu", "gelu_tanh", "mish"):
        return [_critical(f, -0.8 if name != "mish" else -1.2)]
    if name == "silu":
        return [_critical(f, -1.28)]
    return []


def unary_tolerance(exact, scale: float) -> float:
    """A few ulps of the value, plus a few rounding units of the operands' size for the composed rules
    (gelu's x * (1 + erf) cancels near its tail; hardsigmoid's 1/6 is rounded)."""
    return 32 * ulp(exact) + 16 * EPS * scale + 1e-300


def _unary_points(name: str) -> np.ndarray:
    domain = UNARY[name][2]
    a, b = RANGES.get(name, (-8, 8))
    rng = np.random.default_rng(sum(map(ord, name)))
    edges = [0.0, -0.0, 0.5, -0.5, 1.0, -1.0, 3.0, -3.0, -1.5, 1e-8, -1e-8, 1e-300, a, b]
    xs = np.concatenate([rng.uniform(a, b, 64), [x for x in edges if a <= x <= b]])
    return np.array([x for x in xs if domain is None or in_domain(domain, x)])


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_point_boxes_are_within_a_few_ulps_of_mpmath(name):
    attrs, ref, _ = UNARY[name]
    xs = _unary_points(name)
    net = unary_net(_kind(name), xs.shape, attrs)
    lo, hi = net.boxes(xs, xs)[1]
    node_attrs = net.nodes[1].attrs
    for x, a, b in zip(xs, lo, hi):
        exact = ref(mp.mpf(float(x)), node_attrs)
        tol = unary_tolerance(exact, max(1.0, abs(x)))
        assert mp.mpf(float(a)) <= exact <= mp.mpf(float(b)), (name, x, a, b, exact)
        assert_near(a, exact, tol, (name, x))
        assert_near(b, exact, tol, (name, x))


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_box_ends_are_the_exact_range(name):
    """Monotone ops end at the images of the ends; the others also reach their turning points."""
    attrs, ref, _ = UNARY[name]
    a_min, a_max = RANGES.get(name, (-8, 8))
    rng = np.random.default_rng(1 + sum(map(ord, name)))
    width = (a_max - a_min) / 4
    ends = np.sort(rng.uniform(a_min, a_max, (48, 2)), axis=1)
    ends[:16, 1] = np.minimum(ends[:16, 0] + rng.uniform(0, width / 8, 16), a_max)  # narrow boxes too
    lo_in, hi_in = ends[:, 0].copy(), ends[:, 1].copy()
    net = unary_net(_kind(name), lo_in.shape, attrs)
    lo, hi = net.boxes(lo_in, hi_in)[1]
    node_attrs = net.nodes[1].attrs
    turns = critical_points(name, node_attrs)
    for a, b, out_lo, out_hi in zip(lo_in, hi_in, lo, hi):
        xs = [mp.mpf(float(a)), mp.mpf(float(b))] + [t for t in turns if a < t < b]
        values = [ref(x, node_attrs) for x in xs]
        exact_lo, exact_hi = min(values), max(values)
        scale = max(1.0, abs(a), abs(b))
        assert mp.mpf(float(out_lo)) <= exact_lo and exact_hi <= mp.mpf(float(out_hi)), (name, a, b)
        assert_near(out_lo, exact_lo, unary_tolerance(exact_lo, scale), (name, a, b, "lo"))
        assert_near(out_hi, exact_hi, unary_tolerance(exact_hi, scale), (name, a, b, "hi"))


# -- elementwise binary ops: the exact extreme corners, in Fraction ------------------------------

def _prelu(x, s):
    return x if x >= 0 else s * x


BINARY = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul_elem": lambda a, b: a * b,
    "div": lambda a, b: a / b,
    "max_elem": max,
    "min_elem": min,
    "prelu": _prelu,
}


def _binary_boxes(kind: str, n: int = 80):
    rng = np.random.default_rng(sum(map(ord, kind)))
    boxes = []
    for _ in range(2):
        c = rng.normal(size=n) * 3
        r = rng.uniform(0, 2, n) * (rng.random(n) < 0.8)  # some point boxes
        boxes.append((c - r, c + r))
    if kind == "div":  # denominators of one sign
        lo, hi = boxes[1]
        sign = np.where(rng.random(n) < 0.5, -1.0, 1.0)
        boxes[1] = tuple(sorted((sign * (0.1 + np.abs(lo)), sign * (0.1 + np.abs(lo) + (hi - lo))),
                                key=lambda e: float(e[0])))
        boxes[1] = (np.minimum(*boxes[1]), np.maximum(*boxes[1]))
    return boxes


@pytest.mark.parametrize("kind", sorted(BINARY))
def test_binary_box_ends_are_the_exact_corner_extremes(kind):
    (a_lo, a_hi), (b_lo, b_hi) = _binary_boxes(kind)
    net = Net()
    net.add(kind, [net.input(a_lo.shape), net.input(b_lo.shape)])
    lo, hi = net.boxes([a_lo, b_lo], [a_hi, b_hi])[2]
    f = BINARY[kind]
    for i in range(len(a_lo)):
        xs = {Fraction(a_lo[i]), Fraction(a_hi[i])} | ({Fraction(0)} if a_lo[i] < 0 < a_hi[i] else set())
        ys = {Fraction(b_lo[i]), Fraction(b_hi[i])}
        values = [f(x, y) for x in xs for y in ys]
        exact_lo, exact_hi = min(values), max(values)
        assert Fraction(lo[i]) <= exact_lo and exact_hi <= Fraction(hi[i]), (kind, i)
        for end, exact in ((lo[i], exact_lo), (hi[i], exact_hi)):
            assert abs(Fraction(end) - exact) <= Fraction(8 * ulp(float(exact))) + Fraction(1e-300), (kind, i)


# -- comparisons, logic, where, cast, random: decided conditions are decided ---------------------

def _two_input_box(kind, a, b, dtypes=("float", "float")):
    net = Net()
    net.add(kind, [net.input(np.shape(a[0]), dtypes[0]), net.input(np.shape(b[0]), dtypes[1])])
    return net.boxes([a[0], b[0]], [a[1], b[1]])[2]


# left box, right box per column: decided true / decided false / undecided / touching ends / equal points
CMP_A = (np.array([0.0, 2.0, 0.0, 0.0, 1.0, 1.0]), np.array([1.0, 3.0, 2.0, 1.0, 1.0, 2.0]))
CMP_B = (np.array([1.5, 0.0, 1.0, 1.0, 1.0, 5.0]), np.array([2.0, 1.0, 3.0, 4.0, 1.0, 6.0]))


def _exact_truth(op, a, b):
    """(surely, possibly) by the definition: over every real pair in the boxes (closed intervals)."""
    surely, possibly = [], []
    for al, ah, bl, bh in zip(*a, *b):
        if op in ("lt", "le"):
            strict = op == "lt"
            surely.append(ah < bl if strict else ah <= bl)
            possibly.append(al < bh if strict else al <= bh)
        elif op in ("gt", "ge"):
            strict = op == "gt"
            surely.append(al > bh if strict else al >= bh)
            possibly.append(ah > bl if strict else ah >= bl)
        elif op == "eq":
            surely.append(al == ah == bl == bh)
            possibly.append(al <= bh and bl <= ah)
        else:  # ne
            surely.append(ah < bl or bh < al)
            possibly.append(not (al == ah == bl == bh))
    return np.array(surely, float), np.array(possibly, float)


@pytest.mark.parametrize("op", ["lt", "le", "gt", "ge", "eq", "ne"])
def test_comparisons_are_decided_exactly_when_the_boxes_decide_them(op):
    lo, hi = _two_input_box(op, CMP_A, CMP_B)
    surely, possibly = _exact_truth(op, CMP_A, CMP_B)
    np.testing.assert_array_equal(lo, surely)
    np.testing.assert_array_equal(hi, possibly)


BOOL_BOXES = [(np.array([0.0, 0.0, 1.0, 0.0, 1.0, 0.0]), np.array([0.0, 1.0, 1.0, 1.0, 1.0, 0.0])),
              (np.array([1.0, 1.0, 1.0, 0.0, 0.0, 0.0]), np.array([1.0, 1.0, 1.0, 1.0, 0.0, 0.0]))]


def _bool_net(kind, arity):
    net = Net()
    cmp = [net.add("le", [net.input((6,)), net.input((6,))]) for _ in range(arity)]
    net.add(kind, cmp)
    return net


@pytest.mark.parametrize("kind", ["logical_and", "logical_or", "logical_not"])
def test_logic_on_bool_boxes_is_exact(kind):
    """Undecided bools come from `le(0, y)` with y in [s - 0.5, p - 0.5]: surely true iff s = 1,
    possibly true iff p = 1; the result is the exact range over the Booleans each box allows."""
    arity = 1 if kind == "logical_not" else 2
    net = _bool_net(kind, arity)
    lows, highs = [], []
    for s, p in BOOL_BOXES[:arity]:
        lows += [np.zeros(6), s - 0.5]
        highs += [np.zeros(6), p - 0.5]
    boxes = net.boxes(lows, highs)
    for (s, p), nid in zip(BOOL_BOXES, [2, 5][:arity]):
        np.testing.assert_array_equal(boxes[nid][0], s)
        np.testing.assert_array_equal(boxes[nid][1], p)
    truth = {"logical_and": lambda a, b: a and b, "logical_or": lambda a, b: a or b,
             "logical_not": lambda a: not a}[kind]
    for i in range(6):
        choices = [sorted({bool(s[i]), bool(p[i])}) for s, p in BOOL_BOXES[:arity]]
        outs = [truth(*c) for c in itertools.product(*choices)]
        assert (boxes[-1][0][i], boxes[-1][1][i]) == (float(min(outs)), float(max(outs))), (kind, i)


def test_where_with_a_decided_condition_selects_its_branch():
    net = Net()
    a, b, x, y = (net.input((4,)) for _ in range(4))
    cond = net.add("lt", [a, b])
    net.add("where", [cond, x, y])
    # condition: surely true, surely false, undecided, surely false
    a_box = (np.array([0.0, 5.0, 0.0, 2.0]), np.array([1.0, 6.0, 3.0, 3.0]))
    b_box = (np.array([2.0, 1.0, 1.0, 0.0]), np.array([3.0, 2.0, 2.0, 1.0]))
    x_box = (np.array([10.0, 10.0, 10.0, -1.0]), np.array([11.0, 11.0, 11.0, 0.0]))
    y_box = (np.array([-5.0, -5.0, -5.0, 7.0]), np.array([-4.0, -4.0, -4.0, 8.0]))
    lo, hi = net.boxes([a_box[0], b_box[0], x_box[0], y_box[0]], [a_box[1], b_box[1], x_box[1], y_box[1]])[-1]
    assert lo.tolist() == [10.0, -5.0, -5.0, 7.0]
    assert hi.tolist() == [11.0, -4.0, 11.0, 8.0]


def test_cast_boxes_are_exact():
    x = (np.array([-2.5, -0.5, 0.0, 0.0, 0.3, 1.7, -1.0]), np.array([-1.5, 0.5, 0.0, 2.0, 0.9, 3.2, -1.0]))
    for target, want in {"float": x,
                         "int64": (np.trunc(x[0]), np.trunc(x[1])),
                         "bool": (np.array([1, 0, 0, 0, 1, 1, 1.0]), np.array([1, 1, 0, 1, 1, 1, 1.0]))}.items():
        out = unary_net("cast", (7,), {"dtype": target}).boxes(*x)[1]
        np.testing.assert_array_equal(out[0], want[0], err_msg=target)
        np.testing.assert_array_equal(out[1], want[1], err_msg=target)


def test_random_leaves_are_their_documented_ranges_and_bernoulli_is_decided_at_0_and_1():
    net = Net()
    q = net.input(())
    mask = net.add("bernoulli_mask", [q], {"seed": 1}, shape=(3,))
    noise = net.add("rand_uniform", [], {"seed": 2}, shape=(3,))
    for (q_lo, q_hi), want in {(0.0, 0.0): (0, 0), (1.0, 1.0): (1, 1), (0.3, 0.3): (0, 1), (0.0, 1.0): (0, 1),
                               (1.0, 2.0): (1, 1)}.items():
        boxes = net.boxes(np.array(q_lo), np.array(q_hi))
        assert boxes[mask][0].tolist() == [want[0]] * 3 and boxes[mask][1].tolist() == [want[1]] * 3, (q_lo, q_hi)
        assert boxes[noise][0].tolist() == [0.0] * 3 and boxes[noise][1].tolist() == [1.0] * 3


def test_isnan_is_decided_false_on_finite_boxes():
    out = unary_net("isnan", (3,)).boxes(np.array([-1.0, -np.inf, 0.0]), np.array([1.0, 0.0, np.inf]))[1]
    assert out[0].tolist() == [0.0, 0.0, 0.0] and out[1].tolist() == [0.0, 1.0, 1.0]


def test_argmax_argmin_boxes_are_the_indices_that_can_win():
    rng = np.random.default_rng(5)
    for axis in range(3):
        c = rng.normal(size=(3, 4, 5))
        r = rng.uniform(0, 0.6, c.shape) * (rng.random(c.shape) < 0.7)
        lo_in, hi_in = c - r, c + r
        for kind, largest in (("argmax", True), ("argmin", False)):
            for keepdim in (False, True):
                lo, hi = unary_net(kind, c.shape, {"axis": axis, "keepdim": keepdim}).boxes(lo_in, hi_in)[1]
                a, b = (lo_in, hi_in) if largest else (-hi_in, -lo_in)
                a, b = np.moveaxis(a, axis, -1), np.moveaxis(b, axis, -1)
                # j can be the first winner iff b_j > a_i for every i < j and b_j >= a_i for every i > j
                can = np.stack([np.all(b[..., j:j + 1] > a[..., :j], axis=-1) & np.all(b[..., j:j + 1] >= a[..., j + 1:],
                                                                                       axis=-1)
                                for j in range(a.shape[-1])], axis=-1)
                idx = np.arange(a.shape[-1])
                first = np.min(np.where(can, idx, 99), axis=-1).astype(float)
                last = np.max(np.where(can, idx, -1), axis=-1).astype(float)
                if keepdim:
                    first, last = np.expand_dims(first, axis), np.expand_dims(last, axis)
                np.testing.assert_array_equal(lo, first, err_msg=f"{kind} axis {axis}")
                np.testing.assert_array_equal(hi, last, err_msg=f"{kind} axis {axis}")
