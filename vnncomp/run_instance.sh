#!/usr/bin/env bash
# VNN-COMP tool interface: run_instance.sh v1 BENCHMARK ONNX VNNLIB RESULT_FILE TIMEOUT
# Writes RESULT_FILE: sat (with the counterexample), unsat, unknown, timeout or error.
# PYTHON names the interpreter of the environment torchlean-bridge is installed in (default python3).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export PYTHONPATH="$HERE/..${PYTHONPATH:+:$PYTHONPATH}"
exec "${PYTHON:-python3}" -m torchlean_bridge.app.campaign.vnncomp run "$@"
