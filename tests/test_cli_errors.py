"""Errors in the command line's words, exit codes as documented, --version, --quiet/--verbose everywhere,
and no warnings on stderr, through the real command line."""

from __future__ import annotations

import json

import numpy as np
import pytest

import torchlean_bridge as tlb
from torchlean_bridge.app.cli import COMMANDS
from tests.test_cli_output import cli, seed_files


@pytest.fixture(scope="module")
def seed(tmp_path_factory):
    folder = tmp_path_factory.mktemp("errors")
    seed_files(folder, onnx="m.onnx")
    (folder / "notes.txt").write_text("hello\n")
    doc = json.loads((folder / "seed" / "graph.json").read_text())
    doc["nodes"][2]["parents"] = [9]
    (folder / "broken.json").write_text(json.dumps(doc))
    return folder


def test_version():
    r = cli("--version")
    assert r.returncode == 0 and r.stdout.startswith(f"torchlean-bridge {tlb.__version__} (python ")
    assert r.stdout.count("\n") == 1


@pytest.mark.parametrize("given, message", [
    ("m.onnx", "m.onnx is an ONNX model, not a bundle: run `torchlean-bridge import {d}/m.onnx -o FOLDER`"),
    ("notes.txt", "notes.txt is not a bundle: expected a bundle folder or a torchlean.ir.v1 JSON document"),
    ("x0.npy", "x0.npy is a .npy array, not a bundle"),
])
def test_a_bundle_command_given_another_file_says_what_it_is(seed, given, message):
    for argv in (["check", str(seed / given)], ["eval", str(seed / given), "--input", str(seed / "x0.npy")],
                 ["abi", str(seed / given)]):
        r = cli(*argv)
        assert r.returncode == 2 and message.format(d=seed) in r.stderr and "codec" not in r.stderr
        assert r.stderr.count("\n") == 1  # one line, no traceback


def test_a_text_file_as_an_array_gets_no_pickle_advice(seed):
    r = cli("eval", str(seed / "seed"), "--input", str(seed / "notes.txt"))
    assert r.returncode == 2 and "not a .npy file (write one with numpy.save)" in r.stderr
    assert "pickle" not in r.stderr


def test_check_exit_codes(seed):
    assert cli("check", str(seed / "seed")).returncode == 0
    r = cli("check", str(seed / "broken.json"))
    assert r.returncode == 1 and r.stdout.startswith("PyTorch graph import: node[2]: parent id 9") and r.stderr == ""
    (seed / "garbage.json").write_text("{not json")
    assert cli("check", str(seed / "garbage.json")).returncode == 2


def test_an_unknown_option_prints_the_subcommands_usage(seed):
    r = cli("eval", str(seed / "seed"), "--input", str(seed / "x0.npy"), "--bogus")
    assert r.returncode == 2 and r.stderr.startswith("usage: torchlean-bridge eval ")
    assert "torchlean-bridge eval: error: unrecognized arguments: --bogus" in r.stderr


def test_every_command_accepts_quiet_and_verbose():
    from torchlean_bridge.app.cli import _parser
    parser = _parser()
    for name, p in parser.get_default("_commands").items():
        opts = {o for a in p._actions for o in a.option_strings}
        assert {"--quiet", "--verbose", "--json"} <= opts, name
    assert set(parser.get_default("_commands")) == set(COMMANDS)


@pytest.mark.slow
def test_warnings_stay_off_stderr_unless_verbose(tmp_path):
    (tmp_path / "m.py").write_text(
        "import logging\nimport warnings\nimport torch\n\n\ndef make():\n"
        "    logging.getLogger('torch.export').warning('a multi-line graph dump')\n"
        "    warnings.warn('factory warning', UserWarning)\n"
        "    warnings.warn('old spelling', FutureWarning)\n"
        "    return torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())\n")
    r = cli("import", f"{tmp_path / 'm.py'}:make", "--input-shape", "2", "-o", str(tmp_path / "b"))
    assert r.returncode == 0 and r.stderr == "" and "wrote" in r.stdout
    loud = cli("import", f"{tmp_path / 'm.py'}:make", "--input-shape", "2", "-o", str(tmp_path / "b"), "--force",
               "--verbose")
    assert loud.returncode == 0 and "UserWarning: factory warning" in loud.stderr and "FutureWarning" in loud.stderr
    assert "a multi-line graph dump" in loud.stderr


def test_library_advice_is_given_in_the_flags_words(tmp_path):
    g = tlb.Graph([tlb.Node(0, [], "input", [4]), tlb.Node(1, [0], "layernorm", [4], {"axis": 0})])
    tlb.save(tlb.Bundle(g, tlb.Payload({1: {"weight": np.ones(4), "bias": np.zeros(4)}})), tmp_path / "ln")
    r = cli("init", str(tmp_path / "ln"), "-o", str(tmp_path / "out"))
    assert r.returncode == 2 and "(give --scheme zeros)" in r.stderr and "scheme='zeros'" not in r.stderr
    assert cli("init", str(tmp_path / "ln"), "-o", str(tmp_path / "out"), "--scheme", "zeros").returncode == 0


@pytest.mark.slow
def test_an_untraceable_model_is_told_to_use_via_export(tmp_path):
    (tmp_path / "m.py").write_text(
        "import torch\n\n\nclass M(torch.nn.Module):\n    def forward(self, x):\n"
        "        return x if x.sum() > 0 else -x\n\n\ndef make():\n    return M()\n")
    r = cli("import", f"{tmp_path / 'm.py'}:make", "--via", "fx", "--input-shape", "2", "-o", str(tmp_path / "b"))
    assert r.returncode == 2 and "import with --via export (torch.export) instead" in r.stderr
    assert "import_export" not in r.stderr
