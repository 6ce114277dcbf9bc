"""Small ONNX models built in tests: one graph from nodes, typed inputs/outputs and initializers,
and our evaluation of it (the helpers the per-family ONNX test files share)."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import onnx
from onnx import helper

import torchlean_bridge as tlb


def onnx_model(nodes: Sequence[Any], inputs: Sequence[tuple], outputs: Sequence[tuple], inits: Sequence[tuple] = (),
               opset: int = 21, ir_version: int = 10) -> onnx.ModelProto:
    """``inputs``/``outputs``: (name, element type, shape) triples; ``inits``: (name, array) pairs."""
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                          [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
                          [onnx.numpy_helper.from_array(np.asarray(v), n) for n, v in inits])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = ir_version
    return m


def evaluate_onnx(m: onnx.ModelProto, feeds: dict[str, np.ndarray], **import_options: Any) -> list[np.ndarray]:
    """Import ``m`` and evaluate it on ``feeds`` (by input name) in the model's precision."""
    b = tlb.import_onnx(m, **import_options)
    return [np.asarray(v) for v in tlb.evaluate(b.graph, b.payload, [feeds[n] for n in b.report["inputs"]])]
