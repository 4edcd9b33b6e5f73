"""The 4096^3 half-precision GEMM rows of issue 26, ours beside cuBLAS (through PyTorch, in
the bench only) measured in the same run; merged into bench/results.json.

    python3 bench/gemm_bench.py [--n 4096] [--json bench/results.json]

Rows, TFLOP/s (2 n^3 / median time, CUDA events around BATCH products queued back to back,
so that host-side launch work overlaps the GPU's as in a network; 5 warm-ups, 20 runs,
random data; the same for torch):
  gemm4096_{fp16,bf16}_tflops: the Hopper GEMM (cuda_wgmma.gemm_half) on half-precision
      operands stored K-major, fp32 C: what cuBLAS is given below (its C is half, ours fp32);
  gemm4096_{fp16,bf16}_from_fp32_tflops: CudaBackend.gemm_lowp on fp32 operands as the
      layers call it (the rounding pass into the K-major layout included);
  torch_gemm4096_{fp16,bf16}_tflops: torch.matmul on half-precision tensors.
On a GPU without the sm_90a kernels, the gemm_lowp rows alone (mma.sync).
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from darknet_py.bench import median_seconds  # noqa: E402
from darknet_py.precision import round_to  # noqa: E402

HALF = ("fp16", "bf16")
BATCH = 10


def half_bits(x, precision):
    """float32 values rounded to `precision`, as the float16 array holding their bits."""
    r = round_to(x, precision)
    if precision == "fp16":
        return r.astype(np.float16)
    return (r.view(np.uint32) >> 16).astype(np.uint16).view(np.float16)


def ours(be, n=4096, warmup=5, repeats=20):
    """{key: TFLOP/s} of our n^3 products."""
    from darknet_py.backends import cuda_wgmma
    rng = np.random.default_rng(0)
    flop = 2.0 * n ** 3
    a32 = be.from_host(rng.uniform(-1, 1, n * n).astype(np.float32))
    b32 = be.from_host(rng.uniform(-1, 1, n * n).astype(np.float32))
    c = be.empty(n * n)
    out = {}
    hopper = cuda_wgmma.kernels(be) is not None

    def per_product(fn):
        return median_seconds(be, lambda: [fn() for _ in range(BATCH)], warmup, repeats) / BATCH
    for p in HALF:
        fn = lambda p=p: be.gemm_lowp(p, 0, 0, n, n, n, 1.0, a32, n, b32, n, 0.0, c, n)  # noqa: E731
        out[f"gemm{n}_{p}_from_fp32_tflops"] = flop / per_product(fn) / 1e12
        if not hopper:
            continue
        a = be._new(n * n, np.float16)
        b = be._new(n * n, np.float16)
        be.write(a, half_bits(rng.uniform(-1, 1, n * n).astype(np.float32), p))
        be.write(b, half_bits(rng.uniform(-1, 1, n * n).astype(np.float32), p))
        fn = lambda p=p, a=a, b=b: cuda_wgmma.gemm_half(be, p, n, n, n, 1.0, a, n, b, n, 0.0, c, n)  # noqa: E731
        out[f"gemm{n}_{p}_tflops"] = flop / per_product(fn) / 1e12
    return out


def torch_rows(n=4096, warmup=5, repeats=20):
    """{key: TFLOP/s} of torch.matmul on half tensors; {} without PyTorch."""
    try:
        import torch
    except ImportError:
        return {}
    out = {}
    flop = 2.0 * n ** 3
    for p, dtype in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
        a = torch.rand(n, n, device="cuda", dtype=dtype) - 0.5
        b = torch.rand(n, n, device="cuda", dtype=dtype) - 0.5
        for _ in range(warmup):
            a @ b
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(repeats):
            start.record()
            for _ in range(BATCH):
                a @ b
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop) / 1e3 / BATCH)
        out[f"torch_gemm{n}_{p}_tflops"] = flop / statistics.median(times) / 1e12
    return out


def merge_results(path, figures, gpu):
    """Add `figures` to the JSON object in `path` (made if absent), with `gpu` and `date`."""
    path = Path(path)
    data = json.loads(path.read_text()) if path.exists() else {}
    data.update({k: round(v, 1) for k, v in figures.items()})
    data["gpu"] = gpu
    data["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return data


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--json", default=str(ROOT / "bench" / "results.json"))
    args = ap.parse_args()
    from darknet_py.backends import get_backend
    be = get_backend("cuda:0")
    figures = ours(be, args.n)
    figures.update(torch_rows(args.n))
    for key, value in sorted(figures.items()):
        print(f"{key:40s} {value:8.1f} TFLOP/s")
    merge_results(args.json, figures, be.device_name)


if __name__ == "__main__":
    main()
