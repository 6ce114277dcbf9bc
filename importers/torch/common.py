"""What the torch.fx and torch.export importers share: values, the node-by-node lowerer, folding.

Both frameworks hand us a ``torch.fx.Graph``; they differ only in where parameters come from (FX
``get_attr`` / module attributes, or the exported program's public ``graph_signature``), in where
shapes are recorded (``tensor_meta`` from shape propagation, or ``val`` fake tensors), and in the
targets they use (modules, functions and methods, or ATen overloads). The ``Lowerer`` walks the
graph like ``torch.fx.Interpreter``: one environment, one ``run_node`` dispatch, small lowering
functions registered in the tables of ``torch_ops`` (shared), ``torch_aten`` and ``torch_modules``.

A value in the environment is a ``Sym`` (an IR node computed from the inputs), a ``Known`` tensor
(import-time value: a parameter, buffer, constant or folded result, materialized as a ``const``
node only when an op reads it as data), or a plain Python value (ints, shapes, tuples). Anything
that does not depend on an input or on a state_dict tensor is folded by running the framework's
own op on the known values, so masks, positions and shape arithmetic never reach the graph.
"""

from __future__ import annotations

import math
import operator
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
import torch

from importers.builder import GraphBuilder
from torchlean_bridge.bundle import Bundle
from torchlean_bridge.errors import BridgeError, UnsupportedError
from torchlean_bridge.graph import Source
from torchlean_bridge.ops import BOOL, FLOAT, INT64, fmt_shape

__all__ = ["Known", "Sym", "Lowerer", "Lowering", "NotLowerable", "EMITTED_KINDS", "FOLD_BLOCKLIST",
           "element_type", "normalize_axis", "role_transform", "flat_values", "source_line", "module_path",
           "target_name", "op_base_name", "is_shape_query", "check_static", "check_training", "bind_aliases",
           "prod"]

# every IR kind a lowering in torch_ops / torch_aten / torch_modules can emit (docs/make_ops_md.py)
EMITTED_KINDS: frozenset[str] = frozenset({
    "input", "const", "add", "sub", "mul_elem", "div", "neg", "abs", "sqrt", "rsqrt", "inv", "exp", "expm1",
    "log", "log1p", "sin", "cos", "tan", "tanh", "sigmoid", "relu", "softplus", "gelu", "silu", "leaky_relu", "elu",
    "selu", "celu", "clamp", "hardsigmoid", "hardswish", "mish", "softsign", "erf", "sign", "floor", "ceil",
    "round", "trunc", "exp2", "log2", "atan", "asin", "acos", "sinh", "cosh", "asinh", "acosh", "atanh",
    "pow", "max_elem", "min_elem", "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or",
    "logical_not", "isnan", "where", "cast", "softmax", "log_softmax", "reduce_sum", "reduce_mean", "sum",
    "reduce_sum_axes", "reduce_mean_axes", "reduce_max", "reduce_min", "reduce_prod", "argmax", "argmin", "matmul",
    "linear", "conv", "conv_transpose", "batch_norm_eval", "layernorm", "max_pool", "avg_pool", "max_pool_nd",
    "avg_pool_nd", "resize_linear", "cumsum", "sort", "reshape", "permute", "transpose", "broadcast_to", "concat",
    "slice", "gather", "gather_elements", "pad",
})

# ops that must never be folded even when their operands are known (randomness, side effects)
FOLD_BLOCKLIST = frozenset({
    "rand", "randn", "randint", "randperm", "rand_like", "randn_like", "randint_like", "bernoulli", "normal",
    "uniform", "multinomial", "poisson", "exponential", "dropout", "native_dropout", "feature_dropout",
    "alpha_dropout", "dropout1d", "dropout2d", "dropout3d", "empty", "empty_like", "new_empty", "empty_strided"})


class NotLowerable(BridgeError):
    """A lowering cannot express this use of a supported target (collected, reported together)."""


@dataclass(eq=False)
class Known:
    """A tensor known at import time.

    ``key`` is the external name bound when it becomes a ``const`` node; ``pinned`` marks a
    state_dict tensor, which is never folded into anonymous values (the role map must bind it);
    ``steps`` are the layout transforms (permute/reshape) applied since it left the state_dict.
    """

    tensor: torch.Tensor
    key: str | None = None
    pinned: bool = False
    steps: tuple[tuple[str, tuple[int, ...]], ...] = ()
    folded: bool = False
    key_shape: tuple[int, ...] | None = None  # shape under ``key``, before ``steps``

    def __post_init__(self) -> None:
        if self.key_shape is None:
            self.key_shape = tuple(self.tensor.shape)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.tensor.shape)

    def moved(self, tensor: torch.Tensor, step: tuple[str, tuple[int, ...]]) -> "Known":
        return Known(tensor, self.key, self.pinned, self.steps + (step,), self.folded, self.key_shape)


@dataclass(frozen=True)
class Sym:
    """An IR node computed from the graph inputs."""

    nid: int


Lowering = Callable[..., Any]


def element_type(dtype: torch.dtype) -> str:
    if dtype == torch.bool:
        return BOOL
    if dtype.is_floating_point:
        return FLOAT
    if dtype.is_complex:
        raise NotLowerable(f"complex tensors ({dtype}) are not supported")
    return INT64


def normalize_axis(axis: int, rank: int, what: str = "dim") -> int:
    if not -max(rank, 1) <= axis < max(rank, 1):
        raise NotLowerable(f"{what} {axis} is out of range for rank {rank}")
    return axis % rank if rank else 0


def role_transform(steps: Sequence[tuple[str, tuple[int, ...]]], source_shape: Sequence[int]) -> str | None:
    """The role-map transform text for a chain of layout steps, simplified.

    Consecutive permutations compose into one; an identity disappears; a 2-D swap is ``transpose``.
    """
    out: list[str] = []
    perm: tuple[int, ...] | None = None
    shape = tuple(source_shape)

    def flush() -> None:
        nonlocal perm
        if perm is not None and perm != tuple(range(len(perm))):
            out.append("transpose" if perm == (1, 0) else "permute:" + ",".join(map(str, perm)))
        perm = None

    for name, arg in steps:
        if name == "permute":
            perm = tuple(arg) if perm is None else tuple(perm[i] for i in arg)
            shape = tuple(shape[i] for i in arg)
        elif name == "reshape":
            flush()
            if tuple(arg) != shape:
                out.append("reshape:" + ",".join(map(str, arg)))
            shape = tuple(arg)
    flush()
    return ";".join(out) or None


def flat_values(value: Any) -> list[Any]:
    """Leaves of nested tuples/lists/dicts (model outputs) in order."""
    if isinstance(value, (list, tuple)):
        return [leaf for v in value for leaf in flat_values(v)]
    if isinstance(value, Mapping):
        return [leaf for v in value.values() for leaf in flat_values(v)]
    return [value]


def _map_values(value: Any, fn: Callable[[Any], Any]) -> Any:
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(_map_values(v, fn) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(_map_values(v, fn) for v in value)
    if isinstance(value, dict):
        return {k: _map_values(v, fn) for k, v in value.items()}
    if isinstance(value, slice):
        return slice(fn(value.start), fn(value.stop), fn(value.step))
    return fn(value)


_FRAME = re.compile(r'File "([^"]+)", line (\d+)')
_TORCH_DIR = str(torch.__file__).rsplit("/", 1)[0]


def source_line(stack_trace: str | None) -> str | None:
    """``file.py:12`` of the innermost frame of model code.

    User code wins; inside ``torch.nn`` containers the library module's own line is the source;
    frames of the tracing machinery (``torch/fx``, ``torch/_*``, ``torch/export``) never are.
    """
    if not stack_trace:
        return None
    frames = _FRAME.findall(stack_trace)
    user = [f for f in frames if not f[0].startswith(_TORCH_DIR)]
    library = [f for f in frames if f[0].startswith(_TORCH_DIR + "/nn/")]
    chosen = (user or library)
    if not chosen:
        return None
    path, line = chosen[-1]
    return f"{path}:{line}"


def module_path(node: torch.fx.Node) -> str | None:
    """The dotted path of the innermost module a node belongs to (``nn_module_stack``)."""
    if node.op == "call_module":
        return str(node.target)
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return None
    path = list(stack.values())[-1][0]
    path = re.sub(r"^L\['self'\]\.?|^L__self__\.?", "", str(path))
    return path or None


def target_name(node: torch.fx.Node, module: torch.nn.Module | None = None) -> str:
    t = node.target
    if node.op == "call_module" and module is not None:
        return f"{type(module).__module__}.{type(module).__name__}"
    if node.op == "call_method":
        return f"Tensor.{t}"
    if isinstance(t, torch._ops.OpOverload):
        return str(t)
    if callable(t):
        mod = getattr(t, "__module__", None) or ""
        name = getattr(t, "__qualname__", None) or getattr(t, "__name__", None) or repr(t)
        return f"{mod}.{name}" if mod and mod != "builtins" else name
    return str(t)


def op_base_name(node: torch.fx.Node) -> str:
    """``randn`` for ``aten.randn.default``, ``torch.randn`` and ``Tensor.randn``-style methods."""
    t = node.target
    if isinstance(t, torch._ops.OpOverload):
        return str(t).split(".")[1].rstrip("_")
    if isinstance(t, str):
        return t.rstrip("_")
    return str(getattr(t, "__name__", t)).rstrip("_")


class Lowerer:
    """Lower one ``torch.fx.Graph`` node by node into a ``GraphBuilder``.

    ``torch_program.TorchLowerer`` supplies the target tables (``resolve``), parameters
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
        self.unused_keys: set[str] = set()
        # matmul nodes with an import-time right operand: (fx node, input, weight), for x @ W + b
        self.linear_candidates: dict[int, tuple[torch.fx.Node, Any, Known]] = {}

    # -- provenance -----------------------------------------------------------------------------
    def describe(self, node: torch.fx.Node) -> dict[str, Any]:
        path = module_path(node)
        if self.module_prefix:
            path = self.module_prefix + ("." + path if path else "")
        return {"name": self.module_prefix + ("." if self.module_prefix else "") + node.name,
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
        transform = role_transform(k.steps, k.key_shape) if k.steps else None
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
        transform = role_transform(steps, v.key_shape) if v.key and steps else None
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
            from .torch_aten import is_inplace_overload
            return is_inplace_overload(node.target)
        return bool(node.kwargs.get("inplace")) if node.op != "call_module" else False

    def depends(self, graph: torch.fx.Graph, seeds: set[torch.fx.Node]) -> set[torch.fx.Node]:
        """Nodes whose value (statically) depends on ``seeds``; shape queries return plain numbers."""
        out = set(seeds)
        for n in graph.nodes:
            if not is_shape_query(n) and any(a in out for a in n.all_input_nodes):
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
                outputs = flat_values(_map_values(n.args[0], self._lookup))
                continue
            if n.op == "placeholder":
                continue  # bound by the importer before run()
            try:
                self.run_node(n)
            except (NotLowerable, BridgeError) as e:
                self.problem(n, e.message if isinstance(e, BridgeError) else str(e))
                poisoned.add(n)
            except (TypeError, ValueError, IndexError, RuntimeError) as e:
                self.problem(n, f"cannot lower these arguments ({type(e).__name__}: {e})"[:300])
                poisoned.add(n)
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
        args = _map_values(n.args, self._lookup)
        kwargs = _map_values(dict(n.kwargs), self._lookup)
        first = len(self.builder.nodes)
        leaves = flat_values([args, kwargs])
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
        return lower(self, *args, **kwargs)

    def fold(self, n: torch.fx.Node, args: Any, kwargs: dict[str, Any]) -> Any:
        """Run the framework's own op on import-time values; tensors become folded Knowns."""
        concrete = _map_values((args, kwargs), lambda v: v.tensor if isinstance(v, Known) else v)
        with torch.no_grad():
            out = self.execute(n, *concrete)
        return _map_values(out, lambda v: Known(v, folded=True) if isinstance(v, torch.Tensor) else v)

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


def is_shape_query(node: torch.fx.Node) -> bool:
    """``x.size()``, ``x.shape``, ``x.dim()``, ``sym_size``: the answer is a number, not data."""
    if node.op == "call_method":
        return node.target in ("size", "dim", "numel")
    if node.op == "call_function":
        if node.target is getattr:
            return len(node.args) > 1 and node.args[1] in ("shape", "ndim", "dtype", "device")
        return str(node.target).startswith("aten.sym_size")
    return False


def check_static(shape: Iterable[Any], what: str) -> tuple[int, ...]:
    """Concrete ints or a clear error for symbolic (dynamic) dimensions."""
    out = []
    for d in shape:
        if isinstance(d, torch.SymInt) or not isinstance(d, int):
            raise BridgeError(f"{what}: dimension {d} is dynamic; export with static shapes "
                              "(no dynamic_shapes=/Dim) so every extent is a number")
        out.append(d)
    return tuple(out)


def prod(xs: Iterable[int]) -> int:
    return math.prod(int(x) for x in xs)


def check_training(module: torch.nn.Module, framework: str) -> None:
    if module.training:
        raise BridgeError(f"{framework} import: {type(module).__name__} is in training mode (dropout and batch "
                          "norm compute something else there); call model.eval() before importing")


def _same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride()
            and a.dtype == b.dtype)


def bind_aliases(bundle: Bundle, state_dict: Mapping[str, torch.Tensor]) -> None:
    """Tied parameters: keys sharing one tensor are bound to every use of that tensor.

    torch.export names a tied tensor once, FX by whichever attribute the code read; either way each
    key of the tie ends up with one binding per use, so ``roles.uses(key)`` lists all of them and
    both importers give the same role map.
    """
    from torchlean_bridge.roles import Binding, RoleMap
    groups: list[list[str]] = []
    for key, tensor in state_dict.items():
        if not isinstance(tensor, torch.Tensor):
            continue
        group = next((g for g in groups if _same_tensor(state_dict[g[0]], tensor)), None)
        if group is None:
            groups.append([key])
        else:
            group.append(key)
    tied = [g for g in groups if len(g) > 1 and any(k in bundle.roles for k in g)]
    if not tied:
        return
    members = {k for g in tied for k in g}
    bindings = [b for b in bundle.roles.bindings() if b.key not in members]
    for group in tied:
        uses = sorted({(b.node, b.role, b.transform) for k in group for b in bundle.roles.uses(k)},
                      key=lambda u: (u[0], u[1], u[2] or ""))
        bindings += [Binding(k, node, role, transform) for k in group for node, role, transform in uses]
    bundle.roles = RoleMap(bindings)
    unused = [k for k in bundle.report.get("unused_tensors", []) if k not in members]
    if unused:
        bundle.report["unused_tensors"] = unused
    else:
        bundle.report.pop("unused_tensors", None)
    bundle.report["tied_tensors"] = [sorted(g) for g in tied]
