"""What every importer shares about failure: the refusal of one node, and a bug's node context.

``NotLowerable`` is bad input at one node (a supported target used in a way no IR op expresses);
the importers collect these and report them together. Any other exception raised while lowering a
node is a bug: it propagates with its traceback, and ``add_node_note`` names the node it happened
at, the way ``torch.fx.Interpreter`` does.
"""

from __future__ import annotations

from torchlean_bridge.errors import BridgeError

__all__ = ["NotLowerable", "add_node_note"]


class NotLowerable(BridgeError):
    """A lowering cannot express this use of a supported target (collected, reported together)."""


def add_node_note(error: BaseException, where: str) -> None:
    """Attach ``While lowering <where>`` to an exception that escapes a lowering (once per error)."""
    note = f"While lowering {where}"
    if note not in getattr(error, "__notes__", ()):
        error.add_note(note)
