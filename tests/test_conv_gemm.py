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


def test_a_stride_far_beyond_the_kernel_stages_only_the_phases_it_reads():
    """Stride 200 x 300 with a 2 x 2 kernel: 60,000 stride phases, of which the taps read 4. The staged
    copy holds those 4 (not one per phase, which would be sized by an attribute alone)."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 401, 601))
    w = rng.standard_normal((2, 3, 2, 2))
    attrs = dict(kernel=(2, 2), stride=(200, 300), dilation=(1, 1), padding=(0, 0), padding_after=(0, 0), groups=1)
    plan = conv_plan(x.shape, attrs)
    assert len(plan.phases) == 4
    staged = stage(x, plan, np.float64, "test.staged")
    assert staged.shape[1] == 4
    got = conv_products(staged, plan, w, 1, "test.products")
    want = F.conv2d(torch.from_numpy(x), torch.from_numpy(w), stride=(200, 300)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
