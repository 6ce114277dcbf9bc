"""Branch and bound for ``verify --method bab-relu``: the search (``search``) and its PGD attack (``pgd``)."""

from .pgd import RESTARTS, ROOT_MACS, Dag, pgd_candidates
from .search import BATCH, MAX_QUEUE_BYTES, TRY_POINTS, BabOutcome, ReluBab

__all__ = ["ReluBab", "BabOutcome", "MAX_QUEUE_BYTES", "BATCH", "TRY_POINTS", "Dag", "pgd_candidates", "RESTARTS",
           "ROOT_MACS"]
