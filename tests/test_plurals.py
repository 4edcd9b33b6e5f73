"""Counts in messages take the noun's number: "1 malformed line", "2 malformed lines"
(they said "2 malformed line", "1 streams x 1 steps", "4 + 1 + 1 classes")."""

import pytest
from helpers import Lines
from test_cli import run_in_process

from darknet_py.cfg import CfgError, parse_cfg_text
from darknet_py.data.check import LabelProblem, LabelReport, problem_lines, summary_line
from darknet_py.network import Network
from darknet_py.plurals import counted
from darknet_py.rnn_text import train_text


def test_counted_takes_the_number_of_the_count():
    assert counted(1, "malformed line") == "1 malformed line"
    assert counted(2, "malformed line") == "2 malformed lines"
    assert counted(0, "image") == "0 images"
    assert counted(1, "box", "boxes") == "1 box" and counted(3, "box", "boxes") == "3 boxes"


def test_label_summary_counts_in_the_right_number():
    one = LabelReport(images=1, boxes=1, problems=[LabelProblem("a.txt", 2, "format", "bad")])
    assert summary_line(one) == "labels of 1 image: 1 box (1 line not counted); 1 malformed line"
    two = LabelReport(
        images=2,
        boxes=0,
        problems=[
            LabelProblem("a.txt", 1, "format", "bad"),
            LabelProblem("a.txt", 2, "format", "bad"),
            LabelProblem("b.txt", 1, "class", "bad"),
            LabelProblem("c.txt", 0, "missing", "gone"),
        ],
    )
    assert summary_line(two) == (
        "labels of 2 images: 0 boxes (3 lines not counted); 1 class "
        "id out of range; 2 malformed lines; 1 label file not found"
    )
    many = LabelReport(
        images=1, boxes=0, problems=[LabelProblem("a.txt", n, "class", "bad") for n in range(1, 13)]
    )
    assert problem_lines(many, shown=11)[11] == "... and 1 more class ids out of range"


def test_check_says_one_image_and_one_box(tmp_path):
    import cv2
    import numpy as np

    cv2.imwrite(str(tmp_path / "a.png"), np.zeros((8, 8, 3), np.uint8))
    (tmp_path / "a.txt").write_text("0 .5 .5 .2 .2\n0 .5 .5\n")
    (tmp_path / "train.list").write_text(f"{tmp_path}/a.png\n")
    (tmp_path / "one.names").write_text("thing\n")
    data = tmp_path / "one.data"
    data.write_text(f"classes=1\ntrain={tmp_path}/train.list\nnames={tmp_path}/one.names\n")
    r = run_in_process(["check", data, "--picture", "none", "--darknet", "alexeyab"], cwd=tmp_path)
    assert r.code == 1, r
    assert r.out.splitlines()[0] == (
        f"train: {tmp_path}/train.list: 1 image (0 missing), 1 label file (0 empty), 1 box"
    )
    assert r.err.splitlines()[-1] == (
        "darknet-py: warning: labels of 1 image: 1 box (1 line not counted); 1 malformed line"
    )


def test_rnn_train_says_one_stream_of_one_step(tmp_path):
    cfg = tmp_path / "one.cfg"
    cfg.write_text(
        "[net]\ninputs=128\nbatch=1\ntime_steps=1\nlearning_rate=0.1\n"
        "max_batches=1\n\n[rnn]\noutput=8\nactivation=leaky\n\n[connected]\n"
        "output=128\nactivation=linear\n\n[softmax]\n"
    )
    text = tmp_path / "t.txt"
    text.write_text("abc")
    log = Lines()
    train_text(str(cfg), str(text), backup_dir=str(tmp_path / "b"), device="cpu", log=log)
    assert log[0].endswith(f"inputs 128, 1 stream x 1 step, text {text}: 3 bytes")


def test_cfg_errors_count_one_channel_and_one_class():
    text = (
        "[net]\nwidth=8\nheight=8\nchannels=1\n\n[convolutional]\nfilters=1\nsize=1\n"
        "stride=1\nactivation=linear\n\n[yolo]\nmask=0,1,2\nanchors=1,1,2,2,3,3\n"
        "classes=1\nnum=3\n"
    )
    with pytest.raises(CfgError) as caught:
        Network(parse_cfg_text(text, "y.cfg"), "y.cfg", allocate=False)
    assert "gives 1 channel but 3 masked anchors x (4 + 1 + 1 class) need 18" in str(caught.value)
    steps = (
        "[net]\nwidth=8\nheight=8\nchannels=1\npolicy=steps\nsteps=10\nscales=.1,.2\n"
        "[convolutional]\nfilters=1\nsize=1\n"
    )
    with pytest.raises(CfgError, match="1 step but 2 scales"):
        Network(parse_cfg_text(steps, "s.cfg"), "s.cfg", allocate=False)
