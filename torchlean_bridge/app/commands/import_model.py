"""``torchlean-bridge import``: a PyTorch factory or an ONNX file into a bundle folder."""

from __future__ import annotations

import argparse
import math
from typing import Any

from ...bundle import Bundle
from ...errors import BridgeError, CheckFailed
from ...ops.contracts import MAX_RANK
from ..output import add_json_argument, emit_json
from .common import in_cli_words, load_factory, phases, refuse_existing

HELP = "import a PyTorch model (file.py:factory) or an ONNX file into a bundle folder"
DESCRIPTION = (
    "Import a model into a bundle folder (graph.json, payload.safetensors, roles.json). SOURCE is model.onnx, "
    "or path/to/file.py:factory where factory() returns an nn.Module (put in eval mode here); it is captured "
    "with torch.export (--via export, the default) or torch.fx symbolic tracing (--via fx) on example inputs "
    "of the --input-shape shapes (one per input; a suffix :int64 or :bool gives integer token ids or masks). "
    "--checkpoint binds other weights through the role map. Prints nodes, parameters, ops used and the ext "
    "ops that block torchlean.ir.v1 export.")

DTYPES = ("float32", "float64", "int64", "bool")
MAX_EXAMPLE_ELEMENTS = 2 ** 26  # an example input is materialized to trace the model; shapes, not data, matter


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", metavar="SOURCE", help="model.onnx or path/to/file.py:factory")
    p.add_argument("-o", "--output", metavar="FOLDER", required=True, help="bundle folder to write")
    p.add_argument("--force", action="store_true", help="replace FOLDER if it exists (a bundle folder only)")
    p.add_argument("--via", choices=("export", "fx"), default="export",
                   help="PyTorch capture: torch.export (default) or torch.fx symbolic tracing")
    p.add_argument("--decompose", action="store_true", help="with --via export: lower core ATen "
                   "(run_decompositions) instead of the exported operators")
    p.add_argument("--input-shape", metavar="D0,D1,...[:DTYPE]", action="append", default=[],
                   help="shape of one example input (repeat per input); DTYPE is float32 (default), "
                        "float64, int64 or bool")
    p.add_argument("--checkpoint", metavar="FILE", help="bind these weights (safetensors / state_dict) instead")
    p.add_argument("--bind", metavar="NAME=FILE.npy", action="append", default=[],
                   help="ONNX: freeze graph input NAME to the array in FILE.npy (shapes, axes, pads, weights given "
                        "as inputs); what follows from it folds at import. Repeat per input")
    p.add_argument("--quiet", action="store_true", help="no progress display")
    add_json_argument(p, "what was imported (summary, notes, the checkpoint binding)")


def parse_input_shape(text: str) -> tuple[tuple[int, ...], str]:
    shape_text, _, dtype = text.partition(":")
    dtype = dtype or "float32"
    if dtype not in DTYPES:
        raise BridgeError(f"--input-shape {text!r}: element type must be one of {', '.join(DTYPES)}")
    try:
        shape = tuple(int(d) for d in shape_text.split(",") if d.strip() != "")
    except ValueError:
        raise BridgeError(f"--input-shape {text!r}: expected comma-separated integers such as 1,4") from None
    if any(d < 0 for d in shape):
        raise BridgeError(f"--input-shape {text!r}: extents must be >= 0")
    if len(shape) > MAX_RANK:
        raise BridgeError(f"--input-shape {text!r}: rank {len(shape)} is above the limit of {MAX_RANK}")
    if math.prod(shape) > MAX_EXAMPLE_ELEMENTS:
        raise BridgeError(f"--input-shape {text!r}: {math.prod(shape)} elements, above the limit of "
                          f"{MAX_EXAMPLE_ELEMENTS} for an example input")
    return shape, dtype


def example_inputs(specs: list[str]) -> tuple[Any, ...]:
    """Seeded example tensors: normal floats, zero token ids, all-true masks."""
    import torch
    gen = torch.Generator().manual_seed(0)
    out = []
    for spec in specs:
        shape, dtype = parse_input_shape(spec)
        if dtype in ("float32", "float64"):
            out.append(torch.randn(shape, generator=gen, dtype=getattr(torch, dtype)))
        elif dtype == "int64":
            out.append(torch.zeros(shape, dtype=torch.int64))
        else:
            out.append(torch.ones(shape, dtype=torch.bool))
    return tuple(out)


MAX_BIND_BYTES = 2 ** 31  # a bound input is read into memory


def parse_binds(specs: list[str]) -> dict[str, Any]:
    """``NAME=FILE.npy`` pairs as arrays (numeric .npy files, no pickles)."""
    import os

    import numpy as np
    out: dict[str, Any] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise BridgeError(f"--bind {spec!r}: expected NAME=FILE.npy")
        if name in out:
            raise BridgeError(f"--bind: input `{name}` is bound twice")
        if not os.path.isfile(path):
            raise BridgeError(f"--bind {spec!r}: no such file: {path}")
        if os.path.getsize(path) > MAX_BIND_BYTES:
            raise BridgeError(f"--bind {spec!r}: {os.path.getsize(path)} bytes, above the limit of {MAX_BIND_BYTES}")
        try:
            out[name] = np.load(path, allow_pickle=False)
        except (ValueError, OSError, EOFError) as e:
            raise BridgeError(f"--bind {spec!r}: not a numeric .npy file: {e}"[:300]) from None
        if not isinstance(out[name], np.ndarray):
            raise BridgeError(f"--bind {spec!r}: expected one array (.npy), got a {type(out[name]).__name__}")
    return out


def import_source(args: argparse.Namespace) -> Bundle:
    if args.source.endswith(".onnx"):
        from importers.onnx import import_onnx
        shapes = [parse_input_shape(s)[0] for s in args.input_shape] or None
        return import_onnx(args.source, shapes, constants=parse_binds(args.bind) or None)
    if args.bind:
        raise BridgeError("--bind freezes ONNX graph inputs; it does not apply to a PyTorch SOURCE")
    if ".py:" not in args.source:
        raise BridgeError(f"SOURCE must be model.onnx or path/to/file.py:factory, got {args.source!r}")
    model = load_factory(args.source, "SOURCE")
    if not args.input_shape:
        raise BridgeError("a PyTorch SOURCE needs example inputs: give --input-shape once per input (e.g. 1,4)")
    inputs = example_inputs(args.input_shape)
    if args.via == "fx":
        from importers.fx import import_fx
        return import_fx(model, inputs)
    from importers.torch_export import import_export
    return import_export(model, inputs, decompose=args.decompose)


def bind_weights(bundle: Bundle, path: str, source: str) -> tuple[Bundle, Any]:
    """Bind the checkpoint; an ONNX file's renamed weights (``onnx::MatMul_14``) first take the
    checkpoint's keys where the values prove them."""
    from importers.checkpoints import load_checkpoint
    from importers.onnx_keys import recover_keys
    from ..abi import bind_checkpoint
    ckpt = load_checkpoint(path)
    if bundle.report.get("framework") == "onnx" and not set(ckpt) >= set(bundle.roles):
        bundle = recover_keys(bundle, ckpt, source)
    bound, report = bind_checkpoint(bundle, ckpt)
    print(str(report))
    if not report.ok:
        raise CheckFailed(f"--checkpoint {path}: the checkpoint does not fit the imported graph (see above)")
    return bound, report


def counts(bundle: Bundle) -> dict[str, int]:
    """One definition of "parameters", the ABI's (``abi`` prints the same figure): the values of its
    slots, i.e. the parameter roles of parameter-bearing ops and every tensor bound to a checkpoint key.
    Constants the importer made (folded shapes, masks, literals) are counted apart."""
    from ..abi import abi
    slots = abi(bundle)
    total = bundle.payload.num_parameters()
    return {"parameters": slots.num_parameters, "parameter_tensors": len(slots),
            "constant_values": total - slots.num_parameters, "constant_tensors": len(bundle.payload) - len(slots)}


def v1_facts(bundle: Bundle) -> dict:
    """The v1 rewrite's note: what a torchlean.ir.v1 export would rewrite and what blocks it."""
    from torchlean_bridge.passes.v1_rewrite import rewrite_to_v1
    return dict(rewrite_to_v1(bundle)[1].facts)


def v1_outlook(facts: dict) -> str:
    """``v1_facts`` in one line, blocking kinds grouped by reason."""
    reasons: dict[str, list[str]] = {}
    for b in facts["blocking"]:
        reasons.setdefault(b["reason"], []).append(b["kind"] or "graph")
    rewritten = sorted({r["kind"] for r in facts["rewrites"]})
    text = f"{len(facts['rewrites'])} node(s) rewritten ({', '.join(rewritten)}); " if rewritten else ""
    if not reasons:
        return text + "nothing blocks it"
    return text + "blocked by " + "; ".join(f"{', '.join(sorted(set(kinds)))} ({reason})"
                                           for reason, kinds in sorted(reasons.items()))


def summary_lines(bundle: Bundle, facts: dict | None = None) -> list[str]:
    s, c = bundle.summary(), counts(bundle)
    ops = ", ".join(f"{k}×{v}" if v > 1 else k for k, v in s["ops"].items())
    consts = (f"; constants: {c['constant_values']} values in {c['constant_tensors']} tensors"
              if c["constant_tensors"] else "")
    lines = [f"nodes: {s['nodes']} ({len(s['inputs'])} input(s), {len(s['outputs'])} output(s))",
             f"parameters: {c['parameters']} values in {c['parameter_tensors']} tensors (the ABI's slots), "
             f"{len(bundle.roles)} keys bound{consts}",
             f"ops used: {ops}"]
    lines.append("torchlean.ir.v1 export: " + v1_outlook(facts or v1_facts(bundle)))
    lines.extend(f"note: {note}" for note in bundle.report.get("notes", ()))
    unused = bundle.report.get("unused_tensors")
    if unused:
        lines.append(f"unused tensors (not read by the graph): {', '.join(unused)}")
    return lines


def run(args: argparse.Namespace) -> int:
    from exporters.folder import save
    refuse_existing(args.output, args.force)
    with phases(f"importing {args.source}", args.quiet) as step:
        step("capturing and lowering")
        with in_cli_words():
            bundle = import_source(args)
        binding = None
        if args.checkpoint:
            step(f"binding {args.checkpoint}")
            bundle, binding = bind_weights(bundle, args.checkpoint, args.source)
        step(f"writing {args.output}")
        save(bundle, args.output)
    how = "onnx" if args.source.endswith(".onnx") else args.via + (" (core ATen)" if args.decompose else "")
    facts = v1_facts(bundle)
    emit_json({"source": args.source, "via": how, "output": str(args.output), **bundle.summary(), **counts(bundle),
               "v1_blocking": facts["blocking"], "v1_rewrites": [{k: r[k] for k in ("id", "kind", "formula")}
                                                                 for r in facts["rewrites"]],
               "keys_bound": len(bundle.roles), "notes": list(bundle.report.get("notes", ())),
               "unused_tensors": list(bundle.report.get("unused_tensors") or ()),
               "binding": binding.to_json() if binding is not None else None}, args.json)
    print(f"imported {args.source} via {how}")
    for line in summary_lines(bundle, facts):
        print(line)
    print(f"wrote {args.output}")
    return 0
