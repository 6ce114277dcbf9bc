"""Reference semantics on the seed chapter: value table, payload and partiality messages, the CLI."""

import json
import math

import numpy as np
import pytest

import torchlean_bridge as tlb
from semantics.evaluate import eval_node
from semantics.float_random import splitmix64, uniform_bits
from torchlean_bridge.app.cli import main
from torchlean_bridge.app.commands.common import format_vector
from torchlean_bridge.errors import EvalError
from torchlean_bridge.graph import Graph, Node
from torchlean_bridge.payload import Payload
from torchlean_bridge.seed import SEED_X0, seed_mlp_bundle, seed_mlp_graph, seed_mlp_payload
from tests.conftest import FIXTURES

# the chapter's value table (executable-graph-types-and-lowering.txt, "A Heterogeneous Value Table")
SEED_TABLE = ["[0.300000, -0.200000, 0.100000, 0.400000]",
              "[0.107000, -0.017000, 0.004000, 0.081000, -0.003000]",
              "[0.107000, 0.000000, 0.004000, 0.081000, 0.000000]",
              "[0.027540, -0.014730, 0.014910]", "0.027720", "0.027713"]

LOG_MESSAGE = ("IR eval: log: input contains values <= 0 (or NaN); use `safe_log`, "
               "which is log(softplus(x) + eps)")


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_seed_value_table_matches_the_chapter(dtype):
    table = tlb.evaluate(seed_mlp_graph(), seed_mlp_payload(), SEED_X0, dtype=dtype, all_nodes=True)
    assert [format_vector(v) for v in table] == SEED_TABLE
    assert all(v.dtype == np.dtype(dtype) for v in table)


def test_float64_and_float32_agree_to_six_decimals_and_outputs_are_the_last_row():
    out64 = tlb.evaluate(seed_mlp_graph(), seed_mlp_payload(), SEED_X0)
    out32 = tlb.evaluate(seed_mlp_graph(), seed_mlp_payload(), [SEED_X0], dtype="float32")
    assert len(out64) == 1 and out64[0].shape == ()
    assert format_vector(out64[0]) == format_vector(out32[0]) == "0.027713"
    assert abs(float(out64[0]) - math.tanh(0.02772)) < 1e-6


def test_torch_tensor_inputs_are_accepted():
    torch = pytest.importorskip("torch")
    out = tlb.evaluate(seed_mlp_graph(), seed_mlp_payload(), torch.tensor(SEED_X0))
    assert format_vector(out[0]) == "0.027713"


def test_unreadable_inputs_are_reported_not_raised_from_numpy():
    torch = pytest.importorskip("torch")
    with pytest.raises(EvalError, match="cannot read an input tensor of dtype torch.bfloat16"):
        tlb.evaluate(seed_mlp_graph(), seed_mlp_payload(), torch.zeros(4, dtype=torch.bfloat16))
    with pytest.raises(EvalError, match="element type mismatch: expected float"):
        tlb.evaluate(seed_mlp_graph(), seed_mlp_payload(), [np.array(["a", "b", "c", "d"])])


def test_swapped_linear_payload_keys_fail_with_the_chapter_message():
    p = seed_mlp_payload()
    swapped = Payload({1: p.record(3), 3: p.record(1)})
    with pytest.raises(EvalError) as e:
        tlb.evaluate(seed_mlp_graph(), swapped, SEED_X0)
    assert str(e.value) == "IR eval: linear 1: declared outShape mismatch: [5] vs expected [3]"
    assert e.value.node == 1 and e.value.op == "linear"


def test_missing_payloads_and_const_length():
    with pytest.raises(EvalError, match=r"^IR eval: missing linear payload for node 1$"):
        tlb.evaluate(seed_mlp_graph(), Payload(), SEED_X0)
    g = Graph([Node(0, [], "input", [3]), Node(1, [], "const", [3]), Node(2, [0, 1], "add", [3])],
              outputs=[2])
    with pytest.raises(EvalError, match=r"^IR eval: missing const payload for node 1$"):
        tlb.evaluate(g, Payload(), np.zeros(3))
    with pytest.raises(EvalError, match=r"^IR eval: const 1: flat length mismatch: have 4, expected 3$"):
        tlb.evaluate(g, Payload({1: {"values": np.zeros(4)}}), np.zeros(3))
    out = tlb.evaluate(g, Payload({1: {"values": np.array([1.0, 2.0, 3.0])}}), np.ones(3))
    assert out[0].tolist() == [2.0, 3.0, 4.0]


def test_input_shape_and_element_type_are_checked():
    with pytest.raises(EvalError, match=r"^IR eval: shape mismatch: expected \[4\], got \[1, 4\]$"):
        tlb.evaluate(seed_mlp_graph(), seed_mlp_payload(), SEED_X0[None])
    with pytest.raises(EvalError, match="element type mismatch: expected float, got int64"):
        tlb.evaluate(seed_mlp_graph(), seed_mlp_payload(), np.arange(4))
    with pytest.raises(EvalError, match="expected 1 input"):
        tlb.evaluate(seed_mlp_graph(), seed_mlp_payload(), [SEED_X0, SEED_X0])


def _unary_graph(kind: str, n: int = 3) -> Graph:
    return Graph([Node(0, [], "input", [n]), Node(1, [0], kind, [n])])


def test_log_of_non_positive_values_fails_with_the_spec_message():
    for bad in ([1.0, 0.0, 2.0], [1.0, -1.0, 2.0], [1.0, np.nan, 2.0]):
        with pytest.raises(EvalError) as e:
            tlb.evaluate(_unary_graph("log"), None, np.array(bad))
        assert str(e.value) == LOG_MESSAGE
        assert e.value.node == 1 and e.value.op == "log"
    assert tlb.evaluate(_unary_graph("log"), None, np.array([1.0, math.e, 2.0]))[0][1] == pytest.approx(1.0)


@pytest.mark.parametrize("kind, bad", [("rsqrt", [0.0, 1.0, 4.0]), ("rsqrt", [1.0, np.nan, 4.0]),
                                       ("log1p", [-1.0, 0.0, 1.0])])
def test_partial_unary_ops_name_the_node_instead_of_returning_nan(kind, bad):
    """Our no-NaN choice for ext ops: negative or NaN inputs are refused."""
    with pytest.raises(EvalError, match=rf"^IR eval: node 1: {kind}: ") as e:
        tlb.evaluate(_unary_graph(kind), None, np.array(bad))
    assert e.value.node == 1


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_inv_is_ieee_reciprocal_with_signed_infinities_at_zero(dtype):
    """Spec 2.2: inv(x) = 1/x (Lean Float): +-0 gives +-inf, as torch.reciprocal does."""
    torch = pytest.importorskip("torch")
    x = np.array([0.0, -0.0, 2.0], dtype=dtype)
    ours = tlb.evaluate(_unary_graph("inv"), None, x, dtype=dtype)[0]
    assert ours.dtype == np.dtype(dtype) and ours.tolist() == [math.inf, -math.inf, 0.5]
    assert ours.tolist() == torch.reciprocal(torch.from_numpy(x)).tolist()
    # TorchLean's sqrtSpec is sqrt(max(x, 0)): sqrt(-0.0) = +0.0, a negative input gives 0
    root = tlb.evaluate(_unary_graph("sqrt"), None, np.array([-0.0, -4.0, 4.0], dtype=dtype), dtype=dtype)[0]
    assert root.tolist() == [0.0, 0.0, 2.0] and math.copysign(1, root[0]) == 1


def test_pow_nan_division_by_zero_and_gather_range_fail():
    g = Graph([Node(0, [], "input", [2]), Node(1, [0], "pow", [2], {"exponent": 0.5})])
    y = tlb.evaluate(g, None, np.array([-4.0, 4.0]))[0]  # NaN, as torch, onnxruntime and C's pow (issue #32)
    assert np.isnan(y[0]) and y[1] == 2.0
    assert tlb.evaluate(g, None, np.array([9.0, 4.0]))[0].tolist() == [3.0, 2.0]
    g = Graph([Node(0, [], "input", [2]), Node(1, [], "input", [2]), Node(2, [0, 1], "div", [2])])
    with pytest.raises(EvalError, match=r"^IR eval: node 2: div: division by zero"):
        tlb.evaluate(g, None, [np.ones(2), np.array([1.0, 0.0])])
    g = Graph([Node(0, [], "input", [3, 2]), Node(1, [], "input", [2], dtype="int64"),
               Node(2, [0, 1], "gather", [2, 2], {"axis": 0})])
    with pytest.raises(EvalError, match=r"^IR eval: node 2: gather: index 3 out of range for axis 0"):
        tlb.evaluate(g, None, [np.zeros((3, 2)), np.array([0, 3])])



@pytest.mark.parametrize("kind,dtype", [("div", "float64"), ("div", "float32"), ("int_div", "int64")])
def test_division_checks_a_broadcast_divisor_through_its_stored_entries(kind, dtype):
    """A divisor broadcast from a constant is tested on the constant's entries (``stored_entries``): a zero
    anywhere in it is still refused, whichever broadcast axis or position holds it."""
    from semantics.rules.table import stored_entries
    row = np.array([[3, 0, 5]], dtype=dtype)
    view = np.broadcast_to(row[:, None, :], (4, 2, 3))
    assert stored_entries(view).shape == (1, 1, 3) and np.shares_memory(stored_entries(view), row)
    assert stored_entries(np.ones((2, 3))).shape == (2, 3)  # nothing broadcast: the array itself
    t = {"dtype": "int64"} if dtype == "int64" else {}
    g = Graph([Node(0, [], "input", [4, 2, 3], **t), Node(1, [], "const", [1, 1, 3], **t),
               Node(2, [1], "broadcast_to", [4, 2, 3], {"from_shape": [1, 1, 3], "to_shape": [4, 2, 3]}, **t),
               Node(3, [0, 2], kind, [4, 2, 3], **t)])
    x = np.arange(1, 25, dtype=dtype).reshape(4, 2, 3)
    run = dict(dtype=dtype) if dtype != "int64" else {}
    with pytest.raises(EvalError, match=rf"^IR eval: node 3: {kind}: (integer )?division by zero"):
        tlb.evaluate(g, tlb.Payload({1: {"values": row.reshape(1, 1, 3)}}), x, **run)
    ok = row.reshape(1, 1, 3).copy()
    ok[0, 0, 1] = 2
    y = tlb.evaluate(g, tlb.Payload({1: {"values": ok}}), x, **run)[0]
    assert np.array_equal(y, x / ok if kind == "div" else x // ok)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_batch_norm_eval_in_place_steps_give_the_formulas_bits(dtype):
    """The rule runs ``(x - mean) / sqrt(max(var, 0) + eps) * gamma + beta`` step by step in place: the
    same bits as the expression, a negative running variance read as 0."""
    rng = np.random.default_rng(3)
    c = 5
    x = rng.standard_normal((2, c, 3, 4)).astype(dtype)
    rec = {k: rng.standard_normal(c).astype(dtype) for k in ("running_mean", "weight", "bias")}
    rec["running_var"] = np.abs(rng.standard_normal(c)).astype(dtype)
    rec["running_var"][0] = -0.5
    g = Graph([Node(0, [], "input", [2, c, 3, 4]),
               Node(1, [0], "batch_norm_eval", [2, c, 3, 4], {"channel_axis": 1, "channels": c, "eps": 1e-5})])
    y = tlb.evaluate(g, tlb.Payload({1: rec}), x, dtype=dtype)[0]
    t = np.dtype(dtype).type
    sh = (c, 1, 1)
    want = (x - rec["running_mean"].reshape(sh)) / np.sqrt(np.maximum(rec["running_var"], t(0)) + 1e-5).reshape(sh) \
        * rec["weight"].reshape(sh) + rec["bias"].reshape(sh)
    assert y.dtype == np.dtype(dtype) and y.tobytes() == want.astype(dtype).tobytes()

def test_eval_node_folds_one_node_in_either_domain():
    node = Node(2, [0, 1], "add", [2])
    y = eval_node(node, [np.array([1.0, 2.0]), np.array([0.5, 0.25])], None)
    assert y.dtype == np.float64 and y.tolist() == [1.5, 2.25]
    assert eval_node(node, [np.ones(2), np.ones(2)], {}, "float32").dtype == np.float32
    const = Node(0, [], "const", [3], dtype="int64")
    assert eval_node(const, [], {"values": np.array([4, 5, 6])}, "float32").tolist() == [4, 5, 6]
    with pytest.raises(tlb.BridgeError, match="unsupported dtype"):
        eval_node(node, [np.ones(2), np.ones(2)], None, "float16")


def test_every_registered_op_has_float_semantics():
    from semantics.rules import FLOAT_RULES
    from torchlean_bridge.ops import REGISTRY
    assert sorted(set(REGISTRY) - set(FLOAT_RULES)) == []


def test_custom_has_no_checked_body():
    g = Graph([Node(0, [], "input", [2]),
               Node(1, [0], "custom", [2], {"name": "f", "input_shapes": [[2]], "output_shape": [2]})])
    with pytest.raises(EvalError, match=r"^IR eval: custom f: "):
        tlb.evaluate(g, None, np.zeros(2))


def test_values_are_dropped_after_their_last_use():
    """Without all_nodes only the outputs survive the evaluation; nothing else is kept alive."""
    import gc
    import weakref

    import semantics.domains as domains
    g, p = seed_mlp_graph(), seed_mlp_payload()
    refs = []
    node_value = domains.node_value

    def spy(domain, node, parents, record):
        v = node_value(domain, node, parents, record)
        refs.append(weakref.ref(v))
        return v

    domains.node_value = spy
    try:
        out = tlb.evaluate(g, p, SEED_X0.copy())
    finally:
        domains.node_value = node_value
    gc.collect()
    assert [r() is not None for r in refs] == [False, False, False, False, False, True]
    assert out[0] is refs[-1]()


# spec section 2.2 (`Spec.Random`) in plain Python ints: an oracle independent of semantics/float_random.py
def spec_mix(x: int) -> int:
    z1 = (x + 0x9E3779B97F4A7C15) % 2**64
    z2 = ((z1 ^ (z1 >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
    z3 = ((z2 ^ (z2 >> 27)) * 0x94D049BB133111EB) % 2**64
    return z3 ^ (z3 >> 31)


def spec_uniform(seed: int, node_index: int, count: int) -> list[float]:
    """key = mix((seed + i) mod 2^64); u_k = mix((key + k) mod 2^64) mod 2^32; value u_k / 2^32."""
    key = spec_mix((seed + node_index) % 2**64)
    return [(spec_mix((key + k) % 2**64) % 2**32) / 2**32 for k in range(count)]


def test_splitmix64_stream_matches_the_reference_constants():
    # splitmix64 from state 0: first outputs 0xe220a8397b1dcdaf, 0x6e789e6aa1b965f4 (Vigna's reference)
    z = splitmix64(np.array([0, 0x9E3779B97F4A7C15], dtype=np.uint64))
    assert [hex(int(v)) for v in z] == ["0xe220a8397b1dcdaf", "0x6e789e6aa1b965f4"]
    # the node's key is mix(seed + node index); entry k uses mix(key + k) mod 2^32
    assert [int(u) for u in uniform_bits(7, 2, 5)] == [round(v * 2**32) for v in spec_uniform(7, 2, 5)]
    assert [int(u) for u in uniform_bits(2**64 - 1, 3, 4)] == [round(v * 2**32) for v in spec_uniform(2**64 - 1, 3, 4)]


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_rand_uniform_and_bernoulli_mask_follow_the_spec_stream(dtype):
    g = Graph([Node(0, [], "input", []), Node(1, [], "rand_uniform", [2, 3], {"seed": 11}),
               Node(2, [0], "bernoulli_mask", [2, 3], {"seed": 11})], outputs=[1, 2])
    u, m = tlb.evaluate(g, None, np.array(0.5), dtype=dtype)
    want_u = np.array(spec_uniform(11, 1, 6), dtype=dtype).reshape(2, 3)
    assert u.dtype == np.dtype(dtype) and u.tolist() == want_u.tolist()
    want_m = [1.0 if np.array(0.5, dtype) > np.array(v, dtype) else 0.0 for v in spec_uniform(11, 2, 6)]
    assert m.reshape(-1).tolist() == want_m and 0 < sum(want_m) < 6
    assert (tlb.evaluate(g, None, np.array(0.0))[1] == 0).all()
    assert (tlb.evaluate(g, None, np.array(1.0))[1] == 1).all()


def test_softplus_is_sign_branched_and_batch_norm_clamps_variance():
    x = np.array([-800.0, -1.0, 0.0, 1.0, 800.0])
    y = tlb.evaluate(_unary_graph("softplus", 5), None, x)[0]
    assert y.tolist() == [0.0, math.log(1 + math.exp(-1.0)), math.log(2.0),
                          1.0 + math.log(1 + math.exp(-1.0)), 800.0]
    g = Graph([Node(0, [], "input", [2, 2]),
               Node(1, [0], "batch_norm_eval", [2, 2], {"channel_axis": 1, "channels": 2, "eps": 0.25})])
    rec = {"weight": np.array([2.0, 3.0]), "bias": np.array([1.0, -1.0]),
           "running_mean": np.array([1.0, 0.0]), "running_var": np.array([-5.0, 0.75])}
    y = tlb.evaluate(g, Payload({1: rec}), np.array([[2.0, 1.0], [0.0, -1.0]]))[0]
    assert y.tolist() == [[(2 - 1) / 0.5 * 2 + 1, 1 / 1.0 * 3 - 1], [(0 - 1) / 0.5 * 2 + 1, -1 / 1.0 * 3 - 1]]


def test_batch_norm_and_conv_payload_mismatches():
    g = Graph([Node(0, [], "input", [1, 2]),
               Node(1, [0], "batch_norm_eval", [1, 2], {"channel_axis": 1, "channels": 2})])
    rec = {r: np.zeros(3) for r in ("weight", "bias", "running_mean", "running_var")}
    with pytest.raises(EvalError, match=r"^IR eval: batch_norm_eval 1: payload and node channel counts differ$"):
        tlb.evaluate(g, Payload({1: rec}), np.zeros((1, 2)))
    with pytest.raises(EvalError, match=r"^IR eval: missing batch_norm_eval payload for node 1$"):
        tlb.evaluate(g, None, np.zeros((1, 2)))
    conv = {"spatial_rank": 1, "kernel": [3], "stride": [1], "padding": [1], "padding_after": [1],
            "dilation": [1], "groups": 2, "channel_axis": 0, "in_channels": 4, "out_channels": 2}
    g = Graph([Node(0, [], "input", [4, 5]), Node(1, [0], "conv", [2, 5], conv)])
    dense = {"weight": np.zeros((2, 4, 3)), "bias": np.zeros(2)}
    with pytest.raises(EvalError, match=r"^IR eval: conv 1: payload does not match the node configuration"):
        tlb.evaluate(g, Payload({1: dense}), np.zeros((4, 5)))
    with pytest.raises(EvalError, match=r"^IR eval: missing conv payload for node 1$"):
        tlb.evaluate(g, None, np.zeros((4, 5)))


def test_layernorm_payload_shape_is_checked_against_the_suffix():
    g = Graph([Node(0, [], "input", [2, 3, 4]), Node(1, [0], "layernorm", [2, 3, 4], {"axis": 1})])
    with pytest.raises(EvalError, match=r"^IR eval: node 1: layernorm payload shape \[4, 3\] does not match "
                                        r"normalized suffix \[3, 4\]$"):
        tlb.evaluate(g, Payload({1: {"weight": np.ones((4, 3))}}), np.zeros((2, 3, 4)))
    with pytest.raises(EvalError, match=r"^IR eval: node 1: layernorm payload has inconsistent suffix size$"):
        tlb.evaluate(g, Payload({1: {"weight": np.ones(5)}}), np.zeros((2, 3, 4)))


def test_check_flag_and_all_nodes_table():
    g = seed_mlp_graph()
    table = tlb.evaluate(g, seed_mlp_payload(), SEED_X0, all_nodes=True, check=False)
    assert [v.shape for v in table] == [n.out_shape for n in g.nodes]
    bad = Graph(list(g.nodes[:2]) + [g.nodes[2].with_(out_shape=(4,))] + list(g.nodes[3:]), g.inputs, g.outputs)
    with pytest.raises(tlb.BridgeError, match=r"^IR graph: node 2: outShape mismatch"):
        tlb.evaluate(bad, seed_mlp_payload(), SEED_X0)
    with pytest.raises(EvalError, match=r"^IR eval: node 2: produced shape mismatch: produced=\[5\], declared=\[4\]"):
        tlb.evaluate(bad, seed_mlp_payload(), SEED_X0, check=False)


def test_unchecked_graphs_still_fail_with_torchlean_eval_messages():
    """check=False is TorchLean's denoteAll (well-formedness only): each node checks locally."""
    g = Graph([Node(0, [], "input", [2, 3]), Node(1, [0], "reshape", [5], {"in_shape": [2, 3], "out_shape": [5]})])
    with pytest.raises(EvalError, match=r"^IR eval: node 1: reshape numel mismatch: 6 vs 5$"):
        tlb.evaluate(g, None, np.zeros((2, 3)), check=False)
    g = Graph([Node(0, [], "input", [2]), Node(1, [], "input", [3]), Node(2, [0, 1], "mse_loss", [])])
    with pytest.raises(EvalError, match=r"^IR eval: node 2: mse_loss expects equal shapes, got \[2\] vs \[3\]$"):
        tlb.evaluate(g, None, [np.zeros(2), np.zeros(3)], check=False)
    g = Graph([Node(0, [], "input", [2]), Node(1, [0], "bernoulli_mask", [2], {"seed": 0})])
    with pytest.raises(EvalError, match=r"^IR eval: node 1: bernoulli_mask expects scalar keepProb parent"):
        tlb.evaluate(g, None, np.zeros(2), check=False)
    g = Graph([Node(0, [], "input", [3]),
               Node(1, [0], "broadcast_to", [2, 2], {"from_shape": [3], "to_shape": [2, 2]})])
    with pytest.raises(EvalError, match=r"^IR eval: node 1: broadcastTo invalid: \[3\] → \[2, 2\]$"):
        tlb.evaluate(g, None, np.zeros(3), check=False)


# -- CLI --------------------------------------------------------------------------------------

def _run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_eval_prints_the_seed_table(capsys, tmp_path):
    x = tmp_path / "x.npy"
    np.save(x, SEED_X0)
    bundle = FIXTURES / "seed_mlp.json"
    code, out, _ = _run(capsys, "eval", str(bundle), "--input", str(x), "--all-nodes", "--full")
    assert code == 0
    assert out.splitlines() == [f"node {i}: {v}" for i, v in enumerate(SEED_TABLE)]
    code, out, _ = _run(capsys, "eval", str(bundle), "--input", str(x), "--dtype", "float32")
    assert code == 0 and out == "node 5: 0.027713\n"
    code, out, _ = _run(capsys, "eval", str(bundle), "--input", str(x), "--json")
    doc = json.loads(out)
    assert code == 0 and doc["nodes"][0]["id"] == 5 and abs(doc["nodes"][0]["value"] - 0.027713) < 1e-6


def test_cli_eval_on_a_saved_bundle_and_bad_input(capsys, tmp_path):
    tlb.save(seed_mlp_bundle(), tmp_path / "b")
    x, bad = tmp_path / "x.npy", tmp_path / "bad.npy"
    np.save(x, SEED_X0)
    np.save(bad, np.zeros(3))
    code, out, _ = _run(capsys, "eval", str(tmp_path / "b"), "--input", str(x))
    assert code == 0 and out == "node 5: 0.027713\n"
    code, _, err = _run(capsys, "eval", str(tmp_path / "b"), "--input", str(bad))
    assert code == 2 and "IR eval: shape mismatch: expected [4], got [3]" in err
    code, _, err = _run(capsys, "eval", str(tmp_path / "b"), "--input", str(tmp_path / "missing.npy"))
    assert code == 2 and "cannot read array" in err


def test_erf_tables_are_accurate_against_mpmath():
    """erf has no numpy implementation; ours must be within a few ulps (binary64) / one ulp (binary32)."""
    mpmath = pytest.importorskip("mpmath")
    from semantics.float_special import erf
    rng = np.random.default_rng(0)
    xs = np.concatenate([rng.uniform(-7, 7, 2000), np.logspace(-300, 0.8, 200), -np.logspace(-30, 0.8, 200),
                         np.arange(-6, 6.01, 1 / 64), [0.0, 5.9999999, 6.0, 1e300]])
    with mpmath.workdps(40):
        exact = np.array([float(mpmath.erf(mpmath.mpf(float(v)))) for v in xs])
    rel64 = np.abs(erf(xs, np.float64) - exact) / np.maximum(np.abs(exact), 1e-300)
    assert rel64.max() < 1e-15
    xs32 = xs[np.abs(xs) < 1e30].astype(np.float32)
    with mpmath.workdps(40):
        exact32 = np.array([float(mpmath.erf(mpmath.mpf(float(v)))) for v in xs32])
    got32 = erf(xs32, np.float32)
    assert got32.dtype == np.float32
    normal = np.abs(exact32) > 1e-37  # below that binary32 itself is subnormal
    assert (np.abs(got32 - exact32)[normal] / np.abs(exact32[normal])).max() < 3e-7
    assert np.isnan(erf(np.array([np.nan]))[0]) and erf(np.array([np.inf, -np.inf])).tolist() == [1.0, -1.0]


def test_binary32_erf_is_within_one_and_a_half_ulps_on_a_dense_grid():
    """The binary32 closed forms against the binary64 table (itself within 1e-15 of mpmath, above) on
    2M points of [-4.5, 4.5], the neighbourhoods of the split at 1 and the cut at 4, every binary32
    value in [0.99, 1.01], subnormals and the special values; NaN stays NaN, signs and -0.0 kept."""
    from semantics.float_special import erf
    rng = np.random.default_rng(1)
    near = np.arange(np.float32(0.99).view(np.int32), np.float32(1.01).view(np.int32), dtype=np.int32).view(np.float32)
    xs = np.concatenate([np.linspace(-4.5, 4.5, 2_000_001), np.linspace(3.9, 4.1, 20_001), near, -near,
                         rng.uniform(-1e-37, 1e-37, 1000)]).astype(np.float32)
    got = erf(xs, np.float32)
    want = erf(xs.astype(np.float64))
    ulps = np.abs(got - want) / np.spacing(np.abs(want).astype(np.float32)).astype(np.float64)
    assert got.dtype == np.float32 and ulps.max() <= 1.5
    special = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 4.0, 1e30], np.float32)
    got = erf(special, np.float32)
    assert np.isnan(got[0]) and got[1:].tolist() == [1.0, -1.0, 0.0, -0.0, special[5] * 1.0, -special[5], 1.0, 1.0]
    assert np.signbit(got[4]) and not np.signbit(got[3])
    assert erf(np.float32(0.5), np.float32).shape == () and erf(np.zeros((0, 3), np.float32), np.float32).shape == (0, 3)


def test_binary32_erf_gathered_and_blended_forms_agree_bit_for_bit(monkeypatch):
    """Where few entries need the large form it runs on them alone (gathered by index): the same bits as
    the blend of both forms over every entry, specials and -0.0 included, in both shares of large entries."""
    import semantics.float_special as special
    rng = np.random.default_rng(4)
    for scale in (0.4, 3.0):  # about 1% and 74% of the entries at |x| >= 1
        x = (rng.standard_normal(200_000) * scale).astype(np.float32)
        x[:9] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 1.0, -4.0]
        runs = []
        for share in (0.0, 1.0):  # 0: always the blend; 1: always gathered
            monkeypatch.setattr(special, "_GATHER_LARGE", share)
            runs.append(special.erf(x, np.float32))
        assert np.array_equal(runs[0].view(np.uint32), runs[1].view(np.uint32))


def test_cast_to_int64_refuses_values_it_cannot_represent():
    g = Graph([Node(0, [], "input", [2]), Node(1, [0], "cast", [2], {"dtype": "int64"}, dtype="int64")])
    assert tlb.evaluate(g, None, np.array([-2.7, 3.9]))[0].tolist() == [-2, 3]
    for bad in (np.nan, np.inf, 1e19):
        with pytest.raises(EvalError, match=r"^IR eval: node 1: cast: "):
            tlb.evaluate(g, None, np.array([0.0, bad]))


def test_cli_eval_several_inputs_exact_integers_and_json_without_nan(capsys, tmp_path):
    g = Graph([Node(0, [], "input", [3, 2]), Node(1, [], "input", [2], dtype="int64"),
               Node(2, [0, 1], "gather", [2, 2], {"axis": 0}), Node(3, [2], "exp", [2, 2]),
               Node(4, [2], "argmax", [2], {"axis": 1}, dtype="int64")], outputs=[3, 4])
    tlb.save(tlb.Bundle(g), tmp_path / "b")
    np.save(tmp_path / "d.npy", np.array([[0.0, 1.0], [2.0, 3.0], [800.0, 5.0]]))
    np.save(tmp_path / "i.npy", np.array([2, 0]))
    args = ["eval", str(tmp_path / "b"), "--input", str(tmp_path / "d.npy"), "--input", str(tmp_path / "i.npy")]
    code, out, _ = _run(capsys, *args)
    assert code == 0
    assert out.splitlines() == [f"node 3: [[inf, {math.exp(5):.6f}], [1.000000, {math.e:.6f}]]", "node 4: [0, 1]"]
    code, out, _ = _run(capsys, *args, "--json")
    nodes = json.loads(out)["nodes"]
    assert nodes[0]["value"][0] == ["inf", math.exp(5.0)] and nodes[1]["value"] == [0, 1]
    code, _, err = _run(capsys, *args[:4])
    assert code == 2 and "expected 2 input(s), got 1" in err


@pytest.mark.parametrize("kernel, stride, pad, ceil", [((9, 9), (1, 1), (0, 0), False), ((9, 8), (3, 2), (4, 3), True),
                                                       ((3, 3), (2, 2), (1, 1), True)])
def test_pooling_large_and_small_windows_match_torch(kernel, stride, pad, ceil):
    """More than 64 kernel offsets take the window-view path; small kernels fold offset by offset."""
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(0).standard_normal((2, 3, 17, 16))
    attrs = {"spatial_rank": 2, "kernel": kernel, "stride": stride, "padding": pad, "padding_after": pad,
             "dilation": (1, 1), "ceil_mode": ceil, "count_include_pad": False}
    t = torch.from_numpy(x)
    refs = {"max_pool_nd": torch.nn.functional.max_pool2d(t, kernel, stride, pad, ceil_mode=ceil),
            "avg_pool_nd": torch.nn.functional.avg_pool2d(t, kernel, stride, pad, ceil_mode=ceil,
                                                          count_include_pad=False)}
    for kind, ref in refs.items():
        g = Graph([Node(0, [], "input", x.shape), Node(1, [0], kind, tuple(ref.shape), attrs)])
        np.testing.assert_allclose(tlb.evaluate(g, None, x)[0], ref.numpy(), rtol=1e-12, atol=1e-15)


def test_a_list_of_plain_numbers_is_one_input_array_everywhere():
    """Decision: a list/tuple holding arrays or tensors is a list of inputs; a (nested) list of
    plain numbers is one array, for evaluate, interval_bounds and input_sets alike."""
    from semantics.evaluate import input_sets
    one = Graph([Node(0, [], "input", [2]), Node(1, [0], "exp", [2])])
    np.testing.assert_array_equal(tlb.evaluate(one, None, [0.0, 1.0])[0], np.exp([0.0, 1.0]))
    np.testing.assert_array_equal(tlb.evaluate(one, None, (np.array([0.0, 1.0]),))[0], np.exp([0.0, 1.0]))
    lo, hi = tlb.interval_bounds(one, None, [0.0, 1.0], [1.0, 2.0])[1]
    assert lo[0] <= 1.0 <= hi[0] and lo[1] <= math.e <= hi[1] and hi[1] >= math.exp(2.0)
    two = Graph([Node(0, [], "input", [2]), Node(1, [], "input", [2]), Node(2, [0, 1], "add", [2])])
    np.testing.assert_array_equal(tlb.evaluate(two, None, [np.ones(2), [1.0, 2.0]])[0], [2.0, 3.0])
    with pytest.raises(EvalError, match=r"^IR eval: expected 2 input\(s\), got 1$"):
        tlb.evaluate(two, None, [[0.0, 1.0], [1.0, 2.0]])  # one [2, 2] array, not two inputs
    with pytest.raises(tlb.BridgeError, match=r"^interval: lower bounds: expected 2 input\(s\), got 1$"):
        tlb.interval_bounds(two, None, [[0.0, 1.0], [1.0, 2.0]], [[0.0, 1.0], [1.0, 2.0]])
    assert len(input_sets(one, [0.0, 1.0])) == 1
    sets = input_sets(two, [[np.zeros(2), np.ones(2)], [np.ones(2), [2.0, 3.0]]])
    assert [[list(x) for x in s] for s in sets] == [[[0, 0], [1, 1]], [[1, 1], [2, 3]]]
