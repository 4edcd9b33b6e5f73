"""The NHWC 16-bit ops (issue 42, ops/nhwc/) against their NCHW 16-bit twins and the
memory roofline.

    python3 bench/kernels/nhwc_ops.py [--batch 8] [--precision fp16] [--device cuda]

Each op on a yolov3-tiny/yolov4-tiny-sized tensor at 416x416 (median of CUDA events after
warm-up): the bytes it must move at the least, the rate that makes in GB/s, and the NCHW
op doing the same work on the same 16-bit values; a 16-bit copy of the largest tensor is
the roofline. Pitches are the channels (all multiples of 8 here): the 16-byte path.
"""

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from darknet_py.backends import get_backend  # noqa: E402
from darknet_py.bench import median_seconds  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--precision", choices=("fp16", "bf16"), default="fp16")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--size", type=int, default=416, help="network input width and height")
    args = ap.parse_args()
    be, b, p, s = get_backend(args.device), args.batch, args.precision, args.size
    rng = np.random.default_rng(0)

    def tensor(c, h, w):
        a = be.storage_zeros(b * c * h * w, p)
        be.copy_rounded(be.from_host(rng.uniform(-4, 4, b * c * h * w).astype(np.float32)), a, p)
        return a

    ops = []  # (name, run, bytes at the least)
    # maxpool 2x2/2 after yolov3-tiny's first convolution: 16 x 416 x 416 -> 208 x 208
    c, h = 16, s
    x, out = tensor(c, h, h), tensor(c, h // 2, h // 2)
    moved = 2 * b * c * (h * h + (h // 2) ** 2)
    ops.append(("maxpool 2/2 16ch NHWC", lambda c=c, h=h: be.nhwc_maxpool(
        x, b, c, h, h, c, 0, 2, 2, 2, 1, out, c, 0), moved))  # fmt: skip
    ops.append(("maxpool 2/2 16ch NCHW", lambda c=c, h=h: be.maxpool_forward(
        x, b, c, h, h, 2, 2, 1, out, None), moved))  # fmt: skip
    # yolov3-tiny's maxpool size 2 stride 1 on 512 x 13 x 13
    c, h = 512, s // 32
    x1, out1 = tensor(c, h, h), tensor(c, h, h)
    moved = 4 * b * c * h * h
    ops.append(("maxpool 2/1 512ch NHWC", lambda c=c, h=h: be.nhwc_maxpool(
        x1, b, c, h, h, c, 0, 2, 1, 1, 1, out1, c, 0), moved))  # fmt: skip
    ops.append(("maxpool 2/1 512ch NCHW", lambda c=c, h=h: be.maxpool_forward(
        x1, b, c, h, h, 2, 1, 1, out1, None), moved))  # fmt: skip
    # upsample 2x of 128 x 13 x 13 into a route's 384-channel pixels (in place)
    c, h = 128, s // 32
    x2, route = tensor(c, h, h), tensor(384, 2 * h, 2 * h)
    out2 = tensor(c, 2 * h, 2 * h)
    moved = 2 * b * c * (h * h + 4 * h * h)
    ops.append(("upsample 2x 128ch into a route slice NHWC", lambda c=c, h=h: be.nhwc_upsample(
        x2, b, c, h, h, c, 0, 2, 1.0, route, 384, 0), moved))  # fmt: skip
    ops.append(("upsample 2x 128ch NCHW", lambda c=c, h=h: be.upsample(
        x2, h, h, c, b, 2, True, 1.0, out2), moved))  # fmt: skip
    # a route's copy: 256 channels of 26 x 26 into a 384-channel concatenation at 128
    c, h = 256, s // 16
    x3 = tensor(c, h, h)
    moved = 4 * b * c * h * h
    ops.append(("route copy 256ch at 128 of 384 NHWC", lambda c=c, h=h: be.nhwc_copy_channels(
        x3, b, c, h, h, c, 0, route, 384, 128), moved))  # fmt: skip
    ops.append(("route copy 256ch NCHW (copy_blocks)", lambda c=c, h=h: be.copy_blocks(
        x3, 0, c * h * h, route, 128 * h * h, 384 * h * h, c * h * h, b), moved))  # fmt: skip
    # a residual shortcut on 64 x 104 x 104 (yolov4's)
    c, h = 64, s // 4
    x4, a4, out4 = tensor(c, h, h), tensor(c, h, h), tensor(c, h, h)
    moved = 6 * b * c * h * h
    ops.append(("shortcut 64ch NHWC", lambda c=c, h=h: be.nhwc_shortcut(
        x4, c, 0, a4, c, c, 0, b, c, h, h, 1.0, 1.0, "linear", out4, c, 0), moved))  # fmt: skip

    def nchw_shortcut(c=c, h=h):
        be.copy(x4, out4)
        be.shortcut(b, h, h, c, a4, h, h, c, 1.0, 1.0, out4)

    ops.append(("shortcut 64ch NCHW (copy + shortcut)", nchw_shortcut, moved + 4 * b * c * h * h))
    # the boundaries: a head's input (512 x 13 x 13) to NCHW fp32, the image into NHWC
    c, h = 512, s // 32
    x5, nchw = tensor(c, h, h), be.zeros(b * c * h * h)
    ops.append(("NHWC 512ch -> NCHW fp32", lambda c=c, h=h: be.nhwc_to_nchw(
        x5, b, c, h, h, c, 0, nchw), 6 * b * c * h * h))  # fmt: skip
    image = be.from_host(rng.uniform(0, 1, b * 3 * s * s).astype(np.float32))
    first = be.storage_zeros(b * 8 * s * s, p)
    ops.append(("image fp32 NCHW -> NHWC pitch 8", lambda: be.nhwc_from_nchw(
        image, b, 3, s, s, first, 8, 0), b * s * s * (12 + 16)))  # fmt: skip
    big = tensor(16, s, s)
    roof = be.storage_zeros(b * 16 * s * s, p)
    ops.insert(0, ("16-bit copy (roofline)", lambda: be.copy(big, roof), 4 * b * 16 * s * s))

    print(f"{be.name} {getattr(be, 'device_name', '')}: batch {b}, {p}, {s}x{s}")
    print(f"{'op':46s} {'ms':>9s} {'GB/s':>8s}")
    for name, run, nbytes in ops:
        seconds = median_seconds(be, run, 3, args.repeats)
        print(f"{name:46s} {seconds * 1e3:9.3f} {nbytes / seconds / 1e9:8.1f}")


if __name__ == "__main__":
    main()
