"""``torchlean-bridge show``: the text listing, DOT, a rendered SVG/PNG through Graphviz, or an
interactive self-contained HTML page."""

from __future__ import annotations

import argparse
import shutil
import subprocess

from ...errors import BridgeError
from ...fileio import atomic_write_bytes
from ...pretty import listing, to_dot
from ..output import add_json_argument, emit_json
from .common import read_bundle

HELP = "print the node listing, or GraphViz DOT / SVG / PNG, or an interactive HTML page"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", metavar="BUNDLE_OR_GRAPH")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--dot", action="store_true", help="print GraphViz DOT instead of the listing")
    fmt.add_argument("--svg", metavar="FILE", help="render to SVG with Graphviz `dot`")
    fmt.add_argument("--png", metavar="FILE", help="render to PNG with Graphviz `dot`")
    fmt.add_argument("--html", metavar="FILE.html",
                     help="one self-contained HTML page: the graph drawn (pan, zoom), node details on click")
    add_json_argument(fmt, "the torchlean.ir.v1 graph document (nodes, no tensors)")


def render(dot_text: str, fmt: str, out: str) -> None:
    exe = shutil.which("dot")
    if exe is None:
        raise BridgeError("Graphviz `dot` is not installed (apt-get install graphviz); "
                          "use --dot to print the DOT text instead")
    proc = subprocess.run([exe, f"-T{fmt}"], input=dot_text.encode(), capture_output=True)
    if proc.returncode != 0:
        raise BridgeError(f"Graphviz failed: {proc.stderr.decode(errors='replace').strip()}")
    atomic_write_bytes(out, proc.stdout)


def run(args: argparse.Namespace) -> int:
    if args.html:
        from ..html_report import check_target
        check_target(args.html, "show: --html")
    bundle = read_bundle(args.path)
    g = bundle.graph
    if args.html:
        from ..html_report import write_page
        write_page(args.html, bundle, title=f"torchlean-bridge show {args.path}")
        print(f"wrote {args.html}")
    elif args.json:
        from ...wire import dump_graph
        emit_json(dump_graph(g), args.json)
        if args.json != "-":
            print(f"wrote {args.json}")
    elif args.dot:
        print(to_dot(g), end="")
    elif args.svg or args.png:
        out = args.svg or args.png
        render(to_dot(g), "svg" if args.svg else "png", out)
        print(f"wrote {out}")
    else:
        print(listing(g))
    return 0
