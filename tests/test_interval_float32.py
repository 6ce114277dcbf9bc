"""IBP with float32 products (``products="float32"``): sound in exact arithmetic, close to float64.

The hard cases for a float32 product are a large center with a tiny radius (float32 rounding of
the center is then far above the radius: a plain float32 IBP is unsound there) and long sums; the
bound must still enclose the exact real image, checked here with ``fractions.Fraction``.
"""

from __future__ import annotations

import copy
from fractions import Fraction

import numpy as np
import pytest
import torch
import torch.nn as nn

import torchlean_bridge as tlb
from semantics.interval import IntervalPropagator
from semantics.rules.affine import AffineParams
from semantics.rules.affine32 import MIN_OUT_FLOAT32, conv_box32, float32_weights, linear_box32
from torchlean_bridge.errors import EvalError, IntervalError


def _f32(rng: np.random.Generator, shape: tuple[int, ...], scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32).astype(np.float64)


def _exact_linear(w: np.ndarray, b: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> tuple[list, list]:
    """The exact image of the box [lo, hi] (one sample) under x -> W x + b, as Fractions."""
    lows, highs = [], []
    for i in range(w.shape[0]):
        s_lo = s_hi = Fraction(b[i])
        for j in range(w.shape[1]):
            wij = Fraction(w[i, j])
            a, c = wij * Fraction(lo[j]), wij * Fraction(hi[j])
            s_lo, s_hi = s_lo + min(a, c), s_hi + max(a, c)
        lows.append(s_lo)
        highs.append(s_hi)
    return lows, highs


@pytest.fixture
def float32_everywhere(monkeypatch):
    """Float32 products even where their rounding dominates the width (large centers, tiny radii): the
    regimes where a plain float32 IBP is wrong, so the bound's constants are tested where they matter."""
    import semantics.rules.affine32 as affine32
    monkeypatch.setattr(affine32, "_WIDTH_COST", float("inf"))


@pytest.mark.parametrize("center_scale, radius", [(1.0, 0.1), (1000.0, 1e-6), (1e-30, 1e-38), (3e5, 0.5)])
def test_linear_encloses_exact_image(center_scale, radius, float32_everywhere):
    rng = np.random.default_rng(0)
    w, b = _f32(rng, (5, 40)), _f32(rng, (5,))
    c = rng.standard_normal((3, 40)) * center_scale
    r = np.abs(rng.standard_normal((3, 40))) * radius  # not uniform: the float32 path runs
    lo, hi = c - r, c + r
    p = AffineParams.of(w, b)
    assert float32_weights(p, 40) is not None
    got_lo, got_hi = linear_box32((lo, hi), p)
    from semantics.rules.affine import linear_box
    assert not np.array_equal(got_lo, linear_box((lo, hi), p)[0])  # the float32 path ran
    for k in range(3):
        want_lo, want_hi = _exact_linear(w, b, lo[k], hi[k])
        assert all(Fraction(g) <= e for g, e in zip(got_lo[k], want_lo))
        assert all(Fraction(g) >= e for g, e in zip(got_hi[k], want_hi))


def test_conv_encloses_exact_image_of_a_pixel(float32_everywhere):
    """Each conv output is a dot product over its window: check them all exactly on a small map."""
    rng = np.random.default_rng(1)
    cin, cout, k = 2, 3, 3
    w, b = _f32(rng, (cout, cin, k, k)), _f32(rng, (cout,))
    c = rng.standard_normal((1, cin, 5, 5)) * 100.0
    r = np.abs(rng.standard_normal((1, cin, 5, 5))) * 1e-4
    lo, hi = c - r, c + r
    attrs = dict(kernel=[k, k], stride=[1, 1], dilation=[1, 1], padding=[1, 1], padding_after=[1, 1], groups=1,
                 channel_axis=1, in_channels=cin, out_channels=cout, spatial_rank=2)
    got_lo, got_hi = conv_box32((lo, hi), AffineParams.of(w, b), attrs, (1, cout, 5, 5))
    from semantics.rules.affine import conv_box
    assert not np.array_equal(got_lo, conv_box((lo, hi), AffineParams.of(w, b), attrs, (1, cout, 5, 5))[0])
    pad = lambda a: np.pad(a[0], ((0, 0), (1, 1), (1, 1)))  # noqa: E731
    plo, phi = pad(lo), pad(hi)
    for o in range(cout):
        for y in range(5):
            for x in range(5):
                wl = w[o].reshape(1, -1)
                want_lo, want_hi = _exact_linear(wl, b[o:o + 1], plo[:, y:y + k, x:x + k].reshape(-1),
                                                 phi[:, y:y + k, x:x + k].reshape(-1))
                assert Fraction(got_lo[0, o, y, x]) <= want_lo[0]
                assert Fraction(got_hi[0, o, y, x]) >= want_hi[0]


def _net() -> nn.Module:
    torch.manual_seed(3)
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 6, 3, stride=2, padding=1), nn.ReLU(),
                         nn.Flatten(), nn.Linear(6 * 4 * 4, 70), nn.ReLU(), nn.Linear(70, 7))  # 70: float32 products


def assert_sound_and_close(net: nn.Module, x: torch.Tensor, eps: float, samples: int, seed: int) -> None:
    """Float32-product boxes of ``net`` over the l-inf ball: at most 1e-3 wider than the float64 rule's
    (point rows aside), and holding the float64 and float32 values at sampled points and corners."""
    bundle = tlb.import_fx(net, (x,))
    g, out = bundle.graph, bundle.graph.outputs[0]
    assert {"conv", "linear"} <= {n.kind for n in g}
    c = x.double().numpy()
    lo64, hi64 = tlb.interval_bounds(g, bundle.payload, c - eps, c + eps, products="float64")[out]
    lo32, hi32 = tlb.interval_bounds(g, bundle.payload, c - eps, c + eps, products="float32")[out]
    assert np.all(hi32 - lo32 <= (hi64 - lo64) * (1.0 + 1e-3) + 1e-12)  # point rows: allowances of 1e-16
    rng = np.random.default_rng(seed)
    double = copy.deepcopy(net).double()
    for i in range(samples):
        point = c + (eps * rng.choice([-1.0, 1.0], c.shape) if i % 3 == 0 else rng.uniform(-eps, eps, c.shape))
        y = double(torch.from_numpy(point)).detach().numpy()
        y32 = net(torch.from_numpy(point).float()).detach().double().numpy()
        assert np.all(lo32 <= y) and np.all(y <= hi32)
        assert np.all(lo32 <= y32) and np.all(y32 <= hi32)


def test_network_sound_on_samples_and_close_to_float64():
    assert_sound_and_close(_net().eval(), torch.rand(8, 1, 8, 8), 0.02, 30, 4)


def test_float64_weights_and_tiny_uniform_radii_keep_the_float64_rule():
    rng = np.random.default_rng(5)
    w = rng.standard_normal((4, 9))  # not float32-representable
    p = AffineParams.of(w, rng.standard_normal(4))
    assert float32_weights(p, 9) is None
    lo = rng.standard_normal((2, 9))
    hi = lo + np.abs(rng.standard_normal((2, 9)))
    from semantics.rules.affine import linear_box
    for a, b in zip(linear_box32((lo, hi), p), linear_box((lo, hi), p)):
        assert np.array_equal(a, b)
    p32 = AffineParams.of(_f32(rng, (4, 9)), _f32(rng, (4,)))
    ball = (lo - 1e-9, lo + 1e-9)  # float32 centers would cost far more than 2**-9 of this width
    for a, b in zip(linear_box32(ball, p32), linear_box(ball, p32)):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("n, center_scale", [(9, 1.0), (600, 1.0), (600, 1e-30)])
def test_uniform_radius_float32_centers_enclose_the_exact_image(n, center_scale):
    """An l-inf ball (uniform radius): the center product in float32 (600 terms: three float32 pieces
    summed in float64), checked against the exact image in rational arithmetic, and within 2**-8 of the
    float64 rule's width."""
    rng = np.random.default_rng(n)
    w, b = _f32(rng, (5, n)), _f32(rng, (5,))
    c = rng.standard_normal((2, n)) * center_scale
    eps = 0.05 * center_scale
    lo, hi = c - eps, c + eps
    p = AffineParams.of(w, b)
    got_lo, got_hi = linear_box32((lo, hi), p)
    from semantics.rules.affine import linear_box
    ref_lo, ref_hi = linear_box((lo, hi), p)
    assert not np.array_equal(got_lo, ref_lo)  # the float32 path ran
    assert np.all(got_hi - got_lo <= (ref_hi - ref_lo) * (1.0 + 2.0 ** -8))
    for k in range(2):
        want_lo, want_hi = _exact_linear(w, b, lo[k], hi[k])
        assert all(Fraction(g) <= e for g, e in zip(got_lo[k], want_lo))
        assert all(Fraction(g) >= e for g, e in zip(got_hi[k], want_hi))


def test_uniform_radius_float32_conv_encloses_the_exact_image():
    rng = np.random.default_rng(2)
    cin, cout, k = 2, 3, 3
    w, b = _f32(rng, (cout, cin, k, k)), _f32(rng, (cout,))
    c = rng.standard_normal((1, cin, 5, 5))
    lo, hi = c - 0.01, c + 0.01
    attrs = dict(kernel=[k, k], stride=[2, 2], dilation=[1, 1], padding=[1, 1], padding_after=[0, 0], groups=1,
                 channel_axis=1, in_channels=cin, out_channels=cout, spatial_rank=2)
    from semantics.rules.affine import conv_box
    params = AffineParams.of(w, b)
    got_lo, got_hi = conv_box32((lo, hi), params, attrs, (1, cout, 2, 2))
    assert not np.array_equal(got_lo, conv_box((lo, hi), params, attrs, (1, cout, 2, 2))[0])
    plo, phi = (np.pad(a[0], ((0, 0), (1, 0), (1, 0))) for a in (lo, hi))
    for o in range(cout):
        for y in range(2):
            for x in range(2):
                window = (slice(None), slice(2 * y, 2 * y + k), slice(2 * x, 2 * x + k))
                want_lo, want_hi = _exact_linear(w[o].reshape(1, -1), b[o:o + 1], plo[window].reshape(-1),
                                                 phi[window].reshape(-1))
                assert Fraction(got_lo[0, o, y, x]) <= want_lo[0] and Fraction(got_hi[0, o, y, x]) >= want_hi[0]


def test_float32_overflow_falls_back_to_float64():
    rng = np.random.default_rng(6)
    p = AffineParams.of(_f32(rng, (3, 5)), _f32(rng, (3,)))
    lo = rng.standard_normal((1, 5)) * 1e200
    hi = lo + np.abs(rng.standard_normal((1, 5))) * 1e199
    from semantics.rules.affine import linear_box
    for a, b in zip(linear_box32((lo, hi), p), linear_box((lo, hi), p)):
        assert np.array_equal(a, b)


def test_products_argument_is_checked_and_prepared_forms_agree():
    net = _net().eval()
    x = torch.rand(2, 1, 8, 8)
    bundle = tlb.import_fx(net, (x,))
    c = x.double().numpy()
    with pytest.raises(IntervalError, match="products must be one of float64, float32, got 'float16'"):
        tlb.interval_bounds(bundle.graph, bundle.payload, c, c, products="float16")
    with pytest.raises(IntervalError, match="products must be one of"):
        IntervalPropagator(bundle.graph, bundle.payload, products=32)
    direct = tlb.interval_bounds(bundle.graph, bundle.payload, c - 0.1, c + 0.1, products="float32")
    prop = IntervalPropagator(bundle.graph, bundle.payload, products="float32")(c - 0.1, c + 0.1)
    prep = tlb.prepare(bundle.graph, bundle.payload).interval_bounds(c - 0.1, c + 0.1, products="float32")
    for (a, b), (e, f), (g, h) in zip(direct, prop, prep):
        assert np.array_equal(a, e) and np.array_equal(b, f) and np.array_equal(a, g) and np.array_equal(b, h)
    # float32 products are every entry point's default (and CROWN's own boxes keep float64)
    defaults = [tlb.interval_bounds(bundle.graph, bundle.payload, c - 0.1, c + 0.1),
                IntervalPropagator(bundle.graph, bundle.payload)(c - 0.1, c + 0.1),
                tlb.prepare(bundle.graph, bundle.payload).interval_bounds(c - 0.1, c + 0.1)]
    wide = tlb.interval_bounds(bundle.graph, bundle.payload, c - 0.1, c + 0.1, products="float64")
    out = bundle.graph.outputs[0]
    for boxes in defaults:
        assert all(np.array_equal(a, e) for a, e in zip(boxes[out], direct[out]))
    assert not np.array_equal(direct[out][1], wide[out][1])  # the net's layers do take the float32 rule
    crown = tlb.linear_bounds(bundle.graph, bundle.payload, c - 0.1, c + 0.1, method="ibp")
    assert np.array_equal(crown.upper[0], wide[out][1])


class _Grouped(nn.Module):
    """A grouped, dilated, strided conv and a linear over a 3-D activation."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 6, 3, stride=2, padding=2, dilation=2, groups=2)
        self.head = nn.Linear(5, MIN_OUT_FLOAT32)  # wide enough for float32 products

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.conv(x))  # [b, 6, 5, 5]
        return self.head(h.reshape(h.shape[0], 30, 5))


def test_grouped_dilated_conv_and_3d_linear():
    torch.manual_seed(7)
    assert_sound_and_close(_Grouped().eval(), torch.rand(3, 4, 9, 9), 0.03, 20, 8)


def test_narrow_linear_layers_keep_the_float64_rule():
    """Below MIN_OUT_FLOAT32 outputs the float32 rule would cost more than it saves: the float64 box."""
    torch.manual_seed(9)
    for width, same in ((MIN_OUT_FLOAT32 - 1, True), (MIN_OUT_FLOAT32, False)):
        net = nn.Sequential(nn.Linear(30, width)).eval()
        x = torch.rand(4, 30)
        bundle = tlb.import_fx(net, (x,))
        c = x.double().numpy()
        lo, hi = c - np.linspace(0.01, 0.02, 30), c + 0.01  # a radius that is not uniform
        out = bundle.graph.outputs[0]
        b64 = tlb.interval_bounds(bundle.graph, bundle.payload, lo, hi, products="float64")[out]
        b32 = tlb.interval_bounds(bundle.graph, bundle.payload, lo, hi, products="float32")[out]
        assert all(np.array_equal(a, b) for a, b in zip(b64, b32)) == same


def test_float32_is_declined_where_its_rounding_would_dominate_the_width():
    """A radius tiny next to the center (1e-6 around 1000): float32 products would widen the box by
    orders of magnitude, so the float64 rule's box is returned."""
    rng = np.random.default_rng(4)
    p = AffineParams.of(_f32(rng, (5, 40)), _f32(rng, (5,)))
    c = rng.standard_normal((3, 40)) * 1000.0
    r = np.abs(rng.standard_normal((3, 40))) * 1e-6
    from semantics.rules.affine import linear_box
    for a, b in zip(linear_box32((c - r, c + r), p), linear_box((c - r, c + r), p)):
        assert np.array_equal(a, b)


def _conv_case(rng: np.random.Generator, w: np.ndarray, scale: float) -> tuple:
    attrs = dict(kernel=[3, 3], stride=[1, 1], dilation=[1, 1], padding=[1, 1], padding_after=[1, 1], groups=1,
                 channel_axis=1, in_channels=2, out_channels=3, spatial_rank=2)
    c = rng.standard_normal((2, 2, 4, 4)) * scale
    r = np.abs(rng.standard_normal(c.shape)) * scale * 0.1
    return (c - r, c + r), AffineParams.of(w, _f32(rng, (3,))), attrs


def test_conv_float32_falls_back_where_halving_the_weights_or_float32_range_fails():
    """The varying-radius conv runs on halved float32 weights: a weight too small to halve exactly, or
    ends beyond float32's range (2**126 here), give the float64 rule's box."""
    from semantics.rules.affine import conv_box
    rng = np.random.default_rng(8)
    tiny = _f32(rng, (3, 2, 3, 3))
    tiny[0, 0, 0, 0] = np.float32(1e-39)  # a float32 subnormal
    for w, scale in ((tiny, 1.0), (_f32(rng, (3, 2, 3, 3)), 2.0 ** 126)):
        box, params, attrs = _conv_case(rng, w, scale)
        for a, b in zip(conv_box32(box, params, attrs, (2, 3, 4, 4)), conv_box(box, params, attrs, (2, 3, 4, 4))):
            assert np.array_equal(a, b)
    box, params, attrs = _conv_case(rng, _f32(rng, (3, 2, 3, 3)), 1.0)
    assert not np.array_equal(conv_box32(box, params, attrs, (2, 3, 4, 4))[0],
                              conv_box(box, params, attrs, (2, 3, 4, 4))[0])  # the float32 path otherwise


@pytest.mark.parametrize("uniform", [False, True])
def test_float32_falls_back_where_a_weight_cannot_be_halved_exactly(uniform):
    """Both float32 paths of linear and conv run on 2c and 2r against W / 2: a float32-normal weight whose half
    is a float32 subnormal (1.5e-38) gives the float64 rule's box, for an l-inf ball and a varying radius."""
    from semantics.rules.affine import conv_box, linear_box
    rng = np.random.default_rng(9)
    w = _f32(rng, (64, 18))
    w[3, 4] = np.float32(1.5e-38)
    p = AffineParams.of(w, _f32(rng, (64,)))
    assert float32_weights(p, 18) is not None
    c = rng.standard_normal((4, 18))
    r = np.full(c.shape, 0.01) if uniform else np.abs(rng.standard_normal(c.shape)) * 0.01
    for a, b in zip(linear_box32((c - r, c + r), p), linear_box((c - r, c + r), p)):
        assert np.array_equal(a, b)
    p.weight[3, 4] = 0.5  # a weight that halves exactly: the float32 path runs
    p = AffineParams.of(p.weight, p.bias)
    assert not np.array_equal(linear_box32((c - r, c + r), p)[0], linear_box((c - r, c + r), p)[0])
    cw = _f32(rng, (3, 2, 3, 3))
    cw[1, 1, 2, 0] = np.float32(1.5e-38)
    box, params, attrs = _conv_case(rng, cw, 1.0)
    if uniform:
        box = (box[0], box[0] + 0.02)
    for a, b in zip(conv_box32(box, params, attrs, (2, 3, 4, 4)), conv_box(box, params, attrs, (2, 3, 4, 4))):
        assert np.array_equal(a, b)


def test_subnormal_float32_weights_are_read_exactly_and_flush_to_zero_mode_is_refused():
    """1e-39 weights (float32 subnormals) over a box around 1e30: the exact minimum is 7.9e-9. With IEEE
    gradual underflow both product settings enclose it; under FTZ/DAZ (``torch.set_flush_denormal``)
    the weights would read as 0, so every evaluation and bound refuses to run, naming the mode."""
    net = nn.Linear(8, 64, bias=False).eval()
    with torch.no_grad():
        net.weight.fill_(1e-39)
    bundle = tlb.import_fx(net, (torch.zeros(1, 8),))
    g, p = bundle.graph, bundle.payload
    w = float(p.record(1)["weight"][0, 0])
    lo = np.full((1, 8), 1e30) - np.linspace(1e28, 2e28, 8)
    hi = np.full((1, 8), 1e30) + np.linspace(1e28, 2e28, 8)
    exact_min = sum(Fraction(w) * Fraction(float(v)) for v in lo[0])
    for products in ("float32", "float64"):
        box_lo, box_hi = tlb.interval_bounds(g, p, lo, hi, products=products)[1]
        assert Fraction(float(box_lo[0, 0])) <= exact_min <= Fraction(float(box_hi[0, 0]))
    torch.set_flush_denormal(True)
    try:
        for call in (lambda: tlb.interval_bounds(g, p, lo, hi), lambda: tlb.linear_bounds(g, p, lo, hi),
                     lambda: IntervalPropagator(g, p)(lo, hi)):
            with pytest.raises(IntervalError, match=r"^interval: this thread flushes subnormal numbers to zero"):
                call()
        with pytest.raises(EvalError, match=r"^IR eval: this thread flushes subnormal numbers .*set_flush_denormal"):
            tlb.evaluate(g, p, lo)
    finally:
        torch.set_flush_denormal(False)
    assert np.isfinite(tlb.evaluate(g, p, lo)[0]).all()


def test_an_infinite_weight_keeps_the_float64_rule_so_other_outputs_stay_finite():
    rng = np.random.default_rng(5)
    w = _f32(rng, (64, 20))
    w[3, 7] = np.inf
    p = AffineParams.of(w, np.zeros(64))
    c = rng.random((2, 20))
    r = rng.random((2, 20)) * 0.01
    got = linear_box32((c - r, c + r), p)
    from semantics.rules.affine import linear_box
    want = linear_box((c - r, c + r), p)
    assert all(np.array_equal(a, b) for a, b in zip(got, want))
    assert np.isfinite(got[0][:, :3]).all() and np.isinf(got[0][:, 3]).all()


# ---- no subnormal reaches a float32 GEMM (a 40x stall on x86 BLAS), and the flush is paid for --------------

_TINY32 = np.float32(2.0 ** -126)


def _subnormals(a: np.ndarray) -> int:
    return int(np.count_nonzero((a != 0) & (np.abs(a) < _TINY32))) if a.dtype == np.float32 else 0


@pytest.fixture
def gemm_operands(monkeypatch):
    """Every operand the float32 rules hand to a matrix product (np.matmul and the conv GEMM's staged input),
    as (operand, subnormal count) pairs."""
    import types

    import semantics.rules.affine32 as affine32
    seen: list[int] = []

    def matmul(a, b, *args, **kw):
        seen.extend((_subnormals(np.asarray(a)), _subnormals(np.asarray(b))))
        return np.matmul(a, b, *args, **kw)

    def conv_products(staged, plan, weight, groups, name):
        seen.extend((_subnormals(staged), _subnormals(np.asarray(weight))))
        return real_conv(staged, plan, weight, groups, name)

    real_conv = affine32.conv_products
    proxy = types.SimpleNamespace(**{k: getattr(np, k) for k in dir(np) if not k.startswith("__")})
    proxy.matmul = matmul
    monkeypatch.setattr(affine32, "np", proxy)
    monkeypatch.setattr(affine32, "conv_products", conv_products)
    return seen


def test_flush_subnormals_zeroes_exactly_the_subnormals():
    from semantics.rules.affine32 import flush_subnormals
    x = np.array([0.0, -0.0, 1e-45, -1e-45, 1e-39, -1.1754942e-38, 2.0 ** -126, -(2.0 ** -126), 1.0, -3e38,
                  np.inf, -np.inf], np.float32)
    want = np.where(np.abs(x) < _TINY32, np.float32(0), x)
    strided = np.zeros((2, 12), np.float32)
    strided[0] = x
    got = flush_subnormals(strided[:, ::1][0])
    assert np.array_equal(got, want) and _subnormals(strided) == 0 and np.array_equal(strided[1], np.zeros(12))


def _subnormal_box(rng: np.random.Generator, rows: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """A box whose float32 center and spread are mostly subnormal: pinned units (lo = hi = 0, spread
    2**-147), centers and radii just under float32's smallest normal, some normal entries."""
    kind = rng.integers(0, 4, (rows, n))
    c = np.where(kind == 0, 0.0, np.where(kind == 1, rng.uniform(0.5, 0.999, (rows, n)) * 2.0 ** -126,
                                          np.where(kind == 2, rng.uniform(-1e-40, 1e-40, (rows, n)),
                                                   rng.standard_normal((rows, n)))))
    r = np.where(kind == 0, 0.0, np.where(kind == 3, np.abs(rng.standard_normal((rows, n))) * 0.01,
                                          rng.uniform(0.5, 0.999, (rows, n)) * 2.0 ** -126))
    return c - r, c + r


@pytest.mark.parametrize("weight_scale", [1.0, 1e30])
def test_linear_with_subnormal_operands_encloses_the_exact_image(weight_scale, float32_everywhere, gemm_operands):
    """Centers and spreads full of float32 subnormals (1e30 weights make the flush's n max|W| 2**-126
    visible: about 1e-7 per output, above the products' own rounding), checked against the exact image in
    rational arithmetic; the products saw no subnormal operand."""
    rng = np.random.default_rng(11)
    w, b = _f32(rng, (6, 48), weight_scale), _f32(rng, (6,))
    lo, hi = _subnormal_box(rng, 3, 48)
    got_lo, got_hi = linear_box32((lo, hi), AffineParams.of(w, b))
    assert gemm_operands and not any(gemm_operands)  # the float32 path ran, on flushed operands
    c32 = ((lo + hi) / 2).astype(np.float32)
    assert _subnormals(c32) > 30  # without the flush, the GEMM would have read these
    for k in range(3):
        want_lo, want_hi = _exact_linear(w, b, lo[k], hi[k])
        assert all(Fraction(g) <= e for g, e in zip(got_lo[k], want_lo))
        assert all(Fraction(g) >= e for g, e in zip(got_hi[k], want_hi))


def test_uniform_radius_linear_with_subnormal_centers_encloses_the_exact_image(float32_everywhere, gemm_operands):
    """An l-inf ball of radius 1e-39 around float32-subnormal centers (float64 normals), 1e30 weights."""
    rng = np.random.default_rng(12)
    w, b = _f32(rng, (5, 300), 1e30), _f32(rng, (5,))
    c = rng.uniform(-1.1e-38, 1.1e-38, (2, 300))
    lo, hi = c - 1e-39, c + 1e-39
    got_lo, got_hi = linear_box32((lo, hi), AffineParams.of(w, b))
    assert gemm_operands and not any(gemm_operands)
    for k in range(2):
        want_lo, want_hi = _exact_linear(w, b, lo[k], hi[k])
        assert all(Fraction(g) <= e for g, e in zip(got_lo[k], want_lo))
        assert all(Fraction(g) >= e for g, e in zip(got_hi[k], want_hi))


@pytest.mark.parametrize("uniform", [False, True])
def test_conv_with_subnormal_operands_encloses_the_exact_image(uniform, float32_everywhere, gemm_operands):
    rng = np.random.default_rng(13)
    cin, cout, k = 2, 3, 3
    w, b = _f32(rng, (cout, cin, k, k), 1e20), _f32(rng, (cout,))
    if uniform:
        c = rng.uniform(-1.1e-38, 1.1e-38, (1, cin, 5, 5))
        lo, hi = c - 1e-39, c + 1e-39
    else:
        lo, hi = (a.reshape(1, cin, 5, 5) for a in _subnormal_box(rng, 1, cin * 25))
    attrs = dict(kernel=[k, k], stride=[1, 1], dilation=[1, 1], padding=[1, 1], padding_after=[1, 1], groups=1,
                 channel_axis=1, in_channels=cin, out_channels=cout, spatial_rank=2)
    got_lo, got_hi = conv_box32((lo, hi), AffineParams.of(w, b), attrs, (1, cout, 5, 5))
    assert gemm_operands and not any(gemm_operands)
    plo, phi = (np.pad(a[0], ((0, 0), (1, 1), (1, 1))) for a in (lo, hi))
    for o in range(cout):
        for y in range(5):
            for x in range(5):
                want_lo, want_hi = _exact_linear(w[o].reshape(1, -1), b[o:o + 1], plo[:, y:y + k, x:x + k].reshape(-1),
                                                 phi[:, y:y + k, x:x + k].reshape(-1))
                assert Fraction(got_lo[0, o, y, x]) <= want_lo[0] and Fraction(got_hi[0, o, y, x]) >= want_hi[0]


def test_pinned_relus_feed_no_subnormal_to_the_next_products(gemm_operands):
    """The stall's origin: a ReLU-pinned unit (lo = hi = 0) has spread 2**-147 when rounded up, a float32
    subnormal. A net whose ReLUs pin many units (conv and linear layers after them): no GEMM operand is
    subnormal, and the boxes still hold the float64 and float32 values at samples and corners, within 1e-3
    of the float64 rule's widths."""
    torch.manual_seed(14)
    net = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(),
                        nn.Flatten(), nn.Linear(8 * 36, 96), nn.ReLU(), nn.Linear(96, 64)).eval()
    x = torch.rand(6, 1, 6, 6)
    bundle = tlb.import_fx(net, (x,))
    c = x.double().numpy()
    boxes = tlb.interval_bounds(bundle.graph, bundle.payload, c - 0.01, c + 0.01)
    for relu in (n.id for n in bundle.graph.nodes if n.kind == "relu"):
        assert np.count_nonzero((boxes[relu][0] == 0) & (boxes[relu][1] == 0)) >= 10  # pinned units
    assert gemm_operands and not any(gemm_operands)
    gemm_operands.clear()
    assert_sound_and_close(net, x, 0.01, 20, 15)
    assert not any(gemm_operands)
