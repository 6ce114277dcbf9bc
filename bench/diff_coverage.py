"""Diff coverage: compared nodes / IR nodes per model and route (fx, export, torch.onnx file, our own
ONNX export), one "compared N of M" line each, then the total and every node left uncompared with
its reason. Covers the zoo's CASES and its real architectures (REAL: torchvision, timm,
transformers with random weights; torchvision through tests/torchvision_cpu.py's shim).

Run: python bench/diff_coverage.py [case ...]   (``real``: every REAL model, ``all``: CASES and REAL)"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's package and tests, from any folder

import torchlean_bridge as tlb  # noqa: E402
from tests.diff_routes import routes  # noqa: E402
from tests.model_zoo import CASES, REAL  # noqa: E402
from tests.torchvision_cpu import define_missing_ops  # noqa: E402

DEFAULT = ("encoder_layer_batch_first", "cnn2d", "residual", "mha_batch_first", "layout", "seed_mlp")


def coverage(report) -> tuple[int, int]:
    c = report.coverage
    return c["compared"], c["nodes"]


def main(names: list[str]) -> int:
    define_missing_ops()  # torchvision's compiled ops do not load with the CPU torch
    zoo = {**CASES, **REAL}
    if names == ["real"]:
        names = list(REAL)
    elif names == ["all"]:
        names = list(zoo)
    total, missing = [0, 0], Counter()
    print(f"{'case':<28} {'route':<11} coverage")
    for name in names:
        for route, made in routes(zoo[name]):
            if isinstance(made, Exception):
                print(f"{name:<28} {route:<11} route refused: {type(made).__name__}: {str(made).splitlines()[0][:90]}")
                continue
            bundle, kw = made
            try:
                rep = tlb.diff(bundle, random=2, **kw)
            except Exception as e:  # a route that fails is reported, not hidden
                print(f"{name:<28} {route:<11} diff error: {type(e).__name__}: {str(e)[:90]}")
                continue
            c, m = coverage(rep)
            total[0] += c
            total[1] += m
            for r in rep.nodes:
                if r.status == "no counterpart":
                    missing[(name, route, r.op, (r.problem or "").split(";")[-1].strip())] += 1
            print(f"{name:<28} {route:<11} compared {c} of {m}  {'ok' if rep.ok else 'DIVERGED'}", flush=True)
    print(f"total: {total[0]} of {total[1]} IR nodes compared ({100 * total[0] / max(total[1], 1):.1f}%)")
    for (name, route, op, reason), n in sorted(missing.items()):
        print(f"  not compared: {name} {route}: {n} {op}: {reason}")
    return 0 if total[0] == total[1] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or list(DEFAULT)))
