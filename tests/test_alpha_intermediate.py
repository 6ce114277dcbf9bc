"""alpha-CROWN on intermediate bounds (``alpha_intermediate``): the boxes of the ReLUs' inputs at
branch and bound's root, each unstable unit bounded with slopes of its own. They enclose the exact range
of every pre-activation (rationals, by enumeration of activation patterns on small nets), are never looser
than CROWN's, are tighter somewhere on a deeper net, and hold on samples through an input normalization;
the one sound pass they rest on, with a spec row per sample, gives each sample the bound a pass of its own gives."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from semantics.linear_bounds import Crown
from semantics.linear_bounds.batch_axis import with_batch
from semantics.linear_bounds.crown import _Pass, _Run
from semantics.linear_bounds.splits import bound_domains, relu_nodes
from tests.test_bab_exact import Exact, _bundle, _conv_net, _net
from tests.test_bab_normalized_input import HIDDEN, SIDE, normalized_mlp


def _root(crown: Crown, lo: np.ndarray, hi: np.ndarray, c: np.ndarray, method: str):
    relus = relu_nodes(crown)
    splits = {v: np.zeros((1, int(np.prod(crown.ishape(v)[1:]))), dtype=np.int8) for v in relus}
    return relus, bound_domains(crown, lo, hi, splits, c, method=method)


@pytest.mark.parametrize("seed, kind", [(s, "mlp") for s in range(6)] + [(s, "conv") for s in range(3)])
def test_the_optimized_boxes_enclose_the_exact_pre_activation_ranges(seed, kind):
    import torch
    import torchlean_bridge as tlb
    net, params = _net(seed) if kind == "mlp" else _conv_net(seed)
    b = _bundle(net) if kind == "mlp" else tlb.import_fx(net, (torch.zeros(1, 1, 1, 2),))
    crown = Crown(b.graph, b.payload)
    rng = np.random.default_rng(300 + seed)
    lo = rng.uniform(-1, 0, 2).astype(np.float32).astype(np.float64)
    hi = lo + rng.uniform(0.5, 2, 2).astype(np.float32)
    shape = tuple(b.graph.nodes[b.graph.inputs[0]].out_shape)
    c = np.array([[1.0, -1.0]])
    relus, plain = _root(crown, lo.reshape(shape), hi.reshape(shape), c, "crown")
    _, tight = _root(crown, lo.reshape(shape), hi.reshape(shape), c, "beta-crown")
    if kind == "conv":  # the convolutions are on the chain alpha optimizes
        from semantics.linear_bounds.alpha import chain_to_input
        run = _Run(crown, crown.ibp(lo.reshape(shape), hi.reshape(shape)))
        run.prepare(False)
        assert chain_to_input(run, crown.graph.outputs[0]) is not None
    z2 = [pre[1] for _, pre in Exact(params, lo, hi).candidates()]  # the second layer's pre-activations
    v = relus[1]
    t_lo, t_hi = tight.pre[v]
    p_lo, p_hi = plain.pre[v]
    assert np.all(t_lo >= p_lo) and np.all(t_hi <= p_hi)  # never looser than CROWN's
    for j in range(t_lo.shape[1]):
        values = [z[j] for z in z2]
        assert Fraction(float(t_lo[0, j])) <= min(values) and Fraction(float(t_hi[0, j])) >= max(values), (seed, j)


def test_a_deeper_normalized_net_gets_tighter_boxes_that_hold_on_samples(tmp_path):
    model = normalized_mlp(tmp_path, "normalize", seed=8)
    lo, hi = np.full((1, 1, SIDE, SIDE), 0.1), np.full((1, 1, SIDE, SIDE), 0.7)
    c = np.array([[1.0, -1.0, 0.0]])
    relus, plain = _root(model.crown, lo, hi, c, "crown")
    _, tight = _root(model.crown, lo, hi, c, "beta-crown")
    from semantics.linear_bounds.chain import dag_layers
    from torchlean_bridge.app.bab import Dag
    from tests.test_bab_normalized_input import _pre_activations
    xs = np.random.default_rng(9).uniform(0.1, 0.7, (20000, SIDE * SIDE))
    pre = _pre_activations(Dag(model.crown, dag_layers(model.crown)), xs, relus)
    gained = 0.0
    for v in relus:
        (t_lo, t_hi), (p_lo, p_hi) = tight.pre[v], plain.pre[v]
        assert np.all(t_lo >= p_lo) and np.all(t_hi <= p_hi)
        # the plain DAG's values are the file's float32 weights in float64: within 1e-9 of the graph's
        assert np.all(pre[v] >= t_lo - 1e-9) and np.all(pre[v] <= t_hi + 1e-9)
        gained += float(np.sum((p_hi - p_lo) - (t_hi - t_lo)))
    assert gained > 0  # the second ReLU's unstable units are bounded tighter
    assert tight.lower[0, 0] >= plain.lower[0, 0]


def test_a_spec_row_per_sample_bounds_each_sample_as_its_own_pass(tmp_path):
    model = normalized_mlp(tmp_path, "affine", seed=10)
    n = 8
    g = with_batch(model.bundle.graph, n)
    wide, one = Crown(g, model.bundle.payload), model.crown
    rng = np.random.default_rng(11)
    lo = np.repeat(np.full((1, 1, SIDE, SIDE), 0.2), n, 0)
    hi = lo + 0.3
    t = relu_nodes(one)[1]
    t = one.graph.nodes[t].parents[0]
    spec = rng.standard_normal((n, 1, HIDDEN))
    run_w = _Run(wide, wide.ibp(lo, hi))
    run_w.prepare(False)
    low, neg_up = _Pass(run_w, t, 0, n, spec=spec).run()
    for i in range(n):
        run_1 = _Run(one, one.ibp(lo[:1], hi[:1]))
        run_1.prepare(False)
        l1, u1 = _Pass(run_1, t, 0, 1, spec=spec[i]).run()
        np.testing.assert_allclose(low[i], l1[0], rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(neg_up[i], u1[0], rtol=1e-12, atol=1e-12)


def test_the_root_boxes_are_optimized_once_per_box_and_shared_by_its_groups(tmp_path, monkeypatch):
    import semantics.linear_bounds.alpha_intermediate as alpha_intermediate
    from torchlean_bridge.app.verify import verify
    from torchlean_bridge.app.vnnlib import Case, Property
    model = normalized_mlp(tmp_path, "normalize", seed=12)
    lo, hi = np.full(SIDE * SIDE, 0.2), np.full(SIDE * SIDE, 0.5)
    xs = np.random.default_rng(13).uniform(0.2, 0.5, (4000, SIDE * SIDE))
    ys = np.stack([model.evaluate(x.reshape(model.input_shape), "float64").reshape(-1) for x in xs])
    rows = [np.array([[1.0, -1.0, 0.0]]), np.array([[0.0, 1.0, -1.0]])]
    root = [float(model.crown(lo.reshape(model.input_shape), hi.reshape(model.input_shape), spec=c).spec_lower[0, 0])
            for c in rows]
    # each group just beyond its CROWN bound, below every sample: both need the search
    groups = [(c, np.array([r + 0.3 * (float((ys @ c.T).min()) - r)]), np.zeros(1, dtype=bool))
              for c, r in zip(rows, root)]
    calls = []
    real = alpha_intermediate.tighten_unstable
    monkeypatch.setattr(alpha_intermediate, "tighten_unstable", lambda run, v, *a: calls.append(v) or real(run, v, *a))
    r = verify(model, Property(SIDE * SIDE, 3, [Case(lo, hi, groups)]), method="bab-relu", timeout=30)
    assert r.result == "unsat", r
    assert len(calls) == len(set(calls)) == 2  # each ReLU's input once: the second group reuses the first's
