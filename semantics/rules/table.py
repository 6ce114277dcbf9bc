"""Rule tables keyed by op kind, one per semantic domain, and the registration helpers every family uses.

A family module (``elementwise``, ``activations``, ``reductions``, ...) files each op's rules side by
side, one per domain, the way auto_LiRPA's operator modules keep an op's forward and its bounds
together::

    @float_rule("relu")
    def relu(node, xs, rec, dt): ...        # xs: parent arrays; dt: float64 or float32

    @interval_rule("relu")
    def relu_box(node, boxes, rec): ...     # boxes: parent (lo, hi) pairs of float64 arrays

``EXACT_RULES`` holds the exact float64 mode's rules (TorchLean's fold orders and C libm, see
``semantics.folds``) for the v1 kinds whose default float64 rule rounds differently; every other
kind runs its ``FLOAT_RULES`` rule in that mode.

``rec`` is the node's payload record (``{role: ndarray}``); rules read it through ``read_params``,
which checks it against the node (``semantics.records``) and converts it for the domain, or returns
the parameters an evaluator prepared once (``PREPARED``). A new domain (linear bounds) adds one
``RuleTable`` here and files its rules next to the others.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence, TypeVar

import numpy as np

from torchlean_bridge.graph import Node

from ..interval_round import CleanBox
from ..records import PREPARED, READERS, fail

__all__ = ["RuleTable", "FLOAT_RULES", "INTERVAL_RULES", "EXACT_RULES", "float_rule", "interval_rule", "exact_rule", "float_unary",
           "float_binary", "interval_pointwise", "on_ends", "POINTWISE_INTERVAL_KINDS", "read_params",
           "float_params", "domain_error", "FloatRule", "IntervalRule", "Box"]

F = TypeVar("F", bound=Callable)
Box = tuple[np.ndarray, np.ndarray]
Record = Mapping[str, np.ndarray]
FloatRule = Callable[[Node, Sequence[np.ndarray], Record, np.dtype], np.ndarray]
IntervalRule = Callable[[Node, Sequence[Box], Record], Box]
F64 = np.dtype(np.float64)


class RuleTable(dict):
    """``{kind: rule}`` for one domain, plus ``params``: ``{kind: convert(node, record, *args)}``, how
    the domain turns a checked payload record into what its rules compute with."""

    def __init__(self, domain: str) -> None:
        super().__init__()
        self.domain = domain
        self.params: dict[str, Callable[..., Any]] = {}

    def register(self, *kinds: str) -> Callable[[F], F]:
        """``@table.register("relu", "tanh")`` files the function under each kind (once per kind)."""
        def register(fn: F) -> F:
            for k in kinds:
                assert k not in self, f"two {self.domain} rules for {k}"
                self[k] = fn
            return fn
        return register


FLOAT_RULES = RuleTable("float")
INTERVAL_RULES = RuleTable("interval")
# the exact float64 mode: TorchLean's accumulation orders and libm where they differ from FLOAT_RULES
EXACT_RULES = RuleTable("exact float64")
float_rule = FLOAT_RULES.register
interval_rule = INTERVAL_RULES.register
exact_rule = EXACT_RULES.register


def float_unary(kind: str, fn: Callable[[np.ndarray], np.ndarray]) -> None:
    FLOAT_RULES.register(kind)(lambda node, xs, rec, dt: fn(xs[0]))


def float_binary(kind: str, fn: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> None:
    FLOAT_RULES.register(kind)(lambda node, xs, rec, dt: fn(xs[0], xs[1]))


# kinds whose interval rule maps one box entrywise (registered through ``interval_pointwise``)
POINTWISE_INTERVAL_KINDS: set[str] = set()


def interval_pointwise(*kinds: str) -> Callable[[Callable[[Box, Mapping[str, Any]], Box]],
                                                Callable[[Box, Mapping[str, Any]], Box]]:
    """An entrywise interval rule written as ``fn(box, attrs)``."""
    def register(fn):
        POINTWISE_INTERVAL_KINDS.update(kinds)
        INTERVAL_RULES.register(*kinds)(lambda node, ps, rec: fn(ps[0], node.attrs))
        return fn
    return register


def on_ends(*kinds: str, nan_free: bool = True) -> None:
    """Data movement and monotone ops computed exactly in floating point (relu, floor, max, slicing):
    the float rule applied to the lower ends and to the upper ends is the exact range. ``nan_free``:
    the op makes no NaN from numbers (the parents' ends never hold NaN), so its box needs no scan;
    False for ops whose attributes may bring one in (a clamp bound, a pad value)."""
    for kind in kinds:
        fn = FLOAT_RULES[kind]

        def run(node: Node, ps: Sequence[Box], rec: Record, fn: FloatRule = fn) -> Box:
            lo = np.asarray(fn(node, [p[0] for p in ps], rec, F64), dtype=np.float64)
            hi = np.asarray(fn(node, [p[1] for p in ps], rec, F64), dtype=np.float64)
            return CleanBox((lo, hi)) if nan_free else (lo, hi)
        INTERVAL_RULES.register(kind)(run)


def read_params(table: RuleTable, node: Node, rec: Record, parent_shape: Sequence[int], *args: Any) -> Any:
    """The node's payload parameters for ``table``'s domain: prepared once by an evaluator
    (``rec[PREPARED]``), or read from the raw record now (checked by ``records.READERS``, then
    converted by ``table.params``)."""
    prepared = rec.get(PREPARED)
    if prepared is not None:
        return prepared
    typed = READERS[node.kind](node, rec, tuple(parent_shape))
    convert = table.params.get(node.kind)
    return typed if convert is None else convert(node, typed, *args)


def float_params(node: Node, rec: Record, parent_shape: Sequence[int], dt: np.dtype) -> Any:
    return read_params(FLOAT_RULES, node, rec, parent_shape, dt)


def domain_error(node: Node, what: str) -> Exception:
    """A float evaluation refusal naming the node: ``IR eval: node 3: log2: input contains ...``."""
    return fail(node, f"IR eval: node {node.id}: {node.kind}: {what}")


def stored_entries(a: np.ndarray) -> np.ndarray:
    """``a`` with every broadcast axis (stride 0) cut to length 1: the same set of values, read once.
    A check over a broadcast operand (a divisor constant broadcast over an activation) then scans the
    constant, not the activation's size: on ConvMixer's GELU a zero test took four times the division."""
    return a[tuple(slice(0, 1) if s == 0 and n > 1 else slice(None) for s, n in zip(a.strides, a.shape))]
