"""bench/multigpu/data_parallel.py's reading of the train command's log and its results."""

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench" / "multigpu"))
import data_parallel as bench  # noqa: E402

LOG = """darknet-py: rank 0 of 4: pid 101, cuda:0
darknet-py: rank 1 of 4: pid 102, cuda:1
yolov4-3c
1: 900.5, 900.5 avg, 0.000000 rate, 0.700000 seconds, 256 images | 300.0 images/s, ETA 0:00:20
first iteration after 3.85 s (it started 3.12 s after the process)
2: 800.0, 890.4 avg, 0.000000 rate, 0.560000 seconds, 512 images | 400.0 images/s, ETA 0:00:15
3: 700.0, 871.4 avg, 0.000000 rate, 0.550000 seconds, 768 images | 450.0 images/s, ETA 0:00:14
4: 650.0, 849.2 avg, 0.000000 rate, 0.550000 seconds, 1024 images | 460.0 images/s, ETA 0:00:12
5: 640.0, 828.3 avg, 0.000000 rate, 0.550000 seconds, 1280 images | 466.0 images/s, ETA 0:00:11
6: 630.0, 808.5 avg, 0.000000 rate, 0.550000 seconds, 1536 images | 470.0 images/s, ETA 0:00:00
Saved /tmp/b/yolov4-3c_final.weights after 6 iterations (1536 images)""".splitlines()


def test_the_log_gives_the_steady_rate_and_the_first_iteration():
    steady, first, first_start = bench.parse_log(LOG, 6)
    assert steady == 466.0  # the median of iterations 4-6 (after the first third, >= 3)
    assert (first, first_start) == (3.85, 3.12)
    assert bench.parse_log(LOG[:3], 6) == (None, None, None)


def row(name, gpus, precision, seconds, steady, first, code=0):
    return dict(
        name=name,
        gpus=gpus,
        precision=precision,
        iterations=30,
        seconds=seconds,
        code=code,
        steady=steady,
        first=first,
        first_start=first - 0.5,
        log="",
    )


def test_speedups_and_the_results_files(tmp_path):
    rows = [
        row("steady_fp16_1", 1, "fp16", 11.0, 230.0, 3.0),
        row("steady_fp16_4", 4, "fp16", 12.0, 910.0, 3.5),
        row("steady_fp32_1", 1, "fp32", 20.0, 117.5, 3.2),
        row("steady_fp32_4", 4, "fp32", 22.0, 465.0, 3.9),
        row("whole_fp16_1", 1, "fp16", 90.0, 231.0, 3.1),
        row("whole_fp16_4", 4, "fp16", 94.0, 905.0, 3.6, code=1),
    ]
    keys = bench.summarise(rows, 4, 300)
    assert keys["dp4_steady_speedup_fp16"] == round(910 / 230, 3)
    assert keys["dp4_steady_speedup_fp32"] == round(465 / 117.5, 3)
    assert "dp4_whole_300_speedup_fp16" not in keys  # its 4-GPU run failed
    assert keys["dp1_first_iteration_s"] == 3.05 and keys["dp4_first_iteration_s"] == 3.5
    rows[-1]["code"] = 0
    assert bench.summarise(rows, 4, 300)["dp4_whole_300_speedup_fp16"] == round(4 * 90 / 94, 3)
    results, notes = tmp_path / "results.json", tmp_path / "RESULTS.md"
    results.write_text(json.dumps({"yolov4_b32_pass_ms_fp16": 101.6, "gpu": "NVIDIA H200"}))
    notes.write_text("# Results\n")
    settings = SimpleNamespace(
        cpu=True,
        json=results,
        results=notes,
        gpus=4,
        modes=["steady", "whole"],
        steady_iterations=30,
        whole_iterations=300,
        cfg="yolov4-3c.cfg",
        batch=64,
        subdivisions=2,
        images=512,
        image_size=416,
    )
    bench.write_results(settings, rows, keys)
    written = json.loads(results.read_text())
    assert written["yolov4_b32_pass_ms_fp16"] == 101.6  # the other benches' keys stay
    assert written["dp4_steady_speedup_fp16"] == keys["dp4_steady_speedup_fp16"]
    assert written["gpu"] == "NVIDIA H200"  # the single-GPU benches' machine stays
    assert written["dp4_gpu"].startswith("CPU") and written["dp4_date"].endswith(" UTC")
    text = notes.read_text()
    assert text.startswith("# Results\n\n## ")
    assert "| whole_fp16_4 | 4 | fp16 | 30 | 94.00 |" in text


def test_the_cfg_and_the_data_set(tmp_path):
    cfg = bench.write_cfg(tmp_path / "small.cfg", cpu=True, batch=4, subdivisions=1)
    text = cfg.read_text()
    assert "batch=4\n" in text and "width=64\n" in text and "random=1" not in text
    folder = bench.write_data_set(tmp_path / "set", 3, 64)
    paths = (folder / "train.list").read_text().split()
    assert len(paths) == 3 and all(Path(p).exists() for p in paths)
    for p in paths:
        boxes = (folder / "labels" / (Path(p).stem + ".txt")).read_text().split("\n")[:-1]
        assert 1 <= len(boxes) <= 4
        for b in boxes:
            c, x, y, w, h = b.split()
            assert c in "012" and all(0 < float(v) < 1 for v in (x, y, w, h))


def test_bad_modes_are_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(["--cpu", "--modes", "fast"])
    assert e.value.code == 2
    assert "--modes fast: expected steady, whole or steady,whole" in capsys.readouterr().err
