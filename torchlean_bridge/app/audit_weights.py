"""Weight audits: name how each checkpoint tensor differs from the trusted weights, without evaluating.

A conversion bug moves, transposes, reorders or rescales tensors; it rarely invents values. So every
checkpoint tensor is compared with the trusted tensor of the same key by an exact hash of its
canonical bytes (float64, C order, -0.0 as 0.0), and each difference is explained by the smallest
transformation that reproduces it exactly:

1. another key's tensor: moves grouped into permutations; moves between keys that differ only in a
   layer index are grouped by their index pattern, so a layer-mapping bug reads ``block h.1 <-> h.2``
   or ``every layer of h shifted by +1`` instead of dozens of pairs, and one exchange repeated in
   several layers reads ``gate_proj.weight <-> up_proj.weight exchanged in every layer of layers``;
2. a transpose (2-D, or of the first two axes of a square conv weight: (C, C, k...));
3. a reordering of equal slices along one axis (Q/K/V thirds, gate/up halves, per-head interleave,
   head order): the fewest slices whose permutation reproduces the tensor;
4. a rounding to float16 or bfloat16, then a scale factor;
5. otherwise "different values", with the figures.

Hashes decide moves and slice orders (exact); rounding is exact equality with the rounded
reference; a scale holds within a few ulps of the checkpoint's dtype.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from ..report import Finding, Report

__all__ = ["WeightReport", "compare_weights", "tensor_hash", "describe_order", "EXPLAINED_KINDS", "transposed",
           "transpose_words", "is_square"]

# finding kinds that name a transformation: undoing it restores the trusted tensor
EXPLAINED_KINDS = ("block_swap", "block_cycle", "layer_shift", "swap", "cycle", "moved", "transpose",
                   "reordered", "rounded", "scaled")
MAX_SLICES = 4096          # slice orders are searched with at most this many slices along one axis
MAX_REORDER_ELEMENTS = 1 << 26  # larger tensors are not searched for slice orders (said in the finding)
HASH_CHUNK = 1 << 20  # elements canonicalized at a time when hashing

_INDEX = re.compile(r"^(|.*_)(\d+)$")  # a layer index: `3`, or the `3` of `encoder_layer_3`


def _index_of(component: str) -> tuple[str, int] | None:
    """(stem, index) of a layer component (`3` -> ("", 3), `encoder_layer_3` -> ("encoder_layer_", 3))."""
    m = _INDEX.match(component)
    return (m.group(1), int(m.group(2))) if m else None


def _layer_name(prefix: tuple[str, ...], index: int | str) -> str:
    """The key prefix of one layer; ``prefix`` ends with the index's stem."""
    return ".".join(prefix[:-1] + (prefix[-1] + str(index),))


def _label(prefix: tuple[str, ...]) -> str:
    """The layers' collective name: ``h``, ``encoder.layers.encoder_layer``."""
    return ".".join(p for p in prefix[:-1] + (prefix[-1].rstrip("_"),) if p) or "layer"


# -- canonical hashes ---------------------------------------------------------------------------------
def _canonical(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    if a.dtype.kind in "fc":
        c = np.ascontiguousarray(a, dtype=np.float64) + 0.0  # -0.0 -> 0.0
        return np.where(np.isnan(c), np.nan, c) if np.isnan(c).any() else c
    return np.ascontiguousarray(a, dtype=np.int64 if a.dtype.kind in "iub" else a.dtype)


def is_square(shape: tuple[int, ...]) -> bool:
    """A shape a transpose keeps: a square matrix, or a conv weight (C, C, k...) whose out and in
    channels match (a 1x1 conv is a matrix too)."""
    return len(shape) >= 2 and shape[0] == shape[1] > 1


def transposed(a: np.ndarray) -> np.ndarray:
    """``a`` with its first two axes exchanged: the matrix transpose, or a conv weight's out and in
    channels exchanged (its kernel axes kept)."""
    return np.ascontiguousarray(np.swapaxes(a, 0, 1))


def transpose_words(key: str, ndim: int) -> str:
    return f"transpose {key}" if ndim == 2 else f"transpose {key} in its first two axes (out and in channels)"


def tensor_hash(a: np.ndarray) -> bytes:
    """Exact content hash of a tensor: shape and canonical float64 bytes (float32 and float64 copies
    of the same values hash alike; so do -0.0 and 0.0)."""
    a = np.asarray(a)
    h = hashlib.blake2b(digest_size=16)
    h.update(repr(a.shape).encode())
    flat = a.reshape(-1)  # a view for contiguous (and memory-mapped) arrays
    for start in range(0, max(flat.size, 1), HASH_CHUNK):  # bounded working memory, one chunk at a time
        h.update(_canonical(flat[start:start + HASH_CHUNK]).tobytes())
    return h.digest()


def _slice_hashes(c: np.ndarray, axis: int, n: int) -> list[bytes]:
    """Hashes of the ``n`` equal slices of canonical array ``c`` along ``axis``."""
    moved = np.moveaxis(c, axis, 0)
    parts = moved.reshape((n, -1) + moved.shape[1:])
    return [hashlib.blake2b(np.ascontiguousarray(p).tobytes(), digest_size=16).digest() for p in parts]


# -- rounding -----------------------------------------------------------------------------------------
def _round_bfloat16(a: np.ndarray) -> np.ndarray:
    """Round to nearest even bfloat16 (as float32), the way torch's ``.to(torch.bfloat16)`` does."""
    f = np.ascontiguousarray(a, dtype=np.float32)
    bits = f.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)
    return np.where(np.isnan(f), f, rounded)


_ROUNDINGS = {"float16": lambda a: np.asarray(a, np.float32).astype(np.float16).astype(np.float64),
              "bfloat16": lambda a: _round_bfloat16(a).astype(np.float64)}


# -- the report ---------------------------------------------------------------------------------------
class WeightReport(Report):
    """Findings of a weight comparison; ``same`` counts the tensors identical to the trusted ones."""

    def __init__(self, findings: Sequence[Finding] = (), title: str = "weights") -> None:
        super().__init__(list(findings), title)
        self.same = 0
        self.compared = 0

    @property
    def explained(self) -> list[Finding]:
        return self.of_kind(*EXPLAINED_KINDS)

    @property
    def differing_keys(self) -> list[str]:
        return sorted({k for f in self.findings if f.severity == "error" for k in f.keys})

    def _extra_json(self) -> dict:
        return {"compared": self.compared, "same": self.same}

    def to_dict(self) -> dict:
        return self.to_json()

    def short(self) -> str:
        """The short text form: a count, then one line per finding."""
        head = f"{self.title}: {self.same} of {self.compared} tensor(s) identical to the reference"
        return "\n".join([head] + [f"  {f.kind}: {f.message}" for f in self.findings])


@dataclass(frozen=True)
class _Move:
    dst: str   # the checkpoint key
    src: str   # the reference key whose tensor it holds


def _split_index(dst: str, src: str) -> tuple[tuple[str, ...], int, int, int] | None:
    """(prefix, position, dst index, src index) when the keys differ only in one numeric component."""
    a, b = dst.split("."), src.split(".")
    if len(a) != len(b):
        return None
    diff = [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
    if len(diff) != 1:
        return None
    p = diff[0]
    ia, ib = _index_of(a[p]), _index_of(b[p])
    if ia is None or ib is None or ia[0] != ib[0]:
        return None
    return tuple(a[:p]) + (ia[0],), p, ia[1], ib[1]


def _cycles(mapping: Mapping[Any, Any]) -> tuple[list[list[Any]], list[list[Any]]]:
    """Decompose ``dst -> src`` into closed cycles and open chains (each listed dst first, following src)."""
    seen: set = set()
    cycles, chains = [], []
    sources = set(mapping.values())
    # chains start at a dst that is no one's source
    for start in sorted(mapping, key=str):
        if start in seen or start in sources:
            continue
        chain, x = [], start
        while x in mapping and x not in seen:
            seen.add(x)
            chain.append(x)
            x = mapping[x]
        chains.append(chain + [x])
    for start in sorted(mapping, key=str):
        if start in seen:
            continue
        cycle, x = [], start
        while x not in seen:
            seen.add(x)
            cycle.append(x)
            x = mapping[x]
        cycles.append(cycle)
    return cycles, chains


def _group_moves(moves: list[_Move], layers: Mapping[tuple[str, ...], set[int]]) -> tuple[list[Finding], list[_Move]]:
    """Moves between keys differing only in one layer index, grouped by (prefix, index map): each
    group with at least two tensors becomes one block finding; the rest are returned."""
    groups: dict[tuple[tuple[str, ...], int], list[tuple[_Move, int, int]]] = {}
    rest: list[_Move] = []
    for m in moves:
        s = _split_index(m.dst, m.src)
        if s is None:
            rest.append(m)
        else:
            groups.setdefault((s[0], s[1]), []).append((m, s[2], s[3]))
    findings: list[Finding] = []
    for (prefix, _), members in sorted(groups.items()):
        index_map: dict[int, int] = {}
        consistent = True
        for _, d, s in members:
            if index_map.setdefault(d, s) != s:
                consistent = False
        kinds = {tuple(m.dst.split(".")[len(prefix):]) for m, _, _ in members}
        if not consistent or len(kinds) < 2:  # one tensor kind moving is a pair, not a block
            rest.extend(m for m, _, _ in members)
            continue
        findings.extend(_block_findings(prefix, index_map, members, sorted(layers.get(prefix, set()))))
    return findings, rest


def _block_findings(prefix: tuple[str, ...], index_map: dict[int, int], members: list[tuple[_Move, int, int]],
                    all_layers: list[int]) -> list[Finding]:
    name = _label(prefix)

    def keys_of(indices: Iterable[int]) -> tuple[str, ...]:
        wanted = set(indices)
        return tuple(sorted(m.dst for m, d, _ in members if d in wanted))

    shifts = {d - s for d, s in index_map.items()}
    if len(shifts) == 1 and len(index_map) >= 2:
        (shift,) = shifts
        dsts = sorted(index_map)
        keys = keys_of(dsts)
        every = set(dsts) | {s for s in index_map.values()} >= set(all_layers) if all_layers else False
        first, last = _layer_name(prefix, dsts[0]), _layer_name(prefix, dsts[-1])
        scope = f"every layer of {name}" if every else f"layers {first}..{last}"
        msg = (f"{scope} shifted by {shift:+d}: {first}..{last} hold the reference's "
               f"{_layer_name(prefix, dsts[0] - shift)}..{_layer_name(prefix, dsts[-1] - shift)} ({len(keys)} tensors)")
        sources = set(index_map.values())
        pushed_out = max(sources) + 1 if shift > 0 else min(sources) - 1  # the layer next in line, if any
        unsourced = [_layer_name(prefix, pushed_out)] if pushed_out in all_layers and pushed_out not in sources else []
        return [Finding("layer_shift", msg, keys=keys, data={"prefix": name, "shift": shift, "unsourced": unsourced,
                                                             "map": {str(d): s for d, s in index_map.items()}})]
    n_layers = len(all_layers)
    if n_layers and set(index_map) == set(all_layers) and len(index_map) > 2:
        mods = {(d - s) % n_layers for d, s in index_map.items()}
        if len(mods) == 1:
            keys = keys_of(index_map)
            (shift,) = mods
            return [Finding("layer_shift", f"every layer of {name} rotated by {shift:+d}: layer i holds the "
                            f"reference's layer (i - {shift}) mod {n_layers} ({len(keys)} tensors)", keys=keys,
                            data={"prefix": name, "shift": shift, "map": {str(d): s for d, s in index_map.items()}})]
    cycles, chains = _cycles(index_map)
    out = []
    for cyc in cycles:
        keys = keys_of(cyc)
        data = {"prefix": name, "map": {str(d): index_map[d] for d in cyc}}
        if len(cyc) == 2:
            out.append(Finding("block_swap", f"block {_layer_name(prefix, cyc[0])} <-> {_layer_name(prefix, cyc[1])} "
                               f"exchanged ({len(keys)} tensors)", keys=keys, data=data))
        else:
            path = " <- ".join(_layer_name(prefix, i) for i in cyc + [cyc[0]])
            out.append(Finding("block_cycle", f"blocks cycled: {path} ({len(keys)} tensors; each holds the next "
                               f"one's tensors)", keys=keys, data=data))
    for chain in chains:
        dsts = chain[:-1]
        keys = keys_of(dsts)
        path = " <- ".join(_layer_name(prefix, i) for i in chain)
        out.append(Finding("moved", f"blocks moved: {path} ({len(keys)} tensors; each holds the next one's "
                           f"tensors)", keys=keys, data={"prefix": name, "map": {str(d): index_map[d] for d in dsts}}))
    return out


def _within_layer(a: str, b: str) -> tuple[tuple[str, ...], int, str, str] | None:
    """(prefix, layer index, suffix of a, suffix of b) when both keys sit in the same numbered layer."""
    pa, pb = a.split("."), b.split(".")
    for i, (x, y) in enumerate(zip(pa[:-1], pb[:-1])):
        if x != y:
            return None
        index = _index_of(x)
        if index is not None:
            return tuple(pa[:i]) + (index[0],), index[1], ".".join(pa[i + 1:]), ".".join(pb[i + 1:])
    return None


def _layer_swaps(pairs: list[list[str]], layers: Mapping[tuple[str, ...], set[int]]) -> tuple[list[Finding],
                                                                                              list[list[str]]]:
    """The same exchange (e.g. gate_proj <-> up_proj) in several layers: one finding naming it."""
    groups: dict[tuple[tuple[str, ...], str, str], list[tuple[int, list[str]]]] = {}
    rest = []
    for pair in pairs:
        w = _within_layer(*pair)
        if w is None:
            rest.append(pair)
            continue
        prefix, index, x, y = w
        if x > y:
            x, y = y, x
        groups.setdefault((prefix, x, y), []).append((index, pair))
    out = []
    for (prefix, x, y), members in sorted(groups.items()):
        if len(members) < 2:
            rest.extend(pair for _, pair in members)
            continue
        indices = sorted(i for i, _ in members)
        name = _label(prefix)
        scope = f"every layer of {name}" if set(indices) >= layers.get(prefix, set()) else \
            "layers " + ", ".join(_layer_name(prefix, i) for i in indices)
        keys = tuple(sorted(k for _, pair in members for k in pair))
        out.append(Finding("swap", f"{x} <-> {y} exchanged in {scope} ({len(members)} pairs)", keys=keys,
                           data={"prefix": name, "layers": indices, "suffixes": [x, y]}))
    return out, rest


def _pair_findings(moves: list[_Move], layers: Mapping[tuple[str, ...], set[int]]) -> list[Finding]:
    mapping = {m.dst: m.src for m in moves}
    cycles, chains = _cycles(mapping)
    grouped, pairs = _layer_swaps([c for c in cycles if len(c) == 2], layers)
    out = list(grouped)
    out += [Finding("swap", f"swap {a} <-> {b}", keys=(a, b)) for a, b in pairs]
    for cyc in cycles:
        if len(cyc) == 2:
            continue
        else:
            out.append(Finding("cycle", "cycle " + " <- ".join(cyc + [cyc[0]]) + " (each holds the next one's tensor)",
                               keys=tuple(cyc)))
    for chain in chains:
        for dst, src in zip(chain, chain[1:]):
            if dst in mapping:
                out.append(Finding("moved", f"{dst} holds the reference's {src}", keys=(dst,),
                                   data={"source": src}))
    return out


# -- slice orders -------------------------------------------------------------------------------------
def _divisors(n: int) -> list[int]:
    return [d for d in range(2, min(n, MAX_SLICES) + 1) if n % d == 0]


def _fingerprints(c: np.ndarray, axis: int) -> np.ndarray:
    """One uint64 per index along ``axis``: the position-weighted sum of the value bits, wrapping
    (integer arithmetic: exact, independent of summation order)."""
    bits = np.moveaxis(c.view(np.uint64) if c.dtype == np.float64 else c.astype(np.int64).view(np.uint64),
                       axis, 0).reshape(c.shape[axis], -1)
    weights = (np.arange(bits.shape[1], dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
               + np.uint64(0x632BE59BD9B4E019)) | np.uint64(1)
    with np.errstate(over="ignore"):
        return (bits * weights).sum(axis=1, dtype=np.uint64)


def _slice_order(ours: np.ndarray, ref: np.ndarray) -> tuple[int, int, list[int]] | None:
    """(axis, n, perm): the fewest equal slices along one axis whose permutation turns ``ref`` into
    ``ours`` (ours slice i is ref slice perm[i]); None when no such reordering exists."""
    if ours.shape != ref.shape or ours.size > MAX_REORDER_ELEMENTS or ours.size == 0:
        return None
    o, r = _canonical(ours), _canonical(ref)
    if np.isnan(o).any() or np.isnan(r).any():
        return None
    for axis in range(o.ndim):
        # exact per-index fingerprints: equal slices have equal block fingerprints, so one pass over
        # the data rules out most slice counts before any slice is hashed
        fo, fr = _fingerprints(o, axis), _fingerprints(r, axis)
        for n in _divisors(o.shape[axis]):
            if not np.array_equal(np.sort(fo.reshape(n, -1).sum(axis=1)), np.sort(fr.reshape(n, -1).sum(axis=1))):
                continue
            ho, hr = _slice_hashes(o, axis, n), _slice_hashes(r, axis, n)
            if sorted(ho) != sorted(hr):
                continue
            free: dict[bytes, list[int]] = {}
            for j, h in enumerate(hr):
                free.setdefault(h, []).append(j)
            perm = []
            for i, h in enumerate(ho):  # an equal slice in place is taken first: the fewest moves
                js = free[h]
                perm.append(js.pop(js.index(i)) if i in js else js.pop(0))
            if perm != list(range(n)):
                return axis, n, perm
    return None


def _interleave(perm: list[int]) -> tuple[int, int] | None:
    """(a, b) when ours[i*a + j] = ref[j*b + i]: b groups of a stored as a groups of b."""
    n = len(perm)
    for a in range(2, n):
        if n % a:
            continue
        b = n // a
        if all(perm[i * a + j] == j * b + i for i in range(b) for j in range(a)):
            return a, b
    return None


_PROJECTION = {"q_proj": "Q", "wq": "Q", "query": "Q", "k_proj": "K", "wk": "K", "key": "K",
               "v_proj": "V", "wv": "V", "value": "V"}


def projection_part(key: str) -> str | None:
    """"Q", "K" or "V" for a separate attention projection's tensor (``...k_proj.weight``), else None."""
    parts = key.split(".")
    return _PROJECTION.get(parts[-2]) if len(parts) >= 2 else None


def _per_head(perm: list[int]) -> tuple[int, int, int] | None:
    """(heads, rows per head, a) when ``perm`` applies one interleave of two runs (a = 2 or rows / 2)
    inside each of at least two equal consecutive blocks (heads): the rotary permute of Llama
    conversions and its inverse."""
    n = len(perm)
    for m in range(4, n + 1):
        if n % m:
            continue
        local = [p - perm[0] for p in perm[:m]]
        if perm[0] != 0 or any(perm[b * m + i] != b * m + local[i] for b in range(n // m) for i in range(m)):
            continue
        inter = _interleave(local)
        if inter and n // m >= 2 and 2 in inter:  # rotary pairs: two runs interleaved, in two heads or more
            return n // m, m, inter[0]
    return None


def describe_order(width: int, n: int, perm: list[int], where: str = "", part: str | None = None) -> str:
    """Words for a stored order of ``n`` slices ``width`` wide (``where``: e.g. "along axis 1";
    ``part``: "Q", "K" or "V" for a separate projection, whose slices are heads, not Q/K/V thirds)."""
    where = f" {where}" if where else ""
    moved = [i for i in range(n) if perm[i] != i]
    rotary = _per_head(perm)
    if rotary:
        heads, m, a = rotary
        order = [0, 2, 4, "...", 1, 3, 5, "..."] if a == m // 2 else [0, m // 2, 1, m // 2 + 1, "..."]
        what = ("the permute convert_llama_weights applies for rotary embeddings" if a == m // 2
                else "the inverse of convert_llama_weights' rotary permute")
        return (f"{part + ' ' if part else ''}per-head rotary permute{where}: within each of {heads} heads of "
                f"{m * width}, the reference's rows stored in order [{', '.join(map(str, order))}] ({what})")
    if part is not None:
        if len(moved) == 2:
            i, j = moved
            return f"{part} head slices {i} <-> {j} of {n} exchanged{where} ({width} wide)"
        return f"{part}: {n} head slices{where} reordered ({width} wide): stored order {perm}"
    if n == 3:
        names = "QKV"
        order = "".join(names[p] for p in perm)
        what = f"{names[moved[0]]} and {names[moved[1]]} exchanged" if len(moved) == 2 else f"order {order}"
        return f"thirds{where} reordered: {what} (stored as [{', '.join(order)}], reference [Q, K, V]; {width} wide)"
    if n == 2:
        return f"halves{where} exchanged (e.g. gate/up or K/V order; {width} wide)"
    inter = _interleave(perm)
    if inter:
        a, b = inter
        layout = (f"[Q0, K0, V0, Q1, ...] for the reference's [Q0..Q{b - 1}, K.., V..]" if a == 3
                  else f"slice j of each of the reference's {a} runs of {b} side by side")
        return f"interleaved{where}: per-head interleave, {layout} ({n} slices, {width} wide)"
    if len(moved) == 2:
        i, j = moved
        if n % 3 == 0 and i // (n // 3) == j // (n // 3):
            per = n // 3
            part = "QKV"[i // per]
            return (f"{part} heads {i % per} <-> {j % per} exchanged{where} ({per} heads per third, "
                    f"{width} wide)")
        return f"slices {i} <-> {j} of {n} exchanged{where} ({width} wide)"
    return f"{n} slices{where} reordered ({width} wide): stored order {perm}"


# -- per-key explanations -----------------------------------------------------------------------------
def _scale_factor(ours: np.ndarray, ref: np.ndarray) -> float | None:
    """c with ours = c * ref within a few ulps of ours' dtype, else None (c = 1 excluded)."""
    o, r = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    if o.shape != r.shape or not (np.isfinite(o).all() and np.isfinite(r).all()):
        return None
    rr = float(np.dot(r.ravel(), r.ravel()))
    if rr == 0.0:
        return None
    c = float(np.dot(o.ravel(), r.ravel())) / rr
    eps = np.finfo(ours.dtype).eps if ours.dtype.kind == "f" else np.finfo(np.float64).eps
    if c == 0.0 or np.isclose(c, 1.0, rtol=8 * eps, atol=0.0):
        return None
    ok = np.abs(o - c * r) <= 8 * eps * np.maximum(np.abs(c * r), np.finfo(np.float64).tiny)
    return c if bool(ok.all()) else None


def _explain(key: str, ours: np.ndarray, ref: np.ndarray) -> Finding:
    """The one transformation turning ``ref`` into ``ours``, or a "different values" finding."""
    h = tensor_hash(ours)
    if ours.ndim >= 2 and ref.ndim == ours.ndim and ours.shape == ref.shape[1::-1] + ref.shape[2:] \
            and h == tensor_hash(transposed(ref)):
        return Finding("transpose", transpose_words(key, ours.ndim), keys=(key,))
    if ours.shape != ref.shape:
        return Finding("shape_differs", f"{key} has shape {list(ours.shape)}, the reference's is {list(ref.shape)}",
                       keys=(key,), data={"shape": list(ours.shape), "reference_shape": list(ref.shape)})
    order = _slice_order(ours, ref)
    if order is not None:
        axis, n, perm = order
        text = describe_order(ours.shape[axis] // n, n, perm, f"along axis {axis}", projection_part(key))
        return Finding("reordered", f"{key}: {text}", keys=(key,),
                       data={"axis": axis, "slices": n, "order": perm})
    o, r = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    if ref.dtype.kind == "f":
        for name, rounding in _ROUNDINGS.items():
            if np.array_equal(o, rounding(ref), equal_nan=True):
                changed = int(np.count_nonzero(o != r))
                return Finding("rounded", f"{key} rounded to {name} ({changed} of {o.size} values changed, max "
                               f"error {float(np.max(np.abs(o - r))):.3g})", keys=(key,),
                               data={"dtype": name, "changed": changed})
    c = _scale_factor(ours, ref)
    if c is not None:
        return Finding("scaled", f"{key} scaled by {c:.6g}", keys=(key,), data={"factor": c})
    with np.errstate(invalid="ignore"):
        d = np.abs(o - r)
    d = np.where(np.isnan(d), np.inf, d)
    changed = int(np.count_nonzero(d))
    peak = float(np.max(np.abs(r), initial=0.0))
    searched = "reordering, " if ours.size <= MAX_REORDER_ELEMENTS else \
        f"(slice orders not searched above {MAX_REORDER_ELEMENTS} elements) "
    return Finding("different_values", f"{key}: different values ({changed} of {o.size} differ, max |diff| "
                   f"{float(d.max()):.3g}, reference max |value| {peak:.3g}); no move, transpose, {searched}"
                   f"rounding or scale explains it", keys=(key,),
                   data={"changed": changed, "max_abs_diff": float(d.max())})


def _group_different(findings: list[Finding]) -> list[Finding]:
    """Several different-values tensors of one layer read as one finding naming the layer."""
    by_layer: dict[str, list[Finding]] = {}
    order: list[str] = []
    for f in findings:
        parts = f.keys[0].split(".")
        cut = next((i for i, p in enumerate(parts[:-1]) if _index_of(p)), None)
        layer = ".".join(parts[:cut + 1]) if cut is not None else f.keys[0]
        if layer not in by_layer:
            order.append(layer)
        by_layer.setdefault(layer, []).append(f)
    out = []
    for layer in order:
        group = by_layer[layer]
        if len(group) == 1:
            out.append(group[0])
            continue
        keys = tuple(k for f in group for k in f.keys)
        worst = max(f.data["max_abs_diff"] for f in group)
        out.append(Finding("different_values", f"{layer}: {len(group)} tensors have different values (max |diff| "
                           f"{worst:.3g}): {', '.join(keys)}", keys=keys, data={"max_abs_diff": worst}))
    return out


def _layers(keys: Iterable[str]) -> dict[tuple[str, ...], set[int]]:
    """prefix -> the layer indices the reference has under it (every numeric component)."""
    out: dict[tuple[str, ...], set[int]] = {}
    for key in keys:
        parts = key.split(".")
        for i, p in enumerate(parts[:-1]):
            index = _index_of(p)
            if index is not None:
                out.setdefault(tuple(parts[:i]) + (index[0],), set()).add(index[1])
    return out


def _with_absent_layers(findings: list[Finding], reference: Mapping[str, Any], ref_hash: Mapping[str, bytes],
                        held: set[bytes]) -> list[Finding]:
    """A shift's finding names the reference layer it pushed out when none of that layer's tensors is
    under any checkpoint key (a shift that dropped the last layer)."""
    out = []
    for f in findings:
        absent = [layer for layer in (f.data or {}).get("unsourced", [])
                  if all(ref_hash[k] not in held for k in reference if k.startswith(layer + "."))]
        if absent:
            f = Finding(f.kind, f"{f.message}; the reference's {', '.join(absent)} is absent from the checkpoint (none "
                        f"of its tensors is under any key)", keys=f.keys,
                        node=f.node, severity=f.severity, data={**f.data, "absent": absent})
        out.append(f)
    return out


def compare_weights(ckpt: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray],
                    keys: Sequence[str] | None = None, title: str = "weights") -> WeightReport:
    """Compare ``ckpt`` with the trusted ``reference`` key by key and explain every difference.

    ``keys`` limits the comparison (default: every key of the checkpoint). Keys only one side has
    are reported (warnings: the binding decides whether they matter).
    """
    every = keys is None
    keys = list(ckpt) if keys is None else list(keys)
    report = WeightReport(title=title)
    ref_hash: dict[str, bytes] = {k: tensor_hash(np.asarray(reference[k])) for k in reference}
    by_hash: dict[bytes, list[str]] = {}
    for k, h in ref_hash.items():
        by_hash.setdefault(h, []).append(k)
    ours_hash = {k: tensor_hash(np.asarray(ckpt[k])) for k in keys}
    differing = [k for k in keys if k in ref_hash and ours_hash[k] != ref_hash[k]]
    report.compared = sum(1 for k in keys if k in ref_hash)
    report.same = report.compared - len(differing)
    differing_set = set(differing)

    moves, unexplained = [], []
    for k in differing:
        sources = [s for s in by_hash.get(ours_hash[k], []) if s != k]
        if not sources:
            unexplained.append(k)
            continue
        # prefer a source that itself differs (a permutation), then one a layer index away
        sources.sort(key=lambda s: (s not in differing_set, _split_index(k, s) is None, s))
        moves.append(_Move(k, sources[0]))
    layers = _layers(reference)
    blocks, rest = _group_moves(moves, layers)
    report.extend(_with_absent_layers(blocks, reference, ref_hash, set(ours_hash.values())))
    report.extend(_pair_findings(rest, layers))
    different = []
    for k in unexplained:
        f = _explain(k, np.asarray(ckpt[k]), np.asarray(reference[k]))
        (different if f.kind == "different_values" else report.findings).append(f)
    report.extend(_group_different(different))
    missing = [k for k in reference if k not in ckpt] if every else []
    extra = [k for k in keys if k not in ref_hash]
    if extra:
        report.add(Finding("not_in_reference", f"{len(extra)} checkpoint key(s) the reference lacks: "
                           f"{', '.join(extra[:8])}" + (" ..." if len(extra) > 8 else ""), keys=tuple(extra),
                           severity="warning"))
    if missing:
        report.add(Finding("not_in_checkpoint", f"{len(missing)} reference key(s) the checkpoint lacks: "
                           f"{', '.join(missing[:8])}" + (" ..." if len(missing) > 8 else ""), keys=tuple(missing),
                           severity="warning"))
    return report
