"""Real architectures nobody here wrote (torchvision, timm; small configs, random weights) through
torch.fx and torch.export.

Each import must evaluate in float32 within 1e-4 of the module's own output (relative to the
output's scale), and ``diff`` against torch must agree on the route. Where the model's own Python is
not symbolically traceable (transformers' encoders), fx refuses naming the cause and the line. The
models are built at small input sizes so the whole file stays within a few minutes on two cores
(marked slow).
"""

from __future__ import annotations

import importlib.util
import warnings

import numpy as np
import pytest
import torch

import torchlean_bridge as tlb
from tests.model_zoo import REAL
from torchlean_bridge.errors import BridgeError

warnings.filterwarnings("ignore", category=FutureWarning)

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::UserWarning", "ignore::FutureWarning"),
              pytest.mark.skipif(not all(importlib.util.find_spec(m) for m in ("torchvision", "timm")),
                                 reason="torchvision and timm are not installed (.ci/run installs them)")]


@pytest.mark.parametrize("via", ["fx", "export"])
@pytest.mark.parametrize("name", sorted(REAL))
def test_real_architecture_imports_and_matches_torch(name, via):
    module, inputs = REAL[name].make()
    if not getattr(REAL[name], via):  # the model's own Python is not symbolically traceable
        with pytest.raises(BridgeError, match=r"fx import: symbolic tracing of \w+ failed at \S+:\d+: .*use "
                                              r"import_export \(torch\.export\) instead"):
            tlb.import_fx(module, inputs)
        return
    with torch.no_grad():
        want = module(*inputs).numpy()
    bundle = tlb.import_fx(module, inputs) if via == "fx" else tlb.import_export(module, inputs)
    got = tlb.evaluate(bundle.graph, bundle.payload, *(x.numpy() for x in inputs), dtype="float32")[0]
    scale = max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * scale)
    assert set(bundle.roles) <= set(module.state_dict())
    report = tlb.diff(bundle, against="torch", module=module, inputs=[x.numpy() for x in inputs], per_node=False)
    assert report.ok, str(report)


@pytest.mark.parametrize("name", ["tv_convnext", "tv_swin", "hf_roberta"])
def test_real_architecture_decomposed_to_core_aten_matches_torch(name):
    """Core ATen leaves as_strided views (the pooling heads), slice scatters and integer running sums."""
    module, inputs = REAL[name].make()
    with torch.no_grad():
        want = module(*inputs).numpy()
    bundle = tlb.import_export(module, inputs, decompose=True)
    got = tlb.evaluate(bundle.graph, bundle.payload, *(x.numpy() for x in inputs), dtype="float32")[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(want).max())))
