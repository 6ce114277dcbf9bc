"""How the torch importers treat the model's own Python: wrapped functions, aliases, folded in-place
writes, the module's state, and where failures point.

Each import is compared with the module in float64 (1e-12, relative to the output's scale): the
lowerings are exact.
"""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest
import torch
import torch.nn as nn

import torchlean_bridge as tlb
from importers.torch.common import source_line
from importers.torch.targets import ALIASES, FUNCTIONS, METHODS
from torchlean_bridge.errors import BridgeError, UnsupportedError

warnings.filterwarnings("ignore", category=FutureWarning)


def _close(bundle: tlb.Bundle, module: nn.Module, *inputs: torch.Tensor) -> None:
    with torch.no_grad():
        want = copy.deepcopy(module).double()(*(x.double() if x.is_floating_point() else x for x in inputs))
    got = tlb.evaluate(bundle.graph, bundle.payload, *(x.double().numpy() if x.is_floating_point() else x.numpy()
                                                       for x in inputs), dtype="float64")
    want = want if isinstance(want, (tuple, list)) else (want,)
    for g, w in zip(got, want):
        w = w.numpy()
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12 * max(1.0, float(np.abs(w).max())))


def scaled_residual(x: torch.Tensor, weight: torch.Tensor, scale: float, mode: str = "row") -> torch.Tensor:
    """A function FX keeps as one call (wrapped below), with Python control flow on its arguments."""
    if mode == "row":
        return x + scale * torch.nn.functional.linear(x, weight)
    return x - scale * x.sum(-1, keepdim=True)


torch.fx.wrap("scaled_residual")


class Wrapped(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(6, 6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return scaled_residual(scaled_residual(x, self.weight, 0.5), self.weight, 2.0, mode="col")


def test_a_wrapped_function_is_lowered_by_its_body_with_its_weights_bound():
    module = Wrapped().eval()
    x = torch.randn(3, 6)
    gm = torch.fx.symbolic_trace(module)
    assert [n.target for n in gm.graph.nodes if n.op == "call_function"] == [scaled_residual, scaled_residual]
    bundle = tlb.import_fx(module, (x,))
    _close(bundle, module, x)
    assert set(bundle.roles) == {"weight"}  # the argument kept its state_dict key inside the body
    assert "linear" in bundle.graph.ops_used()
    names = {n.source.name for n in bundle.graph if n.source is not None and n.source.name}
    assert any(name.startswith("scaled_residual.") for name in names), names


class Aliases(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (torch.swapaxes(x, 0, 1), x.swapdims(1, 2), torch.arctan(x), x.clip(-0.5, 0.5), torch.subtract(x, 1),
                torch.multiply(x, x), torch.divide(x, 3), torch.greater(x, 0).float(), torch.negative(x),
                torch.concatenate([x, x], 1), torch.fix(x * 3))


@pytest.mark.parametrize("via", ["fx", "export"])
def test_aliases_lower_as_their_operation(via):
    module, x = Aliases().eval(), torch.randn(2, 3, 4)
    bundle = tlb.import_fx(module, (x,)) if via == "fx" else tlb.import_export(module, (x,))
    _close(bundle, module, x)


def test_every_alias_is_the_same_operation_as_its_canonical_name():
    x = torch.randn(3, 4).clamp(-0.9, 0.9)
    checked = 0
    for alias, canonical in ALIASES.items():
        a, c = getattr(torch, alias, None), getattr(torch, canonical, None)
        if a is None or c is None or canonical in ("cat", "transpose", "outer"):
            continue
        args = (x, 0.25) if canonical in ("sub", "mul", "div", "gt", "ge", "lt", "le", "ne", "clamp") else (x,)
        assert torch.allclose(a(*args), c(*args), rtol=0, atol=0, equal_nan=True), alias
        assert FUNCTIONS[a] is FUNCTIONS[c] and METHODS.get(alias) is METHODS.get(canonical), alias
        checked += 1
    assert checked >= 15


class MaskBySliceAssignment(nn.Module):
    """Swin's attention mask: a zero tensor written region by region, then used as data."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = x.new_zeros(4, 6)
        count = 0
        for h in (slice(0, 2), slice(2, 4)):
            for w in (slice(0, 3), slice(3, 6)):
                mask[h, w] = count
                count += 1
        table = torch.zeros(4, 6)
        table[1] = torch.arange(6.0)
        table.index_put_((torch.tensor([0]),), torch.tensor(7.0))
        return x * mask + table


@pytest.mark.parametrize("decompose", [False, True])
def test_in_place_writes_into_input_independent_tensors_fold_at_import(decompose):
    module, x = MaskBySliceAssignment().eval(), torch.randn(2, 4, 6)
    bundle = tlb.import_export(module, (x,), decompose=decompose)
    _close(bundle, module, x)
    assert set(bundle.graph.ops_used()) <= {"input", "const", "mul_elem", "add", "broadcast_to"}


class CachesInForward(nn.Module):
    """timm's LeViT: a value computed from a parameter is cached in a dict attribute by forward."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.cache: dict[str, torch.Tensor] = {}
        self.seen: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if "bias" not in self.cache:
            self.cache["bias"] = self.lin.weight * 2
        self.seen.append(1)
        return self.lin(x) + self.cache["bias"]


@pytest.mark.parametrize("via", ["fx", "export"])
def test_importing_leaves_the_users_module_unchanged(via):
    module, x = CachesInForward().eval(), torch.randn(4, 4)
    bundle = tlb.import_fx(module, (x,)) if via == "fx" else tlb.import_export(module, (x,))
    assert module.cache == {} and module.seen == []
    _close(bundle, module, x)
    with torch.no_grad():
        module(x)  # runs (no Proxy or fake tensor left in its cache) and caches a real tensor
    assert type(module.cache["bias"]) is torch.Tensor and module.seen == [1]


class IntOfSize(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, : int(x.shape[1] / 2)]


class SliceByTensor(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, : x.shape[1] // torch.tensor(2)] * 2


class BranchOnData(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x if x.sum() > 0 else -x


def test_symbolic_trace_failures_name_their_actual_cause_and_line():
    x = torch.randn(2, 4)
    with pytest.raises(BridgeError) as info:
        tlb.import_fx(BranchOnData().eval(), (x,))
    message = str(info.value)
    assert "data-dependent control flow" in message and "test_import_torch_behaviour.py:" in message
    assert "use import_export" in message
    with pytest.raises(BridgeError) as info:
        tlb.import_fx(IntOfSize().eval(), (x,))
    message = str(info.value)
    assert "TypeError" in message and "data-dependent" not in message and "use import_export" in message
    assert f"test_import_torch_behaviour.py:{IntOfSize.forward.__code__.co_firstlineno + 1}" in message


@pytest.mark.parametrize("via", ["fx", "export"])
def test_a_slice_bound_computed_at_import_is_its_integer(via):
    module, x = SliceByTensor().eval(), torch.randn(2, 4)
    bundle = tlb.import_fx(module, (x,)) if via == "fx" else tlb.import_export(module, (x,))
    _close(bundle, module, x)


def test_source_lines_of_model_libraries_named_like_torch_are_the_models():
    torch_dir = torch.__file__.rsplit("/", 1)[0]
    site = torch_dir.rsplit("/", 1)[0]
    trace = (f'File "{site}/torchvision/models/convnext.py", line 63, in forward\n'
             f'File "{torch_dir}/nn/modules/module.py", line 1789, in _call_impl\n'
             f'File "{site}/torchvision/ops/stochastic_depth.py", line 71, in forward\n')
    assert source_line(trace) == f"{site}/torchvision/ops/stochastic_depth.py:71"


class Unsupported(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.special.bessel_j0(x)


def test_unsupported_targets_point_at_the_models_line():
    with pytest.raises(UnsupportedError) as info:
        tlb.import_fx(nn.Sequential(nn.Linear(3, 3), Unsupported()).eval(), (torch.randn(2, 3),))
    line = Unsupported.forward.__code__.co_firstlineno + 1
    assert f"test_import_torch_behaviour.py:{line}" in str(info.value), str(info.value)


class PositionIds(nn.Module):
    """RoBERTa's position ids: a running count of the non-padding tokens, offset by the padding id."""

    def __init__(self) -> None:
        super().__init__()
        self.positions = nn.Embedding(16, 4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        mask = ids.ne(1).int()
        positions = (torch.cumsum(mask, dim=1).type_as(mask) + 0) * mask
        return self.positions(positions.long() + 1)


IDS = torch.tensor([[5, 7, 9, 2, 1, 1], [3, 1, 4, 1, 5, 9]])


@pytest.mark.parametrize("via", ["export", "decomposed"])
def test_integer_running_sums_and_arithmetic_are_exact(via):
    module = PositionIds().eval()
    bundle = tlb.import_export(module, (IDS,), decompose=via == "decomposed")
    _close(bundle, module, IDS)
    (lo, hi), = tlb.interval_bounds(bundle.graph, bundle.payload, [IDS.numpy()], [IDS.numpy()], all_nodes=False)
    want = module(IDS).detach().double().numpy()
    assert np.all(lo <= want) and np.all(want <= hi) and float(np.max(hi - lo)) < 1e-6  # point indices stay points


class UnboundedIntegers(nn.Module):
    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return (ids * ids + 1).float()


def test_integer_arithmetic_without_a_proven_range_is_refused():
    with pytest.raises(UnsupportedError, match=r"product of int64 values whose range is not known at import"):
        tlb.import_export(UnboundedIntegers().eval(), (IDS,))
