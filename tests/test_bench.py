"""`darknet-py bench`: the report, the per-layer table, --json and its refusal to overwrite."""
import json
import time
from pathlib import Path

from test_cli import run_in_process

from darknet_py.backends.numpy_backend import NumpyBackend

CFG = Path(__file__).resolve().parents[1] / "cfg" / "digits-classifier.cfg"


def test_bench_reports_forward_training_and_every_layer(tmp_path):
    out = tmp_path / "bench.json"
    r = run_in_process(["bench", CFG, "--device", "cpu", "--batch", "4", "--train", "--layers",
                        "--repeats", "3", "--warmup", "1", "--json", out])
    assert r.code == 0, r.err
    figures = json.loads(out.read_text())
    assert figures["batch"] == 4 and figures["device"] == "cpu" and figures["repeats"] == 3
    assert figures["forward_ms"] > 0 and figures["train_step_ms"] > 0
    assert abs(figures["forward_images_per_s"] - 4000 / figures["forward_ms"]) < 1e-6 * 4000
    assert figures["peak_device_memory_bytes"] is None
    rows = figures["layers"]
    assert [row["type"] for row in rows] == ["convolutional", "maxpool", "convolutional",
                                             "maxpool", "convolutional", "convolutional",
                                             "avgpool", "softmax"]
    for key in ("forward_share", "backward_share"):
        assert abs(sum(row[key] for row in rows) - 1) < 1e-9
    assert all(row["forward_ms"] > 0 and row["backward_ms"] > 0 for row in rows)
    assert all((row["forward_tflops"] is not None and row["forward_tflops"] > 0)
               == (row["type"] == "convolutional") for row in rows)
    lines = r.out.splitlines()
    assert lines[0].startswith(f"{CFG}: batch 4, cpu,")
    assert lines[1].startswith("forward:") and "images/s" in lines[1]
    assert lines[2].startswith("  layers only:") and lines[3].startswith("  upload:")
    assert lines[4].startswith("  download:") and lines[5].startswith("training step:")
    assert figures["upload_bytes"] == 4 * 24 * 24 * 4 and figures["download_bytes"] == 4 * 10 * 4
    assert all(figures[k] > 0 for k in ("gpu_forward_ms", "upload_ms", "download_ms"))
    assert "peak device memory: not known (CPU)" in lines
    table = lines[lines.index("layer type            forward ms  share   backward ms  share  TFLOP/s") + 1:]
    assert len(table) == len(rows) + 1 and table[-1].startswith("total")


def test_bench_forward_only_has_no_backward_columns():
    r = run_in_process(["bench", CFG, "--device", "cpu", "--layers", "--repeats", "2"])
    assert r.code == 0, r.err
    assert "training step" not in r.out and "backward" not in r.out
    assert "layer type            forward ms  share  TFLOP/s" in r.out.splitlines()


def test_bench_json_refuses_to_overwrite_without_overwrite(tmp_path):
    out = tmp_path / "mine.json"
    out.write_text("keep me")
    r = run_in_process(["bench", CFG, "--device", "cpu", "--repeats", "1", "--json", out])
    assert r.code == 2
    assert r.err.strip() == (f"darknet-py: error: {out}: already exists; not replacing it "
                             f"(pass --overwrite to replace, or choose another output)")
    assert out.read_text() == "keep me"
    r = run_in_process(["bench", CFG, "--device", "cpu", "--repeats", "1", "--json", out,
                        "--overwrite"])
    assert r.code == 0 and json.loads(out.read_text())["repeats"] == 1


def test_numpy_timer_measures_the_wall_clock():
    timer = NumpyBackend().timer()
    timer.start()
    time.sleep(0.02)
    assert 0.02 <= timer.stop() < 1.0
