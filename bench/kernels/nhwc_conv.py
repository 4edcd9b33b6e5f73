"""The channels-last 16-bit convolution forward (ops/convolution/conv_nhwc.cu: wgmma fed by TMA
im2col) against today's NCHW forward (CudaBackend.conv_forward at 16 bits: wgmma over an
unfolded copy for 3x3 layers up to 52x52, the implicit mma.sync kernel otherwise), on
yolov4's convolutions at 416x416, batch 32.

    python3 bench/kernels/nhwc_conv.py [--precision fp16|bf16] [--batch 32] [--reps 20]
                                       [--only LABEL] [--json OUT]

Each distinct layer shape (yolov4.cfg of the AlexeyAB fork, 110 convolutions in 37 shapes,
listed below) runs on random 16-bit images and weights with a bias and leaky (the
inference epilogue): the median of `reps` CUDA-event timings of QUEUE calls queued back to
back (per call), after 3 warm-ups, for each path; TFLOP/s counts 2 x pixels x filters x
channels x ksize^2 (the channels the layer has, not the padded pitch). NHWC pitches are
the channels rounded up to 8 (the input's cx, and the output's, which is the next layer's
cx). Both paths' first images are compared (max |NHWC - NCHW| / max |NCHW|, two 16-bit
roundings apart). The last table line weighs each shape by its count: one batch's forward
convolutions, each path.
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from darknet_py.bench import median_seconds  # noqa: E402

QUEUE = 5
# (channels, size, filters, ksize, stride, count) of yolov4.cfg's convolutions at 416x416
# (size: the input's height = width; pad = ksize // 2)
YOLOV4_416 = [
    (3, 416, 32, 3, 1, 1),
    (32, 416, 64, 3, 2, 1),
    (32, 208, 64, 3, 1, 1),
    (64, 208, 64, 1, 1, 3),
    (64, 208, 32, 1, 1, 1),
    (64, 208, 128, 3, 2, 1),
    (128, 208, 64, 1, 1, 1),
    (64, 104, 64, 1, 1, 3),
    (64, 104, 64, 3, 1, 2),
    (128, 104, 64, 1, 1, 2),
    (128, 104, 128, 1, 1, 1),
    (128, 104, 256, 3, 2, 1),
    (128, 52, 128, 1, 1, 9),
    (128, 52, 128, 3, 1, 8),
    (128, 52, 256, 3, 1, 3),
    (128, 52, 256, 3, 2, 1),
    (256, 52, 128, 1, 1, 6),
    (256, 52, 256, 1, 1, 1),
    (256, 52, 512, 3, 2, 1),
    (256, 52, 255, 1, 1, 1),
    (256, 26, 256, 1, 1, 9),
    (256, 26, 256, 3, 1, 8),
    (256, 26, 512, 3, 1, 5),
    (256, 26, 128, 1, 1, 1),
    (256, 26, 512, 3, 2, 1),
    (512, 26, 256, 1, 1, 9),
    (512, 26, 512, 1, 1, 1),
    (512, 26, 1024, 3, 2, 1),
    (512, 26, 255, 1, 1, 1),
    (512, 13, 512, 1, 1, 5),
    (512, 13, 512, 3, 1, 4),
    (512, 13, 1024, 3, 1, 5),
    (512, 13, 256, 1, 1, 1),
    (1024, 13, 512, 1, 1, 8),
    (1024, 13, 1024, 1, 1, 1),
    (1024, 13, 255, 1, 1, 1),
    (2048, 13, 512, 1, 1, 1),
]


def label(c, size, f, k, s):
    return f"{k}x{k}/{s} {c}->{f} @{size}"


def stored(be, values, precision):
    kept = be.storage_zeros(values.size, precision)
    be.copy_rounded(be.from_host(values), kept, precision)
    return kept


def one_shape(be, precision, batch, reps, c, size, f, k, s, rng):
    pad = k // 2
    out_size = (size + 2 * pad - k) // s + 1
    positions = out_size * out_size
    cx = -(-c // 8) * 8
    flops = 2.0 * batch * positions * f * c * k * k
    images = rng.uniform(-1, 1, (batch, c, size, size)).astype(np.float32)
    weights = rng.uniform(-1, 1, f * c * k * k).astype(np.float32) / np.sqrt(c * k * k)
    bias = be.from_host(rng.uniform(-0.3, 0.3, f).astype(np.float32))
    w = be.from_host(weights)
    # NCHW: today's path
    im = stored(be, images.reshape(-1), precision)
    packed = be.pack_weights(w, f, c * k * k, precision)
    out_nchw = be.storage_zeros(batch * f * positions, precision)

    def nchw():
        be.conv_forward(
            packed, im, c, size, size, k, s, pad, 1, batch, c * size * size, bias, "leaky",
            out_nchw, f * positions, precision,
        )  # fmt: skip

    # NHWC: the padded channels zero
    nhwc_images = np.zeros((batch, size, size, cx), np.float32)
    nhwc_images[..., :c] = images.transpose(0, 2, 3, 1)
    del images
    x = stored(be, nhwc_images.reshape(-1), precision)
    del nhwc_images
    packed_nhwc = be.pack_nhwc_weights(w, f, c, k, cx, precision)
    pitch = -(-f // 8) * 8  # the next layer's cx
    out_nhwc = be.storage_zeros(batch * positions * pitch, precision)

    def nhwc():
        be.conv_nhwc_forward(
            precision, x, batch, size, size, cx, packed_nhwc, f, k, s, pad, out_nhwc, pitch, 0,
            bias=bias, activation="leaky",
        )  # fmt: skip

    times = {}
    for name, run in (("nchw", nchw), ("nhwc", nhwc)):
        # QUEUE calls back to back a timing, so that the host's launch work (Python checks,
        # ctypes) overlaps the GPU's instead of being timed on small layers
        times[name] = median_seconds(be, lambda run=run: [run() for _ in range(QUEUE)], 3, reps)
        times[name] /= QUEUE
    first_nchw = be.to_host(out_nchw[: f * positions]).reshape(f, positions).T
    first_nhwc = be.to_host(out_nhwc[: positions * pitch]).reshape(positions, pitch)[:, :f]
    agree = float(np.abs(first_nhwc - first_nchw).max() / np.abs(first_nchw).max())
    return {
        "flops": flops,
        "nchw_ms": 1e3 * times["nchw"],
        "nhwc_ms": 1e3 * times["nhwc"],
        "nchw_tflops": flops / times["nchw"] / 1e12,
        "nhwc_tflops": flops / times["nhwc"] / 1e12,
        "first_image_rel_diff": agree,
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--precision", default="fp16", choices=("fp16", "bf16"))
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--only", help="run the shapes whose label contains this")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)

    from darknet_py.backends.cuda_backend import CudaBackend
    from darknet_py.ops.convolution import nhwc

    be = CudaBackend(0)
    if nhwc.kernels(be) is None:
        sys.exit(f"{be.device_name}: the NHWC kernel needs compute capability 9.0")
    rng = np.random.default_rng(0)
    rows, totals = {}, {"nchw_ms": 0.0, "nhwc_ms": 0.0, "flops": 0.0}
    print(f"{be.device_name}, {args.precision}, batch {args.batch}", flush=True)
    header = f"{'layer':24s} {'n':>3s} {'NCHW ms':>9s} {'TF/s':>6s} {'NHWC ms':>9s} {'TF/s':>6s}"
    print(header + f" {'x':>5s} {'diff':>8s}", flush=True)
    for c, size, f, k, s, count in YOLOV4_416:
        name = label(c, size, f, k, s)
        if args.only and args.only not in name:
            continue
        r = one_shape(be, args.precision, args.batch, args.reps, c, size, f, k, s, rng)
        r["count"] = count
        rows[name] = r
        for key in ("nchw_ms", "nhwc_ms", "flops"):
            totals[key] += count * r[key]
        print(
            f"{name:24s} {count:3d} {r['nchw_ms']:9.3f} {r['nchw_tflops']:6.1f} "
            f"{r['nhwc_ms']:9.3f} {r['nhwc_tflops']:6.1f} "
            f"{r['nchw_ms'] / r['nhwc_ms']:5.2f} {r['first_image_rel_diff']:8.1e}",
            flush=True,
        )
    t = totals
    print(
        f"{'all, weighted':24s} {'':3s} {t['nchw_ms']:9.3f} {t['flops'] / t['nchw_ms'] / 1e9:6.1f} "
        f"{t['nhwc_ms']:9.3f} {t['flops'] / t['nhwc_ms'] / 1e9:6.1f} "
        f"{t['nchw_ms'] / t['nhwc_ms']:5.2f}",
        flush=True,
    )
    if args.json:
        report = dict(gpu=be.device_name, precision=args.precision, batch=args.batch, rows=rows)
        args.json.write_text(json.dumps(dict(report, totals=totals), indent=1) + "\n")


if __name__ == "__main__":
    main()
