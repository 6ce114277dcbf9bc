"""``torchlean-bridge export``: write a bundle as ONNX or as one torchlean.ir.v1 document."""

from __future__ import annotations

import argparse
import sys

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


def run(args: argparse.Namespace) -> int:
    from torchlean_bridge.errors import ExportError
    bundle = read_bundle(args.path)
    try:
        if args.to == "onnx":
            from exporters.onnx import export_onnx
            model = export_onnx(bundle, args.output)
            print(f"wrote {args.output}: ONNX opset {model.opset_import[0].version}, {len(model.graph.node)} nodes, "
                  f"{len(model.graph.initializer)} initializers")
        else:
            from exporters.torchlean_json import export_torchlean, payload_file_for
            doc = export_torchlean(bundle, args.output, inline_payload=args.inline_payload)
            where = "inline" if args.inline_payload else str(payload_file_for(args.output))
            print(f"wrote {args.output}: torchlean.ir.v1, {len(doc['nodes'])} nodes, payload {where}")
    except ExportError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0
