"""ONNX data-movement ops: reshape family, transpose, concat/split/slice, gather, expand, pad, aliases.

Shape-like operands (target shapes, axes, starts/ends, pads) must be known at import time; they
are read as constants (the importer folds shape subgraphs first). Attribute forms of older opsets
(``Squeeze``/``Unsqueeze``/``Split`` axes before 13, ``Slice`` before 10, ``Pad`` before 11) are
handled next to the input forms.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Callable

import numpy as np

from torchlean_bridge.errors import ShapeRuleError
from torchlean_bridge.ops import BOOL, INT64
from torchlean_bridge.ops.contracts import broadcast_shapes, resolve_reshape

from .context import Const, OnnxContext, Value

__all__ = ["HANDLERS", "EMITS"]

Handler = Callable[[OnnxContext], list[Value]]


def _alias(ctx: OnnxContext) -> list[Value]:
    return [ctx.values[ctx.node.input[0]]]


def _dropout(ctx: OnnxContext) -> list[Value]:
    """Inference-mode dropout: the identity; the mask output (if any) is all true."""
    if ctx.opset >= 12 and ctx.has_input(2) and bool(np.asarray(ctx.static(2, "training_mode")).reshape(-1)[0]):
        raise ctx.fail("training_mode=1")
    if ctx.opset < 7 and ctx.attr("is_test", 0) == 0:
        raise ctx.fail("is_test=0 (training)")
    outs: list[Value] = [ctx.values[ctx.node.input[0]]]
    if len(ctx.node.output) > 1:
        outs.append(Const(np.ones(ctx.shape(0), dtype=bool), folded=True))
    return outs


def _reshape_target(ctx: OnnxContext, shape: list[int], allowzero: bool) -> tuple[int, ...]:
    """ONNX's 0 copies the input extent unless ``allowzero``; the -1 is the shared rule's."""
    src = ctx.shape(0)
    try:
        return resolve_reshape(src, [src[i] if d == 0 and not allowzero else d for i, d in enumerate(shape)])
    except ShapeRuleError as e:
        raise ctx.fail(e.message) from None


def _reshape(ctx: OnnxContext) -> list[Value]:
    shape = ctx.ints(1, "shape") if ctx.opset >= 5 else list(ctx.attr("shape"))
    target = _reshape_target(ctx, shape, bool(ctx.attr("allowzero", 0)))
    return [ctx.b.reshape(ctx.operand(0), target, ctx.source)]


def _flatten(ctx: OnnxContext) -> list[Value]:
    s = ctx.shape(0)
    axis = int(ctx.attr("axis", 1))
    axis = axis + len(s) if axis < 0 else axis
    if not 0 <= axis <= len(s):
        raise ctx.fail(f"axis {axis} out of range for rank {len(s)}")
    return [ctx.b.reshape(ctx.operand(0), (math.prod(s[:axis]), math.prod(s[axis:])), ctx.source)]


def _transpose(ctx: OnnxContext) -> list[Value]:
    rank = ctx.rank(0)
    perm = ctx.attr("perm") or list(range(rank))[::-1]
    if sorted(perm) != list(range(rank)):
        raise ctx.fail(f"perm {list(perm)} is not a permutation of the {rank} axes")
    if list(perm) == list(range(rank)):
        return _alias(ctx)
    return [ctx.add("permute", [ctx.operand(0)], {"perm": tuple(perm)})]


def _squeeze(ctx: OnnxContext) -> list[Value]:
    s = ctx.shape(0)
    axes = ctx.ints(1, "axes") if ctx.opset >= 13 else ctx.attr("axes")
    axes = sorted(ctx.axis(a, len(s)) for a in axes) if axes else [i for i, d in enumerate(s) if d == 1]
    if not axes:
        return _alias(ctx)
    return [ctx.add("squeeze", [ctx.operand(0)], {"axes": tuple(axes)})]


def _unsqueeze(ctx: OnnxContext) -> list[Value]:
    axes = ctx.ints(1, "axes") if ctx.opset >= 13 else ctx.attr("axes")
    rank = ctx.rank(0) + len(axes)
    return [ctx.add("unsqueeze", [ctx.operand(0)], {"axes": tuple(sorted(ctx.axis(a, rank) for a in axes))})]


def _concat(ctx: OnnxContext) -> list[Value]:
    names = [n for n in ctx.node.input if n]
    shapes = [ctx.shape(i) for i in range(len(ctx.node.input)) if ctx.node.input[i]]
    axis = ctx.axis(int(ctx.attr("axis")), len(shapes[0]))
    keep = [i for i, s in enumerate(shapes) if s[axis] != 0] or [0]
    if len(keep) == 1:
        return [ctx.values[names[keep[0]]]]
    return [ctx.add("concat", [ctx.tensor(names[i]) for i in keep], {"axis": axis})]


def _slice_node(ctx: OnnxContext, x: int, axes: list[int], starts: list[int], ends: list[int],
                steps: list[int]) -> int:
    return ctx.add("slice", [x], {"axes": tuple(axes), "starts": tuple(starts), "ends": tuple(ends),
                                  "steps": tuple(steps)})


def _split(ctx: OnnxContext) -> list[Value]:
    s = ctx.shape(0)
    axis = ctx.axis(int(ctx.attr("axis", 0)), len(s))
    n_out = len(ctx.node.output)
    sizes = ctx.ints(1, "split") if ctx.opset >= 13 else ctx.attr("split")
    if not sizes:
        parts = int(ctx.attr("num_outputs", n_out))
        if parts < 1:
            raise ctx.fail(f"num_outputs={parts}")
        chunk = -(-s[axis] // parts)
        sizes = [min(chunk, s[axis] - i * chunk) for i in range(parts)]
    if sum(sizes) != s[axis] or len(sizes) != n_out or any(k < 0 for k in sizes):
        raise ctx.fail(f"split sizes {sizes} do not partition extent {s[axis]} into {n_out} outputs")
    x, outs, start = ctx.operand(0), [], 0
    for size in sizes:
        if size == s[axis]:
            outs.append(x)
        else:
            outs.append(_slice_node(ctx, x, [axis], [start], [start + size], [1]))
        start += size
    return outs


def _slice(ctx: OnnxContext) -> list[Value]:
    s = ctx.shape(0)
    if ctx.opset < 10:
        starts, ends, axes = ctx.attr("starts"), ctx.attr("ends"), ctx.attr("axes")
        steps = None
    else:
        starts, ends = ctx.ints(1, "starts"), ctx.ints(2, "ends")
        axes, steps = ctx.ints(3, "axes"), ctx.ints(4, "steps")
    axes = list(axes) if axes else list(range(len(starts)))
    steps = list(steps) if steps else [1] * len(starts)
    na, ns, ne, nst = [], [], [], []
    for ax, st, en, sp in zip(axes, starts, ends, steps):
        ax = ctx.axis(ax, len(s))
        if sp <= 0:
            raise ctx.fail(f"step {sp} on axis {ax} (only positive steps are supported)")
        dim = s[ax]
        st = min(max(st + dim if st < 0 else st, 0), dim)
        en = min(max(en + dim if en < 0 else en, 0), dim)
        en = max(en, st)
        if (st, en, sp) == (0, dim, 1):
            continue
        na.append(ax), ns.append(st), ne.append(en), nst.append(sp)
    if not na:
        return _alias(ctx)
    order = sorted(range(len(na)), key=lambda i: na[i])
    return [_slice_node(ctx, ctx.operand(0), *([lst[i] for i in order] for lst in (na, ns, ne, nst)))]


def _gather(ctx: OnnxContext) -> list[Value]:
    """``Gather`` (numpy.take) and ``GatherElements`` (take along the axis); constant indices are
    range-checked and made non-negative at import."""
    s = ctx.shape(0)
    axis = ctx.axis(int(ctx.attr("axis", 0)), len(s))
    idx = ctx.const(1)
    if idx is not None:
        vals = np.asarray(idx.value).astype(np.int64)
        if np.any((vals < -s[axis]) | (vals >= s[axis])):
            raise ctx.fail(f"index out of range for extent {s[axis]}")
        vals = np.where(vals < 0, vals + s[axis], vals)
        ind = ctx.b.const(vals, source=ctx.source, folded=True)
    else:
        ind = ctx.operand(1)
    kind = "gather_elements" if ctx.node.op_type == "GatherElements" else "gather"
    return [ctx.add(kind, [ctx.operand(0), ind], {"axis": axis})]


def _gather_nd(ctx: OnnxContext) -> list[Value]:
    """``GatherND``: a ``gather`` on the flattened leading axes (constant indices) or on axis 0 (exact)."""
    if int(ctx.attr("batch_dims", 0)):
        raise ctx.fail("batch_dims > 0")
    idx = ctx.const(1)
    if idx is None:
        # x[idx] exports as GatherND with indices idx[..., None]: exactly a gather on axis 0
        ishape = ctx.shape(1)
        if not ishape or ishape[-1] != 1:
            raise ctx.fail("computed indices must index one axis (last index extent 1)")
        rows = ctx.b.reshape(ctx.operand(1), ishape[:-1], ctx.source)
        return [ctx.add("gather", [ctx.operand(0), rows], {"axis": 0})]
    s = ctx.shape(0)
    ind = np.asarray(idx.value).astype(np.int64)
    r = ind.shape[-1]
    lead = np.asarray(s[:r], dtype=np.int64)
    if np.any((ind < -lead) | (ind >= lead)):
        raise ctx.fail(f"index out of range for extents {list(s[:r])}")
    flat = np.ravel_multi_index(tuple(np.where(ind < 0, ind + lead, ind).reshape(-1, r).T), s[:r])
    data = ctx.b.reshape(ctx.operand(0), (math.prod(s[:r]),) + tuple(s[r:]), ctx.source)
    flat_idx = ctx.b.const(flat.reshape(ind.shape[:-1]).astype(np.int64), source=ctx.source, folded=True)
    return [ctx.add("gather", [data, flat_idx], {"axis": 0})]


def _expand(ctx: OnnxContext) -> list[Value]:
    target = broadcast_shapes(ctx.shape(0), tuple(ctx.ints(1, "shape")), "Expand")
    if target == ctx.shape(0):
        return _alias(ctx)
    return [ctx.add("expand", [ctx.operand(0)], {"to_shape": target})]


def _tile(ctx: OnnxContext) -> list[Value]:
    """``Tile`` as pure data movement: interleave size-1 axes, expand them to the repeats, merge."""
    s = ctx.shape(0)
    reps = ctx.ints(1, "repeats")
    if len(reps) != len(s) or any(r < 1 for r in reps):
        raise ctx.fail(f"repeats {reps} for rank {len(s)}")
    if all(r == 1 for r in reps):
        return _alias(ctx)
    spread = ctx.b.reshape(ctx.operand(0), tuple(d for e in s for d in (1, e)), ctx.source)
    grown = ctx.add("expand", [spread], {"to_shape": tuple(d for r, e in zip(reps, s) for d in (r, e))})
    return [ctx.b.reshape(grown, tuple(r * e for r, e in zip(reps, s)), ctx.source)]


def _repeat_each(ctx: OnnxContext, x: int, shape: tuple[int, ...], factors: list[int]) -> int:
    """Each entry repeated ``factors[i]`` times along axis i (nearest upsampling): exact data movement."""
    spread = ctx.b.reshape(x, tuple(d for e in shape for d in (e, 1)), ctx.source)
    grown = ctx.add("expand", [spread], {"to_shape": tuple(d for f, e in zip(factors, shape) for d in (e, f))})
    return ctx.b.reshape(grown, tuple(f * e for f, e in zip(factors, shape)), ctx.source)


# Integer-factor nearest upsampling reads input index o // f (each entry repeated f times) exactly
# under these (coordinate_transformation_mode, nearest_mode) pairs; the value is the largest factor
# for which that holds (None: any). half_pixel maps o to o // f + ((o % f) + 0.5) / f - 0.5, strictly
# within half a step of o // f, so both round modes land on it; asymmetric maps o to o / f, whose
# halves (f == 2) round down only under round_prefer_floor; align_corners maps o = 2q + r (f == 2) to
# q + (r(n-1) - q) / (2n-1), strictly within half a step of q. Each pair is checked against onnxruntime.
_NEAREST_REPEAT_EXACT: dict[tuple[str, str], int | None] = {
    **{(coord, rounding): None for coord in ("half_pixel", "pytorch_half_pixel", "half_pixel_symmetric")
       for rounding in ("round_prefer_floor", "round_prefer_ceil")},
    ("align_corners", "round_prefer_floor"): 2,
    ("align_corners", "round_prefer_ceil"): 2,
    ("asymmetric", "floor"): None,
    ("asymmetric", "round_prefer_floor"): 2,
}


def _resize(ctx: OnnxContext) -> list[Value]:
    """``Resize``/``Upsample``: nearest mode with integer scale factors (each entry repeated) or
    linear mode (``resize_linear``); the coordinate modes without an exact IR form are refused."""
    s = ctx.shape(0)
    mode = ctx.attr("mode", "nearest")
    legacy = ctx.node.op_type == "Upsample" or ctx.opset == 10  # asymmetric coordinates, scales only
    coord = "asymmetric" if legacy else ctx.attr("coordinate_transformation_mode", "half_pixel")
    if ctx.attr("antialias", 0):
        raise ctx.fail("antialias=1 (an averaging filter when downsampling) is not supported")
    if ctx.attr("axes") is not None:
        raise ctx.fail("the axes attribute is not supported (give scales or sizes for every axis)")
    if ctx.attr("keep_aspect_ratio_policy", "stretch") != "stretch":
        raise ctx.fail(f"keep_aspect_ratio_policy={ctx.attr('keep_aspect_ratio_policy')} (only stretch)")
    scales, sizes = _resize_targets(ctx, s, legacy)
    if mode in ("linear", "bilinear"):
        return _resize_linear(ctx, s, coord, scales, sizes)
    if mode != "nearest":
        raise ctx.fail(f"mode={mode} (nearest with integer scales, or linear)")
    rounding = "floor" if legacy else ctx.attr("nearest_mode", "round_prefer_floor")
    if (coord, rounding) not in _NEAREST_REPEAT_EXACT:
        raise ctx.fail(f"coordinate_transformation_mode={coord} with nearest_mode={rounding} does not repeat "
                       "each entry; exact pairs: " + ", ".join(f"{c}/{r}" for c, r in _NEAREST_REPEAT_EXACT))
    if scales is None:
        if any(i == 0 for i in s):
            raise ctx.fail(f"nearest resize of an empty axis (input shape {list(s)})")
        if any(o % i for o, i in zip(sizes, s)):
            raise ctx.fail(f"sizes {sizes} are not integer multiples of {list(s)}")
        scales = [o / i for o, i in zip(sizes, s)]
    if any(f < 1 or f != int(f) for f in scales):
        raise ctx.fail(f"scales {scales} (only integer upsampling factors are exact)")
    factors = [int(f) for f in scales]
    largest = _NEAREST_REPEAT_EXACT[(coord, rounding)]
    if largest is not None and max(factors) > largest:
        raise ctx.fail(f"coordinate_transformation_mode={coord} with nearest_mode={rounding} repeats each entry "
                       f"only for factors up to {largest}, got {factors}")
    if all(f == 1 for f in factors):
        return _alias(ctx)
    return [_repeat_each(ctx, ctx.operand(0), s, factors)]


def _resize_targets(ctx: OnnxContext, s: tuple[int, ...], legacy: bool) -> tuple[list[float] | None, list[int]]:
    """The ``scales`` (None when ``sizes`` is given) and the output extents, one per axis."""
    if legacy:
        scales = [float(v) for v in np.asarray(ctx.static(1, "scales")).reshape(-1)]
    else:
        scales_in = ctx.needed(2, "scales") if ctx.has_input(2) else None
        scales = [float(v) for v in scales_in.value.reshape(-1)] if scales_in is not None and scales_in.value.size \
            else None
    if scales is None:
        if not ctx.has_input(3):
            raise ctx.fail("neither scales nor sizes is given")
        sizes = [int(v) for v in ctx.ints(3, "sizes")]
        if len(sizes) != len(s):
            raise ctx.fail(f"sizes {sizes} do not give one extent per axis of {list(s)}")
        return None, sizes
    if len(scales) != len(s) or any(not (0 < f < math.inf) for f in scales):
        raise ctx.fail(f"scales {scales} do not give one positive finite factor per axis of {list(s)}")
    return scales, [int(math.floor(i * f)) for i, f in zip(s, scales)]


_LINEAR_COORDINATE_MODES = ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric")


def _resize_linear(ctx: OnnxContext, s: tuple[int, ...], coord: str, scales: list[float] | None,
                   sizes: list[int]) -> list[Value]:
    """Linear mode: the trailing block of axes that change, as one ``resize_linear``. Our source
    coordinates use out/in exactly; a given scale that differs from out/in (a non-integral output
    extent was floored) would move them, so it is refused."""
    if coord not in _LINEAR_COORDINATE_MODES:
        raise ctx.fail(f"linear mode with coordinate_transformation_mode={coord} (supported: "
                       f"{', '.join(_LINEAR_COORDINATE_MODES)})")
    if scales is not None:
        for i, f, o in zip(s, scales, sizes):
            if i == 0:
                raise ctx.fail(f"linear resize of an empty axis (input shape {list(s)})")
            if Fraction(f) != Fraction(o, i):
                raise ctx.fail(f"scale {f} on an axis of extent {i} gives {o} cells, and {o}/{i} is not the "
                               "scale the coordinates use; give sizes instead")
    changed = [a for a, (i, o) in enumerate(zip(s, sizes)) if i != o]
    if not changed:
        return _alias(ctx)
    r = len(s) - changed[0]
    return [ctx.add("resize_linear", [ctx.operand(0)],
                    {"spatial_rank": r, "sizes": tuple(sizes[len(s) - r:]), "coordinate_mode": coord})]


def _depth_space(ctx: OnnxContext) -> list[Value]:
    """``DepthToSpace`` (DCR or CRD) and ``SpaceToDepth`` by the ONNX spec's own definition: a reshape,
    a permutation and a reshape (exact data movement)."""
    s = ctx.shape(0)
    if len(s) != 4:
        raise ctx.fail(f"input rank {len(s)} (expected [N, C, H, W])")
    bs = int(ctx.attr("blocksize"))
    b, c, h, w = s
    mode = ctx.attr("mode", "DCR")  # SpaceToDepth has the attribute from opset 28 on; DCR before
    if mode not in ("DCR", "CRD"):
        raise ctx.fail(f"mode={mode} (DCR or CRD)")
    if bs < 1:
        raise ctx.fail(f"blocksize {bs}")
    if ctx.node.op_type == "SpaceToDepth":
        if h % bs or w % bs:
            raise ctx.fail(f"spatial extents {h}x{w} are not multiples of blocksize {bs}")
        split = (b, c, h // bs, bs, w // bs, bs)
        perm = (0, 1, 3, 5, 2, 4) if mode == "CRD" else (0, 3, 5, 1, 2, 4)
        out = (b, c * bs * bs, h // bs, w // bs)
    else:
        if c % (bs * bs):
            raise ctx.fail(f"{c} channels are not a multiple of blocksize^2 = {bs * bs}")
        if mode == "CRD":
            split, perm = (b, c // (bs * bs), bs, bs, h, w), (0, 1, 4, 2, 5, 3)
        else:
            split, perm = (b, bs, bs, c // (bs * bs), h, w), (0, 3, 4, 1, 5, 2)
        out = (b, c // (bs * bs), h * bs, w * bs)
    moved = ctx.add("permute", [ctx.b.reshape(ctx.operand(0), split, ctx.source)], {"perm": perm})
    return [ctx.b.reshape(moved, out, ctx.source)]


def _trilu(ctx: OnnxContext) -> list[Value]:
    """``Trilu``: keep the entries on and above (upper=1) or below (upper=0) diagonal k of the last two
    axes, zero elsewhere: ``where`` with a mask (multiplying would turn inf * 0 into NaN), constant when
    k is, else the constant column-minus-row offsets compared with k at run time."""
    s = ctx.shape(0)
    if len(s) < 2:
        raise ctx.fail(f"input rank {len(s)} (Trilu needs a matrix)")
    offset = np.arange(s[-1])[None, :] - np.arange(s[-2])[:, None]
    upper = bool(ctx.attr("upper", 1))
    if ctx.has_input(1) and ctx.const(1) is None:  # k computed at run time: the mask compares against it
        if math.prod(ctx.shape(1)) != 1:
            raise ctx.fail(f"k of shape {list(ctx.shape(1))} (a single integer)")
        k = ctx.b.reshape(ctx.operand(1), (), ctx.source)
        mask = ctx.elementwise("ge" if upper else "le", [ctx.b.const(offset, source=ctx.source, folded=True), k])
    else:
        k = int(np.asarray(ctx.static(1, "k")).reshape(-1)[0]) if ctx.has_input(1) else 0
        mask = ctx.b.const(offset >= k if upper else offset <= k, source=ctx.source, folded=True)
    zero = ctx.scalar(0, np.int64 if ctx.dtype(0) == INT64 else bool if ctx.dtype(0) == BOOL else np.float32)
    return [ctx.elementwise("where", [mask, ctx.operand(0), zero])]


def _pad(ctx: OnnxContext) -> list[Value]:
    mode = ctx.attr("mode", "constant")
    if mode != "constant":
        raise ctx.fail(f"mode={mode} (only constant padding is supported)")
    rank = ctx.rank(0)
    if ctx.opset < 11:
        pads, value = list(ctx.attr("pads")), float(ctx.attr("value", 0.0))
        axes = list(range(rank))
    else:
        pads = ctx.ints(1, "pads")
        value = float(np.asarray(ctx.static(2, "constant_value")).reshape(-1)[0]) if ctx.has_input(2) else 0.0
        axes = [ctx.axis(a, rank) for a in ctx.ints(3, "axes")] if ctx.has_input(3) else list(range(rank))
    if len(pads) != 2 * len(axes) or any(p < 0 for p in pads):
        raise ctx.fail(f"pads {pads} (negative pads are not supported)")
    before, after = [0] * rank, [0] * rank
    for i, ax in enumerate(axes):
        before[ax], after[ax] = pads[i], pads[i + len(axes)]
    if not any(before) and not any(after):
        return _alias(ctx)
    return [ctx.add("pad", [ctx.operand(0)], {"pads_before": tuple(before), "pads_after": tuple(after),
                                              "value": value})]


HANDLERS: dict[str, Handler] = {
    "Identity": _alias, "Dropout": _dropout, "Reshape": _reshape, "Flatten": _flatten, "Transpose": _transpose,
    "Squeeze": _squeeze, "Unsqueeze": _unsqueeze, "Concat": _concat, "Split": _split, "Slice": _slice,
    "Gather": _gather, "GatherElements": _gather, "GatherND": _gather_nd, "Expand": _expand, "Pad": _pad, "Tile": _tile,
    "Resize": _resize, "Upsample": _resize, "DepthToSpace": _depth_space, "SpaceToDepth": _depth_space,
    "Trilu": _trilu,
}

# ONNX operator versions each handler implements (see ops_math.OPSETS): Concat-1 (optional axis),
# Split-1 (split as a second input), Tile-1 (tiles/axis inputs) and Upsample before 9 (scales as an
# attribute) have other forms and are reached by upgrading the model.
OPSETS: dict[str, tuple[int, int]] = {
    "Identity": (1, 25), "Dropout": (1, 22), "Reshape": (1, 25), "Flatten": (1, 25), "Transpose": (1, 25),
    "Squeeze": (1, 25), "Unsqueeze": (1, 25), "Concat": (4, 13), "Split": (2, 18), "Slice": (1, 13),
    "Gather": (1, 13), "GatherElements": (11, 13), "GatherND": (11, 13), "Expand": (8, 13), "Pad": (2, 25),
    "Tile": (6, 13), "Resize": (10, 19), "Upsample": (9, 10), "DepthToSpace": (1, 28), "SpaceToDepth": (1, 28),
    "Trilu": (14, 14),
}

EMITS = frozenset({"reshape", "permute", "squeeze", "unsqueeze", "concat", "slice", "gather", "expand", "pad",
                   "const", "resize_linear", "where", "gather_elements"})
