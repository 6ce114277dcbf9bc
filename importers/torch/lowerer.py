"""The node-by-node lowerer both torch importers share, shaped like ``torch.fx.Interpreter``.

Both frameworks hand us a ``torch.fx.Graph``; they differ only in where parameters come from (FX
``get_attr`` / module attributes, or the exported program's public ``graph_signature``), in where
shapes are recorded (``tensor_meta`` from shape propagation, or ``val`` fake tensors), and in the
targets they use (modules, functions and methods, or ATen overloads). The ``Lowerer`` walks the
graph with one environment and one ``run_node`` dispatch; ``program.TorchLowerer`` resolves targets
through the tables ``targets`` builds from the registrations at each lowering.

Anything that does not depend on an input or on a state_dict tensor is folded by running the
framework's own op on the known values, so masks, positions and shape arithmetic never reach the
graph. A lowering's arguments are checked against its signature before the call (a mismatch is the
model using a form we do not lower); an exception from inside a lowering is a bug and keeps its
traceback, with a note naming the fx node.
"""

from __future__ import annotations

import inspect
import operator
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from importers.builder import GraphBuilder
from importers.errors import NotLowerable, add_node_note
from torchlean_bridge.bundle import Bundle
from torchlean_bridge.errors import BridgeError, UnsupportedError
from torchlean_bridge.graph import Source
from torchlean_bridge.ops import BOOL, FLOAT, INT64, fmt_shape
from torchlean_bridge.roles import Transform

from .common import (FOLD_BLOCKLIST, DataDependent, Known, Lowering, Sym, data_operands, element_type, flat_values,
                     is_inplace_overload, map_values, module_path, op_base_name, source_line,
                     target_name)

__all__ = ["Lowerer", "check_arguments"]

_SIGNATURES: dict[Any, inspect.Signature | None] = {}


def check_arguments(lower: Lowering, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
    """Refuse a call whose arguments do not fit the lowering's signature (a form of the target the
    lowering does not take), before the call, so a TypeError inside the lowering stays a bug."""
    key = getattr(lower, "__func__", lower)
    if key not in _SIGNATURES:
        try:
            _SIGNATURES[key] = inspect.signature(lower)
        except (TypeError, ValueError):  # a builtin without a signature: nothing to check
            _SIGNATURES[key] = None
    sig = _SIGNATURES[key]
    if sig is None:
        return
    try:
        sig.bind(*args, **kwargs)
    except TypeError as e:
        raise NotLowerable(f"cannot lower these arguments ({type(e).__name__}: {e})"[:300]) from None


def _data_dependent_operand(n: torch.fx.Node, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    """A ``DataDependent`` value used as an operand (directly or in a list of tensors); selecting it
    from its tuple (``getitem``, ``.indices``) is no use yet."""
    direct = [*args, *kwargs.values()]
    if not (n.op == "call_function" and n.target in (operator.getitem, getattr)):
        direct += [x for a in direct if isinstance(a, (list, tuple)) for x in a]
    return next((v for v in direct if isinstance(v, DataDependent)), None)


class Lowerer:
    """Lower one ``torch.fx.Graph`` node by node into a ``GraphBuilder``.

    ``program.TorchLowerer`` supplies the target tables (``resolve``), parameters
    (``get_attr``/``param``) and submodules; the importers bind the placeholders and call ``run``.
    """

    framework = "torch"

    def __init__(self, max_elements: int | None = None) -> None:
        self.builder = GraphBuilder(self.framework) if max_elements is None else \
            GraphBuilder(self.framework, max_elements)
        self.env: dict[torch.fx.Node, Any] = {}
        self.const_nodes: dict[Known, int] = {}  # each Known (by identity) becomes at most one const
        self.problems: list[dict[str, Any]] = []
        self.current: torch.fx.Node | None = None
        self.current_source: Source | None = None
        self.module_prefix = ""  # set while inlining a submodule's exported program
        self.name_prefix = ""  # the node names' prefix there (the call's own name, for an inlined function)
        self.unused_keys: set[str] = set()
        self.int_ranges: dict[int, tuple[int, int]] = {}  # int64 node id -> bounds proven at import
        # matmul nodes with an import-time right operand: (fx node, input, weight), for x @ W + b

    # -- provenance -----------------------------------------------------------------------------
    def describe(self, node: torch.fx.Node) -> dict[str, Any]:
        path = module_path(node)
        if self.module_prefix:
            path = self.module_prefix + ("." + path if path else "")
        return {"name": self.name_prefix + ("." if self.name_prefix else "") + node.name,
                "target": target_name(node, self.submodule(node)), "module": path,
                "location": source_line(node.meta.get("stack_trace"))}

    def submodule(self, node: torch.fx.Node) -> torch.nn.Module | None:
        return None

    def source(self, name: str | None = None, tensor: str | None = None) -> Source | None:
        base = self.current_source
        if base is None:
            return Source(framework=self.framework, name=name, tensor=tensor)
        return Source(framework=self.framework, name=name, target=base.target, module=base.module,
                      tensor=tensor, location=base.location)

    # -- values ---------------------------------------------------------------------------------
    def shape(self, v: Any) -> tuple[int, ...]:
        if isinstance(v, Sym):
            return self.builder.shape(v.nid)
        if isinstance(v, Known):
            return v.shape
        return tuple(np.shape(v))

    def rank(self, v: Any) -> int:
        return len(self.shape(v))

    def etype(self, v: Any) -> str:
        if isinstance(v, Sym):
            return self.builder.dtype(v.nid)
        if isinstance(v, Known):
            return element_type(v.tensor.dtype)
        if isinstance(v, bool):
            return BOOL
        if isinstance(v, int):
            return INT64
        return FLOAT

    def known(self, v: Any) -> torch.Tensor | None:
        """The import-time value of a tensor operand (None when it depends on an input)."""
        if isinstance(v, Known):
            return v.tensor
        if isinstance(v, Sym):
            return None
        if isinstance(v, torch.Tensor):
            return v
        return None

    def node(self, v: Any, etype: str | None = None) -> int:
        """An IR node id for a tensor operand: Known tensors and Python scalars become consts."""
        if isinstance(v, Sym):
            nid = v.nid
        elif isinstance(v, Known):
            nid = self.const_nodes.get(v)
            if nid is None:
                nid = self._materialize(v)
                self.const_nodes[v] = nid
        elif isinstance(v, (bool, int, float)):
            nid = self.scalar(v, etype or self.etype(v))
        elif isinstance(v, torch.Tensor):
            nid = self._materialize(Known(v, folded=True))
        else:
            raise NotLowerable(f"expected a tensor operand, got {type(v).__name__} {v!r}"[:200])
        if etype is not None and self.builder.dtype(nid) != etype:
            nid = self.builder.add("cast", [nid], {"dtype": etype}, source=self.source())
        return nid

    def _materialize(self, k: Known) -> int:
        t = k.tensor.detach()
        if t.dtype in (torch.float16, torch.bfloat16):
            t = t.float()
        arr = t.cpu().numpy().copy()
        if k.key is None:
            return self.builder.const(arr, source=self.source(), folded=True)
        transform = Transform.of_layout(k.steps, k.key_shape).text if k.steps else None
        return self.builder.const(arr, key=k.key, transform=transform, folded=k.folded,
                                  source=self.source(tensor=k.key))

    def bind_param(self, nid: int, role: str, v: Known, transpose: bool = False) -> None:
        """Store a Known tensor as a node's payload role, bound to its key with its transform."""
        t = v.tensor.detach()
        steps = v.steps + ((("permute", (1, 0)),) if transpose else ())
        if transpose:
            t = t.t()
        if t.dtype in (torch.float16, torch.bfloat16):
            t = t.float()
        arr = np.asarray(t.cpu().numpy(), order="C")
        transform = Transform.of_layout(steps, v.key_shape).text if v.key and steps else None
        self.builder.param(nid, role, arr, key=v.key, transform=transform)

    def add(self, kind: str, parents: Sequence[int], attrs: Mapping[str, Any] | None = None,
            shape: Sequence[int] | None = None, dtype: str | None = None) -> Sym:
        return Sym(self.builder.add(kind, parents, attrs, shape=shape, dtype=dtype, source=self.source()))

    def scalar(self, value: float | int | bool, etype: str) -> int:
        """A rank-0 const for a Python scalar in the element type of the operand it meets."""
        dtype = {FLOAT: np.float64, INT64: np.int64, BOOL: np.bool_}[etype]
        return self.builder.const(np.array(value, dtype=dtype), source=self.source(), folded=True)

    # -- errors ---------------------------------------------------------------------------------
    def problem(self, node: torch.fx.Node, reason: str) -> None:
        self.problems.append({**self.describe(node), "reason": reason})

    def raise_problems(self, what: str) -> None:
        if not self.problems:
            return
        lines = []
        for p in self.problems:
            where = ", ".join(x for x in (p.get("module") and f"module {p['module']}", p.get("location")) if x)
            lines.append(f"  {p['name']}: {p['target']}" + (f" ({where})" if where else "")
                         + (f": {p['reason']}" if p.get("reason") else ""))
        raise UnsupportedError(f"{self.framework} import: {len(self.problems)} {what}:\n" + "\n".join(lines),
                               items=list(self.problems))

    # -- the walk -------------------------------------------------------------------------------
    def live_nodes(self, graph: torch.fx.Graph) -> set[torch.fx.Node]:
        """Nodes the outputs depend on, plus in-place calls (they rebind a value others read)."""
        nodes = list(graph.nodes)
        live: set[torch.fx.Node] = set()
        roots = [n for n in nodes if n.op == "output" or self.is_inplace(n)]
        stack = list(roots)
        while stack:
            n = stack.pop()
            if n in live:
                continue
            live.add(n)
            stack.extend(n.all_input_nodes)
        return live

    def is_inplace(self, node: torch.fx.Node) -> bool:
        if node.op == "call_method" and isinstance(node.target, str):
            t = node.target
            return t.endswith("_") and not t.startswith("_")
        if node.op == "call_function" and node.target in (operator.iadd, operator.isub, operator.imul,
                                                          operator.itruediv):
            return True
        if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
            return is_inplace_overload(node.target)
        return bool(node.kwargs.get("inplace")) if node.op != "call_module" else False

    def depends(self, graph: torch.fx.Graph, seeds: set[torch.fx.Node]) -> set[torch.fx.Node]:
        """Nodes whose value (statically) depends on ``seeds``; shape queries return plain numbers."""
        out = set(seeds)
        for n in graph.nodes:
            if any(a in out for a in data_operands(n)):
                out.add(n)
        return out

    def resolve(self, node: torch.fx.Node) -> Lowering | None:
        raise NotImplementedError

    def precheck(self, graph: torch.fx.Graph, live: set[torch.fx.Node], dynamic: set[torch.fx.Node]) -> None:
        """Collect every target without a lowering (among nodes that cannot fold) before lowering."""
        for n in graph.nodes:
            if n not in live or n.op not in ("call_function", "call_method", "call_module"):
                continue
            if n not in dynamic and self.foldable_target(n):
                continue
            if self.resolve(n) is None:
                self.problem(n, "no lowering for this target")
        self.raise_problems("unsupported targets")

    def foldable_target(self, node: torch.fx.Node) -> bool:
        """Deterministic, side-effect free, and (for modules) without state_dict tensors."""
        if node.op == "call_module":
            module = self.submodule(node)
            if module is None or any(True for _ in module.state_dict()):
                return False
        if node.op == "call_module":
            return not isinstance(self.submodule(node), torch.nn.modules.dropout._DropoutNd)
        return op_base_name(node) not in FOLD_BLOCKLIST

    def run(self, graph: torch.fx.Graph, dynamic_seeds: set[torch.fx.Node]) -> list[Any]:
        """Lower every live node; returns the output values (flattened)."""
        live = self.live_nodes(graph)
        dynamic = self.depends(graph, dynamic_seeds)
        self.precheck(graph, live, dynamic)
        poisoned: set[torch.fx.Node] = set()
        outputs: list[Any] = []
        for n in graph.nodes:
            if n not in live:
                continue
            if any(a in poisoned for a in n.all_input_nodes):
                poisoned.add(n)
                continue
            if n.op == "output":
                outputs = flat_values(map_values(n.args[0], self._lookup))
                continue
            if n.op == "placeholder":
                continue  # bound by the importer before run()
            try:
                self.run_node(n)
            except BridgeError as e:  # NotLowerable, or a rule that rejected what the lowering built
                self.problem(n, e.message)
                poisoned.add(n)
            except Exception as e:  # a bug: keeps its traceback, named by the node it happened at
                add_node_note(e, self.where(n))
                raise
        self.raise_problems("nodes could not be lowered")
        return outputs

    def _lookup(self, v: Any) -> Any:
        return self.env[v] if isinstance(v, torch.fx.Node) else v

    def run_node(self, n: torch.fx.Node) -> None:
        self.current = n
        info = self.describe(n)
        self.current_source = Source(framework=self.framework, target=info["target"], module=info["module"],
                                     location=info["location"])
        if n.op == "get_attr":
            self.env[n] = self.get_attr(n)
            return
        args = map_values(n.args, self._lookup)
        kwargs = map_values(dict(n.kwargs), self._lookup)
        first = len(self.builder.nodes)
        leaves = flat_values([args, kwargs])
        refused = _data_dependent_operand(n, args, kwargs)
        if refused is not None:
            raise refused.refusal()
        if self.foldable_target(n) and not any(isinstance(v, Sym) or isinstance(v, Known) and v.pinned
                                               for v in leaves):
            result = self.fold(n, args, kwargs)
        else:
            lower = self.resolve(n)
            if lower is None:
                raise NotLowerable("no lowering for this target")
            result = self.call(n, lower, args, kwargs)
        self.finish_node(n, result, first)
        self.env[n] = result
        if self.is_inplace(n) and isinstance(n.args[0], torch.fx.Node):
            target = self.env[n.args[0]]
            if isinstance(target, Known) and target.key:
                raise NotLowerable(f"in-place update of `{target.key}`: the model mutates its parameters or "
                                   "buffers; import a forward that leaves its state unchanged")
            self.env[n.args[0]] = result

    def call(self, n: torch.fx.Node, lower: Lowering, args: Any, kwargs: dict[str, Any]) -> Any:
        check_arguments(lower, (self, *args), kwargs)
        return lower(self, *args, **kwargs)

    def where(self, n: torch.fx.Node) -> str:
        """``fx node `name` (target, module m, file.py:12)``: the context a bug's traceback gets."""
        info = self.describe(n)
        extra = ", ".join(x for x in (info["target"], info["module"] and f"module {info['module']}",
                                      info["location"]) if x)
        return f"fx node `{info['name']}` ({extra})"

    def fold(self, n: torch.fx.Node, args: Any, kwargs: dict[str, Any]) -> Any:
        """Run the framework's own op on import-time values; tensors become folded Knowns."""
        concrete = map_values((args, kwargs), lambda v: v.tensor if isinstance(v, Known) else v)
        with torch.no_grad():
            out = self.execute(n, *concrete)
        return map_values(out, lambda v: Known(v, folded=True) if isinstance(v, torch.Tensor) else v)

    def execute(self, n: torch.fx.Node, args: Any, kwargs: dict[str, Any]) -> Any:
        if n.op == "call_method":
            return getattr(args[0], n.target)(*args[1:], **kwargs)
        if n.op == "call_module":
            return self.submodule(n)(*args, **kwargs)
        return n.target(*args, **kwargs)

    def get_attr(self, n: torch.fx.Node) -> Any:
        raise NotImplementedError

    def meta_of(self, n: torch.fx.Node) -> Any:
        """The framework's recorded value: a tensor-like with ``shape``/``dtype``, or a tuple.

        torch.export records fake tensors under ``val``; FX shape propagation records
        ``TensorMetadata`` under ``tensor_meta``.
        """
        if "val" in n.meta:
            return n.meta["val"]
        return n.meta.get("tensor_meta")

    def current_meta(self) -> Any:
        meta = self.meta_of(self.current) if self.current is not None else None
        if meta is None or not hasattr(meta, "shape"):
            raise NotLowerable("the framework recorded no tensor shape for this node")
        return meta

    def finish_node(self, n: torch.fx.Node, result: Any, first: int) -> None:
        """Name the node that produces ``n``'s value; declare the framework's shape on it."""
        if not isinstance(result, Sym):
            return
        if result.nid < first and not self._selects_from_tuple(n):
            return  # an alias of an earlier value (identity, dropout, no-op view): keeps its name
        meta = self.meta_of(n)
        b = self.builder
        node = b.nodes[result.nid]
        src = node.source or Source(framework=self.framework)
        name = self.describe(n)["name"]
        changes: dict[str, Any] = {"source": Source(**{**src.to_json(), "name": name})}
        if isinstance(meta, torch.Tensor) or hasattr(meta, "shape") and hasattr(meta, "dtype"):
            # a data-dependent extent (boolean mask of a constant) is symbolic to the framework;
            # the import-time values fixed it, so only concrete extents are declared
            concrete = all(isinstance(d, int) for d in meta.shape)
            declared = tuple(int(d) for d in meta.shape) if concrete else node.out_shape
            if declared != node.out_shape:
                b.notes.append(f"node {node.id} ({node.kind}, {name}): framework shape {fmt_shape(declared)} "
                               f"differs from the rule's {fmt_shape(node.out_shape)}")
                changes["out_shape"] = declared
            want = element_type(meta.dtype)
            if want != node.dtype:
                raise NotLowerable(f"lowering produced element type {node.dtype}, the framework says {want}")
        b.nodes[result.nid] = node.with_(**changes)

    def _selects_from_tuple(self, n: torch.fx.Node) -> bool:
        """``getitem`` of a multi-output op (split, native_batch_norm, attention): the element's
        IR node carries the getitem's name, the framework's name for that value."""
        return (n.op == "call_function" and n.target is operator.getitem and bool(n.args)
                and isinstance(n.args[0], torch.fx.Node) and isinstance(self.env.get(n.args[0]), (tuple, list)))

    # -- result -----------------------------------------------------------------------------------
    def finish(self, outputs: Sequence[Any], report: dict[str, Any]) -> Bundle:
        outs = []
        for v in outputs:
            if isinstance(v, (Sym, Known)) or isinstance(v, torch.Tensor):
                outs.append(self.node(v))
            elif v is None:
                continue
            else:
                raise BridgeError(f"{self.framework} import: model output {v!r} is not a tensor"[:200])
        if not outs:
            raise BridgeError(f"{self.framework} import: the model has no tensor outputs")
        bundle = self.builder.finish(outs, report)
        unused = sorted(self.unused_keys - set(bundle.roles))
        if unused:
            bundle.report["unused_tensors"] = sorted(set(bundle.report.get("unused_tensors", [])) | set(unused))
        return bundle


