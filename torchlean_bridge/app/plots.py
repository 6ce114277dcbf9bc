"""Plots for people who would rather look than read: interval widths per node (``bounds --plot``) and
differential error against budget per node (``diff --plot``).

matplotlib is an optional extra (``pip install 'torchlean-bridge[plot]'``); it is imported only here,
through its object API (no pyplot state, no display backend), and the image is written atomically.
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import BridgeError
from .output import box_stats

__all__ = ["check_target", "plot_widths", "plot_diff", "FORMATS"]

FORMATS = ("png", "svg", "pdf")
_MAX_LABELLED = 60  # nodes up to this many get their op under the axis


def check_target(path: str, option: str = "--plot") -> str:
    """The image format of ``path``; BridgeError for another suffix or when matplotlib is missing.
    Commands call it before their work, so nobody waits for bounds to learn that."""
    fmt = Path(path).suffix.lower().lstrip(".")
    if fmt not in FORMATS:
        raise BridgeError(f"{option} {path}: the file name must end in {', '.join('.' + f for f in FORMATS)}")
    try:
        import matplotlib.figure  # noqa: F401
    except ImportError:
        raise BridgeError(f"{option} needs matplotlib, which is not installed: pip install 'torchlean-bridge[plot]' "
                          "(or pip install matplotlib)") from None
    return fmt


def _figure(path: str, option: str) -> tuple[Any, str]:
    fmt = check_target(path, option)
    from matplotlib.figure import Figure
    return Figure(figsize=(10, 4.5), layout="constrained"), fmt


def _save(fig: Any, fmt: str, path: str) -> None:
    from ..fileio import atomic_write_bytes
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt, dpi=120, metadata={"Software": None} if fmt == "png" else None)
    atomic_write_bytes(path, buf.getvalue())


def _label_nodes(ax: Any, ids: list[int], kinds: list[str]) -> None:
    if len(ids) <= _MAX_LABELLED:
        ax.set_xticks(ids, [f"{i} {k}" for i, k in zip(ids, kinds)], rotation=90, fontsize=7)
    ax.set_xlabel("node")


def plot_widths(g: Any, boxes: Any, path: str, title: str) -> dict[str, int]:
    """Max and mean box width per node on a log axis; nodes whose box is a point (constants, integer
    values, zero radius) cannot sit on a log axis and are counted in the legend instead."""
    fig, fmt = _figure(path, "--plot")
    ax = fig.add_subplot()
    ids, kinds, mx, mean = [], [], [], []
    for n in g:
        s = box_stats(*boxes[n.id])
        ids.append(n.id)
        kinds.append(n.kind)
        mx.append(s["width_max"] if s["width_max"] is not None else math.nan)
        mean.append(s["width_mean"] if s["width_mean"] is not None else math.nan)
    mx_a, mean_a = np.asarray(mx, dtype=np.float64), np.asarray(mean, dtype=np.float64)
    shown = np.isfinite(mx_a) & (mx_a > 0)
    points = int(np.sum(~shown))
    idx = np.asarray(ids)
    ax.semilogy(idx[shown], mx_a[shown], "o-", label="max width")
    keep = shown & (mean_a > 0)
    ax.semilogy(idx[keep], mean_a[keep], "s--", alpha=0.7, label="mean width")
    if points:
        ax.plot([], [], " ", label=f"{points} node(s) with point boxes not shown")
    _label_nodes(ax, ids, kinds)
    ax.set_ylabel("box width (log scale)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    _save(fig, fmt, path)
    return {"plotted": int(np.sum(shown)), "points": points}


def plot_diff(report: Any, path: str) -> dict[str, int | None]:
    """Error / budget per compared node on a log axis, the budget line at 1, the first divergence
    marked; nodes without a counterpart are left out (counted in the legend)."""
    fig, fmt = _figure(path, "--plot")
    ax = fig.add_subplot()
    rows = [r for r in report.nodes if r.status != "no counterpart"]
    ids = [r.node for r in rows]
    tiny = 2.0 ** -30  # an exact match sits at the floor of the log axis
    ratios = np.array([min(max(r.worst_ratio, tiny), 1e30) for r in rows], dtype=np.float64)
    colors = ["tab:red" if r.status == "diverged" else "tab:orange" if r.status == "downstream" else "tab:blue"
              for r in rows]
    ax.bar(ids, ratios, color=colors, bottom=tiny)
    ax.set_yscale("log")
    ax.axhline(1.0, color="black", linewidth=1, label="budget (error = budget)")
    first = report.first_divergence
    marked = first.node if first is not None and first.node is not None and first.node in ids else None
    if marked is not None:
        y = ratios[ids.index(first.node)]
        ax.annotate(f"first divergence: node {first.node}", (first.node, y), xytext=(0, 18),
                    textcoords="offset points", ha="center", color="tab:red",
                    arrowprops={"arrowstyle": "->", "color": "tab:red"})
    skipped = len(report.nodes) - len(rows)
    if skipped:
        ax.plot([], [], " ", label=f"{skipped} node(s) without a counterpart not shown")
    _label_nodes(ax, ids, [r.op for r in rows])
    ax.set_ylabel("max error / budget (log scale)")
    ax.set_title(report.title)
    ax.grid(True, which="both", axis="y", alpha=0.3)
    ax.legend()
    _save(fig, fmt, path)
    return {"plotted": len(rows), "skipped": skipped, "marked": marked}
