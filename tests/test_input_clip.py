"""Input splitting's domain clipping (``app.input_clip``): the clipped box keeps every point of the box where
an open group may hold, and it clips with the linear bound its coefficients belong to, never with a tighter
bound taken from elsewhere (the output box)."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import torch
import torch.nn as nn

import torchlean_bridge as tlb
from semantics.linear_bounds import Crown
from torchlean_bridge.app.input_clip import clipped_box


def _crown(net: nn.Module, inputs: int) -> tuple[Crown, tlb.Bundle]:
    b = tlb.import_fx(net.eval(), (torch.zeros(1, inputs),))
    return Crown(b.graph, b.payload), b


def _outputs(b, xs: np.ndarray) -> np.ndarray:
    return np.stack([np.asarray(tlb.evaluate(b.graph, b.payload, [x[None]])[0]).reshape(-1) for x in xs])


def _diagonal_distance() -> nn.Module:
    """|x0 - x1| as relu(x0 - x1) + relu(x1 - x0)."""
    net = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 1))
    with torch.no_grad():
        net[0].weight.copy_(torch.tensor([[1.0, -1.0], [-1.0, 1.0]]))
        net[0].bias.zero_()
        net[2].weight.copy_(torch.tensor([[1.0, 1.0]]))
        net[2].bias.zero_()
    return net


def test_every_point_where_a_group_can_hold_stays_in_the_clipped_box():
    """Random MLPs and boxes, two groups (one row, and two rows that must hold together) at levels that some
    of the box's points meet: each such point lies in the clipped box, which is smaller than the box in some
    of the cases, and a group no point meets can be dropped."""
    shrunk = 0
    for seed in range(12):
        torch.manual_seed(seed)
        net = nn.Sequential(nn.Linear(3, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 3))
        crown, b = _crown(net, 3)
        rng = np.random.default_rng(seed)
        centre, radius = rng.uniform(-1, 1, 3), rng.uniform(0.05, 0.4, 3)
        lo, hi = centre - radius, centre + radius
        c = np.array([[1.0, -1.0, 0.0], [0.0, 1.0, -1.0], [-1.0, 0.0, 1.0]])
        res = crown(lo[None], hi[None], spec=c)
        xs = lo + rng.random((3000, 3)) * (hi - lo)
        rows = _outputs(b, xs) @ c.T
        levels = np.quantile(rows, 0.15, axis=0)  # each row holds (row <= level) on about 15% of the points
        groups = [(slice(0, 1), levels[:1]), (slice(1, 3), levels[1:])]
        got = clipped_box(lo, hi, res.spec_coefficients[0][0], res.spec_line_lower[0], groups)
        holds = [np.all(rows[:, g[0]] <= g[1], axis=1) for g in groups]
        if got is None:
            assert not any(h.any() for h in holds)
            continue
        new_lo, new_hi, kept = got
        assert np.all(new_lo >= lo) and np.all(new_hi <= hi)
        for index, h in enumerate(holds):
            if h.any():
                assert index in kept
                assert np.all((xs[h] >= new_lo) & (xs[h] <= new_hi))
        shrunk += bool(np.any(new_lo > lo) or np.any(new_hi < hi))
    assert shrunk >= 3


def test_the_clip_uses_the_lines_own_bound_not_the_output_boxs():
    """|x0 - x1| as relu(t) + relu(-t): on [-0.3, 0] x [-0.3, 0.3] CROWN's line for y is below 0 somewhere while
    the output box says y >= 0, so spec_lower exceeds spec_line_lower. The point (-0.3, -0.3), where y = 0
    meets the level 1e-6, must stay: it does with the line's bound, and would not with spec_lower."""
    net = _diagonal_distance()
    crown, _ = _crown(net, 2)
    lo, hi = np.array([-0.3, -0.3]), np.array([0.0, 0.3])
    res = crown(lo[None], hi[None], spec=np.array([[1.0]]))
    assert res.spec_lower[0, 0] > res.spec_line_lower[0, 0] + 0.1
    a, point = res.spec_coefficients[0][0], np.array([-0.3, -0.3])
    groups = [(slice(0, 1), np.array([1e-6]))]
    new_lo, new_hi, _ = clipped_box(lo, hi, a, res.spec_line_lower[0], groups)
    assert np.all((point >= new_lo) & (point <= new_hi))
    wrong = clipped_box(lo, hi, a, res.spec_lower[0], groups)
    assert wrong is None or not np.all((point >= wrong[0]) & (point <= wrong[1]))


def test_new_ends_are_rounded_outward():
    """a = 3, shortfall 1: the exact end is lo + 1/3 (not a float); the clipped end is at or above it, and a
    coefficient of 0 or a bound of -inf clips nothing."""
    lo, hi = np.array([0.0, 0.0]), np.array([1.0, 1.0])
    level = [(slice(0, 1), np.array([0.0]))]
    new_lo, new_hi, kept = clipped_box(lo, hi, np.array([[3.0, 0.0]]), np.array([-1.0]), level)
    assert Fraction(float(new_hi[0])) >= Fraction(1, 3) and new_hi[0] < 0.34 and new_hi[1] == 1.0
    assert np.array_equal(new_lo, lo) and kept == [0]
    same = clipped_box(lo, hi, np.array([[3.0, -2.0]]), np.array([-np.inf]), level)
    assert np.array_equal(same[0], lo) and np.array_equal(same[1], hi)


def test_a_group_whose_rows_exclude_the_box_together_is_dropped():
    """On [0, 1]^2 a group's rows hold only where x0 <= 0.2 and where x0 >= 0.8: each row alone keeps part of
    the box, together none; the other group (x1 <= 0.5) keeps its part, and the hull is that part."""
    lo, hi = np.array([0.0, 0.0]), np.array([1.0, 1.0])
    coeffs = np.array([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0]])
    line_lower = np.array([0.0, -1.0, 0.0])
    groups = [(slice(0, 2), np.array([0.2, -0.8])), (slice(2, 3), np.array([0.5]))]
    new_lo, new_hi, kept = clipped_box(lo, hi, coeffs, line_lower, groups)
    assert kept == [1]
    assert np.array_equal(new_lo, lo) and new_hi[0] == 1.0 and 0.5 <= new_hi[1] < 0.5 + 1e-12
    assert clipped_box(lo, hi, coeffs[:2], line_lower[:2], groups[:1]) is None


def test_verify_clips_each_box_with_a_bound_that_holds_on_it(tmp_path, monkeypatch):
    """Input splitting on |x0 - x1| against y < 0 (unsat, and no box that meets the diagonal can be refuted):
    every clip verify makes gets a linear lower bound that holds at sampled points of its box (the output
    box's bound, y >= 0, would not: CROWN's line is below 0 on boxes that straddle the diagonal)."""
    import torchlean_bridge.app.verify as verify_mod
    from torchlean_bridge.app.vnnlib import load_vnnlib
    net = _diagonal_distance()
    onnx_path, prop_path = tmp_path / "diagonal.onnx", tmp_path / "below.vnnlib"
    torch.onnx.export(net.eval(), (torch.zeros(1, 2),), str(onnx_path), input_names=["x"], output_names=["y"],
                      dynamo=False)
    prop_path.write_text("(declare-const X_0 Real)\n(declare-const X_1 Real)\n(declare-const Y_0 Real)\n"
                         "(assert (>= X_0 -0.3))\n(assert (<= X_0 0.3))\n"
                         "(assert (>= X_1 -0.3))\n(assert (<= X_1 0.3))\n(assert (< Y_0 0))\n")
    real, calls = verify_mod.clipped_box, []
    rng = np.random.default_rng(0)

    def checked(lo, hi, coeffs, line_lower, groups):
        xs = lo.reshape(-1) + rng.random((200, lo.size)) * (hi - lo).reshape(-1)
        ys = np.abs(xs[:, 0] - xs[:, 1])  # the network, exactly
        a = coeffs.reshape(-1)
        assert np.all(ys >= line_lower[0] + xs @ a - np.minimum(a * lo.reshape(-1), a * hi.reshape(-1)).sum() - 1e-12)
        calls.append(1)
        return real(lo, hi, coeffs, line_lower, groups)

    monkeypatch.setattr(verify_mod, "clipped_box", checked)
    model = verify_mod.load_model(onnx_path)
    got = verify_mod.verify(model, load_vnnlib(prop_path), method="bab-input", timeout=3)
    assert got.result in ("unsat", "unknown") and len(calls) >= 20
