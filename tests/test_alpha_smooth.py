"""alpha-CROWN through sigmoid and tanh: both slopes of each unit optimized, each with the rigorous
intercept of its line over the box. The plain pass's gradient is the finite difference of its bound, the
lines built for any slopes hold on the box, the bounds (and the optimized intermediate boxes) enclose
sampled values and are never looser than CROWN's, and ``verify --method auto`` bounds a
high-dimensional sigmoid net's box with them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn

import torchlean_bridge as tlb
from semantics.linear_bounds import Crown
from semantics.linear_bounds.crown import _Run
import semantics.linear_bounds.alpha as alpha


def _net(act: type, widths=(6, 8, 8, 3), seed: int = 0, gain: float = 1.0) -> tlb.Bundle:
    """Linear layers (weights scaled by ``gain``: larger pre-activations, more curvature) and ``act``."""
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for a, b in zip(widths[:-1], widths[1:]):
        lin = nn.Linear(a, b)
        with torch.no_grad():
            lin.weight.mul_(gain)
        layers += [lin, act()]
    return tlb.import_fx(nn.Sequential(*layers[:-1]).eval(), (torch.zeros(1, widths[0]),))


def _run(b: tlb.Bundle, lo: np.ndarray, hi: np.ndarray) -> _Run:
    crown = Crown(b.graph, b.payload)
    run = _Run(crown, crown.ibp(lo, hi))
    run.prepare(False)
    return run


@pytest.mark.parametrize("act", [nn.Sigmoid, nn.Tanh])
def test_the_plain_pass_gradient_is_the_finite_difference(act):
    b = _net(act)
    lo, hi = np.full((1, 6), -1.0), np.full((1, 6), 1.5)
    run = _run(b, lo, hi)
    t = run.graph.outputs[0]
    layers, _ = alpha.chain_to_input(run, t)
    assert [k for k, _ in layers].count("smooth") == 2
    rows = np.random.default_rng(0).standard_normal((1, 4, 3))
    slopes = alpha.optimize_slopes(run, t, rows, iterations=3)
    c, r = (lo + hi) / 2, (hi - lo) / 2
    _, grads = alpha._bound_and_grads(run, layers, rows, slopes, c, r)
    rng = np.random.default_rng(1)
    for v, pair in slopes.items():
        for j in range(2):
            d = rng.standard_normal(pair[j].shape) * 1e-7
            moved = lambda sign: {**slopes, v: tuple(x + sign * d if i == j else x for i, x in enumerate(pair))}  # noqa
            fd = (alpha._bound_and_grads(run, layers, rows, moved(1), c, r)[0]
                  - alpha._bound_and_grads(run, layers, rows, moved(-1), c, r)[0]) / 2
            np.testing.assert_allclose((grads[v][j] * d).sum(axis=-1), fd, rtol=1e-4, atol=1e-13)


@pytest.mark.parametrize("act", [nn.Sigmoid, nn.Tanh])
def test_lines_for_any_slopes_hold_on_the_box(act):
    b = _net(act)
    lo, hi = np.full((1, 6), -2.0), np.full((1, 6), 2.0)
    run = _run(b, lo, hi)
    f = torch.sigmoid if act is nn.Sigmoid else torch.tanh
    rng = np.random.default_rng(2)
    for v in [w for w in run.lines if run.graph.nodes[w].kind in alpha.SMOOTH_OPTIMIZED]:
        z_lo, z_hi = (x.reshape(1, -1) for x in run.boxes[run.graph.nodes[v].parents[0]])
        m = 5
        slopes = (rng.uniform(-0.2, 1.2, (m, z_lo.shape[1])), rng.uniform(-0.2, 1.2, (m, z_lo.shape[1])))
        a_l, b_l, a_u, b_u = alpha.lines_for(run, v, slopes, m)
        z = z_lo + (z_hi - z_lo) * np.linspace(0, 1, 401)[:, None, None]  # [points, 1, units]
        fz = f(torch.tensor(z, dtype=torch.float64)).numpy()
        assert np.all(a_l * z + b_l <= fz + 1e-12) and np.all(fz <= a_u * z + b_u + 1e-12)
        np.testing.assert_array_equal(a_l, slopes[0])  # the slopes asked for (finite intercepts)


@pytest.mark.parametrize("act, seed", [(nn.Sigmoid, 3), (nn.Tanh, 4)])
def test_alpha_bounds_and_boxes_enclose_samples_and_beat_crown(act, seed):
    b = _net(act, (10, 16, 16, 16, 4), seed)
    lo, hi = np.full((1, 10), -0.6), np.full((1, 10), 0.6)
    c = np.array([[1.0, -1.0, 0.0, 0.0], [0.0, 0.5, -1.0, 1.0]])
    plain = tlb.linear_bounds(b.graph, b.payload, lo, hi, spec=c, all_nodes=True)
    tight = tlb.linear_bounds(b.graph, b.payload, lo, hi, spec=c, method="alpha-crown", all_nodes=True)
    assert tight.method == "alpha-crown"
    assert np.all(tight.spec_lower >= plain.spec_lower) and np.all(tight.spec_upper <= plain.spec_upper)
    assert np.sum(tight.spec_lower - plain.spec_lower) > 0
    xs = np.random.default_rng(seed).uniform(-0.6, 0.6, (3000, 10))
    from semantics.linear_bounds.batch_axis import with_batch
    values = tlb.evaluate(with_batch(b.graph, len(xs)), b.payload, [xs], all_nodes=True)  # every node, every sample
    ys = np.asarray(values[b.graph.outputs[0]]) @ c.T
    assert np.all(ys >= tight.spec_lower[0] - 1e-12) and np.all(ys <= tight.spec_upper[0] + 1e-12)
    narrower = 0.0
    for v, node in enumerate(b.graph.nodes):
        if node.kind == "linear":
            (t_lo, t_hi), (p_lo, p_hi) = tight.boxes[v], plain.boxes[v]
            z = np.asarray(values[v])
            assert np.all(z >= t_lo - 1e-12) and np.all(z <= t_hi + 1e-12), v
            narrower += float(np.sum((p_hi - p_lo) - (t_hi - t_lo)))
    assert narrower > 0  # the intermediate boxes were optimized too


def _wide_sigmoid():
    """A sigmoid net with more input entries than input splitting takes, its box, one row, CROWN's bound of
    it, and ``prop(threshold)``: the property that the row stays above the threshold."""
    from exporters.onnx import export_onnx
    from torchlean_bridge.app.verify import INPUT_SPLIT_DIMS, _Model
    from torchlean_bridge.app.vnnlib import Case, Property
    d = INPUT_SPLIT_DIMS + 8
    b = _net(nn.Sigmoid, (d, 24, 24, 3), seed=5, gain=3.0)
    model = _Model(b, export_onnx(b).SerializeToString())
    lo, hi = np.full(d, -0.5), np.full(d, 0.5)
    c = np.array([[1.0, -1.0, 0.0]])
    crown = tlb.linear_bounds(b.graph, b.payload, lo[None], hi[None], spec=c).spec_lower[0, 0]
    prop = lambda t: Property(d, 3, [Case(lo, hi, [(c, np.array([t]), np.zeros(1, dtype=bool))])])  # noqa: E731
    return b, model, lo, hi, c, crown, prop


def test_auto_bounds_a_high_dimensional_sigmoid_box_with_alpha_crown():
    from torchlean_bridge.app.verify import verify
    b, model, lo, hi, c, crown, prop = _wide_sigmoid()
    tight = tlb.linear_bounds(b.graph, b.payload, lo[None], hi[None], spec=c, method="alpha-crown").spec_lower[0, 0]
    assert tight > crown
    t = crown + 0.5 * (tight - crown)  # beyond CROWN, within alpha-CROWN's bound
    auto = verify(model, prop(t), method="auto", timeout=30)
    assert auto.result == "unsat" and auto.method == "bab-input" and auto.boxes_explored == 1, auto
    plain = verify(model, prop(t), method="bab-input", timeout=30)
    assert plain.boxes_explored > 1  # CROWN alone needs input splits


def test_auto_runs_the_optimization_only_when_crown_leaves_the_box_open(monkeypatch):
    from torchlean_bridge.app.verify import verify
    _, model, _, _, _, crown, prop = _wide_sigmoid()
    monkeypatch.setattr(alpha, "optimize_slopes", lambda *a, **k: pytest.fail("optimized a box CROWN decides"))
    r = verify(model, prop(crown - 0.1), method="auto", timeout=30)
    assert r.result == "unsat" and r.boxes_explored == 1


def test_auto_tries_the_cheap_points_before_optimizing_a_box_crown_leaves_open(monkeypatch):
    """A violated property on a box CROWN cannot decide: the attack's cheap points (the centre among them)
    find the counterexample before alpha-CROWN's optimization runs (seconds on a deep sigmoid net)."""
    from torchlean_bridge.app.verify import verify
    b, model, lo, hi, c, crown, prop = _wide_sigmoid()
    centre = float((c @ tlb.evaluate(b.graph, b.payload, ((lo + hi) / 2)[None])[0].reshape(-1))[0])
    monkeypatch.setattr(alpha, "optimize_slopes", lambda *a, **k: pytest.fail("optimized before the attack"))
    r = verify(model, prop(centre + 1e-3), method="auto", timeout=30)
    assert r.result == "sat" and r.boxes_explored == 1, r
    x = np.asarray(r.counterexample["x"])
    assert np.all((lo <= x) & (x <= hi))
