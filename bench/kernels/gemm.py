"""The 4096^3 GEMM in every precision, ours beside cuBLAS (through PyTorch, in the bench
only) measured in the same run; merged into bench/results.json.

    python3 bench/kernels/gemm.py [--n 4096] [--no-torch] [--json bench/results.json]
                                  [--results bench/RESULTS.md]

Rows, TFLOP/s (2 n^3 / median time, CUDA events around BATCH products queued back to back,
so that host-side launch work overlaps the GPU's as in a network; 5 warm-ups, 20 runs,
random data; the same for torch):
  gemm4096_fp32_tflops, gemm4096_{tf32,fp16,bf16}_from_fp32_tflops: CudaBackend.gemm and
      gemm_lowp on fp32 operands as the layers call them (the rounding pass included);
  gemm4096_{fp16,bf16}_tflops: the Hopper GEMM (cuda_wgmma.gemm_half) on half-precision
      operands stored K-major, fp32 C: what cuBLAS is given below (its C is half, ours fp32);
  torch_gemm4096_{fp32,tf32,fp16,bf16}_tflops: torch.matmul on tensors of that type.
On a GPU without the sm_90a kernels, the fp32-operand rows alone. results.json takes the
fp16/bf16 rows (its keys); --results appends every row to RESULTS.md.
"""

import argparse
import re
import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.common import RESULTS_JSON, append_section, merge_json, utc_now  # noqa: E402
from darknet_py.bench import median_seconds  # noqa: E402
from darknet_py.precision import round_to  # noqa: E402

PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
HALF = ("fp16", "bf16")
BATCH = 10


def half_bits(x, precision):
    """float32 values rounded to `precision`, as the float16 array holding their bits."""
    r = round_to(x, precision)
    if precision == "fp16":
        return r.astype(np.float16)
    return (r.view(np.uint32) >> 16).astype(np.uint16).view(np.float16)


def half_operand(be, host, precision):
    """A device float16 array holding `host` rounded to `precision` (gemm_half's operand)."""
    arr = be.storage_zeros(host.size, "fp16")
    be.write(arr, half_bits(host, precision))
    return arr


def per_product(be, fn, warmup=5, repeats=20):
    """Median seconds of one call of fn, timed over BATCH calls queued back to back."""
    return median_seconds(be, lambda: [fn() for _ in range(BATCH)], warmup, repeats) / BATCH


def ours(be, n=4096):
    """{key: TFLOP/s} of our n^3 products."""
    from darknet_py.ops.convolution import wgmma as cuda_wgmma

    rng = np.random.default_rng(0)
    flop = 2.0 * n**3
    a32 = be.from_host(rng.uniform(-1, 1, n * n).astype(np.float32))
    b32 = be.from_host(rng.uniform(-1, 1, n * n).astype(np.float32))
    c = be.empty(n * n)
    out = {}
    hopper = cuda_wgmma.kernels(be) is not None
    for p in PRECISIONS:
        if p == "fp32":

            def fn():
                be.gemm(0, 0, n, n, n, 1.0, a32, n, b32, n, 0.0, c, n)

            key = f"gemm{n}_fp32_tflops"
        else:

            def fn(p=p):
                be.gemm_lowp(p, 0, 0, n, n, n, 1.0, a32, n, b32, n, 0.0, c, n)

            key = f"gemm{n}_{p}_from_fp32_tflops"
        out[key] = flop / per_product(be, fn) / 1e12
        if p not in HALF or not hopper:
            continue
        a = half_operand(be, rng.uniform(-1, 1, n * n).astype(np.float32), p)
        b = half_operand(be, rng.uniform(-1, 1, n * n).astype(np.float32), p)

        def half(p=p, a=a, b=b):
            cuda_wgmma.gemm_half(be, p, n, n, n, 1.0, a, n, b, n, 0.0, c, n)

        out[f"gemm{n}_{p}_tflops"] = flop / per_product(be, half) / 1e12
    return out


def torch_rows(n=4096, warmup=5, repeats=20, precisions=PRECISIONS):
    """{key: TFLOP/s} of torch.matmul in each precision; {} without PyTorch."""
    try:
        import torch
    except ImportError:
        return {}
    out = {}
    flop = 2.0 * n**3
    types = {
        "fp32": torch.float32,
        "tf32": torch.float32,
        "fp16": torch.float16,
        "bf16": torch.bfloat16,
    }
    for p in precisions:
        torch.backends.cuda.matmul.allow_tf32 = p == "tf32"
        a = torch.rand(n, n, device="cuda", dtype=types[p]) - 0.5
        b = torch.rand(n, n, device="cuda", dtype=types[p]) - 0.5
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
    torch.backends.cuda.matmul.allow_tf32 = False
    return out


def json_keys(figures):
    """The rows results.json keeps: the 16-bit ones (fp32 and tf32 go to RESULTS.md)."""
    return {k: v for k, v in figures.items() if re.search(r"_(fp16|bf16)_", k)}


def markdown(figures, n, gpu):
    lines = [
        f"\n## {utc_now()}, the {n}^3 GEMM (bench/kernels/gemm.py), {gpu}",
        "",
        "| precision | ours, fp32 operands | ours, half operands | cuBLAS (torch) |",
        "|---|---|---|---|",
    ]

    def cell(key):
        return f"{figures[key]:.1f}" if key in figures else "-"

    for p in PRECISIONS:
        from_fp32 = f"gemm{n}_fp32_tflops" if p == "fp32" else f"gemm{n}_{p}_from_fp32_tflops"
        lines.append(
            f"| {p} | {cell(from_fp32)} | {cell(f'gemm{n}_{p}_tflops')} | "
            f"{cell(f'torch_gemm{n}_{p}_tflops')} |"
        )
    return lines + ["", "TFLOP/s, medians of 20 runs of 10 products queued back to back."]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--no-torch", action="store_true", help="leave out cuBLAS's rows")
    ap.add_argument("--json", default=str(RESULTS_JSON), help="merge the rows into this file")
    ap.add_argument("--results", help="append a dated section to this Markdown file")
    args = ap.parse_args()
    from darknet_py.backends import get_backend

    be = get_backend("cuda:0")
    figures = ours(be, args.n)
    if not args.no_torch:
        figures.update(torch_rows(args.n))
    for key, value in sorted(figures.items()):
        print(f"{key:40s} {value:8.1f} TFLOP/s")
    if args.json:
        merge_json(args.json, json_keys(figures), be.device_name, digits=1)
    if args.results:
        append_section(args.results, markdown(figures, args.n, be.device_name))


if __name__ == "__main__":
    main()
