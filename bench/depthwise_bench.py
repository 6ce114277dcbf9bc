"""The depthwise path against im2col and torch on eval_bench's depthwise models (a benchmark, not a test).

Evaluates one prepared float32 graph per model with the banded depthwise path on and off
(``semantics.conv.depthwise_serves`` patched), interleaved with torch's own forward round by round,
one thread each, and prints the median times, the ratios to torch and each path's largest error
against torch relative to torch's largest output.

    python bench/depthwise_bench.py [--models convmixer,convnext] [--runs 7]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="convmixer,convnext")
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args(argv)

    import numpy as np
    import onnx
    import torch

    import eval_bench
    import semantics.conv as conv
    import torchlean_bridge as tlb

    torch.set_num_threads(1)
    banded = conv.depthwise_serves
    paths = {"banded": banded, "im2col": lambda *a: False}
    for name in args.models.split(","):
        model, example = eval_bench.MODELS[name]()
        model.eval()
        bundle = tlb.import_onnx(onnx.load_from_string(eval_bench.export_onnx(model, example)))
        x = example.numpy()
        prepared = tlb.prepare(bundle.graph, bundle.payload.astype("float32"))
        with torch.no_grad():
            want = model(example).numpy()
        scale = float(np.abs(want).max())
        errors = {}
        for path, serves in paths.items():
            conv.depthwise_serves = serves
            errors[path] = float(np.abs(prepared.evaluate(x, dtype="float32")[0] - want).max()) / scale
        times: dict[str, list[float]] = {"banded": [], "im2col": [], "torch": []}
        for _ in range(args.runs):
            for path in times:
                t0 = time.perf_counter()
                if path == "torch":
                    with torch.no_grad():
                        model(example)
                else:
                    conv.depthwise_serves = paths[path]
                    prepared.evaluate(x, dtype="float32")
                times[path].append(time.perf_counter() - t0)
        conv.depthwise_serves = banded
        ms = {k: sorted(v)[len(v) // 2] * 1e3 for k, v in times.items()}
        print(f"{name}: banded {ms['banded']:.1f} ms, im2col {ms['im2col']:.1f} ms, torch {ms['torch']:.1f} ms; "
              f"banded/torch {ms['banded'] / ms['torch']:.2f}, im2col/torch {ms['im2col'] / ms['torch']:.2f}; "
              f"error vs torch: banded {errors['banded']:.1e}, im2col {errors['im2col']:.1e}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
