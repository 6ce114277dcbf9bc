"""What several commands share: reading a bundle or graph, progress display, numpy inputs."""

from __future__ import annotations

import importlib.util
import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator

import numpy as np

from ...bundle import Bundle
from ...errors import BridgeError

__all__ = ["refuse_existing", "read_bundle", "sniff_document", "read_array", "progress", "phases", "in_cli_words", "CLI_WORDS", "format_vector",
           "load_factory", "bounded_int", "MAX_SAMPLES"]


def read_bundle(path: str) -> Bundle:
    """A bundle folder, or a single torchlean.ir.v1 document (payload inline or absent)."""
    from exporters.folder import load
    sniff_document(path)
    return load(Path(path))


def sniff_document(path: str) -> None:
    """Refuse, in the command line's words, a file that cannot be a graph document (an ONNX model, a
    checkpoint, text), before the JSON reader reports a decoding error."""
    if not os.path.isfile(path):
        return  # a folder (the bundle reader names what is missing) or nothing (it says so)
    try:
        with open(path, "rb") as f:
            head = f.read(64)
    except OSError:
        return  # the reader reports it
    start = head.lstrip()[:1]
    if start == b"{":
        return
    hint = f"run `torchlean-bridge import {path} -o FOLDER` and give FOLDER instead"
    if path.endswith(".onnx") or head[:1] == b"\x08":
        raise BridgeError(f"{path} is an ONNX model, not a bundle: {hint}")
    if head.startswith(NPY_MAGIC):
        raise BridgeError(f"{path} is a .npy array, not a bundle (arrays go to --input / --center)")
    if path.endswith((".pt", ".pth", ".safetensors")):
        raise BridgeError(f"{path} is a checkpoint, not a bundle (checkpoints go to --checkpoint)")
    raise BridgeError(f"{path} is not a bundle: expected a bundle folder or a torchlean.ir.v1 JSON document; "
                      f"a model becomes one with `torchlean-bridge import MODEL.onnx -o FOLDER`")


NPY_MAGIC = b"\x93NUMPY"


def refuse_existing(folder: str, force: bool) -> None:
    """An output folder that exists is replaced only with ``--force`` (and then only if it holds a
    bundle: the writer refuses a folder of other files)."""
    if not force and (os.path.lexists(folder)):
        raise BridgeError(f"{folder} exists; give --force to replace it")


# the library's advice in Python terms -> the same advice as the command line spells it
CLI_WORDS = {
    "(use scheme='zeros')": "(give --scheme zeros)",
    "; use import_export (torch.export) instead": "; import with --via export (torch.export) instead",
}


@contextmanager
def in_cli_words() -> Iterator[None]:
    """A BridgeError raised inside says what to do with the command's flags, not the Python API's
    arguments (``--scheme zeros``, not ``scheme='zeros'``)."""
    try:
        yield
    except BridgeError as e:
        text = e.message
        for python, cli in CLI_WORDS.items():
            text = text.replace(python, cli)
        if text != e.message:
            e.message = text
            e.args = (text, *e.args[1:])
        raise


MAX_SAMPLES = 10_000  # sampled or generated input sets a command evaluates, one at a time
MAX_SEED = 2 ** 63 - 1


def bounded_int(value: int, option: str, low: int = 0, high: int = MAX_SEED) -> int:
    """A command-line integer within ``[low, high]``, else one clear BridgeError line (exit 2)."""
    if not low <= value <= high:
        raise BridgeError(f"{option} must be between {low} and {high}, got {value}")
    return value


def read_array(path: str) -> np.ndarray:
    """A .npy file, memory-mapped until its header is known to fit (never a pickle)."""
    from ...fileio import regular_file_size
    from ...ops.contracts import DEFAULT_ELEMENT_LIMIT
    if regular_file_size(path, "array") == 0:
        raise BridgeError(f"cannot read array {path}: the file is empty")
    with open(path, "rb") as f:
        head = f.read(len(NPY_MAGIC))
    if head[:2] == b"PK":
        raise BridgeError(f"cannot read array {path}: expected one .npy array, got an archive (.npz)")
    if head != NPY_MAGIC:
        raise BridgeError(f"cannot read array {path}: not a .npy file (write one with numpy.save)")
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise BridgeError(f"cannot read array {path}: {e}") from None
    if not isinstance(arr, np.ndarray):  # an .npz archive
        raise BridgeError(f"cannot read array {path}: expected one .npy array, got an archive")
    if arr.size > DEFAULT_ELEMENT_LIMIT:
        raise BridgeError(f"cannot read array {path}: {arr.size} elements, above the limit of "
                          f"{DEFAULT_ELEMENT_LIMIT}")
    return np.array(arr)


def format_vector(a: Any, digits: int = 6) -> str:
    """The seed's value-table formatting: ``[0.027540, -0.014730]``, scalars bare."""
    arr = np.asarray(a)
    if arr.ndim == 0:
        return f"{float(arr):.{digits}f}"
    return "[" + ", ".join(f"{float(v):.{digits}f}" for v in arr.reshape(-1)) + "]"


def _shows_progress(quiet: bool) -> bool:
    """Progress is drawn on stderr when it is a terminal, never with --quiet or into a pipe or file."""
    return not quiet and sys.stderr.isatty()


@contextmanager
def progress(total: int | None, description: str, quiet: bool = False) -> Iterator[Any]:
    """A rich progress bar on stderr when it is a terminal; silent when piped or quiet. Yields
    ``advance(n=1)``."""
    if not _shows_progress(quiet):
        yield lambda n=1: None
        return
    from rich.console import Console
    from rich.progress import Progress
    with Progress(*Progress.get_default_columns(), transient=True, console=Console(stderr=True)) as bar:
        task = bar.add_task(description, total=total)
        yield lambda n=1: bar.advance(task, n)


@contextmanager
def phases(description: str, quiet: bool = False) -> Iterator[Any]:
    """For work done in a few long calls: a spinner with the current phase and the elapsed time,
    redrawn by rich's own thread so it moves while a call runs (stderr, terminal only). Yields
    ``step(text)``."""
    if not _shows_progress(quiet):
        yield lambda text: None
        return
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), transient=True,
                  console=Console(stderr=True)) as bar:
        task = bar.add_task(description, total=None)
        # refresh=True draws each phase at once, however short (else a phase between two redraws never shows)
        yield lambda text: bar.update(task, description=f"{description}: {text}", refresh=True)


def iterate(items: Iterable[Any], total: int | None, description: str, quiet: bool = False) -> Iterator[Any]:
    with progress(total, description, quiet) as advance:
        for item in items:
            yield item
            advance()


def load_factory(spec: str, option: str = "SOURCE") -> Any:
    """``path/to/file.py:factory`` -> the nn.Module (in eval mode) the zero-argument factory returns."""
    path, sep, name = spec.rpartition(":")
    file = Path(path)
    if not sep or not name or file.suffix != ".py":
        raise BridgeError(f"{option} expects path/to/file.py:factory, got {spec!r}")
    if not file.is_file():
        raise BridgeError(f"{option}: no such file: {file}")
    module_spec = importlib.util.spec_from_file_location(f"_tlb_factory_{file.stem}", file)
    if module_spec is None or module_spec.loader is None:
        raise BridgeError(f"{option}: cannot load {file} as Python")
    code = importlib.util.module_from_spec(module_spec)
    sys.path.insert(0, str(file.resolve().parent))
    try:
        module_spec.loader.exec_module(code)
        factory = getattr(code, name, None)
        if not callable(factory):
            raise BridgeError(f"{option}: {file} has no callable `{name}`")
        model = factory()
    except BridgeError:
        raise
    except Exception as e:  # user code: report it as bad input, not as our traceback
        raise BridgeError(f"{option}: running {file}:{name} failed: {type(e).__name__}: {e}") from e
    finally:
        sys.path.pop(0)
    if not (hasattr(model, "eval") and hasattr(model, "state_dict")):
        raise BridgeError(f"{option}: {name}() returned {type(model).__name__}, not an nn.Module")
    return model.eval()
