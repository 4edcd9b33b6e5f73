"""Batch 1 on each device: the forward of one image and a training step, on the CUDA
backend next to the NumPy backend, for a few cfgs.

    python3 bench/networks/batch1.py [--cpu] [--repeats N] [--out FILE.json]

Prints a table; medians after warm-up (darknet_py.bench.median_seconds: CUDA events on the
GPU, the wall clock on the CPU). Random weights (timings do not depend on values, but never
zeros). The NumPy backend is slow, so it runs fewer repeats and the training step at a
smaller batch (the table says which). The batch-64 forward is bench/networks/forward.py's.
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import darknet_py as dn  # noqa: E402
from bench.common import SHARED  # noqa: E402
from darknet_py.backends import cuda_available, get_backend  # noqa: E402
from darknet_py.bench import median_seconds  # noqa: E402


def detector_truth(batch, rng):
    truth = np.zeros((batch, 90 * 5), dtype=np.float32)
    for b in range(batch):
        for j in range(3):
            w, h = rng.uniform(0.05, 0.4, 2)
            x, y = rng.uniform(w / 2, 1 - w / 2), rng.uniform(h / 2, 1 - h / 2)
            truth[b, j * 5 : (j + 1) * 5] = (x, y, w, h, rng.integers(0, 80))
    return truth


def bench_cfg(cfg, device, train_batch, repeats, rng):
    be = get_backend(device)
    row = {"cfg": cfg.name, "device": device}
    # Passes of train_batch images: the batch-1 forward below only re-sizes the arrays.
    net = dn.Network(
        dn.cfg.parse_cfg_text(cfg.read_text(), str(cfg)),
        str(cfg),
        batch=train_batch,
        backend=be,
        seed=1,
    )
    # Fresh networks have zero rolling variance, which inference divides by: without real
    # statistics the activations overflow and the CPU times NaN arithmetic.
    stats_rng = np.random.default_rng(2)
    for layer in net.layers:
        if getattr(layer, "batch_normalize", 0):
            be.write(layer.rolling_variance, stats_rng.uniform(0.5, 2.0, layer.out_c))
    x = rng.random((1,) + net.input_shape, dtype=np.float32)
    # forward only: the input upload is part of a real predict() call, so it is timed
    row["fwd_ms_b1"] = 1e3 * median_seconds(be, lambda: net.forward(x), 2, repeats)
    last = net.layers[-1].type
    x = rng.random((train_batch,) + net.input_shape, dtype=np.float32)
    if last in ("yolo", "region", "detection"):
        truth = detector_truth(train_batch, rng)
    else:
        truth = np.eye(net.layers[-1].outputs, dtype=np.float32)[
            rng.integers(0, net.layers[-1].outputs, train_batch)
        ]
    for layer in net.layers:  # the yolo statistics line would flood the table
        layer.verbose = False
    net.set_batch(train_batch)
    seconds = median_seconds(be, lambda: net.train_pass(x, truth), 1, max(1, repeats // 2))
    row["train_step_ms"] = 1e3 * seconds
    row["train_batch"] = train_batch
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu", action="store_true", help="also time the NumPy backend")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--out", help="write the rows as JSON here")
    args = ap.parse_args()
    cfgs = [
        SHARED / "darknet-cfg" / "yolov3-tiny.cfg",
        ROOT / "cfg" / "digits-classifier.cfg",
        SHARED / "darknet-cfg" / "tiny.cfg",
    ]
    cfgs = [c for c in cfgs if c.exists()]
    rng = np.random.default_rng(0)
    rows = []
    if cuda_available():
        for cfg in cfgs:
            rows.append(bench_cfg(cfg, "cuda", 64, args.repeats, rng))
            print(rows[-1], flush=True)
    else:
        print("no CUDA GPU: timing the NumPy backend only", file=sys.stderr)
    if args.cpu or not cuda_available():
        for cfg in cfgs:
            rows.append(bench_cfg(cfg, "cpu", 8, max(2, args.repeats // 5), rng))
            print(rows[-1], flush=True)
    print(f"\n{'cfg':24s} {'device':6s} {'fwd ms b1':>10s} {'train step ms':>14s} {'(batch)':>8s}")
    for r in rows:
        print(
            f"{r['cfg']:24s} {r['device']:6s} {r['fwd_ms_b1']:10.3f} "
            f"{r['train_step_ms']:14.1f} {r['train_batch']:8d}"
        )
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
