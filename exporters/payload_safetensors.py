"""Payload <-> safetensors: tensors keyed ``"<node id>.<role>"``, a sha256 per tensor in the metadata.

The hashes are checked on load, so a payload file that was edited or truncated is an error, not a
silently different model. The file is the standard safetensors layout (8-byte little-endian header
length, JSON header, tensor bytes), written tensor by tensor to disk and read memory-mapped: the
header is validated in full (element types, shapes within the element limit, offsets that tile
the data exactly, canonical names) before any tensor is touched, and each tensor is a read-only
view of the mapped file, so neither side holds a second copy of the whole payload.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import re
from pathlib import Path
from typing import Any, BinaryIO, Callable, Mapping, NamedTuple

import numpy as np

from torchlean_bridge.check import DEFAULT_MAX_ELEMENTS
from torchlean_bridge.errors import BridgeError, PayloadError
from torchlean_bridge.fileio import atomic_write_stream, regular_file_size
from torchlean_bridge.ops.contracts import MAX_RANK
from torchlean_bridge.payload import Payload, tensor_hash_prefix, tensor_sha256
from torchlean_bridge.wire import STRICT_JSON

__all__ = ["payload_to_bytes", "payload_from_file", "write_payload", "payload_writer", "split_key", "index_safetensors",
           "SafetensorsIndex", "MAX_HEADER_BYTES", "file_sha256"]

_META_KEY = "torchlean_bridge.sha256"
MAX_HEADER_BYTES = 100 << 20  # safetensors' own cap on the JSON header
_KEY = re.compile(r"(0|[1-9][0-9]{0,17})\.([A-Za-z_][A-Za-z0-9_]*)")  # node ids below 10**18
_TAGS = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1",
         "U8": "u1", "U16": "<u2", "U32": "<u4", "U64": "<u8", "BOOL": "?"}
_TAG_OF = {np.dtype(v).newbyteorder("<").str: k for k, v in _TAGS.items()}


def _tag(a: np.ndarray, key: str) -> str:
    tag = _TAG_OF.get(a.dtype.newbyteorder("<").str)
    if tag is None:
        raise PayloadError(f"payload tensor `{key}`: element type {a.dtype} has no safetensors encoding")
    return tag


def _layout(payload: Payload) -> tuple[bytes, list[tuple[str, np.ndarray]]]:
    """The padded header and the tensors in file order (sorted names, contiguous offsets)."""
    tensors = [(k, np.asarray(a, order="C")) for k, a in sorted(payload.flat().items())]
    header: dict[str, Any] = {
        "__metadata__": {_META_KEY: json.dumps({k: tensor_sha256(a) for k, a in tensors}, sort_keys=True)}}
    offset = 0
    for k, a in tensors:
        header[k] = {"dtype": _tag(a, k), "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # safetensors aligns the data start to 8 bytes with spaces
    return len(text).to_bytes(8, "little") + text, tensors


def _write(payload: Payload, f: BinaryIO) -> None:
    head, tensors = _layout(payload)
    f.write(head)
    for _, a in tensors:
        le = a.astype(a.dtype.newbyteorder("<"), copy=False)
        f.write(memoryview(np.ascontiguousarray(le).reshape(-1)).cast("B"))


def payload_to_bytes(payload: Payload) -> bytes:
    """The whole file in memory (tests and small payloads; ``write_payload`` streams to disk)."""
    import io
    buf = io.BytesIO()
    _write(payload, buf)
    return buf.getvalue()


def write_payload(payload: Payload, path: str | Path) -> None:
    """Atomically, one tensor at a time (no concatenated copy of the payload in memory)."""
    atomic_write_stream(path, payload_writer(payload))


def payload_writer(payload: Payload) -> Callable[[BinaryIO], None]:
    """The function that writes ``payload`` as safetensors to an open binary file."""
    return lambda f: _write(payload, f)


def split_key(key: str, where: str = "payload file") -> tuple[int, str]:
    """``"<node id>.<role>"`` in canonical spelling only (``01.weight`` and ``1..weight`` are refused)."""
    m = _KEY.fullmatch(key) if isinstance(key, str) else None
    if m is None:
        raise PayloadError(f"{where}: tensor name {key!r:.200} is not `<node id>.<role>` (a decimal node id "
                           f"below 10**18 without leading zeros, a dot, a role name)")
    return int(m.group(1)), m.group(2)


# every element type a safetensors file may declare, with its size in bytes
_ITEMSIZES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1, "I16": 2, "U16": 2, "F16": 2,
              "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "C64": 8, "I64": 8, "U64": 8, "F64": 8}


class SafetensorsIndex(NamedTuple):
    """A validated safetensors header over the memory-mapped file: ``entries[key] = (tag, shape, lo, hi)``
    with byte offsets relative to ``start``; the offsets tile the data exactly."""

    data: Any  # mmap.mmap (or b"" for an empty file)
    start: int
    metadata: dict[str, str]
    entries: dict[str, tuple[str, tuple[int, ...], int, int]]

    def array(self, key: str) -> np.ndarray:
        """A read-only view of one tensor of a numpy element type (not BF16/F8/C64, which callers convert)."""
        tag, shape, lo, hi = self.entries[key]
        dtype = np.dtype(_TAGS[tag])
        if hi == lo:
            return np.empty(shape, dtype.newbyteorder("="))
        arr = np.frombuffer(self.data, dtype=dtype, count=(hi - lo) // dtype.itemsize, offset=self.start + lo)
        return arr.reshape(shape).astype(dtype.newbyteorder("="), copy=False)

    def raw(self, key: str, dtype: str) -> np.ndarray:
        """One tensor's bytes as ``dtype`` elements (e.g. ``<u2`` for BF16), a read-only view."""
        _, shape, lo, hi = self.entries[key]
        dt = np.dtype(dtype)
        if hi == lo:
            return np.empty(shape, dt)
        return np.frombuffer(self.data, dtype=dt, count=(hi - lo) // dt.itemsize, offset=self.start + lo).reshape(shape)


def _header(data: mmap.mmap | bytes, size: int, what: str) -> tuple[dict[str, Any], int]:
    if size < 8:
        raise BridgeError(f"cannot read {what}: {size} bytes is too short for a safetensors header")
    n = int.from_bytes(data[:8], "little")
    if n > MAX_HEADER_BYTES or 8 + n > size:
        raise BridgeError(f"cannot read {what}: header length {n} does not fit the file of {size} bytes")
    try:
        header = json.loads(bytes(data[8:8 + n]).decode("utf-8"), **STRICT_JSON)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise BridgeError(f"cannot read {what}: the header is not JSON ({type(e).__name__})") from None
    if not isinstance(header, dict):
        raise BridgeError(f"cannot read {what}: the header is not a JSON object")
    return header, 8 + n


def _entry(key: str, info: Any, data_len: int, what: str, max_elements: int,
           tags: Mapping[str, int]) -> tuple[str, tuple[int, ...], int, int]:
    ctx = f"{what}: tensor `{key}`"
    if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
        raise BridgeError(f"{ctx}: expected {{dtype, shape, data_offsets}}, got {str(info)[:120]}")
    tag, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if not isinstance(tag, str) or tag not in tags:
        raise BridgeError(f"{ctx}: element type {str(tag)[:40]} is not one of {', '.join(tags)}")
    nat = (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0)
    if not isinstance(shape, list) or len(shape) > MAX_RANK or not all(nat(d) for d in shape):
        raise BridgeError(f"{ctx}: shape {str(shape)[:80]} is not a list of natural numbers")
    count = 1
    for d in shape:
        count *= d
    if count > max_elements:
        raise BridgeError(f"{ctx}: shape {shape} has {count} elements, above the limit of {max_elements}")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(nat(o) for o in offsets) \
            or not offsets[0] <= offsets[1] <= data_len:
        raise BridgeError(f"{ctx}: data_offsets {str(offsets)[:80]} are not within the {data_len} data bytes")
    if offsets[1] - offsets[0] != count * tags[tag]:
        raise BridgeError(f"{ctx}: {offsets[1] - offsets[0]} data bytes for shape {shape} of {tag} "
                          f"(expected {count * tags[tag]})")
    return tag, tuple(shape), offsets[0], offsets[1]


def index_safetensors(path: str | Path, what: str, max_elements: int = DEFAULT_MAX_ELEMENTS,
                      tags: Mapping[str, int] = _ITEMSIZES) -> SafetensorsIndex:
    """Memory-map a safetensors file and validate its whole header before any tensor is touched."""
    path = Path(path)
    what = f"{what} {path}"
    size = regular_file_size(path, what.split(" ")[0])
    try:
        with open(path, "rb") as f:
            data: mmap.mmap | bytes = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
    except (OSError, ValueError) as e:
        raise BridgeError(f"cannot read {what}: {e}") from None
    header, start = _header(data, size, what)
    meta = header.pop("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
        raise BridgeError(f"{what}: __metadata__ is not a mapping of strings")
    entries = {key: _entry(key, info, size - start, what, max_elements, tags) for key, info in header.items()}
    end = 0
    for lo, hi, key in sorted((e[2], e[3], k) for k, e in entries.items()):
        if lo != end:
            raise BridgeError(f"cannot read {what}: tensor `{key}` starts at byte {lo}, expected {end} "
                              f"(tensors overlap or leave gaps)")
        end = hi
    if end != size - start:
        raise BridgeError(f"cannot read {what}: {size - start} data bytes, the tensors use {end}")
    return SafetensorsIndex(data, start, meta, entries)


def _stored_sha256(f: BinaryIO, index: SafetensorsIndex, key: str, a: np.ndarray) -> str:
    """``tensor_sha256(a)`` of the stored tensor ``a``, from the file's bytes (already little-endian row-major)
    read in blocks: verifying does not fault the mapped pages in, so loading adds no resident copy."""
    _, _, lo, hi = index.entries[key]
    h = hashlib.sha256(tensor_hash_prefix(a))
    f.seek(index.start + lo)
    remaining = hi - lo
    while remaining:
        block = f.read(min(remaining, 1 << 20))
        if not block:
            raise BridgeError(f"payload {f.name}: truncated while verifying tensor `{key}`")
        h.update(block)
        remaining -= len(block)
    return h.hexdigest()


def _verify_hashes(path: Path, index: SafetensorsIndex, tensors: dict[str, np.ndarray]) -> None:
    meta = index.metadata
    if tensors and _META_KEY not in meta:
        raise BridgeError(f"payload {path}: no `{_META_KEY}` metadata, so its tensors cannot be verified "
                          f"(write it with tlb.save, or load with verify=False)")
    try:
        hashes = json.loads(meta.get(_META_KEY, "{}"))
    except (ValueError, RecursionError):
        raise BridgeError(f"payload {path}: corrupt hash metadata") from None
    if not isinstance(hashes, dict) or not all(isinstance(v, str) for v in hashes.values()):
        raise BridgeError(f"payload {path}: corrupt hash metadata")
    unlisted = sorted(set(tensors) - set(hashes))
    if unlisted:
        raise BridgeError(f"payload {path}: tensors without a recorded sha256 (added after writing): {unlisted}")
    with open(path, "rb") as f:
        for k, a in tensors.items():
            if hashes[k] != _stored_sha256(f, index, k, a):
                raise BridgeError(f"payload {path}: tensor `{k}` does not match its recorded sha256 "
                                  f"(the file was modified)")
    missing = sorted(set(hashes) - set(tensors))
    if missing:
        raise BridgeError(f"payload {path}: tensors listed in the metadata are missing: {missing}")


def payload_from_file(path: str | Path, verify: bool = True, max_elements: int = DEFAULT_MAX_ELEMENTS) -> Payload:
    """The payload of a safetensors file, each tensor a read-only view of the memory-mapped file."""
    path = Path(path)
    index = index_safetensors(path, "payload", max_elements, {t: np.dtype(d).itemsize for t, d in _TAGS.items()})
    for key in index.entries:
        split_key(key, f"payload {path}")
    tensors = {key: index.array(key) for key in index.entries}
    if verify:
        _verify_hashes(path, index, tensors)
    payload = Payload()
    for k, a in tensors.items():
        payload.set(*split_key(k), a)
    return payload


def file_sha256(path: Path) -> str:
    """sha256 of a file's bytes, read in blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
