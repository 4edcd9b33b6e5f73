"""Build tree_harness.c against a CPU build of pjreddie's Darknet and store what it prints
as tests/fixtures/tree/tree_reference.npz (used by tests/test_tree.py).

    python tests/c_harness/make_tree_fixture.py /path/to/darknet   # with libdarknet.a built
"""

import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
FIXTURES = HERE.parent / "fixtures" / "tree"


def main(darknet):
    darknet = Path(darknet).resolve()
    with tempfile.TemporaryDirectory() as tmp:
        exe = Path(tmp) / "tree_harness"
        subprocess.run(
            [
                "gcc",
                "-O0",
                "-I",
                str(darknet / "include"),
                "-I",
                str(darknet / "src"),
                str(HERE / "tree_harness.c"),
                str(darknet / "libdarknet.a"),
                "-lm",
                "-pthread",
                "-o",
                str(exe),
            ],
            check=True,
        )
        text = subprocess.run(
            [str(exe), str(FIXTURES / "small.tree")], check=True, capture_output=True, text=True
        ).stdout
    arrays = {}
    for line in text.splitlines():
        name, kind, count, *values = line.split()
        dtype = np.float32 if kind == "f" else np.int64
        arrays[name] = np.array(values, dtype=dtype)
        assert arrays[name].size == int(count), name
    np.savez_compressed(FIXTURES / "tree_reference.npz", **arrays)
    print(f"wrote {FIXTURES / 'tree_reference.npz'}: {', '.join(sorted(arrays))}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "/work/cbuild/darknet-orig")
