"""ReLU branch and bound against exact answers: small random ReLU nets on 2-D boxes, in rationals.

The true minimum of ``c . y`` over a subdomain (the box with some ReLUs fixed active or inactive) is found
by enumeration in exact rational arithmetic (``fractions.Fraction``; the weights are float32 numbers,
so they convert exactly). The network is piecewise linear on pieces bounded by the lines where a
pre-activation is 0: the first layer's lines, and for each activation pattern of the first layer the
second layer's lines (affine under that pattern). A linear function's minimum over a polygonal piece is
at one of its vertices, which are intersections of two such lines or box edges, so the minimum over the
subdomain is the minimum of the exact network value over the intersection points inside the box that
satisfy the splits. Against that: every bound ``bound_domains`` gives encloses the exact range of
every subdomain, a subdomain reported empty has no point, and ``verify --method bab-relu`` is never
wrong on threshold properties on either side of the exact minimum.
"""

from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pytest
import torch
import torch.nn as nn

import torchlean_bridge as tlb
from torchlean_bridge.app.verify import _Model, verify
from torchlean_bridge.app.vnnlib import Case, Property

H1, H2 = 4, 4



def enclosure_gap(r, i: int, c: np.ndarray, inside: list, label) -> float:
    """Subdomain ``i`` of bound result ``r`` holds the exact outputs ``inside`` (rational points of it):
    empty only with no point, and each row ``c[k] . y`` within ``[lower, upper]`` in exact arithmetic.
    Returns the summed gap between the true minima and the lower bounds (for tightness comparisons)."""
    if r.empty[i]:
        assert not inside, (label, i, "a subdomain with points was reported empty")
        return 0.0
    gap = 0.0
    for k in range(c.shape[0]):
        values = [Fraction(float(c[k, 0])) * y[0] + Fraction(float(c[k, 1])) * y[1] for y in inside]
        if values:
            assert Fraction(float(r.lower[i, k])) <= min(values), (label, i, k)
            assert Fraction(float(r.upper[i, k])) >= max(values), (label, i, k)
            gap += float(min(values)) - float(r.lower[i, k])
    return gap

def _net(seed: int) -> tuple[nn.Module, list[tuple[np.ndarray, np.ndarray]]]:
    """A 2-H1-H2-2 ReLU net with weights on a 1/16 grid (exact in float32 and in rationals)."""
    rng = np.random.default_rng(seed)
    dims = [2, H1, H2, 2]
    layers, params = [], []
    for a, b in zip(dims[:-1], dims[1:]):
        w = rng.integers(-16, 17, (b, a)) / 16.0
        bias = rng.integers(-8, 9, b) / 16.0
        lin = nn.Linear(a, b)
        with torch.no_grad():
            lin.weight.copy_(torch.tensor(w))
            lin.bias.copy_(torch.tensor(bias))
        layers += [lin, nn.ReLU()]
        params.append((w, bias))
    return nn.Sequential(*layers[:-1]).eval(), params


def _conv_net(seed: int) -> tuple[nn.Module, list[tuple[np.ndarray, np.ndarray]]]:
    """The same function shape as convolutions on a 1x1x2 image: conv (1, 2) to H1 channels, ReLU,
    1x1 conv to H2 channels, ReLU, flatten, linear; its dense layers for the enumeration."""
    _, params = _net(seed)
    (w1, b1), (w2, b2), (w3, b3) = params
    c1, c2, lin = nn.Conv2d(1, H1, (1, 2)), nn.Conv2d(H1, H2, 1), nn.Linear(H2, 2)
    with torch.no_grad():
        c1.weight.copy_(torch.tensor(w1.reshape(H1, 1, 1, 2)))
        c1.bias.copy_(torch.tensor(b1))
        c2.weight.copy_(torch.tensor(w2.reshape(H2, H1, 1, 1)))
        c2.bias.copy_(torch.tensor(b2))
        lin.weight.copy_(torch.tensor(w3))
        lin.bias.copy_(torch.tensor(b3))
    return nn.Sequential(c1, nn.ReLU(), c2, nn.ReLU(), nn.Flatten(), lin).eval(), params


def _frac(m: np.ndarray):
    return [[Fraction(float(v)) for v in row] for row in np.atleast_2d(m)]


class Exact:
    """Exact evaluation and enumeration for the 2-H1-H2-k net."""

    def __init__(self, params, lo, hi) -> None:
        self.w = [(_frac(w), [Fraction(float(v)) for v in b]) for w, b in params]
        self.lo, self.hi = [Fraction(float(v)) for v in lo], [Fraction(float(v)) for v in hi]

    @staticmethod
    def _affine(w, b, x):
        return [sum((wi * xi for wi, xi in zip(row, x)), Fraction(0)) + bi for row, bi in zip(w, b)]

    def pre(self, x):
        """Both hidden layers' pre-activations and the output at x."""
        z1 = self._affine(*self.w[0], x)
        z2 = self._affine(*self.w[1], [max(v, Fraction(0)) for v in z1])
        y = self._affine(*self.w[2], [max(v, Fraction(0)) for v in z2])
        return z1, z2, y

    def candidates(self):
        """Every intersection of two piece-boundary lines (or box edges) inside the box."""
        lines = [((Fraction(1), Fraction(0)), -self.lo[0]), ((Fraction(1), Fraction(0)), -self.hi[0]),
                 ((Fraction(0), Fraction(1)), -self.lo[1]), ((Fraction(0), Fraction(1)), -self.hi[1])]
        (w1, b1), (w2, b2) = self.w[0], self.w[1]
        first = [((row[0], row[1]), bi) for row, bi in zip(w1, b1)]
        points = set()
        for pattern in itertools.product((0, 1), repeat=len(first)):
            # under the pattern z2 = W2 diag(p) (W1 x + b1) + b2: affine in x
            second = []
            for row, bj in zip(w2, b2):
                a0 = sum((row[i] * w1[i][0] for i in range(len(first)) if pattern[i]), Fraction(0))
                a1 = sum((row[i] * w1[i][1] for i in range(len(first)) if pattern[i]), Fraction(0))
                c = sum((row[i] * b1[i] for i in range(len(first)) if pattern[i]), Fraction(0)) + bj
                second.append(((a0, a1), c))
            for (p, cp), (q, cq) in itertools.combinations(lines + first + second, 2):
                det = p[0] * q[1] - p[1] * q[0]
                if det == 0:
                    continue
                x0 = (-cp * q[1] + cq * p[1]) / det
                x1 = (-p[0] * cq + q[0] * cp) / det
                if self.lo[0] <= x0 <= self.hi[0] and self.lo[1] <= x1 <= self.hi[1]:
                    points.add((x0, x1))
        return [(x, self.pre(list(x))) for x in points]


def _bundle(net):
    return tlb.import_fx(net, (torch.zeros(1, 2),))


def _fits(split1, split2, z1, z2) -> bool:
    return all((s == 0) or (s > 0 and z >= 0) or (s < 0 and z <= 0)
               for s, z in zip(list(split1) + list(split2), list(z1) + list(z2)))


@pytest.mark.parametrize("seed, kind", [(s, "mlp") for s in range(8)] + [(s, "conv") for s in range(3)])
def test_split_bounds_enclose_the_exact_range_of_every_subdomain(seed, kind):
    from semantics.linear_bounds import Crown
    from semantics.linear_bounds.batch_axis import with_batch
    from semantics.linear_bounds.splits import bound_domains, relu_nodes
    net, params = _net(seed) if kind == "mlp" else _conv_net(seed)
    b = _bundle(net) if kind == "mlp" else tlb.import_fx(net, (torch.zeros(1, 1, 1, 2),))
    rng = np.random.default_rng(100 + seed)
    lo = rng.uniform(-1, 0, 2).astype(np.float32).astype(np.float64)
    hi = lo + rng.uniform(0.5, 2, 2).astype(np.float32)
    exact = Exact(params, lo, hi)
    points = exact.candidates()
    n = 24
    g = with_batch(b.graph, n)
    assert g is not None
    crown = Crown(g, b.payload)
    relus = relu_nodes(crown)
    assert len(relus) == 2
    splits = {v: rng.choice([-1, 0, 0, 1], size=(n, u)).astype(np.int8) for v, u in zip(relus, (H1, H2))}
    c = rng.integers(-3, 4, (3, 2)).astype(np.float64)
    tight = dict.fromkeys(("crown", "alpha-crown", "beta-crown", "reused", "warm", "hostile"), 0.0)  # summed gaps
    # to the exact minima
    shape = (n,) + tuple(b.graph.nodes[b.graph.inputs[0]].out_shape[1:])
    boxes = np.repeat(lo[None], n, 0).reshape(shape), np.repeat(hi[None], n, 0).reshape(shape)
    parent = bound_domains(crown, *boxes, {v: np.zeros_like(x) for v, x in splits.items()}, c)
    # warm starts: the unsplit parent's optimized slopes, and hostile ones (any alpha, huge or infinite
    # beta, NaN holes): the bound must hold whatever the start
    warm = bound_domains(crown, *boxes, {v: np.zeros_like(x) for v, x in splits.items()}, c, method="beta-crown").slopes
    assert warm is not None and set(warm) == set(relus)
    hostile = {}
    for v, (a, b_) in warm.items():
        a, b_ = rng.uniform(-5, 5, a.shape), rng.choice([-1.0, 0.0, 1.0, 1e8, np.inf, np.nan], size=b_.shape)
        a[rng.random(a.shape) < 0.2] = np.nan
        hostile[v] = (a, b_)
    for method in ("crown", "alpha-crown", "beta-crown", "reused", "warm", "hostile"):
        if method == "reused":  # the parent's (unsplit) ReLU input boxes instead of new intermediate passes
            r = bound_domains(crown, *boxes, splits, c, method="beta-crown", known=parent.pre)
        elif method in ("warm", "hostile"):
            r = bound_domains(crown, *boxes, splits, c, method="beta-crown", known=parent.pre,
                              warm=warm if method == "warm" else hostile)
            assert r.method == "beta-crown" and all(a.shape == warm[v][0].shape for v, (a, _) in r.slopes.items())
        else:
            r = bound_domains(crown, *boxes, splits, c, method=method)
        if method == "beta-crown":  # the attack candidates: one point of the box per subdomain and row
            assert r.points.shape == (n, 3, 2) and np.all((r.points >= lo) & (r.points <= hi))
        for i in range(n):
            inside = [y for x, (z1, z2, y) in points if _fits(splits[relus[0]][i], splits[relus[1]][i], z1, z2)]
            tight[method] += enclosure_gap(r, i, c, inside, method)
    assert r.method == "beta-crown"
    assert tight["beta-crown"] <= tight["crown"] + 1e-9  # the multipliers only ever tighten
    # and they do tighten: the optimized multipliers beat alpha-CROWN alone (frozen at zero they do not)
    assert tight["beta-crown"] < tight["alpha-crown"] - 1e-6, tight


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_root_seeded_by_the_first_crown_pass_skips_its_passes_and_encloses(seed, monkeypatch):
    """Branch and bound's root starts from the caller's CROWN boxes on the same box (``seeds``) instead of
    computing them again: no intermediate backward pass runs, alpha- and beta-CROWN still optimize, and
    the bounds enclose the exact range (enumerated activation patterns) and equal the unseeded root's."""
    from semantics.linear_bounds import Crown
    import semantics.linear_bounds.crown as crown_mod
    from semantics.linear_bounds.splits import bound_domains, relu_nodes
    net, params = _net(seed)
    b = _bundle(net)
    rng = np.random.default_rng(200 + seed)
    lo = rng.uniform(-1, 0, (1, 2)).astype(np.float32).astype(np.float64)
    hi = lo + rng.uniform(0.5, 2, (1, 2)).astype(np.float32)
    inside = [y for _, (_, _, y) in Exact(params, lo[0], hi[0]).candidates()]
    c = rng.integers(-3, 4, (3, 2)).astype(np.float64)
    crown = Crown(b.graph, b.payload)
    first = crown(lo, hi, keep_refined=True)
    assert first.refined_boxes  # the ReLUs' inputs, at least
    root = {v: np.zeros((1, u), np.int8) for v, u in zip(relu_nodes(crown), (H1, H2))}
    passes = []
    chunks = crown_mod._Run._chunks
    monkeypatch.setattr(crown_mod._Run, "_chunks", lambda self, *a: passes.append(1) or chunks(self, *a))
    for method in ("crown", "beta-crown"):
        passes.clear()
        seeded = bound_domains(crown, lo, hi, root, c, method=method, seeds=first.refined_boxes)
        assert not passes, "a seeded node was bounded again"
        fresh = bound_domains(crown, lo, hi, root, c, method=method)
        assert passes
        enclosure_gap(seeded, 0, c, inside, method)
        np.testing.assert_allclose(seeded.lower, fresh.lower, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(seeded.upper, fresh.upper, rtol=1e-9, atol=1e-12)


def test_batched_domains_agree_with_one_at_a_time():
    from semantics.linear_bounds import Crown
    from semantics.linear_bounds.batch_axis import with_batch
    from semantics.linear_bounds.splits import bound_domains, relu_nodes
    net, _ = _net(3)
    b = _bundle(net)
    n = 8
    rng = np.random.default_rng(5)
    one, many = Crown(b.graph, b.payload), Crown(with_batch(b.graph, n), b.payload)
    relus = relu_nodes(many)
    splits = {v: rng.choice([-1, 0, 1], size=(n, u)).astype(np.int8) for v, u in zip(relus, (H1, H2))}
    lo, hi = np.full((n, 2), -0.5), np.full((n, 2), 0.75)
    c = np.array([[1.0, -1.0], [0.5, 2.0]])
    batch = bound_domains(many, lo, hi, splits, c)
    for i in range(n):
        single = bound_domains(one, lo[:1], hi[:1], {v: s[i:i + 1] for v, s in splits.items()}, c)
        assert single.empty[0] == batch.empty[i]
        if not single.empty[0]:
            np.testing.assert_allclose(single.lower[0], batch.lower[i], rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(single.upper[0], batch.upper[i], rtol=1e-12, atol=1e-12)


def test_a_batch_on_one_box_is_propagated_once_and_its_boxes_are_never_changed():
    """Branch and bound bounds every batch of subdomains on the property's one box: the IBP boxes are
    computed once per box (``Crown.shared_ibp``), read-only, and bounds from them equal a fresh Crown's;
    a batch whose samples differ is propagated as it is."""
    from semantics.linear_bounds import Crown
    from semantics.linear_bounds.batch_axis import with_batch
    from semantics.linear_bounds.splits import bound_domains, relu_nodes
    net, _ = _net(4)
    b = _bundle(net)
    n = 8
    rng = np.random.default_rng(6)
    many = Crown(with_batch(b.graph, n), b.payload)
    relus = relu_nodes(many)
    lo, hi = np.full((n, 2), -0.5), np.full((n, 2), 0.75)
    c = np.array([[1.0, -1.0], [0.5, 2.0]])
    boxes = many.shared_ibp(lo, hi)
    assert many.shared_ibp(lo.copy(), hi.copy()) is boxes
    for _ in range(3):  # runs on the kept boxes neither change them nor differ from fresh ones
        splits = {v: rng.choice([-1, 0, 1], size=(n, u)).astype(np.int8) for v, u in zip(relus, (H1, H2))}
        kept = bound_domains(many, lo, hi, splits, c, method="beta-crown")
        fresh = bound_domains(Crown(with_batch(b.graph, n), b.payload), lo, hi, splits, c, method="beta-crown")
        np.testing.assert_array_equal(kept.lower, fresh.lower)
        np.testing.assert_array_equal(kept.upper, fresh.upper)
        for (k_lo, k_hi), (f_lo, f_hi) in zip(boxes, many.ibp(lo, hi)):
            np.testing.assert_array_equal(k_lo, f_lo)
            np.testing.assert_array_equal(k_hi, f_hi)
    assert not boxes[relus[0]][0].flags.writeable
    for moved in ((lo, hi + 0.25), (lo - 0.25, hi)):  # other boxes, then rows that differ: not the kept boxes
        got = many.shared_ibp(*moved)
        np.testing.assert_array_equal(got[relus[0]][1], many.ibp(*moved)[relus[0]][1])
    lo[3] -= 0.25
    got = many.shared_ibp(lo, hi)
    np.testing.assert_array_equal(got[relus[0]][0], many.ibp(lo, hi)[relus[0]][0])
    assert got[relus[0]][0].flags.writeable


def test_magnitudes_of_the_shared_boxes_are_one_row_broadcast(monkeypatch):
    """The shared boxes' magnitudes max(|lo|, |hi|) are computed from one row and broadcast read-only
    (``Crown.shared_mag``: a product with them costs one row); any other box gets none. Bounds with them
    match the bounds computed from full magnitudes up to the products' summation order."""
    from semantics.linear_bounds import Crown
    from semantics.linear_bounds.batch_axis import with_batch
    from semantics.linear_bounds.splits import bound_domains, relu_nodes
    net, _ = _net(4)
    b = _bundle(net)
    n = 8
    many = Crown(with_batch(b.graph, n), b.payload)
    lo, hi = np.full((n, 2), -0.5), np.full((n, 2), 0.75)
    boxes = many.shared_ibp(lo, hi)
    for v, (b_lo, b_hi) in enumerate(boxes):
        m = many.shared_mag(v, b_lo, b_hi)
        if many.const[v]:
            continue
        assert m is not None and not m.flags.writeable and m.strides[0] == 0
        np.testing.assert_array_equal(m, np.maximum(np.abs(b_lo), np.abs(b_hi)))
        assert many.shared_mag(v, b_lo.copy(), b_hi) is None
    relus = relu_nodes(many)
    rng = np.random.default_rng(8)
    splits = {v: rng.choice([-1, 0, 1], size=(n, u)).astype(np.int8) for v, u in zip(relus, (H1, H2))}
    c = np.array([[1.0, -1.0], [0.5, 2.0]])
    shared = bound_domains(many, lo, hi, splits, c, method="beta-crown")
    monkeypatch.setattr(Crown, "shared_mag", lambda self, v, lo, hi: None)
    full = bound_domains(Crown(with_batch(b.graph, n), b.payload), lo, hi, splits, c, method="beta-crown")
    np.testing.assert_allclose(shared.lower, full.lower, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(shared.upper, full.upper, rtol=1e-12, atol=1e-12)


def test_shared_boxes_beyond_the_memory_cap_are_propagated_each_time(monkeypatch):
    """Boxes larger than ``MAX_SHARED_IBP_BYTES`` are not kept (a large network's batch would hold
    gigabytes across the search): each call propagates, and the result equals IBP's."""
    import semantics.linear_bounds.crown as crown_module
    from semantics.linear_bounds import Crown
    from semantics.linear_bounds.batch_axis import with_batch
    net, _ = _net(4)
    b = _bundle(net)
    many = Crown(with_batch(b.graph, 4), b.payload)
    lo, hi = np.full((4, 2), -0.5), np.full((4, 2), 0.75)
    monkeypatch.setattr(crown_module, "MAX_SHARED_IBP_BYTES", 0)
    first = many.shared_ibp(lo, hi)
    assert many.shared_ibp(lo, hi) is not first and many._shared_ibp is None
    assert first[-1][0].flags.writeable
    for (a_lo, a_hi), (b_lo, b_hi) in zip(first, many.ibp(lo, hi)):
        np.testing.assert_array_equal(a_lo, b_lo)
        np.testing.assert_array_equal(a_hi, b_hi)


def _model(b) -> _Model:
    from exporters.onnx import export_onnx
    return _Model(b, export_onnx(b).SerializeToString())


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(10))
def test_bab_relu_is_never_wrong_and_decides(seed):
    """Thresholds just below and above the exact minimum of y0 - y1: unsat below, sat above."""
    net, params = _net(seed)
    b = _bundle(net)
    model = _model(b)
    rng = np.random.default_rng(200 + seed)
    lo = rng.uniform(-1, 0, 2).astype(np.float32).astype(np.float64)
    hi = lo + rng.uniform(0.5, 2, 2).astype(np.float32)
    exact = Exact(params, lo, hi)
    values = [y[0] - y[1] for _, (_, _, y) in exact.candidates()]
    true_min = min(values)
    c = np.array([[1.0, -1.0]])
    decided = 0
    for delta in (-0.05, -0.005, 0.005, 0.05):
        t = float(true_min) + delta * (1 + abs(float(true_min)))
        prop = Property(2, 2, [Case(lo.copy(), hi.copy(), [(c, np.array([t]), np.zeros(1, bool))])])
        r = verify(model, prop, method="bab-relu", timeout=10, seed=seed)
        if r.result == "unsat":
            assert true_min > Fraction(t), (t, r)
        if r.result == "sat":
            x = [Fraction(v) for v in r.counterexample["x"]]
            assert Fraction(t) >= true_min
            assert exact.pre(x)[2][0] - exact.pre(x)[2][1] <= Fraction(t) + Fraction(1, 10 ** 6)
        decided += r.result != "unknown"
    assert decided >= 3  # the search closes thresholds 0.5% of the scale away from the exact minimum


@pytest.mark.parametrize("where", ["beta's plain pass", "the relaxations' preparation"])
def test_bounding_subdomains_stops_at_the_deadline_at_the_next_node(where, monkeypatch):
    """A deadline that passes while beta-CROWN's plain pass or the preparation of a batch's relaxations runs
    stops it at its next node: on VNN-COMP's resnet_4b each took seconds for a batch of subdomains, and
    ``--timeout 30`` answered at 31.5-34 s."""
    import sys
    from semantics.linear_bounds import Crown
    import semantics.linear_bounds.beta as beta_mod
    import semantics.linear_bounds.crown as crown_mod
    from semantics.linear_bounds.splits import bound_domains, relu_nodes
    code = {"beta's plain pass": beta_mod._plain.__code__,
            "the relaxations' preparation": crown_mod._Run.prepare.__code__}[where]
    net, _ = _net(4)
    b = _bundle(net)
    crown = Crown(b.graph, b.payload)
    lo, hi = np.full((1, 2), -0.5), np.full((1, 2), 0.75)
    root = {v: np.zeros((1, u), np.int8) for v, u in zip(relu_nodes(crown), (H1, H2))}
    stopped = []

    def on_time(self):
        if sys._getframe(1).f_code is code:
            stopped.append(1)
            raise crown_mod.DeadlineExceeded

    monkeypatch.setattr(crown_mod._Run, "on_time", on_time)
    with pytest.raises(crown_mod.DeadlineExceeded):
        bound_domains(crown, lo, hi, root, np.array([[1.0, -1.0]]), method="beta-crown")
    assert stopped == [1]


def test_bounding_subdomains_after_the_deadline_does_not_start():
    """Called once the deadline has passed, ``bound_domains`` raises before the batch's IBP (seconds on a
    CIFAR ResNet's batch of subdomains)."""
    import time
    from semantics.linear_bounds import Crown
    import semantics.linear_bounds.crown as crown_mod
    from semantics.linear_bounds.splits import bound_domains, relu_nodes
    net, _ = _net(4)
    b = _bundle(net)
    crown = Crown(b.graph, b.payload)
    calls = []
    shared = crown.shared_ibp
    crown.shared_ibp = lambda *a: calls.append(1) or shared(*a)
    root = {v: np.zeros((1, u), np.int8) for v, u in zip(relu_nodes(crown), (H1, H2))}
    with pytest.raises(crown_mod.DeadlineExceeded):
        bound_domains(crown, np.full((1, 2), -0.5), np.full((1, 2), 0.75), root, np.array([[1.0, -1.0]]),
                      deadline=time.perf_counter() - 1.0)
    assert not calls
