"""Runners for differential testing: one interface, every intermediate value captured.

A runner turns the graph inputs into ``{match key: value}`` covering every value it computed, and
names which keys are the model outputs (in order). Keys are what provenance recorded at import:
our evaluator uses node ids, PyTorch runners FX / torch.export node names, ONNX runners tensor
names. torch, onnx and onnxruntime are imported inside the runners that need them.
"""

from __future__ import annotations

from typing import Any, Hashable, Mapping, Sequence

import numpy as np

from ..bundle import Bundle
from ..errors import BridgeError
from .diff_bodies import FunctionBodies, lifted_arguments, lifted_constant

__all__ = ["Runner", "EvaluatorRunner", "TorchFXRunner", "TorchExportRunner", "OnnxRuntimeRunner",
           "OnnxReferenceRunner", "expose_all_values", "reference_parameters"]

Values = dict[Hashable, np.ndarray]


class Runner:
    """``run(inputs) -> {key: value}``; ``output_keys`` are the keys of the model outputs, in order."""

    name = "runner"
    output_keys: list[Hashable] = []
    input_precision: type = np.float32  # what the runner's float inputs are rounded to

    def rounded(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """The inputs exactly as this runner sees them, held in float64 for the reference."""
        return [x.astype(self.input_precision).astype(np.float64) if x.dtype.kind == "f" else x for x in inputs]

    def run(self, inputs: Sequence[np.ndarray]) -> Values:
        raise NotImplementedError


class EvaluatorRunner(Runner):
    """Our reference semantics at one precision, the whole value table keyed by node id."""

    def __init__(self, bundle: Bundle, dtype: str, exact: bool = False) -> None:
        from semantics.evaluate import evaluate
        from ..check import check
        check(bundle.graph)  # once, not on every input set
        self._evaluate = evaluate
        self.graph = bundle.graph
        self.payload = bundle.payload.astype(dtype)  # converted once, not on every input set
        self.dtype = dtype
        self.exact = exact  # the exact float64 mode: TorchLean's fold orders and C libm
        self.name = f"ours ({dtype}{', exact' if exact else ''})"
        self.output_keys = list(bundle.graph.outputs)

    def run(self, inputs: Sequence[np.ndarray]) -> Values:
        table = self._evaluate(self.graph, self.payload, list(inputs), dtype=self.dtype, all_nodes=True,
                               check=False, exact=self.exact)
        return {i: np.asarray(v) for i, v in enumerate(table)}


# -- PyTorch ----------------------------------------------------------------------------------

def _to_numpy(value: Any) -> np.ndarray | None:
    import torch
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().resolve_conj().resolve_neg().numpy().copy()
    return None


def _float_dtype_of(module: Any) -> Any:
    import torch
    for t in list(module.parameters()) + list(module.buffers()):
        if t.is_floating_point():
            return t.dtype
    return torch.float32


def _torch_inputs(inputs: Sequence[np.ndarray], float_dtype: Any) -> list[Any]:
    import torch
    out = []
    for x in inputs:
        t = torch.from_numpy(np.asarray(x, order="C"))
        out.append(t.to(float_dtype) if t.is_floating_point() else t)
    return out


def _recording_interpreter(graph_module: Any, record: dict[str, np.ndarray], bodies: Any = None) -> Any:
    """An FX Interpreter that stores every tensor a node produces under the node's name (and, for a
    call whose body the importer inlined, ``bodies`` records the body's values too)."""
    import torch.fx

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n: torch.fx.Node) -> Any:
            result = super().run_node(n)
            if bodies is not None and n.name in bodies.calls:
                bodies.record(n.name, n.target, *self.fetch_args_kwargs_from_env(n), record)
            if n.op != "output":
                value = _to_numpy(result)
                if value is None and type(result) in (int, float, bool):
                    value = np.asarray(result)  # a number the framework computed (a shape, a scale)
                if value is not None:
                    record[n.name] = value
            return result

    return Recorder(graph_module)


def _output_names(graph_module: Any) -> list[str]:
    """Names of the FX nodes the output node returns, flattened in pytree order."""
    import torch.fx
    import torch.utils._pytree as pytree
    out = next(n for n in graph_module.graph.nodes if n.op == "output")
    leaves = pytree.tree_leaves(out.args[0])
    return [leaf.name if isinstance(leaf, torch.fx.Node) else f"<constant {leaf!r}>" for leaf in leaves]


def _numeric_literals(graph_module: Any, name: str, constant: Any = None,
                      shapes: Mapping[str, tuple[int, ...]] | None = None) -> list[np.ndarray]:
    """The numbers an FX node was called with (scalars, number lists, constant tensors), as arrays;
    for ``scaled_dot_product_attention`` without ``scale``, its documented default 1/sqrt(E) too, E
    from the query's recorded shape (``meta["val"]``) or, where tracing recorded none (plain
    ``symbolic_trace``), from the shape of the value the run recorded for it (``shapes``)."""
    import torch
    import torch.fx
    node = next((n for n in graph_module.graph.nodes if n.name == name), None)
    if node is None:
        return []
    found: list[np.ndarray] = []

    def walk(arg: Any) -> None:
        if isinstance(arg, (list, tuple)) and arg and all(type(v) in (int, float) for v in arg):
            found.append(np.asarray(arg))  # a number list is one literal (an index list, a shape)
        if isinstance(arg, (list, tuple, dict)):
            for v in (arg.values() if isinstance(arg, dict) else arg):
                walk(v)
        elif type(arg) in (int, float, bool):
            found.append(np.asarray(arg))
        elif isinstance(arg, torch.Tensor):
            found.append(_to_numpy(arg))
        elif isinstance(arg, torch.fx.Node) and constant is not None:
            value = constant(arg)  # a lifted constant tensor (torch.export), not a computed value
            if value is not None:
                found.append(_to_numpy(value))

    walk([*node.args, *node.kwargs.values()])
    if "scaled_dot_product_attention" in str(node.target) and node.args:
        if "scale" not in node.kwargs:
            query = node.args[0] if isinstance(node.args[0], torch.fx.Node) else None
            recorded = getattr(query.meta.get("val"), "shape", None) if query is not None else None
            if recorded is None and query is not None and shapes is not None:
                recorded = shapes.get(query.name)
            if recorded is not None and len(recorded) and int(recorded[-1]) > 0:
                found.append(np.asarray(1.0 / np.sqrt(float(recorded[-1]))))
        mask = node.kwargs.get("attn_mask", node.args[3] if len(node.args) > 3 else None)
        mask_val = mask.meta.get("val") if isinstance(mask, torch.fx.Node) else None
        if node.kwargs.get("is_causal") or (mask_val is not None and mask_val.dtype == torch.bool):
            found.append(np.asarray(-np.inf))  # documented: a masked-out score is -inf before the softmax
    return found


def _operand_names(graph_module: Any, name: str) -> list[str]:
    """The names of the FX nodes FX node ``name`` takes as arguments (their recorded values are the
    oracle's own values of what a lowering folded from them)."""
    import torch.fx
    import torch.utils._pytree as pytree
    node = next((n for n in graph_module.graph.nodes if n.name == name), None)
    if node is None:
        return []
    return [a.name for a in pytree.tree_leaves([node.args, node.kwargs]) if isinstance(a, torch.fx.Node)]


class TorchFXRunner(Runner):
    """PyTorch eager, node by node through ``torch.fx.symbolic_trace`` (or the GraphModule given).

    A module symbolic tracing cannot handle (the importer then inlined it another way) runs as a
    whole: only its outputs (keys ``output:0``, ...) can be compared.
    """

    name = "torch (fx)"

    def __init__(self, module: Any) -> None:
        import torch
        import torch.fx
        self.float_dtype = _float_dtype_of(module)
        self.input_precision = np.float64 if self.float_dtype == torch.float64 else np.float32
        self.traced = True
        if isinstance(module, torch.fx.GraphModule):
            self.module = module
        else:
            try:
                self.module = torch.fx.symbolic_trace(module)
            except Exception:  # tracing raises whatever the model code raises
                self.module, self.traced = module, False
                self.name = "torch (eager, outputs only)"
        self.module.eval()
        self.output_keys = _output_names(self.module) if self.traced else []
        self.shapes: dict[str, tuple[int, ...]] = {}  # each recorded value's shape (static), from the runs
        self.bodies = FunctionBodies(self.module, _recording_interpreter) if self.traced else None

    def literals(self, name: str) -> list[np.ndarray]:
        """Numbers the FX node ``name`` (or node of an inlined body, ``<call>.<node>``) was called with
        (what a folded constant came from)."""
        if not self.traced:
            return []
        inner = self.bodies.split(name)
        if inner is not None:
            program, node = inner
            return _numeric_literals(program.graph_module, node, lambda n: lifted_constant(program, n),
                                     {k.partition(".")[2]: v for k, v in self.shapes.items()
                                      if k.startswith(name.partition(".")[0] + ".")})
        return _numeric_literals(self.module, name, shapes=self.shapes)

    def operand_keys(self, name: str) -> list[str]:
        """The keys of the values FX node ``name`` (or ``<call>.<node>``) was called with."""
        if not self.traced:
            return []
        inner = self.bodies.split(name)
        if inner is not None:
            call = name.partition(".")[0]
            return [f"{call}.{k}" for k in _operand_names(inner[0].graph_module, inner[1])]
        return _operand_names(self.module, name)

    def run(self, inputs: Sequence[np.ndarray]) -> Values:
        import torch
        import torch.utils._pytree as pytree
        record: dict[str, np.ndarray] = {}
        args = _torch_inputs(inputs, self.float_dtype)
        with torch.no_grad():
            if self.traced:
                _recording_interpreter(self.module, record, self.bodies).run(*args)
                self.shapes.update((k, v.shape) for k, v in record.items())
                return record
            leaves = [_to_numpy(v) for v in pytree.tree_leaves(self.module(*args))]
        self.output_keys = [f"output:{k}" for k in range(len(leaves))]
        return {key: v for key, v in zip(self.output_keys, leaves) if v is not None}


class TorchExportRunner(Runner):
    """PyTorch eager through the ``torch.export`` graph, keyed by its node names.

    Parameters, buffers and constants are fed from the exported program's public graph signature.
    """

    name = "torch (export)"

    def __init__(self, module_or_program: Any, example_inputs: Sequence[np.ndarray],
                 decompose: bool = False) -> None:
        import torch
        from torch.export import ExportedProgram
        if isinstance(module_or_program, ExportedProgram):
            program = module_or_program
        else:
            from importers.torch_export import export_program
            float_dtype = _float_dtype_of(module_or_program)
            program = export_program(module_or_program, tuple(_torch_inputs(example_inputs, float_dtype)))
        if decompose:
            program = program.run_decompositions()
        self.program = program
        self.float_dtype = next((t.dtype for t in program.state_dict.values() if t.is_floating_point()),
                                torch.float32)
        self.input_precision = np.float64 if self.float_dtype == torch.float64 else np.float32
        self.output_keys = [getattr(spec.arg, "name", "?") for spec in program.graph_signature.output_specs
                            if spec.kind.name == "USER_OUTPUT"]

    def literals(self, name: str) -> list[np.ndarray]:
        """Numbers the graph node ``name`` was called with (what a folded constant came from)."""
        return _numeric_literals(self.program.graph_module, name, self._constant)

    def operand_keys(self, name: str) -> list[str]:
        """The keys of the values graph node ``name`` was called with."""
        return _operand_names(self.program.graph_module, name)

    def _constant(self, node: Any) -> Any:
        """The tensor a placeholder feeds when it is a lifted constant (not a parameter or an input)."""
        return lifted_constant(self.program, node)

    def run(self, inputs: Sequence[np.ndarray]) -> Values:
        import torch
        record: dict[str, np.ndarray] = {}
        args = lifted_arguments(self.program, _torch_inputs(inputs, self.float_dtype))
        with torch.no_grad():
            _recording_interpreter(self.program.graph_module, record).run(*args)
        return record


# -- ONNX -------------------------------------------------------------------------------------

def expose_all_values(model: Any) -> Any:
    """A copy of ``model`` where every node output is also a graph output (existing outputs first)."""
    import onnx
    exposed = onnx.ModelProto()
    exposed.CopyFrom(model)
    have = {o.name for o in exposed.graph.output}
    for node in exposed.graph.node:
        for name in node.output:
            if name and name not in have:
                exposed.graph.output.append(onnx.ValueInfoProto(name=name))
                have.add(name)
    return exposed


class _OnnxRunner(Runner):
    def __init__(self, model: Any) -> None:
        from importers.onnx import load_model
        model = load_model(model)
        initializers = {t.name for t in model.graph.initializer}
        from onnx.helper import tensor_dtype_to_np_dtype
        self.feeds = [(i.name, tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type) if i.type.tensor_type.elem_type
                       else np.dtype(np.float32))
                      for i in model.graph.input if i.name not in initializers]
        self.output_keys = [o.name for o in model.graph.output]
        floats = [dt for _, dt in self.feeds if np.dtype(dt).kind == "f"]
        self.input_precision = np.float64 if floats and all(dt == np.float64 for dt in floats) else np.float32
        self.node_outputs = {n.name: list(n.output) for n in model.graph.node if n.name}
        self.source = model  # as given (its metadata says which value holds which IR node, for our exports)
        self.model = expose_all_values(model)
        self._initializers = {t.name: t for t in model.graph.initializer}
        self._constants: dict[str, np.ndarray] = {}
        self._made: dict[str, Any] | None = None  # Constant nodes by output name, built on first use
        self.wanted: set[str] = set()  # keys the diff compares: initializers among them are returned too

    def literals(self, name: str) -> list[np.ndarray]:
        """The constant operands (initializers, ``Constant`` outputs) of the ONNX node ``name``."""
        node = next((n for n in self.source.graph.node if n.name == name), None)
        if node is None:
            return []
        return [v for v in map(self._literal, node.input) if v is not None]

    def _literal(self, tensor: str) -> np.ndarray | None:
        """The value of an initializer or a ``Constant`` node's output; None for a computed tensor."""
        from onnx import numpy_helper
        if tensor in self._initializers:
            return numpy_helper.to_array(self._initializers[tensor])
        if self._made is None:
            self._made = {n.output[0]: n for n in self.source.graph.node if n.op_type == "Constant" and n.output}
        made = self._made.get(tensor)
        if made is not None and made.attribute and made.attribute[0].name == "value":
            return numpy_helper.to_array(made.attribute[0].t)
        return None

    def index_tables(self, name: str, values: Mapping[Hashable, np.ndarray]) -> list[np.ndarray]:
        """For a ``GatherND`` node with constant indices, the flat (row-major) positions in its data's
        leading ``batch_dims + r`` axes that it reads, from the indices by the ONNX definition (each
        batch indexes its own block); ``values``: the oracle's values (the data's shape). An importer
        folds this table into a gather over the flattened data, so it is that constant's counterpart."""
        node = next((n for n in self.source.graph.node if n.name == name), None)
        if node is None or node.op_type != "GatherND" or len(node.input) < 2:
            return []
        ind, data = self._literal(node.input[1]), values.get(node.input[0])
        if data is None or ind is None or ind.dtype.kind not in "iu":
            return []
        ind = ind.astype(np.int64)
        b = next((int(a.i) for a in node.attribute if a.name == "batch_dims"), 0)
        r = ind.shape[-1] if ind.ndim else 0
        shape = np.shape(data)
        if not r or ind.ndim <= b or b + r > len(shape) or ind.shape[:b] != shape[:b]:
            return []
        nb = int(np.prod(shape[:b], dtype=np.int64))
        positions = np.arange(nb * int(np.prod(shape[b:b + r], dtype=np.int64))).reshape((nb,) + shape[b:b + r])
        rows = ind.reshape(nb, -1, r)
        try:  # numpy's indexing: negative indices count from the end, as GatherND's
            read = positions[(np.arange(nb)[:, None], *np.moveaxis(rows, -1, 0))]
        except IndexError:
            return []  # an index out of range: the import refuses such a model
        return [read.reshape(ind.shape[:-1])]

    def operand_keys(self, name: str) -> list[str]:
        """The tensor names ONNX node ``name`` takes as inputs."""
        node = next((n for n in self.source.graph.node if n.name == name), None)
        return [i for i in node.input if i] if node is not None else []

    def constants(self) -> dict[str, np.ndarray]:
        """The wanted initializers' values (they are no node's output, so no run exposes them)."""
        from onnx import numpy_helper
        for name in self.wanted.difference(self._constants).intersection(self._initializers):
            self._constants[name] = numpy_helper.to_array(self._initializers[name])
        return self._constants

    def _feed(self, inputs: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
        if len(inputs) != len(self.feeds):
            raise BridgeError(f"{self.name}: the model has {len(self.feeds)} inputs, got {len(inputs)}")
        return {name: np.asarray(x, dtype=dt, order="C") for (name, dt), x in zip(self.feeds, inputs)}


class OnnxRuntimeRunner(_OnnxRunner):
    name = "onnxruntime"

    def __init__(self, model: Any) -> None:
        import onnxruntime as ort
        super().__init__(model)
        options = ort.SessionOptions()
        options.log_severity_level = 3
        try:
            self.session = ort.InferenceSession(self.model.SerializeToString(), options,
                                                providers=["CPUExecutionProvider"])
        except Exception as e:  # onnxruntime raises its own exception family
            raise BridgeError(f"onnxruntime rejected the model: {e}") from None
        self.names = [o.name for o in self.session.get_outputs()]

    def run(self, inputs: Sequence[np.ndarray]) -> Values:
        feeds = self._feed(inputs)
        return {**self.constants(), **feeds,
                **dict(zip(self.names, (np.asarray(v) for v in self.session.run(None, feeds))))}


class OnnxReferenceRunner(_OnnxRunner):
    """onnx's ReferenceEvaluator: a second, independent ONNX oracle written from the spec."""

    name = "onnx reference evaluator"

    def __init__(self, model: Any) -> None:
        from onnx.reference import ReferenceEvaluator
        super().__init__(model)
        self.evaluator = ReferenceEvaluator(self.model)
        self.names = list(self.evaluator.output_names)

    def run(self, inputs: Sequence[np.ndarray]) -> Values:
        feeds = self._feed(inputs)
        return {**self.constants(), **feeds,
                **dict(zip(self.names, (np.asarray(v) for v in self.evaluator.run(None, feeds))))}


def reference_parameters(reference: Any) -> Mapping[str, np.ndarray]:
    """The named tensors a reference holds: the state_dict of a module or an exported program, or an
    ONNX model's initializers."""
    if reference is None:
        return {}
    if hasattr(reference, "state_dict"):
        state = reference.state_dict() if callable(reference.state_dict) else reference.state_dict
        return {k: v for k, v in ((k, _to_numpy(t)) for k, t in state.items()) if v is not None}
    from onnx import numpy_helper

    from importers.onnx import load_model
    return {t.name: numpy_helper.to_array(t) for t in load_model(reference).graph.initializer}
