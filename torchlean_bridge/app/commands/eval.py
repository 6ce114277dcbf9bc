"""``torchlean-bridge eval``: evaluate a bundle on .npy inputs and print the value table."""

from __future__ import annotations

import argparse

import numpy as np

from ...errors import BridgeError
from ..output import (add_json_argument, add_view_arguments, emit_json, human_output, shown_nodes, stats,
                      value_text, values_table)
from .common import read_array, read_bundle

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
    add_view_arguments(p)
    add_json_argument(p, "every shown node's value")
    p.add_argument("--at", metavar="NODE", help="show NODE's value (an id, or `embeddings`: the node "
                                               "`export --input-at embeddings` cuts at)")
    p.add_argument("--save", metavar="FILE.npy", help="with --at: write NODE's value to FILE.npy (the input of a "
                                                      "graph cut there)")
    p.add_argument("--plan", metavar="PLAN", help="run each node with its provider in a saved kernel plan "
                                                  "(a plan file, or a bundle folder holding kernel_plan.json)")


def run(args: argparse.Namespace) -> int:
    from semantics.evaluate import evaluate
    bundle = read_bundle(args.path)
    g = bundle.graph
    if args.save and not args.at:
        raise BridgeError("eval: --save needs --at NODE")
    at = None
    if args.at is not None:
        from ..torchlean_export import resolve_node
        at = resolve_node(bundle, args.at)
        args.node = list(args.node or []) + [at]
    ids = shown_nodes(g, args)
    every = args.all_nodes or bool(args.node)
    inputs = [read_array(f) for f in args.input]
    if args.exact and (args.plan or args.dtype != "float64"):
        raise BridgeError("eval: --exact is the float64 reference evaluator's mode (no --plan, no --dtype float32)")
    if args.plan:  # see `torchlean-bridge plan --save`
        from ..kernel_plan import load_plan
        from ..plan_exec import execute_plan
        values = execute_plan(g, bundle.payload, inputs, load_plan(args.plan, g), dtype=args.dtype,
                              all_nodes=every)
    else:
        values = evaluate(g, bundle.payload, inputs, dtype=args.dtype, all_nodes=every, exact=args.exact)
    table = values if every else dict(zip(g.outputs, values))
    if args.save:
        from ...fileio import staged_outputs
        with staged_outputs() as stage:
            stage(args.save, lambda f: np.save(f, np.asarray(table[at]), allow_pickle=False))
    emit_json({"dtype": args.dtype, "exact": args.exact,
               "nodes": [{"id": i, "kind": g[i].kind, "shape": list(g[i].out_shape), "element_type": g[i].dtype,
                          "stats": stats(table[i]).to_json(), "value": table[i]} for i in ids]}, args.json)
    if human_output(args):
        if args.all_nodes and not args.full and not args.node:
            print(values_table(g, table, ids))
        else:
            print("\n".join(value_text(g, i, table[i], args.full) for i in ids))
    return 0
