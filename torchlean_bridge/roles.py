"""The role map: external tensor name -> (node id, role, transform).

Every tensor an importer reads (state_dict key, ONNX initializer, exported-program parameter) is
bound explicitly. A tensor used by several nodes (tied weights) has one binding per use, and
``roles.uses(key)`` lists them. The transform is a small, applicable language, so binding a new
checkpoint replays exactly what the importer did:

``transpose`` (2-D), ``permute:1,0,2``, ``reshape:3,1,1``, ``cast:float64``; several joined by
``;`` apply left to right. ``None`` is identity.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from .errors import BridgeError

__all__ = ["Binding", "RoleMap", "apply_transform", "transform_shape"]


@dataclass(frozen=True)
class Binding:
    key: str
    node: int
    role: str
    transform: str | None = None

    def __post_init__(self) -> None:
        _validate(self.transform, self.key)

    def to_json(self) -> dict[str, Any]:
        d = {"key": self.key, "node": self.node, "role": self.role}
        if self.transform:
            d["transform"] = self.transform
        return d


def _steps(transform: str | None) -> list[tuple[str, str]]:
    if not transform:
        return []
    out = []
    for step in transform.split(";"):
        name, _, arg = step.strip().partition(":")
        out.append((name, arg))
    return out


def _ints(arg: str) -> tuple[int, ...]:
    return tuple(int(x) for x in arg.split(",") if x != "")


_CAST_TARGETS = frozenset(np.dtype(t).name for t in (np.float16, np.float32, np.float64, np.int8, np.int16, np.int32,
                                                     np.int64, np.uint8, np.uint16, np.uint32, np.uint64, np.bool_))


def _is_dtype(name: str) -> bool:
    return name in _CAST_TARGETS


def _validate(transform: str | None, key: str) -> None:
    """Reject a transform the grammar does not allow, naming the binding, before anything uses it."""
    for name, arg in _steps(transform):
        try:
            values = _ints(arg) if name in ("permute", "reshape") else ()
        except ValueError:
            values = None
        ok = {"transpose": arg == "",
              "permute": values is not None and sorted(values) == list(range(len(values))),
              "reshape": values is not None and all(v >= 0 for v in values),
              "cast": _is_dtype(arg)}.get(name, False)
        if not ok:
            raise BridgeError(f"role map: binding `{key}` has an invalid transform step `{name}"
                              f"{':' + arg if arg else ''}` (allowed: transpose, permute:<axes>, "
                              "reshape:<dims>, cast:<numpy dtype>)")


def apply_transform(transform: str | None, array: np.ndarray) -> np.ndarray:
    """Turn an external tensor into the payload tensor the binding describes."""
    a = np.asarray(array)
    try:
        return _apply_steps(transform, a)
    except ValueError as e:  # e.g. a reshape that does not fit this tensor
        raise BridgeError(f"transform `{transform}` cannot apply to a tensor of shape {list(a.shape)}: {e}") from None


def _apply_steps(transform: str | None, a: np.ndarray) -> np.ndarray:
    for name, arg in _steps(transform):
        if name == "transpose":
            if a.ndim != 2:
                raise BridgeError(f"transform transpose expects a matrix, got rank {a.ndim}")
            a = a.T
        elif name == "permute":
            a = np.transpose(a, _ints(arg))
        elif name == "reshape":
            a = a.reshape(_ints(arg))
        elif name == "cast":
            a = a.astype(arg)
        else:
            raise BridgeError(f"unknown role transform `{name}`")
    return np.asarray(a, order="C")


def transform_shape(transform: str | None, shape: Sequence[int]) -> tuple[int, ...]:
    """The payload shape an external tensor of ``shape`` has after the transform."""
    s = tuple(shape)
    for name, arg in _steps(transform):
        if name == "transpose":
            s = s[::-1] if len(s) == 2 else s
        elif name == "permute":
            s = tuple(s[i] for i in _ints(arg))
        elif name == "reshape":
            s = _ints(arg)
    return s


class RoleMap(Mapping[str, Binding]):
    """Read-only mapping from external tensor names to their (first) binding."""

    def __init__(self, bindings: Sequence[Binding] = ()) -> None:
        self._bindings: list[Binding] = list(bindings)
        self._by_key: dict[str, list[Binding]] = {}
        for b in self._bindings:
            self._by_key.setdefault(b.key, []).append(b)

    def __getitem__(self, key: str) -> Binding:
        return self._by_key[key][0]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_key)

    def __len__(self) -> int:
        return len(self._by_key)

    def uses(self, key: str) -> list[Binding]:
        return list(self._by_key.get(key, []))

    def bindings(self) -> list[Binding]:
        return list(self._bindings)

    def for_node(self, node: int) -> list[Binding]:
        return [b for b in self._bindings if b.node == node]

    def key_of(self, node: int, role: str) -> str | None:
        for b in self._bindings:
            if b.node == node and b.role == role:
                return b.key
        return None

    def with_binding(self, binding: Binding) -> "RoleMap":
        return RoleMap(self._bindings + [binding])

    def renumbered(self, mapping: Mapping[int, int]) -> "RoleMap":
        """Bindings moved to new node ids (dropped when the node no longer exists)."""
        return RoleMap([Binding(b.key, mapping[b.node], b.role, b.transform) for b in self._bindings
                        if b.node in mapping])

    def to_json(self) -> list[dict[str, Any]]:
        return [b.to_json() for b in self._bindings]

    @classmethod
    def from_json(cls, data: Any) -> "RoleMap":
        if not isinstance(data, list):
            raise BridgeError("roles: expected a JSON list of bindings")
        out = []
        for i, d in enumerate(data):
            if not isinstance(d, dict) or not isinstance(d.get("key"), str) \
                    or not isinstance(d.get("node"), int) or isinstance(d.get("node"), bool) \
                    or not isinstance(d.get("role"), str):
                raise BridgeError(f"roles[{i}]: expected {{key: str, node: int, role: str, transform?: str}}, "
                                  f"got {d!r}"[:300])
            t = d.get("transform")
            if t is not None and not isinstance(t, str):
                raise BridgeError(f"roles[{i}].transform: expected string, got {t!r}")
            out.append(Binding(d["key"], d["node"], d["role"], t))
        return cls(out)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RoleMap):
            return NotImplemented
        return self._bindings == other._bindings

    def __repr__(self) -> str:
        return f"RoleMap({len(self._bindings)} bindings, {len(self)} keys)"
