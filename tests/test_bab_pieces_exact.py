"""Splits of leaky ReLU, abs, clamp and max-pool, and beta-less DAGs, against exact answers in rationals.

Small nets on a 2-D input box (weights on a 1/8 grid: exact in float32 and as ``Fraction``): leaky
ReLU, abs and hardtanh in one MLP; ReLU, max pooling and a one-sided clamp; a residual add between
ReLU layers. The exact minimum of ``c . y`` over a subdomain comes from enumerating activation
patterns: the box, a convex polygon, is cut along every piece boundary of every unit in graph order
(``z = t`` for a breakpoint t, ``z_i = z_j`` for two cells of a pool window), each unit's input being
affine on every polygon cut by the units before it, so the final polygons are the cells of the
pattern arrangement. On a cell the net is affine and every constraint is a face, so the minimum over
a subdomain is at a cell vertex that satisfies the subdomain's constraints (checked at the vertex,
exactly). Against that: every bound encloses the exact range, a subdomain reported empty has no
point, and ``bab-relu`` with either branching rule is never wrong on thresholds either side of the
exact minimum, every ``sat`` reproducing exactly.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torchlean_bridge as tlb
from torchlean_bridge.app.verify import _Model, verify
from torchlean_bridge.app.vnnlib import Case, Property
from tests.test_bab_exact import enclosure_gap

ZERO = Fraction(0)


def _grid(rng, shape, scale=8):
    return rng.integers(-scale, scale + 1, shape) / 8.0


class Spec:
    """A net as a list of ops over flat values, evaluated exactly (Fractions) and built as a torch module.

    ops: ("linear", W, b), ("leaky", slope), ("abs",), ("clamp", lo, hi), ("relu",),
    ("pool", channels, width) (max over (1, 2) windows of a [channels, 1, width] map),
    ("save",) / ("add_saved",) (a residual connection around the ops between them).
    """

    def __init__(self, ops) -> None:
        self.ops = ops
        self.frac = [tuple(_fr(x) for x in op[1:]) if op[0] == "linear" else op for op in ops]

    # -- exact -------------------------------------------------------------------------------

    def trace(self, x):
        """Every piecewise op's input (flat Fractions) at x, in order, and the output."""
        v, saved, inputs = list(x), None, []
        for op, fop in zip(self.ops, self.frac):
            kind = op[0]
            if kind == "linear":
                w, b = fop
                v = [sum((wi * vi for wi, vi in zip(row, v)), ZERO) + bi for row, bi in zip(w, b)]
            elif kind == "save":
                saved = v
            elif kind == "add_saved":
                v = [a + b for a, b in zip(v, saved)]
            else:
                inputs.append(v)
                v = _apply(op, v)
        return inputs, v

    # -- torch -------------------------------------------------------------------------------

    def module(self) -> nn.Module:
        spec = self

        class Net(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.lin = nn.ModuleList()
                for op in spec.ops:
                    if op[0] == "linear":
                        w, b = op[1], op[2]
                        m = nn.Linear(w.shape[1], w.shape[0])
                        with torch.no_grad():
                            m.weight.copy_(torch.tensor(w))
                            m.bias.copy_(torch.tensor(b))
                        self.lin.append(m)

            def forward(self, x):
                i, saved = 0, None
                for op in spec.ops:
                    kind = op[0]
                    if kind == "linear":
                        x = self.lin[i](x)
                        i += 1
                    elif kind == "leaky":
                        x = F.leaky_relu(x, op[1])
                    elif kind == "abs":
                        x = torch.abs(x)
                    elif kind == "clamp":
                        x = torch.clamp(x, op[1], op[2])
                    elif kind == "relu":
                        x = torch.relu(x)
                    elif kind == "pool":
                        x = F.max_pool2d(x.reshape(-1, op[1], 1, op[2]), (1, 2)).flatten(1)
                    elif kind == "save":
                        saved = x
                    elif kind == "add_saved":
                        x = x + saved
                return x
        return Net().eval()


def _fr(m):
    return [[Fraction(float(v)) for v in row] for row in m] if np.ndim(m) == 2 else [Fraction(float(v)) for v in m]


def _apply(op, v):
    kind = op[0]
    if kind == "relu":
        return [max(z, ZERO) for z in v]
    if kind == "leaky":
        s = Fraction(op[1])
        return [z if z >= 0 else s * z for z in v]
    if kind == "abs":
        return [abs(z) for z in v]
    if kind == "clamp":
        lo, hi = (None if t is None else Fraction(t) for t in op[1:])
        return [min(max(z, lo) if lo is not None else z, hi) if hi is not None else max(z, lo) for z in v]
    if kind == "pool":
        return [max(v[2 * j], v[2 * j + 1]) for j in range(len(v) // 2)]
    raise AssertionError(kind)


def _boundaries(op, v):
    """The piece-boundary functions of a piecewise op given its input values: (unit, value - t) per
    breakpoint t, or the difference of a pool window's two cells."""
    kind = op[0]
    if kind == "pool":
        return [v[2 * j] - v[2 * j + 1] for j in range(len(v) // 2)]
    knots = [Fraction(t) for t in op[1:] if t is not None] if kind == "clamp" else [ZERO]
    return [z - t for z in v for t in knots]


def _cut(poly, f):
    """The convex polygon (exact vertices) cut by the affine function f (given at the vertices)."""
    vals = [f(p) for p in poly]
    if all(x >= 0 for x in vals) or all(x <= 0 for x in vals):
        return [poly]
    out = []
    for side in (1, -1):
        piece = []
        for i, (p, fp) in enumerate(zip(poly, vals)):
            q, fq = poly[(i + 1) % len(poly)], vals[(i + 1) % len(poly)]
            if side * fp >= 0:
                piece.append(p)
            if (fp > 0 and fq < 0) or (fp < 0 and fq > 0):
                t = fp / (fp - fq)
                piece.append((p[0] + t * (q[0] - p[0]), p[1] + t * (q[1] - p[1])))
        out.append(piece)
    return out


def vertices(spec: Spec, lo, hi):
    """Every vertex of the pattern arrangement on the box, with its trace."""
    lo, hi = [Fraction(float(v)) for v in lo], [Fraction(float(v)) for v in hi]
    polys = [[(lo[0], lo[1]), (hi[0], lo[1]), (hi[0], hi[1]), (lo[0], hi[1])]]
    memo = {}

    def trace(p):
        if p not in memo:
            memo[p] = spec.trace(list(p))
        return memo[p]
    n_ops = len(trace(polys[0][0])[0])
    pw = [op for op in spec.ops if op[0] not in ("linear", "save", "add_saved")]
    for k in range(n_ops):
        units = len(_boundaries(pw[k], trace(polys[0][0])[0][k]))
        for u in range(units):
            def f(p, k=k, u=u):
                return _boundaries(pw[k], trace(p)[0][k])[u]
            polys = [piece for poly in polys for piece in _cut(poly, f)]
    points = {p for poly in polys for p in poly}
    return pw, [(p, trace(p)) for p in points]


def _satisfies(pw, inputs, codes) -> bool:
    """Whether the exact inputs of every piecewise op meet the subdomain's codes (module pieces)."""
    for op, v, c in zip(pw, inputs, codes):
        for u, code in enumerate(c):
            code = int(code)
            if code == 0:
                continue
            if op[0] == "pool":
                a, b = v[2 * u], v[2 * u + 1]
                mine, other = (a, b) if abs(code) == 1 else (b, a)
                if (code > 0 and mine < other) or (code < 0 and mine > other):
                    return False
                continue
            knots = [Fraction(t) for t in op[1:] if t is not None] if op[0] == "clamp" else [ZERO]
            z = v[u]
            if code == 3:
                if not knots[0] <= z <= knots[1]:
                    return False
            elif (code > 0 and z < knots[code - 1]) or (code < 0 and z > knots[-code - 1]):
                return False
    return True


def _codes(op, units, rng):
    if op[0] == "pool":
        choices = [-2, -1, 0, 0, 0, 1, 2]
    elif op[0] == "clamp" and op[1] is not None and op[2] is not None:
        choices = [-2, -1, 0, 0, 0, 1, 2, 3]
    else:
        choices = [-1, 0, 0, 1]
    return rng.choice(choices, size=units).astype(np.int8)


def _mix(seed):
    rng = np.random.default_rng(seed)
    return Spec([("linear", _grid(rng, (5, 2)), _grid(rng, 5, 4)), ("leaky", 0.25),
                 ("linear", _grid(rng, (5, 5)), _grid(rng, 5, 4)), ("abs",),
                 ("linear", _grid(rng, (4, 5)), _grid(rng, 4, 4)), ("clamp", -0.5, 0.75),
                 ("linear", _grid(rng, (2, 4)), _grid(rng, 2, 4))])


def _pool(seed):
    rng = np.random.default_rng(seed)
    return Spec([("linear", _grid(rng, (8, 2)), _grid(rng, 8, 4)), ("relu",), ("pool", 2, 4),
                 ("linear", _grid(rng, (4, 4)), _grid(rng, 4, 4)), ("clamp", 0.125, None),
                 ("linear", _grid(rng, (2, 4)), _grid(rng, 2, 4))])


def _residual(seed):
    rng = np.random.default_rng(seed)
    return Spec([("linear", _grid(rng, (4, 2)), _grid(rng, 4, 4)), ("relu",), ("save",),
                 ("linear", _grid(rng, (4, 4)), _grid(rng, 4, 4)), ("relu",),
                 ("linear", _grid(rng, (4, 4)), _grid(rng, 4, 4)), ("add_saved",), ("relu",),
                 ("linear", _grid(rng, (2, 4)), _grid(rng, 2, 4))])


def _pool_relu(seed):
    rng = np.random.default_rng(seed)
    return Spec([("linear", _grid(rng, (8, 2)), _grid(rng, 8, 4)), ("relu",), ("pool", 2, 4),
                 ("linear", _grid(rng, (4, 4)), _grid(rng, 4, 4)), ("relu",),
                 ("linear", _grid(rng, (2, 4)), _grid(rng, 2, 4))])


def _leaky_residual(seed):
    rng = np.random.default_rng(seed)
    return Spec([("linear", _grid(rng, (4, 2)), _grid(rng, 4, 4)), ("leaky", 0.125), ("save",),
                 ("linear", _grid(rng, (4, 4)), _grid(rng, 4, 4)), ("leaky", 0.5),
                 ("linear", _grid(rng, (4, 4)), _grid(rng, 4, 4)), ("add_saved",), ("relu",),
                 ("linear", _grid(rng, (2, 4)), _grid(rng, 2, 4))])


NETS = {"mix": _mix, "pool": _pool, "residual": _residual, "pool-relu": _pool_relu, "leaky-residual": _leaky_residual}
BETA = {"residual", "pool-relu", "leaky-residual"}  # DAGs of affine layers, (leaky) ReLUs, adds, max pools
KINDS = {"leaky": "leaky_relu", "abs": "abs", "clamp": "clamp", "relu": "relu", "pool": "max_pool"}


def _box(rng):
    lo = rng.uniform(-1, 0, 2).astype(np.float32).astype(np.float64)
    return lo, lo + rng.uniform(0.5, 1.5, 2).astype(np.float32)


@pytest.mark.parametrize("net, seed", [(n, s) for n in NETS for s in range(3)])
def test_split_bounds_enclose_the_exact_range(net, seed):
    from semantics.linear_bounds import Crown
    from semantics.linear_bounds.batch_axis import with_batch
    from semantics.linear_bounds.splits import bound_domains, split_nodes, split_units
    spec = NETS[net](seed)
    b = tlb.import_fx(spec.module(), (torch.zeros(1, 2),))
    rng = np.random.default_rng(300 + seed)
    lo, hi = _box(rng)
    pw, points = vertices(spec, lo, hi)
    n = 16
    crown = Crown(with_batch(b.graph, n), b.payload)
    nodes = split_nodes(crown)
    assert [crown.graph.nodes[v].kind for v in nodes] == [KINDS[op[0]] for op in pw]
    splits = {v: np.stack([_codes(op, split_units(crown, v), rng) for _ in range(n)]) for v, op in zip(nodes, pw)}
    splits = {v: np.where(np.arange(n)[:, None] == 0, 0, s).astype(np.int8) for v, s in splits.items()}  # 0: the box
    c = rng.integers(-3, 4, (3, 2)).astype(np.float64)
    boxes = np.repeat(lo[None], n, 0), np.repeat(hi[None], n, 0)
    parent = bound_domains(crown, *boxes, {v: np.zeros_like(s) for v, s in splits.items()}, c)
    tight = {}  # summed gaps to the exact minima
    for how in ("crown", "beta-crown", "reused"):
        tight[how] = 0.0
        if how == "reused":
            r = bound_domains(crown, *boxes, splits, c, method="beta-crown", known=parent.pre)
        else:
            r = bound_domains(crown, *boxes, splits, c, method=how)
        assert r.method == ("crown" if how == "crown" or net not in BETA else "beta-crown"), (how, r.method)
        for i in range(n):
            codes = [splits[v][i] for v in nodes]
            inside = [y for _, (inputs, y) in points if _satisfies(pw, inputs, codes)]
            tight[how] += enclosure_gap(r, i, c, inside, how)
    assert tight["beta-crown"] <= tight["crown"] + 1e-9  # beta is intersected with CROWN: never looser
    # the whole box (sample 0) is never empty, and the relaxations are not the box: CROWN is finite
    assert not r.empty[0] and np.all(np.isfinite(r.lower[0]))


def test_a_fixed_piece_is_bounded_by_its_exact_line():
    """One abs unit between two linear maps: fixing its side makes CROWN exact on a 1-D box."""
    from semantics.linear_bounds import Crown
    from semantics.linear_bounds.batch_axis import with_batch
    from semantics.linear_bounds.splits import bound_domains, split_nodes
    spec = Spec([("linear", np.array([[1.0, 0.0]]), np.array([0.0])), ("abs",),
                 ("linear", np.array([[1.0]]), np.array([0.0]))])
    b = tlb.import_fx(spec.module(), (torch.zeros(1, 2),))
    crown = Crown(with_batch(b.graph, 3), b.payload)
    (v,) = split_nodes(crown)
    lo, hi = np.array([[-1.0, 0.0]] * 3), np.array([[2.0, 0.0]] * 3)
    r = bound_domains(crown, lo, hi, {v: np.array([[0], [1], [-1]], dtype=np.int8)}, np.array([[1.0]]))
    tol = 1e-12  # the outward rounding's slack
    assert -tol <= r.lower[1, 0] <= 0.0 and 2.0 <= r.upper[1, 0] <= 2.0 + tol  # |x| = x on [0, 2]
    assert -tol <= r.lower[2, 0] <= 0.0 and 1.0 <= r.upper[2, 0] <= 1.0 + tol  # |x| = -x on [-1, 0]
    assert r.lower[0, 0] <= 0.0 and r.upper[0, 0] >= 2.0 and not r.empty.any()
    assert r.upper[0, 0] < 2.0 + 1.0  # the free unit's chord, not a box: at most 2 + (chord - |x| at 0)


def _model(b) -> _Model:
    from exporters.onnx import export_onnx
    return _Model(b, export_onnx(b).SerializeToString())


@pytest.mark.slow
@pytest.mark.parametrize("net, seed", [(n, s) for n in NETS for s in range(2)])
def test_bab_on_piecewise_nets_is_never_wrong_and_fsb_agrees_with_babsr(net, seed):
    from torchlean_bridge.app.bab import search
    spec = NETS[net](seed)
    b = tlb.import_fx(spec.module(), (torch.zeros(1, 2),))
    model = _model(b)
    rng = np.random.default_rng(400 + seed)
    lo, hi = _box(rng)
    _, points = vertices(spec, lo, hi)
    true_min = min(y[0] - y[1] for _, (_, y) in points)
    c = np.array([[1.0, -1.0]])
    decided = {"fsb": 0, "babsr": 0}
    default = search.BRANCHING
    try:
        for delta in (-0.05, -0.005, 0.005, 0.05):
            t = float(true_min) + delta * (1 + abs(float(true_min)))
            prop = Property(2, 2, [Case(lo.copy(), hi.copy(), [(c, np.array([t]), np.zeros(1, bool))])])
            answers = {}
            for rule in ("babsr", "fsb"):
                search.BRANCHING = rule
                r = verify(model, prop, method="bab-relu", timeout=10, seed=seed)
                answers[rule] = r.result
                if r.result == "unsat":
                    assert true_min > Fraction(t), (rule, t, r)
                if r.result == "sat":
                    x = [Fraction(v) for v in r.counterexample["x"]]
                    y = spec.trace(x)[1]
                    assert Fraction(t) >= true_min and y[0] - y[1] <= Fraction(t) + Fraction(1, 10 ** 6), (rule, t)
                decided[rule] += r.result != "unknown"
            assert "sat" not in answers.values() or "unsat" not in answers.values(), answers
    finally:
        search.BRANCHING = default
    assert decided["fsb"] >= 3 and decided["babsr"] >= 3, decided


def test_bad_split_codes_are_refused_naming_the_node():
    from semantics.linear_bounds import Crown
    from semantics.linear_bounds.splits import bound_domains, split_nodes
    from torchlean_bridge.errors import BridgeError
    spec = _mix(0)
    b = tlb.import_fx(spec.module(), (torch.zeros(1, 2),))
    crown = Crown(b.graph, b.payload)
    leaky, _, clamp = split_nodes(crown)
    box = np.zeros((1, 2)), np.ones((1, 2))
    c = np.eye(2)
    with pytest.raises(BridgeError, match=f"node {leaky} \\(leaky_relu\\) takes split codes"):
        bound_domains(crown, *box, {leaky: np.full((1, 5), 3, dtype=np.int8)}, c)
    with pytest.raises(BridgeError, match="must be int8"):
        bound_domains(crown, *box, {clamp: np.zeros((1, 4))}, c)
    ok = bound_domains(crown, *box, {clamp: np.full((1, 4), 3, dtype=np.int8)}, c)  # between both breakpoints
    assert ok.lower.shape == (1, 2)


def test_auto_branches_on_leaky_relu_nets_with_many_inputs():
    from torchlean_bridge.app.verify import choose_method
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(40, 16), nn.LeakyReLU(0.1), nn.Linear(16, 2))
    model = _model(tlb.import_fx(net.eval(), (torch.zeros(1, 40),)))
    assert choose_method(model, Case(np.full((1, 40), -1.0), np.full((1, 40), 1.0), [])) == "bab-relu"
    assert choose_method(model, Case(np.zeros((1, 40)), np.zeros((1, 40)), [])) == "bab-input"  # a point


@pytest.mark.parametrize("knots", [(0.0,), (-1.0, 2.0)])
def test_constraint_interval_gathers_each_codes_interval(knots):
    """Every code of ``_INTERVALS`` (0: free) in a random array maps to its interval's ends."""
    from semantics.linear_bounds.pieces import _INTERVALS, constraint_interval
    ends = (-np.inf,) + knots + (np.inf,)
    codes = np.array(sorted(_INTERVALS[len(knots)]), np.int8)
    rng = np.random.default_rng(len(knots))
    grid = rng.choice(codes, size=(5, 7)).astype(np.int8)
    c_lo, c_hi = constraint_interval(grid, knots)
    for (r, u), code in np.ndenumerate(grid):
        i, j = _INTERVALS[len(knots)][int(code)]
        assert (c_lo[r, u], c_hi[r, u]) == (ends[i], ends[j])
