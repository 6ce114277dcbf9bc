"""One exception family for every problem the library reports on bad input.

Each error carries *where* (node id, op, source name) and *what* (the message, which states the
expected and the actual value). Messages follow TorchLean's templates where TorchLean has one.
"""

from __future__ import annotations

__all__ = [
    "BridgeError",
    "WireError",
    "GraphError",
    "ShapeRuleError",
    "PayloadError",
    "EvalError",
    "IntervalError",
    "UnsupportedError",
    "CheckpointError",
    "ExportError",
    "CheckFailed",
]


MAX_MESSAGE = 4000  # characters: a hostile name or a 10**5-entry attribute must not become a megabyte of text


class BridgeError(Exception):
    """Base of every error the library raises on bad input (messages beyond ``MAX_MESSAGE``
    characters are cut, saying how long they were)."""

    def __init__(self, message: str, *, node: int | None = None, op: str | None = None,
                 source: str | None = None) -> None:
        if len(message) > MAX_MESSAGE:
            message = f"{message[:MAX_MESSAGE]} ... (cut: {len(message)} characters in all)"
        if source is not None and len(source) > MAX_MESSAGE:
            source = f"{source[:MAX_MESSAGE]} ..."
        super().__init__(message)
        self.message = message
        self.node = node
        self.op = op
        self.source = source

    def __str__(self) -> str:
        if self.source and self.source not in self.message:
            return f"{self.message} [at {self.source}]"
        return self.message


class WireError(BridgeError):
    """A torchlean.ir.v1 document is malformed (``PyTorch graph import: ...`` templates)."""


class GraphError(BridgeError):
    """The IR graph is not well formed or not well shaped (``IR graph: ...`` templates)."""


class ShapeRuleError(BridgeError):
    """A shape rule rejected its operands; the bare TorchLean rule message, no node prefix."""


class PayloadError(BridgeError):
    """A payload record is malformed or disagrees with its node."""


class EvalError(BridgeError):
    """Evaluation failed (``IR eval: ...`` templates), e.g. log of a non-positive value."""


class IntervalError(BridgeError):
    """Interval propagation has no sound rule for a node, or a containment check failed."""


class UnsupportedError(BridgeError):
    """An importer met framework targets it cannot lower; lists all of them at once."""

    def __init__(self, message: str, items: list[dict] | None = None, **kw) -> None:
        super().__init__(message, **kw)
        self.items = items or []


class CheckpointError(BridgeError):
    """A checkpoint file is unreadable, unsafe, or does not fit the parameter ABI."""


class ExportError(BridgeError):
    """A bundle cannot be written in the requested format (lists every blocking node)."""


class CheckFailed(BridgeError):
    """A check ran on readable input and found a problem (the CLI exits 1, not 2)."""
