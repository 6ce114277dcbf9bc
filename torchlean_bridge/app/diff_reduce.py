"""The minimal reproducer of a divergence (``diff --reduce FOLDER``).

The diff already knows the first divergent node, and its parents agree with the oracle (else one of
them would be first). So the smallest subgraph that still diverges is that node alone, cut upstream
at its parents' values as the oracle computed them on the diverging input: those become the
reduced graph's inputs; constant parents stay constants; everything else is dropped. The reduced
case is verified before it is written: our evaluation of it must still exceed the node's budget
against the oracle's value (``expected.npy``).

The folder, written atomically as a unit: ``bundle/`` (the reduced bundle), ``reduced.onnx`` (the
reduced graph with the *reference's* tensors where the role map binds them, so onnxruntime runs
the oracle's side of a payload divergence), ``input_K.npy``, ``expected.npy``, and ``reduced.json``
(what was cut, whether each check reproduces, the one-command reproduction line).
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from ..bundle import Bundle
from ..errors import BridgeError
from ..fileio import atomic_folder
from ..graph import Graph
from ..payload import Payload
from ..report import jsonable
from ..roles import Binding, RoleMap

__all__ = ["reduce_to_node", "write_reduced", "MARKER"]

MARKER = "reduced.json"


def reduce_to_node(bundle: Bundle, nid: int) -> tuple[Bundle, list[int]]:
    """Node ``nid`` alone, its non-constant parents cut into graph inputs (in parent order, each once),
    its constant parents kept; returns the reduced bundle and the original ids of its inputs."""
    g = bundle.graph
    node = g.nodes[nid]
    cut = [p for p in dict.fromkeys(node.parents) if g.nodes[p].kind != "const"]
    kept = [p for p in dict.fromkeys(node.parents) if g.nodes[p].kind == "const"]
    order = [*cut, *kept, nid]
    new = {old: k for k, old in enumerate(order)}
    nodes = [g.nodes[p].with_(id=new[p], parents=(), kind="input", attrs={}) for p in cut]
    nodes += [g.nodes[p].with_(id=new[p]) for p in kept]
    nodes.append(node.with_(id=new[nid], parents=tuple(new[p] for p in node.parents)))
    payload = Payload()
    for old in (*kept, nid):
        for role, array in bundle.payload.record(old).items():
            payload.set(new[old], role, array)
    roles = RoleMap([Binding(b.key, new[b.node], b.role, b.transform) for old in (*kept, nid)
                     for b in bundle.roles.for_node(old)])
    reduced = Graph(nodes, tuple(range(len(cut))), (new[nid],))
    return Bundle(reduced, payload, roles, {"reduced_from": {"node": nid, "cut": cut, "kept": kept}}), cut


def with_reference_tensors(reduced: Bundle, original: Bundle, reference: Mapping[tuple[int, str], np.ndarray]
                           ) -> Bundle:
    """The reduced bundle with the reference's tensors wherever the original bound them."""
    cut_kept = reduced.report["reduced_from"]
    order = [*cut_kept["cut"], *cut_kept["kept"], cut_kept["node"]]
    payload = reduced.payload.copy()
    for new_id, old in enumerate(order):
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


def write_reduced(folder: str | Path, bundle: Bundle, nid: int, values: Mapping[int, np.ndarray],
                  expected: np.ndarray, reference: Mapping[tuple[int, str], np.ndarray], label: str,
                  diverges: Verify, onnx_diverges: OnnxCheck) -> dict[str, Any]:
    """Reduce around node ``nid``, verify the reduced case diverges, write the folder atomically;
    returns what ``reduced.json`` says. ``values``: the oracle's values by original node id on the
    diverging input ``label``; ``expected``: its value at ``nid``. ``diverges(reduced, inputs,
    expected)`` is the diff's own budget test on the reduced output, ``onnx_diverges(reduced, inputs,
    model)`` the diff of the reduced bundle against onnxruntime on ``model`` (the diff's engine, passed
    in so this module stays below it)."""
    from exporters.folder import save
    from exporters.onnx import export_onnx
    reduced, cut = reduce_to_node(bundle, nid)
    missing = [p for p in cut if p not in values]
    if missing:
        raise BridgeError(f"diff --reduce: the oracle has no value for node(s) {missing} feeding node {nid}")
    inputs = [np.asarray(values[p]) for p in cut]
    inputs = [x.astype(np.float64) if x.dtype.kind == "f" else x for x in inputs]
    still, row = diverges(reduced, inputs, np.asarray(expected))
    if not still:
        raise BridgeError(f"diff --reduce: node {nid} alone, fed the oracle's parent values, no longer diverges "
                          f"(error/budget {row['max_abs']:.3g}/{row['budget']:.3g}); nothing written")
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
