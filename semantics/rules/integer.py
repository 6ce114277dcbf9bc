"""Integer arithmetic, reductions, remainders and bit operations on int64 values, each with its interval rule.

Float rules compute exactly in int64 and check, before trusting a result, that it did not overflow
int64 and that it fits the ONNX element type the node names (``bits``, ``signed``): ONNX would wrap
an int8 sum of 100 + 100, and a wrapped value is a silent wrong answer, so the node refuses it with
the values involved. Shifts and bitwise ops are defined modulo 2^bits, so they wrap as the type does.
``mod`` also takes float operands (numpy.fmod / numpy.mod, onnx's reference).

Interval rules: integer ops refuse by name (their values are indices and counts, known exactly at
import in the models this bridges); ``mod`` refuses too (a remainder is discontinuous where the
quotient crosses an integer, and no enclosure is implemented).
"""

from __future__ import annotations

import numpy as np

from .. import interval_arith as ia
from .table import domain_error, float_rule, interval_rule, stored_entries

__all__ = ["INTEGER_KINDS", "INT_REDUCTIONS", "INTERVAL_REFUSALS"]

_I64 = np.iinfo(np.int64)


def _type_range(attrs) -> tuple[int, int, str]:
    bits, signed = int(attrs["bits"]), bool(attrs["signed"])
    if signed:
        return -(1 << (bits - 1)), (1 << (bits - 1)) - 1, f"int{bits}"
    return 0, min((1 << bits) - 1, int(_I64.max)), f"uint{bits}"


def _fit(node, r: np.ndarray, overflow: np.ndarray | None = None) -> np.ndarray:
    """``r`` when every entry is exact and inside the node's element type; else a refusal."""
    lo, hi, name = _type_range(node.attrs)
    bad = (r < lo) | (r > hi)
    if overflow is not None:
        bad = bad | overflow
    if np.any(bad):
        where = np.flatnonzero(bad.reshape(-1))[0]
        value = "beyond int64" if overflow is not None and overflow.reshape(-1)[where] else int(r.reshape(-1)[where])
        raise domain_error(node, f"result {value} is outside {name} (ONNX would wrap it); refused, not wrapped")
    return r


def _ints(xs) -> list[np.ndarray]:
    return [np.asarray(x, dtype=np.int64) for x in xs]


@float_rule("int_add")
def int_add(node, xs, rec, dt):
    a, b = _ints(xs)
    with np.errstate(over="ignore"):
        r = a + b
    return _fit(node, r, ((a > 0) & (b > _I64.max - a)) | ((a < 0) & (b < _I64.min - a)))


@float_rule("int_sub")
def int_sub(node, xs, rec, dt):
    a, b = _ints(xs)
    with np.errstate(over="ignore"):
        r = a - b
    return _fit(node, r, ((b < 0) & (a > _I64.max + b)) | ((b > 0) & (a < _I64.min + b)))


@float_rule("int_mul")
def int_mul(node, xs, rec, dt):
    a, b = _ints(xs)
    with np.errstate(over="ignore"):
        r = a * b
    safe_a = np.where(a == 0, 1, a)
    overflow = (a != 0) & ((np.floor_divide(r, safe_a) != b) | ((a == -1) & (b == _I64.min))
                           | ((b == -1) & (a == _I64.min)))
    return _fit(node, r, overflow)


def _nonzero_divisor(node, b: np.ndarray) -> None:
    if np.any(stored_entries(b) == 0):
        raise domain_error(node, "integer division by zero")


@float_rule("int_div")
def int_div(node, xs, rec, dt):
    a, b = _ints(xs)
    _nonzero_divisor(node, b)
    overflow = (a == _I64.min) & (b == -1)
    safe_b = np.where(overflow, 1, b)
    q = np.floor_divide(a, safe_b)
    q = q + ((np.remainder(a, safe_b) != 0) & ((a < 0) ^ (safe_b < 0)))
    return _fit(node, q, overflow)


@float_rule("int_max", "int_min")
def int_extreme(node, xs, rec, dt):
    a, b = _ints(xs)
    return _fit(node, np.maximum(a, b) if node.kind == "int_max" else np.minimum(a, b))


def _wrap(node, r: np.ndarray) -> np.ndarray:
    """``r`` reduced modulo 2^bits into the node's type (two's complement when signed)."""
    bits, signed = int(node.attrs["bits"]), bool(node.attrs["signed"])
    if bits == 64:
        return r
    u = r & ((1 << bits) - 1)
    return np.where(u >= (1 << (bits - 1)), u - (1 << bits), u) if signed else u


@float_rule("bitwise_and", "bitwise_or", "bitwise_xor")
def bitwise(node, xs, rec, dt):
    a, b = _ints(xs)
    fn = {"bitwise_and": np.bitwise_and, "bitwise_or": np.bitwise_or, "bitwise_xor": np.bitwise_xor}[node.kind]
    return _fit(node, _wrap(node, fn(a, b)))


@float_rule("bitwise_not")
def bitwise_not(node, xs, rec, dt):
    (a,) = _ints(xs)
    if node.attrs["signed"]:
        return _fit(node, np.invert(a))
    return _fit(node, _wrap(node, ((1 << 63) - 1) - a if node.attrs["bits"] == 64 else np.invert(a)))


@float_rule("bitshift")
def bitshift(node, xs, rec, dt):
    a, b = _ints(xs)
    bits = int(node.attrs["bits"])
    a, b = np.broadcast_arrays(a, b)
    out_of_range = (b < 0) | (b >= bits)
    s = np.where(out_of_range, 0, b).astype(np.uint64)
    if node.attrs["left"]:
        u = np.left_shift(a.astype(np.uint64), s)  # modulo 2^64, then modulo 2^bits
        if bits < 64:
            u = u & np.uint64((1 << bits) - 1)
        if not node.attrs["signed"] and bits == 64 and np.any((u > np.uint64(_I64.max)) & ~out_of_range):
            raise domain_error(node, "a uint64 result above 2^63 - 1 cannot be held exactly in int64")
        r = u.astype(np.int64)  # for int64, two's complement reinterpretation
        if node.attrs["signed"] and bits < 64:
            r = _wrap(node, r)
        r = np.where(out_of_range, 0, r)
    else:
        r = np.right_shift(a, s.astype(np.int64))
        r = np.where(out_of_range, np.where(a < 0, -1, 0), r)
    return _fit(node, r)


@float_rule("mod")
def mod(node, xs, rec, dt):
    a, b = xs
    if a.dtype.kind == "f":
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.fmod(a, b) if node.attrs["fmod"] else np.mod(a, b)
    a, b = _ints(xs)
    _nonzero_divisor(node, b)
    return _fit(node, np.fmod(a, b) if node.attrs["fmod"] else np.mod(a, b))


def _reduced(node, fn, x: np.ndarray) -> np.ndarray:
    return fn(x, axis=tuple(node.attrs["axes"]), keepdims=bool(node.attrs["keepdim"]))


@float_rule("int_reduce_sum")
def int_reduce_sum(node, xs, rec, dt):
    """Exact: the float64 sum of |x| bounds the exact sum's magnitude (within 1e-12), so below 2^62 no int64
    partial sum wrapped."""
    (x,) = _ints(xs)
    if np.any(_reduced(node, np.sum, np.abs(x.astype(np.float64))) >= 2.0 ** 62):
        raise domain_error(node, "a sum may leave int64 (ONNX would wrap it); refused, not wrapped")
    return _fit(node, _reduced(node, np.sum, x))


@float_rule("int_reduce_prod")
def int_reduce_prod(node, xs, rec, dt):
    """Exact: below 2^62 in float64 (relative error n * 2^-53) no int64 partial product wrapped."""
    (x,) = _ints(xs)
    with np.errstate(over="ignore"):
        if np.any(_reduced(node, np.prod, np.abs(x.astype(np.float64))) >= 2.0 ** 62):
            raise domain_error(node, "a product may leave int64 (ONNX would wrap it); refused, not wrapped")
    return _fit(node, _reduced(node, np.prod, x))


@float_rule("int_reduce_max", "int_reduce_min")
def int_reduce_extreme(node, xs, rec, dt):
    (x,) = _ints(xs)
    return _fit(node, _reduced(node, np.max if node.kind == "int_reduce_max" else np.min, x))


INTEGER_KINDS = ("int_add", "int_sub", "int_mul", "int_div", "int_max", "int_min", "bitwise_and", "bitwise_or",
                 "bitwise_xor", "bitwise_not", "bitshift")
INT_REDUCTIONS = ("int_reduce_sum", "int_reduce_prod", "int_reduce_max", "int_reduce_min")


@interval_rule(*INTEGER_KINDS, *INT_REDUCTIONS)
def integer_box(node, ps, rec):
    raise ia.DomainError(f"no interval rule for {node.kind}: integer arithmetic is evaluated on exact values "
                         f"only (bind or fold the integer inputs)")


INTERVAL_REFUSALS = frozenset(INTEGER_KINDS) | {"mod"}  # the elementwise refusals (INT_REDUCTIONS refuse too)


@interval_rule("mod")
def mod_box(node, ps, rec):
    raise ia.DomainError("no interval rule for mod: a remainder jumps where the quotient crosses an integer, and "
                         "no enclosure is implemented")
