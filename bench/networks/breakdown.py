"""Where a network's time goes on the CUDA backend: a forward (or, with --train, a training
pass), kernel by kernel, layer by layer, on the host, and outside the layers.

    python3 bench/networks/breakdown.py [CFG] [--batch N] [--precision P] [--train]
                                      [--parts kernels layers host outside] [--passes 5]
                                      [--top 30]

Random weights and input (truth too, with --train: darknet_py.bench.prepare and
random_truth, as `darknet-py bench`). Parts (all by default):
  kernels  the calls run eagerly (no CUDA graph replay, so every kernel is seen) under
           PyTorch's profiler, which records every CUDA kernel of the process through CUPTI,
           ours included (PyTorch is only the recorder here, nothing of it runs): each
           kernel's device time per call, its launches per call and its share, largest
           first; needs PyTorch;
  layers   one more call, eager, with a CUDA event pair around every layer's forward and
           backward: GPU time per layer and phase (launch gaps inside a layer count toward
           it, so a layer's time above its kernels' is host-bound time);
  host     host time per call against the time until synchronised, and the Python
           profile of the host side (launch overhead, host-side losses);
  outside  (forward only) every step of predict and of detect's read-out outside the layers
           on its own: the input's upload, the output's and every head's download, image
           0's boxes decoded, the whole predict and predict_in_parts; CUDA events and the
           wall clock, for the copies on the driver's pageable path and through the
           page-locked staging of backends/cuda_transfer.py. A Markdown table.
"""

import argparse
import collections
import cProfile
import pstats
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.common import SHARED  # noqa: E402
from darknet_py.bench import forward_parts, median_seconds, prepare, random_truth  # noqa: E402
from darknet_py.network import load_network  # noqa: E402

PARTS = ("kernels", "layers", "host", "outside")


class Eager:
    """The network's calls run eagerly (not replayed as CUDA graphs) inside the block."""

    def __init__(self, net):
        self.net = net

    def __enter__(self):
        self.was, self.net.graphs.enabled = self.net.graphs.enabled, False

    def __exit__(self, *exc):
        self.net.graphs.enabled = self.was


def kernels(net, run, what, passes, top):
    """Each kernel's device time and launches per call (CUPTI, through PyTorch)."""
    try:
        from torch.profiler import ProfilerActivity, profile
    except ImportError:
        print("kernels: needs PyTorch's profiler (pip install torch); not measured")
        return
    with Eager(net):
        for _ in range(3):
            run()
        net.be.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(passes):
                run()
            net.be.synchronize()
    totals = collections.defaultdict(float)
    counts = collections.Counter()
    for event in prof.events():
        if event.device_type.name == "CUDA":
            totals[event.name] += event.device_time_total / 1e3  # ms
            counts[event.name] += 1
    whole = sum(totals.values()) / passes or 1.0
    print(
        f"\nkernels: {whole:.1f} ms of device work a {what}, "
        f"{sum(counts.values()) // passes} launches"
    )
    print(f"{'ms/call':>9} {'share':>6} {'calls':>6}  kernel")
    for name, ms in sorted(totals.items(), key=lambda kv: -kv[1])[:top]:
        print(
            f"{ms / passes:9.2f} {ms / passes / whole:6.1%} {counts[name] // passes:6d}  "
            f"{name[:90]}"
        )


def layers(net, run, train):
    """GPU ms per (layer, phase) of one eager call: CUDA event pairs on the backend's
    stream around each layer's forward and backward."""
    import pycuda.driver as drv

    be, spans = net.be, []
    phases = ("forward", "backward") if train else ("forward",)

    def spanned(layer, phase):
        method = getattr(layer, phase)

        def timed(n):
            start, stop = drv.Event(), drv.Event()
            start.record(be.stream)
            result = method(n)
            stop.record(be.stream)
            spans.append(((layer.index, layer.type), phase, start, stop))
            return result

        return timed

    with Eager(net):
        run()
        for layer in net.layers:
            for phase in phases:
                setattr(layer, phase, spanned(layer, phase))
        try:
            run()
            be.synchronize()
        finally:
            for layer in net.layers:
                for phase in phases:
                    delattr(layer, phase)
    table = collections.defaultdict(lambda: collections.defaultdict(float))
    for key, phase, start, stop in spans:
        table[key][phase] += stop.time_since(start)
    print(f"\nlayers (one eager call): {sum(sum(v.values()) for v in table.values()):.2f} ms")
    print("layer type            forward ms" + ("  backward ms" if train else ""))
    for (index, kind), ms in sorted(table.items()):
        line = f"{index:5d} {kind:<14s} {ms['forward']:11.3f}"
        print(line + (f" {ms['backward']:12.3f}" if train else ""))


def host(net, run, what, repeats):
    """Host time per call, the time until synchronised, and the host side's profile."""
    for _ in range(3):
        run()
    net.be.synchronize()
    t0 = time.perf_counter()
    for _ in range(repeats):
        run()
    host_s = (time.perf_counter() - t0) / repeats
    net.be.synchronize()
    total_s = (time.perf_counter() - t0) / repeats
    print(f"\nhost: {1e3 * host_s:.3f} ms a {what} (until synchronised: {1e3 * total_s:.3f} ms)")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(repeats):
        run()
    net.be.synchronize()
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(14)


def outside(net, x, repeats):
    """Every step of predict and detect's read-out outside the layers, in each copy mode."""
    from darknet_py.backends import cuda_transfer
    from darknet_py.predictions import detector_layers, get_network_boxes

    be = net.be
    heads = detector_layers(net)

    def timed(fn):
        """(median event ms, median wall ms) of fn()."""
        timer, events, walls = be.timer(), [], []
        for _ in range(repeats):
            be.synchronize()
            t0 = time.perf_counter()
            timer.start()
            fn()
            events.append(1e3 * timer.stop())
            walls.append(1e3 * (time.perf_counter() - t0))
        return statistics.median(events), statistics.median(walls)

    steps = [
        (
            "download (every detector head, as detect reads them)",
            lambda: [be.to_host(layer.output) for layer in heads],
        ),
        (
            "decode (image 0: its slice of each head downloaded, boxes decoded on the host)",
            lambda: get_network_boxes(net, 640, 480, 0.25),
        ),
        ("predict (whole: upload, layers, download)", lambda: net.predict(x)),
    ]
    staged = cuda_transfer.MIN_STAGED_BYTES, cuda_transfer.MIN_STAGED_DOWNLOAD_BYTES
    modes = {
        "driver, pageable": (1 << 62, 1 << 62),
        f"staged (uploads from {staged[0] >> 10} KiB, downloads from "
        f"{staged[1] >> 10} KiB)": staged,
        "staged from 256 KiB": (256 << 10, 256 << 10),
    }
    rows = collections.defaultdict(dict)
    try:
        for mode, thresholds in modes.items():
            cuda_transfer.MIN_STAGED_BYTES, cuda_transfer.MIN_STAGED_DOWNLOAD_BYTES = thresholds
            parts = forward_parts(net, x, 2, repeats)  # CUDA events only
            rows["upload (input, host -> device)"][mode] = (parts["upload_ms"], None)
            rows["layers (graph replay, input on the device)"][mode] = (
                parts["gpu_forward_ms"],
                None,
            )
            rows["download (output layer, device -> host)"][mode] = (parts["download_ms"], None)
            for what, fn in steps:
                fn()
                rows[what][mode] = timed(fn)
    finally:
        cuda_transfer.MIN_STAGED_BYTES, cuda_transfer.MIN_STAGED_DOWNLOAD_BYTES = staged
    if net.batch % 4 == 0:  # last: it leaves the network at batch / 4
        batch = net.batch
        fn = lambda: net.predict_in_parts(x, batch // 4)  # noqa: E731
        fn()
        rows["predict in 4 parts (the copies of one part behind another's layers)"] = {
            mode: timed(fn) for mode in modes if modes[mode] == staged
        }
        net.set_batch(batch)
    print(f"\noutside the layers: median of {repeats}, ms (CUDA events / wall clock)\n")
    print(f"| step | {' | '.join(modes)} |")
    print("|---|" + "---|" * len(modes))
    for what, by_mode in rows.items():
        cells = [
            "-"
            if m not in by_mode
            else f"{by_mode[m][0]:.3f}"
            + ("" if by_mode[m][1] is None else f" / {by_mode[m][1]:.3f}")
            for m in modes
        ]
        print(f"| {what} | {' | '.join(cells)} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cfg", nargs="?", default=str(SHARED / "darknet-cfg" / "yolov3-tiny.cfg"))
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--train", action="store_true", help="a training pass, not a forward")
    ap.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    ap.add_argument("--passes", type=int, default=5, help="calls the kernels part records")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--top", type=int, default=30)
    args = ap.parse_args()
    net = load_network(args.cfg, batch=args.batch, device="cuda:0", precision=args.precision)
    rng = np.random.default_rng(0)
    prepare(net, 0)
    for layer in net.layers:  # the yolo statistics line would flood the output
        layer.verbose = False
    x = rng.random((net.batch,) + net.input_shape, dtype=np.float32)
    if args.train:
        net.share_deltas = True  # as `darknet-py train` trains
        net.share_outputs = True
        truth = random_truth(net, rng)
        what = "training pass"

        def run():
            net.train_pass(x, truth)
    else:
        what = "forward"
        net.predict(x)
        run = net.infer
    print(
        f"{Path(args.cfg).name}, batch {net.batch}, {args.precision}, {net.be.device_name}: "
        f"a {what} takes {1e3 * median_seconds(net.be, run, 3, args.repeats):.2f} ms "
        f"(median of {args.repeats})"
    )
    if "kernels" in args.parts:
        kernels(net, run, what, args.passes, args.top)
    if "layers" in args.parts:
        layers(net, run, args.train)
    if "host" in args.parts:
        host(net, run, what, args.repeats)
    if "outside" in args.parts and not args.train:
        outside(net, x, args.repeats)


if __name__ == "__main__":
    main()
