"""Data loader throughput on its own (no network): detector training batches, images/s.

    python3 bench/data/loader.py [--images 256] [--sizes 96 416] [--workers 1 4 16]
                                  [--batch 32] [--batches 4] [--out results.json]

Generates a synthetic detection set into a temporary directory first: 640x480 JPEGs
(COCO's typical size) of smooth colour fields with 1-4 boxes each, one label file per
image. Each (size, workers) case first takes 2 x workers + 1 batches untimed (start-up,
and the batches a loader builds ahead, which would otherwise come for free), then times
--batches batches (at least one per worker) of --batch images with detector
augmentation (jitter, flip, HSV), as `darknet-py train` asks for them.
Prints a Markdown table, headed with the date and machine: images/s (wall clock), CPU ms
per image (this process and its workers; on a shared machine the steadier of the two,
as the wall clock depends on the CPU share the loader gets), and how much slower a
pure-Python step in the consuming thread runs while the loader works than without it
(the training loop's host code; 1.00x = not slowed at all).
"""

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import cv2
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from darknet_py.data.augment import DetectorAugment  # noqa: E402
from darknet_py.data.loader import DataLoader  # noqa: E402

IMAGE_W, IMAGE_H = 640, 480
CLASSES = 80


def make_dataset(root, count, seed=0):
    """count JPEGs under root/images with labels under root/labels; returns the paths."""
    rng = np.random.default_rng(seed)
    (root / "images").mkdir(parents=True)
    (root / "labels").mkdir()
    paths = []
    for i in range(count):
        # A low-resolution random field scaled up: smooth like a photo, so the JPEG
        # decodes at a realistic cost (noise would be slower, flat colour faster).
        small = rng.integers(0, 256, (IMAGE_H // 16, IMAGE_W // 16, 3), dtype=np.uint8)
        img = cv2.resize(small, (IMAGE_W, IMAGE_H), interpolation=cv2.INTER_CUBIC)
        lines = []
        for _ in range(rng.integers(1, 5)):
            w, h = rng.uniform(0.05, 0.6, 2)
            x, y = rng.uniform(w / 2, 1 - w / 2), rng.uniform(h / 2, 1 - h / 2)
            left, top = int((x - w / 2) * IMAGE_W), int((y - h / 2) * IMAGE_H)
            right, bottom = int((x + w / 2) * IMAGE_W), int((y + h / 2) * IMAGE_H)
            cv2.rectangle(
                img,
                (left, top),
                (right, bottom),
                tuple(int(v) for v in rng.integers(0, 256, 3)),
                -1,
            )
            lines.append(f"{rng.integers(CLASSES)} {x:.6f} {y:.6f} {w:.6f} {h:.6f}\n")
        path = root / "images" / f"{i:05d}.jpg"
        cv2.imwrite(str(path), img, [cv2.IMWRITE_JPEG_QUALITY, 90])
        (root / "labels" / f"{i:05d}.txt").write_text("".join(lines))
        paths.append(str(path))
    return paths


def images_per_second(paths, size, workers, batch, batches):
    """Steady-state images/s: after 2 x workers + 1 warm-up batches (start-up, and the
    batches built ahead meanwhile, which would come for free), over the next `batches`
    batches, at least one per worker so that all of them take part."""
    batches = max(batches, workers)
    augment = DetectorAugment(jitter=0.3, hue=0.1, saturation=1.5, exposure=1.5)
    with DataLoader(
        paths,
        task="detector",
        width=size,
        height=size,
        batch=batch,
        classes=CLASSES,
        augment=augment,
        seed=0,
        workers=workers,
    ) as loader:
        for _ in range(2 * workers + 1):
            loader.next_batch()
        pids = getattr(loader, "workers", [])  # the thread loader had none
        start, cpu = time.perf_counter(), cpu_seconds(pids)
        for _ in range(batches):
            loader.next_batch()
        seconds, cpu = time.perf_counter() - start, cpu_seconds(pids) - cpu
        images = batch * batches
        return images / seconds, 1000 * cpu / images


def python_step(n=200_000):
    """Seconds for a fixed piece of pure-Python work (it needs the GIL throughout), as the
    training loop's host code does between kernel launches."""
    start = time.perf_counter()
    total = 0
    for i in range(n):
        total += i * i
    return time.perf_counter() - start


def consumer_slowdown(paths, size, workers, batch, steps=12):
    """How much slower the consumer's Python step runs while the loader builds batches
    (median over `steps` steps, each after a next_batch) than with no loader: the
    issue's complaint was loader threads holding the GIL against the training thread."""
    alone = statistics.median(python_step() for _ in range(steps))
    with DataLoader(
        paths,
        task="detector",
        width=size,
        height=size,
        batch=batch,
        classes=CLASSES,
        augment=DetectorAugment(jitter=0.3),
        seed=0,
        workers=workers,
    ) as loader:
        loader.next_batch()
        during = []
        for _ in range(steps):
            loader.next_batch()
            during.append(python_step())
    return statistics.median(during) / alone


def cpu_seconds(pids):
    """CPU time of this process (all its threads) and of the worker processes `pids`."""
    total = time.process_time()
    tick = os.sysconf("SC_CLK_TCK")
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return total


def machine():
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return (
        f"{os.cpu_count()} CPUs ({cpu}), Python {platform.python_version()}, "
        f"OpenCV {cv2.__version__}"
    )


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=256, help="dataset size")
    parser.add_argument("--sizes", type=int, nargs="+", default=[96, 416])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument(
        "--batches", type=int, default=4, help="timed batches per case (at least one per worker)"
    )
    parser.add_argument("--out", help="also write the results as JSON here")
    args = parser.parse_args()

    results = []
    with tempfile.TemporaryDirectory(prefix="loader-bench-") as tmp:
        paths = make_dataset(Path(tmp), args.images)
        print(f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; {machine()}")
        print(
            f"{args.images} synthetic {IMAGE_W}x{IMAGE_H} JPEGs, 1-4 boxes each; "
            f"batch {args.batch}, {args.batches} timed batches per case\n"
        )
        print(
            "| input | workers | images/s | CPU ms/image | consumer's Python step |\n"
            "|---|---|---|---|---|"
        )
        for size in args.sizes:
            for workers in args.workers:
                rate, cpu_ms = images_per_second(paths, size, workers, args.batch, args.batches)
                slowdown = consumer_slowdown(paths, size, workers, args.batch)
                results.append(
                    {
                        "size": size,
                        "workers": workers,
                        "images_per_s": rate,
                        "cpu_ms_per_image": cpu_ms,
                        "consumer_slowdown": slowdown,
                    }
                )
                print(
                    f"| {size}x{size} | {workers} | {rate:.0f} | {cpu_ms:.1f} | {slowdown:.2f}x |",
                    flush=True,
                )
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"machine": machine(), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
