"""Checkpoints as users have them: sharded indexes, checkpoint folders, torch.distributed.checkpoint.

``save_pretrained`` writes ``model.safetensors.index.json`` (or ``pytorch_model.bin.index.json``) and
shards above its shard size; a training run leaves a folder; ``torch.distributed.checkpoint`` leaves
``.metadata`` and ``__R_I.distcp`` files. Each is read as one ``Checkpoint`` whose tensors are read
on first access, shard by shard (safetensors shards memory-mapped, torch shards through
``torch.load(weights_only=True, mmap=True)``), so a checkpoint larger than RAM audits in bounded memory.
DCP's ``.metadata`` is a pickle: it is read by an unpickler that constructs only DCP's metadata classes,
torch sizes and dtypes, and refuses every other global.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any, Callable

import numpy as np

from torchlean_bridge.errors import CheckpointError
from torchlean_bridge.fileio import read_capped, real_inside
from torchlean_bridge.report import Finding

from .checkpoint_base import Checkpoint, _strip

__all__ = ["is_shard_index", "load_shard_index", "load_folder", "load_distributed"]

INDEX_SUFFIXES = (".safetensors.index.json", ".bin.index.json", ".pt.index.json")
_SINGLE = ("model.safetensors", "pytorch_model.bin", "model.pt", "model.pth", "checkpoint.pt")


def is_shard_index(path: Path) -> bool:
    return path.name.endswith(INDEX_SUFFIXES)


def load_shard_index(path: Path, strip_prefix: str | None, load_file: Callable[..., Any]) -> Any:
    """A Hugging Face shard index (``weight_map``: key -> shard file beside the index)."""
    try:
        doc = json.loads(read_capped(path, "shard index"))
    except (ValueError, RecursionError) as e:
        raise CheckpointError(f"cannot read shard index {path}: {e}") from None
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                   for k, v in weight_map.items()):
        raise CheckpointError(f"shard index {path}: expected {{\"weight_map\": {{key: shard file}}}}")
    shards: dict[str, Any] = {}
    for name in sorted(set(weight_map.values())):
        shard = path.parent / name
        if Path(name).name != name or real_inside(path.parent, shard) is None:
            raise CheckpointError(f"shard index {path}: shard {name!r} must be a file beside the index")
        if not shard.is_file():
            raise CheckpointError(f"shard index {path}: shard {name} is missing")
        shards[name] = load_file(shard, None)
    findings = []
    for name, ckpt in shards.items():
        findings.extend(ckpt.notes)
        missing = [k for k, v in weight_map.items() if v == name and k not in ckpt]
        if missing:
            raise CheckpointError(f"shard index {path}: {len(missing)} key(s) the index puts in {name} are not "
                                  f"there (first: {missing[0]})")
    keys = list(weight_map)
    renamed, notes = _strip(keys, strip_prefix, str(path))
    where = {new: (shards[weight_map[old]], old) for new, old in renamed.items()}
    return Checkpoint({k: c.shape(o) for k, (c, o) in where.items()}, {k: c.dtype(o) for k, (c, o) in where.items()},
                      lambda k: where[k][0][where[k][1]], source=str(path), format="sharded " + next(
                          iter(shards.values())).format, findings=findings + notes,
                      metadata=doc.get("metadata") if isinstance(doc.get("metadata"), dict) else None)


def load_folder(path: Path, strip_prefix: str | None, load_file: Callable[..., Any]) -> Any:
    """A checkpoint folder: its shard index, its DCP metadata, or the one checkpoint file inside."""
    if (path / ".metadata").is_file():
        return load_distributed(path, strip_prefix)
    indexes = sorted(p for p in path.iterdir() if is_shard_index(p))
    if len(indexes) == 1:
        return load_shard_index(indexes[0], strip_prefix, load_file)
    if len(indexes) > 1:
        raise CheckpointError(f"checkpoint folder {path}: several shard indexes ({', '.join(p.name for p in indexes)}); "
                              f"give one")
    named = [path / n for n in _SINGLE if (path / n).is_file()]
    candidates = named or sorted(p for p in path.iterdir() if p.is_file() and p.suffix in
                                 (".safetensors", ".bin", ".pt", ".pth"))
    if len(candidates) != 1:
        found = ", ".join(p.name for p in candidates) or "no checkpoint file"
        raise CheckpointError(f"checkpoint folder {path}: expected one shard index or one checkpoint file, found "
                              f"{found}")
    return load_file(candidates[0], strip_prefix)


# -- torch.distributed.checkpoint ------------------------------------------------------------------

_DCP = "torch.distributed.checkpoint"
_ALLOWED = {(f"{_DCP}.metadata", n) for n in ("Metadata", "TensorStorageMetadata", "BytesStorageMetadata",
                                             "ChunkStorageMetadata", "TensorProperties", "MetadataIndex",
                                             "StorageMeta", "_MEM_FORMAT_ENCODING")}
_ALLOWED |= {(f"{_DCP}.filesystem", "_StorageInfo"), ("torch", "Size"), ("torch.serialization", "_get_layout"),
             ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath")}


class _MetadataUnpickler(pickle.Unpickler):
    """Constructs DCP's metadata classes, torch sizes and dtypes, and nothing else."""

    def find_class(self, module: str, name: str) -> Any:
        import torch
        if (module, name) in _ALLOWED or (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not part of checkpoint metadata")


def load_distributed(path: Path, strip_prefix: str | None) -> Any:
    """A torch.distributed.checkpoint folder; each tensor read on first access (``dcp.load`` of that key)."""
    import torch
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    try:
        with (path / ".metadata").open("rb") as f:
            metadata = _MetadataUnpickler(f).load()
        entries = metadata.state_dict_metadata
    except Exception as e:  # noqa: BLE001 - untrusted bytes: whatever they make the unpickler raise is bad input
        raise CheckpointError(f"cannot read distributed checkpoint {path}: its .metadata is not DCP metadata "
                              f"({type(e).__name__}: {str(e)[:200]})") from None
    tensors = {k: v for k, v in entries.items() if isinstance(v, TensorStorageMetadata)}
    findings = [Finding("non_tensor", f"`{k}` is not a tensor; not loaded", keys=(k,), severity="info")
                for k in entries if k not in tensors]
    renamed, notes = _strip(list(tensors), strip_prefix, str(path))
    shapes = {new: tuple(tensors[old].size) for new, old in renamed.items()}
    dtypes = {new: _numpy_dtype(tensors[old].properties.dtype) for new, old in renamed.items()}
    if not shapes:
        raise CheckpointError(f"distributed checkpoint {path} holds no tensors")

    def read(key: str) -> np.ndarray:
        import torch.distributed.checkpoint as dcp
        old = renamed[key]
        meta = tensors[old]
        out = {old: torch.empty(tuple(meta.size), dtype=meta.properties.dtype)}
        dcp.load(out, storage_reader=FileSystemReader(str(path)))  # the metadata above passed the allowlist
        value = out[old]
        return (value.float() if value.dtype == torch.bfloat16 else value).numpy()

    return Checkpoint(shapes, dtypes, read, source=str(path), format="torch.distributed.checkpoint",
                      findings=findings + notes)


def _numpy_dtype(dtype: Any) -> np.dtype:
    import torch
    return np.dtype(np.float32) if dtype == torch.bfloat16 else torch.empty(0, dtype=dtype).numpy().dtype
