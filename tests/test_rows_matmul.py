"""``rules.affine.rows_matmul``: a stack times one shared matrix or vector as one GEMM, against numpy's
stacked matmul."""

from __future__ import annotations

import math

import numpy as np
import pytest

from semantics.rules.affine import rows_matmul


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("m_shape", [(7, 5), (7,)])
def test_one_gemm_agrees_with_the_stacked_product(dtype, m_shape):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 3, 2, 7)).astype(dtype)
    m = rng.standard_normal(m_shape).astype(dtype)
    want = np.matmul(x, m)
    tol = 1e-12 if dtype == np.float64 else 1e-5
    got = rows_matmul(x, m)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    np.testing.assert_allclose(rows_matmul(x[:, ::2], m), np.matmul(x[:, ::2], m), rtol=tol, atol=tol)


def test_stacks_of_matrices_and_operator_objects_keep_numpys_product():
    rng = np.random.default_rng(1)
    x, m = rng.standard_normal((3, 2, 4)), rng.standard_normal((3, 4, 5))
    np.testing.assert_array_equal(rows_matmul(x, m), np.matmul(x, m))

    class Operator:  # as chain.ConvOperator: numpy defers ``@`` to it
        __array_ufunc__ = None

        def __rmatmul__(self, other):
            return ("applied", other.shape)

    assert rows_matmul(x, Operator()) == ("applied", (3, 2, 4))


@pytest.mark.parametrize("shape", [(6, 7), (6, 3, 7)])
def test_a_broadcast_row_is_multiplied_once_and_repeated(shape):
    """A leading axis of stride 0 (the shared IBP's magnitudes in branch and bound): the result equals
    the product of the full array, is writable and contiguous, and the product sees one sample only."""
    rng = np.random.default_rng(2)
    x = np.broadcast_to(rng.standard_normal((1,) + shape[1:]), shape)
    seen = []

    class Recording(np.ndarray):  # records the left operand of every matmul it takes part in
        def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
            seen.append(np.shape(inputs[0]))
            plain = [np.asarray(a) if isinstance(a, Recording) else a for a in inputs]
            return getattr(ufunc, method)(*plain, **kwargs)

    m_plain = rng.standard_normal((7, 4))
    got = rows_matmul(x, m_plain.view(Recording))
    want = np.matmul(np.ascontiguousarray(x), m_plain)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-13, atol=1e-13)
    assert got.shape == want.shape and got.flags.writeable and got.flags.c_contiguous
    assert seen and sum(math.prod(s[:-1]) for s in seen) == math.prod(shape[1:-1])
