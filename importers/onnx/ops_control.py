"""ONNX control flow lowered at import: ``If`` selected, ``Loop`` and ``Scan`` unrolled.

There is no IR kind for control flow, and none is needed when what steers it is known at import time:
an ``If`` whose condition folds is its selected branch; a ``Loop`` whose trip count and conditions fold is
its body repeated; a ``Scan`` (whose length is a static extent) is its body once per step. Bodies are
lowered by the importer's own node lowering into the same builder: a body's tensors get names scoped by
the node, the iteration and the branch (so iterations never collide), and names the body reads from
enclosing graphs resolve through the enclosing bodies' scopes. A condition or trip count computed from
run-time data is refused by name (it asks for the tensor to be bound, which the ONNX backend does).
Unrolling is bounded: more than ``MAX_UNROLLED_NODES`` body nodes in one import is refused before it
is built, so a trip count of 10^12 costs nothing.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from torchlean_bridge.errors import BridgeError

from .context import Const, NodeUnsupported, OnnxContext, Opt, Value, attr_value

__all__ = ["HANDLERS", "OPSETS", "EMITS", "NOT_FOLDED", "MAX_UNROLLED_NODES", "run_body", "take", "stack", "materialize"]

Handler = Callable[[OnnxContext], list[Any]]

MAX_UNROLLED_NODES = 100_000  # body nodes lowered by unrolling in one import (an iteration counts one more)
_GRAPH, _GRAPHS = 5, 10  # onnx.AttributeProto types


# -- bodies ---------------------------------------------------------------------------------

def resolve(ctx: OnnxContext, name: str) -> str:
    """The name a body's tensor has in ``ctx.values``: the innermost enclosing scope that defines it."""
    for layer in reversed(ctx.scopes):
        if name in layer:
            return layer[name]
    return name


def subgraphs(node: Any) -> list[Any]:
    """The graphs a node's attributes hold (If's branches, Loop's and Scan's bodies...)."""
    out = []
    for a in node.attribute:
        if a.type == _GRAPH:
            out.append(a.g)
        elif a.type == _GRAPHS:
            out.extend(a.graphs)
    return out


def node_count(graph: Any) -> int:
    """Nodes of a graph, those of its nested subgraphs included (the cost of lowering it once)."""
    return sum(1 + sum(node_count(g) for g in subgraphs(n)) for n in graph.node)


def references(graph: Any, counts: dict[str, int]) -> dict[str, int]:
    """How often each name is read in a graph and its nested subgraphs (node inputs and graph outputs)."""
    for n in graph.node:
        for name in n.input:
            if name:
                counts[name] = counts.get(name, 0) + 1
        for g in subgraphs(n):
            references(g, counts)
    for o in graph.output:
        counts[o.name] = counts.get(o.name, 0) + 1
    return counts


def _scoped_node(ctx: OnnxContext, node: Any, prefix: str, renames: dict[str, str]) -> Any:
    from onnx import NodeProto
    inner = NodeProto()
    inner.op_type, inner.domain = node.op_type, node.domain
    inner.name = prefix + (node.name or node.output[0])
    inner.input.extend(resolve(ctx, x) if x else "" for x in node.input)
    for x in node.output:
        if x:
            renames[x] = prefix + x
    inner.output.extend(prefix + x if x else "" for x in node.output)
    inner.attribute.extend(node.attribute)
    return inner


def elem_type(ctx: OnnxContext, name: str | None, value: Any) -> int:
    """The ONNX element type of a value: shape inference's for its name, a constant's dtype, else the IR
    element type in the model's precision (0 for a sequence or optional, or unknown)."""
    from onnx import helper
    if name and ctx.onnx_types.get(name):
        return int(ctx.onnx_types[name])
    if isinstance(value, Const):
        try:
            return int(helper.np_dtype_to_tensor_dtype(value.value.dtype))
        except (KeyError, TypeError, ValueError):
            return 0
    if isinstance(value, int):
        ir = ctx.b.dtype(value)
        return {"int64": 7, "bool": 9}.get(ir, 11 if ctx.precision == "float64" else 1)
    return 0


def run_body(ctx: OnnxContext, graph: Any, feeds: Sequence[Any], prefix: str,
             feed_names: Sequence[str | None] = ()) -> tuple[list[Any], list[str]]:
    """Lower ``graph`` (a subgraph) with its inputs bound to ``feeds`` (``feed_names``: the tensors they
    come from, for their element types); the values of its outputs and their names in ``ctx.values``.

    Its tensors are named ``prefix + name``; the first node that cannot be lowered refuses the whole
    body, naming that node and its reason.
    """
    if len(feeds) != len(graph.input):
        raise ctx.fail(f"the subgraph `{graph.name}` takes {len(graph.input)} inputs, {len(feeds)} given")
    outer = ctx.node
    renames: dict[str, str] = {}
    names = list(feed_names) + [None] * (len(feeds) - len(feed_names))
    for vi, value, source in zip(graph.input, feeds, names):
        renames[vi.name] = prefix + vi.name
        ctx.values[prefix + vi.name] = value
        declared = vi.type.tensor_type.elem_type if vi.type.WhichOneof("value") == "tensor_type" else 0
        ctx.onnx_types[prefix + vi.name] = declared or elem_type(ctx, source, value)
    for vi in graph.value_info:
        if vi.type.WhichOneof("value") == "tensor_type" and vi.type.tensor_type.elem_type:
            ctx.onnx_types[prefix + vi.name] = vi.type.tensor_type.elem_type
    from onnx import numpy_helper
    for t in graph.initializer:
        renames[t.name] = prefix + t.name
        ctx.values[prefix + t.name] = Const(numpy_helper.to_array(t), initializer=False)
    for name, count in references(graph, {}).items():
        ctx.consumers[prefix + name] = count
    ctx.scopes.append(renames)
    try:
        for node in graph.node:
            inner = _scoped_node(ctx, node, prefix, renames)
            ctx.node = inner
            label = f"body node `{node.name or node.output[0]}` ({node.op_type})"
            unknown = [x for x in node.input if x and resolve(ctx, x) not in ctx.values]
            if unknown:
                raise NodeUnsupported(f"{label} reads undefined tensors {unknown}")
            try:
                outs = ctx.lower_node(ctx, inner)
            except BridgeError as e:
                scoped = {v for layer in ctx.scopes for v in layer.values()}
                needs = [n for n in getattr(e, "needs", ()) if n not in scoped]
                raise NodeUnsupported(f"{label}: {e.message}", needs=needs) from None
            for name, value in zip(inner.output, outs):
                if name:
                    ctx.values[name] = value
            missing = [x for x in node.output if x and prefix + x not in ctx.values]
            if missing:
                raise NodeUnsupported(f"{label} does not produce {missing}")
        out_names = [resolve(ctx, o.name) for o in graph.output]
        return [ctx.values[n] for n in out_names], out_names
    finally:
        ctx.scopes.pop()
        ctx.node = outer


def charge(ctx: OnnxContext, cost: int, what: str) -> None:
    """Count ``cost`` more unrolled body nodes; refuse once the import's budget is exceeded."""
    ctx.unrolled += cost
    if ctx.unrolled > MAX_UNROLLED_NODES:
        raise NodeUnsupported(f"{what}: unrolling would lower more than {MAX_UNROLLED_NODES} body nodes in this "
                              "import (the limit), so it is refused")


# -- values along an axis -------------------------------------------------------------------

def _shape(ctx: OnnxContext, v: Value) -> tuple[int, ...]:
    return tuple(v.value.shape) if isinstance(v, Const) else ctx.b.shape(v)


def tensor_value(ctx: OnnxContext, v: Any, what: str) -> Value:
    if not isinstance(v, (int, Const)):
        raise NodeUnsupported(f"{what} is {v.kind}, where a tensor is expected")
    return v


def materialize(ctx: OnnxContext, v: Value) -> int:
    """A value as an IR node id: a constant becomes a const node, bound to its initializer if it is one."""
    if isinstance(v, int):
        return v
    key = v.key if v.initializer else None
    if key is not None:
        ctx.used_keys.add(key)
    return ctx.b.const(v.value, key=key, transform=v.transform if key else None, source=ctx.source, folded=True)


def take(ctx: OnnxContext, v: Value, axis: int, index: int) -> Value:
    """``v[..., index, ...]`` along ``axis`` (the axis removed); a constant's only slice keeps its binding."""
    if isinstance(v, Const):
        part = np.take(v.value, index, axis=axis)
        if v.value.shape[axis] == 1:
            return v.derived(part, "reshape:" + ",".join(map(str, part.shape)))
        return Const(part, folded=True)
    s = ctx.b.shape(v)
    part = v if s[axis] == 1 else ctx.add("slice", [v], {"axes": (axis,), "starts": (index,), "ends": (index + 1,),
                                                         "steps": (1,)})
    return ctx.add("squeeze", [part], {"axes": (axis,)})


def stack(ctx: OnnxContext, values: Sequence[Value], axis: int) -> Value:
    """The values stacked along a new ``axis`` (they share one shape)."""
    shapes = {_shape(ctx, v) for v in values}
    if len(shapes) != 1:
        raise ctx.fail(f"the values to stack have different shapes {sorted(shapes)}")
    if all(isinstance(v, Const) for v in values):
        return Const(np.stack([v.value for v in values], axis=axis), folded=True)
    parts = [ctx.add("unsqueeze", [materialize(ctx, v)], {"axes": (axis,)}) for v in values]
    return parts[0] if len(parts) == 1 else ctx.add("concat", parts, {"axis": axis})


def _flag(ctx: OnnxContext, v: Any, what: str) -> bool:
    arr = np.asarray(v.value)
    if arr.size != 1:
        raise ctx.fail(f"{what} has {arr.size} elements (a condition is one boolean)")
    return bool(arr.reshape(-1)[0])


def _known(ctx: OnnxContext, i: int, what: str, op: str) -> Const:
    c = ctx.const(i)
    if c is not None:
        return c
    name = ctx.node.input[i]
    raise NodeUnsupported(f"{what} `{name}` is computed at run time: {op} is lowered only when its {what} is known "
                          "at import time" + (f" (bind graph input `{name}` with constants=... or --bind)"
                                              if name in ctx.graph_inputs else ""), needs=[name])


# -- If -------------------------------------------------------------------------------------

def _if(ctx: OnnxContext) -> list[Any]:
    """The branch the (import-time) condition selects."""
    take_then = _flag(ctx, _known(ctx, 0, "condition", "If"), "the condition")
    branch = attr_value(ctx.node, "then_branch" if take_then else "else_branch")
    prefix = f"{ctx.node.output[0]}/{'then' if take_then else 'else'}/"
    charge(ctx, node_count(branch), "the selected branch")
    outs, _ = run_body(ctx, branch, [], prefix)
    if len(outs) != len(ctx.node.output):
        raise ctx.fail(f"the selected branch has {len(outs)} outputs, the node {len(ctx.node.output)}")
    return outs


# -- Loop -----------------------------------------------------------------------------------

def _passes_condition_through(body: Any) -> bool:
    """The body's condition output is its condition input (directly or through Identity): only the trip
    count ends the loop."""
    cond_in, cond_out = body.input[1].name, body.output[0].name
    if cond_in == cond_out:
        return True
    return any(n.op_type == "Identity" and list(n.output) == [cond_out] and list(n.input) == [cond_in]
               for n in body.node)


def _loop(ctx: OnnxContext) -> list[Any]:
    """The body repeated while ``i < M`` and the condition holds, every step known at import."""
    node, body = ctx.node, attr_value(ctx.node, "body")
    trips = int(np.asarray(_known(ctx, 0, "trip count", "Loop").value).reshape(-1)[0]) if ctx.has_input(0) else None
    cond = _flag(ctx, _known(ctx, 1, "condition", "Loop"), "the condition") if ctx.has_input(1) else True
    if trips is None and not ctx.has_input(1):
        raise ctx.fail("neither a trip count nor a condition: the loop never ends")
    carried: list[Any] = [ctx.values[n] if n else Opt(None) for n in node.input[2:]]
    names: list[str | None] = [n or None for n in node.input[2:]]
    n_scan = len(body.output) - 1 - len(carried)
    if len(body.input) != 2 + len(carried) or n_scan < 0:
        raise ctx.fail(f"the body takes {len(body.input)} inputs and gives {len(body.output)} outputs for "
                       f"{len(carried)} loop-carried values")
    cost = 1 + node_count(body)
    if trips is not None and cond and _passes_condition_through(body) and \
            ctx.unrolled + max(trips, 0) * cost > MAX_UNROLLED_NODES:
        raise ctx.fail(f"trip count {trips} x {cost - 1} body nodes exceeds the limit of {MAX_UNROLLED_NODES} "
                       "unrolled body nodes, so it is refused")
    scans: list[list[Any]] = [[] for _ in range(n_scan)]
    i = 0
    while (trips is None or i < trips) and cond:
        charge(ctx, cost, f"iteration {i}")
        feeds = [Const(np.asarray(i, dtype=np.int64), folded=True), Const(np.asarray(cond), folded=True)] + carried
        outs, out_names = run_body(ctx, body, feeds, f"{node.output[0]}/{i}/", [None, None] + names)
        if not isinstance(outs[0], Const):
            raise ctx.fail(f"the condition the body computes (`{body.output[0].name}`) depends on run-time data at "
                           f"iteration {i}, so the number of iterations is not known at import time")
        cond = _flag(ctx, outs[0], "the body's condition")
        carried, names = outs[1:1 + len(carried)], out_names[1:1 + len(carried)]
        for k, v in enumerate(outs[1 + len(carried):]):
            scans[k].append(tensor_value(ctx, v, f"scan output {k}"))
        i += 1
    if n_scan and i == 0:
        raise ctx.fail("the loop runs zero times: its scan outputs are empty tensors, which the IR does not hold")
    return carried + [stack(ctx, values, 0) for values in scans]


# -- Scan -----------------------------------------------------------------------------------

def _scan_steps(ctx: OnnxContext, body: Any, states: list[Any], xs: list[Value], axes: list[int],
                reverse: list[bool], prefix: str, names: list[str | None]) -> tuple[list[Any], list[list[Value]]]:
    """Run the body over the scan inputs' common extent; final states and per-step scan outputs (in
    iteration order)."""
    lengths = {_shape(ctx, x)[a] for x, a in zip(xs, axes)}
    if len(lengths) != 1:
        raise ctx.fail(f"the scan inputs have different lengths {sorted(lengths)} along their scan axes")
    steps = lengths.pop()
    n_out = len(body.output) - len(states)
    outs_per_step: list[list[Value]] = [[] for _ in range(n_out)]
    cost = 1 + node_count(body)
    for t in range(steps):
        charge(ctx, cost, f"step {t}")
        elements = [take(ctx, x, a, steps - 1 - t if r else t) for x, a, r in zip(xs, axes, reverse)]
        outs, out_names = run_body(ctx, body, states + elements, f"{prefix}{t}/", names)
        states, names = outs[:len(states)], out_names[:len(states)] + names[len(states):]
        for k, v in enumerate(outs[len(states):]):
            outs_per_step[k].append(tensor_value(ctx, v, f"scan output {k}"))
    if n_out and steps == 0:
        raise ctx.fail("the scan inputs are empty: the scan outputs are empty tensors, which the IR does not hold")
    return states, outs_per_step


def _scan(ctx: OnnxContext) -> list[Any]:
    """``Scan`` (opset 9+): the body once per step along each scan input's axis."""
    node, body = ctx.node, attr_value(ctx.node, "body")
    m = int(ctx.attr("num_scan_inputs"))
    inputs = [ctx.values[n] for n in node.input]
    n_state = len(inputs) - m
    if m < 1 or n_state < 0:
        raise ctx.fail(f"num_scan_inputs={m} for {len(inputs)} inputs")
    xs = [tensor_value(ctx, v, f"scan input {j}") for j, v in enumerate(inputs[n_state:])]
    k = len(body.output) - n_state
    in_axes = [ctx.axis(int(a), len(_shape(ctx, x))) for a, x in
               zip(ctx.attr("scan_input_axes") or [0] * m, xs)]
    in_rev = [bool(d) for d in ctx.attr("scan_input_directions") or [0] * m]
    out_axes_raw = ctx.attr("scan_output_axes") or [0] * k
    out_rev = [bool(d) for d in ctx.attr("scan_output_directions") or [0] * k]
    if len(in_axes) != m or len(in_rev) != m or len(out_axes_raw) != k or len(out_rev) != k:
        raise ctx.fail("scan_input_axes/directions or scan_output_axes/directions do not match the inputs/outputs")
    states, per_step = _scan_steps(ctx, body, inputs[:n_state], xs, in_axes, in_rev, f"{node.output[0]}/",
                                   list(node.input))
    outs = []
    for values, a, r in zip(per_step, out_axes_raw, out_rev):
        rank = len(_shape(ctx, values[0])) + 1
        outs.append(stack(ctx, values[::-1] if r else values, ctx.axis(int(a), rank)))
    return states + outs


def _scan8(ctx: OnnxContext) -> list[Any]:
    """``Scan``-8: batched (axis 0 of every input is the batch, axis 1 the sequence); each batch row is
    scanned on its own and the results stacked. Sequence lengths must be the full extent."""
    node, body = ctx.node, attr_value(ctx.node, "body")
    m = int(ctx.attr("num_scan_inputs"))
    inputs = [tensor_value(ctx, ctx.values[n], f"input `{n}`") for n in node.input[1:]]
    n_state = len(inputs) - m
    if m < 1 or n_state < 0:
        raise ctx.fail(f"num_scan_inputs={m} for {len(inputs)} inputs")
    k = len(body.output) - n_state
    rev = [bool(d) for d in ctx.attr("directions") or [0] * m]
    batch = {_shape(ctx, v)[0] for v in inputs if _shape(ctx, v)}
    if len(batch) != 1 or any(len(_shape(ctx, v)) < (2 if j >= n_state else 1) for j, v in enumerate(inputs)):
        raise ctx.fail("the inputs do not share one batch extent (axis 0)")
    n_batch = batch.pop()
    if ctx.has_input(0):
        lens = np.asarray(ctx.static(0, "sequence_lens")).reshape(-1)
        full = _shape(ctx, inputs[n_state])[1]
        if not np.all(lens == full):
            raise ctx.fail(f"sequence_lens {lens.tolist()} shorter than the sequence extent {full} (padded "
                           "batches are not lowered)")
    final: list[list[Any]] = [[] for _ in range(n_state)]
    scanned: list[list[Value]] = [[] for _ in range(k)]
    for b in range(n_batch):
        states = [take(ctx, v, 0, b) for v in inputs[:n_state]]
        xs = [take(ctx, v, 0, b) for v in inputs[n_state:]]
        states, per_step = _scan_steps(ctx, body, states, xs, [0] * m, rev, f"{node.output[0]}/{b}/",
                                       list(node.input[1:]))
        for j, v in enumerate(states):
            final[j].append(tensor_value(ctx, v, f"state {j}"))
        for j, values in enumerate(per_step):
            scanned[j].append(stack(ctx, values, 0))
    return [stack(ctx, v, 0) for v in final] + [stack(ctx, v, 0) for v in scanned]


def _scan_any(ctx: OnnxContext) -> list[Any]:
    import onnx.defs
    return _scan8(ctx) if onnx.defs.get_schema("Scan", ctx.opset, "").since_version == 8 else _scan(ctx)


HANDLERS: dict[str, Handler] = {"If": _if, "Loop": _loop, "Scan": _scan_any}
OPSETS = {"If": (1, 25), "Loop": (1, 25), "Scan": (8, 25)}
EMITS = {"slice", "squeeze", "unsqueeze", "concat", "const"}
NOT_FOLDED = frozenset(HANDLERS)
