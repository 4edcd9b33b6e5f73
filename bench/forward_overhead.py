"""Where a batch forward's time goes outside the layers (issue 18): every step of predict and
of detect's read-out timed on its own, with CUDA events (GPU time between the step's first
and last queued work) and the wall clock, for the large copies on the driver's pageable path
and through the page-locked staging of backends/cuda_transfer.py.

    python3 bench/forward_overhead.py [CFG] [--batch 64] [--repeats 10]

Prints a Markdown table (median ms per step) for bench/RESULTS.md.
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import darknet_py as dn  # noqa: E402
from darknet_py.backends import cuda_transfer  # noqa: E402
from darknet_py.bench import prepare  # noqa: E402
from darknet_py.detection import detector_layers, get_network_boxes  # noqa: E402

SHARED = ROOT.parent / "shared"


def timed(be, fn, repeats):
    """(median event ms, median wall ms) of fn()."""
    timer = be.timer()
    events, walls = [], []
    for _ in range(repeats):
        be.synchronize()
        t0 = time.perf_counter()
        timer.start()
        fn()
        events.append(1e3 * timer.stop())
        walls.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(events), statistics.median(walls)


def steps(net, x):
    be = net.be
    out = net.output_index
    heads = detector_layers(net)
    return [
        ("upload (input, host -> device)", lambda: net._stage(x, None, False)),
        ("layers (graph replay, input on the device)", net.infer),
        ("download (output layer, device -> host)", lambda: net.layer_output(out)),
        ("download (every detector head, as detect reads them)",
         lambda: [be.to_host(layer.output) for layer in heads]),
        ("decode (image 0: its slice of each head downloaded, boxes decoded on the host)",
         lambda: get_network_boxes(net, 640, 480, 0.25)),
        ("predict (whole: upload, layers, download)", lambda: net.predict(x)),
    ]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cfg", nargs="?", default=str(SHARED / "darknet-cfg" / "yolov3-tiny.cfg"))
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args()
    net = dn.load_network(args.cfg, batch=args.batch, device="cuda")
    prepare(net)
    x = np.random.default_rng(0).random((args.batch,) + net.input_shape, dtype=np.float32)
    for _ in range(3):
        net.predict(x)
    staged = cuda_transfer.MIN_STAGED_BYTES, cuda_transfer.MIN_STAGED_DOWNLOAD_BYTES
    modes = {"driver, pageable": (1 << 62, 1 << 62),
             f"staged (uploads from {staged[0] >> 10} KiB, downloads from "
             f"{staged[1] >> 10} KiB)": staged,
             "staged from 256 KiB": (256 << 10, 256 << 10)}
    rows = {}
    for mode, thresholds in modes.items():
        cuda_transfer.MIN_STAGED_BYTES, cuda_transfer.MIN_STAGED_DOWNLOAD_BYTES = thresholds
        for what, fn in steps(net, x):
            fn()
            rows.setdefault(what, {})[mode] = timed(net.be, fn, args.repeats)
    cuda_transfer.MIN_STAGED_BYTES, cuda_transfer.MIN_STAGED_DOWNLOAD_BYTES = staged
    if args.batch % 4 == 0:   # last: it leaves the network at batch / 4
        fn = lambda: net.predict_in_parts(x, args.batch // 4)  # noqa: E731
        fn()
        rows["predict in 4 parts (the copies of one part behind another's layers)"] = {
            mode: timed(net.be, fn, args.repeats) for mode in modes if modes[mode] == staged}
        net.set_batch(args.batch)
        for _ in range(2):
            net.predict(x)
    threads = {}
    default_threads = cuda_transfer._THREADS
    for count in (2, 4, 8, 16):
        cuda_transfer._THREADS = count
        net.be._transfers.close()   # its thread pool is made again with `count` threads
        threads[count] = [timed(net.be, fn, args.repeats)[0] for _, fn in steps(net, x)[:3:2]]
    cuda_transfer._THREADS = default_threads
    net.be._transfers.close()
    print(f"{Path(args.cfg).name}, batch {args.batch}, {net.be.device_name}: median of "
          f"{args.repeats}, ms (CUDA events / wall clock); {launches(net, x)} kernel launches "
          f"per eager forward\n")
    print(f"| step | {' | '.join(modes)} |")
    print("|---|" + "---|" * len(modes))
    for what, by_mode in rows.items():
        cells = [f"{by_mode[m][0]:.3f} / {by_mode[m][1]:.3f}" if m in by_mode else "-"
                 for m in modes]
        print(f"| {what} | {' | '.join(cells)} |")
    print("\nstaged copies by host threads (CUDA events, ms): " + ", ".join(
        f"{count}: upload {up:.2f} download {down:.2f}" for count, (up, down) in threads.items()))


def launches(net, x):
    """Kernel launches of one forward run eagerly (what the replayed graph holds)."""
    be, count = net.be, [0]
    real = be._launch

    def counting(*args):
        count[0] += 1
        return real(*args)

    be._launch = counting
    try:
        net._forward_layers(net._net_input, False)
        be.synchronize()
    finally:
        be._launch = real
    return count[0]


if __name__ == "__main__":
    main()
