"""Build variants of the Hopper GEMM (kernels/gemm_wgmma.cu) are checked and timed in one
device call: each variant's cubin (compiled beforehand with -D WGMMA_STAGES / WGMMA_GROUP_M,
on this machine or the device) multiplies the same 4096^3 half operands; its output is
compared with the shipped kernel's (same order of sums: identical) and with NumPy on 64
random rows; its time is the median of 20 runs after 5 warm-ups (CUDA events).

    python3 bench/wgmma_probe.py [--variants DIR] [--n 4096] [--json OUT]

DIR holds NAME.cubin files named sS_gG (S stages, G group rows), e.g. s4g8.cubin.
"""
import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from darknet_py.bench import median_seconds  # noqa: E402
from darknet_py.precision import round_to  # noqa: E402
from gemm_bench import half_bits  # noqa: E402


def shared_bytes(stages):
    from darknet_py.backends import cuda_wgmma as w
    return stages * (w.TILE_M + w.TILE_N) * w.TILE_K * 2 + 2 * stages * 8 + 1024


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", default=None)
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    from darknet_py.backends import cuda_wgmma as w
    from darknet_py.backends import get_backend
    be = get_backend("cuda:0")
    n = args.n
    flop = 2.0 * n ** 3
    rng = np.random.default_rng(1)
    rows = np.sort(rng.choice(n, 64, replace=False))
    report = {"device": be.device_name, "variants": {}}
    c = be.empty(n * n)
    for p in ("fp16", "bf16"):
        a_host = rng.uniform(-1, 1, n * n).astype(np.float32)
        b_host = rng.uniform(-1, 1, n * n).astype(np.float32)
        a, b = be._new(n * n, np.float16), be._new(n * n, np.float16)
        be.write(a, half_bits(a_host, p))
        be.write(b, half_bits(b_host, p))
        want = (round_to(a_host, p).astype(np.float64).reshape(n, n)[rows]
                @ round_to(b_host, p).astype(np.float64).reshape(n, n).T)
        be.fill(c, np.nan)
        w.gemm_half(be, p, n, n, n, 1.0, a, n, b, n, 0.0, c, n)
        shipped = be.to_host(c).reshape(n, n)
        err = float(np.max(np.abs(shipped[rows] - want)) / np.max(np.abs(want)))
        ms = 1e3 * median_seconds(be, lambda: w.gemm_half(be, p, n, n, n, 1.0, a, n, b, n, 0.0, c, n), 5, 20)
        report["variants"][f"shipped {p}"] = {"ms": ms, "tflops": flop / ms / 1e9, "err": err,
                                              "nan": int(np.isnan(shipped).sum())}
        print(f"shipped {p}: {ms:.3f} ms {flop / ms / 1e9:.1f} TFLOP/s err {err:.2e}", flush=True)
        if not args.variants:
            continue
        for path in sorted(Path(args.variants).glob("*.cubin")):
            stages = int(re.match(r"s(\d+)", path.stem).group(1))
            kern = w._Kernels(path.read_bytes(), shared_bytes(stages))

            def run():
                w._multiply(be, kern, p, n, n, n, 1.0, a.ptr, n, b.ptr, n, 0.0, c.ptr, n)
            be.fill(c, np.nan)
            run()
            got = be.to_host(c).reshape(n, n)
            same = bool(np.array_equal(got, shipped))
            ms = 1e3 * median_seconds(be, run, 5, 20)
            report["variants"][f"{path.stem} {p}"] = {"ms": ms, "tflops": flop / ms / 1e9,
                                                      "same_as_shipped": same}
            print(f"{path.stem} {p}: {ms:.3f} ms {flop / ms / 1e9:.1f} TFLOP/s same {same}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
