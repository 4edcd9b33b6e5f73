"""Where a training step's time goes on the CUDA backend, layer by layer and kernel by
kernel, and which gemm plan suits each convolution's products (issue #8).

    python3 bench/conv_bench.py CFG[:BATCH] ... [--sweep] [--cap LOG2] [--json F]

For each cfg (random weights, random input and truth, as `darknet-py bench`):
  * the training step: median of CUDA-event timings around train_pass after warm-up;
  * one more step, run eagerly (not as a CUDA graph replay), with an event pair around
    every kernel launch and every layer's forward and backward: GPU time per layer and phase, and per kernel (gemm kernels
    also by their M x N x K). Launch gaps inside a layer count toward the layer, not
    toward any kernel, so a layer's time above its kernels' sum is host-bound time;
  * --sweep: every convolution's three products (forward W x col, weight gradient
    delta x col^T, input gradient W^T x delta) at the chunk of images the layer uses,
    timed under the heuristic's plan and under each alternative (tile, K splits).
"""
import argparse
import json
import os
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pycuda.driver as drv  # noqa: E402

import darknet_py as dn  # noqa: E402
from darknet_py.bench import prepare, random_truth  # noqa: E402
from darknet_py.layers import convolutional  # noqa: E402

SWEEP_PLANS = ([("128x128x8s4", s) for s in (1, 2, 4, 8)] +
               [("64x64x8s4r8", s) for s in (1, 4, 16, 32, 64, 128)] +
               [("32x32x8s4w", s) for s in (1, 16, 64, 256, 1024, 2048)])


def median_ms(be, fn, warmup=3, repeats=10):
    for _ in range(warmup):
        fn()
    be.synchronize()
    start, stop = drv.Event(), drv.Event()
    times = []
    for _ in range(repeats):
        start.record(be.stream)
        fn()
        stop.record(be.stream)
        stop.synchronize()
        times.append(stop.time_since(start))
    return statistics.median(times)


class Recorder:
    """Event pairs around launches and layer phases on the backend's stream."""

    def __init__(self, be):
        self.be, self.spans = be, []   # (kind, key, start event, stop event)

    def span(self, kind, key, fn, *args):
        a, b = drv.Event(), drv.Event()
        a.record(self.be.stream)
        result = fn(*args)
        b.record(self.be.stream)
        self.spans.append((kind, key, a, b))
        return result

    def totals(self):
        self.be.synchronize()
        out = defaultdict(lambda: defaultdict(float))
        for kind, key, a, b in self.spans:
            out[kind][key] += b.time_since(a)
        return out


def profile_step(net, x, truth):
    """{'layer': {(index, type, phase): ms}, 'kernel': {name: ms}} of one training step."""
    be = net.be
    rec = Recorder(be)
    real_launch, real_gemm = be._launch, be.gemm
    gemm_shape = []

    def launch(name, grid, block, *args):
        key = name
        if name.startswith("sgemm_") and gemm_shape:
            key = f"{name} {gemm_shape[-1]}"
        return rec.span("kernel", key, real_launch, name, grid, block, *args)

    def gemm(ta, tb, m, n, k, *args):
        gemm_shape.append(f"{m}x{n}x{k} splits {be.gemm_plan(m, n, k)[1]}")
        try:
            return real_gemm(ta, tb, m, n, k, *args)
        finally:
            gemm_shape.pop()

    graphs, net.graphs.enabled = net.graphs.enabled, False   # eager: every launch seen
    be._launch, be.gemm = launch, gemm
    for layer in net.layers:
        for phase in ("forward", "backward"):
            method = getattr(layer, phase)

            def wrapped(n, method=method, key=(layer.index, layer.type, phase)):
                return rec.span("layer", key, method, n)
            setattr(layer, phase, wrapped)
    try:
        net.train_pass(x, truth)
        return rec.totals()
    finally:
        net.graphs.enabled = graphs
        be._launch, be.gemm = real_launch, real_gemm
        for layer in net.layers:
            for phase in ("forward", "backward"):
                delattr(layer, phase)


def conv_products(net):
    """[(label, ta, tb, m, n, k)] of each convolution's gemms at its chunk size."""
    seen, out = set(), []
    for layer in net.layers:
        if layer.type != "convolutional":
            continue
        m, k, n = layer._gemm_dims()
        cols = layer._chunk(net.batch) * n
        for what, case in (("fwd", (0, 0, m, cols, k)), ("wgrad", (0, 1, m, k, cols)),
                           ("dgrad", (1, 0, k, cols, m))):
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
        run = lambda: be.gemm(ta, tb, m, n, k, 1.0, a, lda, b, ldb, 0.0, c, n)  # noqa: E731
        plan = be.gemm_plan(m, n, k)
        times = {}
        for p in [None] + SWEEP_PLANS:
            if p is not None and p[1] > max(1, k // 64):
                continue
            be.gemm_override = p
            times["heuristic" if p is None else f"{p[0]}/{p[1]}"] = median_ms(be, run, 1, 5)
        be.gemm_override = None
        best = min((v, key) for key, v in times.items() if key != "heuristic")
        rows.append(dict(label=label, shape=f"{m}x{n}x{k} {'nt'[ta]}{'nt'[tb]}",
                         plan=f"{plan[0]}/{plan[1]}", ms=times["heuristic"], best=best[1],
                         best_ms=best[0], gflops=2.0 * m * n * k / times["heuristic"] / 1e6,
                         times=times))
        print(f"{label:9s} {rows[-1]['shape']:24s} {rows[-1]['plan']:16s} {times['heuristic']:8.3f}"
              f"  best {best[1]:16s} {best[0]:8.3f}  {rows[-1]['gflops']:6.0f} GFLOP/s", flush=True)
        a = b = c = None
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("cfgs", nargs="+", help="CFG or CFG:BATCH")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--cap", type=int, default=None,
                    help="convolution workspace cap: 2**CAP floats (default: the layer's)")
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
        step = median_ms(be, lambda: net.train_pass(x, truth), 3, args.repeats)
        prof = profile_step(net, x, truth)
        entry = dict(cfg=path, batch=net.batch, step_ms=step, cap=convolutional.WORKSPACE_CAP_FLOATS,
                     layers={f"{i} {t} {p}": v for (i, t, p), v in prof["layer"].items()},
                     kernels=dict(prof["kernel"]))
        print(f"\n{Path(path).name} batch {net.batch}, workspace cap "
              f"{convolutional.WORKSPACE_CAP_FLOATS} floats: training step {step:.2f} ms (median of "
              f"{args.repeats}); profiled step: layers {sum(prof['layer'].values()):.2f} ms, "
              f"kernels {sum(prof['kernel'].values()):.2f} ms")
        by_layer = defaultdict(dict)
        for (i, t, p), v in prof["layer"].items():
            by_layer[(i, t)][p] = v
        print("layer type            forward ms  backward ms")
        for (i, t), v in sorted(by_layer.items()):
            print(f"{i:5d} {t:<14s} {v.get('forward', 0):11.3f} {v.get('backward', 0):12.3f}")
        print("kernels by total ms (top 25):")
        for name, v in sorted(prof["kernel"].items(), key=lambda kv: -kv[1])[:25]:
            print(f"  {v:8.3f}  {name}")
        if args.sweep:
            print(f"\ngemm plans for {Path(path).name}'s convolutions (ms; heuristic, best):")
            entry["sweep"] = sweep(be, conv_products(net), rng)
        report.append(entry)
        net = be = None
    out = args.json or (os.path.join(os.environ["OUT"], "conv_bench.json")
                        if os.environ.get("OUT") else None)
    if out:
        with open(out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
