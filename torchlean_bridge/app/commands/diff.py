"""``torchlean-bridge diff``: compare a bundle with PyTorch or onnxruntime, node by node."""

from __future__ import annotations

import argparse

from ...errors import BridgeError
from ..output import add_json_argument, diff_text, emit_json, human_output
from .common import MAX_SAMPLES, bounded_int, load_factory, progress, read_array, read_bundle
HELP = "differential test against PyTorch or onnxruntime; exit 1 on divergence"
DESCRIPTION = ("Evaluate the bundle with our float64 reference semantics and compare every node with PyTorch, "
               "onnxruntime or onnx's ReferenceEvaluator: nodes with a counterpart (FX / torch.export node names, "
               "ONNX tensor names recorded at import, the node annotation of our own ONNX exports) directly, the "
               "rest (decomposed ops, expanded broadcasts, constants) through a finer oracle that recomputes them "
               "with numpy from the oracle's own parent values. The report says how many nodes it compared and "
               "why any were not. Each node's budget is derived from our own float32-vs-float64 gap there. "
               "Reports the first divergent node and the checkpoint keys feeding it.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("bundle", metavar="BUNDLE", help="bundle folder or torchlean.ir.v1 document")
    p.add_argument("--against", choices=("torch", "onnxruntime", "reference-evaluator"), default="torch",
                   help="the oracle (default: torch)")
    ref = p.add_mutually_exclusive_group()
    ref.add_argument("--reference", metavar="FILE.py:FACTORY",
                     help="zero-argument callable returning the reference nn.Module (for --against torch)")
    ref.add_argument("--onnx", metavar="FILE", help="ONNX model to run (default for onnxruntime: our own export)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--input", metavar="FILE.npy", nargs="+", action="extend",
                     help="one .npy per graph input, in graph-input order (list them, or repeat the option)")
    src.add_argument("--random", metavar="N", type=int, default=4,
                     help="N seeded input sets: normal, uniform, zeros, edge values, ... (default 4)")
    src.add_argument("--inputs", metavar="FILE.npz|DIR",
                     help="a dataset: an .npz (one array per graph input, [N, *shape] stacks) or a folder of "
                          ".npy files; every set is run, and each node says on how many it exceeded its budget; the "
                          "sets run in batches on the campaign engine (--workers, --engine), the report is the same")
    p.add_argument("--batch-size", type=int, metavar="N",
                   help="with --inputs: input sets per campaign task (default: about four tasks per worker, "
                        "at most 64 sets each); the report does not depend on it")
    from ..campaign.options import add_engine_arguments
    add_engine_arguments(p)  # --workers, --engine, --ray-address: where --inputs' batches run
    p.add_argument("--reduce", metavar="FOLDER",
                   help="on a node divergence, write the smallest subgraph that still diverges (bundle, ONNX "
                        "file, captured .npy inputs, expected value, reproduction line) to FOLDER, atomically")
    p.add_argument("--seed", type=int, default=0, help="seed for --random (default 0)")
    p.add_argument("--per-node", action="store_true", help="print every node's row, not only divergent ones")
    add_json_argument(p, "the report (per-node and per-output rows, findings, first divergence)")
    p.add_argument("--quiet", action="store_true", help="print only the verdict; no progress display")
    p.add_argument("--plot", metavar="FILE.png", help="draw error / budget per node (log scale, first divergence "
                                                     "marked) to FILE (.png, .svg, .pdf; needs matplotlib)")
    p.add_argument("--report", metavar="FILE.html",
                   help="one self-contained HTML page: the graph drawn, every node colored by error / budget, the "
                        "first divergence and suspected keys marked, details on click (no network, no server)")


def run(args: argparse.Namespace) -> int:
    from ..diff import diff
    bounded_int(args.random, "diff: --random", 0, MAX_SAMPLES)
    bounded_int(args.seed, "diff: --seed")
    if args.plot:
        from ..plots import check_target
        check_target(args.plot)
    if args.report:
        from ..html_report import check_target as check_html
        check_html(args.report, "diff: --report")
    bundle = read_bundle(args.bundle)
    if args.against == "torch" and not args.reference:
        raise BridgeError("--against torch needs --reference FILE.py:FACTORY")
    if args.against != "torch" and args.reference:
        raise BridgeError(f"--reference applies to --against torch; for {args.against} give --onnx FILE or nothing")
    if args.inputs:
        from ..campaign.diff_campaign import run_from_args
        report = run_from_args(args, bundle)
    else:
        if args.workers is not None or args.engine != "local" or args.ray_address or args.batch_size is not None:
            raise BridgeError("diff: --workers, --engine, --ray-address and --batch-size apply to --inputs")
        module = load_factory(args.reference, "--reference") if args.reference else None
        inputs = [read_array(f) for f in args.input] if args.input else None
        count = 1 if inputs is not None else max(args.random, 1)
        with progress(count, "comparing inputs", args.quiet) as advance:
            report = diff(bundle, against=args.against, module=module, onnx_model=args.onnx, inputs=inputs,
                          random=args.random, seed=args.seed, advance=advance, reduce=args.reduce)
    emit_json(report.to_json(), args.json)
    if args.plot:
        from ..plots import plot_diff
        plot_diff(report, args.plot)
        if human_output(args) and not args.quiet:
            print(f"wrote {args.plot}")
    if args.report:
        from ..html_report import diff_overlay, write_page
        write_page(args.report, bundle, diff_overlay(report, bundle))
        if human_output(args) and not args.quiet:
            print(f"wrote {args.report}")
    if human_output(args):
        if args.quiet:  # the verdict, and where a reduced reproduction was written
            lines = report.summary().splitlines()
            print("\n".join(lines[:1] + [line for line in lines[1:] if "reduced to" in line]))
        else:
            print(diff_text(report, all_nodes=args.per_node))
    return 0 if report.ok else 1
