"""A graph with its payload prepared once for repeated evaluation and bounding (``tlb.prepare``).

``evaluate`` and ``interval_bounds`` check the graph and convert the payload on every call (float64
copies of float32 weights, float64 weights and |W| for the interval domain): for a small MLP at
batch 1 that conversion is most of an IBP call. ``prepare(g, payload)`` checks the graph and reads
every payload record once (payload errors surface here, with the evaluator's messages), converts
the records for a domain the first time that domain is used, and precomputes the dead-value
schedule; each call then only runs the loop.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from torchlean_bridge.check import check
from torchlean_bridge.graph import Graph
from torchlean_bridge.payload import Payload

from .domains import DEFAULT_PRODUCTS, Domain, IntervalDomain, run
from .evaluate import float_domain, input_list
from .interval import input_boxes, interval_domain
from .interval_round import Box
from .arena import ThreadArenas
from .records import domain_records, read_payload
from .rules import FLOAT_RULES, INTERVAL_RULES
from .rules.rng import stream_records

__all__ = ["prepare", "Prepared"]


class Prepared:
    """``g`` checked and its payload read once; ``.evaluate`` and ``.interval_bounds`` as the
    module-level functions, without the per-call checks and conversions."""

    def __init__(self, g: Graph, payload: Payload | None) -> None:
        check(g)
        self.graph = g
        self._typed = read_payload(g, payload if payload is not None else Payload())
        self._records: dict[str, list[dict]] = {}
        self._arenas = ThreadArenas()

    def _domain_records(self, domain: Domain) -> list[dict]:
        interval = isinstance(domain, IntervalDomain)  # both product precisions read the same records
        key = "interval" if interval else domain.name
        records = self._records.get(key)
        if records is None:
            if interval:
                records = domain_records(self.graph, self._typed, INTERVAL_RULES.params)
            else:
                records = domain_records(self.graph, self._typed, FLOAT_RULES.params, domain.dtype)
            self._records[key] = records
        return records

    def evaluate(self, inputs: Any, dtype: str = "float64", all_nodes: bool = False, exact: bool = False
                 ) -> list[np.ndarray]:
        """As ``tlb.evaluate(g, payload, inputs, dtype=..., all_nodes=..., exact=...)``."""
        domain = float_domain(dtype, exact)
        seeds = dict(zip(self.graph.inputs, input_list(inputs, len(self.graph.inputs))))
        records = stream_records(self.graph, self._domain_records(domain).__getitem__)
        return run(self.graph, domain, seeds, records, all_nodes=all_nodes)

    def interval_bounds(self, lower: Any, upper: Any, all_nodes: bool = True,
                        products: str = DEFAULT_PRODUCTS) -> list[Box]:
        """As ``tlb.interval_bounds(g, payload, lower, upper, all_nodes=..., products=...)``, with the
        hot rules' results in memory reused across calls (as ``IntervalPropagator``'s)."""
        domain = interval_domain(products)
        with self._arenas.active():
            seeds = input_boxes(self.graph, lower, upper)
            return run(self.graph, domain, seeds, self._domain_records(domain).__getitem__, all_nodes=all_nodes)


def prepare(g: Graph, payload: Payload | None) -> Prepared:
    """``g`` with ``payload`` prepared for repeated ``.evaluate(inputs, dtype=...)`` and
    ``.interval_bounds(lower, upper)`` calls."""
    return Prepared(g, payload)
