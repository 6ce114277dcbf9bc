"""The seed chapter's graph, its listing/DOT and its three broken variants, byte for byte."""

import pytest

import torchlean_bridge as tlb
from torchlean_bridge.graph import Graph
from torchlean_bridge.seed import seed_mlp_graph
from tests.conftest import FIXTURES

SEED_LISTING = """0: input parents=[] out=[4]
1: linear(payload=node_id) parents=[0] out=[5]
2: relu parents=[1] out=[5]
3: linear(payload=node_id) parents=[2] out=[3]
4: sum parents=[3] out=[]
5: tanh parents=[4] out=[]"""

SEED_DOT = r"""digraph IR {
  rankdir=LR;
  node [shape=box, fontsize=10];
  n0 [label="0: input\nout=[4]"];
  n1 [label="1: linear(payload=node_id)\nout=[5]"];
  n2 [label="2: relu\nout=[5]"];
  n3 [label="3: linear(payload=node_id)\nout=[3]"];
  n4 [label="4: sum\nout=[]"];
  n5 [label="5: tanh\nout=[]"];
  n0 -> n1;
  n1 -> n2;
  n2 -> n3;
  n3 -> n4;
  n4 -> n5;
}
"""


def variant(**changes) -> Graph:
    g = seed_mlp_graph()
    nodes = list(g.nodes)
    nodes[2] = nodes[2].with_(**changes)
    return Graph(nodes, g.inputs, g.outputs)


def test_listing_and_dot_match_the_chapter():
    g = tlb.load_graph(FIXTURES / "seed_mlp_graph.json")
    assert tlb.listing(g) == SEED_LISTING
    assert tlb.to_dot(g) == SEED_DOT
    assert g == seed_mlp_graph()


def test_good_graph_passes_both_checks_and_infers_the_chapter_shapes():
    g = seed_mlp_graph()
    assert tlb.check_well_formed(g) == []
    assert tlb.check(g) == []
    assert [list(s) for s in tlb.infer_shapes(g)] == [[4], [5], [5], [3], [], []]


def test_bad_shape_passes_well_formed_and_fails_shapes():
    g = variant(out_shape=(4,))
    assert tlb.check_well_formed(g) == []
    with pytest.raises(tlb.BridgeError) as e:
        tlb.check(g)
    assert str(e.value) == ("IR graph: node 2: outShape mismatch: inferred=[5], declared=[4] "
                            "(Node(id=2, kind=relu, parents=#[1], outShape=[4]))")


def test_forward_parent():
    with pytest.raises(tlb.BridgeError) as e:
        tlb.check_well_formed(variant(parents=(3,)))
    assert str(e.value) == ("IR graph: node 2: parent id 3 is not < 2 "
                            "(Node(id=2, kind=relu, parents=#[3], outShape=[5]))")


def test_id_discipline():
    with pytest.raises(tlb.BridgeError) as e:
        tlb.check(variant(id=7))
    assert str(e.value) == "IR graph: id discipline violated at index 2: nodes[2].id = 7"


def test_wire_variants_report_the_importer_messages():
    g = tlb.load_graph(FIXTURES / "seed_mlp_bad_shape.json")
    errs = tlb.check(g, collect=True)
    assert [str(e) for e in errs] == ["IR graph: node 2: outShape mismatch: inferred=[5], declared=[4] "
                                      "(Node(id=2, kind=relu, parents=#[1], outShape=[4]))"]
    with pytest.raises(tlb.BridgeError, match=r"^PyTorch graph import: node\[2\]: parent id 3 is not < 2$"):
        tlb.load_graph(FIXTURES / "seed_mlp_bad_parent.json")
    with pytest.raises(tlb.BridgeError,
                       match=r"^PyTorch graph import: raw id discipline violated at index 2: nodes\[2\]\.id = 7$"):
        tlb.load_graph(FIXTURES / "seed_mlp_bad_id.json")


def test_collect_mode_reports_every_problem_without_cascades():
    g = seed_mlp_graph()
    nodes = list(g.nodes)
    nodes[1] = nodes[1].with_(out_shape=(5, 2))  # linear: leading dims must be preserved -> broken
    nodes[3] = nodes[3].with_(kind="relu")      # relu of a broken parent: not re-reported
    nodes[5] = nodes[5].with_(out_shape=(1,))   # tanh [] declared [1]: its own problem
    nodes[4] = nodes[4].with_(parents=(3, 2))   # bad arity for sum
    errs = tlb.check(Graph(nodes, g.inputs, g.outputs), collect=True)
    texts = [str(e) for e in errs]
    assert texts[0].startswith("IR graph: node 4: bad parent count for sum: expected 1..1, got 2")
    assert texts[1] == "IR graph: node 1: linear: leading dimensions must be preserved: input=[4], outShape=[5, 2]"
    assert len(texts) == 2  # node 2, 3 depend on node 1; node 5 depends on the broken node 4
    assert {e.node for e in errs} == {4, 1}
