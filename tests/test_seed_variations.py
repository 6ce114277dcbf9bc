"""The seed chapters' variations, each asserting what the chapter predicts.

Executable-graph chapter: the seven variations on the six-node graph. Architecture chapter: the
variations that mean something outside Lean (a hidden-width mismatch named by its two shapes, a
softmax head leaving the ABI unchanged, a pooling-stride change flowing into the head's weight shape).
"""

from __future__ import annotations

import numpy as np
import pytest

import torchlean_bridge as tlb
from torchlean_bridge.app.kernel_plan import KernelPolicy, PlanError
from torchlean_bridge.bundle import Bundle
from torchlean_bridge.errors import BridgeError, EvalError, GraphError
from torchlean_bridge.graph import Graph, Node
from torchlean_bridge.ops.registry import REGISTRY
from torchlean_bridge.seed import SEED_WEIGHTS, SEED_X0, seed_mlp_graph, seed_mlp_payload


def _with(last: list[Node]) -> Graph:
    return Graph(list(seed_mlp_graph().nodes) + last, inputs=[0], outputs=[last[-1].id])


def _replace_output(kind: str) -> Graph:
    nodes = list(seed_mlp_graph().nodes)
    nodes[5] = Node(5, [4], kind, [])
    return Graph(nodes, inputs=[0], outputs=[5])


# 1. a seventh node: relu on node 5, first with the right shape, then with [3]

def test_variation_1_seventh_node():
    ok = _with([Node(6, [5], "relu", [])])
    tlb.check_well_formed(ok)
    tlb.check(ok)
    bad = _with([Node(6, [5], "relu", [3])])
    tlb.check_well_formed(bad)  # structure is fine: the parent edge points backwards
    with pytest.raises(GraphError) as e:
        tlb.check_shapes(bad)
    assert str(e.value) == ("IR graph: node 6: outShape mismatch: inferred=[], declared=[3] "
                            "(Node(id=6, kind=relu, parents=#[5], outShape=[3]))")


# 2. the two linear payload keys swapped: step 4 of node 1's evaluation fails

def test_variation_2_swapped_payload_keys():
    p = seed_mlp_payload()
    swapped = tlb.Payload({1: p.record(3), 3: p.record(1)})
    with pytest.raises(EvalError) as e:
        tlb.evaluate(seed_mlp_graph(), swapped, SEED_X0)
    assert str(e.value) == "IR eval: linear 1: declared outShape mismatch: [5] vs expected [3]"
    assert e.value.node == 1


# 3. the radius at which coordinate 1 of node 2 stops being [0, 0]

def _node2_coordinate1(radius: float) -> tuple[float, float]:
    lo, hi = tlb.interval_bounds(seed_mlp_graph(), seed_mlp_payload(), SEED_X0 - radius, SEED_X0 + radius)[2]
    return float(lo[1]), float(hi[1])


def test_variation_3_radius_where_relu_coordinate_1_opens():
    w, b = SEED_WEIGHTS["l1.weight"][1], SEED_WEIGHTS["l1.bias"][1]
    center = float(w @ SEED_X0 + b)  # -0.017
    critical = -center / float(np.abs(w).sum())  # 0.017 / 0.29: the pre-activation's upper end reaches 0
    assert abs(critical - 0.0586207) < 1e-6
    assert _node2_coordinate1(0.05) == (0.0, 0.0)
    assert _node2_coordinate1(critical * (1 - 1e-6)) == (0.0, 0.0)
    lo, hi = _node2_coordinate1(critical * (1 + 1e-6))
    assert lo == 0.0 and hi > 0.0
    lo, hi = _node2_coordinate1(0.5)
    assert lo == 0.0 and hi == pytest.approx(-0.017 + 0.5 * 0.29, abs=1e-12)


# 4. and 5. sigmoid and abs instead of tanh: the output box follows the instance's rule

def _node4_box() -> tuple[float, float]:
    lo, hi = tlb.interval_bounds(seed_mlp_graph(), seed_mlp_payload(), SEED_X0 - 0.05, SEED_X0 + 0.05)[4]
    assert f"{float(lo):.6f}" == "0.020775" and f"{float(hi):.6f}" == "0.035640"
    return float(lo), float(hi)


def test_variation_4_sigmoid_box_is_the_monotone_image():
    lo4, hi4 = _node4_box()
    g = _replace_output("sigmoid")
    lo, hi = tlb.interval_bounds(g, seed_mlp_payload(), SEED_X0 - 0.05, SEED_X0 + 0.05)[5]
    sig = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
    # our rule is sigmoid's monotone image, outward rounded (TorchLean's Float instance prints [0, 1])
    assert float(lo) <= sig(lo4) and float(hi) >= sig(hi4)
    assert sig(lo4) - float(lo) < 1e-12 and float(hi) - sig(hi4) < 1e-12
    assert 0 < float(lo) < float(hi) < 1
    tlb.check_containment(g, seed_mlp_payload(), SEED_X0 - 0.05, SEED_X0 + 0.05, samples=50, seed=0)


def test_variation_5_abs_box_is_informative():
    lo4, hi4 = _node4_box()
    lo, hi = tlb.interval_bounds(_replace_output("abs"), seed_mlp_payload(), SEED_X0 - 0.05, SEED_X0 + 0.05)[5]
    assert (float(lo), float(hi)) == (lo4, hi4)  # the box is positive: abs is the identity on it
    assert f"{float(lo):.6f}" == "0.020775" and f"{float(hi):.6f}" == "0.035640"


# 6. log after tanh: with the seed weights every finite input keeps tanh(...) > 0 (each column of W2
# sums to a positive number, ReLU is >= 0 and b2 sums to 0.01), so only non-finite coordinates make
# the evaluation fail, with the log domain message at node 6

def test_variation_6_log_after_tanh():
    g = _with([Node(6, [5], "log", [])])
    tlb.check(g)
    w2, b2 = SEED_WEIGHTS["l2.weight"], SEED_WEIGHTS["l2.bias"]
    assert np.all(w2.sum(axis=0) > 0) and b2.sum() > 0  # node 4 >= b2.sum() = 0.01 for every finite x
    assert float(tlb.evaluate(g, seed_mlp_payload(), SEED_X0)[0]) == pytest.approx(np.log(np.tanh(0.027720)),
                                                                                   abs=1e-4)
    for x in np.random.default_rng(0).uniform(-100, 100, (50, 4)):
        assert np.isfinite(tlb.evaluate(g, seed_mlp_payload(), x)[0])
    for bad in ([np.inf, 0, 0, 0], [0, -np.inf, 0, 0], [0, 0, np.nan, 0]):
        with pytest.raises(EvalError) as e:
            tlb.evaluate(g, seed_mlp_payload(), np.array(bad))
        assert str(e.value).startswith("IR eval: log: input contains values <= 0 (or NaN)") and e.value.node == 6


# 7. a provider this build does not have: the backend boundary refuses, the graph is fine

def test_variation_7_unavailable_provider():
    g = seed_mlp_graph()
    tlb.check(g)
    with pytest.raises(PlanError) as e:
        tlb.plan_kernels(g, KernelPolicy(prefer="libtorch", providers=("reference",)))
    assert str(e.value).startswith("no admissible kernel capsule for op linear on device cpu")
    assert not isinstance(e.value, GraphError)


# -- the architecture chapter -----------------------------------------------------------------

def _chain(widths_and_kinds: list[tuple[str, dict]], in_shape: list[int]) -> Graph:
    """A chain whose declared shapes come from the registry's shape rules (node by node)."""
    nodes = [Node(0, [], "input", in_shape)]
    shape = tuple(in_shape)
    for i, (kind, attrs) in enumerate(widths_and_kinds, start=1):
        attrs = dict(attrs)
        out = attrs.pop("_out", None)
        shape = tuple(out) if out is not None else REGISTRY[kind].infer(attrs, [shape], shape)
        nodes.append(Node(i, [i - 1], kind, list(shape), attrs))
    return Graph(nodes, inputs=[0], outputs=[len(nodes) - 1])


def test_architecture_hidden_width_mismatch_names_both_shapes():
    g = _chain([("linear", {"_out": [5]}), ("relu", {}), ("linear", {"_out": [1]})], [2])
    rng = np.random.default_rng(0)
    bad = tlb.Payload({1: {"weight": rng.standard_normal((5, 2)), "bias": np.zeros(5)},
                       3: {"weight": rng.standard_normal((1, 3)), "bias": np.zeros(1)}})  # Linear(3, 1)
    assert bad.num_parameters() == 19  # the chapter's "19 scalars"
    with pytest.raises(EvalError) as e:
        tlb.evaluate(g, bad, np.array([0.5, 0.8]))
    assert "[3]" in str(e.value) and "[5]" in str(e.value) and e.value.node == 3


def test_architecture_softmax_head_leaves_the_abi_unchanged():
    g = _chain([("linear", {"_out": [3]}), ("relu", {}), ("linear", {"_out": [3]})], [2])
    with_head = Graph(list(g.nodes) + [Node(4, [3], "softmax", [3], {"axis": 0})], inputs=[0], outputs=[4])
    tlb.check(with_head)
    assert tlb.abi(Bundle(with_head)).shapes == tlb.abi(Bundle(g)).shapes == [[3, 2], [3], [3, 3], [3]]
    with pytest.raises(GraphError, match="axis"):
        tlb.check(Graph(list(g.nodes) + [Node(4, [3], "softmax", [3], {"axis": 1})], inputs=[0], outputs=[4]))


def _cnn(pool_stride: int) -> Graph:
    conv = lambda cin: ("conv", {"spatial_rank": 2, "kernel": [3, 3], "stride": [1, 1], "padding": [1, 1],  # noqa
                                 "padding_after": [1, 1], "dilation": [1, 1], "groups": 1, "channel_axis": 0,
                                 "in_channels": cin, "out_channels": 3})
    pool = ("max_pool", {"spatial_rank": 2, "kernel": [2, 2], "stride": [pool_stride] * 2, "padding": [0, 0]})
    body = _chain([conv(1), ("relu", {}), pool, conv(3), ("relu", {}), pool], [1, 8, 8])
    features = body.nodes[-1].out_shape
    n = int(np.prod(features))
    nodes = list(body.nodes) + [Node(7, [6], "flatten", [n], {"value_shape": list(features)}),
                                Node(8, [7], "linear", [2])]
    return Graph(nodes, inputs=[0], outputs=[8])


def test_architecture_pooling_stride_flows_into_the_head_weight_shape():
    g2, g3 = _cnn(2), _cnn(3)
    tlb.check(g2)
    tlb.check(g3)
    assert g2.nodes[6].out_shape == (3, 2, 2)  # the chapter's [3, 2, 2], 12 features
    head2 = [s.shape for s in tlb.abi(Bundle(g2)) if s.node == 8 and s.role == "weight"]
    head3 = [s.shape for s in tlb.abi(Bundle(g3)) if s.node == 8 and s.role == "weight"]
    assert head2 == [(2, 12)] and head3 == [(2, 3)]  # 8 -> 3 -> 1 per axis with stride 3
