"""The same graph with a batch of N samples: branch and bound bounds N subdomains in one CROWN pass.

CROWN treats the first axis as independent samples when every node keeps samples apart
(``Crown.batched``). A network exported for one sample (input ``[1, ...]``) is rebuilt here with
``[N, ...]`` on every value that depends on the input (shape attributes with the leading 1 follow), then
checked by the registry's shape rules: any graph the rules reject is refused (None), and the caller
bounds one subdomain per pass instead. The node ids are unchanged, so the payload serves both graphs.
"""

from __future__ import annotations

import numpy as np

from torchlean_bridge.check import check
from torchlean_bridge.errors import BridgeError
from torchlean_bridge.graph import Graph

__all__ = ["with_batch"]

# attributes that carry a value's full shape, leading (batch) axis included
_SHAPE_ATTRS = ("in_shape", "out_shape", "shape", "from_shape", "to_shape")


def with_batch(g: Graph, n: int) -> Graph | None:
    """g with a leading axis of n on every input-dependent value, or None when g's first axis is not a
    batch axis of 1 that the shape rules accept at n."""
    if n < 1 or len(g.inputs) != 1:
        return None
    nodes = g.nodes
    depends = np.zeros(len(nodes), dtype=bool)
    for node in nodes:
        depends[node.id] = node.kind == "input" or any(depends[p] for p in node.parents)
    out = []
    for node in nodes:
        if not depends[node.id]:
            out.append(node)
            continue
        shape = tuple(node.out_shape)
        if not shape or shape[0] != 1:
            return None
        attrs = dict(node.attrs)
        for key in _SHAPE_ATTRS:
            value = attrs.get(key)
            if isinstance(value, tuple) and value and value[0] == 1:
                attrs[key] = (n,) + value[1:]
        out.append(node.with_(out_shape=(n,) + shape[1:], attrs=attrs))
    try:
        batched = Graph(out, g.inputs, g.outputs)
        check(batched)
    except BridgeError:
        return None
    return batched
