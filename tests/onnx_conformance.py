"""onnx's backend test suite (onnx.backend.test.BackendTest) through torchlean_bridge.onnx_backend.

Every CPU case of the installed onnx's suites is run once; each result is compared with the
expected-failures file (``onnx_expected_failures.txt`` beside this module: a test-name pattern, a
reason category and a note per line). A failure that no entry lists, and a listed case that passes,
are both errors, so the list cannot go stale. ``python tests/onnx_conformance.py`` runs the suite and
writes docs/onnx-conformance.md from the results.
"""

from __future__ import annotations

import io
import re
import sys
import time
import traceback
import unittest
import warnings
from contextlib import redirect_stdout
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXPECTED_FILE = Path(__file__).with_name("onnx_expected_failures.txt")
DOC = ROOT / "docs" / "onnx-conformance.md"

SUITES = {"NodeModel": "node", "SimpleModel": "simple", "PyTorchConvertedModel": "pytorch-converted",
          "PyTorchOperatorModel": "pytorch-operator", "RealModel": "light"}

# reason categories an expected failure may give
CATEGORIES = {
    "string": "string tensors (no string element type in the IR)",
    "complex": "complex tensors",
    "float8": "float8 / float4 / float6 element types",
    "int4": "int4 / uint4 / int2 / uint2 element types",
    "float16": "float16 / bfloat16 tensors (supported since issue #15: docs/element-types.md)",
    "integer": "integer arithmetic (the IR's arithmetic ops compute on float tensors)",
    "training": "training ops and training-mode attributes",
    "sequence": "sequence, optional or map types",
    "domain": "ai.onnx.ml, ai.onnx.preview.training or another non-default domain",
    "random": "random generators (no deterministic reference)",
    "control-flow": "If, Loop, Scan (subgraphs)",
    "quantized": "quantization ops (QuantizeLinear, QLinear*, ...)",
    "op": "op without a handler (see issue #15)",
    "mode": "an attribute value, mode or form of a supported op that is not lowered exactly",
    "dynamic": "values that must be known at import time are computed from graph inputs",
    "shape": "shapes our rules reject or onnx and we disagree on (empty tensors, ...)",
    "precision": "results outside the suite's tolerance because of binary32 evaluation order",
    "numeric": "a float semantics difference at special values (NaN, inf, signed zero, rounding ties)",
    "undefined": "the case feeds values for which ONNX leaves the result undefined (refused by name; the suite "
                 "encodes one implementation's choice)",
    "mixed-precision": "casts between float32 and float64 inside the computation (the evaluator computes one "
                       "float precision per model)",
}


@dataclass(frozen=True)
class Result:
    name: str
    suite: str
    passed: bool
    message: str
    seconds: float


@dataclass(frozen=True)
class Expected:
    pattern: re.Pattern
    category: str
    note: str


def read_expected(path: Path = EXPECTED_FILE) -> list[Expected]:
    """The expected-failures entries: ``pattern  category  note``, '#' comments, blank lines."""
    entries = []
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        parts = line.split(None, 2)
        if len(parts) < 2 or parts[1] not in CATEGORIES:
            raise ValueError(f"{path.name}:{lineno}: expected `pattern category note`, category one of "
                             f"{sorted(CATEGORIES)}: {line!r}")
        entries.append(Expected(re.compile(parts[0]), parts[1], parts[2] if len(parts) > 2 else ""))
    return entries


def expected_entry(name: str, entries: list[Expected]) -> Expected | None:
    for e in entries:
        if e.pattern.fullmatch(name):
            return e
    return None


def _runner():
    import onnx.backend.test

    from torchlean_bridge.onnx_backend import TorchLeanBackend
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return onnx.backend.test.BackendTest(TorchLeanBackend, __name__)


def run_suite(only: str | None = None) -> list[Result]:
    """Every CPU case (names without the ``_cpu`` suffix), optionally only names matching ``only``."""
    runner = _runner()
    results = []
    for category, items in runner._test_items.items():
        suite = SUITES.get(category, category)
        for full_name, item in sorted(items.items()):
            if not full_name.endswith("_cpu"):
                continue
            name = full_name[:-len("_cpu")]
            if only and not re.search(only, name):
                continue
            start = time.perf_counter()
            try:
                with warnings.catch_warnings(), redirect_stdout(io.StringIO()):
                    warnings.simplefilter("ignore")
                    item.func(None)
                passed, message = True, ""
            except unittest.SkipTest as e:
                passed, message = False, f"skipped: {e}"
            except Exception as e:  # noqa: BLE001 - a case's failure is its result
                passed, message = False, _describe(e)
            results.append(Result(name, suite, passed, message, time.perf_counter() - start))
    return results


def _describe(e: BaseException) -> str:
    from torchlean_bridge.errors import BridgeError
    if isinstance(e, (BridgeError, AssertionError)):
        text = str(e)
    else:  # not a refusal: a bug or an unclear message, keep where it came from
        tb = traceback.extract_tb(e.__traceback__)
        where = next((f"{Path(f.filename).name}:{f.lineno}" for f in reversed(tb)
                      if "torchlean" in f.filename or "/importers/" in f.filename or "/semantics/" in f.filename), "")
        text = f"{type(e).__name__}: {e} [{where}]"
    return " ".join(text.split())[:400]


def compare(results: list[Result], entries: list[Expected]) -> tuple[list[Result], list[Result]]:
    """(failures no entry lists, listed cases that pass)."""
    unexpected = [r for r in results if not r.passed and expected_entry(r.name, entries) is None]
    stale = [r for r in results if r.passed and expected_entry(r.name, entries) is not None]
    return unexpected, stale


def render(results: list[Result], entries: list[Expected]) -> str:
    import onnx
    suites = sorted({r.suite for r in results}, key=list(SUITES.values()).index)
    total_time = sum(r.seconds for r in results)
    lines = ["# ONNX conformance", "",
             f"onnx {onnx.__version__}'s backend test suite (`onnx.backend.test.BackendTest`) run through",
             "`torchlean_bridge.onnx_backend` (import with `tlb.import_onnx`, evaluation with `tlb.evaluate` in the",
             "model's declared precision; steering inputs such as shapes, axes and pads bound at import).",
             "Generated by `python tests/onnx_conformance.py`; CI runs the same cases in",
             "`tests/test_onnx_backend.py` against `tests/onnx_expected_failures.txt`: a failure without an",
             "entry, or an entry whose case passes, fails the run.", "",
             "| suite | cases | pass | expected failures |", "|---|---:|---:|---:|"]
    for s in suites:
        rs = [r for r in results if r.suite == s]
        ok = sum(r.passed for r in rs)
        lines.append(f"| {s} | {len(rs)} | {ok} | {len(rs) - ok} |")
    ok = sum(r.passed for r in results)
    lines += [f"| **all** | {len(results)} | {ok} | {len(results) - ok} |", "",
              f"Wall time of the run: {total_time:.0f} s (one core).", "", "## Failures by reason", "",
              "| category | meaning | cases |", "|---|---|---:|"]
    by_cat: dict[str, list[Result]] = {}
    for r in results:
        if not r.passed:
            e = expected_entry(r.name, entries)
            by_cat.setdefault(e.category if e else "(unlisted)", []).append(r)
    for cat in sorted(by_cat, key=lambda c: -len(by_cat[c])):
        lines.append(f"| {cat} | {CATEGORIES.get(cat, 'not in the expected-failures file')} | {len(by_cat[cat])} |")
    lines += ["", "## Every failing case", "", "| case | suite | category | note |", "|---|---|---|---|"]
    for r in sorted((r for r in results if not r.passed), key=lambda r: r.name):
        e = expected_entry(r.name, entries)
        note = (e.note if e and e.note else r.message)[:160].replace("|", "\\|")
        lines.append(f"| {r.name} | {r.suite} | {e.category if e else '(unlisted)'} | {note} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    only = argv[1] if len(argv) > 1 and not argv[1].startswith("-") else None
    results = run_suite(only)
    entries = read_expected()
    unexpected, stale = compare(results, entries)
    for r in unexpected:
        print(f"UNLISTED FAILURE {r.suite} {r.name}: {r.message}")
    for r in stale:
        print(f"LISTED BUT PASSES {r.suite} {r.name}")
    print(f"{sum(r.passed for r in results)} of {len(results)} pass; {len(unexpected)} unlisted failures, "
          f"{len(stale)} stale entries; {sum(r.seconds for r in results):.0f} s")
    if only is None and "--no-doc" not in argv:
        DOC.write_text(render(results, entries))
        print(f"wrote {DOC.relative_to(ROOT)}")
    return 1 if unexpected or stale else 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main(sys.argv))
