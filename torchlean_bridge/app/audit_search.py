"""Structured hypotheses for audits with golden outputs only: the conversion bugs real converters make.

Without trusted weights a misplaced tensor can only be found by evaluating the model. Single
exchanges cannot explain a layer-mapping bug (two whole blocks exchanged is a dozen exchanges at
once) or a fused-projection layout bug (Q and K thirds exchanged inside one tensor), so before them
the audit tries these hypotheses, each a way to restore the checkpoint:

- block exchanges: every tensor of layer ``a`` with the same-named tensor of layer ``b``;
- layer shifts: every layer rotated by ``d`` (not over duplicated layers: a rotation moves distinct
  ones), or moved by one without wrapping, the layer pushed out absent and stood in by zeros (a
  skipped residual block) or by what it holds; such a shift cannot restore agreement, so the audit
  reports the error it leaves, and a rotation short of agreement is preferred to it only if it
  halves that error;
- runs of layers rotated: a contiguous run of 3 or more layers (fewer than all) rotated by one either
  way (``blocks cycled: layer1.1 <- layer1.2 <- layer1.3 <- layer1.1``), shortest runs first, at most
  ``MAX_RUN_ROTATIONS`` per stack of layers;
- one exchange repeated in every layer (gate/up, K/V of the same shape, two norms);
- fused projections (keys named like ``c_attn``, ``qkv``, ``in_proj``, ``query_key_value``): the five
  other orders of the Q/K/V thirds, per-head interleavings, two heads exchanged in one third;
  fused gate/up keys: their halves exchanged; each for every layer at once and for one layer;
- separate Q/K/V projections (``q_proj``, ``k_proj``, ``v_proj``; rows are heads): the per-head rotary
  permute of Llama conversions and its inverse, for every layer at once and for one module; two heads
  exchanged in one module (K/V heads of grouped-query attention included);
- transposes of square weights (matrices, and conv weights (C, C, k...) in their first two axes), of
  every layer at once and of one key.

Each is screened on the first input set and ranked by the error left; the best are confirmed on
every set. A best step short of agreement is first checked against the single exchanges within the
modules it touches (the module whose part of the step lowers the error most first), and on the first
step against every other single exchange after them, nearest keys first: an exchange in every layer of
a stage can remove most of the error one exchange causes, and the one exchange is the explanation.
The search is bounded by a count and a time (both reported). Messages are those of the weight audit
(``audit_weights``), so both audits name a bug the same way.
"""

from __future__ import annotations

import itertools
import re
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Mapping

import numpy as np

from .audit_weights import (_cycles, _index_of, _label, _layer_name, describe_order, is_square, projection_part,
                            transpose_words, transposed)

__all__ = ["Hypothesis", "hypotheses", "SearchResult", "search", "shift_signatures"]

_FUSED_QKV = re.compile(r"(c_attn|qkv|in_proj|query_key_value)", re.IGNORECASE)
_FUSED_GATE_UP = re.compile(r"(gate_up|w13|w1_w3)", re.IGNORECASE)
MAX_HEADS = 64
MAX_RUN_ROTATIONS = 64  # rotated runs of layers tried per run of layers (a 12-layer stack has 108)
MIN_HEAD_WIDTH = 4  # narrower heads are not searched: each width multiplies the hypotheses (and chance fits)


@dataclass(frozen=True)
class Hypothesis:
    """A conversion bug and how to undo it: ``undo`` maps the current tensors to restored ones for
    ``keys``."""

    kind: str
    message: str
    keys: tuple[str, ...]
    undo: Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]] = field(compare=False, repr=False)
    data: dict = field(default_factory=dict, compare=False)


# -- layers ---------------------------------------------------------------------------------------------
def _layer_index(keys: list[str]) -> dict[tuple[str, ...], dict[int, dict[str, str]]]:
    """prefix (ending with the index's stem) -> layer index -> suffix -> key, for the first layer
    component of every key."""
    out: dict[tuple[str, ...], dict[int, dict[str, str]]] = {}
    for key in keys:
        parts = key.split(".")
        for i, p in enumerate(parts[:-1]):
            index = _index_of(p)
            if index is not None:
                prefix = tuple(parts[:i]) + (index[0],)
                out.setdefault(prefix, {}).setdefault(index[1], {})[".".join(parts[i + 1:])] = key
                break
    return out


def _moves(layers: dict[int, dict[str, str]], tensors: Mapping[str, np.ndarray],
           source_of: dict[int, int]) -> dict[str, str] | None:
    """dst key -> src key for a layer map (restored layer i takes the checkpoint's layer source_of[i]),
    for the suffixes both layers have with equal shapes; None when some tensor would change shape."""
    moves = {}
    for dst, src in source_of.items():
        for suffix, key in layers[dst].items():
            other = layers.get(src, {}).get(suffix)
            if other is None:
                continue
            if tensors[other].shape != tensors[key].shape:
                return None
            moves[key] = other
    return moves


def _distinct(moves: Mapping[str, str], tensors: Mapping[str, np.ndarray]) -> int:
    """How many of the moved tensors actually change value."""
    return sum(1 for dst, src in moves.items() if not np.array_equal(tensors[dst], tensors[src]))


def _touches(moves: Mapping[str, str], missing: frozenset[str]) -> bool:
    """A move involves a key the checkpoint lacks (its zero stand-in is no tensor to move around)."""
    return any(dst in missing or src in missing for dst, src in moves.items())


def _move_hypothesis(kind: str, message: str, moves: dict[str, str], data: dict) -> Hypothesis:
    def undo(t: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {dst: t[src] for dst, src in moves.items()}
    return Hypothesis(kind, message, tuple(sorted(moves)), undo, data)


def _block_hypotheses(tensors: Mapping[str, np.ndarray], missing: frozenset[str] = frozenset()
                      ) -> Iterator[Hypothesis]:
    for prefix, layers in _layer_index(sorted(tensors)).items():
        idx = sorted(layers)
        if len(idx) < 2:
            continue
        label = _label(prefix)
        for a, b in itertools.combinations(idx, 2):
            moves = _moves(layers, tensors, {a: b, b: a})
            # a block exchange must move at least two different tensor kinds; one is a pair exchange
            if moves and _distinct(moves, tensors) >= 4 and not _touches(moves, missing):
                yield _move_hypothesis("block_swap", f"block {_layer_name(prefix, a)} <-> {_layer_name(prefix, b)} "
                                       f"exchanged "
                                       f"({_distinct(moves, tensors)} tensors)", moves,
                                       {"prefix": label, "map": {str(a): b, str(b): a}})
        n = len(idx)
        if idx != list(range(idx[0], idx[0] + n)):
            continue
        duplicated = any(_layer_is(layers, a, b, tensors) for a, b in itertools.combinations(idx, 2))
        for d in range(1, n) if not duplicated else ():  # a permutation of distinct layers makes no duplicate
            # checkpoint layer i holds the true layer i - d (mod n): restore from i + d
            source = {i: idx[(k + d) % n] for k, i in enumerate(idx)}
            moves = _moves(layers, tensors, source)
            if moves and _distinct(moves, tensors) >= 4 and not _touches(moves, missing):
                yield _move_hypothesis("layer_shift", f"every layer of {label} rotated by {d:+d}: layer i holds the "
                                       f"reference's layer (i - {d}) mod {n} ({_distinct(moves, tensors)} tensors)",
                                       moves,
                                       {"prefix": label, "shift": d,
                                        "refines": (label, 1) if d == 1 else (label, -1) if d == n - 1 else None})
        yield from _absent_layer_shifts(prefix, layers, tensors, missing)
        if not duplicated:
            yield from _run_rotations(prefix, layers, tensors, missing)


def _run_rotations(prefix: tuple[str, ...], layers: dict[int, dict[str, str]], tensors: Mapping[str, np.ndarray],
                   missing: frozenset[str]) -> Iterator[Hypothesis]:
    """A contiguous run of 3 or more layers (not all: that is a rotation of every layer) rotated by one
    either way, e.g. layer1.1 <- layer1.2 <- layer1.3 <- layer1.1 (a loop over a subset of one stage's
    blocks off by one). Shortest runs first, at most ``MAX_RUN_ROTATIONS`` per run of layers: their
    number grows with the square of the layer count."""
    idx = sorted(layers)
    label, made = _label(prefix), 0
    for length in range(3, len(idx)):
        for start in range(len(idx) - length + 1):
            run = idx[start:start + length]
            for step in (1, -1):
                if made >= MAX_RUN_ROTATIONS:
                    return
                held = {run[k]: run[(k + step) % length] for k in range(length)}  # checkpoint layer -> reference's
                moves = _moves(layers, tensors, {src: dst for dst, src in held.items()})
                if not moves or _distinct(moves, tensors) < 4 or _touches(moves, missing):
                    continue
                (cycle,), _ = _cycles(held)
                path = " <- ".join(_layer_name(prefix, i) for i in cycle + [cycle[0]])
                made += 1
                yield _move_hypothesis("block_cycle", f"blocks cycled: {path} ({_distinct(moves, tensors)} tensors; "
                                       f"each holds the next one's tensors)", moves,
                                       {"prefix": label, "map": {str(d): s for d, s in sorted(held.items())}})


def _layer_is(layers: dict[int, dict[str, str]], a: int, b: int, tensors: Mapping[str, np.ndarray]) -> bool:
    """Layer ``a`` holds exactly layer ``b``'s tensors (same suffixes, equal by value)."""
    return set(layers[a]) == set(layers[b]) and all(np.array_equal(tensors[layers[a][s]], tensors[layers[b][s]])
                                                    for s in layers[a])


def _vacated(layers: dict[int, dict[str, str]], i: int, neighbour: int, tensors: Mapping[str, np.ndarray],
             missing: frozenset[str]) -> str:
    """What the layer a shift vacated holds: "missing", a "duplicate" of its neighbour, or "own" values."""
    if all(k in missing for k in layers[i].values()):
        return "missing"
    return "duplicate" if _layer_is(layers, i, neighbour, tensors) else "own"


def _vacated_words(prefix: tuple[str, ...], i: int, neighbour: int, state: str) -> str:
    name = _layer_name(prefix, i)
    return {"missing": f"{name} is missing from the checkpoint",
            "duplicate": f"{name} holds the same tensors as {_layer_name(prefix, neighbour)} (equal by value: a "
                         f"duplicate)",
            "own": f"{name} holds tensors of its own"}[state]


def _absent_layer_shifts(prefix: tuple[str, ...], layers: dict[int, dict[str, str]],
                         tensors: Mapping[str, np.ndarray], missing: frozenset[str]) -> Iterator[Hypothesis]:
    """Every layer shifted by one without wrapping: the layer pushed out is not in the checkpoint, so no
    rearrangement restores it. Restored layer i takes the checkpoint's layer i + d; the absent layer is
    stood in by zeros (a zeroed residual block is skipped: pre-norm transformer blocks and residual
    conv blocks pass their input through) or by the tensors it holds. The error left is the absent
    layer's; the audit reports it, and names the shift only if it removes most of the error."""
    idx = sorted(layers)
    n = len(idx)
    if n < 3 or idx != list(range(idx[0], idx[0] + n)):
        return
    label = _label(prefix)
    for d in (1, -1):
        source = {i: i + d for i in idx if i + d in layers}
        moves = _moves(layers, tensors, source)
        if not moves or _distinct(moves, tensors) < 4 or any(src in missing for src in moves.values()):
            continue  # a missing key's zero stand-in is nothing to restore from
        absent = idx[-1] if d == 1 else idx[0]      # the reference layer no checkpoint layer holds
        vacated = idx[0] if d == 1 else idx[-1]     # the checkpoint layer holding no reference layer
        lo, hi = (idx[1], idx[-1]) if d == 1 else (idx[0], idx[-2])
        count = len(moves)  # the tensors the shifted layers hold (a duplicate's included)
        state = _vacated(layers, vacated, vacated + d, tensors, missing)
        claim = (f"{_layer_name(prefix, lo)}..{_layer_name(prefix, hi)} hold the reference's "
                 f"{_layer_name(prefix, lo - d)}..{_layer_name(prefix, hi - d)} ({count} tensors)")
        head = (f"every layer of {label} shifted by {d:+d}: {claim}; "
                f"the reference's {_layer_name(prefix, absent)} is absent from the checkpoint and "
                f"{_vacated_words(prefix, vacated, vacated + d, state)}")
        absent_keys = [k for k in layers[absent].values() if k not in moves]
        for stand_in in ("zeros", "kept"):
            if stand_in == "kept" and any(k in missing for k in absent_keys):
                continue
            text = (f"{head}; {_layer_name(prefix, absent)} stood in by zeros (the layer skipped)"
                    if stand_in == "zeros" else
                    f"{head}; {_layer_name(prefix, absent)} stood in by the tensors it holds")

            def undo(t: Mapping[str, np.ndarray], moves=moves, zeroed=absent_keys if stand_in == "zeros" else []
                     ) -> dict[str, np.ndarray]:
                out = {dst: t[src] for dst, src in moves.items()}
                out.update({k: np.zeros_like(t[k]) for k in zeroed})
                return out
            keys = tuple(sorted(set(moves) | set(absent_keys)))
            yield Hypothesis("layer_shift", text, keys, undo,
                             {"prefix": label, "shift": d, "absent": _layer_name(prefix, absent),
                              "stand_in": stand_in, "vacated": _layer_name(prefix, vacated), "vacated_holds": state,
                              "neighbour": _layer_name(prefix, vacated + d), "claim": claim,
                              "group": (label, d)})


def shift_signatures(tensors: Mapping[str, np.ndarray], missing: frozenset[str] = frozenset()) -> list[Hypothesis]:
    """The absent-layer shifts (absent layer skipped) whose vacated layer is missing or duplicates
    its neighbour: the hash signature a shift by one that dropped a layer leaves, whatever the outputs
    can show."""
    return [h for prefix, layers in _layer_index(sorted(tensors)).items()
            for h in _absent_layer_shifts(prefix, layers, tensors, missing)
            if h.data["stand_in"] == "zeros" and h.data["vacated_holds"] != "own"]


def _layer_swap_hypotheses(tensors: Mapping[str, np.ndarray], missing: frozenset[str] = frozenset()
                           ) -> Iterator[Hypothesis]:
    """The same exchange of two same-shaped tensors (gate/up, K/V, two norms) in every layer."""
    for prefix, layers in _layer_index(sorted(tensors)).items():
        if len(layers) < 2:
            continue
        common = set.intersection(*(set(s) for s in layers.values()))
        label = _label(prefix)
        for x, y in itertools.combinations(sorted(common), 2):
            moves = {}
            for suffixes in layers.values():
                a, b = suffixes[x], suffixes[y]
                if tensors[a].shape != tensors[b].shape:
                    moves = {}
                    break
                moves.update({a: b, b: a})
            if moves and _distinct(moves, tensors) >= 4 and not _touches(moves, missing):
                yield _move_hypothesis("swap", f"{x} <-> {y} exchanged in every layer of {label} "
                                       f"({_distinct(moves, tensors) // 2} pairs)", moves,
                                       {"prefix": label, "suffixes": [x, y]})


# -- fused projections ----------------------------------------------------------------------------------
def _base(key: str) -> str:
    """The parameter's owner: the key without its leaf (``.weight``), or without the ``_weight`` /
    ``_bias`` of a leaf like ``in_proj_weight``."""
    module, _, leaf = key.rpartition(".")
    for end in ("_weight", "_bias"):
        if leaf.endswith(end) and len(leaf) > len(end):
            return f"{module}.{leaf[:-len(end)]}" if module else leaf[:-len(end)]
    return module or key


def _fused_modules(tensors: Mapping[str, np.ndarray], pattern: re.Pattern, parts: int
                   ) -> dict[str, list[tuple[str, int]]]:
    """module name -> [(key, axis)]: the keys matching ``pattern`` and the axis split into ``parts``
    (the bias's length decides a weight's axis; the last fitting axis otherwise)."""
    out: dict[str, list[tuple[str, int]]] = {}
    for key, t in sorted(tensors.items()):
        module = _base(key)  # `h.0.attn.c_attn` of `.weight`, `...self_attention.in_proj` of `.in_proj_weight`
        if not pattern.search(module) or t.ndim == 0:
            continue
        bias = tensors.get(f"{module}.bias", tensors.get(f"{module}_bias"))
        size = bias.shape[0] if bias is not None and bias.ndim == 1 else None
        axes = [a for a in range(t.ndim) if t.shape[a] % parts == 0 and t.shape[a] >= parts
                and (size is None or t.shape[a] == size)]
        if axes:
            out.setdefault(module, []).append((key, axes[-1]))
    return out


def _reorder(a: np.ndarray, axis: int, perm: list[int]) -> np.ndarray:
    """``a`` with its ``len(perm)`` slices along ``axis`` restored from stored order ``perm``
    (stored slice i is the true slice perm[i])."""
    n = len(perm)
    inverse = np.argsort(perm)
    moved = np.moveaxis(a, axis, 0)
    parts = moved.reshape((n, -1) + moved.shape[1:])[inverse]
    return np.moveaxis(parts.reshape(moved.shape), 0, axis)


def _reorder_hypotheses(modules: dict[str, list[tuple[str, int]]], tensors: Mapping[str, np.ndarray],
                        orders: list[tuple[int, list[int], str]], every: bool = True) -> Iterator[Hypothesis]:
    """Each stored order (n slices per part) for every fused module at once (``every``), then for
    each module."""
    groups = ([list(modules)] if every else []) + ([[m] for m in modules] if len(modules) > 1 or not every else [])
    for n, perm, family in orders:
        for group in groups:
            members = [(k, ax) for m in group for k, ax in modules[m] if tensors[k].shape[ax] % n == 0]
            if not members:
                continue
            first_key, first_axis = members[0]
            desc = describe_order(tensors[first_key].shape[first_axis] // n, n, perm)
            what = "fused projection" if family != "gate_up" else "fused gate/up"
            where = f"every {what} ({len(members)} tensors)" if len(group) > 1 else ", ".join(k for k, _ in members)

            def undo(t: Mapping[str, np.ndarray], members=members, perm=perm) -> dict[str, np.ndarray]:
                return {k: _reorder(t[k], ax, perm) for k, ax in members}
            yield Hypothesis("reordered", f"{where}: {desc}", tuple(k for k, _ in members), undo,
                             {"slices": n, "order": perm})


def _qkv_orders(modules: dict[str, list[tuple[str, int]]], tensors: Mapping[str, np.ndarray]
                ) -> tuple[list[tuple[int, list[int], str]], list[tuple[int, list[int], str]]]:
    """(third orders and per-head interleaves, two-head exchanges) to try for the fused Q/K/V keys."""
    widths = {tensors[k].shape[ax] // 3 for m in modules.values() for k, ax in m}
    cheap = [(3, list(p), "qkv") for p in itertools.permutations(range(3)) if list(p) != [0, 1, 2]]
    heads_exchanges = []
    for d in sorted(widths):
        for h in range(2, min(d, MAX_HEADS) + 1):
            if d % h:
                continue
            n = 3 * h
            cheap.append((n, [j * h + i for i in range(h) for j in range(3)], "qkv"))  # [Q0 K0 V0 Q1 ...]
            if d // h < MIN_HEAD_WIDTH:
                continue  # narrow heads would make nearly every slice order a hypothesis
            for third in range(3):
                for i, j in itertools.combinations(range(h), 2):
                    perm = list(range(n))
                    perm[third * h + i], perm[third * h + j] = third * h + j, third * h + i
                    heads_exchanges.append((n, perm, "qkv"))
    return cheap, heads_exchanges


def _rotary_orders(rows: int) -> list[list[int]]:
    """Per-head rotary permutes of ``rows`` rows (convert_llama_weights' and its inverse), for every
    head width that is even and at least 4 (two heads or more)."""
    out = []
    for m in range(4, rows + 1, 2):
        if rows % m or not 2 <= rows // m <= MAX_HEADS:  # two heads at least, as the weight audit names them
            continue
        half = m // 2
        forward = [j * 2 + i for i in range(2) for j in range(half)]     # stored (i, j) <- row 2j + i
        inverse = [j * half + i for i in range(half) for j in range(2)]  # stored (i, j) <- row j*half + i
        for local in (forward, inverse):
            out.append([b * m + p for b in range(rows // m) for p in local])
    return out


def _projection_modules(tensors: Mapping[str, np.ndarray]) -> dict[str, list[str]]:
    """module -> its tensors, for separate Q/K/V projections (rows, axis 0, are heads)."""
    out: dict[str, list[str]] = {}
    for key, t in sorted(tensors.items()):
        if projection_part(key) and t.ndim in (1, 2) and t.shape[0] >= 2:
            out.setdefault(key.rpartition(".")[0], []).append(key)
    return {m: keys for m, keys in out.items() if len({tensors[k].shape[0] for k in keys}) == 1}


def _projection_hypotheses(tensors: Mapping[str, np.ndarray], exchanges: bool) -> Iterator[Hypothesis]:
    """Separate Q/K/V projections (Llama's q_proj, k_proj, v_proj): per-head rotary permutes, for every
    layer's same projection at once and for one module (``exchanges`` False); two heads exchanged in
    one module (``exchanges`` True)."""
    modules = _projection_modules(tensors)

    def reorder(members: list[str], perm: list[int], text: str) -> Hypothesis:
        def undo(t: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
            return {k: _reorder(t[k], 0, perm) for k in members}
        return Hypothesis("reordered", text, tuple(members), undo, {"slices": len(perm), "order": perm})
    if not exchanges:
        by_suffix: dict[str, list[str]] = {}
        for prefix, layers in _layer_index(sorted(modules)).items():
            for suffixes in layers.values():
                for suffix, module in suffixes.items():
                    by_suffix.setdefault(_layer_name(prefix, "*") + "." + suffix, []).append(module)
        for pattern, group in sorted(by_suffix.items()):
            if len(group) < 2:
                continue
            members = [k for m in group for k in modules[m]]
            rows = tensors[members[0]].shape[0]
            for perm in _rotary_orders(rows):
                part = projection_part(members[0])
                yield reorder(members, perm, f"every {pattern} ({len(members)} tensors): "
                                             f"{describe_order(1, rows, perm, part=part)}")
    for module, members in modules.items():
        rows, part = tensors[members[0]].shape[0], projection_part(members[0])
        where = ", ".join(members)
        if not exchanges:
            for perm in _rotary_orders(rows):
                yield reorder(members, perm, f"{where}: {describe_order(1, rows, perm, part=part)}")
            continue
        for h in range(2, min(rows, MAX_HEADS) + 1):
            if rows % h or rows // h < MIN_HEAD_WIDTH:
                continue
            for i, j in itertools.combinations(range(h), 2):
                perm = list(range(h))
                perm[i], perm[j] = j, i
                yield reorder(members, perm, f"{where}: {describe_order(rows // h, h, perm, part=part)}")


def _transpose_hypotheses(tensors: Mapping[str, np.ndarray]) -> Iterator[Hypothesis]:
    """Square matrices and square conv weights (C, C, k...) transposed in their first two axes."""
    squares = [k for k, t in sorted(tensors.items()) if is_square(t.shape) and not np.array_equal(t, transposed(t))]
    by_suffix: dict[str, list[str]] = {}
    for prefix, layers in _layer_index(squares).items():
        for i, suffixes in layers.items():
            for suffix, key in suffixes.items():
                by_suffix.setdefault(_layer_name(prefix, "*") + "." + suffix, []).append(key)

    def undo_of(keys: list[str]) -> Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]:
        return lambda t: {k: transposed(t[k]) for k in keys}
    for pattern, keys in sorted(by_suffix.items()):
        if len(keys) > 1:
            axes = "" if tensors[keys[0]].ndim == 2 else " in their first two axes (out and in channels)"
            yield Hypothesis("transpose", f"transpose every {pattern}{axes} ({len(keys)} tensors)", tuple(keys),
                             undo_of(keys))
    for k in squares:
        yield Hypothesis("transpose", transpose_words(k, tensors[k].ndim), (k,), undo_of([k]))


def hypotheses(tensors: Mapping[str, np.ndarray], missing: frozenset[str] = frozenset()) -> Iterator[Hypothesis]:
    """Every structured hypothesis for these checkpoint tensors, cheapest families first (``missing``:
    keys the checkpoint lacks, present in ``tensors`` as zero stand-ins)."""
    yield from _block_hypotheses(tensors, missing)
    yield from _layer_swap_hypotheses(tensors, missing)
    qkv = _fused_modules(tensors, _FUSED_QKV, 3)
    cheap, head_pairs = _qkv_orders(qkv, tensors)
    yield from _reorder_hypotheses(qkv, tensors, cheap)
    gate_up = _fused_modules(tensors, _FUSED_GATE_UP, 2)
    yield from _reorder_hypotheses(gate_up, tensors, [(2, [1, 0], "gate_up")])
    yield from _projection_hypotheses(tensors, exchanges=False)
    yield from _transpose_hypotheses(tensors)
    yield from _reorder_hypotheses(qkv, tensors, head_pairs, every=False)
    yield from _projection_hypotheses(tensors, exchanges=True)


# -- the search -----------------------------------------------------------------------------------------
@dataclass
class SearchResult:
    """The steps taken (hypothesis, error before, error after), the error left, and the budget used."""

    steps: list[tuple[Hypothesis, float, float]]
    error: float
    tried: int
    time_s: float
    bounded: bool

    def to_dict(self) -> dict:
        return {"steps": [{"kind": h.kind, "message": h.message, "keys": list(h.keys), "error_before": a,
                           "error_after": b} for h, a, b in self.steps],
                "error": self.error, "tried": self.tried, "time_s": self.time_s, "bounded": self.bounded}


def _applied(current: Mapping[str, np.ndarray], h: Hypothesis) -> dict[str, np.ndarray]:
    trial = dict(current)
    trial.update(h.undo(current))
    return trial


Trial = tuple[float, Hypothesis, dict[str, np.ndarray]]  # (error on every input set, hypothesis, tensors)


def _prefer_weaker(best: Trial | None, screened: list[tuple[float, int, Hypothesis]], confirmed: list[Trial],
                   current: Mapping[str, np.ndarray], changed: set[str],
                   error_of: Callable[[dict[str, np.ndarray], list[str], bool], float], limit: float) -> Trial | None:
    """A rotation claims more than the shift it refines (the layer pushed out is also the one wrapped
    round): short of agreement, it is taken only if it removes most of the error the shift with an
    absent layer leaves; otherwise the weaker claim is the explanation."""
    if best is None or best[0] <= limit or best[1].data.get("refines") is None:
        return best
    group = best[1].data["refines"]
    done = {id(h): (e, h, t) for e, h, t in confirmed}
    bases = []
    for _, _, h in screened:
        if h.data.get("group") == group:
            bases.append(done.get(id(h)) or (error_of(_applied(current, h), sorted(changed | set(h.keys)), False),
                                              h, _applied(current, h)))
    base = min(bases, key=lambda c: c[0], default=None)
    return best if base is None or best[0] < base[0] / 2 else base


def _module(key: str) -> str:
    return key.rpartition(".")[0]


def _modules_by_share(h: Hypothesis, current: Mapping[str, np.ndarray], changed: set[str],
                      error_of: Callable[[dict[str, np.ndarray], list[str], bool], float]) -> list[str]:
    """The modules ``h`` touches, those whose part of it alone lowers the first input set's error most
    first (one screening each): where a step that spans many layers finds the error."""
    undone = h.undo(current)
    modules = sorted({_module(k) for k in undone})
    if len(modules) < 2:
        return modules
    share = {}
    for m in modules:
        part = {k: v for k, v in undone.items() if _module(k) == m}
        share[m] = error_of({**current, **part}, sorted(changed | set(part)), True)
    return sorted(modules, key=lambda m: (share[m], m))


def search(tensors: dict[str, np.ndarray], error_of: Callable[[dict[str, np.ndarray], list[str], bool], float],
           error: float, limit: float, *, max_steps: int = 3, max_hypotheses: int = 2000,
           time_limit: float = 60.0, confirm: int = 5, missing: frozenset[str] = frozenset(),
           held_out: Callable[[dict[str, np.ndarray], list[str]], float] | None = None,
           refine: Callable[[list[str], bool], Iterable[Hypothesis]] | None = None) -> SearchResult:
    """Greedy over structured hypotheses: screen each (``error_of(tensors, changed, screen=True)``,
    the first input set), confirm the ``confirm`` best on every set, take the best if it removes more
    than half of the error left (short of agreement: on the ``held_out`` sets too, those not screened
    on); stop at agreement, when nothing does, or when the budget is spent. A best step short of
    agreement (one the held-out sets confirm) is first checked against ``refine(modules, first)``,
    smaller hypotheses (single exchanges) within the modules it touches, the modules whose part of the
    step lowers the error most first, and on the first step (``first``) every other one after them:
    one restoring agreement is the explanation instead (an exchange in every layer can remove most of
    the error one exchange in one layer, or in another stage, causes)."""
    start = time.perf_counter()
    tried, bounded = 0, False
    steps: list[tuple[Hypothesis, float, float]] = []
    current, changed = dict(tensors), set()

    def agreement(h: Hypothesis) -> tuple[float, tuple[float, Hypothesis, dict] | None]:
        """``h``'s error on the first input set, and (error, h, trial) when it agrees on every set
        (confirmed only after the cheap screen agrees)."""
        trial = _applied(current, h)
        keys = sorted(changed | set(h.keys))
        screen = error_of(trial, keys, True)
        if screen <= limit and (e := error_of(trial, keys, False)) <= limit:
            return screen, (e, h, trial)
        return screen, None

    for _ in range(max_steps):
        screened: list[tuple[float, int, Hypothesis]] = []  # trials are rebuilt when confirmed: bounded memory
        best = None
        for k, h in enumerate(hypotheses(current, missing)):
            if tried >= max_hypotheses or time.perf_counter() - start > time_limit:
                bounded = True
                break
            tried += 1
            screen, agreed = agreement(h)
            if agreed is not None:
                best = agreed
                break
            screened.append((screen, k, h))
        if best is None:
            screened.sort(key=lambda s: (s[0], s[1]))
            confirmed = [(error_of(trial, sorted(changed | set(h.keys)), False), h, trial)
                         for h, trial in ((h, _applied(current, h)) for _, _, h in screened[:confirm])]
            best = min(confirmed, key=lambda c: c[0], default=None)
            best = _prefer_weaker(best, screened, confirmed, current, changed, error_of, limit)
        if best is None or not best[0] < error / 2:
            break
        if best[0] > limit and held_out is not None:
            # short of agreement the pick was screened on the first input set: it must also halve the
            # error on the sets it was not chosen on, or it only fits noise (e.g. a perturbed tensor)
            keys = sorted(changed | set(best[1].keys))
            if not held_out(best[2], keys) < held_out(current, sorted(changed)) / 2:
                break
        if best[0] > limit and refine is not None:
            modules = _modules_by_share(best[1], current, changed, error_of)
            tried += len(modules) if len(modules) > 1 else 0  # one screening per module (counted in the bound)
            for h in refine(modules, not steps):
                if tried >= max_hypotheses or time.perf_counter() - start > time_limit:
                    bounded = True
                    break
                tried += 1
                agreed = agreement(h)[1]
                if agreed is not None:
                    best = agreed
                    break
        steps.append((best[1], error, best[0]))
        current, error = best[2], best[0]
        changed |= set(best[1].keys)
        if error <= limit or bounded:
            break
    return SearchResult(steps, error, tried, time.perf_counter() - start, bounded)
