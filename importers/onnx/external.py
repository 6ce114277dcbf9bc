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
from torchlean_bridge.fileio import real_inside

__all__ = ["is_external", "mapped_array", "initializer_array", "sparse_initializer_array"]


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
    real = real_inside(base, base / location)
    if real is None:
        raise _fail(t, f"location {location!r} resolves outside the model's folder")
    if not real.is_file():
        raise _fail(t, f"no regular file {location!r} next to the model")
    return real


def _extent(t: Any, base: Path, default_length: int | None) -> tuple[Path, int, int, int]:
    """(data file, offset, length, file size) of external tensor ``t``, the file checked to lie inside
    ``base``; a missing ``length`` is ``default_length`` (None: the rest of the file)."""
    fields = _fields(t)
    path = _data_file(t, base, fields.get("location", ""))
    size = path.stat().st_size
    try:
        offset = int(fields.get("offset", 0))
        length = int(fields.get("length", size - offset if default_length is None else default_length))
    except ValueError:
        raise _fail(t, f"offset/length {fields.get('offset')!r}/{fields.get('length')!r} are not integers") from None
    return path, offset, length, size


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
    nbytes = math.prod(t.dims) * dtype.itemsize
    path, offset, length, size = _extent(t, base, nbytes)
    if offset < 0 or length != nbytes or offset + length > size:
        raise _fail(t, f"offset {offset} and length {length} do not hold {list(t.dims)} x {dtype.name} "
                       f"({nbytes} bytes) within the {size}-byte file")
    if nbytes == 0:
        return np.zeros(tuple(t.dims), dtype.newbyteorder("<"))
    mapped = np.memmap(path, dtype=dtype.newbyteorder("<"), mode="r", offset=offset, shape=(math.prod(t.dims),))
    view = mapped.view(np.ndarray).reshape(tuple(t.dims))  # a plain read-only array over the mapping
    return view if np.little_endian else view.astype(dtype)


def initializer_array(t: Any, base: Path | None) -> np.ndarray:
    """An initializer's values (external data memory-mapped from ``base``); data that cannot be read
    is a BridgeError naming it."""
    from onnx import numpy_helper
    if is_external(t) and base is not None:
        mapped = mapped_array(t, base)
        if mapped is not None:
            return mapped
        from torchlean_bridge.check import DEFAULT_MAX_ELEMENTS
        _, offset, length, size = _extent(t, base, None)  # types that are not mapped are read whole: sized first
        if offset < 0 or length < 0 or offset + length > size or length > DEFAULT_MAX_ELEMENTS:
            raise _fail(t, f"offset {offset} and length {length} do not lie within the {size}-byte file "
                           f"(or exceed {DEFAULT_MAX_ELEMENTS} bytes)")
        from onnx.external_data_helper import load_external_data_for_tensor
        t = type(t).FromString(t.SerializeToString())
        try:
            load_external_data_for_tensor(t, str(base))
        except Exception as e:  # noqa: BLE001 - onnx raises ValidationError, OSError, ValueError here
            raise BridgeError(f"ONNX import: cannot read initializer `{t.name}` (external data): "
                              f"{type(e).__name__}: {e}"[:400]) from None
        t.data_location = 0
        del t.external_data[:]
    try:
        return numpy_helper.to_array(t)
    except Exception as e:  # noqa: BLE001 - onnx raises ValidationError, OSError, ValueError here
        where = {kv.key: kv.value for kv in t.external_data}.get("location")
        detail = f" (external data `{where}`: load the model from its path, next to that file)" if where else ""
        raise BridgeError(f"ONNX import: cannot read initializer `{t.name}`{detail}: {type(e).__name__}: "
                          f"{str(e).splitlines()[0] if str(e) else ''}"[:400]) from None


def sparse_initializer_array(sparse: Any, base: Path | None, max_elements: int) -> np.ndarray:
    """A ``sparse_initializer`` made dense (its size checked first): ``values`` at ``indices``, given as
    [NNZ] flat positions or [NNZ, rank] coordinates, zero elsewhere."""
    name = sparse.values.name or "?"
    dims = tuple(int(d) for d in sparse.dims)
    count = math.prod(dims)
    if any(d < 0 for d in dims) or count > max_elements:
        raise BridgeError(f"ONNX import: sparse initializer `{name}` has dims {list(dims)}: negative, or above the "
                          f"limit of {max_elements} elements")
    values = np.asarray(initializer_array(sparse.values, base)).reshape(-1)
    indices = np.asarray(initializer_array(sparse.indices, base)).astype(np.int64, copy=False)
    flat = indices.reshape(-1) if indices.ndim == 1 else None
    if indices.ndim == 2 and indices.shape[1] == len(dims):
        if np.any(indices < 0) or np.any(indices >= np.asarray(dims, dtype=np.int64)):
            flat = None
        else:
            flat = np.ravel_multi_index(tuple(indices.T), dims) if dims else np.zeros(len(indices), np.int64)
    if flat is None or flat.size != values.size or np.any(flat < 0) or np.any(flat >= count):
        raise BridgeError(f"ONNX import: sparse initializer `{name}`: indices {list(indices.shape)} do not address "
                          f"{values.size} values inside {list(dims)}")
    dense = np.zeros(count, dtype=values.dtype)
    dense[flat] = values
    return dense.reshape(dims)
