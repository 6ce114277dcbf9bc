"""VNN-LIB parsing (the VNN-COMP subset, clear errors outside it) and ``verify``.

Verify is checked for its two promises on networks it has never seen: never ``unsat`` where a
counterexample exists (dense sampling of the box finds none, and properties satisfied at the
centre by construction are always ``sat``), never ``sat`` without a counterexample that reproduces
(in the box, satisfying the rows in float64, float32 and onnxruntime, re-evaluated here).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn

import torchlean_bridge as tlb
from torchlean_bridge.app.verify import load_model, verify, verify_files
from torchlean_bridge.app.vnnlib import parse_vnnlib

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "fixtures" / "verify"


def decl(n_in: int, n_out: int) -> str:
    return "\n".join([f"(declare-const X_{i} Real)" for i in range(n_in)]
                     + [f"(declare-const Y_{j} Real)" for j in range(n_out)]) + "\n"


def box(lo, hi) -> str:
    return "\n".join(f"(assert (>= X_{i} {float(a)!r}))\n(assert (<= X_{i} {float(b)!r}))" for i, (a, b) in
                     enumerate(zip(lo, hi))) + "\n"


# -- parsing ------------------------------------------------------------------------------------


def test_parse_boxes_terms_and_disjunctions():
    text = decl(2, 3) + """; comment
(assert (<= X_0 1.5)) (assert (>= X_0 -0.5))
(assert (and (<= X_1 2) (>= X_1 0)))
(assert (or (and (<= Y_0 Y_1) (>= (+ Y_2 (* 2 Y_0)) 1.0))
            (and (< (- Y_1 Y_2) -3e-1))))
"""
    p = parse_vnnlib(text)
    assert (p.n_inputs, p.n_outputs, len(p.cases)) == (2, 3, 1)
    case = p.cases[0]
    np.testing.assert_array_equal(case.lower, [-0.5, 0.0])
    np.testing.assert_array_equal(case.upper, [1.5, 2.0])
    (c1, d1, s1), (c2, d2, s2) = case.groups
    np.testing.assert_array_equal(c1, [[1, -1, 0], [-2, 0, -1]])
    np.testing.assert_array_equal(d1, [0, -1.0])
    assert not s1.any()
    np.testing.assert_array_equal(c2, [[0, 1, -1]])
    np.testing.assert_allclose(d2, [-0.3])
    assert s2.all()


def test_input_disjunction_gives_several_boxes():
    text = decl(1, 1) + "(assert (or (and (>= X_0 0) (<= X_0 1)) (and (>= X_0 2) (<= X_0 3))))\n(assert (>= Y_0 5))\n"
    p = parse_vnnlib(text)
    assert [(c.lower[0], c.upper[0]) for c in p.cases] == [(0.0, 1.0), (2.0, 3.0)]
    assert all(len(c.groups) == 1 for c in p.cases)


@pytest.mark.parametrize("body, message", [
    ("(assert (<= X_0 1))", "X_0 is not bounded on both sides"),
    ("(assert (>= X_0 0)) (assert (<= X_0 1)) (assert (<= (+ X_0 Y_0) 1))", "mixes inputs X and outputs Y"),
    ("(assert (>= X_0 0)) (assert (<= X_0 1)) (assert (<= (* Y_0 Y_0) 1))", "product of two variables"),
    ("(assert (>= X_0 0)) (assert (<= X_0 1)) (assert (= Y_0 1))", "'=' is outside"),
    ("(assert (>= X_0 0)) (assert (<= X_0 1)) (assert (not (<= Y_0 1)))", "'not' is outside"),
    ("(define-fun f () Real 1.0)", "command 'define-fun' is outside"),
    ("(assert (>= X_0 0)) (assert (<= X_0 Z))", "'Z' is neither a number"),
    ("(assert (>= X_0 0)", "never closed"),
    ("(assert (>= X_0 0)))", "unbalanced"),
    ("(assert (>= X_0 0)) (assert (<= X_0 1)) (assert (<= (+ X_0 X_0) 1))", None),
])
def test_errors_outside_the_subset(body, message):
    text = decl(1, 1) + body + "\n"
    if message is None:  # 2 X_0 <= 1 is a bound on one variable: accepted
        assert parse_vnnlib(text).cases[0].upper[0] == 0.5
        return
    with pytest.raises(tlb.BridgeError, match=message):
        parse_vnnlib(text)


def test_declarations_must_be_contiguous_and_real():
    with pytest.raises(tlb.BridgeError, match="missing X_1"):
        parse_vnnlib("(declare-const X_0 Real)(declare-const X_2 Real)(declare-const Y_0 Real)")
    with pytest.raises(tlb.BridgeError, match="sort 'Int'"):
        parse_vnnlib("(declare-const X_0 Int)")


def test_load_vnnlib_checks_counts(tmp_path):
    f = tmp_path / "p.vnnlib"
    f.write_text(decl(2, 1) + box([0, 0], [1, 1]) + "(assert (<= Y_0 0))\n")
    p = tlb.load_vnnlib(f, input_shape=(1, 2))
    assert p.cases[0].lower.shape == (1, 2)
    with pytest.raises(tlb.BridgeError, match="declares 2 inputs"):
        tlb.load_vnnlib(f, input_shape=(1, 3))
    with pytest.raises(tlb.BridgeError, match="cannot read"):
        tlb.load_vnnlib(tmp_path / "missing.vnnlib")

def test_strict_input_bounds_open_the_box():
    text = decl(2, 1) + """(assert (> X_0 0)) (assert (<= X_0 1)) (assert (>= X_0 0))
(assert (< X_1 0.5)) (assert (<= X_1 0.75)) (assert (>= X_1 -1))
(assert (<= Y_0 0))"""
    case, = parse_vnnlib(text).cases
    np.testing.assert_array_equal(case.lower, [0, -1])
    np.testing.assert_array_equal(case.upper, [1, 0.5])
    assert case.lower_open.tolist() == [True, False] and case.upper_open.tolist() == [False, True]
    # a point box with an open side is empty: that disjunct has no counterexample
    point = decl(1, 1) + "(assert (or (and (< X_0 0.5) (> X_0 0.5)) (and (<= X_0 0.5) (< X_0 0.5) (>= X_0 0.5))" \
                         " (and (<= X_0 2) (>= X_0 2))))\n(assert (<= Y_0 0))"
    assert [(c.lower[0], c.upper[0]) for c in parse_vnnlib(point).cases] == [(2.0, 2.0)]


def _identity_model(tmp_path):
    """y = x on one input: the boundary of an open input bound is the only candidate of its property."""
    from exporters.folder import save
    net = nn.Linear(1, 1)
    with torch.no_grad():
        net.weight.fill_(1.0)
        net.bias.zero_()
    save(tlb.import_fx(net.eval(), (torch.zeros(1, 1),)), tmp_path / "identity")
    return load_model(tmp_path / "identity")


def _onnx_file(path: Path, nodes: list, inputs: list, outputs: list) -> Path:
    """A one-graph ONNX model (opset 13) of ``nodes`` saved at ``path``."""
    import onnx
    from onnx import helper
    model = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs),
                              opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


@pytest.mark.parametrize("method", ["ibp", "crown"])
def test_no_counterexample_on_an_open_bound(method, tmp_path):
    model = _identity_model(tmp_path)
    empty = parse_vnnlib(decl(1, 1) + "(assert (>= X_0 0)) (assert (< X_0 0.5)) (assert (>= Y_0 0.5))")
    assert verify(model, empty, method=method, timeout=2).result in ("unknown", "unsat")
    inside = parse_vnnlib(decl(1, 1) + "(assert (> X_0 0.25)) (assert (< X_0 0.5)) (assert (>= Y_0 0.25))")
    r = verify(model, inside, method=method, timeout=10)
    assert r.result == "sat"
    _reproduces(model, inside, r.counterexample)
    assert 0.25 < r.counterexample["x"][0] < 0.5


def test_output_atoms_may_carry_inputs_with_coefficient_zero():
    case, = parse_vnnlib(decl(3, 2) + box([0] * 3, [1] * 3) + "(assert (<= (+ Y_1 (* 0 X_2)) 4))").cases
    (c, d, _), = case.groups
    np.testing.assert_array_equal(c, [[0, 1]])
    np.testing.assert_array_equal(d, [4])


def test_numbers_names_and_nesting_outside_the_subset():
    for token in ("1_0", "inf", "nan", "0x10", "1e", "--1"):
        with pytest.raises(tlb.BridgeError, match="neither a number"):
            parse_vnnlib(decl(1, 1) + f"(assert (>= X_0 0)) (assert (<= X_0 {token}))")
    for token, value in (("-1.5e-03", -1.5e-3), ("+2", 2.0), (".5", 0.5), ("5.", 5.0), ("1E2", 100.0)):
        case = parse_vnnlib(decl(1, 1) + f"(assert (>= X_0 -1e3)) (assert (<= X_0 {token}))").cases[0]
        # binary64's -0.0015 lies below the decimal: the box's side is the next number up, open
        assert case.upper[0] == (np.nextafter(value, 1) if token == "-1.5e-03" else value)
        assert case.upper_open[0] == (token == "-1.5e-03")
    with pytest.raises(tlb.BridgeError, match="constant 'X_01'"):
        parse_vnnlib(decl(2, 1) + "(declare-const X_01 Real)")
    deep = decl(1, 1) + box([0], [1]) + "(assert " + "(and " * 300 + "(<= Y_0 0)" + ")" * 301
    with pytest.raises(tlb.BridgeError, match="nested deeper than 256 levels"):
        parse_vnnlib(deep)
    fine = decl(1, 1) + box([0], [1]) + "(assert " + "(and " * 200 + "(<= Y_0 0)" + ")" * 201
    assert len(parse_vnnlib(fine).cases) == 1


def test_numbers_and_arithmetic_beyond_binary64_are_refused_by_line(tmp_path):
    """1e-400 read as 0 turned ``Y_0 >= 1e-400`` into ``Y_0 >= 0`` (sat at y = 0, where the property has
    no point); 1e200 * 1e200 became an infinite row; 1e308 + 1e308 an infinite right-hand side."""
    head = decl(1, 1) + box([0], [0])
    for body, message in (("(>= Y_0 1e-400)", "line 5: the number 1e-400 is nonzero but rounds to 0"),
                          ("(>= Y_0 -1e400)", "line 5: the number -1e400 is beyond binary64's range"),
                          ("(<= (* 1e-200 1e-200 Y_0) 0)", "line 5: the product 1e-200 \\* 1e-200 is nonzero but "
                                                           "rounds to 0"),
                          ("(<= (* 1e-200 (* 1e-200 Y_0)) 0)", "line 5: the product .* rounds to 0"),
                          ("(>= (* 1e200 1e200 Y_0) 1)", "line 5: the product .* beyond binary64's range"),
                          ("(>= Y_0 (+ 1e308 1e308))", "line 5: a sum is beyond binary64's range"),
                          ("(>= Y_0 (- -1e308 1e308))", "line 5: a sum is beyond binary64's range"),
                          ("(<= -1e308 (- 1e308 Y_0))", "line 5: a sum is beyond binary64's range")):
        with pytest.raises(tlb.BridgeError, match=message):
            parse_vnnlib(head + f"(assert {body})")
    with pytest.raises(tlb.BridgeError, match="line 3: the bound .* on X_0 is outside binary64's range"):
        parse_vnnlib(decl(1, 1) + "(assert (<= (* 1e-300 X_0) 1e10))\n(assert (>= X_0 0))")
    # zeros stay zeros, and in-range products and subnormals are kept
    case, = parse_vnnlib(head + "(assert (<= (* 0.0e-400 Y_0) (* 0 1e-300)))\n(assert (>= (* 1e-160 1e-160 Y_0) 1e-310))").cases
    (c, d, _), = case.groups
    assert c[0, 0] == -1e-320 and d[0] == -1e-310


def test_an_integer_input_is_refused_by_name(tmp_path):
    """A Cast(int64 -> float) net: a point box failed inside the evaluator ('element type mismatch'),
    a wider box inside the interval rules; now load_model names the input and its type."""
    from onnx import TensorProto, helper
    _onnx_file(tmp_path / "int.onnx", [helper.make_node("Cast", ["x"], ["xf"], to=TensorProto.FLOAT),
                                       helper.make_node("Relu", ["xf"], ["y"])],
               [helper.make_tensor_value_info("x", TensorProto.INT64, [1, 2])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])])
    (tmp_path / "p.vnnlib").write_text(decl(2, 2) + box([1, 1], [1, 1]) + "(assert (>= Y_0 0.5))")
    with pytest.raises(tlb.BridgeError, match="verify: the network input 'x' is int64; .* float input only"):
        verify(load_model(tmp_path / "int.onnx"), parse_vnnlib((tmp_path / "p.vnnlib").read_text()))


@pytest.mark.parametrize("elem", ["DOUBLE", "FLOAT16"])
def test_a_double_input_is_rechecked_in_double_and_a_half_input_is_refused(elem, tmp_path):
    """onnxruntime was always fed float32: a Relu net with a double (or float16) input crashed in the
    re-check with 'INVALID_ARGUMENT: Unexpected input data type'. A double input now takes the binary32
    point exactly; a narrower float is refused at load (the margin covers binary32 rounding only)."""
    from onnx import TensorProto, helper
    kind = getattr(TensorProto, elem)
    _onnx_file(tmp_path / "net.onnx", [helper.make_node("Relu", ["x"], ["y"])],
               [helper.make_tensor_value_info("x", kind, [1, 2])], [helper.make_tensor_value_info("y", kind, [1, 2])])
    prop = parse_vnnlib(decl(2, 2) + box([-1, -1], [1, 1]) + "(assert (>= Y_0 0.5))")
    if elem == "FLOAT16":
        with pytest.raises(tlb.BridgeError, match="input 'x' is FLOAT16; verify takes networks with float"):
            load_model(tmp_path / "net.onnx")
        return
    for method in ("crown", "bab-relu"):
        r = verify(load_model(tmp_path / "net.onnx"), prop, method=method, timeout=10)
        assert r.result == "sat" and r.counterexample["y_onnxruntime"][0] >= 0.5


def test_a_fixed_batch_larger_than_one_is_refused_by_name(tmp_path):
    """An input [3, 1] (or a Gemm net on [2, 2]) keeps axis 0 apart, so the bounds took it as 3 samples with
    rows of width 1 while the property's rows span all 3 outputs: 'linear_bounds: spec must be a finite
    [K, 1] matrix, got shape [1, 3]' with no word on the cause."""
    from onnx import TensorProto, helper
    _onnx_file(tmp_path / "net.onnx", [helper.make_node("Relu", ["x"], ["y"])],
               [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 1])],
               [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 1])])
    with pytest.raises(tlb.BridgeError, match=r"verify: the network input \[3, 1\] has a leading axis of 3 samples"):
        verify(load_model(tmp_path / "net.onnx"), parse_vnnlib(decl(3, 3) + box([-1] * 3, [1] * 3) +
                                                                "(assert (>= Y_0 0.5))"))


def test_an_input_bound_between_binary64_numbers_is_placed_outward_and_opened(tmp_path):
    """X_0 <= b with b = 0.100000001490116119384765624, 1e-27 below binary32's 0.1: b rounded to that
    binary32 number, so on y = x with Y_0 >= b the point x = 0.1f, outside the box, was reported as sat
    (the property has no binary32 point). Now an inexact bound's side is the nearest binary64 number
    outside, open; exact ones stay closed."""
    model = _identity_model(tmp_path)
    b = "0.100000001490116119384765624"
    prop = parse_vnnlib(decl(1, 1) + f"(assert (>= X_0 0)) (assert (<= X_0 {b})) (assert (>= Y_0 {b}))")
    assert verify(model, prop, method="crown", timeout=2).result in ("unknown", "unsat")
    case, = parse_vnnlib(decl(2, 1) + "(assert (<= -0.1 X_0 0.2)) (assert (<= 0 X_1 1)) (assert (<= Y_0 0))").cases
    assert case.lower[0] == -0.1 and case.upper[0] == 0.2  # binary64's -0.1 and 0.2 lie outside already
    assert case.lower[1] == 0 and case.upper[1] == 1 and not case.lower_open[1] and not case.upper_open[1]
    assert case.lower_open[0] and case.upper_open[0]
    case, = parse_vnnlib(decl(1, 1) + "(assert (>= X_0 0.1)) (assert (<= X_0 0.3)) (assert (<= Y_0 0))").cases
    assert case.lower[0] == np.nextafter(0.1, -1) and case.upper[0] == np.nextafter(0.3, 1)  # 0.1 is above, 0.3 below
    assert parse_vnnlib(decl(1, 1) + "(assert (>= X_0 0.1)) (assert (<= X_0 0.1)) (assert (<= Y_0 0))").cases


def test_a_box_beyond_binary32_range_warns_nothing(tmp_path):
    import warnings
    model = _identity_model(tmp_path)
    prop = parse_vnnlib(decl(1, 1) + "(assert (>= X_0 -1e300)) (assert (<= X_0 1e300)) (assert (>= Y_0 1e299))")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r = verify(model, prop, timeout=2)
    assert r.result in ("unknown", "unsat")  # no binary32 input reaches 1e299


def test_models_with_external_data_from_any_folder(tmp_path):
    """torch's exporter writes weights beside the model (MODEL.onnx.data): found from the model's path,
    whatever the working directory."""
    import onnx
    torch.manual_seed(3)
    net = nn.Sequential(nn.Linear(5, 40), nn.ReLU(), nn.Linear(40, 5)).eval()
    (tmp_path / "m").mkdir()
    path = tmp_path / "m" / "net.onnx"
    torch.onnx.export(net, (torch.zeros(1, 5),), str(path), dynamo=False)
    onnx.save(onnx.load(str(path)), str(path), save_as_external_data=True, location="net.onnx.data",
              size_threshold=0)
    prop = tmp_path / "p.vnnlib"
    prop.write_text(decl(5, 5) + box([-1] * 5, [1] * 5) + "(assert (<= Y_0 1e6))\n")
    out = subprocess.run([sys.executable, "-m", "torchlean_bridge", "verify", str(path), str(prop), "--json"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["result"] == "sat"


def test_the_timeout_holds_within_a_slow_bound(monkeypatch):
    """A CROWN call longer than the timeout stops at its next backward pass: 'unknown', with the
    first box's interval bounds reported."""
    import time as time_mod
    import semantics.linear_bounds.crown as crown_mod
    model = load_model(FIX / "cnn_small.onnx")
    p = tlb.load_vnnlib(FIX / "cnn_robust.vnnlib")
    slow = crown_mod._Run.bound

    def slower(self, *args, **kwargs):
        time_mod.sleep(0.2)
        return slow(self, *args, **kwargs)
    monkeypatch.setattr(crown_mod._Run, "bound", slower)
    start = time_mod.perf_counter()
    r = verify(model, p, timeout=0.3)
    assert time_mod.perf_counter() - start < 0.3 + 1.0
    assert r.result == "unknown" and r.reason.startswith("timeout")
    assert r.bounds and r.bounds[0]["method"] == "ibp"


# -- verify on the committed fixtures -----------------------------------------------------------


def _reproduces(model, prop, found):
    x = np.array(found["x"])
    case_ok = False
    for case in prop.cases:
        lo, hi = case.lower.reshape(-1), case.upper.reshape(-1)
        above, below = np.where(case.lower_open.reshape(-1), x > lo, x >= lo), \
            np.where(case.upper_open.reshape(-1), x < hi, x <= hi)
        if np.all(above) and np.all(below):
            case_ok = True
            x_shaped = x.reshape(model.input_shape)
            ys = [model.evaluate(x_shaped, "float64"), model.evaluate(x_shaped, "float32"),
                  model.onnxruntime(x_shaped)]
            assert any(all(np.all(np.where(s, c @ y < d, c @ y <= d)) for y in ys) for c, d, s in case.groups)
    assert case_ok
    assert np.array_equal(x.astype(np.float32).astype(np.float64), x)  # a binary32 point


@pytest.mark.parametrize("net, prop, want", [("acas_like", "acas_robust", "unsat"), ("acas_like", "acas_sat", "sat"),
                                             ("acas_like", "acas_min", "sat"), ("cnn_small", "cnn_robust", "unsat")])
def test_fixture_answers(net, prop, want):
    model = load_model(FIX / f"{net}.onnx")
    p = tlb.load_vnnlib(FIX / f"{prop}.vnnlib")
    r = verify(model, p, timeout=20)
    assert r.result == want, r
    if want == "sat":
        _reproduces(model, p, r.counterexample)


def test_crown_proves_what_ibp_cannot_at_once():
    model = load_model(FIX / "acas_like.onnx")
    p = tlb.load_vnnlib(FIX / "acas_robust.vnnlib")
    assert verify(model, p, method="crown", timeout=20).boxes_explored == 1
    ibp = verify(model, p, method="ibp", timeout=1.0)
    assert ibp.result in ("unknown", "unsat") and ibp.boxes_explored > 1


def _random_net(seed: int) -> tlb.Bundle:
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(3, 12), nn.ReLU(), nn.Linear(12, 12), nn.ReLU(), nn.Linear(12, 3)).eval()
    return tlb.import_fx(net, (torch.zeros(1, 3),))


@pytest.mark.parametrize("seed", range(6))
def test_never_wrong_on_unseen_networks(seed, tmp_path):
    """Threshold properties Y_0 - Y_1 <= t for t across the range: the answer agrees with dense sampling."""
    from exporters.folder import save
    b = _random_net(seed)
    save(b, tmp_path / "net")
    model = load_model(tmp_path / "net")
    rng = np.random.default_rng(seed)
    c = rng.uniform(-1, 1, 3)
    lo, hi = c - 0.3, c + 0.3
    xs = lo + rng.random((4000, 3)) * (hi - lo)
    ys = np.stack([np.asarray(tlb.evaluate(b.graph, b.payload, [x[None]])[0]).reshape(-1) for x in xs[:400]])
    margin = ys[:, 0] - ys[:, 1]
    for t in (margin.min() - 1.0, margin.min() + 1e-3, np.median(margin), margin.max() + 1.0):
        prop = parse_vnnlib(decl(3, 3) + box(lo, hi) + f"(assert (<= (- Y_0 Y_1) {float(t)!r}))\n")
        r = verify(model, prop, timeout=5, seed=seed)
        if np.any(margin <= t):
            assert r.result != "unsat", (t, r)
        if r.result == "sat":
            _reproduces(model, prop, r.counterexample)
        if t > margin.min():
            assert r.result == "sat"  # a sampled point satisfies it: the search must find one too


def test_timeout_and_seed_of_the_wrong_kind_are_refused():
    """seed -1 and seed 1.5 failed in numpy's SeedSequence (ValueError, TypeError), timeout '5' in a
    comparison (TypeError)."""
    model = load_model(FIX / "acas_like.onnx")
    prop = tlb.load_vnnlib(FIX / "acas_sat.vnnlib")
    for kw, message in (({"seed": -1}, "seed must be a whole number >= 0, got -1"),
                        ({"seed": 1.5}, "seed must be a whole number >= 0, got 1.5"),
                        ({"seed": True}, "seed must be"), ({"timeout": "5"}, "timeout must be a positive number"),
                        ({"timeout": True}, "timeout must be"), ({"timeout": 0}, "timeout must be")):
        with pytest.raises(tlb.BridgeError, match=message):
            verify(model, prop, **kw)


def test_gzipped_files_a_byte_order_mark_and_a_property_given_as_model(tmp_path):
    """VNN-COMP ships model.onnx.gz and prop.vnnlib.gz: the command read the model as a bundle ('invalid
    JSON: utf-8 codec can't decode byte 0x8b') and the property as text; a UTF-8 BOM was 'expected a
    command' on line 1; a property given as MODEL gave 'invalid JSON' without naming the file."""
    import gzip
    model_gz, prop_gz = tmp_path / "net.onnx.gz", tmp_path / "prop.vnnlib.gz"
    model_gz.write_bytes(gzip.compress((FIX / "acas_like.onnx").read_bytes()))
    prop_gz.write_bytes(gzip.compress((FIX / "acas_sat.vnnlib").read_bytes()))
    bom = tmp_path / "bom.vnnlib"
    bom.write_bytes(b"\xef\xbb\xbf" + (FIX / "acas_sat.vnnlib").read_bytes())
    for model, prop in ((model_gz, prop_gz), (FIX / "acas_like.onnx", bom)):
        r = verify_files(model, prop, timeout=20)
        assert r.result == "sat"
    bad = tmp_path / "bad.onnx.gz"
    bad.write_bytes(b"not gzip")
    with pytest.raises(tlb.BridgeError, match="cannot decompress .*bad.onnx.gz"):
        load_model(bad)
    with pytest.raises(tlb.BridgeError, match="verify: .*acas_sat.vnnlib is not an .onnx file"):
        load_model(FIX / "acas_sat.vnnlib")


def test_cli_json_and_text(tmp_path):
    cmd = [sys.executable, "-m", "torchlean_bridge", "verify", str(FIX / "acas_like.onnx"),
           str(FIX / "acas_sat.vnnlib"), "--json", "--timeout", "20"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["result"] == "sat" and doc["time_s"] > 0 and len(doc["counterexample"]["x"]) == 5
    assert "bounds" in doc
    text = subprocess.run(cmd[:-3] + ["--method", "ibp", "--timeout", "0.5"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert text.returncode == 0 and text.stdout.split()[0] in ("sat", "unknown")
    bad = subprocess.run(cmd[:5] + ["--timeout", "-1"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--timeout" in bad.stderr
    seed = subprocess.run(cmd[:6] + ["--seed", "-1"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert seed.returncode == 2 and "--seed must be a whole number >= 0, got -1" in seed.stderr, seed.stderr
    wrong = tmp_path / "p.vnnlib"
    wrong.write_text(decl(4, 5) + box([0] * 4, [1] * 4) + "(assert (<= Y_0 0))\n")
    mismatch = subprocess.run(cmd[:5] + [str(wrong)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert mismatch.returncode == 2 and "declares 4 inputs" in mismatch.stderr
