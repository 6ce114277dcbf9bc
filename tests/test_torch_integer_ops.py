"""torch's integer and bitwise operators through both importers: fmod / remainder / % (int64 exact,
float as numpy's fmod/mod), & | ^ ~ on integers and bools, against torch's own results exactly."""

from __future__ import annotations

import numpy as np
import pytest

import torchlean_bridge as tlb

torch = pytest.importorskip("torch")

INTS = (torch.tensor([7, -7, 5, 12, -9, 0, 2**40 + 3]), torch.tensor([3, 3, -2, 5, -4, 7, -(2**35) - 1]))
_rng = np.random.default_rng(21)
FLOATS = (torch.from_numpy(_rng.standard_normal(64) * 10), torch.from_numpy(_rng.standard_normal(64) * 3))
BOOLS = (torch.tensor([True, False, True, False]), torch.tensor([True, True, False, False]))

CASES = {
    "fmod": (torch.fmod, INTS), "remainder": (torch.remainder, INTS), "mod_operator": (lambda a, b: a % b, INTS),
    "fmod_float": (torch.fmod, FLOATS), "remainder_float": (torch.remainder, FLOATS),
    "mod_operator_float": (lambda a, b: a % b, FLOATS), "method_fmod": (lambda a, b: a.fmod(b), INTS),
    "and": (lambda a, b: a & b, INTS), "or": (lambda a, b: a | b, INTS), "xor": (lambda a, b: a ^ b, INTS),
    "bitwise_and": (torch.bitwise_and, INTS), "bitwise_xor_method": (lambda a, b: a.bitwise_xor(b), INTS),
    "invert": (lambda a, b: ~a ^ b, INTS), "and_scalar": (lambda a, b: (a & 6) | b, INTS),
    "and_bool": (lambda a, b: a & b, BOOLS), "or_bool": (lambda a, b: a | b, BOOLS),
    "xor_bool": (lambda a, b: a ^ b, BOOLS), "invert_bool": (lambda a, b: ~a & b, BOOLS),
    "logical_not_int": (lambda a, b: torch.logical_not(a) & (b > 0), INTS),
}


class _Binary(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, a, b):
        return self.fn(a, b)


@pytest.mark.parametrize("importer", ["import_fx", "import_export"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_integer_and_bitwise_operators_agree_with_torch_exactly(name, importer):
    fn, (a, b) = CASES[name]
    bundle = getattr(tlb, importer)(_Binary(fn).eval(), (a, b))
    got = tlb.evaluate(bundle.graph, bundle.payload, [a.numpy(), b.numpy()])[0]
    want = fn(a, b).numpy()
    assert got.dtype.kind == want.dtype.kind
    np.testing.assert_array_equal(got, want)

