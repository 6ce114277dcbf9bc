"""Writes that respect the file system: a symlinked output is written through (the link stays a link),
streams and devices (/dev/stdout, a FIFO, /dev/null) are written in place, folders are refused, and
import/init refuse an existing folder without --force."""

from __future__ import annotations

import json
import os
import stat
import threading

import onnx
import pytest

import torchlean_bridge as tlb
from torchlean_bridge.errors import BridgeError
from torchlean_bridge.fileio import atomic_write_text, output_target
from torchlean_bridge.seed import seed_mlp_bundle
from tests.test_cli_output import cli, seed_files


@pytest.fixture()
def seed(tmp_path):
    return seed_files(tmp_path)


def test_export_through_a_symlink_keeps_the_link(seed):
    (seed / "real.onnx").write_bytes(b"old")
    os.chmod(seed / "real.onnx", 0o640)
    (seed / "link.onnx").symlink_to("real.onnx")
    r = cli("export", str(seed / "seed"), "--to", "onnx", "-o", str(seed / "link.onnx"))
    assert r.returncode == 0, r.stderr
    assert os.path.islink(seed / "link.onnx") and os.readlink(seed / "link.onnx") == "real.onnx"
    onnx.checker.check_model(onnx.load(str(seed / "real.onnx")))
    assert stat.S_IMODE(os.stat(seed / "real.onnx").st_mode) == 0o640  # the replaced file keeps its mode
    assert sorted(p.name for p in seed.iterdir()) == ["link.onnx", "real.onnx", "seed", "x0.npy"]


def test_a_dangling_link_is_written_through_and_a_link_into_nowhere_refused(seed):
    (seed / "out").mkdir()
    (seed / "l.json").symlink_to(seed / "out" / "r.json")
    atomic_write_text(seed / "l.json", "{}")
    assert os.path.islink(seed / "l.json") and (seed / "out" / "r.json").read_text() == "{}"
    (seed / "bad.json").symlink_to(seed / "missing" / "r.json")
    with pytest.raises(BridgeError, match="whose folder does not exist"):
        atomic_write_text(seed / "bad.json", "{}")
    (seed / "a").symlink_to("b")
    (seed / "b").symlink_to("a")
    with pytest.raises(BridgeError, match="too many levels of symbolic links"):
        atomic_write_text(seed / "a", "{}")
    with pytest.raises(BridgeError, match="it is a folder"):
        atomic_write_text(seed / "out", "{}")


def test_descriptor_links_and_devices_are_written_in_place(seed):
    assert output_target("/dev/stdout")[1] and output_target("/dev/null") == (output_target("/dev/null")[0], True)
    atomic_write_text("/dev/null", "{}")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode) and os.path.islink("/dev/stdout")
    fifo = seed / "fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(open(fifo, "rb").read()))
    reader.start()
    atomic_write_text(fifo, '{"a": 1}\n')
    reader.join(10)
    assert got == [b'{"a": 1}\n'] and stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_json_to_dev_stdout_goes_to_stdout_in_order(seed):
    # a link of our own to the descriptor link: were it replaced, only this link would be lost
    (seed / "out").symlink_to("/proc/self/fd/1")
    for target in (str(seed / "out"), "/dev/stdout"):
        r = cli("check", str(seed / "seed"), f"--json={target}")  # not a .json name: only with =
        assert r.returncode == 0, r.stderr
        first, second = r.stdout.splitlines()
        assert json.loads(first)["ok"] is True and second.startswith("accepted: nodes=6")
    assert os.path.islink(seed / "out") and os.path.islink("/dev/stdout")
    # stdout redirected to a file: the JSON and the text share the descriptor's offset
    with open(seed / "log.txt", "w") as log:
        import subprocess
        import sys
        from tests.test_cli_output import ROOT
        subprocess.run([sys.executable, "-m", "torchlean_bridge", "check", str(seed / "seed"), "--json=/dev/stdout"],
                       stdout=log, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), check=True, timeout=120)
    lines = (seed / "log.txt").read_text().splitlines()
    assert json.loads(lines[0])["nodes"] == 6 and lines[1].startswith("accepted")


def test_import_and_init_refuse_an_existing_folder_without_force(seed):
    tlb.export_onnx(seed_mlp_bundle(), seed / "m.onnx")
    r = cli("import", str(seed / "m.onnx"), "-o", str(seed / "seed"))
    assert r.returncode == 2 and f"{seed / 'seed'} exists; give --force to replace it" in r.stderr
    assert cli("import", str(seed / "m.onnx"), "-o", str(seed / "seed"), "--force").returncode == 0
    assert tlb.load(seed / "seed").graph.nodes[1].kind == "linear"
    r = cli("init", str(seed / "seed"), "-o", str(seed / "seed"))
    assert r.returncode == 2 and "give --force" in r.stderr
    (seed / "other").mkdir()
    (seed / "other" / "notes.txt").write_text("mine")
    r = cli("init", str(seed / "seed"), "-o", str(seed / "other"), "--force")
    assert r.returncode == 2 and (seed / "other" / "notes.txt").read_text() == "mine"
