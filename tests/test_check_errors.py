"""``tlb.check``: exact texts and provenance of every structural, interface and shape error, in both modes.

Spec section 4.4 (structure), 4.5 (shapes) and 4.6 (interface: output id out of bounds, an input id
naming a non-input node, an input node not listed, no outputs). Each error names where (``.node``,
``.op``, ``.source``) and what (the exact message); the collecting mode returns every independent
problem once, in node order within each stage, and the raising mode raises the first of them.
"""

from __future__ import annotations

import pytest

import torchlean_bridge as tlb
from torchlean_bridge.errors import GraphError
from torchlean_bridge.graph import Graph, Node, Source

SRC = Source(framework="fx", name="act", target="relu")


def chain(**overrides) -> list[Node]:
    """input [2, 3] -> relu (with a source) -> tanh -> sum."""
    nodes = [Node(0, [], "input", (2, 3)), Node(1, [0], "relu", (2, 3), source=SRC),
             Node(2, [1], "tanh", (2, 3)), Node(3, [2], "sum", ())]
    for i, changes in overrides.items():
        nodes[int(i[1:])] = nodes[int(i[1:])].with_(**changes)
    return nodes


def where(e: tlb.BridgeError) -> tuple:
    return type(e), e.message, e.node, e.op, e.source


def test_a_valid_graph_has_no_errors():
    assert tlb.check(Graph(chain()), collect=True) == []
    assert tlb.check(Graph(chain())) == []


INTERFACE_CASES = {
    "output out of bounds": (dict(outputs=[3, 9]), [(GraphError, "IR graph: node id out of bounds: 9", 9, None, None)]),
    "input out of bounds": (dict(inputs=[0, 4]), [(GraphError, "IR graph: node id out of bounds: 4", 4, None, None)]),
    "input names a non-input node": (
        dict(inputs=[0, 1]),
        [(GraphError, "IR graph: input id 1 designates `relu`, not `input`", 1, "relu", str(SRC))]),
    "input node not listed": (
        dict(inputs=[]),
        [(GraphError, "IR graph: input nodes [0] are not listed among the graph inputs", 0, "input", None)]),
    "no outputs": (dict(outputs=[]), [(GraphError, "IR graph: graph has no outputs", None, None, None)]),
}


@pytest.mark.parametrize("case", sorted(INTERFACE_CASES))
def test_interface_errors_have_exact_texts_and_provenance(case):
    interface, expected = INTERFACE_CASES[case]
    g = Graph(chain(), **{"inputs": [0], "outputs": [3], **interface})
    assert [where(e) for e in tlb.check(g, collect=True)] == expected
    with pytest.raises(GraphError) as e:
        tlb.check(g)
    assert where(e.value) == expected[0]
    with pytest.raises(GraphError) as e:
        tlb.check_well_formed(g)
    assert where(e.value) == expected[0]


def test_every_interface_problem_is_collected_in_order():
    nodes = chain() + [Node(4, [], "input", (1,))]
    g = Graph(nodes, inputs=[1, 7], outputs=[8])
    assert [e.message for e in tlb.check(g, collect=True)] == [
        "IR graph: input id 1 designates `relu`, not `input`",
        "IR graph: node id out of bounds: 7",
        "IR graph: node id out of bounds: 8",
        "IR graph: input nodes [0, 4] are not listed among the graph inputs",
    ]


def summary(nodes, i) -> str:
    return nodes[i].summary()


def test_structural_errors_have_exact_texts_node_op_and_source():
    nodes = chain(n1=dict(parents=(0, 0)))
    errs = tlb.check(Graph(nodes), collect=True)
    assert [where(e) for e in errs] == [
        (GraphError, f"IR graph: node 1: bad parent count for relu: expected 1..1, got 2 ({summary(nodes, 1)})",
         1, "relu", str(SRC))]
    nodes = chain(n1=dict(parents=(1,)))
    assert [where(e) for e in tlb.check(Graph(nodes), collect=True)] == [
        (GraphError, f"IR graph: node 1: parent id 1 is not < 1 ({summary(nodes, 1)})", 1, "relu", str(SRC))]
    nodes = chain(n1=dict(id=5))
    assert [where(e) for e in tlb.check(Graph(nodes, [0], [3]), collect=True)] == [
        (GraphError, "IR graph: id discipline violated at index 1: nodes[1].id = 5", 5, "relu", str(SRC))]
    nodes = chain(n1=dict(kind="fft"))
    assert [where(e) for e in tlb.check(Graph(nodes), collect=True)] == [
        (GraphError, "IR graph: node 1: unknown op kind `fft`", 1, "fft", str(SRC))]
    nodes = [Node(0, [], "input", (2,)), Node(1, [0], "concat", (2,), {"axis": 0})]
    assert [e.message for e in tlb.check(Graph(nodes), collect=True)] == [
        f"IR graph: node 1: bad parent count for concat: expected at least 2, got 1 ({summary(nodes, 1)})"]


def test_shape_errors_have_exact_texts_node_op_and_source():
    nodes = chain(n1=dict(out_shape=(2, 4)))
    assert [where(e) for e in tlb.check(Graph(nodes), collect=True)] == [
        (GraphError, f"IR graph: node 1: outShape mismatch: inferred=[2, 3], declared=[2, 4] ({summary(nodes, 1)})",
         1, "relu", str(SRC))]
    nodes = [Node(0, [], "input", (2, 3)), Node(1, [], "input", (3,)),
             Node(2, [0, 1], "add", (2, 3), source=SRC)]
    assert [where(e) for e in tlb.check(Graph(nodes), collect=True)] == [
        (GraphError, "IR graph: node 2: add: shape mismatch: [2, 3] vs [3]", 2, "add", str(SRC))]
    nodes = chain(n1=dict(dtype="bool"))
    assert [where(e) for e in tlb.check(Graph(nodes), collect=True)] == [
        (GraphError, f"IR graph: node 1: element type mismatch: inferred=float, declared=bool ({summary(nodes, 1)})",
         1, "relu", str(SRC))]


def test_declared_sizes_are_refused_before_allocation():
    nodes = [Node(0, [], "input", (2 ** 20, 2 ** 12))]
    msg = ("IR graph: node 0: declared shape [1048576, 4096] has 4294967296 elements, above the limit of "
           "2147483648 (raise max_elements to allow it)")
    assert [e.message for e in tlb.check(Graph(nodes), collect=True)] == [msg]
    assert tlb.check(Graph(nodes), max_elements=2 ** 32) == []
    assert [e.message for e in tlb.check(Graph(chain()), collect=True, max_elements=5)] == [
        f"IR graph: node {i}: declared shape [2, 3] has 6 elements, above the limit of 5 (raise max_elements to "
        "allow it)" for i in (0,)]


def test_collect_mode_reports_independent_problems_once_and_skips_their_consumers():
    """Two broken nodes in each stage: both reported (a `break` after the first fails this); the
    nodes reading a broken node are skipped, and the raising mode raises the first structural error
    even though a shape error comes earlier in node order."""
    nodes = [Node(0, [], "input", (2, 3)),
             Node(1, [0], "relu", (2, 4)),               # shape error
             Node(2, [1], "tanh", (2, 4)),               # consumer of a broken node: skipped
             Node(3, [0], "sigmoid", (2, 3), source=SRC),
             Node(4, [3, 3], "exp", (2, 3)),             # structural error
             Node(5, [0], "neg", (2, 5)),                # shape error
             Node(6, [4], "abs", (2, 3)),                # consumer of a broken node: skipped
             Node(7, [0, 3], "sin", (2, 3)),             # structural error
             Node(8, [5, 3], "add", (2, 3))]             # reads a broken node: skipped
    g = Graph(nodes, [0], [2, 6, 8])
    errs = tlb.check(g, collect=True)
    assert [(e.node, e.op) for e in errs] == [(4, "exp"), (7, "sin"), (1, "relu"), (5, "neg")]
    assert errs[0].message.startswith("IR graph: node 4: bad parent count for exp: expected 1..1, got 2")
    assert errs[2].message.startswith("IR graph: node 1: outShape mismatch: inferred=[2, 3], declared=[2, 4]")
    with pytest.raises(GraphError) as e:
        tlb.check(g)
    assert e.value.node == 4
    assert [e.node for e in tlb.check_well_formed(g, collect=True)] == [4, 7]
    g_shapes_only = Graph([n for n in nodes if n.id in (0, 1, 2)], [0], [2])
    with pytest.raises(GraphError) as e:
        tlb.check(g_shapes_only)
    assert e.value.node == 1 and tlb.check_well_formed(g_shapes_only) == []


def test_infer_shapes_returns_every_shape_and_raises_the_first_problem():
    from torchlean_bridge.check import infer_shapes
    assert infer_shapes(Graph(chain())) == [(2, 3), (2, 3), (2, 3), ()]
    with pytest.raises(GraphError, match=r"^IR graph: node 2: outShape mismatch"):
        infer_shapes(Graph(chain(n2=dict(out_shape=(3,)))))
    with pytest.raises(GraphError, match=r"^IR graph: node 3: bad parent count"):
        infer_shapes(Graph(chain(n3=dict(parents=(2, 2)))))


def test_error_str_names_the_source_once():
    e = tlb.check(Graph(chain(n1=dict(out_shape=(2, 4)))), collect=True)[0]
    assert str(e) == f"{e.message} [at {SRC}]"


def test_an_unlisted_input_with_a_broken_id_is_reported_without_indexing_by_it():
    nodes = [Node(0, [], "input", (2,)), Node(9, [], "input", (2,)), Node(2, [0], "relu", (2,))]
    assert [e.message for e in tlb.check(Graph(nodes, [0], [2]), collect=True)] == [
        "IR graph: id discipline violated at index 1: nodes[1].id = 9",
        "IR graph: input nodes [9] are not listed among the graph inputs"]


def test_collect_mode_keeps_going_after_every_kind_of_error():
    """One problem of each kind, each followed by another: a `break` for a `continue` after any of them,
    a node not marked broken (re-checked for shapes or sizes), or a second report for a second bad
    parent changes this list."""
    nodes = [Node(0, [], "input", (2, 3)),
             Node(9, [0], "relu", (2, 4)),            # id discipline (its shape would also be wrong)
             Node(2, [1], "fft", (2, 3)),             # unknown kind
             Node(3, [0, 0], "relu", (2, 5)),         # bad arity (its shape would also be wrong)
             Node(4, [5, 6], "add", (2, 3)),          # two forward parents: reported once
             Node(5, [0], "tanh", (2, 3)),
             Node(6, [], "input", (3,)),
             Node(7, [0, 6], "add", (2, 3)),          # shape rule error
             Node(8, [6, 0], "sub", (2, 3)),          # shape rule error
             Node(9, [], "input", (8,)),              # above max_elements
             Node(10, [], "input", (8,)),             # above max_elements
             Node(11, [3], "relu", (2, 5))]           # reads a broken node
    g = Graph(nodes, [0, 6, 9, 10], [5, 7, 8, 11])
    size = "declared shape [8] has 8 elements, above the limit of 7 (raise max_elements to allow it)"
    assert [e.message for e in tlb.check(g, collect=True, max_elements=7)] == [
        "IR graph: id discipline violated at index 1: nodes[1].id = 9",
        "IR graph: node 2: unknown op kind `fft`",
        f"IR graph: node 3: bad parent count for relu: expected 1..1, got 2 ({summary(nodes, 3)})",
        f"IR graph: node 4: parent id 5 is not < 4 ({summary(nodes, 4)})",
        "IR graph: node 7: add: shape mismatch: [2, 3] vs [3]",
        "IR graph: node 8: sub: shape mismatch: [3] vs [2, 3]",
        f"IR graph: node 9: {size}",
        f"IR graph: node 10: {size}",
    ]
    assert [e.node for e in tlb.check_well_formed(g, collect=True)] == [9, 2, 3, 4]
