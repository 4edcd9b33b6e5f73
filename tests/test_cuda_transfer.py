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
    cuda.write(b, b_host)  # the staging buffer again, right after a's upload
    a_host_copy = a_host.copy()
    a_host[:] = 0  # the host array may change once the call returns
    np.testing.assert_array_equal(cuda.to_host(a), a_host_copy)
    np.testing.assert_array_equal(cuda.to_host(b), b_host)
    view = b[1000 : 1000 + N // 2]
    np.testing.assert_array_equal(cuda.to_host(view), b_host[1000 : 1000 + N // 2])


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


@pytest.mark.parametrize("n", [N, 1000])  # staged, and on the driver's path
def test_download_async_copies_what_was_there_when_it_was_queued(cuda, n):
    values = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    x = cuda.from_host(values)
    out = np.full(n, np.nan, np.float32)
    pending = cuda.download_async(x, out)
    cuda.fill(x, 5.0)  # queued after the download: not in `out`
    cuda.finish_download(pending)
    np.testing.assert_array_equal(out, values)
    assert np.all(cuda.to_host(x) == 5.0)
    with pytest.raises(ValueError, match="download_async"):
        cuda.download_async(x, np.empty(n + 1, np.float32))


def test_predict_in_parts_matches_predict_on_the_gpu():
    from pathlib import Path

    import darknet_py as dn
    from darknet_py.backends import cuda_available
    from darknet_py.bench import prepare

    cfg = Path(__file__).resolve().parents[2] / "shared" / "darknet-cfg" / "yolov3-tiny.cfg"
    if not cuda_available() or not cfg.is_file():
        pytest.skip(f"needs a CUDA GPU and {cfg}")
    # Parts of 8: 8.3 MiB in, 5.5 MiB out, both through the staging and the copy stream.
    net = dn.load_network(cfg, batch=8, device="cuda")
    prepare(net)
    x = np.random.default_rng(2).random((24,) + net.input_shape, dtype=np.float32)
    per_part = np.concatenate([net.predict(x[i : i + 8]) for i in range(0, 24, 8)])
    for _ in range(3):  # eager, then captured, then replayed
        parts = net.predict_in_parts(x, 8)
        np.testing.assert_array_equal(parts, per_part)
    np.testing.assert_allclose(parts, net.predict(x), rtol=1e-4, atol=1e-5)


def test_upload_async_of_pageable_memory_is_staged_and_of_pinned_memory_is_not(cuda):
    values = np.random.default_rng(3).standard_normal(N).astype(np.float32)
    x, upload = cuda.upload_async(values)
    cuda.wait_upload(upload)
    cuda.finish_upload(upload)
    values_copy = values.copy()
    values[:] = 0  # read already: the staged copy returned after it
    np.testing.assert_array_equal(cuda.to_host(x), values_copy)
    assert cuda._staged(values.nbytes, values)
    unpin = cuda.pin(values)
    try:
        assert not cuda._staged(values.nbytes, values)
        assert not cuda._staged(values[N // 2 :].nbytes, values[N // 2 :])
    finally:
        unpin()
    assert cuda._staged(values.nbytes, values)


def test_a_single_chunk_is_staged_without_the_threads(cuda, monkeypatch):
    from darknet_py.backends import cuda_transfer

    monkeypatch.setattr(cuda_transfer, "MIN_STAGED_BYTES", 1 << 16)
    monkeypatch.setattr(cuda_transfer, "MIN_STAGED_DOWNLOAD_BYTES", 1 << 16)
    values = np.random.default_rng(4).standard_normal(300_000).astype(np.float32)
    assert cuda._staged(values.nbytes, values) and values.nbytes < cuda_transfer.CHUNK_BYTES
    x = cuda.from_host(values)
    np.testing.assert_array_equal(cuda.to_host(x), values)
    out = np.empty_like(values)
    pending = cuda.download_async(x, out)
    cuda.fill(x, 1.0)
    cuda.finish_download(pending)
    np.testing.assert_array_equal(out, values)


def test_copies_larger_than_the_staging_cap_go_in_rounds(cuda, monkeypatch):
    from darknet_py.backends import cuda_transfer

    monkeypatch.setattr(cuda_transfer, "STAGING_CAP_BYTES", 5 << 20)  # N floats: 3 rounds
    cuda._transfers.close()  # staging buffers of the earlier tests go
    values = np.random.default_rng(5).standard_normal(N).astype(np.float32)
    x = cuda.from_host(values)
    np.testing.assert_array_equal(cuda.to_host(x), values)
    out = np.empty_like(values)
    pending = cuda.download_async(x, out)
    cuda.fill(x, 2.0)
    cuda.finish_download(pending)
    np.testing.assert_array_equal(out, values)
    assert cuda._transfers._up.buffer.nbytes <= 5 << 20
    assert cuda._transfers._down.buffer.nbytes <= 5 << 20
