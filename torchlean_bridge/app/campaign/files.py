"""Files as a worker sees them: ``.gz`` decompressed once per worker, shipped bytes written once.

VNN-COMP benchmarks ship ``model.onnx.gz`` and ``prop.vnnlib.gz``; the single-instance readers take
plain files, so a worker decompresses each into its own temporary folder (same base name without
``.gz``, so messages still name the file) and keeps it for the tasks that follow. A Ray worker on
another machine receives a file's bytes from the object store and writes them the same way.

A campaign owns one scratch folder (``campaign_scratch``) and every worker keeps its folder inside it
(``use_scratch``): the campaign removes the whole folder when it ends. Workers cannot clean up after
themselves: a pool worker ends with ``os._exit`` and a hung one is killed, so neither runs ``atexit``.
"""

from __future__ import annotations

import atexit
import gzip
import hashlib
import io
import os
import shutil
import socket
import tempfile
import time
import zlib
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Iterator

from ...errors import BridgeError
from ...fileio import regular_file_size

__all__ = ["local_file", "materialize", "read_plain", "campaign_scratch", "use_scratch", "drop_scratch",
           "MAX_FILE_BYTES"]

MAX_FILE_BYTES = 8 << 30  # a decompressed model or property larger than this is refused
_CHUNK = 1 << 20
_PREFIX = "tlb-campaign-"
_REMOVE_TRIES = 4
_local: dict[str, str] = {}
_folder: list[Path] = []


def _workdir() -> Path:
    """This process's folder: inside the campaign's scratch folder, or (a lone ``verify`` of a ``.gz``
    file) a temporary folder removed when the process exits."""
    if not _folder:
        _folder.append(Path(tempfile.mkdtemp(prefix=_PREFIX)))
        atexit.register(shutil.rmtree, _folder[0], True)
    return _folder[0]


@contextmanager
def campaign_scratch() -> Iterator[str]:
    """A folder for the campaign's workers' files, removed with everything in it when the campaign ends."""
    root = tempfile.mkdtemp(prefix=_PREFIX)
    try:
        yield root
    finally:
        # a Ray actor killed as the campaign ends may still be starting (``ray.kill`` does not wait) and make
        # its folder while the removal runs; once the folder is gone none makes it again (``use_scratch``)
        for _ in range(_REMOVE_TRIES):
            shutil.rmtree(root, ignore_errors=True)
            if not os.path.exists(root):
                break
            time.sleep(0.5)


def use_scratch(root: str, home: str | None = None) -> None:
    """Keep this process's files in a new folder of ``root``. A missing ``root`` is made only on a host
    other than ``home`` (the campaign's, for a Ray actor: that node's copy of the folder); on the
    campaign's own host it means the campaign has ended (a Ray actor whose start raced its ``ray.kill``),
    and nothing is made, so nothing outlives the campaign."""
    _local.clear()
    _folder.clear()
    if not os.path.isdir(root):
        if home is None or home == socket.gethostname():
            return
        os.makedirs(root, exist_ok=True)
    try:
        _folder.append(Path(tempfile.mkdtemp(prefix="worker-", dir=root)))
    except FileNotFoundError:  # removed since: the campaign ended as this worker started
        pass


def drop_scratch() -> None:
    """Remove this process's folder and forget the files in it (the campaign process after an inline run,
    a Ray worker ending normally)."""
    for folder in _folder:
        shutil.rmtree(folder, ignore_errors=True)
        # the campaign's folder as a Ray node elsewhere made it: the last worker out removes it (nothing else
        # ever starts a worker then: actors are closed only when the campaign ends)
        if folder.parent.name.startswith(_PREFIX):
            try:
                folder.parent.rmdir()
            except OSError:
                pass  # other workers' folders are still in it
    _folder.clear()
    _local.clear()


def _digest_name(key: str, name: str) -> Path:
    sub = _workdir() / hashlib.sha256(key.encode()).hexdigest()[:16]
    sub.mkdir(exist_ok=True)
    return sub / name


def _decompress(path: str, dst: BinaryIO) -> None:
    """``path``'s decompressed bytes into ``dst``, refused past ``MAX_FILE_BYTES`` (the caller has checked
    that ``path`` is a regular file: ``regular_file_size``)."""
    try:
        with gzip.open(path, "rb") as src:
            total = 0
            while chunk := src.read(_CHUNK):
                total += len(chunk)
                if total > MAX_FILE_BYTES:
                    raise BridgeError(f"cannot read {path}: more than {MAX_FILE_BYTES} bytes once decompressed")
                dst.write(chunk)
    except (OSError, EOFError, zlib.error) as e:
        raise BridgeError(f"cannot decompress {path}: {e}") from None


def local_file(path: str) -> str:
    """``path`` itself, or for ``X.gz`` the decompressed ``X`` in this process's folder (made once)."""
    if not path.endswith(".gz"):
        return path
    if path in _local:
        return _local[path]
    regular_file_size(path, "file")
    out = _digest_name(os.path.realpath(path), Path(path).name[:-3])
    try:
        with open(out, "wb") as dst:
            _decompress(path, dst)
    except BaseException:
        out.unlink(missing_ok=True)
        raise
    _local[path] = str(out)
    return str(out)


def read_plain(path: str) -> bytes:
    """The bytes of ``path`` (decompressed in memory if ``.gz``: the campaign process writes no copy), for
    shipping to workers elsewhere."""
    from ...fileio import read_capped
    if not path.endswith(".gz"):
        return read_capped(path, "file", MAX_FILE_BYTES)
    regular_file_size(path, "file")
    buf = io.BytesIO()
    _decompress(path, buf)
    return buf.getvalue()


def materialize(name: str, digest: str, data: bytes) -> str:
    """Write shipped bytes to this process's folder once (keyed by their digest); the local path."""
    key = f"sha256:{digest}"
    if key in _local:
        return _local[key]
    out = _digest_name(key, Path(name).name.removesuffix(".gz"))
    out.write_bytes(data)
    _local[key] = str(out)
    return str(out)
