"""A square conv weight (C, C, 1, 1) transposed in its first two axes (out and in channels
exchanged: a 1x1 conv stored as the matrix a Linear port holds, the wrong way round) passes every
key and shape check; the audit names it with the trusted module and with golden outputs only."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import torchlean_bridge as tlb
from torchlean_bridge.app.audit import audit
from torchlean_bridge.app.audit_weights import compare_weights

KEY = "2.weight"
WORDS = f"transpose {KEY} in its first two axes (out and in channels)"


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 6, 3, padding=1), nn.ReLU(), nn.Conv2d(6, 6, 1), nn.Tanh(),
                         nn.Conv2d(6, 6, 1), nn.Flatten(), nn.Linear(6 * 4 * 4, 3)).double().eval()


@pytest.fixture(scope="module")
def setup():
    m = model()
    bundle = tlb.import_export(m, (torch.zeros(1, 3, 4, 4, dtype=torch.float64),))
    ref = {k: v.detach().numpy().copy() for k, v in m.state_dict().items()}
    xs = [np.random.default_rng(k).standard_normal((1, 3, 4, 4)) for k in range(2)]
    with torch.no_grad():
        golden = [[m(torch.tensor(x)).numpy()] for x in xs]
    return m, bundle, ref, xs, golden


def flipped(ref: dict) -> dict:
    assert ref[KEY].shape == (6, 6, 1, 1)
    return dict(ref, **{KEY: np.swapaxes(ref[KEY], 0, 1).copy()})


def test_the_weight_audit_names_the_transpose():
    ref = {k: v.detach().numpy() for k, v in model().state_dict().items()}
    (f,) = compare_weights(flipped(ref), ref).findings
    assert (f.kind, f.message, f.keys) == ("transpose", WORDS, (KEY,))
    # a 3x3 square conv weight too: its kernel axes stay where they are
    w = np.random.default_rng(0).standard_normal((4, 4, 3, 3))
    (f,) = compare_weights({"c.weight": np.swapaxes(w, 0, 1).copy()}, {"c.weight": w}).findings
    assert f.message == "transpose c.weight in its first two axes (out and in channels)"


@pytest.mark.parametrize("mode", ["module", "golden"])
def test_the_audit_names_the_transposed_1x1_conv(setup, mode):
    m, bundle, ref, xs, golden = setup
    if mode == "module":
        report = audit(bundle, flipped(ref), reference=m)
    else:
        report = audit(bundle, flipped(ref), reference=golden, inputs=[[x] for x in xs], time_limit=3.0)
    (f,) = report.swaps
    assert (f.kind, f.keys) == ("transpose", (KEY,))
    assert f.message.startswith(f"{WORDS}: max error ") and f.message.endswith(" -> 0.000000")
    assert report.error_before > 1e-3 and report.error_after < 1e-9
    assert f"[error] transpose: {WORDS}: max error " in str(report)
