"""The role map: external tensor name -> (node id, role, transform).

Every tensor an importer reads (state_dict key, ONNX initializer, exported-program parameter) is
bound explicitly. A tensor used by several nodes (tied weights) has one binding per use, and
``roles.uses(key)`` lists them. The transform is a small, applicable language, so binding a new
checkpoint replays exactly what the importer did. ``Transform`` is the typed form (parsed once,
composed by one rule for every importer); its text is the on-disk spelling (docs/formats.md):

``transpose`` (2-D), ``permute:1,0,2``, ``reshape:3,1,1``, ``cast:float64``; several joined by
``;`` apply left to right. ``None`` is identity.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from .errors import BridgeError

__all__ = ["Binding", "RoleMap", "Step", "Transform", "apply_transform", "transform_shape"]


@dataclass(frozen=True)
class Binding:
    key: str
    node: int
    role: str
    transform: str | None = None

    def __post_init__(self) -> None:
        Transform.parse(self.transform, self.key)  # refuses an invalid step, naming the binding

    @property
    def steps(self) -> "Transform":
        """The transform, typed."""
        return Transform.parse(self.transform, self.key)

    def to_json(self) -> dict[str, Any]:
        d = {"key": self.key, "node": self.node, "role": self.role}
        if self.transform:
            d["transform"] = self.transform
        return d


_CAST_TARGETS = frozenset(np.dtype(t).name for t in (np.float16, np.float32, np.float64, np.int8, np.int16, np.int32,
                                                     np.int64, np.uint8, np.uint16, np.uint32, np.uint64, np.bool_))
_GRAMMAR = "allowed: transpose, permute:<axes>, reshape:<dims>, cast:<numpy dtype>"


@dataclass(frozen=True)
class Step:
    """One transform step: ``transpose`` (2-D), ``permute`` (axes), ``reshape`` (dims) or ``cast`` (dtype)."""

    name: str
    dims: tuple[int, ...] = ()  # permute axes / reshape dims
    dtype: str | None = None  # cast target

    def __str__(self) -> str:
        if self.name in ("permute", "reshape"):
            return f"{self.name}:{','.join(map(str, self.dims))}"
        return f"cast:{self.dtype}" if self.name == "cast" else self.name

    @classmethod
    def parse(cls, text: str, key: str = "?") -> "Step":
        """A step from its on-disk spelling; an invalid one is refused naming the binding."""
        name, _, arg = text.strip().partition(":")
        try:
            dims = tuple(int(x) for x in arg.split(",") if x != "") if name in ("permute", "reshape") else ()
        except ValueError:
            dims = None
        ok = {"transpose": arg == "",
              "permute": dims is not None and sorted(dims) == list(range(len(dims))),
              "reshape": dims is not None and all(v >= 0 for v in dims),
              "cast": arg in _CAST_TARGETS}.get(name, False)
        if not ok:
            raise BridgeError(f"role map: binding `{key}` has an invalid transform step `{name}"
                              f"{':' + arg if arg else ''}` ({_GRAMMAR})")
        return cls(name, dims or (), arg if name == "cast" else None)

    def apply(self, a: np.ndarray) -> np.ndarray:
        if self.name == "transpose":
            if a.ndim != 2:
                raise BridgeError(f"transform transpose expects a matrix, got rank {a.ndim}")
            return a.T
        if self.name == "permute":
            return np.transpose(a, self.dims)
        if self.name == "reshape":
            return a.reshape(self.dims)
        return a.astype(self.dtype)

    def shape(self, s: tuple[int, ...]) -> tuple[int, ...]:
        if self.name == "transpose":
            return s[::-1] if len(s) == 2 else s
        if self.name == "permute":
            return tuple(s[i] for i in self.dims)
        return self.dims if self.name == "reshape" else s

    @property
    def perm(self) -> tuple[int, ...] | None:
        """The axis permutation of a transpose/permute step (None for the others)."""
        return (1, 0) if self.name == "transpose" else self.dims if self.name == "permute" else None


@dataclass(frozen=True)
class Transform:
    """A binding's transform: steps applied left to right to the external tensor.

    ``then`` appends a step in canonical form, the one simplification rule for every importer:
    consecutive permutations compose (an identity disappears; the 2-D swap is spelled ``transpose``),
    consecutive reshapes keep the last, and a reshape to the shape the tensor already has (when the
    caller knows it) is dropped. Casts are kept as written. ``str()`` is the on-disk spelling.
    """

    steps: tuple[Step, ...] = ()

    @classmethod
    def parse(cls, text: "str | Transform | None", key: str = "?") -> "Transform":
        if isinstance(text, Transform):
            return text
        return cls(tuple(Step.parse(t, key) for t in text.split(";"))) if text else cls()

    @classmethod
    def of_layout(cls, steps: Sequence[tuple[str, Sequence[int]]], source_shape: Sequence[int]) -> "Transform":
        """The canonical transform for a chain of ``("permute", axes)`` / ``("reshape", dims)`` steps."""
        out, shape = cls(), tuple(source_shape)
        for name, arg in steps:
            out = out.then(Step(name, tuple(arg)), shape)
            shape = Step(name, tuple(arg)).shape(shape)
        return out

    def then(self, step: "Step | str", shape: Sequence[int] | None = None) -> "Transform":
        """This transform followed by ``step``; ``shape`` is the tensor's shape before it, if known."""
        step = Step.parse(step) if isinstance(step, str) else step
        steps = list(self.steps)
        last = steps[-1] if steps else None
        if step.perm is not None:
            perm = step.perm
            if last is not None and last.perm is not None and len(last.perm) == len(perm):
                perm = tuple(last.perm[i] for i in perm)
                steps.pop()
            if perm != tuple(range(len(perm))):
                steps.append(Step("transpose") if perm == (1, 0) else Step("permute", perm))
        elif step.name == "reshape":
            if last is not None and last.name == "reshape":
                steps.pop()
                shape = None  # the shape before the dropped reshape no longer applies
            if shape is None or tuple(shape) != step.dims:
                steps.append(step)
        else:
            steps.append(step)
        return Transform(tuple(steps))

    @property
    def text(self) -> str | None:
        """The on-disk spelling, None for the identity."""
        return ";".join(map(str, self.steps)) or None

    def __str__(self) -> str:
        return self.text or ""

    def __bool__(self) -> bool:
        return bool(self.steps)

    def apply(self, array: np.ndarray) -> np.ndarray:
        """Turn an external tensor into the payload tensor the binding describes."""
        a = np.asarray(array)
        try:
            for step in self.steps:
                a = step.apply(a)
        except ValueError as e:  # e.g. a reshape that does not fit this tensor
            raise BridgeError(f"transform `{self.text}` cannot apply to a tensor of shape "
                              f"{list(np.shape(array))}: {e}") from None
        return np.asarray(a, order="C")

    def shape(self, shape: Sequence[int]) -> tuple[int, ...]:
        """The payload shape an external tensor of ``shape`` has after the transform."""
        s = tuple(shape)
        for step in self.steps:
            s = step.shape(s)
        return s


def apply_transform(transform: str | Transform | None, array: np.ndarray) -> np.ndarray:
    """Turn an external tensor into the payload tensor the binding describes."""
    return Transform.parse(transform).apply(array)


def transform_shape(transform: str | Transform | None, shape: Sequence[int]) -> tuple[int, ...]:
    """The payload shape an external tensor of ``shape`` has after the transform."""
    return Transform.parse(transform).shape(shape)


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
