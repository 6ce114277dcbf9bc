"""Input splitting bounds many boxes per CROWN pass (``verify(batch=...)``): the batched pass gives each
box the bounds a pass of its own gives, the verdicts do not depend on the batch, the open-box memory
cap ends the search with ``unknown`` saying so, and an ONNX input normalization ``(x - mean) / std``
with constants of shape [1, 1, 1, n] (ACAS Xu's) is rebatched so such models batch too."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from semantics.evaluate import evaluate
from semantics.linear_bounds.batch_axis import with_batch_payload
from torchlean_bridge.app.verify import _Search, load_model, verify
from torchlean_bridge.app.vnnlib import parse_vnnlib
from torchlean_bridge.errors import BridgeError

N_IN, HIDDEN, N_OUT = 5, 16, 3


def acas_like(tmp_path, seed: int):
    """X [1, 1, 1, 5] -> (X - mean) / std -> flatten -> Gemm -> Relu -> Gemm -> Relu -> Gemm, random weights."""
    rng = np.random.default_rng(seed)
    consts = {"mean": rng.uniform(-1, 1, (1, 1, 1, N_IN)), "std": rng.uniform(0.5, 2, (1, 1, 1, N_IN)),
              "w1": rng.standard_normal((HIDDEN, N_IN)), "b1": rng.standard_normal(HIDDEN) * 0.3,
              "w2": rng.standard_normal((HIDDEN, HIDDEN)) / 4, "b2": rng.standard_normal(HIDDEN) * 0.3,
              "w3": rng.standard_normal((N_OUT, HIDDEN)) / 4, "b3": rng.standard_normal(N_OUT) * 0.3}
    nodes = [helper.make_node("Sub", ["X", "mean"], ["centred"]), helper.make_node("Div", ["centred", "std"], ["z"]),
             helper.make_node("Flatten", ["z"], ["f"]),
             helper.make_node("Gemm", ["f", "w1", "b1"], ["h1"], transB=1), helper.make_node("Relu", ["h1"], ["r1"]),
             helper.make_node("Gemm", ["r1", "w2", "b2"], ["h2"], transB=1), helper.make_node("Relu", ["h2"], ["r2"]),
             helper.make_node("Gemm", ["r2", "w3", "b3"], ["Y"], transB=1)]
    graph = helper.make_graph(
        nodes, "acas_like", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 1, 1, N_IN])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, N_OUT])],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    path = tmp_path / f"acas_like_{seed}.onnx"
    onnx.save(model, str(path))
    return load_model(path)


def prop_text(lo: np.ndarray, hi: np.ndarray, threshold: float) -> str:
    """Y_0 - Y_1 <= threshold somewhere in the box (the property's counterexample condition)."""
    lines = [f"(declare-const X_{i} Real)" for i in range(N_IN)] + [f"(declare-const Y_{j} Real)" for j in range(N_OUT)]
    for i in range(N_IN):
        lines += [f"(assert (>= X_{i} {float(lo[i])!r}))", f"(assert (<= X_{i} {float(hi[i])!r}))"]
    return "\n".join(lines + [f"(assert (<= (- Y_0 Y_1) {float(threshold)!r}))"]) + "\n"


def sampled_margins(model, lo: np.ndarray, hi: np.ndarray, n: int = 400) -> np.ndarray:
    xs = lo + np.random.default_rng(0).random((n, N_IN)) * (hi - lo)
    ys = np.stack([model.evaluate(x.reshape(model.input_shape), "float64") for x in xs])
    return ys[:, 0] - ys[:, 1]


def test_the_normalization_constants_are_rebatched(tmp_path):
    """The rebatched graph (constants of shape [1, 1, 1, n] repeated) evaluates N inputs as N
    separate evaluations of the original do."""
    model = acas_like(tmp_path, 0)
    g, payload = model.bundle.graph, model.bundle.payload
    assert any(node.kind == "const" and tuple(node.out_shape) == (1, 1, 1, N_IN) for node in g.nodes)
    got = with_batch_payload(g, payload, 6)
    assert got is not None
    gb, pb = got
    xs = np.random.default_rng(1).standard_normal((6, 1, 1, N_IN))
    batched = np.asarray(evaluate(gb, pb, [xs], dtype="float64")[0])
    single = np.concatenate([np.asarray(evaluate(g, payload, [x[None]], dtype="float64")[0]) for x in xs])
    assert batched.shape == (6, N_OUT)
    np.testing.assert_allclose(batched, single, rtol=1e-12, atol=1e-12)  # batched GEMMs may round differently
    assert model.batched_crown(8) is not None


def test_one_batched_pass_bounds_each_box_as_its_own_pass_does(tmp_path):
    model = acas_like(tmp_path, 1)
    rng = np.random.default_rng(2)
    centres = rng.uniform(-1, 1, (5, 1, 1, 1, N_IN))
    los, his = centres - 0.2, centres + 0.2
    c = np.array([[1.0, -1.0, 0.0], [0.0, 1.0, -1.0]])
    prop = parse_vnnlib(prop_text(los[0].reshape(-1), his[0].reshape(-1), 0.0))
    search = _Search(model, prop, "crown", deadline=float("inf"), seed=0, batch=8)
    y_lo, y_hi, spec_lo, coeffs, _, line_lo = search.bound_many(los, his, c)
    assert search.boxes == 5 and model.batched_crown(8) is not None  # one pass at batch 8 (padded), not 5
    for j in range(5):
        one = _Search(model, prop, "crown", deadline=float("inf"), seed=0, batch=1)
        a_lo, a_hi, a_spec, a_coeffs, _, a_line = one.bound_many(los[j:j + 1], his[j:j + 1], c)
        np.testing.assert_allclose(y_lo[j], a_lo[0], rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(y_hi[j], a_hi[0], rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(spec_lo[j], a_spec[0], rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(coeffs[j], a_coeffs[0], rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(line_lo[j], a_line[0], rtol=1e-9, atol=1e-9)
    # and the bounds are sound on samples of each box
    for j in range(5):
        xs = los[j] + rng.random((200,) + los[j].shape) * (his[j] - los[j])
        ys = np.stack([model.evaluate(x, "float64") for x in xs])
        assert np.all(ys >= y_lo[j] - 1e-9) and np.all(ys <= y_hi[j] + 1e-9)
        assert np.all(ys @ c.T >= spec_lo[j] - 1e-9)


@pytest.mark.parametrize("seed, drops", [(5, (0.5, 2.0)), (7, (0.2, 0.5))])
def test_verdicts_do_not_depend_on_the_batch(tmp_path, seed, drops):
    """On the box [-2, 2]^5, thresholds below the smallest sampled margin: one a counterexample
    satisfies (found after splits, or at once), one that takes a few hundred boxes to prove (measured).
    Batch 1 and the automatic batch agree; a counterexample reproduces; a proof contradicts no sample
    and rests on many boxes (so batches of several were bounded)."""
    model = acas_like(tmp_path, seed)
    lo, hi = np.full(N_IN, -2.0), np.full(N_IN, 2.0)
    margins = sampled_margins(model, lo, hi, n=4000)
    verdicts = []
    for t in (float(margins.min()) - d for d in drops):
        prop = parse_vnnlib(prop_text(lo, hi, t))
        one = verify(model, prop, method="bab-input", timeout=30, batch=1)
        many = verify(model, prop, method="bab-input", timeout=30)
        assert one.result == many.result, (t, one, many)
        verdicts.append(many.result)
        if many.result == "sat":
            for r in (one, many):
                x = np.array(r.counterexample["x"])
                assert np.all(x >= lo) and np.all(x <= hi)
                y = model.evaluate(x.reshape(model.input_shape), "float64")
                assert y[0] - y[1] <= t
        else:
            assert many.result == "unsat" and not np.any(margins <= t), (t, many)
            assert many.best_lower_bound is not None and many.best_lower_bound > 0
            assert many.boxes_explored >= 16 and one.boxes_explored >= 16
    assert verdicts == ["sat", "unsat"]


def test_the_memory_cap_ends_the_search_with_unknown(tmp_path):
    """A true property that takes many splits, with room for a few open boxes only: the search stops
    with the cap named and the best lower bound over the open boxes (not positive: not refuted)."""
    model = acas_like(tmp_path, 5)
    lo, hi = np.full(N_IN, -2.0), np.full(N_IN, 2.0)
    prop = parse_vnnlib(prop_text(lo, hi, float(sampled_margins(model, lo, hi).min()) - 2.0))
    free = verify(model, prop, method="bab-input", timeout=20, batch=2)
    assert free.result == "unsat" and free.boxes_explored >= 16, free  # ~170 boxes measured
    r = verify(model, prop, method="bab-input", timeout=20, batch=2, max_queue_bytes=600)
    assert r.result == "unknown" and r.reason.startswith("memory cap: ") and "600 bytes" in r.reason, r
    assert r.best_lower_bound is not None and r.best_lower_bound <= 0
    assert r.boxes_explored < free.boxes_explored


@pytest.mark.parametrize("batch", [0, -3, 2.5, True, "8"])
def test_a_batch_that_is_not_a_whole_number_of_boxes_is_refused(tmp_path, batch):
    model = acas_like(tmp_path, 4)
    prop = parse_vnnlib(prop_text(np.zeros(N_IN), np.ones(N_IN), 0.0))
    with pytest.raises(BridgeError, match=r"^verify: batch must be a whole number of boxes >= 1, got "):
        verify(model, prop, method="bab-input", timeout=5, batch=batch)


def test_the_fixture_network_batches(tmp_path):
    """The committed ACAS-like fixture rebatches (its graph keeps samples apart)."""
    from pathlib import Path
    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "verify" / "acas_like.onnx"
    model = load_model(fixture)
    assert model.batched_crown(4) is not None
