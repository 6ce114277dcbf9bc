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
from semantics.rules.integer import INT_REDUCTIONS, INTERVAL_REFUSALS as INTEGER_REFUSALS
from semantics.rules.misc import INTERVAL_REFUSALS as MISC_REFUSALS
from semantics.rules.select import INTERVAL_REFUSALS as SELECT_REFUSALS
from semantics.rules.spatial import NO_SPATIAL_INTERVAL_RULE
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


# left box, right box per column: decided true / decided false / undecided / touching ends / equal points /
# disjoint / equal lower ends only / equal upper ends only / a point inside a box
CMP_A = (np.array([0.0, 2.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.5]), np.array([1.0, 3.0, 2.0, 1.0, 1.0, 2.0, 2.0, 3.0, 1.5]))
CMP_B = (np.array([1.5, 0.0, 1.0, 1.0, 1.0, 5.0, 1.0, 2.0, 1.0]), np.array([2.0, 1.0, 3.0, 4.0, 1.0, 6.0, 3.0, 3.0, 2.0]))


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
                can = np.stack([np.all(b[..., j:j + 1] > a[..., :j], axis=-1)
                                & np.all(b[..., j:j + 1] >= a[..., j + 1:], axis=-1) for j in range(a.shape[-1])],
                               axis=-1)
                idx = np.arange(a.shape[-1])
                first = np.min(np.where(can, idx, 99), axis=-1).astype(float)
                last = np.max(np.where(can, idx, -1), axis=-1).astype(float)
                if keepdim:
                    first, last = np.expand_dims(first, axis), np.expand_dims(last, axis)
                np.testing.assert_array_equal(lo, first, err_msg=f"{kind} axis {axis}")
                np.testing.assert_array_equal(hi, last, err_msg=f"{kind} axis {axis}")


# -- monotone ops: the ends are the images of the ends --------------------------------------------

def _x_box(shape, seed: int, radius: float = 0.7):
    rng = np.random.default_rng(seed)
    c = rng.normal(size=shape) * 2
    r = rng.uniform(0, radius, shape) * (rng.random(shape) < 0.8)
    return c - r, c + r


POOL = dict(spatial_rank=2, kernel=[2, 3], stride=[1, 2], padding=[1, 1])
POOL_ND = dict(spatial_rank=2, kernel=[2, 2], stride=[2, 1], padding=[1, 0], padding_after=[0, 1], dilation=[1, 2],
               ceil_mode=True, count_include_pad=False)

# kind -> [(attrs, input shape)], one entry per axis / variant; non-decreasing in every input entry
FLOAT_EXACT_MONOTONE = {
    "detach": [({}, (2, 3))],
    "permute": [({"perm": p}, (2, 3, 4)) for p in ([2, 0, 1], [1, 0, 2], [0, 2, 1])],
    "transpose": [({"axis1": a, "axis2": b}, (2, 3, 4)) for a, b in ((0, 1), (0, 2), (1, 2))],
    "broadcast_to": [({"from_shape": [3, 1], "to_shape": [2, 3, 4]}, (3, 1))],
    "expand": [({"to_shape": [2, 3, 4]}, (3, 1))],
    "reshape": [({"in_shape": [2, 3, 4], "out_shape": [6, 4]}, (2, 3, 4))],
    "flatten": [({"value_shape": [2, 3, 4]}, (2, 3, 4))],
    "squeeze": [({"axes": [a]}, s) for a, s in ((0, (1, 3, 4)), (1, (2, 1, 4)), (2, (2, 3, 1)))],
    "unsqueeze": [({"axes": [a]}, (2, 3)) for a in (0, 1, 2)],
    "slice": [({"axes": [a], "starts": [1], "ends": [3], "steps": [s]}, (3, 4, 5)) for a in range(3) for s in (1, 2)],
    "pad": [({"pads_before": [0, 1, 2], "pads_after": [1, 0, 1], "value": -0.5}, (2, 3, 4))],
    "max_pool": [(POOL, (2, 3, 4))],
    "max_pool_nd": [(POOL_ND, (2, 3, 4))],
    "reduce_max": [({"axes": ax, "keepdim": k}, (2, 3, 4)) for ax in ([0], [1], [2], [0, 2]) for k in (False, True)],
    "reduce_min": [({"axes": ax, "keepdim": k}, (2, 3, 4)) for ax in ([0], [1], [2], [1, 2]) for k in (False, True)],
    "relu": [({}, (2, 3))], "floor": [({}, (2, 3))], "ceil": [({}, (2, 3))], "round": [({}, (2, 3))],
    "trunc": [({}, (2, 3))], "sign": [({}, (2, 3))],
    "clamp": [({"min": -0.5, "max": 1.0}, (2, 3)), ({"min": None, "max": 0.3}, (2, 3))],
    "sort": [({"axis": a, "k": k, "descending": d}, (3, 4, 5)) for a in range(3) for k in (1, 3)
             for d in (False, True)],
    "cast": [({"dtype": "float"}, (2, 3))],
    "resize": [({"sizes": [2, 5, 3], "scales": "1 7/4 3/5", "mode": "nearest", "coordinate_mode": c, "nearest_mode": r},
                (2, 3, 4)) for c, r in (("half_pixel", "round_prefer_floor"), ("align_corners", "ceil"),
                                        ("asymmetric", "floor"))],
}

# the same, but the rule rounds: within a rounding bound of the float image of each end
ROUNDED_MONOTONE = {
    "sum": [({}, (2, 3, 4))],
    "reduce_sum": [({"axis": a}, (2, 3, 4)) for a in range(3)],
    "reduce_mean": [({"axis": a}, (2, 3, 4)) for a in range(3)],
    "reduce_sum_axes": [({"axes": ax, "keepdim": k}, (2, 3, 4)) for ax in ([0], [1], [2], [0, 2])
                        for k in (False, True)],
    "reduce_mean_axes": [({"axes": ax, "keepdim": k}, (2, 3, 4)) for ax in ([0], [1], [2], [0, 1])
                         for k in (False, True)],
    "cumsum": [({"axis": a, "exclusive": e, "reverse": r}, (3, 4, 5)) for a in range(3) for e in (False, True)
               for r in (False, True)],
    "avg_pool": [(POOL, (2, 3, 4))],
    "avg_pool_nd": [(POOL_ND, (2, 3, 4)), (dict(POOL_ND, count_include_pad=True, ceil_mode=False), (2, 3, 4))],
    "resize_linear": [({"spatial_rank": 2, "sizes": [5, 3], "coordinate_mode": m}, (2, 3, 4))
                      for m in ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric")],
    "safe_log": [({}, (2, 3))],
    # linear weights are non-negative (cubic's are not: tests/test_resize_modes.py checks its point boxes)
    "resize": [({"sizes": [2, 5, 2], "scales": "1 5/3 1/2", "mode": "linear", "coordinate_mode": c, "antialias": aa,
                 "exclude_outside": aa}, (2, 3, 4))
               for c in ("half_pixel", "half_pixel_symmetric", "align_corners") for aa in (False, True)],
}


def _monotone_net(kind, attrs, shape):
    net = Net()
    x = net.input(shape)
    if kind == "safe_log":
        net.add(kind, [x, net.input(())])
    else:
        net.add(kind, [x], attrs)
    return net


@pytest.mark.parametrize("kind,case", [(k, i) for k, cases in FLOAT_EXACT_MONOTONE.items() for i in range(len(cases))])
def test_float_exact_monotone_ops_end_at_the_images_of_the_ends(kind, case):
    attrs, shape = FLOAT_EXACT_MONOTONE[kind][case]
    net = _monotone_net(kind, attrs, shape)
    lo_in, hi_in = _x_box(shape, case)
    lo, hi = net.boxes(lo_in, hi_in)[-1]
    np.testing.assert_array_equal(lo, net.values([lo_in])[-1])
    np.testing.assert_array_equal(hi, net.values([hi_in])[-1])


@pytest.mark.parametrize("kind,case", [(k, i) for k, cases in ROUNDED_MONOTONE.items() for i in range(len(cases))])
def test_rounding_monotone_ops_end_near_the_images_of_the_ends(kind, case):
    attrs, shape = ROUNDED_MONOTONE[kind][case]
    net = _monotone_net(kind, attrs, shape)
    lo_in, hi_in = _x_box(shape, case)
    lows, highs = [lo_in], [hi_in]
    if kind == "safe_log":
        lows, highs = [lo_in, np.array(1e-3)], [hi_in, np.array(0.5)]
    lo, hi = net.boxes(lows, highs)[-1]
    f_lo, f_hi = net.values(lows)[-1], net.values(highs)[-1]
    tol = 1e-13 * (1 + np.abs(lo_in).sum() + np.abs(hi_in).sum())
    assert np.all(lo <= f_lo) and np.all(f_hi <= hi)
    assert np.max(f_lo - lo) <= tol and np.max(hi - f_hi) <= tol, (np.max(f_lo - lo), np.max(hi - f_hi))


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_concat_gather_and_gather_elements_on_every_axis_are_exact(axis):
    shape = (3, 4, 5)
    a, b = _x_box(shape, 10 + axis), _x_box(shape, 20 + axis)
    net = Net()
    x, y = net.input(shape), net.input(shape)
    idx_shape = tuple(2 if d == axis else n for d, n in enumerate(shape))
    i_flat, i_elem = net.input((2, 2), "int64"), net.input(idx_shape, "int64")
    cat = net.add("concat", [x, y], {"axis": axis})
    gat = net.add("gather", [x, i_flat], {"axis": axis})
    gel = net.add("gather_elements", [y, i_elem], {"axis": axis})
    rng = np.random.default_rng(axis)
    flat = rng.integers(0, shape[axis], (2, 2)).astype(np.int64)
    elem = rng.integers(0, shape[axis], idx_shape).astype(np.int64)
    boxes = net.boxes([a[0], b[0], flat, elem], [a[1], b[1], flat, elem])
    for end, xs in ((0, [a[0], b[0], flat, elem]), (1, [a[1], b[1], flat, elem])):
        values = net.values(xs)
        for nid in (cat, gat, gel):
            np.testing.assert_array_equal(boxes[nid][end], values[nid], err_msg=net.nodes[nid].kind)


def test_const_box_is_its_values():
    net = Net()
    values = np.array([[0.1, -2.0], [3e300, 5e-324]])
    c = net.add("const", [], {}, shape=(2, 2), values=values)
    lo, hi = net.boxes([], [])[c]
    np.testing.assert_array_equal(lo, values)
    np.testing.assert_array_equal(hi, values)


# -- affine ops: c +- |W| r, the exact range ------------------------------------------------------

def _affine_net(kind, attrs, shape, rec, const_operand=None):
    net = Net()
    x = net.input(shape)
    if kind == "matmul":
        w = net.add("const", [], {}, shape=const_operand.shape, values=const_operand)
        net.add("matmul", [x, w])
    else:
        out = shape[:-1] + (rec["weight"].shape[0],) if kind == "linear" else None
        net.add(kind, [x], attrs, shape=out, **rec)
    return net


def _abs_record(kind, rec):
    """The same op with |W| and no offset: applied to the radius it gives each output's exact half-width."""
    if kind == "batch_norm_eval":
        return {**rec, "weight": np.abs(rec["weight"]), "bias": np.zeros_like(rec["bias"]),
                "running_mean": np.zeros_like(rec["running_mean"])}
    return {**rec, "weight": np.abs(rec["weight"]), "bias": np.zeros_like(rec["bias"])}


def _affine_cases():
    rng = np.random.default_rng(30)
    cases = [("linear", {}, (2, 3, 4), {"weight": rng.normal(size=(5, 4)), "bias": rng.normal(size=5)})]
    for ca in range(3):
        shape = (2, 3, 4)
        c = shape[ca]
        cases.append(("batch_norm_eval", {"channel_axis": ca, "channels": c, "eps": 1e-5}, shape,
                      {"weight": rng.normal(size=c), "bias": rng.normal(size=c), "running_mean": rng.normal(size=c),
                       "running_var": rng.uniform(0.1, 2, c)}))
    for ca in (0, 1):
        shape = (2,) * ca + (4, 5, 6)
        conv = dict(spatial_rank=2, kernel=[2, 3], stride=[1, 2], padding=[1, 0], padding_after=[0, 1],
                    dilation=[2, 1], groups=2, channel_axis=ca, in_channels=4, out_channels=6)
        cases.append(("conv", conv, shape, {"weight": rng.normal(size=(6, 2, 2, 3)), "bias": rng.normal(size=6)}))
        convt = dict(conv, output_padding=[1, 0], out_channels=4)
        cases.append(("conv_transpose", convt, shape, {"weight": rng.normal(size=(4, 2, 2, 3)),
                                                       "bias": rng.normal(size=4)}))
    return cases


AFFINE = _affine_cases()


@pytest.mark.parametrize("case", range(len(AFFINE)), ids=lambda i: f"{AFFINE[i][0]}-{i}")
def test_affine_boxes_are_centre_plus_minus_abs_weight_times_radius(case):
    kind, attrs, shape, rec = AFFINE[case]
    lo_in, hi_in = _x_box(shape, case)
    net, abs_net = _affine_net(kind, attrs, shape, rec), _affine_net(kind, attrs, shape, _abs_record(kind, rec))
    lo, hi = net.boxes(lo_in, hi_in)[-1]
    centre, radius = (lo_in + hi_in) / 2, (hi_in - lo_in) / 2
    f_c, half = net.values([centre])[-1], abs_net.values([radius])[-1]
    tol = 1e-12 * (1 + abs_net.values([np.abs(centre) + radius])[-1].max() + np.abs(rec["bias"]).max())
    assert np.all(lo <= f_c - half + tol) and np.all(f_c + half - tol <= hi)
    np.testing.assert_allclose(lo, f_c - half, rtol=0, atol=tol)
    np.testing.assert_allclose(hi, f_c + half, rtol=0, atol=tol)


@pytest.mark.parametrize("shapes", [((2, 3), (3, 4)), ((2, 2, 3), (3,)), ((3,), (2, 3, 4))], ids=str)
def test_matmul_with_a_constant_operand_is_the_exact_range(shapes):
    x_shape, w_shape = shapes
    rng = np.random.default_rng(len(x_shape))
    w = rng.normal(size=w_shape)
    lo_in, hi_in = _x_box(x_shape, 3)
    lo, hi = _affine_net("matmul", {}, x_shape, {}, w).boxes(lo_in, hi_in)[-1]
    centre, radius = (lo_in + hi_in) / 2, (hi_in - lo_in) / 2
    f_c, half = np.matmul(centre, w), np.matmul(radius, np.abs(w))
    tol = 1e-12 * (1 + np.matmul(np.abs(centre) + radius, np.abs(w)).max())
    np.testing.assert_allclose(lo, f_c - half, rtol=0, atol=tol)
    np.testing.assert_allclose(hi, f_c + half, rtol=0, atol=tol)


def test_matmul_and_mul_of_two_boxes_on_point_boxes_are_the_float_products():
    rng = np.random.default_rng(4)
    a, b = rng.normal(size=(2, 3, 4)), rng.normal(size=(4, 5))
    net = Net()
    x, y = net.input(a.shape), net.input(b.shape)
    mm = net.add("matmul", [x, y])
    lo, hi = net.boxes([a, b], [a, b])[mm]
    exact = np.matmul(a, b)
    assert np.all(lo <= exact) and np.all(exact <= hi) and np.max(hi - lo) <= 1e-14


# -- softmax, log_softmax, hard_masked_softmax and layernorm on every axis -----------------------

def _mp_softmax(row):
    e = [mp.exp(mp.mpf(float(v))) for v in row]
    s = sum(e)
    return [v / s for v in e]


@pytest.mark.parametrize("axis", [0, 1, 2])
@pytest.mark.parametrize("kind", ["softmax", "log_softmax"])
def test_softmax_boxes_are_exact_per_entry_ranges_on_every_axis(kind, axis):
    """Entry i is smallest at (x_i = lo_i, x_j = hi_j) and largest at (hi_i, lo_j): both ends attained."""
    shape = (2, 3, 4)
    lo_in, hi_in = _x_box(shape, 40 + axis, radius=1.5)
    lo, hi = unary_net(kind, shape, {"axis": axis}).boxes(lo_in, hi_in)[1]
    f = (lambda row: _mp_softmax(row)) if kind == "softmax" else (lambda row: [mp.log(p) for p in _mp_softmax(row)])
    a, b = np.moveaxis(lo_in, axis, -1), np.moveaxis(hi_in, axis, -1)
    out_lo, out_hi = np.moveaxis(lo, axis, -1), np.moveaxis(hi, axis, -1)
    for idx in np.ndindex(a.shape[:-1]):
        for i in range(a.shape[-1]):
            low_row, high_row = b[idx].copy(), a[idx].copy()
            low_row[i], high_row[i] = a[idx][i], b[idx][i]
            exact_lo, exact_hi = f(low_row)[i], f(high_row)[i]
            assert mp.mpf(float(out_lo[idx][i])) <= exact_lo and exact_hi <= mp.mpf(float(out_hi[idx][i]))
            scale = 1 + max(np.abs(a[idx]).max(), np.abs(b[idx]).max())
            assert_near(out_lo[idx][i], exact_lo, unary_tolerance(exact_lo, 2 * scale), (kind, axis, idx, i))
            assert_near(out_hi[idx][i], exact_hi, unary_tolerance(exact_hi, 2 * scale), (kind, axis, idx, i))


def test_hard_masked_softmax_is_exact_on_the_allowed_entries_and_zero_elsewhere():
    shape = (2, 3, 4)
    rng = np.random.default_rng(6)
    allowed = rng.random(shape) < 0.7
    allowed[..., 0] = True
    lo_in, hi_in = _x_box(shape, 7, radius=1.0)
    attrs = {"mask_shape": shape, "allowed": tuple(bool(v) for v in allowed.reshape(-1))}
    lo, hi = unary_net("hard_masked_softmax", shape, attrs).boxes(lo_in, hi_in)[1]
    assert np.all(lo[~allowed] == 0) and np.all(hi[~allowed] == 0)
    for idx in np.ndindex(shape[:-1]):
        keep = np.flatnonzero(allowed[idx])
        for k, i in enumerate(keep):
            low_row, high_row = hi_in[idx][keep].copy(), lo_in[idx][keep].copy()
            low_row[k], high_row[k] = lo_in[idx][i], hi_in[idx][i]
            exact_lo, exact_hi = _mp_softmax(low_row)[k], _mp_softmax(high_row)[k]
            scale = 1 + max(np.abs(lo_in[idx]).max(), np.abs(hi_in[idx]).max())
            assert_near(lo[idx][i], exact_lo, unary_tolerance(exact_lo, 2 * scale), (idx, i))
            assert_near(hi[idx][i], exact_hi, unary_tolerance(exact_hi, 2 * scale), (idx, i))


def _mp_layernorm(x, axis, gamma, beta, eps=1e-5):
    """mpmath reference: normalize over the suffix ``x.shape[axis:]`` (TorchLean's layernorm)."""
    lead = x.shape[:axis]
    flat = x.reshape(lead + (-1,))
    g, b = gamma.reshape(-1), beta.reshape(-1)
    out = np.empty(flat.shape, dtype=object)
    for idx in np.ndindex(lead):
        row = [mp.mpf(float(v)) for v in flat[idx]]
        mean = sum(row) / len(row)
        var = sum((v - mean) ** 2 for v in row) / len(row)
        out[idx] = [(v - mean) / mp.sqrt(var + mp.mpf(eps)) * mp.mpf(float(gg)) + mp.mpf(float(bb))
                    for v, gg, bb in zip(row, g, b)]
    return out.reshape(x.shape)


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_layernorm_on_every_axis_is_tight_on_points_and_encloses_boxes(axis):
    shape = (2, 3, 4)
    rng = np.random.default_rng(50 + axis)
    gamma, beta = rng.normal(size=shape[axis:]), rng.normal(size=shape[axis:])
    net = unary_net("layernorm", shape, {"axis": axis, "eps": 1e-5})
    net.payload.set(1, "weight", gamma)
    net.payload.set(1, "bias", beta)
    x = rng.normal(size=shape)
    lo, hi = net.boxes(x, x)[1]
    exact = _mp_layernorm(x, axis, gamma, beta)
    for idx in np.ndindex(shape):
        assert mp.mpf(float(lo[idx])) <= exact[idx] <= mp.mpf(float(hi[idx]))
        assert hi[idx] - lo[idx] <= 1e-12, (axis, idx, lo[idx], hi[idx])
    lo_in, hi_in = x - 0.05, x + 0.05
    lo, hi = net.boxes(lo_in, hi_in)[1]
    for k in range(6):
        point = lo_in + rng.random(shape) * (hi_in - lo_in) if k else lo_in
        exact = _mp_layernorm(np.clip(point, lo_in, hi_in), axis, gamma, beta)
        for idx in np.ndindex(shape):
            assert mp.mpf(float(lo[idx])) <= exact[idx] <= mp.mpf(float(hi[idx])), (axis, idx)


# -- reductions and losses with exact ranges ----------------------------------------------------

@pytest.mark.parametrize("axes,keepdim", [((0,), False), ((1,), True), ((2,), False), ((0, 2), True)])
def test_reduce_prod_is_the_exact_corner_range(axes, keepdim):
    shape = (2, 3, 2)
    rng = np.random.default_rng(sum(axes))
    c = rng.normal(size=shape)
    r = rng.uniform(0, 1.2, shape) * (rng.random(shape) < 0.7)
    lo_in, hi_in = c - r, c + r
    lo, hi = unary_net("reduce_prod", shape, {"axes": list(axes), "keepdim": keepdim}).boxes(lo_in, hi_in)[1]
    a, b = np.moveaxis(lo_in, axes, range(-len(axes), 0)), np.moveaxis(hi_in, axes, range(-len(axes), 0))
    k = math.prod(shape[ax] for ax in axes)
    a, b = a.reshape(a.shape[:a.ndim - len(axes)] + (k,)), b.reshape(b.shape[:b.ndim - len(axes)] + (k,))
    lo, hi = lo.reshape(a.shape[:-1]), hi.reshape(a.shape[:-1])
    for idx in np.ndindex(a.shape[:-1]):
        values = [math.prod(Fraction(v) for v in corner)
                  for corner in itertools.product(*[{x, y} for x, y in zip(a[idx], b[idx])])]
        for end, exact in ((lo[idx], min(values)), (hi[idx], max(values))):
            assert abs(Fraction(end) - exact) <= Fraction(16 * ulp(float(exact))) + Fraction(1e-300), (idx, end, exact)
        assert Fraction(lo[idx]) <= min(values) and max(values) <= Fraction(hi[idx])


def test_mse_loss_is_the_exact_range():
    rng = np.random.default_rng(8)
    (y_lo, y_hi), (t_lo, t_hi) = _x_box((3, 4), 1), _x_box((3, 4), 2)
    net = Net()
    net.add("mse_loss", [net.input((3, 4)), net.input((3, 4))])
    lo, hi = net.boxes([y_lo, t_lo], [y_hi, t_hi])[2]
    d_lo, d_hi = [Fraction(a) - Fraction(b) for a, b in zip(y_lo.flat, t_hi.flat)], \
                 [Fraction(a) - Fraction(b) for a, b in zip(y_hi.flat, t_lo.flat)]
    sq_lo = [Fraction(0) if a <= 0 <= b else min(a * a, b * b) for a, b in zip(d_lo, d_hi)]
    sq_hi = [max(a * a, b * b) for a, b in zip(d_lo, d_hi)]
    exact_lo, exact_hi = sum(sq_lo) / 12, sum(sq_hi) / 12
    del rng
    for end, exact in ((lo, exact_lo), (hi, exact_hi)):
        assert abs(Fraction(float(end)) - exact) <= Fraction(64 * ulp(float(exact))), (end, exact)
    assert Fraction(float(lo)) <= exact_lo and exact_hi <= Fraction(float(hi))


def test_every_rule_has_a_tightness_check():
    """A new interval rule needs a case in one of this file's tables (or a test below naming it)."""
    covered = ({_kind(k) for k in UNARY} | set(BINARY) | set(FLOAT_EXACT_MONOTONE) | set(ROUNDED_MONOTONE)
               | {kind for kind, *_ in AFFINE}
               | {"lt", "le", "gt", "ge", "eq", "ne", "logical_and", "logical_or", "logical_not", "where", "cast",
                  "bernoulli_mask", "rand_uniform", "isnan", "argmax", "argmin", "concat", "gather",
                  "gather_elements", "const", "matmul", "softmax", "log_softmax", "hard_masked_softmax",
                  "layernorm", "reduce_prod", "mse_loss"}
               | INTEGER_REFUSALS  # integer ops and mod refuse boxes by name: tests/test_onnx_breadth.py
               | {"round_float", "int_wrap", "int_matmul", "int_conv"}  # tests/test_element_types.py, test_quantization.py
               | {"cumprod"} | set(MISC_REFUSALS)  # tests/test_onnx_misc_ops.py (exact bounds, refusals)
               | set(NO_SPATIAL_INTERVAL_RULE) | {"lp_pool_nd", "col2im", "grid_sample"}  # tests/test_spatial_ops.py
               | set(SELECT_REFUSALS) | {"pow_elem"}  # tests/test_select_ops.py (refusals by name, pow_elem's boxes)
               | set(INT_REDUCTIONS) | {"dynamic_slice"})  # tests/test_onnx_long_tail.py (refusals, the exact hull)
    missing = sorted(set(INTERVAL_RULES) - set(NO_RULE) - {"input"} - covered)  # input: the seeded box itself
    assert not missing, f"interval rules without a tightness check in {__file__}: {missing}"
    for kind in NO_RULE:
        net = unary_net(kind, (1,), {"name": "f", "input_shapes": [[1]], "output_shape": [1]}) \
            if kind == "custom" else unary_net(kind, (1,))
        with pytest.raises(IntervalError, match=rf"^interval: node 1 \({kind}\): no interval rule for {kind}: "):
            net.boxes(np.zeros(1), np.zeros(1))
