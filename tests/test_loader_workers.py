"""The data loader's worker processes: what they make (yolov4's mosaic batches equal those
of the code before the fast paths) and how they run (one thread each, freed memory kept)."""

import os
import subprocess
import sys

import augment_reference as before
import cv2
import numpy as np
import pytest

from darknet_py.data import loader as L
from darknet_py.data.augment_fork import ForkAugment

YOLOV4 = dict(jitter=0.3, hue=0.1, saturation=1.5, exposure=1.5, flip=True, mosaic=True)


@pytest.fixture
def jpeg_set(tmp_path):
    """8 JPEGs of 416x416 and 640x480 with 1-3 boxes each, labels where Darknet looks."""
    rng = np.random.default_rng(0)
    (tmp_path / "images").mkdir()
    (tmp_path / "labels").mkdir()
    paths = []
    for i in range(8):
        w, h = (416, 416) if i % 2 else (640, 480)
        small = rng.integers(0, 256, (h // 16, w // 16, 3), np.uint8)
        image = cv2.resize(small, (w, h), interpolation=cv2.INTER_CUBIC)
        path = tmp_path / "images" / f"{i}.jpg"
        cv2.imwrite(str(path), image)
        boxes = [
            f"{rng.integers(3)} {rng.uniform(0.3, 0.7):.6f} {rng.uniform(0.3, 0.7):.6f} "
            f"{rng.uniform(0.1, 0.5):.6f} {rng.uniform(0.1, 0.5):.6f}\n"
            for _ in range(int(rng.integers(1, 4)))
        ]
        (tmp_path / "labels" / f"{i}.txt").write_text("".join(boxes))
        paths.append(str(path))
    return paths


def batches(paths, count, workers, **options):
    with L.DataLoader(
        paths,
        task="detector",
        width=416,
        height=416,
        batch=6,
        classes=3,
        augment=ForkAugment(**YOLOV4),
        seed=3,
        workers=workers,
        **options,
    ) as loader:
        return [(b.x.copy(), b.truth.copy()) for b in (loader.next_batch() for _ in range(count))]


def test_mosaic_batches_equal_the_old_codes_bit_for_bit(jpeg_set, monkeypatch):
    fast = batches(jpeg_set, 3, workers=2)
    # The same loader in this process with the old sample code (tests/augment_reference.py).
    monkeypatch.setattr(L, "fork_detection_sample", before.fork_detection_sample)
    monkeypatch.setattr(L, "read_hwc", before.read_hwc)
    old = batches(jpeg_set, 3, workers=0)
    for (x, truth), (old_x, old_truth) in zip(fast, old):
        assert x.tobytes() == old_x.tobytes()
        assert truth.tobytes() == old_truth.tobytes()
    assert not np.array_equal(fast[0][0], fast[1][0])  # batches differ: a real comparison


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or (os.cpu_count() or 1) < 2,
    reason="counts threads in /proc; with one CPU the libraries start no extra threads",
)
def test_workers_run_one_thread_each(jpeg_set):
    """A worker has its own thread and the result queue's feeder, nothing else: OpenCV's
    bundled OpenBLAS would start a thread for every CPU but one when the worker loads it."""
    with L.DataLoader(
        jpeg_set,
        task="detector",
        width=416,
        height=416,
        batch=4,
        classes=3,
        augment=ForkAugment(**YOLOV4),
        workers=2,
    ) as loader:
        loader.next_batch()
        for pid in loader.workers:
            assert len(os.listdir(f"/proc/{pid}/task")) <= 2, pid


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or (os.cpu_count() or 1) < 2,
    reason="counts threads in /proc; with one CPU the libraries start no extra threads",
)
def test_workers_run_one_thread_each_under_a_script_that_imports_opencv(jpeg_set, tmp_path):
    """A worker re-imports the main script before any loader code runs: OpenCV loads there,
    with the server's one-thread settings already in the worker's environment."""
    script = tmp_path / "train_script.py"
    script.write_text(
        "import os\n"
        "import cv2  # loaded again in each worker, as this script is\n"
        "from darknet_py.data.augment_fork import ForkAugment\n"
        "from darknet_py.data.loader import DataLoader\n"
        "if __name__ == '__main__':\n"
        "    paths = os.environ['JPEGS'].split(',')\n"
        "    with DataLoader(paths, task='detector', width=96, height=96, batch=2,\n"
        "                    classes=3, augment=ForkAugment(mosaic=True), workers=1) as loader:\n"
        "        loader.next_batch()\n"
        "        print(len(os.listdir(f'/proc/{loader.workers[0]}/task')))\n"
    )
    env = dict(os.environ, JPEGS=",".join(jpeg_set))
    out = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert int(out.stdout.strip()) <= 2


def _threads_around_a_matrix_product(results):
    before = len(os.listdir("/proc/self/task"))
    a = np.ones((512, 512), np.float32)
    (a @ a).sum()
    cv2.gemm(a, a, 1, None, 0)
    results.put((before, len(os.listdir("/proc/self/task"))))


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or (os.cpu_count() or 1) < 2,
    reason="counts threads in /proc; with one CPU the libraries start no extra threads",
)
def test_a_matrix_product_in_a_worker_starts_no_threads():
    """NumPy's OpenBLAS is loaded in the worker server already: it is set to one thread
    there, or a worker's first product would start a thread for every CPU but one."""
    context = L.start_worker_server()
    if context is None:
        pytest.skip("no fork server here")
    results = context.Queue()
    worker = context.Process(target=_threads_around_a_matrix_product, args=(results,))
    worker.start()
    before, after = results.get(timeout=60)
    worker.join()
    assert after == before


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_keep_freed_memory_sets_glibcs_malloc():
    # In a child: the setting stays with the process that makes it.
    code = "from darknet_py.data.loader import keep_freed_memory; print(keep_freed_memory())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"
