"""Recover checkpoint keys for the role map of a torch-exported ONNX file.

torch.onnx names the initializers it creates: a transposed ``Linear`` weight becomes
``onnx::MatMul_14`` (TorchScript exporter) or ``val_0`` (dynamo exporter, after its optimizer folded
the transpose), so an audit would name those instead of ``l1.weight``. Given the state_dict of the
reference module (or a checkpoint's tensors), ``recover_keys`` rebinds each such binding to the key
whose tensor, under an exact transform (none, ``transpose``, a ``reshape``), equals the payload the
node reads: matched by value, never by guess. Where several keys hold that value (zero-initialized
biases, LayerNorm ones), the names the file carries narrow the choice: the dynamo optimizer's
``folded_from`` record and the module scope of the consuming node (``/l1/MatMul``,
``pkg.torch.onnx.name_scopes``). A binding that stays ambiguous or unmatched keeps its name and is
listed in the report. The ONNX importer (or a caller) runs this after import; it only reads the
bundle and the model.
"""

from __future__ import annotations

import ast
import dataclasses
from typing import Any, Mapping

import numpy as np

from torchlean_bridge.bundle import Bundle
from torchlean_bridge.errors import BridgeError
from torchlean_bridge.roles import Binding, RoleMap, apply_transform

__all__ = ["recover_keys", "file_hints", "reference_tensors"]


def recover_keys(bundle: Bundle, state_dict: Mapping[str, Any], onnx_model: Any = None) -> Bundle:
    """A copy of ``bundle`` whose bindings name ``state_dict`` keys where the values prove them.

    ``state_dict``: name -> tensor (torch tensors or arrays); ``onnx_model``: the ``ModelProto`` (or
    its path) the bundle was imported from, for the names it carries. The report gains
    ``recovered_keys`` (``old (node n role)`` -> new) and ``unrecovered_keys`` (old -> why). A file
    whose exporter merged equal constants (one zero bias read by three layers) gets one key per use.
    """
    arrays = {k: _array(k, v) for k, v in state_dict.items()}
    by_size: dict[int, list[str]] = {}
    for key, a in arrays.items():
        by_size.setdefault(a.size, []).append(key)
    hints, node_scopes = file_hints(onnx_model) if onnx_model is not None else ({}, {})
    scopes = {n.id: node_scopes.get(n.source.name) or _scope(n.source.name)
              for n in bundle.graph if n.source is not None and n.source.name}
    recovered: dict[str, str] = {}
    unrecovered: dict[str, str] = {}
    bindings = []
    for b in bundle.roles.bindings():
        payload = bundle.payload.get(b.node, b.role)
        matches = [] if payload is None else _matches(np.asarray(payload), arrays, by_size.get(payload.size, ()))
        matches = _narrow(matches, hints.get(b.key, {}), scopes.get(b.node))
        keys = sorted({key for key, _ in matches})
        if b.key in arrays and (b.key in keys or not keys) and (len(keys) != 1 or keys == [b.key]):
            bindings.append(b)  # already a key the values confirm (or nothing better is proven)
            if len(keys) > 1:
                unrecovered[b.key] = f"{len(keys)} tensors of the reference have this value: " + ", ".join(keys[:5])
        elif len(keys) == 1:
            key, transform = matches[0]
            bindings.append(Binding(key, b.node, b.role, transform))
            recovered[f"{b.key} (node {b.node} {b.role})"] = key
        else:
            bindings.append(b)
            unrecovered[b.key] = ("no tensor of the reference has this value" if not keys else
                                  f"{len(keys)} tensors of the reference have this value: " + ", ".join(keys[:5]))
    report = dict(bundle.report)
    if recovered:
        report["recovered_keys"] = {**report.get("recovered_keys", {}), **recovered}
    if unrecovered:
        report["unrecovered_keys"] = unrecovered
    return dataclasses.replace(bundle, roles=RoleMap(bindings), report=report)


def reference_tensors(reference: Any) -> Mapping[str, Any]:
    """The named tensors of a reference: an ``nn.Module``'s state_dict, a mapping, or a checkpoint path."""
    state_dict = getattr(reference, "state_dict", None)
    if callable(state_dict):
        return state_dict()
    from importers.checkpoints import as_checkpoint
    return as_checkpoint(reference)


def file_hints(onnx_model: Any) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """What the file says of its tensors' origin: per initializer, ``folded_from`` (the dynamo
    optimizer's source names) and ``scopes`` (module paths of the nodes that read it); per node name,
    its module path (``pkg.torch.onnx.name_scopes``, or the TorchScript name's)."""
    import onnx
    model = onnx.load(str(onnx_model), load_external_data=False) if not isinstance(onnx_model, onnx.ModelProto) \
        else onnx_model
    graph = model.graph
    hints: dict[str, dict[str, Any]] = {i.name: {"folded_from": [], "scopes": set()} for i in graph.initializer}
    for info in graph.value_info:
        if info.name in hints:
            for prop in info.metadata_props:
                if prop.key.endswith("folded_from"):
                    hints[info.name]["folded_from"] = _names(prop.value)
    node_scopes: dict[str, str] = {}
    for node in graph.node:
        scope = _scope(node.name)
        for prop in node.metadata_props:
            if prop.key == "pkg.torch.onnx.name_scopes":
                scope = _module_path(_names(prop.value)[:-1]) or scope
        if scope:
            node_scopes[node.name] = scope
        for name in node.input:
            if name in hints and scope:
                hints[name]["scopes"].add(scope)
    return hints, node_scopes


def _array(key: str, value: Any) -> np.ndarray:
    if hasattr(value, "detach"):
        value = value.detach().cpu()
        if str(value.dtype) in ("torch.bfloat16", "torch.float16"):
            value = value.float()
        value = value.numpy()
    if not isinstance(value, np.ndarray):
        raise BridgeError(f"recover keys: `{key}` is a {type(value).__name__}, expected a tensor")
    return value


def _matches(payload: np.ndarray, arrays: Mapping[str, np.ndarray], keys: Any) -> list[tuple[str, str | None]]:
    """(key, transform) pairs whose transformed tensor equals ``payload`` exactly."""
    out = []
    for key in keys:
        source = arrays[key]
        for transform in _transforms(source.shape, payload.shape):
            candidate = apply_transform(transform, source)
            if candidate.shape == payload.shape and np.array_equal(candidate.astype(payload.dtype, copy=False),
                                                                   payload):
                out.append((key, transform))
                break
    return out


def _transforms(source: tuple[int, ...], target: tuple[int, ...]) -> list[str | None]:
    out: list[str | None] = []
    if source == target:
        out.append(None)
    if len(source) == 2 and source[::-1] == target:
        out.append("transpose")
    if source != target:
        out.append("reshape:" + ",".join(map(str, target)) if target else "reshape:")
    return [t for t in out if t != "reshape:"]


def _narrow(matches: list[tuple[str, str | None]], hint: Mapping[str, Any], scope: str | None) -> list:
    """Keep the matches the file's names point at, most specific first: the module of the node that
    reads the tensor, the optimizer's source names, the modules of every reader of the initializer."""
    if len({k for k, _ in matches}) <= 1:
        return matches
    for keep in (lambda k: bool(scope) and k.rsplit(".", 1)[0] == scope,
                 lambda k: k in hint.get("folded_from", ()),
                 lambda k: any(k.rsplit(".", 1)[0] == s for s in hint.get("scopes", ()))):
        narrowed = [m for m in matches if keep(m[0])]
        if narrowed:
            return narrowed
    return matches


def _scope(node_name: str | None) -> str | None:
    """The module path in a TorchScript-exported node name: ``/l1/MatMul`` -> ``l1``,
    ``/encoder/layer.0/attention/MatMul`` -> ``encoder.layer.0.attention``, and a container's child,
    which repeats its parent (``/block/block.2/Add``), -> ``block.2``."""
    if not node_name or not node_name.startswith("/"):
        return None
    return _module_path(node_name.split("/")[1:-1])


def _module_path(parts: list[str]) -> str | None:
    path: list[str] = []
    for part in (p for p in parts if p):
        if path and part.startswith(path[-1] + "."):
            path[-1] = part
        else:
            path.append(part)
    return ".".join(path) or None


def _names(text: str) -> list[str]:
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return []
    return [str(v) for v in value] if isinstance(value, (list, tuple)) else []
