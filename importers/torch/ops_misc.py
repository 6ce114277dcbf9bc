"""Lowerings of issue #15's ext ops from PyTorch: running products and determinants (the ONNX CumProd and
Det ops' kinds, so a model gives the same IR through either importer)."""

from __future__ import annotations

from typing import Any

import torch

from torchlean_bridge.ops import FLOAT

from .common import NotLowerable, Sym, normalize_axis
from .lowerer import Lowerer
from .targets import lowers

Cx = Lowerer


@lowers(aten="cumprod.default", fx="torch.cumprod", methods="cumprod")
def cumprod(cx: Cx, input: Any, dim: int, dtype: Any = None) -> Sym:
    """torch.cumprod on float tensors (an integer tensor's products are int64 in PyTorch, and their
    range is not known at import: refused)."""
    if cx.etype(input) != FLOAT or (dtype is not None and dtype not in (torch.float32, torch.float64)):
        raise NotLowerable("cumprod of an integer or bool tensor (or to a non-float dtype)")
    return cx.add("cumprod", [cx.node(input, FLOAT)], {"axis": normalize_axis(int(dim), cx.rank(input))})


@lowers(aten="linalg_det.default det.default", fx="torch.det linalg.det", methods="det")
def det(cx: Cx, input: Any) -> Sym:
    """torch.linalg.det / torch.det of [..., n, n] float matrices."""
    if cx.etype(input) != FLOAT:
        raise NotLowerable("det of an integer or bool tensor")
    return cx.add("det", [cx.node(input, FLOAT)])
