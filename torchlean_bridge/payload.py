"""Node-keyed parameter records, kept apart from the graph (TorchLean's ``NN.IR.Payload``).

A record is the set of role tensors one node reads (``linear``: weight [out, in], bias [out];
``conv``: grouped weight [out, in/groups, k...], bias; ``layernorm``: weight/bias over the
normalized suffix; ``batch_norm_eval``: weight, bias, running_mean, running_var; ``const``:
values). The op registry declares the roles and their shapes, so the same graph can be evaluated
with several payloads (initial, trained, interval) and each can be checked against it.
"""

from __future__ import annotations

import hashlib
from typing import Iterator, Mapping, Sequence

import numpy as np

from .errors import PayloadError
from .graph import Graph, Node
from .ops import Shape, fmt_shape

__all__ = ["Payload", "payload_errors", "foreign_record_errors", "role_shape", "tensor_sha256"]


def tensor_hash_prefix(a: np.ndarray) -> bytes:
    """What ``tensor_sha256`` hashes before the tensor's bytes: its dtype and shape."""
    return f"{a.dtype.str}|{','.join(map(str, a.shape))}|".encode()


def tensor_sha256(a: np.ndarray) -> str:
    """Hash of dtype, shape and little-endian row-major bytes: stable across machines. Hashes a buffer
    view, not a ``tobytes`` copy (a C-contiguous little-endian tensor, e.g. a mapped weight, is not copied)."""
    a = np.asarray(a, order="C")  # keeps 0-d tensors 0-d (ascontiguousarray would not)
    h = hashlib.sha256(tensor_hash_prefix(a))
    le = np.ascontiguousarray(a.astype(a.dtype.newbyteorder("<"), copy=False)).reshape(-1)
    h.update(memoryview(le).cast("B"))
    return h.hexdigest()


def _read_only_view(a: np.ndarray) -> np.ndarray:
    view = a.view()
    view.flags.writeable = False
    return view


class Payload:
    """Mapping ``node id -> {role: ndarray}``."""

    def __init__(self, records: Mapping[int, Mapping[str, np.ndarray]] | None = None) -> None:
        self._records: dict[int, dict[str, np.ndarray]] = {}
        for nid, rec in (records or {}).items():
            for role, arr in rec.items():
                self.set(nid, role, arr)

    # -- access -------------------------------------------------------------------------------
    def set(self, node: int, role: str, array: np.ndarray) -> None:
        arr = np.asarray(array)
        if arr.dtype.kind not in "fiub":
            raise PayloadError(f"payload {node}.{role}: unsupported element type {arr.dtype}", node=node)
        self._records.setdefault(int(node), {})[role] = arr

    def get(self, node: int, role: str) -> np.ndarray | None:
        return self._records.get(node, {}).get(role)

    def record(self, node: int) -> dict[str, np.ndarray]:
        return self._records.get(node, {})

    def __contains__(self, node: object) -> bool:
        return node in self._records

    def nodes(self) -> list[int]:
        return sorted(self._records)

    def items(self) -> Iterator[tuple[int, str, np.ndarray]]:
        for nid in sorted(self._records):
            for role, arr in self._records[nid].items():
                yield nid, role, arr

    def __len__(self) -> int:
        return sum(len(r) for r in self._records.values())

    def num_parameters(self) -> int:
        return sum(int(a.size) for _, _, a in self.items())

    def copy(self) -> "Payload":
        return Payload({n: {r: a.copy() for r, a in rec.items()} for n, rec in self._records.items()})

    def shared(self) -> "Payload":
        """A new payload over the same tensors, as read-only views (no data copied): what a transform
        that replaces some records starts from, so it copies only what it changes. Replacing a record
        in it leaves this payload as it was; writing into a shared tensor through it is refused."""
        return Payload({n: {r: _read_only_view(a) for r, a in rec.items()} for n, rec in self._records.items()})

    def astype(self, dtype: np.dtype | str) -> "Payload":
        """Float tensors converted; integer and bool tensors kept exact."""
        return Payload({n: {r: (a.astype(dtype) if a.dtype.kind == "f" else a) for r, a in rec.items()}
                        for n, rec in self._records.items()})

    def remove(self, node: int, role: str | None = None) -> None:
        if role is None:
            self._records.pop(node, None)
        else:
            self._records.get(node, {}).pop(role, None)

    def flat(self) -> dict[str, np.ndarray]:
        """Tensors keyed ``"<node id>.<role>"`` (the safetensors naming)."""
        return {f"{n}.{r}": a for n, r, a in self.items()}

    def hashes(self) -> dict[str, str]:
        return {k: tensor_sha256(a) for k, a in self.flat().items()}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Payload):
            return NotImplemented
        a, b = self.flat(), other.flat()
        return a.keys() == b.keys() and all(
            a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and np.array_equal(a[k], b[k], equal_nan=True)
            for k in a)

    def __repr__(self) -> str:
        return f"Payload({len(self._records)} nodes, {len(self)} tensors, {self.num_parameters()} values)"


def role_shape(node: Node, role: str, parent_shapes: Sequence[Shape]) -> Shape:
    """The shape the registry's ParamRole declares for ``node``'s payload tensor ``role`` (the one
    definition every reader, writer and evaluator uses)."""
    for r in node.spec.params:
        if r.name == role:
            return tuple(r.shape(node.attrs, parent_shapes, node.out_shape))
    raise KeyError(f"{node.kind} has no payload role {role!r}")


def foreign_record_errors(g: Graph, payload: Payload) -> list[PayloadError]:
    """Records keyed by a node that is not in the graph, or by a role its node does not have."""
    errors: list[PayloadError] = []
    for nid in payload.nodes():
        if not 0 <= nid < len(g.nodes):
            errors.append(PayloadError(f"payload: record for node {nid}, which is not in the graph", node=nid))
            continue
        node = g.nodes[nid]
        roles = {r.name for r in (node.spec.params if node.spec else ())}
        for role in payload.record(nid):
            if role not in roles:
                errors.append(PayloadError(f"payload: node {nid} ({node.kind}) has no role `{role}`", node=nid,
                                           op=node.kind))
    return errors


def payload_errors(g: Graph, payload: Payload) -> list[PayloadError]:
    """Every record that does not fit its node: unknown node, unknown role, missing role, shape."""
    errors = foreign_record_errors(g, payload)
    for node in g.nodes:
        if node.spec is None:
            continue
        parent_shapes = [g.nodes[p].out_shape for p in node.parents if 0 <= p < len(g.nodes)]
        for role in node.spec.params:
            arr = payload.get(node.id, role.name)
            if arr is None:
                if not role.optional:
                    errors.append(PayloadError(f"payload: node {node.id} ({node.kind}) is missing `{role.name}`",
                                               node=node.id, op=node.kind))
                continue
            try:
                want = role_shape(node, role.name, parent_shapes)
            except (IndexError, KeyError, ZeroDivisionError, TypeError):
                continue  # the graph itself is malformed; check() reports that
            if tuple(arr.shape) != want:
                errors.append(PayloadError(
                    f"payload: node {node.id} ({node.kind}) `{role.name}` has shape {fmt_shape(arr.shape)}, "
                    f"expected {fmt_shape(want)}", node=node.id, op=node.kind))
    return errors
