"""Data loader throughput on its own (no network): detector training batches, images/s.

    python3 bench/data/loader.py [--images 256] [--sizes 96 416] [--workers 1 4 16]
                                  [--batch 32] [--batches 4] [--out results.json]
                                  [--augment original|yolov4] [--jpeg 640x480 ...]
    python3 bench/data/loader.py --profile [--samples 200] [--augment yolov4]
                                  [--jpeg 416x416 640x480] [--sizes 416]

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

--augment yolov4: the fork's augmentation as yolov4.cfg asks for it (mosaic=1, jitter=.3,
hue=.1, saturation=1.5, exposure=1.5, flip), which bench/multigpu/data_parallel.py trains
with; original (default): pjreddie's, with the same jitter and colour settings.
--jpeg WxH (several allowed): the synthetic JPEGs' size (default 640x480).

--profile: no workers; one process makes --samples training samples as a worker does
(OpenCV single-threaded) and reports the CPU time per sample (process time, unprofiled),
then where it goes: a cProfile run of the same samples, each function's own time given to
a stage (decode, to float, crop and fill colour, resize, colour jitter, flip, mosaic
placement, labels, random draws, copy into the batch); a C function's time goes to the
stage of the Python function that called it (cv2.cvtColor in read_hwc is "to float").
cProfile's own overhead is in its figures: compare their shares, not their sum.
"""

import argparse
import cProfile
import json
import os
import platform
import pstats
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
from darknet_py.data.augment_fork import ForkAugment  # noqa: E402
from darknet_py.data.loader import DataLoader, _SampleMaker  # noqa: E402

try:
    from darknet_py.data.loader import keep_freed_memory  # noqa: E402
except ImportError:  # the code before it (bench/NOTES.md, L1): workers did not set it
    keep_freed_memory = None

IMAGE_W, IMAGE_H = 640, 480
CLASSES = 80

# The augmentations a detector trains with, as their cfgs set them.
AUGMENTS = {
    "original": lambda: DetectorAugment(jitter=0.3, hue=0.1, saturation=1.5, exposure=1.5),
    # yolov4.cfg: [net] mosaic=1 hue=.1 saturation=1.5 exposure=1.5 flip (default 1),
    # [yolo] jitter=.3 (no resize=): detector_augment's ForkAugment for it.
    "yolov4": lambda: ForkAugment(
        jitter=0.3, hue=0.1, saturation=1.5, exposure=1.5, flip=True, mosaic=True
    ),
}


def make_dataset(root, count, seed=0, size=(IMAGE_W, IMAGE_H)):
    """count JPEGs of size (width, height) under root/images with labels under
    root/labels; returns the paths."""
    width, height = size
    rng = np.random.default_rng(seed)
    (root / "images").mkdir(parents=True)
    (root / "labels").mkdir()
    paths = []
    for i in range(count):
        # A low-resolution random field scaled up: smooth like a photo, so the JPEG
        # decodes at a realistic cost (noise would be slower, flat colour faster).
        small = rng.integers(0, 256, (height // 16, width // 16, 3), dtype=np.uint8)
        img = cv2.resize(small, (width, height), interpolation=cv2.INTER_CUBIC)
        lines = []
        for _ in range(rng.integers(1, 5)):
            w, h = rng.uniform(0.05, 0.6, 2)
            x, y = rng.uniform(w / 2, 1 - w / 2), rng.uniform(h / 2, 1 - h / 2)
            left, top = int((x - w / 2) * width), int((y - h / 2) * height)
            right, bottom = int((x + w / 2) * width), int((y + h / 2) * height)
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


def images_per_second(paths, size, workers, batch, batches, augment="original"):
    """Steady-state images/s: after 2 x workers + 1 warm-up batches (start-up, and the
    batches built ahead meanwhile, which would come for free), over the next `batches`
    batches, at least one per worker so that all of them take part."""
    batches = max(batches, workers)
    augment = AUGMENTS[augment]()
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


# Stages of a training sample, by the function whose own time it is (the loader's and the
# augmentations' functions, before and after the fast paths of bench/NOTES.md's L1).
STAGE_OF_FUNCTION = {
    "decode_image": "decode",
    "check_input_file": "decode",
    "image_size": "decode",
    "_truncated_jpeg": "decode",
    "imdecode": "decode",
    "read_hwc": "to float",
    "read_rgb_u8": "decode",
    "crop_fill_colour": "crop and fill colour",
    "mean_colour": "crop and fill colour",
    "_crop_with_fill": "crop and fill colour",
    "_mean": "crop and fill colour",
    "copyMakeBorder": "crop and fill colour",
    "resize": "resize",
    "warpAffine": "resize",
    "_place_hwc": "resize",
    "_warp_hwc": "resize",
    "_fork_colour_jitter": "colour jitter",
    "_distort_hwc": "colour jitter",
    "_random_distort_hwc": "colour jitter",
    "flip": "flip",
    "fork_detection_sample": "mosaic placement",
    "augment_piece": "mosaic placement",
    "image_data_augmentation": "crop, flip, colour (inline NumPy)",
    "augment_detection_hwc": "flip and placement (inline)",
    "read_image_labels": "labels",
    "fork_fill_truth": "labels",
    "mosaic_truth": "labels",
    "detection_truth": "labels",
    "correct_boxes": "labels",
    "draw": "random draws",
    "rng": "random draws",
    "crop_borders": "random draws",
    "_load_into": "copy into the batch",
}


def _stage(func):
    """The stage of a pstats function key, or None (then its callers' stages count)."""
    filename, _, name = func
    if filename == "~":  # a C function: "<built-in method cv2.resize>" and the like
        name = name.strip("<>").split()[-1].split(".")[-1]
    return STAGE_OF_FUNCTION.get(name)


def stage_times(stats):
    """{stage: seconds} from a pstats.Stats: each function's own time to its stage, or, for
    one without a stage, to its callers' stages in proportion to what each call cost."""
    table = stats.stats
    totals = {}

    def give(func, seconds, depth=0):
        stage = _stage(func)
        callers = table.get(func, (0, 0, 0, 0, {}))[4]
        if stage is None and callers and depth < 20:
            spent = sum(c[2] for c in callers.values()) or 1.0
            for caller, c in callers.items():
                give(caller, seconds * c[2] / spent, depth + 1)
            return
        stage = stage or "other"
        totals[stage] = totals.get(stage, 0.0) + seconds

    for func, (_, _, own, _, callers) in table.items():
        if _stage(func) is None and callers:
            # A C or library function: its time, call site by call site.
            for caller, c in callers.items():
                give(caller, c[2])
        else:
            give(func, own)
    return totals


def sample_profile(paths, size, augment, samples):
    """(CPU ms per sample unprofiled, {stage: profiled CPU ms per sample}): a worker's
    sample-making in this process, OpenCV single-threaded and malloc set as in a worker."""
    cv2.setNumThreads(1)
    if keep_freed_memory is not None:
        keep_freed_memory()
    maker = _SampleMaker(
        paths=paths,
        task="detector",
        classes=CLASSES,
        channels=3,
        augment=AUGMENTS[augment](),
        labels=None,
        letterbox=True,
        max_boxes=90,
        seed=0,
    )
    x, truth = maker.empty_batch(1, (size, size))

    def make(first, count):
        for k in range(first, first + count):
            maker.make(k, 0, k % len(paths), (size, size), True, x[0], truth[0], [])

    make(0, 10)  # first-use costs (OpenCV's tables, NumPy's) out of the figures
    start = time.process_time()
    make(10, samples)
    cpu_ms = 1000 * (time.process_time() - start) / samples
    profile = cProfile.Profile(time.process_time)
    profile.runcall(make, 10, samples)  # the same samples again
    stages = stage_times(pstats.Stats(profile))
    return cpu_ms, {k: 1000 * v / samples for k, v in stages.items()}


def print_profiles(args):
    print(f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; {machine()}")
    print(
        f"{args.augment} augmentation, {args.samples} samples per case made in one process "
        f"(OpenCV single-threaded, as a worker), {args.images} synthetic JPEGs\n"
    )
    results = []
    for jpeg in args.jpeg:
        with tempfile.TemporaryDirectory(prefix="loader-bench-") as tmp:
            paths = make_dataset(Path(tmp), args.images, size=jpeg)
            for size in args.sizes:
                cpu_ms, stages = sample_profile(paths, size, args.augment, args.samples)
                profiled = sum(stages.values())
                print(
                    f"JPEG {jpeg[0]}x{jpeg[1]} -> {size}x{size}: **{cpu_ms:.1f} CPU ms a "
                    f"sample** (unprofiled); profiled {profiled:.1f} ms:"
                )
                print("| stage | profiled CPU ms a sample | share |\n|---|---|---|")
                for stage, ms in sorted(stages.items(), key=lambda kv: -kv[1]):
                    print(f"| {stage} | {ms:.2f} | {100 * ms / profiled:.0f}% |")
                print(flush=True)
                results.append(
                    {
                        "jpeg": list(jpeg),
                        "size": size,
                        "cpu_ms_per_sample": cpu_ms,
                        "stages": stages,
                    }
                )
    return results


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


def jpeg_size(text):
    try:
        width, height = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected WIDTHxHEIGHT, got {text!r}") from None
    if width < 16 or height < 16:
        raise argparse.ArgumentTypeError(f"{text}: at least 16x16")
    return width, height


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
    parser.add_argument(
        "--sizes", type=int, nargs="+", default=None, help="network inputs [96 416; --profile 416]"
    )
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument(
        "--batches", type=int, default=4, help="timed batches per case (at least one per worker)"
    )
    parser.add_argument("--out", help="also write the results as JSON here")
    parser.add_argument("--augment", choices=sorted(AUGMENTS), default="original")
    parser.add_argument(
        "--jpeg",
        type=jpeg_size,
        nargs="+",
        default=None,
        metavar="WxH",
        help="the synthetic JPEGs' size (default 640x480; --profile: 416x416 640x480)",
    )
    parser.add_argument(
        "--profile", action="store_true", help="CPU ms a sample and where it goes, no workers"
    )
    parser.add_argument("--samples", type=int, default=200, help="--profile: samples a case")
    parser.add_argument(
        "--no-consumer", action="store_true", help="skip the consumer's Python step column"
    )
    args = parser.parse_args()
    args.sizes = args.sizes or ([416] if args.profile else [96, 416])

    if args.profile:
        args.jpeg = args.jpeg or [(416, 416), (640, 480)]
        results = print_profiles(args)
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"machine": machine(), "profiles": results}, f, indent=1)
        return
    jpeg = (args.jpeg or [(IMAGE_W, IMAGE_H)])[0]
    results = []
    with tempfile.TemporaryDirectory(prefix="loader-bench-") as tmp:
        paths = make_dataset(Path(tmp), args.images, size=jpeg)
        print(f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; {machine()}")
        print(
            f"{args.images} synthetic {jpeg[0]}x{jpeg[1]} JPEGs, 1-4 boxes each; "
            f"{args.augment} augmentation; batch {args.batch}, {args.batches} timed "
            f"batches per case\n"
        )
        print(
            "| input | workers | images/s | CPU ms/image | consumer's Python step |\n"
            "|---|---|---|---|---|"
        )
        for size in args.sizes:
            for workers in args.workers:
                rate, cpu_ms = images_per_second(
                    paths, size, workers, args.batch, args.batches, args.augment
                )
                slowdown = (
                    float("nan")
                    if args.no_consumer
                    else consumer_slowdown(paths, size, workers, args.batch)
                )
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
                    f"| {size}x{size} | {workers} | {rate:.0f} | {cpu_ms:.1f} | "
                    f"{'-' if args.no_consumer else f'{slowdown:.2f}x'} |",
                    flush=True,
                )
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"machine": machine(), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
