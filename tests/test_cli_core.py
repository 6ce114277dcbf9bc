"""CLI commands over the core: check and show (exit codes, exact text, Graphviz handling)."""

import shutil

import pytest

from torchlean_bridge.app.cli import main
from tests.conftest import FIXTURES
from tests.test_core_seed import SEED_DOT, SEED_LISTING


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_check_accepts_and_rejects(capsys):
    code, out, _ = run(capsys, "check", str(FIXTURES / "seed_mlp.json"))
    assert code == 0 and out.startswith("accepted: nodes=6")
    code, out, _ = run(capsys, "check", str(FIXTURES / "seed_mlp_bad_shape.json"))
    assert code == 1
    assert out.splitlines()[0] == ("IR graph: node 2: outShape mismatch: inferred=[5], declared=[4] "
                                   "(Node(id=2, kind=relu, parents=#[1], outShape=[4]))")


def test_check_unreadable_input_exits_2(capsys, tmp_path):
    bad = tmp_path / "g.json"
    bad.write_text("{not json")
    code, _, err = run(capsys, "check", str(bad))
    assert code == 2 and "invalid JSON" in err
    code, _, err = run(capsys, "check", str(tmp_path / "missing.json"))
    assert code == 2 and "no such file" in err


def test_show_listing_and_dot(capsys):
    code, out, _ = run(capsys, "show", str(FIXTURES / "seed_mlp.json"))
    assert code == 0 and out == SEED_LISTING + "\n"
    code, out, _ = run(capsys, "show", str(FIXTURES / "seed_mlp.json"), "--dot")
    assert code == 0 and out == SEED_DOT


def test_show_svg_without_graphviz_is_a_clear_error(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    code, _, err = run(capsys, "show", str(FIXTURES / "seed_mlp.json"), "--svg", str(tmp_path / "g.svg"))
    assert code == 2 and "Graphviz `dot` is not installed" in err


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz not installed")
def test_show_svg_renders(capsys, tmp_path):
    code, _, _ = run(capsys, "show", str(FIXTURES / "seed_mlp.json"), "--svg", str(tmp_path / "g.svg"))
    assert code == 0 and "<svg" in (tmp_path / "g.svg").read_text()


def test_written_files_get_the_usual_mode_not_mkstemps_0600(tmp_path):
    import os
    from torchlean_bridge.fileio import atomic_write_text
    atomic_write_text(tmp_path / "out.json", "{}")
    mask = os.umask(0)
    os.umask(mask)
    assert (tmp_path / "out.json").stat().st_mode & 0o777 == 0o666 & ~mask
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]  # no temporary left behind
