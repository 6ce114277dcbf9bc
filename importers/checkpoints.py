"""Checkpoints: named tensors from safetensors, PyTorch, ONNX or TorchLean state-dict JSON files.

A ``Checkpoint`` is a read-only mapping ``key -> numpy array``. Nothing in a file is silently
dropped or converted: entries that are not tensors, integer and bool tensors, widened bfloat16 and
NaN/Inf values are all listed in ``checkpoint.findings`` (kinds ``non_tensor``, ``integer``,
``bool``, ``widened``, ``non_finite``, ``unsupported``, ``prefix``, ``wrapper``).

Safety: PyTorch files are read only through ``torch.load(weights_only=True)``; a pickle that
would construct arbitrary objects (and so could run code) is refused with ``CheckpointError``.
safetensors files are memory-mapped (header validated whole, each tensor a read-only view of the
file), so shapes and dtypes of a large file are known without reading its data.
"""

from __future__ import annotations

import json
import math
import re
import warnings
import zipfile
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from torchlean_bridge.errors import BridgeError, CheckpointError
from torchlean_bridge.fileio import read_capped
from torchlean_bridge.ops.contracts import DEFAULT_ELEMENT_LIMIT, MAX_RANK
from torchlean_bridge.report import Finding

from .checkpoint_base import Checkpoint, _strip

__all__ = ["Checkpoint", "load_checkpoint", "as_checkpoint"]

# safetensors dtype tag -> numpy dtype (BF16 has none: widened exactly to float32 and reported)
_ST_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32,
              "I16": np.int16, "I8": np.int8, "U8": np.uint8, "U16": np.uint16, "U32": np.uint32,
              "U64": np.uint64, "BOOL": np.bool_}

_WRAPPERS = ("state_dict", "model_state_dict")


def _eager(arrays: dict[str, np.ndarray], source: str, fmt: str, findings: list[Finding],
           strip_prefix: str | None, metadata: Mapping[str, Any] | None = None) -> Checkpoint:
    renamed, notes = _strip(list(arrays), strip_prefix, source)
    data = {new: arrays[old] for new, old in renamed.items()}
    return Checkpoint({k: a.shape for k, a in data.items()}, {k: a.dtype for k, a in data.items()},
                      lambda k: data[k], source=source, format=fmt, findings=findings + notes, metadata=metadata)


# -- safetensors -----------------------------------------------------------------------------------
def _load_safetensors(path: Path, strip_prefix: str | None) -> Checkpoint:
    """Memory-mapped: the header is validated whole, each tensor is a read-only view of the file
    (bfloat16 is widened exactly, on first access, to float32)."""
    from exporters.payload_safetensors import index_safetensors
    source = str(path)
    try:
        index = index_safetensors(path, "safetensors checkpoint")
    except BridgeError as e:
        raise CheckpointError(e.message) from None
    findings: list[Finding] = []
    dtypes: dict[str, np.dtype] = {}
    for k, (tag, _, _, _) in index.entries.items():
        if tag == "BF16":
            dtypes[k] = np.dtype(np.float32)
            findings.append(Finding("widened", f"`{k}` is bfloat16; widened exactly to float32", keys=(k,),
                                    severity="info"))
        elif tag in _ST_DTYPES:
            dtypes[k] = np.dtype(_ST_DTYPES[tag])
        else:
            findings.append(Finding("unsupported", f"`{k}` has element type {tag}, which has no numpy "
                                    f"equivalent; not loaded", keys=(k,), severity="warning"))
    renamed, notes = _strip([k for k in index.entries if k in dtypes], strip_prefix, source)

    def read(key: str) -> np.ndarray:
        original = renamed[key]
        if index.entries[original][0] == "BF16":  # the upper half of a float32: exact
            return (index.raw(original, "<u2").astype(np.uint32) << 16).view(np.float32)
        return index.array(original)

    return Checkpoint({new: index.entries[old][1] for new, old in renamed.items()},
                      {new: dtypes[old] for new, old in renamed.items()}, read, source=source,
                      format="safetensors", findings=findings + notes, metadata=index.metadata)


# -- PyTorch ---------------------------------------------------------------------------------------
def _tensor_to_numpy(key: str, value: Any, findings: list[Finding]) -> np.ndarray | None:
    import torch
    if value.is_quantized or value.is_complex() or value.layout != torch.strided:
        findings.append(Finding("unsupported", f"`{key}` is a {value.dtype} {value.layout} tensor; not loaded",
                                keys=(key,), severity="warning"))
        return None
    value = value.detach().cpu()
    if value.dtype == torch.bfloat16:
        findings.append(Finding("widened", f"`{key}` is bfloat16; widened exactly to float32", keys=(key,),
                                severity="info"))
        value = value.float()
    try:
        return value.numpy()
    except TypeError:  # e.g. float8: no numpy type, and widening would hide the format
        findings.append(Finding("unsupported", f"`{key}` is a {value.dtype} tensor, which numpy cannot hold; "
                                "not loaded", keys=(key,), severity="warning"))
        return None


def _state_dict_arrays(obj: Any, source: str) -> tuple[dict[str, np.ndarray], list[Finding]]:
    """Unwrap ``{"state_dict": ...}``/``{"model_state_dict": ...}``; tensors out, everything else noted."""
    import torch
    findings: list[Finding] = []
    if not isinstance(obj, Mapping):
        raise CheckpointError(f"checkpoint {source}: expected a state_dict (a mapping of names to tensors), "
                              f"got {type(obj).__name__}; save `model.state_dict()` instead of the model")
    for wrapper in _WRAPPERS:
        if isinstance(obj.get(wrapper), Mapping):
            others = sorted(str(k) for k in obj if k != wrapper)
            findings.append(Finding("wrapper", f"unwrapped `{wrapper}`" + (
                f"; other top-level entries not read: {', '.join(others)}" if others else ""),
                data={"wrapper": wrapper, "ignored": others}, severity="info"))
            obj = obj[wrapper]
            break
    arrays: dict[str, np.ndarray] = {}
    for key, value in obj.items():
        key = str(key)
        if isinstance(value, torch.Tensor):
            arr = _tensor_to_numpy(key, value, findings)
            if arr is not None:
                arrays[key] = arr
        else:
            findings.append(Finding("non_tensor", f"`{key}` is a {type(value).__name__}, not a tensor; not loaded",
                                    keys=(key,), severity="warning"))
    return arrays, findings


def _unpickler_reason(message: str) -> str:
    """The one informative sentence of torch's long weights-only refusal (what it refused)."""
    lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
    for i, line in enumerate(lines):
        if "WeightsUnpickler error:" in line:
            reason = line.split("WeightsUnpickler error:", 1)[1].strip() or (lines[i + 1] if i + 1 < len(lines) else "")
        elif "unsupported" in line.lower():
            reason = line
        else:
            continue
        return re.split(r"\.(?:\s|$)", reason, maxsplit=1)[0]
    return "the weights-only unpickler refused it"


def _torch_load(path: Path) -> Any:
    """``torch.load(weights_only=True)``, memory-mapped where the file allows it (its storages are then
    views of the file, so a corrupted size cannot make torch allocate it)."""
    import torch
    with warnings.catch_warnings():  # torch warns about pickle protocols before refusing; the refusal says it all
        warnings.filterwarnings("ignore", message="Detected pickle protocol")
        warnings.filterwarnings("ignore", category=UserWarning)
        if zipfile.is_zipfile(path):
            return torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
        return torch.load(str(path), map_location="cpu", weights_only=True)


def _load_torch(path: Path, strip_prefix: str | None) -> Checkpoint:
    import pickle
    try:
        obj = _torch_load(path)
    except pickle.UnpicklingError as e:
        first = _unpickler_reason(str(e))
        raise CheckpointError(
            f"refused to load {path}: it is not a weights-only file (its pickle would construct objects "
            f"or run code that torch.load(weights_only=True) does not allow: {first}). Re-save it with "
            f"torch.save(model.state_dict(), ...) or convert it to safetensors") from None
    except MemoryError:
        raise CheckpointError(f"cannot read PyTorch checkpoint {path}: it declares more data than fits in "
                              f"memory (a corrupted file?)") from None
    except Exception as e:  # noqa: BLE001 - torch.load is the entry point of untrusted bytes: whatever a
        # corrupted file makes it raise (KeyError, IndexError, AttributeError, RuntimeError, ...) is bad input
        raise CheckpointError(f"cannot read PyTorch checkpoint {path}: the file is corrupted or not a "
                              f"PyTorch file ({type(e).__name__}: {str(e)[:200]})") from None
    arrays, findings = _state_dict_arrays(obj, str(path))
    return _eager(arrays, str(path), "torch", findings, strip_prefix)


# -- ONNX --------------------------------------------------------------------------------------------
def _initializer_problem(init: Any, data_types: set[int]) -> str | None:
    """Why an initializer cannot be read, decided from its header before any data is decoded."""
    if init.data_type not in data_types or init.data_type == 0:
        return f"data_type {init.data_type} is not an ONNX element type"
    if any(d < 0 for d in init.dims):
        return f"negative dimension in {list(init.dims)}"
    if len(init.dims) > MAX_RANK:
        return f"rank {len(init.dims)} above the limit of {MAX_RANK}"
    count = math.prod(init.dims)
    if count > DEFAULT_ELEMENT_LIMIT:
        return f"shape {list(init.dims)} has {count} elements, above the limit of {DEFAULT_ELEMENT_LIMIT}"
    return None


def _load_onnx(path: Path, strip_prefix: str | None) -> Checkpoint:
    import onnx
    from importers.onnx.external import initializer_array
    try:  # external data stays on disk: read (memory-mapped) per initializer, after its checks
        model = onnx.load(str(path), load_external_data=False)
    except Exception as e:  # onnx raises DecodeError, OSError, ValueError ... depending on the damage
        raise CheckpointError(f"cannot read ONNX model {path}: {e}") from None
    data_types = set(onnx.TensorProto.DataType.values())
    arrays: dict[str, np.ndarray] = {}
    findings: list[Finding] = []
    for init in model.graph.initializer:
        if not isinstance(init.name, str):  # protobuf hands back bytes for a name that is not UTF-8
            raise CheckpointError(f"ONNX model {path}: initializer name {init.name!r} is not valid UTF-8")
        problem = _initializer_problem(init, data_types)
        if problem is not None:  # a header no ONNX writer produces: a damaged file, not a tensor to skip
            raise CheckpointError(f"ONNX model {path}: initializer `{init.name}`: {problem}")
        try:
            arrays[init.name] = initializer_array(init, path.parent)
            continue
        except BridgeError as e:  # a valid element type the IR cannot hold (strings, ...): that key is skipped
            problem = e.message
        findings.append(Finding("unsupported", f"initializer `{init.name}` cannot be read: {problem}",
                                keys=(init.name,), severity="warning"))
    return _eager(arrays, str(path), "onnx", findings, strip_prefix)


# -- TorchLean state-dict JSON (spec 3.3) -------------------------------------------------------------
_JSON_DTYPES = {"torch.int64": np.int64, "torch.int32": np.int32, "torch.bool": np.bool_}


def _json_shape(value: Any) -> tuple[int, ...] | None:
    """The shape of a rectangular nested list of JSON numbers (bools allowed), None otherwise;
    iterative, so no nesting depth can exhaust the stack."""
    shape, level = [], [value]
    while level and isinstance(level[0], list):
        if len(shape) >= MAX_RANK:
            return None
        extent = len(level[0])
        if any(not isinstance(row, list) or len(row) != extent for row in level):
            return None
        shape.append(extent)
        level = [x for row in level for x in row]
    if any(isinstance(x, list) or not isinstance(x, (int, float)) for x in level):
        return None
    return tuple(shape)


def _meta_shape(shape: Any, where: str) -> list[int]:
    """A meta record's shape: a list of natural numbers within the element limit, else the file is refused
    (a shape of ``Infinity``, ``1e300`` or a value past int64 is a damaged or hostile file, not a tensor to skip)."""
    text = json.dumps(shape, allow_nan=True)[:80]
    if not isinstance(shape, list) or len(shape) > MAX_RANK or \
            not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise CheckpointError(f"{where}: {text} is not a list of at most {MAX_RANK} natural numbers")
    if math.prod(shape) > DEFAULT_ELEMENT_LIMIT:
        raise CheckpointError(f"{where}: {text} has {math.prod(shape)} elements, above the limit of "
                              f"{DEFAULT_ELEMENT_LIMIT}")
    return shape


def _load_torchlean_json(path: Path, strip_prefix: str | None) -> Checkpoint:
    try:
        doc = json.loads(read_capped(path, "JSON checkpoint"))
    except BridgeError as e:
        raise CheckpointError(e.message) from None
    except (ValueError, RecursionError) as e:
        raise CheckpointError(f"cannot read JSON checkpoint {path}: "
                              f"{'nested too deeply' if isinstance(e, RecursionError) else e}") from None
    if not isinstance(doc, dict):
        raise CheckpointError("PyTorch import: expected a JSON object `{...}` or a wrapper `{ \"params\": {...} }`.")
    params = doc.get("params", doc) if isinstance(doc.get("params"), dict) else doc
    meta = doc.get("meta", {}) if isinstance(doc.get("meta"), dict) else {}
    arrays: dict[str, np.ndarray] = {}
    findings: list[Finding] = []
    for key, value in params.items():
        if key == "meta" and params is doc:
            continue
        info = meta.get(key, {}) if isinstance(meta.get(key), dict) else {}
        tag = info.get("dtype")
        if tag is not None and not isinstance(tag, str):
            findings.append(Finding("non_tensor", f"`{key}`: meta dtype {str(tag)[:40]} is not a string; not loaded",
                                    keys=(key,), severity="warning"))
            continue
        dtype = _JSON_DTYPES.get(tag, np.float64)
        shape = _meta_shape(info["shape"], f"JSON checkpoint {path}: meta.{key}.shape") if "shape" in info else None
        data_shape = _json_shape(value)
        if data_shape is None:
            findings.append(Finding("non_tensor", f"`{key}` is not a rectangular array of numbers with a list "
                                    "shape of natural numbers; not loaded", keys=(key,), severity="warning"))
            continue
        try:
            arr = np.array(value, dtype=dtype)
        except (OverflowError, ValueError):
            findings.append(Finding("non_tensor", f"`{key}` holds a value that does not fit {np.dtype(dtype)}; "
                                    "not loaded", keys=(key,), severity="warning"))
            continue
        if shape is not None and shape != list(arr.shape):
            if arr.size == math.prod(shape):
                arr = arr.reshape(shape)
            else:
                findings.append(Finding("non_tensor", f"`{key}`: meta shape {info['shape']} does not match the "
                                        f"data's {list(arr.shape)}; not loaded", keys=(key,), severity="warning"))
                continue
        arrays[key] = arr
    if params is doc and (not arrays or (findings and all(a.ndim == 0 for a in arrays.values()))):  # a config.json
        why = f" ({findings[0].message})" if findings else ""
        raise CheckpointError(f"{path} is not a checkpoint: a JSON checkpoint holds tensors as nested lists of "
                              f"numbers, this one holds no array{why}")
    return _eager(arrays, str(path), "torchlean-json", findings, strip_prefix)


# -- entry points -----------------------------------------------------------------------------------
_LOADERS = {"safetensors": _load_safetensors, "torch": _load_torch, "onnx": _load_onnx,
            "torchlean-json": _load_torchlean_json}
_SUFFIXES = {".safetensors": "safetensors", ".pt": "torch", ".pth": "torch", ".bin": "torch", ".ckpt": "torch",
             ".tar": "torch", ".onnx": "onnx", ".json": "torchlean-json"}


def _sniff(path: Path) -> str:
    """The format from the suffix, else from the first bytes (zip = torch, JSON header = safetensors)."""
    if path.suffix.lower() in _SUFFIXES:
        return _SUFFIXES[path.suffix.lower()]
    with path.open("rb") as f:
        head = f.read(16)
    if head[:2] == b"PK" or head[:1] == b"\x80":
        return "torch"
    if len(head) > 9 and head[8:9] == b"{":
        return "safetensors"
    if head.lstrip()[:1] == b"{":
        return "torchlean-json"
    raise CheckpointError(f"cannot tell the format of {path}: use a .safetensors, .pt/.pth/.bin, .onnx or "
                          f".json file")


def load_checkpoint(path: str | Path, strip_prefix: str | None = "module.", format: str | None = None) -> Checkpoint:
    """Open a checkpoint file, a shard index, or a checkpoint folder (its index, its DCP metadata, or the one
    file inside); ``strip_prefix`` (default ``module.``, from DataParallel) is removed."""
    from .checkpoint_shards import is_shard_index, load_folder, load_shard_index
    path = Path(path)
    if path.is_dir() and format is None:
        return load_folder(path, strip_prefix, load_checkpoint)
    if not path.is_file():
        raise CheckpointError(f"no such checkpoint file or folder: {path}")
    if format is None and is_shard_index(path):
        return load_shard_index(path, strip_prefix, load_checkpoint)
    fmt = format or _sniff(path)
    if fmt not in _LOADERS:
        raise CheckpointError(f"unknown checkpoint format `{fmt}`; expected one of {', '.join(_LOADERS)}")
    return _LOADERS[fmt](path, strip_prefix)


def as_checkpoint(obj: Any, strip_prefix: str | None = "module.") -> Checkpoint:
    """A Checkpoint from a path, a Checkpoint, or an in-memory mapping (e.g. ``module.state_dict()``)."""
    if isinstance(obj, Checkpoint):
        return obj
    if isinstance(obj, (str, Path)):
        return load_checkpoint(obj, strip_prefix)
    if isinstance(obj, Mapping):
        if any(not isinstance(v, np.ndarray) for v in obj.values()):
            arrays, findings = _state_dict_arrays(obj, "<state_dict>")
        else:
            arrays, findings = {str(k): v for k, v in obj.items()}, []
        return _eager(arrays, "<state_dict>", "mapping", findings, strip_prefix)
    raise CheckpointError(f"expected a checkpoint path, Checkpoint or mapping of tensors, got {type(obj).__name__}")
