"""onnx's checker semantics, as explicit checks on a model before anything reads it.

Each check names what it rejects (node, tensor, field): opset versions outside what the installed
onnx defines, names and op types that are not valid UTF-8 (protobuf hands them back as bytes),
tensors written twice (SSA), node arity against the op's schema, negative or unknown dimensions in
declared shapes and initializers, unknown initializer data types and attribute types. Running
these first lets the importer and its handlers read the model without guarding every access.
"""

from __future__ import annotations

import re
from typing import Any, Iterable

from torchlean_bridge.errors import BridgeError

__all__ = ["check_model", "newest_opset", "unique_opsets", "DEFAULT_DOMAINS"]

DEFAULT_DOMAINS = ("", "ai.onnx")
_MAX_DOMAIN_VERSION = 10_000  # no operator set of any domain is anywhere near this


def newest_opset() -> int:
    import onnx.defs
    return int(onnx.defs.onnx_opset_version())


def _fail(what: str) -> BridgeError:
    return BridgeError(f"ONNX import: invalid model: {what}"[:600])


def _text(value: Any, field: str) -> str:
    if isinstance(value, bytes):
        raise _fail(f"{field} is not valid UTF-8 ({value[:40]!r})")
    return value


def _check_names(graph: Any) -> None:
    for kind, items in (("graph input", graph.input), ("graph output", graph.output),
                        ("value_info", graph.value_info), ("initializer", graph.initializer)):
        for i, item in enumerate(items):
            _text(item.name, f"the name of {kind} {i}")
    for i, node in enumerate(graph.node):
        where = f"node {i}"
        _text(node.name, f"the name of {where}")
        _text(node.op_type, f"the op_type of {where}")
        _text(node.domain, f"the domain of {where}")
        for k, name in enumerate(node.input):
            _text(name, f"input {k} of {where}")
        for k, name in enumerate(node.output):
            _text(name, f"output {k} of {where}")
        for a in node.attribute:
            _text(a.name, f"an attribute name of {where}")


def _node_label(i: int, node: Any) -> str:
    return f"node {i} (`{node.name}`, {node.op_type})" if node.name else f"node {i} ({node.op_type})"


def _check_opsets(model: Any) -> int:
    """The default-domain opset, checked to be one the installed onnx defines.

    A domain listed twice (``""`` and ``"ai.onnx"`` are one domain) is accepted when the entries agree
    (onnx's checker and onnxruntime accept them; exporters write them) and refused when they disagree:
    which version governs the nodes would be a guess.
    """
    versions: dict[str, int] = {}
    for o in model.opset_import:
        domain = _text(o.domain, "an opset_import domain")
        key = "" if domain in DEFAULT_DOMAINS else domain
        if key in versions:
            if versions[key] != o.version:
                raise _fail(f"opset_import lists domain `{domain or 'ai.onnx'}` twice with different versions "
                            f"({versions[key]} and {o.version})")
            continue
        if key == "":
            if not 1 <= o.version <= newest_opset():
                raise _fail(f"default-domain opset version {o.version} (the installed onnx defines "
                            f"1..{newest_opset()})")
        elif not 1 <= o.version <= _MAX_DOMAIN_VERSION:
            raise _fail(f"opset version {o.version} for domain `{domain}`")
        versions[key] = int(o.version)
    if "" not in versions:
        raise BridgeError(f"ONNX import: the model imports no default-domain (ai.onnx) opset, only "
                          f"{sorted(versions) or 'no domains'}; its ops are outside what the importer lowers")
    return versions[""]


def unique_opsets(model: Any) -> Any:
    """``model`` with one opset_import entry per domain (a copy only when it lists one twice).

    Run after ``check_model`` (so duplicates agree): onnx's version converter upgrades only the first
    of two default-domain entries, and shape inference would see the stale one.
    """
    keys = ["" if o.domain in DEFAULT_DOMAINS else o.domain for o in model.opset_import]
    if len(set(keys)) == len(keys):
        return model
    import onnx
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    del copy.opset_import[:]
    seen: set[str] = set()
    for key, o in zip(keys, model.opset_import):
        if key not in seen:
            seen.add(key)
            copy.opset_import.add(domain=o.domain, version=o.version)
    return copy


def _check_ssa(graph: Any) -> None:
    """Every tensor is written once: by a graph input, an initializer, or one node output."""
    written: dict[str, str] = {}
    for vi in graph.input:
        if vi.name in written:
            raise _fail(f"graph input `{vi.name}` is listed twice")
        written[vi.name] = f"graph input `{vi.name}`"
    inits: set[str] = set()
    for t in graph.initializer:
        if t.name in inits:
            raise _fail(f"initializer `{t.name}` is defined twice")
        inits.add(t.name)
        written.setdefault(t.name, f"initializer `{t.name}`")  # an initializer may also be a graph input
    for i, node in enumerate(graph.node):
        if not any(node.output):
            raise _fail(f"{_node_label(i, node)} has no outputs")
        for name in node.output:
            if not name:
                continue
            if name in written:
                raise _fail(f"{_node_label(i, node)} writes tensor `{name}`, already written by {written[name]} "
                            "(each tensor must have one producer)")
            written[name] = _node_label(i, node)


def _check_required_names(i: int, node: Any, schema: Any) -> None:
    """An empty name marks an omitted optional input; in a required (single) slot or among variadic operands
    (Max, Sum, Einsum, SequenceConstruct...: an operand list, not optional slots) it is an error."""
    from onnx.defs import OpSchema
    required = (OpSchema.FormalParameterOption.Single, OpSchema.FormalParameterOption.Variadic)
    for k, name in enumerate(node.input):
        formal = schema.inputs[min(k, len(schema.inputs) - 1)] if schema.inputs else None
        if name == "" and formal is not None and formal.option in required:
            raise _fail(f"{_node_label(i, node)}: required input {k} (`{formal.name}`) of "
                        f"{node.op_type}-{schema.since_version} is empty")


def _check_arity(graph: Any, opset: int) -> None:
    import onnx.defs
    for i, node in enumerate(graph.node):
        if node.domain not in DEFAULT_DOMAINS:
            continue
        try:
            schema = onnx.defs.get_schema(node.op_type, opset, "")
        except onnx.defs.SchemaError:
            continue  # an unknown op is reported as unsupported, with every other node that cannot be lowered
        for what, count, lo, hi in (("inputs", len(node.input), schema.min_input, schema.max_input),
                                    ("outputs", len(node.output), schema.min_output, schema.max_output)):
            if not lo <= count <= hi:
                bound = f"{lo}" if lo == hi else f"{lo}..{hi}" if hi < 2**31 - 1 else f"at least {lo}"
                raise _fail(f"{_node_label(i, node)} has {count} {what}; {node.op_type}-{schema.since_version} takes "
                            f"{bound}")
        _check_required_names(i, node, schema)
        given = set()
        for a in node.attribute:
            if a.type == 0 or a.type not in _attribute_types():
                raise _fail(f"{_node_label(i, node)}: attribute `{a.name}` has unknown type {a.type}")
            if a.name in given:
                raise _fail(f"{_node_label(i, node)}: attribute `{a.name}` is given twice")
            given.add(a.name)
            spec = schema.attributes.get(a.name)
            if spec is None:
                raise _fail(f"{_node_label(i, node)}: {node.op_type}-{schema.since_version} has no attribute "
                            f"`{a.name}`")
            if not a.ref_attr_name and int(spec.type) != a.type:
                raise _fail(f"{_node_label(i, node)}: attribute `{a.name}` is {_attribute_type_name(a.type)}, "
                            f"{node.op_type}-{schema.since_version} expects {_attribute_type_name(int(spec.type))}")
        for a in node.attribute:  # onnx's shape inference aborts the process on this one
            if node.op_type == "Split" and a.name == "num_outputs" and a.i != len(node.output):
                raise _fail(f"{_node_label(i, node)}: num_outputs={a.i} but {len(node.output)} outputs")
        missing = sorted(n for n, spec in schema.attributes.items() if spec.required and n not in given)
        if missing:
            raise _fail(f"{_node_label(i, node)}: {node.op_type}-{schema.since_version} requires attribute(s) "
                        f"{', '.join(missing)}")


def _attribute_types() -> frozenset[int]:
    from onnx import AttributeProto
    return frozenset(AttributeProto.AttributeType.values())


def _attribute_type_name(t: int) -> str:
    from onnx import AttributeProto
    try:
        return AttributeProto.AttributeType.Name(t)
    except ValueError:
        return str(t)


def _check_value_infos(items: Iterable[Any], kind: str) -> None:
    for vi in items:
        if vi.type.WhichOneof("value") != "tensor_type" or not vi.type.tensor_type.HasField("shape"):
            continue
        for axis, d in enumerate(vi.type.tensor_type.shape.dim):
            if d.HasField("dim_value") and d.dim_value < 0:
                raise _fail(f"{kind} `{vi.name}` has dimension {d.dim_value} at axis {axis} (dimensions are >= 0; "
                            "an unknown one is a dim_param)")


def _check_initializers(graph: Any) -> None:
    from onnx import TensorProto
    known = frozenset(TensorProto.DataType.values()) - {TensorProto.UNDEFINED}
    for t in graph.initializer:
        if t.data_type not in known:
            raise _fail(f"initializer `{t.name}` has unknown data_type {t.data_type}")
        bad = [d for d in t.dims if d < 0]
        if bad:
            raise _fail(f"initializer `{t.name}` has negative dimensions {list(t.dims)}")


# an Einsum equation as the spec writes it: letters and ellipses per term, commas, one optional arrow
_EINSUM_TERM = r"\s*(?:(?:[A-Za-z]|\.\.\.)\s*)*"  # unambiguous: no backtracking blow-up
_EINSUM = re.compile(rf"{_EINSUM_TERM}(?:,{_EINSUM_TERM})*(?:->{_EINSUM_TERM})?")


def _check_einsum_equations(graph: Any) -> None:
    """A malformed Einsum equation is refused here: onnx's shape inference loops forever on some."""
    for i, node in enumerate(graph.node):
        if node.op_type != "Einsum" or node.domain not in DEFAULT_DOMAINS:
            continue
        for a in node.attribute:
            if a.name == "equation" and not _EINSUM.fullmatch(a.s.decode("utf-8", "replace")):
                raise _fail(f"{_node_label(i, node)}: Einsum equation {a.s.decode('utf-8', 'replace')!r} is not "
                            "letters, '...', commas and one optional '->'")


def check_model(model: Any) -> int:
    """Check ``model`` as onnx's checker would (the parts the importer relies on); its default opset."""
    graph = model.graph
    _check_names(graph)
    opset = _check_opsets(model)
    _check_ssa(graph)
    _check_arity(graph, opset)
    _check_value_infos(graph.input, "graph input")
    _check_value_infos(graph.output, "graph output")
    _check_value_infos(graph.value_info, "value_info")
    _check_initializers(graph)
    _check_einsum_equations(graph)
    return opset
