"""The options every campaign command shares, and how its report is printed."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ...fileio import atomic_write_text
from .engine import Engine
from .engines import make_engine
from .report import CampaignReport

__all__ = ["add_engine_arguments", "engine_from_args", "emit"]


def add_engine_arguments(p: argparse.ArgumentParser) -> None:
    """``--workers``, ``--engine``, ``--ray-address`` (shared by the commands that run campaigns)."""
    p.add_argument("--workers", type=int, metavar="N",
                   help="campaign: parallel workers (default: the cores here; with ray, the cluster's CPUs)")
    p.add_argument("--engine", choices=("local", "ray"), default="local",
                   help="campaign: local process pool (default) or Ray (pip install 'torchlean-bridge[distributed]')")
    p.add_argument("--ray-address", metavar="ADDR",
                   help="campaign with --engine ray: the cluster to join (default: start Ray on this machine)")


def engine_from_args(args: argparse.Namespace) -> Engine:
    return make_engine(args.engine, args.workers, args.ray_address)


def emit(report: CampaignReport, json_option: Any) -> None:
    """The summary on stdout, or its JSON (``--json`` as a flag or ``-``: stdout; a path: that file)."""
    if json_option is True or json_option == "-":
        print(json.dumps(report.to_json(), allow_nan=False))
        return
    print(report)
    if json_option:
        atomic_write_text(Path(json_option), json.dumps(report.to_json(), allow_nan=False, indent=1) + "\n")
