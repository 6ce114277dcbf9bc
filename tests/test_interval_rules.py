"""Soundness of every interval rule: random boxes, random points inside, exact or 60-digit references.

For each rule, hypothesis draws boxes (moderate, huge, tiny and subnormal magnitudes, degenerate
[a, a], boxes straddling 0) and points inside them (the ends included); the exact real value of the
op at the point, computed with fractions (rational ops) or mpmath at 60 digits (transcendentals),
must lie inside the propagated box. The references never use our code.
"""

from __future__ import annotations

import math
from fractions import Fraction

import mpmath as mp
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from semantics.interval import INTERVAL_RULES
from semantics.interval_arith import DomainError
from semantics.rules import POINTWISE_INTERVAL_KINDS
from torchlean_bridge.graph import Node

mp.mp.dps = 60
SETTINGS = settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])

EDGES = [0.0, -0.0, 5e-324, -5e-324, 2.2e-308, 1e-310, 1.0, -1.0, 0.5, 1e300, -1e300, 1e-300,
         math.pi / 2, -math.pi / 2, math.pi, 3 * math.pi / 2, -1.2784645427610738, -0.7517915246935645,
         -1.5, -3.0, 3.0, 20.0, -20.0, 710.0, -745.0, 40.0]
VALUES = st.one_of(st.floats(-8, 8), st.floats(-1e-300, 1e-300), st.sampled_from(EDGES), st.floats(-1e6, 1e6),
                   st.floats(allow_nan=False, allow_infinity=False, width=64))


@st.composite
def boxes_and_points(draw, n_max: int = 5):
    """(lo, hi, point) arrays: each entry a box and a point of it (an end, or inside)."""
    n = draw(st.integers(1, n_max))
    lo, hi, pt = [], [], []
    for _ in range(n):
        a, b = draw(VALUES), draw(VALUES)
        if draw(st.booleans()):
            b = a  # degenerate box
        a, b = min(a, b), max(a, b)
        t = draw(st.one_of(st.just(0.0), st.just(1.0), st.floats(0, 1)))
        x = a + t * (b - a) if math.isfinite(b - a) else (a if t < 0.5 else b)
        lo.append(a), hi.append(b), pt.append(min(max(x, a), b))
    return np.array(lo), np.array(hi), np.array(pt)


def node_attrs(kind: str, **attrs) -> dict:
    return dict(Node(1, [0], kind, (1,), attrs).attrs)


def mpf(x: float) -> mp.mpf:
    return mp.mpf(float(x))


def inside(ref, lo: float, hi: float) -> bool:
    return mpf(lo) <= ref <= mpf(hi)


def _round_half_even(x):
    f = mp.floor(x)
    d = x - f
    return f + 1 if d > 0.5 or (d == 0.5 and int(f) % 2) else f


def _sigmoid(x):
    return 1 / (1 + mp.exp(-x))


def _softplus(x):
    return mp.log1p(mp.exp(x)) if x < 0 else x + mp.log1p(mp.exp(-x))


GE0, GT0, NE0, UNIT = ("ge", 0.0), ("gt", 0.0), ("ne", 0.0), ("in", (-1.0, 1.0))


def in_domain(domain, x: float) -> bool:
    op, c = domain
    if op == "in":
        return c[0] <= x <= c[1]
    return {"ge": x >= c, "gt": x > c, "ne": x != c}[op]


def box_leaves_domain(domain, lo: float, hi: float) -> bool:
    op, c = domain
    if op == "in":
        return lo < c[0] or hi > c[1]
    return {"ge": lo < c, "gt": lo <= c, "ne": lo <= c <= hi}[op]


SELU_A, SELU_S = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946

# kind -> (attrs, exact reference at a point, domain of the point)
UNARY = {
    "relu": ({}, lambda x, a: max(x, 0), None),
    "abs": ({}, lambda x, a: abs(x), None),
    "neg": ({}, lambda x, a: -x, None),
    "sqrt": ({}, lambda x, a: mp.sqrt(x), GE0),
    "inv": ({}, lambda x, a: 1 / x, NE0),
    "rsqrt": ({}, lambda x, a: 1 / mp.sqrt(x), GT0),
    "exp": ({}, lambda x, a: mp.exp(x), None),
    "expm1": ({}, lambda x, a: mp.expm1(x), None),
    "log": ({}, lambda x, a: mp.log(x), GT0),
    "log1p": ({}, lambda x, a: mp.log1p(x), ("gt", -1.0)),
    "tanh": ({}, lambda x, a: mp.tanh(x), None),
    "sigmoid": ({}, lambda x, a: _sigmoid(x), None),
    "softplus": ({}, lambda x, a: _softplus(x), None),
    "erf": ({}, lambda x, a: mp.erf(x), None),
    "softsign": ({}, lambda x, a: x / (1 + abs(x)), None),
    "sin": ({}, lambda x, a: mp.sin(x), None),
    "cos": ({}, lambda x, a: mp.cos(x), None),
    "tan": ({}, lambda x, a: mp.tan(x), None),
    "atan": ({}, lambda x, a: mp.atan(x), None),
    "asin": ({}, lambda x, a: mp.asin(x), UNIT),
    "acos": ({}, lambda x, a: mp.acos(x), UNIT),
    "sinh": ({}, lambda x, a: mp.sinh(x), None),
    "cosh": ({}, lambda x, a: mp.cosh(x), None),
    "asinh": ({}, lambda x, a: mp.asinh(x), None),
    "acosh": ({}, lambda x, a: mp.acosh(x), ("ge", 1.0)),
    "atanh": ({}, lambda x, a: mp.atanh(x) if abs(x) < 1 else mp.sign(x) * mp.inf, UNIT),
    "exp2": ({}, lambda x, a: mp.power(2, x), None),
    "log2": ({}, lambda x, a: mp.log(x, 2), GT0),
    "round": ({}, lambda x, a: _round_half_even(x), None),
    "trunc": ({}, lambda x, a: mp.sign(x) * mp.floor(abs(x)), None),
    "gelu": ({"approximate": "none"}, lambda x, a: x * (1 + mp.erf(x / mp.sqrt(2))) / 2, None),
    "gelu_tanh": ({"approximate": "tanh"},
                  lambda x, a: x * (1 + mp.tanh(mp.sqrt(2 / mp.pi) * (x + mpf(0.044715) * x ** 3))) / 2, None),
    "silu": ({}, lambda x, a: x * _sigmoid(x), None),
    "mish": ({}, lambda x, a: x * mp.tanh(_softplus(x)), None),
    "hardswish": ({}, lambda x, a: x * min(max(x + 3, 0), 6) / 6, None),
    "leaky_relu": ({"negative_slope": 0.01}, lambda x, a: x if x > 0 else mpf(a["negative_slope"]) * x, None),
    "leaky_relu_neg": ({"negative_slope": -0.5}, lambda x, a: x if x > 0 else mpf(a["negative_slope"]) * x, None),
    "elu": ({"alpha": 1.0}, lambda x, a: x if x > 0 else mpf(a["alpha"]) * mp.expm1(x), None),
    "elu_neg": ({"alpha": -0.7}, lambda x, a: x if x > 0 else mpf(a["alpha"]) * mp.expm1(x), None),
    "selu": ({}, lambda x, a: mpf(SELU_S) * (x if x > 0 else mpf(SELU_A) * mp.expm1(x)), None),
    "celu": ({"alpha": 0.3}, lambda x, a: max(x, 0) + min(0, mpf(a["alpha"]) * mp.expm1(x / mpf(a["alpha"]))),
             None),
    "hardsigmoid": ({}, lambda x, a: min(max(mpf(a["alpha"]) * x + mpf(a["beta"]), 0), 1), None),
    "clamp": ({"min": -0.5, "max": 2.0}, lambda x, a: min(max(x, mpf(a["min"])), mpf(a["max"])), None),
    "sign": ({}, lambda x, a: mp.sign(x), None),
    "floor": ({}, lambda x, a: mp.floor(x), None),
    "ceil": ({}, lambda x, a: mp.ceil(x), None),
    "pow2": ({"exponent": 2.0}, lambda x, a: x ** 2, None),
    "pow3": ({"exponent": 3.0}, lambda x, a: x ** 3, None),
    "pow-1": ({"exponent": -1.0}, lambda x, a: x ** -1, NE0),
    "pow-2": ({"exponent": -2.0}, lambda x, a: x ** -2, NE0),
    "pow0.5": ({"exponent": 0.5}, lambda x, a: mp.sqrt(x), GE0),
    "pow1.5": ({"exponent": 1.5}, lambda x, a: x ** mpf(1.5), GE0),
}


def _kind(name: str) -> str:
    return {"gelu_tanh": "gelu", "leaky_relu_neg": "leaky_relu", "elu_neg": "elu"}.get(name, name.split("pow")[0] or "pow")


# relu, clamp, sign, floor, ceil: the float rule on both ends (exact in floating point)
ENDPOINT_UNARY = {"relu", "clamp", "sign", "floor", "ceil", "round", "trunc"}


def unary_box(kind: str, lo: np.ndarray, hi: np.ndarray, attrs: dict) -> tuple[np.ndarray, np.ndarray]:
    """The rule the propagator runs for ``kind`` (``INTERVAL_RULES``), on one node."""
    return INTERVAL_RULES[kind](Node(1, [0], kind, lo.shape, attrs), [(lo, hi)], {})


def test_every_unary_rule_is_tested():
    assert {_kind(k) for k in UNARY} == POINTWISE_INTERVAL_KINDS | ENDPOINT_UNARY
    assert not ENDPOINT_UNARY & POINTWISE_INTERVAL_KINDS


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_rule_encloses_the_exact_value(name):
    attrs_override, ref, domain = UNARY[name]
    kind = _kind(name)
    attrs = node_attrs(kind, **attrs_override)

    @SETTINGS
    @given(boxes_and_points())
    def check(bp):
        lo, hi, pt = bp
        try:
            with np.errstate(all="ignore"):
                out_lo, out_hi = unary_box(kind, lo, hi, attrs_override)
        except DomainError:
            # refusing is sound only when the box really leaves the domain
            assert domain is not None and any(box_leaves_domain(domain, a, b) for a, b in zip(lo, hi))
            return
        assert out_lo.shape == lo.shape and out_hi.shape == hi.shape
        assert not np.any(np.isnan(out_lo)) and not np.any(np.isnan(out_hi))
        for i, x in enumerate(pt):
            if domain is not None and not in_domain(domain, x):
                continue
            value = ref(mpf(x), attrs)
            assert inside(value, out_lo[i], out_hi[i]), (name, lo[i], hi[i], x, value, out_lo[i], out_hi[i])

    check()


def test_tanh_is_tight_not_the_codomain():
    lo, hi = unary_box("tanh", np.array([0.020775]), np.array([0.03564]), {})
    assert 0 < hi[0] - lo[0] < 0.0149
    assert lo[0] == pytest.approx(math.tanh(0.020775), abs=4e-15)


def test_periodic_extrema_are_found():
    lo, hi = unary_box("sin", np.array([1.0, 2.0, -2.0]), np.array([2.0, 2.5, -1.0]), {})
    assert hi[0] == 1.0 and lo[0] == pytest.approx(math.sin(1.0), abs=4e-15)
    assert hi[1] == pytest.approx(math.sin(2.0), abs=4e-15) and lo[1] == pytest.approx(math.sin(2.5), abs=4e-15)
    assert lo[2] == -1.0
    lo, hi = unary_box("gelu", np.array([-2.0]), np.array([0.5]), {})
    assert lo[0] == pytest.approx(-0.16997120747990366, abs=4e-14)


# -- binary elementwise rules, exact rational references ----------------------------------------

BINARY = {
    "add": (lambda a, b: a + b, None),
    "sub": (lambda a, b: a - b, None),
    "mul_elem": (lambda a, b: a * b, None),
    "div": (lambda a, b: a / b, NE0),
    "max_elem": (max, None),
    "min_elem": (min, None),
    "prelu": (lambda a, b: a if a >= 0 else b * a, None),
}

FINITE_MODERATE = st.one_of(st.floats(-1e6, 1e6), st.floats(-1e-300, 1e-300), st.sampled_from(EDGES))


@pytest.mark.parametrize("kind", sorted(BINARY))
def test_binary_rule_encloses_the_exact_value(kind):
    ref, domain = BINARY[kind]
    node = Node(2, [0, 1], kind, (1,))

    @SETTINGS
    @given(boxes_and_points(), st.data())
    def check(bp, data):
        lo, hi, pt = bp
        n = len(lo)
        raw = [sorted([data.draw(FINITE_MODERATE), data.draw(FINITE_MODERATE)]) for _ in range(n)]
        lo2, hi2 = np.array([r[0] for r in raw]), np.array([r[1] for r in raw])
        pt2 = np.array([data.draw(st.sampled_from([r[0], r[1], (r[0] + r[1]) / 2])) for r in raw])
        assume(np.all(np.isfinite(lo)) and np.all(np.isfinite(hi)))
        try:
            out_lo, out_hi = INTERVAL_RULES[kind](node, [(lo, hi), (lo2, hi2)], {})
        except DomainError:
            assert domain is not None and np.any((lo2 <= 0) & (hi2 >= 0))
            return
        for i in range(n):
            value = ref(Fraction(pt[i]), Fraction(pt2[i]))
            for end, op in ((out_lo[i], "lo"), (out_hi[i], "hi")):
                if math.isinf(end):
                    assert (end < 0) == (op == "lo")
                    continue
                assert (Fraction(end) <= value) if op == "lo" else (value <= Fraction(end)), (kind, i, value, end)

    check()


def test_inv_on_a_box_containing_zero_is_unbounded_and_contains_the_float_infinities():
    """The float inv gives +inf at +0 and -inf at -0 (both in any box holding 0): [-inf, inf]."""
    import torchlean_bridge as tlb
    lo, hi = unary_box("inv", np.array([-1.0, 0.0, -2.0, 0.0, 0.5]), np.array([2.0, 3.0, 0.0, 0.0, 4.0]), {})
    assert lo[:4].tolist() == [-math.inf] * 4 and hi[:4].tolist() == [math.inf] * 4
    assert mpf(lo[4]) <= mp.mpf(1) / 4 and mpf(hi[4]) >= 2
    g = tlb.Graph([Node(0, [], "input", [3]), Node(1, [0], "inv", [3])])
    report = tlb.check_containment(g, None, np.array([-0.0, 0.0, -1.0]), np.array([0.0, 1.0, 1.0]), samples=8)
    assert report.samples >= 8


def test_sigmoid_box_ends_are_the_point_enclosures_ends_bit_for_bit():
    """The sigmoid box rule widens only the end it keeps (``_sigmoid_end``): its ends must be exactly
    ``monotone(sigmoid_at, box)``'s, NaN where those are NaN, over ordinary values, subnormals, the
    exp underflow and overflow edges and infinities (their soundness is tested against mpmath above)."""
    from semantics.interval_arith import monotone
    from semantics.rules.activations import sigmoid_at
    rng = np.random.default_rng(3)
    special = np.array([0.0, -0.0, 5e-324, -5e-324, 1e-300, -708.4, -709.78, -745.2, -746.0, 709.8, 800.0,
                        -np.inf, np.inf, np.nan, 36.7, -36.7])
    ends = np.concatenate([rng.normal(0, 5, 4000), rng.uniform(-800, 800, 2000), special])
    lo = np.sort(rng.choice(ends, (2, 3000)), axis=0)
    box = (lo[0].reshape(50, 60), lo[1].reshape(50, 60))
    got = unary_box("sigmoid", *box, {})
    want = monotone(sigmoid_at, box)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype == np.float64
        assert np.array_equal(np.isnan(g), np.isnan(w)) and g.tobytes() == w.tobytes()
