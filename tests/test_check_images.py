"""`darknet-py check` reads every listed image's header: an empty file, a text file named
.jpg or a header claiming an impossible size is a problem (exit 1), named for the first
ten, as training would skip those images."""

import time

import cv2
import numpy as np
from test_cli import run_in_process

from darknet_py.dataset_check import unreadable_images
from darknet_py.image import header_problem

GOOD = "0 0.5 0.5 0.2 0.3\n"


def dataset(root, names):
    """A .data over one image per name (a real PNG or JPEG unless the test replaces it),
    each with its label file beside it (the fork's rule, --darknet alexeyab)."""
    image = np.full((16, 24, 3), 90, np.uint8)
    for name in names:
        cv2.imwrite(str(root / name), image)
        (root / name).with_suffix(".txt").write_text(GOOD)
    (root / "train.list").write_text("".join(f"{root / n}\n" for n in names))
    (root / "one.names").write_text("thing\n")
    data = root / "set.data"
    data.write_text(f"classes=1\ntrain={root}/train.list\nnames={root}/one.names\n")
    return data


def check(data, cwd):
    return run_in_process(["check", data, "--picture", "none", "--darknet", "alexeyab"], cwd=cwd)


def test_check_counts_and_names_unreadable_images(tmp_path):
    data = dataset(tmp_path, ["a.png", "b.jpg", "c.jpg", "d.png"])
    (tmp_path / "b.jpg").write_bytes(b"")
    (tmp_path / "c.jpg").write_text("this is not a picture\n")
    r = check(data, tmp_path)
    assert r.code == 1, r
    assert r.out.splitlines()[0] == (
        f"train: {tmp_path}/train.list: 4 images (0 missing, "
        f"2 unreadable), 4 label files (0 empty), 4 boxes"
    )
    assert r.out.splitlines()[-1] == "2 problems found"
    assert r.err.splitlines() == [
        f"darknet-py: warning: {tmp_path}/b.jpg: the image file is empty; training skips it "
        f"(listed in {tmp_path}/train.list)",
        f"darknet-py: warning: {tmp_path}/c.jpg: not an image (no decoder knows its first "
        f"bytes); training skips it (listed in {tmp_path}/train.list)",
    ]


def test_check_names_ten_unreadable_images_and_counts_the_rest(tmp_path):
    names = [f"{i:02d}.jpg" for i in range(13)]
    data = dataset(tmp_path, names)
    for name in names:
        (tmp_path / name).write_bytes(b"")
    r = check(data, tmp_path)
    assert r.code == 1 and r.out.splitlines()[-1] == "13 problems found", r
    lines = r.err.splitlines()
    assert len(lines) == 11 and lines[9].startswith(f"darknet-py: warning: {tmp_path}/09.jpg:")
    assert lines[10] == "darknet-py: warning: ... and 3 more unreadable images"


def test_check_of_sound_pictures_is_quiet(tmp_path):
    data = dataset(tmp_path, ["a.png", "b.jpg"])
    r = check(data, tmp_path)
    assert r.code == 0 and r.err == "" and r.out.splitlines()[-1] == "no problems found", r
    assert "unreadable" not in r.out


def test_header_problem_reads_sizes_from_the_header(tmp_path):
    png = tmp_path / "big.png"
    cv2.imwrite(str(png), np.zeros((4, 4), np.uint8))
    data = bytearray(png.read_bytes())
    data[16:24] = (70000).to_bytes(4, "big") * 2  # IHDR width and height: 70000 x 70000
    png.write_bytes(bytes(data))
    assert header_problem(png) == (
        "the image header claims 70000 x 70000 pixels; images of 1 to 1024 million pixels are read"
    )
    assert header_problem(tmp_path / "absent.png").startswith("cannot read the file")


def test_header_check_of_hundreds_of_images_is_fast(tmp_path):
    """The header alone: 300 images in well under a second (a decode of each would not be)."""
    cv2.imwrite(str(tmp_path / "0.jpg"), np.full((480, 640, 3), 128, np.uint8))
    photo = (tmp_path / "0.jpg").read_bytes()
    paths = []
    for i in range(300):
        path = tmp_path / f"{i}.jpg"
        path.write_bytes(photo)
        paths.append(str(path))
    (tmp_path / "7.jpg").write_text("0 0.5 0.5 0.2 0.3\n")
    start = time.perf_counter()
    found = unreadable_images(paths)
    assert time.perf_counter() - start < 1.0
    assert found == [(str(tmp_path / "7.jpg"), "not an image (no decoder knows its first bytes)")]
