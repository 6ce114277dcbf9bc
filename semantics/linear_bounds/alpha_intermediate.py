"""alpha-CROWN for intermediate bounds on chains: each unit bounded with slopes of its own.

The boxes of the inputs of ReLUs, sigmoids and tanhs decide every later relaxation, and CROWN computes
them with one rule for the slopes. Here, as auto_LiRPA's alpha-CROWN does, the lower and upper bound of
each unit whose box matters (a ReLU input's unstable units; every unit of a smooth node's input) get
their own slopes for the activations below it, optimized by ``alpha.optimize_slopes`` (projected Adam in
plain float64: a heuristic, no soundness claim). Any ReLU lower slope in [0, 1], and any sigmoid or tanh
slope with its rigorous intercept (``alpha.lines_for``), gives a valid line, so any slopes give a valid
bound; the sound bound is the outward-rounded CROWN pass (``crown._Pass``) on a batch in which sample k
carries the slopes of row k and starts from row k alone (a per-sample spec): one sound pass serves
every row. The result is intersected with the node's box, so it is never looser than CROWN's.

Used for one box (a batch of 1: branch and bound's root, whose boxes its children reuse, and single-box
``alpha-crown`` calls) on chains of linear layers, convolutions, ReLUs, sigmoids and tanhs
(``alpha.chain_to_input``) with at most MAX_ENTRIES slopes and row entries to optimize and
MAX_BATCH_ENTRIES entries in the sound pass's batch (MNIST and ERAN MLPs fit; oval21's second convolution,
442 rows over 3,072 units, does not: optimized, it cost 7 s for a root gap of -0.44 against -0.47);
anything else keeps CROWN's boxes.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from torchlean_bridge.errors import BridgeError

if TYPE_CHECKING:
    from .crown import _Run

__all__ = ["MAX_BATCH_ENTRIES", "MAX_ENTRIES", "tighten_unstable"]

MAX_ENTRIES = 1 << 20  # slopes and row entries per optimization (rows x units); beyond: CROWN's box
MAX_BATCH_ENTRIES = 1 << 24  # the sound pass's batch: samples x input-dependent entries per sample


def tighten_unstable(run: "_Run", v: int, make_run: type, make_pass: type) -> bool:
    """Tighten the box of v (the input of a ReLU, sigmoid or tanh on a chain, batch 1) on the units whose
    box decides a relaxation (a ReLU's unstable units, every unit of a non-point smooth input); whether it
    ran. ``make_run`` and ``make_pass`` are crown's ``_Run`` and ``_Pass`` (crown calls this module)."""
    from .alpha import SMOOTH_OPTIMIZED, chain, lines_for, optimize_slopes
    crown = run.crown
    if crown.n != 1 or not crown.batched:
        return False
    kinds = _reader_kinds(crown)[v]  # the nodes relaxed after this refinement
    if not kinds or not kinds <= ({"relu"} | SMOOTH_OPTIMIZED):
        return False
    layers = chain(run, v)
    if layers is None:
        return False
    lo, hi = (x.reshape(1, -1) for x in run.boxes[v])
    matters = (lo[0] < 0) & (hi[0] > 0) if kinds == {"relu"} else lo[0] < hi[0]
    cols = np.flatnonzero(matters)
    if cols.size == 0:
        return False
    optimized = [u for kind, u in layers if kind in ("relu", "smooth")]
    k = 2 * cols.size
    width = lo.shape[1]
    # the slopes and rows to optimize, then the batch of one sample per row: both sized before either exists
    if k * (width + sum(math.prod(crown.ishape(u)[1:]) for u in optimized)) > MAX_ENTRIES:
        return False
    size = 1 << max(0, (k - 1).bit_length())
    per_sample = sum(math.prod(crown.ishape(node.id)[1:]) for node in run.graph.nodes if not crown.const[node.id])
    if size * per_sample > MAX_BATCH_ENTRIES:
        return False
    rows = np.zeros((1, k, width))
    rows[0, np.arange(cols.size), cols] = 1.0  # lower bounds of z
    rows[0, cols.size + np.arange(cols.size), cols] = -1.0  # lower bounds of -z: upper bounds of z
    alphas = optimize_slopes(run, v, rows)
    if alphas is None:
        return False
    wide = _row_batch(crown, size)
    if wide is None:
        return False
    pad = lambda x: (np.concatenate([x, np.repeat(x[-1:], size - x.shape[0], axis=0)])  # noqa: E731
                     if size > x.shape[0] else x)
    boxes = [_widen(box, tuple(node.out_shape)) for box, node in zip(run.boxes, wide.graph.nodes)]
    alt = make_run(wide, boxes, run.deadline)
    alt.refined = list(run.refined)
    for u, a in alphas.items():  # sample j takes row j's slopes
        rows_of = tuple(pad(x[0]) for x in a) if isinstance(a, tuple) else pad(a[0])
        alt.lines[u] = tuple(np.ascontiguousarray(x).reshape(wide.ishape(u)) for x in lines_for(run, u, rows_of, size))
    low, _ = make_pass(alt, v, 0, size, spec=pad(rows[0])[:, None, :]).run()
    low = low[:, 0]
    new_lo, new_hi = lo.copy(), hi.copy()
    new_lo[0, cols] = np.maximum(lo[0, cols], low[:cols.size])
    new_hi[0, cols] = np.minimum(hi[0, cols], -low[cols.size:k])
    shape = run.boxes[v][0].shape
    run.set_box(v, (new_lo.reshape(shape), new_hi.reshape(shape)))
    return True


def _reader_kinds(crown) -> list[set[str]]:
    """Per node, the kinds of the nodes reading it (once per Crown: refinements ask node by node)."""
    got = crown.__dict__.get("_reader_kinds")
    if got is None:
        g = crown.graph
        got = [{g.nodes[r].kind for r in readers} for readers in g.consumers()]
        crown.__dict__["_reader_kinds"] = got
    return got


def _widen(box, shape: tuple[int, ...]):
    """A node's box repeated along the batch axis to ``shape`` (a constant's box as it is)."""
    lo, hi = box
    if tuple(lo.shape) == shape:
        return box
    return np.ascontiguousarray(np.broadcast_to(lo, shape)), np.ascontiguousarray(np.broadcast_to(hi, shape))


def _row_batch(crown, size: int):
    """The Crown of crown's graph with a batch of ``size`` samples (cached on crown), or None."""
    from .batch_axis import with_batch_payload
    Crown = type(crown)  # noqa: N806 (crown's class: this module does not import crown)
    cache = crown.__dict__.setdefault("_row_batches", {})
    if size not in cache:
        got = with_batch_payload(crown.graph, crown.payload, size)
        try:
            wide = None if got is None else Crown(*got)
        except BridgeError:  # a batch the working-memory limit refuses
            wide = None
        cache[size] = wide if wide is not None and wide.batched and wide.n == size else None
    return cache[size]
