"""F.grid_sample, F.affine_grid, F.lp_pool1d/2d/3d and F.fold through both torch importers, against PyTorch.

Random shapes and attributes; float64 evaluation must agree with PyTorch's float64 to 1e-10 (interpolation
weights and window sums computed in another order), float32 to 2e-5. Both importers must give the same
kinds. torchvision's deform_conv2d and roi_align need torchvision's compiled kernels, which do not load with
this CPU torch: those ops are checked against onnxruntime and the ONNX reference in test_spatial_ops.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import torchlean_bridge as tlb
from torchlean_bridge.errors import ExportError

RNG = np.random.default_rng(1516)
IMPORTERS = ("import_fx", "import_export")


class One(torch.nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, a):
        return self.fn(a)


class Two(One):
    def forward(self, a, b):
        return self.fn(a, b)


def Wrap(fn, arity: int = 2) -> torch.nn.Module:  # noqa: N802 (a module factory)
    return (One if arity == 1 else Two)(fn)


def _agree(fn, *inputs):
    model = Wrap(fn, len(inputs)).eval()
    kinds = []
    for importer in IMPORTERS:
        bundle = getattr(tlb, importer)(model, tuple(torch.from_numpy(x.astype(np.float32)) for x in inputs))
        kinds.append(bundle.graph.ops_used())
        for dtype, tol in (("float64", 1e-10), ("float32", 2e-5)):
            xs = [x.astype(dtype) for x in inputs]
            (ours,) = tlb.evaluate(bundle.graph, bundle.payload, xs, dtype=dtype)
            ref = fn(*(torch.from_numpy(x) for x in xs)).numpy()
            np.testing.assert_allclose(ours, ref, rtol=tol, atol=tol, err_msg=f"{importer} {dtype}")
    assert kinds[0] == kinds[1]
    return bundle


@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [False, True])
def test_grid_sample_2d_agrees_with_pytorch(mode, padding_mode, align_corners):
    x = RNG.standard_normal((2, 3, int(RNG.integers(1, 6)), int(RNG.integers(1, 6))))
    grid = RNG.uniform(-1.7, 1.7, (2, int(RNG.integers(1, 5)), int(RNG.integers(1, 5)), 2))
    _agree(lambda a, g: F.grid_sample(a, g, mode=mode, padding_mode=padding_mode, align_corners=align_corners),
           x, grid)


@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
def test_grid_sample_3d_agrees_with_pytorch(mode, padding_mode):
    x = RNG.standard_normal((1, 2, 3, 4, 5))
    grid = RNG.uniform(-1.5, 1.5, (1, 2, 3, 2, 3))
    _agree(lambda a, g: F.grid_sample(a, g, mode=mode, padding_mode=padding_mode, align_corners=False), x, grid)


def test_grid_sample_in_torchs_convention_exports_where_onnx_computes_the_same():
    x, grid = RNG.standard_normal((1, 2, 4, 4)), RNG.uniform(-1.2, 1.2, (1, 3, 3, 2))
    args = (torch.from_numpy(x.astype(np.float32)), torch.from_numpy(grid.astype(np.float32)))
    same = tlb.import_fx(Wrap(lambda a, g: F.grid_sample(a, g, padding_mode="reflection", align_corners=True)).eval(),
                         args)
    assert any(n.op_type == "GridSample" for n in tlb.export_onnx(same).graph.node)
    differs = tlb.import_fx(Wrap(lambda a, g: F.grid_sample(a, g, mode="bicubic", padding_mode="border",
                                                            align_corners=False)).eval(), args)
    with pytest.raises(ExportError, match="grid_sample: torch's grid_sample mode=cubic padding_mode=border computes "
                                          "differently from ONNX GridSample"):
        tlb.export_onnx(differs)


@pytest.mark.parametrize("rank,align_corners", [(2, False), (2, True), (3, False), (3, True)])
def test_affine_grid_agrees_with_pytorch(rank, align_corners):
    size = [2, 3] + [int(v) for v in RNG.integers(1, 6, rank)]  # extents of 1 included (PyTorch puts them at 0)
    theta = RNG.standard_normal((2, rank, rank + 1))
    _agree(lambda t: F.affine_grid(t, size, align_corners=align_corners), theta)


def test_a_spatial_transformer_agrees_with_pytorch():
    x = RNG.standard_normal((2, 3, 6, 5))
    theta = np.eye(2, 3)[None] + 0.2 * RNG.standard_normal((2, 2, 3))
    _agree(lambda a, t: F.grid_sample(a, F.affine_grid(t, (2, 3, 4, 4), align_corners=False), align_corners=False),
           x, theta)


@pytest.mark.parametrize("r", [1, 2, 3])
@pytest.mark.parametrize("p", [1.0, 2.0, 3.0])
@pytest.mark.parametrize("ceil_mode", [False, True])
def test_lp_pool_agrees_with_pytorch(r, p, ceil_mode):
    kernel = [int(v) for v in RNG.integers(1, 4, r)]
    stride = [int(v) for v in RNG.integers(1, 3, r)]
    x = RNG.standard_normal((2, 3) + tuple(k + int(RNG.integers(0, 4)) for k in kernel))
    if p != 2.0:
        x = np.abs(x)  # torch raises x, not |x|, to the power p: its odd-p windows may sum below 0 (then NaN)
    pool = {1: F.lp_pool1d, 2: F.lp_pool2d, 3: F.lp_pool3d}[r]
    k, s = (kernel[0], stride[0]) if r == 1 else (kernel, stride)
    _agree(lambda a: pool(a, p, k, s, ceil_mode=ceil_mode), x)


@pytest.mark.parametrize("batched", [True, False])
def test_fold_agrees_with_pytorch(batched):
    block = [int(v) for v in RNG.integers(1, 4, 2)]
    dilation, stride, padding = [int(v) for v in RNG.integers(1, 3, 2)], [int(v) for v in RNG.integers(1, 3, 2)], \
        [int(v) for v in RNG.integers(0, 2, 2)]
    image = [d * (k - 1) + 1 + int(RNG.integers(0, 4)) for k, d in zip(block, dilation)]
    blocks = [(n + 2 * pd - d * (k - 1) - 1) // s + 1 for n, pd, d, k, s in zip(image, padding, dilation, block, stride)]
    shape = (3 * block[0] * block[1], blocks[0] * blocks[1])
    x = RNG.standard_normal(((2,) + shape) if batched else shape)
    bundle = _agree(lambda a: F.fold(a, image, block, dilation=dilation, padding=padding, stride=stride), x)
    assert "col2im" in bundle.graph.ops_used()

