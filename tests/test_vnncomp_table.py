"""bench/vnncomp_table.py: reading the competition's results CSV, matching its instances to the
instances files, the comparison (wrong answers, counterexamples re-checked by onnxruntime), and, on the
real VNN-COMP 2021 benchmarks when this machine has them, one instance per benchmark."""

from __future__ import annotations

import csv
import gzip
import importlib.util
import io
import sys
from pathlib import Path

import pytest

from torchlean_bridge.errors import BridgeError

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "fixtures" / "verify"
_spec = importlib.util.spec_from_file_location("vnncomp_table", ROOT / "bench" / "vnncomp_table.py")
vt = importlib.util.module_from_spec(_spec)
sys.modules["vnncomp_table"] = vt  # dataclasses look their module up
_spec.loader.exec_module(vt)

SYNTHETIC = """\
acasxu,./benchmarks/acasxu/ACASXU_run2a_1_1_batch_2000.onnx,./benchmarks/acasxu/prop_1.vnnlib,7.0,UNSAT,9.1
acasxu,./benchmarks/acasxu/ACASXU_run2a_1_2_batch_2000.onnx,./benchmarks/acasxu/prop_2.vnnlib,7.0,SAT,1.0

mnist_fc,./benchmarks/mnist_fc/onnx/net.onnx,./benchmarks/mnist_fc/vnnlib/p.vnnlib,24.3,unsat,7.2
mnist_fc,./benchmarks/mnist_fc/onnx/net.onnx,./benchmarks/mnist_fc/vnnlib/q.vnnlib,24.3,run_instance_timeout,7.2
test,./benchmarks/test/test_nano.onnx,./benchmarks/test/test_nano.vnnlib,1.8,,1.7
"""


def test_reference_words_and_keys():
    ref = vt.read_reference(SYNTHETIC, "abc.csv")
    assert ref == {
        ("acasxu", "ACASXU_run2a_1_1_batch_2000.onnx", "prop_1.vnnlib"): "unsat",
        ("acasxu", "ACASXU_run2a_1_2_batch_2000.onnx", "prop_2.vnnlib"): "sat",
        ("mnist_fc", "onnx/net.onnx", "vnnlib/p.vnnlib"): "unsat",
        ("mnist_fc", "onnx/net.onnx", "vnnlib/q.vnnlib"): "timeout",
        ("test", "test_nano.onnx", "test_nano.vnnlib"): "unknown",
    }
    # the instances file's spelling (relative to the benchmark folder, possibly gzipped) meets the CSV's
    assert vt.instance_key("mnist_fc", "onnx/net.onnx.gz", "./vnnlib/p.vnnlib.gz") in ref
    with pytest.raises(BridgeError, match=r"abc.csv line 1: result 'proved' is not one of"):
        vt.read_reference("acasxu,a.onnx,p.vnnlib,1,proved,2\n", "abc.csv")
    with pytest.raises(BridgeError, match=r"abc.csv line 2: expected 6 fields"):
        vt.read_reference("acasxu,a.onnx,p.vnnlib,1,sat,2\nacasxu,a.onnx\n", "abc.csv")
    with pytest.raises(BridgeError, match="listed twice with different results"):
        vt.read_reference("b,a.onnx,p.vnnlib,1,sat,2\nb,a.onnx,p.vnnlib,1,unsat,2\n", "abc.csv")


def test_tally_counts_agreement_and_wrong_answers():
    rows = [vt.Row("a", "n", "p1", "unsat", "unsat", 1.0),
            vt.Row("a", "n", "p2", "timeout", "unsat", 30.0),
            vt.Row("a", "n", "p3", "sat", "unsat", 2.0, cex_ok=True),    # contradicts their proof
            vt.Row("a", "n", "p4", "sat", "sat", 3.0, cex_ok=False),     # agrees, but does not reproduce
            vt.Row("b", "m", "p5", "unsat", "sat", 4.0),                 # contradicts their counterexample
            vt.Row("b", "m", "p6", "error", None, 5.0),
            vt.Row("b", "m", "p7", "unknown", "timeout", 6.0)]
    a, b, total = vt.tally(rows)
    assert (a.run, a.their_unsat, a.our_unsat_of_theirs, a.their_sat, a.our_sat_of_theirs) == (4, 3, 1, 1, 1)
    assert (a.wrong, a.cex_failed, a.unknown, a.errors, a.median_s) == (1, 1, 1, 0, 2.5)
    assert (b.wrong, b.errors, b.unknown, b.not_in_reference, b.their_sat) == (1, 1, 1, 1, 1)
    assert (total.run, total.wrong, total.cex_failed, total.errors, total.median_s) == (7, 2, 1, 1, 4.0)
    table = vt.render("2021", [a, b, total]).splitlines()
    assert table[4] == "| a | 4 | 1/3 (33%) | 1/1 (100%) | 1 | 1 | 1 | 0 | 2.5 |"
    assert table[5] == "| b | 3 (1 not in their results) | 0/0 | 0/1 (0%) | 1 | 0 | 1 | 1 | 5.0 |"
    assert not vt.is_wrong("sat", "timeout") and not vt.is_wrong("unsat", None) and vt.is_wrong("unsat", "sat")


def test_counterexample_recheck_by_onnxruntime(tmp_path):
    from torchlean_bridge.app.campaign.verify_task import counterexample_text
    from torchlean_bridge.app.verify import verify_files
    onnx, prop = FIX / "acas_like.onnx", FIX / "acas_sat.vnnlib"
    r = verify_files(onnx, prop, timeout=60)
    assert r.result == "sat"
    text = counterexample_text(r.counterexample)
    gz = tmp_path / "acas_sat.vnnlib.gz"
    gz.write_bytes(gzip.compress(prop.read_bytes()))
    assert vt.counterexample_holds(str(onnx), str(gz), text) == (True, "")
    xs, ys = vt.parse_counterexample(text, "cex")
    assert xs == r.counterexample["x"] and ys == r.counterexample["y_onnxruntime"]
    # the same point against the robust property (proved unsat) cannot hold
    ok, why = vt.counterexample_holds(str(onnx), str(FIX / "acas_robust.vnnlib"), text)
    assert not ok and "satisfy no disjunct" in why
    with pytest.raises(BridgeError, match="starts with 'sat'"):
        vt.parse_counterexample("unsat\n", "cex")
    with pytest.raises(BridgeError, match="not numbered"):
        vt.parse_counterexample("sat\n((X_0 1.0)\n (X_2 0.5))", "cex")


def test_sampling_is_seeded_and_takes_gzipped_files(tmp_path):
    bench = tmp_path / "mnist_fc"
    (bench / "onnx").mkdir(parents=True)
    rows = [(f"onnx/n{i}.onnx", f"p{i}.vnnlib", "120") for i in range(10)]
    for o, v, _ in rows:
        (bench / (o + ".gz")).write_bytes(b"")
        (bench / v).write_text("")
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)
    (bench / "instances.csv").write_text(buf.getvalue() + "\n")
    a = vt.sample_instances(bench, "mnist_fc", 3, seed=0)
    assert a == vt.sample_instances(bench, "mnist_fc", 3, seed=0) and len(a) == 3
    assert [r[0] for r in a] == sorted((r[0] for r in a), key=lambda s: int(s[6:-5]))  # file order
    assert all(str(o).endswith(".onnx.gz") and o.exists() and v.exists() for _, _, o, v in a)
    assert len(vt.sample_instances(bench, "mnist_fc", None, seed=0)) == 10
    (bench / "instances.csv").write_text("a.onnx,b.vnnlib\n")
    with pytest.raises(BridgeError, match="row 1: expected 3 fields"):
        vt.sample_instances(bench, "mnist_fc", 1, seed=0)


BENCH2021 = vt.YEARS["2021"]["root"]


@pytest.mark.slow  # six real networks, up to 20 s each
@pytest.mark.skipif(not (BENCH2021.is_dir() and vt.YEARS["2021"]["results"].is_file()),
                    reason="the VNN-COMP 2021 benchmarks or alpha-beta-CROWN's results are not on this machine")
@pytest.mark.parametrize("benchmark", vt.YEARS["2021"]["benchmarks"])
def test_one_real_instance_per_2021_benchmark(benchmark):
    """The first instance of the benchmark that alpha-beta-CROWN decided: our answer never contradicts
    theirs, and a counterexample reproduces in onnxruntime."""
    from torchlean_bridge.app.campaign.verify_task import verify_instance
    ref = vt.read_reference(vt.YEARS["2021"]["results"].read_text(), "a-b-CROWN.csv")
    folder = BENCH2021 / benchmark
    if not folder.is_dir():  # a partial checkout
        pytest.skip(f"the VNN-COMP 2021 benchmark {benchmark} is not on this machine")
    for written_onnx, written_vnnlib, onnx, vnnlib in vt.sample_instances(folder, benchmark, None, 0):
        theirs = ref.get(vt.instance_key(benchmark, written_onnx, written_vnnlib))
        if theirs in ("sat", "unsat"):
            break
    else:
        pytest.skip(f"alpha-beta-CROWN decided no {benchmark} instance")
    answer = verify_instance(str(onnx), str(vnnlib), "auto", 0, 20.0, written_vnnlib)
    assert answer["result"] in ("sat", "unsat", "unknown", "timeout"), answer
    assert not vt.is_wrong(answer["result"], theirs), (written_onnx, written_vnnlib, answer["result"], theirs)
    if answer["result"] == "sat":
        assert vt.counterexample_holds(str(onnx), str(vnnlib), answer["counterexample"]) == (True, "")
