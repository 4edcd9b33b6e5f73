"""fp16 against bf16 training steps, run after run (issue 42: fp16's step was slow and
unsteady while bf16's held): `darknet-py bench --train` on the fork's yolov4.cfg with 3
classes at 416x416, batch 32, each run a process of its own, the precisions interleaved.

    python3 bench/training/fp16_steps.py [--runs 5] [--batch 32] [--subdivisions N] [--json FILE]
    python3 bench/training/fp16_steps.py --trace [--passes 23] [--subdivisions N]

--subdivisions N rewrites the cfg's (the stock 8 updates at every 8th pass; 1 at every pass,
where the update's cost shows in each timed step).

Prints each run's training step (ms; the bench's median of 20 timed steps after 3 warm-up
ones) and per precision the median and the spread (max - min) over the runs. --trace
instead runs the bench's passes in this process, one precision after the other, and prints
each pass: its time, whether it updated, the loss scale and skipped count after it, and
the recorded graphs so far (captured, replayed): where the time of a slow pass goes.
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.common import SHARED, three_class_cfg  # noqa: E402

PRECISIONS = ("fp16", "bf16")


def one_run(cfg, precision, batch, out, device="cuda:0"):
    """The training step (ms) of one `darknet-py bench --train` process."""
    command = [sys.executable, "-m", "darknet_py", "bench", str(cfg), "--train"]
    command += ["--precision", precision, "--batch", str(batch), "--device", device]
    command += ["--json", str(out), "--overwrite"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"fp16_steps: {' '.join(command)} failed: {done.stderr.strip()[-2000:]}")
    return json.loads(Path(out).read_text())["train_step_ms"]


def trace(cfg, precision, batch, passes, device="cuda:0"):
    """Each of `passes` bench training passes timed on its own, with what happened in it."""
    import numpy as np

    from darknet_py.bench import prepare, random_truth
    from darknet_py.network import load_network

    net = load_network(cfg, batch=batch, device=device, precision=precision)
    prepare(net)
    net.share_deltas = net.share_outputs = True  # as run_bench trains
    rng = np.random.default_rng(0)
    x = rng.random((net.batch,) + net.input_shape, dtype=np.float32)
    truth = random_truth(net, rng)
    timer = net.be.timer()
    scaler = net.loss_scaler
    print(f"{precision}: {net.images_per_pass} images a pass, {net.subdivisions} passes an update")
    for k in range(1, passes + 1):
        timer.start()
        net.train_pass(x, truth)
        ms = 1e3 * timer.stop()
        scale = f"scale {scaler.scale:g}, {scaler.skipped} skipped, " if scaler else ""
        print(
            f"  pass {k:2d}: {ms:8.2f} ms{' update' if net.last_rate is not None else ''}, "
            f"{scale}graphs captured {net.graphs.captured}, replayed {net.graphs.replayed}",
            flush=True,
        )
    if net.graphs.fallback:
        print(f"  graphs fell back to eager steps: {net.graphs.fallback}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--json", type=Path, help="write {precision: [ms per run]} here")
    parser.add_argument("--subdivisions", type=int, help="the cfg's subdivisions= (stock: 8)")
    parser.add_argument("--trace", action="store_true", help="each pass, in this process")
    parser.add_argument("--passes", type=int, default=23, help="passes --trace runs")
    args = parser.parse_args()
    if not (SHARED / "darknet-cfg-ab" / "yolov4.cfg").is_file():
        sys.exit(f"fp16_steps: needs {SHARED}/darknet-cfg-ab/yolov4.cfg (the fork's cfgs)")
    net = {} if args.subdivisions is None else {"subdivisions": args.subdivisions}
    if args.trace:
        with tempfile.TemporaryDirectory() as tmp:
            cfg = three_class_cfg("yolov4.cfg", tmp, **net)
            for precision in PRECISIONS:
                trace(cfg, precision, args.batch, args.passes)
        return
    steps = {p: [] for p in PRECISIONS}
    with tempfile.TemporaryDirectory() as tmp:
        cfg = three_class_cfg("yolov4.cfg", tmp, **net)
        for run in range(1, args.runs + 1):
            for precision in PRECISIONS:
                ms = one_run(cfg, precision, args.batch, Path(tmp) / f"{precision}.json")
                steps[precision].append(ms)
                print(f"run {run} {precision}: training step {ms:.2f} ms", flush=True)
    for precision, figures in steps.items():
        print(
            f"{precision}: median {statistics.median(figures):.2f} ms, spread "
            f"{max(figures) - min(figures):.2f} ms over {len(figures)} runs "
            f"({', '.join(f'{ms:.1f}' for ms in figures)})"
        )
    if args.json:
        args.json.write_text(json.dumps(steps, indent=1) + "\n")


if __name__ == "__main__":
    main()
