"""The command-line tool as a child process, for the tests that watch a running command or interrupt it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _ctrl_c_reaches_it() -> None:
    """SIGINT back to its default action in the child. A suite started as a background job of a
    non-interactive shell (``cmd &``) inherits SIGINT ignored, Python then installs no KeyboardInterrupt
    handler, and a test's Ctrl-C would never arrive."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def cli_process(*args: str, env: dict[str, str] | None = None, **kw) -> subprocess.Popen:
    """``python -m torchlean_bridge *args`` from the repository root with piped text output; ``env`` adds
    variables to this process's environment (the repository first on PYTHONPATH)."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return subprocess.Popen([sys.executable, "-m", "torchlean_bridge", *args], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=dict(os.environ, PYTHONPATH=path, **(env or {})), preexec_fn=_ctrl_c_reaches_it, **kw)
