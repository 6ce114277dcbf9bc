"""IR-to-IR passes: one transformation per module, one signature ``bundle -> (bundle, Note)``.

Each module's docstring says what it does and why; docs/architecture.md lists them in the order the
importers and exporters run them.
"""

from .absorb_broadcasts import absorb_broadcasts
from .base import GraphEdit, Note, Pass
from .bind_tied_weights import bind_tied_weights
from .canonicalize import canonicalize
from .common_subexpressions import eliminate_common_subexpressions
from .dead_code import eliminate_dead_code
from .fuse_linear_bias import fuse_linear_bias
from .v1_rewrite import rewrite_to_v1

__all__ = ["Note", "Pass", "GraphEdit", "absorb_broadcasts", "bind_tied_weights", "canonicalize", "eliminate_common_subexpressions", "eliminate_dead_code", "fuse_linear_bias", "rewrite_to_v1"]
