"""``torchlean-bridge check``: validate a bundle or graph document."""

from __future__ import annotations

import argparse

from ...check import check
from ...payload import payload_errors
from ...errors import WireError
from ..output import add_json_argument, emit_json
from .common import read_bundle, sniff_document

HELP = "validate structure and shapes (exit 0 valid, 1 invalid)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", metavar="BUNDLE_OR_GRAPH", help="bundle folder or torchlean.ir.v1 JSON file")
    p.add_argument("--all", action="store_true", help="list every problem, not just the first")
    add_json_argument(p, "the verdict and every problem")


def _parses_as_json(path: str) -> bool:
    """Whether ``path`` is a file holding readable JSON: its structural problems then make an invalid
    graph (exit 1), while a file that is no JSON document at all is bad input (exit 2)."""
    import json
    import os
    from ...fileio import read_capped
    if not os.path.isfile(path):
        return False
    sniff_document(path)
    try:
        json.loads(read_capped(path, "graph document"))
    except (ValueError, RecursionError):
        return False
    return True


def run(args: argparse.Namespace) -> int:
    document = _parses_as_json(args.path)
    try:
        bundle = read_bundle(args.path)
    except WireError as e:
        if not document:
            raise
        emit_json({"ok": False, "nodes": None, "inputs": None, "outputs": None, "errors": [str(e)]}, args.json)
        print(str(e))
        return 1
    g = bundle.graph
    errors = check(g, collect=True)
    if not errors and len(bundle.payload):
        errors = payload_errors(g, bundle.payload)
    emit_json({"ok": not errors, "nodes": len(g), "inputs": list(g.inputs), "outputs": list(g.outputs),
               "errors": [str(e) for e in errors]}, args.json)
    if not errors:
        print(f"accepted: nodes={len(g)}, inputs={list(g.inputs)}, outputs={list(g.outputs)}")
        return 0
    for e in errors if args.all else errors[:1]:
        print(str(e))
    if not args.all and len(errors) > 1:
        print(f"({len(errors) - 1} more problem(s); use --all to list them)")
    return 1
