"""darknet-py's NumPy backend and its ONNX Runtime engine (--engine onnxruntime, the
default where onnxruntime is installed) against OpenCV 4's DNN module
(cv2.dnn.readNetFromDarknet) on the CPU: same cfg, same weights, same letterboxed photo,
batch 1.

    python3 bench/cpu/vs_opencv.py [--repeats N] [--results bench/RESULTS.md]

`make bench-cpu` builds the OpenCV-4 virtualenv (bench/.venv-opencv4; OpenCV 5 dropped the
Darknet importer) and runs this. OpenCV runs in that virtualenv as a worker process; the
engines' forwards alternate (A, B, C, A, B, C, ...) so that load from other processes falls
on all alike. Each engine times its own forward with perf_counter; medians are compared.
Also times `darknet-py detect` on one photo as a whole process (Python start included),
on the default engine and with `--engine numpy`, interleaved.

Goals (issue 39): the default engine's forward at most 0.6x OpenCV's; its whole `detect`
no slower than `--engine numpy`'s.
"""

import argparse
import datetime
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared"
RESULTS_JSON = ROOT / "bench" / "results.json"
OPENCV_PYTHON = ROOT / "bench" / ".venv-opencv4" / "bin" / "python"
PHOTO = SHARED / "images" / "dog.jpg"
BEGIN, END = "<!-- cpu_vs_opencv: begin -->", "<!-- cpu_vs_opencv: end -->"

# (name, cfg, real weights or None for random ones, goal: the default engine's forward
# over OpenCV's)
CASES = [
    (
        "yolov3-tiny 416",
        SHARED / "darknet-cfg" / "yolov3-tiny.cfg",
        SHARED / "weights" / "yolov3-tiny.weights",
        0.6,
    ),
    ("darknet19 256", SHARED / "darknet-cfg" / "darknet19.cfg", None, 0.6),
]


def opencv_worker():
    """The OpenCV side: reads 'load CFG WEIGHTS INPUT' and 'time' lines, answers each."""
    import cv2
    import numpy as np

    net = x = names = None
    for line in sys.stdin:
        cmd, *args = line.rstrip("\n").split("\t")
        if cmd == "load":
            net = cv2.dnn.readNetFromDarknet(args[0], args[1])
            net.setPreferableBackend(cv2.dnn.DNN_BACKEND_OPENCV)
            net.setPreferableTarget(cv2.dnn.DNN_TARGET_CPU)
            names = net.getUnconnectedOutLayersNames()
            x = np.load(args[2])
            reply = f"opencv {cv2.__version__}, {cv2.getNumThreads()} threads"
        elif cmd == "time":
            start = time.perf_counter()
            net.setInput(x)
            net.forward(names)
            reply = repr(time.perf_counter() - start)
        else:
            reply = f"error: unknown command {cmd}"
        print(reply, flush=True)


class Worker:
    def __init__(self):
        self.proc = subprocess.Popen(
            [str(OPENCV_PYTHON), __file__, "--opencv-worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def ask(self, *words):
        self.proc.stdin.write("\t".join(map(str, words)) + "\n")
        self.proc.stdin.flush()
        reply = self.proc.stdout.readline().strip()
        if not reply or reply.startswith("error"):
            raise SystemExit(f"OpenCV worker failed on {words[0]}: {reply or 'no answer'}")
        return reply

    def close(self):
        self.proc.stdin.close()
        self.proc.wait()


def random_weights(net, path):
    """Seeded random parameters with usable batch-norm statistics, saved for both engines."""
    import numpy as np

    rng = np.random.default_rng(0)
    for layer in net.layers:
        if getattr(layer, "batch_normalize", 0):
            net.be.write(layer.rolling_mean, rng.normal(0, 0.1, layer.out_c))
            net.be.write(layer.rolling_variance, rng.uniform(0.5, 2.0, layer.out_c))
    net.params_changed()
    net.save_weights(path)


def onnxruntime_engine(cfg, weights):
    """The network served by darknet-py's ONNX Runtime engine (its export made ready now,
    not in the timed runs), or None without the onnx extra."""
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return None
    import darknet_py as dn

    net = dn.load_network(cfg, weights, batch=1, device="cpu", engine="onnxruntime")
    assert net.engine == "onnxruntime"
    return net


def compare(name, cfg, weights, worker, tmp, repeats, warmup, pause):
    import numpy as np

    import darknet_py as dn

    net = dn.load_network(cfg, weights, batch=1, device="cpu", engine="numpy")
    if weights is None:
        weights = tmp / f"{cfg.stem}.weights"
        random_weights(net, weights)
    engine = onnxruntime_engine(cfg, weights)
    channels, height, width = net.input_shape
    x = dn.letterbox(dn.load_image(PHOTO), width, height)[None]
    np.save(tmp / "input.npy", x)
    version = worker.ask("load", cfg, weights, tmp / "input.npy")
    ours, ort, theirs = [], [], []
    for i in range(warmup + repeats):
        start = time.perf_counter()
        net.predict(x)
        t = time.perf_counter() - start
        # The engines' idle worker threads spin for a while after a run (OpenBLAS for
        # about 2^28 cycles): let them go to sleep before the next engine starts.
        time.sleep(pause)
        if engine is not None:
            start = time.perf_counter()
            engine.predict(x)
            o = time.perf_counter() - start
            time.sleep(pause)
        u = float(worker.ask("time"))
        time.sleep(pause)
        if i >= warmup:
            ours.append(t)
            theirs.append(u)
            if engine is not None:
                ort.append(o)
    a, b = statistics.median(ours) * 1e3, statistics.median(theirs) * 1e3
    c = statistics.median(ort) * 1e3 if ort else float("nan")
    return {
        "name": name,
        "darknet_py_ms": a,
        "opencv_ms": b,
        "ratio": a / b,
        "onnxruntime_ms": c,
        "onnxruntime_ratio": c / b,
        "opencv": version,
        "onnxruntime": onnxruntime_version(),
    }


def onnxruntime_version():
    try:
        import onnxruntime

        return f"onnxruntime {onnxruntime.__version__}"
    except ImportError:
        return "no onnxruntime (pip install onnx onnxruntime)"


def detect_process_seconds(repeats, tmp):
    """{engine: median seconds} of whole `darknet-py detect` processes on one photo, the
    default engine's and `--engine numpy`'s alternating."""
    cfg, weights = CASES[0][1], CASES[0][2]
    cmd = [
        sys.executable,
        "-m",
        "darknet_py",
        "detect",
        str(cfg),
        str(weights),
        str(PHOTO),
        "--device",
        "cpu",
        "--out",
        str(tmp / "predictions.jpg"),
        "--overwrite",
    ]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)  # the engine's cache made
    times = {"default": [], "numpy": []}
    for _ in range(repeats):
        for engine, extra in (("default", []), ("numpy", ["--engine", "numpy"])):
            start = time.perf_counter()
            subprocess.run(cmd + extra, check=True, stdout=subprocess.DEVNULL)
            times[engine].append(time.perf_counter() - start)
    return {engine: statistics.median(t) for engine, t in times.items()}


def load_average():
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


def cpu_name():
    """This machine's CPU as results.json records it: "2 CPU cores (AMD EPYC)"."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} CPU cores ({cpu})"


def machine(load_before):
    return (
        f"{cpu_name()}, load average {load_before:.2f} before the "
        f"run and {load_average():.2f} after (other processes slow the engines, unevenly)"
    )


def report(rows, detect_s, repeats, load_before):
    import numpy as np

    lines = [
        BEGIN,
        "# CPU inference: darknet-py (NumPy, ONNX Runtime) vs OpenCV DNN, batch 1 "
        "(`make bench-cpu`)",
        "",
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, "
        f"{machine(load_before)}; "
        f"NumPy {np.__version__}, {rows[0]['opencv']}, {rows[0]['onnxruntime']}. "
        f"Medians of {repeats} forwards per "
        f"engine, interleaved; input: ../shared/images/dog.jpg letterboxed.",
        "",
        "| network | darknet-py NumPy ms | darknet-py ONNX Runtime ms | OpenCV ms | "
        "ratio NumPy | ratio ONNX Runtime | goal (the default engine) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        # the default engine's: ONNX Runtime's where it is installed, else NumPy's
        default = r["ratio"] if np.isnan(r["onnxruntime_ratio"]) else r["onnxruntime_ratio"]
        verdict = "met" if default <= r["goal"] else "not met"
        lines.append(
            f"| {r['name']} | {r['darknet_py_ms']:.1f} | {r['onnxruntime_ms']:.1f} | "
            f"{r['opencv_ms']:.1f} | {r['ratio']:.2f} | {r['onnxruntime_ratio']:.2f} | "
            f"<= {r['goal']:.1f} ({verdict}) |"
        )
    verdict = "met" if detect_s["default"] <= detect_s["numpy"] else "not met"
    lines += [
        "",
        f"`darknet-py detect` yolov3-tiny on one photo, whole process (medians, the two "
        f"alternating): default engine {detect_s['default']:.3f} s, `--engine numpy` "
        f"{detect_s['numpy']:.3f} s (goal: default <= numpy: {verdict}).",
        END,
    ]
    return "\n".join(lines) + "\n"


def write_results(path, text):
    """Replace this script's section of the results file, keeping everything else."""
    old = path.read_text() if path.is_file() else "# Benchmark results\n\n"
    if BEGIN in old and END in old:
        head, rest = old.split(BEGIN, 1)
        new = head + text.rstrip("\n") + rest.split(END, 1)[1]
    else:
        new = old.rstrip("\n") + "\n\n" + text
    path.write_text(new)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--detect-repeats", type=int, default=9)
    ap.add_argument(
        "--pause",
        type=float,
        default=0.25,
        help="seconds between the two engines' runs (spinning threads settle)",
    )
    ap.add_argument("--results", type=Path, help="write the table into this Markdown file")
    ap.add_argument("--opencv-worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.opencv_worker:
        return opencv_worker()
    if not OPENCV_PYTHON.is_file():
        raise SystemExit(f"{OPENCV_PYTHON}: no OpenCV-4 virtualenv; `make bench-cpu` builds it")
    sys.path.insert(0, str(ROOT))
    load_before = load_average()
    worker = Worker()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for name, cfg, weights, goal in CASES:
            row = compare(name, cfg, weights, worker, tmp, args.repeats, args.warmup, args.pause)
            row["goal"] = goal
            rows.append(row)
            print(
                f"{name}: darknet-py {row['darknet_py_ms']:.1f} ms, with ONNX Runtime "
                f"{row['onnxruntime_ms']:.1f} ms, OpenCV {row['opencv_ms']:.1f} ms, ratios "
                f"{row['ratio']:.2f} and {row['onnxruntime_ratio']:.2f} (goal <= {goal})",
                flush=True,
            )
        worker.close()
        detect_s = detect_process_seconds(args.detect_repeats, tmp)
    print(
        f"darknet-py detect, whole process: default engine {detect_s['default']:.3f} s, "
        f"--engine numpy {detect_s['numpy']:.3f} s (goal: default <= numpy)"
    )
    text = report(rows, detect_s, args.repeats, load_before)
    if args.results:
        write_results(args.results, text)
        print(f"wrote {args.results}")
        from bench.common import merge_json

        merge_json(RESULTS_JSON, json_figures(rows, detect_s), cpu_name(), 3, headline=False)
        print(f"wrote {RESULTS_JSON}")


def json_figures(rows, detect_s):
    """results.json's CPU keys: each network's forward on both engines and OpenCV's (ms),
    the default engine's ratio to OpenCV's (goal <= 0.6), and the whole detect's seconds
    on the default engine and on NumPy (goal: default <= numpy)."""
    figures = {}
    for r in rows:
        net = "cpu_" + r["name"].replace("-", "").replace(" ", "_")  # cpu_yolov3tiny_416
        figures.update(
            {
                f"{net}_forward_ms_numpy": r["darknet_py_ms"],
                f"{net}_forward_ms_onnxruntime": r["onnxruntime_ms"],
                f"{net}_forward_ms_opencv": r["opencv_ms"],
                f"{net}_onnxruntime_over_opencv": r["onnxruntime_ratio"],
            }
        )
    figures["cpu_detect_yolov3tiny_s_default"] = detect_s["default"]
    figures["cpu_detect_yolov3tiny_s_numpy"] = detect_s["numpy"]
    return {k: v for k, v in figures.items() if v == v}  # no NaN (no ONNX Runtime)


if __name__ == "__main__":
    main()
