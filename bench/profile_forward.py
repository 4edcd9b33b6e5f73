"""Where a batch-1 forward spends its time on the CUDA backend: Python profile of the
host side (launch overhead) and the count of kernel launches per forward.

    python3 bench/profile_forward.py [CFG] [--batch N]
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
    args = ap.parse_args()
    net = dn.load_network(args.cfg, batch=args.batch, device="cuda")
    be = net.be
    x = np.random.default_rng(0).random((args.batch,) + net.input_shape, dtype=np.float32)
    for _ in range(3):
        net.forward(x)
    be.synchronize()
    launches = Counter()
    real_launch = be._launch

    def counting_launch(name, *a):
        launches[name] += 1
        return real_launch(name, *a)

    be._launch = counting_launch
    net.forward(x)
    be.synchronize()
    be._launch = real_launch
    print(f"{sum(launches.values())} launches per forward:", dict(launches.most_common()))
    t0 = time.perf_counter()
    for _ in range(20):
        net.forward(x)
    host = (time.perf_counter() - t0) / 20
    be.synchronize()
    total = (time.perf_counter() - t0) / 20
    print(f"host time per forward {1e3 * host:.3f} ms (until synchronised: {1e3 * total:.3f} ms)")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(20):
        net.forward(x)
    be.synchronize()
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main()
