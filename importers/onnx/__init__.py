"""ONNX import: models into IR + payload + role map (``importers.onnx.import_onnx``, ``tlb.import_onnx``).

Modules: ``importer`` (the walk), ``context`` (per-import state), ``fold`` (import-time constants),
``ops_math`` / ``ops_tensor`` / ``ops_nn`` (handlers by op family).
"""

from .importer import EMITTED_KINDS, HANDLERS, MAX_OPSET, MIN_OPSET, import_onnx, load_model

__all__ = ["import_onnx", "load_model", "HANDLERS", "EMITTED_KINDS", "MIN_OPSET", "MAX_OPSET"]
