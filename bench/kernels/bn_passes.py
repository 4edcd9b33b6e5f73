"""Batch norm's element-wise passes against the memory roofline.

    python3 bench/kernels/bn_passes.py [--shape 32 64 208 208] [--device cuda] [--repeats 20]

Each op of a training batch-normalised layer, timed alone on one array (median of CUDA
events after warm-up), with the bytes it must move at the least and the rate that makes
in GB/s; a device-to-device copy of the same array is the roofline. yolov4's largest
layers are 32 x 64 x 208 x 208 at batch 32.
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
    ap.add_argument("--shape", type=int, nargs=4, default=[32, 64, 208, 208])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    b, c, h, w = args.shape
    spatial, n = h * w, b * c * h * w
    be = get_backend(args.device)
    rng = np.random.default_rng(0)
    x = be.from_host(rng.standard_normal(n, dtype=np.float32))
    y = be.from_host(rng.standard_normal(n, dtype=np.float32))
    delta = be.from_host(rng.standard_normal(n, dtype=np.float32))
    dst = be.zeros(n)
    mean, var = be.zeros(c), be.from_host(np.ones(c, np.float32))
    scales, biases = be.from_host(np.ones(c, np.float32)), be.zeros(c)
    upd_a, upd_b, md, vd = be.zeros(c), be.zeros(c), be.zeros(c), be.zeros(c)
    sum_g, sum_gx = be.zeros(c), be.zeros(c)
    x16 = be.storage_zeros(n, "fp16")
    be.copy_rounded(x, x16, "fp16")

    def apply(act, keep=None):
        be.copy(y, dst)  # untimed-size note: batchnorm_apply works in place
        be.batchnorm_apply(
            dst,
            mean,
            var,
            scales,
            biases,
            b,
            c,
            spatial,
            1e-5,
            act,
            None,
            keep=keep,
            keep_precision="fp16",
        )

    ops = [  # (name, run, bytes at the least)
        ("copy (roofline)", lambda: be.copy(x, dst), 8 * n),
        ("mean", lambda: be.mean(x, b, c, spatial, mean), 4 * n),
        ("variance", lambda: be.variance(x, mean, b, c, spatial, var), 4 * n),
        ("mean_variance (one read)", lambda: be.mean_variance(x, b, c, spatial, mean, var), 4 * n),
        ("copy_rounded fp16", lambda: be.copy_rounded(x, x16, "fp16"), 6 * n),
    ]
    for act in ("linear", "leaky", "mish"):
        ops.append((f"copy + batchnorm_apply {act}", lambda a=act: apply(a), 16 * n))
    ops.append(("copy + batchnorm_apply leaky, keep x16", lambda: apply("leaky", x16), 18 * n))
    for act, from_y in (("leaky", True), ("mish", False)):
        ops.append(
            (
                f"batchnorm_activation_backward {act} x16",
                lambda a=act: be.batchnorm_activation_backward(
                    x16,
                    mean,
                    var,
                    scales,
                    biases,
                    y,
                    b,
                    c,
                    spatial,
                    1e-5,
                    a,
                    delta,
                    upd_a,
                    upd_b,
                    x_precision="fp16",
                ),
                (14 if from_y else 10) * n,
            )
        )
    ops.append(
        (
            "batchnorm_delta x16",
            lambda: be.batchnorm_delta(
                x16, mean, var, scales, b, c, spatial, md, vd, delta, fork=True, x_precision="fp16"
            ),
            (6 + 10) * n,
        )
    )
    ops.append(
        (
            "batchnorm_activation_backward leaky x16, sums",
            lambda: be.batchnorm_activation_backward(
                x16,
                mean,
                var,
                scales,
                biases,
                y,
                b,
                c,
                spatial,
                1e-5,
                "leaky",
                delta,
                upd_a,
                upd_b,
                x_precision="fp16",
                delta_sum=sum_g,
                delta_x_norm_sum=sum_gx,
            ),
            14 * n,
        )
    )
    ops.append(
        (
            "batchnorm_delta_from_sums x16",
            lambda: be.batchnorm_delta_from_sums(
                x16,
                mean,
                var,
                scales,
                b,
                c,
                spatial,
                1e-5,
                sum_g,
                sum_gx,
                md,
                vd,
                delta,
                fork=True,
                x_precision="fp16",
            ),
            10 * n,
        )
    )
    print(f"shape {b}x{c}x{h}x{w} ({n * 4 / 1e9:.2f} GB fp32) on {be.name}")
    for name, run, nbytes in ops:
        s = median_seconds(be, run, 3, args.repeats)
        print(f"{name:44s} {1e3 * s:8.3f} ms {nbytes / s / 1e9:8.0f} GB/s")


if __name__ == "__main__":
    main()
