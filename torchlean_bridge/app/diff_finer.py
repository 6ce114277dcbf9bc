"""The finer oracle: values for IR nodes the framework never materialized.

An importer lowers one framework op into several IR nodes (a decomposed attention: slices,
transposes, matmuls, a scale, a softmax; an expanded broadcast; a fused op's inner half). The
framework holds only the op's final value, so those inner nodes have no counterpart. Here each is
recomputed from the *oracle's own* values of its parents with plain numpy primitives in the oracle's
precision, written from the op's definition (not our semantics module), and compared like any
other node; the reason is recorded per node. Constants bound to a reference tensor are the
reference's tensor (transform applied); graph inputs are exactly what the oracle was fed.

A kind without a primitive here, or a node whose parents have no oracle value, stays uncompared
with its reason: it is never guessed.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..graph import Graph, Node

__all__ = ["PRIMITIVES", "derive"]

Prim = Callable[[Node, list[np.ndarray], Mapping[str, np.ndarray]], np.ndarray]


def _softmax(x: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def _slice(node: Node, xs: list[np.ndarray], _: Mapping[str, np.ndarray]) -> np.ndarray:
    index = [slice(None)] * xs[0].ndim
    a = node.attrs
    for ax, st, en, sp in zip(a["axes"], a["starts"], a["ends"], a["steps"]):
        index[ax] = slice(st, en, sp)
    return xs[0][tuple(index)]


def _linear(node: Node, xs: list[np.ndarray], params: Mapping[str, np.ndarray]) -> np.ndarray:
    w = params["weight"].astype(xs[0].dtype)
    y = np.matmul(xs[0], w.T)
    return y + params["bias"].astype(xs[0].dtype) if "bias" in params else y


def _layernorm(node: Node, xs: list[np.ndarray], params: Mapping[str, np.ndarray]) -> np.ndarray:
    x = xs[0]
    axes = tuple(range(node.attrs["axis"], x.ndim))
    mean = np.mean(x, axis=axes, keepdims=True)
    var = np.mean(np.square(x - mean), axis=axes, keepdims=True)
    y = (x - mean) / np.sqrt(var + np.asarray(node.attrs["eps"], x.dtype))
    if "weight" in params:
        y = y * params["weight"].astype(x.dtype)
    return y + params["bias"].astype(x.dtype) if "bias" in params else y


def _reduce(f: Callable[..., np.ndarray]) -> Prim:
    """A reduction over the listed axes (kept or removed as the node says); none listed: refused."""
    def prim(node: Node, xs: list[np.ndarray], _: Mapping[str, np.ndarray]) -> np.ndarray:
        axes = node.attrs.get("axes", (node.attrs["axis"],) if "axis" in node.attrs else None)
        if not axes:
            raise ValueError("no axes listed")
        return f(xs[0], axis=tuple(axes), keepdims=bool(node.attrs.get("keepdim", False)))
    return prim


def _log_softmax(x: np.ndarray, axis: int) -> np.ndarray:
    shifted = x - np.max(x, axis=axis, keepdims=True)
    return shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))


def _clamp(node: Node, xs: list[np.ndarray], _: Mapping[str, np.ndarray]) -> np.ndarray:
    lo, hi = node.attrs.get("min"), node.attrs.get("max")
    x = xs[0]
    if lo is not None:
        x = np.maximum(x, np.asarray(lo, x.dtype))
    return np.minimum(x, np.asarray(hi, x.dtype)) if hi is not None else x


def _unary(f: Callable[[np.ndarray], np.ndarray]) -> Prim:
    return lambda node, xs, _: f(xs[0])


def _binary(f: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Prim:
    return lambda node, xs, _: f(xs[0], xs[1])


def _relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, np.zeros((), x.dtype))


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


def _shaped(node: Node, xs: list[np.ndarray], _: Mapping[str, np.ndarray]) -> np.ndarray:
    return xs[0].reshape(node.out_shape)


def _cast(node: Node, xs: list[np.ndarray], _: Mapping[str, np.ndarray]) -> np.ndarray:
    """torch's ``.to`` / ONNX Cast: to bool is "not zero", float to int64 truncates toward zero."""
    x, target = xs[0], node.attrs["dtype"]
    if target == "bool":
        return x != 0
    if target == "int64":
        return (np.trunc(x) if x.dtype.kind == "f" else x).astype(np.int64)
    return x if x.dtype.kind == "f" else x.astype(np.float64)


def _cumsum(node: Node, xs: list[np.ndarray], _: Mapping[str, np.ndarray]) -> np.ndarray:
    """Running sums along ``axis`` (last to first with ``reverse``; ``exclusive`` shifts by one)."""
    a, x = node.attrs, xs[0]
    axis = a["axis"]
    y = np.flip(x, axis) if a.get("reverse") else x
    c = np.cumsum(y, axis=axis, dtype=y.dtype)
    if a.get("exclusive"):
        head = np.zeros_like(np.take(c, [0], axis=axis))
        c = np.concatenate([head, np.take(c, np.arange(c.shape[axis] - 1), axis=axis)], axis=axis)
    return np.flip(c, axis) if a.get("reverse") else c


# one primitive per IR kind, each the op's definition in numpy (the oracle's primitives)
PRIMITIVES: dict[str, Prim] = {
    "broadcast_to": lambda node, xs, _: np.broadcast_to(xs[0], node.out_shape),
    "expand": lambda node, xs, _: np.broadcast_to(xs[0], node.out_shape),
    "reshape": _shaped, "flatten": _shaped, "squeeze": _shaped, "unsqueeze": _shaped,
    "transpose": lambda node, xs, _: np.swapaxes(xs[0], node.attrs["axis1"], node.attrs["axis2"]),
    "permute": lambda node, xs, _: np.transpose(xs[0], node.attrs["perm"]),
    "slice": _slice,
    "concat": lambda node, xs, _: np.concatenate(xs, axis=node.attrs["axis"]),
    "gather": lambda node, xs, _: np.take(xs[0], xs[1], axis=node.attrs["axis"]),
    "detach": _unary(lambda x: x),
    "matmul": _binary(np.matmul),
    "add": _binary(np.add), "sub": _binary(np.subtract), "mul_elem": _binary(np.multiply),
    "div": _binary(np.divide), "max_elem": _binary(np.maximum), "min_elem": _binary(np.minimum),
    "where": lambda node, xs, _: np.where(xs[0], xs[1], xs[2]),
    "softmax": lambda node, xs, _: _softmax(xs[0], node.attrs["axis"]),
    "relu": _unary(_relu), "tanh": _unary(np.tanh), "sigmoid": _unary(_sigmoid), "exp": _unary(np.exp),
    "neg": _unary(np.negative), "abs": _unary(np.abs), "sqrt": _unary(np.sqrt),
    "linear": _linear, "layernorm": _layernorm,
    "log": _unary(np.log), "pow_elem": _binary(np.power), "clamp": _clamp,
    "log_softmax": lambda node, xs, _: _log_softmax(xs[0], node.attrs["axis"]),
    "reduce_sum_axes": _reduce(np.sum), "reduce_mean_axes": _reduce(np.mean), "reduce_max": _reduce(np.max),
    "reduce_min": _reduce(np.min), "reduce_prod": _reduce(np.prod), "reduce_sum": _reduce(np.sum),
    "reduce_mean": _reduce(np.mean), "sum": lambda node, xs, _: np.sum(xs[0]),
    "eq": _binary(np.equal), "ne": _binary(np.not_equal), "lt": _binary(np.less), "le": _binary(np.less_equal),
    "gt": _binary(np.greater), "ge": _binary(np.greater_equal),
    "logical_and": _binary(np.logical_and), "logical_or": _binary(np.logical_or),
    "logical_not": _unary(np.logical_not),
    "cast": _cast, "round": _unary(np.rint), "cumsum": _cumsum,  # rint: half to even, as torch.round
}


def _precise(x: np.ndarray, precision: type) -> np.ndarray:
    return x.astype(precision) if x.dtype.kind == "f" else x


def _from_literal(g: Graph, nid: int, ours: np.ndarray, literals: Callable[[str], list[np.ndarray]],
                  operands: Callable[[str], list[np.ndarray]] | None = None,
                  tables: Callable[[str], list[np.ndarray]] | None = None) -> tuple[np.ndarray, str] | None:
    """The framework literal a folded constant came from, read off the nodes it feeds (through
    broadcasts and the unnamed rest of one lowering): one equal to ours up to float32 rounding; else
    the oracle's own value of one of those nodes' arguments (a constant the framework computed, e.g.
    an attention mask or an expanded index buffer, that the importer folded); else the index table
    ``tables`` derives from such a node's literal by the op's definition (GatherND's flat positions):
    that one is returned whenever its size fits, equal or not, since it is that constant's own
    counterpart (a wrong table then diverges). None when nothing fits: a node has many literals
    (dropout, flags, axes), so an unequal one is no evidence of a wrong fold; the constant then stays
    uncompared (its consumers still are)."""
    consumers = g.consumers()
    own = g.nodes[nid].source
    frontier, names = list(consumers[nid]), [own.name] if own is not None and own.name else []
    seen: set[int] = set()
    while frontier and len(seen) < 64:  # through broadcasts and the unnamed rest of the same lowering
        c = g.nodes[frontier.pop(0)]
        if c.id in seen:
            continue
        seen.add(c.id)
        if c.source is not None and c.source.name and c.kind not in ("broadcast_to", "expand"):
            if c.source.name not in names:
                names.append(c.source.name)
        else:
            frontier.extend(consumers[c.id])
    sources = [(literals, "a literal argument")]
    if operands is not None:
        sources.append((operands, "the oracle's value of an argument"))
    for find, what in sources:
        for name in names:
            sized = [lit for lit in find(name) if lit is not None and lit.dtype.kind in "biuf"
                     and lit.size == ours.size]
            same = [lit for lit in sized if np.allclose(lit.astype(np.float64).reshape(ours.shape),
                                                         ours.astype(np.float64),
                                                         rtol=2 * float(np.finfo(np.float32).eps), atol=0, equal_nan=True)]
            if same:
                return same[0].reshape(ours.shape), f"constant folded from {what} of {name}"
    for name in names if tables is not None else ():
        for table in tables(name):
            if table.size == ours.size:
                return table.reshape(ours.shape), f"index table of {name}, from its indices by the op's definition"
    return None


def derive(g: Graph, known: dict[int, np.ndarray], candidates: Sequence[int], precision: type,
           inputs: Sequence[np.ndarray], reference: Mapping[tuple[int, str], np.ndarray],
           payload: Any, literals: Callable[[str], list[np.ndarray]] | None = None,
           cache: dict[int, tuple[np.ndarray, str] | None] | None = None,
           operands: Callable[[str], list[np.ndarray]] | None = None,
           tables: Callable[[str], list[np.ndarray]] | None = None,
           ) -> tuple[dict[int, np.ndarray], dict[int, str]]:
    """Oracle values for ``candidates`` (ascending ids, so parents come first) from ``known``
    (the oracle's values by node id, extended as nodes are derived), and why each was derivable or not.

    ``reference`` holds the reference's tensors by (node, role), transform applied; a folded constant
    with no reference tensor lends our own value to its consumers (said in their reason) but is not
    compared itself, unless ``literals`` (framework node name -> the numbers it was called with) gives
    the literal it was folded from, or ``operands`` (framework node name -> the oracle's values of its
    arguments on this input) the value it was folded from, or ``tables`` (framework node name -> the
    index tables its definition reads, see ``_from_literal``) its counterpart. ``cache`` keeps those
    look-ups across input sets (they do not depend on the input).
    """
    cache = {} if cache is None else cache
    values: dict[int, np.ndarray] = {}
    reasons: dict[int, str] = {}
    position = {nid: k for k, nid in enumerate(g.inputs)}
    borrowed: dict[int, np.ndarray] = {}
    for nid in candidates:
        node = g.nodes[nid]
        if node.kind == "input":
            values[nid] = known[nid] = np.asarray(inputs[position[nid]])
            reasons[nid] = "graph input: the value the oracle was fed"
            continue
        if node.kind == "const":
            ref = reference.get((nid, "values"))
            if ref is not None:
                values[nid] = known[nid] = ref
                reasons[nid] = "constant: the reference's own tensor"
                continue
            own = payload.get(nid, "values")
            if nid not in cache:
                cache[nid] = (_from_literal(g, nid, np.asarray(own), literals, operands, tables)
                              if own is not None and literals else None)
            found = cache[nid]
            if found is not None:
                values[nid] = known[nid] = found[0]
                reasons[nid] = found[1]
            else:
                if own is not None:
                    borrowed[nid] = np.asarray(own)
                reasons[nid] = "constant folded by the importer: no reference tensor or equal framework literal"
            continue
        prim = PRIMITIVES.get(node.kind)
        if prim is None:
            reasons[nid] = f"no finer oracle for {node.kind}"
            continue
        missing = [p for p in node.parents if p not in known and p not in borrowed]
        if missing:
            reasons[nid] = f"parent node(s) {', '.join(map(str, missing))} have no oracle value"
            continue
        record = payload.record(nid) if nid in payload else {}
        # an unbound all-zero role is a default the importer filled in (a bias the framework op lacks)
        unbound = [role for role, a in record.items() if (nid, role) not in reference and np.any(a)]
        if unbound:
            reasons[nid] = f"its payload `{unbound[0]}` is bound to no reference tensor to recompute it from"
            continue
        params = {role: reference.get((nid, role), a) for role, a in record.items()}
        xs = [_precise(known[p] if p in known else borrowed[p], precision) for p in node.parents]
        try:
            with np.errstate(all="ignore"):
                value = np.asarray(prim(node, xs, params)).reshape(node.out_shape)
        except ValueError as e:  # numpy refusing these operands: say so, compare nothing
            reasons[nid] = f"no finer oracle for this {node.kind}: numpy: {e}"
            continue
        values[nid] = known[nid] = value
        lent = [p for p in node.parents if p in borrowed and p not in known]
        reasons[nid] = (f"finer oracle: numpy {node.kind} on the oracle's values of node(s) "
                        f"{', '.join(map(str, node.parents))}"
                        + (f" (our folded constant(s) {', '.join(map(str, lent))})" if lent else ""))
    return values, reasons
