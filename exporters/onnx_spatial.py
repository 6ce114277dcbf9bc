"""ONNX exporters of the spatial sampling ext ops (issue #15), merged into ``exporters.onnx.ONNX_EXPORTERS``.

Each writes the op of the exported opset (21) whose meaning is the node's: GridSample-20, LpPool-18 (integer
p only), Col2Im-18, DeformConv-19, RoiAlign-16. A node without such a form raises ExportError by name.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from torchlean_bridge.errors import ExportError
from torchlean_bridge.graph import Node

__all__ = ["SPATIAL_EXPORTERS", "torch_grid_sample_is_onnx"]


def torch_grid_sample_is_onnx(mode: str, padding_mode: str) -> bool:
    """Whether torch's grid_sample and ONNX GridSample define the same value: they differ only for bicubic with
    border/reflection (ONNX fixes the coordinate, PyTorch only the taps) and nearest with reflection (ties)."""
    return padding_mode == "zeros" or mode == "linear" or (mode == "nearest" and padding_mode == "border")


def _refuse(node: Node, why: str) -> ExportError:
    return ExportError(f"ONNX export: node {node.id}: {node.kind}: {why}", node=node.id, op=node.kind)


def _grid_sample(w: Any, node: Node) -> None:
    a = node.attrs
    if a["convention"] == "torch" and not torch_grid_sample_is_onnx(a["mode"], a["padding_mode"]):
        raise _refuse(node, f"torch's grid_sample mode={a['mode']} padding_mode={a['padding_mode']} computes "
                            "differently from ONNX GridSample")
    w.emit("GridSample", w.operands(node), w.out(node), node, mode=a["mode"], padding_mode=a["padding_mode"],
           align_corners=int(a["align_corners"]))


def _lp_pool(w: Any, node: Node) -> None:
    a = node.attrs
    p = float(a["p"])
    if p != int(p):
        raise _refuse(node, f"p={p} (ONNX LpPool's p is an integer)")
    r = a["spatial_rank"]
    attrs = {"kernel_shape": list(a["kernel"]), "strides": list(a["stride"]), "dilations": list(a["dilation"]),
             "pads": list(a["padding"]) + list(a["padding_after"]), "ceil_mode": int(a["ceil_mode"]), "p": int(p)}
    x = w.operands(node)[0]
    s = w.g.nodes[node.parents[0]].out_shape
    if len(s) == r + 2:
        w.emit("LpPool", [x], w.out(node), node, **attrs)
        return
    x4 = w.emit("Reshape", [x, w.constant([math.prod(s[:len(s) - r]), 1, *s[len(s) - r:]], node)], None, node)
    y = w.emit("LpPool", [x4], None, node, **attrs)
    w.emit("Reshape", [y, w.constant(list(node.out_shape), node)], w.out(node), node)


def _col2im(w: Any, node: Node) -> None:
    a = node.attrs
    w.emit("Col2Im", [w.operands(node)[0], w.constant(list(a["image"]), node), w.constant(list(a["block"]), node)],
           w.out(node), node, strides=list(a["stride"]), dilations=list(a["dilation"]),
           pads=list(a["padding"]) + list(a["padding_after"]))


def _deform_conv(w: Any, node: Node) -> None:
    a = node.attrs
    w.emit("DeformConv", w.operands(node), w.out(node), node, kernel_shape=list(a["kernel"]),
           strides=list(a["stride"]), dilations=list(a["dilation"]), pads=list(a["padding"]) + list(a["padding_after"]),
           group=int(a["groups"]), offset_group=int(a["offset_groups"]))


def _roi_align(w: Any, node: Node) -> None:
    a = node.attrs
    w.emit("RoiAlign", w.operands(node), w.out(node), node, mode=a["mode"], output_height=int(a["output_height"]),
           output_width=int(a["output_width"]), sampling_ratio=int(a["sampling_ratio"]),
           spatial_scale=float(np.float32(a["spatial_scale"])),
           coordinate_transformation_mode="half_pixel" if a["half_pixel"] else "output_half_pixel")


SPATIAL_EXPORTERS = {"grid_sample": _grid_sample, "lp_pool_nd": _lp_pool, "col2im": _col2im,
                     "deform_conv": _deform_conv, "roi_align": _roi_align}
