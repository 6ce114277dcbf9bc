"""``torchlean-bridge demo`` tells the seed chapters' story: the lines that matter are the chapters'."""

import contextlib
import io
import json

import pytest

pytest.importorskip("torch")

from torchlean_bridge.app.cli import main  # noqa: E402
from tests.test_core_seed import SEED_LISTING  # noqa: E402

# executable-graph-types-and-lowering: the value table at x0 and the interval boxes for radius 0.05
SEED_VALUES = """node 0: [0.300000, -0.200000, 0.100000, 0.400000]
node 1: [0.107000, -0.017000, 0.004000, 0.081000, -0.003000]
node 2: [0.107000, 0.000000, 0.004000, 0.081000, 0.000000]
node 3: [0.027540, -0.014730, 0.014910]
node 4: 0.027720
node 5: 0.027713"""

SEED_BOXES = """node 0: [0.250000, -0.250000, 0.050000, 0.350000] .. [0.350000, -0.150000, 0.150000, 0.450000]
node 1: [0.087000, -0.031500, -0.007500, 0.067500, -0.015000] .. [0.127000, -0.002500, 0.015500, 0.094500, 0.009000]
node 2: [0.087000, 0.000000, 0.000000, 0.067500, 0.000000] .. [0.127000, 0.000000, 0.015500, 0.094500, 0.009000]
node 3: [0.025445, -0.016025, 0.011355] .. [0.029815, -0.012220, 0.018045]
node 4: [0.020775] .. [0.035640]"""


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo") / "artefacts"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(["demo", "-o", str(out), "--quiet"])
    return code, buf.getvalue(), out


def test_demo_exits_zero_and_names_its_folder(demo):
    code, text, out = demo
    assert code == 0
    assert f"artefacts go to {out}/" in text


def test_demo_prints_the_seed_listing_and_value_table(demo):
    _, text, _ = demo
    assert SEED_LISTING in text
    assert SEED_VALUES in text


def test_demo_shows_the_imports_agreeing(demo):
    _, text, _ = demo
    for line in ("fx import vs torch (fx): agree; 6 of 6 nodes matched",
                 "export import vs torch (export): agree; 6 of 6 nodes matched",
                 "onnx import vs onnxruntime: agree; 6 of 6 nodes matched",
                 "onnx import vs onnx reference evaluator: agree; 6 of 6 nodes matched"):
        assert line in text
    assert "fx vs export: outputs differ by at most" in text


def test_demo_prints_the_chapter_boxes_and_checks_containment(demo):
    _, text, _ = demo
    assert SEED_BOXES in text
    assert "sampled containment: 50 seeded points" in text


def test_demo_catches_the_swapped_biases(demo):
    _, text, out = demo
    assert "load_state_dict result: <All keys matched successfully>" in text
    assert "at x = 0: trusted [1.0, 0.0, 0.0], with the checkpoint [0.0, 0.0, 0.0]" in text
    assert "0.bias, 2.bias: an exchange among them passes every key and shape check" in text  # ambiguity group
    assert "swap 0.bias <-> 2.bias: max error" in text  # the audit
    assert "0.bias and 2.bias look exchanged" in text  # the diff
    report = json.loads((out / "bias_pair_diff.json").read_text())
    assert report["ok"] is False and report["first_divergence"]["node"] == 1
    assert "0.bias" in report["first_divergence"]["keys"]
    assert report["first_divergence"]["data"]["suspects"] == [["0.bias", "2.bias"]]


def test_demo_writes_its_artefacts(demo):
    _, _, out = demo
    for name in ("seed_mlp.torch.onnx", "seed_mlp.onnx", "seed_mlp.torchlean.json", "bias_pair_swapped.safetensors",
                 "bias_pair_diff.json", "seed_mlp/graph.json", "seed_mlp/payload.safetensors", "seed_mlp/roles.json"):
        assert (out / name).is_file(), name
    doc = json.loads((out / "seed_mlp.torchlean.json").read_text())
    assert doc["format"] == "torchlean.ir.v1" and doc["output_ids"] == [5] and len(doc["nodes"]) == 6
