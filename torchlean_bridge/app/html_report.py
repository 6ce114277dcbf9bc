"""One self-contained HTML page of a graph (``show --html``), optionally overlaid with a diff report
(``diff --report``: every node colored by error / budget, the first divergence and suspected exchanged
keys marked) or with interval bounds (``bounds --report``: colored by box width).

Python lays the graph out (layer = longest path from an input) and embeds everything as JSON in a
``<script type="application/json">`` tag; the inline script of templates/report.html draws the SVG,
pans and zooms it, and shows a node's details on click. No server and no network are involved.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from ..bundle import Bundle
from ..errors import BridgeError
from ..fileio import staged_outputs
from ..graph import Graph
from ..report import jsonable

MAX_HTML_NODES = 50_000  # beyond this a browser cannot lay out the SVG usefully; refuse before building it
PREVIEW = 6  # values shown per parameter in a node's details
TEMPLATE = Path(__file__).with_name("templates") / "report.html"


def layers(g: Graph) -> list[int]:
    """Each node's layer: the longest path (in edges) from a node without parents. Parents precede
    their consumers in a checked graph, so one pass in id order suffices."""
    layer = [0] * len(g.nodes)
    for n in g.nodes:
        if n.parents:
            layer[n.id] = 1 + max(layer[p] for p in n.parents)
    return layer


def _layout(g: Graph) -> list[tuple[int, int]]:
    """(layer, row in layer) per node: columns by layer, rows in id order inside a column."""
    layer = layers(g)
    rows: dict[int, int] = {}
    out = []
    for n in g.nodes:
        r = rows.get(layer[n.id], 0)
        rows[layer[n.id]] = r + 1
        out.append((layer[n.id], r))
    return out


def _preview(a: np.ndarray) -> dict[str, Any]:
    flat = np.asarray(a).reshape(-1)[:PREVIEW]
    return {"shape": list(np.shape(a)), "dtype": str(np.asarray(a).dtype),
            "values": [float(v) if np.issubdtype(flat.dtype, np.floating) else v.item() for v in flat]}


def graph_data(bundle: Bundle) -> dict[str, Any]:
    """Nodes with their layout, op, shape, provenance, parameters (key, shape, first values)."""
    g = bundle.graph
    if len(g.nodes) > MAX_HTML_NODES:
        raise BridgeError(f"html report: the graph has {len(g.nodes)} nodes; at most {MAX_HTML_NODES} can be drawn")
    place = _layout(g)
    outputs = set(g.outputs)
    keys: dict[tuple[int, str], str] = {}
    for b in bundle.roles.bindings():  # one pass (RoleMap.key_of scans every binding per call)
        keys.setdefault((b.node, b.role), b.key)
    nodes = []
    for n, (col, row) in zip(g.nodes, place):
        params = []
        for role, value in sorted(bundle.payload.record(n.id).items()):
            params.append({"role": role, "key": keys.get((n.id, role)), **_preview(value)})
        src = n.source.to_json() if n.source is not None else {}
        nodes.append({"id": n.id, "op": n.kind, "label": n.describe(), "parents": list(n.parents),
                      "shape": list(n.out_shape), "dtype": n.dtype, "layer": col, "row": row,
                      "source": src, "params": params, "output": n.id in outputs})
    return {"nodes": nodes, "inputs": list(g.inputs), "outputs": list(g.outputs)}


def diff_overlay(report: Any, bundle: Bundle) -> dict[str, Any]:
    """Per node: status, error / budget ratio, errors and budget; the first divergence; nodes holding
    keys a parameter-mismatch finding suspects (exchanged or wrong checkpoint entries)."""
    rows = {}
    for r in report.nodes:
        rows[r.node] = {**r.to_json(), "ratio": r.worst_ratio}
    suspected: dict[int, set[str]] = {}
    for f in report.findings:
        if f.kind != "parameter-mismatch":
            continue
        for key in f.keys:  # the nodes bound to the key; the finding's own node when none is
            owners = [b.node for b in bundle.roles.uses(key)] or ([f.node] if f.node is not None else [])
            for nid in owners:
                suspected.setdefault(nid, set()).add(key)
    first = report.first_divergence
    return {"kind": "diff", "title": report.title, "summary": report.summary(), "rows": rows,
            "first_divergence": first.to_json() if first is not None else None,
            "suspected": {n: sorted(set(ks)) for n, ks in suspected.items()},
            "findings": [f.to_json() for f in report.findings]}


def bounds_overlay(boxes: Any, title: str) -> dict[str, Any]:
    """Per node: the largest width of its box (hi - lo), with lo/hi previews."""
    rows = {}
    for nid, box in (boxes.items() if isinstance(boxes, dict) else enumerate(boxes)):
        if box is None:
            continue
        lo, hi = (np.asarray(b, dtype=np.float64) for b in box)
        width = float(np.max(hi - lo)) if lo.size else 0.0
        rows[int(nid)] = {"width": width, "lo": lo.reshape(-1)[:PREVIEW].tolist(),
                          "hi": hi.reshape(-1)[:PREVIEW].tolist()}
    return {"kind": "bounds", "title": title, "rows": rows}


def embed(data: dict[str, Any]) -> str:
    """JSON for a ``<script>`` body: non-finite floats as strings, and ``<``, ``>``, ``&`` escaped so no
    ``</script>`` (or comment opener) in a name can end the block."""
    text = json.dumps(jsonable(data), allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def page(bundle: Bundle, overlay: dict[str, Any] | None = None, title: str = "torchlean-bridge graph") -> str:
    data = {"title": overlay["title"] if overlay else title, "graph": graph_data(bundle), "overlay": overlay}
    html = TEMPLATE.read_text(encoding="utf-8")
    safe_title = data["title"].replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    head, tail = html.split("__DATA__")
    return head.replace("__TITLE__", safe_title) + embed(data) + tail


def write_page(path: str, bundle: Bundle, overlay: dict[str, Any] | None = None,
               title: str = "torchlean-bridge graph") -> None:
    """Render and write the page atomically (a failure leaves ``path`` unchanged)."""
    text = page(bundle, overlay, title).encode("utf-8")
    with staged_outputs() as stage:
        stage(path, lambda f: f.write(text))


def check_target(path: str, what: str) -> None:
    """Refuse a report path that is not an .html/.htm file before any work is done."""
    if Path(path).suffix.lower() not in (".html", ".htm"):
        raise BridgeError(f"{what}: {path!r} must end in .html")
    if Path(path).is_dir():
        raise BridgeError(f"{what}: {path!r} is a folder")


__all__ = ["layers", "graph_data", "diff_overlay", "bounds_overlay", "page", "write_page", "check_target",
           "MAX_HTML_NODES"]
