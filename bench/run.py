"""darknet-py's benchmarks, by subject, behind one command (`make bench` runs the default
subjects: kernels, networks, training).

    python3 bench/run.py [SUBJECT ...] [--list] [--dry-run] [--results FILE] [--json FILE]

Each subject runs its scripts one after another, each in a process of its own with this
Python, from the checkout's root; their dated sections are appended to --results
(bench/RESULTS.md) and their figures merged into --json (bench/results.json), under the
keys they have always had. A script whose inputs are missing (../shared's cfgs, weights or
photos) is skipped with a line saying what it needs; one that fails does not stop the
others, and the command's exit code is 1 when any failed. `all` runs every subject.
"""

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import RESULTS_JSON, RESULTS_MD, SHARED  # noqa: E402

TINY = SHARED / "darknet-cfg" / "yolov3-tiny.cfg"
FORK = SHARED / "darknet-cfg-ab"
DEFAULT = ("kernels", "networks", "training")

# subject: (what it measures, [(script and arguments, the ../shared paths it needs)]).
# In the arguments {results}, {json} and {scratch} (a temporary directory for the run)
# are filled in.
SUBJECTS = {
    "kernels": (
        "the 4096^3 GEMM in every precision beside cuBLAS; the fp32 GEMM and "
        "im2col/col2im on convolution shapes against their floors",
        [
            (["kernels/gemm.py", "--json", "{json}", "--results", "{results}"], []),
            (["kernels/shapes.py"], []),
        ],
    ),
    "networks": (
        "yolov3-tiny's batch-64 forward in each precision beside PyTorch (the layers, the "
        "whole call from photos); batch 1 on the GPU and on the CPU",
        [
            (
                [
                    "networks/forward.py",
                    "--torch",
                    "--batch1",
                    "--precisions",
                    "fp32",
                    "tf32",
                    "fp16",
                    "bf16",
                    "--json",
                    "{json}",
                    "--results",
                    "{results}",
                ],
                [TINY],
            ),
            (["networks/batch1.py", "--cpu"], []),
        ],
    ),
    "training": (
        "training end to end against the C Darknet (loader, upload, start too); passes, "
        "steps and iterations beside PyTorch; each precision's steps and detections",
        [
            (["training/end_to_end.py", "--results", "{results}"], [SHARED / "bench-cfg", TINY]),
            (
                ["training/vs_pytorch.py", "--json", "{json}", "--results", "{results}"],
                [FORK / "yolov4.cfg", TINY],
            ),
            (
                ["training/precision.py", "--results", "{results}"],
                [
                    TINY,
                    SHARED / "weights" / "yolov3-tiny.weights",
                    SHARED / "images",
                    FORK / "yolov4.cfg",
                ],
            ),
        ],
    ),
    "breakdown": (
        "where the time goes: yolov3-tiny's fp16 forward and training pass, kernel by "
        "kernel, layer by layer, on the host and outside the layers",
        [
            (["networks/breakdown.py", str(TINY), "--precision", "fp16"], [TINY]),
            (["networks/breakdown.py", str(TINY), "--precision", "fp16", "--train"], [TINY]),
        ],
    ),
    "probes": (
        "kernel probes: gemm plans per convolution, the convolution backward per shape, "
        "batch norm's passes against the roofline, tensor-core tiles, wgmma build variants",
        [
            (["kernels/conv_plans.py", f"{TINY}:64"], [TINY]),
            (
                ["kernels/conv_backward.py", "--make-cfg", "{scratch}/yolov4_3c.cfg"],
                [FORK / "yolov4.cfg"],
            ),
            (
                ["kernels/conv_backward.py", "{scratch}/yolov4_3c.cfg", "--sweep"],
                [FORK / "yolov4.cfg"],
            ),
            (["kernels/bn_passes.py"], []),
            (["kernels/tc_probe.py", "fp16", "--sweep"], []),
            (["kernels/wgmma_probe.py", "--shapes"], []),
        ],
    ),
    "cpu": (
        "CPU inference: the NumPy backend and ONNX Runtime against OpenCV 4's DNN module "
        "(`make bench-cpu` builds its virtualenv first)",
        [
            (
                ["cpu/vs_opencv.py", "--results", "{results}"],
                [TINY, SHARED / "weights" / "yolov3-tiny.weights", SHARED / "images"],
            )
        ],
    ),
    "loader": (
        "the data loader alone: detector batches a second by size and workers",
        [(["data/loader.py"], [])],
    ),
    "multigpu": (
        "data-parallel training through the train command on 1 and all GPUs (steady, whole "
        "process, first iteration); the cluster checks (torchrun, signals)",
        [
            (["multigpu/data_parallel.py"], []),
            (["multigpu/cluster_check.sh"], [FORK / "yolov4.cfg"]),
        ],
    ),
    "start": (
        "process start with an empty and a filled kernel cache, and the CUDA graphs' gain",
        [(["networks/start.py"], [])],
    ),
    "learning": (
        "the learning check per precision: yolov4-tiny trained in fp32, fp16 and bf16 "
        "(1500 iterations, seeds 1-3), each scored by `map` in fp32 (long)",
        [
            (
                [
                    "learning/precision.sh",
                    str(FORK / "yolov4-tiny.cfg"),
                    "{scratch}/learning",
                    "1500",
                    "1",
                    "2",
                    "3",
                ],
                [FORK / "yolov4-tiny.cfg"],
            )
        ],
    ),
}


def command(script, args):
    """The process to start for bench/SCRIPT with `args`."""
    path = ROOT / "bench" / script
    return (["bash", str(path)] if path.suffix == ".sh" else [sys.executable, str(path)]) + args


def listing():
    lines = []
    for name, (what, steps) in SUBJECTS.items():
        lines.append(f"{name}{' (default)' if name in DEFAULT else ''}: {what}")
        lines += [f"    bench/{' '.join(argv)}" for argv, _ in steps]
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="subjects:\n" + listing(),
    )
    ap.add_argument(
        "subjects",
        nargs="*",
        metavar="SUBJECT",
        help=f"what to run (default: {' '.join(DEFAULT)}; all: every subject)",
    )
    ap.add_argument("--list", action="store_true", help="name each subject's scripts and stop")
    ap.add_argument(
        "--dry-run", action="store_true", help="print the commands instead of running them"
    )
    ap.add_argument(
        "--results",
        default=str(RESULTS_MD),
        help="the Markdown file the scripts append their sections to",
    )
    ap.add_argument(
        "--json",
        default=str(RESULTS_JSON),
        help="the JSON file the scripts merge their figures into",
    )
    args = ap.parse_args(argv)
    if args.list:
        print(listing())
        return 0
    subjects = list(SUBJECTS) if "all" in args.subjects else args.subjects or list(DEFAULT)
    unknown = [s for s in subjects if s not in SUBJECTS]
    if unknown:
        print(
            f"bench/run.py: error: no subject {unknown[0]!r}; the subjects are "
            f"{', '.join(SUBJECTS)} (or all)",
            file=sys.stderr,
        )
        return 2
    failed, skipped = [], []
    with tempfile.TemporaryDirectory(prefix="darknet-bench-") as scratch:
        fill = {"results": args.results, "json": args.json, "scratch": scratch}
        for subject in subjects:
            print(f"== {subject}: {SUBJECTS[subject][0]}", flush=True)
            for argv_template, needs in SUBJECTS[subject][1]:
                script, *rest = (a.format(**fill) for a in argv_template)
                cmd = command(script, rest)
                missing = [str(p) for p in needs if not Path(p).exists()]
                if missing:
                    skipped.append(script)
                    print(f"-- skipped bench/{script}: needs {', '.join(missing)}", flush=True)
                    continue
                print(f"-- bench/{script} {' '.join(rest)}", flush=True)
                if args.dry_run:
                    continue
                start = time.perf_counter()
                code = subprocess.run(cmd, cwd=ROOT).returncode
                print(
                    f"-- bench/{script}: exit {code} after {time.perf_counter() - start:.0f} s",
                    flush=True,
                )
                if code:
                    failed.append(f"bench/{script} (exit {code})")
    if not args.dry_run and Path(args.json).is_file():
        # The README's speed table follows results.json (bench/readme_speed.py).
        from bench import readme_speed

        readme_speed.main(["--json", args.json])
    if skipped:
        print(f"skipped (inputs missing): {', '.join(skipped)}")
    if failed:
        print(f"failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
