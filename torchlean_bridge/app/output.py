"""The command line's one rendering layer: numbers, tensors, statistics, tables and JSON documents.

Commands build plain data (values, boxes, report objects) and hand it here, so that every command
prints numbers the same way: tensors numpy-style (truncated with their shape kept unless ``--full``),
one line per node for whole-graph views, tables sized to the terminal, and ``--json [FILE|-]``
written to a file atomically or to stdout for ``-``.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import shutil
import sys
from contextlib import contextmanager, redirect_stdout
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Sequence

import numpy as np

from ..report import jsonable

__all__ = ["add_json_argument", "add_view_arguments", "format_number", "format_tensor", "format_shape",
           "Stats", "stats", "box_stats", "value_text", "values_table", "box_text", "box_summary",
           "boxes_table", "shown_nodes", "Table", "terminal_width", "format_short", "abi_table", "plan_table", "diff_table", "diff_text", "json_text", "emit_json", "json_owns_stdout", "human_output",
           "SUMMARY_ELEMENTS", "json_argv", "JSON_HELP"]

SUMMARY_ELEMENTS = 16  # a tensor of at most this many elements is printed whole on one line
_DIGITS = 6


# -- arguments ------------------------------------------------------------------------------------

JSON_HELP = ("`--json` alone or `--json -`: on stdout, replacing the text; `--json FILE.json` (a name ending in "
             ".json): written to that file, the text still printed; any other name only as `--json=FILE`. A "
             "name after --json that the command needs as its positional argument is that argument")


def add_json_argument(p: Any, what: str = "the result") -> None:
    """``--json [FILE.json|-]`` (on a parser or an argument group). The value is optional, so which
    word after ``--json`` is its value is decided before argparse sees it (``json_argv``): a bare
    ``--json`` must never read the command's positional (``eval --json BUNDLE``) as its output file."""
    p.add_argument("--json", nargs="?", const="-", metavar="FILE.json|-", help=f"{what} as JSON. {JSON_HELP}")


JSON_FLAG = "--json"


def _json_spelling(token: str, options: Iterable[str]) -> bool:
    """Whether ``token`` is ``--json`` or an abbreviation argparse would expand to it alone."""
    if token == JSON_FLAG:
        return True
    return (len(token) > 2 and JSON_FLAG.startswith(token)
            and not any(o != JSON_FLAG and o.startswith(token) for o in options))


def json_argv(argv: Sequence[str], options: Iterable[str], take_files: bool = True) -> list[str]:
    """``argv`` with every ``--json`` spelled with its value, ``--json=VALUE``: ``-`` when alone; the
    next word when it is ``-`` or (``take_files``) ends in ``.json``; ``--json=VALUE`` as given.
    Words after ``--`` are left alone."""
    options = list(options)
    out: list[str] = []
    k = 0
    while k < len(argv):
        token = argv[k]
        if token == "--":
            out.extend(argv[k:])
            break
        if _json_spelling(token, options):
            nxt = argv[k + 1] if k + 1 < len(argv) else None
            if nxt == "-" or (take_files and nxt is not None and nxt.lower().endswith(".json")
                              and not nxt.startswith("-")):
                out.append(f"{JSON_FLAG}={nxt}")
                k += 2
                continue
            out.append(f"{JSON_FLAG}=-")
        else:
            out.append(token)
        k += 1
    return out


def add_view_arguments(p: argparse.ArgumentParser) -> None:
    """The views of node values shared by ``eval`` and ``bounds``."""
    p.add_argument("--all-nodes", action="store_true",
                   help="one line per node (id, op, shape and statistics), not just the outputs")
    p.add_argument("--full", action="store_true", help="print the shown tensors whole, untruncated")
    p.add_argument("--node", metavar="ID", type=int, action="append", default=[],
                   help="print this node's tensor (repeat the option); with --full untruncated")


def human_output(args: argparse.Namespace) -> bool:
    """Whether the terminal text goes to stdout (not when ``--json -`` owns it)."""
    return getattr(args, "json", None) != "-"


# -- numbers and tensors --------------------------------------------------------------------------

def format_number(v: Any, digits: int = _DIGITS) -> str:
    """Six decimals in the seed chapters' style where that shows the value; exponent form for values
    too small or too large for it (never ``-0.000000`` for a tiny negative bound); integers exactly."""
    if isinstance(v, (bool, np.bool_)):
        return "true" if v else "false"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    f = float(v)
    if not math.isfinite(f):
        return "nan" if math.isnan(f) else ("inf" if f > 0 else "-inf")
    if f == 0:
        return f"{0.0:.{digits}f}"
    if 10 ** -(digits - 2) <= abs(f) < 1e9:
        return f"{f:.{digits}f}"
    return f"{f:.{digits}e}"


def format_short(v: float | None) -> str:
    """Three significant digits, for error figures and budgets in tables."""
    if v is None:
        return "-"
    f = float(v)
    if f == 0:
        return "0"
    if not math.isfinite(f):
        return "nan" if math.isnan(f) else ("inf" if f > 0 else "-inf")
    return f"{f:.3g}" if 1e-3 <= abs(f) < 1e4 else f"{f:.2e}"


def format_shape(shape: Iterable[int]) -> str:
    return "[" + ", ".join(str(int(d)) for d in shape) + "]"


def _edgeitems(ndim: int) -> int:
    return 3 if ndim <= 1 else 2 if ndim == 2 else 1


def format_tensor(a: Any, full: bool = False, width: int | None = None) -> str:
    """numpy's array printing with our number format: whole when small or ``full``, otherwise the
    first and last items of every long axis with ``...`` between (rows on separate lines)."""
    arr = np.asarray(a)
    if arr.ndim == 0:
        return format_number(arr.item())
    if full:
        threshold, line = sys.maxsize, sys.maxsize
    else:
        threshold, line = SUMMARY_ELEMENTS, width or terminal_width()
    kind = "int_kind" if arr.dtype.kind in "iu" else "bool" if arr.dtype.kind == "b" else "float_kind"
    text = np.array2string(arr, separator=", ", threshold=threshold, edgeitems=_edgeitems(arr.ndim),
                           max_line_width=line, formatter={kind: format_number})
    return text if full else "\n".join(s for s in text.splitlines() if s.strip())


@dataclass(frozen=True)
class Stats:
    """min / max / mean of the finite entries, and how many entries are not finite."""

    min: float | None
    max: float | None
    mean: float | None
    nonfinite: int
    size: int

    def to_json(self) -> dict[str, Any]:
        return {"min": self.min, "max": self.max, "mean": self.mean, "nonfinite": self.nonfinite}

    def cells(self) -> list[str]:
        if self.min is None:
            return ["-", "-", "-"]
        return [format_number(self.min), format_number(self.max), format_number(self.mean)]

    def text(self) -> str:
        if self.min is None:
            return "no finite entries" if self.size else "empty"
        extra = f", {self.nonfinite} not finite" if self.nonfinite else ""
        return f"min {format_number(self.min)}, max {format_number(self.max)}, mean {format_number(self.mean)}{extra}"


def stats(a: Any) -> Stats:
    arr = np.asarray(a)
    if arr.dtype.kind == "b":
        arr = arr.astype(np.int64)
    flat = arr.reshape(-1)
    if flat.dtype.kind == "f":
        finite = flat[np.isfinite(flat)]
    else:
        finite = flat
    if finite.size == 0:
        return Stats(None, None, None, int(flat.size), int(flat.size))
    return Stats(float(finite.min()), float(finite.max()), float(finite.mean(dtype=np.float64)),
                 int(flat.size - finite.size), int(flat.size))


def box_stats(lo: Any, hi: Any) -> dict[str, float | None]:
    """The box's range (least lower, greatest upper bound) and its widths (min, mean, max)."""
    lo64, hi64 = np.asarray(lo, dtype=np.float64).reshape(-1), np.asarray(hi, dtype=np.float64).reshape(-1)
    if lo64.size == 0:
        return {"lo_min": None, "hi_max": None, "width_min": None, "width_mean": None, "width_max": None}
    with np.errstate(invalid="ignore", over="ignore"):
        w = hi64 - lo64
    return {"lo_min": float(lo64.min()), "hi_max": float(hi64.max()), "width_min": float(w.min()),
            "width_mean": float(w.mean()), "width_max": float(w.max())}


# -- node views (eval, bounds) -------------------------------------------------------------------

def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())


def _one_line(arr: np.ndarray) -> str:
    """A small tensor whole on one line, nested rows included."""
    return " ".join(line.strip() for line in format_tensor(arr, full=True).splitlines())


def _head(g: Any, nid: int) -> str:
    n = g[nid]
    return f"node {nid} ({n.kind}) {format_shape(n.out_shape)}"


def value_text(g: Any, nid: int, value: Any, full: bool = False) -> str:
    """One node's value: ``node ID: VALUE`` when small or ``full``, else a header with its shape and
    statistics followed by the truncated tensor."""
    arr = np.asarray(value)
    if arr.size <= SUMMARY_ELEMENTS:
        return f"node {nid}: {_one_line(arr)}"
    if full:
        return f"node {nid}: {format_tensor(arr, full=True)}"
    return f"{_head(g, nid)}: {stats(arr).text()}\n{_indent(format_tensor(arr, width=terminal_width() - 2))}"


def values_table(g: Any, table: Any, ids: Iterable[int]) -> str:
    """One line per node: id, op, shape, element type and min / max / mean."""
    t = Table(["node", "op", "shape", "type", "min", "max", "mean"], numeric=["node", "min", "max", "mean"])
    for i in ids:
        t.add(str(i), g[i].kind, format_shape(g[i].out_shape), g[i].dtype, *stats(table[i]).cells())
    return t.render()


def box_text(g: Any, nid: int, lo: Any, hi: Any, full: bool = False) -> str:
    """One node's box: ``node ID: LO .. HI`` when small or ``full``, else its range and width
    statistics followed by both truncated bounds."""
    lo, hi = np.asarray(lo), np.asarray(hi)
    if lo.size <= SUMMARY_ELEMENTS:
        return f"node {nid}: {_one_line(np.atleast_1d(lo))} .. {_one_line(np.atleast_1d(hi))}"
    if full:
        return f"node {nid}: {format_tensor(lo, full=True)} ..\n{format_tensor(hi, full=True)}"
    s = box_stats(lo, hi)
    width = terminal_width() - 4
    return (f"{_head(g, nid)}: {box_summary(s)}\n  lower:\n{_indent(_indent(format_tensor(lo, width=width)))}"
            f"\n  upper:\n{_indent(_indent(format_tensor(hi, width=width)))}")


def box_summary(s: dict[str, float | None]) -> str:
    if s["lo_min"] is None:
        return "empty"
    return (f"box [{format_number(s['lo_min'])}, {format_number(s['hi_max'])}], width min {format_number(s['width_min'])}, "
            f"mean {format_number(s['width_mean'])}, max {format_number(s['width_max'])}")


def boxes_table(g: Any, boxes: Any, ids: Iterable[int]) -> str:
    """One line per node: id, op, shape, least lower and greatest upper bound, mean and max width."""
    t = Table(["node", "op", "shape", "lo", "hi", "mean width", "max width"],
              numeric=["node", "lo", "hi", "mean width", "max width"])
    for i in ids:
        s = box_stats(*boxes[i])
        t.add(str(i), g[i].kind, format_shape(g[i].out_shape), s["lo_min"], s["hi_max"], s["width_mean"], s["width_max"])
    return t.render()


def shown_nodes(g: Any, args: argparse.Namespace) -> list[int]:
    """The node ids a view shows: ``--node`` ids (checked), else every node with ``--all-nodes``, else
    the outputs."""
    from ..errors import BridgeError
    if args.node:
        bad = [i for i in args.node if not 0 <= i < len(g)]
        if bad:
            raise BridgeError(f"--node {bad[0]}: the graph has nodes 0..{len(g) - 1}")
        return list(dict.fromkeys(args.node))
    return list(range(len(g))) if args.all_nodes else list(g.outputs)


# -- tables ---------------------------------------------------------------------------------------

def terminal_width() -> int:
    """The terminal's columns (``COLUMNS`` wins); 120 when the output is not a terminal."""
    return max(40, shutil.get_terminal_size((120, 24)).columns)


_MIN_FOLD = 12  # a folding column keeps at least this many characters a line


class Table:
    """Rows of cells rendered by rich to fit ``width``: right-aligned numbers; the ``wrap`` columns
    (names, keys, statuses; the last column by default) fold long cells inside the column, every other
    column keeps its cells whole."""

    def __init__(self, columns: Sequence[str], numeric: Sequence[str] = (), wrap: Sequence[str] = (),
                 title: str | None = None):
        self.columns, self.numeric, self.title = list(columns), set(numeric), title
        self.wrap = set(wrap) or {self.columns[-1]}
        self.rows: list[list[str]] = []

    def add(self, *cells: Any) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"table row has {len(cells)} cells for {len(self.columns)} columns")
        self.rows.append([c if isinstance(c, str) else format_number(c) if c is not None else "-" for c in cells])

    def render(self, width: int | None = None) -> str:
        from rich.console import Console
        from rich.table import Table as RichTable
        t = RichTable(box=None, show_edge=False, pad_edge=False, title=self.title, title_justify="left",
                      header_style="", title_style="")
        for name in self.columns:
            t.add_column(name, justify="right" if name in self.numeric else "left", overflow="fold",
                         no_wrap=name not in self.wrap)
        for row in self.rows:
            t.add_row(*row)
        buf = io.StringIO()
        # never narrower than whole unwrapped columns plus folded ones of _MIN_FOLD: rich would drop columns
        natural = [max(len(c) for c in [name, *(r[i] for r in self.rows)]) for i, name in enumerate(self.columns)]
        needed = sum(min(w, _MIN_FOLD) if name in self.wrap else w for name, w in zip(self.columns, natural))
        needed += 2 * (len(self.columns) - 1)
        Console(file=buf, width=max(width or terminal_width(), needed), color_system=None, highlight=False, markup=False,
                emoji=False).print(t)
        return "\n".join(line.rstrip() for line in buf.getvalue().splitlines())


# -- report tables (abi, plan, diff) -------------------------------------------------------------

def abi_table(slots: Any, squares: Sequence[str] = ()) -> str:
    """The ABI's slots as a table, then its totals, ambiguity groups and the keys of square matrices."""
    t = Table(["slot", "node", "op", "role", "shape", "dtype", "params", "key"], numeric=["slot", "node", "params"])
    for s in slots:
        t.add(str(s.index), str(s.node), s.op, s.role, format_shape(s.shape), s.dtype, str(s.size),
              (s.key or "-") + (f" ({s.transform})" if s.transform else ""))
    lines = [t.render()]
    unbound = len(slots.unbound())
    lines.append(f"total: {len(slots)} slots, {slots.num_parameters} parameters"
                 + (f", {unbound} unbound" if unbound else ""))
    lines.append(f"shapes: {slots.shapes}")
    groups = slots.ambiguity_groups()
    if groups:
        lines.append("ambiguity groups (same shape and dtype: a swap passes every key and shape check):")
        lines.extend(f"  {g.describe()}" for g in groups)
    if squares:
        lines.append(f"square matrices (a transpose passes the shape check): {', '.join(squares)}")
    return "\n".join(lines)


def plan_table(plan: Any) -> str:
    """One row per planned kernel: node, kind, backend op, capsule and its four states."""
    yes = {True: "yes", False: "no"}
    t = Table(["node", "kind", "backend op", "capsule", "ext", "registered", "selectable", "executable", "proved"],
              numeric=["node"], wrap=["capsule", "backend op"])
    for k in plan.kernels:
        s = k.states
        t.add(str(k.node), k.kind, k.op, k.capsule.name, yes[k.capsule.ext], yes[s["registered"]],
              yes[s["selectable"]], yes[s["executable"]], yes[s["proved"]])
    return t.render()


def diff_table(report: Any, all_nodes: bool = False) -> str:
    """The compared nodes (all, or the divergent ones) and the outputs: errors against the budget."""
    t = Table(["", "op", "counterpart", "max abs", "max rel", "ulps", "budget", "vs exact", "status"],
              numeric=["", "max abs", "max rel", "ulps", "budget"], wrap=["counterpart", "status"])

    def row(label: str, r: Any) -> None:
        status = r.status + (f" on {r.diverged_on}" if r.diverged and r.diverged_on else "")
        if r.problem:
            status += f" ({r.problem})"
        exact = "-" if r.exact_ulps is None else "=" if r.exact_ulps == 0 else f"{format_short(r.exact_ulps)} ulp"
        figures = ([""] * 4 if r.status == "no counterpart"
                   else [format_short(x) for x in (r.max_abs, r.max_rel, r.max_ulp, r.budget)])
        t.add(label, r.op, r.counterpart or "-", *figures, exact, status)

    for r in report.nodes:
        if all_nodes or r.diverged:
            row(f"node {r.node}", r)
    for r in report.outputs:
        row(f"output {r.output}", r)
    return t.render()


def diff_text(report: Any, all_nodes: bool = False) -> str:
    """A diff report for people: the verdict, the table, the findings besides the first divergence."""
    lines = [report.summary(), diff_table(report, all_nodes)]
    notable = [f for f in report.findings if f is not report.first_divergence]
    if notable:
        lines.append("findings:")
        lines.extend(f"  [{f.severity}] {f.kind}: {f.message}" for f in notable)
    return "\n".join(lines)


# -- JSON -----------------------------------------------------------------------------------------

_json_stream: Any = None  # the real stdout while ``--json -`` silences the text (see ``json_owns_stdout``)


@contextmanager
def json_owns_stdout(args: argparse.Namespace) -> Iterator[None]:
    """With ``--json -`` the command's text is discarded so that stdout carries one JSON document and
    nothing else, whatever a command or a library prints."""
    global _json_stream
    if getattr(args, "json", None) != "-":
        yield
        return
    _json_stream = sys.stdout
    try:
        with open(os.devnull, "w") as sink, redirect_stdout(sink):
            yield
    finally:
        _json_stream = None

def json_text(doc: Any) -> str:
    """The one JSON spelling of every command: deterministic, one line (pipe it to `jq` to read it), no
    NaN or Infinity (non-finite numbers are the strings "inf", "-inf", "nan")."""
    return json.dumps(jsonable(doc), allow_nan=False) + "\n"


def emit_json(doc: Any, dest: str | None) -> None:
    """Write ``doc`` to ``dest``: stdout for ``-``, else the file (atomically, through a symlink);
    nothing for None."""
    if dest is None:
        return
    text = json_text(doc)
    if dest == "-":
        stream = _json_stream or sys.stdout
        stream.write(text)
        stream.flush()
        return
    from ..fileio import atomic_write_text
    atomic_write_text(dest, text)
