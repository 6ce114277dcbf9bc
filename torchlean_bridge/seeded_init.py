"""Deterministic parameter initialization: TorchLean's seeded initializer, and all zeros.

``scheme="torchlean"`` follows GraphSpec's ``detInitParams?`` (the concatenation of the runtime
layers' own ``initState``, in ABI order): each parameter-bearing layer gets a seed equal to its
occurrence index (plus the caller's ``seed``), the index advancing only at layers that count
(``countsAsLayer``); the layer's key is ``splitmix64(layer seed + 0)``, and sample ``idx`` is
``splitmix64(key + idx) mod 2^32 / 2^32``. Linear weights are Xavier-uniform,
``-limit + unit * 2 * limit`` with ``limit = sqrt(6 / (fanIn + fanOut))``, filled row-major (flat
index ``r * in + c``); biases are exactly zero. The facts are from TorchLean's Lean sources
(``NN/GraphSpec`` ``detInitParams?``, ``Runtime.Autograd.Model.Layers.linear``), as recorded in
the project's spec note ``torchlean-kernel-plan-and-init.md``.

Only ``linear`` has a TorchLean initializer this module reproduces exactly. Convolution's
(``NN/GraphSpec/Primitives/Spatial.lean``: uniform(-0.1, 0.1) through ``Torch.Init.tensor`` with seed
``2 i``) depends on a sampler whose algorithm the note does not give, and BatchNorm's GraphSpec
primitive has no running statistics; every op without an exact initializer is refused by name.

``scheme="zeros"`` fills every parameter slot with zeros (TorchLean's structural-example init).
Constants the importer made (unbound ``const`` nodes) are architecture, not parameters: both schemes
keep them.
"""

from __future__ import annotations

import math

import numpy as np

from .bundle import Bundle
from .errors import BridgeError
from .payload import Payload

__all__ = ["init_params", "splitmix64", "unit_samples", "xavier_uniform", "SCHEMES", "COUNTS_AS_LAYER"]

SCHEMES = ("torchlean", "zeros")

# ops whose TorchLean layer advances the occurrence index, with the initializer of each role
COUNTS_AS_LAYER = {"linear": ("weight", "bias")}

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


def _check_seed(seed: int) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= int(seed) < 2 ** 64:
        raise BridgeError(f"init_params: seed must be an integer in [0, 2^64), got {seed!r}")
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
    if scheme == "torchlean":
        refused = sorted({(nid, op) for nid, op, _, _ in slots if op not in COUNTS_AS_LAYER})
        if refused:
            listed = ", ".join(f"node {n} ({op})" for n, op in refused)
            raise BridgeError(f"init_params: no TorchLean initializer is reproduced for {listed}; "
                              f"only {', '.join(COUNTS_AS_LAYER)} has one (use scheme='zeros')",
                              node=refused[0][0], op=refused[0][1])
    payload = Payload()
    in_slots = {(nid, role) for nid, _, role, _ in slots}
    for nid, role, arr in bundle.payload.items():
        if (nid, role) not in in_slots and bundle.graph.nodes[nid].kind == "const":
            payload.set(nid, role, arr)
    # occurrence index: counts only layers whose countsAsLayer is true (linear yes, relu no)
    layer_index = {n.id: k for k, n in enumerate(n for n in bundle.graph.nodes if n.kind in COUNTS_AS_LAYER)}
    for nid, op, role, shape in slots:
        if scheme == "zeros" or role == "bias":
            payload.set(nid, role, np.zeros(shape, dtype=_dtype(bundle.graph.nodes[nid])))
        else:
            out_dim, in_dim = shape
            payload.set(nid, role, xavier_uniform(out_dim, in_dim, base + layer_index[nid]))
    return payload


def _dtype(node) -> np.dtype:
    if node.kind != "const":
        return np.dtype(np.float64)
    return np.dtype({"int64": np.int64, "bool": bool}.get(node.dtype, np.float64))
