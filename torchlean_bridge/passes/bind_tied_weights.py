"""Tied weights: every key naming one tensor is bound to every use of that tensor.

A tensor shared by several layers (an embedding reused as the output projection) has several
state_dict keys. torch.export names it once and FX by whichever attribute the code read, so an
importer's bindings say only part of the story. The importer records which keys alias one tensor
(``report["tied_tensors"]``: groups of keys, found by storage identity, which only it can see); this
pass gives each key of a group one binding per use of any of them, so ``roles.uses(key)`` lists them
all and both torch importers give the same role map. Groups with no bound key are dropped from the
report; a key bound through its alias is no longer reported unused.
"""

from __future__ import annotations

__all__ = ["bind_tied_weights"]

from ..bundle import Bundle
from ..roles import Binding, RoleMap
from .base import Note


def bind_tied_weights(bundle: Bundle) -> tuple[Bundle, Note]:
    groups = [list(g) for g in bundle.report.get("tied_tensors", ()) if len(g) > 1]
    tied = [g for g in groups if any(k in bundle.roles for k in g)]
    report = {k: v for k, v in bundle.report.items() if k != "tied_tensors"}
    if not tied:
        if report == bundle.report:
            return bundle, Note("bind_tied_weights")
        return Bundle(bundle.graph, bundle.payload, bundle.roles, report), Note("bind_tied_weights")
    members = {k for g in tied for k in g}
    bindings = [b for b in bundle.roles.bindings() if b.key not in members]
    for group in tied:
        uses = sorted({(b.node, b.role, b.transform) for k in group for b in bundle.roles.uses(k)},
                      key=lambda u: (u[0], u[1], u[2] or ""))
        bindings += [Binding(k, node, role, transform) for k in group for node, role, transform in uses]
    unused = [k for k in report.get("unused_tensors", []) if k not in members]
    if unused:
        report["unused_tensors"] = unused
    else:
        report.pop("unused_tensors", None)
    report["tied_tensors"] = [sorted(g) for g in tied]
    return Bundle(bundle.graph, bundle.payload, RoleMap(bindings), report), \
        Note("bind_tied_weights", len(tied), tuple(f"{', '.join(sorted(g))} share one tensor" for g in tied))
