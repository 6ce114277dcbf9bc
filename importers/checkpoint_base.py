"""The ``Checkpoint`` mapping and what every checkpoint reader shares (findings, the prefix rule).

Its own module so that the single-file readers (``checkpoints.py``) and the sharded and folder readers
(``checkpoint_shards.py``) both build on it without importing each other.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Mapping

import numpy as np

from torchlean_bridge.report import Finding

__all__ = ["Checkpoint"]

class Checkpoint(Mapping[str, np.ndarray]):
    """Read-only ``key -> ndarray`` with per-key shape/dtype known up front and load notes.

    ``notes`` lists what loading noticed without reading tensor data; ``findings`` adds the NaN/Inf
    scan, which for lazily read files (safetensors) reads each tensor once, when first asked for.
    """

    def __init__(self, shapes: Mapping[str, tuple[int, ...]], dtypes: Mapping[str, np.dtype],
                 read: Callable[[str], np.ndarray], *, source: str = "<memory>", format: str = "mapping",
                 findings: list[Finding] | None = None, metadata: Mapping[str, Any] | None = None) -> None:
        self._shapes = {k: tuple(int(d) for d in s) for k, s in shapes.items()}
        self._dtypes = {k: np.dtype(d) for k, d in dtypes.items()}
        self._read = read
        self.source = source
        self.format = format
        self.metadata = dict(metadata or {})
        self._findings = list(findings or [])
        self._findings.extend(_element_type_findings(self._dtypes))
        self._scanned = False

    # -- mapping --------------------------------------------------------------------------------
    def __getitem__(self, key: str) -> np.ndarray:
        if key not in self._shapes:
            raise KeyError(key)
        arr = self._read(key).view()  # a view: the flag must not change the caller's own array
        arr.flags.writeable = False
        return arr

    def __iter__(self) -> Iterator[str]:
        return iter(self._shapes)

    def __len__(self) -> int:
        return len(self._shapes)

    def __contains__(self, key: object) -> bool:
        return key in self._shapes

    # -- metadata without reading data ----------------------------------------------------------
    def shape(self, key: str) -> tuple[int, ...]:
        return self._shapes[key]

    def dtype(self, key: str) -> np.dtype:
        return self._dtypes[key]

    def num_parameters(self) -> int:
        return sum(int(np.prod(s, dtype=np.int64)) for s in self._shapes.values())

    @property
    def notes(self) -> list[Finding]:
        return [f for f in self._findings if f.kind != "non_finite"]

    @property
    def findings(self) -> list[Finding]:
        if not self._scanned:
            self._findings.extend(_non_finite_findings(self))
            self._scanned = True
        return list(self._findings)

    def __repr__(self) -> str:
        return f"Checkpoint({self.format}, {self.source}, {len(self)} tensors, {self.num_parameters()} values)"


# -- findings shared by every format -------------------------------------------------------------
def _element_type_findings(dtypes: Mapping[str, np.dtype]) -> list[Finding]:
    out = []
    for key, dt in dtypes.items():
        if dt.kind in "iu":
            out.append(Finding("integer", f"`{key}` is an integer tensor ({dt}); kept as is", keys=(key,),
                               data={"dtype": str(dt)}, severity="info"))
        elif dt.kind == "b":
            out.append(Finding("bool", f"`{key}` is a bool tensor; kept as is", keys=(key,), severity="info"))
    return out


def _non_finite_findings(ckpt: Checkpoint) -> list[Finding]:
    out = []
    for key in ckpt:
        if ckpt.dtype(key).kind != "f":
            continue
        a = ckpt[key]
        nan, inf = int(np.isnan(a).sum()), int(np.isinf(a).sum())
        if nan or inf:
            out.append(Finding("non_finite", f"`{key}` holds {nan} NaN and {inf} Inf value(s) of {a.size}",
                               keys=(key,), data={"nan": nan, "inf": inf, "size": int(a.size)},
                               severity="warning"))
    return out


def _strip(keys: list[str], prefix: str | None, source: str) -> tuple[dict[str, str], list[Finding]]:
    """new key -> original key. The prefix goes only when every key has it (a DataParallel wrapper);
    a model whose own submodule is called ``module`` keeps its keys."""
    if not prefix or not keys or not all(k.startswith(prefix) for k in keys):
        return {k: k for k in keys}, []
    renamed = {k[len(prefix):]: k for k in keys}
    notes = [Finding("prefix", f"stripped the prefix `{prefix}` from {len(keys)} key(s)",
                     data={"prefix": prefix, "count": len(keys)}, severity="info")]
    return renamed, notes


