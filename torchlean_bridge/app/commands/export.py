"""``torchlean-bridge export``: write a bundle as ONNX or as one torchlean.ir.v1 document."""

from __future__ import annotations

import argparse
import sys

from ...errors import BridgeError
from ..output import add_json_argument, emit_json
from .common import read_array, read_bundle

HELP = "export a bundle to ONNX or to TorchLean's torchlean.ir.v1 JSON"
DESCRIPTION = ("Export a bundle. --to onnx writes an ONNX model (opset 21) whose initializers carry the role-map "
               "names. --to torchlean writes a torchlean.ir.v1 document; its payload goes to "
               "FILE's NAME.payload.safetensors unless --inline-payload puts it inside the document, which is "
               "the form TorchLean's importer reads. Ext ops are rewritten to their exact v1 forms and every "
               "rewrite is reported with its deviation class and the largest deviation measured on sample inputs "
               "(--sample, or two standard-normal samples); constant subgraphs (masks, index tables) are folded. "
               "Token models: --input-at embeddings (or a node id) makes that node's value the input "
               "(`eval --at NODE --save FILE.npy` computes it). What has no exact form (GELU with erf, several "
               "inputs, int64/bool values) is refused with every blocking node listed and the option that would "
               "export it (exit 1).")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", metavar="BUNDLE", help="bundle folder or torchlean.ir.v1 file")
    p.add_argument("--to", choices=("onnx", "torchlean"), required=True, help="output format")
    p.add_argument("-o", "--output", metavar="FILE", required=True, help="file to write (atomically)")
    p.add_argument("--inline-payload", action="store_true",
                   help="torchlean: put the payload inside the document (TorchLean's importer form)")
    p.add_argument("--input-at", metavar="NODE", help="torchlean: cut the graph so that NODE's value (an id, or "
                                                     "`embeddings` for the token embeddings) is the input")
    p.add_argument("--constant-input", metavar="ID=FILE.npy", action="append", default=[],
                   help="torchlean: graph input ID becomes a constant holding FILE.npy (repeat)")
    p.add_argument("--approximate", metavar="KIND=NAME", action="append", default=[],
                   help="torchlean: export KIND with the named approximation and state its deviation "
                        "(gelu=tanh, gelu=sigmoid)")
    p.add_argument("--sample", metavar="FILE.npy", action="append", default=[],
                   help="torchlean: one sample input per graph input (in order) to measure the rewrites' deviations on")
    add_json_argument(p, "what was written, with the torchlean report (or, exit 1, what blocks the export)")


def run(args: argparse.Namespace) -> int:
    from torchlean_bridge.errors import ExportError
    bundle = read_bundle(args.path)
    try:
        if args.to == "onnx":
            from exporters.onnx import export_onnx
            model = export_onnx(bundle, args.output)
            doc = {"ok": True, "output": args.output, "format": "onnx", "opset": model.opset_import[0].version,
                   "nodes": len(model.graph.node), "initializers": len(model.graph.initializer)}
            print(f"wrote {args.output}: ONNX opset {doc['opset']}, {doc['nodes']} nodes, {doc['initializers']} "
                  f"initializers")
        else:
            from exporters.torchlean_json import payload_file_for
            from ..torchlean_export import export_for_torchlean
            report = export_for_torchlean(bundle, args.output, inline_payload=args.inline_payload,
                                          input_at=args.input_at, constants=_constants(args.constant_input),
                                          approximate=_approximations(args.approximate),
                                          samples=[[read_array(f) for f in args.sample]] if args.sample else None)
            where = "inline" if args.inline_payload else str(payload_file_for(args.output))
            doc = {"ok": True, "output": args.output, "format": "torchlean.ir.v1",
                   "nodes": len(report.document["nodes"]), "payload": where,
                   "rewrites": report.document.get("torchlean_bridge", {}).get("rewrites", []),
                   **report.annotations()}
            print(f"wrote {args.output}: torchlean.ir.v1, {doc['nodes']} nodes, payload {where}")
            for line in report.lines():
                print(line)
    except ExportError as e:
        emit_json({"ok": False, "output": args.output, "format": args.to, "error": str(e)}, args.json)
        print(f"error: {e}", file=sys.stderr)
        return 1
    emit_json(doc, args.json)
    return 0


def _pairs(items: list[str], flag: str) -> list[tuple[str, str]]:
    pairs = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            raise BridgeError(f"{flag} {item!r}: expected {'ID=FILE.npy' if flag == '--constant-input' else 'KIND=NAME'}")
        pairs.append((key, value))
    return pairs


def _constants(items: list[str]) -> dict[int, object]:
    out = {}
    for key, path in _pairs(items, "--constant-input"):
        if not key.isdigit():
            raise BridgeError(f"--constant-input {key}={path}: ID must be a graph input's node id")
        out[int(key)] = read_array(path)
    return out


def _approximations(items: list[str]) -> dict[str, str]:
    from torchlean_bridge.passes.v1_forms import APPROXIMATIONS
    out = dict(_pairs(items, "--approximate"))
    for kind, name in out.items():
        if (kind, name) not in APPROXIMATIONS:
            known = ", ".join(f"{k}={n}" for k, n in APPROXIMATIONS)
            raise BridgeError(f"--approximate {kind}={name}: no such approximation (there are: {known})")
    return out
