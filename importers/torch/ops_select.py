"""F.max_unpool{1,2,3}d (``max_unpool``): PyTorch's indices count within one (N, C) plane, the IR's over the
whole tensor (``ops_nn.shift_planes``)."""

from __future__ import annotations

from typing import Any

from torchlean_bridge.ops import FLOAT

from .common import NotLowerable
from .lowerer import Lowerer
from .ops_nn import _tuple, shift_planes
from .targets import register

Cx = Lowerer


def max_unpool(r: int):
    """F.max_unpool{r}d(input, indices, kernel_size, stride, padding, output_size): each value written at its
    plane-local index into zeros of the output (default (in - 1) stride - 2 padding + kernel per axis)."""

    def lower(cx: Cx, input: Any, indices: Any, kernel_size: Any = None, stride: Any = None, padding: Any = 0,
              output_size: Any = None) -> Any:
        s = list(cx.shape(input))
        if len(s) != r + 2:
            raise NotLowerable(f"max_unpool{r}d of a rank-{len(s)} input (needs (N, C, *spatial))")
        if output_size is not None:
            out = [int(v) for v in list(output_size)[-r:]]
        else:
            k = _tuple(kernel_size, r)
            st = _tuple(stride, r) if stride not in (None, [], ()) else list(k)
            pad = _tuple(padding, r)
            out = [(n - 1) * t - 2 * p + kk for n, t, p, kk in zip(s[2:], st, pad, k)]
        full = tuple(s[:2] + out)
        flat = shift_planes(cx, indices, full, r, +1)
        return cx.add("max_unpool", [cx.node(input, FLOAT), flat.nid], {"scatter_shape": full, "out_shape": full})

    return lower


def aten_max_unpool(r: int):
    """aten.max_unpool2d(self, indices, output_size) / max_unpool3d(self, indices, output_size, stride, padding)."""

    def lower(cx: Cx, input: Any, indices: Any, output_size: Any, *rest: Any) -> Any:
        return max_unpool(r)(cx, input, indices, output_size=output_size)

    return lower


for _r in (1, 2, 3):
    register(max_unpool(_r), fx=f"F.max_unpool{_r}d")
register(aten_max_unpool(2), aten="max_unpool2d.default")
register(aten_max_unpool(3), aten="max_unpool3d.default")
