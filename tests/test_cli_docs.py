"""docs/cli.md's sessions cannot go stale: every documented `check`, `show`, `eval`, `bounds`, `abi` and `export`
run on the seed MLP (and the wide model) is run here and its output compared with the page.

In an expected block, a line `...` ends the comparison and a line ending in `...` is a prefix."""

from __future__ import annotations

import re
import shlex

import numpy as np
import pytest

import torchlean_bridge as tlb
from torchlean_bridge.app.cli import main
from tests.test_cli_output import ROOT, seed_files, wide_mlp

RUN = {"check", "show", "eval", "bounds", "abi", "export"}


def documented_runs() -> list[tuple[list[str], list[str]]]:
    """(argv, expected lines) for each `$ torchlean-bridge ...` line of a code block in docs/cli.md."""
    runs: list[tuple[list[str], list[str]]] = []
    for block in re.findall(r"^```\n(.*?)^```", (ROOT / "docs" / "cli.md").read_text(), re.M | re.S):
        current = None
        for line in block.splitlines():
            if line.startswith("$ "):
                argv = shlex.split(line[2:].partition("  #")[0])
                current = (argv[1:], []) if argv[0] == "torchlean-bridge" else None
                if current is not None and current[0][0] in RUN:
                    runs.append(current)
            elif current is not None and line:
                current[1].append(line)
    return runs


RUNS = documented_runs()


def test_the_page_documents_these_commands():
    assert {argv[0] for argv, _ in RUNS} == RUN and len(RUNS) >= 10


@pytest.mark.parametrize("argv, expected", RUNS, ids=[" ".join(a) for a, _ in RUNS])
def test_documented_output(argv, expected, tmp_path, monkeypatch, capsys):
    seed_files(tmp_path)
    tlb.save(wide_mlp(), tmp_path / "wide")
    np.save(tmp_path / "xw.npy", np.linspace(-1, 1, 512))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "100")
    assert main(argv) == 0
    got = capsys.readouterr().out.splitlines()
    for i, want in enumerate(expected):
        if want == "...":
            return
        assert i < len(got), f"missing line {want!r}"
        if want.endswith("..."):
            assert got[i].startswith(want[:-3]), (got[i], want)
        else:
            assert got[i] == want
    assert len(got) == len(expected)
