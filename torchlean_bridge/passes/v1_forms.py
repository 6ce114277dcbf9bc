"""The torchlean.ir.v1 forms of ext ops: each one a small graph of v1 kinds that computes the same
function in real arithmetic, with the float behaviour that changes stated.

TorchLean verifies the graph it receives, so an export must be *that* model: a form is listed here only
when it is exact over the reals (constants such as 1/6 or sqrt(2/pi) are rounded to binary64, which the
deviation class says). ``deviation`` names what can differ in floating point; the writer measures the
size on the model's sample inputs (``app/torchlean_export.py``). Ops whose only v1 forms are
approximations (GELU with erf) lower only when the user names the approximation (``APPROXIMATIONS``).

A lowering reads its node and the new ids of its parents and emits v1 nodes through ``Emit``; it
returns the id holding the node's value, or a sentence saying why these attributes have no form.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from ..graph import Node, normalized_attrs
from ..ops import FLOAT, REGISTRY
from ..ops.resize_taps import interpolation_matrix

if TYPE_CHECKING:
    from .base import GraphEdit

__all__ = ["V1Form", "V1_FORMS", "APPROXIMATIONS", "Emit", "LOWEST", "NoForm", "MATRIX_LIMIT"]

LOWEST = float(np.finfo(np.float64).min)  # JSON has no -inf: padding that must never win a max uses this
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_SELU_ALPHA = 1.6732632423543772848170429916717  # torch.nn.SELU's constants (as semantics/rules/activations.py)
_SELU_SCALE = 1.0507009873554804934193349852946


MATRIX_LIMIT = 1 << 24  # entries of one constant matrix a form may build (128 MiB in float64)


class NoForm(Exception):
    """Raised inside a lowering when these shapes have no affordable form; the message says why."""


def sized_matrix(rows: int, cols: int, what: str) -> np.ndarray:
    """A zero ``[rows, cols]`` float64 matrix, sized before it is made."""
    if rows * cols > MATRIX_LIMIT:
        raise NoForm(f"{what} would need a {rows} x {cols} constant matrix ({rows * cols} entries, above the "
                     f"limit of {MATRIX_LIMIT})")
    return np.zeros((rows, cols))


class Emit:
    """Emits v1 nodes for one ext node into a ``GraphEdit``; shapes come from the registry's rules."""

    def __init__(self, edit: GraphEdit, node: Node, const_value: Callable[[int], np.ndarray | None],
                 parameter: Callable[[str], np.ndarray | None]) -> None:
        self.edit, self.node, self._const_value, self.parameter = edit, node, const_value, parameter
        self.owns_payload = False  # the lowering wrote its node's parameters itself (transformed)

    def shape(self, nid: int) -> tuple[int, ...]:
        return self.edit.shape(nid)

    def op(self, kind: str, *parents: int, shape: Sequence[int] | None = None, **attrs: Any) -> int:
        spec = REGISTRY[kind]
        if shape is None:
            shape = spec.infer(normalized_attrs(kind, attrs, ()), [self.shape(p) for p in parents], ())
        return self.edit.emit(kind, parents, attrs, shape, FLOAT, self.node.source)

    def const(self, values: np.ndarray) -> int:
        values = np.array(values, dtype=np.float64, order="C")  # (ascontiguousarray makes a scalar 1-D)
        if not np.isfinite(values).all():
            raise NoForm(f"{self.node.kind} would need a constant holding {values[~np.isfinite(values)].flat[0]}, "
                         f"which torchlean.ir.v1's JSON cannot spell")
        nid = self.op("const", shape=values.shape)
        self.edit.payload[nid] = {"values": values}
        return nid

    def full(self, value: float, shape: Sequence[int]) -> int:
        """``value`` everywhere in ``shape``: one scalar constant and a broadcast."""
        c = self.const(np.array(value))
        return c if not tuple(shape) else self.op("broadcast_to", c, from_shape=(), to_shape=tuple(shape))

    def like(self, value: float, x: int) -> int:
        return self.full(value, self.shape(x))

    def scale(self, x: int, factor: float) -> int:
        return self.op("mul_elem", x, self.like(factor, x))

    def shift(self, x: int, offset: float) -> int:
        return self.op("add", x, self.like(offset, x))

    def clamp(self, x: int, lo: float | None, hi: float | None) -> int:
        # Lean's max x y = if x <= y then y else x: max(x, lo) keeps a NaN x, and min(hi, x) does too
        if lo is not None:
            x = self.op("max_elem", x, self.like(lo, x))
        if hi is not None:
            x = self.op("min_elem", self.like(hi, x), x)
        return x

    def neg_part(self, x: int) -> int:
        """min(x, 0), NaN kept (min(0, x) = if 0 <= x then 0 else x)."""
        return self.op("min_elem", self.like(0.0, x), x)

    def move_axis_last(self, x: int, axis: int) -> tuple[int, Callable[[int], int]]:
        """``x`` with ``axis`` moved last, and the function that moves it back."""
        rank = len(self.shape(x))
        if axis == rank - 1:
            return x, lambda y: y
        perm = tuple(i for i in range(rank) if i != axis) + (axis,)
        back = tuple(perm.index(i) for i in range(rank))
        return self.op("permute", x, perm=perm), lambda y: self.op("permute", y, perm=back)

    def select(self, x: int, axis: int, index: np.ndarray) -> int:
        """``take(x, index, axis)`` for a 1-D constant ``index``: a matmul by a 0/1 selection matrix."""
        moved, back = self.move_axis_last(x, axis)
        n = self.shape(x)[axis]
        selection = sized_matrix(n, len(index), f"selecting {len(index)} of {n} entries on axis {axis}")
        selection[index, np.arange(len(index))] = 1.0
        return back(self.op("matmul", moved, self.const(selection)))

    def reshape(self, x: int, shape: Sequence[int]) -> int:
        shape = tuple(shape)
        return x if self.shape(x) == shape else self.op("reshape", x, in_shape=self.shape(x), out_shape=shape)

    def reduce_last(self, kind: str, x: int) -> int:
        """max (through a v1 max_pool whose window is the whole last axis) or sum over the last axis,
        keeping it with extent 1."""
        s = self.shape(x)
        if kind == "max":
            return self.op("max_pool", x, spatial_rank=1, kernel=(s[-1],), stride=(s[-1],), padding=(0,))
        return self.reshape(self.op("reduce_sum", x, axis=len(s) - 1), s[:-1] + (1,))

    def reduce_axes(self, kind: str, x: int, axes: Sequence[int], keepdim: bool) -> int:
        """max/sum over ``axes``: moved last, merged, reduced, reshaped to the reduction's shape."""
        s = self.shape(x)
        axes = sorted(axes)
        rest = [i for i in range(len(s)) if i not in axes]
        if axes != list(range(len(s) - len(axes), len(s))):
            x = self.op("permute", x, perm=tuple(rest + axes))
        merged = math.prod(s[a] for a in axes)
        x = self.reshape(x, tuple(s[i] for i in rest) + (merged,))
        y = self.reduce_last(kind, x)
        out = tuple(1 if i in axes else s[i] for i in range(len(s))) if keepdim else tuple(s[i] for i in rest)
        return self.reshape(y, out)

    def pad_axis(self, x: int, axis: int, before: int, after: int, value: float) -> int:
        """Constant blocks of ``value`` concatenated on both sides of ``axis``."""
        if not before and not after:
            return x
        s = self.shape(x)
        parts = []
        if before:
            parts.append(self.full(value, s[:axis] + (before,) + s[axis + 1:]))
        parts.append(x)
        if after:
            parts.append(self.full(value, s[:axis] + (after,) + s[axis + 1:]))
        return self.op("concat", *parts, axis=axis)

    def interleave_zeros(self, x: int, axis: int, stride: int) -> int:
        """``stride - 1`` zeros after every entry along ``axis`` (a concat on a new axis, then a reshape)."""
        s = self.shape(x)
        col = self.reshape(x, s[:axis + 1] + (1,) + s[axis + 1:])
        zeros = self.full(0.0, s[:axis + 1] + (stride - 1,) + s[axis + 1:])
        both = self.op("concat", col, zeros, axis=axis + 1)
        return self.reshape(both, s[:axis] + (s[axis] * stride,) + s[axis + 1:])

    def const_parent(self, i: int) -> np.ndarray | None:
        """The value of the node's ``i``-th parent when it is a constant (through broadcasts and reshapes)."""
        return self._const_value(self.node.parents[i])


Lowering = Callable[[Emit, Node, Sequence[int]], "int | str"]


@dataclass(frozen=True)
class V1Form:
    """How one ext kind becomes v1 kinds, and what that changes in floating point."""

    lower: Lowering
    formula: str
    deviation: str


_ROUNDING = "rounding: the v1 form rounds at different places than the op's own formula"
_CONSTANT = "rounding: constants are rounded to binary64 and the v1 form rounds at different places"
_SELECTION = ("non-finite values: an inf or NaN anywhere on a selected line makes every entry of that line's "
              "result NaN (0 * inf); -0.0 becomes +0.0; finite values are selected exactly")

V1_FORMS: dict[str, V1Form] = {}


def form(kind: str, formula: str, deviation: str) -> Callable[[Lowering], Lowering]:
    def register(fn: Lowering) -> Lowering:
        V1_FORMS[kind] = V1Form(fn, formula, deviation)
        return fn
    return register


# -- elementwise -----------------------------------------------------------------------------------------

@form("neg", "x * -1", "none: multiplying by -1 is exact")
def _neg(e: Emit, n: Node, xs: Sequence[int]) -> int:
    return e.scale(xs[0], -1.0)


@form("clamp", "min_elem(hi, max_elem(x, lo))", "signed zero: a bound of 0 gives +0.0 for -0.0")
def _clamp(e: Emit, n: Node, xs: Sequence[int]) -> int:
    return e.clamp(xs[0], n.attrs["min"], n.attrs["max"])


@form("div", "a * inv(b)", "rounding: two roundings (1/b, then the product) instead of one")
def _div(e: Emit, n: Node, xs: Sequence[int]) -> int:
    return e.op("mul_elem", xs[0], e.op("inv", xs[1]))


@form("rsqrt", "inv(sqrt(x))", "rounding: two roundings; negative inputs give +inf (v1 sqrt clamps at 0) "
                                "where rsqrt gives NaN")
def _rsqrt(e: Emit, n: Node, xs: Sequence[int]) -> int:
    return e.op("inv", e.op("sqrt", xs[0]))


@form("leaky_relu", "max_elem(x, a*x) for 0 <= a <= 1, min_elem(x, a*x) for a > 1, relu(x) + a*min(x, 0) "
                    "otherwise", "none for 0 <= a: the same products are taken; otherwise rounding of the sum")
def _leaky_relu(e: Emit, n: Node, xs: Sequence[int]) -> int:
    x, a = xs[0], float(n.attrs["negative_slope"])
    if 0.0 <= a <= 1.0:
        return e.op("max_elem", x, e.scale(x, a))
    if a > 1.0:
        return e.op("min_elem", x, e.scale(x, a))
    return e.op("add", e.op("relu", x), e.scale(e.neg_part(x), a))


@form("prelu", "relu(x) + slope * min(x, 0)", "signed zero: -0.0 comes out as +0.0")
def _prelu(e: Emit, n: Node, xs: Sequence[int]) -> int:
    return e.op("add", e.op("relu", xs[0]), e.op("mul_elem", xs[1], e.neg_part(xs[0])))


@form("silu", "x * sigmoid(x)", _ROUNDING)
def _silu(e: Emit, n: Node, xs: Sequence[int]) -> int:
    return e.op("mul_elem", xs[0], e.op("sigmoid", xs[0]))


def _hardsigmoid_of(e: Emit, x: int, alpha: float, beta: float) -> int:
    return e.clamp(e.shift(e.scale(x, alpha), beta), 0.0, 1.0)


@form("hardsigmoid", "min_elem(1, max_elem(alpha*x + beta, 0))", _CONSTANT)
def _hardsigmoid(e: Emit, n: Node, xs: Sequence[int]) -> int:
    return _hardsigmoid_of(e, xs[0], float(n.attrs["alpha"]), float(n.attrs["beta"]))


@form("hardswish", "x * min_elem(1, max_elem(x/6 + 1/2, 0))", _CONSTANT)
def _hardswish(e: Emit, n: Node, xs: Sequence[int]) -> int:
    return e.op("mul_elem", xs[0], _hardsigmoid_of(e, xs[0], 1.0 / 6.0, 0.5))


def _elu_of(e: Emit, x: int, alpha: float) -> int:
    tail = e.shift(e.op("exp", e.neg_part(x)), -1.0)  # exp(min(x, 0)) - 1: 0 exactly for x >= 0
    return e.op("add", e.op("relu", x), e.scale(tail, alpha))


@form("elu", "relu(x) + alpha * (exp(min(x, 0)) - 1)",
      "rounding: exp(x) - 1 instead of expm1 (absolute error about 1e-16, relative error large near 0)")
def _elu(e: Emit, n: Node, xs: Sequence[int]) -> int:
    return _elu_of(e, xs[0], float(n.attrs["alpha"]))


@form("selu", "scale * (relu(x) + alpha * (exp(min(x, 0)) - 1))", "as elu, and the constants rounded")
def _selu(e: Emit, n: Node, xs: Sequence[int]) -> int:
    return e.scale(_elu_of(e, xs[0], _SELU_ALPHA), _SELU_SCALE)


@form("celu", "relu(x) + min(0, alpha * (exp(min(x, 0) / alpha) - 1))", "as elu")
def _celu(e: Emit, n: Node, xs: Sequence[int]) -> int | str:
    alpha = float(n.attrs["alpha"])
    if alpha <= 0:
        return f"celu with alpha {alpha} <= 0 has no v1 form here"
    inner = e.scale(e.neg_part(xs[0]), 1.0 / alpha)
    tail = e.scale(e.shift(e.op("exp", inner), -1.0), alpha)
    return e.op("add", e.op("relu", xs[0]), e.neg_part(tail))


@form("softsign", "x * inv(1 + abs(x))", _ROUNDING)
def _softsign(e: Emit, n: Node, xs: Sequence[int]) -> int:
    return e.op("mul_elem", xs[0], e.op("inv", e.shift(e.op("abs", xs[0]), 1.0)))


@form("mish", "x * tanh(softplus(x))", _ROUNDING)
def _mish(e: Emit, n: Node, xs: Sequence[int]) -> int:
    return e.op("mul_elem", xs[0], e.op("tanh", e.op("softplus", xs[0])))


@form("expm1", "exp(x) - 1", "rounding: absolute error about 1e-16, relative error large near 0")
def _expm1(e: Emit, n: Node, xs: Sequence[int]) -> int:
    return e.shift(e.op("exp", xs[0]), -1.0)


@form("log1p", "log(1 + x)", "rounding near 0; v1 log fails evaluation for x <= -1 where log1p gives -inf/NaN")
def _log1p(e: Emit, n: Node, xs: Sequence[int]) -> int:
    return e.op("log", e.shift(xs[0], 1.0))


@form("tan", "sin(x) * inv(cos(x))", _ROUNDING)
def _tan(e: Emit, n: Node, xs: Sequence[int]) -> int:
    return e.op("mul_elem", e.op("sin", xs[0]), e.op("inv", e.op("cos", xs[0])))


@form("sinh", "(exp(x) - exp(-x)) / 2", "rounding: cancellation near 0 (absolute error about 1e-16)")
def _sinh(e: Emit, n: Node, xs: Sequence[int]) -> int:
    return e.scale(e.op("sub", e.op("exp", xs[0]), e.op("exp", e.scale(xs[0], -1.0))), 0.5)


@form("cosh", "(exp(x) + exp(-x)) / 2", _ROUNDING)
def _cosh(e: Emit, n: Node, xs: Sequence[int]) -> int:
    return e.scale(e.op("add", e.op("exp", xs[0]), e.op("exp", e.scale(xs[0], -1.0))), 0.5)


@form("log2", "log(x) * (1/ln 2)", _CONSTANT + "; v1 log fails evaluation for x <= 0")
def _log2(e: Emit, n: Node, xs: Sequence[int]) -> int:
    return e.scale(e.op("log", xs[0]), 1.0 / math.log(2.0))


@form("exp2", "exp(x * ln 2)", _CONSTANT)
def _exp2(e: Emit, n: Node, xs: Sequence[int]) -> int:
    return e.op("exp", e.scale(xs[0], math.log(2.0)))


_POW_LIMIT = 16


@form("pow", "x*x*...*x for integer exponents up to 16 (inv for negative ones), sqrt(x) for 1/2, inv(sqrt(x)) "
             "for -1/2, 1 for 0", "rounding: one rounding per product; sqrt forms give 0 or +inf for negative "
                                  "bases where pow gives NaN")
def _pow(e: Emit, n: Node, xs: Sequence[int]) -> int | str:
    x, p = xs[0], float(n.attrs["exponent"])
    if p == 0.0:
        return e.like(1.0, x)
    if abs(p) == 0.5:
        root = e.op("sqrt", x)
        return root if p > 0 else e.op("inv", root)
    if p != int(p) or abs(p) > _POW_LIMIT:
        return f"pow with exponent {p:g} has no exact v1 form (integers up to {_POW_LIMIT}, 0 and ±1/2 do)"
    out = x
    for _ in range(int(abs(p)) - 1):
        out = e.op("mul_elem", out, x)
    return out if p > 0 else e.op("inv", out)


@form("gelu", "0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))) (approximate='tanh')", _CONSTANT)
def _gelu(e: Emit, n: Node, xs: Sequence[int]) -> int | str:
    if n.attrs["approximate"] != "tanh":
        return ("GELU with erf has no exact v1 form (v1 has no erf): --approximate gelu=tanh or gelu=sigmoid "
                "exports an approximation and states its deviation")
    return gelu_tanh(e, xs[0])


def gelu_tanh(e: Emit, x: int) -> int:
    cube = e.op("mul_elem", e.op("mul_elem", x, x), x)
    inner = e.scale(e.op("add", x, e.scale(cube, 0.044715)), _SQRT_2_OVER_PI)
    return e.op("mul_elem", e.scale(x, 0.5), e.shift(e.op("tanh", inner), 1.0))


def gelu_sigmoid(e: Emit, x: int) -> int:
    return e.op("mul_elem", x, e.op("sigmoid", e.scale(x, 1.702)))


# approximations the user may ask for by name: (kind, name) -> (lowering of the node's input, formula)
APPROXIMATIONS: dict[tuple[str, str], tuple[Callable[[Emit, int], int], str]] = {
    ("gelu", "tanh"): (gelu_tanh, "0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))"),
    ("gelu", "sigmoid"): (gelu_sigmoid, "x * sigmoid(1.702 * x)"),
}


# -- constant conditions ------------------------------------------------------------------------------------

@form("where", "x * m + y * (1 - m) for a constant condition m (constant branches folded; -inf written as the "
               "lowest finite float)", "non-finite values: an inf or NaN in the branch not taken gives NaN; a "
                                       "constant -inf branch becomes -1.797e308 (exact after softmax unless a whole "
                                       "row is masked); -0.0 becomes +0.0")
def _where(e: Emit, n: Node, xs: Sequence[int]) -> int | str:
    cond = e.const_parent(0)
    if cond is None:
        return "where over a computed condition has no exact v1 form (only constant conditions, such as masks " \
               "built from shapes, do)"
    shape = tuple(n.out_shape)
    keep = np.broadcast_to(cond.astype(bool), shape)
    parts = []
    for i, mask in ((1, keep), (2, ~keep)):
        if not mask.any():
            continue
        value = e.const_parent(i)
        if value is None:
            parts.append(xs[i] if mask.all() else e.op("mul_elem", xs[i], e.const(mask.astype(np.float64))))
            continue
        v = np.where(mask, np.broadcast_to(np.asarray(value, dtype=np.float64), shape), 0.0)
        if np.isnan(v).any():
            return "where with a constant NaN branch has no v1 form (JSON has no NaN)"
        parts.append(e.const(np.clip(v, LOWEST, -LOWEST)))
    if not parts:
        return e.full(0.0, shape)
    return parts[0] if len(parts) == 1 else e.op("add", parts[0], parts[1])


# -- indexing and layout ----------------------------------------------------------------------------------

@form("slice", "a matmul by a 0/1 selection matrix per sliced axis", _SELECTION)
def _slice(e: Emit, n: Node, xs: Sequence[int]) -> int:
    x = xs[0]
    a = n.attrs
    for axis, start, end, step in zip(a["axes"], a["starts"], a["ends"], a["steps"]):
        index = np.arange(start, end, step)
        if len(index) != e.shape(x)[axis]:
            x = e.select(x, axis, index)
    return x


@form("gather", "a matmul by a 0/1 selection matrix (constant indices)", _SELECTION)
def _gather(e: Emit, n: Node, xs: Sequence[int]) -> int | str:
    index = e.const_parent(1)
    if index is None:
        return "gather by computed indices has no v1 form (a token embedding lookup: cut the graph after it " \
               "with --input-at embeddings)"
    axis = n.attrs["axis"]
    data = e.shape(xs[0])
    flat = np.asarray(index, dtype=np.int64).reshape(-1)
    flat = np.where(flat < 0, flat + data[axis], flat)
    if data[axis] == 0 or flat.size == 0 or np.any((flat < 0) | (flat >= data[axis])):
        return "gather with an index outside the data has no v1 form"
    picked = e.select(xs[0], axis, flat)
    return e.reshape(picked, tuple(n.out_shape))


@form("pad", "constant blocks concatenated on each padded axis", "none: the blocks hold the pad value exactly")
def _pad(e: Emit, n: Node, xs: Sequence[int]) -> int | str:
    value = float(n.attrs["value"])
    if math.isinf(value):  # a NaN value is refused by Emit.const
        value = LOWEST if value < 0 else -LOWEST
    x = xs[0]
    for axis, (b, a) in enumerate(zip(n.attrs["pads_before"], n.attrs["pads_after"])):
        x = e.pad_axis(x, axis, b, a, value)
    return x


def _pool_geometry(e: Emit, n: Node, xs: Sequence[int]) -> tuple[int, int, tuple[int, ...], int, tuple[int, ...]]:
    """The input, spatial rank, input shape, number of leading axes and output spatial extents."""
    r = n.attrs["spatial_rank"]
    s = e.shape(xs[0])
    lead = len(s) - r
    return xs[0], r, s, lead, tuple(n.out_shape[lead:])


@form("max_pool_nd", "blocks of the lowest finite float concatenated for asymmetric padding and ceil mode, then "
                     "a v1 max_pool without padding", "a window whose cells are all -inf gives -1.797e308")
def _max_pool_nd(e: Emit, n: Node, xs: Sequence[int]) -> int | str:
    a = n.attrs
    if any(d != 1 for d in a["dilation"]):
        return "max pooling with dilation has no v1 form"
    x, r, s, lead, out = _pool_geometry(e, n, xs)
    for i in range(r):
        need = (out[i] - 1) * a["stride"][i] + a["kernel"][i]  # the padded extent the windows cover
        after = need - s[lead + i] - a["padding"][i]
        # floor mode may leave cells at the end unread (after < 0): the v1 pool's own floor does the same
        x = e.pad_axis(x, lead + i, a["padding"][i], max(after, 0), LOWEST)
    return e.op("max_pool", x, spatial_rank=r, kernel=tuple(a["kernel"]), stride=tuple(a["stride"]),
                padding=(0,) * r)


@form("reduce_max", "a v1 max_pool whose window is the reduced axes (moved last and merged)",
      "NaN: the first maximum of a window wins, so a NaN may be passed over")
def _reduce_max(e: Emit, n: Node, xs: Sequence[int]) -> int | str:
    if not n.attrs["axes"] or any(e.shape(xs[0])[ax] == 0 for ax in n.attrs["axes"]):
        return "reduce_max over no axis or an empty axis has no v1 form"
    return e.reduce_axes("max", xs[0], n.attrs["axes"], n.attrs["keepdim"])


@form("reduce_min", "-max(-x) through a v1 max_pool", "NaN: as reduce_max")
def _reduce_min(e: Emit, n: Node, xs: Sequence[int]) -> int | str:
    if not n.attrs["axes"] or any(e.shape(xs[0])[ax] == 0 for ax in n.attrs["axes"]):
        return "reduce_min over no axis or an empty axis has no v1 form"
    return e.scale(e.reduce_axes("max", e.scale(xs[0], -1.0), n.attrs["axes"], n.attrs["keepdim"]), -1.0)


@form("log_softmax", "x - m - log(sum(exp(x - m))), m the axis maximum (a v1 max_pool)", _ROUNDING)
def _log_softmax(e: Emit, n: Node, xs: Sequence[int]) -> int | str:
    x, axis = xs[0], n.attrs["axis"]
    s = e.shape(x)
    if s[axis] == 0:
        return "log_softmax over an empty axis has no v1 form"
    moved, back = e.move_axis_last(x, axis)
    ms = e.shape(moved)
    top = e.op("broadcast_to", e.reduce_last("max", moved), from_shape=ms[:-1] + (1,), to_shape=ms)
    centred = e.op("sub", moved, top)
    total = e.reduce_last("sum", e.op("exp", centred))
    lse = e.op("broadcast_to", e.op("log", total), from_shape=ms[:-1] + (1,), to_shape=ms)
    return back(e.op("sub", centred, lse))


@form("cumsum", "a matmul by a triangular 0/1 matrix along the axis", _SELECTION.replace("selected", "summed"))
def _cumsum(e: Emit, n: Node, xs: Sequence[int]) -> int:
    a = n.attrs
    x, axis = xs[0], a["axis"]
    size = e.shape(x)[axis]
    sized_matrix(size, size, f"cumsum over an axis of {size} entries")
    j, i = np.meshgrid(np.arange(size), np.arange(size), indexing="ij")  # [source j, target i]
    take = (j >= i) if a["reverse"] else (j <= i)
    if a["exclusive"]:
        take &= j != i
    moved, back = e.move_axis_last(x, axis)
    return back(e.op("matmul", moved, e.const(take.astype(np.float64))))


def _window_counts(size: int, kernel: int, stride: int, padding: int, out: int, lo: int, hi: int) -> np.ndarray:
    """Cells of each window ``[o*stride - padding, ... + kernel)`` inside ``[lo, hi)``."""
    start = np.arange(out) * stride - padding
    return np.clip(np.minimum(start + kernel, hi) - np.maximum(start, lo), 0, None)


@form("avg_pool_nd", "zero blocks concatenated for the padding, a v1 avg_pool (divisor the kernel size), times a "
                     "constant map kernel size / the op's divisor", "rounding: (sum / K) * (K / divisor) instead of "
                                                                    "sum / divisor")
def _avg_pool_nd(e: Emit, n: Node, xs: Sequence[int]) -> int | str:
    a = n.attrs
    if any(d != 1 for d in a["dilation"]):
        return "average pooling with dilation has no v1 form"
    x, r, s, lead, out = _pool_geometry(e, n, xs)
    divisor = np.ones(())
    for i in range(r):
        size, k, st, pb = s[lead + i], a["kernel"][i], a["stride"][i], a["padding"][i]
        lo, hi = (-pb, size + a["padding_after"][i]) if a["count_include_pad"] else (0, size)
        divisor = np.multiply.outer(divisor, _window_counts(size, k, st, pb, out[i], lo, hi))
        need = (out[i] - 1) * st + k
        x = e.pad_axis(x, lead + i, pb, max(need - size - pb, 0), 0.0)
    if np.any(divisor == 0):
        return "average pooling with a window entirely in the padding has no v1 form"
    kernel = float(math.prod(a["kernel"]))
    y = e.op("avg_pool", x, spatial_rank=r, kernel=tuple(a["kernel"]), stride=tuple(a["stride"]), padding=(0,) * r)
    if np.all(divisor == kernel):
        return y
    ratio = e.const(kernel / divisor)
    return e.op("mul_elem", y, e.op("broadcast_to", ratio, from_shape=tuple(out), to_shape=tuple(n.out_shape))
                if lead else ratio)


@form("conv_transpose", "zeros interleaved by concat and reshape (the stride), then a v1 conv with the kernel "
                        "flipped and its channel axes exchanged", "rounding: the sums run in another order and "
                                                                  "include exact zero products")
def _conv_transpose(e: Emit, n: Node, xs: Sequence[int]) -> int | str:
    a = n.attrs
    r, ax = a["spatial_rank"], a["channel_axis"]
    weight, bias = e.parameter("weight"), e.parameter("bias")
    if weight is None:
        return "conv_transpose without its weight in the payload"
    k, st, dil = a["kernel"], a["stride"], a["dilation"]
    before = [dil[i] * (k[i] - 1) - a["padding"][i] for i in range(r)]
    after = [dil[i] * (k[i] - 1) - a["padding_after"][i] + a["output_padding"][i] - (st[i] - 1) for i in range(r)]
    if min(before + after) < 0:
        return "conv_transpose whose padding crops more than the kernel reach has no v1 form here"
    x = xs[0]
    for i in range(r):
        if st[i] > 1:
            x = e.interleave_zeros(x, ax + 1 + i, st[i])
    g, cin, cout = a["groups"], a["in_channels"], a["out_channels"]
    w = np.asarray(weight, dtype=np.float64).reshape(g, cin // g, cout // g, *k)
    w = np.flip(w, axis=tuple(range(3, 3 + r))).swapaxes(1, 2).reshape(cout, cin // g, *k)
    y = e.op("conv", x, spatial_rank=r, kernel=tuple(k), stride=(1,) * r, padding=tuple(before),
             padding_after=tuple(after), dilation=tuple(dil), groups=g, channel_axis=ax, in_channels=cin,
             out_channels=cout)
    record = {"weight": np.ascontiguousarray(w)}
    if bias is not None:
        record["bias"] = np.asarray(bias, dtype=np.float64)
    e.edit.payload[y] = record
    e.owns_payload = True
    return y


@form("resize_linear", "a matmul by the interpolation matrix per resized axis, last axis first", _SELECTION.replace(
    "selected exactly", "interpolated with the same two products and sum"))
def _resize_linear(e: Emit, n: Node, xs: Sequence[int]) -> int:
    x = xs[0]
    sizes, mode = n.attrs["sizes"], n.attrs["coordinate_mode"]
    rank = len(e.shape(x))
    for axis in range(rank - 1, rank - len(sizes) - 1, -1):
        m = sizes[axis - (rank - len(sizes))]
        size = e.shape(x)[axis]
        if m == size:  # every coordinate mode maps o to o when the extent stays: an identity
            continue
        sized_matrix(size, m, f"resizing an axis of {size} entries to {m}")
        moved, back = e.move_axis_last(x, axis)
        x = back(e.op("matmul", moved, e.const(interpolation_matrix(size, m, mode))))
    return x
