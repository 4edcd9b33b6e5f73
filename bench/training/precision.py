"""Each precision (fp32, tf32, fp16, bf16) on the GPU: training steps, the detections of real
weights, and the fork's yolov4 / yolov4-tiny passes; a dated section for RESULTS.md.

    python3 bench/training/precision.py [--parts step detections fork] [--cfg CFG]
                                        [--batch 64] [--thresh 0.25] [--json FILE]
                                        [--results bench/RESULTS.md]

Parts (all by default):
  step        yolov3-tiny 416 (--cfg) at batch 64, random weights and truth
              (darknet_py.bench.run_bench): the training step, its convolutions' backward
              (each layer timed on its own) and peak device memory;
  detections  the real COCO yolov3-tiny weights on the photos of ../shared/images: whether
              each precision finds fp32's classes above --thresh, and the largest change
              of a probability;
  fork        the fork's yolov4-tiny (64 images a pass) and yolov4 (32) from
              ../shared/darknet-cfg-ab with classes=3 at 416x416, random weights and
              synthetic truth: a pass, an iteration of 64 images, the forward and the peak
              memory, each row in a process of its own.
The forward in each precision, layer by layer: bench/networks/forward.py --precisions.
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.common import SHARED, append_section, three_class_cfg, utc_now  # noqa: E402
from darknet_py.bench import run_bench  # noqa: E402
from darknet_py.network import load_network  # noqa: E402

PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
PARTS = ("step", "detections", "fork")


def step_rows(cfg, batch):
    """[{precision, train_step_ms, conv_backward_ms, peak_mib}] of a training step each."""
    rows = []
    for p in PRECISIONS:
        try:
            net = load_network(cfg, None, batch=batch, device="cuda", precision=p)
            r = run_bench(net, train=True, layers=True, warmup=3, repeats=10)
        except Exception as e:  # one precision's failure must not hide the others' figures
            print(f"{p}: {type(e).__name__}: {e}", flush=True)
            continue
        convs = [row for row in r["layers"] if row["type"] == "convolutional"]
        peak = r.get("train_peak_device_memory_bytes") or r["peak_device_memory_bytes"] or 0
        rows.append(
            {
                "precision": p,
                "train_step_ms": r["train_step_ms"],
                "conv_backward_ms": sum(row["backward_ms"] for row in convs),
                "peak_mib": peak / 2**20,
            }
        )
        print(
            f"{p}: step {r['train_step_ms']:.2f} ms, conv backward "
            f"{rows[-1]['conv_backward_ms']:.2f} ms",
            flush=True,
        )
        del net
    return rows


def detections_per_precision(thresh):
    """{precision: {image: [(class, prob)]}} of yolov3-tiny with the COCO weights."""
    cfg = SHARED / "darknet-cfg" / "yolov3-tiny.cfg"
    weights = SHARED / "weights" / "yolov3-tiny.weights"
    images = sorted(p for p in (SHARED / "images").iterdir() if p.suffix == ".jpg")
    found = {}
    for precision in PRECISIONS:
        net = load_network(cfg, weights, batch=1, device="cuda:0", precision=precision)
        found[precision] = {
            p.name: sorted((d.class_id, d.prob) for d in net.detect(str(p), thresh=thresh))
            for p in images
        }
    return found


def compare(found):
    """Lines: per precision, whether the classes equal fp32's and the largest change."""
    lines = []
    for precision in PRECISIONS[1:]:
        same, worst = True, 0.0
        for image, dets in found[precision].items():
            ref = found["fp32"][image]
            if [c for c, _ in dets] != [c for c, _ in ref]:
                same = False
                continue
            worst = max([worst] + [abs(p - q) for (_, p), (_, q) in zip(dets, ref)])
        lines.append(f"| {precision} | {'yes' if same else 'no'} | {100 * worst:.2f} |")
    return lines


def fork_row(cfg, precision, per_pass):
    """One table row; run in a process of its own, so each network's GPU memory is gone
    before the next (and peak memory is this one's)."""
    net = load_network(
        cfg, batch=per_pass, device="cuda:0", darknet="alexeyab", precision=precision
    )
    r = run_bench(net, train=True, warmup=2, repeats=5)
    passes = 64 // per_pass
    peak = r.get("train_peak_device_memory_bytes") or r["peak_device_memory_bytes"] or 0
    return (
        f"| {Path(cfg).name} | {precision} | {per_pass} | {r['train_step_ms']:.1f} | "
        f"{passes * r['train_step_ms'] / 1e3:.3f} | {r['forward_ms']:.1f} | "
        f"{peak / 2**20:.0f} |"
    )


def fork_rows(batch_per_pass):
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, per_pass in batch_per_pass:
            cfg = three_class_cfg(name, tmp)
            for precision in PRECISIONS:
                out = subprocess.run(
                    [sys.executable, __file__, "--row", str(cfg), precision, str(per_pass)],
                    capture_output=True,
                    text=True,
                )
                row = out.stdout.strip().splitlines()[-1:] if out.returncode == 0 else []
                rows.append(
                    row[0]
                    if row
                    else f"| {name} | {precision} | {per_pass} | failed: "
                    f"{(out.stderr.strip().splitlines() or ['?'])[-1]} | | | |"
                )
                print(rows[-1], flush=True)
    return rows


def markdown(out, cfg_name, batch, thresh, gpu):
    lines = [f"\n## {utc_now()}, precisions (bench/training/precision.py), {gpu}"]
    if "step" in out:
        lines += [
            "",
            f"| {cfg_name} batch {batch} | training step ms | conv backward ms | peak MiB |",
            "|---|---|---|---|",
        ]
        lines += [
            f"| {r['precision']} | {r['train_step_ms']:.2f} | "
            f"{r['conv_backward_ms']:.2f} | {r['peak_mib']:.0f} |"
            for r in out["step"]
        ]
    if "detections" in out:
        lines += [
            "",
            f"COCO yolov3-tiny weights on ../shared/images, `detect --thresh "
            f"{thresh}` in each precision against fp32:",
            "",
            "| precision | same classes as fp32 | largest probability change (points) |",
            "|---|---|---|",
            *out["detections"],
        ]
    if "fork" in out:
        lines += [
            "",
            "The fork's cfgs with classes=3 at 416x416, random weights, synthetic "
            "truth (darknet_py.bench.run_bench, medians of 5): a pass of `batch` images; "
            "an iteration of 64 images is 64 / batch passes.",
            "",
            "| cfg | precision | batch per pass | pass ms | iteration s (64 images) | "
            "forward ms | peak MiB |",
            "|---|---|---|---|---|---|---|",
            *out["fork"],
        ]
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    ap.add_argument("--cfg", default=str(SHARED / "darknet-cfg" / "yolov3-tiny.cfg"))
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--thresh", type=float, default=0.25)
    ap.add_argument("--json", help="write every figure here")
    ap.add_argument("--results", help="append a dated section to this Markdown file")
    ap.add_argument("--row", nargs=3, metavar=("CFG", "PRECISION", "BATCH"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.row:
        print(fork_row(args.row[0], args.row[1], int(args.row[2])))
        return
    from darknet_py.backends import get_backend

    gpu = get_backend("cuda:0").device_name
    out = {}
    if "step" in args.parts:
        out["step"] = step_rows(args.cfg, args.batch)
    if "detections" in args.parts:
        out["detections"] = compare(detections_per_precision(args.thresh))
    if "fork" in args.parts:
        out["fork"] = fork_rows((("yolov4-tiny.cfg", 64), ("yolov4.cfg", 32)))
    lines = markdown(out, Path(args.cfg).name, args.batch, args.thresh, gpu)
    print("\n".join(lines))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    if args.results:
        append_section(args.results, lines)


if __name__ == "__main__":
    main()
