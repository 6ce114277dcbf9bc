"""The command line: one module per command under ``torchlean_bridge/app/commands``.

Exit status: 0 success, 1 a check failed (invalid graph, divergence, audit finding), 2 bad usage
or unreadable input.
"""

from __future__ import annotations

import argparse
import os
import sys
from importlib import import_module
from typing import Sequence

from ..errors import BridgeError, CheckFailed

__all__ = ["main", "COMMANDS"]

# command name -> module in torchlean_bridge.app.commands (each defines HELP, add_arguments, run)
COMMANDS = {
    "demo": "demo",
    "import": "import_model",
    "check": "check",
    "show": "show",
    "eval": "eval",
    "bounds": "bounds",
    "export": "export",
    "abi": "abi",
    "audit": "audit",
    "diff": "diff",
    "plan": "plan",
    "init": "init",
    "verify": "verify",
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="torchlean-bridge",
        description="Import PyTorch/ONNX models into TorchLean's graph IR; validate, evaluate, bound, "
                    "export and differential-test them.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module in COMMANDS.items():
        try:
            mod = import_module(f".commands.{module}", __package__)
        except ModuleNotFoundError as e:
            if e.name and e.name.endswith(f"commands.{module}"):
                continue  # command not built yet
            raise
        p = sub.add_parser(name, help=mod.HELP, description=getattr(mod, "DESCRIPTION", mod.HELP))
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    from .output import json_owns_stdout
    try:
        with json_owns_stdout(args):
            return int(args._run(args) or 0)
    except BridgeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1 if isinstance(e, CheckFailed) else 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader (e.g. `| head`) went away: stop quietly, as Unix tools do
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return 0
    except OSError as e:  # the file system said no (permissions, disk full, a folder in the way)
        print(f"error: {e}", file=sys.stderr)
        return 2
