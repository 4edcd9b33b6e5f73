"""The training augmentations' fast paths (bench/NOTES.md, L1) against the code they
replaced (tests/augment_reference.py, frozen): the same random draws give the same
samples bit for bit (compared as bytes, so that even -0.0 against 0.0 would fail)."""

import itertools

import augment_reference as before
import cv2
import numpy as np
import pytest

from darknet_py.data import augment as A
from darknet_py.data import augment_fork as F
from darknet_py.data.augment import DetectorAugment, mean_colour
from darknet_py.data.augment_fork import ForkAugment


def same_bits(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def photo(rng, h, w, channels=3, smooth=True):
    """A decoded 8-bit image as the loader's read_hwc gives it (float32 k / 255): a smooth
    field with edges, like a photo, or noise."""
    if smooth:
        small = rng.integers(0, 256, (max(h // 16, 1), max(w // 16, 1), channels), np.uint8)
        u8 = cv2.resize(small, (w, h), interpolation=cv2.INTER_CUBIC).reshape(h, w, channels)
        u8[h // 3 : h // 2, w // 4 : w // 2] = rng.integers(0, 256, channels, np.uint8)
    else:
        u8 = rng.integers(0, 256, (h, w, channels), np.uint8)
    return np.divide(u8, np.float32(255), dtype=np.float32)


def random_boxes(rng, n):
    boxes = np.zeros((n, 5), np.float32)
    boxes[:, 2:4] = rng.uniform(0.05, 0.6, (n, 2))
    boxes[:, 0:2] = rng.uniform(boxes[:, 2:4] / 2, 1 - boxes[:, 2:4] / 2)
    boxes[:, 4] = rng.integers(0, 3, n)
    return boxes


@pytest.mark.parametrize(
    "shape",
    [(416, 416, 3), (480, 640, 3), (37, 53, 3), (64, 64, 1), (1, 1, 3), (300, 200, 4), (9, 7, 2)],
)
def test_mean_colour_is_numpys_mean_bit_for_bit(shape):
    rng = np.random.default_rng(sum(shape))
    for image in (
        photo(rng, shape[0], shape[1], shape[2]),
        photo(rng, shape[0], shape[1], shape[2], smooth=False),
        np.full(shape, np.float32(1)),
        np.zeros(shape, np.float32),
    ):
        want = image.reshape(-1, shape[2]).mean(axis=0)
        assert same_bits(mean_colour(image), want)


def test_mean_colour_of_a_large_image_adds_it_in_chunks(monkeypatch):
    monkeypatch.setattr(A, "_SUM_CHUNK", 1000)  # 7 chunks, the last one short
    image = photo(np.random.default_rng(5), 61, 107)
    assert same_bits(mean_colour(image), image.reshape(-1, 3).mean(axis=0))


def test_mean_colour_checks_opencv_once_and_falls_back_to_numpy(monkeypatch):
    image = photo(np.random.default_rng(1), 50, 70)
    monkeypatch.setattr(A, "_integral_sums_agree", {})
    monkeypatch.setattr(A, "_sums_in_order", lambda flat: np.zeros(flat.shape[1], np.float32))
    assert same_bits(mean_colour(image), image.reshape(-1, 3).mean(axis=0))
    assert A._integral_sums_agree == {3: False}


def test_mean_colour_uses_opencv_where_it_agrees():
    mean_colour(photo(np.random.default_rng(1), 5, 5))
    assert A._integral_sums_agree[3], "the fast path is off: OpenCV sums differently here"


def test_mirror_is_numpys_reversed_copy():
    rng = np.random.default_rng(2)
    for channels in (1, 3):
        image = photo(rng, 31, 47, channels)
        assert same_bits(A.mirror_hwc(image), np.ascontiguousarray(image[:, ::-1]))


def test_hue_wrap_equals_numpys_mod():
    """The colour jitter's wrap (add or take off a turn) against np.mod, on hues shifted by
    every jitter the fork can draw, the turn's edges included."""
    rng = np.random.default_rng(3)
    hue = np.concatenate(
        [
            rng.uniform(0, 360, 200_000).astype(np.float32),
            np.float32([0, 360, 359.99997, 1e-30, 36, 324]),
        ]
    )
    for shift in [-35.8, -0.0, 0.0, 1e-7, -1e-7, 17.3, 35.8, *rng.uniform(-35.8, 35.8, 20)]:
        shifted = hue + np.float32(shift)
        want = np.mod(shifted, 360)
        got = F.wrap_degrees(shifted.copy())
        assert same_bits(got, want), shift


def crop_cases(rng, ow, oh, count):
    """(pleft, ptop, swidth, sheight): inside the image, across its edges, beyond it."""
    for _ in range(count):
        pleft = int(rng.integers(-ow // 3, ow // 3))
        ptop = int(rng.integers(-oh // 3, oh // 3))
        pright = int(rng.integers(-ow // 3, ow // 3))
        pbot = int(rng.integers(-oh // 3, oh // 3))
        yield pleft, ptop, ow - pleft - pright, oh - ptop - pbot
    yield 0, 0, ow, oh
    yield 10, 5, ow - 30, oh - 20  # inside
    yield -ow, -oh, ow // 2, oh // 2  # all outside


@pytest.mark.parametrize("source", [(416, 416), (640, 480), (97, 61)])
def test_image_data_augmentation_equals_the_old_one(source):
    ow, oh = source
    rng = np.random.default_rng(ow)
    image = photo(rng, oh, ow)
    truth = random_boxes(rng, 3)
    for i, (pleft, ptop, sw, sh) in enumerate(crop_cases(rng, ow, oh, 12)):
        w, h = [(416, 416), (96, 160), (203, 97)][i % 3]
        flip = bool(i % 2)
        dhue, dsat, dexp = rng.uniform(-0.1, 0.1), rng.uniform(0.66, 1.5), rng.uniform(0.66, 1.5)
        if i % 5 == 0:
            dhue, dsat, dexp = 0.0, 1.0, 1.0  # no colour jitter drawn
        if i % 5 == 1:
            dhue = -0.0  # hue=0 in the cfg: _rand_uniform(-0.0, 0.0)
        blur, noise = (1, 0) if i % 7 == 3 else (5, 3) if i % 7 == 5 else (0, 0)
        args = (image, w, h, pleft, ptop, sw, sh, flip, dhue, dsat, dexp, noise, blur, truth)
        want = before.image_data_augmentation(*args, np.random.default_rng(i))
        got = F.image_data_augmentation(*args, np.random.default_rng(i))
        assert same_bits(got, want), (i, pleft, ptop, sw, sh)
        # A window: that part equals the whole image's (a mosaic uses no more).
        x0, y0 = int(rng.integers(0, w // 2)), int(rng.integers(0, h // 2))
        x1, y1 = int(rng.integers(x0, w + 1)), int(rng.integers(y0, h + 1))
        got = F.image_data_augmentation(*args, np.random.default_rng(i), window=(x0, y0, x1, y1))
        assert same_bits(got[y0:y1, x0:x1], want[y0:y1, x0:x1]), (i, x0, y0, x1, y1)


def fork_cases():
    yolov4 = dict(jitter=0.3, hue=0.1, saturation=1.5, exposure=1.5, flip=True)
    return [
        ForkAugment(**yolov4, mosaic=True),
        ForkAugment(**yolov4, mosaic=True, mosaic_bound=True, resize=1.5),
        ForkAugment(**yolov4, mixup=True),
        ForkAugment(**yolov4),
        ForkAugment(jitter=0.2, mosaic=True),  # no colour jitter
        ForkAugment(**yolov4, mosaic=True, blur=1, gaussian_noise=10),
        ForkAugment(**yolov4, letter_box=True, blur=7),
    ]


@pytest.mark.parametrize("aug", fork_cases(), ids=lambda a: f"{a}"[:60])
def test_fork_samples_equal_the_old_ones(aug):
    """Whole samples (mosaics of 416x416, 640x480 and odd-sized images): image and truth."""
    rng = np.random.default_rng(7)
    sizes = [(416, 416), (640, 480), (333, 517), (416, 416)]
    images = [(photo(rng, h, w), random_boxes(rng, int(rng.integers(0, 6)))) for w, h in sizes]
    for seed, (w, h) in itertools.product(range(12), [(416, 416), (320, 192)]):
        results = []
        for sample in (before.fork_detection_sample, F.fork_detection_sample):
            draws = np.random.default_rng(seed)
            pick = np.random.default_rng(100 + seed)

            def other(pick=pick):
                return images[int(pick.integers(len(images)))]

            hwc, boxes = images[seed % len(images)]
            results.append(sample(hwc, boxes, other, aug, w, h, draws, 90))
        (want_x, want_t), (got_x, got_t) = results
        assert same_bits(got_x, want_x), (seed, w, h)
        assert same_bits(got_t, want_t), (seed, w, h)


@pytest.mark.parametrize("channels", [3, 1])
def test_original_detector_samples_equal_the_old_ones(channels):
    rng = np.random.default_rng(11)
    aug = DetectorAugment(jitter=0.3, hue=0.1, saturation=1.5, exposure=1.5)
    for seed, (ow, oh) in enumerate([(640, 480), (416, 416), (200, 333)] * 3):
        image, boxes = photo(rng, oh, ow, channels), random_boxes(rng, 4)
        args = (image, boxes, aug, 416, 416)
        want = before.augment_detection_hwc(*args, np.random.default_rng(seed))
        got = A.augment_detection_hwc(*args, np.random.default_rng(seed))
        assert same_bits(got[0], want[0]) and same_bits(got[1], want[1]), seed


def test_read_hwc_equals_the_old_one(tmp_path):
    rng = np.random.default_rng(12)
    for i, (w, h) in enumerate([(640, 480), (417, 311)]):
        u8 = (photo(rng, h, w) * 255).astype(np.uint8)
        path = tmp_path / f"{i}.jpg"
        cv2.imwrite(str(path), u8)
        for channels in (3, 1):
            assert same_bits(A.read_hwc(path, channels), before.read_hwc(path, channels))
