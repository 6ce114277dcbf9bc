"""embeddings_node's one-sweep separator agrees with the definition on random DAGs.

The definition: the first float node, reached from an integer input, such that no output reads an
integer input along a path that avoids it (checked here by a walk that stops at the candidate).
"""

from __future__ import annotations

import random

import pytest

from torchlean_bridge.errors import BridgeError
from torchlean_bridge.graph import Graph, Node
from torchlean_bridge.ops import FLOAT, INT64
from torchlean_bridge.passes.cut_at import embeddings_node


def _reads_avoiding(g: Graph, stop: int) -> set[int]:
    seen, stack = set(g.outputs), list(g.outputs)
    while stack:
        nid = stack.pop()
        if nid == stop:
            continue
        for p in g.nodes[nid].parents:
            if p not in seen:
                seen.add(p)
                stack.append(p)
    return seen


def _by_definition(g: Graph) -> int | None:
    ints = {i for i in g.inputs if g.nodes[i].dtype != FLOAT}
    tainted = set(ints)
    for node in g.nodes:
        if node.id not in tainted and any(p in tainted for p in node.parents):
            tainted.add(node.id)
        if (node.id in tainted and node.id not in ints and node.dtype == FLOAT
                and node.id in _reads_avoiding(g, -1) and not (_reads_avoiding(g, node.id) & ints)):
            return node.id
    return None


def _random_dag(rng: random.Random) -> Graph:
    n = rng.randint(3, 14)
    nodes = [Node(0, (), "input", (2,), dtype=INT64)]
    inputs = [0]
    for i in range(1, n):
        if rng.random() < 0.15:
            nodes.append(Node(i, (), "input", (2,), dtype=rng.choice([FLOAT, INT64])))
            inputs.append(i)
            continue
        parents = tuple(sorted(rng.sample(range(i), rng.randint(1, min(2, i)))))
        nodes.append(Node(i, parents, "add", (2,), dtype=FLOAT if rng.random() < 0.8 else INT64))
    outputs = sorted(rng.sample(range(n // 2, n), rng.randint(1, 2)))
    return Graph(nodes, inputs, outputs)


@pytest.mark.parametrize("seed", range(400))
def test_the_sweep_finds_the_separator_the_definition_does(seed):
    g = _random_dag(random.Random(seed))
    expected = _by_definition(g)
    if expected is None:
        with pytest.raises(BridgeError, match="no single float node separates"):
            embeddings_node(g)
    else:
        assert embeddings_node(g) == expected


def test_a_long_chain_is_linear_not_quadratic():
    n = 200_000
    nodes = [Node(0, (), "input", (2,), dtype=INT64)] + [Node(i, (i - 1,), "add", (2,)) for i in range(1, n)]
    nodes.append(Node(n, (0, n - 1), "add", (2,)))  # a skip from the ids to the end: only the last node separates
    g = Graph(nodes, [0], [n])
    assert embeddings_node(g) == n
