"""VNN-COMP's ``instances.csv``: one ``onnx,vnnlib,timeout`` row per instance, paths relative to the file.

A row that cannot run (wrong number of fields, a timeout that is not a positive number of seconds,
a file that is missing) is kept with its ``problem``: the campaign records it as an ``error`` row
with that reason and runs the others.
"""

from __future__ import annotations

import csv
import io
import math
import os
from dataclasses import dataclass
from pathlib import Path

from ...errors import BridgeError
from ...fileio import read_capped

__all__ = ["Instance", "read_instances", "MAX_INSTANCES_BYTES"]

MAX_INSTANCES_BYTES = 64 << 20


@dataclass(frozen=True)
class Instance:
    line: int  # 1-based line of the instances file
    onnx: str  # as written in the file
    vnnlib: str
    timeout: float | None
    onnx_path: str = ""  # resolved against the file's folder
    vnnlib_path: str = ""
    problem: str = ""  # why the row cannot run ("" when it can)


def _file_problem(path: str, written: str, what: str) -> str:
    if not written:
        return f"no {what} path"
    if not os.path.exists(path):
        return f"{what} file {written} not found (looked for {path})"
    if not os.path.isfile(path) and not (what == "onnx" and os.path.isdir(path)):
        return f"{what} {written} is not a regular file"
    return ""


def read_instances(path: str | os.PathLike) -> list[Instance]:
    """The rows of an instances file, in order (blank lines skipped)."""
    path = Path(path)
    data = read_capped(path, "instances file", MAX_INSTANCES_BYTES)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise BridgeError(f"--instances {path}: not a UTF-8 CSV file") from None
    base = path.resolve().parent
    out: list[Instance] = []
    reader = csv.reader(io.StringIO(text))
    try:
        for row in reader:
            line = reader.line_num
            fields = [f.strip() for f in row]
            if not any(fields):
                continue
            if len(fields) != 3:
                out.append(Instance(line, fields[0], fields[1] if len(fields) > 1 else "", None,
                                    problem=f"{path.name} line {line}: expected 3 fields (onnx, vnnlib, timeout), "
                                            f"got {len(fields)}"))
                continue
            onnx, vnnlib, raw_timeout = fields
            onnx_path, vnnlib_path = str(base / onnx), str(base / vnnlib)
            try:
                timeout: float | None = float(raw_timeout)
            except ValueError:
                timeout = None
            problem = ""
            if timeout is None or not math.isfinite(timeout) or timeout <= 0:
                problem = f"{path.name} line {line}: timeout {raw_timeout!r} is not a positive number of seconds"
                timeout = None
            problem = problem or _file_problem(onnx_path, onnx, "onnx") or _file_problem(vnnlib_path, vnnlib, "vnnlib")
            out.append(Instance(line, onnx, vnnlib, timeout, onnx_path, vnnlib_path, problem))
    except csv.Error as e:
        raise BridgeError(f"--instances {path}: line {reader.line_num}: {e}") from None
    return out
