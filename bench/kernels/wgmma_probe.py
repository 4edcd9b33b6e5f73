"""Build variants of the Hopper GEMM (ops/convolution/gemm_wgmma.cu) are checked and timed in one
device call: each variant's cubin (compiled beforehand with -D WGMMA_STAGES / WGMMA_GROUP_M,
on this machine or the device) multiplies the same 4096^3 half operands; its output is
compared with the shipped kernel's (same order of sums: identical) and with NumPy on 64
random rows; its time is the median of 20 runs of 10 products queued back to back (so the
host's launch work overlaps the GPU's), after 5 warm-ups (CUDA events). A torch.matmul row
is timed the same way in the same call.

    python3 bench/kernels/wgmma_probe.py [--variants DIR] [--n 4096] [--shapes] [--json OUT]

DIR holds NAME.cubin files named cCsSgG (cluster of C blocks, S stages, G group rows), e.g.
c2s4g8.cubin.
--shapes: gemm_lowp (fp32 operands, fp16) on the data-gradient products of yolov3-tiny's
3x3 convolutions at batch 64 (tn: M = 9 C, N = 64 H W, K = filters), wgmma against mma.sync
(forced by tc_override), for handles()'s K threshold. The shipped kernel's 4096^3 rows
beside cuBLAS are bench/kernels/gemm.py's.
"""

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.kernels.gemm import half_bits, torch_rows  # noqa: E402
from darknet_py.bench import median_seconds  # noqa: E402
from darknet_py.precision import round_to  # noqa: E402


def per_product(be, fn, batch=10):
    """Median seconds of one call of fn, timed over `batch` calls queued back to back."""
    return median_seconds(be, lambda: [fn() for _ in range(batch)], 5, 20) / batch


# (M, N, K) = (9 C, 64 H W, filters) of yolov3-tiny's 3x3 convolutions, and a square one
DGRAD_SHAPES = [
    (144, 64 * 208 * 208, 32),
    (288, 64 * 104 * 104, 64),
    (576, 64 * 52 * 52, 128),
    (1152, 64 * 26 * 26, 256),
    (2304, 64 * 13 * 13, 512),
    (4608, 64 * 13 * 13, 1024),
]


def shape_rows(be, report):
    from darknet_py.ops.convolution import wgmma as w

    rng = np.random.default_rng(2)
    for m, n, k in DGRAD_SHAPES:
        a = be.from_host(rng.uniform(-1, 1, k * m).astype(np.float32))
        b = be.from_host(rng.uniform(-1, 1, k * n).astype(np.float32))
        c = be.empty(m * n)

        def run(m=m, n=n, k=k, a=a, b=b, c=c):
            be.gemm_lowp("fp16", 1, 0, m, n, k, 1.0, a, m, b, n, 0.0, c, n)

        row = {"wgmma_by_default": w.handles(be, "fp16", m, n, k)}
        saved = w.MIN_K
        w.MIN_K = 1  # let wgmma take every shape here
        try:
            row["wgmma_ms"] = (
                1e3 * median_seconds(be, run, 3, 10) if w.handles(be, "fp16", m, n, k) else None
            )
        finally:
            w.MIN_K = saved
        be.tc_override = be.tc_plan(m, n, k)
        try:
            row["mma_sync_ms"] = 1e3 * median_seconds(be, run, 3, 10)
        finally:
            be.tc_override = None
        report["dgrad"][f"{m}x{n}x{k}"] = row
        print(
            f"dgrad {m}x{n}x{k}: wgmma {row['wgmma_ms']} ms, mma.sync {row['mma_sync_ms']:.3f} ms",
            flush=True,
        )
        del a, b, c


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", default=None)
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--json", default=None)
    ap.add_argument("--shapes", action="store_true")
    args = ap.parse_args()
    from darknet_py.backends import get_backend
    from darknet_py.ops.convolution import wgmma as w

    be = get_backend("cuda:0")
    n = args.n
    flop = 2.0 * n**3
    rng = np.random.default_rng(1)
    rows = np.sort(rng.choice(n, 64, replace=False))
    report = {"device": be.device_name, "variants": {}, "dgrad": {}}
    c = be.empty(n * n)
    for p in ("fp16", "bf16"):
        a_host = rng.uniform(-1, 1, n * n).astype(np.float32)
        b_host = rng.uniform(-1, 1, n * n).astype(np.float32)
        a, b = be.storage_zeros(n * n, "fp16"), be.storage_zeros(n * n, "fp16")
        be.write(a, half_bits(a_host, p))
        be.write(b, half_bits(b_host, p))
        want = (
            round_to(a_host, p).astype(np.float64).reshape(n, n)[rows]
            @ round_to(b_host, p).astype(np.float64).reshape(n, n).T
        )
        be.fill(c, np.nan)
        w.gemm_half(be, p, n, n, n, 1.0, a, n, b, n, 0.0, c, n)
        shipped = be.to_host(c).reshape(n, n)
        err = float(np.max(np.abs(shipped[rows] - want)) / np.max(np.abs(want)))
        ms = 1e3 * per_product(be, lambda: w.gemm_half(be, p, n, n, n, 1.0, a, n, b, n, 0.0, c, n))
        report["variants"][f"shipped {p}"] = {
            "ms": ms,
            "tflops": flop / ms / 1e9,
            "err": err,
            "nan": int(np.isnan(shipped).sum()),
        }
        print(f"shipped {p}: {ms:.3f} ms {flop / ms / 1e9:.1f} TFLOP/s err {err:.2e}", flush=True)
        w.TMA_STORE = False  # the epilogue from the registers, for comparison
        try:
            be.fill(c, np.nan)
            w.gemm_half(be, p, n, n, n, 1.0, a, n, b, n, 0.0, c, n)
            same = bool(np.array_equal(be.to_host(c).reshape(n, n), shipped))
            ms = 1e3 * per_product(
                be, lambda: w.gemm_half(be, p, n, n, n, 1.0, a, n, b, n, 0.0, c, n)
            )
        finally:
            w.TMA_STORE = True
        report["variants"][f"register stores {p}"] = {
            "ms": ms,
            "tflops": flop / ms / 1e9,
            "same": same,
        }
        print(
            f"register stores {p}: {ms:.3f} ms {flop / ms / 1e9:.1f} TFLOP/s same {same}",
            flush=True,
        )
        if not args.variants:
            continue
        for path in sorted(Path(args.variants).glob("*.cubin")):
            cluster, stages = (int(v) for v in re.match(r"c(\d+)s(\d+)", path.stem).groups())
            kern = w.variant_kernels(path.read_bytes(), stages, cluster)

            def run(kern=kern, p=p, a=a, b=b):
                w.gemm_half_on(be, kern, p, n, n, n, 1.0, a, n, b, n, 0.0, c, n)

            be.fill(c, np.nan)
            run()
            got = be.to_host(c).reshape(n, n)
            same = bool(np.array_equal(got, shipped))
            ms = 1e3 * per_product(be, run)
            report["variants"][f"{path.stem} {p}"] = {
                "ms": ms,
                "tflops": flop / ms / 1e9,
                "same_as_shipped": same,
            }
            print(
                f"{path.stem} {p}: {ms:.3f} ms {flop / ms / 1e9:.1f} TFLOP/s same {same} "
                f"({kern.max_clusters} clusters fit)",
                flush=True,
            )
    for key, tflops in torch_rows(n, precisions=("fp16", "bf16")).items():
        report["variants"][key] = {"tflops": tflops}
        print(f"{key}: {tflops:.1f} TFLOP/s", flush=True)
    if args.shapes:
        del a, b, c
        shape_rows(be, report)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
