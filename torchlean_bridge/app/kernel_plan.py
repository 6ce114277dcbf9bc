"""Kernel planning: TorchLean's ``GraphKernelPlan`` (NN/Backend/IR.lean), metadata only.

Each IR kind maps to a backend operation (``op?``: input, const and detach need no runtime work; sum
and reduce_sum share ``reduce_sum``, flatten plans as ``reshape``, transpose as ``permute``, ...);
ext ops map to backend operations of their own name, served by capsules marked ``ext``. The
planner filters the capsule catalog by what this build has (devices, providers) once, then picks
per node in graph order the first admissible capsule: the catalog order is TorchLean's module order
(attention, libtorch, reference), a ``prefer`` policy searches the preferred provider first, and
``only`` admits nothing else. No admissible capsule gives TorchLean's error
``no admissible kernel capsule for op {op} on device {device}``.

TorchLean's libtorch and attention capsules target CUDA; this library adds libtorch capsules on the
CPU (registered after the reference module, so the default CPU plan stays TorchLean's reference
plan) for the ops it runs through torch's functional ops (``app/torch_kernels.py``).

A capsule is a contract, not an implementation. Each planned kernel reports the four states the
chapter distinguishes: registered (in the catalog), selectable (this build has its device and
provider, and the policy admits it), executable (this library can run it: reference capsules through
the reference evaluator, CPU libtorch capsules through torch) and proved (never: no proof is
claimed). TorchLean's VJP fields are omitted: this library is forward only.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterator, Mapping

from torchlean_bridge.errors import BridgeError, CheckFailed
from torchlean_bridge.fileio import atomic_write_text
from torchlean_bridge.graph import Graph
from torchlean_bridge.ops.registry import REGISTRY
from torchlean_bridge.wire import dump_graph, dumps_document

from .torch_kernels import TORCH_RULES

__all__ = ["KernelCapsule", "KernelPolicy", "PlannedKernel", "KernelPlan", "PlanError", "plan_kernels",
           "backend_op", "CATALOG", "BACKEND_OPS", "DEVICES", "PROVIDERS", "build_providers", "capsule_states",
           "save_plan", "load_plan", "graph_digest", "PLAN_FILE", "PLAN_FORMAT"]

PLAN_FILE = "kernel_plan.json"
PLAN_FORMAT = "torchlean-bridge.kernel-plan.v1"

# TorchLean's Device.cliName spellings (gpu is its alias for cuda) and Provider constructors
DEVICES = ("cpu", "cuda", "rocm", "metal", "wasm", "tpu", "trainium", "custom", "external")
_DEVICE_ALIASES = {"gpu": "cuda"}
PROVIDERS = ("reference", "torchlean", "libtorch", "aten", "mps", "webgpu", "cublas", "cudnn", "cufft", "xla",
             "neuron", "custom_chip", "external")

# op? : IR kind -> backend operation (None: no runtime work). Kinds not listed keep their name.
_V1_OPS: dict[str, str | None] = {
    "input": None, "const": None, "detach": None,
    "mul_elem": "mul", "max_elem": "max", "min_elem": "min", "sum": "reduce_sum",
    "flatten": "reshape", "transpose": "permute", "broadcast_to": "broadcast",
    "layernorm": "layer_norm", "batch_norm_eval": "batch_norm",
    # value-graph forms TorchLean's importer lowers into single-axis reductions
    "reduce_sum_axes": "reduce_sum", "reduce_mean_axes": "reduce_mean",
}

BACKEND_OPS: dict[str, str | None] = {kind: _V1_OPS.get(kind, kind) for kind in REGISTRY}

# backend ops of TorchLean's maintained reference module that some IR kind reaches, with the
# numerical policy of its capsule constructor (reductions and accumulations fix a left fold)
_ACCUMULATING = {"matmul", "linear", "mse_loss", "layer_norm", "batch_norm", "conv", "max_pool", "avg_pool",
                 "softmax", "hard_masked_softmax", "reduce_sum", "reduce_mean"}
_TORCHLEAN_OPS = ("matmul", "linear", "mse_loss", "relu", "add", "sub", "mul", "abs", "sqrt", "max", "min",
                  "sigmoid", "tanh", "softplus", "exp", "log", "sin", "cos", "inv", "safe_log", "softmax",
                  "hard_masked_softmax", "reduce_sum", "reduce_mean", "reshape", "permute", "broadcast",
                  "concat", "rand_uniform", "bernoulli_mask", "layer_norm", "batch_norm", "conv", "max_pool",
                  "avg_pool")
_EXT_ACCUMULATING = {"reduce_prod", "cumsum", "log_softmax", "conv_transpose", "avg_pool_nd", "resize_linear"}


class PlanError(CheckFailed):
    """No admissible capsule for a node's backend operation (the CLI exits 1)."""


@dataclass(frozen=True)
class KernelCapsule:
    """A backend contract: which operation, provider and device, from which catalog module."""

    name: str
    op: str
    provider: str
    device: str
    module: str
    ext: bool = False
    reduction: str = "n/a"  # fixed-left | implementation-defined | n/a (TorchLean's ReductionPolicy label)

    @property
    def identity(self) -> tuple[str, str, str, str]:
        return (self.name, self.op, self.provider, self.device)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "op": self.op, "provider": self.provider, "device": self.device,
                "module": self.module, "ext": self.ext, "reduction": self.reduction}


def _build_catalog() -> tuple[KernelCapsule, ...]:
    ext_ops = sorted({op for kind, op in BACKEND_OPS.items() if op and REGISTRY[kind].dialect == "ext"})
    attention = [KernelCapsule("libtorch.direct_attention", "scaled_dot_product_attention", "libtorch", "cuda",
                               "attention", reduction="implementation-defined"),
                 KernelCapsule("torchlean.composed_attention", "scaled_dot_product_attention", "torchlean", "cuda",
                               "attention", reduction="implementation-defined")]
    libtorch_cuda = [KernelCapsule(f"libtorch.{op}", op, "libtorch", "cuda", "libtorch",
                                   reduction="implementation-defined" if op in _ACCUMULATING else "n/a")
                     for op in _TORCHLEAN_OPS]
    reference = [KernelCapsule(f"reference.{op}", op, "reference", "cpu", "reference",
                               reduction="fixed-left" if op in _ACCUMULATING else "n/a") for op in _TORCHLEAN_OPS]
    reference += [KernelCapsule(f"reference.{op}", op, "reference", "cpu", "reference", ext=True,
                                reduction="fixed-left" if op in _EXT_ACCUMULATING else "n/a") for op in ext_ops]
    # the bridge's CPU libtorch module: every backend op all of whose IR kinds run through torch
    kinds_of: dict[str, list[str]] = {}
    for kind, op in BACKEND_OPS.items():
        if op:
            kinds_of.setdefault(op, []).append(kind)
    libtorch_cpu = [KernelCapsule(f"libtorch.{op}", op, "libtorch", "cpu", "libtorch-cpu",
                                  ext=REGISTRY[kinds[0]].dialect == "ext",
                                  reduction="implementation-defined" if op in _ACCUMULATING | _EXT_ACCUMULATING
                                  else "n/a")
                    for op, kinds in kinds_of.items() if all(k in TORCH_RULES for k in kinds)]
    catalog = tuple(attention + libtorch_cuda + reference + libtorch_cpu)
    identities = [c.identity for c in catalog]
    assert len(set(identities)) == len(identities), "duplicate backend capsule identity"
    return catalog


CATALOG = _build_catalog()


def backend_op(kind: str) -> str | None:
    """TorchLean's ``op?``: the backend operation an IR kind needs, None for no runtime work."""
    if kind not in BACKEND_OPS:
        raise BridgeError(f"kernel plan: unknown op kind `{kind}`")
    return BACKEND_OPS[kind]


def _torch_importable() -> bool:
    return importlib.util.find_spec("torch") is not None


def build_providers() -> tuple[str, ...]:
    """Providers this build has: reference always, libtorch when torch is importable."""
    return ("reference", "libtorch") if _torch_importable() else ("reference",)


def _build_devices(requested: str) -> tuple[str, ...]:
    """Devices this build has: the CPU, and CUDA when torch sees one (only asked when it is requested)."""
    if requested == "cuda" and _torch_importable():
        import torch
        if torch.cuda.is_available():
            return ("cpu", "cuda")
    return ("cpu",)


def _device(name: str) -> str:
    name = _DEVICE_ALIASES.get(name, name)
    if name not in DEVICES:
        raise BridgeError(f"unknown device {name} (known targets: cpu | gpu | cuda | rocm | metal | wasm | tpu "
                          f"| trainium | custom | external)")
    return name


def _provider(name: str) -> str:
    if name not in PROVIDERS:
        raise BridgeError(f"unknown provider {name} (known providers: {' | '.join(PROVIDERS)})")
    return name


@dataclass(frozen=True)
class KernelPolicy:
    """TorchLean's ``KernelPolicy`` plus the build's ``Availability``.

    ``prefer``: a provider searched first (TorchLean's ``.prefer``); with ``only`` it is the only one
    admitted (``.only``). ``providers``/``devices``: what this build has; None detects it.
    """

    device: str = "cpu"
    prefer: str | None = None
    only: bool = False
    providers: tuple[str, ...] | None = None
    devices: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "device", _device(self.device))
        if self.prefer is not None:
            object.__setattr__(self, "prefer", _provider(self.prefer))
        elif self.only:
            raise BridgeError("kernel policy: `only` needs a provider (prefer=...)")
        if self.providers is not None:
            object.__setattr__(self, "providers", tuple(_provider(p) for p in self.providers))
        if self.devices is not None:
            object.__setattr__(self, "devices", tuple(_device(d) for d in self.devices))

    def resolved(self) -> "KernelPolicy":
        """The policy with this build's providers and devices filled in."""
        return replace(self, providers=self.providers if self.providers is not None else build_providers(),
                       devices=self.devices if self.devices is not None else _build_devices(self.device))

    @property
    def preference(self) -> str:
        if self.prefer is None:
            return "auto"
        return f"{'only' if self.only else 'prefer'} {self.prefer}"

    def to_json(self) -> dict[str, Any]:
        return {"device": self.device, "prefer": self.prefer, "only": self.only,
                "providers": list(self.providers) if self.providers is not None else None,
                "devices": list(self.devices) if self.devices is not None else None}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "KernelPolicy":
        if not isinstance(d, Mapping):
            raise BridgeError("kernel plan: `policy` must be an object")
        lists = {k: tuple(d[k]) if isinstance(d.get(k), list) else None for k in ("providers", "devices")}
        return cls(device=str(d.get("device", "cpu")), prefer=d.get("prefer"), only=bool(d.get("only", False)),
                   **lists)


def _executable(capsule: KernelCapsule, kind: str) -> bool:
    if capsule.device != "cpu":
        return False
    if capsule.provider == "reference":
        from semantics.rules import FLOAT_RULES
        return kind in FLOAT_RULES and kind != "custom"
    return capsule.provider == "libtorch" and kind in TORCH_RULES and _torch_importable()


def capsule_states(capsule: KernelCapsule, kind: str, policy: KernelPolicy | None = None) -> dict[str, bool]:
    """registered / selectable / executable / proved for ``capsule`` serving a node of ``kind``."""
    policy = (policy or KernelPolicy()).resolved()
    selectable = (capsule.device in policy.devices and capsule.provider in policy.providers
                  and capsule.device == policy.device
                  and (not policy.only or capsule.provider == policy.prefer))
    return {"registered": capsule in CATALOG, "selectable": selectable,
            "executable": _executable(capsule, kind), "proved": False}


@dataclass(frozen=True)
class PlannedKernel:
    """TorchLean's ``PlannedNodeKernel``: the node, its kind, the backend operation, the capsule."""

    node: int
    kind: str
    op: str
    capsule: KernelCapsule
    states: dict[str, bool] = field(compare=False, hash=False)

    @property
    def registered(self) -> bool:
        return self.states["registered"]

    @property
    def selectable(self) -> bool:
        return self.states["selectable"]

    @property
    def executable(self) -> bool:
        return self.states["executable"]

    @property
    def proved(self) -> bool:
        return self.states["proved"]

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "kind": self.kind, "op": self.op, "capsule": self.capsule.name,
                "provider": self.capsule.provider, "device": self.capsule.device, "ext": self.capsule.ext,
                "reduction": self.capsule.reduction, "states": dict(self.states)}


def graph_digest(g: Graph) -> str:
    """sha256 of the graph's wire form without provenance: what a saved plan was made for."""
    return hashlib.sha256(dumps_document(dump_graph(g, include_source=False)).encode()).hexdigest()


class KernelPlan:
    """TorchLean's ``GraphKernelPlan``: one planned kernel per runtime-relevant node, graph order."""

    def __init__(self, kernels: tuple[PlannedKernel, ...], policy: KernelPolicy, digest: str) -> None:
        self.kernels = tuple(kernels)
        self.policy = policy
        self.graph_digest = digest
        self._by_node = {k.node: k for k in self.kernels}

    def __iter__(self) -> Iterator[PlannedKernel]:
        return iter(self.kernels)

    def __len__(self) -> int:
        return len(self.kernels)

    def __eq__(self, other: object) -> bool:
        """Equal plans; a pair ``(node ids, capsule names)`` compares with what TorchLean prints."""
        if isinstance(other, tuple) and len(other) == 2:
            return self.as_tuple() == (tuple(other[0]), tuple(other[1]))
        if not isinstance(other, KernelPlan):
            return NotImplemented
        return self.kernels == other.kernels and self.graph_digest == other.graph_digest

    __hash__ = None  # type: ignore[assignment]

    def as_tuple(self) -> tuple[tuple[int, ...], tuple[str, ...]]:
        """TorchLean's ``(plan.nodeIds, plan.capsuleNames)``."""
        return tuple(self.node_ids), tuple(self.capsule_names)

    @property
    def node_ids(self) -> list[int]:
        return [k.node for k in self.kernels]

    @property
    def capsule_names(self) -> list[str]:
        return [k.capsule.name for k in self.kernels]

    def kernel_for(self, node: int) -> PlannedKernel | None:
        return self._by_node.get(node)

    def providers_used(self) -> list[str]:
        return list(dict.fromkeys(k.capsule.provider for k in self.kernels))

    def __str__(self) -> str:
        """TorchLean's printed pair ``(#[node ids], #["capsule names"])``."""
        names = ", ".join(f'"{n}"' for n in self.capsule_names)
        return f"(#[{', '.join(str(i) for i in self.node_ids)}], #[{names}])"

    def __repr__(self) -> str:
        return f"KernelPlan({self})"

    def table(self) -> str:
        from .output import plan_table
        return plan_table(self)

    def to_json(self) -> dict[str, Any]:
        return {"format": PLAN_FORMAT, "graph_sha256": self.graph_digest, "policy": self.policy.to_json(),
                "node_ids": self.node_ids, "capsule_names": self.capsule_names,
                "kernels": [k.to_json() for k in self.kernels]}

    @classmethod
    def from_json(cls, d: Any) -> "KernelPlan":
        """A saved plan; every capsule must be one of this catalog's (by name, op, provider, device)."""
        if not isinstance(d, Mapping) or d.get("format") != PLAN_FORMAT:
            raise BridgeError(f"kernel plan: not a {PLAN_FORMAT} document")
        kernels_json, digest = d.get("kernels"), d.get("graph_sha256")
        if not isinstance(kernels_json, list) or not isinstance(digest, str):
            raise BridgeError("kernel plan: `kernels` must be a list and `graph_sha256` a string")
        policy = KernelPolicy.from_json(d.get("policy", {}))
        by_identity = {c.identity: c for c in CATALOG}
        kernels = []
        for i, k in enumerate(kernels_json):
            if not isinstance(k, Mapping):
                raise BridgeError(f"kernel plan: kernels[{i}] must be an object")
            try:
                node, kind, op = int(k["node"]), str(k["kind"]), str(k["op"])
                identity = (str(k["capsule"]), op, str(k["provider"]), str(k["device"]))
            except (KeyError, TypeError, ValueError) as e:
                raise BridgeError(f"kernel plan: kernels[{i}] lacks a field or has a bad value: {e}") from None
            capsule = by_identity.get(identity)
            if capsule is None:
                raise BridgeError(f"kernel plan: kernels[{i}]: capsule `{identity[0]}` ({identity[2]}, "
                                  f"{identity[3]}, op {op}) is not registered in this build's catalog")
            kernels.append(PlannedKernel(node, kind, op, capsule, capsule_states(capsule, kind, policy)))
        return cls(tuple(kernels), policy, digest)

    def validate(self, g: Graph) -> None:
        """The plan was made for ``g``: same graph digest, one kernel per runtime-relevant node."""
        if self.graph_digest != graph_digest(g):
            raise BridgeError("kernel plan: the plan was made for a different graph (graph digests differ); "
                              "plan this graph again")
        needed = [n.id for n in g.nodes if backend_op(n.kind) is not None]
        if self.node_ids != needed:
            raise BridgeError(f"kernel plan: planned nodes {self.node_ids} differ from the graph's runtime nodes "
                              f"{needed}")
        for k in self.kernels:
            node = g.nodes[k.node]
            if node.kind != k.kind or backend_op(node.kind) != k.op or k.capsule.op != k.op:
                raise BridgeError(f"kernel plan: node {k.node} is `{node.kind}` but its kernel is for `{k.kind}` "
                                  f"({k.capsule.name})", node=k.node)


_POLICY_KEYS = {"device": "device", "prefer": "prefer", "preferred": "prefer", "provider": "prefer", "only": "only",
                "providers": "providers", "devices": "devices"}


def _as_policy(policy: KernelPolicy | Mapping[str, Any] | str | None, device: str | None,
               prefer: str | None) -> KernelPolicy:
    if policy is None:
        policy = KernelPolicy()
    elif isinstance(policy, str):  # a device name
        policy = KernelPolicy(device=policy)
    elif isinstance(policy, Mapping):
        unknown = sorted(str(k) for k in policy if k not in _POLICY_KEYS)
        if unknown:
            raise BridgeError(f"plan_kernels: unknown policy field(s) {', '.join(unknown)}; expected "
                              f"{', '.join(_POLICY_KEYS)}")
        fields = {_POLICY_KEYS[k]: v for k, v in policy.items()}
        for key in ("providers", "devices"):
            if fields.get(key) is not None:
                fields[key] = tuple(fields[key])
        policy = KernelPolicy(**fields)
    elif not isinstance(policy, KernelPolicy):
        raise BridgeError(f"plan_kernels: policy must be a KernelPolicy, a mapping or a device name, got "
                          f"{type(policy).__name__}")
    if device is not None:
        policy = replace(policy, device=_device(device))
    if prefer is not None:
        policy = replace(policy, prefer=_provider(prefer))
    return policy


def plan_kernels(g: Graph, policy: KernelPolicy | Mapping[str, Any] | str | None = None, *,
                 device: str | None = None, prefer: str | None = None) -> KernelPlan:
    """TorchLean's ``checkedPlanGraph``: well-formedness first, then one capsule per runtime node.

    Raises ``PlanError`` (``no admissible kernel capsule for op {op} on device {device}``) at the
    first node whose operation has no admissible capsule, and when the preferred provider is not
    one this build has: a request the backend cannot honour fails there, not in the graph.
    """
    from torchlean_bridge.check import check_well_formed
    check_well_formed(g)
    policy = _as_policy(policy, device, prefer).resolved()
    available = [c for c in CATALOG if c.device in policy.devices and c.provider in policy.providers]
    kernels = []
    for node in g.nodes:
        op = backend_op(node.kind)
        if op is None:
            continue
        where = f"no admissible kernel capsule for op {op} on device {policy.device}"
        if policy.prefer is not None and policy.prefer not in policy.providers:
            raise PlanError(f"{where}: provider {policy.prefer} is not available in this build (it has "
                            f"{', '.join(policy.providers)})", node=node.id, op=node.kind)
        eligible = [c for c in available if c.op == op and c.device == policy.device
                    and (not policy.only or c.provider == policy.prefer)]
        preferred = [c for c in eligible if c.provider == policy.prefer]
        chosen = (preferred or eligible or [None])[0]
        if chosen is None:
            raise PlanError(where, node=node.id, op=node.kind)
        kernels.append(PlannedKernel(node.id, node.kind, op, chosen, capsule_states(chosen, node.kind, policy)))
    return KernelPlan(tuple(kernels), policy, graph_digest(g))


def save_plan(plan: KernelPlan, path: str | Path) -> Path:
    """Write the plan as JSON; a bundle folder gets ``kernel_plan.json`` beside its graph."""
    path = Path(path)
    target = path / PLAN_FILE if path.is_dir() else path
    atomic_write_text(target, json.dumps(plan.to_json(), indent=1) + "\n")
    return target


def load_plan(path: str | Path, graph: Graph | None = None) -> KernelPlan:
    """A saved plan (a file, or a bundle folder holding ``kernel_plan.json``), checked against ``graph``."""
    path = Path(path)
    target = path / PLAN_FILE if path.is_dir() else path
    try:
        doc = json.loads(target.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BridgeError(f"no kernel plan at {target}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BridgeError(f"cannot read kernel plan {target}: {e}") from None
    plan = KernelPlan.from_json(doc)
    if graph is not None:
        plan.validate(graph)
    return plan
