"""``torchlean-bridge export``: write a bundle as ONNX or as one torchlean.ir.v1 document."""

from __future__ import annotations

import argparse
import sys

from ..output import add_json_argument, emit_json
from .common import read_bundle

HELP = "export a bundle to ONNX or to TorchLean's torchlean.ir.v1 JSON"
DESCRIPTION = ("Export a bundle. --to onnx writes an ONNX model (opset 21) whose initializers carry the role-map "
               "names. --to torchlean writes a torchlean.ir.v1 document; its payload goes to "
               "FILE's NAME.payload.safetensors unless --inline-payload puts it inside the document, which is "
               "the form TorchLean's importer reads. Ext ops without an exact v1 form, several inputs or "
               "int64/bool values are refused with every blocking node listed (exit 1).")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", metavar="BUNDLE", help="bundle folder or torchlean.ir.v1 file")
    p.add_argument("--to", choices=("onnx", "torchlean"), required=True, help="output format")
    p.add_argument("-o", "--output", metavar="FILE", required=True, help="file to write (atomically)")
    p.add_argument("--inline-payload", action="store_true",
                   help="torchlean: put the payload inside the document (TorchLean's importer form)")
    add_json_argument(p, "what was written (or, exit 1, what blocks the export)")


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
            from exporters.torchlean_json import export_torchlean, payload_file_for
            written = export_torchlean(bundle, args.output, inline_payload=args.inline_payload)
            where = "inline" if args.inline_payload else str(payload_file_for(args.output))
            doc = {"ok": True, "output": args.output, "format": "torchlean.ir.v1", "nodes": len(written["nodes"]),
                   "payload": where}
            print(f"wrote {args.output}: torchlean.ir.v1, {doc['nodes']} nodes, payload {where}")
    except ExportError as e:
        emit_json({"ok": False, "output": args.output, "format": args.to, "error": str(e)}, args.json)
        print(f"error: {e}", file=sys.stderr)
        return 1
    emit_json(doc, args.json)
    return 0
