"""The libtorch provider across the model zoo: a plan preferring libtorch, executed node by node in
float64, agrees with the reference evaluator on every node (torch's functional ops and our rules
compute the same functions; only rounding differs)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torchlean_bridge as tlb  # noqa: E402
from tests.model_zoo import cases  # noqa: E402


@pytest.mark.parametrize("case", cases(importer="export", slow=False), ids=lambda c: c.name)
def test_libtorch_plan_agrees_with_the_reference_on_every_node(case):
    module, inputs = case.make()
    bundle = tlb.import_export(module, inputs)
    plan = tlb.plan_kernels(bundle.graph, prefer="libtorch")
    arrays = [t.numpy().astype(np.float64) if t.is_floating_point() else t.numpy() for t in inputs]
    ref = tlb.evaluate(bundle.graph, bundle.payload, arrays, all_nodes=True)
    got = tlb.evaluate(bundle.graph, bundle.payload, arrays, all_nodes=True, plan=plan)
    for k in plan:
        r, v = ref[k.node], got[k.node]
        assert v.dtype == r.dtype and v.shape == r.shape, (k.node, k.capsule.name)
        scale = max(1.0, float(np.max(np.abs(r)))) if r.size and r.dtype.kind == "f" else 1.0
        np.testing.assert_allclose(v, r, rtol=1e-9, atol=1e-12 * scale,
                                   err_msg=f"node {k.node} {k.kind} via {k.capsule.name}")
