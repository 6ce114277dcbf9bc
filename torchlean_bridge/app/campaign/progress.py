"""Campaign progress on a terminal: done / total, solved, rate and ETA; silent when piped."""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from typing import Callable, Iterator

__all__ = ["campaign_progress"]


@contextmanager
def campaign_progress(total: int, description: str, quiet: bool = False, solved_label: str = "solved"
                      ) -> Iterator[Callable[[bool], None]]:
    """Yields ``advance(solved)``, called once per finished task of the ``total`` this run does;
    ``solved_label`` names what the second count counts (a diff campaign's batches without divergence)."""
    if quiet or total == 0 or not sys.stderr.isatty():
        yield lambda solved: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
    start = time.monotonic()
    counts = {"done": 0, "solved": 0}
    with Progress(TextColumn("{task.description}"), BarColumn(),
                  TextColumn("{task.completed:.0f}/{task.total:.0f} done, {task.fields[solved]} " + solved_label + ", "
                             "{task.fields[rate]}"), TextColumn("ETA"), TimeRemainingColumn(),
                  transient=True, console=Console(stderr=True)) as bar:
        task = bar.add_task(description, total=total, solved=0, rate="")

        def advance(solved: bool) -> None:
            counts["done"] += 1
            counts["solved"] += int(solved)
            per_min = counts["done"] / max(time.monotonic() - start, 1e-9) * 60
            bar.update(task, advance=1, solved=counts["solved"], rate=f"{per_min:.1f}/min")

        yield advance
