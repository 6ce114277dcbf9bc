"""alpha-CROWN: optimized ReLU lower slopes, never looser than CROWN, sound in exact arithmetic."""

from __future__ import annotations

import json
import subprocess
import sys
from fractions import Fraction

import numpy as np
import pytest
import torch
import torch.nn as nn

import torchlean_bridge as tlb
from semantics.sampling import sample_points
from tests.conftest import ROOT
from tests.test_linear_bounds import _exact_mlp


def _mlp(seed: int, widths=(4, 24, 24, 3)) -> tuple[nn.Module, tlb.Bundle, list]:
    torch.manual_seed(seed)
    layers = []
    for a, b in zip(widths[:-1], widths[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    net = nn.Sequential(*layers[:-1]).eval()
    weights = [(m.weight.detach().double().numpy(), m.bias.detach().double().numpy()) for m in net
               if isinstance(m, nn.Linear)]
    return net, tlb.import_fx(net, (torch.zeros(2, widths[0]),)), weights


@pytest.mark.parametrize("seed", range(4))
def test_never_looser_than_crown_and_sound_in_exact_arithmetic(seed):
    net, b, weights = _mlp(seed)
    rng = np.random.default_rng(seed)
    c = rng.uniform(-1, 1, (2, 4))
    lo, hi = c - 0.5, c + 0.5
    crown = tlb.linear_bounds(b.graph, b.payload, lo, hi)
    alpha = tlb.linear_bounds(b.graph, b.payload, lo, hi, method="alpha-crown")
    assert alpha.method == "alpha-crown"
    assert np.all(alpha.lower[0] >= crown.lower[0]) and np.all(alpha.upper[0] <= crown.upper[0])
    points, corners = sample_points([(lo, hi)], 60, seed)
    assert corners >= 1
    for (x,) in points:
        for s in range(2):
            for j, v in enumerate(_exact_mlp(weights, x[s])):
                assert Fraction(alpha.lower[0][s, j]) <= v <= Fraction(alpha.upper[0][s, j])


def test_tighter_than_crown_on_a_wide_box():
    """With many unstable units the optimized slopes beat the adaptive rule on some outputs."""
    gains = []
    for seed in range(3):
        _, b, _ = _mlp(seed, widths=(6, 40, 40, 4))
        c = np.random.default_rng(seed).uniform(-1, 1, (2, 6))
        crown = tlb.linear_bounds(b.graph, b.payload, c - 1.0, c + 1.0)
        alpha = tlb.linear_bounds(b.graph, b.payload, c - 1.0, c + 1.0, method="alpha-crown")
        gains.append(float(np.sum(crown.upper[0] - crown.lower[0]) - np.sum(alpha.upper[0] - alpha.lower[0])))
    assert min(gains) >= 0 and max(gains) > 1e-3, gains


def test_spec_rows_and_unsupported_graphs():
    net, b, weights = _mlp(7)
    c = np.zeros((2, 4))
    spec = np.array([[1.0, -1.0, 0.0], [0.0, 2.0, -1.0]])
    crown = tlb.linear_bounds(b.graph, b.payload, c - 0.8, c + 0.8, spec=spec)
    alpha = tlb.linear_bounds(b.graph, b.payload, c - 0.8, c + 0.8, spec=spec, method="alpha-crown")
    assert np.all(alpha.spec_lower >= crown.spec_lower) and np.all(alpha.spec_upper <= crown.spec_upper)
    points, _ = sample_points([(c - 0.8, c + 0.8)], 40, 7)
    for (x,) in points:
        for s in range(2):
            y = np.array(_exact_mlp(weights, x[s]), dtype=object)
            for k, row in enumerate(spec):
                v = sum(Fraction(a) * yi for a, yi in zip(row, y))
                assert Fraction(alpha.spec_lower[s, k]) <= v <= Fraction(alpha.spec_upper[s, k])
    # a chain of convolutions and ReLUs is optimized too: never looser than CROWN, sound on samples
    torch.manual_seed(0)
    cnn = nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU(), nn.Flatten(), nn.Linear(2 * 4 * 4, 2)).eval()
    bc = tlb.import_fx(cnn, (torch.zeros(1, 1, 6, 6),))
    x = np.zeros((1, 1, 6, 6))
    got = tlb.linear_bounds(bc.graph, bc.payload, x - 0.5, x + 0.5, method="alpha-crown")
    ref = tlb.linear_bounds(bc.graph, bc.payload, x - 0.5, x + 0.5)
    assert got.method == "alpha-crown"
    assert np.all(got.lower[0] >= ref.lower[0]) and np.all(got.upper[0] <= ref.upper[0])
    xs = np.random.default_rng(1).uniform(-0.5, 0.5, (500, 1, 1, 6, 6))
    ys = np.stack([np.asarray(tlb.evaluate(bc.graph, bc.payload, [xi])[0]) for xi in xs])
    assert np.all(ys >= got.lower[0] - 1e-12) and np.all(ys <= got.upper[0] + 1e-12)
    # a graph that is not such a chain (a residual add) keeps CROWN's bounds and says so
    class Residual(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 3)

        def forward(self, z):
            return self.b(z + torch.relu(self.a(z)))
    br = tlb.import_fx(Residual().eval(), (torch.zeros(1, 4),))
    got = tlb.linear_bounds(br.graph, br.payload, c[:1] - 0.8, c[:1] + 0.8, method="alpha-crown")
    ref = tlb.linear_bounds(br.graph, br.payload, c[:1] - 0.8, c[:1] + 0.8)
    assert got.method == "crown"
    np.testing.assert_array_equal(got.lower[0], ref.lower[0])


def test_verify_cli_alpha_crown():
    fix = ROOT / "fixtures" / "verify"
    cmd = [sys.executable, "-m", "torchlean_bridge", "verify", str(fix / "acas_like.onnx"),
           str(fix / "acas_robust.vnnlib"), "--method", "alpha-crown", "--json", "--timeout", "20"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["result"] == "unsat" and doc["method"] == "alpha-crown"
