"""Framework targets, declared at each lowering: ATen overloads, FX callables, Tensor methods, modules.

A lowering names its targets where it is defined::

    @lowers(aten="sub.Tensor sub.Scalar", fx="torch.sub torch.subtract operator.sub operator.isub",
            methods="sub")
    def sub(cx, input, other, alpha=1): ...

and ``register`` does the same for lowerings made by a factory (``unary("relu")``). The four tables
below are filled by those registrations as the op modules are imported (``program`` imports all of
them); nothing else writes them. FX names are ``namespace.name`` with the namespaces of
``NAMESPACES``; a name the installed torch lacks is skipped. An in-place ``X_`` (method or ATen
overload) lowers as ``X``: the lowerer rebinds the mutated operand to the result. Aliases (one
operation, two names) are declared once, in ``ALIASES``, and follow every registration.
"""

from __future__ import annotations

import builtins
import operator
from typing import Any, Callable, Sequence, TypeVar

import torch
import torch.nn.functional as F

from .common import Lowering, is_inplace_overload

__all__ = ["ATEN", "FUNCTIONS", "METHODS", "MODULES", "NAMESPACES", "ALIASES", "ATEN_OVERLOAD_ALIASES",
           "OTHER_EMITTED_KINDS", "lowers",
           "register", "aten_lowering", "method_lowering", "function_lowering", "module_lowering"]

ATEN: dict[str, Lowering] = {}
FUNCTIONS: dict[Any, Lowering] = {}
METHODS: dict[str, Lowering] = {}
MODULES: dict[type, Lowering] = {}  # called as lower(cx, module, path, *args, **kwargs)

NAMESPACES: dict[str, Any] = {"torch": torch, "F": F, "operator": operator, "builtins": builtins,
                              "linalg": torch.linalg, "special": torch.special}

# One operation under a second name, every alias in one place: a registration names the canonical
# target and ``register`` adds its aliases as torch functions (same namespace), Tensor methods and
# ATen packets (same overload names). torch.export keeps the spelling the model used.
ALIASES: dict[str, str] = {
    "arctan": "atan", "arcsin": "asin", "arccos": "acos", "arctanh": "atanh", "arcsinh": "asinh",
    "arccosh": "acosh", "fix": "trunc", "absolute": "abs", "negative": "neg", "clip": "clamp",
    "subtract": "sub", "multiply": "mul", "divide": "div", "true_divide": "div", "swapdims": "transpose",
    "swapaxes": "transpose", "concat": "cat", "concatenate": "cat", "ger": "outer", "greater": "gt",
    "greater_equal": "ge", "less": "lt", "less_equal": "le", "not_equal": "ne",
}
# ATen aliases whose overload names differ from the canonical one's: alias overload -> canonical
ATEN_OVERLOAD_ALIASES: dict[str, str] = {"swapaxes.default": "transpose.int", "swapdims.default": "transpose.int"}

# the IR kinds lowerings emit beyond the elementwise tables (program.EMITTED_KINDS adds those);
# tests/test_import_torch_targets.py records what the lowerings actually emit on a corpus and compares
OTHER_EMITTED_KINDS: frozenset[str] = frozenset({
    "input", "const", "add", "sub", "mul_elem", "div", "softplus", "gelu", "leaky_relu", "elu", "celu", "clamp",
    "hardsigmoid", "round", "pow", "max_elem", "min_elem", "logical_and", "logical_or", "logical_not", "where",
    "cast", "softmax", "log_softmax", "reduce_sum", "reduce_mean", "sum", "reduce_sum_axes", "reduce_mean_axes",
    "reduce_max", "reduce_min", "reduce_prod", "argmax", "argmin", "matmul", "linear", "conv", "conv_transpose",
    "batch_norm_eval", "layernorm", "max_pool", "avg_pool", "max_pool_nd", "avg_pool_nd", "resize_linear", "cumsum",
    "resize", "topk_indices", "max_pool_indices", "max_unpool", "pow_elem", "int_pow", "int_add", "int_sub", "sort",
    "reshape", "permute", "transpose", "broadcast_to", "concat", "slice", "gather", "gather_elements", "pad",
}) | {"cumprod", "det"}  # importers/torch/ops_misc.py (issue #15)
OTHER_EMITTED_KINDS |= {"grid_sample", "col2im", "sign", "relu", "abs"}  # importers/torch/ops_spatial.py (issue #15)
OTHER_EMITTED_KINDS |= {"mod", "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not", "ne"}  # integer operators

L = TypeVar("L", bound=Callable[..., Any])


def _put(table: dict[Any, Lowering], key: Any, lowering: Lowering) -> None:
    if table.get(key, lowering) is not lowering:
        raise RuntimeError(f"torch importer: target {key!r} is declared by two lowerings")
    table[key] = lowering


def _with_aliases(name: str) -> list[str]:
    """``name`` and its aliases (``transpose`` -> ``transpose``, ``swapdims``, ``swapaxes``); an in-place
    name ``X_`` has the aliases of X, in place."""
    base, suffix = (name[:-1], "_") if name.endswith("_") and not name.startswith("_") else (name, "")
    return [name] + [alias + suffix for alias, canonical in ALIASES.items() if canonical == base]


def _aten_with_aliases(name: str) -> list[str]:
    packet, _, overload = name.partition(".")
    names = [f"{p}.{overload}" for p in _with_aliases(packet)]
    return names + [alias for alias, canonical in ATEN_OVERLOAD_ALIASES.items() if canonical == name]


def register(lowering: L, *, aten: str = "", fx: str = "", methods: str = "",
             modules: Sequence[type] = ()) -> L:
    """Declare the targets ``lowering`` lowers (space-separated names; see the module docstring)."""
    for name in aten.split():
        for spelling in _aten_with_aliases(name):
            _put(ATEN, f"aten.{spelling}", lowering)
    for qualified in fx.split():
        namespace, _, name = qualified.rpartition(".")
        for spelling in _with_aliases(name):
            target = getattr(NAMESPACES[namespace], spelling, None)
            if target is not None:
                _put(FUNCTIONS, target, lowering)
    for name in methods.split():
        for spelling in _with_aliases(name):
            _put(METHODS, spelling, lowering)
    for module_type in modules:
        _put(MODULES, module_type, lowering)
    return lowering


def lowers(*, aten: str = "", fx: str = "", methods: str = "", modules: Sequence[type] = ()) -> Callable[[L], L]:
    """``register`` as a decorator."""
    return lambda lowering: register(lowering, aten=aten, fx=fx, methods=methods, modules=modules)


def aten_lowering(target: Any) -> Lowering | None:
    """The lowering of an overload; ``aten.X_.overload`` lowers as ``aten.X.overload``."""
    name = str(target)
    lower = ATEN.get(name)
    if lower is None and is_inplace_overload(target):
        _, packet, overload = name.split(".", 2)
        lower = ATEN.get(f"aten.{packet[:-1]}.{overload}")
    return lower


def function_lowering(target: Any) -> Lowering | None:
    try:
        return FUNCTIONS.get(target)
    except TypeError:  # an unhashable callable is no registered target
        return None


def method_lowering(name: Any) -> Lowering | None:
    """A Tensor method; an in-place ``X_`` lowers as ``X``."""
    if not isinstance(name, str):
        return None
    lower = METHODS.get(name)
    if lower is None and name.endswith("_") and not name.startswith("_"):
        lower = METHODS.get(name[:-1])
    return lower


def module_lowering(module_type: type) -> Lowering | None:
    return MODULES.get(module_type)
