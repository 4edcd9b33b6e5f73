"""Training beside PyTorch on one GPU: darknet-py and PyTorch (cuDNN; AMP = autocast +
channels_last) measured in the same run, each figure also in bench/results.json, against
the goals of the project's performance issue (26).

    python3 bench/training/vs_pytorch.py [--results bench/RESULTS.md] [--json FILE]
                                         [--skip-iteration] [--only KEY_PREFIX ...]

Rows (keys of results.json; ms, s or GB; each darknet-py key has its torch_ twin where
PyTorch has the work):
  yolov4_b32_pass_ms_{fp16,bf16,fp32}   the fork's yolov4.cfg, 3 classes, 416x416, one
                                        forward+backward of 32 images (darknet-py: a
                                        training step, `bench --train`)
  yolov4_b32_peak_gb_{fp16,fp32}        peak device memory of that pass's process
  yolov4_iteration_s_{fp16,fp32}        `darknet-py train` of 30 iterations of 64 images
                                        (batch=64 subdivisions=2) on a synthetic 416 set,
                                        whole process / 30 (loader, start-up included)
  yolov3tiny_b64_step_ms_{fp16,fp32}    yolov3-tiny 416 b64 training step (torch: with an
                                        SGD step)
The table also shows rows other scripts measure and write into the same JSON:
  yolov3tiny_b64_forward_layers_ms_fp16 bench/networks/forward.py (the layers, and PyTorch's)
  yolov3tiny_b64_forward_whole_ms_fp16  bench/networks/forward.py (uint8 photos in)
  gemm4096_fp16_tflops                  bench/kernels/gemm.py (half operands, as cuBLAS)
Each darknet-py and PyTorch measurement runs in a process of its own, so peak memory is
that process's alone; medians of CUDA-event-timed runs after warm-up.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    RESULTS_JSON,
    SHARED,
    append_section,
    gpu_name,
    merge_json,
    three_class_cfg,
    utc_now,
)

GOALS = {  # issue 26's goals; "<=" unless the key says tflops
    "yolov4_b32_pass_ms_fp16": 45,
    "yolov4_b32_pass_ms_bf16": 45,
    "yolov4_b32_pass_ms_fp32": 200,
    "yolov4_b32_peak_gb_fp16": 11,
    "yolov4_b32_peak_gb_fp32": 25,
    "yolov4_iteration_s_fp16": 0.12,
    "yolov4_iteration_s_fp32": 0.38,
    "yolov3tiny_b64_step_ms_fp16": 15,
    "yolov3tiny_b64_step_ms_fp32": 55,
    "yolov3tiny_b64_forward_layers_ms_fp16": 4,
    "yolov3tiny_b64_forward_whole_ms_fp16": 8,
    "gemm4096_fp16_tflops": 600,
}


# ---- one measurement per process ---------------------------------------------------------
def ours(cfg, precision, batch):
    """darknet-py's training figures for one (cfg, precision, batch) as a dict."""
    from darknet_py.bench import run_bench
    from darknet_py.network import load_network

    net = load_network(cfg, batch=batch, device="cuda:0", precision=precision)
    r = run_bench(net, train=True, warmup=3, repeats=10)
    # A training row's peak is the training's (as PyTorch's, reset before its step), not
    # that of the inference timed before it in the same process.
    peak = r.get("train_peak_device_memory_bytes") or r["peak_device_memory_bytes"] or 0
    return {"step_ms": r.get("train_step_ms"), "peak_gb": peak / 1e9}


def theirs(cfg, precision, batch):
    """PyTorch's figures for the same work."""
    import torch

    from bench.torch_port import DarknetPort, head_loss

    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda:0")
    model = DarknetPort(cfg).to(dev)
    amp = precision in ("fp16", "bf16")
    dtype = torch.float16 if precision == "fp16" else torch.bfloat16
    fmt = torch.channels_last if amp else torch.contiguous_format
    model = model.to(memory_format=fmt)
    x = torch.rand((batch,) + model.input_shape, device=dev).to(memory_format=fmt)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)
    scaler = torch.amp.GradScaler(enabled=precision == "fp16")

    def pass_(step=False):
        with torch.autocast("cuda", dtype=dtype, enabled=amp):
            loss = head_loss(model(x))
        scaler.scale(loss).backward()
        if step:
            scaler.step(opt)
            scaler.update()
        opt.zero_grad(set_to_none=True)

    torch.cuda.reset_peak_memory_stats()
    step = "yolov3" in str(cfg)
    ms = median_ms(torch, lambda: pass_(step))
    return {"step_ms": ms, "peak_gb": torch.cuda.max_memory_allocated() / 1e9}


def median_ms(torch, fn, warmup=5, repeats=20):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def measure(who, cfg, precision, batch):
    """Run one measurement in a fresh process: its dict, or {"error": text}."""
    out = subprocess.run(
        [sys.executable, __file__, "--one", who, str(cfg), precision, str(batch)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode or not lines:
        tail = (out.stderr.strip().splitlines() or ["?"])[-1]
        return {"error": f"exit {out.returncode}: {tail}"}
    return json.loads(lines[-1])


# ---- whole-process iterations ------------------------------------------------------------
def iteration_seconds(tmp, precision, iterations=30):
    """`darknet-py train` of `iterations` iterations of 64 images, whole process / count."""
    from bench.training.end_to_end import detector_set

    root = Path(tmp) / "set416"
    data = next(root.glob("*.data"), None) if root.exists() else None
    if data is None:
        root.mkdir()
        data = detector_set(root, count=512, size=416)
    cfg = three_class_cfg(
        "yolov4.cfg",
        tmp,
        path=Path(tmp) / "yolov4-iterations.cfg",
        batch=64,
        subdivisions=2,
        max_batches=iterations,
    )
    start = time.perf_counter()
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "darknet_py",
            "train",
            str(cfg),
            str(data),
            "--overwrite",
            "--quiet",
            "--device",
            "cuda:0",
            "--precision",
            precision,
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    seconds = time.perf_counter() - start
    if run.returncode:
        return {"error": (run.stderr.strip().splitlines() or ["?"])[-1]}
    return {"iteration_s": seconds / iterations}


# ---- the table -----------------------------------------------------------------------------
def collect(tmp, skip_iteration, only):
    yolov4 = three_class_cfg("yolov4.cfg", tmp)
    tiny = SHARED / "darknet-cfg" / "yolov3-tiny.cfg"
    plan = []  # (key, cfg, precision, batch)
    for p in ("fp16", "bf16", "fp32"):
        plan.append((f"yolov4_b32_pass_ms_{p}", yolov4, p, 32))
    for p in ("fp16", "fp32"):
        plan.append((f"yolov3tiny_b64_step_ms_{p}", tiny, p, 64))
    results, errors = {}, {}
    for key, cfg, p, batch in plan:
        if only and not any(key.startswith(o) for o in only):
            continue
        for who, prefix in (("ours", ""), ("theirs", "torch_")):
            r = measure(who, cfg, p, batch)
            if "error" in r:
                errors[prefix + key] = r["error"]
            else:
                results[prefix + key] = r["step_ms"]
                if key.startswith("yolov4_b32_pass") and p in ("fp16", "fp32"):
                    results[f"{prefix}yolov4_b32_peak_gb_{p}"] = r["peak_gb"]
            print(
                f"{prefix + key}: {results.get(prefix + key, errors.get(prefix + key))}", flush=True
            )
    if not skip_iteration and (
        not only
        or any("yolov4_iteration".startswith(o) or o.startswith("yolov4_iteration") for o in only)
    ):
        for p in ("fp16", "fp32"):
            r = iteration_seconds(tmp, p)
            key = f"yolov4_iteration_s_{p}"
            if "error" in r:
                errors[key] = r["error"]
            else:
                results[key] = r["iteration_s"]
            print(f"{key}: {results.get(key, errors.get(key))}", flush=True)
    return results, errors


def markdown(results, errors, gpu, date):
    def fmt(key):
        if key in results:
            v = results[key]
            return f"{v:.3f}" if v < 1 else f"{v:.1f}"
        return f"failed ({errors[key]})" if key in errors else "-"

    lines = [
        f"\n## {date}, issue 26's rows (bench/training/vs_pytorch.py), {gpu}",
        "",
        "| key | darknet-py | PyTorch (same run) | goal | |",
        "|---|---|---|---|---|",
    ]
    for key, goal in GOALS.items():
        ours_v, met = results.get(key), ""
        if ours_v is not None:
            met = (
                "met"
                if (ours_v >= goal if key.endswith("tflops") else ours_v <= goal)
                else "not met"
            )
        lines.append(
            f"| {key} | {fmt(key)} | {fmt('torch_' + key)} | "
            f"{'>=' if key.endswith('tflops') else '<='} {goal} | {met} |"
        )
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default=None, help="append a dated section to this file")
    ap.add_argument("--json", default=str(RESULTS_JSON))
    ap.add_argument("--skip-iteration", action="store_true")
    ap.add_argument("--only", nargs="*", default=[])
    ap.add_argument("--one", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        who, cfg, precision, batch = args.one
        fn = ours if who == "ours" else theirs
        print(json.dumps(fn(cfg, precision, int(batch))))
        return
    with tempfile.TemporaryDirectory() as tmp:
        results, errors = collect(tmp, args.skip_iteration, args.only)
    gpu = gpu_name()
    merged = merge_json(args.json, results, gpu)
    lines = markdown(
        {k: v for k, v in merged.items() if isinstance(v, (int, float))}, errors, gpu, utc_now()
    )
    print("\n".join(lines))
    if args.results:
        append_section(args.results, lines)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
