"""conv_gemm's staged GEMM against torch's convolution on random geometries (1-3 spatial axes,
strides beyond the kernel, dilation, groups, asymmetric padding), in float64 and float32."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from semantics.conv_gemm import conv_plan, conv_products, stage
from semantics.rules.affine import batched_conv

_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}


def _case(rng: np.random.Generator) -> tuple:
    rank = int(rng.integers(1, 4))
    groups = int(rng.choice([1, 2, 3]))
    cin, cout = groups * int(rng.integers(1, 3)), groups * int(rng.integers(1, 3))
    draw = lambda lo, hi: tuple(int(v) for v in rng.integers(lo, hi, size=rank))  # noqa: E731
    spatial, kernel, stride, dilation = draw(1, 9), draw(1, 4), draw(1, 5), draw(1, 3)
    before, after = draw(0, 3), draw(0, 3)
    return int(rng.integers(1, 5)), cin, cout, spatial, kernel, stride, dilation, before, after, groups


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_staged_gemm_matches_torch(dtype):
    rng = np.random.default_rng(11)
    checked = 0
    while checked < 150:
        n, cin, cout, spatial, kernel, stride, dilation, before, after, groups = _case(rng)
        attrs = dict(kernel=kernel, stride=stride, dilation=dilation, padding=before, padding_after=after,
                     groups=groups)
        x = rng.standard_normal((n, cin) + spatial)
        w = rng.standard_normal((cout, cin // groups) + kernel).astype(dtype)
        plan = conv_plan(x.shape, attrs)
        if min(plan.out_spatial) <= 0:
            continue
        got = conv_products(stage(x, plan, dtype, "test.staged"), plan, w, groups, "test.products")
        pad = [v for b, a in zip(reversed(before), reversed(after)) for v in (b, a)]
        xt = F.pad(torch.from_numpy(x.astype(dtype)), pad)
        want = _CONV[len(spatial)](xt, torch.from_numpy(w), stride=stride, dilation=dilation, groups=groups).numpy()
        tol = 1e-12 if dtype == np.float64 else 1e-4
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * 10)
        np.testing.assert_array_equal(batched_conv(x.astype(dtype), w, attrs), got)
        checked += 1
