"""``import_export``: a model captured by ``torch.export`` (as is, or after ``run_decompositions()``).

Parameters, buffers and lifted constants come from the program's public ``graph_signature``; each
becomes payload of the node that reads it, bound to its state_dict key. Non-tensor user inputs
(``use_cache=False``) are constants of the program.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch
from torch.export import ExportedProgram

from torchlean_bridge.bundle import Bundle
from torchlean_bridge.errors import BridgeError

from .common import TRAINING_NOTE, bind_aliases, check_training, preserved_state
from .program import TorchLowerer, bind_and_run, graph_inputs

__all__ = ["import_export", "export_program"]


def export_program(module: torch.nn.Module, example_inputs: Sequence[Any] | Any,
                   kwargs: Mapping[str, Any] | None = None, strict: bool = False) -> ExportedProgram:
    """``torch.export.export`` with the model's mode checked, its state left as it was, and failures as
    BridgeError."""
    check_training(module, "export")
    args = tuple(example_inputs) if isinstance(example_inputs, (list, tuple)) else (example_inputs,)
    try:
        with preserved_state(module):
            return torch.export.export(module, args, kwargs=dict(kwargs or {}), strict=strict)
    except Exception as e:  # noqa: BLE001 - export raises many exception types
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise BridgeError(f"export import: torch.export failed: {type(e).__name__}: {first}"[:500]) from None


def import_export(module_or_exported_program: torch.nn.Module | ExportedProgram,
                  example_inputs: Sequence[Any] | Any = None, *, kwargs: Mapping[str, Any] | None = None,
                  decompose: bool = False, strict: bool = False, max_elements: int | None = None) -> Bundle:
    """Import an ``nn.Module`` (exported here on ``example_inputs``) or an ``ExportedProgram``.

    ``decompose=True`` runs ``run_decompositions()`` first, so the graph is core ATen.
    """
    source = module_or_exported_program
    module = source if isinstance(source, torch.nn.Module) else None
    if isinstance(source, ExportedProgram):
        ep = source
    elif module is not None:
        if example_inputs is None:
            raise BridgeError("export import: example_inputs are needed to export an nn.Module")
        ep = export_program(module, example_inputs, kwargs, strict)
    else:
        raise BridgeError(f"export import: expected an nn.Module or ExportedProgram, got {type(source).__name__}")
    if decompose:
        ep = ep.run_decompositions()
    keys = list(ep.state_dict)
    cx = TorchLowerer("export", state_dict_keys=keys, max_elements=max_elements)
    outputs = bind_and_run(cx, ep, graph_inputs(cx, ep))
    cx.unused_keys = set(keys)
    bundle = cx.finish(outputs, {"framework": "export", "decomposed": bool(decompose),
                                 "model": type(module).__name__ if module is not None else "ExportedProgram"})
    if module is not None:
        bundle = bind_aliases(bundle, module.state_dict())
        if module.training:  # export_program let it through: nothing in it depends on the mode
            bundle.report["notes"] = list(bundle.report.get("notes", ())) + [TRAINING_NOTE]
    return bundle
