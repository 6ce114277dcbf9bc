"""Input splitting's choice of entry (``app.split_axis``): for a few input entries, the one that spreads the
first nonlinear layer most, measured by IBP and independent of the units an entry is measured in."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn

import torchlean_bridge as tlb
from semantics.linear_bounds import Crown
from torchlean_bridge.app.split_axis import input_sensitivity, split_axis


def _crown(net: nn.Module, inputs: int) -> Crown:
    b = tlb.import_fx(net.eval(), (torch.zeros(1, inputs),))
    return Crown(b.graph, b.payload)


def _column_sums(layer: nn.Linear) -> np.ndarray:
    return np.abs(layer.weight.detach().double().numpy()).sum(axis=0)


def test_one_split_layer_gives_each_entry_its_share_of_the_absolute_column_sums():
    """Affine up to the only ReLU: entry k alone spreads the ReLU's input by sum_j |W_jk| width_k (IBP is
    exact on one wide entry through one affine map), so its share is that over the sum of all entries'
    spreads, per unit of its width; an entry of width 0 scores 0."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    lo = np.array([[0.0, -1.0, 2.0, 0.5]])
    hi = np.array([[0.5, 3.0, 2.0, 0.75]])
    got = input_sensitivity(_crown(net, 4), lo, hi)
    width = (hi - lo).reshape(-1)
    spread = _column_sums(net[0]) * width
    np.testing.assert_allclose(got * width, spread / spread.sum(), rtol=1e-12)
    assert got[2] == 0.0


class _Bypass(nn.Module):
    """x1 enters only at the second ReLU layer."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.d, self.out = nn.Linear(1, 6), nn.Linear(6, 6), nn.Linear(1, 6), nn.Linear(6, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.a(x[:, :1]))
        return self.out(torch.relu(self.b(h) + self.d(x[:, 1:])))


def test_an_entry_that_only_reaches_a_later_layer_is_still_split():
    torch.manual_seed(3)
    crown = _crown(_Bypass(), 2)
    lo, hi = np.array([[-1.0, -1.0]]), np.array([[1.0, 1.0]])
    sens = input_sensitivity(crown, lo, hi)
    assert np.all(sens > 0)
    # halving x0 alone (the only entry the first layer sees) would never end: x1's turn comes
    for _ in range(8):
        k = split_axis(lo, hi, None, sens)
        hi = hi.copy()
        hi[0, k] = (lo[0, k] + hi[0, k]) / 2
        if k == 1:
            break
    assert k == 1


def test_without_a_split_node_the_output_is_measured():
    """Two affine layers: entry k alone spreads the output by sum |W2| |W1[:, k]| width_k under IBP."""
    torch.manual_seed(1)
    net = nn.Sequential(nn.Linear(3, 5), nn.Linear(5, 2))
    lo, hi = np.zeros((1, 3)), np.array([[1e-3, 2.0, 0.5]])
    got = input_sensitivity(_crown(net, 3), lo, hi)
    width = (hi - lo).reshape(-1)
    spread = np.abs(net[1].weight.detach().double().numpy()).sum(axis=0) @ np.abs(
        net[0].weight.detach().double().numpy()) * width
    # rtol: IBP's outward rounding against widths of 1e-3
    np.testing.assert_allclose(got * width, spread / spread.sum(), rtol=1e-9)


def test_the_choice_does_not_depend_on_an_entrys_units():
    """The same network with entry k measured in units s_k times smaller (x' = s x, W' = W / s): on the
    scaled boxes every choice is the same, where the widest entry (and the coefficient score) would move."""
    torch.manual_seed(2)
    net = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 3))
    scale = np.array([1.0, 1000.0, 0.01, 7.0, 1.0])
    scaled = nn.Sequential(nn.Linear(5, 16), nn.ReLU(), nn.Linear(16, 3))
    scaled.load_state_dict(net.state_dict())
    with torch.no_grad():
        scaled[0].weight.div_(torch.tensor(scale, dtype=torch.float32))
    rng = np.random.default_rng(0)
    lo0, hi0 = np.full((1, 5), -1.0), np.full((1, 5), 1.0)
    sens, sens_scaled = input_sensitivity(_crown(net, 5), lo0, hi0), input_sensitivity(_crown(scaled, 5),
                                                                                      lo0 * scale, hi0 * scale)
    widest_moved = False
    for _ in range(50):
        a, b = rng.uniform(-1, 1, (2, 1, 5))
        lo, hi = np.minimum(a, b), np.maximum(a, b)
        assert split_axis(lo, hi, None, sens) == split_axis(lo * scale, hi * scale, None, sens_scaled)
        widest_moved |= split_axis(lo, hi, None) != split_axis(lo * scale, hi * scale, None)
    assert widest_moved


def test_the_entry_that_drives_the_relus_is_split_before_the_one_the_output_weighs_most():
    """y = 10 x0 + relu(x1) - 2 relu(x1 - 1/2): the linear bound's coefficient on x0 (10) dominates, but
    x0 never crosses a breakpoint; x1 drives both ReLUs' inputs and is the one to split."""
    net = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1))
    with torch.no_grad():
        net[0].weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 1.0]]))
        net[0].bias.copy_(torch.tensor([0.0, 0.0, -0.5]))
        net[2].weight.copy_(torch.tensor([[10.0, 1.0, -2.0]]))
        net[2].bias.zero_()
    crown = _crown(net, 2)
    lo, hi = np.array([[1.0, 0.0]]), np.array([[2.0, 1.0]])
    coeffs = crown(lo, hi, spec=np.array([[-1.0]])).spec_coefficients[0].reshape(1, 1, 2)
    assert split_axis(lo, hi, coeffs) == 0  # the coefficient score
    assert split_axis(lo, hi, coeffs, input_sensitivity(crown, lo, hi)) == 1
