"""ONNX external data, memory-mapped: an initializer stored beside the model is a read-only view
into its file, never read into memory (a transform that needs other values copies then).

The model is loaded without its external data; each external tensor's ``location`` must name a
regular file inside the model's folder (no absolute paths, no ``..``, no symlink out), and its
``offset``/``length`` must lie within that file and match the tensor's dims and element type.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from torchlean_bridge.errors import BridgeError

__all__ = ["is_external", "mapped_array"]


def is_external(t: Any) -> bool:
    from onnx import TensorProto
    return t.data_location == TensorProto.EXTERNAL


def _fields(t: Any) -> dict[str, str]:
    return {kv.key: kv.value for kv in t.external_data}


def _fail(t: Any, what: str) -> BridgeError:
    return BridgeError(f"ONNX import: initializer `{t.name}` (external data): {what}"[:500])


def _data_file(t: Any, base: Path, location: str) -> Path:
    if not location or os.path.isabs(location) or ".." in Path(location).parts:
        raise _fail(t, f"location {location!r} must be a relative path inside the model's folder")
    path = base / location
    real, root = Path(os.path.realpath(path)), Path(os.path.realpath(base))
    if root != real and root not in real.parents:
        raise _fail(t, f"location {location!r} resolves outside the model's folder")
    if not real.is_file():
        raise _fail(t, f"no regular file {location!r} next to the model")
    return real


def mapped_array(t: Any, base: Path) -> np.ndarray | None:
    """A read-only memory map of external tensor ``t`` under folder ``base``; None for element types
    that are not plain fixed-size numbers (read the ordinary way)."""
    from onnx import helper
    try:
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type))
    except (KeyError, TypeError, ValueError):
        return None
    if dtype.kind not in "biuf" or dtype.itemsize not in (1, 2, 4, 8) or dtype.name == "bfloat16":
        return None
    fields = _fields(t)
    path = _data_file(t, base, fields.get("location", ""))
    try:
        offset = int(fields.get("offset", 0))
        nbytes = math.prod(t.dims) * dtype.itemsize
        length = int(fields.get("length", nbytes))
    except ValueError:
        raise _fail(t, f"offset/length {fields.get('offset')!r}/{fields.get('length')!r} are not integers") from None
    size = path.stat().st_size
    if offset < 0 or length != nbytes or offset + length > size:
        raise _fail(t, f"offset {offset} and length {length} do not hold {list(t.dims)} x {dtype.name} "
                       f"({nbytes} bytes) within the {size}-byte file")
    if nbytes == 0:
        return np.zeros(tuple(t.dims), dtype.newbyteorder("<"))
    mapped = np.memmap(path, dtype=dtype.newbyteorder("<"), mode="r", offset=offset, shape=(math.prod(t.dims),))
    view = mapped.view(np.ndarray).reshape(tuple(t.dims))  # a plain read-only array over the mapping
    return view if np.little_endian else view.astype(dtype)
