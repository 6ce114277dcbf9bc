"""nn.LSTM / nn.GRU / nn.RNN through the torch importers (importers/torch/ops_recurrent.py), unrolled over the
static sequence length: outputs and final states agree with PyTorch within binary32 rounding of the float64
evaluation (atol 1e-5), through torch.fx and torch.export; the weights are bound to their state_dict keys.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn

import torchlean_bridge as tlb
from torchlean_bridge.errors import UnsupportedError


class Wrap(nn.Module):
    """The layer's output and every final state, flattened (an LSTM's (h, c) pair as two outputs)."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer
        self.lstm = isinstance(layer, nn.LSTM)

    def forward(self, x):
        if self.lstm:
            y, (h, c) = self.layer(x)
            return y, h, c
        y, h = self.layer(x)
        return y, h


class WrapState(Wrap):
    """As Wrap, with initial states given."""

    def forward(self, x, h0, c0=None):
        if self.lstm:
            y, (h, c) = self.layer(x, (h0, c0))
            return y, h, c
        y, h = self.layer(x, h0)
        return y, h


def _agree(module, *args, via="fx"):
    module = module.eval()
    importer = tlb.import_fx if via == "fx" else tlb.import_export
    b = importer(module, args)
    ours = tlb.evaluate(b.graph, b.payload, [a.numpy() for a in args])
    with torch.no_grad():
        ref = module(*args)
    assert len(ours) == len(ref)
    for o, r in zip(ours, ref):
        assert np.asarray(o).shape == tuple(r.shape)
        np.testing.assert_allclose(np.asarray(o), r.numpy(), rtol=1e-5, atol=1e-5)
    return b


CONFIGS = [
    (nn.LSTM, dict(num_layers=2, bidirectional=True, batch_first=True)),
    (nn.LSTM, dict(num_layers=1, bias=False)),
    (nn.GRU, dict(num_layers=3, bidirectional=False, batch_first=False)),
    (nn.GRU, dict(num_layers=1, bidirectional=True, batch_first=True)),
    (nn.RNN, dict(num_layers=2, nonlinearity="relu", bidirectional=True)),
    (nn.RNN, dict(num_layers=1, nonlinearity="tanh", batch_first=True)),
]


@pytest.mark.parametrize("via", ["fx", "export"])
@pytest.mark.parametrize("cell,kw", CONFIGS, ids=[f"{c.__name__}-{i}" for i, (c, _) in enumerate(CONFIGS)])
def test_recurrent_modules_agree_with_pytorch(cell, kw, via):
    torch.manual_seed(7)
    layer = cell(5, 4, **kw)
    x = torch.randn(3, 6, 5)
    _agree(Wrap(layer), x, via=via)


def test_initial_states_and_unbatched_input_agree_with_pytorch():
    torch.manual_seed(8)
    lstm = nn.LSTM(3, 2, num_layers=2, bidirectional=True)
    h0, c0 = torch.randn(4, 5, 2), torch.randn(4, 5, 2)
    _agree(WrapState(lstm), torch.randn(6, 5, 3), h0, c0)
    gru = nn.GRU(3, 2)
    _agree(WrapState(gru), torch.randn(4, 3), torch.randn(1, 2))  # unbatched: [steps, features], h0 [layers, hidden]


def test_weights_are_bound_to_their_state_dict_keys():
    torch.manual_seed(9)
    b = _agree(Wrap(nn.LSTM(3, 2, num_layers=2, bidirectional=True)), torch.randn(4, 2, 3))
    keys = {binding.key for binding in b.roles.bindings()}
    expected = {f"layer.{w}_{g}_l{k}{s}" for w in ("weight", "bias") for g in ("ih", "hh") for k in (0, 1)
                for s in ("", "_reverse")}
    assert expected <= keys


def test_projection_is_refused_by_name():
    with pytest.raises(UnsupportedError, match="LSTM with proj_size=2 is not lowered"):
        tlb.import_fx(Wrap(nn.LSTM(3, 4, proj_size=2)).eval(), (torch.randn(2, 1, 3),))
