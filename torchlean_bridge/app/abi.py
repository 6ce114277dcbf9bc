"""The parameter ABI of a graph and the binding of a checkpoint to it.

The ABI is the ordered list of parameter slots a caller must supply (the seed chapter's
"parameter ABI"): node order, then the role order the op registry declares in ``OpSpec.params``.
Each slot carries the external key the role map binds to it (None when unbound).

Which nodes are parameters: every node whose op declares payload roles (linear, conv, layernorm,
batch_norm_eval, ...) contributes its required roles, and its optional roles when the payload holds
them or a key is bound to them. A ``const`` node is a parameter only when the role map binds an
external tensor to it (an FX ``get_attr`` buffer, an ONNX initializer); unbound consts were made by
the importer (folded shape arithmetic, literal eps) and belong to the architecture, not the ABI.

Binding (``bind_checkpoint``) copies each slot's tensor from the checkpoint through the role map,
replaying the binding's transform, and reports every mismatch. It always returns the new bundle:
callers decide with ``report.ok``. With ``strict=True`` (the default) missing slots and unexpected
keys are errors; with ``strict=False`` they are warnings. Shape mismatches, element-kind mismatches
(an integer tensor for a float slot) and NaN/Inf values are errors either way, because binding them
would give a different model. A slot that cannot be bound keeps the bundle's previous tensor (if it
had one), and the report says so. The report always lists the ambiguity groups: keys whose tensors
share shape and dtype, so exchanging them passes every key and shape check.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np

from ..bundle import Bundle
from ..ops import BOOL, FLOAT, INT64, fmt_shape
from ..report import Finding, Report
from ..roles import Binding, apply_transform, transform_shape

__all__ = ["Slot", "ABI", "AmbiguityGroup", "BindingReport", "abi", "bind_checkpoint", "ambiguity_groups",
           "format_abi", "square_matrix_keys"]


@dataclass(frozen=True)
class Slot:
    """One parameter slot: which node and role, its payload shape and element type, its bound key."""

    index: int
    node: int
    op: str
    role: str
    shape: tuple[int, ...]
    dtype: str
    key: str | None = None
    transform: str | None = None
    optional: bool = False

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def where(self) -> str:
        return f"slot {self.index} (node {self.node} {self.op} `{self.role}` {fmt_shape(self.shape)})"

    def to_json(self) -> dict[str, Any]:
        d = {"index": self.index, "node": self.node, "op": self.op, "role": self.role, "shape": list(self.shape),
             "dtype": self.dtype, "key": self.key, "size": self.size}
        if self.transform:
            d["transform"] = self.transform
        return d


@dataclass(frozen=True)
class AmbiguityGroup:
    """Keys whose tensors share shape and dtype: an exchange among them passes key and shape checks."""

    keys: tuple[str, ...]
    shape: tuple[int, ...]
    dtype: str

    def describe(self) -> str:
        return f"{fmt_shape(self.shape)} {self.dtype}: {', '.join(self.keys)}"


class ABI(Sequence[Slot]):
    """The ordered slots plus totals; iterating gives the slots."""

    def __init__(self, slots: Sequence[Slot]) -> None:
        self.slots: tuple[Slot, ...] = tuple(slots)
        self._by_key: dict[str, list[Slot]] = {}
        for slot in self.slots:
            if slot.key is not None:
                self._by_key.setdefault(slot.key, []).append(slot)

    def __getitem__(self, i: Any) -> Any:
        return self.slots[i]

    def __len__(self) -> int:
        return len(self.slots)

    def __iter__(self) -> Iterator[Slot]:
        return iter(self.slots)

    @property
    def shapes(self) -> list[list[int]]:
        return [list(s.shape) for s in self.slots]

    @property
    def num_parameters(self) -> int:
        return sum(s.size for s in self.slots)

    @property
    def keys(self) -> list[str]:
        """Bound keys in ABI order, each once (a tied tensor is listed at its first slot)."""
        return list(dict.fromkeys(s.key for s in self.slots if s.key is not None))

    def unbound(self) -> list[Slot]:
        return [s for s in self.slots if s.key is None]

    def for_key(self, key: str) -> list[Slot]:
        return list(self._by_key.get(key, ()))

    def ambiguity_groups(self) -> list[AmbiguityGroup]:
        return ambiguity_groups(self)

    def to_json(self) -> dict[str, Any]:
        return {"slots": [s.to_json() for s in self.slots], "parameters": self.num_parameters,
                "unbound": len(self.unbound()),
                "ambiguity_groups": [{"keys": list(g.keys), "shape": list(g.shape), "dtype": g.dtype}
                                     for g in self.ambiguity_groups()]}

    def __repr__(self) -> str:
        return f"ABI({len(self.slots)} slots, {self.num_parameters} parameters)"


def abi(bundle: Bundle) -> ABI:
    """The ordered parameter slots of ``bundle.graph`` with the keys its role map binds to them."""
    g = bundle.graph
    bound: dict[tuple[int, str], Binding] = {}
    for b in bundle.roles.bindings():
        bound.setdefault((b.node, b.role), b)
    slots: list[Slot] = []
    for node in g.nodes:
        spec = node.spec
        if spec is None or not spec.params:
            continue
        parent_shapes = [g.nodes[p].out_shape for p in node.parents]
        for role in spec.params:
            binding = bound.get((node.id, role.name))
            if node.kind == "const" and binding is None:
                continue  # an importer-made constant, not a parameter (see the module docstring)
            if role.optional and binding is None and bundle.payload.get(node.id, role.name) is None:
                continue
            dtype = node.dtype if node.kind == "const" else FLOAT
            slots.append(Slot(len(slots), node.id, node.kind, role.name,
                              tuple(int(d) for d in role.shape(node.attrs, parent_shapes, node.out_shape)), dtype,
                              binding.key if binding else None, binding.transform if binding else None,
                              role.optional))
    return ABI(slots)


def _element_type(dtype: np.dtype) -> str:
    return BOOL if dtype.kind == "b" else INT64 if dtype.kind in "iu" else FLOAT


def ambiguity_groups(slots: ABI, ckpt: Any = None) -> list[AmbiguityGroup]:
    """Bound keys grouped by (shape, dtype): the checkpoint's shapes when given, else the slots'.

    A key bound to several slots (tied weights) counts once; groups keep ABI order.
    """
    groups: dict[tuple, list[str]] = {}
    for key in slots.keys:
        if ckpt is not None:
            if key not in ckpt:
                continue
            sig = (tuple(ckpt.shape(key)), str(ckpt.dtype(key)))
        else:
            first = slots.for_key(key)[0]
            sig = (first.shape, first.dtype)
        groups.setdefault(sig, []).append(key)
    return [AmbiguityGroup(tuple(keys), shape, dtype) for (shape, dtype), keys in groups.items() if len(keys) > 1]


def square_matrix_keys(slots: ABI, ckpt: Any = None) -> list[str]:
    """Bound keys holding square matrices: a transposed tensor passes the shape check too."""
    out = []
    for key in slots.keys:
        shape = tuple(ckpt.shape(key)) if ckpt is not None and key in ckpt else slots.for_key(key)[0].shape
        if len(shape) == 2 and shape[0] == shape[1] and shape[0] > 1:
            out.append(key)
    return out


class BindingReport(Report):
    """A report whose ``ambiguity_groups`` lists the keys a swap could hide among."""

    def __init__(self, findings: Sequence[Finding] = (), title: str = "binding",
                 ambiguity: Sequence[AmbiguityGroup] = ()) -> None:
        super().__init__(list(findings), title)
        self.ambiguity_groups: list[AmbiguityGroup] = list(ambiguity)

    def _extra_json(self) -> dict:
        return {"ambiguity_groups": [{"keys": list(g.keys), "shape": list(g.shape), "dtype": g.dtype}
                                     for g in self.ambiguity_groups]}


def _fits(slot_dtype: str, array_dtype: np.dtype) -> bool:
    return _element_type(array_dtype) == slot_dtype


def bind_checkpoint(bundle: Bundle, ckpt: Any, strict: bool = True) -> tuple[Bundle, BindingReport]:
    """A new bundle whose payload comes from ``ckpt`` through the role map, and the binding report.

    ``ckpt`` is a Checkpoint, a path, or a mapping of arrays/tensors (e.g. ``module.state_dict()``).
    """
    from importers.checkpoints import as_checkpoint
    ckpt = as_checkpoint(ckpt)
    slots = abi(bundle)
    keyed = "error" if strict else "warning"
    payload = bundle.payload.shared()  # the slots bound below get the checkpoint's tensors; nothing else is copied
    report = BindingReport(title=f"binding {ckpt.source}: {len(slots)} slots, {slots.num_parameters} parameters")
    report.extend(ckpt.notes)  # NaN/Inf are judged per slot below, on the tensors actually bound

    changes: dict[tuple[str, str], list[str]] = {}  # (bundle dtype, checkpoint dtype) -> keys
    slot_ids = {(s.node, s.role) for s in slots}
    for b in bundle.roles.bindings():
        if (b.node, b.role) not in slot_ids:
            report.add(Finding("binding", f"role map binds `{b.key}` to node {b.node} role `{b.role}`, which is not "
                                          f"a parameter slot of the graph", node=b.node, keys=(b.key,)))
    for slot in slots:
        previous = bundle.payload.get(slot.node, slot.role)
        kept = "kept the bundle's previous tensor" if previous is not None else "the slot has no value"
        if slot.key is None:
            if previous is None:
                report.add(Finding("missing", f"{slot.where()} has no key in the role map and no value",
                                   node=slot.node))
            else:
                report.add(Finding("unbound", f"{slot.where()} has no key in the role map; {kept}",
                                   node=slot.node, severity="info"))
            continue
        key = slot.key
        if key not in ckpt:
            report.add(Finding("missing", f"missing key `{key}` for {slot.where()}; {kept}", node=slot.node,
                               keys=(key,), severity=keyed))
            continue
        raw = tuple(ckpt.shape(key))
        got = transform_shape(slot.transform, raw)
        if got != slot.shape:
            via = f" (after transform `{slot.transform}`: {fmt_shape(got)})" if slot.transform else ""
            report.add(Finding("shape", f"`{key}` has shape {fmt_shape(raw)}{via}, {slot.where()} expects "
                                        f"{fmt_shape(slot.shape)}; {kept}", node=slot.node, keys=(key,),
                               data={"got": raw, "expected": slot.shape}))
            continue
        dtype = ckpt.dtype(key)
        if not _fits(slot.dtype, dtype):
            report.add(Finding("dtype", f"`{key}` is {dtype}, {slot.where()} holds {slot.dtype} values; not "
                                        f"converted; {kept}", node=slot.node, keys=(key,),
                               data={"got": str(dtype), "expected": slot.dtype}))
            continue
        array = apply_transform(slot.transform, ckpt[key])
        if array.dtype.kind == "f" and not np.isfinite(array).all():
            nan, inf = int(np.isnan(array).sum()), int(np.isinf(array).sum())
            report.add(Finding("non_finite", f"`{key}` for {slot.where()} holds {nan} NaN and {inf} Inf value(s)",
                               node=slot.node, keys=(key,), data={"nan": nan, "inf": inf}))
        if previous is not None and previous.dtype != array.dtype:
            changes.setdefault((str(previous.dtype), str(array.dtype)), []).append(key)
        payload.set(slot.node, slot.role, array)

    for (before, after), keys in changes.items():
        report.add(Finding("dtype_change", f"{len(keys)} tensor(s) were {before} in the bundle and are {after} in "
                                           f"the checkpoint (kept as {after}): {', '.join(dict.fromkeys(keys))}",
                           keys=tuple(dict.fromkeys(keys)), severity="info", data={"before": before, "after": after}))
    report.extend(_alias_findings(bundle, slots, ckpt, payload))
    known_unused = set(bundle.report.get("unused_tensors", ()))
    for key in ckpt:
        if key in bundle.roles:
            continue
        if key in known_unused:
            report.add(Finding("unused", f"`{key}` is not read by the graph (the importer found it unused)",
                               keys=(key,), severity="info"))
        else:
            report.add(Finding("unexpected", f"unexpected key `{key}` {fmt_shape(ckpt.shape(key))}: no slot binds it",
                               keys=(key,), severity=keyed))

    report.ambiguity_groups = ambiguity_groups(slots, ckpt)
    for group in report.ambiguity_groups:
        report.add(Finding("ambiguity", f"same shape and dtype {group.describe()}: an exchange among them passes "
                                        f"every key and shape check", keys=group.keys,
                           data={"shape": group.shape, "dtype": group.dtype}, severity="info"))
    squares = [k for k in square_matrix_keys(slots, ckpt) if k in ckpt]
    if squares:
        report.add(Finding("transposable", f"square matrices (a transposed tensor passes the shape check): "
                                           f"{', '.join(squares)}", keys=tuple(squares), severity="info"))
    bound = Bundle(bundle.graph, payload, bundle.roles, {**bundle.report, "checkpoint": ckpt.source})
    return bound, report


def _alias_findings(bundle: Bundle, slots: ABI, ckpt: Any, payload: Any) -> list[Finding]:
    """Further keys bound to an already keyed slot (tied weights saved twice) must hold the same values."""
    by_slot = {(s.node, s.role): s for s in slots}
    out = []
    for b in bundle.roles.bindings():
        slot = by_slot.get((b.node, b.role))
        if slot is None or slot.key is None or b.key == slot.key or b.key not in ckpt or slot.key not in ckpt:
            continue
        mine = apply_transform(b.transform, ckpt[b.key]) if transform_shape(b.transform, ckpt.shape(b.key)) \
            == slot.shape else None
        if mine is None or not np.array_equal(mine, payload.get(slot.node, slot.role), equal_nan=True):
            out.append(Finding("tied", f"`{b.key}` and `{slot.key}` are bound to the same {slot.where()} (tied "
                                       f"weights) but hold different values; `{slot.key}` was used",
                               node=slot.node, keys=(slot.key, b.key)))
    return out


def format_abi(slots: ABI) -> str:
    """The ABI as a text table, then totals and ambiguity groups."""
    from .output import abi_table
    return abi_table(slots, square_matrix_keys(slots))
