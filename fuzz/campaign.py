"""The long fuzz campaign: mutated wire documents, corrupted bundles, ONNX models and checkpoints,
mutated CLI invocations, each case in a worker under an address-space limit and a timeout.

    OMP_NUM_THREADS=1 python -m fuzz.campaign --wire 2000 --bundle 300 --onnx 2000 --checkpoint 1000 --cli 134

Prints the counts per outcome class for each entry point (``bridge``, ``accepted``, ``silent``,
``crash``, ``memory``, ``timeout``) and the first few cases of every bad class with their detail;
exits 1 when any bad class is non-empty. Seeded: the same arguments give the same cases.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from fuzz import harness as h


def _cases(kind: str, count: int, seed: int, work: Path):
    import torchlean_bridge as tlb
    rng = random.Random(f"{kind}:{seed}")
    if kind == "wire":
        seeds = h.wire_seeds()
        return (h.wire_case(seeds, rng) for _ in range(count))
    if kind == "bundle":
        saved = []
        for i, b in enumerate(h.bundle_seeds()):
            saved.append(tlb.save(b, work / f"seed{i}"))
        return (h.bundle_case(saved, work, rng, i % 16) for i in range(count))
    if kind == "onnx":
        models = [m.SerializeToString() for m in h.onnx_seed_models().values()]
        return (h.onnx_case(models, work, rng, i) for i in range(count))
    if kind == "checkpoint":
        seeds = h.checkpoint_seeds(work / "seeds")
        return (h.checkpoint_case(seeds, work, rng, i) for i in range(count))
    if kind == "cli":
        f = h.cli_fixtures(work / "cli")
        base = h.cli_base(f)
        return iter([h.Case("cli", argv, label=" ".join(argv)) for argv in base][:count]
                    + [h.cli_case(base, f, rng) for _ in range(max(0, count - len(base)))])
    raise ValueError(kind)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for kind, default in (("wire", 1000), ("bundle", 200), ("onnx", 1000), ("checkpoint", 500), ("cli", 134)):
        p.add_argument(f"--{kind}", type=int, default=default, help=f"{kind} cases (default {default})")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=10.0, help="seconds per case (default 10)")
    p.add_argument("--address-limit-gib", type=float, default=4.0)
    p.add_argument("--show", type=int, default=3, help="bad cases printed per class")
    args = p.parse_args(argv)
    total_bad = 0
    with tempfile.TemporaryDirectory(prefix="tlb-fuzz-") as tmp:
        for kind in ("wire", "bundle", "onnx", "checkpoint", "cli"):
            count = getattr(args, kind)
            if count <= 0:
                continue
            work = Path(tmp) / kind
            work.mkdir()
            shown: Counter = Counter()
            where: Counter = Counter()
            slowest = [0.0]

            def report(result: h.Result) -> None:
                slowest[0] = max(slowest[0], result.seconds)
                if result.seconds > args.timeout / 4:
                    print(f"  [{kind} slow {result.seconds:.1f} s] {result.case.label} {result.outcome} "
                          f"{result.detail[:200]}", file=sys.stderr)
                    if isinstance(result.case.argument, str) and Path(result.case.argument).is_file():
                        shutil.copy(result.case.argument, Path(tempfile.gettempdir()) / f"tlb-fuzz-slow-{kind}")
                v = result.verdict
                if v == "crash":
                    where[h.innermost_project_file(result.detail).split("/")[0] or "?"] += 1
                if v in h.BAD_CLASSES and shown[v] < args.show:
                    shown[v] += 1
                    print(f"  [{kind} {v}] {result.case.label}: {result.detail[-1500:]}", file=sys.stderr)

            start = time.monotonic()
            with h.Worker(timeout=args.timeout, address_limit=int(args.address_limit_gib * (1 << 30)),
                          cwd=str(work)) as worker:
                counts = h.run_cases(worker, _cases(kind, count, args.seed, work), report)
            bad = sum(counts[c] for c in h.BAD_CLASSES)
            total_bad += bad
            classes = ", ".join(f"{c}={counts[c]}" for c in ("bridge", "accepted") + h.BAD_CLASSES)
            print(f"{kind:>10}: {sum(counts.values())} cases in {time.monotonic() - start:.0f} s "
                  f"(slowest {slowest[0]:.2f} s): {classes}"
                  + (f" (crashes by package: {dict(where)})" if where else ""))
    print("no bad outcomes" if not total_bad else f"{total_bad} bad outcome(s)")
    return 1 if total_bad else 0


if __name__ == "__main__":
    sys.exit(main())
