"""Framework-neutral decompositions every importer shares: einsum and group/instance normalization.

An importer lowers its framework's spelling (``torch.einsum``, ONNX ``Einsum``, ``F.group_norm``,
``GroupNormalization``, ``InstanceNormalization``) by calling these with a ``GraphBuilder``, so one
computation has one decomposition and the torch and ONNX graphs agree kind for kind. Only how a
parameter becomes a node stays with the importer (its bindings and transforms differ by format).
A form that cannot be decomposed exactly raises ``Undecomposable`` (a ``NotLowerable``) with the
reason.
"""

from __future__ import annotations

import math
import string
from dataclasses import dataclass
from typing import Callable, Sequence

from torchlean_bridge.graph import Source

from .builder import GraphBuilder
from .errors import NotLowerable

__all__ = ["Undecomposable", "EinsumPlan", "WeightContraction", "plan_einsum", "einsum", "group_norm", "channel_affine"]

Shape = tuple[int, ...]
LETTERS = frozenset(string.ascii_letters)
_ELLIPSIS_BASE = 0x391  # Greek capitals: internal names of the ellipsis axes, never an equation letter


class Undecomposable(NotLowerable):
    """The equation or form has no exact decomposition (the message says why); importers re-raise
    it in their own words (``ctx.fail`` adds the ONNX node)."""


# -- einsum -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class EinsumPlan:
    """An equation with its ellipses expanded to named axes and its output made explicit."""

    terms: tuple[str, ...]
    output: str
    extents: dict[str, int]  # each letter's extent after broadcasting (ellipsis axes may broadcast 1)


def plan_einsum(equation: str, shapes: Sequence[Shape]) -> EinsumPlan:
    """Parse ``equation`` against the operand shapes (numpy's and ONNX's rules): ``...`` stands for
    the same broadcast axes in every term; without ``->`` the output is the ellipsis axes followed by
    every letter seen exactly once, in ASCII order."""
    eq = equation.replace(" ", "")
    lhs, arrow, out = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(shapes):
        raise Undecomposable(f"equation `{equation}` has {len(terms)} terms for {len(shapes)} operands")
    for t in (*terms, out):
        rest = t.replace("...", "", 1)
        if "." in rest or any(c not in LETTERS for c in rest):
            raise Undecomposable(f"equation `{equation}`: a term is not letters with at most one '...'")
    if "..." in out and not any("..." in t for t in terms):
        raise Undecomposable(f"equation `{equation}`: '...' in the output but in no term")
    ellipsis_rank = 0
    for t, s in zip(terms, shapes):
        named = len(t.replace("...", ""))
        if ("..." in t and named > len(s)) or ("..." not in t and named != len(s)):
            raise Undecomposable(f"equation `{equation}`: term `{t}` does not match an operand of rank {len(s)}")
        if "..." in t:
            ellipsis_rank = max(ellipsis_rank, len(s) - named)
    axes = "".join(chr(_ELLIPSIS_BASE + i) for i in range(ellipsis_rank))
    expanded = [t.replace("...", axes[ellipsis_rank - (len(s) - len(t.replace("...", ""))):]) for t, s in zip(terms, shapes)]
    if arrow:
        output = out.replace("...", axes)
        if len(set(output)) != len(output):
            raise Undecomposable(f"equation `{equation}`: the output repeats a letter")
        missing = [c for c in output if not any(c in t for t in expanded)]
        if missing:
            raise Undecomposable(f"equation `{equation}`: output letter(s) {''.join(missing)} occur in no term")
    else:
        counts = {c: sum(t.count(c) for t in expanded) for t in expanded for c in t if c not in axes}
        output = axes + "".join(sorted(c for c, n in counts.items() if n == 1))
    extents: dict[str, int] = {}
    for t, s in zip(expanded, shapes):
        for c, d in zip(t, s):
            seen = extents.setdefault(c, d)
            if seen == d:
                continue
            if c in axes and 1 in (seen, d):  # ellipsis axes broadcast
                extents[c] = max(seen, d)
            else:
                raise Undecomposable(f"equation `{equation}`: index {_show(c)} has extents {seen} and {d}")
    return EinsumPlan(tuple(expanded), output, extents)


def _show(letter: str) -> str:
    return letter if letter in LETTERS else "..."


# an importer's contraction of x (laid out [m, k]) with operand 1 as a weight: (x, letters, summed, right, k, n)
WeightContraction = Callable[[int, str, list[str], list[str], int, int], int]


class _Einsum:
    def __init__(self, b: GraphBuilder, plan: EinsumPlan, source: Source | None) -> None:
        self.b, self.plan, self.source = b, plan, source

    def add(self, kind: str, parents: list[int], attrs: dict) -> int:
        return self.b.add(kind, parents, attrs, source=self.source)

    def permute(self, nid: int, letters: str, order: str) -> int:
        perm = tuple(letters.index(c) for c in order)
        return nid if perm == tuple(range(len(perm))) else self.add("permute", [nid], {"perm": perm})

    def diagonal(self, nid: int, letters: str) -> tuple[int, str]:
        """Repeated letters within one term select a diagonal: the two axes moved last, flattened,
        and every (n+1)-th element kept (a slice: no arithmetic, so exact)."""
        while len(set(letters)) != len(letters):
            c = next(ch for ch in letters if letters.count(ch) > 1)
            first, second = letters.index(c), letters.index(c, letters.index(c) + 1)
            rest = "".join(ch for i, ch in enumerate(letters) if i not in (first, second))
            order = [i for i in range(len(letters)) if i not in (first, second)] + [first, second]
            if order != list(range(len(letters))):
                nid = self.add("permute", [nid], {"perm": tuple(order)})
            shape = self.b.shape(nid)
            n = shape[-1]
            if shape[-2] != n:
                raise Undecomposable(f"a diagonal over index {_show(c)} with extents {shape[-2]} and {n}")
            nid = self.b.reshape(nid, shape[:-2] + (n * n,), self.source)
            if n > 1:
                nid = self.add("slice", [nid], {"axes": (len(shape) - 2,), "starts": (0,), "ends": (n * n,),
                                                "steps": (n + 1,)})
            letters = rest + c
        return nid, letters

    def sum_out(self, nid: int, letters: str, keep: str) -> tuple[int, str]:
        axes = tuple(i for i, c in enumerate(letters) if c not in keep)
        if not axes:
            return nid, letters
        nid = self.add("reduce_sum_axes", [nid], {"axes": axes, "keepdim": False})
        return nid, "".join(c for c in letters if c in keep)

    def broadcast_shared(self, nid: int, letters: str, other: str) -> int:
        """Stretch extent-1 ellipsis axes this operand shares with ``other`` to the broadcast extent."""
        target = tuple(self.plan.extents[c] if c in other else d for c, d in zip(letters, self.b.shape(nid)))
        return self.b.broadcast(nid, target, self.source)

    def contract(self, a: int, sa: str, b: int, sb: str, keep: str,
                 weight: Callable[[int, list[str], list[str], int, int], int] | None = None) -> tuple[int, str]:
        """One pairwise contraction as permute / reshape / matmul; with ``weight``, operand b is a
        weight the importer contracts itself (``b`` is then unused)."""
        ext = self.plan.extents
        a = self.broadcast_shared(a, sa, sb)
        batch = [c for c in sa if c in sb and c in keep]
        summed = [c for c in sa if c in sb and c not in keep]
        left = [c for c in sa if c not in sb]
        right = [c for c in sb if c not in sa]
        size = lambda cs: math.prod(ext[c] for c in cs)  # noqa: E731
        nb = tuple(ext[c] for c in batch)
        m, k, n = size(left), size(summed), size(right)
        x = self.b.reshape(self.permute(a, sa, "".join(batch + left + summed)), nb + (m, k), self.source)
        if weight is not None:
            z = weight(x, summed, right, k, n)
        else:
            b = self.broadcast_shared(b, sb, sa)
            y = self.b.reshape(self.permute(b, sb, "".join(batch + summed + right)), nb + (k, n), self.source)
            z = self.add("matmul", [x, y], {})
        z = self.b.reshape(z, nb + tuple(ext[c] for c in left + right), self.source)
        return z, "".join(batch + left + right)


def einsum(b: GraphBuilder, equation: str, shapes: Sequence[Shape], operand: Callable[[int], int],
           source: Source | None = None, weight: WeightContraction | None = None) -> int:
    """Any einsum the spec allows (repeated letters, traces and diagonals, ellipses, broadcasting,
    any number of operands), exactly: diagonals as strided slices, sums as ``reduce_sum_axes``, and
    operands contracted left to right by ``matmul``. ``operand(i)`` gives operand i's node (called
    only when needed). An importer whose operand 1 is a weight gives ``weight(x, letters, summed,
    right, k, n)``: it contracts x (laid out [m, k]) with that weight laid out [k, n] itself, when
    the equation allows (ONNX initializers become ``linear``, as MatMul by an initializer does)."""
    plan = plan_einsum(equation, shapes)
    e = _Einsum(b, plan, source)
    acc, acc_letters = -1, ""
    for i, term in enumerate(plan.terms):
        keep = plan.output + "".join(plan.terms[i + 1:])
        if i == 1 and weight is not None and len(plan.terms) == 2 and _weight_shaped(plan, term, acc_letters, shapes[1]):
            hook = lambda x, summed, right, k, n: weight(x, term, summed, right, k, n)  # noqa: E731
            acc, acc_letters = e.contract(acc, acc_letters, -1, term, keep, hook)
            continue
        nid, letters = e.diagonal(operand(i), term)
        nid, letters = e.sum_out(nid, letters, keep + acc_letters)
        if i == 0:
            acc, acc_letters = nid, letters
        else:
            acc, acc_letters = e.contract(acc, acc_letters, nid, letters, keep, None)
    return e.permute(acc, acc_letters, plan.output)


def _weight_shaped(plan: EinsumPlan, term: str, left: str, shape: Shape) -> bool:
    """Operand 1 can be contracted as a weight as it stands: distinct letters, each summed against
    the left operand or kept, none batched, no broadcasting."""
    return (len(set(term)) == len(term) and all(c in left or c in plan.output for c in term)
            and not any(c in left and c in plan.output for c in term)
            and all(plan.extents[c] == d for c, d in zip(term, shape)))


# -- group and instance normalization ---------------------------------------------------------------
def group_norm(b: GraphBuilder, x: int, groups: int, eps: float, source: Source | None = None) -> int:
    """Each (sample, group) block of an (N, C, ...) tensor normalized like a ``layernorm`` without
    affine parameters. Instance norm is the case of one group per channel: with spatial axes that is
    one ``layernorm`` over them (the same rows, so the same values, without the reshapes)."""
    s = b.shape(x)
    if len(s) < 2 or groups < 1 or s[1] % groups:
        raise Undecomposable(f"{groups} groups of an input shaped {list(s)}")
    attrs = {"axis": 2, "eps": float(eps)}
    if groups == s[1] and len(s) >= 3:
        return b.add("layernorm", [x], attrs, source=source)
    blocks = b.reshape(x, (s[0], groups, math.prod(s[1:]) // groups), source)
    return b.reshape(b.add("layernorm", [blocks], attrs, source=source), s, source)


def channel_affine(b: GraphBuilder, y: int, scale: Callable[[], int] | None, bias: Callable[[], int] | None,
                   source: Source | None = None) -> int:
    """The per-channel scale, then shift, of a normalized (N, C, ...) tensor. ``scale`` and ``bias``
    make the importer's (C, 1, ..., 1) nodes from its parameters, each just before its use (so
    node order follows the computation)."""
    if scale is not None:
        y = b.elementwise("mul_elem", [y, scale()], source)
    if bias is not None:
        y = b.elementwise("add", [y, bias()], source)
    return y
