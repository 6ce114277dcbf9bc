"""torchlean-bridge: PyTorch/ONNX models and checkpoints into TorchLean's checked graph IR, and back.

The core (ops, graph, payload, roles, check, wire, pretty) needs only numpy. Everything that needs
torch, onnx or safetensors is imported lazily on first use, so ``import torchlean_bridge`` is fast.
"""

from __future__ import annotations

import sys
import types
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
    "evaluate": "semantics.evaluate",
    "interval_bounds": "semantics.interval",
    "check_containment": "semantics.sampling",
    "import_fx": "importers.fx",
    "import_export": "importers.torch_export",
    "import_onnx": "importers.onnx",
    "load_checkpoint": "importers.checkpoints",
    "load": "exporters.folder",
    "save": "exporters.folder",
    "export_torchlean": "exporters.torchlean_json",
    "export_onnx": "exporters.onnx",
    "abi": "torchlean_bridge.abi",
    "bind_checkpoint": "torchlean_bridge.abi",
    "audit": "torchlean_bridge.audit",
    "diff": "torchlean_bridge.diff",
    "linear_bounds": "semantics.linear_bounds",
    "load_vnnlib": "torchlean_bridge.app.vnnlib",
}

__all__ = ["Node", "Graph", "Source", "Payload", "RoleMap", "Binding", "Bundle", "BridgeError", "load_graph",
           "dump_graph", "check", "check_well_formed", "check_shapes", "infer_shapes", "listing", "to_dot",
           *_LAZY]


# public functions that share their name with the module defining them (abi, audit, diff)
_SHADOWED = frozenset(name for name, module in _LAZY.items() if module == f"{__name__}.{name}")


class _Package(types.ModuleType):
    """Keeps ``tlb.abi`` the function: importing the submodule ``torchlean_bridge.abi`` makes Python
    set the package attribute to the module, which would shadow the public name."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _SHADOWED and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'torchlean_bridge' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
