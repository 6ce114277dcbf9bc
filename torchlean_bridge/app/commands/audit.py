"""``torchlean-bridge audit``: bind a checkpoint to a bundle and look for tensors in the wrong role."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from ...errors import BridgeError
from ..output import add_json_argument, emit_json, human_output
from .common import MAX_SAMPLES, bounded_int, read_array, read_bundle

HELP = "bind a checkpoint and audit its key->role mapping (exit 0 clean, 1 any finding that is an error)"
DESCRIPTION = (HELP + ". With --reference, the bound graph is compared with the trusted module on the given "
               "inputs plus a zero input and seeded random ones; when they disagree, swaps of same-shaped "
               "tensors and transposes of square matrices are searched and the one restoring agreement is named. "
               "With trusted weights (--reference), every checkpoint tensor is first compared with the trusted "
               "one by exact hash, and each difference is named as a transformation: block exchange, layer "
               "shift, swap or cycle, transpose, Q/K/V or per-head reordering, float16/bfloat16 rounding, "
               "scale, or different values. With --golden only, structured hypotheses (block exchanges, layer "
               "shifts, including one that dropped the last layer, Q/K/V and per-head orders of fused and separate "
               "projections, rotary permutes, head exchanges, transposes) are evaluated first, within "
               "--max-hypotheses and --time-limit; see docs/cli.md, 'What the audit names'.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("bundle", metavar="BUNDLE", help="bundle folder or torchlean.ir.v1 JSON file")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--checkpoint", metavar="FILE|FOLDER",
                       help=".safetensors, .pt/.pth (weights-only), .onnx (its initializers), TorchLean .json, a "
                            "shard index or a checkpoint folder")
    which.add_argument("--checkpoints", metavar="GLOB|LIST",
                       help="campaign: audit every checkpoint a glob matches (quote it) or a list file names (one "
                            "path a line), one row each; see docs/campaigns.md")
    p.add_argument("--reference", metavar="FILE.py:FACTORY|CHECKPOINT",
                   help="the trusted weights: a zero-argument factory returning the nn.Module holding them, or a "
                        "checkpoint file (.safetensors, .pt/.pth weights-only, .onnx, TorchLean .json)")
    p.add_argument("--golden", action="append", default=[], metavar="FILE.npy",
                   help="trusted outputs for the --input arrays, one per graph output (instead of --reference)")
    p.add_argument("--input", action="append", default=[], metavar="FILE.npy",
                   help="one array per graph input, in order (repeat the option)")
    p.add_argument("--samples", type=int, default=5, help="generated input sets with --reference (default 5)")
    p.add_argument("--seed", type=int, default=0, help="seed of the generated inputs (default 0)")
    p.add_argument("--tolerance", type=float, default=1e-6,
                   help="agreement: max |ours - reference| <= tolerance * max(1, max |reference|); the default "
                        "1e-6 suits --reference (run in float64); float32 --golden outputs need about 1e-5")
    p.add_argument("--max-hypotheses", type=int, default=2000, metavar="N",
                   help="without trusted weights: structured hypotheses (block exchanges, layer shifts, Q/K/V "
                        "orders, transposes) tried at most (default 2000)")
    p.add_argument("--time-limit", type=float, default=60.0, metavar="S",
                   help="without trusted weights: seconds the search (structured hypotheses, then single "
                        "exchanges) may take (default 60)")
    p.add_argument("--no-strict", action="store_true", help="missing and unexpected keys are warnings, not errors")
    p.add_argument("--keep-prefix", action="store_true", help="do not strip a leading `module.` from keys")
    add_json_argument(p, "the audit report")
    from ..campaign.options import add_engine_arguments
    add_engine_arguments(p)


def run(args: argparse.Namespace) -> int:
    from importers.checkpoints import load_checkpoint

    from ..audit import audit
    bounded_int(args.samples, "audit: --samples", 0, MAX_SAMPLES)
    bounded_int(args.seed, "audit: --seed")
    if not math.isfinite(args.tolerance) or args.tolerance < 0:
        raise BridgeError(f"audit: --tolerance must be a finite number >= 0, got {args.tolerance}")
    bounded_int(args.max_hypotheses, "audit: --max-hypotheses", 0, 10_000_000)
    if not math.isfinite(args.time_limit) or args.time_limit < 0:
        raise BridgeError(f"audit: --time-limit must be a finite number of seconds >= 0, got {args.time_limit}")
    if args.checkpoints is not None:
        from ..campaign.audit_campaign import run_from_args
        return run_from_args(args)
    bundle = read_bundle(args.bundle)
    ckpt = load_checkpoint(args.checkpoint, strip_prefix=None if args.keep_prefix else "module.")
    if args.reference and args.golden:
        raise BridgeError("audit: give --reference or --golden, not both")
    reference = [read_array(p) for p in args.golden] or None
    if args.reference:
        reference = _reference(args.reference, None if args.keep_prefix else "module.")
    inputs = [read_array(p) for p in args.input] or None
    from .common import phases
    with phases(f"auditing {args.checkpoint}", args.quiet) as step:
        step("binding, comparing, searching swaps")
        report = audit(bundle, ckpt, reference=reference, inputs=inputs, tolerance=args.tolerance,
                       samples=args.samples, seed=args.seed, strict=not args.no_strict,
                       max_hypotheses=args.max_hypotheses, time_limit=args.time_limit)
    emit_json(report.to_json(), args.json)
    if human_output(args):
        print(report)
    return 0 if report.ok else 1


def _reference(spec: str, strip_prefix: str | None) -> object:
    """``file.py:factory`` -> the module it returns; any other existing file -> a checkpoint."""
    from .common import load_factory
    path = Path(spec)
    if path.suffix != ".py" and (path.is_file() or path.is_dir()):
        from importers.checkpoints import load_checkpoint
        return load_checkpoint(path, strip_prefix=strip_prefix)
    if ".py:" not in spec:
        raise BridgeError(f"audit: --reference: no such checkpoint file: {spec} (or give path/to/file.py:factory)")
    return load_factory(spec, "--reference")
