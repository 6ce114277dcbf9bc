"""``torchlean-bridge init``: a bundle with deterministically initialized parameters."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from ...bundle import Bundle
from ...seeded_init import SCHEMES, init_params
from ..output import add_json_argument, emit_json
from .common import format_vector, in_cli_words, read_bundle, refuse_existing

HELP = "write a copy of a bundle whose parameters are initialized deterministically (TorchLean's seeded init)"
_PRINT_LIMIT = 64  # tensors up to this many elements are printed in full


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", metavar="BUNDLE", help="bundle folder or torchlean.ir.v1 JSON file")
    p.add_argument("-o", "--output", required=True, metavar="FOLDER", help="bundle folder to write")
    p.add_argument("--force", action="store_true", help="replace FOLDER if it exists (a bundle folder only)")
    p.add_argument("--scheme", choices=SCHEMES, default="torchlean",
                   help="torchlean (splitmix64-seeded Xavier-uniform weights, zero biases; default) or zeros")
    p.add_argument("--seed", type=int, default=0, metavar="N", help="base seed added to each layer's index (default 0)")
    add_json_argument(p, "what was written (scheme, seed, every initialized tensor's node, role and shape)")


def format_tensor(a: np.ndarray) -> str:
    """Nested rows in the chapter's six-decimal format: ``[[-0.435614, 0.404103], ...]``."""
    if a.ndim <= 1:
        return format_vector(a) if a.ndim else format_vector(a.reshape(1))
    return "[" + ", ".join(format_tensor(row) for row in a) + "]"


def run(args: argparse.Namespace) -> int:
    from exporters.folder import save
    refuse_existing(args.output, args.force)
    bundle = read_bundle(args.path)
    with in_cli_words():
        payload = init_params(bundle, scheme=args.scheme, seed=args.seed)
    report = dict(bundle.report)
    report["initialized"] = {"scheme": args.scheme, "seed": args.seed}
    out = save(Bundle(bundle.graph, payload, bundle.roles, report), Path(args.output))
    emit_json({"output": str(out), "scheme": args.scheme, "seed": args.seed, "parameters": payload.num_parameters(),
               "tensors": [{"node": nid, "kind": bundle.graph.nodes[nid].kind, "role": role, "shape": list(arr.shape)}
                           for nid, role, arr in payload.items()]}, args.json)
    print(f"{args.scheme} initialization (seed {args.seed}) of {payload.num_parameters()} parameters -> {out}")
    for nid, role, arr in payload.items():
        shown = format_tensor(arr) if arr.size <= _PRINT_LIMIT else "(not printed)"
        print(f"node {nid} {bundle.graph.nodes[nid].kind} `{role}` {list(arr.shape)}: {shown}")
    return 0
