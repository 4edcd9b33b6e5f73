"""Compile every CUDA kernel file for Hopper with warnings as errors (`make kernels-check`),
skipping the files already checked as they are now.

A file passes for sm_90 (and, where prebuilt.FILE_ARCHS builds it for another target such as
sm_90a, for that too). What passed is remembered by kernel_cache.kernel_digest (the source,
its options and every header it includes) with the flags and nvcc's version, in
$DARKNET_KERNEL_CACHE/../kernels-check (beside the kernel cache), so a later check compiles
only the files whose digest changed. One nvcc per core; exit 1 with nvcc's messages if any
file fails, 0 with a notice where nvcc is absent.

    python scripts/kernels_check.py [--nvcc NVCC] [--jobs N] [--all]
"""

import argparse
import concurrent.futures
import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from darknet_py.backends import kernel_cache  # noqa: E402
from darknet_py.backends.prebuilt import FILE_ARCHS, KERNEL_DIRS, kernel_paths  # noqa: E402

PACKAGE = ROOT / "darknet_py"
FLAGS = ("-Werror", "all-warnings", "-cubin", "-o", os.devnull)


def targets(name):
    """(label, nvcc arguments) of the builds one file is checked in."""
    builds = [("sm_90", ("-arch=sm_90",))]
    for arch in FILE_ARCHS.get(name, ()):
        if arch != "sm_90":
            builds.append((arch, (f"-gencode=arch=compute_{arch[3:]},code={arch}",)))
    return builds


def stamp(name, source, arch_args, nvcc_version, kernel_dirs):
    options = kernel_cache.KERNEL_OPTIONS.get(name, ())
    h = hashlib.sha256()
    for part in (
        kernel_cache.kernel_digest(source, options, kernel_dirs),
        "\0".join(arch_args + FLAGS),
        nvcc_version,
    ):
        h.update(part.encode())
        h.update(b"\0\0")
    return h.hexdigest()


def shown(path):
    """A kernel file's path as the messages show it: from the package's folder where it
    is in the package."""
    return str(path.relative_to(PACKAGE)) if path.is_relative_to(PACKAGE) else str(path)


def check_one(nvcc, path, arch_args, kernel_dirs):
    options = kernel_cache.KERNEL_OPTIONS.get(path.name, ())
    includes = [f"-I{folder}" for folder in kernel_dirs]
    start = time.perf_counter()
    done = subprocess.run(
        [nvcc, *arch_args, *options, *includes, *FLAGS, str(path)], capture_output=True, text=True
    )
    return done.returncode, done.stdout + done.stderr, time.perf_counter() - start


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nvcc", default=os.environ.get("NVCC", "nvcc"))
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument(
        "--kernels",
        type=Path,
        action="append",
        help="a folder of kernel files (repeatable); default every op family's",
    )
    ap.add_argument("--all", action="store_true", help="compile every file, checked or not")
    args = ap.parse_args(argv)
    if shutil.which(args.nvcc) is None:
        print("kernels-check: nvcc not found, kernels not compiled")
        return 0
    version = subprocess.run(
        [args.nvcc, "--version"], capture_output=True, text=True
    ).stdout.strip()
    done_dir = Path(kernel_cache.cache_dir()).parent / "kernels-check"
    kernel_dirs = [str(folder) for folder in args.kernels] if args.kernels else KERNEL_DIRS
    work, passed = [], 0
    for name, path in kernel_paths(kernel_dirs).items():
        path = Path(path)
        source = path.read_text()
        for label, arch_args in targets(name):
            key = stamp(name, source, arch_args, version, kernel_dirs)
            if not args.all and (done_dir / key).exists():
                passed += 1
            else:
                work.append((path, label, arch_args, key))
    print(f"kernels-check: {len(work)} builds to compile, {passed} unchanged since they passed")
    failed = []
    with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
        runs = {
            pool.submit(check_one, args.nvcc, path, arch_args, kernel_dirs): (
                shown(path),
                label,
                key,
            )
            for path, label, arch_args, key in work
        }
        for run in concurrent.futures.as_completed(runs):
            name, label, key = runs[run]
            code, output, seconds = run.result()
            print(
                f"nvcc {name} ({label}): {'ok' if code == 0 else 'FAILED'} in {seconds:.1f} s",
                flush=True,
            )
            if code:
                failed.append((name, label, output))
                continue
            try:
                done_dir.mkdir(parents=True, exist_ok=True)
                (done_dir / key).touch()
            except OSError:  # a read-only cache: the next check compiles again
                pass
    for name, label, output in failed:
        print(f"\n--- {name} ({label}) ---\n{output}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
