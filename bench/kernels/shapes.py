"""The fp32 GEMM on each convolution product's shape, and im2col/col2im, against their floors.

    python3 bench/kernels/shapes.py [--reps N] [--variants] [--out FILE.json]

Runs with the device's plain python3 and PyCUDA, installing nothing. Each case is
timed with CUDA events on the backend's stream after warm-up; the median of the
repeats is reported with its rate and the two floors from bench/NOTES.md:
  FLOP floor: flops / (SMs x 128 FP32 lanes x 2 x max SM clock), the FFMA peak;
  byte floor: bytes / measured device-to-device copy bandwidth (read + write).
Inputs rotate among copies whose total exceeds twice the L2 cache, so repeats
do not just measure the cache. --variants also times every gemm kernel variant
(tile, split-K) per shape, to check the heuristic's choice. The 4096^3 product in every
precision is bench/kernels/gemm.py's.
"""

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from darknet_py.shapes import conv_out_size  # noqa: E402

# (label, ta, tb, m, n, k): Darknet's conv as gemm is M = filters, N = out_h*out_w,
# K = channels*size*size (forward: weights x col; weight gradient: delta x col^T;
# input gradient: weights^T x delta).
GEMM_CASES = [
    ("conv fwd 3x3 32->64 @208", 0, 0, 64, 43264, 288),
    ("conv fwd 3x3 64->128 @104", 0, 0, 128, 10816, 576),
    ("conv fwd 3x3 128->256 @52", 0, 0, 256, 2704, 1152),
    ("conv fwd 3x3 256->512 @26", 0, 0, 512, 676, 2304),
    ("conv fwd 3x3 512->1024 @13", 0, 0, 1024, 169, 4608),
    ("conv fwd 1x1 1024->256 @13", 0, 0, 256, 169, 1024),
    ("conv wgrad 3x3 128->256 @52", 0, 1, 256, 1152, 2704),
    ("conv dgrad 3x3 128->256 @52", 1, 0, 1152, 2704, 256),
    ("square 1024", 0, 0, 1024, 1024, 1024),
    ("square 2048", 0, 0, 2048, 2048, 2048),
    ("square 2048 nt", 0, 1, 2048, 2048, 2048),
    ("square 2048 tn", 1, 0, 2048, 2048, 2048),
]
GEMM_VARIANTS = [
    ("128x128x8s4", 1),
    ("128x128x8s4", 4),
    ("64x64x8s4r8", 1),
    ("64x64x8s4r8", 2),
    ("64x64x8s4r8", 4),
    ("64x64x8s4r8", 8),
]

# (label, channels, height, width, ksize, stride, pad, dilation)
IM2COL_CASES = [
    ("3x3 c3 @416", 3, 416, 416, 3, 1, 1, 1),
    ("3x3 c32 @208", 32, 208, 208, 3, 1, 1, 1),
    ("3x3 c64 @104", 64, 104, 104, 3, 1, 1, 1),
    ("3x3 s2 c64 @104", 64, 104, 104, 3, 2, 1, 1),
    ("3x3 c256 @26", 256, 26, 26, 3, 1, 1, 1),
    ("3x3 c512 @13", 512, 13, 13, 3, 1, 1, 1),
]


class Timer:
    def __init__(self, backend, warmup, reps):
        self.be, self.warmup, self.reps = backend, warmup, reps
        import pycuda.driver as drv

        self.start, self.end = drv.Event(), drv.Event()

    def median_ms(self, fn):
        """fn(i) runs repeat i; returns the median milliseconds of one call."""
        for i in range(self.warmup):
            fn(i)
        self.be.synchronize()
        times = []
        for i in range(self.reps):
            self.start.record(self.be.stream)
            fn(i)
            self.end.record(self.be.stream)
            self.end.synchronize()
            times.append(self.end.time_since(self.start))
        return statistics.median(times), times


def copies_for(nbytes, l2_bytes, limit=16):
    """How many input copies to rotate so that they span twice the L2."""
    return max(1, min(limit, -(-2 * l2_bytes // max(nbytes, 1))))


def measure_copy_bandwidth(be, timer):
    n = 256 << 20  # floats: 1 GiB each way
    src, dst = be.empty(n), be.empty(n)
    be.fill(src, 1.5)
    ms, _ = timer.median_ms(lambda i: be.copy(src, dst))
    return 2 * 4 * n / (ms * 1e-3)  # bytes read + written per second


def library_sgemm_tflops():
    """cuBLAS fp32 SGEMM (TF32 off) via PyTorch, if the device has it: a ceiling to
    compare against, measured in a separate process (never part of the product)."""
    code = (
        "import torch\n"
        "torch.backends.cuda.matmul.allow_tf32 = False\n"
        "n = 2048\n"
        "a = torch.rand(n, n, device='cuda') - 0.5; b = torch.rand(n, n, device='cuda') - 0.5\n"
        "for _ in range(3): a @ b\n"
        "s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)\n"
        "ts = []\n"
        "for _ in range(15):\n"
        "    s.record(); a @ b; e.record(); e.synchronize(); ts.append(s.elapsed_time(e))\n"
        "ts.sort(); print(2 * n**3 / (ts[len(ts) // 2] * 1e-3) / 1e12)\n"
    )
    try:
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
        )
        return float(out.stdout.strip().splitlines()[-1])
    except Exception:
        return None


def bench_gemm(be, timer, peak_flops, bandwidth, l2_bytes, variants, rng):
    rows = []
    for label, ta, tb, m, n, k in GEMM_CASES:
        a_elems, b_elems, c_elems = m * k, k * n, m * n
        set_bytes = 4 * (a_elems + b_elems + c_elems)
        copies = copies_for(set_bytes, l2_bytes)
        a_host = rng.random(a_elems, dtype=np.float32) - 0.5
        b_host = rng.random(b_elems, dtype=np.float32) - 0.5
        sets = [
            (be.from_host(a_host), be.from_host(b_host), be.empty(c_elems)) for _ in range(copies)
        ]
        lda = m if ta else k
        ldb = k if tb else n

        def run(i):
            a, b, c = sets[i % copies]
            be.gemm(ta, tb, m, n, k, 1.0, a, lda, b, ldb, 0.0, c, n)

        flops = 2.0 * m * n * k
        nbytes = 4.0 * (a_elems + b_elems + c_elems)  # beta = 0: C written once, not read
        plan = be.gemm_plan(m, n, k)
        ms, _ = timer.median_ms(run)
        row = dict(
            op="gemm",
            label=label,
            shape=f"{m}x{n}x{k} {'nt'[ta]}{'nt'[tb]}",
            plan=f"{plan[0]}/{plan[1]}",
            ms=ms,
            gflops=flops / (ms * 1e-3) / 1e9,
            flop_floor_ms=flops / peak_flops * 1e3,
            byte_floor_ms=nbytes / bandwidth * 1e3,
        )
        if variants:
            row["variants"] = {}
            for v in GEMM_VARIANTS:
                be.gemm_override = v
                vms, _ = timer.median_ms(run)
                row["variants"][f"{v[0]}/{v[1]}"] = vms
            be.gemm_override = None
        rows.append(row)
        sets = None  # free this case's buffers before the next
    return rows


def bench_im2col(be, timer, bandwidth, l2_bytes, rng):
    rows = []
    for label, c, h, w, ks, s, p, d in IM2COL_CASES:
        out_h, out_w = conv_out_size(h, w, ks, s, p, d)
        im_elems, col_elems = c * h * w, c * ks * ks * out_h * out_w
        copies = copies_for(4 * (im_elems + col_elems), l2_bytes)
        im_host = rng.random(im_elems, dtype=np.float32)
        sets = [(be.from_host(im_host), be.empty(col_elems)) for _ in range(copies)]
        for op in ("im2col", "col2im"):
            if op == "im2col":

                def run(i):
                    im, col = sets[i % copies]
                    be.im2col(im, c, h, w, ks, s, p, d, col)

                nbytes = 4.0 * (im_elems + col_elems)  # read image once, write col once
            else:
                for im, col in sets:
                    be.im2col(im, c, h, w, ks, s, p, d, col)  # col: real data

                def run(i):
                    im, col = sets[i % copies]
                    be.col2im(col, c, h, w, ks, s, p, d, im)

                nbytes = 4.0 * (col_elems + 2 * im_elems)  # read col, read + write image
            ms, _ = timer.median_ms(run)
            rows.append(
                dict(
                    op=op,
                    label=label,
                    shape=f"c{c} {h}x{w} k{ks} s{s}",
                    ms=ms,
                    gbps=nbytes / (ms * 1e-3) / 1e9,
                    byte_floor_ms=nbytes / bandwidth * 1e3,
                )
            )
        sets = None  # free this case's buffers before the next
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=25)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--variants", action="store_true", help="time every gemm kernel variant too")
    ap.add_argument("--no-library", action="store_true", help="skip the cuBLAS reference")
    ap.add_argument("--out", default=None, help="write all numbers as JSON here")
    args = ap.parse_args()

    import pycuda.driver as drv

    from darknet_py.backends import get_backend

    be = get_backend("cuda:0")
    dev = drv.Context.get_device()  # the backend's context is the current one
    clock_hz = dev.get_attribute(drv.device_attribute.CLOCK_RATE) * 1e3
    l2_bytes = dev.get_attribute(drv.device_attribute.L2_CACHE_SIZE)
    peak_flops = be.sm_count * 128 * 2 * clock_hz
    timer = Timer(be, args.warmup, args.reps)
    rng = np.random.default_rng(0)

    bandwidth = measure_copy_bandwidth(be, timer)
    lib = None if args.no_library else library_sgemm_tflops()
    gemm_rows = bench_gemm(be, timer, peak_flops, bandwidth, l2_bytes, args.variants, rng)
    im2col_rows = bench_im2col(be, timer, bandwidth, l2_bytes, rng)

    print(
        f"\n{be.device_name}: {be.sm_count} SMs, max SM clock {clock_hz / 1e9:.2f} GHz, "
        f"L2 {l2_bytes >> 20} MiB"
    )
    print(
        f"ceilings: FP32 FFMA peak {peak_flops / 1e12:.1f} TFLOP/s "
        f"(datasheet-style: SMs x 128 x 2 x clock); "
        f"device copy {bandwidth / 1e9:.0f} GB/s (read + write, measured)"
        + (f"; cuBLAS SGEMM 2048^3 (TF32 off) {lib:.1f} TFLOP/s" if lib else "")
    )
    print(f"medians of {args.reps} after {args.warmup} warm-up runs, CUDA events\n")
    print(
        f"{'gemm':30s} {'M x N x K op':22s} {'plan':13s} {'ms':>8s} {'GFLOP/s':>8s} {'%peak':>6s} "
        f"{'floor ms':>9s}"
    )
    for r in gemm_rows:
        floor = max(r["flop_floor_ms"], r["byte_floor_ms"])
        print(
            f"{r['label']:30s} {r['shape']:22s} {r['plan']:13s} {r['ms']:8.3f} {r['gflops']:8.0f} "
            f"{100 * r['gflops'] * 1e9 / peak_flops:5.1f}% {floor:9.3f}"
        )
        if "variants" in r:
            print("    " + "  ".join(f"{k} {v:.3f}" for k, v in r["variants"].items()))
    print(
        f"\n{'im2col / col2im':30s} {'shape':22s} {'ms':>8s} {'GB/s':>8s} {'%copy':>6s} "
        f"{'floor ms':>9s}"
    )
    for r in im2col_rows:
        print(
            f"{r['op'] + ' ' + r['label']:30s} {r['shape']:22s} {r['ms']:8.3f} {r['gbps']:8.0f} "
            f"{100 * r['gbps'] * 1e9 / bandwidth:5.1f}% {r['byte_floor_ms']:9.3f}"
        )

    if args.out:
        with open(args.out, "w") as f:
            json.dump(
                dict(
                    device=be.device_name,
                    sms=be.sm_count,
                    clock_hz=clock_hz,
                    l2_bytes=l2_bytes,
                    peak_flops=peak_flops,
                    copy_bandwidth=bandwidth,
                    cublas_sgemm_tflops=lib,
                    gemm=gemm_rows,
                    im2col=im2col_rows,
                ),
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
