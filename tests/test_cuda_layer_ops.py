"""The CUDA kernels of issue 23's layers ([logistic], [l2norm], [lrn], binary convolution)
against the NumPy reference, as tests/test_cuda_ops.py does it: float64 NumPy is the
reference, arrays an op only writes are poisoned with NaN first."""

import numpy as np
import pytest
from test_cuda_ops import check, nan, rand

gpu = pytest.mark.gpu


@gpu
@pytest.mark.parametrize("n", [1, 1001, 30011])
def test_logistic_x_ent(cuda, n):
    rng = np.random.default_rng(n)
    pred = rand(rng, n, 0.01, 0.99)
    truth = rand(rng, n, 0.0, 1.0)
    truth[rng.random(n) < 0.3] = 0
    truth[rng.random(n) < 0.3] = 1
    check(cuda, "logistic_x_ent", pred, truth, nan(n), nan(n))


@gpu
@pytest.mark.parametrize("batch,filters,spatial", [(1, 1, 1), (2, 5, 13), (3, 64, 97)])
def test_l2normalize(cuda, batch, filters, spatial):
    rng = np.random.default_rng(filters)
    check(cuda, "l2normalize", rand(rng, batch * filters * spatial), batch, filters, spatial)


@gpu
@pytest.mark.parametrize(
    "batch,c,spatial,size",
    [(1, 1, 1, 5), (2, 7, 13, 3), (2, 7, 13, 5), (3, 32, 50, 4), (1, 3, 9, 9)],
)
def test_lrn(cuda, batch, c, spatial, size):
    rng = np.random.default_rng(c * size)
    n = batch * c * spatial
    x = rand(rng, n)
    check(cuda, "lrn_forward", x, batch, c, spatial, size, 0.3, 0.75, 2.0, nan(n), nan(n))
    norms = rand(rng, n, 0.5, 3.0)
    check(cuda, "lrn_backward", norms, rand(rng, n), 0.75, rand(rng, n))


@gpu
@pytest.mark.parametrize("n,size", [(1, 1), (5, 27), (64, 1152), (300, 9)])
def test_binarize_weights(cuda, n, size):
    rng = np.random.default_rng(n)
    check(
        cuda,
        "binarize_weights",
        rand(rng, n * size),
        n,
        size,
        nan(n * size),
        tol=1e-5 if size <= 1000 else 1e-4,
    )


@gpu
@pytest.mark.parametrize("n", [1, 1001, 30011])
def test_binarize(cuda, n):
    rng = np.random.default_rng(n)
    x = rand(rng, n)
    x[::7] = 0  # zero goes to -1, as on Darknet's CPU
    check(cuda, "binarize", x, nan(n), exact=True)
