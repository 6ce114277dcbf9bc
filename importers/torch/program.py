"""The lowerer that knows every table, and the binding of an exported program's placeholders.

``TorchLowerer.resolve`` dispatches by target kind: ATen overloads (torch.export, and programs the
FX importer inlines), FX functions and methods, leaf modules. ``bind_program`` reads parameter,
buffer and constant roles from the public ``ExportedProgram.graph_signature`` only and refuses
programs that mutate buffers or inputs.
"""

from __future__ import annotations

import inspect
from typing import Any, Sequence

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind, TensorArgument

from torchlean_bridge.bundle import Bundle
from torchlean_bridge.errors import BridgeError

# the op modules register their targets when imported; the lowerer resolves through the tables
from . import modules, ops_elementwise, ops_index, ops_layout, ops_nn, ops_rearrange, ops_reduce  # noqa: F401
from . import ops_resize  # noqa: F401
from . import ops_select  # noqa: F401 - pooling indices, unpooling (issue #15)
from . import ops_spatial  # noqa: F401  (grid_sample, affine_grid, fold, lp_pool: issue #15)
from . import ops_misc  # noqa: F401 - cumprod, det (issue #15)
from .common import Known, Lowering, NotLowerable, Sym, check_static, element_type
from .lowerer import Lowerer
from .targets import OTHER_EMITTED_KINDS, aten_lowering, function_lowering, method_lowering, module_lowering

__all__ = ["EMITTED_KINDS", "TorchLowerer", "ModuleCall", "FunctionCall", "TENSOR_SLOT", "is_model_function",
           "bind_program", "bind_and_run", "graph_inputs", "IGNORED_KWARGS"]

# every IR kind a lowering can emit (docs/make_ops_md.py): a kind added to an elementwise table is in
EMITTED_KINDS: frozenset[str] = OTHER_EMITTED_KINDS | frozenset(ops_elementwise.UNARY_LOWERINGS) \
    | frozenset(ops_elementwise.COMPARE)

# keyword arguments that say where or how a tensor is stored, never what it holds
IGNORED_KWARGS = frozenset({"device", "layout", "pin_memory", "memory_format", "non_blocking", "copy"})


class ModuleCall:
    """A module lowering bound to its module and path: called ``(cx, *args)``, with the signature of
    the lowering after ``(cx, module, path)`` (so arguments are checked against what it takes)."""

    def __init__(self, lower: Lowering, module: torch.nn.Module, path: str) -> None:
        self.lower, self.module, self.path = lower, module, path
        params = list(inspect.signature(lower).parameters.values())
        self.__signature__ = inspect.Signature(params[:1] + params[3:])

    def __call__(self, cx: Lowerer, *args: Any, **kwargs: Any) -> Any:
        return self.lower(cx, self.module, self.path, *args, **kwargs)


def is_model_function(target: Any) -> bool:
    """A Python function of the model's code (not torch's own): FX keeps it as one call only when it
    was wrapped (``torch.fx.wrap``), and its body can be lowered."""
    module = getattr(target, "__module__", None) or ""
    return inspect.isfunction(target) and module != "torch" and not module.startswith("torch.")


class FunctionBody:
    """The lowering of a wrapped function: its body, exported and inlined (``inline_function``)."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def __call__(self, cx: "TorchLowerer", *args: Any, **kwargs: Any) -> Any:
        return cx.inline_function(self.fn, args, kwargs)


class _TensorSlot:
    def __repr__(self) -> str:
        return "<tensor>"


TENSOR_SLOT = _TensorSlot()  # where a tensor argument goes among a wrapped call's constant arguments


class FunctionCall(torch.nn.Module):
    """``fn`` as a module whose inputs are the call's tensor arguments (the rest are constants)."""

    def __init__(self, fn: Any, spec: Any, constants: Sequence[Any]) -> None:
        super().__init__()
        self.fn, self.spec, self.constants = fn, spec, list(constants)

    def forward(self, *tensors: torch.Tensor) -> Any:
        given = iter(tensors)
        leaves = [next(given) if c is TENSOR_SLOT else c for c in self.constants]
        args, kwargs = torch.utils._pytree.tree_unflatten(leaves, self.spec)
        return self.fn(*args, **kwargs)


class TorchLowerer(Lowerer):
    """The lowerer of both importers; ``root`` is the module FX attributes and submodules live on."""

    def __init__(self, framework: str, root: torch.nn.Module | None = None,
                 state_dict_keys: Sequence[str] = (), max_elements: int | None = None) -> None:
        self.framework = framework
        super().__init__(max_elements)
        self.root = root
        self.state_keys = set(state_dict_keys)
        self.constant_names: set[str] = set()  # model tensors outside state_dict(), folded without a key
        self.function_programs: dict[Any, ExportedProgram] = {}  # inlined function bodies, by call signature

    # -- targets --------------------------------------------------------------------------------
    def resolve(self, node: torch.fx.Node) -> Lowering | None:
        if node.op == "call_function":
            if isinstance(node.target, torch._ops.OpOverload):
                return aten_lowering(node.target)
            lower = function_lowering(node.target)
            if lower is None and is_model_function(node.target):
                return FunctionBody(node.target)
            return lower
        if node.op == "call_method":
            return method_lowering(node.target)
        if node.op == "call_module":
            module = self.submodule(node)
            lower = module_lowering(type(module))
            if lower is not None:
                return ModuleCall(lower, module, self.path(node))
            if type(module).__module__.startswith("torch.nn"):
                return lambda cx, *a, **k: cx.inline_module(module, self.path(node), a, k)
        return None

    def call(self, n: torch.fx.Node, lower: Lowering, args: Any, kwargs: dict[str, Any]) -> Any:
        kwargs = {("input" if k == "self" else k): v for k, v in kwargs.items() if k not in IGNORED_KWARGS}
        return super().call(n, lower, args, kwargs)

    def path(self, node: torch.fx.Node) -> str:
        return ".".join(p for p in (self.module_prefix, str(node.target)) if p)

    def submodule(self, node: torch.fx.Node) -> torch.nn.Module | None:
        if node.op != "call_module" or self.root is None:
            return None
        return self.root.get_submodule(str(node.target))

    # -- tensors from the model -----------------------------------------------------------------
    def known_tensor(self, key: str, tensor: torch.Tensor) -> Known:
        """A model tensor: bound to ``key`` only if state_dict() has it, else a folded constant."""
        if key in self.state_keys:
            return Known(tensor.detach(), key=key, pinned=True)
        return self.constant(key, tensor)

    def constant(self, name: str, tensor: torch.Tensor) -> Known:
        """A tensor no checkpoint carries (non-persistent buffer, plain attribute, lifted constant)."""
        self.constant_names.add(name)
        return Known(tensor.detach().clone(), folded=True)  # a copy: folded in-place writes stay ours

    def param(self, path: str, name: str) -> Known | None:
        """A module's parameter or buffer as a Known bound to its state_dict key."""
        local = path[len(self.module_prefix) + 1:] if self.module_prefix and path.startswith(self.module_prefix) \
            else path
        module = self.root.get_submodule(local) if self.root is not None else None
        tensor = getattr(module, name, None)
        if tensor is None:
            return None
        return self.known_tensor(f"{path}.{name}" if path else name, tensor)

    def get_attr(self, n: torch.fx.Node) -> Any:
        target = str(n.target)
        value: Any = self.root
        for part in target.split("."):
            value = getattr(value, part)
        if isinstance(value, torch.Tensor):
            if target.startswith("_tensor_constant"):  # a literal tensor FX lifted while tracing
                return Known(value.detach().clone(), folded=True)
            return self.known_tensor(".".join(p for p in (self.module_prefix, target) if p), value)
        if isinstance(value, torch.nn.Module):
            raise NotLowerable("a submodule used as a value (higher-order op)")
        return value

    def finish(self, outputs: Sequence[Any], report: dict[str, Any]) -> Bundle:
        if self.constant_names:
            report = {**report, "constants": sorted(self.constant_names)}
        return super().finish(outputs, report)

    # -- submodules FX cannot trace -------------------------------------------------------------
    def inline_module(self, module: torch.nn.Module, path: str, args: Sequence[Any],
                      kwargs: dict[str, Any]) -> Any:
        """Export a leaf module with torch.export and lower its ATen program in place.

        ``nn.MultiheadAttention`` and ``nn.TransformerEncoderLayer`` contain control flow that
        symbolic tracing cannot follow; exporting the submodule on example tensors of the
        recorded shapes gives its exact ATen program, whose tensors are bound under ``path``.
        """
        examples = [self.example(a) for a in args]
        kw_examples = {k: self.example(v) for k, v in kwargs.items()}
        try:
            ep = torch.export.export(module, tuple(examples), kwargs=kw_examples, strict=False)
        except Exception as e:  # noqa: BLE001 - export raises many exception types
            raise NotLowerable(f"torch.export of this leaf module failed: {type(e).__name__}: "
                               f"{str(e).splitlines()[0] if str(e) else ''}"[:300]) from None
        flat_inputs = torch.utils._pytree.tree_leaves((tuple(args), kwargs))
        keys = {f"{path}.{k}" if path else k for k in module.state_dict()}
        return self.run_inlined(ep, flat_inputs, path, path, module, keys)

    def inline_function(self, fn: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
        """Lower the body of a Python function FX kept as one call (``torch.fx.wrap``: torchvision's
        ``stochastic_depth``, Swin's ``shifted_window_attention``): export it on example tensors of
        the recorded shapes and lower its ATen program in place. Its tensor arguments are the
        program's inputs, so model tensors passed in keep their keys; other arguments are constants."""
        leaves, spec = torch.utils._pytree.tree_flatten((tuple(args), dict(kwargs)))
        tensors = [v for v in leaves if isinstance(v, (Sym, Known, torch.Tensor))]
        constants = [TENSOR_SLOT if isinstance(v, (Sym, Known, torch.Tensor)) else v for v in leaves]
        examples = [self.example(v) for v in tensors]
        key = (fn, str(spec), repr(constants), tuple((tuple(e.shape), e.dtype) for e in examples))
        ep = self.function_programs.get(key)
        if ep is None:
            try:
                ep = torch.export.export(FunctionCall(fn, spec, constants), tuple(examples), strict=False)
            except Exception as e:  # noqa: BLE001 - export raises many exception types
                raise NotLowerable(f"torch.export of this function's body failed: {type(e).__name__}: "
                                   f"{str(e).splitlines()[0] if str(e) else ''}"[:300]) from None
            self.function_programs[key] = ep
        info = self.describe(self.current) if self.current is not None else {"name": "", "module": None}
        return self.run_inlined(ep, tensors, info["module"] or "", info["name"], self.root, self.state_keys)

    def run_inlined(self, ep: ExportedProgram, inputs: Sequence[Any], module_prefix: str, name_prefix: str,
                    root: torch.nn.Module | None, state_keys: set[str]) -> Any:
        """Lower an exported program in place of one node; its problems become that node's problem."""
        saved = (self.module_prefix, self.name_prefix, self.problems, self.root, self.state_keys)
        self.module_prefix, self.name_prefix, self.problems, self.root = module_prefix, name_prefix, [], root
        self.state_keys = state_keys | saved[4]
        try:
            outputs = bind_and_run(self, ep, inputs)
        finally:
            self.module_prefix, self.name_prefix, self.problems, self.root, self.state_keys = saved
        return torch.utils._pytree.tree_unflatten(outputs, ep.call_spec.out_spec)

    def example(self, v: Any) -> Any:
        if isinstance(v, Sym):
            dtype = {"float": torch.float32, "int64": torch.int64, "bool": torch.bool}[self.builder.dtype(v.nid)]
            return torch.zeros(self.shape(v), dtype=dtype)
        if isinstance(v, Known):
            return v.tensor
        if isinstance(v, (list, tuple)):
            return type(v)(self.example(x) for x in v)
        return v


def bind_program(cx: TorchLowerer, ep: ExportedProgram, user_values: Sequence[Any]) -> set[torch.fx.Node]:
    """Bind every placeholder from the public graph signature; returns the input-dependent seeds."""
    sig = ep.graph_signature
    mutations = [f"{o.kind.name.lower()} {o.target}" for o in sig.output_specs if o.kind != OutputKind.USER_OUTPUT]
    if mutations:
        raise BridgeError(f"{cx.framework} import: the program mutates state ({', '.join(mutations)}); "
                          "call model.eval() and import a model whose forward does not update buffers or inputs")
    placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    constants = dict(ep.constants)
    state = ep.state_dict
    prefix = cx.module_prefix
    tensors = [v for v in user_values if isinstance(v, (Sym, Known, torch.Tensor))]
    seeds: set[torch.fx.Node] = set()
    for spec in sig.input_specs:
        node = placeholders[spec.arg.name]
        key = ".".join(p for p in (prefix, spec.target or "") if p)
        if spec.kind == InputKind.USER_INPUT:
            if not isinstance(spec.arg, TensorArgument):
                cx.env[node] = getattr(spec.arg, "value", None)
                continue
            if not tensors:
                raise BridgeError(f"{cx.framework} import: the program has more tensor inputs than were given")
            v = tensors.pop(0)
            if isinstance(v, torch.Tensor):
                v = Known(v, folded=True)
            cx.env[node] = v
            if isinstance(v, Sym):
                seeds.add(node)
        elif spec.kind == InputKind.PARAMETER:
            cx.env[node] = Known(state[spec.target].detach(), key=key, pinned=True)
        elif spec.kind == InputKind.BUFFER and spec.persistent is not False and spec.target in state:
            cx.env[node] = Known(state[spec.target].detach(), key=key, pinned=True)
        elif spec.kind in (InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            cx.env[node] = cx.constant(key, constants[spec.target])
        else:
            raise BridgeError(f"{cx.framework} import: unsupported program input kind {spec.kind.name} "
                              f"({spec.arg.name})")
    return seeds


def bind_and_run(cx: TorchLowerer, ep: ExportedProgram, user_values: Sequence[Any]) -> list[Any]:
    seeds = bind_program(cx, ep, user_values)
    return cx.run(ep.graph, seeds)


def graph_inputs(cx: TorchLowerer, ep: ExportedProgram) -> list[Any]:
    """One IR input per tensor user input, with the program's static shape and element type."""
    out: list[Any] = []
    placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    for spec in ep.graph_signature.input_specs:
        if spec.kind != InputKind.USER_INPUT:
            continue
        if not isinstance(spec.arg, TensorArgument):
            out.append(getattr(spec.arg, "value", None))
            continue
        node = placeholders[spec.arg.name]
        val = node.meta.get("val")
        if val is None:
            raise BridgeError(f"{cx.framework} import: input {node.name} has no recorded shape")
        shape = check_static(val.shape, f"{cx.framework} import: input {node.name}")
        nid = cx.builder.input(shape, dtype=element_type(val.dtype),
                               source={"name": node.name, "target": "input"})
        out.append(Sym(nid))
    return out
