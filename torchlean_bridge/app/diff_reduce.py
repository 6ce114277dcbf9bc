"""The minimal reproducer of a divergence (``diff --reduce FOLDER``).

The diff already knows the first divergent node, and its parents agree with the oracle within their
budgets (else one of them would be first). Usually that node alone, cut upstream at its parents'
values as the oracle computed them on the diverging input, still diverges: those values become the
reduced graph's inputs, constant parents stay constants, everything else is dropped. When it does
not (an accumulated divergence: each node within its budget, their sum out), the subgraph grows
upstream one level at a time, cut at captured values, until it diverges; then every node whose
removal (cutting at its captured value, dropping what fed only it) keeps the divergence is removed,
so only the branches that matter stay. Every candidate is checked the same way: our evaluation of
it must exceed its output's budget against the oracle's value (``expected.npy``).

The folder, written atomically as a unit: ``bundle/`` (the reduced bundle), ``reduced.onnx`` (the
reduced graph with the *reference's* tensors where the role map binds them, so onnxruntime runs
the oracle's side of a payload divergence), ``input_K.npy``, ``expected.npy``, and ``reduced.json``
(what was cut, the subgraphs tried, whether each check reproduces, the one-command reproduction line).
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any, Callable, Collection, Mapping

import numpy as np

from ..bundle import Bundle
from ..errors import BridgeError
from ..fileio import atomic_folder
from ..graph import Graph
from ..payload import Payload
from ..report import jsonable
from ..roles import Binding, RoleMap

__all__ = ["reduce_to_node", "reduce_to_region", "grow_and_prune", "write_reduced", "MARKER", "MAX_REGION"]

MARKER = "reduced.json"
MAX_REGION = 48  # nodes a grown subgraph may reach before the reduction gives up


def _boundary(g: Graph, region: Collection[int]) -> tuple[list[int], list[int]]:
    """The non-constant nodes outside ``region`` feeding it (cut into inputs) and its constant parents
    (kept), each once, in id order."""
    outside = {p for v in region for p in g.nodes[v].parents if p not in region}
    cut = sorted(p for p in outside if g.nodes[p].kind != "const")
    kept = sorted(p for p in outside if g.nodes[p].kind == "const")
    return cut, kept


def reduce_to_region(bundle: Bundle, nid: int, region: Collection[int]) -> tuple[Bundle, list[int]]:
    """The subgraph ``region`` (non-constant, non-input nodes, ``nid`` among them) with output ``nid``,
    the nodes feeding it from outside cut into graph inputs and its constant parents kept; returns the
    reduced bundle and the original ids of its inputs. ``report["reduced_from"]["order"]`` lists the
    original id of every reduced node."""
    g = bundle.graph
    inner = sorted(set(region) | {nid})  # ids are topological
    cut, kept = _boundary(g, inner)
    order = [*cut, *kept, *inner]
    new = {old: k for k, old in enumerate(order)}
    nodes = [g.nodes[p].with_(id=new[p], parents=(), kind="input", attrs={}) for p in cut]
    nodes += [g.nodes[p].with_(id=new[p]) for p in kept]
    nodes += [g.nodes[v].with_(id=new[v], parents=tuple(new[p] for p in g.nodes[v].parents)) for v in inner]
    payload = Payload()
    for old in (*kept, *inner):
        for role, array in bundle.payload.record(old).items():
            payload.set(new[old], role, array)
    roles = RoleMap([Binding(b.key, new[b.node], b.role, b.transform) for old in (*kept, *inner)
                     for b in bundle.roles.for_node(old)])
    reduced = Graph(nodes, tuple(range(len(cut))), (new[nid],))
    info = {"node": nid, "cut": cut, "kept": kept, "region": inner, "order": order}
    return Bundle(reduced, payload, roles, {"reduced_from": info}), cut


def reduce_to_node(bundle: Bundle, nid: int) -> tuple[Bundle, list[int]]:
    """Node ``nid`` alone, its non-constant parents cut into graph inputs, its constant parents kept."""
    return reduce_to_region(bundle, nid, [nid])


def with_reference_tensors(reduced: Bundle, original: Bundle, reference: Mapping[tuple[int, str], np.ndarray]
                           ) -> Bundle:
    """The reduced bundle with the reference's tensors wherever the original bound them."""
    payload = reduced.payload.copy()
    for new_id, old in enumerate(reduced.report["reduced_from"]["order"]):
        for role, array in original.payload.record(old).items():
            if (old, role) in reference:
                payload.set(new_id, role, np.asarray(reference[(old, role)]).astype(array.dtype))
    return Bundle(reduced.graph, payload, reduced.roles, reduced.report)


def _npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, np.ascontiguousarray(array), allow_pickle=False)
    return buf.getvalue()


def _replaceable(folder: Path) -> bool:
    """Only a folder an earlier ``--reduce`` wrote is replaced."""
    return (folder / MARKER).is_file()


Verify = Callable[[Bundle, list[np.ndarray], np.ndarray], tuple[bool, dict[str, Any]]]
OnnxCheck = Callable[[Bundle, list[np.ndarray], Any], bool]


def _captured(values: Mapping[int, np.ndarray], cut: list[int]) -> list[np.ndarray]:
    xs = [np.asarray(values[p]) for p in cut]
    return [x.astype(np.float64) if x.dtype.kind == "f" else x for x in xs]


def _reaching(g: Graph, region: Collection[int], nid: int) -> set[int]:
    """The nodes of ``region`` from which ``nid`` is reached inside it (what is left once a branch is cut)."""
    inside, keep = set(region), {nid}
    for v in sorted(inside, reverse=True):
        if v in keep:
            keep.update(p for p in g.nodes[v].parents if p in inside)
    return keep


def grow_and_prune(bundle: Bundle, nid: int, values: Mapping[int, np.ndarray], expected: np.ndarray,
                   diverges: Verify) -> tuple[Bundle, list[int], list[np.ndarray], dict[str, Any], list[dict]]:
    """The smallest diverging subgraph found around ``nid``: the node alone, else grown upstream a level
    at a time until it diverges, then pruned node by node (farthest first) while it still diverges.
    Returns the reduced bundle, its cut nodes, their captured values, the check of the reduced output
    and every subgraph tried (nodes, whether it diverged, error and budget)."""
    g = bundle.graph
    tried: list[dict] = []

    def closed(region: set[int]) -> set[int]:  # a node the oracle has no value for cannot be a cut
        region = set(region)
        while True:
            lacking = [p for p in _boundary(g, region)[0] if p not in values and g.nodes[p].kind != "input"]
            if not lacking:
                return region
            region.update(lacking)

    def attempt(region: set[int]) -> tuple | None:
        reduced, cut = reduce_to_region(bundle, nid, region)
        missing = [p for p in cut if p not in values]
        if missing:
            raise BridgeError(f"diff --reduce: the oracle has no value for node(s) {missing} feeding node {nid}")
        inputs = _captured(values, cut)
        still, row = diverges(reduced, inputs, np.asarray(expected))
        tried.append({"nodes": len(reduced.graph.nodes), "region": sorted(region), "diverges": still,
                      "max_abs": row["max_abs"], "budget": row["budget"]})
        return (reduced, cut, inputs, row) if still else None

    region = closed({nid})
    found = attempt(region)
    while found is None:
        grow = [p for p in _boundary(g, region)[0] if g.nodes[p].kind != "input"]
        if not grow or len(region) >= MAX_REGION:
            last = tried[-1]
            why = "fed from the graph inputs" if not grow else f"{len(region)} nodes reached"
            raise BridgeError(f"diff --reduce: no subgraph ending at node {nid} diverges when fed the oracle's "
                              f"captured values ({why}; last error/budget {last['max_abs']:.3g}/"
                              f"{last['budget']:.3g}); nothing written")
        region = closed(region | set(grow))
        found = attempt(region)
    changed = True
    while changed:  # drop every node (and what fed only it) whose cut keeps the divergence
        changed = False
        for v in sorted(region - {nid}):
            if v not in region or v not in values:
                continue
            smaller = _reaching(g, region - {v}, nid)
            smaller_found = attempt(smaller)
            if smaller_found is not None:
                region, found, changed = smaller, smaller_found, True
    reduced, cut, inputs, row = found
    return reduced, cut, inputs, row, tried


def write_reduced(folder: str | Path, bundle: Bundle, nid: int, values: Mapping[int, np.ndarray],
                  expected: np.ndarray, reference: Mapping[tuple[int, str], np.ndarray], label: str,
                  diverges: Verify, onnx_diverges: OnnxCheck) -> dict[str, Any]:
    """Reduce around node ``nid`` (``grow_and_prune``), write the folder atomically; returns what
    ``reduced.json`` says. ``values``: the oracle's values by original node id on the diverging input
    ``label``; ``expected``: its value at ``nid``. ``diverges(reduced, inputs, expected)`` is the
    diff's own budget test on the reduced output, ``onnx_diverges(reduced, inputs, model)`` the diff of
    the reduced bundle against onnxruntime on ``model`` (the diff's engine, passed in so this module
    stays below it)."""
    from exporters.folder import save
    from exporters.onnx import export_onnx
    reduced, cut, inputs, row, tried = grow_and_prune(bundle, nid, values, expected, diverges)
    oracle_side = with_reference_tensors(reduced, bundle, reference)
    folder = Path(folder)
    onnx_model, onnx_note = None, None
    try:
        onnx_model = export_onnx(oracle_side)
    except BridgeError as e:
        onnx_note = f"no ONNX form: {str(e).splitlines()[0]}"
    onnx_reproduces = None
    if onnx_model is not None:
        try:
            onnx_reproduces = onnx_diverges(reduced, inputs, onnx_model)
        except (BridgeError, ImportError) as e:
            onnx_note = f"onnxruntime could not run it: {str(e).splitlines()[0]}"
    names = [f"input_{k}.npy" for k in range(len(inputs))]
    command = (f"torchlean-bridge diff {folder / 'bundle'} --against onnxruntime --onnx {folder / 'reduced.onnx'} "
               f"--input {' '.join(str(folder / n) for n in names)}")
    info = {"node": nid, "kind": bundle.graph.nodes[nid].kind, "input_set": label,
            "nodes": len(reduced.graph.nodes), "cut_at": cut,
            "kept_constants": reduced.report["reduced_from"]["kept"],
            "region": reduced.report["reduced_from"]["region"], "tried": tried,
            "reproduces_against_expected": True, "comparison": row,
            "reproduces_with_onnxruntime": onnx_reproduces, "onnx_note": onnx_note,
            "reproduce": command if onnx_reproduces else None,
            "why_onnx_may_agree": None if onnx_reproduces else
            "reduced.onnx carries our IR's attributes: a divergence in the lowering (an attribute, a "
            "missing step) shows only against expected.npy, the oracle's own value"}
    with atomic_folder(folder, _replaceable) as tmp:
        save(reduced, tmp / "bundle")
        if onnx_model is not None:
            (tmp / "reduced.onnx").write_bytes(onnx_model.SerializeToString())
        for name, x in zip(names, inputs):
            (tmp / name).write_bytes(_npy(x))
        (tmp / "expected.npy").write_bytes(_npy(np.asarray(expected)))
        (tmp / MARKER).write_text(json.dumps(jsonable(info), indent=1, sort_keys=True, allow_nan=False) + "\n",
                                  encoding="utf-8")
    return info
