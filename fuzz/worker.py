"""The fuzz worker: a subprocess under an address-space limit that runs one case at a time.

The parent (``fuzz.harness.Worker``) writes ``(kind, argument)`` frames (pickled, length-prefixed)
to stdin; the worker answers ``(outcome, detail)``: ``bridge`` (a BridgeError, the message),
``accepted`` (no error), ``exit:N`` (a CLI invocation's exit status), ``memory`` (MemoryError: an
allocation past what the limit allows) or ``crash`` (any other exception, with its traceback).
A case that hangs is killed by the parent, which counts it as ``timeout`` and starts a new worker.
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import resource
import struct
import sys
import traceback
from pathlib import Path
from typing import Any, Callable

EVAL_ELEMENT_LIMIT = 2 ** 24  # evaluation of a fuzzed graph: no buffer above 128 MiB of float64
MAX_INPUT_ELEMENTS = 2 ** 20


def _inputs(g: Any) -> list | None:
    import numpy as np
    from torchlean_bridge.ops import numel
    out = []
    for nid in g.inputs:
        node = g.nodes[nid]
        if numel(node.out_shape) > MAX_INPUT_ELEMENTS:
            return None
        dtype = {"int64": np.int64, "bool": np.bool_}.get(node.dtype, np.float64)
        out.append(np.linspace(-1.0, 1.0, numel(node.out_shape)).astype(dtype).reshape(node.out_shape)
                   if dtype is np.float64 else np.zeros(node.out_shape, dtype))
    return out


def _exercise(graph: Any, payload: Any) -> None:
    """What a user does with an accepted graph: check, payload check, evaluate, bound, write back."""
    from semantics.evaluate import evaluate
    from semantics.interval import interval_bounds
    from torchlean_bridge.check import check
    from torchlean_bridge.ops.contracts import element_limit
    from torchlean_bridge.payload import payload_errors
    from torchlean_bridge.wire import dumps_document, graph_to_wire
    with element_limit(EVAL_ELEMENT_LIMIT):
        check(graph)
        payload_errors(graph, payload)
        inputs = _inputs(graph)
        if inputs is not None:
            evaluate(graph, payload, inputs)
            evaluate(graph, payload, inputs, dtype="float32")
            interval_bounds(graph, payload, inputs, inputs)
    dumps_document(graph_to_wire(graph, None))


def target_wire(data: bytes) -> None:
    from torchlean_bridge.wire import loads_document, parse_document
    graph, payload = parse_document(loads_document(data))
    _exercise(graph, payload)


def target_bundle(folder: str) -> None:
    from exporters.folder import load
    b = load(folder)
    _exercise(b.graph, b.payload)


def target_onnx(path: str) -> None:
    from importers.onnx import import_onnx
    b = import_onnx(path)
    _exercise(b.graph, b.payload)


def target_checkpoint(path: str) -> None:
    from importers.checkpoints import load_checkpoint
    ckpt = load_checkpoint(path)
    for key in ckpt:
        ckpt[key].sum()
    ckpt.findings


def target_cli(argv: list[str]) -> tuple[str, str]:
    from torchlean_bridge.app.cli import main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as e:  # argparse's usage errors
            code = e.code if isinstance(e.code, int) else 2
    if "Traceback (most recent call last)" in err.getvalue():
        raise RuntimeError("the CLI printed a traceback:\n" + err.getvalue()[-2000:])
    return f"exit:{code}", err.getvalue()[-500:]


TARGETS: dict[str, Callable[[Any], Any]] = {"wire": target_wire, "bundle": target_bundle, "onnx": target_onnx,
                                            "checkpoint": target_checkpoint, "cli": target_cli}


def run_case(kind: str, argument: Any) -> tuple[str, str]:
    from torchlean_bridge.errors import BridgeError
    try:
        result = TARGETS[kind](argument)
    except BridgeError as e:
        return "bridge", str(e)[:300]
    except MemoryError:
        return "memory", traceback.format_exc()[-3000:]
    except RecursionError:
        return "crash", traceback.format_exc()[-3000:]
    except Exception:  # noqa: BLE001 - the point of the worker: report anything else as a crash
        return "crash", traceback.format_exc()[-3000:]
    return result if isinstance(result, tuple) else ("accepted", "")


def _warm_up() -> None:
    """Pay torch's lazy imports (torch.export, the weights-only unpickler) before the first case, so a
    case's time is its own."""
    import torch
    import torch.export  # noqa: F401
    buf = io.BytesIO()
    torch.save({"w": torch.zeros(2)}, buf, _use_new_zipfile_serialization=False)
    buf.seek(0)
    torch.load(buf, weights_only=True)
    torch.export.export(torch.nn.Linear(2, 2), (torch.zeros(1, 2),))


def _read_frame(stream: Any) -> Any:
    head = stream.read(4)
    if len(head) < 4:
        return None
    (n,) = struct.unpack("<I", head)
    return pickle.loads(stream.read(n))


def _write_frame(stream: Any, obj: Any) -> None:
    data = pickle.dumps(obj)
    stream.write(struct.pack("<I", len(data)) + data)
    stream.flush()


def main() -> None:
    limit = int(os.environ.get("FUZZ_ADDRESS_LIMIT", str(4 << 30)))
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    sys.setrecursionlimit(10_000)
    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root))
    os.chdir(os.environ.get("FUZZ_CWD", str(root)))
    import warnings
    warnings.simplefilter("ignore")
    import numpy as np
    np.seterr(all="ignore")
    import importers.checkpoints  # noqa: F401  (import cost paid once, not per case)
    import importers.onnx  # noqa: F401
    import semantics.evaluate  # noqa: F401
    import semantics.interval  # noqa: F401
    import torchlean_bridge.app.cli  # noqa: F401
    _warm_up()
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # anything a case prints must not corrupt the frames
    _write_frame(stdout, ("ready", ""))
    while True:
        frame = _read_frame(stdin)
        if frame is None:
            return
        _write_frame(stdout, run_case(*frame))


if __name__ == "__main__":
    main()
