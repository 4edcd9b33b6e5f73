"""Data-parallel training throughput: yolov3-tiny at 416x416, batch 64 per GPU, on 1 and on
2 GPUs (NCCL), images/s of whole training iterations (forward, backward, gradient sum,
update). The goal: 2 GPUs >= 1.85x one GPU.

    python3 bench/multigpu_bench.py [--cfg CFG] [--gpus 2] [--batch 64] [--iterations 20]
                                    [--out results.json]

Needs PyCUDA, >= 2 GPUs and NCCL (pip install '.[multigpu]'). Random
weights, images and boxes (timings do not depend on values); data loading is left out,
so the numbers are the training step's. One process per GPU, as `train --gpus` runs.
"""
import argparse
import json
import multiprocessing
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from darknet_py.distributed.comm import free_port  # noqa: E402
from darknet_py.distributed.data_parallel import DataParallel  # noqa: E402
from darknet_py.distributed.launcher import connect  # noqa: E402

DEFAULT_CFG = ROOT.parent / "shared" / "darknet-cfg" / "yolov3-tiny.cfg"


def random_truth(net, batch, rng):
    """Darknet's detector truth: a few random boxes per image, zero padded."""
    truth = np.zeros((batch, net.max_boxes, net.truth_size), dtype=np.float32)
    for b in range(batch):
        n = rng.integers(1, 6)
        truth[b, :n, 0:2] = rng.uniform(0.2, 0.8, (n, 2))
        truth[b, :n, 2:4] = rng.uniform(0.05, 0.4, (n, 2))
        truth[b, :n, 4] = rng.integers(0, 80, n)
    return truth.reshape(batch, -1)


def rank_main(rank, world_size, port, args, results):
    import darknet_py as dn

    comm = connect(rank, world_size, f"cuda:{rank}", ("127.0.0.1", port), timeout=300)
    net = dn.load_network(str(args.cfg), batch=args.batch, device=f"cuda:{rank}", seed=1)
    net.options.max_batches = 1000000
    net.verbose = False
    if world_size > 1:
        DataParallel(comm).attach(net)
    rng = np.random.default_rng(rank)
    images = net.images_per_pass * net.subdivisions   # one iteration's, on this GPU
    x = rng.random((images,) + net.input_shape, dtype=np.float32)
    truth = random_truth(net, images, rng)
    for _ in range(args.warmup):
        net.train_iteration(x, truth)
    net.be.synchronize()
    comm.barrier(timeout=300)
    start = time.perf_counter()
    for _ in range(args.iterations):
        net.train_iteration(x, truth)
    net.be.synchronize()
    comm.barrier(timeout=300)
    seconds = time.perf_counter() - start
    if rank == 0:
        results.put(world_size * images * args.iterations / seconds)
    comm.close()


def measure(world_size, args):
    context = multiprocessing.get_context("spawn")
    results, port = context.Queue(), free_port()
    ranks = [context.Process(target=rank_main, args=(r, world_size, port, args, results))
             for r in range(world_size)]
    for p in ranks:
        p.start()
    images_per_second = results.get(timeout=1800)
    for p in ranks:
        p.join()
        if p.exitcode:
            raise SystemExit(f"rank {ranks.index(p)} failed (exit code {p.exitcode})")
    return images_per_second


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cfg", type=Path, default=DEFAULT_CFG)
    parser.add_argument("--gpus", type=int, default=2, help="the largest GPU count measured")
    parser.add_argument("--batch", type=int, default=64, help="images per GPU per iteration")
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON")
    args = parser.parse_args()
    from darknet_py.backends import cuda_device_count
    if cuda_device_count() < args.gpus:
        raise SystemExit(f"needs {args.gpus} CUDA GPUs, found {cuda_device_count()}")
    rows = {}
    for world_size in range(1, args.gpus + 1):
        rows[world_size] = measure(world_size, args)
        print(f"{args.cfg.name} {args.batch}/GPU, {world_size} GPU{'s' * (world_size > 1)}: "
              f"{rows[world_size]:.1f} images/s ({rows[world_size] / rows[1]:.2f}x one GPU)",
              flush=True)
    if args.out is not None:
        if args.out.exists():
            raise SystemExit(f"{args.out}: already exists; not replacing it")
        args.out.write_text(json.dumps({"cfg": str(args.cfg), "batch_per_gpu": args.batch,
                                        "images_per_second": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
