"""One verification instance on a worker: the single-instance code (``load_model``, ``load_vnnlib``,
``verify``), with the loaded model kept for the worker's next instance on the same network.

The answer is given in VNN-COMP's words: ``sat``/``unsat`` as ``verify`` says, ``timeout`` when
``verify`` ran out of time (its ``unknown`` with reason ``timeout``), ``unknown`` otherwise; a sat
answer carries its counterexample in VNN-COMP's result-file format.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

__all__ = ["verify_instance", "read_property", "vnncomp_word", "counterexample_text", "PRELOAD", "MODEL_CACHE"]

# imported by each worker (and the local engine's fork server) before its first instance
PRELOAD = ("onnx", "onnxruntime", "importers.onnx", "semantics.linear_bounds", "torchlean_bridge.app.verify")
MODEL_CACHE = 4  # loaded networks a worker keeps (VNN-COMP rows come grouped by network)
_models: "OrderedDict[str, Any]" = OrderedDict()


def _model(path: str) -> tuple[Any, float]:
    """The loaded network and the seconds loading took now (0 when this worker had it already)."""
    from ..verify import load_model
    if path in _models:
        _models.move_to_end(path)
        return _models[path], 0.0
    start = time.perf_counter()
    model = load_model(path)
    _models[path] = model
    while len(_models) > MODEL_CACHE:
        _models.popitem(last=False)
    return model, time.perf_counter() - start


def vnncomp_word(result: str, reason: str) -> str:
    if result == "unknown" and reason.startswith("timeout"):
        return "timeout"
    return result


def counterexample_text(cex: dict[str, Any]) -> str:
    """VNN-COMP's result file for ``sat``: the input and output values, each ``(X_i value)``; the outputs
    are onnxruntime's (what the competition's checker recomputes), exact float64 decimals."""
    xs = cex["x"]
    ys = cex.get("y_onnxruntime") or cex["y"]
    pairs = [f"(X_{i} {float(v)!r})" for i, v in enumerate(xs)] + [f"(Y_{j} {float(v)!r})" for j, v in enumerate(ys)]
    return "sat\n(" + "\n ".join(pairs) + ")\n"


def read_property(path: str, label: str) -> Any:
    """``load_vnnlib`` as the single-instance command runs it, naming the file as the instances file
    does (``path`` may be a worker's decompressed or shipped copy)."""
    from ...errors import BridgeError
    from ..vnnlib import parse_vnnlib
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise BridgeError(f"VNN-LIB {label}: cannot read: {e}") from None
    return parse_vnnlib(text, label)


def verify_instance(model_path: str, vnnlib_path: str, method: str, seed: int, timeout: float,
                    vnnlib_label: str, deadline: float | None = None) -> dict[str, Any]:
    """The instance's answer: ``{"result", "time_s", "prepare_s", "reason", "counterexample"}`` (``prepare_s``:
    loading the network, when this worker had not yet; ``counterexample``: text or None). With ``deadline``
    (``time.monotonic``) the search gets at most what loading the network and reading the property left
    of it (VNN-COMP's limit covers both: nn4sys's 20 MB properties take half a minute to read)."""
    from ..verify import verify
    model, prepare_s = _model(model_path)
    prop = read_property(vnnlib_path, vnnlib_label)
    if deadline is not None:
        timeout = min(timeout, deadline - time.monotonic())
        if timeout <= 0:
            return {"result": "timeout", "time_s": 0.0, "prepare_s": prepare_s,
                    "reason": "timeout: loading the network and reading the property took the time limit",
                    "counterexample": None}
    r = verify(model, prop, method=method, timeout=timeout, seed=seed)
    return {"result": vnncomp_word(r.result, r.reason), "time_s": r.time_s, "prepare_s": prepare_s, "reason": r.reason,
            "counterexample": counterexample_text(r.counterexample) if r.counterexample is not None else None}
