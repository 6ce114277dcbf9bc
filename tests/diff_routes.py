"""The four routes a model reaches the diff by, shared by bench/diff_coverage.py and the coverage tests:
torch.fx and torch.export against torch, a torch.onnx file and our own ONNX export against onnxruntime."""

from __future__ import annotations

import io
import warnings
from typing import Any, Iterator

import torch

import torchlean_bridge as tlb

__all__ = ["ROUTES", "torch_onnx", "route", "routes"]

ROUTES = ("fx", "export", "torch.onnx", "own onnx")


def torch_onnx(module: torch.nn.Module, inputs: tuple) -> Any:
    """torch.onnx.export's TorchScript exporter, else its dynamo one (the TorchScript one refuses
    attention fast paths); raises what the dynamo exporter raised when both refuse."""
    import onnx
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            buf = io.BytesIO()
            torch.onnx.export(module, inputs, buf, dynamo=False)
            return onnx.load_from_string(buf.getvalue())
        except Exception:  # noqa: BLE001 - any refusal: the other exporter is tried
            pass
        return torch.onnx.export(module, inputs, dynamo=True, verbose=False).model_proto


def route(name: str, module: torch.nn.Module, inputs: tuple, traceable: bool = True) -> tuple[Any, dict]:
    """(bundle, diff keyword arguments) for one route; our own ONNX export is of the fx bundle
    (of the export bundle when fx cannot trace the module)."""
    if name in ("fx", "export"):
        bundle = (tlb.import_fx if name == "fx" else tlb.import_export)(module, inputs)
        return bundle, dict(against="torch", module=module)
    if name == "torch.onnx":
        model = torch_onnx(module, inputs)
        return tlb.import_onnx(model), dict(against="onnxruntime", onnx_model=model)
    if name == "own onnx":
        bundle = (tlb.import_fx if traceable else tlb.import_export)(module, inputs)
        return bundle, dict(against="onnxruntime", onnx_model=tlb.export_onnx(bundle))
    raise ValueError(f"unknown route {name!r}; expected one of {ROUTES}")


def routes(case: Any) -> Iterator[tuple[str, Any]]:
    """(route, (bundle, kwargs) or the exception that refused it) for every route a zoo case takes."""
    module, inputs = case.make()
    for name in ROUTES:
        if name == "fx" and not case.fx:
            continue
        try:
            yield name, route(name, module, inputs, traceable=case.fx)
        except Exception as e:  # noqa: BLE001 - a route that refuses is reported by the caller, not hidden
            yield name, e
