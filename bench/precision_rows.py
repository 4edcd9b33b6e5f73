"""Issue 17's per-precision rows beside precision_bench.py's yolov3-tiny ones: the real COCO
yolov3-tiny weights on the photos of ../shared/images in every precision (the classes above
--thresh and the largest probability change against fp32), and the fork's yolov4 and
yolov4-tiny (../shared/darknet-cfg-ab, classes=3, 416x416) training step and iteration
time per precision, random weights and synthetic truth (bench.run_bench).

    python3 bench/precision_rows.py [--results bench/RESULTS.md]
"""
import argparse
import datetime
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from darknet_py.bench import run_bench
from darknet_py.network import load_network

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
PRECISIONS = ("fp32", "tf32", "fp16", "bf16")


def detections_per_precision(thresh):
    """{precision: {image: [(class, prob)]}} of yolov3-tiny with the COCO weights."""
    cfg = SHARED / "darknet-cfg" / "yolov3-tiny.cfg"
    weights = SHARED / "weights" / "yolov3-tiny.weights"
    images = sorted(p for p in (SHARED / "images").iterdir() if p.suffix == ".jpg")
    found = {}
    for precision in PRECISIONS:
        net = load_network(cfg, weights, batch=1, device="cuda:0", precision=precision)
        found[precision] = {p.name: sorted((d.class_id, d.prob) for d in
                                           net.detect(str(p), thresh=thresh))
                            for p in images}
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


def three_class_cfg(name, directory, path=None, **net):
    """The fork's stock cfg with classes=3 (heads' filters 3 * (5 + 3)), 416x416, written
    to `path` (default: `name` in `directory`); `net` overrides [net] keys (batch=64,
    max_batches=30, ...)."""
    text = (SHARED / "darknet-cfg-ab" / name).read_text()
    text = re.sub(r"(?m)^classes\s*=\s*80", "classes=3", text)
    text = re.sub(r"(?m)^filters\s*=\s*255", "filters=24", text)
    text = re.sub(r"(?m)^(width|height)\s*=\s*\d+", r"\1=416", text)
    for key, value in net.items():
        text = re.sub(rf"(?m)^{key}\s*=\s*\d+", f"{key}={value}", text)
    path = Path(path) if path is not None else Path(directory) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def training_row(cfg, precision, per_pass):
    """One table row; run in a process of its own, so each network's GPU memory is gone
    before the next (and peak memory is this one's)."""
    net = load_network(cfg, batch=per_pass, device="cuda:0", darknet="alexeyab",
                       precision=precision)
    r = run_bench(net, train=True, warmup=2, repeats=5)
    passes = 64 // per_pass
    return (f"| {Path(cfg).name} | {precision} | {per_pass} | {r['train_step_ms']:.1f} | "
            f"{passes * r['train_step_ms'] / 1e3:.3f} | {r['forward_ms']:.1f} | "
            f"{(r['peak_device_memory_bytes'] or 0) / 2**20:.0f} |")


def training_rows(batch_per_pass):
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, per_pass in batch_per_pass:
            cfg = three_class_cfg(name, tmp)
            for precision in PRECISIONS:
                out = subprocess.run([sys.executable, __file__, "--row", str(cfg), precision,
                                      str(per_pass)], capture_output=True, text=True)
                row = out.stdout.strip().splitlines()[-1:] if out.returncode == 0 else []
                rows.append(row[0] if row else f"| {name} | {precision} | {per_pass} | failed: "
                            f"{(out.stderr.strip().splitlines() or ['?'])[-1]} | | | |")
                print(rows[-1], flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--thresh", type=float, default=0.25)
    ap.add_argument("--results", default=None)
    ap.add_argument("--row", nargs=3, metavar=("CFG", "PRECISION", "BATCH"),
                    help="(internal) print one training row")
    args = ap.parse_args()
    if args.row:
        print(training_row(args.row[0], args.row[1], int(args.row[2])))
        return
    found = detections_per_precision(args.thresh)
    detect_lines = compare(found)
    print("\n".join(detect_lines), flush=True)
    train_lines = training_rows((("yolov4-tiny.cfg", 64), ("yolov4.cfg", 32)))
    section = [
        f"\n## {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, precision rows "
        f"(bench/precision_rows.py), GPU 0",
        "",
        f"COCO yolov3-tiny weights on ../shared/images, `detect --thresh {args.thresh}` in "
        f"each precision against fp32:",
        "", "| precision | same classes as fp32 | largest probability change (points) |",
        "|---|---|---|", *detect_lines, "",
        "The fork's cfgs with classes=3 at 416x416, random weights, synthetic truth "
        "(bench.run_bench, medians of 5): a pass of `batch` images; an iteration of 64 "
        "images is 64 / batch passes.", "",
        "| cfg | precision | batch per pass | pass ms | iteration s (64 images) | forward ms | "
        "peak MiB |", "|---|---|---|---|---|---|---|", *train_lines, ""]
    if args.results:
        with open(args.results, "a", encoding="utf-8") as f:
            f.write("\n".join(section) + "\n")


if __name__ == "__main__":
    main()
