"""End-to-end training on the GPU against the C Darknet, run by `make bench`.

    python3 bench/training/end_to_end.py [--results bench/RESULTS.md | --markdown FILE]
                                         [--parts training loader upload start] [--profile N]
                                         [--device cuda:0] [--max-batches N]
                                         [--c-darknet PATH]

Parts (all by default):
  training  wall clock from process start to <cfg>_final.weights of
            `python3 -m darknet_py train CFG DATA --overwrite --device cuda:0` for the cfgs of
            ../shared/bench-cfg, on synthetic sets of the sizes its README names, written
            under a temporary directory (seeded): 2,000 32x32 colour images of 4 shape
            classes (the class name in each path), and 1,500 96x96 colour images with 1-4
            shapes of 3 classes each (YOLO labels); shapes are drawn on noisy backgrounds.
            The C Darknet (pjreddie's, a GPU build) trains the same cfgs on the same sets in
            the same run when its `darknet` is at --c-darknet (default: where
            bench/learning/original/run_device.sh builds it, /tmp/pjreddie-build/darknet);
            without it the table shows the README's seconds, marked as recorded elsewhere;
  loader    the data loader alone (bench/data/loader.py's set and timing), images/s at
            96x96 and 416x416 for 1, 4 and 16 workers;
  upload    training iterations of yolov3-tiny 416 at batch 64 on random data, the batch
            uploaded plainly from pageable memory or prefetched from page-locked shared
            memory (Network.prefetch), medians of the wall clock per iteration;
  start     wall clock of `python3 -m darknet_py bench cfg/digits-classifier.cfg --device cuda:0`
            with an empty kernel cache (cold: the first GPU command after install) and
            with a filled one (warm).
--profile N also runs the detector for N iterations under cProfile and prints where the
training process's time goes. Prints a Markdown block (date, GPU, every figure next to
its goal) and appends it to --results, or writes it to --markdown. --device cpu and
--max-batches N make a quick check of the script itself (figures not comparable).
"""

import argparse
import os
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from multiprocessing import shared_memory
from pathlib import Path

import cv2
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.common import SHARED, gpu_name  # noqa: E402
from bench.data import loader as loader_bench  # noqa: E402

PARTS = ("training", "loader", "upload", "start")
SHAPES = ("circle", "square", "triangle", "cross")  # classifier classes; detector: first 3
# (cfg, iterations, the C Darknet's command for it, darknet-py's goal in seconds)
TRAINING = [
    ("train_cls32.cfg", 600, "classifier", 3.0),
    ("train_det96.cfg", 2000, "detector", 11.0),
]
# The C Darknet's seconds to the final weights as ../shared/bench-cfg/README.md records
# them: not measured here, so the report names where they come from.
RECORDED_C_SECONDS = {"train_cls32.cfg": 6.0, "train_det96.cfg": 22.3}
RECORDED_C_ON = (
    "one NVIDIA H200, warm caches (../shared/bench-cfg/README.md; it gives no "
    "date, and has been the reference here since 2026-11-23)"
)
# Where bench/learning/original/run_device.sh builds pjreddie's darknet (GPU=1).
C_DARKNET = Path("/tmp/pjreddie-build/darknet")
TRAIN_TIMEOUT = 240  # seconds; a run past it is reported as such
START_CFG = "cfg/digits-classifier.cfg"


# ---- synthetic data ----------------------------------------------------------------------
def noisy_background(rng, size):
    base = rng.integers(40, 216, 3)
    noise = rng.normal(0, 30, (size, size, 3))
    return np.clip(base + noise, 0, 255).astype(np.uint8)


def draw_shape(img, shape, cx, cy, half, colour):
    """A filled shape centred at (cx, cy), `half` pixels from centre to edge."""
    if shape == "circle":
        cv2.circle(img, (cx, cy), half, colour, -1)
    elif shape == "square":
        cv2.rectangle(img, (cx - half, cy - half), (cx + half, cy + half), colour, -1)
    elif shape == "triangle":
        points = np.array([(cx, cy - half), (cx - half, cy + half), (cx + half, cy + half)])
        cv2.fillPoly(img, [points.astype(np.int32)], colour)
    else:
        bar = max(1, half // 3)
        cv2.rectangle(img, (cx - half, cy - bar), (cx + half, cy + bar), colour, -1)
        cv2.rectangle(img, (cx - bar, cy - half), (cx + bar, cy + half), colour, -1)


def contrasting(rng, img):
    """A colour far from the image's mean, so that every shape is visible."""
    return tuple(int(v) for v in (255 - img.mean(axis=(0, 1)) + rng.integers(-30, 31, 3)) % 256)


def write_data_file(root, name, classes, train_list, names):
    """The set's .data file (its backup folder backup-NAME), and a twin NAME-c.data whose
    backup folder is the C Darknet's own (backup-NAME-c), made with it. labels= is what the
    C classifier matches against the image paths."""
    (root / f"{name}.names").write_text("\n".join(names) + "\n")
    (root / f"{name}.list").write_text("\n".join(train_list) + "\n")
    for stem in (name, f"{name}-c"):
        (root / f"backup-{stem}").mkdir(exist_ok=True)
        (root / f"{stem}.data").write_text(
            f"classes={classes}\ntrain={root}/{name}.list\nnames={root}/{name}.names\n"
            f"labels={root}/{name}.names\nbackup={root}/backup-{stem}/\n"
        )
    return root / f"{name}.data"


def classifier_set(root, count=2000, size=32, seed=0):
    """count size x size JPEGs, one shape each, named NNNNN_<shape>.jpg: its .data file."""
    rng = np.random.default_rng(seed)
    folder = root / "cls32"
    folder.mkdir()
    paths = []
    for i in range(count):
        shape = SHAPES[i % len(SHAPES)]
        img = noisy_background(rng, size)
        half = int(rng.integers(size // 6, size // 3))
        cx, cy = (int(v) for v in rng.integers(half, size - half, 2))
        draw_shape(img, shape, cx, cy, half, contrasting(rng, img))
        path = folder / f"{i:05d}_{shape}.jpg"
        cv2.imwrite(str(path), img, [cv2.IMWRITE_JPEG_QUALITY, 95])
        paths.append(str(path))
    return write_data_file(root, "cls32", len(SHAPES), paths, SHAPES)


def detector_set(root, count=1500, size=96, classes=3, seed=1):
    """count size x size JPEGs under images/ with 1-4 shapes each, YOLO labels under
    labels/: its .data file."""
    rng = np.random.default_rng(seed)
    images, labels = root / "det96" / "images", root / "det96" / "labels"
    images.mkdir(parents=True)
    labels.mkdir()
    paths = []
    for i in range(count):
        img = noisy_background(rng, size)
        lines = []
        for _ in range(int(rng.integers(1, 5))):
            cls = int(rng.integers(classes))
            half = int(rng.integers(size // 12, size // 4))
            cx, cy = (int(v) for v in rng.integers(half, size - half, 2))
            draw_shape(img, SHAPES[cls], cx, cy, half, contrasting(rng, img))
            side = (2 * half + 1) / size
            lines.append(
                f"{cls} {(cx + 0.5) / size:.6f} {(cy + 0.5) / size:.6f} {side:.6f} {side:.6f}\n"
            )
        path = images / f"{i:05d}.jpg"
        cv2.imwrite(str(path), img, [cv2.IMWRITE_JPEG_QUALITY, 95])
        (labels / f"{i:05d}.txt").write_text("".join(lines))
        paths.append(str(path))
    return write_data_file(root, "det96", classes, paths, SHAPES[:classes])


# ---- timed processes ---------------------------------------------------------------------
def darknet_py_command(*args, profile=None):
    prefix = [sys.executable] + (["-m", "cProfile", "-o", str(profile)] if profile else [])
    return prefix + ["-m", "darknet_py", *map(str, args)]


def run_until(command, done=None, env=None, timeout=TRAIN_TIMEOUT):
    """(seconds from process start until `done` exists (or the process ends when `done`
    is None), error text or None). The file is polled every 5 ms."""
    start = time.perf_counter()
    with tempfile.TemporaryFile() as err:
        process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=err, env=env, cwd=ROOT
        )
        seconds = None
        while process.poll() is None and time.perf_counter() - start < timeout:
            if seconds is None and done is not None and os.path.exists(done):
                seconds = time.perf_counter() - start
            time.sleep(0.005)
        if process.poll() is None:
            process.kill()
            process.wait()
            return None, f"stopped after {timeout} s"
        ended = time.perf_counter() - start
        if process.returncode:
            err.seek(0)
            tail = err.read().decode(errors="replace").strip().splitlines()[-3:]
            return None, f"exit code {process.returncode}: {' / '.join(tail)}"
        if done is None:
            return ended, None
        if seconds is None and os.path.exists(done):  # written in the last 5 ms
            seconds = ended
        return seconds, None if seconds is not None else f"{done} was not written"


def c_darknet_seconds(c_darknet, command, cfg, data):
    """(seconds, error) of the C Darknet's `darknet COMMAND train DATA CFG` from process start
    to its final weights: <cfg>_final.weights (detector) or <cfg>.weights (classifier) in
    the NAME-c.data twin's backup folder."""
    c_data = data.with_name(f"{data.stem}-c.data")
    stem = Path(cfg).stem
    final = (
        data.parent
        / f"backup-{data.stem}-c"
        / (f"{stem}_final.weights" if command == "detector" else f"{stem}.weights")
    )
    if final.exists():
        final.unlink()
    return run_until(
        [str(c_darknet), command, "train", str(c_data), str(SHARED / "bench-cfg" / cfg)], final
    )


def training(sets, device, max_batches=None, c_darknet=None):
    """[(cfg, iterations, seconds or None, error or None, C seconds or None, how the C
    seconds were had: "measured", "recorded" or an error, goal)] of both cfgs."""
    rows = []
    for cfg, iterations, command, goal in TRAINING:
        data = sets[cfg]
        if max_batches is not None:  # a quick check: no goal or C figure applies
            iterations, goal = max_batches, float("nan")
            c_seconds, c_how = None, "not run (--max-batches)"
        elif c_darknet is not None:
            c_seconds, c_error = c_darknet_seconds(c_darknet, command, cfg, data)
            c_how = c_error or "measured"
            print(f"{cfg}, C Darknet: {c_error or f'{c_seconds:.1f} s'}", flush=True)
        else:
            c_seconds, c_how = RECORDED_C_SECONDS[cfg], "recorded"
        final = data.parent / f"backup-{data.stem}" / f"{Path(cfg).stem}_final.weights"
        limit = [] if max_batches is None else ["--max-batches", max_batches]
        seconds, error = run_until(
            darknet_py_command(
                "train", SHARED / "bench-cfg" / cfg, data, "--overwrite", "--device", device, *limit
            ),
            final,
        )
        rows.append((cfg, iterations, seconds, error, c_seconds, c_how, goal))
        print(f"{cfg}: {error or f'{seconds:.1f} s'}", flush=True)
    return rows


def profile(data, iterations, device, top=30):
    """The detector's training process for `iterations` iterations under cProfile: the
    functions taking the most time (own and cumulative), as text lines."""
    out = data.parent / "det96.prof"
    seconds, error = run_until(
        darknet_py_command(
            "train",
            SHARED / "bench-cfg" / "train_det96.cfg",
            data,
            "--overwrite",
            "--device",
            device,
            "--max-batches",
            iterations,
            profile=out,
        )
    )
    if error:
        return [f"profile failed: {error}"]
    lines = [f"cProfile, train_det96.cfg, {iterations} iterations: {seconds:.1f} s"]
    for order in ("tottime", "cumulative"):
        text = tempfile.SpooledTemporaryFile(mode="w+")
        pstats.Stats(str(out), stream=text).sort_stats(order).print_stats(top)
        text.seek(0)
        body = text.read().splitlines()
        first = next(i for i, line in enumerate(body) if "ncalls" in line)
        # The interpreter's and click's frames around the command say nothing.
        body = [
            line
            for line in body[first:]
            if line.strip()
            and not any(
                frame in line
                for frame in (
                    "<frozen",
                    "click/core.py",
                    "builtins.exec",
                    "<string>",
                    "__main__.py",
                )
            )
        ]
        lines += [f"-- by {order}"] + body[: top + 1]
    return lines


def starts(device):
    """(cold seconds, warm seconds) of `darknet-py bench START_CFG`: cold with an empty
    cache directory (PyCUDA keeps its kernels under XDG_CACHE_HOME), warm the second of
    two runs with the usual one."""
    command = darknet_py_command("bench", ROOT / START_CFG, "--device", device)
    with tempfile.TemporaryDirectory(prefix="cold-cache-") as empty:
        cold, error = run_until(command, env=dict(os.environ, XDG_CACHE_HOME=empty))
    for _ in range(2):
        if error:
            raise RuntimeError(error)
        warm, error = run_until(command)
    return cold, warm


def loader_rates(root):
    """{(size, workers): images/s} of loader_bench's detector batches."""
    folder = root / "loader"
    paths = loader_bench.make_dataset(folder, 256)
    rates = {}
    for size in (96, 416):
        for workers in (1, 4, 16):
            rates[size, workers], _ = loader_bench.images_per_second(paths, size, workers, 32, 4)
            print(
                f"loader {size}x{size}, {workers} workers: {rates[size, workers]:.0f} images/s",
                flush=True,
            )
    return rates


def upload_overlap(device, iterations=8, batch=64):
    """{"plain": ms, "prefetched": ms, "write": ms, "pinned_write": ms}: median wall clock
    of a yolov3-tiny training iteration with each upload, and of the plain upload alone
    from pageable and from pinned memory (CUDA events)."""
    from darknet_py.bench import prepare, random_truth
    from darknet_py.network import load_network

    net = load_network(SHARED / "darknet-cfg" / "yolov3-tiny.cfg", batch=batch, device=device)
    prepare(net)
    be, rng = net.be, np.random.default_rng(0)
    shape = (batch,) + net.input_shape
    truth = random_truth(net, rng)
    pageable = rng.random(shape, dtype=np.float32)
    segments = [shared_memory.SharedMemory(create=True, size=pageable.nbytes) for _ in range(2)]
    try:
        pinned = [np.ndarray(shape, np.float32, buffer=s.buf) for s in segments]
        unpins = [be.pin(np.frombuffer(s.buf, np.uint8)) for s in segments]
        for p in pinned:
            p[...] = pageable
        figures = {}
        buf = be.empty(pageable.size)
        for name, host in (("write", pageable), ("pinned_write", pinned[0])):
            timer, times = be.timer(), []
            for _ in range(iterations):
                timer.start()
                be.write(buf, host)
                times.append(timer.stop())
            figures[name] = 1e3 * statistics.median(times)

        def iteration_ms(step):
            times = []
            for k in range(iterations + 2):
                start = time.perf_counter()
                step(k)
                times.append(time.perf_counter() - start)
            return 1e3 * statistics.median(times[2:])  # two warm-up iterations

        figures["plain"] = iteration_ms(lambda k: net.train_iteration(pageable, truth))

        def prefetched(k, slots=pinned):
            net.prefetch(slots[(k + 1) % 2], truth)
            net.train_iteration(slots[k % 2], truth)

        net.prefetch(pinned[0], truth)
        figures["prefetched"] = iteration_ms(prefetched)
        net.finish_prefetch()
        del prefetched, pinned, buf  # the views of the segments go before they close
        for unpin in unpins:
            unpin()
    finally:
        for s in segments:
            try:
                s.close()
            except BufferError:
                pass  # an array still maps it: freed at exit
            s.unlink()
    return figures


# ---- the report --------------------------------------------------------------------------
def report(results):
    """The Markdown block of everything measured."""
    # Only this checkout's own history (a copy of the tree may sit inside another one).
    commit = (
        subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        if (ROOT / ".git").exists()
        else ""
    )
    if (
        commit
        and subprocess.run(
            [
                "git",
                "-C",
                str(ROOT),
                "diff",
                "--quiet",
                "HEAD",
                "--",
                "darknet_py",
                "kernels",
                "bench",
            ]
        ).returncode
    ):
        commit += " with changes"  # a copy of the tree sent with an older .git
    lines = [
        f"## {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, training end to end "
        f"(bench/training/end_to_end.py), {gpu_name()}{', commit ' + commit if commit else ''}",
        "",
    ]
    for part, value in results.items():
        if isinstance(value, str):
            lines += [f"{part}: {value}", ""]
    results = {part: value for part, value in results.items() if not isinstance(value, str)}
    if "training" in results:
        lines += [
            "Wall clock from process start to `<cfg>_final.weights` of `python3 -m "
            "darknet_py train CFG DATA --overwrite --device cuda:0`, warm kernel cache, "
            "synthetic sets of the sizes in ../shared/bench-cfg/README.md.",
            "",
            "| cfg | C Darknet | darknet-py | per iteration | goal | |",
            "|---|---|---|---|---|---|",
        ]
        recorded = False
        for cfg, iterations, seconds, error, c_seconds, c_how, goal in results["training"]:
            c_cell = f"{c_seconds:.1f} s, {c_how}" if c_seconds is not None else c_how
            recorded = recorded or c_how == "recorded"
            if seconds is None:
                lines.append(f"| {cfg} | {c_cell} | {error} | | <= {goal} s | |")
                continue
            lines.append(
                f"| {cfg} | {c_cell} | {seconds:.1f} s | "
                f"{1e3 * seconds / iterations:.1f} ms | <= {goal} s | "
                f"{'met' if seconds <= goal else 'not met'} |"
            )
        lines.append("")
        if recorded:
            lines += [
                f"C Darknet seconds marked recorded were not measured in this run: "
                f"they were recorded on {RECORDED_C_ON}.",
                "",
            ]
    if "loader" in results:
        rates = results["loader"]
        lines += [
            "Data loader alone (bench/data/loader.py: 640x480 JPEGs, 1-4 boxes, "
            "detector augmentation, batch 32), images/s:",
            "",
            "| input | 1 worker | 4 workers | 16 workers |",
            "|---|---|---|---|",
        ]
        for size in (96, 416):
            lines.append(
                f"| {size}x{size} | "
                + " | ".join(f"{rates[size, w]:.0f}" for w in (1, 4, 16))
                + " |"
            )
        lines.append("")
    if "upload" in results:
        u = results["upload"]
        lines += [
            "yolov3-tiny 416, batch 64 (133 MB of input), training iteration wall "
            "clock (median of 8): batch uploaded plainly from pageable memory "
            f"{u['plain']:.1f} ms, prefetched from pinned shared memory "
            f"{u['prefetched']:.1f} ms. The upload alone: {u['write']:.1f} ms "
            f"pageable, {u['pinned_write']:.1f} ms pinned.",
            "",
        ]
    if "start" in results:
        cold, warm = results["start"]
        lines += [
            f"Start of `darknet-py bench {START_CFG} --device cuda:0` (whole process): "
            f"cold (empty kernel cache) {cold:.1f} s, warm {warm:.1f} s.",
            "",
        ]
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--results", help="append the Markdown block to this file")
    where.add_argument("--markdown", help="write the Markdown block to this file")
    parser.add_argument(
        "--profile",
        type=int,
        metavar="N",
        help="also profile the detector's training over N iterations",
    )
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument(
        "--max-batches",
        type=int,
        metavar="N",
        help="train N iterations instead of the cfgs' (a quick check)",
    )
    parser.add_argument(
        "--c-darknet",
        type=Path,
        default=C_DARKNET,
        metavar="PATH",
        help="the C Darknet's darknet executable (a GPU build), timed on the "
        "same sets in the same run where it exists",
    )
    args = parser.parse_args()
    c_darknet = args.c_darknet if args.c_darknet.is_file() else None
    if c_darknet is None:
        print(
            f"{args.c_darknet}: no C Darknet there; its recorded seconds are shown instead",
            flush=True,
        )
    results = {}

    def measure(part, work):
        try:
            results[part] = work()
        except Exception as e:  # one part failing leaves the others' figures
            results[part] = f"failed: {type(e).__name__}: {e}"
        print(f"{part}: {results[part]}", flush=True)

    root = Path(tempfile.mkdtemp(prefix="train-bench-"))
    try:
        if "start" in args.parts:  # first: it also fills the kernel cache the rest use
            measure("start", lambda: starts(args.device))
        if "training" in args.parts or args.profile:
            sets = {"train_cls32.cfg": classifier_set(root), "train_det96.cfg": detector_set(root)}
            if "training" in args.parts:
                measure(
                    "training", lambda: training(sets, args.device, args.max_batches, c_darknet)
                )
            if args.profile:
                print("\n".join(profile(sets["train_det96.cfg"], args.profile, args.device)))
        if "upload" in args.parts:
            measure("upload", lambda: upload_overlap(args.device))
        if "loader" in args.parts:
            measure("loader", lambda: loader_rates(root))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    block = "\n".join(report(results)) + "\n"
    print("\n" + block)
    if args.results:
        with open(args.results, "a", encoding="utf-8") as f:
            f.write("\n" + block)
    elif args.markdown:
        Path(args.markdown).write_text(block)


if __name__ == "__main__":
    main()
