"""`darknet-py bench`: the report, the per-layer table, --json and its refusal to overwrite."""

import json
import time
from pathlib import Path

import numpy as np
from test_cli import run_in_process

from darknet_py.backends.numpy_backend import NumpyBackend

CFG = Path(__file__).resolve().parents[1] / "cfg" / "digits-classifier.cfg"


def test_bench_reports_forward_training_and_every_layer(tmp_path):
    out = tmp_path / "bench.json"
    r = run_in_process(
        [
            "bench",
            CFG,
            "--device",
            "cpu",
            "--batch",
            "4",
            "--train",
            "--layers",
            "--repeats",
            "3",
            "--warmup",
            "1",
            "--json",
            out,
        ]
    )
    assert r.code == 0, r.err
    figures = json.loads(out.read_text())
    assert figures["batch"] == 4 and figures["device"] == "cpu" and figures["repeats"] == 3
    assert figures["forward_ms"] > 0 and figures["train_step_ms"] > 0
    assert abs(figures["forward_images_per_s"] - 4000 / figures["forward_ms"]) < 1e-6 * 4000
    assert figures["peak_device_memory_bytes"] is None
    rows = figures["layers"]
    assert [row["type"] for row in rows] == [
        "convolutional",
        "maxpool",
        "convolutional",
        "maxpool",
        "convolutional",
        "convolutional",
        "avgpool",
        "softmax",
    ]
    for key in ("forward_share", "backward_share"):
        assert abs(sum(row[key] for row in rows) - 1) < 1e-9
    assert all(row["forward_ms"] > 0 and row["backward_ms"] > 0 for row in rows)
    assert all(
        (row["forward_tflops"] is not None and row["forward_tflops"] > 0)
        == (row["type"] == "convolutional")
        for row in rows
    )
    lines = r.out.splitlines()
    assert lines[0].startswith(f"{CFG}: batch 4, cpu,")
    assert lines[1].startswith("forward:") and "images/s" in lines[1]
    assert lines[2].startswith("  layers only:") and lines[3].startswith("  upload:")
    assert lines[4].startswith("  download:") and lines[5].startswith("training step:")
    assert figures["upload_bytes"] == 4 * 24 * 24 * 4 and figures["download_bytes"] == 4 * 10 * 4
    assert all(figures[k] > 0 for k in ("gpu_forward_ms", "upload_ms", "download_ms"))
    assert "peak device memory: not known (CPU)" in lines
    table = lines[
        lines.index("layer type            forward ms  share   backward ms  share  TFLOP/s") + 1 :
    ]
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
    assert r.err.strip() == (
        f"darknet-py: error: {out}: already exists; not replacing it "
        f"(pass --overwrite to replace, or choose another output)"
    )
    assert out.read_text() == "keep me"
    r = run_in_process(
        ["bench", CFG, "--device", "cpu", "--repeats", "1", "--json", out, "--overwrite"]
    )
    assert r.code == 0 and json.loads(out.read_text())["repeats"] == 1


def test_numpy_timer_measures_the_wall_clock():
    timer = NumpyBackend().timer()
    timer.start()
    time.sleep(0.02)
    assert 0.02 <= timer.stop() < 1.0


RECURRENT_CFG = """[net]
inputs=6
batch=4
time_steps=4

[{kind}]
output=5
batch_normalize=1
activation=leaky

[connected]
output=6
activation=linear

[softmax]
"""

CRNN_CFG = """[net]
width=4
height=4
channels=2
batch=4
time_steps=4

[crnn]
output_filters=3
hidden_filters=3
batch_normalize=1
activation=leaky

[connected]
output=5
activation=linear

[softmax]
"""


def test_bench_trains_recurrent_layers_with_batch_norm(tmp_path):
    """The inner layers' rolling statistics get bench's plausible values (the recurrent
    layer itself has none): a training step is timed, not a traceback."""
    for kind in ("rnn", "gru", "lstm", "crnn"):
        cfg = tmp_path / f"{kind}.cfg"
        cfg.write_text(CRNN_CFG if kind == "crnn" else RECURRENT_CFG.format(kind=kind))
        out = tmp_path / f"{kind}.json"
        r = run_in_process(
            [
                "bench",
                cfg,
                "--device",
                "cpu",
                "--batch",
                "4",
                "--train",
                "--repeats",
                "1",
                "--warmup",
                "0",
                "--json",
                out,
            ]
        )
        assert r.code == 0, (kind, r.err)
        figures = json.loads(out.read_text())
        assert figures["train_step_ms"] > 0 and figures["forward_ms"] > 0


def test_bench_prepare_sets_inner_batch_norm_statistics(tmp_path):
    from darknet_py.bench import prepare
    from darknet_py.network import load_network

    cfg = tmp_path / "lstm.cfg"
    cfg.write_text(RECURRENT_CFG.format(kind="lstm"))
    net = load_network(str(cfg), batch=4, device="cpu")
    prepare(net)
    inner = net.layers[0].param_owners()
    assert len(inner) == 8
    for layer in inner:  # fresh ones are 0 and 1: prepare draws in [0.5, 2] for variance
        assert np.all(layer.rolling_variance >= 0.5) and np.all(layer.rolling_variance <= 2)
        assert np.any(layer.rolling_mean != 0)


def test_bench_refuses_a_batch_that_does_not_split_into_time_steps(tmp_path):
    cfg = tmp_path / "rnn.cfg"
    cfg.write_text(RECURRENT_CFG.format(kind="rnn"))
    r = run_in_process(
        ["bench", cfg, "--device", "cpu", "--batch", "6", "--repeats", "1", "--warmup", "0"]
    )
    assert r.code == 2 and "Traceback" not in r.err
    assert r.err.strip().splitlines() == [
        f"darknet-py: error: {cfg}: layer 0 [rnn] runs time_steps=4: give --batch a multiple "
        f"of 4 (--batch 4 is one sequence), not 6"
    ]
