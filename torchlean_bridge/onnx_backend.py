"""``torchlean_bridge.onnx_backend``: the public name of the ONNX backend (onnx.backend.base.Backend).

The backend imports with ``importers.onnx`` and evaluates with ``semantics``, so it lives in the
application layer (``torchlean_bridge.app.onnx_backend``); this module is that module, resolved by
name the way the package's lazy public functions are, so the core stays free of outer imports.
"""

import sys
from importlib import import_module

sys.modules[__name__] = import_module("torchlean_bridge.app.onnx_backend")
