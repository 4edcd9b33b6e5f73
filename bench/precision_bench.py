"""Issue 17's figures per precision on the GPU: a 4096^3 GEMM beside cuBLAS (through
PyTorch, in this bench only), and yolov3-tiny 416 at batch 64 (forward, training step,
peak device memory, every convolution's forward TFLOP/s against the chip's peak).

    python3 bench/precision_bench.py [--cfg CFG] [--batch 64] [--json F] [--torch]

Prints a table per part; --json writes every figure.
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

from darknet_py import precision as precisions  # noqa: E402
from darknet_py.bench import median_seconds, run_bench  # noqa: E402
from darknet_py.network import load_network  # noqa: E402

PRECISIONS = precisions.PRECISIONS
# H100 SXM dense peaks, TFLOP/s (fp32 FFMA; tensor cores dense): the datasheet's figures
# (HOPPER.md says to treat them as leads; the cuBLAS row is the measured ceiling).
H100_PEAK = {"fp32": 67.0, "tf32": 495.0, "fp16": 990.0, "bf16": 990.0}


def median_ms(be, fn, warmup=3, repeats=10):
    return 1e3 * median_seconds(be, fn, warmup, repeats)


def gemm_rows(be, n=4096):
    rng = np.random.default_rng(0)
    a = be.from_host(rng.uniform(-1, 1, n * n).astype(np.float32))
    b = be.from_host(rng.uniform(-1, 1, n * n).astype(np.float32))
    c = be.empty(n * n)
    flop = 2.0 * n ** 3
    rows = []
    for p in PRECISIONS:
        if p == "fp32":
            fn = lambda: be.gemm(0, 0, n, n, n, 1.0, a, n, b, n, 0.0, c, n)  # noqa: E731
        else:
            fn = lambda p=p: be.gemm_lowp(p, 0, 0, n, n, n, 1.0, a, n, b, n, 0.0, c, n)  # noqa: E731
        ms = median_ms(be, fn)
        rows.append({"what": f"darknet-py gemm {p}", "precision": p, "ms": ms,
                     "tflops": flop / ms / 1e9})
    return rows


def torch_gemm_rows(n=4096):
    try:
        import torch
    except ImportError:
        return []
    rows = []
    flop = 2.0 * n ** 3
    for p, dtype in (("fp32", torch.float32), ("tf32", torch.float32), ("fp16", torch.float16),
                     ("bf16", torch.bfloat16)):
        torch.backends.cuda.matmul.allow_tf32 = p == "tf32"
        a = torch.rand(n, n, device="cuda", dtype=dtype) - 0.5
        b = torch.rand(n, n, device="cuda", dtype=dtype) - 0.5
        for _ in range(3):
            a @ b
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(10):
            start.record()
            a @ b
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop))
        ms = statistics.median(times)
        rows.append({"what": f"cuBLAS (torch) {p}", "precision": p, "ms": ms,
                     "tflops": flop / ms / 1e9})
    torch.backends.cuda.matmul.allow_tf32 = False
    return rows


def network_rows(cfg, batch, train=True):
    rows = []
    for p in PRECISIONS:
        t0 = time.time()
        try:
            net = load_network(cfg, None, batch=batch, device="cuda", precision=p)
            # per-layer forward figures from inference (folded batch norm, fused epilogue);
            # the step and the backward figures from training
            r = run_bench(net, train=False, layers=True, warmup=3, repeats=10)
            if train:
                t = run_bench(net, train=True, layers=True, warmup=3, repeats=10)
                r["train_step_ms"] = t["train_step_ms"]
                r["peak_device_memory_bytes"] = t["peak_device_memory_bytes"]
                for row, trow in zip(r["layers"], t["layers"]):
                    row["backward_ms"] = trow["backward_ms"]
        except Exception as e:   # one precision's failure must not hide the others' figures
            print(f"{p}: {type(e).__name__}: {e}", flush=True)
            continue
        convs = [row for row in r["layers"] if row["type"] == "convolutional"]
        conv_ms = sum(row["forward_ms"] for row in convs)
        conv_bwd_ms = sum(row.get("backward_ms") or 0 for row in convs)
        rows.append({"precision": p, "forward_ms": r["forward_ms"],
                     "train_step_ms": r.get("train_step_ms"),
                     "conv_forward_ms": conv_ms, "conv_backward_ms": conv_bwd_ms,
                     "peak_mib": (r["peak_device_memory_bytes"] or 0) / 2 ** 20,
                     "layers": [{"index": row["index"], "ms": row["forward_ms"],
                                 "backward_ms": row.get("backward_ms"),
                                 "tflops": row["forward_tflops"],
                                 "peak_share": row["forward_tflops"] / H100_PEAK[p]}
                                for row in convs],
                     "seconds": time.time() - t0})
        print(f"{p}: forward {r['forward_ms']:.2f} ms, step {r.get('train_step_ms', 0):.2f} ms, "
              f"conv layers {conv_ms:.2f} ms", flush=True)
        del net
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cfg", default=str(ROOT / ".." / "shared" / "darknet-cfg" / "yolov3-tiny.cfg"))
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--json", default=None)
    ap.add_argument("--torch", action="store_true", help="cuBLAS rows through PyTorch")
    ap.add_argument("--no-train", action="store_true")
    ap.add_argument("--results", default=None, help="append a dated section to this markdown file")
    args = ap.parse_args()
    from darknet_py.backends import get_backend
    be = get_backend("cuda:0")
    out = {"device": be.device_name, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    out["gemm"] = gemm_rows(be) + (torch_gemm_rows() if args.torch else [])
    print("\nGEMM 4096^3                      ms   TFLOP/s")
    for row in out["gemm"]:
        print(f"{row['what']:<28s} {row['ms']:8.3f} {row['tflops']:8.1f}")
    out["network"] = network_rows(args.cfg, args.batch, train=not args.no_train)
    print(f"\n{Path(args.cfg).name} batch {args.batch}: precision, forward ms, training step ms, "
          f"conv forward ms, conv backward ms, peak MiB")
    for row in out["network"]:
        print(f"{row['precision']:5s} {row['forward_ms']:9.2f} {row['train_step_ms'] or 0:9.2f} "
              f"{row['conv_forward_ms']:9.2f} {row['conv_backward_ms']:9.2f} {row['peak_mib']:9.1f}")
    print("\nconv layer forward TFLOP/s (share of the H100 peak):")
    layers = {row["precision"]: row["layers"] for row in out["network"]}
    if layers:
        first = next(iter(layers.values()))
        print("layer " + " ".join(f"{p:>16s}" for p in layers) + "   backward ms per precision")
        for i, base in enumerate(first):
            cells = [f"{layers[p][i]['tflops']:7.1f} ({100 * layers[p][i]['peak_share']:4.1f}%)"
                     for p in layers]
            bwd = " ".join(f"{layers[p][i]['backward_ms'] or 0:6.2f}" for p in layers)
            print(f"{base['index']:5d} " + " ".join(f"{c:>16s}" for c in cells) + "   " + bwd)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    if args.results:
        with open(args.results, "a") as f:
            f.write("\n".join(markdown(out, Path(args.cfg).name, args.batch)) + "\n")


def markdown(out, cfg_name, batch):
    """A dated RESULTS.md section of the figures in `out`."""
    lines = [f"\n## Precision bench ({out['date']}, {out['device']}; bench/precision_bench.py)", "",
             "| GEMM 4096^3 | ms | TFLOP/s |", "|---|---|---|"]
    lines += [f"| {r['what']} | {r['ms']:.3f} | {r['tflops']:.1f} |" for r in out["gemm"]]
    lines += ["", f"| {cfg_name} batch {batch} | forward ms | training step ms | conv forward ms | "
              f"conv backward ms | peak MiB |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['precision']} | {r['forward_ms']:.2f} | {r['train_step_ms'] or 0:.2f} | "
              f"{r['conv_forward_ms']:.2f} | {r['conv_backward_ms']:.2f} | {r['peak_mib']:.0f} |"
              for r in out["network"]]
    return lines


if __name__ == "__main__":
    main()
