"""Every node in a torchlean.ir.v1 form, for the v1 writer, with every rewrite and every refusal listed.

Ext ops whose registry entry carries an exact ``v1_rewrite`` (squeeze/unsqueeze -> reshape, expand ->
broadcast_to, pools with v1 geometry) change kind in place; ext ops with a form in ``v1_forms`` are
replaced by their small v1 graphs; approximations are used only for the kinds the caller names in
``approximate`` (``{"gelu": "tanh"}``). Nothing is rewritten silently: ``facts["rewrites"]`` lists
each rewritten node (original id, kind, formula, deviation class, the id now holding its value) and
``facts["blocking"]`` every node still outside v1 (original ids, with the reason and, where one
exists, the option that would export it), so the writer can refuse naming all of them at once.
Nodes only a rewritten node read (a gather's constant indices, a mask) are dropped.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from ..bundle import Bundle
from ..errors import BridgeError
from ..graph import Node
from ..v1compat import blocking_reason
from .base import GraphEdit, Note
from .dead_code import live_nodes
from .v1_forms import APPROXIMATIONS, V1_FORMS, Emit, NoForm

__all__ = ["rewrite_to_v1"]

_VIEWS = ("broadcast_to", "expand", "reshape", "squeeze", "unsqueeze", "flatten")


def rewrite_to_v1(bundle: Bundle, approximate: Mapping[str, str] | None = None) -> tuple[Bundle, Note]:
    approximate = dict(approximate or {})
    for kind, name in approximate.items():
        if (kind, name) not in APPROXIMATIONS:
            choices = ", ".join(f"{k}={n}" for k, n in APPROXIMATIONS)
            raise BridgeError(f"no approximation {kind}={name} (there are: {choices})")
    g = bundle.graph
    edit = GraphEdit(bundle)
    reasons: dict[int, str] = {}  # new id -> why its node keeps its ext kind
    origin: dict[int, int] = {}  # new id -> the original node it holds
    rewrites: list[dict[str, Any]] = []

    def const_value(old: int) -> np.ndarray | None:
        node = g.nodes[old]
        if node.kind == "const":
            return bundle.payload.get(old, "values")
        if node.kind in _VIEWS:
            inner = const_value(node.parents[0])
            if inner is not None:
                return (np.broadcast_to(inner, node.out_shape) if node.kind in ("broadcast_to", "expand")
                        else inner.reshape(node.out_shape))
        return None

    for node in g.nodes:
        spec = node.spec
        if spec is None or spec.is_v1:
            origin[edit.keep(node)] = node.id
            continue
        if spec.v1_rewrite is not None:
            same = spec.v1_rewrite(node.attrs, [g.nodes[p].out_shape for p in node.parents], node.out_shape)
            if same is not None:
                new = edit.keep(node, kind=same[0], attrs=same[1])
                origin[new] = node.id
                rewrites.append(_entry(node, new, f"exactly a v1 {same[0]}", "none: the same function", None))
                continue
        start = len(edit.nodes)
        emit = Emit(edit, node, const_value, lambda role, n=node.id: bundle.payload.get(n, role))
        form = V1_FORMS.get(node.kind)
        try:
            result = form.lower(emit, node, edit.parents(node)) if form is not None else None
        except NoForm as e:  # a form too large for these shapes (a selection over a 50k vocabulary, ...)
            result = str(e)
        if isinstance(result, int):
            if emit.owns_payload:  # its parameters were rewritten (a flipped kernel): the old record stays behind
                edit.new_id[node.id] = result
            else:
                edit.replace(node, result)
            rewrites.append(_entry(node, result, form.formula, form.deviation, None))
            continue
        approximation = approximate.get(node.kind)
        if approximation is not None:  # only where no exact form applies
            _roll_back(edit, start)
            lower, formula = APPROXIMATIONS[(node.kind, approximation)]
            new = lower(emit, edit.parents(node)[0])
            edit.replace(node, new)
            rewrites.append(_entry(node, new, formula, f"approximation ({node.kind}={approximation})",
                                   approximation))
            continue
        _roll_back(edit, start)
        new = edit.keep(node)
        origin[new] = node.id
        if isinstance(result, str):
            reasons[new] = result

    rewritten = edit.result()
    live = live_nodes(rewritten)
    blocking = _blocking(rewritten, live, reasons, origin, g)
    final = GraphEdit(rewritten)
    for node in rewritten.graph.nodes:
        if node.id in live:
            final.keep(node)
    out = final.result() if (rewrites or len(live) < len(rewritten.graph)) else bundle
    for r in rewrites:  # None: no output reads the rewritten node (a dead node of a hand-written graph)
        new = r.pop("_new")
        r["now"] = new if out is bundle else final.new_id.get(new)
    details = tuple(f"node {r['id']} {r['kind']} -> {r['formula']}" for r in rewrites)
    return out, Note("v1_rewrite", len(rewrites), details, {"blocking": blocking, "rewrites": rewrites})


def _entry(node: Node, new: int, formula: str, deviation: str, approximation: str | None) -> dict[str, Any]:
    return {"id": node.id, "kind": node.kind, "source": str(node.source) if node.source else None,
            "formula": formula, "deviation": deviation, "approximation": approximation, "_new": new}


def _roll_back(edit: GraphEdit, start: int) -> None:
    """Forget the nodes a lowering emitted before it found it had no form."""
    del edit.nodes[start:]
    for nid in [n for n in edit.payload if n >= start]:
        del edit.payload[nid]


def _blocking(b: Bundle, live: set[int], reasons: dict[int, str], origin: dict[int, int], original) -> list[dict]:
    g = b.graph
    blocking: list[dict[str, Any]] = []
    if not g.inputs:
        blocking.append({"id": None, "kind": None, "source": None,
                         "reason": "the graph has no input; TorchLean graphs have exactly one"})
    extra = {nid: k for k, nid in enumerate(g.inputs) if k > 0}
    for node in g.nodes:
        if node.id not in live or node.id not in origin:
            continue
        old = original.nodes[origin[node.id]]
        if node.id in extra:
            reason = (f"graph input #{extra[node.id] + 1}: TorchLean graphs have exactly one input (freeze it with "
                      f"--constant-input {old.id}=FILE.npy, or cut past it with --input-at NODE)")
        else:
            reason = blocking_reason(node, reasons.get(node.id, "ext op without an exact torchlean.ir.v1 form"))
        if reason is not None:
            blocking.append({"id": old.id, "kind": old.kind, "source": str(old.source) if old.source else None,
                             "reason": reason})
    return blocking
