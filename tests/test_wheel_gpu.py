"""The built wheel on a GPU with no CUDA toolkit: `detect --gpu 0` on one photo from a fresh
virtualenv, nvcc absent from PATH and an empty kernel cache, works and compiles nothing
(every kernel comes from the wheel's prebuilt binaries, backends/prebuilt.py).

Builds the wheel as `make dist` does (nvcc for the four architectures, then pip wheel,
with the installed setuptools where it can: the machine may be offline). Needs a GPU,
PyCUDA, nvcc and Darknet's COCO yolov3-tiny weights under ../shared/weights."""

import json
import os
import shutil
import site
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
WEIGHTS = SHARED / "weights" / "yolov3-tiny.weights"

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


def _without_nvcc_path():
    """PATH minus every folder that holds an nvcc."""
    return os.pathsep.join(
        d
        for d in os.environ.get("PATH", "").split(os.pathsep)
        if d and not os.path.exists(os.path.join(d, "nvcc"))
    )


def _pythonpath_without_this_checkout():
    """PYTHONPATH and this interpreter's site-packages (numpy, click, opencv, PyCUDA: a
    virtualenv made from a virtualenv's python does not see the latter's packages) minus
    any folder holding a darknet_py package."""
    dirs = os.environ.get("PYTHONPATH", "").split(os.pathsep) + site.getsitepackages()
    keep = [d for d in dirs if d and not (Path(d) / "darknet_py").exists()]
    return os.pathsep.join(keep)


def _build_wheel(work):
    """The wheel of a copy of this checkout (its prebuilt kernels built fresh)."""
    src = work / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    shutil.copytree(REPO / "cfg", src / "cfg")
    shutil.copytree(
        REPO / "darknet_py",
        src / "darknet_py",
        symlinks=True,
        ignore=shutil.ignore_patterns("__pycache__", "kernels_bin"),
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")]))
    subprocess.run(
        [sys.executable, "-m", "darknet_py.backends.prebuilt"], cwd=src, env=env, check=True
    )
    # An offline machine builds with the setuptools it has; else pip fetches one.
    for isolation in (["--no-build-isolation"], []):
        built = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "-q",
                "--no-deps",
                *isolation,
                "-w",
                str(work / "dist"),
                str(src),
            ],
            capture_output=True,
            text=True,
        )
        if built.returncode == 0:
            break
    assert built.returncode == 0, built.stderr
    wheel = next((work / "dist").glob("darknet_cfg_runner-*.whl"))
    done = subprocess.run(
        [sys.executable, "-m", "darknet_py.backends.prebuilt", "--check-wheel", str(wheel)],
        cwd=src,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    return wheel


@pytest.mark.skipif(not WEIGHTS.is_file(), reason=f"no {WEIGHTS}")
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="building the wheel needs nvcc")
def test_detect_from_the_wheel_without_nvcc_compiles_nothing(tmp_path):
    pytest.importorskip("pycuda.driver")
    wheel = _build_wheel(tmp_path)
    venv = tmp_path / "venv"
    # System packages (numpy, click, opencv) stay visible; darknet_py only from the wheel.
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            str(wheel),
        ],
        check=True,
    )
    cache = tmp_path / "kernel-cache"
    cache.mkdir()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    env = dict(
        os.environ,
        PATH=_without_nvcc_path(),
        DARKNET_KERNEL_CACHE=str(cache),
        PYTHONPATH=_pythonpath_without_this_checkout(),
    )
    env.pop("DARKNET_CUDA_SYNC", None)
    assert shutil.which("nvcc", path=env["PATH"]) is None
    command = [
        str(venv / "bin" / "darknet-py"),
        "detect",
        "--gpu",
        "0",
        str(SHARED / "darknet-cfg" / "yolov3-tiny.cfg"),
        str(WEIGHTS),
        str(SHARED / "images" / "dog.jpg"),
        "--thresh",
        "0.25",
        "--names",
        str(SHARED / "weights" / "coco.names"),
        "--out",
        "none",
        "--json",
        "dets.json",
    ]
    start = time.perf_counter()
    done = subprocess.run(command, cwd=run_dir, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    print(f"first `detect --gpu 0` from the wheel, no nvcc, empty cache: {seconds:.2f} s")
    assert done.returncode == 0, done.stderr
    assert "nvcc" not in done.stderr and "prebuilt" not in done.stderr, done.stderr
    assert list(cache.iterdir()) == []  # compiled nothing
    names = {
        d["name"]
        for d in json.loads((run_dir / "dets.json").read_text())["images"][0]["detections"]
    }
    assert {"dog", "bicycle"} <= names, names
    start = time.perf_counter()
    again = subprocess.run(
        command + ["--overwrite"], cwd=run_dir, env=env, capture_output=True, text=True
    )
    print(f"then: {time.perf_counter() - start:.2f} s")
    assert again.returncode == 0, again.stderr
    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import darknet_py; print(darknet_py.__file__)"],
        cwd=run_dir,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert where.stdout.startswith(str(venv)), where.stdout
