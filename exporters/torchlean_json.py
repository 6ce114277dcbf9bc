"""Bundles as one torchlean.ir.v1 document in exactly the form TorchLean's importer accepts.

Ext ops whose registry entry has an exact ``v1_rewrite`` (squeeze/unsqueeze -> reshape, expand ->
broadcast_to, pools with v1 geometry) are rewritten by ``passes.v1_rewrite``; ``wire.graph_to_wire`` then writes payload
fields inline (spec 3.2: grouped conv weights expanded dense, reductions as ``axes``/``keepdim``).
Anything TorchLean cannot take (other ext ops, several inputs, int64/bool values, kinds its
importer rejects, payloads that do not fit) is refused with every blocking node listed at once.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

from torchlean_bridge.bundle import Bundle
from torchlean_bridge.errors import BridgeError, ExportError
from torchlean_bridge.fileio import real_inside, staged_outputs
from torchlean_bridge.gcpause import gc_paused
from torchlean_bridge.graph import Graph
from torchlean_bridge.payload import Payload, payload_errors
from torchlean_bridge.passes.base import Note
from torchlean_bridge.passes.v1_rewrite import rewrite_to_v1
from torchlean_bridge.wire import dumps_document, graph_to_wire

from .payload_safetensors import file_sha256, payload_from_file, payload_writer

__all__ = ["export_torchlean", "torchlean_blocking_nodes", "to_v1", "to_v1_graph", "payload_file_for",
           "read_companion_payload"]


def torchlean_blocking_nodes(bundle: Bundle) -> list[dict[str, Any]]:
    """Every node that keeps the bundle out of torchlean.ir.v1, with the reason (empty when none)."""
    return rewrite_to_v1(bundle)[1].facts["blocking"]


def to_v1(bundle: Bundle, approximate: Mapping[str, str] | None = None) -> tuple[Bundle, Note]:
    """The bundle with every node in its v1 form and the rewrite's note; ExportError listing every
    blocking node."""
    v1, note = rewrite_to_v1(bundle, approximate)
    blocking = note.facts["blocking"]
    if blocking:
        lines = [(f"  node {b['id']}: {b['kind']}" if b["id"] is not None else "  graph")
                 + (f" ({b['source']})" if b["source"] else "") + f": {b['reason']}" for b in blocking]
        error = ExportError(f"torchlean.ir.v1 export: {len(blocking)} node(s) block the export:\n" + "\n".join(lines),
                            node=blocking[0]["id"], op=blocking[0]["kind"])
        error.items = blocking
        raise error
    return v1, note


def to_v1_graph(bundle: Bundle) -> Graph:
    """The graph with every ext node in its v1 form; ExportError listing every blocking node."""
    return to_v1(bundle)[0].graph


def payload_file_for(file: str | Path) -> Path:
    """Where a document written without inline payload keeps its tensors: ``NAME.payload.safetensors``."""
    path = Path(file)
    return path.with_name(path.stem + ".payload.safetensors")


@gc_paused
def export_torchlean(bundle: Bundle, file: str | Path | None, inline_payload: bool = True,
                     approximate: Mapping[str, str] | None = None,
                     annotations: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Write (atomically, when ``file`` is given) and return the torchlean.ir.v1 document.

    Without ``inline_payload`` the document holds nodes only and the payload goes to
    ``payload_file_for(file)`` (safetensors, ``"<node id>.<role>"`` keys, sha256 per tensor).
    ``approximate`` names the approximations allowed (``{"gelu": "tanh"}``). Every rewrite is listed
    in the document's root field ``torchlean_bridge.rewrites`` (TorchLean ignores other root fields),
    beside ``annotations`` (the application's measured deviations, the cut, ...).
    """
    v1, note = to_v1(bundle, approximate)
    problems = payload_errors(v1.graph, v1.payload)
    if problems:
        raise ExportError("torchlean.ir.v1 export: the payload does not fit the graph:\n"
                          + "\n".join(f"  {p.message}" for p in problems), node=problems[0].node)
    doc = graph_to_wire(v1.graph, v1.payload if inline_payload else None)
    if note.facts["rewrites"] or annotations:
        doc["torchlean_bridge"] = {"rewrites": note.facts["rewrites"], **dict(annotations or {})}
    if file is None:
        return doc
    with staged_outputs() as stage:
        if not inline_payload:
            # the pair is one unit: both are written before either is renamed, the payload first, so
            # the document that names its size and sha256 never appears without it
            side = payload_file_for(file)
            written = stage(side, payload_writer(v1.payload))
            doc["payload_file"] = {"name": side.name, "bytes": written.stat().st_size, "sha256": file_sha256(written)}
        text = dumps_document(doc).encode("utf-8")
        stage(file, lambda f: f.write(text))
    return doc


def read_companion_payload(document: Path, ref: Any) -> Payload:
    """The payload a nodes-only document names in its ``payload_file`` field, checked against it."""
    if not isinstance(ref, dict) or not isinstance(ref.get("name"), str) or not isinstance(ref.get("sha256"), str) \
            or not isinstance(ref.get("bytes"), int):
        raise BridgeError(f"{document}: `payload_file` must be {{name, bytes, sha256}}")
    name = ref["name"]
    if Path(name).name != name or name in ("", ".", ".."):
        raise BridgeError(f"{document}: payload_file name {name!r} must be a file name beside the document")
    side = document.parent / name
    if not side.exists():
        raise BridgeError(f"{document}: its payload file {side} is missing")
    if real_inside(document.parent, side) is None:
        raise BridgeError(f"{document}: its payload file {side} resolves outside the document's folder (a symlink "
                          f"to {os.path.realpath(side)}); refused")
    payload = payload_from_file(side)
    if side.stat().st_size != ref["bytes"] or file_sha256(side) != ref["sha256"]:
        raise BridgeError(f"{document}: payload file {side} does not match the size and sha256 the document "
                          f"records (it is from another write)")
    return payload
