"""Label checks (issue 21, item 1): pixel coordinates, > 1, negative, classes out of range;
one warning line per problem naming file and line, a summary count, and train/anchors
refusing a dataset whose boxes are mostly pixels, pointing at the fix."""

import numpy as np
import pytest
from test_cli import run_in_process

from darknet_py.data.check import problem_lines, refuse_pixel_labels, scan_labels
from darknet_py.data.config import DataError

DETECTOR_CFG = """[net]
batch=2
width=32
height=32
channels=3
max_batches=10

[convolutional]
filters=21
size=1
stride=1
activation=linear

[yolo]
mask=0,1,2
anchors=4,4, 8,8, 16,16
classes=2
num=3
"""


def make_dataset(root, labels, classes=2):
    """A .data file over one small image per label text (the same picture each time)."""
    import cv2

    image = np.full((32, 48, 3), 120, np.uint8)
    lines = []
    for i, text in enumerate(labels):
        path = root / f"img{i}.png"
        cv2.imwrite(str(path), image)
        (root / f"img{i}.txt").write_text(text)
        lines.append(str(path))
    (root / "train.list").write_text("\n".join(lines) + "\n")
    (root / "two.names").write_text("cat\ndog\n"[: 4 * classes])
    data = root / "set.data"
    data.write_text(
        f"classes={classes}\ntrain={root}/train.list\nvalid={root}/train.list\n"
        f"names={root}/two.names\nbackup={root}/backup\n"
    )
    (root / "backup").mkdir()
    (root / "d.cfg").write_text(DETECTOR_CFG)
    return data


GOOD = "0 0.5 0.5 0.2 0.3\n1 0.25 0.4 0.1 0.1\n"


def test_scan_names_every_kind_by_file_and_line(tmp_path):
    make_dataset(
        tmp_path,
        [
            GOOD,
            "0 22 63 24 16\n0 .5 .5 .1 .1\n",
            "1 1.2 .5 .1 .1\n",
            "0 -.1 .5 .1 .1\n",
            "5 .5 .5 .1 .1\n",
            "0 .5 .5 0 .1\nbad\n",
        ],
    )
    paths = [str(tmp_path / f"img{i}.png") for i in range(6)] + [str(tmp_path / "no.png")]
    report = scan_labels(paths, classes=2)
    kinds = {(p.path.rsplit("/", 1)[-1], p.line, p.kind) for p in report.problems}
    assert kinds == {
        ("img1.txt", 1, "pixels"),
        ("img2.txt", 1, "range"),
        ("img3.txt", 1, "range"),
        ("img4.txt", 1, "class"),
        ("img5.txt", 1, "size"),
        ("img5.txt", 2, "format"),
        ("no.txt", 0, "missing"),
    }
    # a class id out of range, a box without size and a malformed line are no box
    assert report.boxes == 6 and report.per_class == {0: 4, 1: 2}
    lines = problem_lines(report)
    assert any(
        line.endswith(
            "img1.txt:1: x=22 y=63 w=24 h=16 look like pixels; YOLO labels "
            "are relative: divide x and w by the image width, y and h by its "
            "height (each 0-1)"
        )
        for line in lines
    ), lines
    assert lines[-1] == (
        "labels of 7 images: 6 boxes (3 lines not counted); 1 class id out "
        "of range; 1 malformed line; 1 label file not found; 1 box whose "
        "coordinates look like pixels (YOLO labels are 0-1); 2 boxes with "
        "coordinates outside 0-1; 1 box of zero or negative size"
    )
    refuse_pixel_labels(report)  # 1 of 9: a warning, not a refusal


def test_many_problems_are_capped_and_counted(tmp_path):
    make_dataset(tmp_path, ["0 1.3 .5 .1 .1\n" * 25])
    lines = problem_lines(scan_labels([str(tmp_path / "img0.png")], 2))
    assert len(lines) == 12 and lines[10] == "... and 15 more boxes with coordinates outside 0-1"
    assert lines[9].endswith(
        "img0.txt:10: x=1.3 y=.5 w=.1 h=.1: outside 0-1 (Darknet clips the box to the image)"
    )


def test_mostly_pixel_boxes_are_refused_with_the_fix(tmp_path):
    make_dataset(tmp_path, ["0 22 63 24 16\n", "1 40 10 8 8\n", GOOD])
    report = scan_labels([str(tmp_path / f"img{i}.png") for i in range(3)], 2)
    refuse_pixel_labels(report)  # 2 of 4: half is not most
    report = scan_labels([str(tmp_path / f"img{i}.png") for i in range(2)], 2)
    with pytest.raises(
        DataError,
        match=r"2 of the 2 boxes in the training labels look like "
        r"pixel coordinates \(first: .*img0.txt:1\); YOLO labels "
        r"are relative: divide x and w",
    ):
        refuse_pixel_labels(report)


def test_train_refuses_pixel_labels_before_writing_anything(tmp_path):
    data = make_dataset(tmp_path, ["0 22 63 24 16\n", "1 40 10 8 8\n"])
    r = run_in_process(["train", tmp_path / "d.cfg", data, "--device", "cpu"])
    assert r.code == 2, r
    assert "Traceback" not in r.err
    assert r.err.count("look like pixels;") == 2  # one warning line per box
    assert "img0.txt:1: x=22 y=63 w=24 h=16 look like pixels" in r.err
    error = r.err.strip().splitlines()[-1]
    assert error.startswith(
        "darknet-py: error: 2 of the 2 boxes in the training labels look like pixel coordinates"
    ), r
    assert "divide x and w by the image width" in error
    assert list((tmp_path / "backup").iterdir()) == []


def test_anchors_warns_about_a_stray_pixel_box_and_refuses_pixel_datasets(tmp_path):
    data = make_dataset(tmp_path, [GOOD, GOOD, "0 22 63 24 16\n" + GOOD])
    r = run_in_process(["anchors", data, "--num", "2"])
    assert r.code == 0, r
    assert r.out.startswith("anchors = ")
    warnings = [l for l in r.err.splitlines() if l.startswith("darknet-py: warning: ")]
    assert len(warnings) == 2, r
    assert warnings[0].endswith(
        "img2.txt:1: x=22 y=63 w=24 h=16 look like pixels; YOLO labels "
        "are relative: divide x and w by the image width, y and h by "
        "its height (each 0-1)"
    )
    assert warnings[1].endswith(
        "labels of 3 images: 7 boxes; 1 box whose coordinates look "
        "like pixels (YOLO labels are 0-1)"
    )
    (tmp_path / "x").mkdir()
    bad = make_dataset(tmp_path / "x", ["0 22 63 24 16\n", "1 40 10 8 8\n"])
    r = run_in_process(["anchors", bad, "--num", "2"])
    assert r.code == 2 and "look like pixel coordinates" in r.err.splitlines()[-1], r


# ---- `check` (item 9) ---------------------------------------------------------------------
def test_check_reports_lists_classes_problems_and_writes_the_overview(tmp_path):
    data = make_dataset(tmp_path, [GOOD, "0 22 63 24 16\n", "5 .5 .5 .1 .1\n", GOOD])
    with open(tmp_path / "train.list", "a") as f:
        f.write(f"{tmp_path}/gone.png\n")
    r = run_in_process(["check", data], cwd=tmp_path)
    assert r.code == 1, r
    assert r.out.splitlines() == [
        f"train: {tmp_path}/train.list: 5 images (1 missing), 4 label files (0 empty), 5 boxes",
        "class  name                   train",
        "    0  cat                        3",
        "    1  dog                        2",
        "wrote set_labels.png (boxes per class, box centres and sizes)",
        "4 problems found",
    ]
    warnings = r.err.splitlines()
    assert (
        f"darknet-py: warning: {tmp_path}/img1.txt:1: x=22 y=63 w=24 h=16 look like pixels; "
        f"YOLO labels are relative: divide x and w by the image width, y and h by its "
        f"height (each 0-1)" in warnings
    )
    assert f"darknet-py: warning: {tmp_path}/img2.txt:1: class id 5 out of range (0..1)" in warnings
    assert (
        f"darknet-py: warning: {tmp_path}/gone.png: image not found (listed in "
        f"{tmp_path}/train.list)" in warnings
    )
    import cv2

    picture = cv2.imread(str(tmp_path / "set_labels.png"))
    assert picture.shape == (520, 1380, 3)
    # the bars: class 0's (3 boxes) is the full height, class 1's (2) two thirds of it
    blue = np.abs(picture.astype(int) - (180, 100, 30)).sum(axis=2) < 10
    heights = [blue[:, x].sum() for x in (70 + 95, 70 + 285)]
    assert heights[0] == pytest.approx(330, abs=3) and heights[1] == pytest.approx(220, abs=3)
    # a second check does not replace the first picture
    r = run_in_process(["check", data], cwd=tmp_path)
    assert "wrote set_labels-2.png" in r.out


def test_check_counts_a_malformed_line_in_no_total(tmp_path):
    """Issue 28: 82 boxes where the class table summed to 81. A malformed line (and a class
    id out of range) is a warning naming file and line, and no box: totals and table agree."""
    data = make_dataset(tmp_path, [GOOD, "1 .5 .5 .1\n0 .3 .3 .1 .1\n", "0 .5 .5 .1 oops\n"])
    r = run_in_process(["check", data, "--picture", "none"], cwd=tmp_path)
    assert r.code == 1, r
    assert r.out.splitlines() == [
        f"train: {tmp_path}/train.list: 3 images (0 missing), 3 label files (0 empty), 3 boxes",
        "class  name                   train",
        "    0  cat                        2",
        "    1  dog                        1",
        "2 problems found",
    ]
    assert r.err.splitlines() == [
        f"darknet-py: warning: {tmp_path}/img1.txt:1: expected 'class x y w h' (5 fields), got 4",
        f"darknet-py: warning: {tmp_path}/img2.txt:1: expected a whole class id and 4 numbers, "
        f"got '0 .5 .5 .1 oops'",
        "darknet-py: warning: labels of 3 images: 3 boxes (2 lines not counted); 2 malformed lines",
    ], r


def test_check_of_a_sound_dataset_exits_0(tmp_path):
    data = make_dataset(tmp_path, [GOOD, GOOD])
    r = run_in_process(["check", data, "--picture", "none"], cwd=tmp_path)
    assert r.code == 0 and r.out.splitlines()[-1] == "no problems found" and r.err == "", r


def test_anchors_takes_num_and_size_from_the_cfg(tmp_path):
    data = make_dataset(tmp_path, [GOOD, "0 0.4 0.4 0.6 0.5\n1 .5 .5 .05 .1\n"])
    r = run_in_process(["anchors", data, "--cfg", tmp_path / "d.cfg"])
    ours = run_in_process(["anchors", data, "--num", "3", "--width", "32", "--height", "32"])
    assert r.code == ours.code == 0, (r, ours)
    assert r.out == ours.out and len(r.out.split(", ")) == 3  # 3 anchors: "w,h, w,h, w,h"
    assert f"darknet-py: note: num=3, width=32, height=32 from {tmp_path / 'd.cfg'}" in r.err
    r = run_in_process(["anchors", data, "--cfg", tmp_path / "d.cfg", "--num", "2"])
    assert len(r.out.split(", ")) == 2, r


def test_check_of_a_classifier_dataset_counts_images_per_class(tmp_path):
    import cv2

    for name in ("cat_1", "cat_2", "dog_1", "bird_x"):
        cv2.imwrite(str(tmp_path / f"{name}.png"), np.zeros((8, 8, 3), np.uint8))
    (tmp_path / "train.list").write_text(
        "".join(f"{tmp_path}/{n}.png\n" for n in ("cat_1", "cat_2", "dog_1", "bird_x"))
    )
    (tmp_path / "labels.txt").write_text("cat\ndog\n")
    data = tmp_path / "c.data"
    data.write_text(f"classes=2\ntrain={tmp_path}/train.list\nlabels={tmp_path}/labels.txt\n")
    r = run_in_process(["check", data], cwd=tmp_path)
    assert r.code == 1, r
    assert r.out.splitlines() == [
        f"train: {tmp_path}/train.list: 4 images (0 missing)",
        "class  name                   train",
        "    0  cat                        2",
        "    1  dog                        1",
        "1 problem found",
    ]
    assert r.err.splitlines()[-1] == (
        "darknet-py: warning: labels of 4 images: 1 image path "
        "names no class, or several (a classifier's label)"
    )
    assert not list(tmp_path.glob("*.png.png")) and not (tmp_path / "c_labels.png").exists()
