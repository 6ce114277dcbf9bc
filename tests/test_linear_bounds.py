"""CROWN (``tlb.linear_bounds``): soundness in floating point, tightness against IBP, fallbacks.

Soundness is checked three ways: sampled containment (every corner when there are few, random
corners, the center and uniform points, evaluated in float64 and float32 with the rounding allowance
IBP's containment check uses) for every node of networks covering each listed op; exact rational
arithmetic of small ReLU networks at corners and interior points; and the relaxation lines of each
smooth function against mpmath on a dense grid. ``x ** 2`` on [2, 5] and [-3, -1] is where
auto_LiRPA's CROWN returns 22.75 and 8 as upper bounds.
"""

from __future__ import annotations

import sys
from fractions import Fraction

import mpmath as mp
import numpy as np
import pytest
import torch
import torch.nn as nn

import torchlean_bridge as tlb
from semantics.evaluate import evaluate
from semantics.linear_bounds.relax import relu_lines, smooth_for, smooth_lines
from semantics.sampling import RTOL, sample_points

mp.mp.dps = 40


def bundle(module: nn.Module, shape) -> tlb.Bundle:
    torch.manual_seed(0)
    return tlb.import_fx(module.eval(), (torch.zeros(shape),))


def assert_contains(b: tlb.Bundle, lo: np.ndarray, hi: np.ndarray, samples: int = 40, seed: int = 0):
    """Every node's CROWN box (and the outputs) holds the float64 and float32 values at sampled points."""
    g = b.graph
    res = tlb.linear_bounds(g, b.payload, lo, hi, all_nodes=True)
    points, corners = sample_points([(lo, hi)], samples, seed)
    assert corners >= 1
    for point in points:
        for dtype in ("float64", "float32"):
            values = evaluate(g, b.payload, point, dtype=dtype, all_nodes=True)
            for node in g.nodes:
                blo, bhi = res.boxes[node.id]
                scale = max(float(np.max(np.abs(blo), initial=0)), float(np.max(np.abs(bhi), initial=0)))
                v = np.asarray(values[node.id], dtype=np.float64)
                allow = RTOL[dtype] * scale
                assert np.all(v >= blo - allow) and np.all(v <= bhi + allow), (node, dtype, v, blo, bhi)
    for o, lo_o, hi_o in zip(g.outputs, res.lower, res.upper):
        np.testing.assert_array_equal(lo_o, res.boxes[o][0])
        np.testing.assert_array_equal(hi_o, res.boxes[o][1])
    return res


class Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(2, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.c1 = nn.Conv2d(4, 4, 3, padding=1)
        self.head = nn.Linear(4 * 3 * 3, 3)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-0.5, 0.5)
            self.bn.running_var.uniform_(0.5, 2.0)
            self.bn.weight.uniform_(-1, 1)

    def forward(self, x):
        h = torch.relu(self.bn(self.stem(x)))
        h = torch.relu(self.c1(h) + h)
        h = nn.functional.avg_pool2d(h, 2, stride=2, padding=1)
        return self.head(torch.flatten(h, 1))


class Shapes(nn.Module):
    """Shape ops and constants: permute, concat, slice, pad, scaling and shifting, matmul by a constant."""

    def __init__(self) -> None:
        super().__init__()
        self.l1 = nn.Linear(4, 6)
        self.register_buffer("m", torch.randn(6, 5))

    def forward(self, x):
        h = torch.tanh(self.l1(x))  # [2, 6]
        h = torch.cat([h, 2.5 * h[:, :3] - 1.0], dim=1)  # [2, 9]
        h = nn.functional.pad(h, (1, 2), value=0.5)  # [2, 12]
        h = h[:, 1:7] @ self.m  # [2, 5]
        h = h.reshape(2, 5, 1).permute(0, 2, 1).reshape(2, 5)
        return nn.functional.leaky_relu(h / 4.0, 0.2)


CASES = {
    "relu mlp": (lambda: nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4)),
                 (1, 5), 0.3),
    "smooth mlp": (lambda: nn.Sequential(nn.Linear(3, 8), nn.Sigmoid(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8),
                                         nn.GELU(), nn.Linear(8, 6), nn.Softplus(), nn.Linear(6, 2)), (2, 3), 0.8),
    "silu mlp": (lambda: nn.Sequential(nn.Linear(3, 8), nn.SiLU(), nn.Linear(8, 8), nn.SiLU(), nn.Linear(8, 2)),
                 (2, 3), 1.5),
    "exp + elu": (lambda: nn.Sequential(nn.Linear(3, 6), nn.ReLU(), nn.Linear(6, 4), nn.ELU(), nn.Linear(4, 3)),
                  (1, 3), 0.5),
    "cnn": (lambda: nn.Sequential(nn.Conv2d(1, 3, 3, stride=2), nn.ReLU(), nn.Conv2d(3, 4, 2), nn.ReLU(),
                                  nn.MaxPool2d(2), nn.Flatten(), nn.Linear(4, 3)), (1, 1, 7, 7), 0.1),
    "max pool overlapping": (lambda: nn.Sequential(nn.Conv2d(2, 3, 2), nn.ReLU(), nn.MaxPool2d(3, stride=2, padding=1),
                                                   nn.Flatten(), nn.Linear(3 * 3 * 3, 2)), (2, 2, 6, 6), 0.05),
    "conv transpose": (lambda: nn.Sequential(nn.ConvTranspose2d(2, 3, 3, stride=2, padding=1), nn.ReLU(),
                                             nn.Flatten(), nn.Linear(3 * 5 * 5, 2)), (1, 2, 3, 3), 0.2),
    "residual": (Residual, (2, 2, 5, 5), 0.1),
    "shape ops": (Shapes, (2, 4), 0.4),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_containment_every_node(name):
    make, shape, eps = CASES[name]
    b = bundle(make(), shape)
    c = np.random.default_rng(1).uniform(-1, 1, shape)
    res = assert_contains(b, c - eps, c + eps)
    assert not res.fallback  # every op of these networks has a backward rule or a relaxation
    ibp = tlb.interval_bounds(b.graph, b.payload, c - eps, c + eps)
    for o, lo, hi in zip(b.graph.outputs, res.lower, res.upper):
        assert np.all(lo >= ibp[o][0]) and np.all(hi <= ibp[o][1])  # never looser than IBP


def test_prelu_and_exp_from_the_builder():
    from importers.builder import GraphBuilder
    rng = np.random.default_rng(2)
    g = GraphBuilder("test")
    x = g.input((1, 4))
    h = g.add("linear", [x], shape=(1, 6))
    g.param(h, "weight", rng.normal(size=(6, 4)))
    g.param(h, "bias", rng.normal(size=6))
    slope = g.const(rng.uniform(-0.5, 2.0, (1, 6)))
    h = g.add("prelu", [h, slope])
    h = g.add("exp", [g.add("neg", [h])])
    out = g.add("linear", [h], shape=(1, 2))
    g.param(out, "weight", rng.normal(size=(2, 6)))
    g.param(out, "bias", rng.normal(size=2))
    b = g.finish([out])
    c = rng.uniform(-1, 1, (1, 4))
    res = assert_contains(b, c - 0.3, c + 0.3)
    assert not res.fallback


def test_unsupported_nodes_fall_back_to_their_box_and_are_named():
    class Square(nn.Module):
        def __init__(self):
            super().__init__()
            self.l = nn.Linear(3, 3)

        def forward(self, x):
            h = self.l(x)
            return torch.relu(h * h - torch.sin(h))

    b = bundle(Square(), (1, 3))
    c = np.array([[0.2, -0.4, 0.1]])
    res = assert_contains(b, c - 0.3, c + 0.3)
    kinds = set(res.fallback.values())
    assert "sin" in kinds and "mul_elem" not in kinds, res.fallback  # h * h: McCormick's planes


@pytest.mark.parametrize("lo, hi, true_lo, true_hi", [(2.0, 5.0, 4.0, 25.0), (-3.0, -1.0, 1.0, 9.0),
                                                      (-1.0, 2.0, 0.0, 4.0)])
def test_square_is_sound_where_auto_lirpa_is_not(lo, hi, true_lo, true_hi):
    class Sq(nn.Module):
        def forward(self, x):
            return x ** 2
    b = bundle(Sq(), (1, 1))
    res = tlb.linear_bounds(b.graph, b.payload, np.array([[lo]]), np.array([[hi]]))
    assert res.upper[0][0, 0] >= true_hi and res.lower[0][0, 0] <= true_lo
    assert res.upper[0][0, 0] <= true_hi * (1 + 1e-12) + 1e-300
    # the relaxation itself, not only the IBP intersection: the upper line is above the parabola at both ends
    a_l, b_l, a_u, b_u = smooth_lines(smooth_for("pow", {"exponent": 2.0}), np.array([lo]), np.array([hi]))
    for z in (lo, hi, (lo + hi) / 2):
        assert Fraction(a_u[0]) * Fraction(z) + Fraction(b_u[0]) >= Fraction(z) ** 2
        assert Fraction(a_l[0]) * Fraction(z) + Fraction(b_l[0]) <= Fraction(z) ** 2


_MP = {"sigmoid": lambda z: 1 / (1 + mp.exp(-z)), "tanh": mp.tanh, "exp": mp.exp,
       "softplus": lambda z: mp.log1p(mp.exp(z)), "gelu": lambda z: z * (1 + mp.erf(z / mp.sqrt(2))) / 2,
       "silu": lambda z: z / (1 + mp.exp(-z)), "pow3": lambda z: z ** 3, "pow2": lambda z: z ** 2, "elu": lambda z: z if z > 0 else mp.expm1(z),
       # alpha < 1: f' jumps from alpha to 1 at 0, where the tangent point of a slope between them sits
       "elu0.3": lambda z: z if z > 0 else mp.mpf("0.3") * mp.expm1(z)}


@pytest.mark.parametrize("kind", sorted(_MP))
def test_smooth_lines_enclose_the_function(kind):
    rng = np.random.default_rng(5)
    centers = rng.uniform(-4, 4, 60)
    radii = np.concatenate([rng.uniform(0, 3, 50), [1e-9, 0.0, 5.0, 1e-3, 2.0, 0.5, 1.4, 1.5, 0.1, 4.0]])
    lo, hi = centers - radii, centers + radii
    if kind.startswith("pow"):
        fn = smooth_for("pow", {"exponent": float(kind[3:])})
    elif kind.startswith("elu"):
        fn = smooth_for("elu", {"alpha": float(kind[3:] or 1.0)})
    else:
        fn = smooth_for(kind, {})
    a_l, b_l, a_u, b_u = smooth_lines(fn, lo, hi)
    f = _MP[kind]
    for i in range(lo.size):
        for t in np.linspace(0, 1, 41):
            z = mp.mpf(float(lo[i])) + (mp.mpf(float(hi[i])) - mp.mpf(float(lo[i]))) * mp.mpf(float(t))
            v = f(z)
            assert mp.mpf(float(a_l[i])) * z + mp.mpf(float(b_l[i])) <= v, (kind, lo[i], hi[i], float(z))
            assert mp.mpf(float(a_u[i])) * z + mp.mpf(float(b_u[i])) >= v, (kind, lo[i], hi[i], float(z))


def test_relu_family_lines_exact():
    lo = np.array([-2.0, -1.0, 0.5, -3.0, -1e-300])
    hi = np.array([1.0, 3.0, 2.0, -0.5, 1e300])
    for slope in (0.0, 0.1, 1.7):
        a_l, b_l, a_u, b_u = relu_lines(lo, hi, slope)
        for i in range(lo.size):
            for z in (lo[i], hi[i], 0.0 if lo[i] < 0 < hi[i] else lo[i], (lo[i] + hi[i]) / 2):
                fz = Fraction(z) if z >= 0 else Fraction(slope) * Fraction(z)
                assert Fraction(a_l[i]) * Fraction(z) + Fraction(b_l[i]) <= fz
                assert Fraction(a_u[i]) * Fraction(z) + Fraction(b_u[i]) >= fz


def _exact_mlp(weights, x):
    h = [Fraction(v) for v in x]
    for k, (w, b) in enumerate(weights):
        h = [sum((Fraction(w[i, j]) * h[j] for j in range(len(h))), Fraction(b[i])) for i in range(w.shape[0])]
        if k < len(weights) - 1:
            h = [max(v, Fraction(0)) for v in h]
    return h


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_exact_rational_arithmetic_small_relu_net(seed):
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(3, 6), nn.ReLU(), nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 2)).eval()
    b = tlb.import_fx(net, (torch.zeros(1, 3),))
    weights = [(m.weight.detach().double().numpy(), m.bias.detach().double().numpy()) for m in net
               if isinstance(m, nn.Linear)]
    rng = np.random.default_rng(seed)
    c = rng.uniform(-1, 1, (1, 3))
    lo, hi = c - 0.4, c + 0.4
    res = tlb.linear_bounds(b.graph, b.payload, lo, hi)
    points, _ = sample_points([(lo, hi)], 40, seed)
    for (x,) in points:
        y = _exact_mlp(weights, x.reshape(-1))
        for j, v in enumerate(y):
            assert Fraction(res.lower[0][0, j]) <= v <= Fraction(res.upper[0][0, j])


def test_tighter_than_ibp_on_a_deep_net():
    torch.manual_seed(0)
    layers = [nn.Linear(10, 40), nn.ReLU()]
    for _ in range(4):
        layers += [nn.Linear(40, 40), nn.ReLU()]
    b = bundle(nn.Sequential(*layers, nn.Linear(40, 3)), (1, 10))
    c = np.zeros((1, 10))
    res = tlb.linear_bounds(b.graph, b.payload, c - 0.05, c + 0.05)
    ibp = tlb.linear_bounds(b.graph, b.payload, c - 0.05, c + 0.05, method="ibp")
    w_crown, w_ibp = res.upper[0] - res.lower[0], ibp.upper[0] - ibp.lower[0]
    assert np.all(w_crown <= w_ibp) and w_crown.sum() < 0.5 * w_ibp.sum()


def test_batch_axis_matches_one_sample_at_a_time():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 12), nn.ReLU(), nn.Linear(12, 12), nn.ReLU(), nn.Linear(12, 3))
    xs = np.random.default_rng(0).uniform(-1, 1, (5, 4))
    batched = bundle(net, (5, 4))
    single = bundle(net, (1, 4))
    res = tlb.linear_bounds(batched.graph, batched.payload, xs - 0.2, xs + 0.2)
    for i in range(5):
        one = tlb.linear_bounds(single.graph, single.payload, xs[i:i + 1] - 0.2, xs[i:i + 1] + 0.2)
        np.testing.assert_allclose(res.lower[0][i], one.lower[0][0], rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(res.upper[0][i], one.upper[0][0], rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("budget", [None, 40])
def test_spec_rows_of_a_batch_match_one_sample_at_a_time(budget, monkeypatch):
    """The spec rows of a batch of samples are bounded in one pass (or in groups of samples when the
    coefficients would exceed the pass budget: 40 entries here, one sample a group): each sample's bounds
    and input coefficients equal a one-sample graph's, and they hold at sampled points, as does the linear
    lower bound the coefficients a give, spec_line_lower + a.x - min over the box of a.x (input splitting's
    clipping rests on it; spec_lower may be tighter than spec_line_lower, never looser)."""
    import semantics.linear_bounds.crown as crown_mod
    if budget is not None:
        monkeypatch.setattr(crown_mod, "_BUDGET", budget)
    torch.manual_seed(1)
    net = nn.Sequential(nn.Linear(4, 12), nn.ReLU(), nn.Linear(12, 12), nn.ReLU(), nn.Linear(12, 3))
    xs = np.random.default_rng(1).uniform(-1, 1, (5, 4))
    spec = np.array([[1.0, -1.0, 0.0], [0.0, 2.0, -0.5]])
    batched, single = bundle(net, (5, 4)), bundle(net, (1, 4))
    res = tlb.linear_bounds(batched.graph, batched.payload, xs - 0.2, xs + 0.2, spec=spec)
    assert res.spec_lower.shape == (5, 2) and res.spec_coefficients[0].shape == (5, 2, 4)
    for i in range(5):
        one = tlb.linear_bounds(single.graph, single.payload, xs[i:i + 1] - 0.2, xs[i:i + 1] + 0.2, spec=spec)
        np.testing.assert_allclose(res.spec_lower[i], one.spec_lower[0], rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(res.spec_upper[i], one.spec_upper[0], rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(res.spec_coefficients[0][i], one.spec_coefficients[0][0], rtol=1e-12, atol=1e-14)
        lo, hi = xs[i] - 0.2, xs[i] + 0.2
        a = res.spec_coefficients[0][i]
        a_min = np.minimum(a * lo, a * hi).sum(axis=1)
        points, _ = sample_points([(lo[None], hi[None])], 40, i)
        for (x,) in points:
            v = spec @ np.asarray(tlb.evaluate(single.graph, single.payload, [x])[0]).reshape(-1)
            assert np.all(v >= res.spec_lower[i] - 1e-12) and np.all(v <= res.spec_upper[i] + 1e-12)
            assert np.all(v >= res.spec_line_lower[i] + a @ x.reshape(-1) - a_min - 1e-12)
        assert np.all(res.spec_line_lower[i] <= res.spec_lower[i])


def test_spec_rows_bound_linear_combinations():
    b = bundle(nn.Sequential(nn.Linear(3, 10), nn.ReLU(), nn.Linear(10, 4)), (1, 3))
    c = np.array([[0.1, 0.2, -0.3]])
    spec = np.array([[1.0, -1.0, 0.0, 0.0], [0.0, 2.0, 0.0, -0.5]])
    res = tlb.linear_bounds(b.graph, b.payload, c - 0.2, c + 0.2, spec=spec)
    points, _ = sample_points([(c - 0.2, c + 0.2)], 60, 0)
    for (x,) in points:
        y = np.asarray(tlb.evaluate(b.graph, b.payload, [x])[0]).reshape(-1)
        v = spec @ y
        assert np.all(v >= res.spec_lower[0] - 1e-12) and np.all(v <= res.spec_upper[0] + 1e-12)
    lo, hi = res.lower[0][0], res.upper[0][0]
    direct = np.minimum(spec * lo, spec * hi).sum(axis=1)  # combining the output boxes
    assert np.all(res.spec_lower[0] >= direct - 1e-9)
    assert res.spec_coefficients[0].shape == (1, 2, 3)


def test_bad_arguments_are_bridge_errors():
    b = bundle(nn.Sequential(nn.Linear(3, 2)), (1, 3))
    z = np.zeros((1, 3))
    with pytest.raises(tlb.BridgeError, match="unknown method"):
        tlb.linear_bounds(b.graph, b.payload, z, z, method="alpha")
    with pytest.raises(tlb.BridgeError, match="spec must be"):
        tlb.linear_bounds(b.graph, b.payload, z, z, spec=np.ones((2, 3)))
    with pytest.raises(tlb.BridgeError, match="lower bound exceeds"):
        tlb.linear_bounds(b.graph, b.payload, z + 1, z)


def test_infinite_boxes_give_infinite_bounds_not_nan():
    b = bundle(nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1)), (1, 2))
    res = tlb.linear_bounds(b.graph, b.payload, np.array([[-np.inf, 0.0]]), np.array([[1.0, 1.0]]))
    assert not np.any(np.isnan(res.lower[0])) and not np.any(np.isnan(res.upper[0]))


@pytest.mark.parametrize("name", ["cnn", "residual", "max pool overlapping"])
def test_patch_passes_agree_with_dense_passes(name, monkeypatch):
    """Convolutional intermediate bounds in patch form equal the dense computation up to rounding."""
    import semantics.linear_bounds.crown as crown_mod
    make, shape, eps = CASES[name]
    b = bundle(make(), shape)
    c = np.random.default_rng(3).uniform(-1, 1, shape)
    patched = tlb.linear_bounds(b.graph, b.payload, c - eps, c + eps, all_nodes=True)
    monkeypatch.setattr(crown_mod, "patchable", lambda run, t: False)
    dense = tlb.linear_bounds(b.graph, b.payload, c - eps, c + eps, all_nodes=True)
    for (plo, phi), (dlo, dhi) in zip(patched.boxes, dense.boxes):
        scale = 1e-9 * (1 + np.abs(dlo).max() + np.abs(dhi).max())
        np.testing.assert_allclose(plo, dlo, rtol=0, atol=scale)
        np.testing.assert_allclose(phi, dhi, rtol=0, atol=scale)


@pytest.mark.parametrize("name", ["relu mlp", "cnn"])
def test_a_backward_pass_stops_at_the_deadline_between_nodes(name, monkeypatch):
    """A deadline that passes during a backward pass (dense or patch form) stops it at its next node, not
    after the whole pass: one pass through VNN-COMP's resnet_4b took 5 s, and ``--timeout 30`` ran 36 s.
    Here the deadline passes as soon as a pass is under way (the clock is read from inside its node loop)."""
    import semantics.linear_bounds.crown as crown_mod
    import semantics.linear_bounds.patches as patches_mod
    make, shape, eps = CASES[name]
    b = bundle(make(), shape)
    c = np.random.default_rng(5).uniform(-1, 1, shape)
    passes = {crown_mod._Pass.run.__code__, patches_mod.PatchPass.run.__code__}
    stopped = []

    def on_time(self):
        caller = sys._getframe(1).f_code
        if caller in passes:
            stopped.append(caller.co_qualname)
            raise crown_mod.DeadlineExceeded

    monkeypatch.setattr(crown_mod._Run, "on_time", on_time)
    with pytest.raises(crown_mod.DeadlineExceeded):
        tlb.linear_bounds(b.graph, b.payload, c - eps, c + eps)
    assert stopped == ["PatchPass.run" if name == "cnn" else "_Pass.run"]
