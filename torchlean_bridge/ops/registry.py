"""The op registry: one entry per op kind, holding everything the core knows about it.

An entry is the wire spelling, the dialect (``v1`` = a ``torchlean.ir.v1`` IR kind, ``v1-wire`` = a
value-graph form TorchLean's importer lowers, ``ext`` = our extension), the parent arity, the
attributes with their JSON field names, the one shape rule, the element-type rule and the payload
roles. Semantics and interval rules live in ``semantics/`` keyed by the same kind.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from ..errors import ShapeRuleError
from .contracts import Shape, fmt_array, fmt_shape

__all__ = [
    "Attr",
    "per_axis_attrs",
    "ParamRole",
    "OpSpec",
    "REGISTRY",
    "register",
    "get_op",
    "FLOAT",
    "INT64",
    "BOOL",
    "ELEMENT_TYPES",
    "int_only",
    "float_only",
    "same_as_parent",
]

FLOAT, INT64, BOOL = "float", "int64", "bool"
ELEMENT_TYPES = (FLOAT, INT64, BOOL)

_MISSING: Any = object()

# attribute value kinds; JSON decoding and validation of each lives in wire.py
ATTR_KINDS = ("nat", "nats", "int", "ints", "bool", "float", "opt_float", "str", "shape",
              "shapes", "bools")


@dataclass(frozen=True)
class Attr:
    """One op attribute: JSON field name, value kind, default, and a length tied to another attr."""

    name: str
    kind: str
    default: Any = _MISSING
    length_of: str | None = None  # e.g. "spatial_rank": list must have that many entries
    choices: tuple | None = None

    @property
    def required(self) -> bool:
        return self.default is _MISSING

    def __post_init__(self) -> None:
        assert self.kind in ATTR_KINDS, self.kind


def per_axis_attrs(*names: str) -> tuple[Attr, ...]:
    """``spatial_rank`` and one list of that many naturals per name (a window's geometry)."""
    return (Attr("spatial_rank", "nat"),) + tuple(Attr(n, "nats", length_of="spatial_rank") for n in names)


@dataclass(frozen=True)
class ParamRole:
    """A payload tensor an op reads: role name and its expected shape given the node."""

    name: str
    shape: Callable[[Mapping[str, Any], Sequence[Shape], Shape], Shape]
    optional: bool = False


ShapeRule = Callable[[Mapping[str, Any], Sequence[Shape], Shape], Shape]
DtypeRule = Callable[[Mapping[str, Any], Sequence[str], str], str]


def float_only(kind: str) -> DtypeRule:
    """Default element-type rule: float parents, float result (TorchLean's IR is float-only)."""
    return _only(kind, FLOAT)


def int_only(kind: str) -> DtypeRule:
    """Element-type rule of the exact integer ops: int64 parents, int64 result."""
    return _only(kind, INT64)


def _only(kind: str, element_type: str) -> DtypeRule:
    def rule(attrs: Mapping[str, Any], parents: Sequence[str], declared: str) -> str:
        for i, dt in enumerate(parents):
            if dt != element_type:
                raise ShapeRuleError(f"{kind}: operand {i} has element type {dt}, expected {element_type}")
        return element_type

    return rule


def same_as_parent(attrs: Mapping[str, Any], parents: Sequence[str], declared: str) -> str:
    """Element type of data-movement ops: whatever flows in flows out (all parents agree)."""
    if any(dt != parents[0] for dt in parents):
        raise ShapeRuleError(f"element types differ: {', '.join(parents)}")
    return parents[0]


@dataclass(frozen=True)
class OpSpec:
    kind: str
    dialect: str
    min_parents: int
    max_parents: int | None
    infer: ShapeRule
    attrs: tuple[Attr, ...] = ()
    dtype: DtypeRule | None = None
    params: tuple[ParamRole, ...] = ()
    describe_fn: Callable[[Mapping[str, Any]], str] | None = None
    v1_rewrite: Callable[[Mapping[str, Any], Sequence[Shape], Shape], tuple[str, dict]] | None = None
    doc: str = ""
    attr_index: dict[str, Attr] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        self.attr_index.update({a.name: a for a in self.attrs})

    @property
    def is_v1(self) -> bool:
        return self.dialect in ("v1", "v1-wire")

    def accepts_parents(self, count: int) -> bool:
        return self.min_parents <= count and (self.max_parents is None or count <= self.max_parents)

    def arity_text(self) -> str:
        if self.max_parents is None:
            return f"at least {self.min_parents}"
        return f"{self.min_parents}..{self.max_parents}"

    def element_type(self, attrs: Mapping[str, Any], parents: Sequence[str], declared: str) -> str:
        rule = self.dtype or float_only(self.kind)
        return rule(attrs, parents, declared)

    def describe(self, attrs: Mapping[str, Any]) -> str:
        """TorchLean's ``OpKind.describe``; ext ops print ``name(attr=value, ...)``."""
        if self.describe_fn is not None:
            return self.describe_fn(attrs)
        if not self.attrs:
            return self.kind
        parts = []
        for a in self.attrs:
            if a.name not in attrs:
                continue
            v = attrs[a.name]
            if a.kind in ("nats", "ints", "shape"):
                v = fmt_shape(v)
            elif a.kind == "shapes":
                v = "[" + ", ".join(fmt_shape(s) for s in v) + "]"
            parts.append(f"{a.name}={v}")
        return f"{self.kind}({', '.join(parts)})"

    def defaults(self) -> dict[str, Any]:
        return {a.name: a.default for a in self.attrs if not a.required}


REGISTRY: dict[str, OpSpec] = {}


def register(spec: OpSpec) -> OpSpec:
    if spec.kind in REGISTRY:
        raise ValueError(f"op {spec.kind!r} registered twice")
    REGISTRY[spec.kind] = spec
    return spec


def get_op(kind: str) -> OpSpec | None:
    return REGISTRY.get(kind)


# re-exported for the op tables
__all__ += ["fmt_array", "fmt_shape"]
