"""Structural and shape validation with TorchLean's message templates (spec sections 4.4-4.6).

``check_well_formed`` (ids, arity, parents below) then ``check_shapes`` (every declared shape and
element type equals the rule's result). Where TorchLean returns a bare rule message we prefix the
node: ``IR graph: node 7: add: shape mismatch: [2, 3] vs [3]``. The collecting mode reports every
problem once: a node whose parent is already broken is skipped, not re-reported as a cascade.
"""

from __future__ import annotations

from .errors import GraphError, ShapeRuleError
from .gcpause import gc_paused
from .graph import Graph, Node
from .ops import Shape, fmt_shape, numel
from .ops.contracts import DEFAULT_ELEMENT_LIMIT, current_element_limit, element_limit
from .ops.registry import float_only

__all__ = ["check", "check_well_formed", "check_shapes", "infer_shapes", "DEFAULT_MAX_ELEMENTS",
           "check_size"]

DEFAULT_MAX_ELEMENTS = DEFAULT_ELEMENT_LIMIT


def _err(node: Node | None, message: str) -> GraphError:
    return GraphError(message, node=node.id if node else None, op=node.kind if node else None,
                      source=str(node.source) if node is not None and node.source else None)


def check_size(shape: Shape, limit: int, where: str) -> None:
    """Refuse a declared shape before anything of that size could be allocated."""
    if any(d < 0 for d in shape):
        raise GraphError(f"{where}: declared shape {fmt_shape(shape)} has a negative extent")
    n = numel(shape)
    if n > limit:
        raise GraphError(f"{where}: declared shape {fmt_shape(shape)} has {n} elements, "
                         f"above the limit of {limit} (raise max_elements to allow it)")
    if any(d > limit for d in shape):  # even next to a 0 extent: numpy cannot lay such an array out
        raise GraphError(f"{where}: declared shape {fmt_shape(shape)} has an extent above the limit of {limit}")


def _structure_errors(g: Graph) -> tuple[list[GraphError], set[int]]:
    errors: list[GraphError] = []
    broken: set[int] = set()
    arity: dict[str, tuple[int, int | None]] = {}  # each kind's parent count bounds, looked up once
    for i, n in enumerate(g.nodes):
        if n.id != i:
            errors.append(_err(n, f"IR graph: id discipline violated at index {i}: nodes[{i}].id = {n.id}"))
            broken.add(i)
            continue
        bounds = arity.get(n.kind)
        if bounds is None:
            spec = n.spec
            if spec is None:
                errors.append(_err(n, f"IR graph: node {i}: unknown op kind `{n.kind}`"))
                broken.add(i)
                continue
            bounds = arity[n.kind] = (spec.min_parents, spec.max_parents)
        parents = n.parents
        k = len(parents)
        if k < bounds[0] or (bounds[1] is not None and k > bounds[1]):
            errors.append(_err(n, f"IR graph: node {i}: bad parent count for {n.kind}: expected "
                                  f"{n.spec.arity_text()}, got {k} ({n.summary()})"))
            broken.add(i)
            continue
        if parents and max(parents) >= i:
            p = next(p for p in parents if not p < i)
            errors.append(_err(n, f"IR graph: node {i}: parent id {p} is not < {i} ({n.summary()})"))
            broken.add(i)
    errors.extend(_interface_errors(g))
    return errors, broken


def _interface_errors(g: Graph) -> list[GraphError]:
    errors = []
    for role, ids in (("input", g.inputs), ("output", g.outputs)):
        for nid in ids:
            if not 0 <= nid < len(g.nodes):
                errors.append(GraphError(f"IR graph: node id out of bounds: {nid}", node=nid))
            elif role == "input" and g.nodes[nid].kind != "input":
                errors.append(_err(g.nodes[nid], f"IR graph: input id {nid} designates `{g.nodes[nid].kind}`, "
                                                 "not `input`"))
    listed = set(g.inputs)
    unlisted = sorted((n for n in g.nodes if n.kind == "input" and n.id not in listed), key=lambda n: n.id)
    if unlisted:  # names the first unlisted input node, so a listing can point at it
        errors.append(_err(unlisted[0], f"IR graph: input nodes {sorted({n.id for n in unlisted})} are not listed "
                                        "among the graph inputs"))
    if not g.outputs:
        errors.append(GraphError("IR graph: graph has no outputs"))
    return errors


def _infer_node(n: Node, parent_shapes: list[Shape]) -> Shape:
    return tuple(n.spec.infer(n.attrs, parent_shapes, n.out_shape))


def _shape_errors(g: Graph, broken: set[int], max_elements: int) -> tuple[list[GraphError], list[Shape | None]]:
    errors: list[GraphError] = []
    inferred: list[Shape | None] = [None] * len(g.nodes)
    nodes = g.nodes
    rules: dict[str, tuple] = {}  # each kind's shape and element-type rules, looked up once
    sized: set[Shape] = set()  # declared shapes already found within the limit
    for i, n in enumerate(nodes):
        if broken and (i in broken or any(p in broken for p in n.parents)):
            broken.add(i)
            continue
        kind_rules = rules.get(n.kind)
        if kind_rules is None:
            spec = n.spec
            kind_rules = rules[n.kind] = (spec.infer, spec.dtype or float_only(n.kind))
        infer, element_type = kind_rules
        parents = [nodes[p].out_shape for p in n.parents]
        try:
            if n.out_shape not in sized:
                check_size(n.out_shape, max_elements, f"IR graph: node {i}")
                sized.add(n.out_shape)
            shape = tuple(infer(n.attrs, parents, n.out_shape))
            dtype = element_type(n.attrs, [nodes[p].dtype for p in n.parents], n.dtype)
        except ShapeRuleError as e:
            errors.append(_err(n, f"IR graph: node {i}: {e.message}"))
            broken.add(i)
            continue
        except GraphError as e:
            errors.append(_err(n, e.message))
            broken.add(i)
            continue
        inferred[i] = shape
        if shape != n.out_shape:
            errors.append(_err(n, f"IR graph: node {i}: outShape mismatch: inferred={fmt_shape(shape)}, "
                                  f"declared={fmt_shape(n.out_shape)} ({n.summary()})"))
            broken.add(i)
        elif dtype != n.dtype:
            errors.append(_err(n, f"IR graph: node {i}: element type mismatch: inferred={dtype}, "
                                  f"declared={n.dtype} ({n.summary()})"))
            broken.add(i)
    return errors, inferred


def _validated(g: Graph, max_elements: int) -> bool:
    """Whether ``check`` already passed ``g`` under this element limit or a smaller one."""
    limit = getattr(g, "validated_under", None)
    return limit is not None and max_elements >= limit


def _mark_validated(g: Graph, max_elements: int) -> None:
    limit = getattr(g, "validated_under", None)
    object.__setattr__(g, "validated_under", max_elements if limit is None else min(limit, max_elements))


def _known_well_formed(g: Graph) -> bool:
    """Whether ``check_well_formed`` or ``check`` already passed ``g`` (a graph is immutable)."""
    return getattr(g, "well_formed", False) or getattr(g, "validated_under", None) is not None


def mark_well_formed(g: Graph) -> None:
    """Record that ``g`` passed every ``check_well_formed`` test (a reader that proved them itself)."""
    object.__setattr__(g, "well_formed", True)


def check_well_formed(g: Graph, collect: bool = False) -> list[GraphError]:
    if _known_well_formed(g):
        return []
    errors, _ = _structure_errors(g)
    if errors and not collect:
        raise errors[0]
    if not errors:
        object.__setattr__(g, "well_formed", True)
    return errors


@gc_paused
def check(g: Graph, collect: bool = False, max_elements: int | None = None) -> list[GraphError]:
    """Well-formedness then shapes. Raises the first problem, or returns all of them with collect.
    ``max_elements`` (default: the current ``element_limit``) caps declared shapes and op buffers.

    A graph that passes carries that fact (``Graph.validated_under``, the limit it passed under), so
    the evaluator, the bound propagators and the runners calling ``check`` again on the same graph do
    not re-run the rules (a graph is immutable)."""
    limit = current_element_limit() if max_elements is None else max_elements
    if _validated(g, limit):
        return []
    structural, broken = ([], set()) if _known_well_formed(g) else _structure_errors(g)
    if structural and not collect:
        raise structural[0]
    if not structural:
        object.__setattr__(g, "well_formed", True)
    with element_limit(limit):
        shape_errors, _ = _shape_errors(g, broken, limit)
    if shape_errors and not collect:
        raise shape_errors[0]
    if not structural and not shape_errors:
        _mark_validated(g, limit)
    return structural + shape_errors


# TorchLean runs checkShapes after checkWellFormed; ours re-checks structure first, so it never
# indexes out of range on a malformed graph, which makes it the same function as ``check``.
check_shapes = check


def infer_shapes(g: Graph) -> list[Shape]:
    """The shapes the rules infer for every node; raises on the first problem."""
    if _validated(g, current_element_limit()):
        return [n.out_shape for n in g.nodes]  # validation found every declared shape equal to the rule's
    structural, broken = ([], set()) if _known_well_formed(g) else _structure_errors(g)
    if structural:
        raise structural[0]
    errors, inferred = _shape_errors(g, broken, current_element_limit())
    if errors:
        raise errors[0]
    return [s for s in inferred if s is not None]
