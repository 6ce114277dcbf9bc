"""Input splitting (``verify --method bab-input``) on a few ACAS Xu instances: time to verdict and boxes/s.

Compares the batched search (boxes bounded many per CROWN pass, ``verify.INPUT_BATCH``) with one box
per pass (``--batch 1``) in the same run, so both see the same machine load (printed).
Usage: ``python bench/input_split_bench.py [--timeout S] [--batch N ...]``.
"""

from __future__ import annotations

import argparse
import inspect
import os
import time
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ACAS = Path("/work/peers/vnncomp/vnncomp2021/benchmarks/acasxu")
INSTANCES = [("1_1", "prop_1"), ("3_1", "prop_1"), ("1_4", "prop_2"), ("3_1", "prop_3"), ("2_1", "prop_4"),
             ("1_1", "prop_5"), ("4_5", "prop_9"), ("1_9", "prop_7")]


def main() -> None:
    from torchlean_bridge.app.verify import load_model, verify
    from torchlean_bridge.app.vnnlib import load_vnnlib
    p = argparse.ArgumentParser()
    p.add_argument("--timeout", type=float, default=30.0)
    p.add_argument("--batch", type=int, nargs="*", default=[None], help="boxes per pass (omit: automatic)")
    args = p.parse_args()
    takes_batch = "batch" in inspect.signature(verify).parameters
    print(f"load {open('/proc/loadavg').read().split()[:3]}")
    for net, prop in INSTANCES:
        model = load_model(ACAS / f"ACASXU_run2a_{net}_batch_2000.onnx")
        spec = load_vnnlib(ACAS / f"{prop}.vnnlib")
        for batch in args.batch:
            kw = {"batch": batch} if takes_batch else {}
            t0 = time.perf_counter()
            r = verify(model, spec, method="bab-input", timeout=args.timeout, **kw)
            dt = time.perf_counter() - t0
            print(f"{net} {prop} batch={batch if takes_batch else 'old'}: {r.result:7s} {dt:7.2f} s "
                  f"{r.domains_visited:7d} boxes {r.domains_visited / dt:8.1f} boxes/s", flush=True)
    print(f"load {open('/proc/loadavg').read().split()[:3]}")


if __name__ == "__main__":
    main()
