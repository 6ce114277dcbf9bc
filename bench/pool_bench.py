"""max_pool speed against torch (a benchmark peer only): SqueezeNet 1.0's three pools.

Each is a 3x3 stride-2 ceil-mode max pool (inputs 96x109x109, 256x54x54, 512x27x27, batch 1, float32),
run as our float32 evaluation runs it (``semantics.conv.pool_nd``, TorchLean's order-dependent
``max_first``) and as ``torch.nn.functional.max_pool2d``, on a ReLU'd input (many all-zero windows) and
on one holding -0.0 entries (the windows our exact repair recomputes); one thread each, interleaved
runs, median times and the ratio ours/torch. The results are checked equal first.

Run: ``python bench/pool_bench.py [--repeat N]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import numpy as np  # noqa: E402
import torch  # noqa: E402

from semantics.conv import pool_nd  # noqa: E402

SHAPES = ((96, 109), (256, 54), (512, 27))


def _times(fns, repeat: int) -> list[float]:
    for fn in fns:
        fn()
    ts: list[list[float]] = [[] for _ in fns]
    for _ in range(repeat):
        for fn, t in zip(fns, ts):
            t0 = time.perf_counter()
            fn()
            t.append(time.perf_counter() - t0)
    return [statistics.median(t) for t in ts]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    for channels, size in SHAPES:
        out = -(-(size - 3) // 2) + 1
        relu = np.maximum(rng.standard_normal((1, channels, size, size)).astype(np.float32) - 0.5, np.float32(0))
        signed = relu.copy()
        signed[..., ::7, ::5] = np.float32(-0.0)
        for label, x in (("relu'd", relu), ("with -0.0", signed)):
            xt = torch.from_numpy(x)

            def ours(x=x):
                return pool_nd(x, mode="max_first", kernel=(3, 3), stride=(2, 2), padding=(0, 0),
                               padding_after=(0, 0), dilation=(1, 1), out_spatial=(out, out))

            def peer(xt=xt):
                return torch.nn.functional.max_pool2d(xt, 3, 2, ceil_mode=True)

            assert np.array_equal(ours(), peer().numpy())
            t_ours, t_peer = _times([ours, peer], args.repeat)
            print(f"max_pool {channels}x{size}x{size} {label:<10} ours {t_ours * 1e3:7.2f} ms   torch "
                  f"{t_peer * 1e3:7.2f} ms   ratio ours/torch {t_ours / t_peer:5.2f}")


if __name__ == "__main__":
    main()
