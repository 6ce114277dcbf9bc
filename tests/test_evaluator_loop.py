"""The one evaluator loop (semantics/domains.py): bad input is a user error naming the node, a bug in a
rule keeps its traceback with the node added as a note, every domain reports through the same loop."""

from __future__ import annotations

import numpy as np
import pytest

import semantics.rules as rules
import torchlean_bridge as tlb
from torchlean_bridge.errors import EvalError, IntervalError
from torchlean_bridge.graph import Graph, Node


def test_a_malformed_node_under_check_false_is_reported_by_its_own_shape_rule():
    """add needs equal shapes (no implicit broadcasting); with check=False numpy would broadcast or
    raise ValueError inside the rule: the loop reports the node's shape rule instead."""
    g = Graph([Node(0, [], "input", (2, 3)), Node(1, [], "input", (3,)), Node(2, [0, 1], "add", (2, 3))])
    with pytest.raises(EvalError, match=r"^IR eval: node 2: add: ") as e:
        tlb.evaluate(g, None, [np.zeros((2, 3)), np.zeros(3)], check=False)
    assert e.value.node == 2 and e.value.op == "add"
    with pytest.raises(tlb.BridgeError, match=r"^IR graph: node 2: add: "):
        tlb.evaluate(g, None, [np.zeros((2, 3)), np.zeros(3)])


def test_a_bug_in_a_rule_keeps_its_traceback_with_the_node_as_a_note(monkeypatch):
    def broken(node, xs, rec, dt):
        return {}["missing"]  # a KeyError no input can explain

    monkeypatch.setitem(rules.FLOAT_RULES, "tanh", broken)
    g = Graph([Node(0, [], "input", (2,)), Node(1, [0], "tanh", (2,))])
    with pytest.raises(KeyError) as e:
        tlb.evaluate(g, None, np.zeros(2))
    assert any("while evaluating node 1 in the float64 domain" in n for n in e.value.__notes__)

    def broken_box(node, ps, rec):
        raise TypeError("bug")

    monkeypatch.setitem(rules.INTERVAL_RULES, "tanh", broken_box)
    with pytest.raises(TypeError) as e:
        tlb.interval_bounds(g, None, np.zeros(2), np.ones(2))
    assert any("in the interval domain" in n for n in e.value.__notes__)


def test_domain_refusals_name_the_node_in_every_domain():
    g = Graph([Node(0, [], "input", (2,)), Node(1, [0], "log", (2,))])
    for exact in (False, True):
        with pytest.raises(EvalError, match="log: input contains values <= 0") as e:
            tlb.evaluate(g, None, np.array([1.0, -1.0]), exact=exact)
        assert e.value.node == 1
    with pytest.raises(IntervalError, match=r"^interval: node 1 \(log\): log: box reaches"):
        tlb.prepare(g, None).interval_bounds(np.array([-1.0, 1.0]), np.array([1.0, 2.0]))
