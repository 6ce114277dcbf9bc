"""The one evaluator loop, over semantic domains: float64, float32, interval (and linear bounds to come).

``run`` walks the nodes left to right (no recursion, so depth is unlimited), gives each node its
parents' values and its payload record, calls the domain's rule for the node's kind, checks the
result against the node's declared shape, and drops every value right after its last reader unless
the whole table is asked for, so memory follows the live frontier, not the graph, in every domain.

Errors. A rule refuses bad input by raising ``BridgeError`` (payload mismatch, a domain violation)
or the domain's refusal type (``DomainError`` for intervals), which becomes the domain's error naming
the node. Anything else a rule raises is either a malformed node that ``check`` was told not to
look at (``check=False``: the node's own shape rule then reports it, as TorchLean's ``denoteAll``
checks each node locally) or a bug: a bug keeps its traceback, with the node added as a note, the
way ``torch.fx.Interpreter`` does.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from torchlean_bridge.errors import BridgeError, EvalError, IntervalError
from torchlean_bridge.graph import Graph, Node
from torchlean_bridge.ops import BOOL, INT64, fmt_shape

from .float_env import FLUSH_MESSAGE, flushes_subnormals
from .interval_arith import DomainError
from .interval_round import CleanBox, clean
from .records import fail
from .rules import EXACT_RULES, FLOAT_RULES, INTERVAL_RULES
from .rules.affine32 import FLOAT32_OVERRIDES
from .schedule import schedule

__all__ = ["Domain", "FloatDomain", "ExactDomain", "IntervalDomain", "run", "node_value", "DTYPES", "PRODUCTS",
           "DEFAULT_PRODUCTS"]

Record = Mapping[str, np.ndarray]
DTYPES = {"float64": np.dtype(np.float64), "float32": np.dtype(np.float32)}
_RESULT_KINDS = {INT64: np.dtype(np.int64), BOOL: np.dtype(bool)}


class Domain:
    """What the loop needs from a domain: its rule table and how it calls, checks and reports."""

    name: str
    rules: Mapping[str, Callable[..., Any]]
    refusals: tuple[type[Exception], ...] = ()

    def call(self, rule: Callable[..., Any], node: Node, parents: Sequence[Any], record: Record) -> Any:
        raise NotImplementedError

    def finish(self, node: Node, value: Any) -> Any:
        """The rule's result checked against the node (shape, element type)."""
        raise NotImplementedError

    def shape(self, value: Any) -> tuple[int, ...]:
        raise NotImplementedError

    def fail(self, node: Node, message: str) -> BridgeError:
        raise NotImplementedError

    def no_rule(self, node: Node) -> BridgeError:
        return self.fail(node, f"no {self.name} rule for op kind `{node.kind}`")

    def environment_error(self, message: str) -> BridgeError:
        """A refusal that concerns the whole run, not a node."""
        raise NotImplementedError


class FloatDomain(Domain):
    """TorchLean's ``denote`` at Float (binary64, the reference) or binary32 (PyTorch's arithmetic)."""

    rules = FLOAT_RULES

    def __init__(self, dtype: np.dtype) -> None:
        self.dtype = dtype
        self.name = dtype.name

    def call(self, rule, node, parents, record):
        return np.asarray(rule(node, parents, record, self.dtype))

    def finish(self, node, value):
        if value.shape != node.out_shape:
            raise fail(node, f"IR eval: node {node.id}: produced shape mismatch: produced={fmt_shape(value.shape)}, "
                             f"declared={fmt_shape(node.out_shape)} ({node.summary()})")
        want = _RESULT_KINDS.get(node.dtype, self.dtype)
        return value if value.dtype == want else value.astype(want)

    def shape(self, value):
        return value.shape

    def fail(self, node, message):
        return fail(node, message if message.startswith("IR eval") else f"IR eval: node {node.id}: {message}")

    def no_rule(self, node):
        return fail(node, f"IR eval: node {node.id}: no float semantics for op kind `{node.kind}`")

    def environment_error(self, message):
        return EvalError(f"IR eval: {message}")


class _Overlay(Mapping):
    """``first``'s rule where it has one, else ``rest``'s."""

    def __init__(self, first: Mapping[str, Any], rest: Mapping[str, Any]) -> None:
        self.first, self.rest = first, rest

    def __getitem__(self, kind: str) -> Any:
        rule = self.first.get(kind)
        return rule if rule is not None else self.rest[kind]

    def __iter__(self):
        return iter(set(self.first) | set(self.rest))

    def __len__(self) -> int:
        return len(set(self.first) | set(self.rest))


class ExactDomain(FloatDomain):
    """float64 with TorchLean's accumulation orders and C libm (``EXACT_RULES``): the value table of
    TorchLean's ``Graph.denoteAll`` at Float, bit for bit, on the v1 kinds; ext ops (not part of
    TorchLean) run their documented float64 rule."""

    rules = _Overlay(EXACT_RULES, FLOAT_RULES)

    def __init__(self) -> None:
        super().__init__(DTYPES["float64"])
        self.name = "exact float64"


PRODUCTS = ("float64", "float32")
# the default of the public IBP entry points: float32 BLAS products with rigorous error bounds, used per
# layer only where their rounding costs at most 2**-9 of the width (``rules.affine32``). IBP is the fast,
# loose member of the bound family; float64 products (``products="float64"``) cost up to twice the time
# for the last 1e-3 of a width, and CROWN keeps them for its own intermediate boxes.
DEFAULT_PRODUCTS = "float32"


class IntervalDomain(Domain):
    """Boxes ``(lo, hi)`` of float64 arrays enclosing each node's exact real value; with
    ``products="float32"`` the linear and conv products run in float32 with rigorous error bounds
    (``rules.affine32``: about twice as fast on large layers, slightly wider)."""

    name = "interval"
    rules = INTERVAL_RULES
    refusals = (DomainError,)

    def __init__(self, products: str = "float64") -> None:
        if products not in PRODUCTS:
            raise ValueError(f"products must be one of {', '.join(PRODUCTS)}, got {products!r}")
        if products == "float32":
            self.rules = _Overlay(FLOAT32_OVERRIDES, INTERVAL_RULES)

    def call(self, rule, node, parents, record):
        value = rule(node, parents, record)
        if type(value) is CleanBox:
            return value
        lo, hi = value
        return np.asarray(lo, dtype=np.float64), np.asarray(hi, dtype=np.float64)

    def finish(self, node, value):
        lo, hi = value if type(value) is CleanBox else clean(*value)
        if lo.shape != node.out_shape or hi.shape != node.out_shape:
            raise self.fail(node, f"rule produced shape {fmt_shape(lo.shape)}, declared {fmt_shape(node.out_shape)}")
        return lo, hi

    def shape(self, value):
        return value[0].shape

    def fail(self, node, message):
        return IntervalError(f"interval: node {node.id} ({node.kind}): {message}", node=node.id, op=node.kind,
                             source=str(node.source) if node.source else None)

    def environment_error(self, message):
        return IntervalError(f"interval: {message}")


def _malformed(node: Node, parent_shapes: Sequence[tuple[int, ...]]) -> str | None:
    """The node's own shape rule on its parents' shapes: its message if the node is malformed."""
    spec = node.spec
    if spec is None:
        return f"unknown op kind `{node.kind}`"
    try:
        inferred = tuple(spec.infer(node.attrs, list(parent_shapes), node.out_shape))
    except BridgeError as e:  # ShapeRuleError (a bare rule message) or GraphError (attributes)
        return f"{node.kind}: {e.message}"
    if inferred != tuple(node.out_shape):
        return (f"outShape mismatch: inferred={fmt_shape(inferred)}, declared={fmt_shape(node.out_shape)} "
                f"({node.summary()})")
    return None


def node_value(domain: Domain, node: Node, parents: Sequence[Any], record: Record) -> Any:
    """One node's value in ``domain`` (inside the caller's ``np.errstate``)."""
    rule = domain.rules.get(node.kind)
    if rule is None:
        raise domain.no_rule(node)
    try:
        value = domain.call(rule, node, parents, record)
    except BridgeError:
        raise
    except domain.refusals as e:
        raise domain.fail(node, str(e)) from None
    except Exception as e:
        malformed = _malformed(node, [domain.shape(p) for p in parents]) if node.kind != "input" else None
        if malformed is not None:
            raise domain.fail(node, malformed) from e
        e.add_note(f"while evaluating node {node.id} in the {domain.name} domain: {node.summary()}")
        raise
    return domain.finish(node, value)


def run(g: Graph, domain: Domain, seeds: Mapping[int, Any], record: Callable[[int], Record],
        all_nodes: bool = False, local_checks: bool = False,
        resume: tuple[int, Sequence[Any]] | None = None) -> list[Any]:
    """The value of every node (``all_nodes``) or of the outputs, in ``domain``.

    ``seeds`` maps each input node id to its value (the caller's array, or a box) as read at entry;
    ``record(nid)`` is the node's payload record; values die after their last reader (the graph's
    ``schedule``, computed once per graph). ``local_checks`` (a graph whose shapes were not checked up
    front) also runs each node's shape rule on its parents' shapes once the rule has run (its own checks
    and messages come first, as in TorchLean's ``denoteAll``), so a malformed node is refused, never
    silently broadcast. ``resume`` = (start, values): every node before ``start`` takes its value from
    ``values`` (an ``all_nodes`` table of an earlier run whose records agree before ``start``) instead
    of being evaluated again: an audit re-evaluating one changed layer starts there.
    """
    if flushes_subnormals():
        raise domain.environment_error(FLUSH_MESSAGE)
    values: list[Any] = [None] * len(g.nodes)
    plan = schedule(g)
    last, in_range, value_of = plan.last_reader, plan.parents_in_range, values.__getitem__
    with np.errstate(all="ignore"):  # partial ops check their domains; overflow to inf is a value
        start, known = resume if resume is not None else (0, ())
        for node in g.nodes:
            nid = node.id
            if nid < start:
                values[nid] = known[nid]
                continue
            if node.kind == "input":
                if nid not in seeds:
                    raise domain.fail(node, "input node is not listed among the graph inputs")
                parents = [seeds[nid]]
            elif in_range:
                parents = list(map(value_of, node.parents))
                for value in parents:
                    if value is None:  # a parent at or after this node
                        p = next(p for p in node.parents if values[p] is None)
                        raise _not_evaluated(domain, node, p, values)
            else:
                parents = [_parent(domain, node, p, values) for p in node.parents]
            try:
                values[nid] = node_value(domain, node, parents, record(nid))
            except MemoryError:  # within every size check, yet more than this machine holds
                raise domain.fail(node, "evaluating it needs more memory than is available") from None
            if local_checks and node.kind != "input":  # after the rule's own checks and messages
                malformed = _malformed(node, [domain.shape(p) for p in parents])
                if malformed is not None:
                    raise domain.fail(node, malformed)
            if all_nodes:
                continue
            for p in node.parents:
                if last[p] == nid:
                    values[p] = None
            if last[nid] == nid:  # read by nobody and not an output
                values[nid] = None
    if all_nodes:
        return values
    out = []
    for o in g.outputs:
        if not 0 <= o < len(values):
            raise EvalError(f"IR eval: outputId out of bounds: {o}")
        out.append(values[o])
    return out


def _parent(domain: Domain, node: Node, p: int, values: list[Any]) -> Any:
    value = values[p] if 0 <= p < len(values) else None
    if value is None:
        raise _not_evaluated(domain, node, p, values)
    return value


def _not_evaluated(domain: Domain, node: Node, p: int, values: list[Any]) -> BridgeError:
    available = sum(v is not None for v in values)
    return domain.fail(node, f"parent {p} has not been evaluated (available values: {available}) "
                             f"({node.summary()})")
