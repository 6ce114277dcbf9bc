"""Deterministic parameter initialization: TorchLean's seeded initializer, and all zeros.

``scheme="torchlean"`` follows GraphSpec's ``detInitParams?`` (the concatenation of the runtime
layers' own ``initState``, in ABI order). Layers are numbered by occurrence, the index advancing only
at layers whose ``countsAsLayer`` is true (linear, conv, batch norm; not relu); ``seed`` is the index
of the first one (default 0). A seeded tensor's key is ``splitmix64(layer seed + 0)`` (``keyOf seed
0``) and sample ``idx`` is ``splitmix64(key + idx) mod 2^32 / 2^32``, filled row-major.

- ``linear`` at index ``i`` (``Runtime.Autograd.Model.Layers.linear``, weightSeed ``i``; the project's
  spec note ``torchlean-kernel-plan-and-init.md``): Xavier-uniform weights ``-limit + unit * 2 *
  limit``, ``limit = sqrt(6 / (fanIn + fanOut))``; bias exactly zero.
- ``conv`` at index ``i`` (TorchLean ``NN/GraphSpec/Primitives/Spatial.lean``, ``Primitive.conv``:
  kernel ``uniform(-0.1, 0.1)`` with seed ``2 i``, bias zeros; the uniform sample is ``lo + unit * (hi -
  lo)`` by ``NN/Runtime/Autograd/Model/Module/RuntimeInit.lean``, ``unitAt``/``sampleAt``, the sampler
  shared with the tensor initializer). TorchLean's conv primitive has no groups: grouped convolutions
  are refused.
- ``batch_norm_eval`` (``Spatial.lean`` ``Primitive.batchNorm``, which counts as a layer: scale ones,
  shift zeros; ``NN/Runtime/Autograd/Model/Layers/Normalization.lean`` ``batchNorm``: running mean
  zeros, running variance ones).

Every other parameter-bearing op is refused by name (its TorchLean initializer, or whether it counts as
a layer, is not known here). ``scheme="zeros"`` fills every parameter slot with zeros. Constants the
importer made (unbound ``const`` nodes) are architecture, not parameters: both schemes keep them.
"""

from __future__ import annotations

import math

import numpy as np

from .bundle import Bundle
from .errors import BridgeError
from .graph import Node
from .payload import Payload

__all__ = ["init_params", "splitmix64", "unit_samples", "xavier_uniform", "uniform", "SCHEMES", "INITIALIZERS"]

SCHEMES = ("torchlean", "zeros")

_MASK32 = np.uint64(0xFFFFFFFF)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_MAX_ELEMENTS = 1 << 31  # a parameter tensor above this is refused before allocating it


def splitmix64(x: np.ndarray | int) -> np.ndarray:
    """splitmix64 with 64-bit wrapping arithmetic, elementwise over a uint64 array."""
    z = np.asarray(x, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = z + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _MIX1
        z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


def unit_samples(layer_seed: int, count: int) -> np.ndarray:
    """Samples 0..count-1 of a layer's stream, each ``u / 2^32`` in [0, 1) (float64)."""
    key = splitmix64(np.uint64(layer_seed))  # keyOf seed 0 = splitmix64(seed + 0)
    with np.errstate(over="ignore"):
        u = splitmix64(key + np.arange(count, dtype=np.uint64)) & _MASK32
    return u.astype(np.float64) / 2.0 ** 32


def xavier_uniform(out_dim: int, in_dim: int, layer_seed: int) -> np.ndarray:
    """TorchLean's linear weight ``[out, in]`` at this layer seed."""
    if out_dim + in_dim == 0:
        return np.zeros((out_dim, in_dim))
    limit = math.sqrt(6.0 / (in_dim + out_dim))
    return (-limit + unit_samples(layer_seed, out_dim * in_dim) * (2 * limit)).reshape(out_dim, in_dim)


def uniform(count: int, lo: float, hi: float, layer_seed: int) -> np.ndarray:
    """TorchLean's ``FloatInit.uniform lo hi seed``: ``lo + unit * (hi - lo)`` per flat index."""
    return lo + unit_samples(layer_seed, count) * (hi - lo)


def _linear(node: Node, role: str, shape: tuple[int, ...], index: int) -> np.ndarray:
    if role == "bias":
        return np.zeros(shape)
    return xavier_uniform(shape[0], shape[1], index)


def _conv(node: Node, role: str, shape: tuple[int, ...], index: int) -> np.ndarray:
    if role == "bias":
        return np.zeros(shape)
    return uniform(math.prod(shape), -0.1, 0.1, 2 * index).reshape(shape)


_BATCH_NORM_FILL = {"weight": 1.0, "bias": 0.0, "running_mean": 0.0, "running_var": 1.0}


def _batch_norm(node: Node, role: str, shape: tuple[int, ...], index: int) -> np.ndarray:
    return np.full(shape, _BATCH_NORM_FILL[role])


# op kind -> TorchLean initializer of (role, shape, occurrence index); each of these counts as a layer
INITIALIZERS = {"linear": _linear, "conv": _conv, "batch_norm_eval": _batch_norm}


def _refusal(node: Node) -> str | None:
    """Why TorchLean's initializer does not apply to this node (None when it does)."""
    if node.kind not in INITIALIZERS:
        return "no TorchLean initializer is reproduced for it"
    if node.kind == "conv" and node.attrs["groups"] != 1:
        return f"TorchLean's conv primitive has no groups (groups={node.attrs['groups']})"
    return None


def _check_seed(seed: int) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= int(seed) < 2 ** 62:
        raise BridgeError(f"init_params: seed must be an integer in [0, 2^62), got {seed!r}")
    return int(seed)


def _slots(bundle: Bundle) -> list[tuple[int, str, str, tuple[int, ...]]]:
    """(node, op, role, shape) of every parameter slot in ABI order (node order, then role order):
    required roles, optional roles the payload holds, and ``const`` values bound to an external key."""
    g = bundle.graph
    slots = []
    for node in g.nodes:
        spec = node.spec
        if spec is None or not spec.params:
            continue
        parents = [g.nodes[p].out_shape for p in node.parents]
        bound = {b.role for b in bundle.roles.for_node(node.id)}
        for role in spec.params:
            if node.kind == "const" and role.name not in bound:
                continue  # an importer-made constant: architecture, kept as it is
            if role.optional and role.name not in bound and bundle.payload.get(node.id, role.name) is None:
                continue
            shape = tuple(int(d) for d in role.shape(node.attrs, parents, node.out_shape))
            slots.append((node.id, node.kind, role.name, shape))
    return slots


def init_params(bundle: Bundle, scheme: str = "torchlean", seed: int = 0) -> Payload:
    """A new payload for ``bundle.graph``: every parameter slot initialized by ``scheme``.

    Unbound ``const`` values are copied from the bundle's payload unchanged. Raises ``BridgeError``
    naming the node and op when ``scheme="torchlean"`` meets a parameter-bearing op whose TorchLean
    initializer is not reproduced exactly.
    """
    if scheme not in SCHEMES:
        raise BridgeError(f"init_params: unknown scheme {scheme!r}; expected one of {', '.join(SCHEMES)}")
    base = _check_seed(seed)
    slots = _slots(bundle)
    for nid, op, role, shape in slots:
        if math.prod(shape) > _MAX_ELEMENTS:
            raise BridgeError(f"init_params: node {nid} ({op}) `{role}` {list(shape)} has more than "
                              f"{_MAX_ELEMENTS} elements", node=nid, op=op)
    g = bundle.graph
    if scheme == "torchlean":
        refused = [(nid, op, why) for nid, op in sorted({(n, op) for n, op, _, _ in slots})
                   if (why := _refusal(g.nodes[nid]))]
        if refused:
            listed = "; ".join(f"node {n} ({op}): {why}" for n, op, why in refused)
            raise BridgeError(f"init_params: {listed}; TorchLean initializers are reproduced for "
                              f"{', '.join(INITIALIZERS)} only (use scheme='zeros')",
                              node=refused[0][0], op=refused[0][1])
    payload = Payload()
    in_slots = {(nid, role) for nid, _, role, _ in slots}
    for nid, role, arr in bundle.payload.items():
        if (nid, role) not in in_slots and bundle.graph.nodes[nid].kind == "const":
            payload.set(nid, role, arr)
    # occurrence index: counts only layers whose countsAsLayer is true (linear yes, relu no)
    layer_index = {n.id: base + k for k, n in enumerate(n for n in g.nodes if n.kind in INITIALIZERS)}
    for nid, op, role, shape in slots:
        if scheme == "zeros":
            payload.set(nid, role, np.zeros(shape, dtype=_dtype(g.nodes[nid])))
        else:
            payload.set(nid, role, INITIALIZERS[op](g.nodes[nid], role, shape, layer_index[nid]))
    return payload


def _dtype(node) -> np.dtype:
    if node.kind != "const":
        return np.dtype(np.float64)
    return np.dtype({"int64": np.int64, "bool": bool}.get(node.dtype, np.float64))
