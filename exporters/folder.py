"""Bundles on disk: a folder with graph.json (nodes only), payload.safetensors, roles.json, report.json
and manifest.json (every other file's size and sha256).

Nodes and initializers travel through separate files, as in TorchLean's design; ``load`` also
accepts one torchlean.ir.v1 document with its payload inline or in a companion payload file.
A folder is written as a unit (built beside the target, swapped in whole), and ``load`` refuses a
folder whose manifest is missing, lists a file that is not there, or disagrees with a file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from torchlean_bridge.bundle import Bundle
from torchlean_bridge.check import check_well_formed
from torchlean_bridge.errors import BridgeError, PayloadError
from torchlean_bridge.fileio import atomic_folder, read_capped, real_inside
from torchlean_bridge.gcpause import gc_paused
from torchlean_bridge.graph import Graph
from torchlean_bridge.payload import Payload, foreign_record_errors
from torchlean_bridge.report import jsonable
from torchlean_bridge.roles import RoleMap
from torchlean_bridge.wire import STRICT_JSON, dump_graph, dumps_document, loads_document, parse_document

from .payload_safetensors import file_sha256, payload_from_file, write_payload

__all__ = ["save", "load", "GRAPH_FILE", "PAYLOAD_FILE", "ROLES_FILE", "REPORT_FILE", "MANIFEST_FILE",
           "MANIFEST_FORMAT", "file_sha256"]

GRAPH_FILE, PAYLOAD_FILE, ROLES_FILE, REPORT_FILE = "graph.json", "payload.safetensors", "roles.json", "report.json"
MANIFEST_FILE = "manifest.json"
MANIFEST_FORMAT = "torchlean_bridge.bundle.v1"
_CONTENT_FILES = (GRAPH_FILE, PAYLOAD_FILE, ROLES_FILE, REPORT_FILE)
# saved beside a bundle by `torchlean-bridge plan --save` (app/kernel_plan.py); made for the old graph,
# so a new save may replace it with the rest of the folder
_COMPANION_FILES = ("kernel_plan.json",)


def _is_bundle_folder(folder: Path) -> bool:
    """Only bundle files inside: such a folder may be replaced whole by ``save``."""
    return all(p.name in _CONTENT_FILES or p.name in (MANIFEST_FILE, *_COMPANION_FILES) for p in folder.iterdir())


@gc_paused
def save(bundle: Bundle, folder: str | Path) -> Path:
    """Write the bundle folder as a unit (the old folder, if any, is replaced whole); returns it."""
    folder = Path(folder)
    with atomic_folder(folder, _is_bundle_folder) as tmp:
        (tmp / GRAPH_FILE).write_text(dumps_document(dump_graph(bundle.graph)), encoding="utf-8")
        write_payload(bundle.payload, tmp / PAYLOAD_FILE)
        (tmp / ROLES_FILE).write_text(json.dumps(bundle.roles.to_json(), indent=1, sort_keys=True) + "\n",
                                      encoding="utf-8")
        if bundle.report:
            (tmp / REPORT_FILE).write_text(json.dumps(jsonable(bundle.report), indent=1, sort_keys=True, default=str,
                                                      allow_nan=False) + "\n", encoding="utf-8")
        files = {name: {"bytes": (tmp / name).stat().st_size, "sha256": file_sha256(tmp / name)}
                 for name in _CONTENT_FILES if (tmp / name).exists()}
        (tmp / MANIFEST_FILE).write_text(json.dumps({"format": MANIFEST_FORMAT, "files": files}, indent=1,
                                                    sort_keys=True) + "\n", encoding="utf-8")
    return folder


def _manifest(folder: Path) -> dict[str, dict[str, Any]]:
    """The manifest's file table, validated; every listed file present, every present file listed."""
    where = f"bundle {folder}"
    if not (folder / MANIFEST_FILE).exists():
        raise BridgeError(f"{where} is incomplete: {MANIFEST_FILE} is missing (an interrupted write, or a folder "
                          f"not written by tlb.save)")
    _inside(folder, MANIFEST_FILE)
    doc = _json_file(folder / MANIFEST_FILE, "bundle manifest")
    files = doc.get("files") if isinstance(doc, dict) else None
    if not isinstance(doc, dict) or set(doc) != {"format", "files"} or doc["format"] != MANIFEST_FORMAT \
            or not isinstance(files, dict):
        raise BridgeError(f"{where}: {MANIFEST_FILE} is not a `{MANIFEST_FORMAT}` manifest")
    for name, entry in files.items():
        if name not in _CONTENT_FILES or not isinstance(entry, dict) or set(entry) != {"bytes", "sha256"} \
                or not isinstance(entry.get("sha256"), str) \
                or not isinstance(entry.get("bytes"), int) or isinstance(entry.get("bytes"), bool):
            raise BridgeError(f"{where}: {MANIFEST_FILE} entry `{str(name)[:80]}` is not a bundle file with "
                              f"bytes and sha256")
    missing = [n for n in files if not (folder / n).exists()]
    for name in files:
        if name not in missing:
            _inside(folder, name)
    if missing:
        raise BridgeError(f"{where} is incomplete: {', '.join(missing)} listed in {MANIFEST_FILE} "
                          f"{'is' if len(missing) == 1 else 'are'} missing")
    if GRAPH_FILE not in files:
        raise BridgeError(f"{where}: {MANIFEST_FILE} does not list {GRAPH_FILE}")
    unlisted = [n for n in _CONTENT_FILES if n not in files and (folder / n).exists()]
    if unlisted:
        raise BridgeError(f"{where}: {', '.join(unlisted)} not listed in {MANIFEST_FILE} (added after writing)")
    return files


def _check_manifest_hashes(folder: Path, files: dict[str, dict[str, Any]]) -> None:
    for name, entry in files.items():
        path = folder / name
        size = path.stat().st_size
        if size != entry["bytes"] or file_sha256(path) != entry["sha256"]:
            raise BridgeError(f"bundle {folder}: {name} does not match its size and sha256 in {MANIFEST_FILE} "
                              f"(the file was modified or is not from the same write)")


def _json_file(path: Path, what: str) -> Any:
    """A bundle's manifest, roles or report: strict JSON (``STRICT_JSON``), errors naming the file."""
    try:
        return json.loads(read_capped(path, what), **STRICT_JSON)
    except RecursionError:
        raise BridgeError(f"{what} {path}: nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise BridgeError(f"{what} {path}: invalid JSON: {e}"[:500]) from None


def _inside(folder: Path, name: str) -> None:
    """A bundle file must be a file of the folder itself, not a symlink to somewhere else."""
    if real_inside(folder, folder / name) is None:
        raise BridgeError(f"bundle {folder}: {name} resolves outside the bundle folder (a symlink to "
                          f"{os.path.realpath(folder / name)}); refused")


def _checked_roles(graph: Graph, roles: RoleMap, where: str) -> RoleMap:
    """Bindings to nodes that do not exist or to roles their node does not have are refused at load."""
    for b in roles.bindings():
        if not 0 <= b.node < len(graph.nodes):
            raise BridgeError(f"{where}: roles bind `{b.key:.200}` to node {b.node}, which is not in the graph")
        node = graph.nodes[b.node]
        if b.role not in {r.name for r in (node.spec.params if node.spec else ())}:
            raise BridgeError(f"{where}: roles bind `{b.key:.200}` to node {b.node} ({node.kind}), which has no "
                              f"role `{b.role:.80}`", node=b.node, op=node.kind)
    return roles


def _checked(graph: Graph, payload: Payload, where: str) -> Payload:
    """Records for nodes that do not exist or roles the node does not have are refused at load."""
    problems = foreign_record_errors(graph, payload)
    if problems:
        raise PayloadError(f"{where}: " + "; ".join(p.message for p in problems[:5])
                           + (f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""), node=problems[0].node)
    return payload


def _load_document(path: Path) -> Bundle:
    doc = loads_document(read_capped(path, "graph document"))
    graph, payload = parse_document(doc)
    check_well_formed(graph)
    companion = doc.get("payload_file") if isinstance(doc, dict) else None
    if companion is not None:
        from .torchlean_json import read_companion_payload
        side = read_companion_payload(path, companion)
        for nid, role, arr in side.items():
            if payload.get(nid, role) is None:
                payload.set(nid, role, arr)
    return Bundle(graph, _checked(graph, payload, str(path)))


@gc_paused
def load(path: str | Path) -> Bundle:
    """A bundle folder, or a single torchlean.ir.v1 document (payload inline, in a companion file, or absent)."""
    path = Path(path)
    if not path.exists():
        raise BridgeError(f"no such file or folder: {path}")
    if not path.is_dir():
        return _load_document(path)
    gfile = path / GRAPH_FILE
    if not gfile.exists():
        raise BridgeError(f"{path} is not a bundle folder: {GRAPH_FILE} is missing")
    files = _manifest(path)
    graph, inline = parse_document(loads_document(read_capped(gfile, "bundle graph")))
    check_well_formed(graph)
    payload = payload_from_file(path / PAYLOAD_FILE) if PAYLOAD_FILE in files else Payload()
    for nid, role, arr in inline.items():
        if payload.get(nid, role) is None:
            payload.set(nid, role, arr)
    roles = RoleMap.from_json(_json_file(path / ROLES_FILE, "bundle roles")) if ROLES_FILE in files else RoleMap()
    roles = _checked_roles(graph, roles, str(path))
    report = _json_file(path / REPORT_FILE, "bundle report") if REPORT_FILE in files else {}
    _check_manifest_hashes(path, files)
    return Bundle(graph, _checked(graph, payload, str(path)), roles, report if isinstance(report, dict) else {})
