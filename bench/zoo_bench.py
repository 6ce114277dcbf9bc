"""Float32 evaluation against PyTorch's own forward on every real zoo architecture (a benchmark).

    python bench/zoo_bench.py [--runs 7] [--threads 1] [--models tv_convnext,timm_vit] [--ops 3]

Each model of ``tests.model_zoo.REAL`` (torchvision, timm, transformers; random seeded weights) is
imported with ``torch.export`` (fx where export refuses it), prepared once (``tlb.prepare``: validation,
weight conversion, depthwise bands, as torch holds its weights ready), and timed against the module's
own forward under ``torch.no_grad()``, runners interleaved round by round, median of ``--runs``. Both
sides get ``--threads`` threads (default 1: BLAS and torch's intra-op pool; 0: each library's own
default). Printed per model: ours, torch, the ratio ours/torch, the largest relative difference from
torch's output, and the ``--ops`` op kinds that take most of our time (one extra evaluation with
per-node timers). The last line gives the median and the worst ratio. Target (issue 33): at most 1.5x
torch on every model.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=7)
    p.add_argument("--threads", type=int, default=1,
                   help="BLAS and torch intra-op threads (default 1; 0 = each library's own default)")
    p.add_argument("--models", default="", help="comma-separated REAL zoo names (default: all)")
    p.add_argument("--ops", type=int, default=3, help="op kinds listed per model")
    return p.parse_args()


ARGS = _args() if __name__ == "__main__" else None
if ARGS is not None and ARGS.threads:  # before numpy and torch load their thread pools
    for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[_var] = str(ARGS.threads)

import numpy as np  # noqa: E402
import torch  # noqa: E402

import semantics.domains as domains  # noqa: E402
import torchlean_bridge as tlb  # noqa: E402
from tests.model_zoo import REAL  # noqa: E402


def _import(case, module, inputs):
    """torch.export first (the route most models take), fx where export refuses the model."""
    if case.export:
        try:
            return tlb.import_export(module, inputs)
        except Exception as e:  # noqa: BLE001 - a refused route is reported, the other one tried
            if not case.fx:
                raise
            print(f"  ({case.name}: export refused: {type(e).__name__}; fx instead)")
    return tlb.import_fx(module, inputs)


def _op_times(prepared, arrays) -> dict[str, float]:
    """Seconds per op kind in one evaluation (per-node timers around ``node_value``)."""
    spent: dict[str, float] = defaultdict(float)
    original = domains.node_value

    def timed(domain, node, parents, record, *rest, **kw):
        t = time.perf_counter()
        try:
            return original(domain, node, parents, record, *rest, **kw)
        finally:
            spent[node.kind] += time.perf_counter() - t

    domains.node_value = timed
    try:
        prepared.evaluate(*arrays, dtype="float32")
    finally:
        domains.node_value = original
    return spent


def bench_model(name: str, runs: int, ops: int) -> float:
    case = REAL[name]
    module, inputs = case.make()
    bundle = _import(case, module, inputs)
    prepared = tlb.prepare(bundle.graph, bundle.payload)
    arrays = [t.numpy() for t in inputs]
    with torch.no_grad():
        want = module(*inputs)
    want = want if isinstance(want, (tuple, list)) else (want,)
    got = prepared.evaluate(*arrays, dtype="float32")
    err = max(float(np.max(np.abs(g - w.float().numpy())) / max(float(np.max(np.abs(w.float().numpy()))), 1e-30))
              for g, w in zip(got, want) if hasattr(w, "numpy"))
    ours, theirs = [], []
    with torch.no_grad():
        for _ in range(runs):
            t = time.perf_counter()
            prepared.evaluate(*arrays, dtype="float32")
            ours.append(time.perf_counter() - t)
            t = time.perf_counter()
            module(*inputs)
            theirs.append(time.perf_counter() - t)
    o, th = statistics.median(ours), statistics.median(theirs)
    top = sorted(_op_times(prepared, arrays).items(), key=lambda kv: -kv[1])[:ops]
    listed = ", ".join(f"{kind} {1e3 * s:.1f}" for kind, s in top)
    print(f"{name:18s} {len(bundle.graph.nodes):6d} {1e3 * o:9.1f}ms {1e3 * th:9.1f}ms {o / th:7.2f} {err:9.1e}  {listed}",
          flush=True)
    return o / th


def main() -> None:
    if ARGS.threads:
        torch.set_num_threads(ARGS.threads)
    names = [n for n in ARGS.models.split(",") if n] or sorted(REAL)
    unknown = [n for n in names if n not in REAL]
    if unknown:
        raise SystemExit(f"unknown zoo models: {', '.join(unknown)} (known: {', '.join(sorted(REAL))})")
    print(f"{'model':18s} {'nodes':>6s} {'ours f32':>11s} {'torch':>11s} {'ratio':>7s} {'rel err':>9s}  "
          f"top ops (ms)  [threads: {ARGS.threads or 'default'}]")
    ratios = {}
    for name in names:
        try:
            ratios[name] = bench_model(name, ARGS.runs, ARGS.ops)
        except Exception as e:  # noqa: BLE001 - a model that cannot run here is reported and skipped
            print(f"{name:18s} skipped: {type(e).__name__}: {str(e).splitlines()[0][:100]}")
    if ratios:
        worst = max(ratios, key=ratios.get)
        print(f"median ratio {statistics.median(ratios.values()):.2f}, worst {ratios[worst]:.2f} ({worst}); "
              f"{sum(r <= 1.5 for r in ratios.values())} of {len(ratios)} at most 1.5x")


if __name__ == "__main__":
    main()
