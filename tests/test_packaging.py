"""What a wheel (`make dist`) carries, checked from pyproject.toml without building one
(`make dist` builds it and checks the wheel itself)."""

import glob
from pathlib import Path

import tomllib

from darknet_py.backends import prebuilt

REPO = Path(__file__).resolve().parents[1]


def test_pyproject_lists_every_package_and_the_data_read_at_run_time():
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages = {
        str(p.parent.relative_to(REPO)).replace("/", ".")
        for p in REPO.glob("darknet_py/**/__init__.py")
    }
    assert packages == set(config["packages"])
    shipped = {
        Path(p).resolve()
        for pattern in config["package-data"]["darknet_py"]
        for p in glob.glob(str(REPO / "darknet_py" / pattern))
    }
    needed = {
        p.resolve()
        for pattern in ("darknet_py/ops/*/*.cu", "darknet_py/ops/*/*.cuh", "cfg/*.cfg")
        for p in REPO.glob(pattern)
    }
    needed |= {Path(p).resolve() for p in prebuilt.kernel_paths().values()}  # what loads
    assert needed and needed <= shipped
