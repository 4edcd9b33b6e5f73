"""Where a training pass's device time goes, kernel by kernel (a GPU profile for NOTES.md).

    python3 bench/kernel_profile.py CFG [--batch 32] [--precision fp16] [--passes 5] [--top 30]

Runs `--passes` training passes (forward, backward, update; as `bench --train`) eagerly
(DARKNET_CUDA_GRAPHS=0, so every kernel is seen) under PyTorch's profiler, which records
every CUDA kernel of the process through CUPTI, ours included: PyTorch is only the
recorder here, nothing of it runs. Prints each kernel name's device time per pass, its
launches per pass and its share, largest first, grouped by the kernel family (the .cu
file's op family is the name's stem before the precision suffix).
"""
import argparse
import collections
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ["DARKNET_CUDA_GRAPHS"] = "0"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cfg")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--precision", default="fp16")
    ap.add_argument("--passes", type=int, default=5)
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args()

    import numpy as np
    from torch.profiler import ProfilerActivity, profile
    from darknet_py.bench import prepare, random_truth
    from darknet_py.network import load_network

    net = load_network(args.cfg, batch=args.batch, device="cuda:0", precision=args.precision)
    rng = np.random.default_rng(0)
    prepare(net, 0)
    net.share_deltas = True
    net.share_outputs = True
    x = rng.random((net.batch,) + net.input_shape, dtype=np.float32)
    truth = random_truth(net, rng)
    for _ in range(3):
        net.train_pass(x, truth)
    net.be.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(args.passes):
            net.train_pass(x, truth)
        net.be.synchronize()
    totals = collections.defaultdict(float)
    counts = collections.Counter()
    for event in prof.events():
        if event.device_type.name == "CUDA":
            totals[event.name] += event.device_time_total / 1e3   # ms
            counts[event.name] += 1
    whole = sum(totals.values()) / args.passes
    print(f"{args.cfg} batch {args.batch} {args.precision}: {whole:.1f} ms of device work "
          f"a pass, {sum(counts.values()) // args.passes} launches")
    print(f"{'ms/pass':>9} {'share':>6} {'calls':>6}  kernel")
    for name, ms in sorted(totals.items(), key=lambda kv: -kv[1])[:args.top]:
        print(f"{ms / args.passes:9.2f} {ms / args.passes / whole:6.1%} "
              f"{counts[name] // args.passes:6d}  {name[:90]}")


if __name__ == "__main__":
    main()
