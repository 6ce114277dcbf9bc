"""Input datasets for the diff (``diff --inputs FILE.npz|FOLDER``): many input sets from one file.

An ``.npz`` holds one array per graph input, keyed by the input's name (its provenance name or
tensor), by ``input_K``, or in archive order; each is either a stack ``[N, *input shape]`` (N input
sets) or exactly the input's shape (one set). A folder of ``.npy`` files is the same, one file per
graph input (named like the keys, else taken in name order); for a one-input graph a folder of
files each of the input's exact shape is one input set per file. Every array is checked where it
enters (file, key, shape, element type, size) and refused with a BridgeError naming it. ``.npy``
stacks stay memory-mapped: sets are sliced out one at a time as the diff consumes them.
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from ..errors import BridgeError
from ..graph import Graph
from ..ops import BOOL, INT64

__all__ = ["Dataset", "load_dataset", "MAX_SETS"]

MAX_SETS = 1_000_000
MAX_BYTES = 8 << 30  # what one dataset file may decompress to (npz members are read whole)


class Dataset(Sequence):
    """``N`` labelled input sets, sliced lazily from per-input stacks. A batch (``batch``) is a view
    of sets ``start..stop-1`` that keeps their labels (``name[k]`` with ``k`` counted in the whole
    dataset), so reports of batches merge into the report of the whole."""

    def __init__(self, name: str, stacks: list[np.ndarray], stacked: list[bool], count: int,
                 offset: int = 0) -> None:
        self.name, self.stacks, self.stacked, self.count, self.offset = name, stacks, stacked, count, offset

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, k: int) -> tuple[str, list[np.ndarray]]:  # type: ignore[override]
        if not 0 <= k < self.count:
            raise IndexError(k)
        return self.label(k), [np.array(s[k] if st else s) for s, st in zip(self.stacks, self.stacked)]

    def label(self, k: int) -> str:
        return f"{self.name}[{self.offset + k}]"

    def index(self, label: str) -> int:
        """The position in this view of the set labelled ``label`` (a BridgeError if it is not one)."""
        head, _, tail = label.rpartition("[")
        k = int(tail[:-1]) - self.offset if head == self.name and tail.endswith("]") and tail[:-1].isdigit() else -1
        if not 0 <= k < self.count:
            raise BridgeError(f"{label!r} is not an input set of {self.name}")
        return k

    def batch(self, start: int, stop: int) -> "Dataset":
        """Sets ``start..stop-1`` of this view (memory-mapped stacks stay mapped)."""
        if not 0 <= start < stop <= self.count:
            raise BridgeError(f"{self.name}: batch {start}..{stop} is outside its {self.count} input sets")
        stacks = [s[start:stop] if st else s for s, st in zip(self.stacks, self.stacked)]
        return Dataset(self.name, stacks, self.stacked, stop - start, self.offset + start)

    def __iter__(self) -> Iterator[tuple[str, list[np.ndarray]]]:
        return (self[k] for k in range(self.count))


def _names(g: Graph) -> list[list[str]]:
    """Accepted keys per graph input: provenance tensor/name, then ``input_K``."""
    out = []
    for k, nid in enumerate(g.inputs):
        src = g.nodes[nid].source
        keys = [v for v in ((src.tensor, src.name) if src else ()) if v]
        out.append([*keys, f"input_{k}"])
    return out


def _check(g: Graph, where: str, arrays: list[np.ndarray]) -> tuple[list[bool], int]:
    """Each array a stack or one set of its input; returns which are stacks and the set count."""
    stacked, count = [], None
    for k, (a, nid) in enumerate(zip(arrays, g.inputs)):
        node = g.nodes[nid]
        shape, what = tuple(node.out_shape), f"{where}: array for graph input {k} (node {nid})"
        want = {INT64: "iu", BOOL: "b"}.get(node.dtype, "fiu")
        if a.dtype.kind not in want:
            raise BridgeError(f"{what} has element type {a.dtype}, expected {node.dtype}")
        if tuple(a.shape) == shape:
            stacked.append(False)
            continue
        if a.ndim != len(shape) + 1 or tuple(a.shape[1:]) != shape:
            raise BridgeError(f"{what} has shape {list(a.shape)}, expected {list(shape)} or [N, {', '.join(map(str, shape))}]")
        if count is not None and a.shape[0] != count:
            raise BridgeError(f"{what} holds {a.shape[0]} input sets, another input {count}")
        count = int(a.shape[0])
        stacked.append(True)
    count = 1 if count is None else count
    if not 0 < count <= MAX_SETS:
        raise BridgeError(f"{where}: {count} input sets; expected 1 to {MAX_SETS}")
    return stacked, count


def _pick(g: Graph, where: str, available: dict[str, np.ndarray], ordered: list[str]) -> list[np.ndarray]:
    """The array for each graph input: by name, else in order when the count matches."""
    names = _names(g)
    chosen = [next((available[k] for k in keys if k in available), None) for keys in names]
    if all(a is not None for a in chosen):
        return chosen  # type: ignore[return-value]
    if len(ordered) == len(g.inputs):
        return [available[k] for k in ordered]
    wanted = ", ".join(keys[0] for keys in names)
    raise BridgeError(f"{where}: holds {', '.join(ordered) or 'nothing'}; the graph has {len(g.inputs)} "
                      f"input(s) ({wanted}): name the arrays after them or give exactly one per input")


def _load_npy(path: Path) -> np.ndarray:
    try:
        a = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError, EOFError) as e:
        raise BridgeError(f"cannot read input array {path}: {e}") from None
    if not isinstance(a, np.ndarray):
        raise BridgeError(f"cannot read input array {path}: expected one .npy array, got an archive")
    return a


def _load_npz(path: Path) -> tuple[dict[str, np.ndarray], list[str]]:
    try:
        with zipfile.ZipFile(path) as z:
            total = sum(i.file_size for i in z.infolist())
    except (OSError, zipfile.BadZipFile) as e:
        raise BridgeError(f"cannot read input archive {path}: {e}") from None
    if total > MAX_BYTES:
        raise BridgeError(f"input archive {path}: {total} bytes uncompressed, above the limit of {MAX_BYTES}")
    try:
        with np.load(path, allow_pickle=False) as z:
            keys = list(z.files)
            return {k: z[k] for k in keys}, keys
    except (OSError, ValueError, EOFError) as e:
        raise BridgeError(f"cannot read input archive {path}: {e}") from None


def load_dataset(g: Graph, path: str | Path) -> Dataset:
    """The input sets in ``path`` (an .npz archive or a folder of .npy files), checked against ``g``."""
    path = Path(path)
    where = f"--inputs {path}"
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix == ".npy" and p.is_file())
        if not files:
            raise BridgeError(f"{where}: the folder holds no .npy file")
        arrays = {p.stem: _load_npy(p) for p in files}
        shape = tuple(g.nodes[g.inputs[0]].out_shape) if len(g.inputs) == 1 else None
        if shape is not None and len(files) > 1 and all(tuple(a.shape) == shape for a in arrays.values()):
            total = sum(a.nbytes for a in arrays.values())
            if total > MAX_BYTES or len(files) > MAX_SETS:
                raise BridgeError(f"{where}: {len(files)} files, {total} bytes; the limits are {MAX_SETS} files "
                                  f"and {MAX_BYTES} bytes")
            stack = np.stack([np.asarray(arrays[p.stem]) for p in files])  # one input set per file
            stacked, count = _check(g, where, [stack])
            return Dataset(path.name, [stack], stacked, count)
        chosen = _pick(g, where, arrays, [p.stem for p in files])
    elif path.suffix == ".npz" and path.is_file():
        arrays, keys = _load_npz(path)
        chosen = _pick(g, where, arrays, keys)
    else:
        raise BridgeError(f"{where}: expected an .npz file or a folder of .npy files")
    stacked, count = _check(g, where, chosen)
    return Dataset(path.name, chosen, stacked, count)
