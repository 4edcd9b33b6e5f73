"""Start times and CUDA graph gains on the GPU (issue 8): a Markdown section for RESULTS.md.

    python3 bench/networks/start.py [--repeats N] [--out FILE]

Starts: process wall time of `python3 -m darknet_py bench cfg/digits-classifier.cfg
--gpu 0` with an empty cubin cache (the first start after install: every kernel file
compiled, in parallel) and then with the cache filled (median of N); and each kernel
file's nvcc time on its own, which bounds the first start from below.
Graphs: `darknet-py bench` (CUDA events, medians) with DARKNET_CUDA_GRAPHS=0 and =1,
each in its own process.
"""

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import pycuda.driver as drv  # noqa: E402

from darknet_py.backends import kernel_cache, prebuilt  # noqa: E402
from darknet_py.backends.cuda_backend import _KERNEL_OPTIONS, _KERNELS  # noqa: E402

START_CMD = [sys.executable, "-m", "darknet_py", "bench", "cfg/digits-classifier.cfg", "--gpu", "0"]
SHARED = ROOT.parent / "shared"
GRAPH_CASES = [  # (what, cfg, batch, train)
    ("cifar.cfg, training step", SHARED / "darknet-cfg" / "cifar.cfg", 128, True),
    (
        "bench-cfg/train_cls32.cfg, training step",
        SHARED / "bench-cfg" / "train_cls32.cfg",
        64,
        True,
    ),
    ("cfg/digits-classifier.cfg, training step", ROOT / "cfg" / "digits-classifier.cfg", 64, True),
    ("cfg/digits-classifier.cfg, forward", ROOT / "cfg" / "digits-classifier.cfg", 1, False),
]


def wall_seconds(cmd, env):
    start = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def start_times(repeats):
    with tempfile.TemporaryDirectory(prefix="darknet-py-cubins-") as cache:
        env = dict(os.environ, DARKNET_KERNEL_CACHE=cache)
        cold = wall_seconds(START_CMD, env)
        warm = [wall_seconds(START_CMD, env) for _ in range(repeats)]
    return cold, warm


def nvcc_seconds(arch):
    """{kernel file: seconds nvcc takes on it alone}."""
    times, paths = {}, prebuilt.kernel_paths()
    for name in _KERNELS:
        source = Path(paths[name]).read_text()
        start = time.perf_counter()
        kernel_cache.compile_cubin(
            name, source, _KERNEL_OPTIONS.get(name, ()), arch, include_dirs=prebuilt.KERNEL_DIRS
        )
        times[name] = time.perf_counter() - start
    return times


def graph_rows(repeats):
    rows = []
    for what, cfg, batch, train in GRAPH_CASES:
        figures = []
        for graphs in ("0", "1"):
            with tempfile.TemporaryDirectory() as tmp:
                out = Path(tmp) / "bench.json"
                cmd = [
                    sys.executable,
                    "-m",
                    "darknet_py",
                    "bench",
                    str(cfg),
                    "--batch",
                    str(batch),
                    "--gpu",
                    "0",
                    "--repeats",
                    str(repeats),
                    "--json",
                    str(out),
                ]
                subprocess.run(
                    cmd + (["--train"] if train else []),
                    cwd=ROOT,
                    check=True,
                    env=dict(os.environ, DARKNET_CUDA_GRAPHS=graphs),
                    stdout=subprocess.DEVNULL,
                )
                result = json.loads(out.read_text())
            figures.append(result["train_step_ms" if train else "forward_ms"])
        rows.append((f"{what}, batch {batch}", *figures))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3, help="warm starts timed")
    ap.add_argument("--bench-repeats", type=int, default=30, help="timed runs per bench")
    ap.add_argument("--out", type=Path, help="also write the section to this file")
    args = ap.parse_args()
    drv.init()
    device = drv.Device(0)
    arch = "sm_%d%d" % device.compute_capability()
    cold, warm = start_times(args.repeats)
    nvcc = nvcc_seconds(arch)
    rows = graph_rows(args.bench_repeats)
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# Starts and CUDA graphs (bench/networks/start.py)",
        "",
        "Command: `python3 bench/networks/start.py` on the device.",
        "",
        f"## {now}, {device.name()} ({arch}, driver {drv.get_driver_version()}), "
        f"{os.cpu_count()} CPUs",
        "",
        f"Start, `{' '.join(['python3'] + START_CMD[1:])}`, process wall time: "
        f"first (empty cubin cache) {cold:.2f} s; later {statistics.median(warm):.2f} s "
        f"(median of {len(warm)}: {', '.join(f'{w:.2f}' for w in warm)}).",
        "",
        "nvcc alone per kernel file (s): "
        + ", ".join(f"{name} {t:.2f}" for name, t in sorted(nvcc.items(), key=lambda kv: -kv[1]))
        + f"; sum {sum(nvcc.values()):.1f}.",
        "",
        "| `darknet-py bench`, median ms | eager | CUDA graph | gain |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {what} | {eager:.2f} | {graph:.2f} | {eager / graph:.2f}x |"
        for what, eager, graph in rows
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
