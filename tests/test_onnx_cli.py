"""`darknet-py export` and `--engine onnxruntime` from the command line: the file written
and checked, the refusals (an existing OUT, a layer ONNX cannot express, onnx or
onnxruntime missing) as one line and exit 2, and the real COCO yolov3-tiny weights giving the same
detections on the four photos through ONNX Runtime as through NumPy."""

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from darknet_py.cli import cli

pytest.importorskip("onnx", reason="onnx is not installed (pip install onnx onnxruntime)")
pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")

from helpers import digit_set, untrained_detector  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
TINY_CFG = SHARED / "darknet-cfg" / "yolov3-tiny.cfg"
TINY_WEIGHTS = SHARED / "weights" / "yolov3-tiny.weights"
COCO_NAMES = SHARED / "weights" / "coco.names"
PHOTOS = [SHARED / "images" / f"{n}.jpg" for n in ("dog", "eagle", "horses", "person")]
needs_weights = pytest.mark.skipif(
    not TINY_WEIGHTS.is_file(), reason=f"the real weights are not at {TINY_WEIGHTS}"
)


def invoke(args):
    try:
        runner = CliRunner(mix_stderr=False)
    except TypeError:  # click >= 8.2 keeps them apart anyway
        runner = CliRunner()
    r = runner.invoke(cli, [str(a) for a in args])
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise r.exception
    return r


def assert_one_error_line(r, *fragments):
    assert r.exit_code == 2, (r.stdout, r.stderr)
    errors = [l for l in r.stderr.splitlines() if l.startswith("darknet-py: error: ")]
    assert len(errors) == 1 and "Traceback" not in r.stderr, r.stderr
    for fragment in fragments:
        assert fragment in errors[0], errors[0]


@needs_weights
def test_export_writes_a_checked_model_with_metadata_and_keeps_an_existing_out(tmp_path):
    import onnx

    out = tmp_path / "tiny.onnx"
    r = invoke(
        [
            "export",
            TINY_CFG,
            TINY_WEIGHTS,
            out,
            "--nms",
            "--names",
            COCO_NAMES,
            "--image",
            PHOTOS[0],
            "--dynamic-batch",
        ]
    )
    assert r.exit_code == 0, (r.stdout, r.stderr)
    checks = [l for l in r.stdout.splitlines() if l.startswith("check: ONNX Runtime against")]
    assert len(checks) == 2 and str(PHOTOS[0]) in checks[1]
    assert all(float(l.split("difference ")[1].split()[0]) < 1e-4 for l in checks)
    model = onnx.load(str(out))
    onnx.checker.check_model(model)
    meta = {p.key: p.value for p in model.metadata_props}
    assert json.loads(meta["names"])[16] == "dog"
    assert (meta["input_width"], meta["letterbox"], meta["darknet"]) == ("416", "true", "original")
    assert [o.name for o in model.graph.output] == [
        "yolo_16",
        "yolo_23",
        "boxes",
        "scores",
        "selected",
    ]
    before = out.read_bytes()
    again = invoke(["export", TINY_CFG, TINY_WEIGHTS, out, "--no-check"])
    assert_one_error_line(again, str(out), "--overwrite")
    assert out.read_bytes() == before
    assert (
        invoke(
            ["export", TINY_CFG, TINY_WEIGHTS, out, "--no-check", "--overwrite", "--batch", "2"]
        ).exit_code
        == 0
    )
    assert onnx.load(str(out)).graph.input[0].type.tensor_type.shape.dim[0].dim_value == 2


def test_export_refuses_a_layer_onnx_cannot_express(tmp_path):
    from darknet_py.network import load_network

    cfg = tmp_path / "pool.cfg"
    cfg.write_text(
        "[net]\nwidth=9\nheight=9\nchannels=3\n[convolutional]\nfilters=4\n"
        "size=3\npad=1\nactivation=leaky\n[local_avgpool]\nsize=2\nstride=2\n"
        "padding=4\n"
    )
    weights = tmp_path / "pool.weights"
    load_network(str(cfg)).save_weights(str(weights))
    r = invoke(["export", cfg, weights, tmp_path / "pool.onnx"])
    assert_one_error_line(r, "layer 1 [local_avgpool]", "padding=4")
    assert not (tmp_path / "pool.onnx").exists()
    r = invoke(["export", cfg, weights, tmp_path / "x.onnx", "--batch", "2", "--dynamic-batch"])
    assert r.exit_code == 2 and "not both" in r.stderr


@pytest.mark.parametrize("module", ["onnx", "onnxruntime"])
def test_a_missing_package_is_one_line_naming_the_pip_command(tmp_path, monkeypatch, module):
    cfg, weights = untrained_detector(tmp_path)
    monkeypatch.setitem(sys.modules, module, None)  # import fails as if not installed
    r = invoke(["export", cfg, weights, tmp_path / "d.onnx"])
    assert_one_error_line(r, f"{module} is not installed", "pip install onnx onnxruntime")
    assert not (tmp_path / "d.onnx").exists()
    if module == "onnxruntime":
        r = invoke(["detect", cfg, weights, PHOTOS[0], "--engine", "onnxruntime", "--out", "none"])
        assert_one_error_line(r, "onnxruntime is not installed")


@needs_weights
def test_engine_onnxruntime_gives_numpys_detections_on_the_four_photos(tmp_path):
    found = {}
    for engine in ("numpy", "onnxruntime"):
        out = tmp_path / f"{engine}.json"
        r = invoke(
            [
                "detect",
                TINY_CFG,
                TINY_WEIGHTS,
                *PHOTOS,
                "--thresh",
                "0.25",
                "--out",
                "none",
                "--json",
                out,
                "--names",
                COCO_NAMES,
                "--device",
                "cpu",
                "--engine",
                engine,
            ]
        )
        assert r.exit_code == 0, (r.stdout, r.stderr)
        found[engine] = json.loads(out.read_text())["images"]
    count = 0
    for want, got in zip(found["numpy"], found["onnxruntime"]):
        assert [d["name"] for d in got["detections"]] == [d["name"] for d in want["detections"]]
        for a, b in zip(got["detections"], want["detections"]):
            assert a["box"] == b["box"] and abs(a["prob"] - b["prob"]) < 1e-4
            count += 1
    assert count >= 10  # dog.jpg alone has 6 (the C Darknet's: dog, car, truck, ...)


def test_engine_onnxruntime_serves_map_valid_test_and_bench(tmp_path):
    cfg, weights = untrained_detector(tmp_path)
    data = digit_set(tmp_path / "set", 1, 4)
    reports = {}
    for engine in ("numpy", "onnxruntime"):
        r = invoke(["map", cfg, data, weights, "--device", "cpu", "--engine", engine])
        assert r.exit_code == 0, (r.stdout, r.stderr)
        v = invoke(
            [
                "valid",
                cfg,
                data,
                weights,
                "--device",
                "cpu",
                "--engine",
                engine,
                "--results-dir",
                tmp_path / engine,
            ]
        )
        assert v.exit_code == 0, (v.stdout, v.stderr)
        reports[engine] = (r.stdout.splitlines()[-1], v.stdout.splitlines()[-1])
    assert reports["onnxruntime"] == reports["numpy"]
    from darknet_py.network import load_network

    classifier = REPO / "cfg" / "digits-classifier.cfg"
    cweights = tmp_path / "digits.weights"
    load_network(str(classifier), seed=2).save_weights(str(cweights))
    import cv2
    import numpy as np

    image = tmp_path / "noise.png"  # not ../shared: this test runs without it
    cv2.imwrite(str(image), np.random.default_rng(0).integers(0, 256, (30, 20, 3), np.uint8))
    tops = [
        invoke(
            ["test", classifier, cweights, image, "--engine", engine, "--device", "cpu"]
        ).stdout.splitlines()[1:]
        for engine in ("numpy", "onnxruntime")
    ]
    assert tops[0] and tops[0] == tops[1]
    b = invoke(["bench", cfg, "--engine", "onnxruntime", "--repeats", "2", "--warmup", "1"])
    assert b.exit_code == 0 and "cpu (onnxruntime)" in b.stdout, (b.stdout, b.stderr)
    refused = invoke(["bench", cfg, "--engine", "onnxruntime", "--train"])
    assert_one_error_line(refused, "--train")


def test_a_missing_image_is_refused_before_anything_is_written(tmp_path):
    cfg, weights = untrained_detector(tmp_path)
    r = invoke(["export", cfg, weights, tmp_path / "d.onnx", "--image", tmp_path / "no.jpg"])
    assert_one_error_line(r, "no.jpg", "not found")
    assert not (tmp_path / "d.onnx").exists()
