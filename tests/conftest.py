"""Fixtures shared by several test modules."""

import cv2
import numpy as np
import pytest


@pytest.fixture(scope="module")
def cuda():
    """A CudaBackend on GPU 0 for the gpu tests; they are skipped without PyCUDA or a GPU."""
    pytest.importorskip("pycuda.driver")
    from darknet_py.backends import cuda_available

    if not cuda_available():
        pytest.skip("no CUDA GPU")
    from darknet_py.backends.cuda_backend import CudaBackend

    return CudaBackend(0)


@pytest.fixture(scope="module")
def bars(tmp_path_factory):
    """40 images of two classes: horizontal and vertical bars; valid list of 10 more."""
    root = tmp_path_factory.mktemp("bars")
    rng = np.random.default_rng(0)
    lists = {"train": [], "valid": []}
    for split, count in (("train", 40), ("valid", 10)):
        (root / split).mkdir()
        for i in range(count):
            name = ("horiz", "vert")[i % 2]
            img = rng.uniform(0, 60, (12, 12))
            k = rng.integers(2, 10)
            if name == "horiz":
                img[k - 1 : k + 2, :] = 230
            else:
                img[:, k - 1 : k + 2] = 230
            p = root / split / f"{i:03d}_{name}.png"
            cv2.imwrite(str(p), img.astype(np.uint8))
            lists[split].append(str(p))
        (root / f"{split}.list").write_text("\n".join(lists[split]) + "\n")
    (root / "bars.names").write_text("horiz\nvert\n")
    return root


@pytest.fixture(scope="session", autouse=True)
def onnx_cache(tmp_path_factory):
    """The CPU engine's exports (export/cache.py) go to a folder of this test session,
    not the user's ~/.cache; subprocesses inherit it."""
    import os

    path = tmp_path_factory.mktemp("onnx-cache")
    old = os.environ.get("DARKNET_ONNX_CACHE")
    os.environ["DARKNET_ONNX_CACHE"] = str(path)
    yield path
    if old is None:
        os.environ.pop("DARKNET_ONNX_CACHE", None)
    else:
        os.environ["DARKNET_ONNX_CACHE"] = old


SHARED = __import__("pathlib").Path(__file__).resolve().parents[2] / "shared"


def skipped_for_shared(report):
    """Whether a skipped test's reason is a missing ../shared file (the C Darknets' reference
    outputs, stock cfgs, real weights and photos that sit beside a developer's checkout)."""
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return "../shared" in reason or str(SHARED) in reason


def pytest_terminal_summary(terminalreporter):
    skipped = terminalreporter.stats.get("skipped", [])
    missing = sum(1 for report in skipped if skipped_for_shared(report))
    if skipped:
        where = "absent" if not SHARED.is_dir() else "incomplete"
        terminalreporter.write_line(
            f"{missing} of {len(skipped)} skipped tests need ../shared ({SHARED}: {where})"
            if missing
            else f"none of the {len(skipped)} skipped tests needs ../shared"
        )
