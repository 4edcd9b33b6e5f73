"""Data-parallel training through the real command: `darknet-py train` on one GPU
(`--gpu 0`) against K GPUs (`--gpus 0,...,K-1`), yolov4 with 3 classes at 416x416, 64
images per GPU an iteration (2 passes of 32), on a synthetic data set (random images and
boxes written to a temporary folder). Each run is its own process, timed from its start
to its exit.

    python3 bench/multigpu/data_parallel.py [--gpus K] [--modes steady,whole]
        [--steady-iterations 30] [--whole-iterations 300] [--json bench/results.json]
        [--results bench/RESULTS.md] [--cfg CFG]
    python3 bench/multigpu/data_parallel.py --signals [--gpus K]
    python3 bench/multigpu/data_parallel.py --cpu ...     (NumPy ranks, tiny settings)

Modes:
  steady  fp16 and fp32, --steady-iterations each: the steady images/s (median of the
          log's per-iteration rates after the first third), the time to the first
          iteration (the log's "first iteration after X s"), the whole process.
  whole   fp16, --whole-iterations: the whole process's images/s (K x T1 / TK).
Results: bench/results.json's keys dp{K}_steady_speedup_fp16, dp{K}_steady_speedup_fp32,
dp{K}_whole_{N}_speedup_fp16, dp{K}_first_iteration_s, dp1_first_iteration_s, gpu, date
(other keys kept), and a dated section appended to bench/RESULTS.md.

--signals: a K-GPU run whose rank K-1 gets SIGKILL after iteration 3 (the run must end
within seconds, exit 2, naming the rank), then one whose process group gets SIGTERM
(exit 143 within seconds, "Terminated (SIGTERM)", a complete backup that loads).

--cpu: NumPy ranks (`--ranks K` against `--device cpu`), a small detector at 64x64 and a
few iterations, results under the work folder unless --json/--results say otherwise: to
check this script where there is no GPU (the figures mean nothing).
"""

import argparse
import datetime
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # darknet_py of this tree (the backup check, the GPU count)
SHARED = ROOT.parent / "shared"
ITERATION = re.compile(r"^(\d+): .* \| ([0-9.]+) images/s")
FIRST = re.compile(r"^first iteration after ([0-9.]+) s \(it started ([0-9.]+) s after")
RANK_PID = re.compile(r"^darknet-py: rank (\d+) of \d+: pid (\d+)")


def say(line):
    print(line, flush=True)


# ---- the inputs ----------------------------------------------------------------------------
def write_data_set(folder, count, size, seed=0):
    """`count` random JPEG images of size x size with 1-4 random boxes of 3 classes each,
    their labels where both Darknets look for them, train.list, names and a .data file whose
    backup folder is replaced per run (data_file)."""
    import cv2

    folder = Path(folder)
    (folder / "images").mkdir(parents=True, exist_ok=True)
    (folder / "labels").mkdir(exist_ok=True)
    rng = np.random.default_rng(seed)
    paths = []
    for i in range(count):
        image = rng.integers(0, 256, (size // 8, size // 8, 3), dtype=np.uint8)
        image = cv2.resize(image, (size, size), interpolation=cv2.INTER_LINEAR)
        rows = []
        for _ in range(int(rng.integers(1, 5))):
            w, h = rng.uniform(0.05, 0.5, 2)
            x, y = rng.uniform(w / 2, 1 - w / 2), rng.uniform(h / 2, 1 - h / 2)
            c = int(rng.integers(3))
            x0, y0 = int((x - w / 2) * size), int((y - h / 2) * size)
            cv2.rectangle(
                image,
                (x0, y0),
                (x0 + int(w * size), y0 + int(h * size)),
                (60 * c, 255 - 60 * c, 128),
                -1,
            )
            rows.append(f"{c} {x:.6f} {y:.6f} {w:.6f} {h:.6f}")
        path = folder / "images" / f"{i:05d}.jpg"
        cv2.imwrite(str(path), image)
        # Where either Darknet looks: labels/ for the original, beside it for the fork.
        for labels in (folder / "labels" / f"{i:05d}.txt", path.with_suffix(".txt")):
            labels.write_text("\n".join(rows) + "\n")
        paths.append(str(path))
    (folder / "train.list").write_text("\n".join(paths) + "\n")
    (folder / "shapes.names").write_text("red\ngreen\nblue\n")
    return folder


def data_file(folder, name):
    """A .data file of the set with a backup folder of its own (each run writes there)."""
    backup = Path(folder) / "runs" / name
    backup.mkdir(parents=True, exist_ok=True)
    path = Path(folder) / "runs" / f"{name}.data"
    path.write_text(
        f"classes=3\ntrain={folder}/train.list\nnames={folder}/shapes.names\nbackup={backup}/\n"
    )
    return path, backup


def write_cfg(path, cpu, batch, subdivisions, cfg=None):
    """The benchmark's cfg: yolov4 with 3 classes at 416, `batch` images an iteration per
    GPU, random=0, from darknet_py.architectures' writer where this tree has it, else from
    the fork's stock cfg in ../shared; --cpu: the bundled yolov3-tiny-3class at 64x64.
    cfg: a file given with --cfg, used as it is."""
    path = Path(path)
    if cfg is not None:
        path.write_text(Path(cfg).read_text())
        return path
    if cpu:
        text = (ROOT / "cfg" / "yolov3-tiny-3class.cfg").read_text()
        net = dict(
            batch=batch,
            subdivisions=subdivisions,
            width=64,
            height=64,
            burn_in=0,
            max_batches=1000000,
        )
    else:
        try:
            from darknet_py.architectures import cfg_text

            text = cfg_text("yolov4", classes=3, size=416, batch=batch, subdivisions=subdivisions)
        except ImportError:
            stock = SHARED / "darknet-cfg-ab" / "yolov4.cfg"
            if not stock.exists():
                sys.exit(
                    f"darknet-py bench: no cfg writer (darknet_py.architectures) and no "
                    f"{stock}: give --cfg (bench/conv_backward_bench.py --make-cfg "
                    f"writes one)"
                )
            text = stock.read_text()
            text = re.sub(r"(?m)^classes\s*=\s*80", "classes=3", text)
            text = re.sub(r"(?m)^filters\s*=\s*255", "filters=24", text)
        net = dict(
            batch=batch, subdivisions=subdivisions, width=416, height=416, max_batches=1000000
        )
    for key, value in net.items():
        text = re.sub(rf"(?m)^{key}\s*=.*$", f"{key}={value}", text, count=1)
    text = re.sub(r"(?m)^random\s*=\s*\d", "random=0", text)
    path.write_text(text)
    return path


# ---- one run of the command ------------------------------------------------------------------
class Run:
    """One `darknet-py train` process: its output lines as they come (also to `log`), its
    exit code and wall time from start to exit."""

    def __init__(self, args, env, log_path, group=False):
        self.lines, self.pids = [], {}
        self.started = time.monotonic()
        self.log = open(log_path, "w")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "darknet_py", *map(str, args)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            errors="replace",
            start_new_session=group,
        )
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.process.stdout:
            self.log.write(line)
            line = line.rstrip("\n")
            self.lines.append(line)
            m = RANK_PID.match(line)
            if m:
                self.pids[int(m[1])] = int(m[2])

    def wait_for(self, test, timeout):
        """The first line passing test(line) within timeout seconds, else None."""
        deadline, seen = time.monotonic() + timeout, 0
        while time.monotonic() < deadline and self.process.poll() is None:
            for line in self.lines[seen:]:
                if test(line):
                    return line
            seen = len(self.lines)
            time.sleep(0.05)
        return next((line for line in self.lines if test(line)), None)

    def finish(self, timeout):
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL) if self.group_id() else self.process.kill()
            code = self.process.wait()
        self.seconds = time.monotonic() - self.started
        self.reader.join(5)
        self.log.close()
        self.code = code
        return code

    def group_id(self):
        try:
            return os.getpgid(self.process.pid) == self.process.pid
        except ProcessLookupError:
            return False


def parse_log(lines, iterations):
    """(steady images/s, first iteration's end s, its start s) of a run's output lines:
    the median of the per-iteration rates from the first third on (at least iteration
    3), and the "first iteration after" line's figures (None where missing)."""
    rates = {}
    first = (None, None)
    for line in lines:
        m = ITERATION.match(line)
        if m:
            rates[int(m[1])] = float(m[2])
        m = FIRST.match(line)
        if m:
            first = (float(m[1]), float(m[2]))
    skip = max(3, iterations // 3)
    steady = [rate for i, rate in rates.items() if i > skip] or list(rates.values())[-1:]
    return (statistics.median(steady) if steady else None), first[0], first[1]


def train_run(settings, gpus, precision, iterations, name):
    """One timed run: {gpus, precision, iterations, seconds, steady, first, first_start}."""
    data, _ = data_file(settings.work / "set", name)
    if settings.cpu:
        on = ["--device", "cpu"] if gpus == 1 else ["--ranks", gpus]
    else:
        on = ["--gpu", 0] if gpus == 1 else ["--gpus", ",".join(map(str, range(gpus)))]
    env = dict(
        os.environ,
        DARKNET_PRECISION=precision,
        PYTHONUNBUFFERED="1",
        DARKNET_TRACE_START="1" if settings.trace else "0",
        NCCL_NVLS_ENABLE="0",
        PYTHONPATH=os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]),
    )
    run = Run(
        ["train", settings.cfg, data, *on, "--max-batches", iterations, "--quiet"],
        env,
        settings.work / f"{name}.log",
    )
    code = run.finish(settings.timeout)
    steady, first, first_start = parse_log(run.lines, iterations)
    row = dict(
        name=name,
        gpus=gpus,
        precision=precision,
        iterations=iterations,
        seconds=round(run.seconds, 3),
        code=code,
        steady=steady,
        first=first,
        first_start=first_start,
        log=str(settings.work / f"{name}.log"),
    )
    with open(settings.work / "rows.jsonl", "a") as f:  # what a run cut short leaves
        f.write(json.dumps(row) + "\n")
    say(
        f"[{time.monotonic() - settings.t0:6.1f} s] {name}: exit {code}, {run.seconds:.2f} s "
        f"whole, steady {steady if steady is None else round(steady, 1)} images/s, first "
        f"iteration after {first} s"
    )
    if code != 0:
        say("\n".join(run.lines[-15:]))
    return row


# ---- the timing modes --------------------------------------------------------------------
def run_timing(settings):
    k, rows = settings.gpus, []
    say(
        f"[{time.monotonic() - settings.t0:6.1f} s] warm-up: 1 iteration on 1 "
        f"{'CPU' if settings.cpu else 'GPU'} (fills the kernel cache)"
    )
    rows.append(train_run(settings, 1, "fp16", 1, "warmup"))
    plan = []
    if "steady" in settings.modes:
        for precision in ("fp16", "fp32"):
            plan += [
                (g, precision, settings.steady_iterations, f"steady_{precision}_{g}")
                for g in (1, k)
            ]
    if "whole" in settings.modes:
        plan += [(g, "fp16", settings.whole_iterations, f"whole_fp16_{g}") for g in (1, k)]
    for gpus, precision, iterations, name in plan:
        rows.append(train_run(settings, gpus, precision, iterations, name))
    return rows[1:]


def summarise(rows, k, whole_iterations):
    """The results' keys from the runs' rows (a key is left out where a run failed)."""
    by = {row["name"]: row for row in rows if row["code"] == 0}
    out = {}
    for precision in ("fp16", "fp32"):
        one, many = by.get(f"steady_{precision}_1"), by.get(f"steady_{precision}_{k}")
        if one and many and one["steady"] and many["steady"]:
            out[f"dp{k}_steady_speedup_{precision}"] = round(many["steady"] / one["steady"], 3)
            out[f"dp{k}_steady_images_s_{precision}"] = round(many["steady"], 1)
            out[f"dp1_steady_images_s_{precision}"] = round(one["steady"], 1)
    one, many = by.get("whole_fp16_1"), by.get(f"whole_fp16_{k}")
    if one and many:
        out[f"dp{k}_whole_{whole_iterations}_speedup_fp16"] = round(
            k * one["seconds"] / many["seconds"], 3
        )
        out[f"dp{k}_whole_{whole_iterations}_seconds_fp16"] = many["seconds"]
        out[f"dp1_whole_{whole_iterations}_seconds_fp16"] = one["seconds"]
    for gpus in (1, k):  # the time to the first iteration: fp16's runs, median
        firsts = [
            row["first"]
            for row in rows
            if row["gpus"] == gpus
            and row["code"] == 0
            and row["precision"] == "fp16"
            and row["first"] is not None
        ]
        if firsts:
            out[f"dp{gpus}_first_iteration_s"] = round(statistics.median(firsts), 2)
    return out


def gpu_name(cpu):
    if cpu:
        return "CPU (NumPy ranks; --cpu)"
    try:
        names = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.split("\n")
        names = [n.strip() for n in names if n.strip()]
        return f"{len(names)} x {names[0]}" if names else "unknown GPU"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown GPU"


def write_results(settings, rows, keys):
    now = datetime.datetime.now(datetime.timezone.utc)
    gpu = gpu_name(settings.cpu)
    # The figures carry their own machine and date (dp{K}_gpu, dp{K}_date): the file's gpu
    # and date are the single-GPU benches'.
    date = now.strftime("%Y-%m-%d %H:%M UTC")
    record = dict(keys, **{f"dp{settings.gpus}_gpu": gpu, f"dp{settings.gpus}_date": date})
    results = json.loads(settings.json.read_text()) if settings.json.exists() else {}
    results.update(record)
    settings.json.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    k = settings.gpus
    lines = [
        f"\n## {date}, data-parallel training through `darknet-py train`, "
        f"{gpu} (bench/multigpu/data_parallel.py)",
        "",
        f"`python3 bench/multigpu/data_parallel.py --gpus {k} --modes "
        f"{','.join(settings.modes)} --steady-iterations {settings.steady_iterations} "
        f"--whole-iterations {settings.whole_iterations} --image-size {settings.image_size}`: "
        f"{Path(settings.cfg).name}, "
        f"{settings.batch} images per {'rank' if settings.cpu else 'GPU'} an iteration "
        f"in {settings.subdivisions} passes, {settings.images} synthetic "
        f"{settings.image_size}x{settings.image_size} JPEG images; "
        f"whole = the process from its start to its exit; steady = the median of the "
        f"log's per-iteration images/s after the first third; first iteration = the "
        f"log's `first iteration after` (from the command's start).",
        "",
        "| run | GPUs | precision | iterations | whole s | steady images/s | "
        "first iteration s (its start) | exit |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        steady = "-" if row["steady"] is None else f"{row['steady']:.1f}"
        first = "-" if row["first"] is None else f"{row['first']:.2f} ({row['first_start']:.2f})"
        lines.append(
            f"| {row['name']} | {row['gpus']} | {row['precision']} | "
            f"{row['iterations']} | {row['seconds']:.2f} | {steady} | {first} | "
            f"{row['code']} |"
        )
    lines += [
        "",
        "Results: " + ", ".join(f"`{key}` {value}" for key, value in sorted(keys.items())),
        "",
    ]
    with open(settings.results, "a", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    say("\n".join(lines))


# ---- the signals ---------------------------------------------------------------------------
def complete_backup(cfg, backup):
    """'' when `backup` loads whole into the cfg's network, else what is wrong."""
    from darknet_py.network import load_network

    try:
        net = load_network(str(cfg), str(backup), batch=1, device="cpu")
    except Exception as e:  # a truncated or missing file: the check's finding
        return f"{type(e).__name__}: {e}"
    return "" if net.seen > 0 else "seen 0"


def run_signals(settings):
    """The two checks; True when both pass."""
    k = settings.gpus
    on = ["--ranks", k] if settings.cpu else ["--gpus", ",".join(map(str, range(k)))]
    env = dict(
        os.environ,
        PYTHONUNBUFFERED="1",
        NCCL_NVLS_ENABLE="0",
        DARKNET_PRECISION="fp16",
        PYTHONPATH=os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]),
    )
    ok = True
    for check in ("kill", "term"):
        data, backup_dir = data_file(settings.work / "set", f"signal_{check}")
        run = Run(
            ["train", settings.cfg, data, *on, "--max-batches", 100000, "--quiet"],
            env,
            settings.work / f"signal_{check}.log",
            group=True,
        )
        line = run.wait_for(lambda text: text.startswith(("3: ", "3, ")), settings.timeout)
        if line is None:
            run.finish(5)
            say(
                f"signals: {check}: the run never reached iteration 3 (exit {run.code}):\n"
                + "\n".join(run.lines[-10:])
            )
            ok = False
            continue
        sent = time.monotonic()
        if check == "kill":
            victim = max(run.pids)
            os.kill(run.pids[victim], signal.SIGKILL)
        else:
            os.killpg(run.process.pid, signal.SIGTERM)
        code = run.finish(120)
        took = time.monotonic() - sent
        text = "\n".join(run.lines)
        if check == "kill":
            named = f"rank {victim} died (killed by SIGKILL)" in text
            passed = code == 2 and named and took < 10
            say(
                f"signals: SIGKILL to rank {victim}: exit {code} after {took:.2f} s, "
                f"{'names' if named else 'does NOT name'} the rank: "
                f"{'ok' if passed else 'FAIL'}"
            )
        else:
            backup = backup_dir / f"{Path(settings.cfg).stem}.backup"
            named = "Terminated (SIGTERM)" in text
            problem = complete_backup(settings.cfg, backup)
            left = [pid for pid in run.pids.values() if _alive(pid)]
            passed = (
                code == 128 + signal.SIGTERM and named and not problem and took < 30 and not left
            )
            say(
                f"signals: SIGTERM to the group: exit {code} after {took:.2f} s, "
                f"{'names' if named else 'does NOT name'} the signal, backup "
                f"{backup}: {problem or 'complete, loads'}, ranks left {left}: "
                f"{'ok' if passed else 'FAIL'}"
            )
        ok = ok and passed
    return ok


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


# ---- the command ---------------------------------------------------------------------------
def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", type=int, default=None, help="K [default: every GPU; --cpu 2]")
    ap.add_argument("--modes", default="steady,whole", help="steady, whole or both")
    ap.add_argument("--steady-iterations", type=int, default=None, help="[30; --cpu 4]")
    ap.add_argument("--whole-iterations", type=int, default=None, help="[300; --cpu 6]")
    ap.add_argument("--images", type=int, default=None, help="synthetic images [512; --cpu 24]")
    ap.add_argument(
        "--image-size",
        type=int,
        default=None,
        help="their width and height [416; --cpu 96]: JPEG decoding and the "
        "mosaic's resizing grow with it (the loader's CPU work)",
    )
    ap.add_argument(
        "--trace",
        action="store_true",
        help="DARKNET_TRACE_START=1 in the timed runs (start-up lines in the logs)",
    )
    ap.add_argument("--batch", type=int, default=None, help="per GPU an iteration [64; --cpu 4]")
    ap.add_argument("--subdivisions", type=int, default=None, help="[2; --cpu 1]")
    ap.add_argument("--cfg", default=None, help="use this cfg instead of writing one")
    ap.add_argument("--json", type=Path, default=None, help="[bench/results.json]")
    ap.add_argument("--results", type=Path, default=None, help="[bench/RESULTS.md]")
    ap.add_argument("--work", type=Path, default=None, help="scratch folder [a temporary one]")
    ap.add_argument("--timeout", type=float, default=600, help="seconds a run may take")
    ap.add_argument("--signals", action="store_true", help="the signal checks instead")
    ap.add_argument("--cpu", action="store_true", help="NumPy ranks, tiny settings")
    s = ap.parse_args(argv)
    cpu = s.cpu
    s.modes = [m for m in s.modes.split(",") if m]
    if set(s.modes) - {"steady", "whole"} or not s.modes:
        ap.error(f"--modes {','.join(s.modes)}: expected steady, whole or steady,whole")
    s.steady_iterations = s.steady_iterations or (4 if cpu else 30)
    s.whole_iterations = s.whole_iterations or (6 if cpu else 300)
    s.images = s.images or (24 if cpu else 512)
    s.batch = s.batch or (4 if cpu else 64)
    s.subdivisions = s.subdivisions or (1 if cpu else 2)
    if s.gpus is None:
        if cpu:
            s.gpus = 2
        else:
            from darknet_py.backends import cuda_device_count

            s.gpus = cuda_device_count()
    if s.gpus < 2:
        ap.error(f"needs 2 or more {'ranks' if cpu else 'GPUs'}, found {s.gpus}")
    s.t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="darknet-py-dp-bench-") as tmp:
        s.work = s.work or Path(tmp)
        s.work.mkdir(parents=True, exist_ok=True)
        s.json = s.json or (s.work / "results.json" if cpu else ROOT / "bench" / "results.json")
        s.results = s.results or (s.work / "RESULTS.md" if cpu else ROOT / "bench" / "RESULTS.md")
        s.cfg = write_cfg(
            s.work / ("small.cfg" if cpu else "yolov4-3c.cfg"), cpu, s.batch, s.subdivisions, s.cfg
        )
        s.image_size = s.image_size or (96 if cpu else 416)
        write_data_set(s.work / "set", s.images, s.image_size)
        say(
            f"[{time.monotonic() - s.t0:6.1f} s] {s.images} images in {s.work / 'set'}, "
            f"cfg {s.cfg}, {s.gpus} {'ranks' if cpu else 'GPUs'}"
        )
        if s.signals:
            return 0 if run_signals(s) else 1
        rows = run_timing(s)
        keys = summarise(rows, s.gpus, s.whole_iterations)
        write_results(s, rows, keys)
        say(f"[{time.monotonic() - s.t0:6.1f} s] done: {s.json}, {s.results}")
        return 0 if all(row["code"] == 0 for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
