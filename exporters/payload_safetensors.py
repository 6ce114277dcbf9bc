"""Payload <-> safetensors: tensors keyed ``"<node id>.<role>"``, a sha256 per tensor in the metadata.

The hashes are checked on load, so a payload file that was edited or truncated is an error, not a
silently different model.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from torchlean_bridge.errors import BridgeError
from torchlean_bridge.fileio import atomic_write_bytes
from torchlean_bridge.payload import Payload, tensor_sha256

__all__ = ["payload_to_bytes", "payload_from_file"]

_META_KEY = "torchlean_bridge.sha256"


def payload_to_bytes(payload: Payload) -> bytes:
    from safetensors.numpy import save
    tensors = {k: np.asarray(a, order="C") for k, a in sorted(payload.flat().items())}
    meta = {_META_KEY: json.dumps({k: tensor_sha256(a) for k, a in tensors.items()}, sort_keys=True)}
    return save(tensors, metadata=meta)


def write_payload(payload: Payload, path: str | Path) -> None:
    atomic_write_bytes(path, payload_to_bytes(payload))


def _split_key(key: str) -> tuple[int, str]:
    node, _, role = key.partition(".")
    if not (node.isascii() and node.isdigit()) or not role:
        raise BridgeError(f"payload file: tensor name `{key}` is not `<node id>.<role>`")
    return int(node), role


def payload_from_file(path: str | Path, verify: bool = True) -> Payload:
    from safetensors import SafetensorError, safe_open
    try:
        with safe_open(str(path), framework="numpy") as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except (SafetensorError, OSError, ValueError) as e:
        raise BridgeError(f"cannot read payload {path}: {e}") from None
    if verify:
        if tensors and _META_KEY not in meta:
            raise BridgeError(f"payload {path}: no `{_META_KEY}` metadata, so its tensors cannot be verified "
                              f"(write it with tlb.save, or load with verify=False)")
        try:
            hashes = json.loads(meta.get(_META_KEY, "{}"))
        except ValueError:
            raise BridgeError(f"payload {path}: corrupt hash metadata") from None
        if not isinstance(hashes, dict):
            raise BridgeError(f"payload {path}: corrupt hash metadata")
        unlisted = sorted(set(tensors) - set(hashes))
        if unlisted:
            raise BridgeError(f"payload {path}: tensors without a recorded sha256 (added after writing): {unlisted}")
        for k, a in tensors.items():
            if k in hashes and hashes[k] != tensor_sha256(a):
                raise BridgeError(f"payload {path}: tensor `{k}` does not match its recorded sha256 "
                                  f"(the file was modified)")
        missing = sorted(set(hashes) - set(tensors))
        if missing:
            raise BridgeError(f"payload {path}: tensors listed in the metadata are missing: {missing}")
    payload = Payload()
    for k, a in tensors.items():
        node, role = _split_key(k)
        payload.set(node, role, a)
    return payload
