"""The handler modules issue #15 adds, one per op family; each has ``HANDLERS``, ``OPSETS`` and ``EMITS``
like ops_math / ops_tensor / ops_nn, and the importer's tables merge them. A handler here may override
an older module's handler for the same op type (the newer one lowers more forms exactly)."""

from . import ops_attention, ops_cast, ops_einsum, ops_index, ops_int, ops_loss, ops_norm
from . import ops_spatial

BREADTH_MODULES = (ops_cast, ops_index, ops_norm, ops_attention, ops_int, ops_loss, ops_einsum)
BREADTH_MODULES += (ops_spatial,)
