"""The handler modules issue #15 adds, one per op family; each has ``HANDLERS``, ``OPSETS`` and ``EMITS``
like ops_math / ops_tensor / ops_nn, and the importer's tables merge them. A handler here may override
an older module's handler for the same op type (the newer one lowers more forms exactly)."""

from . import ops_attention, ops_cast, ops_index, ops_int, ops_loss, ops_norm
from . import ops_control  # control flow, sequences, recurrent layers (flow)
from . import ops_recurrent, ops_sequence  # recurrent layers, sequences and optionals (flow)
from . import ops_misc, ops_reduce, ops_signal, ops_state  # small ops, empty/bool/int reductions, DFT, ... (ops)
from . import ops_resize, ops_select  # Resize in every mode; TopK/MaxPool indices, MaxUnpool, Slice, Pow (resize)
from . import ops_spatial  # GridSample, AffineGrid, LpPool, Col2Im, CenterCropPad, DeformConv, RoiAlign (spatial)

BREADTH_MODULES = (ops_cast, ops_index, ops_norm, ops_attention, ops_int, ops_loss)
BREADTH_MODULES += (ops_control,)
BREADTH_MODULES += (ops_recurrent, ops_sequence)
BREADTH_MODULES += (ops_misc, ops_reduce, ops_signal, ops_state)
BREADTH_MODULES += (ops_resize, ops_select)
BREADTH_MODULES += (ops_spatial,)

from . import ops_quant  # noqa: E402  QuantizeLinear, DequantizeLinear, QLinear*, *Integer (types)

BREADTH_MODULES += (ops_quant,)
