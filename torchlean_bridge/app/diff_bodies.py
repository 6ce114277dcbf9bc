"""The bodies of the functions FX keeps as one call, run node by node for the FX oracle.

``symbolic_trace`` records a ``torch.fx.wrap``'d function (torchvision's ``stochastic_depth``, Swin's
``shifted_window_attention``) as one ``call_function`` node, but the FX importer lowers its body:
it exports the call with torch.export and inlines that ATen program, naming each node
``<call>.<body node>``. So that every inlined node has a counterpart, the oracle exports the same
body once per call (on the call's own arguments, at the first run) and records the program's values
under those names each run; the literal and operand look-ups the finer oracle makes reach inside it.
"""

from __future__ import annotations

from typing import Any, Callable, Hashable, MutableMapping

import numpy as np

__all__ = ["FunctionBodies"]


def _inlined(target: Any) -> bool:
    """The FX importer's own test: a model function without a registered lowering is inlined."""
    from importers.torch.program import is_model_function
    from importers.torch.targets import function_lowering
    return function_lowering(target) is None and is_model_function(target)


def lifted_constant(program: Any, node: Any) -> Any:
    """The tensor a placeholder of ``program`` feeds when it is a lifted constant or a non-persistent
    buffer (not a parameter, a checkpoint buffer or an input); None otherwise."""
    from torch.export.graph_signature import InputKind
    if node.op != "placeholder":
        return None
    spec = next((s for s in program.graph_signature.input_specs if getattr(s.arg, "name", None) == node.name), None)
    if spec is None or spec.kind not in (InputKind.CONSTANT_TENSOR, InputKind.BUFFER):
        return None
    if spec.kind == InputKind.BUFFER and spec.target in program.state_dict:
        return None  # a persistent buffer is a checkpoint tensor, compared through the role map
    return program.constants.get(spec.target)


def lifted_arguments(program: Any, user_inputs: list[Any]) -> list[Any]:
    """The program's placeholders in order: user inputs, then its state and lifted constants."""
    from torch.export.graph_signature import InputKind
    args, user = [], iter(user_inputs)
    for spec in program.graph_signature.input_specs:
        if spec.kind == InputKind.USER_INPUT:
            args.append(next(user))
        elif spec.target in program.state_dict:
            args.append(program.state_dict[spec.target])
        else:
            args.append(program.constants[spec.target])
    return args


class FunctionBodies:
    """The exported body of each call the FX importer inlines, by the call's FX node name."""

    def __init__(self, graph_module: Any, recorder: Callable[[Any, dict[str, np.ndarray]], Any]) -> None:
        self.recorder = recorder  # (graph module, record) -> an interpreter storing each node's value
        self.calls = {n.name for n in graph_module.graph.nodes if n.op == "call_function" and _inlined(n.target)}
        self.programs: dict[str, Any] = {}
        self.refused: dict[str, str] = {}  # call name -> why its body could not be exported

    def record(self, name: str, fn: Any, args: Any, kwargs: dict[str, Any],
               record: MutableMapping[Hashable, np.ndarray]) -> None:
        """Run call ``name``'s body on its arguments, storing each value as ``<name>.<node>``. The body is
        exported as the importer exports it: tensor arguments are the program's inputs, the rest constants."""
        import torch
        import torch.utils._pytree as pytree
        from importers.torch.program import TENSOR_SLOT, FunctionCall

        leaves, spec = pytree.tree_flatten((tuple(args), dict(kwargs)))
        tensors = [v.detach() for v in leaves if isinstance(v, torch.Tensor)]
        if name in self.refused:
            return
        program = self.programs.get(name)
        if program is None:
            constants = [TENSOR_SLOT if isinstance(v, torch.Tensor) else v for v in leaves]
            try:
                with torch.enable_grad():  # as the importer exports it (outside the runner's no_grad)
                    program = torch.export.export(FunctionCall(fn, spec, constants), tuple(tensors), strict=False)
            except Exception as e:  # noqa: BLE001 - export raises many exception types
                # the reference module need not be the one imported (a user's trusted module may wrap
                # functions the bundle never held): this call then records only its result, and any
                # inlined node it would have matched stays uncompared, as the coverage line says
                self.refused[name] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
                return
            self.programs[name] = program
        inner: dict[str, np.ndarray] = {}
        self.recorder(program.graph_module, inner).run(*lifted_arguments(program, tensors))
        record.update((f"{name}.{k}", v) for k, v in inner.items())

    def split(self, key: str) -> tuple[Any, str] | None:
        """(program, body node name) for a key ``<call>.<node>`` of an exported body, else None."""
        call, _, node = key.partition(".")
        program = self.programs.get(call)
        return (program, node) if program is not None and node else None
