"""FSB's plain float32 candidate bounds on ReLU chains equal the sound CROWN bounds of the same children."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
import torch.nn as nn

import torchlean_bridge as tlb
from torchlean_bridge.app.bab import search
from torchlean_bridge.app.verify import _Model


def _chain_model(seed: int, normalize: bool, last_relu: bool = False) -> _Model:
    from exporters.onnx import export_onnx

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = nn.Sequential(nn.Linear(12, 24), nn.ReLU(), nn.Linear(24, 24), nn.ReLU(), nn.Linear(24, 20),
                                      nn.ReLU(), nn.Linear(20, 3), *([nn.ReLU()] if last_relu else []))

        def forward(self, x):
            return self.body((x - 0.25) / 2.0 if normalize else x)

    torch.manual_seed(seed)
    b = tlb.import_fx(Net().eval(), (torch.zeros(1, 12),))
    return _Model(b, export_onnx(b).SerializeToString())


@pytest.mark.parametrize("seed,normalize,last_relu", [(0, False, False), (1, True, False), (2, False, False),
                                                     (3, False, True)])
def test_plain_children_bounds_equal_the_sound_crown_bounds(seed, normalize, last_relu):
    """Also a network that ends in a ReLU against a one-row group (ERAN's mnist_relu_9_200: the first step
    back is that ReLU's, on the spec's broadcast coefficients)."""
    model = _chain_model(seed, normalize, last_relu)
    lo, hi = np.full((1, 12), -1.0), np.full((1, 12), 1.0)
    c = np.array([[1.0, -1.0, 0.0]]) if last_relu else np.array([[1.0, -1.0, 0.0], [0.0, 1.0, -1.0]])
    n_rows = c.shape[0]
    bab = search.ReluBab(model, lo, hi, c, np.zeros(n_rows), np.zeros(n_rows), time.perf_counter() + 60,
                         progress=False)
    assert bab.plain is not None
    total = int(bab.offsets[-1])
    root = np.zeros((1, total), dtype=np.int8)
    _, _, pre, _, _ = bab._bound(root, lo, hi)
    rng = np.random.default_rng(seed)
    # parents: the root and subdomains with a few unstable units split either way, on halves of the box
    unstable = np.flatnonzero((pre[0][0] < 0) & (pre[1][0] > 0))
    parents = np.zeros((4, total), dtype=np.int8)
    for i in range(1, 4):
        picked = rng.choice(unstable, size=min(3, unstable.size), replace=False)
        parents[i, picked] = rng.choice(np.array([-1, 1], dtype=np.int8), size=picked.size)
    los, his = np.repeat(lo, 4, axis=0), np.repeat(hi, 4, axis=0)
    his[2, 0] = 0.0  # an input split too
    known = (np.repeat(pre[0], 4, axis=0), np.repeat(pre[1], 4, axis=0))
    _, empty, ppre, _, _ = bab._bound(parents, los, his, known, method="crown")
    assert not empty.any()
    score, choice = bab._scores(np.zeros((4, 2)), ppre, parents)
    k = 5
    units = np.argsort(-score, axis=1, kind="stable")[:, :k]
    assert np.isfinite(np.take_along_axis(score, units, axis=1)).all()
    plain = bab.plain.child_lower(c, bab.plain.lines(ppre[0], ppre[1], parents), units, los, his)  # [4, 2, k, rows]
    assert plain.shape == (4, 2, k, n_rows)
    rows = np.repeat(np.arange(4), k)
    flat_units = units.reshape(-1)
    children = bab._children(parents[rows], np.arange(rows.size), flat_units, choice[rows, flat_units])
    sound, empty, *_ = bab._bound(children, np.concatenate([los[rows]] * 2), np.concatenate([his[rows]] * 2),
                                  (np.concatenate([ppre[0][rows]] * 2), np.concatenate([ppre[1][rows]] * 2)),
                                  method="crown")
    assert not empty.any()
    # _children: the first half takes the unit's first code; plain's side 0 is active (+1), 1 inactive (-1)
    codes = children[np.arange(2 * rows.size), np.concatenate([flat_units] * 2)].reshape(2, 4, k)
    assert (codes[0] == -codes[1]).all() and (np.abs(codes) == 1).all()
    sound = sound.reshape(2, 4, k, n_rows)
    sound = np.stack([np.where((codes[0] > 0)[..., None], sound[0], sound[1]),
                      np.where((codes[0] > 0)[..., None], sound[1], sound[0])], axis=1)
    scale = np.abs(sound).max() + 1.0
    assert np.max(np.abs(plain - sound)) <= 1e-5 * scale, np.max(np.abs(plain - sound))
    # and the patched unit matters: the active and inactive children differ where the parent is unstable
    assert np.any(np.abs(plain[:, 0] - plain[:, 1]) > 1e-3)


def test_plain_blocks_give_the_same_bounds(monkeypatch):
    from torchlean_bridge.app.bab import fsb_plain
    model = _chain_model(3, False)
    lo, hi = np.full((1, 12), -1.0), np.full((1, 12), 1.0)
    c = np.array([[1.0, 0.0, -1.0]])
    bab = search.ReluBab(model, lo, hi, c, np.zeros(1), np.zeros(1), time.perf_counter() + 60, progress=False)
    _, _, pre, _, _ = bab._bound(np.zeros((1, int(bab.offsets[-1])), dtype=np.int8), lo, hi)
    m = 5
    splits = np.zeros((m, int(bab.offsets[-1])), dtype=np.int8)
    boxes = (np.repeat(pre[0], m, axis=0), np.repeat(pre[1], m, axis=0))
    units = np.tile(np.flatnonzero((pre[0][0] < 0) & (pre[1][0] > 0))[:4], (m, 1))
    args = (c, bab.plain.lines(boxes[0], boxes[1], splits), units, np.repeat(lo, m, axis=0), np.repeat(hi, m, axis=0))
    whole = bab.plain.child_lower(*args)
    monkeypatch.setattr(fsb_plain, "MAX_BLOCK_ENTRIES", 1)  # one parent per block
    blocked = bab.plain.child_lower(*args)  # float32 products may round differently with the block's shape
    assert np.allclose(blocked, whole, rtol=1e-5, atol=1e-5 * np.abs(whole).max())


def _cnn_chain_model() -> _Model:
    from exporters.onnx import export_onnx
    torch.manual_seed(4)
    net = nn.Sequential(nn.Conv2d(1, 4, 3, stride=2, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 4 * 4, 40),
                        nn.ReLU(), nn.Linear(40, 3)).eval()
    b = tlb.import_fx(net, (torch.zeros(1, 1, 8, 8),))
    return _Model(b, export_onnx(b).SerializeToString())


@pytest.mark.parametrize("conv", [False, True])
def test_fsb_takes_fewer_candidates_on_chains_with_a_convolution(monkeypatch, conv):
    """A conv adjoint per child makes the plain pass cost as much per row as the sound one: FSB ranks
    ``FSB_CONV_CANDIDATES`` units per subdomain there, ``FSB_CANDIDATES`` on dense chains."""
    from torchlean_bridge.app.bab import fsb_plain
    model = _cnn_chain_model() if conv else _chain_model(0, False)
    shape = (1, 1, 8, 8) if conv else (1, 12)
    lo, hi = np.full(shape, -1.0), np.full(shape, 1.0)
    c = np.array([[1.0, -1.0, 0.0]])
    bab = search.ReluBab(model, lo, hi, c, np.zeros(1), np.zeros(1), time.perf_counter() + 60, progress=False)
    assert bab.plain is not None and bab.plain.has_conv == conv
    total = int(bab.offsets[-1])
    assert total > search.FSB_CANDIDATES  # enough units for either count
    asked = []
    real = fsb_plain.PlainChain.child_lower
    monkeypatch.setattr(fsb_plain.PlainChain, "child_lower",
                        lambda self, c, lines, units, *rest: asked.append(units.shape[1]) or real(self, c, lines, units,
                                                                                                *rest))
    splits = np.zeros((2, total), dtype=np.int8)
    _, _, pre, _, _ = bab._bound(splits[:1], lo.reshape(1, -1), hi.reshape(1, -1))
    pre = (np.repeat(pre[0], 2, axis=0), np.repeat(pre[1], 2, axis=0))
    score, choice = bab._scores(np.full((2, 1), -1.0), pre, splits)
    boxes = np.repeat(lo.reshape(1, -1), 2, axis=0), np.repeat(hi.reshape(1, -1), 2, axis=0)
    bab._fsb(splits, np.full((2, 1), -1.0), pre, *boxes, score, choice)
    assert asked == [search.FSB_CONV_CANDIDATES if conv else search.FSB_CANDIDATES]
