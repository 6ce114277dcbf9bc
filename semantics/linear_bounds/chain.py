"""A graph as a chain of affine layers and ReLUs, with dense matrices, for plain-float optimizations.

beta-CROWN's multipliers and the branching scores of branch and bound are computed by plain backward
passes through the network (no soundness claim: the bounds they lead to are computed by the sound
CROWN passes). Those passes need each affine layer as one ``[out, in]`` matrix over flattened values.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from ..records import PREPARED
from ..rules.affine import batched_conv
from .conv_adjoint import conv_adjoint

if TYPE_CHECKING:  # annotations only: crown imports alpha, which reads these layers
    from .crown import Crown

__all__ = ["ConvOperator", "ELEMENTWISE_AFFINE", "MAX_DENSE", "affine_of", "chain_layers", "const_boxes", "dag_layers"]

MAX_DENSE = 1 << 22  # entries of a convolution's dense matrix (32 MiB of float64); larger: a ConvOperator
# a dense matrix costs n_in products per output against a window's for the operator: dense only when
# that is at most this many windows (on oval21's second convolution, dense cost 16x the operator)
DENSE_WINDOWS = 4
ELEMENTWISE_AFFINE = frozenset({"add", "sub", "mul_elem", "div", "neg"})  # with a constant: ``scale`` layers


def _target(crown: Crown, t: int | None) -> int | None:
    """The node a plain-float pass starts from: ``t``, or the single output; None on an unbatched run
    (the passes work along the batch axis) or when there are several outputs and none was named."""
    if not crown.batched:
        return None
    if t is None:
        return crown.graph.outputs[0] if len(crown.graph.outputs) == 1 else None
    return t


def _cached(build):
    """Memoized per Crown and target: the layers (dense matrices included) are built once, not per pass."""
    def wrapper(crown: Crown, t: int | None = None):
        cache = crown.__dict__.setdefault("_layers_cache", {})
        key = (build.__name__, t)
        if key not in cache:
            cache[key] = build(crown, t)
        return cache[key]
    wrapper.__name__, wrapper.__doc__, wrapper.__wrapped__ = build.__name__, build.__doc__, build
    return wrapper


@_cached
def chain_layers(crown: Crown, t: int | None = None) -> tuple[list[tuple[str, int, Any, Any]], int] | None:
    """t's ancestors (the output by default) as ``([(kind, id, weight, bias)], input id)`` from t down, when
    they are a chain of affine layers (``linear`` on ``[N, features]``, ``conv`` with its channel axis 1,
    as dense ``[out, in]`` matrices over the flattened values; reshapes are skipped: they keep the flat
    order), elementwise affine maps by constants (``("scale", id, scale, shift)``: an input
    normalization ``(x - mean) / std``, see ``_elementwise_affine``) and ReLUs (``("relu", id, None, None)``); None
    otherwise. A convolution whose dense matrix would exceed MAX_DENSE entries is a ``ConvOperator`` (``@``
    as a matrix's). For plain-float heuristics and optimizations (no soundness claim)."""
    g = crown.graph
    t = _target(crown, t)
    if t is None:
        return None
    out, v = [], t
    while g.nodes[v].kind != "input":
        node = g.nodes[v]
        if crown.const[v] or not node.parents:
            return None
        if node.kind in ELEMENTWISE_AFFINE:
            got = _elementwise_affine(crown, node, v)
            if got is None:
                return None
            out.append(("scale", v) + got[1:])
            v = got[0]
            continue
        if any(not crown.const[q] for q in node.parents[1:]):
            return None
        if node.kind in ("linear", "conv"):
            got = affine_of(crown, v)
            if got is None:
                return None
            out.append(("affine", v) + got)
        elif node.kind == "relu":
            out.append(("relu", v, None, None))
        elif node.kind not in ("reshape", "flatten"):
            return None
        v = node.parents[0]
    return out, v


@_cached
def dag_layers(crown: Crown, t: int | None = None
               ) -> tuple[list[tuple[str, int, tuple[int, ...], Any, Any]], int] | None:
    """t's ancestors (the output by default) as a DAG for plain-float passes: ``([(kind, id, parents,
    weight, bias)], input id)`` in decreasing id (a backward pass's order), kinds ``affine`` (linear,
    or conv as a dense matrix or a ``ConvOperator``, as ``chain_layers``), ``identity`` (reshape,
    flatten), ``scale`` (an elementwise affine map by constants, weight and bias flat per unit),
    ``add`` / ``sub`` of two input-dependent values of one shape, ``relu`` (also a leaky ReLU with
    slope in [0, 1]: its weight is that slope, 0 for a ReLU) and ``max_pool`` (its relaxation is the
    run's, ``_Run.pools``); None when another op or a second graph input is met. A chain
    (``chain_layers``) is the case of one parent each. No soundness claim."""
    g = crown.graph
    t = _target(crown, t)
    if t is None:
        return None
    out, inputs = [], set()
    for v in crown.ancestors(t):
        node = g.nodes[v]
        if crown.const[v]:
            continue
        parents = tuple(p for p in node.parents if not crown.const[p])
        if node.kind == "input":
            inputs.add(v)
            continue
        if node.kind in ELEMENTWISE_AFFINE and len(parents) == 1:
            got = _elementwise_affine(crown, node, v)
            if got is None:
                return None
            out.append(("scale", v, (got[0],)) + got[1:])
            continue
        if node.kind in ("add", "sub"):
            if len(parents) != 2 or len(node.parents) != 2 or any(
                    tuple(g.nodes[p].out_shape) != tuple(node.out_shape) for p in parents):
                return None
            out.append((node.kind, v, parents, None, None))
            continue
        if len(parents) != 1 or node.parents[0] != parents[0]:
            return None
        if node.kind == "relu":
            out.append(("relu", v, parents, 0.0, None))
        elif node.kind == "leaky_relu" and 0.0 <= float(node.attrs["negative_slope"]) <= 1.0:
            out.append(("relu", v, parents, float(node.attrs["negative_slope"]), None))  # the slope below 0
        elif node.kind in ("max_pool", "max_pool_nd"):
            out.append(("max_pool", v, parents, None, None))
        elif node.kind in ("reshape", "flatten"):
            out.append(("identity", v, parents, None, None))
        else:
            got = affine_of(crown, v)
            if got is None:
                return None
            out.append(("affine", v, parents) + got)
    if len(inputs) != 1:
        return None
    return out, inputs.pop()


def _elementwise_affine(crown: Crown, node, v: int) -> tuple[int, np.ndarray, np.ndarray] | None:
    """``(input-dependent parent, scale, shift)`` (flat over one sample's units) of ``z = scale * x + shift``
    for a ``neg`` or an add, sub, mul or div of x by a constant that is the same for every sample; None
    otherwise (a constant divided by x is not affine)."""
    if node.kind == "neg":
        n_units = math.prod(crown.ishape(v)[1:])
        return node.parents[0], np.full(n_units, -1.0), np.zeros(n_units)
    if len(node.parents) != 2:
        return None
    (x, y) = node.parents
    first_varies = not crown.const[x]
    p, q = (x, y) if first_varies else (y, x)
    if crown.const[p] or not crown.const[q] or (node.kind == "div" and not first_varies):
        return None
    k = _per_unit(crown, q, v)
    if k is None:
        return None
    ones, zeros = np.ones_like(k), np.zeros_like(k)
    if node.kind == "add":
        return p, ones, k
    if node.kind == "sub":
        return (p, ones, -k) if first_varies else (p, -ones, k)
    if node.kind == "mul_elem":
        return p, k, zeros
    with np.errstate(all="ignore"):
        inv = 1.0 / k
    return (p, inv, zeros) if np.all(np.isfinite(inv)) else None


def _per_unit(crown: Crown, q: int, v: int) -> np.ndarray | None:
    """Constant q's value broadcast to one sample of v, flat (its box's midpoint: these passes are
    heuristics), or None when the samples' values differ or are not finite."""
    lo, hi = const_boxes(crown)[q]
    shape = crown.ishape(v)
    mid = np.broadcast_to((np.asarray(lo, dtype=np.float64) * 0.5 + np.asarray(hi, dtype=np.float64) * 0.5)
                          .reshape(crown.ishape(q)), shape).reshape(shape[0], -1)
    if not np.all(np.isfinite(mid)) or np.any(mid != mid[:1]):
        return None
    return mid[0].copy()


def const_boxes(crown: Crown) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """The boxes of the constants elementwise affine maps read, once per Crown: copies out of one IBP
    pass at the zero input (its arena's boxes are not held, so the propagator keeps reusing them)."""
    got = crown.__dict__.get("_const_boxes")
    if got is None:
        g = crown.graph
        wanted = {q for node in g.nodes if node.kind in ELEMENTWISE_AFFINE for q in node.parents if crown.const[q]}
        zero = np.zeros(g.nodes[g.inputs[0]].out_shape)
        boxes = crown.ibp(zero, zero)
        got = {q: (np.array(boxes[q][0]), np.array(boxes[q][1])) for q in wanted}
        del boxes
        crown.__dict__["_const_boxes"] = got
    return got


def affine_of(crown: Crown, v: int):
    """``_affine`` of node v, built once per Crown (a convolution's dense matrix costs a convolution of
    the identity)."""
    cache = crown.__dict__.setdefault("_affine_cache", {})
    if v not in cache:
        cache[v] = _affine(crown, crown.graph.nodes[v], v)
    return cache[v]


def _affine(crown: Crown, node, v: int):
    """(weight ``[out, in]``: dense, or a ``ConvOperator`` above MAX_DENSE entries or DENSE_WINDOWS
    windows of products per output; bias ``[out]``) of a linear layer or convolution, or None."""
    if node.kind == "linear" and len(node.out_shape) == 2:
        p = crown.ibp.records[v][PREPARED]
        return p.weight, p.bias
    if node.kind == "conv" and node.attrs["channel_axis"] == 1:
        tail_in, tail_out = tuple(crown.ishape(node.parents[0])[1:]), tuple(crown.ishape(v)[1:])
        n_in, n_out = math.prod(tail_in), math.prod(tail_out)
        p = crown.ibp.records[v][PREPARED]
        bias = np.repeat(p.bias, n_out // p.bias.size)
        window = node.attrs["in_channels"] // node.attrs["groups"] * math.prod(node.attrs["kernel"])
        if n_in * n_out > MAX_DENSE or n_in > DENSE_WINDOWS * window:
            return ConvOperator(p.weight, node.attrs, tail_in, tail_out), bias
        return _dense_conv(p.weight, node.attrs, tail_in, tail_out), bias
    return None


def _dense_conv(weight: np.ndarray, attrs, tail_in: tuple[int, ...], tail_out: tuple[int, ...]) -> np.ndarray:
    """A convolution's ``[out, in]`` matrix over flat (channel-major) values, its weights written where
    each output position's taps read (the same matrix as convolving the identity, exactly: one product
    by 1 per entry). Convolving the identity cost ``n_in`` convolutions computed on the whole input grid:
    for a kernel as large as its input (a 1x1 output, as in VNN-COMP's collins_rul_cnn) that was
    ``n_in x cells`` times the entries, minutes where this takes milliseconds."""
    cin, sp_in, cout, sp_out = tail_in[0], tuple(tail_in[1:]), tail_out[0], tuple(tail_out[1:])
    groups = attrs["groups"]
    cg, og = cin // groups, cout // groups
    r = len(sp_in)
    col = lambda v: np.asarray(v, dtype=np.int64).reshape(r, 1, 1)  # noqa: E731
    out_pos = np.indices(sp_out).reshape(r, -1)  # [r, outputs per channel]
    taps = np.indices(tuple(attrs["kernel"])).reshape(r, -1)  # [r, taps]
    at = out_pos[:, :, None] * col(attrs["stride"]) - col(attrs["padding"]) + taps[:, None, :] * col(attrs["dilation"])
    inside = np.all((at >= 0) & (at < col(sp_in)), axis=0)  # [outputs, taps]: padding cells read nothing
    pos, tap = np.nonzero(inside)
    flat_in = np.ravel_multi_index(tuple(at[:, pos, tap]), sp_in) if pos.size else np.zeros(0, np.int64)
    n_pos, n_cells = math.prod(sp_out), math.prod(sp_in)
    dense = np.zeros((cout * n_pos, cin * n_cells))
    o = np.arange(cout)[:, None, None]
    rows = o * n_pos + pos[None, None, :]
    cols = ((o // og) * cg + np.arange(cg)[None, :, None]) * n_cells + flat_in[None, None, :]
    # (output, position, input channel, tap) -> distinct (row, column): plain assignment
    dense[rows, cols] = np.asarray(weight, dtype=np.float64).reshape(cout, cg, -1)[:, :, tap]
    return dense


class ConvOperator:
    """A convolution as the ``[out, in]`` matrix of a layer over flat values, never formed: ``a @ op``
    applies its transpose to coefficient rows ``[..., out]`` (a backward pass), ``x @ op.T`` the
    convolution to values ``[..., in]`` (a forward pass). numpy defers ``@`` to it (``__array_ufunc__``).
    Both run in the weight's dtype: float64 for sound passes, float32 for the plain heuristic ones
    (``astype``; 0.6x the time of a float64 adjoint on oval21's convolutions)."""

    __array_ufunc__ = None

    def __init__(self, weight: np.ndarray, attrs, tail_in: tuple[int, ...], tail_out: tuple[int, ...],
                 transposed: bool = False) -> None:
        self.weight, self.attrs, self.tail_in, self.tail_out = weight, attrs, tail_in, tail_out
        self.transposed = transposed

    @property
    def T(self) -> "ConvOperator":
        return ConvOperator(self.weight, self.attrs, self.tail_in, self.tail_out, not self.transposed)

    def astype(self, dtype: np.dtype | type) -> "ConvOperator":
        return ConvOperator(self.weight.astype(dtype), self.attrs, self.tail_in, self.tail_out, self.transposed)

    def __rmatmul__(self, a: np.ndarray) -> np.ndarray:
        lead, dtype = a.shape[:-1], self.weight.dtype
        if self.transposed:  # x @ W.T: the convolution itself
            out = batched_conv(np.ascontiguousarray(a, dtype=dtype).reshape((-1,) + self.tail_in),
                               self.weight, self.attrs)
            return out.reshape(lead + (math.prod(self.tail_out),))
        at = self.attrs
        back = conv_adjoint(np.asarray(a, dtype=dtype).reshape((-1,) + self.tail_out), self.weight, at["stride"],
                            at["padding"], at["dilation"], at["groups"], self.tail_in[1:])
        return back.reshape(lead + (math.prod(self.tail_in),))
