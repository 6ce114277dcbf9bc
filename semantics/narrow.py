"""Narrow element types: their grids, the roundings onto them, and exact widening.

Every float16 / bfloat16 / float8 / float4 / float6 / e8m0 value is exactly a binary32 value, and every
int4 / int2 value an int64, so the evaluator holds narrow tensors in its float (or int64) arrays and
only the conversions *to* a narrow type round. ``round_to`` computes them in binary64 from the exact
value of its operand (binary32 and binary64 operands alike), so there is no double rounding:
ml_dtypes' own conversions from binary64 go through binary32 and can round twice, so they are used
only to read and write arrays of those types (``widen``, ``narrow_array``), never to round. The
rounding rules are ONNX Cast's (docs/element-types.md): round to nearest, ties to even; overflow to
inf where the type has one (float16, bfloat16, float8e5m2 without ``saturate``); ``saturate`` clamps
float8 to +-max; FN/FNUZ types turn overflow into NaN without it; FNUZ types have no -0; float4/float6
have neither inf nor NaN and saturate (a NaN operand is refused); e8m0 follows ``round_mode``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from torchlean_bridge.ops.narrow import NARROW_FLOAT_FORMATS

__all__ = ["FloatFormat", "FORMATS", "round_to", "round_box", "wrap", "widen", "narrow_array", "numpy_dtype",
           "NarrowError", "INT_FORMATS"]


class NarrowError(ValueError):
    """A value a narrow conversion has no defined result for (the rules turn it into a refusal)."""


@dataclass(frozen=True)
class FloatFormat:
    """A binary float format: ``p`` significand bits (the implicit one included), smallest normal
    exponent ``emin``, largest finite value ``max``; whether it has inf, NaN and -0."""

    name: str
    p: int
    emin: int
    max: float
    inf: bool
    nan: bool
    negative_zero: bool
    saturating: bool = False  # float8 types: the `saturate` attribute applies

    @property
    def finite_only(self) -> bool:
        """float4/float6: no inf and no NaN, so out-of-range values always saturate."""
        return not self.inf and not self.nan


FORMATS: dict[str, FloatFormat] = {f.name: f for f in (
    FloatFormat("float16", 11, -14, 65504.0, True, True, True),
    FloatFormat("bfloat16", 8, -126, float((2 - 2.0 ** -7) * 2.0 ** 127), True, True, True),
    FloatFormat("float8e4m3fn", 4, -6, 448.0, False, True, True, True),
    FloatFormat("float8e4m3fnuz", 4, -7, 240.0, False, True, False, True),
    FloatFormat("float8e5m2", 3, -14, 57344.0, True, True, True, True),
    FloatFormat("float8e5m2fnuz", 3, -15, 57344.0, False, True, False, True),
    FloatFormat("float4e2m1", 2, 0, 6.0, False, False, True),
    FloatFormat("float6e2m3", 4, 0, 7.5, False, False, True),
    FloatFormat("float6e3m2", 3, -2, 28.0, False, False, True),
)}
assert set(FORMATS) | {"float8e8m0"} == set(NARROW_FLOAT_FORMATS)

E8M0_MIN_EXP, E8M0_MAX_EXP = -127, 127
_BINARY32_MIN_NORMAL = 2.0 ** -126

# ONNX integer element types narrower than int64 that the evaluator holds in int64: name -> (bits, signed)
INT_FORMATS = {f"{p}int{b}": (b, p == "") for p in ("", "u") for b in (2, 4, 8, 16, 32)}


def round_to(x: np.ndarray, fmt: str, saturate: bool = True, round_mode: str = "nearest") -> np.ndarray:
    """``x`` rounded onto the grid of ``fmt`` as ONNX Cast rounds, in x's own float dtype (exact there).

    Raises ``NarrowError`` for operands whose conversion ONNX leaves undefined: NaN to float4/float6,
    and for e8m0 negative values, binary32 subnormals, inf with ``saturate`` and 0 without it (where the
    spec's table and onnx's reference disagree).
    """
    x = np.asarray(x)
    if x.dtype.kind != "f":
        raise TypeError(f"round_to takes float arrays, got {x.dtype}")
    v = x.astype(np.float64)
    r = _round_e8m0(v, saturate, round_mode) if fmt == "float8e8m0" else _round_binary(v, FORMATS[fmt], saturate)
    return r.astype(x.dtype)


def _round_binary(v: np.ndarray, f: FloatFormat, saturate: bool) -> np.ndarray:
    a = np.abs(v)
    finite = np.isfinite(a)
    safe = np.where(finite, a, 0.0)
    exponent = np.maximum(np.frexp(safe)[1] - 1, f.emin)  # a in [2^e, 2^(e+1)), subnormals at emin
    quantum = np.ldexp(1.0, exponent - (f.p - 1))
    r = np.rint(safe / quantum) * quantum  # exact: a scaling by a power of two, then RNE
    clamp = saturate and f.saturating or f.finite_only
    over = r > f.max
    if clamp:
        r = np.where(over | ~finite & ~np.isnan(v), f.max, r)
    else:
        big = np.inf if f.inf else np.nan
        r = np.where(over | np.isinf(v), big, r)
    if f.finite_only and np.any(np.isnan(v)):
        raise NarrowError(f"NaN has no {f.name} value (the type has no NaN; ONNX does not define the conversion)")
    r = np.where(np.isnan(v), np.nan, np.copysign(r, v))
    if not f.negative_zero:
        r = np.where(r == 0, 0.0, r)  # FNUZ: -0 is +0 (and NaN has one spelling)
        r = np.where(np.isnan(r), np.nan, r)
    elif not f.inf and not clamp:
        r = np.where(np.isnan(r), np.copysign(np.nan, v), r)  # FN: -inf / -overflow -> -NaN
    return r


def _round_e8m0(v: np.ndarray, saturate: bool, round_mode: str) -> np.ndarray:
    """Powers of two 2^-127..2^127 (and NaN). ``up``/``down`` round away from / toward zero, ``nearest``
    to the nearer power (ties up), all on the exact value."""
    nan = np.isnan(v)
    problems = [(~nan & (v < 0), "negative values (ONNX leaves them unspecified)"),
                ((v > 0) & (v < _BINARY32_MIN_NORMAL), "values below 2^-126 (onnx's reference and the spec's "
                                                         "table differ there)"),
                (np.isinf(v) & saturate, "inf with saturate (onnx's reference gives NaN, the spec E8M0_MAX)"),
                ((v == 0) & ~saturate, "0 without saturate (onnx's reference gives 2^-127, the spec NaN)")]
    for bad, what in problems:
        if np.any(bad):
            raise NarrowError(f"float8e8m0: {what} are refused")
    finite = np.isfinite(v) & (v > 0)
    mant, e = np.frexp(np.where(finite, v, 1.0))  # v = mant * 2^e, mant in [0.5, 1)
    k = e - 1
    if round_mode == "up":
        k = k + (mant != 0.5)
    elif round_mode == "nearest":
        k = k + (mant >= 0.75)
    elif round_mode != "down":
        raise ValueError(f"round_mode {round_mode!r}")
    over = k > E8M0_MAX_EXP
    k = np.where(over & saturate, E8M0_MAX_EXP, k)
    r = np.ldexp(1.0, np.clip(k, E8M0_MIN_EXP, E8M0_MAX_EXP))
    r = np.where(v == 0, 2.0 ** E8M0_MIN_EXP, r)  # saturate: 0 is E8M0_MIN (bits 0)
    return np.where(nan | np.isinf(v) | (over & ~saturate), np.nan, r)


def round_box(lo: np.ndarray, hi: np.ndarray, fmt: str, saturate: bool, round_mode: str
              ) -> tuple[np.ndarray, np.ndarray]:
    """Enclosure of ``round_to`` over boxes: the rounding is monotone (non-decreasing) wherever it maps
    to numbers, so the rounded ends enclose; a box reaching a value that becomes NaN is refused."""
    rlo, rhi = round_to(lo, fmt, saturate, round_mode), round_to(hi, fmt, saturate, round_mode)
    if np.any(np.isnan(rlo) | np.isnan(rhi)):
        raise NarrowError(f"the box reaches values that {fmt} turns into NaN (saturate={saturate})")
    return rlo, rhi


def wrap(x: np.ndarray, bits: int, signed: bool) -> np.ndarray:
    """int64 values modulo 2^bits (two's complement when ``signed``): ONNX's integer narrowing."""
    u = np.asarray(x, dtype=np.int64) & ((1 << bits) - 1)
    return np.where(u >= (1 << (bits - 1)), u - (1 << bits), u) if signed else u


def numpy_dtype(name: str) -> np.dtype:
    """The numpy (ml_dtypes) dtype of an ONNX element type name."""
    import ml_dtypes
    table = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float8e4m3fn": ml_dtypes.float8_e4m3fn,
             "float8e4m3fnuz": ml_dtypes.float8_e4m3fnuz, "float8e5m2": ml_dtypes.float8_e5m2,
             "float8e5m2fnuz": ml_dtypes.float8_e5m2fnuz, "float4e2m1": ml_dtypes.float4_e2m1fn,
             "float6e2m3": ml_dtypes.float6_e2m3fn, "float6e3m2": ml_dtypes.float6_e3m2fn,
             "float8e8m0": ml_dtypes.float8_e8m0fnu, "int4": ml_dtypes.int4, "uint4": ml_dtypes.uint4,
             "int2": ml_dtypes.int2, "uint2": ml_dtypes.uint2}
    return np.dtype(table[name])


def format_of(dtype: np.dtype) -> str | None:
    """The ONNX name of a narrow numpy/ml_dtypes dtype, else None."""
    name = np.dtype(dtype).name
    return {"float8_e4m3fn": "float8e4m3fn", "float8_e4m3fnuz": "float8e4m3fnuz", "float8_e5m2": "float8e5m2",
            "float8_e5m2fnuz": "float8e5m2fnuz", "float4_e2m1fn": "float4e2m1", "float6_e2m3fn": "float6e2m3",
            "float6_e3m2fn": "float6e3m2", "float8_e8m0fnu": "float8e8m0", "float16": "float16",
            "bfloat16": "bfloat16", "int4": "int4", "uint4": "uint4", "int2": "int2", "uint2": "uint2"}.get(name)


def widen(a: np.ndarray) -> np.ndarray:
    """A narrow array as the evaluator holds it, exactly: narrow floats as float32, narrow ints as int64;
    any other array as it is."""
    a = np.asarray(a)
    fmt = format_of(a.dtype)
    if fmt is None:
        return a
    if fmt in INT_FORMATS:
        return a.astype(np.int64)
    return a.astype(np.float32)


def narrow_array(a: np.ndarray, name: str) -> np.ndarray:
    """Values already on ``name``'s grid (float or int64) as an array of that type; exact (checked)."""
    want = numpy_dtype(name)
    out = np.asarray(a).astype(want)
    back = out.astype(np.float64 if name not in INT_FORMATS else np.int64)
    same = (back == np.asarray(a)) | (np.isnan(back) & np.isnan(np.asarray(a, dtype=np.float64)))
    if not np.all(same):
        raise NarrowError(f"values are not on the {name} grid")
    return out
