"""The Python side of issue 21: no raw NumPy warnings from an untrained detector (item 4),
names (5), the API (6) and bad inputs (10)."""

import warnings

import numpy as np
import pytest
from test_dayone_labels import DETECTOR_CFG, GOOD

from darknet_py import load_network


def untrained_detector(tmp_path, size_bias=0.0):
    """The 2-class test detector with zero weights and its box-size outputs' biases at
    size_bias (1000: exp overflows as in an early checkpoint)."""
    cfg = tmp_path / "d.cfg"
    cfg.write_text(DETECTOR_CFG)
    net = load_network(str(cfg), None, device="cpu")
    conv = net.layers[0]
    weights = np.zeros_like(net.be.to_host(conv.weights))
    biases = np.zeros(21, np.float32)
    biases[[4, 11, 18]] = 5.0  # objectness: every cell sure of an object
    biases[[2, 3, 9, 10]] = size_bias  # w, h of the first two anchors
    conv.weights = net.be.from_host(weights.astype(np.float32))
    conv.biases = net.be.from_host(biases)
    net.params_changed()
    return net


def test_an_overflowing_box_gives_no_numpy_warning_and_is_dropped(tmp_path):
    net = untrained_detector(tmp_path, size_bias=1000.0)
    image = np.full((40, 60, 3), 90, np.uint8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dets = net.detect(image, thresh=0.1)
    # the first two anchors' boxes are infinite and dropped; the third anchor's remain
    assert dets and all(np.all(np.isfinite(d.box)) for d in dets)
    assert all(d.box[2] < 2 for d in dets)


# ---- the Python API (item 6) ------------------------------------------------------------
from test_cli import DOG, P1_CFG, P1_WEIGHTS, P2_CFG, P2_WEIGHTS, needs_shared  # noqa: E402


@needs_shared
def test_detect_on_a_list_is_batched_and_equals_one_at_a_time(tmp_path):
    import cv2

    net = load_network(str(P2_CFG), str(P2_WEIGHTS), device="cpu", engine="numpy")
    dog = cv2.imread(str(DOG))
    images = [str(DOG), dog[:300, :400].copy(), cv2.resize(dog, (200, 150))]
    one_by_one = [net.detect(image, thresh=0.4) for image in images]
    together = net.detect(images, thresh=0.4, batch=2)
    assert len(together) == 3
    for single, batched in zip(one_by_one, together):
        assert len(single) == len(batched) >= 1
        for a, b in zip(single, batched):
            assert a.class_id == b.class_id and a.score == pytest.approx(b.score, abs=1e-6)
            assert np.allclose(a.xyxy, b.xyxy, atol=1e-3)
    d = together[2][0]
    x, y, w, h = d.box
    assert d.xyxy == pytest.approx(
        ((x - w / 2) * 200, (y - h / 2) * 150, (x + w / 2) * 200, (y + h / 2) * 150)
    )
    assert repr(d).startswith(f"Detection(class {d.class_id} {d.score:.2f} xyxy=(")
    assert len(repr(d)) < 60


@needs_shared
def test_names_come_from_a_list_a_names_file_or_a_data_file(tmp_path, monkeypatch):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "three.names").write_text("cat\ndog\nbird\n")
    data = tmp_path / "sub" / "p2.data"
    data.write_text("classes=3\nnames=three.names\n")  # relative: beside the .data file
    monkeypatch.chdir(tmp_path)
    for names in (["cat", "dog", "bird"], str(tmp_path / "sub" / "three.names"), str(data)):
        net = load_network(str(P2_CFG), str(P2_WEIGHTS), device="cpu", names=names)
        assert net.names == ["cat", "dog", "bird"]
        assert net.detect(str(DOG), thresh=0.4)[0].name in net.names
        assert "Detection(" + net.detect(str(DOG), thresh=0.4)[0].name in repr(
            net.detect(str(DOG), thresh=0.4)[0]
        )


@needs_shared
def test_a_missing_names_file_says_which_data_file_named_it(tmp_path):
    from test_cli import run_in_process

    data = tmp_path / "coco.data"
    data.write_text("classes=3\nnames=data/nothere.names\n")
    r = run_in_process(
        ["detect", P2_CFG, P2_WEIGHTS, DOG, "--data", data, "--out", "none", "--device", "cpu"],
        cwd=tmp_path,
    )
    assert r.code == 2, r
    assert r.err.splitlines() == [
        f"darknet-py: error: data/nothere.names: names file not found (given as names= in {data})"
    ]


@needs_shared
def test_names_beside_the_weights_are_found_and_said(tmp_path):
    import shutil

    from test_cli import run_in_process

    weights = tmp_path / "p2.weights"
    shutil.copyfile(P2_WEIGHTS, weights)
    r = run_in_process(
        ["detect", P2_CFG, weights, DOG, "--out", "none", "--device", "cpu", "--thresh", "0.45"]
    )
    assert r.code == 0 and "no class names given" in r.err and r.out.count(": 5") >= 0, r
    (tmp_path / "p2.names").write_text("cat\ndog\nbird\n")
    r = run_in_process(
        ["detect", P2_CFG, weights, DOG, "--out", "none", "--device", "cpu", "--thresh", "0.45"]
    )
    assert r.code == 0, r
    assert f"darknet-py: note: class names from {tmp_path / 'p2.names'}" in r.err
    assert r.out.splitlines()[1].split(":")[0] in ("cat", "dog", "bird")


@needs_shared
def test_predict_takes_a_photo_or_says_what_it_takes():
    import cv2

    net = load_network(str(P2_CFG), str(P2_WEIGHTS), device="cpu", engine="numpy")
    from darknet_py import letterbox, load_image

    expected = net.predict(letterbox(load_image(str(DOG)), 96, 96)).copy()
    assert np.array_equal(net.predict(cv2.imread(str(DOG))), expected)
    assert np.array_equal(net.predict(str(DOG)), expected)
    with pytest.raises(
        ValueError,
        match=r"predict takes float32 images of shape \(N, 3, 96, "
        r"96\).*got shape \(576, 768, 3\)",
    ):
        net.predict(cv2.imread(str(DOG)).astype(np.float32))


@needs_shared
def test_api_refusals():
    with pytest.raises(ValueError, match="batch must be a whole number of at least 1, got 0"):
        load_network(str(P2_CFG), None, batch=0)
    net = load_network(str(P2_CFG), str(P2_WEIGHTS), device="cpu")
    with pytest.raises(ValueError, match="the network is a detector; use detect"):
        net.classify(str(DOG))
    classifier = load_network(str(P1_CFG), str(P1_WEIGHTS), device="cpu")
    with pytest.raises(ValueError, match="use classify"):
        classifier.detect(str(DOG))


# ---- bad inputs (item 10) --------------------------------------------------------------
def test_cfg_that_is_a_fifo_a_device_or_binary_is_one_line(tmp_path):
    import os

    from test_cli import run_in_process

    fifo = tmp_path / "pipe.cfg"
    os.mkfifo(fifo)
    binary = tmp_path / "nul.cfg"
    binary.write_bytes(b"[net]\nwidth=8\n\0\0")
    for cfg, words in (
        (fifo, "not a regular file"),
        ("/dev/zero", "not a regular file"),
        (binary, "nul.cfg:3: holds NUL bytes"),
    ):
        r = run_in_process(["info", cfg])
        assert r.code == 2 and len(r.err.splitlines()) == 1 and words in r.err, r


def test_a_huge_cfg_is_refused_without_reading_it_all(tmp_path):
    from darknet_py.cfg import MAX_CFG_BYTES, CfgError, parse_cfg

    big = tmp_path / "big.cfg"
    with open(big, "wb") as f:
        f.truncate(MAX_CFG_BYTES + 10)
    with pytest.raises(CfgError, match="larger than 16 MiB: not a Darknet cfg"):
        parse_cfg(big)


@needs_shared
def test_list_files_with_a_nul_byte_are_one_line(tmp_path):
    from test_cli import run_in_process
    from test_dayone_labels import make_dataset

    images = tmp_path / "images.txt"
    images.write_bytes(f"{DOG}\n{DOG}\0x\n".encode())
    r = run_in_process(["detect", P2_CFG, P2_WEIGHTS, images, "--device", "cpu"])
    assert r.code == 2 and r.err.splitlines() == [
        f"darknet-py: error: {images}:2: holds a NUL byte: not a list of image paths"
    ], r
    data = make_dataset(tmp_path, [GOOD])
    (tmp_path / "train.list").write_bytes(b"img0.png\n\0\n")
    r = run_in_process(["train", tmp_path / "d.cfg", data, "--device", "cpu"])
    assert r.code == 2 and "train.list:2: holds a NUL byte" in r.err, r


def test_save_weights_into_a_directory_names_it(tmp_path):
    from darknet_py import WeightsError

    net = untrained_detector(tmp_path)
    with pytest.raises(
        WeightsError, match=f"{tmp_path}: is a directory; give the weights file's name"
    ):
        net.save_weights(tmp_path)


def test_train_says_when_it_removes_a_stale_checkpoint_temporary(tmp_path):
    import os

    from test_cli import run_in_process
    from test_dayone_labels import make_dataset

    data = make_dataset(tmp_path, [GOOD, GOOD])
    stale = tmp_path / "backup" / ".weights-999999-abcdef12"
    stale.write_bytes(b"half a checkpoint")
    os.utime(stale, (1, 1))  # old, and its writer is long gone (a kill -9 mid-save)
    r = run_in_process(
        [
            "train",
            tmp_path / "d.cfg",
            data,
            "--max-batches",
            "1",
            "--workers",
            "0",
            "--device",
            "cpu",
            "--quiet",
        ]
    )
    assert r.code == 0, r
    assert f"darknet-py: note: removed {stale}, left by an interrupted save" in r.out
    assert not stale.exists()


def test_train_warnings_go_to_stderr_with_the_others(tmp_path):
    from test_cli import run_in_process
    from test_dayone_labels import make_dataset

    data = make_dataset(tmp_path, [GOOD, "0 1.2 .5 .1 .1\n"])
    cfg = tmp_path / "d.cfg"
    cfg.write_text(
        DETECTOR_CFG.replace("max_batches=10", "max_batches=10\npolicy=steps\nsteps=100\nscales=.1")
    )
    r = run_in_process(
        ["train", cfg, data, "--max-batches", "1", "--workers", "0", "--device", "cpu", "--quiet"]
    )
    assert r.code == 0, r
    assert "darknet-py: warning" not in r.out, r
    warnings = r.err.splitlines()
    assert any(
        w.startswith(f"darknet-py: warning: {cfg}: steps=100 at or beyond") for w in warnings
    ), r
    assert any(
        w.startswith("darknet-py: warning: ") and "img1.txt:1: x=1.2" in w for w in warnings
    ), r


def test_a_numpy_warning_in_a_command_is_one_warning_line(monkeypatch):
    import click
    from test_cli import run_in_process

    from darknet_py import cli as cli_module

    @cli_module.cli.command("overflow-for-test")
    def overflow():
        np.exp(np.float32(1000))
        click.echo("done")

    try:
        r = run_in_process(["overflow-for-test"])
    finally:
        del cli_module.cli.commands["overflow-for-test"]
    assert r.code == 0 and r.out == "done\n", r
    import re

    assert re.fullmatch(
        r"darknet-py: warning: overflow encountered in exp "
        r"\(test_dayone_api\.py:\d+\)\n",
        r.err,
    ), r
