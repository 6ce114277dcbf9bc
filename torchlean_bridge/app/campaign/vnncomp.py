"""VNN-COMP's tool interface, behind ``vnncomp/prepare_instance.sh`` and ``vnncomp/run_instance.sh``.

``prepare v1 BENCHMARK ONNX VNNLIB``: checks that the network loads and the property parses (exit 0),
else prints why and exits 1, so the harness knows the instance is not supported before timing it.
``run v1 BENCHMARK ONNX VNNLIB RESULT_FILE TIMEOUT``: answers the instance with the campaign's task
(the single-instance ``verify``) and writes RESULT_FILE atomically: ``sat`` followed by the
counterexample, ``unsat``, ``unknown``, ``timeout`` or ``error``. The time limit covers loading too:
``verify`` gets what remains of TIMEOUT after the network is loaded and the property read, less a second
for writing out.
"""

from __future__ import annotations

import math
import sys
import time
from typing import Sequence

from ...errors import BridgeError
from ...fileio import atomic_write_text
from .files import local_file

__all__ = ["main"]

_USAGE = {"prepare": "prepare_instance.sh v1 BENCHMARK ONNX VNNLIB",
          "run": "run_instance.sh v1 BENCHMARK ONNX VNNLIB RESULT_FILE TIMEOUT"}
_WRITE_OUT = 1.0  # seconds kept back from the time limit to stop and write the result


def _prepare(onnx: str, vnnlib: str) -> int:
    from ..verify import load_model
    from .verify_task import read_property
    try:
        model = load_model(local_file(onnx))
        prop = read_property(local_file(vnnlib), vnnlib)
        if prop.n_outputs != model.n_outputs:
            raise BridgeError(f"the property declares {prop.n_outputs} outputs Y_j, the network has "
                              f"{model.n_outputs}")
        prop.shaped(model.input_shape)
    except BridgeError as e:
        print(f"unsupported instance: {e}", file=sys.stderr)
        return 1
    return 0


def _run(onnx: str, vnnlib: str, result_file: str, timeout: float, start: float) -> int:
    from .verify_task import verify_instance
    try:
        model_path, vnnlib_path = local_file(onnx), local_file(vnnlib)
        left = timeout - (time.monotonic() - start) - _WRITE_OUT
        if left <= 0:
            text = "timeout\n"
        else:
            answer = verify_instance(model_path, vnnlib_path, "auto", 0, left, vnnlib,
                                     deadline=start + timeout - _WRITE_OUT)
            text = answer["counterexample"] or f"{answer['result']}\n"
    except BridgeError as e:
        print(f"error: {e}", file=sys.stderr)
        text = "error\n"
    except Exception as e:  # noqa: BLE001 - the harness still gets a result file, the reason goes to stderr
        print(f"internal error: {type(e).__name__}: {e}", file=sys.stderr)
        text = "error\n"
    atomic_write_text(result_file, text)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    start = time.monotonic()
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in _USAGE:
        print("usage: python -m torchlean_bridge.app.campaign.vnncomp prepare|run ...", file=sys.stderr)
        return 2
    command, rest = args[0], args[1:]
    want = 4 if command == "prepare" else 6
    if len(rest) != want or rest[0] != "v1":
        print(f"usage: {_USAGE[command]} (VNN-COMP's interface version v1)", file=sys.stderr)
        return 2
    if command == "prepare":
        return _prepare(rest[2], rest[3])
    try:
        timeout = float(rest[5])
    except ValueError:
        timeout = math.nan
    if not math.isfinite(timeout) or timeout <= 0:
        print(f"run_instance.sh: TIMEOUT must be a positive number of seconds, got {rest[5]!r}", file=sys.stderr)
        return 2
    return _run(rest[2], rest[3], rest[4], timeout, start)


if __name__ == "__main__":
    sys.exit(main())
