"""`detect` on a video file or a camera: darknet_py/video.py, Darknet's `detector demo`."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest
from click.testing import CliRunner
from helpers import untrained_detector
from test_real_weights import SHARED, WEIGHTS, needs_real_weights

from darknet_py.cli import cli
from darknet_py.network import load_network
from darknet_py.video import run_video


def write_video(path, frames, fps=5):
    h, w = frames[0].shape[:2]
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), fps, (w, h))
    assert writer.isOpened()
    for frame in frames:
        writer.write(frame)
    writer.release()


def read_video(path):
    capture = cv2.VideoCapture(str(path))
    frames = []
    while True:
        ok, frame = capture.read()
        if not ok:
            break
        frames.append(frame)
    capture.release()
    return frames


def dog_frames(count=4):
    """The dog photo panning right a few pixels a frame, at 320x240."""
    dog = cv2.resize(cv2.imread(str(SHARED / "images" / "dog.jpg")), (336, 240))
    return [np.ascontiguousarray(dog[:, 4 * i : 4 * i + 320]) for i in range(count)]


@pytest.fixture()
def tiny(tmp_path):
    cfg, weights = untrained_detector(tmp_path)
    video = tmp_path / "in.mp4"
    rng = np.random.default_rng(0)
    write_video(video, [rng.integers(0, 255, (48, 64, 3), dtype=np.uint8) for _ in range(5)])
    return cfg, weights, video


@needs_real_weights
def test_video_frames_are_written_with_boxes_and_progress(tmp_path):
    source, out = tmp_path / "walk.mp4", tmp_path / "boxes.mp4"
    write_video(source, dog_frames(4))
    result = CliRunner().invoke(
        cli,
        [
            "detect",
            str(SHARED / "darknet-cfg" / "yolov3-tiny.cfg"),
            str(WEIGHTS / "yolov3-tiny.weights"),
            str(source),
            "--out",
            str(out),
            "--names",
            str(WEIGHTS / "coco.names"),
            "--device",
            "cpu",
            "--thresh",
            "0.25",
        ],
    )
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert [line.split(":")[0] for line in lines[:4]] == [
        "frame 1/4 (25%)",
        "frame 2/4 (50%)",
        "frame 3/4 (75%)",
        "frame 4/4 (100%)",
    ]
    assert all(" FPS, " in line and "dog" in line for line in lines[:4])
    assert lines[-1].startswith("4 frames in ") and lines[-1].endswith(f"wrote {out}")
    written, originals = read_video(out), read_video(source)
    assert len(written) == 4 and written[0].shape == (240, 320, 3)
    for drawn, original in zip(written, originals):
        # Box outlines and label patches: many pixels far from the source frame (the
        # codec's own differences stay well below 80 levels).
        changed = (np.abs(drawn.astype(int) - original.astype(int)).max(axis=2) > 80).sum()
        assert changed > 500, changed
    assert not [f for f in os.listdir(tmp_path) if f.startswith(".")]


def test_an_existing_out_is_kept(tiny, tmp_path):
    cfg, weights, video = tiny
    out = tmp_path / "out.mp4"
    out.write_bytes(b"an earlier result")
    result = CliRunner().invoke(
        cli, ["detect", cfg, weights, str(video), "--out", str(out), "--device", "cpu"]
    )
    assert result.exit_code == 2
    assert result.output == (
        f"darknet-py: error: {out}: already exists; not replacing it "
        f"(pass --overwrite to replace, or choose another output)\n"
    )
    assert out.read_bytes() == b"an earlier result"


@pytest.mark.parametrize("flavour", ["alexeyab", "original"])
def test_video_follows_the_darknet_option(tiny, tmp_path, monkeypatch, flavour):
    import darknet_py.video

    loaded = []

    def recording_load_network(*args, **kwargs):
        net = load_network(*args, **kwargs)
        loaded.append(net.darknet)
        return net

    monkeypatch.setattr(darknet_py.video, "load_network", recording_load_network)
    cfg, weights, video = tiny
    out = tmp_path / "out.mp4"
    result = CliRunner().invoke(
        cli,
        [
            "detect",
            cfg,
            weights,
            str(video),
            "--out",
            str(out),
            "--device",
            "cpu",
            "--darknet",
            flavour,
        ],
    )
    assert result.exit_code == 0, result.output
    assert loaded == [flavour]
    assert len(read_video(out)) == 5


@pytest.mark.parametrize(
    "content,message",
    [(None, "video file not found"), (b"not a video at all", "cannot open it as a video")],
)
def test_an_unreadable_video_is_one_line_naming_it(tiny, tmp_path, content, message):
    cfg, weights, _ = tiny
    video = tmp_path / "broken.mp4"
    if content is not None:
        video.write_bytes(content)
    result = CliRunner().invoke(
        cli,
        ["detect", cfg, weights, str(video), "--out", str(tmp_path / "out.mp4"), "--device", "cpu"],
    )
    assert result.exit_code == 2
    assert result.output.startswith(f"darknet-py: error: {video}: {message}")
    assert result.output.count("\n") == 1
    assert not (tmp_path / "out.mp4").exists()


def test_ctrl_c_finishes_a_valid_video_of_the_frames_done(tiny, tmp_path):
    cfg, weights, video = tiny
    net = load_network(cfg, weights)
    out = tmp_path / "part.mp4"

    def stop_after_2(index, detections):
        if index == 2:
            raise KeyboardInterrupt

    lines = []
    result = run_video(
        net, str(video), str(out), thresh=0.9, log=lines.append, on_frame=stop_after_2
    )
    assert result.interrupted and result.frames == 2 and result.out == str(out)
    assert len(read_video(out)) == 2  # a playable file with both frames
    assert lines[-1].startswith("2 frames in ") and "interrupted" in lines[-1]


def test_sigint_to_the_command_leaves_a_playable_video(tiny, tmp_path):
    cfg, weights, _ = tiny
    long_video, out = tmp_path / "long.mp4", tmp_path / "stopped.mp4"
    frame = np.random.default_rng(1).integers(0, 255, (48, 64, 3), dtype=np.uint8)
    write_video(long_video, [frame] * 400)
    command = [
        sys.executable,
        "-m",
        "darknet_py",
        "detect",
        cfg,
        weights,
        str(long_video),
        "--out",
        str(out),
        "--device",
        "cpu",
    ]
    with subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[1],
    ) as proc:
        assert proc.stdout.readline().startswith("frame 1/400 (0%): ")
        proc.send_signal(signal.SIGINT)  # what Ctrl-C sends
        stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    last = stdout.strip().splitlines()[-1]
    assert "interrupted" in last and last.endswith(f"wrote {out}")
    frames = int(last.split()[0])
    assert 1 <= frames < 400 and len(read_video(out)) == frames


def test_video_options_that_do_not_fit(tiny, tmp_path):
    cfg, weights, video = tiny
    runner = CliRunner()
    for extra, message in (
        (["--camera", "0"], "give a video file or --camera N, not both"),
        (["--out", str(tmp_path / "frame.jpg")], "needs a video extension"),
    ):
        result = runner.invoke(cli, ["detect", cfg, weights, str(video), "--device", "cpu"] + extra)
        assert result.exit_code == 2 and message in result.output, result.output


@pytest.mark.skipif(os.path.exists("/dev/video0"), reason="this machine has a camera")
def test_a_missing_camera_is_one_line(tiny, tmp_path):
    cfg, weights, _ = tiny
    result = CliRunner().invoke(
        cli,
        [
            "detect",
            cfg,
            weights,
            "--camera",
            "0",
            "--out",
            str(tmp_path / "cam.mp4"),
            "--device",
            "cpu",
        ],
    )
    assert result.exit_code == 2
    assert result.output.startswith("darknet-py: error: camera 0: cannot open the camera")
