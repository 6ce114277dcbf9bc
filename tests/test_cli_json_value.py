"""``--json``'s optional value never swallows a positional argument: ``--json`` alone (or ``-``) is stdout,
the word after it is its file only when that word is ``-`` or ends in ``.json`` and the command does
not need it as its positional; any other file name goes with ``=``. Checked on several commands, with
the flag before and after the positionals."""

from __future__ import annotations

import json

import numpy as np
import pytest

import torchlean_bridge as tlb
from torchlean_bridge.app.cli import main
from torchlean_bridge.app.output import json_argv
from torchlean_bridge.seed import SEED_X0, seed_mlp_bundle


@pytest.fixture(scope="module")
def seed(tmp_path_factory):
    folder = tmp_path_factory.mktemp("jsonvalue")
    tlb.save(seed_mlp_bundle(), folder / "seed")
    np.save(folder / "x0.npy", SEED_X0)
    assert main(["export", str(folder / "seed"), "--to", "torchlean", "-o", str(folder / "graph.json"),
                 "--quiet"]) == 0
    return folder


def one_document(capsys) -> dict:
    out = capsys.readouterr().out
    assert out.count("\n") == 1, out[:300]
    return json.loads(out)


@pytest.mark.parametrize("before", [True, False])
def test_bare_json_before_or_after_the_positional_is_stdout(seed, capsys, before):
    bundle = str(seed / "seed")
    for command, rest, key in (("eval", ["--input", str(seed / "x0.npy")], "dtype"), ("check", [], "nodes"),
                               ("abi", [], "slots"), ("show", [], "nodes")):
        argv = [command, "--json", bundle, *rest] if before else [command, bundle, *rest, "--json"]
        assert main(argv) == 0, command
        assert key in one_document(capsys), command


def test_a_json_name_after_the_flag_is_the_output_file(seed, capsys, tmp_path):
    bundle = str(seed / "seed")
    assert main(["check", "--json", str(tmp_path / "a.json"), bundle]) == 0
    assert capsys.readouterr().out.startswith("accepted")  # the text still printed
    assert main(["eval", bundle, "--input", str(seed / "x0.npy"), "--json", str(tmp_path / "b.json")]) == 0
    assert json.loads((tmp_path / "a.json").read_text())["nodes"] == 6
    assert "dtype" in json.loads((tmp_path / "b.json").read_text())
    assert capsys.readouterr().out.startswith("node 5:")
    assert main(["check", bundle, "--json", "-"]) == 0
    assert one_document(capsys)["ok"] is True


def test_a_json_document_the_command_needs_is_its_positional(seed, capsys):
    graph = seed / "graph.json"
    before = graph.read_bytes()
    assert main(["check", "--json", str(graph)]) == 0  # graph.json is checked, not overwritten
    assert one_document(capsys)["nodes"] == 6 and graph.read_bytes() == before
    assert main(["check", str(graph), "--json", str(seed / "out.json")]) == 0
    assert json.loads((seed / "out.json").read_text())["nodes"] == 6 and graph.read_bytes() == before


def test_other_names_only_with_equals(seed, capsys, tmp_path):
    bundle = str(seed / "seed")
    assert main(["abi", bundle, f"--json={tmp_path / 'abi.txt'}"]) == 0
    assert "slots" in json.loads((tmp_path / "abi.txt").read_text())
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:  # the word is not --json's: an unknown argument, never a silent file
        main(["abi", bundle, "--json", str(tmp_path / "abi2.txt")])
    assert e.value.code == 2 and "unrecognized arguments" in capsys.readouterr().err
    assert not (tmp_path / "abi2.txt").exists()


def test_the_rewriting_rule():
    opts = ["--json", "--input", "--jobs"]
    assert json_argv(["B", "--json"], opts) == ["B", "--json=-"]
    assert json_argv(["--json", "B"], opts) == ["--json=-", "B"]
    assert json_argv(["--json", "r.JSON", "B"], opts) == ["--json=r.JSON", "B"]
    assert json_argv(["--json", "r.json"], opts, take_files=False) == ["--json=-", "r.json"]
    assert json_argv(["--json", "-", "B"], opts) == ["--json=-", "B"]
    assert json_argv(["--json", "--input", "x.json"], opts) == ["--json=-", "--input", "x.json"]
    assert json_argv(["--json=x.txt", "B"], opts) == ["--json=x.txt", "B"]
    assert json_argv(["--js", "B"], opts) == ["--json=-", "B"]  # argparse's abbreviation, settled the same way
    assert json_argv(["--j", "B"], opts) == ["--j", "B"]  # ambiguous with --jobs: argparse's to refuse
    assert json_argv(["B", "--", "--json", "x.json"], opts) == ["B", "--", "--json", "x.json"]
