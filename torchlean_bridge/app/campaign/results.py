"""A results file that an interrupted campaign leaves consistent: one CSV line per finished task.

Each row is appended with one ``write`` on a descriptor opened ``O_APPEND`` and fsynced before the
next task's row, so after a crash, a kill or Ctrl-C the file holds every finished row whole; the one
thing an interrupted write can leave is a last line without its newline, which ``open_results``
cuts off before appending again. An exclusive lock keeps two campaigns from appending to one file.
"""

from __future__ import annotations

import csv
import fcntl
import io
import os
from pathlib import Path
from typing import Sequence

from ...errors import BridgeError
from ...fileio import MAX_DOCUMENT_BYTES, read_capped

__all__ = ["ResultsFile", "open_results"]


class ResultsFile:
    """Rows already in the file (``rows``) and ``append`` for new ones; use as a context manager."""

    def __init__(self, path: Path, fd: int, rows: list[list[str]], width: int) -> None:
        self.path, self._fd, self.rows, self.width = path, fd, rows, width

    def append(self, row: Sequence[str]) -> None:
        if len(row) != self.width:
            raise ValueError(f"a results row has {self.width} fields, got {len(row)}")
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerow([_one_line(v) for v in row])
        data = buf.getvalue().encode("utf-8")
        written = os.write(self._fd, data)
        if written != len(data):
            raise OSError(f"short write to {self.path}: {written} of {len(data)} bytes")
        os.fsync(self._fd)
        self.rows.append(list(row))

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # releases the lock
            self._fd = -1

    def __enter__(self) -> "ResultsFile":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _one_line(value: object) -> str:
    """A field on one line (a reason may quote a multi-line message)."""
    return " ".join(str(value).split())


def open_results(path: str | os.PathLike, width: int, resume: bool) -> ResultsFile:
    """Open (create) ``path`` for appending rows of ``width`` fields. With ``resume`` its complete rows
    are kept and returned; without, it starts empty. A row of the wrong width is a BridgeError naming
    its line (that file is not this campaign's results)."""
    path = Path(path)
    if path.is_dir():
        raise BridgeError(f"--results {path}: it is a folder")
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o666)
    except OSError as e:
        raise BridgeError(f"--results {path}: cannot open: {e.strerror or e}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise BridgeError(f"--results {path}: another campaign is writing to it") from None
        rows: list[list[str]] = []
        if not resume:
            os.ftruncate(fd, 0)
        else:
            data = read_capped(path, "results file", MAX_DOCUMENT_BYTES)
            complete = data[:data.rfind(b"\n") + 1]
            if len(complete) != len(data):  # a row cut by an interrupted write: it is redone
                os.ftruncate(fd, len(complete))
            try:
                text = complete.decode("utf-8")
            except UnicodeDecodeError:
                raise BridgeError(f"--results {path}: not a UTF-8 CSV file") from None
            for n, row in enumerate(csv.reader(io.StringIO(text)), 1):
                if not row:
                    continue
                if len(row) != width:
                    raise BridgeError(f"--results {path}: line {n} has {len(row)} fields, a results row has "
                                      f"{width}; it is not this kind of campaign's results (give another file)")
                rows.append(row)
        return ResultsFile(path, fd, rows, width)
    except BaseException:
        os.close(fd)
        raise
