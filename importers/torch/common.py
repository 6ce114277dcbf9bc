"""What the torch.fx and torch.export importers share: import-time values and node helpers.

A value in the lowerer's environment is a ``Sym`` (an IR node computed from the inputs), a
``Known`` tensor (import-time value: a parameter, buffer, constant or folded result, materialized as
a ``const`` node only when an op reads it as data), or a plain Python value (ints, shapes, tuples).
This module depends on no dispatch table, so the lowerer, the op modules and the tables import it
without a cycle.
"""

from __future__ import annotations

import contextlib
import copy
import math
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Mapping

import torch

from importers.errors import NotLowerable
from torchlean_bridge.bundle import Bundle
from torchlean_bridge.errors import BridgeError
from torchlean_bridge.ops import BOOL, FLOAT, INT64

__all__ = ["Known", "Sym", "DataDependent", "Lowering", "NotLowerable", "FOLD_BLOCKLIST", "element_type",
           "normalize_axis",
           "flat_values", "map_values", "source_line", "module_path", "target_name", "op_base_name",
           "is_shape_query", "data_operands", "is_inplace_overload", "check_static", "check_training", "TRAINING_NOTE",
           "preserved_state",
           "bind_aliases", "prod"]

# ops that must never be folded even when their operands are known (randomness, side effects)
FOLD_BLOCKLIST = frozenset({
    "rand", "randn", "randint", "randperm", "rand_like", "randn_like", "randint_like", "bernoulli", "normal",
    "uniform", "multinomial", "poisson", "exponential", "dropout", "native_dropout", "feature_dropout",
    "alpha_dropout", "dropout1d", "dropout2d", "dropout3d", "empty", "empty_like", "new_empty", "empty_strided"})


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


class DataDependent:
    """An output whose positions depend on the values (sort/topk indices): no IR op computes it, so a
    graph that uses it is refused at the use, naming it."""

    def __init__(self, what: str) -> None:
        self.what = what

    def __repr__(self) -> str:
        return f"<{self.what}: positions that depend on the values have no IR op; only the values are supported>"

    def __getattr__(self, name: str) -> Any:  # any use as a tensor (x.float(), x.shape, ...) is refused
        if name.startswith("__"):
            raise AttributeError(name)
        raise self.refusal()

    def refusal(self) -> NotLowerable:
        return NotLowerable(f"{self.what} are used: positions that depend on the values have no IR op (only "
                            "the values are supported)")


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


def flat_values(value: Any) -> list[Any]:
    """Leaves of nested tuples/lists/dicts (model outputs) in order."""
    if isinstance(value, (list, tuple)):
        return [leaf for v in value for leaf in flat_values(v)]
    if isinstance(value, Mapping):
        return [leaf for v in value.values() for leaf in flat_values(v)]
    return [value]


def map_values(value: Any, fn: Callable[[Any], Any]) -> Any:
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(map_values(v, fn) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(map_values(v, fn) for v in value)
    if isinstance(value, dict):
        return {k: map_values(v, fn) for k, v in value.items()}
    if isinstance(value, slice):
        return slice(fn(value.start), fn(value.stop), fn(value.step))
    return fn(value)


_FRAME = re.compile(r'File "([^"]+)", line (\d+)')
_TORCH_DIR = str(torch.__file__).rsplit("/", 1)[0] + "/"  # the slash: torchvision/, timm/ are model code
_IMPORTERS_DIR = __file__.rsplit("/", 2)[0] + "/"  # our own frames (an inlined function's wrapper) neither


def source_line(stack_trace: str | None) -> str | None:
    """``file.py:12`` of the innermost frame of model code.

    User code wins; inside ``torch.nn`` containers the library module's own line is the source;
    frames of the tracing machinery (``torch/fx``, ``torch/_*``, ``torch/export``) never are.
    """
    if not stack_trace:
        return None
    frames = _FRAME.findall(stack_trace)
    user = [f for f in frames if not f[0].startswith((_TORCH_DIR, _IMPORTERS_DIR))]
    library = [f for f in frames if f[0].startswith(_TORCH_DIR + "nn/")]
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


def is_shape_query(node: torch.fx.Node) -> bool:
    """``x.size()``, ``x.shape``, ``x.dim()``, ``sym_size``: the answer is a number, not data."""
    if node.op == "call_method":
        return node.target in ("size", "dim", "numel")
    if node.op == "call_function":
        if node.target is getattr:
            return len(node.args) > 1 and node.args[1] in ("shape", "ndim", "dtype", "device")
        return str(node.target).startswith("aten.sym_size")
    return False


def is_inplace_overload(target: Any) -> bool:
    """An ATen overload whose schema writes its first (positional) argument: ``aten.add_.Tensor``."""
    schema = getattr(target, "_schema", None)
    if schema is None or not schema.arguments:
        return False
    alias = schema.arguments[0].alias_info
    return bool(alias is not None and alias.is_write and not schema.arguments[0].kwarg_only)


# ops whose value depends on their first operand's shape and dtype only (``x.new_zeros(...)``)
SHAPE_OF_FIRST = frozenset({"new_zeros", "new_ones", "new_full", "new_empty", "zeros_like", "ones_like",
                            "full_like", "empty_like"})


def data_operands(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The nodes whose *values* ``node`` reads: a shape query reads none, ``x.new_zeros(n)`` not x."""
    if is_shape_query(node):
        return []
    operands = list(node.all_input_nodes)
    if node.op in ("call_method", "call_function") and op_base_name(node) in SHAPE_OF_FIRST and node.args \
            and isinstance(node.args[0], torch.fx.Node) and node.args[0] in operands:
        operands.remove(node.args[0])
    return operands


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


def mode_dependent_layers(module: torch.nn.Module) -> list[str]:
    """Submodules that compute something else in training mode: active dropout, batch norm, instance norm
    with running statistics, recurrent or attention layers with dropout."""
    nn = torch.nn
    found = []
    for name, sub in module.named_modules():
        dropout = isinstance(sub, nn.modules.dropout._DropoutNd) and sub.p > 0
        norm = isinstance(sub, nn.modules.batchnorm._BatchNorm) or (
            isinstance(sub, nn.modules.instancenorm._InstanceNorm) and sub.track_running_stats)
        inner = isinstance(sub, (nn.RNNBase, nn.MultiheadAttention)) and getattr(sub, "dropout", 0) > 0
        if dropout or norm or inner:
            found.append(f"{name or '(root)'} ({type(sub).__name__})")
    return found


TRAINING_NOTE = ("the module was in training mode; no layer of it depends on the mode (no dropout, batch norm, "
                 "...), so it was imported as it is")


def check_training(module: torch.nn.Module, framework: str) -> bool:
    """Refuse a module in training mode whose layers depend on the mode, naming them; True when the module
    was in training mode but nothing depends on it (the importer says so in a note)."""
    if not module.training:
        return False
    layers = mode_dependent_layers(module)
    if layers:
        shown = ", ".join(layers[:5]) + (f" and {len(layers) - 5} more" if len(layers) > 5 else "")
        raise BridgeError(f"{framework} import: {type(module).__name__} is in training mode, where {shown} "
                          f"compute something else; call model.eval() before importing")
    return True


@contextlib.contextmanager
def preserved_state(module: torch.nn.Module) -> Iterator[None]:
    """Leave the user's module as it was: tracing runs its Python, which may cache values in its
    attributes (timm's LeViT stores attention biases in a dict; an fx trace left Proxy objects there).
    Every submodule's attributes, and the contents of its dict/list/set attributes, are put back."""
    saved = []
    for sub in module.modules():
        state = vars(sub)
        saved.append((state, dict(state), {k: copy.copy(v) for k, v in state.items()
                                           if type(v) in (dict, list, set)}))
    try:
        yield
    finally:
        for state, attributes, contents in saved:
            for key in [k for k in state if k not in attributes]:
                del state[key]
            state.update(attributes)
            for key, content in contents.items():
                container = attributes[key]
                container.clear()
                container.update(content) if not isinstance(container, list) else container.extend(content)


def _same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride()
            and a.dtype == b.dtype)


def bind_aliases(bundle: Bundle, state_dict: Mapping[str, torch.Tensor]) -> Bundle:
    """Tied parameters: the keys sharing one tensor (by storage), bound to every use of it by
    ``passes.bind_tied_weights``."""
    from torchlean_bridge.passes import bind_tied_weights
    groups: list[list[str]] = []
    for key, tensor in state_dict.items():
        if not isinstance(tensor, torch.Tensor):
            continue
        group = next((g for g in groups if _same_tensor(state_dict[g[0]], tensor)), None)
        if group is None:
            groups.append([key])
        else:
            group.append(key)
    report = {**bundle.report, "tied_tensors": [g for g in groups if len(g) > 1]}
    return bind_tied_weights(Bundle(bundle.graph, bundle.payload, bundle.roles, report))[0]
