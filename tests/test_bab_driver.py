"""The branch-and-bound driver: method choice, memory cap, anytime JSON fields, rebatching."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn

import torchlean_bridge as tlb
from torchlean_bridge.app.verify import _Model, choose_method, load_model, verify
from torchlean_bridge.app.vnnlib import Case

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "fixtures" / "verify"


def _mlp(d: int, seed: int = 0) -> tlb.Bundle:
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(d, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 2)).eval()
    return tlb.import_fx(net, (torch.zeros(1, d),))


def test_auto_splits_inputs_when_few_and_relus_when_many():
    small, large = _model(_mlp(4)), _model(_mlp(40))
    box = lambda d, r: Case(np.full((1, d), -r), np.full((1, d), r), [])  # noqa: E731
    assert choose_method(small, box(4, 1.0)) == "bab-input"
    assert choose_method(large, box(40, 1.0)) == "bab-relu"
    assert choose_method(large, box(40, 0.0)) == "bab-input"  # a point: nothing unstable


def _mlp40(samples: int) -> tuple[_Model, np.ndarray, np.ndarray, float]:
    """The 40-input MLP (seed 1) on the box [-0.5, 0.5]^40 ``[1, 40]``, and the smallest y0 - y1 over
    ``samples`` random points of the box (a row [1, -1] refutable only below it)."""
    model = _model(_mlp(40, seed=1))
    b = model.bundle
    xs = np.random.default_rng(0).uniform(-0.5, 0.5, (samples, 40))
    ys = np.stack([np.asarray(tlb.evaluate(b.graph, b.payload, [x[None]])[0]).reshape(-1) for x in xs])
    return model, np.full((1, 40), -0.5), np.full((1, 40), 0.5), float((ys[:, 0] - ys[:, 1]).min())


def _model(b: tlb.Bundle) -> _Model:
    from exporters.onnx import export_onnx
    return _Model(b, export_onnx(b).SerializeToString())


def test_memory_cap_gives_unknown_with_the_reason():
    from torchlean_bridge.app.bab import ReluBab
    model, lo, hi, smallest = _mlp40(300)
    c = np.array([[1.0, -1.0]])
    d = np.array([smallest - 1e-3])  # close to the minimum: needs many subdomains
    search = ReluBab(model, lo, hi, c, d, np.zeros(1), time.perf_counter() + 30, max_queue_bytes=1, batch=2,
                     progress=False)
    out = search.run(np.array([-np.inf]))
    assert out.result == "unknown" and out.reason.startswith("memory cap"), out
    assert out.domains >= 3


def test_memory_cap_does_not_charge_the_shared_input_box():
    """ReLU splits keep the property's input box: the open subdomains share it, so a cap of 20 domains'
    own data (int8 splits, float64 boxes of the 32 split units, one gap, the entry) holds 5 of them, not
    the 2 it would if each paid for its 40-input box too."""
    import re
    from torchlean_bridge.app.bab import ReluBab
    model, lo, hi, smallest = _mlp40(300)
    per_domain = 32 + 16 * 32 + 8 + 64
    search = ReluBab(model, lo, hi, np.array([[1.0, -1.0]]), np.array([smallest - 1e-3]), np.zeros(1),
                     time.perf_counter() + 30, max_queue_bytes=5 * per_domain, batch=2, progress=False)
    out = search.run(np.array([-np.inf]))
    assert out.result == "unknown" and out.reason.startswith("memory cap"), out
    assert int(re.match(r"memory cap: (\d+) open", out.reason).group(1)) > 5


def test_rebatching_refuses_a_graph_without_a_unit_batch_axis():
    from semantics.linear_bounds.batch_axis import with_batch
    torch.manual_seed(0)
    b = tlb.import_fx(nn.Sequential(nn.Linear(3, 4), nn.ReLU()).eval(), (torch.zeros(2, 3),))
    assert with_batch(b.graph, 4) is None
    one = _mlp(3).graph
    g = with_batch(one, 5)
    assert g is not None and all(n.out_shape[0] == 5 for n in g.nodes)


@pytest.mark.slow
def test_bab_relu_json_reports_domains_and_the_best_lower_bound():
    cmd = [sys.executable, "-m", "torchlean_bridge", "verify", str(FIX / "acas_like.onnx"),
           str(FIX / "acas_robust.vnnlib"), "--json", "--timeout", "20"]
    for method, want in (("bab-relu", "bab-relu"), ("auto", "bab-input")):
        out = subprocess.run(cmd + ["--method", method], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        doc = json.loads(out.stdout)
        assert doc["result"] == "unsat" and doc["method"] == want
        assert doc["domains_visited"] >= 1 and doc["best_lower_bound"] > 0 and doc["time_s"] > 0
        assert out.stderr == ""  # no progress line when not on a terminal


def test_bab_relu_finds_the_fixture_counterexamples():
    model = load_model(FIX / "acas_like.onnx")
    for name in ("acas_sat", "acas_min"):
        r = verify(model, tlb.load_vnnlib(FIX / f"{name}.vnnlib"), method="bab-relu", timeout=20)
        assert r.result == "sat" and r.best_lower_bound is None


def test_unknown_method_is_refused_by_name():
    model = load_model(FIX / "acas_like.onnx")
    with pytest.raises(tlb.BridgeError, match="bab-relu"):
        verify(model, tlb.load_vnnlib(FIX / "acas_sat.vnnlib"), method="beta")


def test_progress_line_on_request(capsys):
    from torchlean_bridge.app.bab import ReluBab
    model, lo, hi, smallest = _mlp40(300)
    d = np.array([smallest - 1e-3])
    out = ReluBab(model, lo, hi, np.array([[1.0, -1.0]]), d, np.zeros(1), time.perf_counter() + 3, batch=2,
                  progress=True).run(np.array([-np.inf]))
    err = capsys.readouterr().err
    assert out.domains > 1
    assert err.startswith("\rbab: ") and " domains, " in err and "worst gap" in err


def test_graphs_that_do_not_rebatch_are_bounded_one_subdomain_per_pass(monkeypatch):
    import semantics.linear_bounds.alpha_intermediate as alpha_intermediate
    import semantics.linear_bounds.batch_axis as batch_axis
    import torchlean_bridge.app.bab.search as search
    # the root's alpha-CROWN boxes need a batch of rows, which a graph that does not rebatch lacks, and FSB
    # one batched pass for its candidates: without either on both sides, the two searches walk the same tree
    monkeypatch.setattr(alpha_intermediate, "MAX_ENTRIES", 0)
    monkeypatch.setattr(search, "BRANCHING", "babsr")
    model, lo, hi, smallest = _mlp40(300)
    lo, hi = lo[0], hi[0]
    root = float(model.crown(lo[None], hi[None], spec=np.array([[1.0, -1.0]])).spec_lower[0, 0])
    t = root + 0.3 * (smallest - root)  # beyond one CROWN pass, below the samples
    from torchlean_bridge.app.vnnlib import Property
    prop = Property(40, 2, [Case(lo, hi, [(np.array([[1.0, -1.0]]), np.array([t]), np.zeros(1, dtype=bool))])])
    batched = verify(model, prop, method="bab-relu", timeout=20)
    monkeypatch.setattr(batch_axis, "with_batch_payload", lambda g, payload, n: None)
    single = verify(_model(model.bundle), prop, method="bab-relu", timeout=20)
    assert batched.result == single.result == "unsat"
    assert batched.domains_visited > 1 and single.domains_visited == batched.domains_visited


@pytest.mark.parametrize("limit", [8, 1])
def test_fsb_halves_its_candidates_where_the_memory_limit_refuses_their_batch(monkeypatch, limit):
    """FSB's candidates' children beyond what one batched pass may hold (a refusal simulated above
    ``limit`` children) are halved, never bounded one per pass; when not even one candidate fits,
    the best-scored unit is split. Either way the search decides as without a limit. (The sound pass
    FSB takes off ReLU chains: the chain's plain float32 pass is switched off here.)"""
    import torchlean_bridge.app.bab.search as search
    from torchlean_bridge.errors import BridgeError
    monkeypatch.setattr(search, "PlainChain", lambda *args: None)
    model, lo, hi, smallest = _mlp40(300)
    b = model.bundle
    c = np.array([[1.0, -1.0]])
    root = float(model.crown(lo, hi, spec=c).spec_lower[0, 0])
    d = np.array([root + 0.5 * (smallest - root)])
    free = search.ReluBab(_model(b), lo, hi, c, d, np.zeros(1), time.perf_counter() + 30, progress=False)
    got = free.run(np.array([-np.inf]))
    assert got.result == "unsat" and got.domains > 2, got  # split at least once (11 domains here)
    tried = []
    real = search.ReluBab._bound_with

    def limited(self, crown, splits, lo_, hi_, size, known=None, method=None, warm=None, seeds=None):
        if method == "crown":  # FSB's pass
            tried.append(splits.shape[0])
            if splits.shape[0] > limit:
                raise BridgeError("simulated: the working-memory limit refuses this batch")
        return real(self, crown, splits, lo_, hi_, size, known, method, warm, seeds)

    monkeypatch.setattr(search.ReluBab, "_bound_with", limited)
    bab = search.ReluBab(model, lo, hi, c, d, np.zeros(1), time.perf_counter() + 30, progress=False)
    out = bab.run(np.array([-np.inf]))
    assert out.result == "unsat"
    assert tried and max(tried) > limit and min(tried) >= 2  # pairs of children, never one per pass
    if limit == 8:
        assert bab.fsb_domains > 0 and any(t <= limit for t in tried)
        refused = {1 << max(0, (t - 1).bit_length()) for t in tried if t > limit}
        assert all(model.batched_crown(n) is None for n in refused)
    else:
        assert bab.fsb_domains == 0  # every candidate batch refused: the best-scored unit is split


def test_a_refused_batch_is_halved_not_bounded_one_box_per_pass(monkeypatch):
    """Subdomains beyond the batch the working-memory limit takes (a refusal simulated above 8) are
    bounded in halves of at least 2, with the same gaps as without the limit."""
    import torchlean_bridge.app.bab.search as search
    from torchlean_bridge.errors import BridgeError
    model, lo, hi, _ = _mlp40(10)
    c = np.array([[1.0, -1.0]])
    bab = search.ReluBab(model, lo, hi, c, np.zeros(1), np.zeros(1), time.perf_counter() + 30, progress=False)
    total = int(bab.offsets[-1])
    _, _, pre, _, _ = bab._bound(np.zeros((1, total), dtype=np.int8), lo, hi)
    unstable = np.flatnonzero((pre[0][0] < 0) & (pre[1][0] > 0))
    m = 24
    splits = np.zeros((m, total), dtype=np.int8)
    splits[np.arange(m), unstable[np.arange(m) % unstable.size]] = np.where(np.arange(m) % 2, 1, -1)
    args = (splits, np.repeat(lo, m, axis=0), np.repeat(hi, m, axis=0), (np.repeat(pre[0], m, 0), np.repeat(pre[1], m, 0)))
    free = bab._bound(*args)
    sizes, real = [], search.ReluBab._bound_with

    def limited(self, crown, splits_, lo_, hi_, size, known=None, method=None, warm=None, seeds=None):
        sizes.append(size)
        if size > 8:
            raise BridgeError("simulated: the working-memory limit refuses this batch")
        return real(self, crown, splits_, lo_, hi_, size, known, method, warm, seeds)

    monkeypatch.setattr(search.ReluBab, "_bound_with", limited)
    got = search.ReluBab(_model(model.bundle), lo, hi, c, np.zeros(1), np.zeros(1), time.perf_counter() + 30,
                         progress=False)._bound(*args)
    assert sizes[0] == 32 and min(sizes) == 8 and sizes.count(8) == 3, sizes  # 32 -> 16 -> 8, 8, 8
    # (beta's float32 heuristic rounds differently with the batch's shape; each bound is sound either way)
    assert np.allclose(got[0], free[0], rtol=1e-5, atol=1e-7) and np.array_equal(got[1], free[1])
    assert all(np.allclose(a, b, rtol=1e-9) for a, b in zip(got[2], free[2]))


class _Residual(nn.Module):
    """40 -> 16, a ReLU block added back, leaky ReLU, a max pool over pairs, 2 outputs: a DAG."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.out = nn.Linear(40, 16), nn.Linear(16, 16), nn.Linear(8, 2)

    def forward(self, x):
        z = torch.relu(self.a(x))
        z = nn.functional.leaky_relu(z + self.b(z), 0.25)
        z = nn.functional.max_pool2d(z.reshape(-1, 1, 1, 16), (1, 2)).flatten(1)
        return self.out(z)


@pytest.mark.parametrize("kind", ["mlp", "dag"])
def test_pgd_descends_to_points_of_the_box_that_violate_more(kind):
    from semantics.linear_bounds.chain import dag_layers
    from torchlean_bridge.app.bab import Dag, pgd_candidates
    torch.manual_seed(2)
    model = _model(_mlp(40, seed=2) if kind == "mlp" else tlb.import_fx(_Residual().eval(), (torch.zeros(1, 40),)))
    dag = Dag(model.crown, dag_layers(model.crown))
    lo, hi = np.full(40, -0.5), np.full(40, 0.5)
    c, d = np.array([[1.0, -1.0]]), np.zeros(1)
    pts = pgd_candidates(dag, lo, hi, c, d, np.random.default_rng(0))
    assert np.all((pts >= lo) & (pts <= hi))
    b = model.bundle
    value = lambda x: float(c[0] @ np.asarray(tlb.evaluate(b.graph, b.payload, [x[None]])[0]).reshape(-1))  # noqa: E731
    random = np.random.default_rng(1).uniform(lo, hi, (200, 40))
    assert value(pts[0]) <= min(value(x) for x in random)  # the evaluator agrees: PGD beats random search
    y, _ = dag.forward(random[:5])  # the plain DAG pass is the network
    want = np.stack([np.asarray(tlb.evaluate(b.graph, b.payload, [x[None]])[0]).reshape(-1) for x in random[:5]])
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


def test_a_restart_pinned_in_a_corner_is_redrawn_and_its_best_point_kept():
    """y = x0 + x1 on [0, 1]^2: every restart walks into the corner (0, 0), stops moving there and is
    redrawn at random; the corner, each restart's best point, is still what PGD returns first."""
    from semantics.linear_bounds.chain import dag_layers
    from torchlean_bridge.app.bab import Dag, pgd_candidates
    net = nn.Linear(2, 1)
    with torch.no_grad():
        net.weight.copy_(torch.tensor([[1.0, 1.0]]))
        net.bias.zero_()
    model = _model(tlb.import_fx(net.eval(), (torch.zeros(1, 2),)))
    dag = Dag(model.crown, dag_layers(model.crown))
    redrawn = []
    real_random = np.random.Generator.random

    class Spy(np.random.Generator):
        def random(self, size=None, *a, **k):
            redrawn.append(size)
            return real_random(self, size, *a, **k)

    pts = pgd_candidates(dag, np.zeros(2), np.ones(2), np.array([[1.0]]), np.zeros(1),
                         Spy(np.random.PCG64(0)), restarts=8, steps=60)
    assert len(redrawn) > 1  # restarts were redrawn after the first draw
    np.testing.assert_array_equal(pts[0], [0.0, 0.0])


def test_root_restarts_fill_the_work_budget_within_the_memory_one():
    """Dag.restarts: as many restarts as fit ROOT_MACS multiply-adds in STEPS forward and backward passes
    (one more would not), capped at MAX_RESTARTS, bounded by the kept values, never below RESTARTS."""
    from semantics.linear_bounds.chain import dag_layers
    from torchlean_bridge.app.bab import pgd
    small_crown = _model(_mlp(4)).crown
    small = pgd.Dag(small_crown, dag_layers(small_crown))
    big_crown = _model(tlb.import_fx(nn.Sequential(nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 10)).eval(),
                                     (torch.zeros(1, 784),))).crown
    big = pgd.Dag(big_crown, dag_layers(big_crown))
    assert small.macs == 4 * 16 + 16 * 16 + 16 * 2 and big.macs == 784 * 1024 + 1024 * 10
    assert small.restarts() == pgd.MAX_RESTARTS  # a tiny network: the cap
    r, per_restart = big.restarts(), 2 * pgd.STEPS * big.macs
    assert pgd.RESTARTS < r < pgd.MAX_RESTARTS and r * per_restart <= pgd.ROOT_MACS < (r + 1) * per_restart
    assert small.restarts(values=small.values * 100) == 100  # the kept values bind
    assert big.restarts(macs=0) == pgd.RESTARTS  # never fewer than the sub-box attack's


@pytest.mark.parametrize("cases", [1, 64])
def test_the_property_s_whole_boxes_share_the_root_attack_budget(monkeypatch, cases):
    """The attack on a whole box gets Dag.restarts() restarts; a property of many boxes splits that budget
    (64 boxes: each gets a 64th of its multiply-adds), so its first attacks never cost 64 times the budget."""
    from semantics.linear_bounds.chain import dag_layers
    from torchlean_bridge.app import bab
    from torchlean_bridge.app.vnnlib import Property
    model = _model(_mlp(4))
    seen, real = [], bab.pgd_candidates
    monkeypatch.setattr(bab, "pgd_candidates", lambda *a, **k: (seen.append(k["restarts"]), real(*a, **k))[1])
    b = model.bundle
    corners = np.array(np.meshgrid(*[[-1.0, 1.0]] * 4)).reshape(4, -1).T
    xs = np.concatenate([corners, np.random.default_rng(0).uniform(-1, 1, (500, 4))])
    ys = np.stack([np.asarray(tlb.evaluate(b.graph, b.payload, [x[None]])[0]).reshape(-1) for x in xs])
    smallest = float((ys[:, 0] - ys[:, 1]).min())  # a row below it: open on the whole box, no cheap point
    box = Case(np.full((1, 4), -1.0), np.full((1, 4), 1.0), [(np.array([[1.0, -1.0]]), np.array([smallest - 0.02]),
                                                              np.zeros(1, dtype=bool))])
    verify(model, Property(4, 2, [box] * cases), method="bab-input", timeout=2)
    dag = bab.Dag(model.crown, dag_layers(model.crown))
    assert seen and max(seen) == dag.restarts(macs=bab.ROOT_MACS // cases)
    assert cases == 1 or max(seen) < dag.restarts()


def test_bab_relu_on_a_net_with_nothing_to_split_halves_the_input():
    """--method bab-relu on a sigmoid net whose root bound stays open: the search had no split node,
    so concatenating their boxes raised 'need at least one array to concatenate' (and, past it, argmax
    of an empty row). It now halves the input box (as for a subdomain with no unit left): never wrong."""
    net = nn.Sequential(nn.Linear(2, 4), nn.Sigmoid(), nn.Linear(4, 4), nn.Sigmoid(), nn.Linear(4, 2)).eval()
    with torch.no_grad():
        for layer, w, b in ((net[0], [[6, 2], [0, -4], [-3, -8], [-7, -8]], [-3, 3, 1, 4]),
                            (net[2], [[0, 2, 8, 4], [2, 1, 1, 7], [-4, 5, 3, -8], [-2, 6, 1, -8]], [2, 2, 3, -3]),
                            (net[4], [[-7, 6, -8, 1], [-7, -3, 0, -1]], [0, 0])):
            layer.weight.copy_(torch.tensor(w, dtype=torch.float32) / 8)
            layer.bias.copy_(torch.tensor(b, dtype=torch.float32) / 8)
    model = _model(tlb.import_fx(net, (torch.zeros(1, 2),)))
    grid = torch.stack(torch.meshgrid(torch.linspace(-1, 1, 201), torch.linspace(-1, 1, 201), indexing="ij"), -1)
    with torch.no_grad():
        y = net(grid.reshape(-1, 2)).double()
    diff = y[:, 0] - y[:, 1]
    low, span = float(diff.min()), float(diff.max() - diff.min())
    head = ("(declare-const X_0 Real)(declare-const X_1 Real)(declare-const Y_0 Real)(declare-const Y_1 Real)"
            "(assert (>= X_0 -1))(assert (<= X_0 1))(assert (>= X_1 -1))(assert (<= X_1 1))")
    answers = []
    for thr, allowed in ((low - 0.005 * span, ("unsat", "unknown")), (low + 0.005 * span, ("sat",))):
        prop = tlb.app.vnnlib.parse_vnnlib(head + f"(assert (<= (- Y_0 Y_1) {thr!r}))")
        r = verify(model, prop, method="bab-relu", timeout=5)
        assert r.result in allowed, (thr, r)
        answers.append(r.result)
    assert answers[0] == "unsat"  # 2-D input halving closes it well within the limit


def test_pgd_stops_at_the_deadline(monkeypatch):
    """PGD's 30 steps ignored the deadline: on VNN-COMP's collins_rul_cnn (0.4 s a step) verify --timeout 10
    answered after 21.5 s. A step here is slowed to 0.1 s; bab-relu at 0.5 s must stop near it."""
    from torchlean_bridge.app.bab import pgd
    from torchlean_bridge.app.vnnlib import Property
    model, lo, hi, smallest = _mlp40(100)
    c = np.array([[1.0, -1.0]])
    d = np.array([smallest - 1e-3])  # open at the root (as in the memory-cap test)
    forward = pgd.Dag.forward
    monkeypatch.setattr(pgd.Dag, "forward", lambda self, x: (time.sleep(0.1), forward(self, x))[1])
    prop = Property(40, 2, [Case(lo, hi, [(c, d, np.zeros(1, dtype=bool))])])
    start = time.perf_counter()
    r = verify(model, prop, method="bab-relu", timeout=0.5)
    assert time.perf_counter() - start < 1.5, r
    past = pgd.pgd_candidates(pgd.Dag(model.crown, __import__("semantics.linear_bounds.chain", fromlist=["x"])
                                      .dag_layers(model.crown)), lo[0], hi[0], c, d, np.random.default_rng(0),
                              deadline=time.perf_counter() - 1)
    assert past.shape == (pgd.RESTARTS, 40) and np.all((past >= lo) & (past <= hi))
