"""``torchlean-bridge audit``: bind a checkpoint to a bundle and look for tensors in the wrong role."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from ...errors import BridgeError
from ...fileio import atomic_write_text
from .common import MAX_SAMPLES, bounded_int, read_array, read_bundle

HELP = "bind a checkpoint and audit its key->role mapping (exit 0 clean, 1 any finding that is an error)"
DESCRIPTION = (HELP + ". With --reference, the bound graph is compared with the trusted module on the given "
               "inputs plus a zero input and seeded random ones; when they disagree, swaps of same-shaped "
               "tensors and transposes of square matrices are searched and the one restoring agreement is named.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("bundle", metavar="BUNDLE", help="bundle folder or torchlean.ir.v1 JSON file")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--checkpoint", metavar="FILE",
                       help=".safetensors, .pt/.pth (weights-only), .onnx (its initializers) or TorchLean .json")
    which.add_argument("--checkpoints", metavar="GLOB|LIST",
                       help="campaign: audit every checkpoint a glob matches (quote it) or a list file names (one "
                            "path a line), one row each; see docs/campaigns.md")
    p.add_argument("--reference", metavar="FILE.py:FACTORY",
                   help="zero-argument factory returning the nn.Module with the trusted weights")
    p.add_argument("--golden", action="append", default=[], metavar="FILE.npy",
                   help="trusted outputs for the --input arrays, one per graph output (instead of --reference)")
    p.add_argument("--input", action="append", default=[], metavar="FILE.npy",
                   help="one array per graph input, in order (repeat the option)")
    p.add_argument("--samples", type=int, default=5, help="generated input sets with --reference (default 5)")
    p.add_argument("--seed", type=int, default=0, help="seed of the generated inputs (default 0)")
    p.add_argument("--tolerance", type=float, default=1e-6,
                   help="agreement: max |ours - reference| <= tolerance * max(1, max |reference|); the default "
                        "1e-6 suits --reference (run in float64); float32 --golden outputs need about 1e-5")
    p.add_argument("--no-strict", action="store_true", help="missing and unexpected keys are warnings, not errors")
    p.add_argument("--keep-prefix", action="store_true", help="do not strip a leading `module.` from keys")
    p.add_argument("--json", nargs="?", const="-", metavar="REPORT.json",
                   help="print the report as JSON (or write it to REPORT.json)")
    from ..campaign.options import add_engine_arguments
    add_engine_arguments(p)


def run(args: argparse.Namespace) -> int:
    from importers.checkpoints import load_checkpoint

    from ..audit import audit
    bounded_int(args.samples, "audit: --samples", 0, MAX_SAMPLES)
    bounded_int(args.seed, "audit: --seed")
    if not math.isfinite(args.tolerance) or args.tolerance < 0:
        raise BridgeError(f"audit: --tolerance must be a finite number >= 0, got {args.tolerance}")
    if args.checkpoints is not None:
        from ..campaign.audit_campaign import run_from_args
        return run_from_args(args)
    bundle = read_bundle(args.bundle)
    ckpt = load_checkpoint(args.checkpoint, strip_prefix=None if args.keep_prefix else "module.")
    if args.reference and args.golden:
        raise BridgeError("audit: give --reference or --golden, not both")
    reference = [read_array(p) for p in args.golden] or None
    if args.reference:
        from .common import load_factory
        reference = load_factory(args.reference, "--reference")
    inputs = [read_array(p) for p in args.input] or None
    report = audit(bundle, ckpt, reference=reference, inputs=inputs, tolerance=args.tolerance,
                   samples=args.samples, seed=args.seed, strict=not args.no_strict)
    if args.json == "-":
        print(json.dumps(report.to_json(), indent=1))
    else:
        print(report)
        if args.json:
            atomic_write_text(Path(args.json), json.dumps(report.to_json(), indent=1) + "\n")
    return 0 if report.ok else 1
