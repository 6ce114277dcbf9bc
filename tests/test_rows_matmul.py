"""``rules.affine.rows_matmul``: a stack times one shared matrix or vector as one GEMM, against numpy's
stacked matmul."""

from __future__ import annotations

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
