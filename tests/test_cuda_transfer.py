"""Large copies through the page-locked staging (backends/cuda_transfer.py): exact values,
chunk edges, ordering with queued kernels, staging reuse, views and int arrays."""
import numpy as np
import pytest

pytestmark = pytest.mark.gpu

# Over the staging threshold, not a whole number of chunks or floats per chunk.
N = 3 * (4 << 20) // 4 + 12345


def test_large_round_trips_are_exact(cuda):
    from darknet_py.backends import cuda_transfer
    assert N * 4 >= cuda_transfer.MIN_STAGED_BYTES
    rng = np.random.default_rng(0)
    a_host = rng.standard_normal(N).astype(np.float32)
    b_host = rng.standard_normal(N).astype(np.float32)
    a = cuda.from_host(a_host)
    b = cuda.empty(N)
    cuda.fill(b, np.nan)
    cuda.write(b, b_host)          # the staging buffer again, right after a's upload
    a_host_copy = a_host.copy()
    a_host[:] = 0                  # the host array may change once the call returns
    np.testing.assert_array_equal(cuda.to_host(a), a_host_copy)
    np.testing.assert_array_equal(cuda.to_host(b), b_host)
    view = b[1000:1000 + N // 2]
    np.testing.assert_array_equal(cuda.to_host(view), b_host[1000:1000 + N // 2])


def test_a_download_waits_for_the_work_queued_before_it(cuda):
    x = cuda.from_host(np.zeros(N, np.float32))
    for value in (1.0, 2.0, 3.0):
        cuda.fill(x, value)
        host = cuda.to_host(x)
        assert host.shape == (N,) and np.all(host == value)


def test_large_int_arrays_come_back_as_int64(cuda):
    ints = cuda.int_zeros(N)
    values = np.arange(N, dtype=np.int32) - 7
    cuda.write(ints, values)
    back = cuda.to_host(ints)
    assert back.dtype == np.int64
    np.testing.assert_array_equal(back, values)
