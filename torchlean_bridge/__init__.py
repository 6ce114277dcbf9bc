"""torchlean-bridge: PyTorch/ONNX models and checkpoints into TorchLean's checked graph IR, and back.

The core (ops, graph, payload, roles, check, wire, pretty, passes) needs only numpy; the application
layer (``torchlean_bridge.app``: ABI, audit, diff, the command line) and the ``semantics``,
``importers`` and ``exporters`` packages are imported lazily on first use of their public names, so
``import torchlean_bridge`` is fast and never imports torch (docs/architecture.md).
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from .bundle import Bundle
from .check import check, check_shapes, check_well_formed, infer_shapes
from .errors import BridgeError
from .graph import Graph, Node, Source
from .payload import Payload
from .pretty import listing, to_dot
from .roles import Binding, RoleMap
from .wire import dump_graph, load_graph

__version__ = "0.1.0"

# public name -> module that defines it (imported on first access)
_LAZY = {
    "evaluate": "torchlean_bridge.app.plan_exec",  # semantics.evaluate.evaluate, plus plan=
    "interval_bounds": "semantics.interval",
    "prepare": "semantics.prepared",
    "check_containment": "semantics.sampling",
    "import_fx": "importers.fx",
    "import_export": "importers.torch_export",
    "import_onnx": "importers.onnx",
    "load_checkpoint": "importers.checkpoints",
    "recover_keys": "importers.onnx_keys",
    "load": "exporters.folder",
    "save": "exporters.folder",
    "export_torchlean": "torchlean_bridge.app.torchlean_export",  # the writer (exporters/) after fold and cut
    "export_for_torchlean": "torchlean_bridge.app.torchlean_export",  # cut, fold, rewrite, measure, write
    "export_onnx": "exporters.onnx",
    "abi": "torchlean_bridge.app.abi",
    "bind_checkpoint": "torchlean_bridge.app.abi",
    "audit": "torchlean_bridge.app.audit",
    "diff": "torchlean_bridge.app.diff",
    "plan_kernels": "torchlean_bridge.app.kernel_plan",
    "KernelPolicy": "torchlean_bridge.app.kernel_plan",
    "save_plan": "torchlean_bridge.app.kernel_plan",
    "load_plan": "torchlean_bridge.app.kernel_plan",
    "init_params": "torchlean_bridge.seeded_init",
    "summary": "torchlean_bridge.app.summary",
    "linear_bounds": "semantics.linear_bounds",
    "load_vnnlib": "torchlean_bridge.app.vnnlib",
}

__all__ = ["Node", "Graph", "Source", "Payload", "RoleMap", "Binding", "Bundle", "BridgeError", "load_graph",
           "dump_graph", "check", "check_well_formed", "check_shapes", "infer_shapes", "listing", "to_dot",
           *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'torchlean_bridge' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
