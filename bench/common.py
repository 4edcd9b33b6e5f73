"""What several benchmarks share: the checkout's paths, the GPU's name, the date of a run,
results.json's merge, and the fork's cfgs made into 3-class 416x416 networks."""

import datetime
import json
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
RESULTS_JSON = ROOT / "bench" / "results.json"
RESULTS_MD = ROOT / "bench" / "RESULTS.md"


def utc_now():
    """The time of a run as RESULTS.md and results.json write it: 2026-11-27 07:40 UTC."""
    return f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC"


def gpu_name():
    """GPU 0's name as nvidia-smi gives it; "unknown GPU" without one."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        return out.stdout.splitlines()[0].strip() or "unknown GPU"
    except (OSError, IndexError, subprocess.SubprocessError):
        return "unknown GPU"


def merge_json(path, figures, gpu, digits=None, headline=True):
    """Add `figures` ({key: number}) to the JSON object in `path` (made if absent), with
    `gpu` and the run's `date` (the latest run's; headline=False leaves those to the GPU
    runs, whose figures without a record of their own fall back on them), and each
    figure's own card (or machine) and date under "measured" (the file gathers figures of
    several runs and machines); rounded to `digits` places where given."""
    path = Path(path)
    data = json.loads(path.read_text()) if path.is_file() else {}
    data.update({k: v if digits is None else round(v, digits) for k, v in figures.items()})
    date = utc_now()
    if headline:
        data["gpu"], data["date"] = gpu, date
    measured = data.setdefault("measured", {})
    for key in figures:
        measured[key] = {"gpu": gpu, "date": date}
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return data


def append_section(path, lines):
    """Append a Markdown section (its lines) to `path` (RESULTS.md)."""
    with open(path, "a", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


def three_class_cfg(name, directory, path=None, **net):
    """The fork's stock cfg `name` (../shared/darknet-cfg-ab) with classes=3 (the heads'
    filters 3 * (5 + 3)) at 416x416, written to `path` (default: `name` in `directory`);
    `net` overrides [net] keys (batch=64, max_batches=30, ...)."""
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
