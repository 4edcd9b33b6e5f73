"""Where each Darknet finds a detector image's label file (data/labels.py), and what train,
map, valid and check do when the flavour's rule finds none but another place has one.

pjreddie's fill_truth_detection (src/data.c) replaces the first images, JPEGImages and raw
anywhere in the path with labels, then the first .jpg/.png/.JPG/.JPEG; the AlexeyAB fork's
replace_image_to_label (src/utils.c) rewrites only COCO's images/train2017 (val2017, and
2014 with backslashes) and VOC's JPEGImages folders and replaces the extension where it
ends the path, so other labels sit beside their images."""

import cv2
import numpy as np
import pytest
from helpers import DETECTOR_CFG, Lines, darknet_py, finish, yolo_head

from darknet_py.data.check import scan_labels
from darknet_py.data.config import DataError
from darknet_py.data.labels import (
    MissingLabelFile,
    find_label_file,
    fork_label_path,
    label_candidates,
    label_path,
    original_label_path,
    read_image_labels,
)
from darknet_py.train import train
from darknet_py.validate import detector_map


@pytest.mark.parametrize(
    "image, want",
    [
        ("data/images/x.jpg", "data/labels/x.txt"),
        ("/voc/VOC2007/JPEGImages/000001.jpg", "/voc/VOC2007/labels/000001.txt"),
        # first occurrence only, anywhere in the path, in Darknet's order
        ("tmp/raw_photos/images_set/images/x.jpg", "tmp/labels_photos/labels_set/images/x.txt"),
        ("/d/images/images/x.png", "/d/labels/images/x.txt"),
        ("/d/raw/x.JPG", "/d/labels/x.txt"),
        ("/d/a.jpg/x.png", "/d/a.txt/x.txt"),  # .jpg first, wherever it is
        ("/d/x.JPEG", "/d/x.txt"),
        ("/d/x.jpeg", "/d/x.txt"),  # darknet-py's one addition (Darknet would read the image)
    ],
)
def test_original_rule(image, want):
    assert original_label_path(image) == want
    assert label_path(image) == want == label_path(image, "original")


@pytest.mark.parametrize(
    "image, want",
    [
        ("data/images/x.jpg", "data/images/x.txt"),  # beside the image
        ("tmp/raw_photos/images_set/images/x.jpg", "tmp/raw_photos/images_set/images/x.txt"),
        ("/coco/images/train2017/1.jpg", "/coco/labels/train2017/1.txt"),
        ("/coco/images/val2017/1.jpg", "/coco/labels/val2017/1.txt"),
        ("/coco/images/train2014/1.jpg", "/coco/labels/train2014/1.txt"),
        ("/coco/images/val2014/1.jpg", "/coco/labels/val2014/1.txt"),
        ("/voc/VOC2012/JPEGImages/2.jpg", "/voc/VOC2012/labels/2.txt"),
        ("C:\\coco\\images\\train2017\\1.jpg", "C:\\coco\\labels\\train2017\\1.txt"),
        ("C:\\voc\\JPEGImages\\2.png", "C:\\voc\\labels\\2.txt"),
        ("/d/a.jpg/x.png", "/d/a.jpg/x.txt"),  # only the extension that ends it
        ("/d/x.PNG", "/d/x.txt"),
        ("/d/x.bmp", "/d/x.txt"),
        ("/d/x.BMP", "/d/x.txt"),
        ("/d/x.ppm", "/d/x.txt"),
        ("/d/x.tiff", "/d/x.txt"),
        ("/d/x.TIFF", "/d/x.txt"),
        ("/d/x.jpeg", "/d/x.txt"),
        ("/d/x.JPEG", "/d/x.txt"),
        ("/d/x.JPG", "/d/x.txt"),
        (" /d/x.jpg\t", "/d/x.txt"),  # trimmed first
    ],
)
def test_fork_rule(image, want):
    assert fork_label_path(image) == want
    assert label_path(image, "alexeyab") == want == label_path(image, "alexeyab-cpu")


def test_an_image_no_rule_names_is_refused():
    with pytest.raises(DataError, match=r"a/b\.gif: cannot derive a label file name"):
        label_candidates("a/b.gif", "original")
    with pytest.raises(DataError, match="the fork maps only"):
        label_path("a/b.gif", "alexeyab")


def test_candidates_own_rule_first_then_the_other_then_the_folder():
    image = "tmp/raw_photos/images_set/images/x.jpg"
    assert label_candidates(image, "alexeyab") == [
        ("alexeyab", "tmp/raw_photos/images_set/images/x.txt"),
        ("original", "tmp/labels_photos/labels_set/images/x.txt"),
        ("folder", "tmp/raw_photos/images_set/labels/x.txt"),
    ]
    assert [r for r, _ in label_candidates(image, "original")] == ["original", "alexeyab", "folder"]
    # a .bmp has no name by pjreddie's rule: the fork's is the first that gives one
    assert label_candidates("d/images/x.bmp", "original") == [
        ("alexeyab", "d/images/x.txt"),
        ("folder", "d/labels/x.txt"),
    ]


# ---- datasets on disk -------------------------------------------------------------------------
# helpers' small detector, one class, trained 2 iterations of 2 images
CFG = DETECTOR_CFG.replace(yolo_head(10), yolo_head(1)).replace(
    "batch=1\n", "batch=2\nlearning_rate=0.01\nmax_batches=2\n"
)


def write_set(root, images_dir, labels_dir, n=4, unlabelled=0):
    """n PNG images in images_dir, their labels in labels_dir (None: no label files), the
    last `unlabelled` without one. Returns the .data path."""
    images_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    paths = []
    for i in range(n):
        image = images_dir / f"im{i}.png"
        cv2.imwrite(str(image), rng.integers(0, 255, (32, 32, 3), dtype=np.uint8))
        paths.append(str(image))
        if labels_dir is not None and i < n - unlabelled:
            labels_dir.mkdir(parents=True, exist_ok=True)
            (labels_dir / f"im{i}.txt").write_text("0 0.5 0.5 0.3 0.4\n")
    (root / "list.txt").write_text("\n".join(paths) + "\n")
    (root / "obj.names").write_text("thing\n")
    (root / "backup").mkdir(exist_ok=True)
    data = root / "obj.data"
    data.write_text(
        f"classes=1\ntrain={root}/list.txt\nvalid={root}/list.txt\n"
        f"names={root}/obj.names\nbackup={root}/backup/\n"
    )
    return str(data)


def beside(tmp_path, **kw):
    """The fork's layout: the labels beside the images, in a folder named images/."""
    folder = tmp_path / "set" / "images"
    return write_set(tmp_path, folder, folder, **kw)


def split(tmp_path, **kw):
    """images/ and labels/ folders under a path with raw and images elsewhere in it."""
    base = tmp_path / "raw_photos" / "images_set"
    return write_set(tmp_path, base / "images", base / "labels", **kw)


def cfg(tmp_path):
    path = tmp_path / "tiny.cfg"
    path.write_text(CFG)
    return str(path)


def notes(lines):
    return [line for line in lines if "labels:" in line and "no label file where" in line]


@pytest.mark.parametrize(
    "layout, darknet, rule, found_by",
    [
        (beside, "alexeyab", "the fork's rule", None),
        (beside, "original", "the original Darknet's rule", "the fork's rule"),
        (split, "alexeyab", "the fork's rule", "the image's own folder renamed to labels"),
        (
            split,
            "original",
            "the original Darknet's rule",
            "the image's own folder renamed to labels",
        ),
    ],
)
def test_both_flavours_train_with_one_line_saying_where_the_labels_were(
    tmp_path, layout, darknet, rule, found_by
):
    data = layout(tmp_path, n=4, unlabelled=1)
    lines = Lines()
    result = train(cfg(tmp_path), data, device="cpu", log=lines, workers=0, darknet=darknet)
    assert result.iterations == 2
    found = notes(lines)
    if found_by is None:  # the flavour's own rule finds them: nothing to say
        assert found == []
        return
    assert len(found) == 1, lines
    assert found[0].startswith(
        f"darknet-py: warning: labels: 3 of 4 images have no label file where {rule}"
    )
    assert f"; found 3 by {found_by}" in found[0] and ", e.g. " in found[0]
    assert found[0].endswith("; reading those; 1 image has no label file anywhere")
    # the line comes before training starts
    first_iteration = next(i for i, line in enumerate(lines) if line.lstrip().startswith("1:"))
    assert lines.index(found[0]) < first_iteration


def test_read_image_labels_reads_the_boxes_found_elsewhere(tmp_path):
    split(tmp_path, n=2)
    image = tmp_path / "raw_photos" / "images_set" / "images" / "im0.png"
    for darknet in ("original", "alexeyab"):
        rule, path = find_label_file(image, darknet)
        assert (rule, path) == ("folder", str(image.parent.parent / "labels" / "im0.txt"))
        np.testing.assert_array_equal(
            read_image_labels(image, 1, darknet), np.float32([[0.5, 0.5, 0.3, 0.4, 0]])
        )
    with pytest.raises(MissingLabelFile):
        read_image_labels(tmp_path / "raw_photos" / "images_set" / "images" / "im9.png", 1)


def test_the_own_rule_wins_where_both_places_have_a_file(tmp_path):
    folder = tmp_path / "images"
    write_set(tmp_path, folder, folder, n=1)
    (tmp_path / "labels").mkdir()
    (tmp_path / "labels" / "im0.txt").write_text("0 0.2 0.2 0.1 0.1\n")
    image = folder / "im0.png"
    assert find_label_file(image, "alexeyab") == ("alexeyab", str(folder / "im0.txt"))
    assert find_label_file(image, "original") == ("original", str(tmp_path / "labels" / "im0.txt"))
    assert not scan_labels([str(image)], 1, "original").found_elsewhere


def test_no_label_files_at_all_is_refused_naming_where_they_were_looked_for(tmp_path):
    data = split(tmp_path, n=3)
    for path in (tmp_path / "raw_photos" / "images_set" / "labels").iterdir():
        path.unlink()
    image = tmp_path / "raw_photos" / "images_set" / "images" / "im0.png"
    code, out, err = finish(
        darknet_py("train", cfg(tmp_path), data, "--device", "cpu", "--darknet", "alexeyab")
    )
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert (
        "none of the 3 training images has a label file; for the first image they were "
        "looked for at " in lines[0]
    )
    for path in (
        image.with_suffix(".txt"),
        image.parent.parent / "labels" / "im0.txt",
        str(image.with_suffix(".txt"))
        .replace("raw_photos", "labels_photos")
        .replace("images_set", "labels_set"),
    ):
        assert str(path) in lines[0]
    assert not list((tmp_path / "backup").iterdir())  # nothing written
    with pytest.raises(DataError, match="none of the 3 validation images has a label file"):
        detector_map(cfg(tmp_path), data, None, device="cpu", log=Lines())


@pytest.mark.parametrize("darknet", ["alexeyab", "original"])
def test_check_and_map_say_where_the_labels_were(tmp_path, darknet):
    data = beside(tmp_path, n=3)
    code, out, err = finish(darknet_py("check", data, "--picture", "none", "--darknet", darknet))
    found = notes(err.splitlines())
    if darknet == "alexeyab":
        assert code == 0 and found == [], err
        assert "3 label files" in out
    else:
        assert len(found) == 1, err
        assert "3 of 3 images have no label file where the original Darknet's rule" in found[0]
        assert "3 label files" in out
    lines = Lines()
    result = detector_map(cfg(tmp_path), data, None, device="cpu", log=lines, darknet=darknet)
    assert result is not None
