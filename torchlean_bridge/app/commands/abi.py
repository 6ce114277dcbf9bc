"""``torchlean-bridge abi``: the ordered parameter slots of a bundle, as a table."""

from __future__ import annotations

import argparse

from ..abi import abi, format_abi
from ..output import add_json_argument, emit_json, human_output
from .common import read_bundle

HELP = "print the parameter ABI: ordered slots (node, op, role, shape, dtype, key) and totals"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", metavar="BUNDLE", help="bundle folder or torchlean.ir.v1 JSON file")
    add_json_argument(p, "the slots and totals")
    p.add_argument("--summary", action="store_true", help="print the GraphSpec view: params and state per layer")


def run(args: argparse.Namespace) -> int:
    if args.summary:
        from ..summary import summary
        print(summary(read_bundle(args.path)))
        return 0
    slots = abi(read_bundle(args.path))
    emit_json(slots.to_json(), args.json)
    if human_output(args):
        print(format_abi(slots))
    return 0
