"""``torchlean-bridge verify``: decide a VNN-LIB property on a network (unsat / sat / unknown)."""

from __future__ import annotations

import argparse
import json
import math

from ...errors import BridgeError

HELP = "prove a VNN-LIB property (unsat), find a re-checked counterexample (sat), or say unknown"
DESCRIPTION = (HELP + ". unsat: sound linear (CROWN) or interval bounds refute the property on the whole input "
               "box (with input splitting, or branch and bound over unstable ReLUs: --method bab-relu); sat: a counterexample that reproduces in float64 and float32 evaluation "
               "and in onnxruntime. Exit status 0 for every answer, 2 for bad input.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL.onnx|BUNDLE", help="an ONNX model or a bundle folder")
    p.add_argument("property", metavar="PROP.vnnlib", help="the property in VNN-LIB (VNN-COMP subset)")
    p.add_argument("--method", choices=("auto", "bab-relu", "bab-input", "crown", "alpha-crown", "ibp"), default="auto",
                   help="auto (the default): bab-input for inputs of at most 16 entries or no unstable ReLU, "
                        "else bab-relu; bab-relu: branch and bound over unstable ReLUs (batched CROWN); bab-input, "
                        "crown, alpha-crown, ibp: input splitting with that bound (bab-input uses CROWN)")
    p.add_argument("--timeout", type=float, default=60.0, metavar="S",
                   help="seconds for bounding, splitting and the counterexample search (default 60)")
    p.add_argument("--seed", type=int, default=0, help="seed of the counterexample search")
    p.add_argument("--json", action="store_true", help="print one JSON object (result, time_s, counterexample, domains_visited, "
                        "best_lower_bound, ...)")


def run(args: argparse.Namespace) -> int:
    from ..verify import verify_files
    if not math.isfinite(args.timeout) or args.timeout <= 0:
        raise BridgeError(f"verify: --timeout must be a positive number of seconds, got {args.timeout}")
    result = verify_files(args.model, args.property, method=args.method, timeout=args.timeout, seed=args.seed)
    if args.json:
        print(json.dumps(result.to_json(), allow_nan=False))
    else:
        print(result)
    return 0
