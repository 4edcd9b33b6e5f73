"""Whole-network timings: forward per image at batch 1 and 64, and one training iteration,
on the CUDA backend (CUDA events) next to the NumPy backend (wall clock).

    python3 bench/network_bench.py [--cpu] [--repeats N] [--out results.json]

Prints a table; medians after warm-up. Random weights (timings do not depend on values,
but never zeros). The NumPy backend is slow, so it runs fewer repeats and the training
iteration at a smaller batch (the table says which).
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import darknet_py as dn  # noqa: E402
from darknet_py.backends import cuda_available, get_backend  # noqa: E402

SHARED = ROOT.parent / "shared"


class Timer:
    """Times a callable with CUDA events on the backend's stream, or the wall clock on the CPU."""

    def __init__(self, be):
        self.be = be
        self.cuda = be.name == "cuda"
        if self.cuda:
            import pycuda.driver as drv
            self.start, self.stop = drv.Event(), drv.Event()

    def __call__(self, fn, warmup, repeats):
        for _ in range(warmup):
            fn()
        self.be.synchronize()
        times = []
        for _ in range(repeats):
            if self.cuda:
                stream = getattr(self.be, "stream", None)
                self.start.record(stream)
                fn()
                self.stop.record(stream)
                self.stop.synchronize()
                times.append(self.stop.time_since(self.start) / 1e3)
            else:
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
        return statistics.median(times)


def detector_truth(batch, rng):
    truth = np.zeros((batch, 90 * 5), dtype=np.float32)
    for b in range(batch):
        for j in range(3):
            w, h = rng.uniform(0.05, 0.4, 2)
            x, y = rng.uniform(w / 2, 1 - w / 2), rng.uniform(h / 2, 1 - h / 2)
            truth[b, j * 5:(j + 1) * 5] = (x, y, w, h, rng.integers(0, 80))
    return truth


def bench_cfg(cfg, device, batches, train_batch, repeats, rng):
    be = get_backend(device)
    timer = Timer(be)
    row = {"cfg": cfg.name, "device": device}
    # Passes of train_batch images: the inference batches below only re-size the arrays.
    net = dn.Network(dn.cfg.parse_cfg_text(cfg.read_text(), str(cfg)), str(cfg),
                     batch=train_batch, backend=be, seed=1)
    # Fresh networks have zero rolling variance, which inference divides by: without real
    # statistics the activations overflow and the CPU times NaN arithmetic.
    stats_rng = np.random.default_rng(2)
    for layer in net.layers:
        if getattr(layer, "batch_normalize", 0):
            be.write(layer.rolling_variance, stats_rng.uniform(0.5, 2.0, layer.out_c))
    c, h, w = net.input_shape
    for batch in batches:
        x = rng.random((batch, c, h, w), dtype=np.float32)
        net.set_batch(batch)
        # forward only: the input upload is part of a real predict() call, so it is timed
        seconds = timer(lambda: net.forward(x), warmup=2, repeats=repeats)
        row[f"fwd_ms_per_image_b{batch}"] = 1e3 * seconds / batch
    last = net.layers[-1].type
    x = rng.random((train_batch, c, h, w), dtype=np.float32)
    if last in ("yolo", "region", "detection"):
        truth = detector_truth(train_batch, rng)
    else:
        truth = np.eye(net.layers[-1].outputs, dtype=np.float32)[
            rng.integers(0, net.layers[-1].outputs, train_batch)]
    for layer in net.layers:  # the yolo statistics line would flood the table
        layer.verbose = False
    seconds = timer(lambda: net.train_pass(x, truth), warmup=1, repeats=max(1, repeats // 2))
    row[f"train_step_ms_b{train_batch}"] = 1e3 * seconds
    row["train_batch"] = train_batch
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu", action="store_true", help="also time the NumPy backend")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--out", help="write the rows as JSON here")
    args = ap.parse_args()
    cfgs = [SHARED / "darknet-cfg" / "yolov3-tiny.cfg", ROOT / "cfg" / "digits-classifier.cfg",
            SHARED / "darknet-cfg" / "tiny.cfg"]
    cfgs = [c for c in cfgs if c.exists()]
    rng = np.random.default_rng(0)
    rows = []
    if cuda_available():
        for cfg in cfgs:
            rows.append(bench_cfg(cfg, "cuda", (1, 64), 64, args.repeats, rng))
            print(rows[-1], flush=True)
    else:
        print("no CUDA GPU: timing the NumPy backend only", file=sys.stderr)
    if args.cpu or not cuda_available():
        for cfg in cfgs:
            rows.append(bench_cfg(cfg, "cpu", (1, 64), 8, max(2, args.repeats // 5), rng))
            print(rows[-1], flush=True)
    print(f"\n{'cfg':24s} {'device':6s} {'fwd ms/img b1':>14s} {'fwd ms/img b64':>15s} "
          f"{'train step ms':>14s} {'(batch)':>8s}")
    for r in rows:
        train_ms = r["train_step_ms_b%d" % r["train_batch"]]
        print(f"{r['cfg']:24s} {r['device']:6s} {r['fwd_ms_per_image_b1']:14.3f} "
              f"{r['fwd_ms_per_image_b64']:15.3f} {train_ms:14.1f} {r['train_batch']:8d}")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
