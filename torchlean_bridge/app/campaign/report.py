"""A campaign's report: its rows, counts per result, and one finding per row that went wrong."""

from __future__ import annotations

from collections import Counter
from typing import Any, Sequence

from ...report import Report

__all__ = ["CampaignReport"]


class CampaignReport(Report):
    """``rows`` (dicts, one per task, earlier runs' included), ``counts`` by ``status_field``, timing."""

    def __init__(self, title: str, columns: Sequence[str], status_field: str, order: Sequence[str]) -> None:
        super().__init__([], title)
        self.columns, self.status_field, self.order = list(columns), status_field, list(order)
        self.rows: list[dict[str, Any]] = []
        self.ran = 0  # tasks this run executed (the others were in the results file already)
        self.skipped = 0
        self.wall_s = 0.0
        self.engine = ""
        self.workers = 0

    @property
    def counts(self) -> dict[str, int]:
        c = Counter(r[self.status_field] for r in self.rows)
        return {k: c[k] for k in self.order if c[k]} | {k: v for k, v in c.items() if k not in self.order}

    def _extra_json(self) -> dict:
        return {"engine": self.engine, "workers": self.workers, "total": len(self.rows), "ran": self.ran,
                "resumed": self.skipped, "wall_s": round(self.wall_s, 6), "counts": self.counts, "rows": self.rows}

    def __str__(self) -> str:
        head = (f"{self.title}: {len(self.rows)} row(s), {self.ran} run now on {self.engine} "
                f"({self.workers} worker(s)) in {self.wall_s:.2f} s, {self.skipped} already in the results")
        width = max([len(k) for k in self.counts] + [6])
        lines = [head, f"  {'result':<{width}}  count"]
        lines += [f"  {k:<{width}}  {v:5d}" for k, v in self.counts.items()]
        for f in self.findings[:20]:
            lines.append(f"  [{f.severity}] {f.message}")
        if len(self.findings) > 20:
            lines.append(f"  ... and {len(self.findings) - 20} more (see the results file)")
        return "\n".join(lines)
