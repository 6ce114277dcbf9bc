"""Interval bound propagation (IBP) over the IR: a sound float64 box for every node.

``interval_bounds(g, payload, lower, upper)`` returns one ``(lo, hi)`` pair per node whose
endpoints enclose the node's *exact real* value for every real input in the box: every operation is
outward rounded (see ``interval_round``), library transcendentals are widened by their error bound.
The rules are tight where it is cheap to be: affine ops in center-radius form (exact ranges before
rounding), monotone functions at the endpoints, gelu/silu/mish/sin/cos through their true extrema,
per-entry exact softmax ranges. ``INTERVAL_RULES`` is keyed by op kind and covers every op of the
registry; the ops listed in ``NO_RULE`` raise ``IntervalError`` naming the node.

Enclosures that are sound but not exact ranges (documented where they live): layernorm (forgets
the correlation of the centered entries), mul_elem/div/matmul between two non-point boxes (each
term exact, the dependency between terms lost), ``rand_uniform`` ([0, 1], TorchLean's rule),
``bernoulli_mask`` ([0, 1] unless the keep probability's box decides it), argmax/argmin (from the
first to the last index that can win), sqrt/rsqrt/pow on a box reaching below 0 (clipped to the
domain, as TorchLean does), inv on a box containing 0 ([-inf, inf]: the float inv gives +-inf at
+-0), and affine images of boxes with an infinite end (unbounded).

Element types: int64 and bool values are boxes too (float64 endpoints; bools as 0/1; int64 is
exact up to 2**53). Ops that need exact integers (gather indices) demand point boxes. Domain
violations (log at <= 0, division by a box containing 0) raise ``IntervalError`` naming the node;
no box end is ever NaN (a NaN from inf - inf becomes the trivial bound).

``interval_bounds`` reads the payload on every call; ``IntervalPropagator(g, payload)`` reads it
once (affine weights in float64 with |W| precomputed) and then propagates many boxes.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .tables import registrar
from torchlean_bridge.check import check
from torchlean_bridge.errors import BridgeError, IntervalError
from torchlean_bridge.graph import Graph, Node
from torchlean_bridge.ops import BOOL, INT64, REGISTRY, fmt_shape
from torchlean_bridge.payload import Payload

from . import interval_arith as ia
from .conv import EMPTY_WINDOW, avg_pool_divisor, pool_out_spatial
from .evaluate import input_list
from .float_rules import FLOAT_RULES, running_sum, sorted_values
from .interval_affine import AffineParams, avg_pool_box, batch_norm_box, conv_box, linear_box, matmul_box, mean_box
from .interval_nonlinear import (arg_extremum_box, layernorm_box, log_softmax_box, mse_box, prod_box,
                                 softmax_box)
from .interval_round import Box, clean, down, gamma, sum_bounds, up
from .interval_unary import UNARY_RULES, DomainError, join_at_zero, log_at, monotone, softplus_at
from .records import batch_norm_record, const_values, conv_record, layernorm_record, linear_record
from .resize import resize_linear_box

__all__ = ["interval_bounds", "IntervalPropagator", "INTERVAL_RULES", "NO_RULE", "IntervalRule", "input_boxes"]

Record = Mapping[str, np.ndarray]
IntervalRule = Callable[[Node, Sequence[Box], Record], Box]
F64 = np.dtype(np.float64)

INTERVAL_RULES: dict[str, IntervalRule] = {}

# ops without a rule, and why
NO_RULE = {
    "custom": "a custom node's body is a checked Lean program that is not part of the bundle",
}


rule = registrar(INTERVAL_RULES)


def _float_rule_on_ends(kind: str) -> IntervalRule:
    """Data movement and monotone ops computed exactly in floating point (relu, floor, ceil, sign,
    clamp, max/min): the float semantics applied to lo and to hi is the exact range."""
    fn = FLOAT_RULES[kind]

    def run(node: Node, ps: Sequence[Box], rec: Record) -> Box:
        lo = fn(node, [p[0] for p in ps], rec, F64)
        hi = fn(node, [p[1] for p in ps], rec, F64)
        return np.asarray(lo, dtype=np.float64), np.asarray(hi, dtype=np.float64)
    return run


for _k in ("detach", "permute", "transpose", "broadcast_to", "expand", "reshape", "flatten", "squeeze",
           "unsqueeze", "concat", "slice", "pad", "max_elem", "min_elem", "max_pool", "max_pool_nd",
           "reduce_max", "reduce_min", "relu", "floor", "ceil", "round", "trunc", "sign", "clamp"):
    INTERVAL_RULES[_k] = _float_rule_on_ends(_k)


def _unary(kind: str) -> IntervalRule:
    fn = UNARY_RULES[kind]
    return lambda node, ps, rec: fn(ps[0], node.attrs)


assert not set(UNARY_RULES) & set(INTERVAL_RULES), "one interval rule per op"
for _k in UNARY_RULES:
    INTERVAL_RULES[_k] = _unary(_k)

# -- payload records --------------------------------------------------------------------------

# The kinds that read a payload record, each read through the float evaluator's helpers
# (semantics/records.py): both domains accept the same payloads (flat const values, flat layernorm
# gamma/beta) and reject the rest with the same spec section 4.8 messages.
_READERS: dict[str, Callable[[Node, Record, tuple[int, ...]], Any]] = {
    "const": lambda node, rec, parent: ia.point(const_values(node, rec).astype(np.float64)),
    "linear": lambda node, rec, parent: AffineParams.of(*linear_record(node, rec, parent)),
    **dict.fromkeys(("conv", "conv_transpose"), lambda node, rec, parent: AffineParams.of(*conv_record(node, rec))),
    "layernorm": lambda node, rec, parent: layernorm_record(node, rec, parent),
    "batch_norm_eval": lambda node, rec, parent: batch_norm_record(node, rec),
}
PREPARED = "prepared"  # record key under which IntervalPropagator stores a node's read parameters


def _params(node: Node, rec: Record, parent_shape: tuple[int, ...]) -> Any:
    """The node's parameters as read once by ``IntervalPropagator``, or read now from a raw record."""
    prepared = rec.get(PREPARED)
    return prepared if prepared is not None else _READERS[node.kind](node, rec, parent_shape)

# -- leaves -----------------------------------------------------------------------------------


@rule("const")
def _const(node, ps, rec):
    return _params(node, rec, ())


@rule("rand_uniform")
def _rand_uniform(node, ps, rec):
    return np.zeros(node.out_shape), np.ones(node.out_shape)


@rule("bernoulli_mask")
def _bernoulli_mask(node, ps, rec):
    q_lo, q_hi = ps[0]
    lo = np.full(node.out_shape, 1.0 if q_lo >= 1 else 0.0)
    hi = np.full(node.out_shape, 0.0 if q_hi <= 0 else 1.0)
    return lo, hi

# -- elementwise arithmetic -------------------------------------------------------------------


INTERVAL_RULES["add"] = lambda node, ps, rec: ia.add(ps[0], ps[1])
INTERVAL_RULES["sub"] = lambda node, ps, rec: ia.sub(ps[0], ps[1])
INTERVAL_RULES["mul_elem"] = lambda node, ps, rec: ia.mul(ps[0], ps[1])


@rule("div")
def _div(node, ps, rec):
    if np.any(ia.contains_zero(ps[1])):
        raise DomainError("div: the denominator's box contains 0")
    return ia.div(ps[0], ps[1])


@rule("prelu")
def _prelu(node, ps, rec):
    x, slope = ps
    negative = np.minimum(x[0], 0.0), np.minimum(x[1], 0.0)
    return join_at_zero(x, ia.mul(negative, slope))


@rule("safe_log")
def _safe_log(node, ps, rec):
    x, eps = ps
    s = monotone(softplus_at, x)
    arg = ia.add(s, (np.broadcast_to(eps[0], s[0].shape), np.broadcast_to(eps[1], s[1].shape)))
    if np.any(arg[0] <= 0):
        raise DomainError("safe_log: softplus(x) + eps may be <= 0 (eps box reaches 0 or below)")
    return monotone(log_at, arg)

# -- comparisons and logic (bool boxes: lo = surely true, hi = possibly true) ------------------


def _bools(surely: np.ndarray, possibly: np.ndarray) -> Box:
    return surely.astype(np.float64), possibly.astype(np.float64)


_COMPARE = {
    "lt": lambda a, b: (a[1] < b[0], a[0] < b[1]),
    "le": lambda a, b: (a[1] <= b[0], a[0] <= b[1]),
    "gt": lambda a, b: (a[0] > b[1], a[1] > b[0]),
    "ge": lambda a, b: (a[0] >= b[1], a[1] >= b[0]),
    "eq": lambda a, b: ((a[0] == a[1]) & (b[0] == b[1]) & (a[0] == b[0]), (a[0] <= b[1]) & (b[0] <= a[1])),
    "ne": lambda a, b: ((a[1] < b[0]) | (b[1] < a[0]), ~((a[0] == a[1]) & (b[0] == b[1]) & (a[0] == b[0]))),
}
for _k, _fn in _COMPARE.items():
    INTERVAL_RULES[_k] = (lambda f: lambda node, ps, rec: _bools(*f(ps[0], ps[1])))(_fn)

INTERVAL_RULES["logical_and"] = lambda node, ps, rec: ia.min_box(ps[0], ps[1])
INTERVAL_RULES["logical_or"] = lambda node, ps, rec: ia.max_box(ps[0], ps[1])
INTERVAL_RULES["logical_not"] = lambda node, ps, rec: (1.0 - ps[0][1], 1.0 - ps[0][0])


@rule("isnan")
def _isnan(node, ps, rec):
    """False (the point box 0) where the input box is finite: a box encloses real values, and the
    evaluator makes NaN only from valid input through an overflow to +-inf (inf - inf, 0 * inf),
    which a finite box rules out. An infinite end leaves the answer open: [0, 1]."""
    lo, hi = ps[0]
    return _bools(np.zeros(lo.shape, bool), ~(np.isfinite(lo) & np.isfinite(hi)))


@rule("where")
def _where(node, ps, rec):
    (c_lo, c_hi), x, y = ps
    lo = np.where(c_lo >= 1, x[0], np.where(c_hi <= 0, y[0], np.minimum(x[0], y[0])))
    hi = np.where(c_lo >= 1, x[1], np.where(c_hi <= 0, y[1], np.maximum(x[1], y[1])))
    return lo, hi


@rule("cast")
def _cast(node, ps, rec):
    (lo, hi), target = ps[0], node.attrs["dtype"]
    if target == BOOL:
        return _bools(~ia.contains_zero((lo, hi)), ~((lo == 0) & (hi == 0)))
    if target == INT64:
        if not (np.all(np.isfinite(lo)) and np.all(np.isfinite(hi))):
            raise DomainError("cast: an unbounded box cannot be converted to int64")
        return np.trunc(lo), np.trunc(hi)
    return lo, hi


@rule("gather", "gather_elements")
def _gather(node, ps, rec):
    data, (i_lo, i_hi) = ps
    if not np.array_equal(i_lo, i_hi):
        raise DomainError(f"{node.kind}: indices must be exact (a point box), got a box of width "
                          f"{float(np.max(i_hi - i_lo))}")
    return _float_rule_on_ends(node.kind)(node, [data, (i_lo.astype(np.int64), i_hi.astype(np.int64))], rec)

# -- reductions -------------------------------------------------------------------------------


@rule("sum")
def _sum(node, ps, rec):
    lo, hi = ps[0]
    if lo.ndim == 0:
        return lo, hi
    return sum_bounds(lo, hi, tuple(range(lo.ndim)))


@rule("sort")
def _sort(node, ps, rec):
    """The j-th smallest value is non-decreasing in every entry, so its range over the box is the j-th
    smallest of the lower ends to the j-th smallest of the upper ends (exact: sorting rounds nothing)."""
    a = node.attrs
    return tuple(sorted_values(end, a["axis"], a["k"], a["descending"]) for end in ps[0])


@rule("cumsum")
def _cumsum(node, ps, rec):
    """Each running sum of the ends, widened by the order-independent bound gamma_n sum|x_i| (n the
    axis length, at least the number of terms of every prefix)."""
    a = node.attrs
    lo, hi = ps[0]
    g = gamma(max(lo.shape[a["axis"]] - 1, 1))
    with np.errstate(all="ignore"):
        ends = []
        for end, outward, sign in ((lo, down, -1.0), (hi, up, 1.0)):
            total = running_sum(end, a["axis"], a["exclusive"], a["reverse"])
            err = up(running_sum(np.abs(end), a["axis"], a["exclusive"], a["reverse"]) * g)
            ends.append(outward(total + sign * err))
        return clean(*ends)


INTERVAL_RULES["reduce_sum"] = lambda node, ps, rec: sum_bounds(*ps[0], node.attrs["axis"])
INTERVAL_RULES["reduce_mean"] = lambda node, ps, rec: mean_box(ps[0], node.attrs["axis"])


def _axes_rule(fn: Callable[[Box, tuple[int, ...]], Box], empty_ok: bool) -> IntervalRule:
    def run(node, ps, rec):
        axes, box = tuple(node.attrs["axes"]), ps[0]
        if not axes:
            return box
        if not empty_ok and any(box[0].shape[a] == 0 for a in axes):
            raise DomainError(f"{node.kind}: reduction over an empty axis of shape {fmt_shape(box[0].shape)}")
        lo, hi = fn(box, axes)
        if node.attrs["keepdim"]:
            lo, hi = np.expand_dims(lo, axes), np.expand_dims(hi, axes)
        return lo, hi
    return run


INTERVAL_RULES["reduce_sum_axes"] = _axes_rule(lambda b, axes: sum_bounds(b[0], b[1], axes), True)
INTERVAL_RULES["reduce_mean_axes"] = _axes_rule(mean_box, False)


@rule("reduce_prod")
def _reduce_prod(node, ps, rec):
    axes = tuple(node.attrs["axes"])
    return ps[0] if not axes else prod_box(ps[0], axes, node.attrs["keepdim"])


INTERVAL_RULES["argmax"] = lambda node, ps, rec: arg_extremum_box(ps[0], node.attrs["axis"],
                                                                 node.attrs["keepdim"], largest=True)
INTERVAL_RULES["argmin"] = lambda node, ps, rec: arg_extremum_box(ps[0], node.attrs["axis"],
                                                                 node.attrs["keepdim"], largest=False)
INTERVAL_RULES["mse_loss"] = lambda node, ps, rec: mse_box(ps[0], ps[1])

# -- normalization and softmax ----------------------------------------------------------------

INTERVAL_RULES["softmax"] = lambda node, ps, rec: softmax_box(ps[0], node.attrs["axis"])
INTERVAL_RULES["log_softmax"] = lambda node, ps, rec: log_softmax_box(ps[0], node.attrs["axis"])


@rule("hard_masked_softmax")
def _hard_masked_softmax(node, ps, rec):
    allowed = np.asarray(node.attrs["allowed"], dtype=bool).reshape(ps[0][0].shape)
    return softmax_box(ps[0], ps[0][0].ndim - 1, allowed)


@rule("layernorm")
def _layernorm(node, ps, rec):
    gamma, beta = _params(node, rec, ps[0][0].shape)
    return layernorm_box(ps[0], node.attrs["axis"], node.attrs["eps"], gamma, beta)


@rule("batch_norm_eval")
def _batch_norm_eval(node, ps, rec):
    p = _params(node, rec, ps[0][0].shape)
    return batch_norm_box(ps[0], p._asdict(), node.attrs["channel_axis"], node.attrs["eps"])

# -- affine maps and pooling ------------------------------------------------------------------


@rule("linear")
def _linear(node, ps, rec):
    return linear_box(ps[0], _params(node, rec, ps[0][0].shape))


@rule("conv", "conv_transpose")
def _conv(node, ps, rec):
    return conv_box(ps[0], _params(node, rec, ps[0][0].shape), node.attrs, node.out_shape,
                    transposed=node.kind == "conv_transpose")


@rule("resize_linear")
def _resize_linear(node, ps, rec):
    return resize_linear_box(*ps[0], node.attrs["sizes"], node.attrs["coordinate_mode"])


INTERVAL_RULES["matmul"] = lambda node, ps, rec: matmul_box(ps[0], ps[1])


@rule("avg_pool")
def _avg_pool(node, ps, rec):
    out = pool_out_spatial(node.out_shape, node.attrs["spatial_rank"])
    return avg_pool_box(ps[0], node.attrs, out, float(math.prod(node.attrs["kernel"])))


@rule("avg_pool_nd")
def _avg_pool_nd(node, ps, rec):
    """Divisor per window as PyTorch/ONNX: cells inside the padded input, or inside the input."""
    a, x = node.attrs, ps[0][0]
    out = pool_out_spatial(node.out_shape, a["spatial_rank"])
    divisor = avg_pool_divisor(a, x.shape[x.ndim - a["spatial_rank"]:], out)
    if np.any(divisor == 0):
        raise DomainError(f"avg_pool_nd: {EMPTY_WINDOW}")
    return avg_pool_box(ps[0], a, out, divisor.astype(np.float64))


def _no_rule(node, ps, rec):
    raise DomainError(f"no interval rule for {node.kind}: {NO_RULE[node.kind]}")


for _k in NO_RULE:
    INTERVAL_RULES[_k] = _no_rule

_missing = sorted(set(REGISTRY) - set(INTERVAL_RULES) - {"input"})
assert not _missing, f"ops without an interval rule: {_missing}"

# -- the driver -------------------------------------------------------------------------------


def _error(node: Node, message: str) -> IntervalError:
    return IntervalError(f"interval: node {node.id} ({node.kind}): {message}", node=node.id, op=node.kind,
                         source=str(node.source) if node.source else None)


def input_boxes(g: Graph, lower: Any, upper: Any) -> dict[int, Box]:
    """The seeded boxes of the graph inputs, checked: shape, order, finiteness, point int/bool boxes."""
    n = len(g.inputs)
    los = input_list(lower, n, "interval: lower bounds", IntervalError)
    his = input_list(upper, n, "interval: upper bounds", IntervalError)
    boxes = {}
    for nid, lo, hi in zip(g.inputs, los, his):
        node = g.nodes[nid]
        for name, arr in (("lower", lo), ("upper", hi)):
            if tuple(arr.shape) != tuple(node.out_shape):
                raise _error(node, f"{name} bound has shape {fmt_shape(arr.shape)}, "
                                   f"expected {fmt_shape(node.out_shape)}")
            if arr.dtype.kind not in "fiub":
                raise _error(node, f"{name} bound has element type {arr.dtype}, expected numbers")
        lo, hi = lo.astype(np.float64), hi.astype(np.float64)
        if np.any(np.isnan(lo)) or np.any(np.isnan(hi)):
            raise _error(node, "bounds contain NaN")
        if np.any(lo > hi):
            k = int(np.argmax((lo > hi).reshape(-1)))
            raise _error(node, f"lower bound exceeds upper bound at flat index {k}: "
                               f"{lo.reshape(-1)[k]!r} > {hi.reshape(-1)[k]!r}")
        if node.dtype in (INT64, BOOL) and not np.array_equal(lo, hi):
            raise _error(node, f"{node.dtype} inputs need a point box (lower == upper)")
        if node.dtype == BOOL and not np.all((lo == 0) | (lo == 1)):
            raise _error(node, "bool inputs must be 0 or 1")
        if node.dtype == INT64 and not np.all(lo == np.trunc(lo)):
            raise _error(node, "int64 inputs must be integers")
        boxes[nid] = lo, hi
    return boxes


class IntervalPropagator:
    """A checked graph whose payload is read once, in node order, through the float evaluator's
    record helpers (so it fails exactly as ``evaluate`` does; affine weights are converted to
    float64 with their absolute values precomputed), for propagating many boxes through one model."""

    def __init__(self, g: Graph, payload: Payload | None) -> None:
        check(g)
        payload = payload if payload is not None else Payload()
        self.graph = g
        self.records: list[Record] = []
        for node in g.nodes:
            rec = payload.record(node.id)
            if node.kind in _READERS:
                parent = g.nodes[node.parents[0]].out_shape if node.parents else ()
                rec = {**rec, PREPARED: _READERS[node.kind](node, rec, parent)}
            self.records.append(rec)

    def __call__(self, lower: Any, upper: Any) -> list[Box]:
        g = self.graph
        seeds = input_boxes(g, lower, upper)
        boxes: list[Box | None] = [None] * len(g.nodes)
        for node in g.nodes:
            if node.kind == "input":
                if node.id not in seeds:
                    raise _error(node, "input node is not listed among the graph inputs")
                boxes[node.id] = seeds[node.id]
                continue
            parents = [boxes[p] for p in node.parents]
            try:
                with np.errstate(all="ignore"):
                    lo, hi = INTERVAL_RULES[node.kind](node, parents, self.records[node.id])
            except BridgeError:
                raise
            except (DomainError, ArithmeticError) as e:
                raise _error(node, str(e)) from None
            lo, hi = clean(np.asarray(lo, dtype=np.float64), np.asarray(hi, dtype=np.float64))
            if lo.shape != node.out_shape or hi.shape != node.out_shape:
                raise _error(node, f"rule produced shape {fmt_shape(lo.shape)}, declared {fmt_shape(node.out_shape)}")
            boxes[node.id] = lo, hi
        return boxes  # type: ignore[return-value]


def interval_bounds(g: Graph, payload: Payload | None, lower: Any, upper: Any) -> list[Box]:
    """One ``(lo, hi)`` pair of float64 arrays per node (the node's shape), outward rounded.

    ``lower``/``upper``: one array each for a one-input graph (a list of plain numbers is one
    array), or lists of arrays in ``g.inputs`` order; read as ``evaluate`` reads its inputs.
    For many boxes through one model, build an ``IntervalPropagator`` once and call it.
    """
    return IntervalPropagator(g, payload)(lower, upper)
