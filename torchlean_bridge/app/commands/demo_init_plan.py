"""The demo's init-and-plan story (the architecture chapter's initializer, the IR chapter's plan).

Linear(2, 3) -> ReLU -> Linear(3, 1) initialized by TorchLean's seeded initializer, its four tensors
printed as the chapter prints them, evaluated at [0.5, 0.8] (forward and MSE against 1.0), the
printed tensors loaded into PyTorch to show it agrees, the GraphSpec view; then the kernel plan of the
seed graph, and the libtorch plan executed and compared with the reference node by node.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...bundle import Bundle
from ...graph import Graph, Node
from ...seeded_init import init_params
from ...payload import Payload
from .common import format_vector
from .init import format_tensor

__all__ = ["init_and_plan_story", "mlp_231_bundle"]

X = np.array([0.5, 0.8])
TARGET = 1.0


def mlp_231_bundle() -> Bundle:
    """The architecture chapter's Models.mlp 2 3 1 as IR (no parameters yet)."""
    g = Graph([Node(0, [], "input", [2]), Node(1, [0], "linear", [3]), Node(2, [1], "relu", [3]),
               Node(3, [2], "linear", [1])], inputs=[0], outputs=[3])
    return Bundle(g, report={"framework": "builder", "model": "mlp 2 3 1"})


def _torch_forward(tensors: list[np.ndarray]) -> tuple[float, float]:
    import torch
    from torch import nn
    net = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1)).eval()
    keys = ["0.weight", "0.bias", "2.weight", "2.bias"]
    net.load_state_dict({k: torch.tensor(t, dtype=torch.float32) for k, t in zip(keys, tensors)})
    with torch.no_grad():
        y = net(torch.tensor(X, dtype=torch.float32))
        return y.item(), ((y - TARGET) ** 2).mean().item()


def init_and_plan_story(seed_bundle: Bundle, section: Any) -> bool:
    """Prints the story; True when PyTorch agrees with our evaluation and the libtorch plan with the reference."""
    from semantics.evaluate import evaluate
    from ..diff import diff
    from ..kernel_plan import plan_kernels
    from ..summary import summary
    section("8. deterministic initialization of Linear(2, 3) -> ReLU -> Linear(3, 1) (TorchLean's seeded init)")
    bundle = mlp_231_bundle()
    payload = init_params(bundle, scheme="torchlean", seed=0)
    tensors = [payload.get(n, r) for n, r in ((1, "weight"), (1, "bias"), (3, "weight"), (3, "bias"))]
    for t in tensors:
        print(f"{list(t.shape)}: {format_tensor(t)}")
    y = evaluate(bundle.graph, payload, X)[0]
    mse = float(np.mean((y - TARGET) ** 2))
    print(f"forward at {format_vector(X, 1)} = {format_vector(y)}; MSE against {TARGET} = {mse:.6f}")
    printed = [np.round(t, 6) for t in tensors]  # exactly what was printed above
    torch_y, torch_mse = _torch_forward(printed)
    printed_payload = Payload({1: {"weight": printed[0], "bias": printed[1]},
                               3: {"weight": printed[2], "bias": printed[3]}})
    ours32 = float(evaluate(bundle.graph, printed_payload, X, dtype="float32")[0][0])
    print(f"PyTorch with the four printed tensors: forward: {torch_y!r}, mse vs target {TARGET}: {torch_mse!r}")
    print(f"our float32 evaluation of the same tensors: {ours32!r} ({'agrees' if ours32 == torch_y else 'DIFFERS'})")
    print(summary(Bundle(bundle.graph, payload)))

    section("9. kernel plan of the seed graph (metadata only)")
    plan = plan_kernels(seed_bundle.graph)
    print(f"Except.ok {plan}")
    print(plan.table())
    libtorch = plan_kernels(seed_bundle.graph, prefer="libtorch")
    report = diff(seed_bundle, against="plan", plan=libtorch, random=4)
    print(f"prefer libtorch: {libtorch}")
    print(f"executed (libtorch through torch's functional ops, float32) vs the reference, node by node: "
          f"{'agree' if report.ok else 'DIVERGE'}")
    agree = abs(torch_y - ours32) <= 1e-7 * max(1.0, abs(torch_y)) and report.ok
    return agree
