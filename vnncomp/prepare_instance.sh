#!/usr/bin/env bash
# VNN-COMP tool interface: prepare_instance.sh v1 BENCHMARK ONNX VNNLIB
# Exit 0 when the network loads and the property parses; otherwise the reason on stderr and exit 1.
# This tool leaves no process running between instances, so there is nothing to clean up here.
# PYTHON names the interpreter of the environment torchlean-bridge is installed in (default python3).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export PYTHONPATH="$HERE/..${PYTHONPATH:+:$PYTHONPATH}"
exec "${PYTHON:-python3}" -m torchlean_bridge.app.campaign.vnncomp prepare "$@"
