"""Fuzzing torchlean-bridge's entry points: seeds, mutators and a subprocess worker pool of one.

Every case runs in ``fuzz.worker`` under an address-space limit (``RLIMIT_AS``, 4 GiB by default)
with a per-case timeout. Outcomes are counted per class:

- ``bridge``: refused with a BridgeError (or, for the CLI, ``exit:2``): the expected answer to bad input;
- ``accepted``: loaded, checked, evaluated and written back without error;
- ``silent``: accepted although the mutation belongs to a class that must be refused (a bool or string
  in an inline tensor, a non-canonical or foreign payload name, a changed bundle file);
- ``crash``: any other exception (or a CLI traceback / exit status outside 0-2);
- ``memory``: MemoryError under the address-space limit; ``timeout``: over the per-case time.

Mutators take a ``random.Random`` so that the tests drive them with hypothesis (``st.randoms``,
derandomized) and the campaign with seeded generators.
"""

from __future__ import annotations

import copy
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

ROOT = Path(__file__).resolve().parents[1]
BAD_CLASSES = ("silent", "crash", "memory", "timeout")


@dataclass
class Case:
    kind: str  # wire, bundle, onnx, checkpoint, cli
    argument: Any  # bytes (wire), a path (bundle, onnx, checkpoint), argv (cli)
    must_reject: bool = False
    label: str = ""


@dataclass
class Result:
    case: Case
    outcome: str
    detail: str
    seconds: float

    @property
    def verdict(self) -> str:
        if self.outcome == "accepted" or self.outcome in ("exit:0", "exit:1"):
            return "silent" if self.case.must_reject else "accepted"
        if self.outcome in ("bridge", "exit:2"):
            return "bridge"
        if self.outcome.startswith("exit:"):
            return "crash"
        return self.outcome


class Worker:
    """One fuzz worker subprocess; restarted after a timeout or a death."""

    def __init__(self, timeout: float = 10.0, address_limit: int = 4 << 30, cwd: str | None = None) -> None:
        self.timeout, self.address_limit, self.cwd = timeout, address_limit, cwd
        self.proc: subprocess.Popen | None = None

    def _start(self) -> None:
        env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1",
                   FUZZ_ADDRESS_LIMIT=str(self.address_limit), PYTHONPATH=str(ROOT))
        if self.cwd:
            env["FUZZ_CWD"] = self.cwd
        self.proc = subprocess.Popen([sys.executable, "-m", "fuzz.worker"], cwd=str(ROOT), env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        if self._read(120.0) != ("ready", ""):
            raise RuntimeError("the fuzz worker did not start")

    def _read(self, timeout: float) -> Any:
        import pickle
        import select
        assert self.proc is not None and self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        buf = b""
        need = 4
        size = None
        while len(buf) < need:
            left = deadline - time.monotonic()
            if left <= 0:
                return "timeout"
            ready, _, _ = select.select([self.proc.stdout], [], [], left)
            if not ready:
                return "timeout"
            chunk = os.read(self.proc.stdout.fileno(), need - len(buf))
            if not chunk:
                return "died"
            buf += chunk
            if size is None and len(buf) == 4:
                (size,) = struct.unpack("<I", buf)
                buf, need = b"", size
        return pickle.loads(buf)

    def run(self, case: Case) -> Result:
        import pickle
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        assert self.proc is not None and self.proc.stdin is not None
        data = pickle.dumps((case.kind, case.argument))
        start = time.monotonic()
        try:
            self.proc.stdin.write(struct.pack("<I", len(data)) + data)
            self.proc.stdin.flush()
            answer = self._read(self.timeout)
        except BrokenPipeError:
            answer = "died"
        seconds = time.monotonic() - start
        if answer in ("timeout", "died"):
            code = self.close()
            outcome = "timeout" if answer == "timeout" else "crash"
            return Result(case, outcome, f"worker {answer} (exit {code})", seconds)
        outcome, detail = answer
        if outcome == "memory" or seconds > self.timeout:
            self.close()  # a process that hit the limit may hold fragmented memory
        return Result(case, "timeout" if seconds > self.timeout else outcome, detail, seconds)

    def close(self) -> int | None:
        if self.proc is None:
            return None
        proc, self.proc = self.proc, None
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for stream in (proc.stdin, proc.stdout):
            try:
                stream.close()
            except (OSError, AttributeError):
                pass
        return proc.returncode

    def __enter__(self) -> "Worker":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# -- JSON structure mutation ----------------------------------------------------------------------

INTERESTING_INTS = (0, 1, -1, 2, 3, 7, 2 ** 31, 2 ** 31 - 1, 2 ** 32, 2 ** 63, -2 ** 63, 10 ** 6, 10 ** 7, 10 ** 9,
                    10 ** 12, 10 ** 20, 99999999999)
INTERESTING_FLOATS = (0.0, -0.0, 0.5, 1e300, -1e300, 1e-320, 3.5, 1e6)


def _paths(doc: Any, prefix: tuple = ()) -> Iterator[tuple]:
    """Every location in a JSON value (iteratively, so a deep document is fine)."""
    stack = [(prefix, doc)]
    while stack:
        path, value = stack.pop()
        yield path
        if isinstance(value, dict):
            stack.extend((path + (k,), v) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((path + (i,), v) for i, v in enumerate(value))


def _get(doc: Any, path: tuple) -> Any:
    for p in path:
        doc = doc[p]
    return doc


def _set(doc: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    _get(doc, path[:-1])[path[-1]] = value
    return doc


def random_json(rng: random.Random, depth: int = 0) -> Any:
    r = rng.random()
    if r < 0.25:
        return rng.choice(INTERESTING_INTS)
    if r < 0.35:
        return rng.choice(INTERESTING_FLOATS)
    if r < 0.45:
        return rng.choice((True, False, None))
    if r < 0.55:
        return rng.choice(("", "1e2", " 3 ", "relu", "conv", "input", "float", "int64", "\u00e9", "x" * 300))
    if r < 0.62 or depth > 3:
        return [rng.choice(INTERESTING_INTS[:8]) for _ in range(rng.randrange(0, 5))]
    if r < 0.7:
        return [rng.choice(INTERESTING_INTS) for _ in range(rng.randrange(0, 5))]
    if r < 0.85:
        return [random_json(rng, depth + 1) for _ in range(rng.randrange(0, 4))]
    return {rng.choice(("id", "kind", "shape", "parents", "weight", "axis")): random_json(rng, depth + 1)}


NESTED = "__nested_list_of_depth_"


def dumps(doc: Any) -> bytes:
    """JSON text of a mutated document; a ``NESTED<depth>`` string becomes a list nested that deep (written
    as text: json.dumps itself would recurse)."""
    text = json.dumps(doc, allow_nan=True)
    while NESTED in text:
        i = text.index('"' + NESTED)
        j = text.index('"', i + 1)
        depth = int(text[i + 1 + len(NESTED):j])
        text = text[:i] + "[" * depth + "0" + "]" * depth + text[j + 1:]
    return text.encode()


def mutate_json(doc: Any, rng: random.Random, rounds: int | None = None) -> Any:
    """A copy of ``doc`` with a few structural mutations: replace, delete, insert, duplicate, swap,
    numeric nudges, deep nesting."""
    doc = copy.deepcopy(doc)
    for _ in range(rounds or rng.randrange(1, 4)):
        paths = list(_paths(doc))
        path = rng.choice(paths)
        value = _get(doc, path)
        op = rng.random()
        if op < 0.35:
            doc = _set(doc, path, random_json(rng))
        elif op < 0.5 and isinstance(value, (int, float)) and not isinstance(value, bool):
            doc = _set(doc, path, rng.choice((value + 1, value - 1, -value, value * 1000, value * 10 ** 6,
                                              value + 2 ** 31, 0, 2 ** 31, 10 ** 9)))
        elif op < 0.6 and path:
            parent = _get(doc, path[:-1])
            if isinstance(parent, dict):
                del parent[path[-1]]
            else:
                parent.pop(path[-1])
        elif op < 0.7 and isinstance(value, list) and value:
            value.insert(rng.randrange(len(value) + 1), copy.deepcopy(rng.choice(value)))
        elif op < 0.78 and isinstance(value, list) and len(value) > 1:
            i, j = rng.randrange(len(value)), rng.randrange(len(value))
            value[i], value[j] = value[j], value[i]
        elif op < 0.85 and isinstance(value, dict):
            value[rng.choice(("groups", "kernel", "stride", "padding", "axis", "channels", "dtype", "values",
                              "input_ids", "value_kind", "in_dim", "out_dim"))] = random_json(rng)
        elif op < 0.88:
            doc = _set(doc, path, f"{NESTED}{rng.choice((40, 200, 5000, 100000))}")
        else:
            doc = _set(doc, path, copy.deepcopy(_get(doc, rng.choice(paths))))
    return doc


def tensor_leaf_paths(doc: dict) -> list[tuple]:
    """Locations of numbers inside inline payload tensors (weight, bias, values, gamma, ...)."""
    fields = ("weight", "bias", "values", "gamma", "beta", "mean", "var")
    out = []
    for i, node in enumerate(doc.get("nodes", [])):
        for f in fields:
            if f in node:
                out.extend(p for p in _paths(node[f], ("nodes", i, f))
                           if isinstance(_get(doc, p), (int, float)) and not isinstance(_get(doc, p), bool))
    return out


def non_number_in_tensor(doc: dict, rng: random.Random) -> dict | None:
    """A must-reject mutation: a bool or a numeric-looking string where an inline tensor has a number."""
    leaves = tensor_leaf_paths(doc)
    if not leaves:
        return None
    doc = copy.deepcopy(doc)
    for path in rng.sample(leaves, min(len(leaves), rng.randrange(1, 4))):
        _set(doc, path, rng.choice((True, False, "1e2", " 3 ", "0", "nan")))
    return doc


# -- byte mutation ----------------------------------------------------------------------------------

def mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    """Flip, overwrite with interesting integers, truncate, insert, duplicate or delete a chunk."""
    b = bytearray(data)
    for _ in range(rng.randrange(1, 5)):
        op = rng.random()
        if not b:
            b += bytes(rng.randrange(256) for _ in range(rng.randrange(1, 16)))
            continue
        i = rng.randrange(len(b))
        if op < 0.3:
            b[i] ^= 1 << rng.randrange(8)
        elif op < 0.5:
            width = rng.choice((1, 2, 4, 8))
            value = rng.choice((0, 1, 0x7F, 0x80, 0xFF, 0x7FFF_FFFF, 0xFFFF_FFFF, 2 ** 63 - 1, 2 ** 64 - 1, 999))
            b[i:i + width] = (value % (1 << (8 * width))).to_bytes(width, "little")
        elif op < 0.6:
            del b[rng.randrange(len(b)):]
        elif op < 0.75:
            j = rng.randrange(len(b))
            b[j:j] = b[i:i + rng.randrange(1, 64)]
        elif op < 0.85:
            del b[i:i + rng.randrange(1, 64)]
        else:
            b[i] = rng.randrange(256)
    return bytes(b)


# -- seeds ------------------------------------------------------------------------------------------

def wire_seeds() -> list[dict]:
    """torchlean.ir.v1 documents with inline payloads (seed MLP, convs, pools, norms) and ext-op graphs."""
    import torchlean_bridge as tlb
    from torchlean_bridge.seed import seed_mlp_bundle
    from torchlean_bridge.wire import graph_to_wire
    docs = [tlb.export_torchlean(seed_mlp_bundle(), None)]
    for name, model in onnx_seed_models().items():
        try:
            b = tlb.import_onnx(model)
        except tlb.BridgeError:
            continue
        try:
            docs.append(tlb.export_torchlean(b, None))
        except tlb.BridgeError:
            docs.append(graph_to_wire(b.graph, None))
    return docs


_ONNX_SEED_NAMES = ("Conv_grouped_dilated_asym", "Conv1d_same_upper", "BatchNormalization", "LayerNormalization_last",
                    "MaxPool_v1", "AveragePool_pad_included", "GlobalAveragePool", "Gemm_transB", "Softmax_opset13",
                    "Reshape_zero_and_minus_one", "ReduceSum_opset13_input", "Resize_nearest_scales", "Tile",
                    "Where_Greater", "Gather_embedding_int64_ids", "InstanceNormalization", "Expand_bidirectional",
                    "Einsum_weight_is_linear", "Round", "Transpose")


def onnx_seed_models() -> dict[str, Any]:
    sys.path.insert(0, str(ROOT))
    from tests.test_onnx_import import CASES
    return {n: CASES[n] for n in _ONNX_SEED_NAMES if n in CASES}


def bundle_seeds() -> list[Any]:
    import torchlean_bridge as tlb
    from torchlean_bridge.seed import seed_mlp_bundle
    out = [seed_mlp_bundle()]
    for model in onnx_seed_models().values():
        try:
            out.append(tlb.import_onnx(model))
        except tlb.BridgeError:
            pass
    return out


def checkpoint_seeds(folder: Path) -> list[Path]:
    """One state dict in every format the checkpoint reader takes."""
    import numpy as np
    import torch
    from safetensors.numpy import save_file
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    sd = {"0.weight": rng.standard_normal((4, 3)).astype(np.float32), "0.bias": np.zeros(4, np.float32),
          "steps": np.array([3], np.int64), "mask": np.array([True, False])}
    save_file(sd, str(folder / "seed.safetensors"), metadata={"k": "v"})
    tsd = {k: torch.from_numpy(v) for k, v in sd.items()}
    torch.save(tsd, folder / "seed.pt")
    torch.save({"state_dict": tsd, "epoch": 3}, folder / "seed_legacy.pth", _use_new_zipfile_serialization=False)
    doc = {"params": {k: v.tolist() for k, v in sd.items()},
           "meta": {"0.weight": {"shape": [4, 3]}, "steps": {"dtype": "torch.int64", "shape": [1]},
                    "mask": {"dtype": "torch.bool", "shape": [2]}}}
    (folder / "seed.json").write_text(json.dumps(doc))
    model = onnx_seed_models().get("Gemm_transB")
    if model is not None:
        (folder / "seed.onnx").write_bytes(model.SerializeToString())
    return sorted(p for p in folder.iterdir() if p.is_file())


# -- case generators --------------------------------------------------------------------------------

def wire_case(seeds: list[dict], rng: random.Random) -> Case:
    seed = rng.choice(seeds)
    if rng.random() < 0.2:
        doc = non_number_in_tensor(seed, rng)
        if doc is not None:
            return Case("wire", json.dumps(doc).encode(), must_reject=True, label="non-number in tensor")
    if rng.random() < 0.1:
        text = json.dumps(seed).encode()
        return Case("wire", mutate_bytes(text, rng), label="bytes")
    return Case("wire", dumps(mutate_json(seed, rng)), label="structure")


def _rewrite_payload(folder: Path, rename: Callable[[str], str]) -> bool:
    """Rename payload tensors and re-record every hash (tensor and manifest), so only the name is wrong."""
    from exporters.folder import PAYLOAD_FILE
    from exporters.payload_safetensors import _META_KEY
    from safetensors import safe_open
    from safetensors.numpy import save_file
    path = folder / PAYLOAD_FILE
    with safe_open(str(path), framework="numpy") as f:
        tensors = {rename(k): f.get_tensor(k) for k in f.keys()}
    from torchlean_bridge.payload import tensor_sha256
    save_file(tensors, str(path), metadata={_META_KEY: json.dumps({k: tensor_sha256(a) for k, a in tensors.items()})})
    _rerecord(folder)
    return bool(tensors)


def _rerecord(folder: Path) -> None:
    """Make manifest.json agree with the files as they are now."""
    from exporters.folder import MANIFEST_FILE, file_sha256
    manifest = json.loads((folder / MANIFEST_FILE).read_text())
    for name in list(manifest["files"]):
        p = folder / name
        if p.is_file():
            manifest["files"][name] = {"bytes": p.stat().st_size, "sha256": file_sha256(p)}
    (folder / MANIFEST_FILE).write_text(json.dumps(manifest))


def bundle_case(saved: list[Path], work: Path, rng: random.Random, index: int) -> Case:
    """A copy of a saved bundle folder with one corruption."""
    from exporters.folder import GRAPH_FILE, MANIFEST_FILE, PAYLOAD_FILE, ROLES_FILE
    src = rng.choice(saved)
    dst = work / f"case{index}"
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst)
    files = sorted(p.name for p in dst.iterdir())
    name = rng.choice(files)
    target = dst / name
    op = rng.random()
    if op < 0.12:
        target.unlink()
        return Case("bundle", str(dst), must_reject=True, label=f"deleted {name}")
    if op < 0.2:
        target.unlink()
        target.mkdir()
        return Case("bundle", str(dst), must_reject=True, label=f"{name} is a folder")
    if op < 0.26:
        target.unlink()
        target.symlink_to(rng.choice(("/dev/zero", "/dev/null", "/nonexistent")))
        return Case("bundle", str(dst), must_reject=True, label=f"{name} is a link to a device")
    if op < 0.45:
        data = target.read_bytes()
        mutated = mutate_bytes(data, rng)
        target.write_bytes(mutated)
        changed = mutated != data
        if name == MANIFEST_FILE and changed:  # whitespace in the manifest is no change of content
            try:
                changed = json.loads(mutated) != json.loads(data)
            except ValueError:
                pass
        return Case("bundle", str(dst), must_reject=changed, label=f"bytes of {name}")
    if op < 0.6 and PAYLOAD_FILE in files:
        bad = rng.choice(("0{n}.{r}", "{n}..{r}", "{n}.bogus", "9999.{r}", "{n}.{r}.x", "+{n}.{r}", "{n}.{r} "))

        def rename(key: str, first=[True]) -> str:
            if not first[0]:
                return key
            first[0] = False
            n, _, r = key.partition(".")
            return bad.format(n=n, r=r)
        renamed = _rewrite_payload(dst, rename)
        return Case("bundle", str(dst), must_reject=renamed, label=f"payload name {bad}")
    if op < 0.68:
        (dst / rng.choice((PAYLOAD_FILE, ROLES_FILE, "report.json"))).write_text("{}")
        return Case("bundle", str(dst), must_reject=True, label="file replaced without the manifest")
    # a structural change to graph.json or roles.json with the manifest re-recorded: a wire case in a folder
    which = rng.choice((GRAPH_FILE, ROLES_FILE, MANIFEST_FILE))
    if which == MANIFEST_FILE:
        original = json.loads((dst / which).read_text())
        doc = mutate_json(original, rng)
        (dst / which).write_bytes(dumps(doc))
        return Case("bundle", str(dst), must_reject=doc != original, label="manifest structure")
    if not (dst / which).exists():
        return Case("bundle", str(dst), label="unchanged")
    doc = mutate_json(json.loads((dst / which).read_text()), rng)
    (dst / which).write_bytes(dumps(doc))
    _rerecord(dst)
    return Case("bundle", str(dst), label=f"{which} structure")


def mutate_onnx(data: bytes, rng: random.Random) -> bytes:
    """A structural mutation of a serialized model: an attribute's integers, a tensor's or a value
    info's dimensions, an initializer's element type, a node's inputs or the opset set to interesting values."""
    import onnx
    model = onnx.ModelProto()
    model.ParseFromString(data)
    g = model.graph
    for _ in range(rng.randrange(1, 3)):
        op = rng.random()
        ints = list(INTERESTING_INTS) + [0, 1, 2, 3]
        if op < 0.4 and g.node:
            node = rng.choice(g.node)
            attrs = [a for a in node.attribute if a.ints or a.type == onnx.AttributeProto.INT]
            if attrs:
                a = rng.choice(attrs)
                if a.ints:
                    a.ints[rng.randrange(len(a.ints))] = rng.choice(ints) % (1 << 63)
                else:
                    a.i = rng.choice(ints) % (1 << 63)
            else:
                node.attribute.append(onnx.helper.make_attribute(
                    rng.choice(("axis", "group", "kernel_shape", "strides", "pads", "dilations")),
                    rng.choice((rng.choice(ints) % (1 << 63), [rng.choice(ints) % (1 << 63)] * rng.randrange(1, 5)))))
        elif op < 0.6:
            infos = list(g.input) + list(g.output)
            dims = [d for vi in infos for d in vi.type.tensor_type.shape.dim]
            if dims:
                rng.choice(dims).dim_value = rng.choice(ints) % (1 << 63)
        elif op < 0.75 and g.initializer:
            init = rng.choice(g.initializer)
            if init.dims and rng.random() < 0.7:
                init.dims[rng.randrange(len(init.dims))] = rng.choice(ints) % (1 << 63)
            else:
                init.data_type = rng.choice((0, 1, 6, 7, 9, 10, 16, 999))
        elif op < 0.85 and g.node:
            node = rng.choice(g.node)
            node.input.append(rng.choice(list(node.input) + [""]) if node.input else "x")
        elif op < 0.9:
            for imp in model.opset_import:
                imp.version = rng.choice((1, 6, 13, 17, 21, 99, 2 ** 40))
        else:
            return mutate_bytes(model.SerializeToString(), rng)
    return model.SerializeToString()


def onnx_case(models: list[bytes], work: Path, rng: random.Random, index: int, structural: bool = True) -> Case:
    path = work / f"case{index % 64}.onnx"
    seed = rng.choice(models)
    if structural and rng.random() < 0.5:
        path.write_bytes(mutate_onnx(seed, rng))
        return Case("onnx", str(path), label="structure")
    path.write_bytes(mutate_bytes(seed, rng))
    return Case("onnx", str(path), label="bytes")


def checkpoint_case(seeds: list[Path], work: Path, rng: random.Random, index: int) -> Case:
    seed = rng.choice(seeds)
    path = work / f"case{index % 64}{seed.suffix}"
    if seed.suffix == ".json" and rng.random() < 0.6:
        doc = json.loads(seed.read_text())
        if rng.random() < 0.5:
            key = rng.choice(list(doc["meta"]))
            doc["meta"][key]["shape"] = rng.choice(([float("inf")], [1e300, 0], [2 ** 40, 2 ** 40], [-1, 4],
                                                    [True], ["3"], [2 ** 63, 2], None, [[1]]))
        else:
            doc = mutate_json(doc, rng)
        path.write_bytes(dumps(doc))
        return Case("checkpoint", str(path), label="json structure")
    path.write_bytes(mutate_bytes(seed.read_bytes(), rng))
    return Case("checkpoint", str(path), label=f"bytes of {seed.name}")


# -- CLI ----------------------------------------------------------------------------------------------

def cli_fixtures(folder: Path) -> dict[str, str]:
    """Files the CLI invocations refer to: a bundle, a graph, inputs, a checkpoint, a model factory."""
    import numpy as np
    import torchlean_bridge as tlb
    from torchlean_bridge.seed import SEED_X0, seed_mlp_bundle
    folder.mkdir(parents=True, exist_ok=True)
    b = seed_mlp_bundle()
    tlb.save(b, folder / "bundle")
    tlb.export_torchlean(b, folder / "graph.json")
    np.save(folder / "x.npy", np.asarray(SEED_X0))
    from semantics.evaluate import evaluate
    np.save(folder / "y.npy", evaluate(b.graph, b.payload, np.asarray(SEED_X0))[0])
    (folder / "empty.npy").write_bytes(b"")
    np.save(folder / "wrong.npy", np.zeros((7, 7)))
    np.save(folder / "strings.npy", np.array(["a", "b"]))
    from safetensors.numpy import save_file
    key_of = {(bd.node, bd.role): bd.key for bd in b.roles.bindings()}  # the model's own keys
    save_file({key_of[(n, r)]: np.asarray(a) for n, r, a in b.payload.items()},
              str(folder / "w.safetensors"))
    (folder / "model.py").write_text("import torch\n\ndef make():\n    return torch.nn.Sequential(torch.nn.Linear(4, 3), "
                                     "torch.nn.ReLU())\n")
    (folder / "d").mkdir(exist_ok=True)
    return {"bundle": str(folder / "bundle"), "graph": str(folder / "graph.json"), "x": str(folder / "x.npy"),
            "y": str(folder / "y.npy"),
            "empty": str(folder / "empty.npy"), "wrong": str(folder / "wrong.npy"),
            "strings": str(folder / "strings.npy"), "ckpt": str(folder / "w.safetensors"),
            "model": str(folder / "model.py"), "dir": str(folder / "d"), "out": str(folder / "out")}


def cli_base(f: dict[str, str]) -> list[list[str]]:
    return [["check", f["bundle"]], ["check", f["graph"], "--all"], ["show", f["bundle"]],
            ["eval", f["bundle"], "--input", f["x"]], ["eval", f["graph"], "--input", f["x"], "--dtype", "float32"],
            ["bounds", f["bundle"], "--center", f["x"], "--radius", "0.1", "--samples", "3", "--seed", "1"],
            ["abi", f["bundle"]], ["audit", f["bundle"], "--checkpoint", f["ckpt"], "--input", f["x"],
                                   "--golden", f["y"]],
            ["export", f["bundle"], "--to", "torchlean", "-o", f["out"] + ".json"],
            ["import", f["model"] + ":make", "--input-shape", "2,4", "-o", f["out"], "--quiet"]]


CLI_VALUES = ("-1", "0", "10000000000", "1e10", "nan", "inf", "-inf", "", " ", "abc", "1,2,3", "99999999999,99999999",
              "1,-1", "a,b", "2,4:int64", "2,4:complex", "-0", "3.5", "/dev/zero", "/nonexistent/x", ":make")


def cli_case(base: list[list[str]], f: dict[str, str], rng: random.Random) -> Case:
    argv = list(rng.choice(base))
    for _ in range(rng.randrange(1, 3)):
        i = rng.randrange(1, len(argv)) if len(argv) > 1 else 0
        op = rng.random()
        if op < 0.45:
            argv[i] = rng.choice(CLI_VALUES + (f["empty"], f["wrong"], f["strings"], f["dir"], f["graph"], f["ckpt"]))
        elif op < 0.6:
            del argv[i]
        elif op < 0.75:
            argv.insert(i, rng.choice(("--samples", "--seed", "--radius", "--input", "--center", "--input-shape",
                                       "--dtype", "--all-nodes", "--json", "--random", "--tolerance")))
        else:
            argv[i:i] = [rng.choice(("--samples", "--seed", "--random")), rng.choice(CLI_VALUES)]
    return Case("cli", argv, label=" ".join(argv)[:120])


def innermost_project_file(traceback_text: str) -> str:
    """The repository path of the innermost project frame in a traceback ("" if none)."""
    import re
    frames = re.findall(r'File "([^"]+)", line \d+', traceback_text)
    for f in reversed(frames):
        rel = Path(f)
        try:
            rel = rel.resolve().relative_to(ROOT)
        except ValueError:
            continue
        if not str(rel).startswith("fuzz/"):
            return str(rel)
    return ""


def run_cases(worker: Worker, cases: Iterable[Case], on_result: Callable[[Result], None] | None = None) -> Counter:
    counts: Counter = Counter()
    for case in cases:
        result = worker.run(case)
        counts[result.verdict] += 1
        if on_result is not None:
            on_result(result)
    return counts
