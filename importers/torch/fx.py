"""``import_fx``: a module traced with ``torch.fx.symbolic_trace`` (or a given ``GraphModule``).

Shapes come from running the example inputs through ``ShapeProp``; each FX node is lowered by the
lowering registered for its target (leaf module, function or method; see ``targets``). ``torch.nn``
leaf modules FX cannot trace into (``nn.MultiheadAttention``, ``nn.TransformerEncoderLayer``) and
functions FX kept whole (``torch.fx.wrap``) are exported with torch.export and their ATen program is
inlined, with parameters bound under their keys.
"""

from __future__ import annotations

import traceback
from typing import Any, Sequence

import torch
from torch.fx.passes.shape_prop import ShapeProp

from torchlean_bridge.bundle import Bundle
from torchlean_bridge.errors import BridgeError, UnsupportedError

from .common import (TRAINING_NOTE, NotLowerable, Sym, bind_aliases, check_static, check_training, element_type, flat_values,
                     preserved_state)
from .program import TorchLowerer
from .targets import module_lowering

__all__ = ["import_fx", "trace", "trace_failure"]

# frames of torch and of this package are not the model's line
_OWN_FRAMES = (str(torch.__file__).rsplit("/", 1)[0] + "/", __file__.rsplit("/", 2)[0] + "/")


class _Tracer(torch.fx.Tracer):
    """The default tracer, recording stack traces so every node knows its source line."""

    def __init__(self) -> None:
        super().__init__()
        self.record_stack_traces = True


def trace(module: torch.nn.Module) -> torch.fx.GraphModule:
    """``symbolic_trace`` with stack traces; a failure names its actual cause and the model's line."""
    tracer = _Tracer()
    try:
        graph = tracer.trace(module)
    except Exception as e:  # noqa: BLE001 - tracing raises whatever the model code raises
        raise BridgeError(trace_failure(module, e)[:700]) from e
    return torch.fx.GraphModule(tracer.root, graph, type(module).__name__)


def trace_failure(module: torch.nn.Module, error: BaseException) -> str:
    """Why symbolic tracing stopped: data-dependent control flow (a Proxy used as a bool or an
    iterator: fx's TraceError) or another error of the model's Python on proxies (a TypeError from
    slicing with a Proxy, ...), at the innermost line of model code; either way torch.export, which
    runs the real Python on example tensors, may succeed."""
    first = str(error).strip().splitlines()[0] if str(error).strip() else ""
    frames = [f for f in traceback.extract_tb(error.__traceback__) if not f.filename.startswith(_OWN_FRAMES)]
    where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    if isinstance(error, torch.fx.proxy.TraceError):
        cause = f"data-dependent control flow cannot be traced ({first})"
    else:
        cause = f"{type(error).__name__}: {first}; the model's Python does not run on symbolic values there"
    return (f"fx import: symbolic tracing of {type(module).__name__} failed{where}: {cause}; use import_export "
            "(torch.export) instead")


def import_fx(module_or_graph_module: torch.nn.Module, example_inputs: Sequence[Any] | Any, *,
              max_elements: int | None = None) -> Bundle:
    """Import an ``nn.Module`` or ``torch.fx.GraphModule`` evaluated on ``example_inputs``; the
    module is left as it was (``preserved_state``)."""
    module = module_or_graph_module
    if not isinstance(module, torch.nn.Module):
        raise BridgeError(f"fx import: expected an nn.Module or GraphModule, got {type(module).__name__}")
    check_training(module, "fx")
    with preserved_state(module):
        return _import_fx(module, example_inputs, max_elements)


def _import_fx(module: torch.nn.Module, example_inputs: Sequence[Any] | Any, max_elements: int | None) -> Bundle:
    args = tuple(example_inputs) if isinstance(example_inputs, (list, tuple)) else (example_inputs,)
    keys = list(module.state_dict())
    if not isinstance(module, torch.fx.GraphModule) and _Tracer().is_leaf_module(module, ""):
        cx = TorchLowerer("fx", root=module, state_dict_keys=keys, max_elements=max_elements)
        inputs = [_input(cx, f"x{i}", a) for i, a in enumerate(args)]
        lower = module_lowering(type(module))
        try:
            result = lower(cx, module, "", *inputs) if lower else cx.inline_module(module, "", inputs, {})
        except NotLowerable as e:
            raise UnsupportedError(f"fx import: {type(module).__name__}: {e.message}",
                                   items=[{"name": "", "target": type(module).__name__, "module": "",
                                           "location": None, "reason": e.message}]) from None
        outputs = flat_values(result)
        cx.raise_problems("nodes could not be lowered")
    else:
        before = {k: v.clone() for k, v in module.state_dict().items()}
        try:
            gm = module if isinstance(module, torch.fx.GraphModule) else trace(module)
            with torch.no_grad():
                ShapeProp(gm).propagate(*args)
        except BridgeError:
            raise
        except Exception as e:  # noqa: BLE001 - the model's own error on these inputs
            raise BridgeError(f"fx import: running the traced model on the example inputs failed: "
                              f"{type(e).__name__}: {e}"[:500]) from None
        finally:
            changed = _restore(module, before)
        if changed:
            raise BridgeError(f"fx import: the forward pass mutates {', '.join(changed)} (FX would bake one "
                              "update into the trace); import a forward that leaves its buffers unchanged")
        cx = TorchLowerer("fx", root=gm, state_dict_keys=keys, max_elements=max_elements)
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        seeds = set()
        for i, node in enumerate(placeholders):
            if i < len(args):
                cx.env[node] = _input(cx, node.name, args[i])
            elif node.args:
                cx.env[node] = node.args[0]  # the parameter's default value
            else:
                raise BridgeError(f"fx import: no example input for forward parameter `{node.name}`")
            if isinstance(cx.env[node], Sym):
                seeds.add(node)
        outputs = cx.run(gm.graph, seeds)
    cx.unused_keys = set(keys)
    bundle = cx.finish(outputs, {"framework": "fx", "model": type(module).__name__})
    bundle = bind_aliases(bundle, module.state_dict())
    if module.training:  # check_training let it through: nothing in it depends on the mode
        bundle.report["notes"] = list(bundle.report.get("notes", ())) + [TRAINING_NOTE]
    return bundle


def _restore(module: torch.nn.Module, before: dict[str, torch.Tensor]) -> list[str]:
    """Put back any state the trace changed; returns the keys that changed."""
    state = module.state_dict()
    changed = [k for k, v in before.items() if k in state and not torch.equal(state[k], v)]
    if changed:
        module.load_state_dict(before, strict=False)
    return changed


def _input(cx: TorchLowerer, name: str, value: Any) -> Any:
    """A graph input for a tensor example; other example values are constants of the trace."""
    if not isinstance(value, torch.Tensor):
        return value
    shape = check_static(value.shape, f"fx import: input {name}")
    return Sym(cx.builder.input(shape, dtype=element_type(value.dtype), source={"name": name, "target": "input"}))
