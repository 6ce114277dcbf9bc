"""Every op's rules, grouped by op family, each family holding its ops' float and interval rules side
by side: ``layout`` (leaves, data movement, cast), ``indexing``, ``elementwise`` (arithmetic, math
functions, comparisons, logic), ``activations``, ``reductions``, ``normalization``, ``softmax``,
``affine`` (linear, matmul, conv), ``pooling`` (and resampling), ``rng``. Importing the package fills
the domain tables ``FLOAT_RULES`` and ``INTERVAL_RULES`` (``table.py``); both cover the registry.
"""

from __future__ import annotations

from torchlean_bridge.ops import REGISTRY

from . import activations, affine, elementwise, indexing, integer, layout, normalization, pooling, reductions, rng, \
    softmax
from . import resize as resize_family
from . import select  # TopK/MaxPool indices, MaxUnpool, powers (issue #15)
from . import misc  # cumprod, det, bitcast (issue #15)
from . import narrow  # narrow element types (issue #15)
from . import spatial  # (issue #15: grid_sample, lp_pool_nd, col2im, deform_conv, roi_align)
from . import dynamic  # dynamic_slice (issue #32)
from .layout import NO_INTERVAL_RULE
from .table import EXACT_RULES, FLOAT_RULES, INTERVAL_RULES, POINTWISE_INTERVAL_KINDS

__all__ = ["FLOAT_RULES", "INTERVAL_RULES", "EXACT_RULES", "NO_INTERVAL_RULE", "POINTWISE_INTERVAL_KINDS"]

FAMILIES = (layout, indexing, elementwise, activations, reductions, normalization, softmax, affine, pooling, rng,
            integer, resize_family, narrow)
FAMILIES += (misc,)
FAMILIES += (spatial,)
FAMILIES += (select,)
FAMILIES += (dynamic,)

for _table in (FLOAT_RULES, INTERVAL_RULES):
    _missing = sorted(set(REGISTRY) - set(_table))
    assert not _missing, f"ops without a {_table.domain} rule: {_missing}"
