"""The options every campaign command shares, and how its report is printed."""

from __future__ import annotations

import argparse
from typing import Any

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
    """The summary on stdout, and its JSON through the CLI's one JSON writer (``-``: stdout alone)."""
    from ..output import emit_json
    emit_json(report.to_json(), json_option)
    if json_option != "-":
        print(report)
