"""``torchlean-bridge verify``: decide a VNN-LIB property on a network (unsat / sat / unknown)."""

from __future__ import annotations

import argparse
import math

from ...errors import BridgeError
from ..output import add_json_argument, emit_json, human_output

HELP = "prove a VNN-LIB property (unsat), find a re-checked counterexample (sat), or say unknown"
DESCRIPTION = (HELP + ". unsat: sound linear (CROWN) or interval bounds refute the property on the whole input "
               "box (with input splitting, or branch and bound over unstable ReLUs: --method bab-relu); sat: a counterexample that reproduces in float64 and float32 evaluation "
               "and in onnxruntime. Exit status 0 for every answer, 2 for bad input.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL.onnx|BUNDLE", nargs="?", help="an ONNX model or a bundle folder")
    p.add_argument("property", metavar="PROP.vnnlib", nargs="?", help="the property in VNN-LIB (VNN-COMP subset)")
    p.add_argument("--method", choices=("auto", "bab-relu", "bab-input", "crown", "alpha-crown", "ibp"), default="auto",
                   help="auto (the default): bab-input for inputs of at most 16 entries or no unstable ReLU, "
                        "else bab-relu; bab-relu: branch and bound over unstable ReLUs (batched CROWN); bab-input, "
                        "crown, alpha-crown, ibp: input splitting with that bound (bab-input uses CROWN)")
    p.add_argument("--timeout", type=float, default=60.0, metavar="S",
                   help="seconds for bounding, splitting and the counterexample search (default 60)")
    p.add_argument("--seed", type=int, default=0, help="seed of the counterexample search")
    add_json_argument(p, "one object (result, time_s, method, bounds, counterexample, domains_visited, "
                         "best_lower_bound, ...)")
    from ..campaign.options import add_engine_arguments
    p.add_argument("--instances", metavar="instances.csv",
                   help="campaign: VNN-COMP instance rows (onnx,vnnlib,timeout; paths relative to the file; .gz "
                        "accepted) instead of MODEL PROP; see docs/campaigns.md")
    p.add_argument("--results", metavar="results.csv",
                   help="campaign: VNN-COMP result rows, appended as each instance finishes")
    p.add_argument("--resume", action=argparse.BooleanOptionalAction, default=None,
                   help="campaign: skip the instances already in --results (the default when it exists)")
    add_engine_arguments(p)


def run(args: argparse.Namespace) -> int:
    from ..verify import verify_files
    if not math.isfinite(args.timeout) or args.timeout <= 0:
        raise BridgeError(f"verify: --timeout must be a positive number of seconds, got {args.timeout}")
    if args.seed < 0:
        raise BridgeError(f"verify: --seed must be a whole number >= 0, got {args.seed}")
    if args.instances is not None or args.model is None or args.property is None:
        from ..campaign.verify_campaign import run_from_args
        return run_from_args(args)
    from .common import phases
    with phases(f"verify ({args.method})", args.quiet) as step:
        step(f"bounding and searching, at most {args.timeout:g} s")
        result = verify_files(args.model, args.property, method=args.method, timeout=args.timeout, seed=args.seed)
    emit_json(result.to_json(), args.json)
    if human_output(args):
        print(result)
    return 0
