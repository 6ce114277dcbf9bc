"""Campaigns: many independent tasks (verification instances, checkpoints) on an engine.

``engine.py`` is the interface (``Task``, ``Outcome``) and the dispatch loop both engines share,
``engines.py`` picks one by name (``make_engine``); ``local.py`` is the default process pool, ``ray_engine.py`` the same on Ray. A
campaign appends each finished task's row to its results file (``results.py``) so that resuming
after a crash or Ctrl-C loses nothing. ``verify_campaign.py`` and ``audit_campaign.py`` are the two
campaigns the command line offers; docs/campaigns.md is the user's guide.
"""

from .engine import Engine, Outcome, Task
from .engines import make_engine

__all__ = ["Engine", "Outcome", "Task", "make_engine"]
