"""What every evaluation of a graph needs to know about its shape, computed once per graph.

The evaluator loop (``semantics.domains.run``) frees each value right after its last reader and
hands each node its parents' values; the random-op stream indices need the graph's kinds. For a
10^6-node graph these per-graph facts cost a pass over the nodes each, so they are computed on the
first evaluation and kept on the graph (a graph is immutable) for every later one, in any domain.
"""

from __future__ import annotations

from dataclasses import dataclass

from torchlean_bridge.graph import Graph

__all__ = ["Schedule", "schedule"]


@dataclass(frozen=True)
class Schedule:
    """``last_reader[v]``: the id of the last node reading value ``v`` (``v`` itself when nothing reads
    it, ``len(g)`` for an output, which lives to the end); ``parents_in_range``: every parent id is
    a node id (a graph that passed ``check_well_formed`` has parents below their node, but a negative
    id is not refused there, and the loop must not read ``values[-1]``); ``kinds``: the op kinds used."""

    last_reader: list[int]
    parents_in_range: bool
    kinds: frozenset[str]


def schedule(g: Graph) -> Schedule:
    """``g``'s schedule, computed on the first call and kept on ``g``."""
    cached = getattr(g, "evaluation_schedule", None)
    if cached is not None:
        return cached
    size = len(g.nodes)
    last = list(range(size))
    in_range = True
    for n in g.nodes:
        nid = n.id
        for p in n.parents:
            if 0 <= p < size:
                if nid > last[p]:
                    last[p] = nid
            else:
                in_range = False
    for o in g.outputs:
        if 0 <= o < size:
            last[o] = size
    result = Schedule(last, in_range, frozenset(n.kind for n in g.nodes))
    object.__setattr__(g, "evaluation_schedule", result)
    return result
