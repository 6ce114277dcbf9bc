"""``torchlean-bridge eval``: evaluate a bundle on .npy inputs and print the value table."""

from __future__ import annotations

import argparse
import json

import numpy as np

from ...errors import BridgeError
from ...report import jsonable
from .common import format_vector, read_array, read_bundle

HELP = "evaluate a bundle on .npy inputs (float64 reference or float32) and print node values"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", metavar="BUNDLE", help="bundle folder or torchlean.ir.v1 file with inline payload")
    p.add_argument("--input", metavar="FILE.npy", action="append", default=[], required=True,
                   help="one .npy per graph input, in graph-input order (repeat the option)")
    p.add_argument("--dtype", choices=("float64", "float32"), default="float64",
                   help="evaluation domain: float64 (TorchLean's binary64, default) or float32")
    p.add_argument("--exact", action="store_true",
                   help="the exact float64 mode: TorchLean's accumulation orders and C libm, bit-identical to "
                        "TorchLean's Graph.denoteAll at Float on the v1 kinds (float64 only)")
    p.add_argument("--all-nodes", action="store_true", help="print every node's value, not just the outputs")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--at", metavar="NODE", help="also report NODE's value (an id, or `embeddings`: the node "
                                               "`export --input-at embeddings` cuts at)")
    p.add_argument("--save", metavar="FILE.npy", help="with --at: write NODE's value to FILE.npy (the input of a "
                                                      "graph cut there)")
    p.add_argument("--plan", metavar="PLAN", help="run each node with its provider in a saved kernel plan "
                                                  "(a plan file, or a bundle folder holding kernel_plan.json)")


def format_value(a: np.ndarray) -> str:
    """The seed's table format for floats; integers and booleans printed exactly."""
    if a.dtype.kind == "f":
        return format_vector(a)
    items = [str(int(v)) for v in a.reshape(-1)]
    return items[0] if a.ndim == 0 else "[" + ", ".join(items) + "]"


def run(args: argparse.Namespace) -> int:
    from semantics.evaluate import evaluate
    bundle = read_bundle(args.path)
    g = bundle.graph
    inputs = [read_array(f) for f in args.input]
    if args.save and not args.at:
        raise BridgeError("eval: --save needs --at NODE")
    at = None
    if args.at is not None:
        from ..torchlean_export import resolve_node
        at = resolve_node(bundle, args.at)
        args.all_nodes = args.all_nodes or at not in g.outputs
    if args.exact and (args.plan or args.dtype != "float64"):
        raise BridgeError("eval: --exact is the float64 reference evaluator's mode (no --plan, no --dtype float32)")
    if args.plan:  # see `torchlean-bridge plan --save`
        from ..kernel_plan import load_plan
        from ..plan_exec import execute_plan
        values = execute_plan(g, bundle.payload, inputs, load_plan(args.plan, g), dtype=args.dtype,
                              all_nodes=args.all_nodes)
    else:
        values = evaluate(g, bundle.payload, inputs, dtype=args.dtype, all_nodes=args.all_nodes, exact=args.exact)
    table = values if args.all_nodes else dict(zip(g.outputs, values))
    ids = [at] if at is not None else (list(range(len(g))) if args.all_nodes else list(g.outputs))
    if args.save:
        from ...fileio import staged_outputs
        with staged_outputs() as stage:
            stage(args.save, lambda f: np.save(f, np.asarray(table[at]), allow_pickle=False))
    if args.json:
        doc = {"dtype": args.dtype, "exact": args.exact,
               "nodes": [{"id": i, "kind": g[i].kind, "shape": list(g[i].out_shape), "element_type": g[i].dtype,
                          "value": jsonable(table[i])} for i in ids]}
        print(json.dumps(doc, allow_nan=False))
    else:
        for i in ids:
            print(f"node {i}: {format_value(table[i])}")
    return 0
