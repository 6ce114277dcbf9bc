"""Diff coverage on zoo models: compared nodes / IR nodes per route (fx, export, torch.onnx file, our own
ONNX export), printed as a table with the total. Run: python bench/diff_coverage.py [case ...]"""

from __future__ import annotations

import io
import sys
import warnings

import torch

import torchlean_bridge as tlb
from tests.model_zoo import CASES

DEFAULT = ("encoder_layer_batch_first", "cnn2d", "residual", "mha_batch_first", "layout", "seed_mlp")


def torch_onnx(module, inputs):
    """torch.onnx.export's TorchScript exporter, else its dynamo one (None when both refuse)."""
    import onnx
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            buf = io.BytesIO()
            torch.onnx.export(module, inputs, buf, dynamo=False)
            return onnx.load_from_string(buf.getvalue())
        except Exception:  # the TorchScript exporter refuses some modules (attention fast paths)
            pass
        try:
            return torch.onnx.export(module, inputs, dynamo=True, verbose=False).model_proto
        except Exception as e:
            print(f"torch.onnx.export failed: {type(e).__name__}: {str(e)[:80]}")
            return None


def routes(name: str):
    """(route, bundle, diff kwargs) for one zoo case."""
    module, inputs = CASES[name].make()
    fx = tlb.import_fx(module, inputs)
    yield "fx", fx, dict(against="torch", module=module)
    ex = tlb.import_export(module, inputs)
    yield "export", ex, dict(against="torch", module=module)
    model = torch_onnx(module, inputs)
    if model is not None:
        yield "torch.onnx", tlb.import_onnx(model), dict(against="onnxruntime", onnx_model=model)
    try:
        own = tlb.export_onnx(fx)
    except tlb.BridgeError as e:  # an op with no exact ONNX form
        print(f"{name}: our ONNX export refuses it: {str(e).splitlines()[0]}")
    else:
        yield "own onnx", fx, dict(against="onnxruntime", onnx_model=own)


def coverage(report) -> tuple[int, int]:
    compared = sum(r.status != "no counterpart" for r in report.nodes)
    return compared, len(report.nodes)


def main(names: list[str]) -> None:
    total = [0, 0]
    print(f"{'case':<28} {'route':<11} compared  verdict")
    for name in names:
        for route, bundle, kw in routes(name):
            try:
                rep = tlb.diff(bundle, random=2, **kw)
            except Exception as e:  # a route that fails is reported, not hidden
                print(f"{name:<28} {route:<11} error: {type(e).__name__}: {str(e)[:80]}")
                continue
            c, m = coverage(rep)
            total[0] += c
            total[1] += m
            print(f"{name:<28} {route:<11} {c:>3}/{m:<4}  {'ok' if rep.ok else 'DIVERGED'}")
    print(f"total: {total[0]} of {total[1]} IR nodes compared ({100 * total[0] / max(total[1], 1):.1f}%)")


if __name__ == "__main__":
    main(sys.argv[1:] or list(DEFAULT))
