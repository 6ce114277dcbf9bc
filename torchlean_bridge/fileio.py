"""File input and output that hostile paths and interrupted runs cannot turn into wrong results.

Output: single files are written to a temporary file beside the target, fsynced and renamed into
place (never over a folder; a symlink is written through to its target and stays a link; a stream
or device such as /dev/stdout is written in place); files that belong together are all written before any is
renamed (``staged_outputs``); a multi-file output (a bundle folder) is built in a temporary folder
beside the target and swapped in whole (``atomic_folder``), so the target holds the old complete state
or the new one. Leftovers of an interrupted write are dot-named siblings (``.NAME.tmp-*``, ``.NAME.old-*``) that no
reader looks at.

Input: ``read_capped`` reads regular files only (not a FIFO, a device such as /dev/zero or a
folder) and refuses, before reading, a file larger than its cap.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import shutil
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

from .errors import BridgeError

__all__ = ["output_target", "atomic_write_bytes", "atomic_write_text", "atomic_write_stream", "staged_outputs", "atomic_folder",
           "read_capped", "regular_file_size", "real_inside", "fsync_folder", "MAX_DOCUMENT_BYTES", "TEMP_MARK",
           "ASIDE_MARK"]

MAX_DOCUMENT_BYTES = 1 << 30  # a JSON document (graph, roles, report, checkpoint) larger than this is refused
TEMP_MARK, ASIDE_MARK = ".tmp-", ".old-"


def regular_file_size(path: str | os.PathLike, what: str) -> int:
    """The size of ``path`` if it is a regular file (symlinks followed); BridgeError otherwise."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise BridgeError(f"cannot read {what} {path}: no such file") from None
    except OSError as e:
        raise BridgeError(f"cannot read {what} {path}: {e.strerror or e}") from None
    if not stat.S_ISREG(st.st_mode):
        kind = "a folder" if stat.S_ISDIR(st.st_mode) else "a device, FIFO or socket"
        raise BridgeError(f"cannot read {what} {path}: it is {kind}, not a regular file")
    return st.st_size


def real_inside(folder: str | os.PathLike, path: str | os.PathLike) -> Path | None:
    """``path`` with every symlink resolved, if that lies inside ``folder`` (resolved too); else None.
    Readers of files that a folder names (bundle files, companion payloads, external data) use it so
    that a symlink cannot take them elsewhere."""
    real, root = Path(os.path.realpath(path)), Path(os.path.realpath(folder))
    return real if root in real.parents else None


def read_capped(path: str | os.PathLike, what: str, limit: int = MAX_DOCUMENT_BYTES) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes; BridgeError naming ``what`` otherwise."""
    size = regular_file_size(path, what)
    if size > limit:
        raise BridgeError(f"cannot read {what} {path}: {size} bytes, above the limit of {limit}")
    try:
        with open(path, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):  # replaced between stat and open
                raise BridgeError(f"cannot read {what} {path}: it is not a regular file")
            data = f.read(limit + 1)
    except OSError as e:
        raise BridgeError(f"cannot read {what} {path}: {e.strerror or e}") from None
    if len(data) > limit:
        raise BridgeError(f"cannot read {what} {path}: more than {limit} bytes")
    return data


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def fsync_folder(folder: str | os.PathLike) -> None:
    """Make renames inside ``folder`` durable (best effort: not every platform can open a folder)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


_MAX_LINK_HOPS = 40


def output_target(path: str | os.PathLike) -> tuple[Path, bool]:
    """Where a write to ``path`` lands, and whether it is written in place.

    A symlink is followed to its final target, which is then replaced (the link stays a link); a
    path that is, or leads through, a descriptor link (``/dev/stdout``, ``/proc/self/fd/1``) or a
    device, FIFO or socket is written in place, since replacing it would replace the stream itself;
    a folder, a symlink loop or a link into a missing folder is refused."""
    cur = os.path.abspath(path)
    for _ in range(_MAX_LINK_HOPS):
        parent, name = os.path.split(cur)
        cur = os.path.join(os.path.realpath(parent), name)
        try:
            st = os.lstat(cur)
        except FileNotFoundError:
            if cur != os.path.abspath(path) and not os.path.isdir(os.path.dirname(cur)):
                raise BridgeError(f"cannot write {path}: it is a symlink to {cur}, whose folder does not exist") from None
            return Path(cur), False
        if stat.S_ISLNK(st.st_mode):
            if cur.startswith("/proc/"):  # a descriptor's magic link: the open stream, whatever it is
                if os.path.isdir(cur):
                    raise BridgeError(f"cannot write {path}: it is a folder, not a regular file")
                return Path(cur), True
            cur = os.path.join(os.path.dirname(cur), os.readlink(cur))
            continue
        if stat.S_ISDIR(st.st_mode):
            raise BridgeError(f"cannot write {path}: it is a folder, not a regular file; refusing to replace it")
        return Path(cur), not stat.S_ISREG(st.st_mode)
    raise BridgeError(f"cannot write {path}: too many levels of symbolic links")


def _write_in_place(tmp: Path, target: Path) -> None:
    """Copy a staged file into a stream or device (appending, as a shell's redirection expects)."""
    import sys
    for stream in (sys.stdout, sys.stderr):  # what we printed before comes first
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    own = _own_descriptor(target)
    fd = own if own is not None else os.open(target, os.O_WRONLY | os.O_APPEND)
    try:
        with open(tmp, "rb") as src, os.fdopen(fd, "wb", closefd=False) as out:
            shutil.copyfileobj(src, out)
    finally:
        if own is None:
            os.close(fd)


def _own_descriptor(target: Path) -> int | None:
    """N for ``/proc/<our pid>/fd/N``: written through the descriptor itself, so that its file offset
    is shared with what else the process writes there (``> out.txt`` then stays in order)."""
    parts = target.parts
    if len(parts) == 5 and parts[1] == "proc" and parts[2] in (str(os.getpid()), "self") and parts[3] == "fd" \
            and parts[4].isdigit():
        return int(parts[4])
    return None


@contextmanager
def staged_outputs() -> Iterator[Callable[[str | os.PathLike, Callable[[BinaryIO], None]], Path]]:
    """Files that appear together: ``stage(path, write)`` calls ``write(file)`` on an fsynced temporary
    beside ``path``'s target (returned, to be read back); when the block ends, every temporary is renamed
    into place in staging order (a symlink's target is replaced, never the link; streams and devices
    are written in place, see ``output_target``). On an exception (an interrupt included) the
    temporaries are removed and no target changes."""
    staged: list[tuple[Path, Path, bool]] = []

    def stage(path: str | os.PathLike, write: Callable[[BinaryIO], None]) -> Path:
        target, in_place = output_target(path)
        mode = 0o666 & ~_umask()
        if in_place:
            fd, tmp = tempfile.mkstemp(prefix=".tlb-stream.", suffix=".tmp")
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.exists():
                mode = stat.S_IMODE(os.stat(target).st_mode)  # a replaced file keeps its permissions
            fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        staged.append((Path(tmp), target, in_place))
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)  # mkstemp makes 0600; give the file the usual mode
        return Path(tmp)

    try:
        yield stage
        for tmp, target, in_place in staged:  # streams first: one that fails (a full device) renames nothing
            if in_place:
                try:
                    _write_in_place(tmp, target)
                except OSError as e:
                    raise BridgeError(f"cannot write {target}: {e.strerror or e}") from None
                os.unlink(tmp)
        for tmp, target, in_place in staged:
            if not in_place:
                os.replace(tmp, target)
        for folder in {target.parent for _, target, in_place in staged if not in_place}:
            fsync_folder(folder)
    except BaseException:
        for tmp, _, _ in staged:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
        raise


def atomic_write_stream(path: str | os.PathLike, write: Callable[[BinaryIO], None]) -> None:
    """Call ``write(file)`` on a temporary file beside ``path``, fsync it, then rename it into place."""
    with staged_outputs() as stage:
        stage(path, write)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    atomic_write_stream(path, lambda f: f.write(data))


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


# -- folders ------------------------------------------------------------------------------------

_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one atomic step (Linux renameat2); False where the system cannot."""
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return False
    try:
        libc = ctypes.CDLL(libc_name, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    return renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0


@contextmanager
def atomic_folder(target: str | os.PathLike, replaceable: Callable[[Path], bool]) -> Iterator[Path]:
    """Yield a fresh temporary folder beside ``target``; on normal exit it replaces ``target`` whole.

    An existing ``target`` is replaced only when ``replaceable(target)`` says it holds nothing but
    what the caller writes (a folder of other files is refused, never deleted). The swap is one
    atomic exchange where the system has one; elsewhere the old folder is renamed aside, the new
    one renamed in and the old one removed. On an exception the temporary folder is removed and
    ``target`` is untouched.
    """
    target = Path(target)
    if target.exists() or target.is_symlink():
        if not target.is_dir() or target.is_symlink():
            raise BridgeError(f"cannot write a bundle folder at {target}: it exists and is not a folder")
        if not replaceable(target):
            raise BridgeError(f"refusing to replace {target}: it holds files that are not part of a bundle")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}{TEMP_MARK}", dir=target.parent))
    try:
        yield tmp
        os.chmod(tmp, 0o777 & ~_umask())
        fsync_folder(tmp)
        if not target.exists():
            os.rename(tmp, target)
        elif _exchange(tmp, target):
            shutil.rmtree(tmp)  # now the old content
        else:
            aside = Path(tempfile.mkdtemp(prefix=f".{target.name}{ASIDE_MARK}", dir=target.parent))
            os.rmdir(aside)
            os.rename(target, aside)
            os.rename(tmp, target)
            shutil.rmtree(aside, ignore_errors=True)
        fsync_folder(target.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
