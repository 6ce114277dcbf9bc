"""One spelling per computation, whichever importer produced the graph (architecture decision 10).

Frameworks spell the same step differently: ONNX has Squeeze/Unsqueeze/Expand/Transpose(perm)/
Gather(constant index)/ReduceSum(keepdims=0), torch has view/expand/transpose/select/sum. The
importers lower each spelling literally and this pass, run by every importer's ``finish``, rewrites
them to the one canonical form, so kinds compare across importers and later stages (v1 export,
bounds, kernel plans) see one spelling. Every rewrite is exact (pure data movement or the same
reduction); nothing that computes differently is touched.

Canonical forms:
- ``squeeze``, ``unsqueeze``, ``flatten`` -> ``reshape`` (in_shape, out_shape)
- ``expand`` -> ``broadcast_to``
- ``max_pool_nd`` / ``avg_pool_nd`` whose geometry v1 expresses exactly -> ``max_pool`` / ``avg_pool``
  (the registry's ``v1_rewrite`` decides, so the decision lives in one place)
- a ``permute``/``transpose`` of one nothing else reads -> one permutation; the identity -> its input;
  a permutation exchanging exactly two axes -> ``transpose(axis1 < axis2)``, any other -> ``permute``
- sums over every axis without keepdim -> ``sum``; one axis without keepdim -> ``reduce_sum``/
  ``reduce_mean`` (axis); any other axis set -> ``reduce_*_axes``; no axis at all -> the input itself
- ``gather`` by an unbound constant index that is a step-1-or-more progression -> ``slice`` (then a
  ``reshape`` dropping the axis for a scalar index), as torch's select/narrow/basic indexing is
- a ``reshape`` of a ``reshape`` read by nothing else -> one ``reshape``
"""

from __future__ import annotations

__all__ = ["canonicalize", "canonical_kinds", "CANONICAL_FORMS"]

from typing import Any

import numpy as np

from ..bundle import Bundle
from ..graph import Node
from ..ops import INT64, REGISTRY
from .base import GraphEdit, Note
from .dead_code import eliminate_dead_code

# kinds this pass never leaves in a graph (the first four always rewrite)
CANONICAL_FORMS = {"squeeze": "reshape", "unsqueeze": "reshape", "flatten": "reshape", "expand": "broadcast_to",
                   "max_pool_nd": "max_pool (when v1 geometry is exact)",
                   "avg_pool_nd": "avg_pool (when v1 geometry is exact)"}
_VIA_REGISTRY = ("expand", "max_pool_nd", "avg_pool_nd")
_RESHAPES = ("squeeze", "unsqueeze", "flatten", "reshape")
_PERMUTATIONS = ("permute", "transpose")
_REDUCTIONS = {"sum": "sum", "reduce_sum": "sum", "reduce_sum_axes": "sum",
               "reduce_mean": "mean", "reduce_mean_axes": "mean"}


class _Canonicalizer:
    def __init__(self, bundle: Bundle) -> None:
        self.bundle = bundle
        self.g = bundle.graph
        self.edit = GraphEdit(bundle)
        self.consumers = self.g.consumers()
        self.outputs = set(self.g.outputs)
        self.bound = {b.node for b in bundle.roles.bindings()}
        self.details: list[str] = []

    def run(self) -> tuple[Bundle, Note]:
        for node in self.g.nodes:
            self.rewrite(node)
        if not self.details:
            return self.bundle, Note("canonicalize")
        out, _ = eliminate_dead_code(self.edit.result())
        return out, Note("canonicalize", len(self.details), tuple(self.details))

    def note(self, node: Node, what: str) -> None:
        self.details.append(f"node {node.id} {node.kind} -> {what}")

    def parent_shapes(self, node: Node) -> list[tuple[int, ...]]:
        return [self.edit.shape(p) for p in self.edit.parents(node)]

    # -- dispatch ---------------------------------------------------------------------------------
    def rewrite(self, node: Node) -> None:
        kind = node.kind
        if kind in _RESHAPES:
            return self.reshape(node)
        if kind in _VIA_REGISTRY:
            rewritten = REGISTRY[kind].v1_rewrite(node.attrs, self.parent_shapes(node), node.out_shape)
            if rewritten is not None:
                self.edit.keep(node, kind=rewritten[0], attrs=rewritten[1])
                return self.note(node, rewritten[0])
        elif kind in _PERMUTATIONS:
            return self.permute(node)
        elif kind in _REDUCTIONS:
            return self.reduction(node)
        elif kind == "gather":
            return self.gather(node)
        self.edit.keep(node)

    # -- rules ------------------------------------------------------------------------------------
    def reshape(self, node: Node) -> None:
        (parent,) = self.edit.parents(node)
        pnode = self.edit.nodes[parent]
        # a reshape of a reshape nothing else reads is one reshape (the inner one then dies)
        old_parent = node.parents[0]
        if pnode.kind == "reshape" and len(self.consumers[old_parent]) == 1 and old_parent not in self.outputs \
                and old_parent not in self.bound:
            parent = pnode.parents[0]
            self.note(node, "reshape (merged with its parent reshape)")
        elif node.kind != "reshape":
            self.note(node, "reshape")
        if self.edit.shape(parent) == node.out_shape and node.id not in self.outputs and node.id not in self.bound:
            self.edit.alias(node, parent)
            return self.note(node, "its input (the reshape changes nothing)")
        attrs = {"in_shape": self.edit.shape(parent), "out_shape": node.out_shape}
        self.edit.keep(node, kind="reshape", parents=(parent,), attrs=attrs)

    def permute(self, node: Node) -> None:
        """``permute``/``transpose``: a permutation of a permutation nothing else reads is one; then the
        identity disappears, a single swap is ``transpose`` and anything else ``permute``."""
        perm = _perm(node)
        (parent,) = self.edit.parents(node)
        pnode, old_parent = self.edit.nodes[parent], node.parents[0]
        merged = pnode.kind in _PERMUTATIONS and len(self.consumers[old_parent]) == 1 \
            and old_parent not in self.outputs and old_parent not in self.bound
        if merged:
            inner = _perm(pnode)
            perm, parent = tuple(inner[i] for i in perm), pnode.parents[0]
        moved = [i for i, p in enumerate(perm) if p != i]
        if not moved and node.id not in self.outputs and node.id not in self.bound:
            self.edit.alias(node, parent)
            return self.note(node, "its input (the permutation is the identity)")
        if len(moved) == 2:
            kind, attrs = "transpose", {"axis1": moved[0], "axis2": moved[1]}
        else:
            kind, attrs = "permute", {"perm": perm}
        if merged or kind != node.kind or any(node.attrs.get(k) != v for k, v in attrs.items()):
            self.note(node, kind + (" (merged with its parent permutation)" if merged else ""))
        self.edit.keep(node, kind=kind, parents=(parent,), attrs=attrs)

    def reduction(self, node: Node) -> None:
        family = _REDUCTIONS[node.kind]
        rank = len(self.parent_shapes(node)[0])
        if node.kind == "sum":
            axes, keepdim = tuple(range(rank)), False
        elif node.kind in ("reduce_sum", "reduce_mean"):
            axes, keepdim = (node.attrs["axis"],), False
        else:
            axes, keepdim = tuple(sorted(node.attrs["axes"])), bool(node.attrs["keepdim"])
        if family == "sum" and not keepdim and axes == tuple(range(rank)) and rank:
            kind, attrs = "sum", {}
        elif len(axes) == 1 and not keepdim:
            kind, attrs = f"reduce_{family}", {"axis": axes[0]}
        else:
            kind, attrs = f"reduce_{family}_axes", {"axes": axes, "keepdim": keepdim}
        if kind == node.kind and all(node.attrs.get(k) == v for k, v in attrs.items()):
            self.edit.keep(node)
            return
        if not axes and node.id not in self.outputs:
            self.edit.alias(node, self.edit.parents(node)[0])
            return self.note(node, "its input (no axis reduced)")
        self.edit.keep(node, kind=kind, attrs=attrs)
        self.note(node, kind)

    def gather(self, node: Node) -> None:
        data_old, index_old = node.parents
        index_node = self.g.nodes[index_old]
        progression = self._index_progression(index_node, self.g.nodes[data_old].out_shape[node.attrs["axis"]])
        if progression is None:
            self.edit.keep(node)
            return
        start, stop, step, scalar = progression
        data, axis = self.edit.parents(node)[0], node.attrs["axis"]
        dshape = self.edit.shape(data)
        sliced = dshape[:axis] + (len(range(start, stop, step)),) + dshape[axis + 1:]
        if (start, stop, step) == (0, dshape[axis], 1) and not scalar and node.id not in self.outputs \
                and node.id not in self.bound:
            self.edit.alias(node, data)
            return self.note(node, "its input (the index takes every element in order)")
        nid = self.edit.emit("slice", [data], {"axes": (axis,), "starts": (start,), "ends": (stop,), "steps": (step,)},
                             sliced, node.dtype, node.source)
        if scalar:
            nid = self.edit.emit("reshape", [nid], {"in_shape": sliced, "out_shape": node.out_shape}, node.out_shape,
                                 node.dtype, node.source)
        self.edit.replace(node, nid)
        self.note(node, "slice" + (" + reshape" if scalar else ""))

    def _index_progression(self, index: Node, extent: int) -> tuple[int, int, int, bool] | None:
        """(start, stop, step, scalar) when ``index`` is an unbound constant progression with step >= 1."""
        if index.kind != "const" or index.dtype != INT64 or index.id in self.bound or len(index.out_shape) > 1:
            return None
        values: Any = self.bundle.payload.get(index.id, "values")
        if values is None or values.size == 0:
            return None
        flat = np.asarray(values, dtype=np.int64).reshape(-1)
        if np.any(flat < -extent) or np.any(flat >= extent):
            return None  # out of range: left for the gather rule to refuse with its own message
        flat = np.where(flat < 0, flat + extent, flat)
        step = int(flat[1] - flat[0]) if flat.size > 1 else 1
        if step < 1 or np.any(flat != flat[0] + step * np.arange(flat.size)):
            return None
        return int(flat[0]), int(flat[-1]) + 1, step, index.out_shape == ()


def _perm(node: Node) -> tuple[int, ...]:
    """A permute/transpose node's axis permutation (output axis i reads input axis perm[i])."""
    if node.kind == "permute":
        return tuple(node.attrs["perm"])
    perm = list(range(len(node.out_shape)))
    a, b = node.attrs["axis1"], node.attrs["axis2"]
    perm[a], perm[b] = perm[b], perm[a]
    return tuple(perm)


def canonicalize(bundle: Bundle) -> tuple[Bundle, Note]:
    return _Canonicalizer(bundle).run()


# what each kind can become: an importer that lowers to ``kinds`` emits ``canonical_kinds(kinds)``
_IMAGES = {"squeeze": {"reshape"}, "unsqueeze": {"reshape"}, "flatten": {"reshape"}, "expand": {"broadcast_to"},
           "max_pool_nd": {"max_pool_nd", "max_pool"}, "avg_pool_nd": {"avg_pool_nd", "avg_pool"},
           "permute": {"permute", "transpose"}, "transpose": {"permute", "transpose"}, "gather": {"gather", "slice", "reshape"},
           **{k: {"sum", "reduce_sum", "reduce_sum_axes"} for k in ("sum", "reduce_sum", "reduce_sum_axes")},
           **{k: {"reduce_mean", "reduce_mean_axes"} for k in ("reduce_mean", "reduce_mean_axes")}}


def canonical_kinds(kinds: frozenset[str] | set[str]) -> frozenset[str]:
    """The kinds a graph built from ``kinds`` holds after this pass."""
    return frozenset(k2 for k in kinds for k2 in _IMAGES.get(k, {k}))
