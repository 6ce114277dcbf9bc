"""Bundles on disk: a folder with graph.json (nodes only), payload.safetensors and roles.json.

Nodes and initializers travel through separate files, as in TorchLean's design; ``load`` also
accepts one torchlean.ir.v1 document with its payload inline.
"""

from __future__ import annotations

import json
from pathlib import Path

from torchlean_bridge.bundle import Bundle
from torchlean_bridge.check import check_well_formed
from torchlean_bridge.errors import BridgeError
from torchlean_bridge.fileio import atomic_write_text
from torchlean_bridge.payload import Payload
from torchlean_bridge.report import jsonable
from torchlean_bridge.roles import RoleMap
from torchlean_bridge.wire import _read_source, dump_graph, dumps_document, loads_document, parse_document

from .payload_safetensors import payload_from_file, write_payload

__all__ = ["save", "load", "GRAPH_FILE", "PAYLOAD_FILE", "ROLES_FILE"]

GRAPH_FILE, PAYLOAD_FILE, ROLES_FILE, REPORT_FILE = "graph.json", "payload.safetensors", "roles.json", "report.json"


def save(bundle: Bundle, folder: str | Path) -> Path:
    """Write the three files (each atomically); returns the folder."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_text(folder / GRAPH_FILE, dumps_document(dump_graph(bundle.graph)))
    write_payload(bundle.payload, folder / PAYLOAD_FILE)
    atomic_write_text(folder / ROLES_FILE, json.dumps(bundle.roles.to_json(), indent=1, sort_keys=True) + "\n")
    if bundle.report:
        atomic_write_text(folder / REPORT_FILE,
                          json.dumps(jsonable(bundle.report), indent=1, sort_keys=True, default=str,
                                     allow_nan=False) + "\n")
    elif (folder / REPORT_FILE).exists():
        (folder / REPORT_FILE).unlink()  # a report left by an earlier bundle would describe the wrong model
    return folder


def load(path: str | Path) -> Bundle:
    """A bundle folder, or a single torchlean.ir.v1 document (payload inline or absent)."""
    path = Path(path)
    if not path.exists():
        raise BridgeError(f"no such file or folder: {path}")
    if path.is_file():
        graph, payload = parse_document(_read_source(str(path)))
        check_well_formed(graph)
        return Bundle(graph, payload)
    gfile = path / GRAPH_FILE
    if not gfile.exists():
        raise BridgeError(f"{path} is not a bundle folder: {GRAPH_FILE} is missing")
    graph, inline = parse_document(_read_source(str(gfile)))
    check_well_formed(graph)
    payload = payload_from_file(path / PAYLOAD_FILE) if (path / PAYLOAD_FILE).exists() else Payload()
    for nid, role, arr in inline.items():
        if payload.get(nid, role) is None:
            payload.set(nid, role, arr)
    roles = RoleMap()
    if (path / ROLES_FILE).exists():
        roles = RoleMap.from_json(loads_document((path / ROLES_FILE).read_bytes()))
    report = {}
    if (path / REPORT_FILE).exists():
        report = loads_document((path / REPORT_FILE).read_bytes())
    return Bundle(graph, payload, roles, report if isinstance(report, dict) else {})
