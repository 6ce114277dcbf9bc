"""How many properties CROWN alone proves against branch and bound (BaBSR and FSB branching), at a fixed time per instance.

    python bench/bab_bench.py [--timeout 10] [--write] [--only TEXT]

Instances: the VNN-COMP-like fixtures under fixtures/verify (fixtures/make_verification_fixtures.py),
and local-robustness properties of networks built here with seeded random weights: an MNIST-shaped
MLP (784-64-64-10) and a 50-64-64-5 one, two seeds each, a residual one (50-64, a ReLU block added
back, 5 outputs), 50-64-64-5 MLPs with leaky ReLU (slope 0.1) and with hardtanh, and the fixture
CNN. Each network's radii are 1.1x, 1.25x and 1.5x the largest radius that one CROWN pass proves
(found by bisection; 1.03x, 1.06x and 1.1x for the residual, leaky-ReLU and hardtanh nets, on which
CROWN is nearly exact: the larger radii are sat at once), so every one of them is beyond CROWN alone by construction and the question is
what branch and bound closes. Per instance the script runs ``verify`` with ``crown`` (one CROWN pass,
then input splitting) and ``bab-relu`` with each branching rule (``bab.search.BRANCHING``) in the same
process, one after the other, with the same timeout, and prints the table; ``--write`` replaces the
table in docs/verification.md. A conflict (one method sat where another is unsat) is counted as a
wrong answer."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

BEGIN, END = "<!-- bab-bench:begin -->", "<!-- bab-bench:end -->"
METHODS = ("crown", "bab-relu babsr", "bab-relu fsb")  # bab-relu with each branching rule (bab.search.BRANCHING)
FACTORS = (1.1, 1.25, 1.5)
CLOSE_FACTORS = (1.03, 1.06, 1.1)  # nets on which CROWN is nearly exact (already sat at 1.25x)


def _model(net, shape):
    import torch
    import torchlean_bridge as tlb
    from exporters.onnx import export_onnx
    from torchlean_bridge.app.verify import _Model
    b = tlb.import_fx(net.eval(), (torch.zeros(*shape),))
    return _Model(b, export_onnx(b).SerializeToString())


def _mlp(d: int, hidden: list[int], k: int, seed: int, act=None):
    import torch
    torch.manual_seed(seed)
    layers, w = [], d
    for h in hidden:
        layers += [torch.nn.Linear(w, h), torch.nn.ReLU() if act is None else act()]
        w = h
    layers.append(torch.nn.Linear(w, k))
    return _model(torch.nn.Sequential(*layers), (1, d))


def _residual(d: int, h: int, k: int, seed: int):
    """x -> relu(W1 x) -> h + W3 relu(W2 h) -> relu -> linear: a residual add (not a chain)."""
    import torch
    torch.manual_seed(seed)

    class Res(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b, self.c = torch.nn.Linear(d, h), torch.nn.Linear(h, h), torch.nn.Linear(h, h)
            self.out = torch.nn.Linear(h, k)

        def forward(self, x):
            z = torch.relu(self.a(x))
            z = torch.relu(z + self.c(torch.relu(self.b(z))))
            return self.out(z)
    return _model(Res(), (1, d))


def _robust(model, x0: np.ndarray, eps: float):
    from torchlean_bridge.app.vnnlib import Case, Property
    y = model.evaluate(x0, "float64")
    label, k = int(np.argmax(y)), y.size
    x0 = x0.reshape(1, -1)
    groups = []
    for j in range(k):
        if j != label:
            c = np.zeros((1, k))
            c[0, label], c[0, j] = 1.0, -1.0  # unsafe: Y_label <= Y_j
            groups.append((c, np.zeros(1), np.zeros(1, dtype=bool)))
    return Property(x0.size, k, [Case((x0 - eps).reshape(-1), (x0 + eps).reshape(-1), groups)])


def _crown_radius(model, x0: np.ndarray) -> float:
    """The largest radius (to 1%) at which one CROWN pass refutes every group."""
    def proved(eps: float) -> bool:
        p = _robust(model, x0, eps)
        case = p.shaped(model.input_shape).cases[0]
        c = np.concatenate([g[0] for g in case.groups])
        r = model.crown(case.lower, case.upper, spec=c)
        return bool(np.all(r.spec_lower[0] > 0))
    lo, hi = 0.0, 1.0
    while proved(hi):
        hi *= 2
    while hi - lo > 0.01 * hi:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if proved(mid) else (lo, mid)
    return lo


def instances():
    import torchlean_bridge as tlb
    from torchlean_bridge.app.verify import load_model
    fix = ROOT / "fixtures" / "verify"
    for net, prop in (("acas_like", "acas_robust"), ("acas_like", "acas_sat"), ("acas_like", "acas_min"),
                      ("cnn_small", "cnn_robust")):
        yield f"fixture {prop}", load_model(fix / f"{net}.onnx"), tlb.load_vnnlib(fix / f"{prop}.vnnlib")
    cnn = load_model(fix / "cnn_small.onnx")  # convolutional: split-aware CROWN without beta (not a chain)
    x0 = np.random.default_rng(1).random((1, 1, 8, 8))
    base = _crown_radius(cnn, x0)
    for factor in FACTORS:
        yield f"cnn_small, eps {factor}x CROWN's", cnn, _robust(cnn, x0, base * factor)
    import torch
    for name, model, d in (("residual 50-64-(64-64)-5", _residual(50, 64, 5, 0), 50),
                           ("leaky-relu mlp 50-64-64-5", _mlp(50, [64, 64], 5, 0, lambda: torch.nn.LeakyReLU(0.1)), 50),
                           ("hardtanh mlp 50-64-64-5", _mlp(50, [64, 64], 5, 0, torch.nn.Hardtanh), 50)):
        x0 = np.random.default_rng(0).random((1, d))
        base = _crown_radius(model, x0)
        for factor in CLOSE_FACTORS:
            yield f"{name} seed 0, eps {factor}x CROWN's", model, _robust(model, x0, base * factor)
    for name, d, hidden, k in (("mnist-like 784-64-64-10", 784, [64, 64], 10), ("mlp 50-64-64-5", 50, [64, 64], 5)):
        for seed in (0, 1):
            model = _mlp(d, hidden, k, seed=seed)
            x0 = np.random.default_rng(seed).random((1, d))
            base = _crown_radius(model, x0)
            for factor in FACTORS:
                yield f"{name} seed {seed}, eps {factor}x CROWN's", model, _robust(model, x0, base * factor)


def main(argv: list[str] | None = None) -> int:
    from torchlean_bridge.app.bab import search
    from torchlean_bridge.app.verify import verify
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--timeout", type=float, default=10.0)
    ap.add_argument("--write", action="store_true", help="replace the table in docs/verification.md")
    ap.add_argument("--only", default="", help="run only the instances whose name contains this text")
    args = ap.parse_args(argv)
    default_branching = search.BRANCHING
    rows, totals = [], {m: {"unsat": 0, "sat": 0, "unknown": 0, "time": 0.0} for m in METHODS}
    wrong = 0
    one_pass = 0
    cells: dict[str, list] = {m: [] for m in METHODS}
    for name, model, prop in instances():
        if args.only not in name:
            continue
        got = {}
        for method in METHODS:
            run, _, branching = method.partition(" ")
            search.BRANCHING = branching or default_branching
            t = time.perf_counter()
            r = verify(model, prop, method=run, timeout=args.timeout)
            got[method] = (r.result, time.perf_counter() - t, r.domains_visited)
            totals[method][r.result] += 1
            totals[method]["time"] += got[method][1]
            cells[method].append(got[method])
        crown_alone = got["crown"][0] == "unsat" and got["crown"][2] == 1
        one_pass += crown_alone
        answers = {a for a, _, _ in got.values()}
        wrong += {"sat", "unsat"} <= answers
        rows.append(f"| {name} | {'unsat' if crown_alone else '-'} | "
                    + " | ".join(f"{got[m][0]} ({got[m][1]:.1f} s, {got[m][2]} domains)" for m in METHODS) + " |")
        print(rows[-1], flush=True)
    search.BRANCHING = default_branching
    head = ["| instance | one CROWN pass | crown (input splitting) | bab-relu, BaBSR | bab-relu, FSB |",
            "|---|---|---|---|---|"]
    a, b = METHODS[1], METHODS[2]
    both = [i for i in range(len(rows)) if cells[a][i][0] != "unknown" and cells[b][i][0] != "unknown"]
    summary = (f"| **total ({len(rows)})** | {one_pass} unsat | "
               + " | ".join(f"{totals[m]['unsat']} unsat, {totals[m]['sat']} sat, {totals[m]['unknown']} unknown"
                            for m in METHODS) + " |")
    table = "\n".join(head + rows + [summary])
    note = (f"\n\nTimeout {args.timeout:g} s per instance and method, on this machine, one process; "
            f"wrong answers (sat against unsat): {wrong}. On the {len(both)} instances both bab-relu "
            f"rules decided: BaBSR {sum(cells[a][i][2] for i in both)} domains in "
            f"{sum(cells[a][i][1] for i in both):.1f} s, FSB {sum(cells[b][i][2] for i in both)} domains in "
            f"{sum(cells[b][i][1] for i in both):.1f} s (FSB's candidate children, bounded to choose a branch, "
            f"are not counted as domains).")
    print(summary)
    print(note.strip())
    if args.write:
        doc = ROOT / "docs" / "verification.md"
        text = doc.read_text()
        start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
        from torchlean_bridge.fileio import atomic_write_text
        atomic_write_text(doc, text[:start] + "\n" + table + note + "\n" + text[end:])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
