"""``torchlean-bridge demo``: the whole story on the seed chapters' two models, built in code.

1. The seed MLP G = tanh(sum(l2(relu(l1(x))))) as a PyTorch module with the seed weights, captured
   three ways (torch.fx, torch.export, ONNX via torch.onnx.export) and imported; each import validates;
   the listing and the value table at x0 are the chapter's; the three imports agree with each other,
   with PyTorch node by node and with onnxruntime; interval boxes for radius 0.05 and the sampled
   containment check; exports to torchlean.ir.v1 and ONNX, and the bundle folder.
2. ReLU(x + b1) + b2 with a checkpoint whose two biases are exchanged: ``load_state_dict`` accepts
   it, our binding lists the ambiguity, and the audit and the diff catch the swap and name the keys.
"""

from __future__ import annotations

import argparse
import io
import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from ...bundle import Bundle
from ...check import check
from ...fileio import atomic_write_bytes, atomic_write_text
from ...pretty import listing
from ...seed import BIAS_PAIR, SEED_WEIGHTS, SEED_X0
from ..output import add_json_argument
from .common import format_vector, iterate
from .demo_init_plan import init_and_plan_story

HELP = "run the end-to-end story on the built-in seed models"
RADIUS = 0.05


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--output", default="tlb-demo", help="folder for the demo's artefacts (default: tlb-demo)")
    p.add_argument("--quiet", action="store_true", help="no progress display")
    add_json_argument(p, "the outcome (ok, failure, artefacts)")


def section(title: str) -> None:
    print(f"\n== {title} ==")


def _ulps(report: Any) -> str:
    matched = [r for r in report.nodes if r.status != "no counterpart"]
    worst = max((r.max_ulp for r in matched + report.outputs), default=0.0)
    return (f"{len(matched)} of {len(report.nodes)} nodes matched, at most {worst:.0f} float32 "
            f"ulp{'' if worst == 1 else 's'} apart")


# -- the models -----------------------------------------------------------------------------------

def seed_module() -> Any:
    """G with the seed weights: the chapter's MLP as an ordinary float32 PyTorch module."""
    import torch
    from torch import nn

    class G(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.l1, self.l2 = nn.Linear(4, 5), nn.Linear(5, 3)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.tanh(torch.sum(self.l2(torch.relu(self.l1(x)))))

    g = G().eval()
    g.load_state_dict({k: torch.tensor(v, dtype=torch.float32) for k, v in SEED_WEIGHTS.items()})
    return g


def bias_pair_module() -> Any:
    """ReLU(x + b1) + b2: nn.Sequential(Linear(3, 3), ReLU(), Linear(3, 3)), identity weights."""
    import torch
    from torch import nn
    m = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 3)).eval()
    m.load_state_dict({k: torch.tensor(v, dtype=torch.float32) for k, v in BIAS_PAIR.items()})
    return m


def torch_onnx_bytes(module: Any, example: np.ndarray) -> bytes:
    """``torch.onnx.export`` (the TorchScript exporter: fast, and what most files in the wild came from)."""
    import torch
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, (torch.tensor(example, dtype=torch.float32),), buf, dynamo=False,
                          input_names=["x"], output_names=["y"])
    return buf.getvalue()


# -- part 1: the seed MLP -------------------------------------------------------------------------

def capture_and_import(module: Any, out: Path, quiet: bool) -> tuple[dict[str, Bundle], Any]:
    """The three imports, and the ExportedProgram (exported once; the diff runs the same program)."""
    import torch
    from importers.fx import import_fx
    from importers.onnx import import_onnx
    from importers.torch_export import import_export
    section("1. capture G three ways and import each")
    x0 = torch.tensor(SEED_X0, dtype=torch.float32)
    onnx_file = out / "seed_mlp.torch.onnx"
    atomic_write_bytes(onnx_file, torch_onnx_bytes(module, SEED_X0))
    program = torch.export.export(module, (x0,))
    steps = {"fx": lambda: import_fx(module, (x0,)), "export": lambda: import_export(program),
             "onnx": lambda: import_onnx(onnx_file)}
    bundles = {}
    for name in iterate(steps, len(steps), "importing", quiet):
        bundles[name] = steps[name]()
        check(bundles[name].graph)
        b = bundles[name]
        print(f"{name:>6}: {len(b.graph)} IR nodes, {b.payload.num_parameters()} parameters, "
              f"keys {', '.join(b.roles)}; check: well formed and well shaped")
    print(f"(torch.onnx.export wrote {onnx_file})")
    return bundles, program


def show_listing_and_values(b: Bundle) -> None:
    from semantics.evaluate import evaluate
    section("2. our IR (from torch.fx)")
    print(listing(b.graph))
    section(f"3. value table at x0 = {format_vector(SEED_X0)} (float64)")
    table = evaluate(b.graph, b.payload, [SEED_X0], dtype="float64", all_nodes=True)
    for i, v in enumerate(table):
        print(f"node {i}: {format_vector(v)}")
    exact = evaluate(b.graph, b.payload, [SEED_X0], dtype="float64", all_nodes=True, exact=True)
    from ..diff import ulp64_distance
    apart = [ulp64_distance(v, e) for v, e in zip(table, exact)]
    print("default float64 vs the exact mode (TorchLean's sequential folds and C libm), per node: "
          + ", ".join(f"{i} {'bit-identical' if d == 0 else f'{d:g} ulps apart'}" for i, d in enumerate(apart)))


def show_agreement(bundles: dict[str, Bundle], module: Any, program: Any, onnx_file: Path, quiet: bool) -> bool:
    """True when every import agrees with its oracle node by node."""
    from semantics.evaluate import evaluate
    from ..diff import diff, make_inputs
    section("4. the three imports agree with each other, with PyTorch and with onnxruntime")
    g = bundles["fx"].graph
    cases = [[SEED_X0]] + [arrays for _, arrays in make_inputs(g, 4, seed=0)]
    outs = {k: [evaluate(b.graph, b.payload, c, dtype="float64")[0] for c in cases] for k, b in bundles.items()}
    for a, b in (("fx", "export"), ("fx", "onnx"), ("export", "onnx")):
        worst = max(float(np.max(np.abs(p - q))) for p, q in zip(outs[a], outs[b]))
        print(f"{a} vs {b}: outputs differ by at most {worst:.1e} on {len(cases)} inputs (x0, normal, uniform, "
              f"zeros, edge)")
    checks = [("fx import", bundles["fx"], "torch", {"module": module}),
              ("export import", bundles["export"], "torch", {"module": program}),
              ("onnx import", bundles["onnx"], "onnxruntime", {"onnx_model": onnx_file}),
              ("onnx import", bundles["onnx"], "reference-evaluator", {"onnx_model": onnx_file})]
    agree = True
    for label, bundle, against, kw in iterate(checks, len(checks), "diffing", quiet):
        report = diff(bundle, against=against, random=4, **kw)
        verdict = "agree" if report.ok else f"DIVERGE ({report.first_divergence})"
        print(f"{label} vs {report.against}: {verdict}; {_ulps(report)}")
        agree = agree and report.ok
    return agree


def show_bounds(b: Bundle) -> None:
    from semantics.interval import interval_bounds
    from semantics.sampling import check_containment
    section(f"5. interval boxes for the l-infinity ball of radius {RADIUS} around x0")
    lo, hi = SEED_X0 - RADIUS, SEED_X0 + RADIUS
    for i, (low, high) in enumerate(interval_bounds(b.graph, b.payload, lo, hi)):
        print(f"node {i}: {format_vector(np.atleast_1d(low))} .. {format_vector(np.atleast_1d(high))}")
    print("(tanh is monotone, so node 5's box is the image of node 4's; the chapter's Float instance "
          "prints the global [-1, 1])")
    check_containment(b.graph, b.payload, lo, hi, samples=50, seed=0)
    print("sampled containment: 50 seeded points of the ball evaluated; every node's value lies in its box")


def write_exports(b: Bundle, out: Path) -> None:
    import onnxruntime as ort
    from exporters.folder import save
    from exporters.onnx import export_onnx
    from exporters.torchlean_json import export_torchlean
    section("6. exports")
    export_torchlean(b, out / "seed_mlp.torchlean.json", inline_payload=True)
    print(f"torchlean.ir.v1 document (payload inline): {out / 'seed_mlp.torchlean.json'}")
    export_onnx(b, out / "seed_mlp.onnx")
    options = ort.SessionOptions()
    options.log_severity_level = 3  # onnxruntime's own warnings go to stderr past Python's filters
    session = ort.InferenceSession(str(out / "seed_mlp.onnx"), options, providers=["CPUExecutionProvider"])
    feed = {session.get_inputs()[0].name: SEED_X0.astype(np.float32)}
    print(f"ONNX: {out / 'seed_mlp.onnx'} (onnxruntime at x0: {format_vector(session.run(None, feed)[0])})")
    save(b, out / "seed_mlp")
    print(f"bundle folder: {out / 'seed_mlp'} (graph.json, payload.safetensors, roles.json)")


# -- part 2: the swapped biases -------------------------------------------------------------------

def swapped_biases(out: Path) -> bool:
    """True when the audit names the exchanged keys and the diff diverges at the first linear."""
    import torch
    from safetensors.torch import save
    from importers.checkpoints import load_checkpoint
    from importers.fx import import_fx
    from ..abi import bind_checkpoint
    from ..audit import audit
    from ..diff import diff
    section("7. ReLU(x + b1) + b2 and a checkpoint with its two biases exchanged")
    trusted = bias_pair_module()
    print("trusted model: nn.Sequential(Linear(3, 3), ReLU(), Linear(3, 3)), identity weights, "
          "b1 = (-1, 0, 0), b2 = (1, 0, 0)")
    sd = {k: v.clone() for k, v in trusted.state_dict().items()}
    sd["0.bias"], sd["2.bias"] = sd["2.bias"].clone(), sd["0.bias"].clone()
    ckpt_file = out / "bias_pair_swapped.safetensors"
    atomic_write_bytes(ckpt_file, save(sd))
    print(f"checkpoint with 0.bias and 2.bias exchanged: {ckpt_file}")
    ckpt = load_checkpoint(ckpt_file)
    victim = bias_pair_module()
    print("load_state_dict result:", victim.load_state_dict({k: torch.from_numpy(np.array(ckpt[k])) for k in ckpt}))
    z = torch.zeros(3)
    with torch.no_grad():
        print(f"at x = 0: trusted {trusted(z).tolist()}, with the checkpoint {victim(z).tolist()}")

    bundle = import_fx(trusted, (z,))
    bound, binding = bind_checkpoint(bundle, ckpt)
    print(f"\nbind_checkpoint (keys and shapes): {'every key and shape fits' if binding.ok else 'PROBLEMS'}")
    print(binding)
    print("\naudit against the trusted module:")
    audit_report = audit(bundle, ckpt, reference=trusted, inputs=[np.zeros(3)])
    print(audit_report)
    print("\ndiff of the bound bundle against the trusted module, node by node:")
    report = diff(bound, against="torch", module=trusted, random=4)
    print(report)  # every node, as output.diff_text renders it
    atomic_write_text(out / "bias_pair_diff.json", json.dumps(report.to_json(), indent=1) + "\n")
    print(f"(diff report as JSON: {out / 'bias_pair_diff.json'})")
    named = any(set(f.keys) == {"0.bias", "2.bias"} for f in audit_report.swaps)
    return named and not report.ok


def run(args: argparse.Namespace) -> int:
    from ..output import emit_json
    code, failure = _story(args)
    out = Path(args.output)
    emit_json({"ok": code == 0, "failure": failure, "output": str(out),
               "artefacts": sorted(p.name for p in out.iterdir())}, args.json)
    return code


def _story(args: argparse.Namespace) -> tuple[int, str | None]:
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    print(f"torchlean-bridge demo: artefacts go to {out}/")
    module = seed_module()
    bundles, program = capture_and_import(module, out, args.quiet)
    show_listing_and_values(bundles["fx"])
    agree = show_agreement(bundles, module, program, out / "seed_mlp.torch.onnx", args.quiet)
    show_bounds(bundles["fx"])
    write_exports(bundles["fx"], out)
    caught = swapped_biases(out)
    story = init_and_plan_story(bundles["fx"], section)
    print(f"\ndone; artefacts in {out}/: {', '.join(sorted(p.name for p in out.iterdir()))}")
    failure = None
    if not (agree and caught):
        failure = "an import disagrees with its oracle" if not agree else "the exchanged biases were not caught"
    elif not story:
        failure = "PyTorch or the libtorch plan disagrees with the reference on the init-and-plan story"
    if failure:
        print(f"demo FAILED: {failure}")
        return 1, failure
    return 0, None
