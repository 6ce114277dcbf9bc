"""``torchlean-bridge bounds``: interval bounds of every node over an l-infinity ball, then a
sampled containment check (exit 1 on a counterexample)."""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any

import numpy as np

from ...errors import BridgeError, IntervalError
from ..output import (add_json_argument, add_view_arguments, box_stats, box_summary, box_text, boxes_table,
                      emit_json, format_shape, human_output, shown_nodes)
from .common import MAX_SAMPLES, bounded_int, phases, read_array, read_bundle

HELP = "interval bounds of every node over an l-inf ball around --center, checked by sampling"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", metavar="BUNDLE", help="bundle folder or torchlean.ir.v1 file with inline payload")
    p.add_argument("--center", metavar="FILE.npy", action="append", default=[], required=True,
                   help="center of the input box, one .npy per graph input in graph-input order (repeat)")
    p.add_argument("--radius", type=float, required=True,
                   help="l-inf radius added around every float input entry (int/bool inputs stay points)")
    p.add_argument("--samples", type=int, default=50,
                   help="sampled points for the containment check (corners, center, uniform); 0 skips it")
    p.add_argument("--seed", type=int, default=0, help="seed of the sample generator")
    p.add_argument("--method", choices=("ibp", "crown", "alpha-crown"), default="ibp",
                   help="ibp: interval propagation (default, fastest); crown / alpha-crown: linear bounds, every node's "
                        "box refined (tighter on wide layers, slower)")
    p.add_argument("--products", choices=("float32", "float64"),
                   help="precision of linear/conv products, both rigorously rounded (default float32 where its "
                        "rounding costs at most 2**-9 of a width; float64 is slower and tighter by about 1e-3)")
    add_view_arguments(p)
    p.add_argument("--plot", metavar="FILE.png", help="draw every node's box width (log scale) to FILE (.png, .svg, "
                                                     ".pdf; needs matplotlib: the `plot` extra)")
    p.add_argument("--report", metavar="FILE.html",
                   help="one self-contained HTML page: the graph drawn, every node colored by its box width "
                        "(log scale), box previews on click")
    add_json_argument(p, "every node's box (lo, hi, range and widths) and the containment check")


def _text(g, boxes, args: argparse.Namespace) -> str:
    """Per output its shape, box range and widths by default; a table with --all-nodes; boxes with --node/--full."""
    ids = shown_nodes(g, args)
    if args.all_nodes and not args.full and not args.node:
        return boxes_table(g, boxes, ids)
    if args.full or args.node:
        return "\n".join(box_text(g, i, *boxes[i], full=args.full) for i in ids)
    return "\n".join(f"output {k}: node {i} ({g[i].kind}) {format_shape(g[i].out_shape)}: "
                     f"{box_summary(box_stats(*boxes[i]))}" for k, i in enumerate(ids))


def _boxes(g: Any, payload: Any, lower: list[np.ndarray], upper: list[np.ndarray], method: str,
           products: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """Every node's box: interval propagation, or CROWN's refined boxes (each node bounded by linear
    relaxations of what feeds it, at least as tight as the intervals on the layers that matter)."""
    if method == "ibp":
        from semantics.interval import interval_bounds
        return interval_bounds(g, payload, lower, upper, products=products)
    from semantics.linear_bounds import linear_bounds
    return linear_bounds(g, payload, lower, upper, method=method, all_nodes=True).boxes


def run(args: argparse.Namespace) -> int:
    from semantics.domains import DEFAULT_PRODUCTS
    from semantics.sampling import check_containment
    if not math.isfinite(args.radius) or args.radius < 0:
        raise BridgeError(f"bounds: --radius must be a finite number >= 0, got {args.radius}")
    bounded_int(args.samples, "bounds: --samples", 0, MAX_SAMPLES)
    bounded_int(args.seed, "bounds: --seed")
    if args.plot:
        from ..plots import check_target
        check_target(args.plot)
    if args.report:
        from ..html_report import check_target as check_html
        check_html(args.report, "bounds: --report")
    bundle = read_bundle(args.path)
    g = bundle.graph
    centers = [read_array(f) for f in args.center]
    if len(centers) != len(g.inputs):
        raise BridgeError(f"bounds: the graph has {len(g.inputs)} input(s), got {len(centers)} --center file(s)")
    lower, upper = [], []
    for nid, c in zip(g.inputs, centers):
        if c.dtype.kind not in "fiub":
            raise BridgeError(f"bounds: center for input {nid} has element type {c.dtype}, expected numbers")
        r = args.radius if g[nid].dtype == "float" else 0.0
        c64 = c.astype(np.float64)
        lower.append(c64 - r)
        upper.append(c64 + r)
        if r:
            # c - r and c + r are rounded: widen so the box contains the exact real ball
            lower[-1], upper[-1] = np.nextafter(lower[-1], -np.inf), np.nextafter(upper[-1], np.inf)
    products = args.products or DEFAULT_PRODUCTS
    report, failure = None, None
    with phases("bounds", args.quiet) as step:
        step(f"{args.method} bounds of {len(g)} nodes")
        boxes = _boxes(g, bundle.payload, lower, upper, args.method, products)
        if args.samples:
            step(f"checking {args.samples} samples against every box")
            try:
                report = check_containment(g, bundle.payload, lower, upper, samples=args.samples, seed=args.seed,
                                           boxes=boxes)
            except IntervalError as e:
                failure = e
    emit_json({"radius": args.radius, "method": args.method, "products": products,
               "nodes": [{"id": n.id, "kind": n.kind, "shape": list(n.out_shape), **box_stats(*boxes[n.id]),
                          "lo": boxes[n.id][0], "hi": boxes[n.id][1]} for n in g],
               "containment": (report.to_json() if report else None) if failure is None
               else {"ok": False, "node": failure.node, "message": str(failure)}}, args.json)
    if args.plot:
        from ..plots import plot_widths
        plot_widths(g, boxes, args.plot, f"box width per node ({args.method}, l-inf radius {args.radius:g})")
    if args.report:
        from ..html_report import bounds_overlay, write_page
        write_page(args.report, bundle, bounds_overlay(
            boxes, f"bounds {args.path}: box width per node ({args.method}, l-inf radius {args.radius:g})"))
    if human_output(args):
        print(_text(g, boxes, args))
        if report is not None:
            print(report)
        if args.plot:
            print(f"wrote {args.plot}")
        if args.report:
            print(f"wrote {args.report}")
    if failure is not None:
        if human_output(args):
            print(f"counterexample: {failure}", file=sys.stderr)
        return 1
    return 0
