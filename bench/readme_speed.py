"""The README's speed table, written from bench/results.json: each row's figure beside the
reference measured in the same run (PyTorch, or one GPU against four), its goal, and the
card and date it was measured on. `make bench` runs this last; run it alone after any
script that merged figures.

    python3 bench/readme_speed.py [--json bench/results.json] [--readme README.md] [--check]

The table sits between README.md's `<!-- speed-table:start -->` and `<!-- speed-table:end -->`
lines; everything outside them is left as it is. --check exits 1 when the README's table is
not the one results.json gives (a test runs it).
"""

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
START, END = "<!-- speed-table:start -->", "<!-- speed-table:end -->"

# (work, darknet-py key, reference key or None, reference's name, goal text, unit)
ROWS = (
    (
        "yolov4 416 (3 classes), batch 32 training pass, fp16",
        "yolov4_b32_pass_ms_fp16",
        "torch_yolov4_b32_pass_ms_fp16",
        "PyTorch AMP",
        "<= 45",
        "ms",
    ),
    (
        "same, bf16",
        "yolov4_b32_pass_ms_bf16",
        "torch_yolov4_b32_pass_ms_bf16",
        "PyTorch AMP",
        "<= 45 and <= AMP",
        "ms",
    ),
    (
        "same, fp32",
        "yolov4_b32_pass_ms_fp32",
        "torch_yolov4_b32_pass_ms_fp32",
        "PyTorch",
        "<= 200",
        "ms",
    ),
    (
        "peak GPU memory of that pass, fp16",
        "yolov4_b32_peak_gb_fp16",
        "torch_yolov4_b32_peak_gb_fp16",
        "PyTorch AMP",
        "<= 9.5",
        "GB",
    ),
    (
        "yolov4 iteration of 64 images, fp16",
        "yolov4_iteration_s_fp16",
        None,
        "",
        "<= 0.12",
        "s",
    ),
    (
        "yolov3-tiny 416, batch 64 training step, fp16",
        "yolov3tiny_b64_step_ms_fp16",
        "torch_yolov3tiny_b64_step_ms_fp16",
        "PyTorch AMP",
        "<= 16",
        "ms",
    ),
    (
        "yolov3-tiny 416, batch 64 training step, fp32",
        "yolov3tiny_b64_step_ms_fp32",
        "torch_yolov3tiny_b64_step_ms_fp32",
        "PyTorch",
        "<= 55",
        "ms",
    ),
    (
        "yolov3-tiny 416, batch 64 forward, layers, fp16",
        "yolov3tiny_b64_forward_layers_ms_fp16",
        "torch_yolov3tiny_b64_forward_layers_ms_fp16",
        "PyTorch AMP graph",
        "<= 4.5",
        "ms",
    ),
    (
        "yolov3-tiny 416, batch 64 from photos to the output, fp16",
        "yolov3tiny_b64_forward_whole_ms_fp16",
        None,
        "",
        "",
        "ms",
    ),
    (
        "yolov3-tiny 416, batch 1, whole call (array in, output out), fp32",
        "yolov3tiny_b1_forward_whole_ms",
        "torch_yolov3tiny_b1_forward_whole_ms",
        "PyTorch TF32 graph",
        "<= 0.5",
        "ms",
    ),
    (
        "GEMM 4096^3, fp16",
        "gemm4096_fp16_tflops",
        "torch_gemm4096_fp16_tflops",
        "cuBLAS",
        ">= 600",
        "TFLOP/s",
    ),
    (
        "4 GPUs against 1, steady images/s, yolov4 fp16",
        "dp4_steady_speedup_fp16",
        None,
        "",
        ">= 3.9",
        "x",
    ),
    (
        "4 GPUs against 1, steady images/s, yolov4 fp32",
        "dp4_steady_speedup_fp32",
        None,
        "",
        ">= 3.9",
        "x",
    ),
    (
        "4 GPUs against 1, a whole run of 300 iterations, fp16",
        "dp4_whole_300_speedup_fp16",
        None,
        "",
        ">= 3.8",
        "x",
    ),
    (
        "time to the first iteration, 4 GPUs (1 GPU beside it)",
        "dp4_first_iteration_s",
        "dp1_first_iteration_s",
        "1 GPU",
        "<= 1.2x one GPU's",
        "s",
    ),
)


def _figure(value, unit):
    if value is None:
        return "not measured"
    digits = 3 if unit in ("s", "x") and value < 10 else (2 if value < 10 else 1)
    return f"{value:.{digits}f} {unit}"


def _where(data, key):
    """The card and date a figure was measured on: its own record, else the file's."""
    own = data.get("measured", {}).get(key)
    if own:
        return own["gpu"], own["date"]
    if key.startswith("dp") and "dp4_gpu" in data:
        return data["dp4_gpu"], data.get("dp4_date", "")
    return data.get("gpu", "unknown GPU"), data.get("date", "")


def table(data):
    """The Markdown lines of the speed table from results.json's data."""
    lines = [
        "| work | darknet-py | reference, same run | goal | card, date |",
        "|---|---|---|---|---|",
    ]
    for work, key, ref_key, ref_name, goal, unit in ROWS:
        value = data.get(key)
        ref = data.get(ref_key) if ref_key else None
        ref_text = f"{ref_name} {_figure(ref, unit)}" if ref is not None else ""
        gpu, date = _where(data, key) if value is not None else ("", "")
        card = f"{gpu}, {date[:10]}" if gpu else ""
        lines.append(f"| {work} | {_figure(value, unit)} | {ref_text} | {goal} | {card} |")
    return lines


def rewritten(readme_text, lines):
    """The README with the text between the markers replaced by `lines`."""
    head, start, rest = readme_text.partition(START)
    _, end, tail = rest.partition(END)
    if not start or not end:
        raise SystemExit(f"README.md has no {START} ... {END} lines to write the table between")
    return head + START + "\n" + "\n".join(lines) + "\n" + END + tail


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, default=ROOT / "bench" / "results.json")
    ap.add_argument("--readme", type=Path, default=ROOT / "README.md")
    ap.add_argument("--check", action="store_true", help="exit 1 if the README is out of date")
    args = ap.parse_args(argv)
    data = json.loads(args.json.read_text())
    text = args.readme.read_text()
    new = rewritten(text, table(data))
    if args.check:
        if new != text:
            print(f"{args.readme}: its speed table is not {args.json}'s; run {__file__}")
            return 1
        return 0
    if new != text:
        args.readme.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
