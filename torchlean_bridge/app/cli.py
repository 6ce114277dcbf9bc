"""The command line: one module per command under ``torchlean_bridge/app/commands``.

Exit status: 0 success, 1 a check failed (invalid graph, divergence, audit finding), 2 bad usage
or unreadable input.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import warnings
from contextlib import contextmanager
from importlib import import_module
from typing import Iterator, Sequence

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


def _version() -> str:
    """This library's version and the versions of what it runs on (read from metadata, not imported)."""
    from importlib.metadata import PackageNotFoundError, version
    from .. import __version__
    parts = [f"python {sys.version.split()[0]}"]
    for dist in ("numpy", "onnx", "onnxruntime", "torch"):
        try:
            parts.append(f"{dist} {version(dist)}")
        except PackageNotFoundError:
            parts.append(f"{dist} not installed")
    return f"torchlean-bridge {__version__} ({', '.join(parts)})"


class _Version(argparse.Action):
    """``--version``: one unwrapped line (argparse's own action wraps it to the help width)."""

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        print(_version())
        parser.exit()


class _TrialFailed(Exception):
    pass


class _CommandParser(argparse.ArgumentParser):
    """A command's parser: ``--json``'s optional value is settled first (``output.json_argv``). A word
    ending in .json after ``--json`` is its file unless, read as a positional argument instead, it
    fills more of the command's positionals and leaves no word over (``check --json graph.json``
    checks graph.json; ``diff BUNDLE --json r.json`` writes r.json)."""

    _trial = False

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        from .output import JSON_FLAG, json_argv
        if args is None or JSON_FLAG not in self._option_string_actions:
            return super().parse_known_args(args, namespace)
        args, options = list(args), list(self._option_string_actions)
        taking, plain = json_argv(args, options), json_argv(args, options, take_files=False)
        if taking != plain:
            took, kept = self._try(taking), self._try(plain)
            if took is not None and not (kept is not None and not kept[1]
                                         and self._filled_positionals(kept[0]) > self._filled_positionals(took[0])):
                return super().parse_known_args(taking, namespace)
        return super().parse_known_args(plain, namespace)

    def _try(self, args: list[str]) -> tuple[argparse.Namespace, list[str]] | None:
        """The parse of ``args`` without printing or exiting (None: it fails)."""
        self._trial = True
        try:
            return super().parse_known_args(list(args), None)
        except _TrialFailed:
            return None
        finally:
            self._trial = False

    def _filled_positionals(self, ns: argparse.Namespace) -> int:
        return sum(getattr(ns, a.dest, None) not in (None, []) for a in self._actions if not a.option_strings
                   and not isinstance(a, argparse._SubParsersAction))

    def error(self, message: str):  # type: ignore[override]
        if self._trial:
            raise _TrialFailed(message)
        super().error(message)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="torchlean-bridge",
        description="Import PyTorch/ONNX models into TorchLean's graph IR; validate, evaluate, bound, "
                    "export and differential-test them.")
    parser.add_argument("--version", action=_Version, nargs=0, help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_CommandParser)
    parser.set_defaults(_commands={})
    for name, module in COMMANDS.items():
        try:
            mod = import_module(f".commands.{module}", __package__)
        except ModuleNotFoundError as e:
            if e.name and e.name.endswith(f"commands.{module}"):
                continue  # command not built yet
            raise
        p = sub.add_parser(name, help=mod.HELP, description=getattr(mod, "DESCRIPTION", mod.HELP))
        mod.add_arguments(p)
        _common_options(p)
        p.set_defaults(_run=mod.run)
        parser.get_default("_commands")[name] = p
    return parser


def _common_options(p: argparse.ArgumentParser) -> None:
    """--quiet and --verbose on every command (a command may define --quiet itself)."""
    opts = {o for a in p._actions for o in a.option_strings}
    if "--quiet" not in opts:
        p.add_argument("--quiet", action="store_true", help="no progress display")
    p.add_argument("--verbose", action="store_true",
                   help="show the warnings libraries raise (numpy, torch, onnx); hidden by default")


@contextmanager
def _quiet_logging(quiet: bool) -> Iterator[None]:
    """Libraries' log records below ERROR (torch's graph dumps and notices) stay off stderr unless
    --verbose."""
    if not quiet:
        yield
        return
    before = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(before)


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # the subcommand's usage, not the top level's
        sub = parser.get_default("_commands").get(args.command)
        (sub or parser).error(f"unrecognized arguments: {' '.join(extra)}")
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    from .output import json_owns_stdout
    try:
        with json_owns_stdout(args), warnings.catch_warnings(), _quiet_logging(not args.verbose):
            if not args.verbose:
                warnings.simplefilter("ignore")
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
