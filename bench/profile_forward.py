"""Where a forward (or, with --train, a training step) spends its time on the CUDA
backend: the count of kernel launches, host time against synchronised time, and a
Python profile of the host side (launch overhead, host-side losses).

    python3 bench/profile_forward.py [CFG] [--batch N] [--train]
"""
import argparse
import cProfile
import pstats
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import darknet_py as dn  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cfg", nargs="?", default=str(ROOT / "cfg" / "digits-classifier.cfg"))
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--train", action="store_true", help="profile train_batch instead")
    args = ap.parse_args()
    net = dn.load_network(args.cfg, batch=args.batch, device="cuda")
    be = net.be
    rng = np.random.default_rng(0)
    x = rng.random((args.batch,) + net.input_shape, dtype=np.float32)
    for layer in net.layers:
        layer.verbose = False
        if getattr(layer, "batch_normalize", 0):  # fresh nets have zero variance
            be.write(layer.rolling_variance, rng.uniform(0.5, 2.0, layer.out_c))
    run = lambda: net.forward(x)  # noqa: E731
    if args.train:
        if net.layers[-1].type == "yolo":
            truth = np.zeros((args.batch, 450), dtype=np.float32)
            truth[:, :5] = (0.5, 0.5, 0.2, 0.3, 1)
            truth[:, 5:10] = (0.3, 0.6, 0.1, 0.1, 2)
        else:
            truth = np.eye(net.outputs, dtype=np.float32)[rng.integers(0, net.outputs, args.batch)]
        run = lambda: net.train_pass(x, truth)  # noqa: E731
    for _ in range(3):
        run()
    be.synchronize()
    launches = Counter()
    real_launch = be._launch

    def counting_launch(name, *a):
        launches[name] += 1
        return real_launch(name, *a)

    be._launch = counting_launch
    run()
    be.synchronize()
    be._launch = real_launch
    what = "training step" if args.train else "forward"
    print(f"{sum(launches.values())} launches per {what}:", dict(launches.most_common(12)))
    repeats = 5 if args.train else 20
    t0 = time.perf_counter()
    for _ in range(repeats):
        run()
    host = (time.perf_counter() - t0) / repeats
    be.synchronize()
    total = (time.perf_counter() - t0) / repeats
    print(f"host time per {what} {1e3 * host:.3f} ms (until synchronised: {1e3 * total:.3f} ms)")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(repeats):
        run()
    be.synchronize()
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(14)


if __name__ == "__main__":
    main()
