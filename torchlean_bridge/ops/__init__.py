"""The op registry: every op kind, its wire spelling, arity, attributes and one shape rule."""

from . import ext as _ext  # noqa: F401  (registers the ext dialect)
from . import ext_resize as _ext_resize  # noqa: F401  (registers resize)
from . import ext_select as _ext_select  # noqa: F401  (index outputs, unpooling, elementwise powers)
from . import narrow as _narrow  # noqa: F401  (ext ops of the narrow element types)
from . import spatial as _spatial  # noqa: F401  (the spatial sampling ext ops)
from . import v1 as _v1  # noqa: F401  (registers the 42 torchlean.ir.v1 kinds)
from .contracts import Shape, fmt_array, fmt_shape, numel
from .registry import BOOL, ELEMENT_TYPES, FLOAT, INT64, REGISTRY, Attr, OpSpec, ParamRole, get_op, register
from .v1 import V1_KINDS

__all__ = ["REGISTRY", "OpSpec", "Attr", "ParamRole", "get_op", "register", "V1_KINDS", "Shape",
           "fmt_shape", "fmt_array", "numel", "FLOAT", "INT64", "BOOL", "ELEMENT_TYPES"]
