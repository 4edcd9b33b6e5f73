"""Training data pipeline: .data files, lists, labels, augmentation, loader, anchors, demo sets."""

import os
import re
import signal
import subprocess
import sys
import time

import cv2
import numpy as np
import pytest

from darknet_py import data as D
from darknet_py import demo_data
from darknet_py.boxes import truth_boxes
from darknet_py.data import augment as A
from darknet_py.image import load_image, resize_image


def write(path, text, newline="\n"):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline=newline) as f:
        f.write(text)
    return str(path)


def write_png(path, rgb_chw):
    path.parent.mkdir(parents=True, exist_ok=True)
    bgr = (np.clip(rgb_chw, 0, 1)[::-1].transpose(1, 2, 0) * 255 + 0.5).astype(np.uint8)
    assert cv2.imwrite(str(path), bgr)
    return str(path)


# --- .data files and lists --------------------------------------------------------------


def test_data_config_parses_keys_and_defaults(tmp_path):
    names = write(tmp_path / "x.names", "cat\ndog\n\nbird  \n")
    data = write(
        tmp_path / "x.data", f"classes = 3\ntrain={tmp_path}/t.list\nnames={names}\n# comment\n"
    )
    cfg = D.load_data_config(data)
    assert cfg.classes == 3 and cfg.names == ["cat", "dog", "bird"]
    assert cfg.labels == cfg.names and cfg.labels_path == names
    assert cfg.valid == cfg.train == f"{tmp_path}/t.list"  # valid defaults to train
    assert cfg.backup == "/backup/" and cfg.top == 1


def test_data_config_labels_key_and_classes_default(tmp_path):
    labels = write(tmp_path / "l.list", "n01\nn02\n")
    cfg = D.load_data_config(write(tmp_path / "x.data", f"labels={labels}\ntop=5\n"))
    assert cfg.classes == 2 and cfg.names == ["n01", "n02"] and cfg.top == 5


def test_data_config_relative_paths_resolve_against_cwd(tmp_path, monkeypatch):
    write(tmp_path / "d" / "x.names", "a\nb\n")
    write(tmp_path / "x.data", "classes=2\nnames=d/x.names\n")
    monkeypatch.chdir(tmp_path)
    assert D.load_data_config("x.data").names == ["a", "b"]


def test_data_config_missing_files_name_the_path(tmp_path):
    with pytest.raises(D.DataError, match="nothere.data"):
        D.load_data_config(tmp_path / "nothere.data")
    data = write(
        tmp_path / "x.data",
        f"classes=2\nnames={tmp_path}/gone.names\ntrain={tmp_path}/gone-train.list\n",
    )
    with pytest.raises(D.DataError, match="gone.names"):
        D.load_data_config(data)
    write(tmp_path / "gone.names", "a\nb\n")
    with pytest.raises(D.DataError, match="gone-train.list"):
        D.load_data_config(data, require=("train",))
    with pytest.raises(D.DataError, match="gone-train.list"):
        D.load_data_config(data).train_paths()


def test_data_config_too_few_names(tmp_path):
    names = write(tmp_path / "x.names", "a\nb\n")
    with pytest.raises(D.DataError, match="2 names for classes=3"):
        D.load_data_config(write(tmp_path / "x.data", f"classes=3\nnames={names}\n"))


def test_read_list_tolerates_crlf_blank_lines_and_trailing_spaces(tmp_path):
    p = write(tmp_path / "a.list", "img/1.jpg  \r\n\r\n  \r\nimg/2.jpg\r\nimg/3.jpg\t", newline="")
    assert D.read_list(p) == ["img/1.jpg", "img/2.jpg", "img/3.jpg"]


# --- classifier labels -------------------------------------------------------------------


def test_classifier_truth_one_hot():
    t = D.classifier_truth("data/train/00012_dog.png", ["cat", "dog", "bird"])
    assert t.dtype == np.float32 and t.tolist() == [0, 1, 0]


def test_classifier_label_ambiguous_and_missing():
    with pytest.raises(D.DataError, match=r"2 class names.*'cat'.*'catfish'"):
        D.classifier_label_index("x/123_catfish.png", ["cat", "catfish"])
    with pytest.raises(D.DataError, match="no class name"):
        D.classifier_label_index("x/123_horse.png", ["cat", "dog"])
    assert (
        D.check_classifier_labels(["a_dog.png", "b_cat_dog.png"], ["cat", "dog"])[0][0]
        == "b_cat_dog.png"
    )


# --- detector labels ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "image, label",
    [
        ("data/images/a.jpg", "data/labels/a.txt"),
        ("VOC/JPEGImages/a.JPEG", "VOC/labels/a.txt"),
        ("set/raw/a.png", "set/labels/a.txt"),
        ("set/images/b.JPG", "set/labels/b.txt"),
        ("set/images/c.jpeg", "set/labels/c.txt"),
        # Darknet replaces the first occurrence only, wherever it is.
        ("images/x/images/d.jpg", "labels/x/images/d.txt"),
    ],
)
def test_label_path_follows_darknet(image, label):
    assert D.label_path(image) == label


def test_label_path_unknown_extension():
    with pytest.raises(D.DataError, match="a.gif"):
        D.label_path("images/a.gif")


def test_read_labels_and_malformed_line(tmp_path):
    good = write(tmp_path / "g.txt", "1 0.5 0.5 0.2 0.4\r\n\n0 0.1 0.2 0.05 0.05\n", newline="")
    b = D.read_labels(good)
    assert b.dtype == np.float32 and b.shape == (2, 5)
    assert b[0].tolist() == pytest.approx([0.5, 0.5, 0.2, 0.4, 1])
    bad = write(tmp_path / "bad.txt", "1 0.5 0.5 0.2 0.4\n2 0.5 oops 0.1 0.1\n")
    with pytest.raises(D.DataError, match=r"bad\.txt:2:"):
        D.read_labels(bad)
    short = write(tmp_path / "short.txt", "\n\n3 0.5 0.5 0.1\n")
    with pytest.raises(D.DataError, match=r"short\.txt:3: expected 'class x y w h'"):
        D.read_labels(short)
    with pytest.raises(D.DataError, match=r"g\.txt:1: class id 1 out of range \(0\.\.0\)"):
        D.read_labels(good, classes=1)
    with pytest.raises(D.MissingLabelFile, match="none.txt"):
        D.read_labels(tmp_path / "none.txt")


def reference_parse_labels(text):
    """The line-by-line label parser that parse_labels replaced, for valid text."""
    rows = []
    for raw in text.splitlines():
        fields = raw.split()
        if fields:
            x, y, w, h = (float(v) for v in fields[1:])
            rows.append((x, y, w, h, int(fields[0])))
    return np.array(rows, dtype=np.float32).reshape(-1, 5)


def random_label_text(rng, n):
    """n label lines written the ways label files are: fixed, %g and exponent formats,
    integers, extra spaces and tabs, CRLF, blank lines."""
    lines = []
    for _ in range(n):
        cls = str(rng.integers(0, 80))
        values = rng.uniform(-0.2, 1.2, 4) * rng.choice([1, 1, 1e-3])
        values[2:] = np.abs(values[2:])
        style = rng.integers(4)
        fmt = ("{:.6f}", "{:g}", "{:.17e}", "{:.0f}")[style]
        sep = rng.choice([" ", "  ", "\t", " \t "])
        lines.append(sep.join([cls] + [fmt.format(v) for v in values]) + rng.choice(["", " "]))
        if rng.random() < 0.2:
            lines.append(rng.choice(["", "   "]))
    return rng.choice(["\n", "\r\n"]).join(lines) + rng.choice(["", "\n"])


def test_parse_labels_equals_line_by_line_parser_bit_for_bit():
    rng = np.random.default_rng(0)
    for n in list(range(6)) + [90, 300]:
        text = random_label_text(rng, n)
        got = D.parse_labels(text, classes=80)
        want = reference_parse_labels(text)
        assert got.dtype == np.float32 and got.shape == (n, 5)
        np.testing.assert_array_equal(got, want)
    # Class ids past float32's exact integers are still parsed as before.
    np.testing.assert_array_equal(
        D.parse_labels("16777217 0.5 0.5 0.1 0.1"),
        reference_parse_labels("16777217 0.5 0.5 0.1 0.1"),
    )


@pytest.mark.parametrize(
    "text, message",
    [
        ("0 0.5 0.5 0.1 0.1\n1 0.5 0.5 0.1\n", r"x\.txt:2: expected 'class x y w h'"),
        ("\n0 0.5 0.5 0.1 0.1\n1.0 0.5 0.5 0.1 0.1\n", r"x\.txt:3: class id must be an integer"),
        ("0 0.5 nan 0.1 0.1\n", r"x\.txt:1: x y w h must be finite"),
        ("0 0.5 0.5 0.1 0.1\n7 0.5 0.5 0.1 0.1\n", r"x\.txt:2: class id 7 out of range \(0\.\.4\)"),
        ("-1 0.5 0.5 0.1 0.1\n", r"x\.txt:1: class id -1 out of range"),
        ("0 0.5 0.5 -0.1 0.1\n", r"x\.txt:1: negative box size"),
    ],
)
def test_parse_labels_names_the_bad_line(text, message):
    with pytest.raises(D.DataError, match=message):
        D.parse_labels(text, "x.txt", classes=5)


def reference_correct_box(box, dx, dy, sx, sy, flip):
    """Darknet's correct_boxes for one box, in float32 as the vectorised version
    computes (a (0, 0) centre is the 'no box' marker: its size becomes 0)."""
    f32 = np.float32
    x, y, w, h, cls = (f32(v) for v in box)
    dx, dy, sx, sy = f32(dx), f32(dy), f32(sx), f32(sy)
    left, right = (x - w / f32(2)) * sx - dx, (x + w / f32(2)) * sx - dx
    top, bottom = (y - h / f32(2)) * sy - dy, (y + h / f32(2)) * sy - dy
    if flip:
        left, right = f32(1) - right, f32(1) - left
    left, right, top, bottom = (min(max(v, f32(0)), f32(1)) for v in (left, right, top, bottom))
    marker = x == 0 and y == 0
    return [
        (left + right) / f32(2),
        (top + bottom) / f32(2),
        f32(0) if marker else min(max(right - left, f32(0)), f32(1)),
        f32(0) if marker else min(max(bottom - top, f32(0)), f32(1)),
        cls,
    ]


def reference_detection_truth(boxes, max_boxes, dx, dy, sx, sy, flip, rng):
    """Darknet's fill_truth_detection, box by box."""
    order = rng.permutation(len(boxes)) if len(boxes) > 1 else range(len(boxes))
    truth = np.zeros((max_boxes, 5), np.float32)
    kept = 0
    for i in list(order)[:max_boxes]:
        box = reference_correct_box(boxes[i], dx, dy, sx, sy, flip)
        if box[2] < np.float32(0.001) or box[3] < np.float32(0.001):
            continue
        truth[kept] = box
        kept += 1
    return truth.reshape(-1)


def random_boxes(rng, n):
    boxes = np.empty((n, 5), np.float32)
    boxes[:, :2] = rng.uniform(-0.2, 1.2, (n, 2))
    boxes[:, 2:4] = rng.uniform(0, 0.8, (n, 2)) * rng.choice([1, 1e-3], (n, 1))
    boxes[:, 4] = rng.integers(0, 80, n)
    boxes[rng.random(n) < 0.1, :2] = 0  # Darknet's 'no box' marker
    return boxes


def test_correct_boxes_and_detection_truth_equal_box_by_box_versions():
    rng = np.random.default_rng(1)
    for trial in range(60):
        boxes = random_boxes(rng, int(rng.integers(0, 120)))
        # Python floats, as the augmentation passes them (a NumPy float64 would make
        # the vectorised version compute in double).
        dx, dy = map(float, rng.uniform(-0.3, 0.3, 2))
        sx, sy = map(float, rng.uniform(0.6, 1.6, 2))
        flip = bool(trial % 2)
        want = [reference_correct_box(b, dx, dy, sx, sy, flip) for b in boxes]
        np.testing.assert_array_equal(
            D.correct_boxes(boxes, dx, dy, sx, sy, flip), np.array(want, np.float32).reshape(-1, 5)
        )
        max_boxes = int(rng.choice([30, 90]))
        got = D.detection_truth(
            boxes, max_boxes, dx, dy, sx, sy, flip, np.random.default_rng(trial)
        )
        np.testing.assert_array_equal(
            got,
            reference_detection_truth(
                boxes, max_boxes, dx, dy, sx, sy, flip, np.random.default_rng(trial)
            ),
        )


def test_truth_buffer_layout():
    boxes = np.array([[0.5, 0.4, 0.2, 0.3, 7], [0.25, 0.75, 0.1, 0.1, 2]], np.float32)
    t = D.detection_truth(boxes)
    assert t.dtype == np.float32 and t.shape == (90 * 5,)
    assert t[:10].tolist() == pytest.approx([0.5, 0.4, 0.2, 0.3, 7, 0.25, 0.75, 0.1, 0.1, 2])
    assert not t[10:].any()
    np.testing.assert_allclose(truth_boxes(t), boxes, atol=1e-6)


def test_truth_drops_tiny_boxes_and_truncates():
    boxes = np.array([[0.5, 0.5, 0.0005, 0.3, 1], [0.3, 0.3, 0.2, 0.2, 2]], np.float32)
    t = D.detection_truth(boxes)
    assert t[:5].tolist() == pytest.approx([0.3, 0.3, 0.2, 0.2, 2]) and not t[5:].any()
    many = np.tile([[0.5, 0.5, 0.1, 0.1, 1]], (120, 1)).astype(np.float32)
    t = D.detection_truth(many, max_boxes=90, rng=np.random.default_rng(0)).reshape(90, 5)
    assert (t[:, 2] > 0).all()


# --- augmentation ------------------------------------------------------------------------


def test_flip_mirrors_x():
    boxes = np.array([[0.2, 0.3, 0.1, 0.2, 4]], np.float32)
    c = D.correct_boxes(boxes, flip=True)
    assert c[0].tolist() == pytest.approx([0.8, 0.3, 0.1, 0.2, 4])


def test_correct_boxes_clips_into_unit_square():
    boxes = np.array([[0.05, 0.95, 0.3, 0.3, 0]], np.float32)
    c = D.correct_boxes(boxes, dx=0.1, dy=-0.1, sx=1.2, sy=1.2)
    left, right = c[0, 0] - c[0, 2] / 2, c[0, 0] + c[0, 2] / 2
    top, bottom = c[0, 1] - c[0, 3] / 2, c[0, 1] + c[0, 3] / 2
    assert 0 <= left <= right <= 1 and 0 <= top <= bottom <= 1


def bright_box_image(w=120, h=80, box=(30, 20, 70, 50)):
    img = np.zeros((3, h, w), np.float32)
    l, t, r, b = box
    img[:, t:b, l:r] = 1.0
    label = [(l + r) / 2 / w, (t + b) / 2 / h, (r - l) / w, (b - t) / h, 3]
    return img, np.array([label], np.float32)


def test_detection_augmentation_places_the_whole_image_as_pjreddie_does():
    """jitter=0 keeps the aspect ratio: the 120x80 image is shrunk to 64x42.67 (placed as
    64x42 pixels, Darknet's int conversion) at a random height on a grey canvas; the box
    scales with it, uncut."""
    img, boxes = bright_box_image()
    for seed in range(4):
        x, t = A.augment_detection_hwc(
            A.to_hwc(img), boxes, D.DetectorAugment(jitter=0.0), 64, 64, np.random.default_rng(seed)
        )
        x = A.from_hwc(x)
        kept = truth_boxes(t)
        assert len(kept) == 1
        np.testing.assert_allclose(kept[0, 2:4], [40 / 120, 30 / 80 * (64 / 1.5) / 64], rtol=1e-6)
        rows = np.flatnonzero(~np.isclose(x[0], 0.5, atol=1e-6).all(axis=1))
        assert len(rows) == 42 and rows[-1] - rows[0] == 41  # the placed image's rows
        assert (
            np.isclose(x[0, : rows[0]], 0.5).all() and np.isclose(x[0, rows[-1] + 1 :], 0.5).all()
        )


def test_detection_augmentation_moves_boxes_with_pixels():
    img, boxes = bright_box_image()
    aug = D.DetectorAugment(jitter=0.3)
    for seed in range(12):
        x, t = A.augment_detection_hwc(
            A.to_hwc(img), boxes, aug, 64, 64, np.random.default_rng(seed)
        )
        x = A.from_hwc(x)
        assert x.shape == (3, 64, 64)
        kept = truth_boxes(t)
        assert len(kept) == 1 and kept[0, 4] == 3
        bx, by, bw, bh = kept[0, :4]
        assert 0 <= bx - bw / 2 and bx + bw / 2 <= 1 and 0 <= by - bh / 2 and by + bh / 2 <= 1
        l, r = int(np.ceil((bx - bw / 2) * 64)) + 1, int((bx + bw / 2) * 64) - 1
        tp, bt = int(np.ceil((by - bh / 2) * 64)) + 1, int((by + bh / 2) * 64) - 1
        assert x[0, tp:bt, l:r].min() > 0.9  # inside the box: the bright square
        # pjreddie's rule places the whole image on a grey canvas: the box is never cut,
        # and every pixel is the dark image, the grey canvas or the box (edges blend; the
        # truth moves by the float placement, the pixels by its int part, as in Darknet)
        outside = x[0].copy()
        outside[max(tp - 3, 0) : bt + 3, max(l - 3, 0) : r + 3] = 0
        grey = np.isclose(outside, 0.5, atol=1e-6)
        assert grey.any() and (outside[~grey] < 0.5).all()


def test_hsv_follows_darknet_formulas():
    rgb = np.array(
        [[1, 0, 0], [0, 1, 0], [0, 0, 1], [0.5, 0.25, 0.5], [0.3, 0.3, 0.3]], np.float32
    ).T.reshape(3, 1, 5)
    hsv = A.rgb_to_hsv(rgb)[:, 0, :].T
    np.testing.assert_allclose(
        hsv, [[0, 1, 1], [1 / 3, 1, 1], [2 / 3, 1, 1], [5 / 6, 0.5, 0.5], [0, 0, 0.3]], atol=1e-5
    )
    img = np.random.default_rng(0).random((3, 9, 11)).astype(np.float32)
    np.testing.assert_allclose(A.hsv_to_rgb(A.rgb_to_hsv(img)), img, atol=1e-5)
    np.testing.assert_allclose(A.distort_image(img, 0, 1, 1), img, atol=1e-5)
    red = np.array([1, 0, 0], np.float32).reshape(3, 1, 1)
    np.testing.assert_allclose(A.distort_image(red, 1 / 3, 1, 1).ravel(), [0, 1, 0], atol=1e-5)
    np.testing.assert_allclose(A.distort_image(red, -1 / 3, 1, 0.5).ravel(), [0, 0, 0.5], atol=1e-5)
    out = A.distort_image(img, 0.3, 2.0, 1.5)
    assert out.shape == img.shape and out.min() >= 0 and out.max() <= 1
    grey = np.full((1, 4, 4), 0.6, np.float32)
    np.testing.assert_allclose(A.distort_image(grey, 0.2, 2, 1.5), 0.9, atol=1e-6)


def darknet_rotate_crop_reference(img, rad, s, w, h, dx, dy, aspect):
    """Darknet's rotate_crop_image, pixel by pixel (bilinear, zero outside)."""
    c, ih, iw = img.shape
    out = np.zeros((c, h, w), np.float32)

    def pixel(x, y):
        inside = 0 <= x < iw and 0 <= y < ih
        return img[:, y, x] if inside else 0

    for y in range(h):
        for x in range(w):
            rx = (
                np.cos(rad) * ((x - w / 2) / s * aspect + dx / s * aspect)
                - np.sin(rad) * ((y - h / 2) / s + dy / s)
                + iw / 2
            )
            ry = (
                np.sin(rad) * ((x - w / 2) / s * aspect + dx / s * aspect)
                + np.cos(rad) * ((y - h / 2) / s + dy / s)
                + ih / 2
            )
            ix, iy = int(np.floor(rx)), int(np.floor(ry))
            fx, fy = rx - ix, ry - iy
            out[:, y, x] = (
                (1 - fy) * (1 - fx) * pixel(ix, iy)
                + fy * (1 - fx) * pixel(ix, iy + 1)
                + (1 - fy) * fx * pixel(ix + 1, iy)
                + fy * fx * pixel(ix + 1, iy + 1)
            )
    return out


@pytest.mark.parametrize(
    "args",
    [
        (0.3, 1.3, 12, 10, 3.2, -2.1, 1.2),
        (0.0, 1.0, 15, 9, 0, 0, 1),
        (-0.5, 0.7, 14, 12, 6, 5, 0.8),
    ],
)
def test_rotate_crop_matches_darknet(args):
    img = np.random.default_rng(1).random((3, 9, 15)).astype(np.float32)
    np.testing.assert_allclose(
        A.rotate_crop_image(img, *args), darknet_rotate_crop_reference(img, *args), atol=1e-4
    )


def test_classifier_augment_shapes_and_center_crop():
    img = np.random.default_rng(0).random((3, 40, 60)).astype(np.float32)
    aug = D.ClassifierAugment(angle=15, aspect=1.2, hue=0.1, saturation=1.5, exposure=1.5)
    out = A.augment_classifier_hwc(A.to_hwc(img), aug, 32, 32, np.random.default_rng(1))
    assert out.shape == (32, 32, 3) and out.dtype == np.float32
    center = D.ClassifierAugment(center=True, flip=False)
    np.testing.assert_allclose(
        A.augment_classifier_hwc(A.to_hwc(img), center, 32, 32, np.random.default_rng(1)),
        A.to_hwc(resize_image(img[:, :, 10:50], 32, 32)),
        atol=1e-5,
    )


# --- loader ------------------------------------------------------------------------------


@pytest.fixture
def tiny_detection_set(tmp_path):
    rng = np.random.default_rng(0)
    paths = []
    for i in range(6):
        w, h = 40 + 4 * i, 36
        img, boxes = bright_box_image(w, h, (5, 6, 5 + 10 + 3 * i, 20))
        img += rng.random(img.shape, dtype=np.float32) * 0.05
        p = write_png(tmp_path / "images" / f"{i}.png", img)
        write(
            tmp_path / "labels" / f"{i}.txt",
            "".join(f"{int(b[4])} {b[0]} {b[1]} {b[2]} {b[3]}\n" for b in boxes),
        )
        paths.append(p)
    return paths


def loader_batches(paths, count, **options):
    with D.DataLoader(paths, **options) as loader:
        return [loader.next_batch() for _ in range(count)]


def assert_same_batches(a, b):
    assert len(a) == len(b)
    for p, q in zip(a, b):
        np.testing.assert_array_equal(p.x, q.x)
        np.testing.assert_array_equal(p.truth, q.truth)
        assert p.paths == q.paths and p.image_sizes == q.image_sizes


def test_loader_is_reproducible_with_a_seed_on_any_worker_count(tiny_detection_set):
    options = dict(
        task="detector",
        width=32,
        height=32,
        batch=4,
        classes=5,
        augment=D.DetectorAugment(jitter=0.2, hue=0.1, saturation=1.5, exposure=1.5),
    )
    a = loader_batches(tiny_detection_set, 3, seed=7, workers=0, **options)
    for x, truth in a:
        assert x.shape == (4, 3, 32, 32) and truth.shape == (4, 450)
        assert x.dtype == np.float32 and truth.dtype == np.float32
    for workers in (1, 3):
        assert_same_batches(
            a, loader_batches(tiny_detection_set, 3, seed=7, workers=workers, **options)
        )
    other = loader_batches(tiny_detection_set, 3, seed=8, workers=0, **options)
    assert not all(np.array_equal(x[0], y[0]) for x, y in zip(a, other))


def test_shuffled_classifier_batches_are_the_same_on_any_worker_count(tmp_path):
    paths = [
        write_png(
            tmp_path / f"{i}_{name}.png",
            np.random.default_rng(i).random((3, 12, 14)).astype(np.float32),
        )
        for i, name in enumerate(["cat", "dog", "cat", "dog", "cat"])
    ]
    options = dict(
        task="classifier",
        width=8,
        height=8,
        batch=3,
        classes=2,
        labels=["cat", "dog"],
        seed=2,
        sampling="shuffle",
        augment=D.ClassifierAugment(angle=10, hue=0.1, exposure=1.3),
    )
    a = loader_batches(paths, 4, workers=0, **options)
    assert sorted(sum((b.paths for b in a[: 5 // 3 + 1]), [])[:5]) == sorted(paths)
    assert_same_batches(a, loader_batches(paths, 4, workers=2, **options))


def test_loader_set_size_changes_next_batch(tiny_detection_set):
    with D.DataLoader(
        tiny_detection_set,
        task="detector",
        width=32,
        height=32,
        batch=2,
        classes=5,
        seed=0,
        workers=2,
    ) as loader:
        assert loader.next_batch().x.shape == (2, 3, 32, 32)
        loader.set_size(48, 40)
        for _ in range(3):
            assert loader.next_batch().x.shape == (2, 3, 40, 48)
    with D.DataLoader(
        tiny_detection_set,
        task="detector",
        width=48,
        height=40,
        batch=2,
        classes=5,
        seed=0,
        workers=2,
    ) as fresh:
        fresh.next_batch()
        expected = fresh.next_batch()
    with D.DataLoader(
        tiny_detection_set,
        task="detector",
        width=32,
        height=32,
        batch=2,
        classes=5,
        seed=0,
        workers=2,
    ) as loader:
        loader.next_batch()
        loader.set_size(48, 40)
        np.testing.assert_array_equal(loader.next_batch().x, expected.x)


def test_loader_skips_and_reports_unreadable_image(tiny_detection_set, tmp_path):
    broken = write(tmp_path / "images" / "broken.png", "not a png")
    no_label = write_png(tmp_path / "images" / "nolabel.png", np.zeros((3, 20, 20)))
    paths = [broken, no_label] + tiny_detection_set
    warnings = []
    with D.DataLoader(
        paths,
        task="detector",
        width=32,
        height=32,
        batch=8,
        classes=5,
        seed=1,
        workers=2,
        on_warning=warnings.append,
    ) as loader:
        for _ in range(6):
            x, truth = loader.next_batch()
            assert x.shape == (8, 3, 32, 32)
        assert all(p != broken for p in loader.next_batch().paths)
    assert broken in loader.bad_paths and loader.missing_labels == [no_label]
    about_broken = [m for m in warnings if broken in m]
    assert len(about_broken) == 1 and about_broken[0].endswith("; skipping it")
    # Every batch here ends an epoch: the missing label file is summed up at the first
    # and not again, as no other image lacks one.
    assert [m for m in warnings if m not in about_broken] == [
        f"1 image without a label file so far, used with no boxes (as Darknet does): {no_label}"
    ]


def test_missing_labels_summary_counts_and_names_the_first_few(tmp_path):
    paths = [write_png(tmp_path / "images" / f"{i}.png", np.zeros((3, 8, 8))) for i in range(5)]
    warnings = []
    with D.DataLoader(
        paths,
        task="detector",
        width=8,
        height=8,
        batch=5,
        classes=1,
        train=False,
        workers=0,
        on_warning=warnings.append,
    ) as loader:
        list(loader)
    assert warnings == [
        f"5 images without a label file so far, used with no boxes (as "
        f"Darknet does): {paths[0]}, {paths[1]}, {paths[2]}, ..."
    ]


def test_loader_validation_pass_in_order(tiny_detection_set):
    with D.DataLoader(
        tiny_detection_set,
        task="detector",
        width=32,
        height=32,
        batch=4,
        classes=5,
        train=False,
        workers=2,
    ) as loader:
        batches = list(loader)
        assert [len(b.paths) for b in batches] == [4, 2]
        assert sum((b.paths for b in batches), []) == tiny_detection_set
        assert batches[1].image_sizes[0] == (56, 36)
        first = truth_boxes(batches[0].truth[0])
        np.testing.assert_allclose(first, D.read_image_labels(tiny_detection_set[0]), atol=1e-6)
        assert len(list(loader)) == 2  # a validation loader can be iterated again


def test_classifier_loader(tmp_path):
    paths = [
        write_png(tmp_path / f"{i}_{name}.png", np.full((3, 10, 12), v, np.float32))
        for i, (name, v) in enumerate([("cat", 0.2), ("dog", 0.8), ("cat", 0.3)])
    ]
    with D.DataLoader(
        paths,
        task="classifier",
        width=8,
        height=8,
        batch=3,
        classes=2,
        labels=["cat", "dog"],
        train=False,
        workers=1,
    ) as loader:
        x, truth = loader.next_batch()
        assert truth.tolist() == [[1, 0], [0, 1], [1, 0]]
        np.testing.assert_allclose(x[1], 0.8, atol=0.01)
    with D.DataLoader(
        paths,
        task="classifier",
        width=8,
        height=8,
        batch=5,
        classes=2,
        labels=["cat", "dog"],
        seed=3,
        workers=2,
        augment=D.ClassifierAugment(max_ratio=1.5),
    ) as loader:
        x, truth = loader.next_batch()
        assert x.shape == (5, 3, 8, 8) and truth.shape == (5, 2)
        assert (truth.sum(axis=1) == 1).all()


# --- anchors -----------------------------------------------------------------------------


def test_kmeans_anchors_deterministic_and_sensible():
    rng = np.random.default_rng(0)
    centres = np.array([[12, 16], [40, 30], [90, 120]], float)
    boxes = np.concatenate([c * rng.uniform(0.9, 1.1, (200, 2)) for c in centres])
    a = D.kmeans_anchors(boxes, 3, seed=5)
    np.testing.assert_array_equal(a, D.kmeans_anchors(boxes, 3, seed=5))
    np.testing.assert_allclose(a, centres, rtol=0.05)
    assert (np.diff(a[:, 0] * a[:, 1]) > 0).all()
    assert D.anchor_mean_iou(boxes, a) > 0.85
    assert D.format_anchors([(10.4, 13), (16, 29.6)]) == "anchors = 10,13, 16,30"
    with pytest.raises(D.DataError, match="3 anchors from 2 distinct"):
        D.kmeans_anchors([[1, 2], [3, 4], [1, 2]], 3)


def test_compute_anchors_from_data_file(tiny_detection_set, tmp_path):
    names = write(tmp_path / "n.names", "a\nb\nc\nd\ne\n")
    train = write(tmp_path / "train.list", "\n".join(tiny_detection_set) + "\n")
    data = write(tmp_path / "x.data", f"classes=5\ntrain={train}\nnames={names}\n")
    boxes = D.gather_label_boxes(data, 100, 200)
    assert boxes.shape == (6, 2)
    widths = [(10 + 3 * i) / (40 + 4 * i) * 100 for i in range(6)]
    np.testing.assert_allclose(sorted(boxes[:, 0]), sorted(widths), rtol=1e-5)
    np.testing.assert_allclose(boxes[:, 1], 14 / 36 * 200, rtol=1e-5)
    anchors, clustered = D.compute_anchors(data, 2, 100, 200, seed=0)
    np.testing.assert_array_equal(clustered, boxes)
    assert len(anchors) == 2 and anchors == D.compute_anchors(data, 2, 100, 200, seed=0)[0]


# --- demo sets ---------------------------------------------------------------------------


def test_bundled_digits():
    images, labels = demo_data.load_digits()
    assert images.shape == (1797, 8, 8) and images.dtype == np.uint8
    assert set(labels.tolist()) == set(range(10)) and images.max() == 255
    assert os.path.getsize(demo_data.DIGITS_NPZ) < 200_000
    assert not any(a in b for a in demo_data.CLASS_NAMES for b in demo_data.CLASS_NAMES if a != b)


def test_build_classification_set(tmp_path):
    data = demo_data.build_classification_set(tmp_path / "cls", seed=0)
    cfg = D.load_data_config(data, require=("train", "valid"))
    assert cfg.classes == 10 and cfg.top == 2 and cfg.names == list(demo_data.CLASS_NAMES)
    train, valid = cfg.train_paths(), cfg.valid_paths()
    assert len(train) + len(valid) == 1797 and not set(train) & set(valid)
    assert D.check_classifier_labels(train + valid, cfg.labels) == []
    assert load_image(train[0]).shape == (3, 32, 32)
    # The split (and so every file name) is a function of the seed.
    a, b = demo_data.split_digits(demo_data.load_digits()[1], seed=0)
    assert [os.path.basename(p)[:4] for p in train] == [f"{i:04d}" for i in a]
    assert [os.path.basename(p)[:4] for p in valid] == [f"{i:04d}" for i in b]
    again = demo_data.split_digits(demo_data.load_digits()[1], seed=0)
    assert all(np.array_equal(x, y) for x, y in zip((a, b), again))


def test_build_detection_set(tmp_path):
    data = demo_data.build_detection_set(tmp_path / "det", n_train=8, n_valid=3, seed=4)
    cfg = D.load_data_config(data)
    train, valid = cfg.train_paths(), cfg.valid_paths()
    assert len(train) == 8 and len(valid) == 3 and cfg.classes == 10
    for p in train + valid:
        assert load_image(p).shape == (3, 128, 128)
        boxes = D.read_image_labels(p, cfg.classes)
        assert 1 <= len(boxes) <= 4
        left, right = boxes[:, 0] - boxes[:, 2] / 2, boxes[:, 0] + boxes[:, 2] / 2
        assert (left >= 0).all() and (right <= 1).all()
    again = demo_data.build_detection_set(tmp_path / "det2", n_train=8, n_valid=3, seed=4)
    other = D.load_data_config(again).train_paths()
    for a, b in zip(train, other):
        assert open(D.label_path(a)).read() == open(D.label_path(b)).read()
        np.testing.assert_array_equal(load_image(a), load_image(b))


@pytest.mark.parametrize("crop", [(0, 0, 15, 9), (-3, 2, 20, 6), (4, -2, 8, 14)])
def test_crop_resize_equals_darknet_crop_then_resize(crop):
    img = np.random.default_rng(2).random((3, 9, 15)).astype(np.float32)
    for w, h in ((15, 9), (31, 17), (7, 5)):
        one_pass = A.from_hwc(A._crop_resize_hwc(A.to_hwc(img), *crop, w, h))
        np.testing.assert_allclose(
            one_pass, resize_image(A.crop_image(img, *crop), w, h), atol=1e-5
        )


def test_augment_settings_from_cfg_sections():
    """What training reads from [net] (parse_net_options) and the head (jitter), with
    Darknet's defaults."""
    import types

    from darknet_py.cfg import parse_cfg_text
    from darknet_py.data.augment_fork import classifier_augment, detector_augment
    from darknet_py.network import parse_net_options

    net, yolo = parse_cfg_text(
        "[net]\nwidth=32\nheight=32\nchannels=3\nmax_crop=40\nangle=7\n"
        "hue=.1\nsaturation=1.5\nexposure=1.4\nflip=0\n[yolo]\njitter=.3\n"
    )
    options = parse_net_options(net)
    aug = classifier_augment(options)
    assert (aug.min_ratio, aug.max_ratio, aug.angle, aug.aspect) == (1.0, 1.25, 7.0, 1.0)
    assert (aug.hue, aug.saturation, aug.exposure, aug.flip, aug.center) == (
        0.1,
        1.5,
        1.4,
        False,
        False,
    )
    det = detector_augment(options, types.SimpleNamespace(jitter=yolo.get_float("jitter", 0.2)))
    assert (det.jitter, det.hue, det.saturation, det.exposure, det.flip) == (
        0.3,
        0.1,
        1.5,
        1.4,
        False,
    )
    defaults = parse_net_options(parse_cfg_text("[net]\nwidth=10\nheight=10\nchannels=1\n")[0])
    assert classifier_augment(defaults) == D.ClassifierAugment()


def test_loader_with_no_usable_image_raises(tmp_path):
    paths = [write(tmp_path / "images" / f"{i}.png", "junk") for i in range(3)]
    warnings = []
    with D.DataLoader(
        paths,
        task="detector",
        width=16,
        height=16,
        batch=2,
        classes=1,
        workers=1,
        on_warning=warnings.append,
    ) as loader:
        with pytest.raises(D.DataError, match="no usable image"):
            loader.next_batch()
    assert sorted(m.split(":")[0] for m in warnings) == sorted(paths)


def test_detector_validation_input_is_letterboxed(tiny_detection_set):
    from darknet_py.image import letterbox

    img = load_image(tiny_detection_set[3])
    for boxed, expected in ((True, letterbox(img, 32, 32)), (False, resize_image(img, 32, 32))):
        with D.DataLoader(
            tiny_detection_set[3:4],
            task="detector",
            width=32,
            height=32,
            batch=1,
            classes=5,
            train=False,
            letterbox=boxed,
            workers=1,
        ) as loader:
            np.testing.assert_allclose(loader.next_batch().x[0], expected, atol=1e-6)


def test_demo_builders_refuse_directories_that_break_darknet_path_rules(tmp_path):
    with pytest.raises(D.DataError, match="'digit3'"):
        demo_data.build_classification_set(tmp_path / "digit3_runs")
    with pytest.raises(D.DataError, match="raw"):
        demo_data.build_detection_set(tmp_path / "drawings", n_train=1, n_valid=0)


# --- worker processes --------------------------------------------------------------------


def shm_segments():
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def process_gone(pid):
    """True once pid has exited (a zombie waiting for a reaper counts as exited)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def wait_until(condition, seconds=10):
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_close_stops_workers_and_frees_shared_memory(tiny_detection_set):
    before = shm_segments()
    with pytest.raises(KeyError):  # an exception in the consumer closes the loader too
        with D.DataLoader(
            tiny_detection_set, task="detector", width=32, height=32, batch=4, classes=5, workers=2
        ) as loader:
            x, truth = loader.next_batch()
            kept = x.copy()
            pids = loader.workers
            ours = shm_segments() - before  # (other engineers' tests may add theirs)
            assert len(pids) == 2 and ours
            raise KeyError
    assert loader.workers == [] and all(process_gone(p) for p in pids)
    # The queues' semaphores go when their feeder thread has finished: wait a little.
    assert wait_until(lambda: not ours & shm_segments())
    np.testing.assert_array_equal(x, kept)  # a batch outlives its loader intact


CTRL_C_SCRIPT = """
import sys
from darknet_py.data.loader import DataLoader
if __name__ == "__main__":
    loader = DataLoader(sys.argv[1:], task="detector", width=32, height=32, batch=4,
                        classes=5, workers=2)
    while not loader.bad_paths:   # until the broken image has been drawn
        loader.next_batch()
    print(*loader.workers, flush=True)
    while True:
        x, truth = loader.next_batch()
"""


@pytest.mark.skipif(not hasattr(os, "killpg"), reason="needs POSIX process groups")
@pytest.mark.parametrize("how", ["ctrl-c", "kill -9"])
def test_interrupted_or_killed_loader_leaves_no_worker_or_shared_memory(
    tiny_detection_set, tmp_path, how
):
    broken = write(tmp_path / "images" / "broken.png", "not a png")
    script = write(tmp_path / "loop.py", CTRL_C_SCRIPT)
    before = shm_segments()
    proc = subprocess.Popen(
        [sys.executable, script, broken] + tiny_detection_set,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        ours = shm_segments() - before
        assert len(pids) == 2 and ours
        if how == "ctrl-c":
            os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        else:
            proc.kill()  # no clean-up code runs in the loader
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    # After kill -9 the workers notice within a second (EOF on the loader's pipe).
    assert wait_until(lambda: all(process_gone(p) for p in pids), seconds=60)
    if how == "ctrl-c":
        assert wait_until(lambda: not ours & shm_segments(), seconds=60)
    # After kill -9 no clean-up code of ours runs: the segments are left to Python's
    # resource tracker, which reclaimed them in most runs but not in 2 of ~6 full-suite
    # runs here (a known gap, not asserted).
    if how == "ctrl-c":
        assert "KeyboardInterrupt" in stderr
        # Warnings come from the parent, one line each: no OpenCV chatter from the
        # workers, no resource_tracker complaint about leaked segments.
        lines = stderr.splitlines()
        assert [line for line in lines if "darknet-py:" in line] == [
            f"darknet-py: warning: {broken}: cannot read image (not an image, or a format "
            f"OpenCV cannot decode); skipping it"
        ]
        assert "WARN" not in stderr and "leaked" not in stderr


def test_a_worker_that_dies_is_reported_with_the_image_it_was_on(tmp_path):
    # Catch the worker inside the image: stop it, look at which image it says it is on,
    # and kill it there; otherwise let it go on and consume a batch to keep it working.
    # (A named pipe no longer blocks a worker: images must be regular files.)
    big = tmp_path / "images" / "big.jpg"
    big.parent.mkdir()
    noise = np.random.default_rng(0).integers(0, 256, (1500, 1500, 3), dtype=np.uint8)
    assert cv2.imwrite(str(big), noise)
    loader = D.DataLoader(
        [str(big)], task="detector", width=16, height=16, batch=1, classes=1, train=True, workers=1
    )
    ((process, on_image),) = loader._pool.processes  # the shared "which image" value
    pid = process.pid
    for _ in range(500):
        os.kill(pid, signal.SIGSTOP)
        if on_image.value >= 0:
            os.kill(pid, signal.SIGKILL)
            break
        os.kill(pid, signal.SIGCONT)
        loader.next_batch()
    else:
        pytest.fail("never caught the worker inside an image")
    with pytest.raises(
        D.DataError,
        match=rf"worker \(pid {pid}\) died \(killed by SIGKILL\) "
        rf"while loading {re.escape(str(big))}$",
    ):
        for _ in range(10):  # batches already built may come first
            loader.next_batch()
    assert loader.workers == [] and process_gone(pid)


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs /dev/shm")
def test_a_batch_larger_than_dev_shm_is_a_clear_error(tiny_detection_set):
    loader = D.DataLoader(
        tiny_detection_set,
        task="detector",
        width=100_000,
        height=100_000,
        batch=64,
        classes=5,
        workers=1,
    )
    pid = loader.workers[0]
    with pytest.raises(
        D.DataError,
        match=r"/dev/shm has \d+ MiB free but the data loader "
        r"needs \d+ MiB more for a batch",
    ):
        loader.next_batch()
    assert loader.workers == [] and wait_until(lambda: process_gone(pid))


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs POSIX shared memory")
def test_a_segment_cut_short_by_ctrl_c_is_still_unlinked(monkeypatch):
    # Ctrl-C right after shm_open, before Python holds the segment or has sized it: the
    # name, given before creation, is what the pool's close unlinks by.
    import _posixshmem

    from darknet_py.data import loader

    def interrupted(name, create, size):
        os.close(_posixshmem.shm_open("/" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR))
        raise KeyboardInterrupt

    monkeypatch.setattr(loader, "_Segment", interrupted)
    names = []
    with pytest.raises(KeyboardInterrupt):
        loader._Slot(0, 4096, None, names)
    assert len(names) == 1 and names[0] in shm_segments()
    loader._unlink_segment_named(names[0])
    assert names[0] not in shm_segments()
    loader._unlink_segment_named(names[0])  # gone already: nothing to do, no error
