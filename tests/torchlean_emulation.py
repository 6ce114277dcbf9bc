"""An independent scalar emulation of TorchLean's ``Graph.denoteAll`` at Float for the v1 kinds.

Plain Python floats and ``math`` (which calls the C library, as Lean's ``Float`` does), one loop per
output entry in TorchLean's order, written from the Lean definitions (lean-dojo/TorchLean
``NN/IR/Semantics.lean`` ``evalNodeRaw`` and the spec layer it calls; facts collected in
../shared/spec/torchlean-ir-v1.md section 2.2 and its appendix). No numpy arithmetic and no code
from ``semantics/``: a tensor is ``(shape, flat row-major list of floats)``.
"""

from __future__ import annotations

import itertools
import math
from typing import Any, Sequence

Tensor = tuple[tuple[int, ...], list[float]]

MASK64 = (1 << 64) - 1


# -- IEEE scalar operations where Python raises instead -----------------------------------------

def div(a: float, b: float) -> float:
    """IEEE a / b (Python raises on b == 0)."""
    if b == 0:
        if a == 0 or a != a:
            return math.nan
        return math.copysign(math.inf, a) * math.copysign(1.0, b)
    return a / b


def c_exp(x: float) -> float:
    try:
        return math.exp(x)
    except OverflowError:
        return math.inf


def c_log(x: float) -> float:
    if x == 0:
        return -math.inf
    if x < 0:
        return math.nan
    return math.log(x)


def c_sqrt(x: float) -> float:
    return math.nan if x < 0 else math.sqrt(x)


def c_sin(x: float) -> float:
    return math.nan if math.isinf(x) else math.sin(x)


def c_cos(x: float) -> float:
    return math.nan if math.isinf(x) else math.cos(x)


def lean_max(x: float, y: float) -> float:
    """Lean core ``maxOfLe``: ``if x <= y then y else x``."""
    return y if x <= y else x


def lean_min(x: float, y: float) -> float:
    """``minOfLe``: ``if x <= y then x else y``."""
    return x if x <= y else y


def fold_sum(values: Sequence[float]) -> float:
    """``tensorFoldlSpec (+) 0``: from +0.0, left to right."""
    acc = 0.0
    for v in values:
        acc = acc + v
    return acc


# -- Spec.Random --------------------------------------------------------------------------------

def mix(x: int) -> int:
    z1 = (x + 0x9E3779B97F4A7C15) & MASK64
    z2 = ((z1 ^ (z1 >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z3 = ((z2 ^ (z2 >> 27)) * 0x94D049BB133111EB) & MASK64
    return z3 ^ (z3 >> 31)


def uniform(seed: int, index: int, count: int) -> list[float]:
    key = mix((seed + index) & MASK64)
    return [float(mix((key + k) & MASK64) & 0xFFFFFFFF) / 4294967296.0 for k in range(count)]


# -- shapes and indices -------------------------------------------------------------------------

def numel(shape: Sequence[int]) -> int:
    return math.prod(shape)


def strides(shape: Sequence[int]) -> list[int]:
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= n
    return out[::-1]


def indices(shape: Sequence[int]):
    return itertools.product(*(range(n) for n in shape))


def flat(index: Sequence[int], shape: Sequence[int]) -> int:
    return sum(i * s for i, s in zip(index, strides(shape)))


# -- the ops ------------------------------------------------------------------------------------

UNARY = {
    "abs": abs,
    "neg": lambda x: -x,
    "sqrt": lambda x: c_sqrt(0.0 if x <= 0 else x),  # sqrtSpec: sqrt(max x 0)
    "inv": lambda x: div(1.0, x),
    "relu": lambda x: 0.0 if x == 0 else lean_max(x, 0.0),  # reluSpec
    "tanh": math.tanh,
    "exp": c_exp,
    "sin": c_sin,
    "cos": c_cos,
    # Activation.lean @25576b9: two branches
    "sigmoid": lambda x: div(1.0, 1.0 + c_exp(-x)) if x > 0 else div(c_exp(x), 1.0 + c_exp(x)),
    "softplus": lambda x: x + c_log(1.0 + c_exp(-x)) if x > 0 else c_log(1.0 + c_exp(x)),
}
BINARY = {"add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul_elem": lambda a, b: a * b,
          "max_elem": lean_max, "min_elem": lean_min}


class EvalFailure(Exception):
    """TorchLean's evaluation returns an error here (log of a non-positive value)."""


def reduce_axis(x: Tensor, axis: int, mean: bool) -> Tensor:
    shape, v = x
    out_shape = shape[:axis] + shape[axis + 1:]
    out = []
    for idx in indices(out_shape):
        terms = [v[flat(idx[:axis] + (j,) + idx[axis:], shape)] for j in range(shape[axis])]
        s = fold_sum(terms)
        out.append(s / shape[axis] if mean else s)
    return out_shape, out


def matmul(a: Tensor, b: Tensor) -> Tensor:
    (sa, va), (sb, vb) = a, b
    left_vec, right_vec = len(sa) == 1, len(sb) == 1
    sa2 = (1,) + sa if left_vec else sa
    sb2 = sb + (1,) if right_vec else sb
    m, n, p = sa2[-2], sa2[-1], sb2[-1]
    la, lb = sa2[:-2], sb2[:-2]
    rank = max(len(la), len(lb))
    la, lb = (1,) * (rank - len(la)) + la, (1,) * (rank - len(lb)) + lb
    batch = tuple(max(x, y) if min(x, y) != 0 else 0 for x, y in zip(la, lb))
    out = []
    for bi in indices(batch):
        ia = tuple(0 if e == 1 else i for i, e in zip(bi, la))
        ib = tuple(0 if e == 1 else i for i, e in zip(bi, lb))
        for i in range(m):
            for k in range(p):
                acc = 0.0
                for j in range(n):
                    acc = acc + va[flat(ia + (i, j), la + (m, n))] * vb[flat(ib + (j, k), lb + (n, p))]
                out.append(acc)
    out_shape = batch + ((m,) if not left_vec else ()) + ((p,) if not right_vec else ())
    return out_shape, out


def conv(x: Tensor, w: Tensor, bias: list[float], a: dict, out_shape: tuple[int, ...]) -> Tensor:
    """``groupedConvSpec``: acc = 0, outer loop over the group's input channels, inner loop over
    kernel offsets row-major, acc = acc + x * w (0 outside the input), bias added last."""
    shape, v = x
    ca, groups = a["channel_axis"], a["groups"]
    cin_g, cout_g = a["in_channels"] // groups, a["out_channels"] // groups
    spatial, out_spatial = shape[ca + 1:], out_shape[ca + 1:]
    ws, wv = w
    out = []
    for lead in indices(shape[:ca]):
        for oc in range(a["out_channels"]):
            g = oc // cout_g
            for o in indices(out_spatial):
                acc = 0.0
                for j in range(cin_g):
                    c = g * cin_g + j
                    for k in indices(a["kernel"]):
                        q = [oi * s + ki * d for oi, ki, s, d in zip(o, k, a["stride"], a["dilation"])]
                        pos = [qi - pb for qi, pb in zip(q, a["padding"])]
                        inside = all(0 <= pi < n for pi, n in zip(pos, spatial))
                        xv = v[flat(lead + (c,) + tuple(pos), shape)] if inside else 0.0
                        acc = acc + xv * wv[flat((oc, j) + k, ws)]
                out.append(acc + bias[oc])
    return out_shape, out


def pool(x: Tensor, a: dict, out_shape: tuple[int, ...], kind: str) -> Tensor:
    shape, v = x
    r = a["spatial_rank"]
    lead, spatial, out_spatial = shape[:len(shape) - r], shape[len(shape) - r:], out_shape[len(shape) - r:]
    out = []
    for li in indices(lead):
        for o in indices(out_spatial):
            best, acc = None, 0.0
            for k in indices(a["kernel"]):
                pos = [oi * s + ki - p for oi, ki, s, p in zip(o, k, a["stride"], a["padding"])]
                inside = all(0 <= pi < n for pi, n in zip(pos, spatial))
                cell = v[flat(li + tuple(pos), shape)] if inside else None
                if kind == "max":  # maxPoolValue: in-range cells only, the first maximum wins
                    if cell is not None and (best is None or cell > best):
                        best = cell
                else:
                    acc = acc + (cell if cell is not None else 0.0)
            out.append(best if kind == "max" else acc / numel(a["kernel"]))
    return out_shape, out


def softmax_rows(rows: list[list[float]], masks: list[list[bool]] | None = None) -> list[list[float]]:
    out = []
    for r, row in enumerate(rows):
        allowed = masks[r] if masks is not None else [True] * len(row)
        best = None
        for x, ok in zip(row, allowed):
            if ok and (best is None or x > best):
                best = x
        if best is None:
            out.append([0.0] * len(row))
            continue
        num = [c_exp(x - best) if ok else 0.0 for x, ok in zip(row, allowed)]
        den = fold_sum(num)
        out.append([div(e, den) for e in num])
    return out


def along_last(x: Tensor, axis: int) -> tuple[list[list[float]], Any]:
    """The rows along ``axis`` (moved innermost) and a function putting rows back."""
    shape, v = x
    rest = shape[:axis] + shape[axis + 1:]
    rows = [[v[flat(idx[:axis] + (j,) + idx[axis:], shape)] for j in range(shape[axis])] for idx in indices(rest)]

    def back(new_rows: list[list[float]]) -> Tensor:
        out = [0.0] * numel(shape)
        for idx, row in zip(indices(rest), new_rows):
            for j, y in enumerate(row):
                out[flat(idx[:axis] + (j,) + idx[axis:], shape)] = y
        return shape, out
    return rows, back


def permute(x: Tensor, perm: Sequence[int]) -> Tensor:
    shape, v = x
    out_shape = tuple(shape[p] for p in perm)
    out = []
    for idx in indices(out_shape):
        src = [0] * len(shape)
        for k, p in enumerate(perm):
            src[p] = idx[k]
        out.append(v[flat(src, shape)])
    return out_shape, out


def lowered_ids(nodes) -> list[int]:
    """Spec 1.3: a multi-axis reduction lowers to one node per axis (+ a reshape each with keepdim)."""
    ids, next_id = [], 0
    for n in nodes:
        ids.append(next_id)
        next_id += len(n.attrs["axes"]) * (2 if n.attrs["keepdim"] else 1) if n.kind.endswith("_axes") else 1
    return ids


def denote_all(g, payload, inputs: Sequence[Any]) -> list[Tensor]:
    """The value table; ``inputs`` as nested Python lists or anything with ``.tolist()``."""
    values: list[Tensor] = []
    lowered = lowered_ids(g.nodes)
    given = dict(zip(g.inputs, inputs))
    for node in g.nodes:
        ps = [values[p] for p in node.parents]
        a, out_shape, kind = node.attrs, tuple(node.out_shape), node.kind
        rec = payload.record(node.id) if payload is not None else {}
        if kind == "input":
            x = given[node.id]
            values.append((out_shape, [float(t) for t in _flatten(x.tolist() if hasattr(x, "tolist") else x)]))
        elif kind == "const":
            values.append((out_shape, [float(t) for t in rec["values"].reshape(-1).tolist()]))
        elif kind in ("detach", "reshape", "flatten"):
            values.append((out_shape, list(ps[0][1])))
        elif kind == "permute":
            values.append(permute(ps[0], a["perm"]))
        elif kind == "transpose":
            perm = list(range(len(ps[0][0])))
            perm[a["axis1"]], perm[a["axis2"]] = perm[a["axis2"]], perm[a["axis1"]]
            values.append(permute(ps[0], perm))
        elif kind == "broadcast_to":
            shape, v = ps[0]
            pad = (1,) * (len(out_shape) - len(shape)) + shape
            values.append((out_shape, [v[flat([0 if e == 1 else i for i, e in zip(idx, pad)], pad)]
                                       for idx in indices(out_shape)]))
        elif kind == "concat":
            axis = a["axis"]
            out = []
            for idx in indices(out_shape):
                j = idx[axis]
                for shape, v in ps:
                    if j < shape[axis]:
                        out.append(v[flat(idx[:axis] + (j,) + idx[axis + 1:], shape)])
                        break
                    j -= shape[axis]
            values.append((out_shape, out))
        elif kind in UNARY:
            values.append((out_shape, [UNARY[kind](x) for x in ps[0][1]]))
        elif kind in BINARY:
            values.append((out_shape, [BINARY[kind](x, y) for x, y in zip(ps[0][1], ps[1][1])]))
        elif kind == "log":
            if not all(x > 0 for x in ps[0][1]):
                raise EvalFailure("log")
            values.append((out_shape, [c_log(x) for x in ps[0][1]]))
        elif kind == "safe_log":
            eps = ps[1][1][0]
            values.append((out_shape, [c_log(UNARY["softplus"](x) + eps) for x in ps[0][1]]))
        elif kind == "rand_uniform":
            values.append((out_shape, uniform(a["seed"], lowered[node.id], numel(out_shape))))
        elif kind == "bernoulli_mask":
            q = ps[0][1][0]
            u = uniform(a["seed"], lowered[node.id], numel(out_shape))
            # q > 0 ? (1 > q ? (q > u ? 1 : 0) : 1) : 0
            values.append((out_shape, [((1.0 if q > t else 0.0) if 1 > q else 1.0) if q > 0 else 0.0 for t in u]))
        elif kind == "sum":
            values.append(((), [fold_sum(ps[0][1])]))
        elif kind in ("reduce_sum", "reduce_mean"):
            values.append(reduce_axis(ps[0], a["axis"], kind == "reduce_mean"))
        elif kind in ("reduce_sum_axes", "reduce_mean_axes"):
            x = ps[0]
            for axis in sorted(a["axes"], reverse=True):
                x = reduce_axis(x, axis, kind == "reduce_mean_axes")
                if a["keepdim"]:
                    x = (x[0][:axis] + (1,) + x[0][axis:], x[1])
            values.append(x)
        elif kind == "matmul":
            values.append(matmul(ps[0], ps[1]))
        elif kind == "linear":
            shape, v = ps[0]
            w, b = rec["weight"], rec["bias"]
            out_dim, in_dim = w.shape
            wl, bl = w.reshape(-1).tolist(), b.tolist()
            out = []
            for r in range(numel(shape[:-1])):
                for o in range(out_dim):
                    acc = 0.0
                    for k in range(in_dim):
                        acc = acc + wl[o * in_dim + k] * v[r * in_dim + k]
                    out.append(acc + bl[o])
            values.append((out_shape, out))
        elif kind == "conv":
            w = rec["weight"]
            values.append(conv(ps[0], (tuple(w.shape), w.reshape(-1).tolist()), rec["bias"].tolist(), a, out_shape))
        elif kind in ("max_pool", "avg_pool"):
            values.append(pool(ps[0], a, out_shape, kind[:3]))
        elif kind == "batch_norm_eval":
            shape, v = ps[0]
            ca = a["channel_axis"]
            mean, var, gamma, beta = (rec[r].tolist() for r in ("running_mean", "running_var", "weight", "bias"))
            out = []
            for idx in indices(shape):
                c = idx[ca]
                den = c_sqrt(lean_max(var[c], 0.0) + a["eps"])
                out.append(div(v[flat(idx, shape)] - mean[c], den) * gamma[c] + beta[c])
            values.append((shape, out))
        elif kind == "softmax":
            rows, back = along_last(ps[0], a["axis"])
            values.append(back(softmax_rows(rows)))
        elif kind == "hard_masked_softmax":
            shape, v = ps[0]
            allowed = list(a["allowed"])
            if not shape:
                values.append(((), [1.0 if allowed[0] else 0.0]))
                continue
            e = shape[-1]
            rows = [v[i:i + e] for i in range(0, len(v), e)]
            masks = [allowed[i:i + e] for i in range(0, len(v), e)]
            values.append((shape, [y for row in softmax_rows(rows, masks) for y in row]))
        elif kind == "layernorm":
            shape, v = ps[0]
            e = numel(shape[a["axis"]:])
            gamma = rec["weight"].reshape(-1).tolist() if rec.get("weight") is not None else [1.0] * e
            beta = rec["bias"].reshape(-1).tolist() if rec.get("bias") is not None else [0.0] * e
            out = []
            for i in range(0, len(v), e):
                row = v[i:i + e]
                mean = fold_sum(row) / e
                c = [x - mean for x in row]
                mc = fold_sum(c) / e
                var = lean_max(fold_sum([(t - mc) * (t - mc) for t in c]) / e, 0.0)
                sd = c_sqrt(var + a["eps"])
                out.extend(div(t, sd) * gm + bt for t, gm, bt in zip(c, gamma, beta))
            values.append((shape, out))
        elif kind == "mse_loss":
            (shape, y), (_, t) = ps
            values.append(((), [fold_sum([(p - q) * (p - q) for p, q in zip(y, t)]) / max(numel(shape), 1)]))
        else:
            raise NotImplementedError(kind)
    return values


def _flatten(x: Any) -> list:
    if isinstance(x, list):
        return [y for item in x for y in _flatten(item)]
    return [x]
