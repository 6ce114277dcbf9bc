"""torchlean.ir.v1 JSON reader and writer (spec sections 1, 3.2 and 4.1-4.3).

Reading follows TorchLean's importer stage by stage (document shape, raw-id discipline, op kinds
and attributes) with its exact messages, and never lets a KeyError or TypeError escape. Our
extensions are read too unless ``strict=True``: ext op kinds, several inputs (``input_ids``),
element types (``dtype``) and provenance (``source``); TorchLean ignores unknown fields.

Raw ids equal our ids: a multi-axis or keepdim ``reduce_sum``/``reduce_mean`` becomes one
``reduce_*_axes`` node instead of TorchLean's lowered chain, so nothing is renumbered.

Writing is deterministic (sorted keys, one node per line, shortest round-trip floats, plain
integers, never NaN or Infinity): the same graph gives byte-identical text.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .check import DEFAULT_MAX_ELEMENTS, mark_well_formed
from .errors import BridgeError, WireError
from .graph import Graph, Node, Source, normalized_attrs
from .fileio import read_capped
from .gcpause import gc_paused
from .ops import ELEMENT_TYPES, FLOAT, REGISTRY, Attr, OpSpec, fmt_shape, numel
from .ops.contracts import MAX_RANK
from .payload import Payload, role_shape

__all__ = ["FORMAT", "load_graph", "parse_document", "loads_document", "dump_graph", "graph_to_wire",
           "dumps_document", "read_tensor"]

FORMAT = "torchlean.ir.v1"
PREFIX = "PyTorch graph import: "
_WIRE_REDUCTIONS = {"reduce_sum": "reduce_sum_axes", "reduce_mean": "reduce_mean_axes"}
_AXES_TO_WIRE = {v: k for k, v in _WIRE_REDUCTIONS.items()}
_INLINE_KINDS = frozenset({"const", "linear", "conv", "layernorm", "batch_norm_eval"})  # may carry payload inline
# payload fields that live inline in a TorchLean node, per kind (spec 3.2), in our role names
_INLINE_ROLES = {
    "linear": {"weight": "weight", "bias": "bias"},
    "conv": {"weight": "weight", "bias": "bias"},
    "layernorm": {"gamma": "weight", "beta": "bias"},
    "batch_norm_eval": {"gamma": "weight", "beta": "bias", "mean": "running_mean", "var": "running_var"},
}


def _fail(msg: str, node: int | None = None) -> WireError:
    return WireError(PREFIX + msg, node=node)


def _render(value: Any) -> str:
    try:
        text = json.dumps(value, allow_nan=True)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _is_nat(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _nat(v: Any, ctx: str) -> int:
    if _is_nat(v):
        return v
    raise _fail(f"{ctx}: expected natural number, got {_render(v)}")


def _field(obj: Mapping[str, Any], key: str, ctx: str) -> Any:
    if key not in obj:
        raise _fail(f"{ctx}: missing field `{key}`")
    return obj[key]


def _array(v: Any, ctx: str) -> list:
    if not isinstance(v, list):
        raise _fail(f"{ctx}: expected array, got {_render(v)}")
    return v


def _nats(v: Any, ctx: str) -> tuple[int, ...]:
    if type(v) is list:  # fast path for 10^6-node documents: all exact ints (no bools), none negative
        t = tuple(v)
        if not t or (set(map(type, t)) == {int} and min(t) >= 0):
            return t
    return tuple(_nat(x, ctx) for x in _array(v, ctx))


def _shape(v: Any, ctx: str, max_elements: int) -> tuple[int, ...]:
    s = _nats(v, ctx)
    if len(s) > MAX_RANK:
        raise _fail(f"{ctx}: declared shape has rank {len(s)}, above the limit of {MAX_RANK}")
    if numel(s) > max_elements:
        raise _fail(f"{ctx}: declared shape {fmt_shape(s)} has {numel(s)} elements, above the limit of "
                    f"{max_elements}")
    if any(d > max_elements for d in s):  # even next to a 0 extent: numpy cannot lay such an array out
        raise _fail(f"{ctx}: declared shape {fmt_shape(s)} has an extent above the limit of {max_elements}")
    return s


def _number(v: Any, ctx: str) -> float:
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
        return float(v)
    raise _fail(f"{ctx}: expected number, got {_render(v)}")


def _decode_attr(a: Attr, v: Any, ctx: str, max_elements: int) -> Any:
    k = a.kind
    if k == "nat":
        return _nat(v, ctx)
    if k == "nats":
        return _nats(v, ctx)
    if k == "shape":
        return _shape(v, ctx, max_elements)
    if k == "shapes":
        return tuple(_shape(s, ctx, max_elements) for s in _array(v, ctx))
    if k == "int":
        if isinstance(v, int) and not isinstance(v, bool):
            return v
        raise _fail(f"{ctx}: expected integer, got {_render(v)}")
    if k == "ints":
        return tuple(_decode_attr(Attr(a.name, "int"), x, ctx, max_elements) for x in _array(v, ctx))
    if k == "bool":
        if isinstance(v, bool):
            return v
        raise _fail(f"{ctx}: expected boolean, got {_render(v)}")
    if k == "bools":
        return tuple(_decode_attr(Attr(a.name, "bool"), x, ctx, max_elements) for x in _array(v, ctx))
    if k == "float":
        return _number(v, ctx)
    if k == "opt_float":
        return None if v is None else _number(v, ctx)
    if k == "str":
        if not isinstance(v, str):
            raise _fail(f"{ctx}: expected string, got {_render(v)}")
        if a.choices and v not in a.choices:
            raise _fail(f"{ctx}: expected one of {', '.join(a.choices)}, got {_render(v)}")
        return v
    raise AssertionError(k)


def _decode_attrs(spec: OpSpec, raw: Mapping[str, Any], nid: int, max_elements: int) -> dict[str, Any]:
    attrs: dict[str, Any] = {}
    for a in spec.attrs:
        ctx = f"node[{nid}].{a.name}"
        if a.name not in raw:
            if a.required:
                raise _fail(f"node[{nid}]: missing field `{a.name}`", nid)
            continue
        attrs[a.name] = _decode_attr(a, raw[a.name], ctx, max_elements)
    for a in spec.attrs:
        if a.length_of and a.name in attrs:
            want, got = attrs[a.length_of], len(attrs[a.name])
            if got != want:
                raise _fail(f"node[{nid}].{a.name}: expected {want} entries, got {got}", nid)
    return attrs


def _leaves(value: Any, shape: tuple[int, ...], ctx: str) -> list:
    """The numbers of a nested list that exactly matches ``shape``, row-major; JSON numbers only
    (a bool or a string is not a number, whatever numpy would make of it)."""
    level = [value]
    for extent in shape:
        nxt: list = []
        for row in level:
            if not isinstance(row, list) or len(row) != extent:
                raise _fail(f"{ctx}: tensor does not match {fmt_shape(shape)}")
            nxt.extend(row)
        level = nxt
    for x in level:
        if type(x) is not float and type(x) is not int:
            raise _fail(f"{ctx}: tensor entries must be numbers, got {_render(x)}")
    return level


def read_tensor(value: Any, shape: Sequence[int], ctx: str) -> np.ndarray:
    """TorchLean's ``parseTensor``: nested lists exactly matching ``shape``, finite numbers."""
    shape = tuple(shape)
    leaves = _leaves(value, shape, ctx)
    try:
        arr = np.array(leaves, dtype=np.float64).reshape(shape)
    except OverflowError:
        raise _fail(f"{ctx}: tensor contains NaN or Infinity") from None
    if not np.all(np.isfinite(arr)):
        raise _fail(f"{ctx}: tensor contains NaN or Infinity")
    return arr


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _unique_names(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        twice = next(k for k, _ in pairs if k in seen or seen.add(k))
        ids = {v for k, v in pairs if k == "id" and type(v) is int}
        where = f" (node[{ids.pop()}])" if len(ids) == 1 else ""
        raise ValueError(f"the name {twice!r:.80} appears twice in one object{where}")
    return out


# json.loads arguments for documents read from outside: no NaN/Infinity, no name twice in an object
# (JSON leaves a repeated name's meaning open; keeping the last would let a second value override
# the first unseen)
STRICT_JSON: dict[str, Any] = {"parse_constant": _no_constant, "object_pairs_hook": _unique_names}


def loads_document(text: str | bytes) -> Any:
    """``json.loads`` that rejects NaN/Infinity and a name repeated in any object (top level, nodes,
    attributes), and turns every failure into a WireError. Inside values the check is a ``dict`` build and
    a length comparison per object (about 0.3 s of CPU per 10^6 nodes, measured on bench/scale_bench.py's
    chain)."""
    try:
        if isinstance(text, (bytes, bytearray)):
            text = text.decode(json.detect_encoding(text), "surrogatepass")
        return _top_level_unique(text)
    except RecursionError:
        raise _fail("document is nested too deeply") from None
    except MemoryError:  # within the size cap, but a document of tiny values takes ~20 bytes per byte
        raise _fail(f"the document ({len(text)} bytes) needs more memory to parse than is available") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise _fail(f"invalid JSON: {e}") from None


_DECODER = json.JSONDecoder(parse_constant=_no_constant, object_pairs_hook=_unique_names)
_SPACE = json.decoder.WHITESPACE.match


def _top_level_unique(text: str) -> Any:
    """The document parsed once: a top-level object's names read here (a repeat is refused), each
    value by the C decoder; anything else as ``json.loads``."""
    i = _SPACE(text, 0).end()
    if not text.startswith("{", i):
        return _DECODER.decode(text)
    out: dict[str, Any] = {}
    i = _SPACE(text, i + 1).end()
    while not text.startswith("}", i) or out:
        if not text.startswith('"', i):
            raise ValueError(f"expecting a property name enclosed in double quotes at char {i}")
        key, i = json.decoder.scanstring(text, i + 1)
        i = _SPACE(text, i).end()
        if not text.startswith(":", i):
            raise ValueError(f"expecting ':' at char {i}")
        value, i = _DECODER.raw_decode(text, _SPACE(text, i + 1).end())
        if key in out:
            raise ValueError(f"the name {key!r:.80} appears twice in one object")
        out[key] = value
        i = _SPACE(text, i).end()
        if text.startswith(",", i):
            i = _SPACE(text, i + 1).end()
            continue
        if not text.startswith("}", i):
            raise ValueError(f"expecting ',' or '}}' at char {i}")
        break
    i = _SPACE(text, i + 1).end()
    if i != len(text):
        raise ValueError(f"extra data at char {i}")
    return out


# -- reading ----------------------------------------------------------------------------------
#
# Each stage checks every node before the next stage starts, so the first problem reported is the one
# TorchLean's importer reports. A node is carried between stages as the tuple
# ``(id, parents, kind, shape, raw)``; the per-node work is written for 10^6-node documents: exact-int
# lists are checked without building messages, each distinct shape is validated once, each kind's
# registry decision is made once, and messages are built only when a check fails.

_ID, _PARENTS, _KIND, _SHAPE, _RAW = range(5)
_INT_TYPE = {int}


def _plain_nats(v: Any) -> tuple[int, ...] | None:
    """``v`` as a tuple when it is a list of exact non-negative ints (no bools), else None: the cheap
    check for the common case; ``_nats`` then reports what is wrong."""
    if type(v) is not list:
        return None
    t = tuple(v)
    if len(t) == 1:
        x = t[0]
        return t if type(x) is int and x >= 0 else None
    return t if not t or (set(map(type, t)) == _INT_TYPE and min(t) >= 0) else None


def _stage_a_node(raw: Any, max_elements: int) -> tuple:
    """One node's document-level fields, checked in TorchLean's order with its messages."""
    if not isinstance(raw, dict):
        raise _fail(f"node: expected object, got {_render(raw)}")
    nid = _nat(_field(raw, "id", "node"), "node.id")
    ctx = f"node[{nid}]"
    parents = _nats(_field(raw, "parents", ctx), f"{ctx}.parents")
    kind = _field(raw, "kind", ctx)
    if not isinstance(kind, str):
        raise _fail(f"{ctx}.kind: expected string, got {_render(kind)}")
    vk = raw.get("value_kind", "tensor")
    if vk != "tensor":
        if vk == "tuple":
            raise _fail(f"{ctx}: tuple-valued nodes (`{kind}`) are not supported; export the model with "
                        f"tensor outputs", nid)
        raise _fail(f"{ctx}: unsupported value_kind `{_render(vk) if not isinstance(vk, str) else vk}`", nid)
    shape = _shape(_field(raw, "shape", ctx), f"{ctx}.shape", max_elements)
    return nid, tuple(map(int, parents)), kind, tuple(map(int, shape)), raw  # exact ints, as Node keeps them


def _stage_a(doc: Any, max_elements: int) -> tuple[Any, list[tuple], list]:
    if not isinstance(doc, dict):
        raise _fail(f"root: expected object, got {_render(doc)}")
    fmt = _field(doc, "format", "root")
    if not isinstance(fmt, str):
        raise _fail(f"root.format: expected string, got {_render(fmt)}")
    if fmt != FORMAT:
        raise _fail(f"unsupported format `{fmt}` (expected `{FORMAT}`)")
    _nat(_field(doc, "input_id", "root"), "root.input_id")
    outputs = _array(_field(doc, "output_ids", "root"), "root.output_ids")
    for o in outputs:
        _nat(o, "root.output_ids")
    if not outputs:
        raise _fail("root.output_ids must contain at least one output")
    nodes = _array(_field(doc, "nodes", "root"), "root.nodes")
    parsed = []
    shapes: dict[tuple[int, ...], tuple[int, ...]] = {}  # each distinct declared shape, validated once
    kinds: dict[str, str] = {}  # one string object per kind
    for raw in nodes:
        if type(raw) is dict and raw.get("value_kind", "tensor") == "tensor":
            nid, kind = raw.get("id"), raw.get("kind")
            parents, shape = _plain_nats(raw.get("parents")), _plain_nats(raw.get("shape"))
            if type(nid) is int and nid >= 0 and type(kind) is str and parents is not None and shape is not None:
                known = shapes.get(shape)
                if known is None:
                    known = shapes[shape] = _shape(list(shape), f"node[{nid}].shape", max_elements)
                parsed.append((nid, parents, kinds.setdefault(kind, kind), known, raw))
                continue
        parsed.append(_stage_a_node(raw, max_elements))
    return doc, parsed, outputs


def _stage_b(doc: dict, parsed: list[tuple], outputs: list, strict: bool) -> tuple[list[int], list[int]]:
    if not parsed:
        raise _fail("graph contains no nodes")
    for i, n in enumerate(parsed):
        if n[_ID] != i:
            raise _fail(f"raw id discipline violated at index {i}: nodes[{i}].id = {n[_ID]}")
        for p in n[_PARENTS]:
            if not p < i:
                raise _fail(f"node[{i}]: parent id {p} is not < {i}", i)
    input_nodes = [n[_ID] for n in parsed if n[_KIND] == "input"]
    if not strict and "input_ids" in doc:
        inputs = list(_nats(doc["input_ids"], "root.input_ids"))
    else:
        if len(input_nodes) != 1:
            raise _fail(f"expected exactly one input node, got {len(input_nodes)}")
        inputs = [doc["input_id"]]
    for nid in inputs + list(outputs):
        if nid >= len(parsed):
            raise _fail(f"raw node id {nid} out of bounds")
    for nid in inputs:
        if parsed[nid][_KIND] != "input":
            raise _fail(f"input_id {nid} designates `{parsed[nid][_KIND]}`, not `input`")
    return inputs, list(outputs)


def _reduction(n: tuple, parsed: list[tuple], max_elements: int) -> tuple[str, dict]:
    nid, parents, kind, shape, raw = n
    ctx = f"node[{nid}]"
    if len(parents) != 1:
        raise _fail(f"{ctx}: reduction expects one tensor parent", nid)
    pshape = parsed[parents[0]][_SHAPE]
    axes = _nats(_field(raw, "axes", ctx), f"{ctx}.axes")
    keepdim = _field(raw, "keepdim", ctx)
    if not isinstance(keepdim, bool):
        raise _fail(f"{ctx}.keepdim: expected boolean, got {_render(keepdim)}", nid)
    for a in axes:
        if a >= len(pshape):
            raise _fail(f"{ctx}: reduction axis is outside rank {len(pshape)}", nid)
    if len(set(axes)) != len(axes):
        raise _fail(f"{ctx}: reduction axes contain duplicates", nid)
    computed = tuple(1 if i in axes else d for i, d in enumerate(pshape)) if keepdim else \
        tuple(d for i, d in enumerate(pshape) if i not in axes)
    if computed != shape:
        raise _fail(f"{ctx}: reduction shape mismatch: computed {fmt_shape(computed)}, "
                    f"declared {fmt_shape(shape)}", nid)
    if len(axes) == 1 and not keepdim:
        return kind, {"axis": axes[0]}
    return _WIRE_REDUCTIONS[kind], {"axes": tuple(axes), "keepdim": keepdim}


def _readable_spec(kind: str, nid: int, strict: bool) -> OpSpec:
    """The registry entry of a node kind this reader accepts (in this mode), else the refusal."""
    ctx = f"node[{nid}]"
    spec = REGISTRY.get(kind)
    if spec is None or spec.dialect == "v1-wire" or (strict and spec.dialect != "v1"):
        raise _fail(f"{ctx}: unsupported TorchLean IR op kind `{kind}`", nid)
    if strict and kind == "custom":
        raise _fail(f"{ctx}: custom computations need a checked Lean body", nid)
    if strict and kind == "hard_masked_softmax":
        raise _fail(f"{ctx}: `hard_masked_softmax` has no artifact encoding for its mask yet", nid)
    return spec


def _node_source(raw: dict, ctx: str, nid: int, strict: bool) -> Source | None:
    if not strict and isinstance(raw.get("source"), dict):
        try:
            return Source.from_json(raw["source"])
        except WireError as e:
            raise _fail(f"{ctx}.{e.message}", nid) from None
    if isinstance(raw.get("debug_target"), str) or isinstance(raw.get("onnx_name"), str):
        return Source(framework="torchlean", name=raw.get("onnx_name"),
                      target=raw.get("debug_target") or raw.get("onnx_op_type"))
    return None


def _stage_c(parsed: list[tuple], strict: bool, max_elements: int) -> list[Node]:
    specs: dict[str, OpSpec] = {}  # kinds already accepted
    return [_stage_c_node(n, parsed, strict, max_elements, specs) for n in parsed]


def _stage_c_node(n: tuple, parsed: Sequence[tuple] | Mapping[int, tuple], strict: bool, max_elements: int,
                  specs: dict[str, OpSpec]) -> Node:
    """One node's kind, attributes, element type and source (``parsed`` gives its parents' shapes)."""
    nid, parents, kind, shape, raw = n
    if kind in _WIRE_REDUCTIONS:
        kind, decoded = _reduction(n, parsed, max_elements)
        attrs = normalized_attrs(kind, decoded, shape)
    else:
        spec = specs.get(kind)
        if spec is None:
            spec = specs[kind] = _readable_spec(kind, nid, strict)
        if spec.attrs or kind == "const":
            attrs = normalized_attrs(kind, _decode_attrs(spec, raw, nid, max_elements), shape)
        else:
            attrs = {}
    if len(raw) == 4:  # only stage A's fields: no dtype, no source
        return Node.from_normal_form(nid, parents, kind, shape, attrs)
    dtype = raw.get("dtype", FLOAT)
    if strict:
        dtype = FLOAT
    elif dtype not in ELEMENT_TYPES:
        raise _fail(f"node[{nid}].dtype: expected one of {', '.join(ELEMENT_TYPES)}, got {_render(dtype)}", nid)
    source = _node_source(raw, f"node[{nid}]", nid, strict)
    return Node.from_normal_form(nid, parents, kind, shape, attrs, dtype, source)


def _grouped(dense: np.ndarray, groups: int) -> np.ndarray:
    """Dense ``[O, I, *k]`` (zeros off the diagonal blocks) to grouped ``[O, I/groups, *k]``."""
    o, i, kernel = dense.shape[0], dense.shape[1], dense.shape[2:]
    blocks = dense.reshape((groups, o // groups, groups, i // groups) + kernel)
    diagonal = blocks[np.arange(groups), :, np.arange(groups)]  # [g, O/g, I/g, *k]
    return diagonal.reshape((o, i // groups) + kernel)


def _dense(grouped: np.ndarray, groups: int, in_channels: int) -> np.ndarray:
    """Grouped ``[O, I/groups, *k]`` to dense ``[O, I, *k]``, the v1 wire layout."""
    o, ig, kernel = grouped.shape[0], grouped.shape[1], grouped.shape[2:]
    dense = np.zeros((groups, o // groups, groups, ig) + kernel)
    dense[np.arange(groups), :, np.arange(groups)] = grouped.reshape((groups, o // groups, ig) + kernel)
    return dense.reshape((o, in_channels) + kernel)


def _conv_geometry(node: Node, ctx: str, max_elements: int) -> None:
    """What reading an inline conv weight needs before any array is built (the rest is check()'s)."""
    a, nid = node.attrs, node.id
    if a["in_channels"] == 0:
        raise _fail(f"{ctx}: convolution input channels must be nonzero", nid)
    g = a["groups"]
    if g == 0 or a["in_channels"] % g or a["out_channels"] % g:
        raise _fail(f"{ctx}: groups {g} must be > 0 and divide in_channels {a['in_channels']} and out_channels "
                    f"{a['out_channels']}", nid)
    dense = (a["out_channels"], a["in_channels"], *a["kernel"])
    if numel(dense) > max_elements:
        raise _fail(f"{ctx}.weight: dense weight shape {fmt_shape(dense)} has {numel(dense)} elements, above "
                    f"the limit of {max_elements}", nid)


def _inline_payload(raws: Sequence[Any], nodes: list[Node], max_elements: int) -> Payload:
    """TorchLean's ``parsePayload``: linear, conv, const values, layernorm, batch_norm_eval.

    Role shapes come from the registry's ParamRole; linear records carry their own dimensions
    (TorchLean's ``LinearWB``), which evaluation then checks against the node."""
    payload = Payload()
    for raw, node in zip(raws, nodes):
        kind = node.kind
        if kind not in _INLINE_KINDS or raw is None:  # None: a four-field node the one pass consumed
            continue
        nid = node.id
        ctx = f"node[{nid}]"
        parents = [nodes[p].out_shape for p in node.parents]
        if kind == "const" and "values" in raw:
            vals = read_tensor(_array(raw["values"], f"{ctx}.values"), (numel(node.out_shape),), f"{ctx}.values")
            payload.set(nid, "values", vals.reshape(node.out_shape))
        elif kind == "linear" and ("weight" in raw or "out_dim" in raw):
            out_dim = _nat(_field(raw, "out_dim", ctx), f"{ctx}.out_dim")
            in_dim = _nat(_field(raw, "in_dim", ctx), f"{ctx}.in_dim")
            payload.set(nid, "weight", read_tensor(_field(raw, "weight", ctx), (out_dim, in_dim), f"{ctx}.weight"))
            payload.set(nid, "bias", read_tensor(_field(raw, "bias", ctx), (out_dim,), f"{ctx}.bias"))
        elif kind == "conv" and "weight" in raw:
            a = node.attrs
            _conv_geometry(node, ctx, max_elements)
            grouped = role_shape(node, "weight", parents)
            dense = read_tensor(raw["weight"], (grouped[0], a["in_channels"], *grouped[2:]), f"{ctx}.weight")
            grouped_weight = _grouped(dense, a["groups"])
            if a["groups"] > 1 and not np.array_equal(_dense(grouped_weight, a["groups"], a["in_channels"]), dense):
                raise _fail(f"{ctx}.weight: a grouped convolution's dense weight has nonzero entries outside its "
                            f"groups' diagonal blocks", nid)
            payload.set(nid, "weight", grouped_weight)
            payload.set(nid, "bias", read_tensor(_field(raw, "bias", ctx), role_shape(node, "bias", parents),
                                                 f"{ctx}.bias"))
            if "input_spatial" in raw and node.parents:
                spatial = _nats(raw["input_spatial"], f"{ctx}.input_spatial")
                parent = parents[0][a["channel_axis"] + 1:]
                if spatial != tuple(parent):
                    raise _fail(f"{ctx}.input_spatial: payload input shape {fmt_shape(spatial)} does not match "
                                f"parent shape {fmt_shape(parent)}", nid)
        elif kind in ("layernorm", "batch_norm_eval") and any(k in raw for k in _INLINE_ROLES[kind]):
            if kind == "layernorm" and (len(parents) != 1 or node.attrs["axis"] > len(parents[0])):
                raise _fail(f"{ctx}: layernorm payload needs one parent with axis {node.attrs['axis']} within "
                            f"its rank", nid)
            if kind == "batch_norm_eval":
                channels = _nat(_field(raw, "channels", ctx), f"{ctx}.channels")
                if channels != node.attrs["channels"]:
                    raise _fail(f"{ctx}.channels: payload has {channels} channels, the node {node.attrs['channels']}",
                                nid)
            for field, role in _INLINE_ROLES[kind].items():
                payload.set(nid, role, read_tensor(_field(raw, field, ctx), role_shape(node, role, parents),
                                                   f"{ctx}.{field}"))
    return payload


@gc_paused
def parse_document(doc: Any, *, strict: bool = False,
                   max_elements: int = DEFAULT_MAX_ELEMENTS) -> tuple[Graph, Payload]:
    """A wire document (already decoded JSON) to a graph and its inline payload (maybe empty).

    A document without any problem is read in one pass (``_one_pass``); at the first sign of one, the
    staged reader runs from the start, so the error reported is the one TorchLean's importer reports."""
    return _parse(doc, strict, max_elements, None)


def _parse(doc: Any, strict: bool, max_elements: int, decode_again: Callable[[], Any] | None
           ) -> tuple[Graph, Payload]:
    """``parse_document``; with ``decode_again`` (a reader that decoded ``doc`` itself and can do it
    again) the one pass drops each plain node's JSON as it builds the node, so the nodes reuse that
    memory, and a fallback to the staged reader starts from a fresh decode."""
    fast = _one_pass(doc, strict, max_elements, consume=decode_again is not None)
    if fast is not None:
        raws, nodes, inputs, outputs, structure_checked = fast
        g = Graph(nodes, inputs, outputs)
        if structure_checked:
            mark_well_formed(g)
        return g, _inline_payload(raws, nodes, max_elements)
    if decode_again is not None:
        doc = decode_again()
    doc, parsed, outputs = _stage_a(doc, max_elements)
    inputs, outputs = _stage_b(doc, parsed, outputs, strict)
    nodes = _stage_c(parsed, strict, max_elements)
    return Graph(nodes, inputs, outputs), _inline_payload([n[_RAW] for n in parsed], nodes, max_elements)


class _Staged(Exception):
    """A node the one-pass reader leaves to the staged reader (which reports its problem in order)."""


def _one_pass(doc: Any, strict: bool, max_elements: int, consume: bool = False) -> tuple | None:
    """``(raws, nodes, inputs, outputs, structure_checked)`` read in one pass over the nodes, or None
    when anything is wrong (or unusual enough to need the staged reader to say what).

    It accepts only what the staged reader accepts and builds the same nodes: the document fields,
    then per node the id discipline, parents below, the declared shape (each distinct one validated
    once) and the kind (each decided once; nodes with attributes, element types or sources, and
    reductions go through the staged per-node functions). It also counts parents against each kind's
    arity and looks for unlisted input nodes, so that a graph passing both needs no separate structure
    scan (``structure_checked``; ``check_well_formed`` reports anything else in its own order).
    ``consume``: replace each plain node's JSON object in ``doc`` by None once its node is built
    (plain nodes carry no payload, so the returned ``raws`` still hold every object the payload reads)."""
    if not (type(doc) is dict and doc.get("format") == FORMAT and type(doc.get("nodes")) is list):
        return None
    raws, outputs = doc["nodes"], doc.get("output_ids")
    if type(doc.get("input_id")) is not int or doc["input_id"] < 0 or _plain_nats(outputs) is None or not outputs \
            or not raws:
        return None
    nodes: list[Node] = []
    append, new, set_dict, node_type, float_type = nodes.append, object.__new__, object.__setattr__, Node, FLOAT
    shapes: dict[tuple[int, ...], tuple[int, ...]] = {}
    plain: dict[str, tuple[str, int, int | None] | None] = {}  # kind -> (kind, arity bounds) if attribute-free
    arity_ok, input_nodes = True, []
    try:
        for i, raw in enumerate(raws):
            try:
                if type(raw) is not dict or len(raw) != 4:
                    raise _Staged
                nid, kind, parents, shape = raw.get("id"), raw.get("kind"), raw.get("parents"), raw.get("shape")
                if nid != i or type(nid) is not int or type(kind) is not str or type(parents) is not list \
                        or type(shape) is not list:
                    return None
                parents = tuple(parents)
                if len(parents) == 1:
                    p = parents[0]
                    if type(p) is not int or not 0 <= p < i:
                        return None
                elif parents and not (set(map(type, parents)) == _INT_TYPE and min(parents) >= 0 and max(parents) < i):
                    return None
                shape = tuple(shape)
                if len(shape) == 1:
                    if type(shape[0]) is not int or shape[0] < 0:
                        return None
                elif shape and not (set(map(type, shape)) == _INT_TYPE and min(shape) >= 0):
                    return None
                known = shapes.get(shape)
                if known is None:
                    known = shapes[shape] = _shape(list(shape), f"node[{i}].shape", max_elements)
                entry = plain.get(kind, _UNSEEN)
                if entry is _UNSEEN:
                    entry = plain[kind] = _plain_kind(kind, i, strict)
                if entry is None:
                    raise _Staged
                kind, low, high = entry
                if len(parents) < low or (high is not None and len(parents) > high):
                    arity_ok = False
                if kind == "input":
                    input_nodes.append(i)
                node = new(node_type)  # Node.from_normal_form, inlined: 10^6 calls
                set_dict(node, "__dict__", {"id": i, "parents": parents, "kind": kind, "out_shape": known,
                                            "attrs": {}, "dtype": float_type, "source": None})
                append(node)
                if consume:
                    raws[i] = None
                continue
            except _Staged:
                pass
            node = _one_node(raw, i, nodes, strict, max_elements)  # attributes, dtype, source, reductions
            arity_ok = arity_ok and node.spec.accepts_parents(len(node.parents))
            if node.kind == "input":
                input_nodes.append(i)
            append(node)
    except (WireError, _Staged):
        return None
    n = len(nodes)
    if not strict and "input_ids" in doc:
        inputs = _plain_nats(doc["input_ids"])
        if inputs is None:
            return None
        inputs = list(inputs)
    else:
        if len(input_nodes) != 1:
            return None
        inputs = [doc["input_id"]]
    if any(k >= n for k in inputs) or any(k >= n for k in outputs) or any(nodes[k].kind != "input" for k in inputs):
        return None
    structure_checked = arity_ok and set(input_nodes) <= set(inputs)
    return raws, nodes, inputs, list(outputs), structure_checked


_UNSEEN = object()




def _plain_kind(kind: str, nid: int, strict: bool) -> tuple[str, int, int | None] | None:
    """``(kind, min parents, max parents)`` for a kind whose four-field nodes the one-pass reader
    builds itself (accepted here, no attributes, not a wire reduction), else None."""
    if kind in _WIRE_REDUCTIONS:
        return None
    spec = _readable_spec(kind, nid, strict)  # a refusal is the staged reader's to report
    if spec.attrs or kind == "const":
        return None
    return sys.intern(kind), spec.min_parents, spec.max_parents


def _one_node(raw: Any, i: int, nodes: list[Node], strict: bool, max_elements: int) -> Node:
    """Node ``i`` through the staged per-node functions (stage A's fields, stage B's id and parent
    discipline, stage C's kind and attributes), raising on any problem."""
    n = _stage_a_node(raw, max_elements)
    if n[_ID] != i or any(not p < i for p in n[_PARENTS]):
        raise _Staged
    # what stage C reads of other nodes: a reduction's parent shape
    parsed = {p: (p, nodes[p].parents, nodes[p].kind, nodes[p].out_shape, None) for p in n[_PARENTS]}
    return _stage_c_node(n, parsed, strict, max_elements, {})


@gc_paused
def load_graph(source: Any, *, strict: bool = False, max_elements: int = DEFAULT_MAX_ELEMENTS) -> Graph:
    """Parse a torchlean.ir.v1 document (path, JSON text, bytes or dict) and check its structure."""
    from .check import check_well_formed
    if isinstance(source, dict):
        g, _ = parse_document(source, strict=strict, max_elements=max_elements)
    else:
        text = _source_text(source)
        g, _ = _parse(loads_document(text), strict, max_elements, lambda: loads_document(text))
    check_well_formed(g)
    return g


def _read_source(source: Any) -> Any:
    return source if isinstance(source, dict) else loads_document(_source_text(source))


def _source_text(source: Any) -> str | bytes:
    """The document text of a source that is not already decoded: bytes, JSON text or a path."""
    if isinstance(source, (bytes, bytearray)):
        return bytes(source)
    if isinstance(source, str) and source.lstrip().startswith("{"):
        return source
    return read_capped(source, "graph document")


# -- writing ----------------------------------------------------------------------------------

def _encode_attr(a: Attr, v: Any) -> Any:
    if v is None:
        return None
    if a.kind in ("nats", "ints", "shape", "bools"):
        return list(v)
    if a.kind == "shapes":
        return [list(s) for s in v]
    if a.kind in ("float", "opt_float"):
        f = float(v)
        if not math.isfinite(f):
            raise BridgeError(f"attribute {a.name} = {v} cannot be written as JSON")
        return f
    return v


def _tensor_json(a: np.ndarray) -> Any:
    a = np.asarray(a, dtype=np.float64)
    if not np.all(np.isfinite(a)):
        raise BridgeError("payload tensor contains NaN or Infinity, which JSON cannot hold")
    return a.tolist()


def _node_wire_named(node: Node, g: Graph, payload: Payload | None, include_source: bool) -> dict[str, Any]:
    """``_node_wire``, its refusals (a non-finite attribute or payload entry) naming the node."""
    try:
        return _node_wire(node, g, payload, include_source)
    except BridgeError as e:
        if e.node is not None:
            raise
        raise BridgeError(f"node {node.id} ({node.kind}): {e.message}", node=node.id, op=node.kind,
                          source=str(node.source) if node.source else None) from None


def _node_wire(node: Node, g: Graph, payload: Payload | None, include_source: bool) -> dict[str, Any]:
    d: dict[str, Any] = {"id": node.id, "kind": node.kind, "parents": list(node.parents),
                         "shape": list(node.out_shape)}
    if not node.attrs and node.dtype == FLOAT and node.source is None and payload is None \
            and node.kind not in _WIRE_REDUCTIONS and node.kind not in _AXES_TO_WIRE:
        return d  # most nodes of a long graph: nothing more to write
    spec = node.spec
    if node.kind in _WIRE_REDUCTIONS:
        d.update(axes=[node.attrs["axis"]], keepdim=False)
    elif node.kind in _AXES_TO_WIRE:
        d.update(kind=_AXES_TO_WIRE[node.kind], axes=list(node.attrs["axes"]), keepdim=node.attrs["keepdim"])
    elif spec is not None:
        for a in spec.attrs:
            if a.name in node.attrs:
                v = _encode_attr(a, node.attrs[a.name])
                if v is not None:
                    d[a.name] = v
    if node.dtype != FLOAT:
        d["dtype"] = node.dtype
    if include_source and node.source is not None and node.source.to_json():
        d["source"] = node.source.to_json()
    if payload is not None:
        d.update(_inline_fields(node, g, payload))
    return d


def _inline_fields(node: Node, g: Graph, payload: Payload) -> dict[str, Any]:
    rec = payload.record(node.id)
    if not rec:
        return {}
    kind, a = node.kind, node.attrs
    if kind == "const":
        return {"values": _tensor_json(rec["values"].reshape(-1))}
    if kind == "linear":
        w = rec["weight"]
        return {"out_dim": int(w.shape[0]), "in_dim": int(w.shape[1]), "weight": _tensor_json(w),
                "bias": _tensor_json(rec["bias"])}
    if kind == "conv":
        w = np.asarray(rec["weight"], dtype=np.float64)
        pshape = g.nodes[node.parents[0]].out_shape
        return {"weight": _tensor_json(_dense(w, a["groups"], a["in_channels"])), "bias": _tensor_json(rec["bias"]),
                "input_spatial": list(pshape[a["channel_axis"] + 1:])}
    if kind in _INLINE_ROLES:
        out: dict[str, Any] = {}
        if kind == "batch_norm_eval":
            out["channels"] = a["channels"]
        for field, role in _INLINE_ROLES[kind].items():
            if role in rec:
                out[field] = _tensor_json(rec[role])
            elif kind == "layernorm":
                shape = role_shape(node, role, [g.nodes[p].out_shape for p in node.parents])
                out[field] = _tensor_json(np.ones(shape) if role == "weight" else np.zeros(shape))
        return out
    return {}


@gc_paused
def graph_to_wire(g: Graph, payload: Payload | None = None, *, include_source: bool = True) -> dict[str, Any]:
    """The wire document: nodes only, or with payload inline (TorchLean's own importer form)."""
    doc: dict[str, Any] = {"format": FORMAT, "input_id": g.inputs[0] if g.inputs else 0,
                           "output_ids": list(g.outputs)}
    if len(g.inputs) != 1:
        doc["input_ids"] = list(g.inputs)
    if payload is not None:
        _check_inline_size(g, payload)
    doc["nodes"] = [_node_wire_named(n, g, payload, include_source) for n in g.nodes]
    return doc


# an inline payload of more numbers than this (each at least "0.0, ") makes a document above the
# readers' 1 GiB cap (fileio.MAX_DOCUMENT_BYTES)
MAX_INLINE_NUMBERS = (1 << 30) // 5


def _check_inline_size(g: Graph, payload: Payload) -> None:
    """Count the numbers an inline payload writes (grouped conv weights dense, as v1 lays them out)
    before any is built: a document no reader would accept is refused with the way out."""
    total = 0
    for nid in payload.nodes():
        node = g.nodes[nid] if 0 <= nid < len(g.nodes) else None
        for role, arr in payload.record(nid).items():
            n = int(np.size(arr))
            if node is not None and node.kind == "conv" and role == "weight":
                n *= int(node.attrs["groups"])  # [out, in/groups, *k] written as [out, in, *k]
            total += n
    if total > MAX_INLINE_NUMBERS:
        raise BridgeError(f"torchlean.ir.v1 export: an inline payload would write {total} numbers (grouped "
                          f"convolutions' weights dense, as v1 lays them out), a document above the 1 GiB that "
                          f"readers accept; write the payload to a companion file instead (inline_payload=False, "
                          f"the CLI's default without --inline-payload)")


@gc_paused
def dump_graph(g: Graph, *, include_source: bool = True) -> dict[str, Any]:
    """Wire dict, nodes only (no tensors)."""
    return graph_to_wire(g, None, include_source=include_source)


def _plain_node_text(n: Any) -> str | None:
    """The encoder's text for a node of only ``id``, ``kind``, ``parents`` and ``shape`` (exact ints and a
    string: most nodes of a long graph), formatted directly; None for any other node."""
    if type(n) is not dict or len(n) != 4:
        return None
    nid, kind, parents, shape = n.get("id"), n.get("kind"), n.get("parents"), n.get("shape")
    if type(nid) is not int or type(kind) is not str or _plain_nats(parents) is None or _plain_nats(shape) is None:
        return None
    return (f'{{"id": {nid}, "kind": {json.encoder.encode_basestring_ascii(kind)}, '
            f'"parents": [{", ".join(map(str, parents))}], "shape": [{", ".join(map(str, shape))}]}}')


def dumps_document(doc: Mapping[str, Any]) -> str:
    """Deterministic text: root keys sorted, one node per line, trailing newline."""
    # json.dumps(v, sort_keys=True, allow_nan=False, ensure_ascii=True), its encoder built once, not per node
    json_text = json.JSONEncoder(sort_keys=True, allow_nan=False, ensure_ascii=True).encode

    def enc(v: Any) -> str:
        return _plain_node_text(v) or json_text(v)

    root = {k: v for k, v in doc.items() if k != "nodes"}
    lines = ["{"]
    for k in sorted(root):
        lines.append(f"  {enc(k)}: {enc(root[k])},")
    lines.append('  "nodes": [')
    nodes = doc.get("nodes", [])
    for i, n in enumerate(nodes):
        lines.append("    " + enc(n) + ("," if i + 1 < len(nodes) else ""))
    lines.append("  ]")
    lines.append("}")
    return "\n".join(lines) + "\n"
