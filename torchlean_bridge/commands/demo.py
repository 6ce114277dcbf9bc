"""``torchlean-bridge demo``: the whole story on the seed chapter's built-in models."""

from __future__ import annotations

import argparse

from ..check import check, infer_shapes
from ..pretty import listing
from ..seed import seed_mlp_bundle

HELP = "run the end-to-end story on the built-in seed models"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--output", default="tlb-demo", help="folder for the demo's artefacts (default: tlb-demo)")
    p.add_argument("--quiet", action="store_true", help="no progress display")


def run(args: argparse.Namespace) -> int:
    b = seed_mlp_bundle()
    print("== the seed MLP as TorchLean IR ==")
    print(listing(b.graph))
    check(b.graph)
    print("check: well formed and well shaped; inferred shapes",
          [list(s) for s in infer_shapes(b.graph)])
    return 0
