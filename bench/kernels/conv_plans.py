"""Which gemm plan suits each convolution's products: every plan timed on the products of
a cfg's convolutions, against the heuristic's choice (CudaBackend.gemm_plan).

    python3 bench/kernels/conv_plans.py CFG[:BATCH] ... [--cap LOG2] [--json FILE]

For each cfg (random weights, random input and truth, as `darknet-py bench`): the training
step (median of CUDA-event timings around train_pass after warm-up), then every
convolution's three products (forward W x col, weight gradient delta x col^T, input
gradient W^T x delta) at the chunk of images the layer uses, timed under the heuristic's
plan and under each alternative (tile, K splits). --cap sets the convolution workspace
(2**LOG2 floats), which sets the chunks. Where a step's time goes layer by layer and kernel
by kernel: bench/networks/breakdown.py.
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import darknet_py as dn  # noqa: E402
from darknet_py.bench import median_seconds, prepare, random_truth  # noqa: E402
from darknet_py.layers import convolutional  # noqa: E402

SWEEP_PLANS = (
    [("128x128x8s4", s) for s in (1, 2, 4, 8)]
    + [("64x64x8s4r8", s) for s in (1, 4, 16, 32, 64, 128)]
    + [("32x32x8s4w", s) for s in (1, 16, 64, 256, 1024, 2048)]
)


def median_ms(be, fn, warmup=3, repeats=10):
    return 1e3 * median_seconds(be, fn, warmup, repeats)


def conv_products(net):
    """[(label, ta, tb, m, n, k)] of each convolution's gemms at its chunk size."""
    seen, out = set(), []
    for layer in net.layers:
        if layer.type != "convolutional":
            continue
        m, k, n = layer.gemm_dims()
        cols = layer.images_per_chunk(net.batch) * n
        for what, case in (
            ("fwd", (0, 0, m, cols, k)),
            ("wgrad", (0, 1, m, k, cols)),
            ("dgrad", (1, 0, k, cols, m)),
        ):
            if case not in seen:
                seen.add(case)
                out.append((f"{layer.index:2d} {what}", *case))
    return out


def sweep(be, products, rng):
    rows = []
    for label, ta, tb, m, n, k in products:
        a = be.from_host(rng.uniform(-1, 1, m * k))
        b = be.from_host(rng.uniform(-1, 1, k * n))
        c = be.empty(m * n)
        lda, ldb = (m if ta else k), (k if tb else n)

        def run(ta=ta, tb=tb, m=m, n=n, k=k, a=a, lda=lda, b=b, ldb=ldb, c=c):
            be.gemm(ta, tb, m, n, k, 1.0, a, lda, b, ldb, 0.0, c, n)

        plan = be.gemm_plan(m, n, k)
        times = {}
        for p in [None] + SWEEP_PLANS:
            if p is not None and p[1] > max(1, k // 64):
                continue
            be.gemm_override = p
            times["heuristic" if p is None else f"{p[0]}/{p[1]}"] = median_ms(be, run, 1, 5)
        be.gemm_override = None
        best = min((v, key) for key, v in times.items() if key != "heuristic")
        rows.append(
            dict(
                label=label,
                shape=f"{m}x{n}x{k} {'nt'[ta]}{'nt'[tb]}",
                plan=f"{plan[0]}/{plan[1]}",
                ms=times["heuristic"],
                best=best[1],
                best_ms=best[0],
                gflops=2.0 * m * n * k / times["heuristic"] / 1e6,
                times=times,
            )
        )
        print(
            f"{label:9s} {rows[-1]['shape']:24s} {rows[-1]['plan']:16s} "
            f"{times['heuristic']:8.3f}  best {best[1]:16s} {best[0]:8.3f}  "
            f"{rows[-1]['gflops']:6.0f} GFLOP/s",
            flush=True,
        )
        a = b = c = None
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cfgs", nargs="+", help="CFG or CFG:BATCH")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument(
        "--cap",
        type=int,
        default=None,
        help="convolution workspace cap: 2**CAP floats (default: the layer's)",
    )
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.cap is not None:
        convolutional.WORKSPACE_CAP_FLOATS = 1 << args.cap
    report = []
    for spec in args.cfgs:
        path, _, batch = spec.partition(":")
        net = dn.load_network(path, batch=int(batch) if batch else None, device="cuda")
        be = net.be
        rng = np.random.default_rng(0)
        prepare(net)
        x = rng.random((net.batch,) + net.input_shape, dtype=np.float32)
        truth = random_truth(net, rng)
        step = median_ms(be, lambda: net.train_pass(x, truth), 3, args.repeats)  # noqa: B023
        print(
            f"\n{Path(path).name} batch {net.batch}, workspace cap "
            f"{convolutional.WORKSPACE_CAP_FLOATS} floats: training step {step:.2f} ms "
            f"(median of {args.repeats})\ngemm plans of its convolutions (ms; heuristic, best):"
        )
        report.append(
            dict(
                cfg=path,
                batch=net.batch,
                step_ms=step,
                cap=convolutional.WORKSPACE_CAP_FLOATS,
                sweep=sweep(be, conv_products(net), rng),
            )
        )
        net = be = None
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
