"""Ops lowered by composing existing IR ops: statistics and norms, logsumexp, rearrangements
(pixel shuffle, flip, roll, repeat_interleave, nearest upsampling), triangles, GLU/log-sigmoid/
softmin, RMS and instance norm, outer/diff/prod.

Each op is a tiny module imported through torch.fx and torch.export (and, where torch decomposes
it, through ``run_decompositions()``); the graph must evaluate in float64 within 1e-12 (relative
to the output's scale) of the module run in float64, since each lowering is the op's exact
real-number function, and in float32 within 1e-5 of the float32 module. Unsupported variants
must raise ``UnsupportedError`` naming the op and the reason.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any, Callable

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torchlean_bridge as tlb
from torchlean_bridge.errors import UnsupportedError
from torchlean_bridge.roles import apply_transform
from importers.torch.program import EMITTED_KINDS

warnings.filterwarnings("ignore", category=FutureWarning)

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")

IMPORTERS = {"fx": tlb.import_fx, "export": tlb.import_export,
             "decomposed": lambda m, x: tlb.import_export(m, x, decompose=True)}


class Fn(nn.Module):
    """``forward`` is ``fn(self, x)``; optional submodules under ``inner``."""

    def __init__(self, fn: Callable[..., Any], inner: nn.Module | None = None) -> None:
        super().__init__()
        self.fn = fn
        if inner is not None:
            self.inner = inner

    def forward(self, x: torch.Tensor) -> Any:
        return self.fn(self, x)


def _flat(out: Any) -> list[torch.Tensor]:
    return [out] if isinstance(out, torch.Tensor) else [t for o in out for t in _flat(o)]


def _close(got: np.ndarray, want: np.ndarray, tol: float) -> None:
    assert got.shape == want.shape
    finite = want[np.isfinite(want)]
    scale = max(1.0, float(np.abs(finite).max())) if finite.size else 1.0
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * scale)


def check(module: nn.Module, x: torch.Tensor, vias: tuple[str, ...] = ("fx", "export"),
          ref64: Callable[[torch.Tensor], Any] | None = None) -> list[tlb.Bundle]:
    """Import through each of ``vias`` and compare in float64 and float32 with the module."""
    module = module.eval()
    with torch.no_grad():
        want32 = [t.numpy() for t in _flat(module(x))]
        want64 = [t.numpy() for t in _flat((ref64 or copy.deepcopy(module).double())(x.double()))]
    bundles = []
    for via in vias:
        b = IMPORTERS[via](copy.deepcopy(module), (x,))
        assert set(b.graph.ops_used()) <= EMITTED_KINDS  # the op-support matrix lists what we emit
        got64 = tlb.evaluate(b.graph, b.payload, x.double().numpy(), dtype="float64")
        got32 = tlb.evaluate(b.graph, b.payload, x.numpy(), dtype="float32")
        assert len(got64) == len(want64), via
        for g, w in zip(got64, want64):
            _close(np.asarray(g), w, 1e-12)
        for g, w in zip(got32, want32):
            _close(np.asarray(g), w, 1e-5)
        bundles.append(b)
    return bundles


def rand(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


X3 = rand(3, 4, 6)
X4 = rand(2, 8, 4, 6, seed=1)
WITH_INF = X3.clone()
WITH_INF[0, 1, 2], WITH_INF[1, 2, :], WITH_INF[2, 0, 0] = float("inf"), float("-inf"), float("-inf")

D = ("fx", "export", "decomposed")
# name -> (forward, input, importers[, submodule])
CASES: dict[str, tuple[Any, ...]] = {
    # 1. variance and standard deviation
    "var_dim": (lambda s, x: torch.var(x, 1), X3, D),
    "var_dims_keepdim": (lambda s, x: torch.var(x, dim=(0, 2), keepdim=True), X3, ("fx", "export")),
    "var_unbiased_false": (lambda s, x: torch.var(x, 1, unbiased=False), X3, ("fx", "export")),
    "var_correction": (lambda s, x: x.var(dim=-1, correction=2, keepdim=True), X3, ("fx", "export")),
    "var_all": (lambda s, x: torch.var(x), X3, ("fx", "export")),
    "var_all_biased": (lambda s, x: x.var(False), X3, ("fx", "export")),
    "std_dim": (lambda s, x: torch.std(x, 1, keepdim=True), X3, D),
    "std_all_method": (lambda s, x: x.std(correction=0), X3, ("fx", "export")),
    "var_mean": (lambda s, x: torch.var_mean(x, 1), X3, D),
    "std_mean": (lambda s, x: torch.std_mean(x, dim=(1, 2), correction=0, keepdim=True), X3, ("fx", "export")),
    # 2. norms
    "vector_norm_2": (lambda s, x: torch.linalg.vector_norm(x, 2, dim=1), X3, D),
    "vector_norm_1_keepdim": (lambda s, x: torch.linalg.vector_norm(x, 1, dim=(1, 2), keepdim=True), X3,
                              ("fx", "export")),
    "vector_norm_inf": (lambda s, x: torch.linalg.vector_norm(x, float("inf"), dim=-1), X3, ("fx", "export")),
    "vector_norm_-inf": (lambda s, x: torch.linalg.vector_norm(x, float("-inf"), dim=0), X3, ("fx", "export")),
    "vector_norm_3_all": (lambda s, x: torch.linalg.vector_norm(x, 3), X3, ("fx", "export")),
    "vector_norm_0": (lambda s, x: torch.linalg.vector_norm(torch.relu(x), 0, dim=1), X3, ("fx", "export")),
    "torch_norm_fro": (lambda s, x: torch.norm(x), X3, ("fx", "export")),
    "torch_norm_dim": (lambda s, x: torch.norm(x, dim=1, keepdim=True), X3, ("fx", "export")),
    "tensor_norm_p1": (lambda s, x: x.norm(p=1, dim=(1, 2)), X3, ("fx", "export")),
    "tensor_norm_positional": (lambda s, x: x.norm(2, 1, True), X3, ("fx", "export")),
    "normalize": (lambda s, x: F.normalize(x, dim=1), X3, D),
    "normalize_dims_inf": (lambda s, x: F.normalize(x, float("inf"), dim=(1, 2)), X3, ("fx", "export")),
    "normalize_p1_eps": (lambda s, x: F.normalize(x * 1e-3, p=1, dim=-1, eps=1e-3), X3, ("fx", "export")),
    # 3. logsumexp
    "logsumexp": (lambda s, x: torch.logsumexp(x, 1), X3, D),
    "logsumexp_dims_keepdim": (lambda s, x: torch.logsumexp(x * 300, (0, 2), keepdim=True), X3, ("fx", "export")),
    # +inf and -inf entries (a row of only -inf would need log(0), outside the IR log's domain)
    "logsumexp_inf": (lambda s, x: x.logsumexp(-1), WITH_INF[:, [0, 1, 3]], ("fx", "export")),
    # 4. pixel shuffle
    "pixel_shuffle": (lambda s, x: F.pixel_shuffle(x, 2), X4, D),
    "pixel_unshuffle": (lambda s, x: F.pixel_unshuffle(x, 2), X4, D),
    "pixel_shuffle_module_unbatched": (lambda s, x: s.inner(x[0]), X4, ("fx", "export"), nn.PixelShuffle(2)),
    "pixel_unshuffle_module": (lambda s, x: s.inner(x + 1), X4, ("fx", "export"), nn.PixelUnshuffle(2)),
    # 5. flip and roll
    "flip": (lambda s, x: torch.flip(x * 2, [1]), X3, D),
    "flip_dims": (lambda s, x: x.flip(0, 2) + torch.flip(x, dims=(-1,)), X3, ("fx", "export")),
    "fliplr_flipud": (lambda s, x: torch.fliplr(x) - torch.flipud(x), X3, ("fx", "export")),
    "roll_dim": (lambda s, x: torch.roll(x, 2, 1), X3, D),
    "roll_dims": (lambda s, x: x.roll((1, -2), (0, 2)), X3, ("fx", "export")),
    "roll_flat": (lambda s, x: torch.roll(x, 5), X3, D),
    # 6. triangles
    "tril": (lambda s, x: torch.tril(x * 2), WITH_INF, D),
    "tril_diag": (lambda s, x: torch.tril(x + 1, 1), WITH_INF, ("fx", "export")),
    "triu_diag": (lambda s, x: (x - 1).triu(-1), WITH_INF, D),
    "triu_wide": (lambda s, x: torch.triu(x.transpose(1, 2), 2), X3, ("fx", "export")),
    # 7. activations
    "logsigmoid": (lambda s, x: F.logsigmoid(x * 40), X3, D),
    "logsigmoid_module": (lambda s, x: s.inner(x), X3, ("fx", "export"), nn.LogSigmoid()),
    "glu": (lambda s, x: F.glu(x), X3, D),
    "glu_module_dim": (lambda s, x: s.inner(x), X3, ("fx", "export"), nn.GLU(1)),
    "softmin": (lambda s, x: F.softmin(x, 1), X3, D),
    "softmin_module": (lambda s, x: s.inner(x), X3, ("fx", "export"), nn.Softmin(dim=-1)),
    # 10. outer, diff, repeat_interleave, prod
    "outer": (lambda s, x: torch.outer(x[0, 0], x[1, 1] * 2), X3, D),
    "ger_method": (lambda s, x: x[0, :, 0].outer(x[1, 1]), X3, ("fx", "export")),
    "diff": (lambda s, x: torch.diff(x, dim=1), X3, D),
    "diff_n2": (lambda s, x: x.diff(n=2), X3, ("fx", "export")),
    "diff_prepend_append": (lambda s, x: torch.diff(x, dim=1, prepend=x[:, :1] * 3, append=x[:, -2:]), X3,
                            ("fx", "export")),
    "repeat_interleave": (lambda s, x: x.repeat_interleave(2, dim=1), X3, D),
    "repeat_interleave_flat": (lambda s, x: torch.repeat_interleave(x, 3), X3, D),
    "repeat_interleave_last": (lambda s, x: x.repeat_interleave(2, -1), X3, ("fx", "export")),
    "prod": (lambda s, x: torch.prod(x, 1), X3, D),
    "prod_keepdim": (lambda s, x: x.prod(-1, keepdim=True), X3, ("fx", "export")),
    "prod_all": (lambda s, x: torch.prod(x[0]), X3, D),
    "inverse_trig_hyperbolic": (lambda s, x: (torch.atan(x), torch.arcsin(torch.tanh(x)), x.tanh().acos(),
                                              torch.sinh(x), x.cosh(), torch.arcsinh(x), (x.abs() + 1).acosh(),
                                              torch.atanh(torch.tanh(x) * 0.9)), X3, D),
    "exp2_log2_round_trunc": (lambda s, x: (torch.exp2(x), torch.log2(x.abs() + 0.5), torch.round(x * 4),
                                            (x * 3).trunc(), torch.fix(x * 3), x.round()), X3, D),
    "cumsum": (lambda s, x: (torch.cumsum(x, 1), x.cumsum(-1), torch.cumsum(x, dim=0, dtype=torch.float64)), X3, D),
    "sort_topk_values": (lambda s, x: (torch.sort(x, dim=1, descending=True).values, torch.topk(x, 2).values,
                                       x.sort(stable=True)[0], torch.topk(x, 3, dim=1, largest=False)[0],
                                       x.reshape(3, 12, 2).sort(-1).values.reshape(3, 4, 6)), X3, D),
    "gather": (lambda s, x: (torch.gather(x, 2, x.abs().argmax(2, keepdim=True).expand(3, 4, 2)),
                             x[:, :, 0].gather(0, torch.tensor([[2, 0, 1, 2]]))), X3, D),
    # (the decomposition of take_along_dim wraps indices with remainder, which has no exact IR form)
    "take_along_dim": (lambda s, x: torch.take_along_dim(x, x.argmax(1, keepdim=True), 1), X3, ("fx", "export")),
    "row_wise_index": (lambda s, x: (x[torch.arange(3), x[:, :, 0].argmax(-1)],
                                     x[:, torch.arange(4), x[0, :, :4].argmax(0)]), X3, ("fx", "export")),
    # integer running sums and arithmetic, exact on floats for ranges proven at import
    "integer_cumsum": (lambda s, x: ((x > 0).long().cumsum(1) * 3 - torch.cumsum(x < 0, -1)).float(), X3, D),
    # strided views of contiguous tensors (what decompositions leave of pooling)
    "as_strided": (lambda s, x: (torch.as_strided(x * 2, (3, 4), (4, 1), 2), torch.as_strided(x + 1, (2, 3), (1, 6)),
                                 F.adaptive_avg_pool2d(x, 1)), X3.reshape(2, 3, 12), ("export", "decomposed")),
    # adaptive pooling whose output size does not divide the input: PyTorch's variable windows
    "adaptive_avg_variable_windows": (lambda s, x: (F.adaptive_avg_pool2d(x, (3, 5)), F.adaptive_avg_pool1d(x[0], 4),
                                                    F.adaptive_avg_pool2d(x[:, :, :1, :1], 3)), X4, D),
    "adaptive_max_variable_windows": (lambda s, x: (F.adaptive_max_pool2d(x, (3, 4)), F.adaptive_max_pool1d(x[0], 5),
                                                    F.adaptive_max_pool3d(x.unsqueeze(0), (3, 3, 4))), X4, D),
    "adaptive_pool_modules": (lambda s, x: s.inner(x), X4, ("fx", "export"),
                              nn.Sequential(nn.AdaptiveAvgPool2d((7, None)), nn.AdaptiveMaxPool2d((5, 4)))),
    "max_dim_values_indices": (lambda s, x: (torch.max(x, dim=-1).values, x.min(1, keepdim=True).indices.float(),
                                             torch.max(x, 0)[0]), X3, D),
    # 11. nearest upsampling
    "interpolate_1d": (lambda s, x: F.interpolate(x, scale_factor=2), X3, D),
    "interpolate_2d_factors": (lambda s, x: F.interpolate(x, scale_factor=(2, 3), mode="nearest"), X4, D),
    "interpolate_2d_size": (lambda s, x: F.interpolate(x, size=(8, 18)), X4, ("fx", "export")),
    "interpolate_3d": (lambda s, x: F.interpolate(x, scale_factor=2.0), X4.reshape(2, 4, 2, 4, 6),
                       ("fx", "export")),
    "interpolate_nearest_exact": (lambda s, x: F.interpolate(x, scale_factor=3, mode="nearest-exact"), X4,
                                  ("fx", "export")),
    "interpolate_recompute": (lambda s, x: F.interpolate(x, scale_factor=2, recompute_scale_factor=True), X4,
                              ("fx", "export")),
    "upsample_module": (lambda s, x: s.inner(x), X4, ("fx", "export"), nn.Upsample(scale_factor=2)),
    "upsampling_nearest2d": (lambda s, x: s.inner(x), X4, ("fx", "export"), nn.UpsamplingNearest2d(size=(12, 12))),
    # linear interpolation (resize_linear): both coordinate modes, sizes and exact scale factors, 1-3 axes
    "bilinear_scale": (lambda s, x: F.interpolate(x, scale_factor=2, mode="bilinear"), X4, D),
    "bilinear_size_down": (lambda s, x: F.interpolate(x, size=(3, 4), mode="bilinear"), X4, D),
    "bilinear_align_corners": (lambda s, x: F.interpolate(x, size=(7, 5), mode="bilinear", align_corners=True), X4,
                               D),
    "bilinear_ratio_scale": (lambda s, x: F.interpolate(x, scale_factor=1.5, mode="bilinear"), X4, D),
    "bilinear_same_size": (lambda s, x: F.interpolate(x, size=(4, 6), mode="bilinear") * 2, X4, ("fx", "export")),
    # (core ATen keeps upsample_bilinear2d; it decomposes linear1d and trilinear3d into 3-tensor indexing)
    "linear_1d": (lambda s, x: F.interpolate(x, size=11, mode="linear"), X3, ("fx", "export")),
    "trilinear": (lambda s, x: F.interpolate(x, scale_factor=(1, 2, 0.5), mode="trilinear"),
                  X4.reshape(2, 4, 2, 4, 6), ("fx", "export")),
    "bilinear_module": (lambda s, x: s.inner(x), X4, ("fx", "export"), nn.UpsamplingBilinear2d(scale_factor=2)),
    "upsample_bilinear_module": (lambda s, x: s.inner(x), X4, ("fx", "export"),
                                 nn.Upsample(size=(5, 9), mode="bilinear")),
    # the resize op: nearest by other factors (where PyTorch's float32 index is the exact one), bicubic, antialias
    "nearest_fractional_scale": (lambda s, x: F.interpolate(x, scale_factor=1.5), X4, ("fx", "export")),
    "nearest_size_not_a_multiple": (lambda s, x: F.interpolate(x, size=(6, 9)), X4, ("fx", "export")),
    "nearest_exact_down": (lambda s, x: F.interpolate(x, size=(3, 4), mode="nearest-exact"), X4, ("fx", "export")),
    "bicubic": (lambda s, x: F.interpolate(x, scale_factor=2, mode="bicubic"), X4, ("fx", "export")),
    "bicubic_align_corners": (lambda s, x: F.interpolate(x, size=(5, 9), mode="bicubic", align_corners=True), X4,
                              ("fx", "export")),
    "bilinear_antialias": (lambda s, x: F.interpolate(x, size=(2, 3), mode="bilinear", antialias=True), X4,
                           ("fx", "export")),
    "bicubic_antialias": (lambda s, x: F.interpolate(x, size=(3, 2), mode="bicubic", antialias=True), X4,
                          ("fx", "export")),
    "sort_indices": (lambda s, x: torch.sort(x, 1).indices.float(), X3, ("fx", "export")),  # (topk_indices)
    "max_pool_indices": (lambda s, x: F.max_pool2d(x, 2, return_indices=True)[1].float(), X4, ("fx", "export")),
    "max_unpool": (lambda s, x: F.max_unpool2d(F.max_pool2d(x, 2, return_indices=True)[0],
                                               F.max_pool2d(x, 2, return_indices=True)[1], 2), X4, ("fx", "export")),
    "pow_tensor": (lambda s, x: torch.pow(x.abs() + 0.5, x), X4, ("fx", "export")),
    "int_pow": (lambda s, x: torch.pow((x > 0).long() * 3 - 1, (x > 0.5).long() + 2).float(), X4, ("fx", "export")),
}


@pytest.mark.parametrize("name", list(CASES))
def test_op_matches_torch_in_float64_and_float32(name):
    fn, x, vias, *inner = CASES[name]
    check(Fn(fn, *inner), x, vias)


def _randomized(module: nn.Module, seed: int = 3) -> nn.Module:
    """Non-trivial affine parameters and running statistics (positive variances)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in module.state_dict().items():
            if t.is_floating_point():
                t.copy_(torch.rand(t.shape, generator=g) + 0.5 if name.endswith("var") else
                        torch.randn(t.shape, generator=g))
    return module


def _assert_bound(b: tlb.Bundle, module: nn.Module, keys: list[str]) -> None:
    """Each key is bound, and its payload is the state_dict tensor under the binding's transform."""
    state = module.state_dict()
    for key in keys:
        uses = b.roles.uses(key)
        assert uses, f"{key} is not bound"
        for u in uses:
            want = apply_transform(u.transform, state[key].numpy())
            np.testing.assert_array_equal(b.payload.get(u.node, u.role), want)


class Norm(nn.Module):
    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        self.norm = norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x * 2)


RMS_CASES = {
    "default_eps": (lambda: nn.RMSNorm(6), X3, D),
    "two_dims": (lambda: nn.RMSNorm((4, 6), eps=1e-5), X3, ("fx", "export", "decomposed")),
    "no_affine": (lambda: nn.RMSNorm(6, eps=1e-6, elementwise_affine=False), X3, ("fx", "export")),
}


@pytest.mark.parametrize("name", list(RMS_CASES))
def test_rms_norm_matches_torch_and_binds_its_weight(name):
    make, x, vias = RMS_CASES[name]
    m = Norm(_randomized(make())).eval()
    eps = m.norm.eps if m.norm.eps is not None else torch.finfo(torch.float32).eps  # the imported dtype's eps
    weight = None if m.norm.weight is None else m.norm.weight.detach().double()
    ref64 = lambda x: F.rms_norm(x * 2, m.norm.normalized_shape, weight, eps)  # noqa: E731
    for b in check(m, x, vias, ref64=ref64):
        _assert_bound(b, m, [k for k in m.state_dict()])


class FunctionalRMS(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(rand(6, seed=4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (6,), self.scale, 1e-4)


def test_functional_rms_norm_binds_its_weight():
    m = FunctionalRMS().eval()
    for b in check(m, X3, D):
        _assert_bound(b, m, ["scale"])


INSTANCE_CASES = {
    "1d_plain": (lambda: nn.InstanceNorm1d(4), X3, ("fx", "export")),
    "2d_affine": (lambda: nn.InstanceNorm2d(8, affine=True), X4, D),
    "3d_affine": (lambda: nn.InstanceNorm3d(4, affine=True, eps=1e-3), X4.reshape(2, 4, 2, 4, 6), ("fx", "export")),
    "1d_unbatched": (lambda: nn.InstanceNorm1d(4, affine=True), X3[0], ("fx", "export")),
    "running_stats": (lambda: nn.InstanceNorm2d(8, affine=True, track_running_stats=True), X4, D),
}


@pytest.mark.parametrize("name", list(INSTANCE_CASES))
def test_instance_norm_matches_torch_and_binds_its_parameters(name):
    make, x, vias = INSTANCE_CASES[name]
    m = Norm(_randomized(make())).eval()
    for b in check(m, x, vias):
        _assert_bound(b, m, [k for k in m.state_dict() if not k.endswith("num_batches_tracked")])


class FunctionalInstance(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w, self.b = nn.Parameter(rand(4, seed=5)), nn.Parameter(rand(4, seed=6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.instance_norm(x, weight=self.w, bias=self.b, eps=1e-3)


def test_functional_instance_norm_binds_its_parameters():
    m = FunctionalInstance().eval()
    for b in check(m, X3, D):
        _assert_bound(b, m, ["w", "b"])


# name -> (forward, input, importers, op name(s) | separated, reason[, submodule])
REFUSED: dict[str, tuple[Any, ...]] = {
    "variance_no_dof": (lambda s, x: torch.var(x[:, :1], dim=1), X3, ("fx", "export"),
                        "var", "n - correction <= 0"),
    "negative_norm_order": (lambda s, x: torch.linalg.vector_norm(x, -1, dim=1), X3, ("fx", "export"),
                            "vector_norm", "negative orders are not supported"),
    "nuclear_norm": (lambda s, x: torch.norm(x[0], p="nuc"), X3, ("fx",), "norm", "p='nuc'"),
    "bilinear_scale_not_out_over_in": (lambda s, x: F.interpolate(x, scale_factor=1.3, mode="bilinear"), X4,
                                       ("fx", "export"), "interpolate|upsample_bilinear2d",
                                       "coordinates then use the scale"),
    "tensor_repeats": (lambda s, x: x.repeat_interleave(torch.tensor([1, 2, 1, 2]), dim=1), X3, ("fx",),
                       "repeat_interleave", "tensor repeats"),
    "batch_statistics": (lambda s, x: s.inner(x), X4, ("fx", "export", "decomposed"), "batch", "batch statistics",
                         nn.BatchNorm2d(8, track_running_stats=False)),
    "round_decimals": (lambda s, x: torch.round(x, decimals=2), X3, ("fx", "export"), "round", "decimals=2"),
    "two_index_tensors_not_row_wise": (lambda s, x: x[torch.tensor([0, 2]), x[0, :2, 0].argmax(0, keepdim=True)], X3,
                                       ("fx", "export"), "getitem|index", "only x[..., arange(n), j]"),
    "integer_cumsum_unbounded": (lambda s, x: (x * 100).long().cumsum(1), X3, ("fx", "export"), "cumsum",
                                 "running sum of int64 values whose range is not known at import"),
    "integer_prod": (lambda s, x: (x > 0).long().prod(1), X3, ("fx", "export"), "prod", "integer"),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_unsupported_variant_is_refused_with_its_reason(name):
    fn, x, vias, op, reason, *inner = REFUSED[name]
    for via in vias:
        with pytest.raises(UnsupportedError) as info:
            IMPORTERS[via](Fn(fn, *inner).eval(), (x,))
        message = str(info.value)
        assert any(o in message for o in op.split("|")), message
        assert reason in message, message
