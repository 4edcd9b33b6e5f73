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
