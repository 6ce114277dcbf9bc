"""Differential tests: every op's float semantics against PyTorch, over random shapes and attributes.

Each case draws shapes, attributes and values with hypothesis, builds a one-op graph, evaluates it
in float64 and float32, and compares with the same PyTorch computation in torch.float64 and
torch.float32. An entry passes when ``|ours - torch| <= rtol * (|torch| + floor)``:
* ``rtol`` is 1e-12 for float64 and 1e-5 for float32 unless a case states otherwise;
* ``floor`` is 0 (pure entrywise relative error) for ops computed entry by entry;
  for sums (reductions, matmul, linear, conv, average pooling) it is the same op applied to the
  absolute values of the operands (the classic componentwise bound: a sum is only as accurate as
  the sum of its terms' magnitudes); for ops whose formula cancels or normalizes it is
  ``max|torch|`` (normwise relative error), each with its reason in ``why``.
Integer and boolean results must be equal. PyTorch has no dilated average pooling, so avg_pool_nd
is compared with dilation 1; asymmetric padding is applied explicitly with F.pad.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from semantics.evaluate import evaluate
from torchlean_bridge.graph import Graph, Node
from torchlean_bridge.ops import REGISTRY
from torchlean_bridge.payload import Payload

RTOL64, RTOL32 = 1e-12, 1e-5


class Draw:
    """Hypothesis choices for structure; one numpy generator (seeded by hypothesis) for values."""

    def __init__(self, data: st.DataObject) -> None:
        self.data = data
        self.rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="seed"))

    def int(self, lo: int, hi: int) -> int:
        return self.data.draw(st.integers(lo, hi))

    def choice(self, options: list) -> Any:
        return self.data.draw(st.sampled_from(options))

    def bool(self) -> bool:
        return self.data.draw(st.booleans())

    def shape(self, min_rank: int = 1, max_rank: int = 4, min_dim: int = 1, max_dim: int = 5) -> tuple:
        return tuple(self.int(min_dim, max_dim) for _ in range(self.int(min_rank, max_rank)))

    def normal(self, shape: tuple, scale: float | None = None) -> np.ndarray:
        scale = self.choice([0.1, 1.0, 3.0]) if scale is None else scale
        return self.rng.standard_normal(shape) * scale

    def subset(self, items: range) -> tuple:
        return tuple(i for i in items if self.bool())


@dataclass
class Example:
    attrs: dict
    inputs: list  # numpy arrays: float64, int64 or bool
    reference: Callable  # (torch inputs, torch payload) -> torch tensor
    payload: dict | None = None  # role -> float64 array (the reference also sees "domain": torch dtype)
    out_shape: tuple = ()  # the declaration, for rules that read it (linear)
    rtol32: float | None = None  # an example-specific float32 tolerance (conditioning it states)


ENTRY, NORM, TERMS = "entry", "norm", "terms"  # the error floor, see the module docstring


@dataclass
class Case:
    kind: str
    gen: Callable[[Draw], Example]
    scale: str = ENTRY
    why: str = ""
    rtol32: float = RTOL32
    rtol64: float = RTOL64
    examples: int = 12


CASES: list[Case] = []


def case(kind: str, *, scale: str = ENTRY, why: str = "", rtol32: float = RTOL32, examples: int = 12):
    def register(gen: Callable[[Draw], Example]) -> Callable:
        CASES.append(Case(kind, gen, scale, why, rtol32, RTOL64, examples))
        return gen
    return register


def _element_type(a: np.ndarray) -> str:
    return {"b": "bool", "i": "int64"}.get(a.dtype.kind, "float")


def _in_domain(a: np.ndarray, dtype: str) -> np.ndarray:
    return a.astype(dtype) if a.dtype.kind == "f" else a


def run_case(c: Case, ex: Example) -> None:
    nodes = [Node(i, [], "input", x.shape, dtype=_element_type(x)) for i, x in enumerate(ex.inputs)]
    k = len(nodes)
    probe = Node(k, range(k), c.kind, ex.out_shape, ex.attrs)
    spec = REGISTRY[c.kind]
    shape = spec.infer(probe.attrs, [x.shape for x in ex.inputs], probe.out_shape)
    etype = spec.element_type(probe.attrs, [n.dtype for n in nodes], "float")
    g = Graph(nodes + [probe.with_(out_shape=shape, dtype=etype)], outputs=[k])
    payload = Payload({k: ex.payload}) if ex.payload else None
    for dtype, rtol in (("float64", c.rtol64), ("float32", ex.rtol32 or c.rtol32)):
        xs = [_in_domain(x, dtype) for x in ex.inputs]
        ours = evaluate(g, payload, xs, dtype=dtype)[0]
        tp = {r: torch.from_numpy(a.astype(dtype)) for r, a in (ex.payload or {}).items()}
        tp["domain"] = getattr(torch, dtype)
        ref = ex.reference([torch.from_numpy(np.array(x)) for x in xs], tp).detach().numpy()
        compare(ours, ref, rtol, _floor(c, ex, ref), f"{c.kind} {dtype}")


def _floor(c: Case, ex: Example, ref: np.ndarray) -> np.ndarray | float:
    if c.scale == NORM:
        fin = np.isfinite(ref)
        return float(np.max(np.abs(ref[fin]), initial=0.0)) if ref.dtype.kind == "f" else 0.0
    if c.scale == TERMS:  # the same sums over |operands|, in float64
        mags = [torch.from_numpy(np.array(np.abs(x) if x.dtype.kind == "f" else x)) for x in ex.inputs]
        tp = {r: torch.from_numpy(np.abs(a)) for r, a in (ex.payload or {}).items()}
        tp["domain"] = torch.float64
        return np.abs(ex.reference(mags, tp).detach().numpy())
    return 0.0


def compare(ours: np.ndarray, ref: np.ndarray, rtol: float, floor: np.ndarray | float, what: str) -> None:
    assert ours.shape == ref.shape, f"{what}: shape {ours.shape} vs torch {ref.shape}"
    if ref.dtype.kind != "f":
        assert ours.dtype.kind == ref.dtype.kind, f"{what}: element type {ours.dtype} vs torch {ref.dtype}"
        np.testing.assert_array_equal(ours, ref, err_msg=what)
        return
    assert ours.dtype == ref.dtype, f"{what}: dtype {ours.dtype} vs torch {ref.dtype}"
    a, b = ours.astype(np.float64), ref.astype(np.float64)
    assert np.array_equal(np.isfinite(a), np.isfinite(b)), what
    fin = np.isfinite(b)
    err = np.abs(a[fin] - b[fin])
    bound = rtol * (np.abs(b[fin]) + np.broadcast_to(floor, b.shape)[fin])
    worst = int(np.argmax(err - bound)) if err.size else 0
    assert np.all(err <= bound), (f"{what}: |ours - torch| = {err[worst]:.3g} > {bound[worst]:.3g} "
                                  f"(ours {a[fin][worst]!r}, torch {b[fin][worst]!r})")


# -- elementwise unary ------------------------------------------------------------------------

def _unary(kind: str, torch_fn: Callable, values: Callable[[Draw, tuple], np.ndarray] | None = None,
           attrs: Callable[[Draw], dict] | None = None, **opts) -> None:
    def gen(d: Draw) -> Example:
        shape = d.shape()
        x = values(d, shape) if values else d.normal(shape)
        a = attrs(d) if attrs else {}
        return Example(a, [x], lambda t, p: torch_fn(t[0], a))
    case(kind, **opts)(gen)


def _positive(d: Draw, shape: tuple) -> np.ndarray:
    return np.exp(d.normal(shape, 1.5))


def _nonzero(d: Draw, shape: tuple) -> np.ndarray:
    x = d.normal(shape)
    return np.where(np.abs(x) < 1e-3, 1.0, x)


def _integers(d: Draw, shape: tuple) -> np.ndarray:
    return d.rng.integers(-2, 3, shape).astype(np.float64)


_unary("abs", lambda x, a: torch.abs(x))
_unary("neg", lambda x, a: torch.neg(x))
_unary("sign", lambda x, a: torch.sign(x), values=lambda d, s: np.concatenate([_integers(d, s), d.normal(s)]))
_unary("floor", lambda x, a: torch.floor(x))
_unary("ceil", lambda x, a: torch.ceil(x))
_unary("sin", lambda x, a: torch.sin(x))
_unary("cos", lambda x, a: torch.cos(x))
_unary("tan", lambda x, a: torch.tan(x), values=lambda d, s: d.rng.uniform(-1.4, 1.4, s))
_unary("exp", lambda x, a: torch.exp(x))
_unary("expm1", lambda x, a: torch.expm1(x), values=lambda d, s: d.normal(s, d.choice([1e-9, 0.1, 1.0, 3.0])))
_unary("tanh", lambda x, a: torch.tanh(x))
_unary("relu", lambda x, a: torch.relu(x))
_unary("sigmoid", lambda x, a: torch.sigmoid(x))
_unary("softplus", lambda x, a: F.softplus(x), scale=NORM,
       why="the spec's log(1 + exp(-|x|)) loses the tail PyTorch's log1p keeps: absolute error ~ eps")
_unary("sqrt", lambda x, a: torch.sqrt(x), values=_positive)
_unary("rsqrt", lambda x, a: torch.rsqrt(x), values=_positive)
_unary("inv", lambda x, a: torch.reciprocal(x), values=_nonzero)
_unary("log", lambda x, a: torch.log(x), values=_positive, scale=NORM,
       why="log near 1 is ill-conditioned (relative error of the result ~ eps / |log x|)")
_unary("log1p", lambda x, a: torch.log1p(x), values=lambda d, s: np.expm1(d.normal(s)))
_unary("erf", lambda x, a: torch.erf(x))
_unary("round", lambda x, a: torch.round(x), values=lambda d, s: np.concatenate([_integers(d, s) / 2, d.normal(s, 3)]))
_unary("trunc", lambda x, a: torch.trunc(x), values=lambda d, s: np.concatenate([_integers(d, s), d.normal(s, 3)]))
_unary("exp2", lambda x, a: torch.exp2(x))
_unary("log2", lambda x, a: torch.log2(x), values=_positive, scale=NORM,
       why="log2 near 1 is ill-conditioned like log")
_unary("atan", lambda x, a: torch.atan(x), values=lambda d, s: d.normal(s, d.choice([1e-3, 1.0, 100.0])))
_unary("sinh", lambda x, a: torch.sinh(x))
_unary("cosh", lambda x, a: torch.cosh(x))
_unary("asinh", lambda x, a: torch.asinh(x), values=lambda d, s: d.normal(s, d.choice([1e-3, 1.0, 100.0])))
_unary("asin", lambda x, a: torch.asin(x), values=lambda d, s: d.rng.uniform(-1, 1, s))
_unary("acos", lambda x, a: torch.acos(x), values=lambda d, s: d.rng.uniform(-1, 1, s))
_unary("atanh", lambda x, a: torch.atanh(x), values=lambda d, s: d.rng.uniform(-0.999, 0.999, s))
_unary("acosh", lambda x, a: torch.acosh(x), values=lambda d, s: 1 + np.exp(d.normal(s, 2)))
_unary("silu", lambda x, a: F.silu(x))
_unary("softsign", lambda x, a: F.softsign(x))
_unary("hardswish", lambda x, a: F.hardswish(x), values=lambda d, s: d.rng.uniform(-5, 5, s))
_unary("mish", lambda x, a: F.mish(x))
_unary("selu", lambda x, a: F.selu(x))
_unary("gelu", lambda x, a: F.gelu(x, approximate=a["approximate"]), scale=NORM,
       attrs=lambda d: {"approximate": d.choice(["none", "tanh"])},
       why="1 + erf(x/sqrt 2) and 1 + tanh(...) cancel for negative x")
_unary("leaky_relu", lambda x, a: F.leaky_relu(x, a["negative_slope"]),
       attrs=lambda d: {"negative_slope": d.choice([0.01, 0.2, 1.5])})
_unary("elu", lambda x, a: F.elu(x, a["alpha"]), attrs=lambda d: {"alpha": d.choice([1.0, 0.5, 2.0])})
_unary("celu", lambda x, a: F.celu(x, a["alpha"]), attrs=lambda d: {"alpha": d.choice([1.0, 0.5, 2.0])})
_unary("hardsigmoid", lambda x, a: (F.hardsigmoid(x) if a["alpha"] == 1 / 6 and a["beta"] == 0.5
                                    else torch.clamp(x * a["alpha"] + a["beta"], 0, 1)),
       values=lambda d, s: d.rng.uniform(-5, 5, s), scale=NORM,
       attrs=lambda d: dict(zip(("alpha", "beta"), d.choice([(1 / 6, 0.5), (0.2, 0.5)]))),
       why="PyTorch computes relu6(x + 3) / 6, ONNX alpha * x + beta: they round differently near 0")
_unary("clamp", lambda x, a: x if a["min"] is None and a["max"] is None else torch.clamp(x, a["min"], a["max"]),
       attrs=lambda d: {"min": d.choice([None, -1.0, 0.0]), "max": d.choice([None, 0.5, 2.0])})


@case("pow")
def _pow(d: Draw) -> Example:
    e = d.choice([2.0, 3.0, -1.0, -2.0, 0.5, 1.5, 0.0])
    shape = d.shape()
    x = _nonzero(d, shape) if float(e).is_integer() else _positive(d, shape)
    return Example({"exponent": e}, [x], lambda t, p: torch.pow(t[0], e))


# -- elementwise binary -----------------------------------------------------------------------

def _binary(kind: str, torch_fn: Callable, second: Callable[[Draw, tuple], np.ndarray] | None = None,
            first: Callable[[Draw, tuple], np.ndarray] | None = None, **opts) -> None:
    def gen(d: Draw) -> Example:
        shape = d.shape()
        x = first(d, shape) if first else d.normal(shape)
        y = second(d, shape) if second else d.normal(shape)
        return Example({}, [x, y], lambda t, p: torch_fn(t[0], t[1]))
    case(kind, **opts)(gen)


_binary("add", torch.add)
_binary("sub", torch.sub)
_binary("mul_elem", torch.mul)
_binary("max_elem", torch.maximum, first=_integers, second=_integers)
_binary("min_elem", torch.minimum)
_binary("div", torch.div, second=_nonzero)
_binary("mse_loss", F.mse_loss, scale=NORM, why="a sum of squares")


@case("safe_log", scale=NORM, rtol32=1e-3,
      why="the spec's log(1 + exp(x)) has absolute error ~eps, relative eps/softplus(x): in binary32 "
          "with x >= -9 that is up to 1e-3 before the log")
def _safe_log(d: Draw) -> Example:
    x, eps = np.clip(d.normal(d.shape()), -9, 9), np.array(d.choice([1e-6, 1e-3, 0.5]))
    return Example({}, [x, eps], lambda t, p: torch.log(F.softplus(t[0]) + t[1]))


@case("prelu")
def _prelu(d: Draw) -> Example:
    shape = d.shape(min_rank=2)
    w = d.normal((shape[1],))
    slope = np.broadcast_to(w.reshape((1, -1) + (1,) * (len(shape) - 2)), shape).copy()
    per_channel = (0, slice(None)) + (0,) * (len(shape) - 2)  # PyTorch takes the [C] weight
    return Example({}, [d.normal(shape), slope], lambda t, p: F.prelu(t[0], t[1][per_channel]))


for _kind, _fn in (("eq", torch.eq), ("ne", torch.ne), ("lt", torch.lt), ("le", torch.le), ("gt", torch.gt),
                   ("ge", torch.ge)):
    def _compare_gen(d: Draw, fn=_fn) -> Example:
        shape = d.shape()
        x, y = _integers(d, shape), _integers(d, shape)
        if d.bool():
            x, y = x.astype(np.int64), y.astype(np.int64)
        return Example({}, [x, y], lambda t, p: fn(t[0], t[1]))
    case(_kind)(_compare_gen)

for _kind, _fn in (("logical_and", torch.logical_and), ("logical_or", torch.logical_or)):
    def _logic_gen(d: Draw, fn=_fn) -> Example:
        shape = d.shape()
        return Example({}, [d.rng.random(shape) < 0.5, d.rng.random(shape) < 0.5], lambda t, p: fn(t[0], t[1]))
    case(_kind)(_logic_gen)


@case("logical_not")
def _logical_not(d: Draw) -> Example:
    return Example({}, [d.rng.random(d.shape()) < 0.5], lambda t, p: torch.logical_not(t[0]))


@case("isnan")
def _isnan(d: Draw) -> Example:
    x = d.normal(d.shape())
    return Example({}, [np.where(d.rng.random(x.shape) < 0.3, np.nan, x)], lambda t, p: torch.isnan(t[0]))


@case("where")
def _where(d: Draw) -> Example:
    shape = d.shape()
    x, y = d.normal(shape), d.normal(shape)
    if d.bool():
        x, y = x.astype(np.int64), y.astype(np.int64)
    return Example({}, [d.rng.random(shape) < 0.5, x, y], lambda t, p: torch.where(t[0], t[1], t[2]))


@case("cast")
def _cast(d: Draw) -> Example:
    shape = d.shape()
    source, target = d.choice([("float", "int64"), ("float", "bool"), ("int64", "float"), ("bool", "float"),
                               ("bool", "int64"), ("float", "float")])
    x = {"float": d.normal(shape, 3.0), "int64": d.rng.integers(-5, 5, shape),
         "bool": d.rng.random(shape) < 0.5}[source]
    if source == "float" and target == "bool":
        x = np.where(d.rng.random(shape) < 0.3, 0.0, x)
    to = {"int64": torch.int64, "bool": torch.bool}
    return Example({"dtype": target}, [x], lambda t, p: t[0].to(to.get(target, p["domain"])))


# -- data movement ----------------------------------------------------------------------------

@case("permute")
def _permute(d: Draw) -> Example:
    shape = d.shape()
    perm = tuple(int(i) for i in d.rng.permutation(len(shape)))
    return Example({"perm": perm}, [d.normal(shape)], lambda t, p: torch.permute(t[0], perm))


@case("transpose")
def _transpose(d: Draw) -> Example:
    shape = d.shape()
    a1, a2 = d.int(0, len(shape) - 1), d.int(0, len(shape) - 1)
    return Example({"axis1": a1, "axis2": a2}, [d.normal(shape)], lambda t, p: torch.transpose(t[0], a1, a2))


@case("detach")
def _detach(d: Draw) -> Example:
    return Example({}, [d.normal(d.shape())], lambda t, p: t[0].detach())


def _broadcast_pair(d: Draw) -> tuple[tuple, tuple]:
    to = d.shape(min_rank=0)
    keep = d.int(0, len(to))
    src = tuple(1 if d.bool() else e for e in to[len(to) - keep:])
    return src, to


@case("broadcast_to")
def _broadcast_to(d: Draw) -> Example:
    src, to = _broadcast_pair(d)
    return Example({"from_shape": src, "to_shape": to}, [d.normal(src)], lambda t, p: torch.broadcast_to(t[0], to))


@case("expand")
def _expand(d: Draw) -> Example:
    src, to = _broadcast_pair(d)
    return Example({"to_shape": to}, [d.normal(src)], lambda t, p: t[0].expand(to))


@case("reshape")
def _reshape(d: Draw) -> Example:
    shape = d.shape(min_rank=0)
    out = tuple(reversed(shape)) + ((1,) if d.bool() else ())
    return Example({"in_shape": shape, "out_shape": out}, [d.normal(shape)], lambda t, p: torch.reshape(t[0], out))


@case("flatten")
def _flatten(d: Draw) -> Example:
    shape = d.shape(min_rank=0)
    return Example({"value_shape": shape}, [d.normal(shape)], lambda t, p: torch.flatten(t[0]))


@case("concat")
def _concat(d: Draw) -> Example:
    shape = d.shape()
    axis = d.int(0, len(shape) - 1)
    parts = []
    for _ in range(d.int(2, 4)):
        s = list(shape)
        s[axis] = d.int(0, 4)
        parts.append(d.normal(tuple(s)))
    return Example({"axis": axis}, parts, lambda t, p: torch.cat(t, axis))


@case("slice")
def _slice(d: Draw) -> Example:
    shape = d.shape()
    axes = d.subset(range(len(shape)))
    starts, ends, steps = [], [], []
    for ax in axes:
        s = d.int(0, shape[ax])
        starts.append(s)
        ends.append(d.int(s, shape[ax]))
        steps.append(d.int(1, 3))
    index = [slice(None)] * len(shape)
    for ax, s, e, st_ in zip(axes, starts, ends, steps):
        index[ax] = slice(s, e, st_)
    return Example({"axes": axes, "starts": starts, "ends": ends, "steps": steps}, [d.normal(shape)],
                   lambda t, p: t[0][tuple(index)])


@case("pad")
def _pad(d: Draw) -> Example:
    shape = d.shape()
    before = [d.int(0, 2) for _ in shape]
    after = [d.int(0, 2) for _ in shape]
    value = d.choice([0.0, -1.5])
    torch_pads = [v for b, a in zip(reversed(before), reversed(after)) for v in (b, a)]
    return Example({"pads_before": before, "pads_after": after, "value": value}, [d.normal(shape)],
                   lambda t, p: F.pad(t[0], torch_pads, value=value))


@case("squeeze")
def _squeeze(d: Draw) -> Example:
    shape = tuple(1 if d.bool() else e for e in d.shape())
    axes = tuple(i for i in d.subset(range(len(shape))) if shape[i] == 1)
    return Example({"axes": axes}, [d.normal(shape)], lambda t, p: torch.squeeze(t[0], axes) if axes else t[0])


@case("unsqueeze")
def _unsqueeze(d: Draw) -> Example:
    shape = d.shape(min_rank=0, max_rank=3)
    n_new = d.int(1, 2)
    axes = tuple(sorted(int(a) for a in d.rng.choice(len(shape) + n_new, n_new, replace=False)))

    def ref(t, p):
        y = t[0]
        for a in axes:
            y = torch.unsqueeze(y, a)
        return y
    return Example({"axes": axes}, [d.normal(shape)], ref)


@case("gather")
def _gather(d: Draw) -> Example:
    shape = d.shape()
    axis = d.int(0, len(shape) - 1)
    idx = d.rng.integers(0, shape[axis], d.shape(min_rank=0, max_rank=2))
    out = shape[:axis] + idx.shape + shape[axis + 1:]
    data = d.normal(shape) if d.bool() else d.rng.integers(-9, 9, shape)
    return Example({"axis": axis}, [data, idx],
                   lambda t, p: torch.index_select(t[0], axis, t[1].reshape(-1)).reshape(out))


# -- reductions -------------------------------------------------------------------------------

@case("sum", scale=TERMS, why="a sum")
def _sum(d: Draw) -> Example:
    return Example({}, [d.normal(d.shape(min_rank=0))], lambda t, p: torch.sum(t[0]))


for _kind, _fn in (("reduce_sum", torch.sum), ("reduce_mean", torch.mean)):
    def _reduce_gen(d: Draw, fn=_fn) -> Example:
        shape = d.shape()
        axis = d.int(0, len(shape) - 1)
        return Example({"axis": axis}, [d.normal(shape)], lambda t, p: fn(t[0], axis))
    case(_kind, scale=TERMS, why="a sum")(_reduce_gen)


def _prod(x: torch.Tensor, axes: tuple, keepdim: bool) -> torch.Tensor:
    for a in sorted(axes, reverse=True):
        x = torch.prod(x, a, keepdim=keepdim)
    return x


for _kind, _fn, _values in (
        ("reduce_sum_axes", lambda x, ax, k: torch.sum(x, ax, keepdim=k), None),
        ("reduce_mean_axes", lambda x, ax, k: torch.mean(x, ax, keepdim=k), None),
        ("reduce_max", lambda x, ax, k: torch.amax(x, ax, keepdim=k), None),
        ("reduce_min", lambda x, ax, k: torch.amin(x, ax, keepdim=k), None),
        ("reduce_prod", _prod, lambda d, s: 1 + d.normal(s, 0.3))):
    def _axes_gen(d: Draw, fn=_fn, values=_values) -> Example:
        shape = d.shape()
        axes, keep = d.subset(range(len(shape))), d.bool()
        x = values(d, shape) if values else d.normal(shape)
        return Example({"axes": axes, "keepdim": keep}, [x], lambda t, p: fn(t[0], axes, keep) if axes else t[0])
    case(_kind, scale=TERMS, why="sums and products accumulate")(_axes_gen)

for _kind, _fn in (("argmax", torch.argmax), ("argmin", torch.argmin)):
    def _arg_gen(d: Draw, fn=_fn) -> Example:
        shape = d.shape()
        axis, keep = d.int(0, len(shape) - 1), d.bool()
        x = _integers(d, shape) if d.bool() else d.normal(shape)  # ties: the first index wins
        return Example({"axis": axis, "keepdim": keep}, [x], lambda t, p: fn(t[0], axis, keepdim=keep))
    case(_kind)(_arg_gen)


# -- softmax and normalization ----------------------------------------------------------------

@case("softmax")
def _softmax(d: Draw) -> Example:
    shape = d.shape()
    axis = d.int(0, len(shape) - 1)
    return Example({"axis": axis}, [d.normal(shape)], lambda t, p: torch.softmax(t[0], axis))


@case("log_softmax", scale=NORM, why="log-probabilities near 0 cancel")
def _log_softmax(d: Draw) -> Example:
    shape = d.shape()
    axis = d.int(0, len(shape) - 1)
    return Example({"axis": axis}, [d.normal(shape)], lambda t, p: torch.log_softmax(t[0], axis))


@case("hard_masked_softmax")
def _hard_masked_softmax(d: Draw) -> Example:
    shape = d.shape()
    allowed = d.rng.random(shape) < 0.6

    def ref(t, p):
        mask = torch.from_numpy(allowed)
        return torch.nan_to_num(torch.softmax(t[0].masked_fill(~mask, -math.inf), -1), nan=0.0)
    return Example({"mask_shape": shape, "allowed": tuple(bool(v) for v in allowed.reshape(-1))},
                   [d.normal(shape)], ref)


@case("layernorm", scale=NORM, why="mean and variance are sums")
def _layernorm(d: Draw) -> Example:
    shape = d.shape()
    axis, eps = d.int(0, len(shape) - 1), d.choice([1e-5, 1e-3])
    suffix = shape[axis:]
    payload = {}
    if d.bool():
        payload["weight"] = d.normal(suffix)
    if d.bool():
        payload["bias"] = d.normal(suffix)
    scale, offset = d.choice([0.1, 1.0, 3.0]), d.choice([0.0, 5.0])
    # x - mean cancels when |mean| >> std: binary32 error grows like eps * |mean| / std
    return Example({"axis": axis, "eps": eps}, [d.normal(shape, scale) + offset],
                   lambda t, p: F.layer_norm(t[0], suffix, p.get("weight"), p.get("bias"), eps), payload=payload,
                   rtol32=RTOL32 * max(1.0, offset / scale))


@case("batch_norm_eval", scale=NORM, why="(x - mean) cancels")
def _batch_norm_eval(d: Draw) -> Example:
    shape = d.shape()
    axis, eps = d.int(0, len(shape) - 1), d.choice([1e-5, 0.1])
    c = shape[axis]
    payload = {"weight": d.normal((c,)), "bias": d.normal((c,)), "running_mean": d.normal((c,)),
               "running_var": np.exp(d.normal((c,)))}

    def ref(t, p):
        x = t[0].reshape(math.prod(shape[:axis]), c, -1)
        y = F.batch_norm(x, p["running_mean"], p["running_var"], p["weight"], p["bias"], False, 0.0, eps)
        return y.reshape(shape)
    return Example({"channel_axis": axis, "channels": c, "eps": eps}, [d.normal(shape)], ref, payload)


# -- affine maps ------------------------------------------------------------------------------

@case("matmul", scale=TERMS, why="dot products", examples=20)
def _matmul(d: Draw) -> Example:
    m, n, p = d.int(1, 5), d.int(1, 6), d.int(1, 5)
    batch = d.shape(min_rank=0, max_rank=2)
    lb = tuple(1 if d.bool() else e for e in batch)[d.int(0, len(batch)):]
    rb = tuple(1 if d.bool() else e for e in batch)[d.int(0, len(batch)):]
    left = d.choice([(n,), lb + (m, n)])
    right = d.choice([(n,), rb + (n, p)])
    return Example({}, [d.normal(left), d.normal(right)], lambda t, q: torch.matmul(t[0], t[1]))


@case("linear", scale=TERMS, why="dot products")
def _linear(d: Draw) -> Example:
    lead, n_in, n_out = d.shape(min_rank=0, max_rank=3), d.int(1, 8), d.int(1, 8)
    payload = {"weight": d.normal((n_out, n_in)), "bias": d.normal((n_out,))}
    return Example({}, [d.normal(lead + (n_in,))], lambda t, p: F.linear(t[0], p["weight"], p["bias"]),
                   payload, out_shape=lead + (n_out,))


_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}


@case("conv", scale=TERMS, why="dot products", examples=30)
def _conv(d: Draw) -> Example:
    r = d.int(1, 3)
    groups = d.int(1, 3)
    cin, cout = groups * d.int(1, 2), groups * d.int(1, 2)
    kernel = [d.int(1, 3) for _ in range(r)]
    stride = [d.int(1, 2) for _ in range(r)]
    dilation = [d.int(1, 2) for _ in range(r)]
    before = [d.int(0, 2) for _ in range(r)]
    after = [d.int(0, 2) for _ in range(r)]
    spatial = [max(d.int(1, 6), dl * (k - 1) + 1 - b - a) for k, dl, b, a in zip(kernel, dilation, before, after)]
    lead = d.shape(min_rank=0, max_rank=2, max_dim=2)
    shape = lead + (cin, *spatial)
    attrs = {"spatial_rank": r, "kernel": kernel, "stride": stride, "padding": before, "padding_after": after,
             "dilation": dilation, "groups": groups, "channel_axis": len(lead), "in_channels": cin,
             "out_channels": cout}
    payload = {"weight": d.normal((cout, cin // groups, *kernel)), "bias": d.normal((cout,))}
    pads = [v for b, a in zip(reversed(before), reversed(after)) for v in (b, a)]

    def ref(t, p):
        x = F.pad(t[0].reshape((-1, cin, *spatial)), pads)
        y = _CONV[r](x, p["weight"], p["bias"], stride=stride, dilation=dilation, groups=groups)
        return y.reshape(lead + tuple(y.shape[1:]))
    return Example(attrs, [d.normal(shape)], ref, payload)


_CONV_TRANSPOSE = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


@case("conv_transpose", scale=TERMS, why="dot products", examples=30)
def _conv_transpose(d: Draw) -> Example:
    r = d.int(1, 3)
    groups = d.int(1, 3)
    cin, og = groups * d.int(1, 2), d.int(1, 2)
    kernel = [d.int(1, 3) for _ in range(r)]
    stride = [d.int(1, 3) for _ in range(r)]
    dilation = [d.int(1, 2) for _ in range(r)]
    output_padding = [d.int(0, max(s, dl) - 1) for s, dl in zip(stride, dilation)]
    spatial = [d.int(1, 4) for _ in range(r)]
    # crop at most what the uncropped output holds (PyTorch needs a positive extent)
    padding = [min(d.int(0, 2), ((n - 1) * s + dl * (k - 1)) // 2)
               for n, s, dl, k in zip(spatial, stride, dilation, kernel)]
    lead = d.shape(min_rank=0, max_rank=2, max_dim=2)
    attrs = {"spatial_rank": r, "kernel": kernel, "stride": stride, "padding": padding, "padding_after": padding,
             "output_padding": output_padding, "dilation": dilation, "groups": groups, "channel_axis": len(lead),
             "in_channels": cin, "out_channels": og * groups}
    payload = {"weight": d.normal((cin, og, *kernel)), "bias": d.normal((og * groups,))}

    def ref(t, p):
        y = _CONV_TRANSPOSE[r](t[0].reshape((-1, cin, *spatial)), p["weight"], p["bias"], stride=stride,
                               padding=padding, output_padding=output_padding, groups=groups, dilation=dilation)
        return y.reshape(lead + tuple(y.shape[1:]))
    return Example(attrs, [d.normal(lead + (cin, *spatial))], ref, payload)


def _cumsum_case(d: Draw) -> tuple[tuple[int, ...], dict, Callable]:
    """A shape, cumsum attributes and torch's reference (exclusive: the sum before each entry; its
    cancellation is the reference's, within TERMS for floats and exact on integers)."""
    shape = d.shape(min_rank=1)
    axis, exclusive, reverse = d.int(0, len(shape) - 1), d.bool(), d.bool()

    def ref(t, p):
        x = t[0].flip(axis) if reverse else t[0]
        y = torch.cumsum(x, axis)
        if exclusive:
            y = y - x
        return y.flip(axis) if reverse else y
    return shape, {"axis": axis, "exclusive": exclusive, "reverse": reverse}, ref


@case("cumsum", scale=TERMS, why="running sums", examples=20)
def _cumsum(d: Draw) -> Example:
    shape, attrs, ref = _cumsum_case(d)
    return Example(attrs, [d.normal(shape)], ref)


@case("sort", examples=20)
def _sort(d: Draw) -> Example:
    shape = d.shape(min_rank=1)
    axis, descending = d.int(0, len(shape) - 1), d.bool()
    k = d.int(0, shape[axis])
    x = d.normal(shape)
    if d.bool():  # ties and infinities
        x = np.round(x)
        x.reshape(-1)[::3] = np.inf
    return Example({"axis": axis, "k": k, "descending": descending}, [x],
                   lambda t, p: torch.topk(t[0], k, dim=axis, largest=descending, sorted=True).values)


@case("gather_elements", examples=20)
def _gather_elements(d: Draw) -> Example:
    shape = d.shape(min_rank=1)
    axis = d.int(0, len(shape) - 1)
    idx_shape = tuple(d.int(1, 4) if k == axis else d.int(1, e) for k, e in enumerate(shape))
    idx = d.rng.integers(0, shape[axis], idx_shape).astype(np.int64)
    return Example({"axis": axis}, [d.normal(shape), idx], lambda t, p: torch.gather(t[0], axis, t[1]),
                   out_shape=idx_shape)


_INTERPOLATE_MODES = {1: "linear", 2: "bilinear", 3: "trilinear"}


@case("resize_linear", scale=TERMS, why="two-term convex combinations per axis", examples=25)
def _resize_linear(d: Draw) -> Example:
    """PyTorch's interpolate expresses the half_pixel and align_corners coordinate modes (the other
    two are checked against onnxruntime in test_onnx_import)."""
    r = d.int(1, 3)
    lead = d.shape(min_rank=0, max_rank=2, max_dim=3)
    spatial = tuple(d.int(1, 5) for _ in range(r))
    sizes = [d.int(1, 9) for _ in range(r)]
    mode = d.choice(["half_pixel", "align_corners"])

    def ref(t, p):
        y = F.interpolate(t[0].reshape((-1, 1) + spatial), size=sizes, mode=_INTERPOLATE_MODES[r],
                          align_corners=mode == "align_corners")
        return y.reshape(lead + tuple(sizes))
    return Example({"spatial_rank": r, "sizes": sizes, "coordinate_mode": mode}, [d.normal(lead + spatial)], ref)


@case("resize", scale=NORM, why="cubic weights are signed: errors scale with the largest value", examples=25)
def _resize(d: Draw) -> Example:
    """The forms PyTorch computes: bicubic (half_pixel or align_corners, a = -0.75) and antialiased bilinear
    and bicubic (exclude_outside, bicubic a = -0.5); every mode against onnx's reference: test_resize_modes."""
    from fractions import Fraction
    lead, spatial = d.shape(min_rank=2, max_rank=2, max_dim=3), (d.int(1, 6), d.int(2, 6))
    sizes = [d.int(1, 9), d.int(2, 9)]  # (PyTorch's antialiased kernels misread an output width of 1)
    torch_mode, antialias = d.choice(["bilinear", "bicubic"]), d.bool()
    antialias = antialias or torch_mode == "bilinear"  # (plain bilinear is resize_linear)
    align = torch_mode == "bicubic" and not antialias and d.bool()
    attrs = {"sizes": list(lead) + sizes, "mode": "cubic" if torch_mode == "bicubic" else "linear",
             "scales": " ".join(str(f) for f in [Fraction(1)] * 2 + [Fraction(o, i) for o, i in zip(sizes, spatial)]),
             "coordinate_mode": "align_corners" if align else "half_pixel",
             "cubic_coeff_a": -0.5 if antialias else -0.75, "exclude_outside": antialias, "antialias": antialias}
    return Example(attrs, [d.normal(tuple(lead) + spatial)],
                   lambda t, p: F.interpolate(t[0], size=sizes, mode=torch_mode, align_corners=align,
                                              antialias=antialias))


# -- index outputs, unpooling and elementwise powers (tests/test_select_ops.py: against onnxruntime) ------------

@case("topk_indices")
def _topk_indices(d: Draw) -> Example:
    shape = d.shape(min_rank=1)
    axis, desc = d.int(0, len(shape) - 1), d.bool()
    k = d.int(0, shape[axis])
    x = d.rng.integers(-2, 3, shape).astype(np.float64)  # ties: the lower index first, as torch's stable sort
    return Example({"axis": axis, "k": k, "descending": desc}, [x],
                   lambda t, p: torch.sort(t[0], dim=axis, descending=desc, stable=True).indices.narrow(axis, 0, k))


def _plane_offsets(t: torch.Tensor, spatial: int) -> torch.Tensor:
    """PyTorch's pooling indices count within one (N, C) plane; ONNX's over the whole tensor."""
    n, c = t.shape[:2]
    return (torch.arange(n * c) * spatial).reshape(n, c, *([1] * (t.ndim - 2)))


@case("max_pool_indices")
def _max_pool_indices(d: Draw) -> Example:
    shape = (d.int(1, 2), d.int(1, 3), d.int(3, 6), d.int(3, 6))
    k, s, dil, ceil = [d.int(1, 3), d.int(1, 2)], [d.int(1, 2), d.int(1, 3)], [1, d.int(1, 2)], d.bool()
    p = [d.int(0, k[0] // 2), d.int(0, k[1] // 2)]
    attrs = {"spatial_rank": 2, "kernel": k, "stride": s, "padding": p, "padding_after": p, "dilation": dil,
             "ceil_mode": ceil, "count_include_pad": True, "storage_order": False}

    def ref(t, q):
        _, i = F.max_pool2d(t[0], k, s, p, dil, ceil_mode=ceil, return_indices=True)
        return i + _plane_offsets(i, shape[2] * shape[3])
    return Example(attrs, [d.normal(shape)], ref)


@case("max_unpool")
def _max_unpool(d: Draw) -> Example:
    shape, k = (d.int(1, 2), d.int(1, 3), 2 * d.int(1, 3), 2 * d.int(1, 3)), 2
    x = torch.from_numpy(d.normal(shape))
    y, i = F.max_pool2d(x, k, return_indices=True)
    grid = tuple(shape[:2]) + (y.shape[2] * k, y.shape[3] * k)
    out = grid[:2] + (grid[2] + d.int(0, 1), grid[3])
    flat = (i + _plane_offsets(i, grid[2] * grid[3])).numpy()
    plane_i = i.numpy()

    def ref(t, p):
        z = F.max_unpool2d(t[0], torch.from_numpy(plane_i), k, output_size=grid[2:])
        return F.pad(z, (0, out[3] - grid[3], 0, out[2] - grid[2]))
    return Example({"scatter_shape": grid, "out_shape": out}, [y.numpy(), flat], ref)


@case("pow_elem", scale=NORM, why="x ** y is exp(y log x): relative errors grow with |y log x|")
def _pow_elem(d: Draw) -> Example:
    shape = d.shape()
    return Example({}, [np.abs(d.normal(shape)) + 0.1, d.normal(shape)], lambda t, p: torch.pow(t[0], t[1]))


@case("int_pow")
def _int_pow(d: Draw) -> Example:
    shape = d.shape()
    return Example({"bits": 64, "signed": True}, [d.rng.integers(-9, 10, shape), d.rng.integers(0, 12, shape)],
                   lambda t, p: torch.pow(t[0], t[1]))


# -- pooling ----------------------------------------------------------------------------------

_MAX_POOL = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
_AVG_POOL = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}


def _pool_input(d: Draw, kernel: list, before: list, after: list, dilation: list, fit_unpadded: bool = False
                ) -> tuple[tuple, tuple]:
    """Leading axes and a spatial extent the window fits (PyTorch's avg_pool3d wants it unpadded)."""
    lead = d.shape(min_rank=0, max_rank=2, max_dim=3)
    spatial = tuple(max(d.int(1, 7), dl * (k - 1) + 1 - (0 if fit_unpadded else b + a))
                    for k, b, a, dl in zip(kernel, before, after, dilation))
    return lead, spatial


def _as_batch(x: torch.Tensor, lead: tuple, spatial: tuple) -> torch.Tensor:
    return x.reshape((-1,) + spatial)  # unbatched (C, *spatial) form with C = prod(lead) (or 1)


@case("max_pool", examples=20)
def _max_pool(d: Draw) -> Example:
    r = d.int(1, 3)
    kernel = [d.int(1, 3) for _ in range(r)]
    stride = [d.int(1, 3) for _ in range(r)]
    padding = [d.int(0, k // 2) for k in kernel]
    lead, spatial = _pool_input(d, kernel, padding, padding, [1] * r)

    def ref(t, p):
        y = _MAX_POOL[r](_as_batch(t[0], lead, spatial), kernel, stride, padding)
        return y.reshape(lead + tuple(y.shape[1:]))
    return Example({"spatial_rank": r, "kernel": kernel, "stride": stride, "padding": padding},
                   [d.normal(lead + spatial)], ref)


@case("avg_pool", scale=TERMS, why="a window sum", examples=20)
def _avg_pool(d: Draw) -> Example:
    r = d.int(1, 3)
    kernel = [d.int(1, 3) for _ in range(r)]
    stride = [d.int(1, 3) for _ in range(r)]
    padding = [d.int(0, k // 2) for k in kernel]
    lead, spatial = _pool_input(d, kernel, padding, padding, [1] * r, fit_unpadded=True)

    def ref(t, p):
        y = _AVG_POOL[r](_as_batch(t[0], lead, spatial), kernel, stride, padding, count_include_pad=True)
        return y.reshape(lead + tuple(y.shape[1:]))
    return Example({"spatial_rank": r, "kernel": kernel, "stride": stride, "padding": padding},
                   [d.normal(lead + spatial)], ref)


def _pool_nd_attrs(d: Draw, with_dilation: bool) -> dict:
    r = d.int(1, 3)
    kernel = [d.int(1, 3) for _ in range(r)]
    ceil_mode = d.bool()
    before = [d.int(0, k // 2) for k in kernel]
    after = before if ceil_mode or d.bool() else [d.int(0, k // 2) for k in kernel]  # asymmetric: no ceil
    return {"spatial_rank": r, "kernel": kernel, "stride": [d.int(1, 3) for _ in range(r)], "padding": before,
            "padding_after": after, "dilation": [d.int(1, 2) if with_dilation else 1 for _ in range(r)],
            "ceil_mode": ceil_mode, "count_include_pad": d.bool()}


def _torch_pads(a: dict) -> list:
    return [v for b, e in zip(reversed(a["padding"]), reversed(a["padding_after"])) for v in (b, e)]


@case("max_pool_nd", examples=30)
def _max_pool_nd(d: Draw) -> Example:
    a = _pool_nd_attrs(d, with_dilation=True)
    r = a["spatial_rank"]
    lead, spatial = _pool_input(d, a["kernel"], a["padding"], a["padding_after"], a["dilation"])

    def ref(t, p):
        x = _as_batch(t[0], lead, spatial)
        if a["padding"] == a["padding_after"]:
            y = _MAX_POOL[r](x, a["kernel"], a["stride"], a["padding"], a["dilation"], ceil_mode=a["ceil_mode"])
        else:
            y = _MAX_POOL[r](F.pad(x, _torch_pads(a), value=-math.inf), a["kernel"], a["stride"], 0, a["dilation"])
        return y.reshape(lead + tuple(y.shape[1:]))
    return Example(a, [d.normal(lead + spatial)], ref)


@case("avg_pool_nd", scale=TERMS, why="a window sum", examples=30)
def _avg_pool_nd(d: Draw) -> Example:
    a = _pool_nd_attrs(d, with_dilation=False)
    r = a["spatial_rank"]
    lead, spatial = _pool_input(d, a["kernel"], a["padding"], a["padding_after"], a["dilation"], fit_unpadded=True)

    def ref(t, p):
        x = _as_batch(t[0], lead, spatial)
        if a["padding"] == a["padding_after"]:
            y = _AVG_POOL[r](x, a["kernel"], a["stride"], a["padding"], ceil_mode=a["ceil_mode"],
                             count_include_pad=a["count_include_pad"])
        else:  # explicit asymmetric zero padding; without count_include_pad divide by the real cells
            pads = _torch_pads(a)
            y = _AVG_POOL[r](F.pad(x, pads), a["kernel"], a["stride"])
            if not a["count_include_pad"]:
                y = y / _AVG_POOL[r](F.pad(torch.ones_like(x), pads), a["kernel"], a["stride"])
        return y.reshape(lead + tuple(y.shape[1:]))
    return Example(a, [d.normal(lead + spatial)], ref)


# -- the tests --------------------------------------------------------------------------------

# ops whose meaning is TorchLean's own (no PyTorch counterpart): tested in test_semantics.py
# -- integer arithmetic and bit operations (issue #15): exact, against torch's int64 ops ---------------------

_INT_TORCH = {"int_add": torch.add, "int_sub": torch.sub, "int_mul": torch.mul, "int_max": torch.maximum,
              "int_min": torch.minimum, "int_div": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
              "bitwise_and": torch.bitwise_and, "bitwise_or": torch.bitwise_or, "bitwise_xor": torch.bitwise_xor}


def _int_case(kind: str) -> None:
    @case(kind)
    def gen(d: Draw) -> Example:
        shape = d.shape()
        a = d.rng.integers(-30000, 30000, shape)
        b = d.rng.integers(-30000, 30000, shape)
        if kind == "int_div":
            b = np.where(b == 0, 7, b)
        if kind in ("int_add", "int_sub", "int_mul"):
            a, b = a // 200, b // 200  # results inside int32
        fn = _INT_TORCH[kind]
        return Example({"bits": 32, "signed": True}, [a, b], lambda t, p: fn(t[0], t[1]))


for _k in _INT_TORCH:
    _int_case(_k)


@case("bitwise_not")
def _bitwise_not(d: Draw) -> Example:
    return Example({"bits": 16, "signed": True}, [d.rng.integers(-32768, 32768, d.shape())],
                   lambda t, p: torch.bitwise_not(t[0]))


@case("bitshift")
def _bitshift(d: Draw) -> Example:
    shape, left = d.shape(), d.bool()
    x, s = d.rng.integers(-2 ** 40, 2 ** 40, shape), d.rng.integers(0, 64, shape)
    fn = torch.bitwise_left_shift if left else torch.bitwise_right_shift  # int64 two's complement, arithmetic
    return Example({"left": left, "bits": 64, "signed": True}, [x, s], lambda t, p: fn(t[0], t[1]))


@case("mod")
def _mod(d: Draw) -> Example:
    shape, fmod = d.shape(), d.bool()
    if d.bool():
        a, b = d.normal(shape), d.normal(shape) + 0.5
    else:
        a, b = d.rng.integers(-50, 50, shape), d.rng.integers(1, 9, shape) * d.choice([-1, 1])
    fn = torch.fmod if fmod else torch.remainder
    return Example({"fmod": fmod}, [a, b], lambda t, p: fn(t[0], t[1]))


# -- spatial sampling (issue #15): torch's grid_sample, lp_pool, fold; deformable convolution via grid_sample ----

_GRID_MODES_TORCH = {"linear": "bilinear", "nearest": "nearest", "cubic": "bicubic"}


@case("grid_sample", scale=NORM, why="interpolation weights", examples=40)
def _grid_sample(d: Draw) -> Example:
    r = d.int(2, 3)  # torch samples 4-D and 5-D inputs (bicubic 4-D only)
    mode = d.choice(["linear", "nearest", "cubic"] if r == 2 else ["linear", "nearest"])
    pad, ac = d.choice(["zeros", "border", "reflection"]), d.bool()
    n, c = d.int(1, 2), d.int(1, 3)
    spatial = tuple(d.int(1, 5) for _ in range(r))
    points = tuple(d.int(1, 4) for _ in range(r))
    grid = d.rng.uniform(-1.6, 1.6, (n, *points, r))
    attrs = {"mode": mode, "padding_mode": pad, "align_corners": ac, "convention": "torch"}

    def ref(t, p):
        return F.grid_sample(t[0], t[1], mode=_GRID_MODES_TORCH[mode], padding_mode=pad, align_corners=ac)
    return Example(attrs, [d.normal((n, c) + spatial), grid], ref)


_LP_POOL = {1: F.lp_pool1d, 2: F.lp_pool2d, 3: F.lp_pool3d}


@case("lp_pool_nd", scale=NORM, why="a power sum", examples=25)
def _lp_pool_nd(d: Draw) -> Example:
    """torch's lp_pool is (prod(kernel) * avg(x^p))^(1/p) without padding or dilation: on |x| and without ceil
    mode (where torch's average divides by the clipped window) that is the ONNX sum."""
    r = d.int(1, 3)
    kernel = [d.int(1, 3) for _ in range(r)]
    stride = [d.int(1, 3) for _ in range(r)]
    spatial = tuple(k + d.int(0, 3) for k in kernel)
    c = d.int(1, 3)
    p = d.choice([1.0, 2.0, 3.0, 1.5])
    attrs = {"spatial_rank": r, "kernel": kernel, "stride": stride, "padding": [0] * r, "padding_after": [0] * r,
             "dilation": [1] * r, "ceil_mode": False, "p": p}
    k, st = (kernel[0], stride[0]) if r == 1 else (tuple(kernel), tuple(stride))  # (lp_pool1d takes ints)
    return Example(attrs, [d.normal((c,) + spatial)],
                   lambda t, q: _LP_POOL[r](t[0].abs().unsqueeze(0), p, k, st).squeeze(0))


@case("col2im", scale=TERMS, why="sums of overlapping blocks", examples=25)
def _col2im(d: Draw) -> Example:
    from torchlean_bridge.ops.spatial import col2im_blocks
    block = [d.int(1, 3) for _ in range(2)]
    stride = [d.int(1, 2) for _ in range(2)]
    dilation = [d.int(1, 2) for _ in range(2)]
    padding = [d.int(0, 1) for _ in range(2)]
    image = [dl * (k - 1) + 1 + d.int(0, 3) for k, dl in zip(block, dilation)]
    attrs = {"spatial_rank": 2, "image": image, "block": block, "stride": stride, "padding": padding,
             "padding_after": padding, "dilation": dilation}
    blocks = col2im_blocks(attrs)
    n, c = d.int(1, 2), d.int(1, 3)
    x = d.normal((n, c * block[0] * block[1], blocks[0] * blocks[1]))
    return Example(attrs, [x], lambda t, p: F.fold(t[0], image, block, dilation=dilation, padding=padding,
                                                   stride=stride))


@case("deform_conv", scale=TERMS, why="bilinear samples in dot products", examples=20)
def _deform_conv(d: Draw) -> Example:
    """The reference samples each kernel tap with torch's grid_sample (bilinear, zeros, align_corners on
    pixel coordinates), as the ONNX reference does, then contracts with the weight."""
    groups, og = d.int(1, 2), d.int(1, 2)
    c = groups * og * d.int(1, 2)
    out_c = groups * d.int(1, 2)
    kernel = [d.int(1, 3) for _ in range(2)]
    stride, dilation = [d.int(1, 2) for _ in range(2)], [d.int(1, 2) for _ in range(2)]
    padding = [d.int(0, 1) for _ in range(2)]
    spatial = [max(2, dl * (k - 1) + 1 - 2 * pd) + d.int(0, 2) for k, dl, pd in zip(kernel, dilation, padding)]
    out = [(n + 2 * pd - dl * (k - 1) - 1) // s + 1 for n, pd, dl, k, s in zip(spatial, padding, dilation, kernel,
                                                                              stride)]
    n, kk = d.int(1, 2), kernel[0] * kernel[1]
    x = d.normal((n, c, *spatial))
    w = d.normal((out_c, c // groups, *kernel))
    offset = d.normal((n, og * kk * 2, *out), 1.5)
    bias, mask = d.normal((out_c,)), d.rng.uniform(0, 1, (n, og * kk, *out))
    attrs = {"spatial_rank": 2, "kernel": kernel, "stride": stride, "padding": padding, "padding_after": padding,
             "dilation": dilation, "groups": groups, "offset_groups": og}

    def ref(t, p):
        xt, wt, off, b, m = t
        off = off.reshape(n, og, kernel[0], kernel[1], 2, *out)
        m = m.reshape(n, og, kernel[0], kernel[1], *out)
        ky, kx = torch.meshgrid(torch.arange(kernel[0]) * dilation[0], torch.arange(kernel[1]) * dilation[1],
                                indexing="ij")
        oy, ox = torch.meshgrid(torch.arange(out[0]) * stride[0] - padding[0],
                                torch.arange(out[1]) * stride[1] - padding[1], indexing="ij")
        cols = []
        for j in range(og):
            py = (ky[:, :, None, None] + oy[None, None]).to(xt.dtype) + off[:, j, :, :, 0]
            px = (kx[:, :, None, None] + ox[None, None]).to(xt.dtype) + off[:, j, :, :, 1]
            grid = torch.stack([2 * px / (spatial[1] - 1) - 1, 2 * py / (spatial[0] - 1) - 1], dim=-1)
            part = xt[:, j * (c // og):(j + 1) * (c // og)]
            s = F.grid_sample(part, grid.reshape(n, kk, -1, 2), mode="bilinear", padding_mode="zeros",
                              align_corners=True).reshape(n, c // og, kk, *out)
            cols.append(s * m[:, j].reshape(n, 1, kk, *out))
        cols = torch.cat(cols, dim=1).reshape(n, groups, (c // groups) * kk, out[0] * out[1])
        y = torch.einsum("gok,ngkp->ngop", wt.reshape(groups, out_c // groups, -1), cols)
        return y.reshape(n, out_c, *out) + b.reshape(1, out_c, 1, 1)
    return Example(attrs, [x, w, offset, bias, mask], ref)


# -- cumprod, det, bitcast (issue #15, ops) --------------------------------------------------------

@case("cumprod", scale=TERMS, why="running products", examples=20)
def _cumprod(d: Draw) -> Example:
    shape = d.shape(min_rank=1)
    axis, exclusive, reverse = d.int(0, len(shape) - 1), d.bool(), d.bool()

    def ref(t, p):
        x = t[0].flip(axis) if reverse else t[0]
        y = torch.cumprod(x, axis)
        if exclusive:  # the product before each entry: shifted one place, 1 first
            first = torch.ones_like(x.narrow(axis, 0, 1))
            y = torch.cat([first, y.narrow(axis, 0, x.shape[axis] - 1)], axis)
        return y.flip(axis) if reverse else y
    return Example({"axis": axis, "exclusive": exclusive, "reverse": reverse, "bits": 64, "signed": True},
                   [d.normal(shape) + 0.5], ref)


@case("det", scale=NORM, why="LU elimination (numpy) vs torch's LU", examples=20)
def _det(d: Draw) -> Example:
    n = d.int(1, 4)
    lead = d.shape(min_rank=0, max_rank=2)
    x = d.normal(lead + (n, n), 1.0) + 2.0 * np.eye(n)  # well conditioned
    return Example({}, [x], lambda t, p: torch.linalg.det(t[0]))


@case("bitcast")
def _bitcast(d: Draw) -> Example:
    bits = d.normal(d.shape()).astype(np.float32).view(np.int32).astype(np.int64)  # finite float32 patterns
    return Example({"source": "int32", "target": "float32"}, [bits],
                   lambda t, p: t[0].to(torch.int32).view(torch.float32).to(p["domain"]))


@case("int_cumsum", examples=20)
def _int_cumsum(d: Draw) -> Example:
    shape, attrs, ref = _cumsum_case(d)
    return Example({**attrs, "bits": 32, "signed": True}, [d.rng.integers(-1000, 1000, shape)], ref)


# narrow element types (issue #15): torch's own conversions; the exhaustive checks against onnx's reference Cast are
# in tests/test_element_types.py
_TORCH_NARROW = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float8e4m3fn": torch.float8_e4m3fn,
                 "float8e5m2": torch.float8_e5m2}


@case("round_float")
def _round_float(d: Draw) -> Example:
    fmt = d.choice(sorted(_TORCH_NARROW))
    return Example({"format": fmt, "saturate": False, "round_mode": "nearest"}, [d.normal(d.shape(), 3.0)],
                   lambda t, p: t[0].to(_TORCH_NARROW[fmt]).to(p["domain"]))


@case("int_wrap")
def _int_wrap(d: Draw) -> Example:
    bits, signed = d.choice([(8, True), (8, False), (16, True), (4, True), (2, False)])
    to = {(8, True): torch.int8, (8, False): torch.uint8, (16, True): torch.int16}.get((bits, signed))
    half = 1 << (bits - 1)
    ref = (lambda t, p: t[0].to(to).to(torch.int64)) if to is not None else \
        (lambda t, p: torch.remainder(t[0] + (half if signed else 0), 1 << bits) - (half if signed else 0))
    return Example({"bits": bits, "signed": signed}, [d.rng.integers(-70000, 70000, d.shape())], ref)


@case("int_matmul")
def _int_matmul(d: Draw) -> Example:
    m, k, n = d.int(1, 4), d.int(1, 5), d.int(1, 4)
    a, b = d.rng.integers(-255, 256, (m, k)), d.rng.integers(-255, 256, (k, n))
    return Example({}, [a, b], lambda t, p: torch.matmul(t[0], t[1]))


@case("int_conv")
def _int_conv(d: Draw) -> Example:
    c, o, k, s = d.int(1, 3), d.int(1, 3), d.int(1, 3), d.int(1, 2)
    x, w = d.rng.integers(-255, 256, (1, c, 5, 5)), d.rng.integers(-255, 256, (o, c, k, k))
    attrs = {"spatial_rank": 2, "kernel": (k, k), "stride": (s, s), "padding": (1, 1), "padding_after": (1, 1),
             "dilation": (1, 1), "groups": 1, "channel_axis": 1, "in_channels": c, "out_channels": o}
    return Example(attrs, [x, w], lambda t, p: torch.nn.functional.conv2d(
        t[0].double(), t[1].double(), stride=s, padding=1).round().long())  # exact: the sums are below 2^53


_INT_REDUCERS = {"int_reduce_sum": lambda t, a, k: torch.sum(t, dim=a, keepdim=k),
                 "int_reduce_prod": lambda t, a, k: torch.prod(t.movedim(a, tuple(range(-len(a), 0))).flatten(
                     -len(a)), dim=-1, keepdim=False).reshape([1 if i in a else n for i, n in enumerate(t.shape)]
                                                               if k else [n for i, n in enumerate(t.shape) if i not in a]),
                 "int_reduce_max": lambda t, a, k: torch.amax(t, dim=a, keepdim=k),
                 "int_reduce_min": lambda t, a, k: torch.amin(t, dim=a, keepdim=k)}


def _int_reduce_case(kind: str):
    @case(kind, examples=15)
    def gen(d: Draw) -> Example:
        shape = d.shape(1, 3, 1, 4)
        axes = d.subset(range(len(shape))) or (0,)
        keep = d.bool()
        x = d.rng.integers(-9, 10, shape) if kind == "int_reduce_prod" else d.rng.integers(-1000, 1000, shape)
        return Example({"axes": axes, "keepdim": keep, "bits": 64, "signed": True}, [x],
                       lambda t, p: _INT_REDUCERS[kind](t[0], axes, keep))
    return gen


for _kind in _INT_REDUCERS:
    _int_reduce_case(_kind)


@case("dynamic_slice", examples=15)
def _dynamic_slice(d: Draw) -> Example:
    shape = d.shape(1, 3, 2, 5)
    axes = tuple(a for a in range(len(shape)) if d.bool()) or (0,)
    sizes = tuple(d.int(1, shape[a]) for a in axes)
    starts = np.array([d.int(0, shape[a] - k) for a, k in zip(axes, sizes)], dtype=np.int64)

    def reference(t, p):
        out = t[0]
        for a, k, s0 in zip(axes, sizes, starts):
            out = torch.narrow(out, a, int(s0), k)
        return out
    return Example({"axes": axes, "sizes": sizes}, [d.normal(shape), starts], reference)


NOT_IN_TORCH = {"input", "const", "custom", "rand_uniform", "bernoulli_mask"}
# torchvision.ops.roi_align needs torchvision's compiled kernels, which do not load with this CPU torch:
# roi_align is checked against onnxruntime and the ONNX reference in tests/test_spatial_ops.py
NOT_IN_TORCH |= {"roi_align"}


def test_every_registered_op_has_a_differential_case():
    covered = {c.kind for c in CASES}
    assert sorted(set(REGISTRY) - covered - NOT_IN_TORCH) == []


@pytest.mark.parametrize("c", CASES, ids=[c.kind for c in CASES])
def test_op_agrees_with_torch(c: Case):
    @settings(max_examples=c.examples, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(data=st.data())
    def check(data):
        run_case(c, c.gen(Draw(data)))
    check()
