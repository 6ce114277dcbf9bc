"""``torchlean-bridge plan``: TorchLean's kernel plan for a bundle (metadata only), optionally saved
beside it or executed against the reference node by node."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..kernel_plan import DEVICES, PROVIDERS, KernelPolicy, plan_kernels, save_plan
from ..output import add_json_argument, diff_text, emit_json, human_output
from .common import read_bundle

HELP = "plan a kernel capsule per runtime node (TorchLean's GraphKernelPlan) and report each capsule's states"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", metavar="BUNDLE", help="bundle folder or torchlean.ir.v1 JSON file")
    p.add_argument("--prefer", metavar="PROVIDER", help=f"provider searched first ({', '.join(PROVIDERS)})")
    p.add_argument("--only", action="store_true", help="admit no provider but the preferred one")
    p.add_argument("--device", default="cpu", metavar="D", help=f"target device (default cpu; {', '.join(DEVICES)})")
    add_json_argument(p, "the plan (with --diff, the comparison under `diff`)")
    p.add_argument("--save", action="store_true", help="write the plan beside the bundle (BUNDLE/kernel_plan.json)")
    p.add_argument("-o", "--output", metavar="FILE", help="write the plan to FILE")
    p.add_argument("--diff", action="store_true",
                   help="execute the plan and compare it with the reference node by node (exit 1 on divergence)")
    p.add_argument("--random", type=int, default=4, metavar="N", help="input sets for --diff (default 4)")


def run(args: argparse.Namespace) -> int:
    from ...errors import BridgeError
    bundle = read_bundle(args.path)
    plan = plan_kernels(bundle.graph, KernelPolicy(device=args.device, prefer=args.prefer, only=args.only))
    if args.save:
        if not Path(args.path).is_dir():
            raise BridgeError(f"--save needs a bundle folder; {args.path} is a file (use -o FILE)")
        save_plan(plan, Path(args.path))
    if args.output:
        save_plan(plan, Path(args.output))
    if human_output(args):
        policy = plan.policy
        print(f"kernel plan: device {policy.device}, provider {policy.preference}; this build has "
              f"{', '.join(policy.providers)} on {', '.join(policy.devices)}")
        print(plan)
        print(plan.table())
        if not plan.kernels:
            print("(no node needs runtime work)")
    if not args.diff:
        emit_json(plan.to_json(), args.json)
        return 0
    from ..diff import diff
    if args.random < 1:
        raise BridgeError(f"--random must be at least 1, got {args.random}")
    report = diff(bundle, against="plan", plan=plan, random=args.random)
    emit_json({**plan.to_json(), "diff": report.to_json()}, args.json)
    if human_output(args):
        print(diff_text(report, all_nodes=True))
    return 0 if report.ok else 1
