"""TorchLean's text listing and GraphViz DOT (spec section 5, ``NN/IR/Pretty.lean``), byte for byte."""

from __future__ import annotations

from .graph import Graph
from .ops import fmt_shape

__all__ = ["listing", "to_dot"]


def listing(g: Graph) -> str:
    """``ID: DESCRIBE parents=[P1, P2] out=SHAPE`` per node, no trailing newline."""
    return "\n".join(
        f"{n.id}: {n.describe()} parents=[{', '.join(str(p) for p in n.parents)}] out={fmt_shape(n.out_shape)}"
        for n in g.nodes)


def _escape(label: str) -> str:
    return label.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def to_dot(g: Graph) -> str:
    """``Graph.toDot``: header, node lines, then edge lines; ends with a newline."""
    lines = [f'  n{n.id} [label="{_escape(f"{n.id}: {n.describe()}" + chr(10) + f"out={fmt_shape(n.out_shape)}")}"];'
             for n in g.nodes]
    lines += [f"  n{p} -> n{n.id};" for n in g.nodes for p in n.parents]
    return "digraph IR {\n  rankdir=LR;\n  node [shape=box, fontsize=10];\n" + "\n".join(lines) + "\n}\n"
