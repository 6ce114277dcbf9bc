"""`--json [FILE|-]` on every command, through the real command line: `-` (or no value) puts exactly one
JSON document on stdout, FILE writes the same document and keeps the text; the fields docs/cli.md
documents are there and agree with the library."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

import torchlean_bridge as tlb
from torchlean_bridge.app.cli import COMMANDS, _parser
from torchlean_bridge.seed import seed_mlp_bundle
from tests.test_cli_output import ROOT, cli, seed_files

FIX = ROOT / "fixtures" / "verify"


@pytest.fixture(scope="module")
def seed(tmp_path_factory):
    folder = tmp_path_factory.mktemp("json")
    return seed_files(folder, onnx="seed.onnx")


def documented(command: str) -> tuple[set[str], set[str]]:
    """docs/cli.md's JSON table row for ``command``: the fields always present, and the optional ones."""
    section = (ROOT / "docs" / "cli.md").read_text().partition("## JSON output")[2]
    row = re.search(rf"^\| `{command}` \|([^|]*)\|([^|]*)\|", section, re.M)
    assert row, f"docs/cli.md documents no JSON fields for {command}"
    return tuple(set(re.findall(r"`([a-z_0-9]+)`", cell)) for cell in row.groups())


def doc_of(*argv: str, code: int = 0) -> dict:
    r = cli(*argv)
    assert r.returncode == code, r.stderr
    assert r.stdout.count("\n") == 1, r.stdout[:500]  # one document, nothing else
    doc = json.loads(r.stdout)
    always, optional = documented(argv[0])
    assert always <= set(doc) <= always | optional, (argv[0], set(doc) ^ always)
    return doc


def test_every_command_has_json():
    parser = _parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for name in COMMANDS:
        opts = {o for a in sub.choices[name]._actions for o in a.option_strings}
        assert "--json" in opts, name


def test_check_json(seed, tmp_path):
    doc = doc_of("check", str(seed / "seed"), "--json", "-")
    assert doc == {"ok": True, "nodes": 6, "inputs": [0], "outputs": [5], "errors": []}
    bad = ROOT / "fixtures" / "seed_mlp_bad_shape.json"
    doc = doc_of("check", str(bad), "--json", code=1)
    assert doc["ok"] is False and doc["errors"][0].startswith("IR graph: node 2: outShape mismatch")


def test_show_json_is_the_graph_document(seed):
    doc = doc_of("show", str(seed / "seed"), "--json")
    assert tlb.dump_graph(tlb.load_graph(doc)) == tlb.dump_graph(seed_mlp_bundle().graph)


def test_eval_and_bounds_json(seed):
    doc = doc_of("eval", str(seed / "seed"), "--input", str(seed / "x0.npy"), "--json", "-")
    assert doc["nodes"][0]["id"] == 5 and doc["nodes"][0]["value"] == pytest.approx(0.027713, abs=1e-6)
    assert set(doc["nodes"][0]) == {"id", "kind", "shape", "element_type", "stats", "value"}
    doc = doc_of("bounds", str(seed / "seed"), "--center", str(seed / "x0.npy"), "--radius", "0.05", "--json")
    assert {"radius", "products", "nodes", "containment"} <= set(doc) and doc["containment"]["samples"] == 50
    n5 = doc["nodes"][5]
    assert n5["lo"] <= 0.027713 <= n5["hi"] and n5["width_max"] == pytest.approx(n5["hi"] - n5["lo"])
    assert n5["lo_min"] == n5["lo"] and n5["hi_max"] == n5["hi"]


def test_abi_plan_init_export_json(seed, tmp_path):
    doc = doc_of("abi", str(seed / "seed"), "--json", "-")
    assert [s["key"] for s in doc["slots"]] == ["l1.weight", "l1.bias", "l2.weight", "l2.bias"]
    doc = doc_of("plan", str(seed / "seed"), "--json")
    assert doc["node_ids"] == [1, 2, 3, 4, 5] and doc["format"].startswith("torchlean-bridge.kernel-plan")
    doc = doc_of("init", str(seed / "seed"), "-o", str(tmp_path / "i"), "--json", "-")
    assert doc["parameters"] == 43 and doc["scheme"] == "torchlean" and len(doc["tensors"]) == 4
    assert tlb.load(tmp_path / "i").payload.num_parameters() == 43
    doc = doc_of("export", str(seed / "seed"), "--to", "onnx", "-o", str(tmp_path / "s.onnx"), "--json", "-")
    assert doc["ok"] and doc["format"] == "onnx" and doc["opset"] == 21 and (tmp_path / "s.onnx").is_file()
    doc = doc_of("export", str(seed / "seed"), "--to", "torchlean", "-o", str(tmp_path / "s.json"), "--json")
    assert doc["format"] == "torchlean.ir.v1" and doc["nodes"] == 6


def test_import_json(seed, tmp_path):
    doc = doc_of("import", str(seed / "seed.onnx"), "-o", str(tmp_path / "b"), "--json", "-")
    assert doc["via"] == "onnx" and doc["parameters"] == 43 and doc["output"] == str(tmp_path / "b")
    assert {"nodes", "inputs", "outputs", "ops", "v1_blocking", "notes", "keys_bound", "binding"} <= set(doc)


def test_import_and_abi_count_parameters_the_same_way(tmp_path):
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    const = helper.make_node("Constant", [], ["c"], value=numpy_helper.from_array(np.arange(4, dtype=np.float32)))
    nodes = [const, helper.make_node("Add", ["x", "c"], ["y"]), helper.make_node("MatMul", ["y", "W"], ["z"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 3])],
                          [numpy_helper.from_array(np.ones((4, 3), np.float32), "W")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / "c.onnx"))
    imported = doc_of("import", str(tmp_path / "c.onnx"), "-o", str(tmp_path / "b"), "--json")
    slots = doc_of("abi", str(tmp_path / "b"), "--json")
    assert imported["parameters"] == slots["parameters"] == sum(np.prod(s["shape"]) for s in slots["slots"])
    assert imported["constant_values"] == 4 and imported["constant_tensors"] == 1
    assert imported["parameters"] + imported["constant_values"] == tlb.load(tmp_path / "b").payload.num_parameters()


def test_diff_json_on_stdout_and_in_a_file(seed, tmp_path):
    doc = doc_of("diff", str(seed / "seed"), "--against", "onnxruntime", "--random", "2", "--json", "-")
    assert doc["ok"] is True and doc["first_divergence"] is None and len(doc["inputs"]) == 2
    assert not (ROOT / "-").exists() and not Path("-").exists()
    r = cli("diff", str(seed / "seed"), "--against", "onnxruntime", "--random", "2", "--json", str(tmp_path / "r.json"))
    assert r.returncode == 0 and "agree" in r.stdout
    assert json.loads((tmp_path / "r.json").read_text())["nodes"] == doc["nodes"]
    quiet = cli("diff", str(seed / "seed"), "--against", "onnxruntime", "--random", "2", "--quiet")
    assert quiet.stdout.splitlines() == ["diff against onnxruntime (our ONNX export): agree at every node (6 of 6)"]


def test_verify_json(seed):
    doc = doc_of("verify", str(FIX / "acas_like.onnx"), str(FIX / "acas_robust.vnnlib"), "--json", "-",
                 "--timeout", "20")
    assert doc["result"] in ("unsat", "sat", "unknown") and doc["method"] == "bab-input" and "bounds" in doc


def test_docs_list_every_commands_json_schema():
    for name in COMMANDS:
        assert documented(name)[0], name


def test_audit_json(seed, tmp_path):
    from safetensors.numpy import save_file
    b = seed_mlp_bundle()
    ckpt = {key: np.asarray(b.payload.get(b.roles[key].node, b.roles[key].role), dtype=np.float32) for key in b.roles}
    save_file(ckpt, str(tmp_path / "c.safetensors"))
    doc = doc_of("audit", str(seed / "seed"), "--checkpoint", str(tmp_path / "c.safetensors"), "--json")
    assert doc["ok"] is True and isinstance(doc["findings"], list)


@pytest.mark.slow
def test_demo_json(tmp_path):
    doc = doc_of("demo", "-o", str(tmp_path / "d"), "--quiet", "--json", "-")
    assert doc["ok"] is True and doc["failure"] is None and "seed_mlp.onnx" in doc["artefacts"]
