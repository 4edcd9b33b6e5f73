"""Batches uploaded ahead (Network.prefetch, the backends' upload ops, the loader's pinned
slots): the same training as plain uploads, on both backends."""

from multiprocessing import shared_memory

import numpy as np
import pytest
from helpers import CLASSIFIER_CFG, Lines, data_file, param_arrays, weights_floats

from darknet_py.backends import cuda_available, get_backend
from darknet_py.backends.numpy_backend import NumpyBackend
from darknet_py.backends.pinning import unpin_nothing
from darknet_py.cfg import parse_cfg_text
from darknet_py.data.augment import ClassifierAugment
from darknet_py.data.loader import DataLoader
from darknet_py.network import Network
from darknet_py.train import train


def gpu(test):
    return pytest.mark.gpu(
        pytest.mark.skipif(not cuda_available(), reason="needs PyCUDA and a CUDA GPU")(test)
    )


class WriteCountingBackend(NumpyBackend):
    """The NumPy backend, counting the plain uploads (write) of `size` floats."""

    def __init__(self, size):
        super().__init__()
        self.size, self.writes = size, 0

    def write(self, arr, host):
        self.writes += arr.size == self.size
        super().write(arr, host)


def tiny_net(backend, batch=8, subdivisions=2):
    text = CLASSIFIER_CFG.format(
        batch=batch, subdivisions=subdivisions, momentum=0.9, max_batches=10
    )
    return Network(parse_cfg_text(text), "tiny.cfg", backend=backend, seed=3)


def random_batches(count, batch=8, seed=0):
    rng = np.random.default_rng(seed)
    return [
        (
            rng.random((batch, 1, 12, 12), dtype=np.float32),
            np.eye(2, dtype=np.float32)[rng.integers(0, 2, batch)],
        )
        for _ in range(count)
    ]


def train_prefetching(net, batches):
    """The training loop's hand-over: batch k+1 is prefetched before iteration k runs."""
    net.prefetch(*batches[0])
    for k, (x, truth) in enumerate(batches):
        if k + 1 < len(batches):
            net.prefetch(*batches[k + 1])
        net.train_iteration(x, truth)
    net.finish_prefetch()


def test_prefetched_batches_train_as_plain_uploads_and_are_not_copied_again():
    batches = random_batches(4)
    pass_floats = 4 * 12 * 12  # one pass of subdivisions=2: 4 images
    ahead = tiny_net(WriteCountingBackend(pass_floats))
    plain = tiny_net(WriteCountingBackend(pass_floats))
    train_prefetching(ahead, batches)
    for x, truth in batches:
        plain.train_iteration(np.array(x), truth)
    for a, b in zip(param_arrays(ahead), param_arrays(plain)):
        np.testing.assert_array_equal(a, b)
    # Each pass's rows came from its prefetched upload (the second pass from row 4 on).
    assert (ahead.be.writes, plain.be.writes) == (0, 8)
    # An array never prefetched is uploaded plainly, prefetched arrays still held or not.
    x = batches[0][0][:4].copy()
    ahead.forward(x)
    assert ahead.be.writes == 1


def test_a_prefetched_array_is_matched_by_its_rows_only():
    net = tiny_net(NumpyBackend(), batch=4, subdivisions=1)
    x, truth = random_batches(1, batch=8)[0]
    net.prefetch(x[:4], truth[:4])
    rows = net._prefetched_rows(x[2:6])  # overlaps the prefetched rows, is not inside
    assert rows is None
    np.testing.assert_array_equal(net._prefetched_rows(x[1:3]), x[1:3].reshape(-1))


def test_loader_pins_its_shared_memory_slots_and_unpins_them_at_close(bars):
    pinned, unpinned = [], []

    def pin(host):
        region = (host.__array_interface__["data"][0], host.nbytes)
        pinned.append(region)
        return lambda: unpinned.append(region)

    paths = (bars / "train.list").read_text().split()
    loader = DataLoader(
        paths,
        task="classifier",
        width=12,
        height=12,
        batch=4,
        classes=2,
        labels=["horiz", "vert"],
        channels=1,
        augment=ClassifierAugment(),
        seed=0,
        workers=1,
        pin=pin,
    )
    with loader:
        for _ in range(3):
            batch = loader.next_batch()
            for array in batch:  # built straight into pinned memory: no staging copy
                start = array.__array_interface__["data"][0]
                assert any(
                    first <= start and start + array.nbytes <= first + size
                    for first, size in pinned
                )
        del batch, array
    assert pinned and sorted(unpinned) == sorted(pinned)


def test_the_training_loop_hands_every_batch_over_ahead(bars, tmp_path, monkeypatch):
    pass_floats = 4 * 12 * 12  # batch 8 in 2 subdivisions of 12x12 grey images
    found = []  # per pass input: did it come from a prefetch?
    prefetched_rows = Network._prefetched_rows

    def recording(self, x):
        rows = prefetched_rows(self, x)
        if x.size == pass_floats:
            found.append(rows is not None)
        return rows

    monkeypatch.setattr(Network, "_prefetched_rows", recording)
    cfg = tmp_path / "tiny.cfg"
    cfg.write_text(CLASSIFIER_CFG.format(batch=8, subdivisions=2, momentum=0.9, max_batches=5))
    result = train(
        str(cfg), data_file(bars, tmp_path / "backup"), device="cpu", log=Lines(), workers=1
    )
    assert result.iterations == 5 and found == [True] * 10


# ---- on the GPU ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cuda():
    return get_backend("cuda:0")


@gpu
@pytest.mark.parametrize("subdivisions", [1, 2])
def test_gpu_prefetched_training_equals_plain_uploads(cuda, subdivisions):
    batches = random_batches(4)
    ahead, plain = (tiny_net(cuda, subdivisions=subdivisions) for _ in range(2))
    ahead.prefetch(*batches[0])
    for k, (x, truth) in enumerate(batches):
        if k + 1 < len(batches):
            ahead.prefetch(*batches[k + 1])
        if ahead._input_buf is not None:  # poisoned: the prefetched copy must fill it
            cuda.fill(ahead._input_buf, np.nan)
        ahead.train_iteration(x, truth)
        plain.train_iteration(np.array(x), np.array(truth))
        assert ahead.cost == plain.cost
    ahead.finish_prefetch()
    for a, b in zip(param_arrays(ahead), param_arrays(plain)):
        np.testing.assert_array_equal(a, b)


@gpu
def test_gpu_upload_from_pinned_shared_memory(cuda):
    segment = shared_memory.SharedMemory(create=True, size=4 * 100_000)
    try:
        host = np.frombuffer(segment.buf, np.float32)
        host[:] = np.arange(host.size, dtype=np.float32)
        unpin = cuda.pin(np.frombuffer(segment.buf, np.uint8))
        assert unpin is not unpin_nothing, "the driver refused to pin shared memory"
        queued = cuda.from_host(np.zeros(host.size, np.float32))
        cuda.fill(queued, 1.0)  # compute work queued before the upload
        array, upload = cuda.upload_async(host[5:])
        cuda.wait_upload(upload)
        cuda.axpy(1.0, array, queued[5:])
        cuda.finish_upload(upload)
        np.testing.assert_array_equal(cuda.to_host(queued)[5:], host[5:] + 1)
        unpin()
        del host, array, upload  # the upload holds a view of the segment until it goes
    finally:
        segment.close()
        segment.unlink()


@gpu
def test_gpu_training_run_is_the_same_with_pinned_worker_slots_or_in_process(cuda, bars, tmp_path):
    cfg = tmp_path / "tiny.cfg"
    cfg.write_text(CLASSIFIER_CFG.format(batch=8, subdivisions=2, momentum=0.9, max_batches=6))
    finals = []
    for workers in (0, 2):
        backup = tmp_path / f"backup{workers}"
        result = train(
            str(cfg), data_file(bars, backup), device="cuda:0", log=Lines(), workers=workers, seed=1
        )
        finals.append(weights_floats(result.final_weights))
    assert finals[0][0] == finals[1][0] == 6 * 8
    np.testing.assert_array_equal(finals[0][1], finals[1][1])
