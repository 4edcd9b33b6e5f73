"""The AlexeyAB fork's detector augmentation (darknet_py/data/augment_fork.py): mosaic,
mixup, letter_box, blur, gaussian_noise, each checked on images whose content says where
every pixel came from."""

import types

import numpy as np
import pytest

from darknet_py.cfg import parse_cfg_text
from darknet_py.data.augment import DetectorAugment
from darknet_py.data.augment_fork import (
    ForkAugment,
    PieceDraws,
    crop_borders,
    detector_augment,
    fork_detection_sample,
    fork_fill_truth,
    image_data_augmentation,
    mosaic_truth,
)
from darknet_py.data.config import DataError
from darknet_py.network import parse_net_options

F32 = np.float32
W = H = 64


def solid(colour, w=80, h=60, box=None):
    """An image of one colour, with a white box (x, y, w, h relative) drawn in it."""
    img = np.empty((h, w, 3), dtype=F32)
    img[:] = colour
    boxes = np.zeros((0, 5), dtype=F32)
    if box is not None:
        x, y, bw, bh = box
        img[
            int((y - bh / 2) * h) : int((y + bh / 2) * h),
            int((x - bw / 2) * w) : int((x + bw / 2) * w),
        ] = 1
        boxes = np.array([[x, y, bw, bh, 0]], dtype=F32)
    return img, boxes


COLOURS = [(1, 0, 0), (0, 1, 0), (0, 0, 1), (1, 1, 0)]


def test_mosaic_fills_four_corners_from_four_images_and_moves_their_boxes():
    aug = ForkAugment(jitter=0.2, mosaic=True, flip=True)
    images = [solid(c, box=(0.5, 0.5, 0.3, 0.3)) for c in COLOURS]
    mosaics = 0
    for seed in range(12):
        rng = np.random.default_rng(seed)
        queue = list(images[1:])
        out, row = fork_detection_sample(*images[0], lambda: queue.pop(0), aug, W, H, rng)
        assert out.shape == (H, W, 3) and out.dtype == F32
        truth = row.reshape(-1, 5)
        truth = truth[truth[:, 0] > 0]
        if queue:  # the fork's coin said: no mosaic this time
            assert len(truth) <= 1
            continue
        mosaics += 1
        assert 1 <= len(truth) <= 4
        for x, y, bw, bh, _ in truth:
            assert 0 < x < 1 and 0 < y < 1 and 0 < bw < 1 and 0 < bh < 1
            # The centre of a kept box is white: the box moved with its image.
            assert np.allclose(out[int(y * H), int(x * W)], 1), (seed, x, y)
    assert mosaics >= 3


def test_mosaic_corners_come_from_their_own_images():
    aug = ForkAugment(jitter=0.0, mosaic=True, flip=False)
    images = [solid(c) for c in COLOURS]
    for seed in range(20):
        rng = np.random.default_rng(seed)
        queue = list(images[1:])
        out, _ = fork_detection_sample(*images[0], lambda: queue.pop(0), aug, W, H, rng)
        if queue:
            continue
        # With no jitter each image fills its whole piece: the corners show the four colours.
        for (r, c), colour in zip(((0, 0), (0, -1), (-1, 0), (-1, -1)), COLOURS):
            np.testing.assert_allclose(out[r, c], colour, atol=1e-6)
        return
    pytest.fail("no mosaic in 20 draws")


def c_blend_truth_mosaic(
    truth, piece, cut_x, cut_y, left_shift, right_shift, top_shift, bot_shift, w, h
):
    """The fork's blend_truth_mosaic (mosaic_bound=0), statement by statement."""
    out = []
    for xb, yb, wb, hb, c in truth:
        if piece == 0:
            xb = xb - (w - cut_x - right_shift) / w
            yb = yb - (h - cut_y - bot_shift) / h
        if piece == 1:
            xb = xb + (cut_x - left_shift) / w
            yb = yb - (h - cut_y - bot_shift) / h
        if piece == 2:
            xb = xb - (w - cut_x - right_shift) / w
            yb = yb + (cut_y - top_shift) / h
        if piece == 3:
            xb = xb + (cut_x - left_shift) / w
            yb = yb + (cut_y - top_shift) / h
        left, right = int((xb - wb / 2) * w), int((xb + wb / 2) * w)
        top, bot = int((yb - hb / 2) * h), int((yb + hb / 2) * h)
        if left < 0:
            diff = left / w
            xb, wb = xb - diff / 2, wb + diff
        if right > w:
            diff = (right - w) / w
            xb, wb = xb - diff / 2, wb - diff
        if top < 0:
            diff = top / h
            yb, hb = yb - diff / 2, hb + diff
        if bot > h:
            diff = (bot - h) / h
            yb, hb = yb - diff / 2, hb - diff
        left, right = int((xb - wb / 2) * w), int((xb + wb / 2) * w)
        top, bot = int((yb - hb / 2) * h), int((yb + hb / 2) * h)
        if (
            left >= 0
            and right <= w
            and top >= 0
            and bot <= h
            and 0 < wb < 1
            and 0 < hb < 1
            and 0 < xb < 1
            and 0 < yb < 1
            and wb > 1 / w
            and hb > 1 / h
        ):
            out.append([xb, yb, wb, hb, c])
    return np.array(out, dtype=F32).reshape(-1, 5)


@pytest.mark.parametrize("piece", [0, 1, 2, 3])
def test_mosaic_truth_matches_the_forks_blend_truth_mosaic(piece):
    rng = np.random.default_rng(piece)
    truth = np.concatenate(
        [rng.random((30, 2)), rng.random((30, 2)) * 0.5 + 0.01, rng.integers(0, 3, (30, 1))], axis=1
    ).astype(F32)
    shifts = tuple(int(v) for v in rng.integers(0, 6, 4))
    got = mosaic_truth(truth, piece, 25, 40, shifts, W, H)
    want = c_blend_truth_mosaic(truth, piece, 25, 40, *shifts, W, H)
    assert 0 < len(got) < 30
    np.testing.assert_allclose(got, want, atol=1e-6)


def test_mixup_blends_two_images_and_keeps_both_boxes():
    aug = ForkAugment(jitter=0.0, mixup=True, flip=False)
    a, b = solid((1, 0, 0), box=(0.3, 0.3, 0.2, 0.2)), solid((0, 0, 1), box=(0.7, 0.7, 0.2, 0.2))
    for seed in range(10):
        rng = np.random.default_rng(seed)
        used = []
        out, row = fork_detection_sample(*a, lambda: used.append(1) or b, aug, W, H, rng)
        truth = row.reshape(-1, 5)
        if used:
            np.testing.assert_allclose(out[H // 2, 5], (0.5, 0, 0.5), atol=1e-6)
            assert (truth[:, 0] > 0).sum() == 2
            return
    pytest.fail("no mixup in 10 draws")


def test_letter_box_crop_keeps_the_image_aspect_on_the_networks():
    aug = ForkAugment(jitter=0.0, letter_box=True)
    d = PieceDraws.draw(np.random.default_rng(0), aug)
    pleft, pright, ptop, pbot = crop_borders(200, 100, 64, 64, aug, d)
    assert (pleft, pright) == (0, 0) and ptop == pbot == -50  # 200 x 200: square like the net
    img, boxes = solid((0, 1, 0), w=200, h=100, box=(0.5, 0.5, 0.5, 0.5))
    out = image_data_augmentation(
        img, 64, 64, 0, -50, 200, 200, False, 0, 1, 1, 0, 0, boxes, np.random.default_rng(0)
    )
    # The bands above and below the image take its mean colour.
    np.testing.assert_allclose(out[2, 32], img.reshape(-1, 3).mean(axis=0), atol=1e-6)
    np.testing.assert_allclose(out[20, 5], (0, 1, 0), atol=1e-6)


def test_blur_background_only_keeps_box_pixels_and_blur_n_is_whole_image():
    rng = np.random.default_rng(1)
    img = rng.random((64, 64, 3)).astype(F32)
    box = np.array([[0.5, 0.5, 0.25, 0.25, 0]], dtype=F32)
    background = image_data_augmentation(img, 64, 64, 0, 0, 64, 64, False, 0, 1, 1, 0, 1, box, rng)
    np.testing.assert_array_equal(background[24:40, 24:40], img[24:40, 24:40])
    assert np.abs(background[:10, :10] - img[:10, :10]).mean() > 0.1
    whole = image_data_augmentation(img, 64, 64, 0, 0, 64, 64, False, 0, 1, 1, 0, 5, box, rng)
    assert np.abs(whole[24:40, 24:40] - img[24:40, 24:40]).mean() > 0.05
    assert whole[:10, :10].std() < img[:10, :10].std()


def test_gaussian_noise_only_brightens_by_whole_grey_levels():
    img = np.full((32, 32, 3), 0.5, dtype=F32)
    out = image_data_augmentation(
        img,
        32,
        32,
        0,
        0,
        32,
        32,
        False,
        0,
        1,
        1,
        20,
        0,
        np.zeros((0, 5), F32),
        np.random.default_rng(2),
    )
    added = (out - img) * 255
    assert added.min() >= -1e-3 and 30 < added.max() < 127
    np.testing.assert_allclose(added, np.rint(added), atol=1e-3)
    assert 0.3 < (added > 0.5).mean() < 0.7  # negative draws add nothing, as in 8-bit OpenCV


def test_fork_fill_truth_drops_sub_pixel_boxes_and_caps_sizes():
    boxes = np.array(
        [[0.5, 0.5, 0.2, 0.2, 1], [0.3, 0.3, 0.005, 0.2, 2], [0.6, 0.6, 0.5, 0.5, 0]], dtype=F32
    )
    truth, min_side = fork_fill_truth(boxes, 0, 0, 1, 1, False, 64, 64, np.random.default_rng(0))
    assert sorted(truth[:, 4].tolist()) == [0, 1]  # .005 * 64 < 1 pixel: dropped
    assert min_side == pytest.approx(0.2 * 64, rel=1e-5)


def test_same_seed_same_sample():
    aug = ForkAugment(
        jitter=0.3, mosaic=True, blur=3, gaussian_noise=10, hue=0.1, saturation=1.5, exposure=1.5
    )
    images = [solid(c, box=(0.4, 0.5, 0.3, 0.3)) for c in COLOURS]

    def sample(seed):
        rng = np.random.default_rng(seed)
        draws = np.random.default_rng(seed + 100)
        return fork_detection_sample(
            *images[0], lambda: images[int(draws.integers(4))], aug, W, H, rng
        )

    (a, ta), (b, tb) = sample(5), sample(5)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(ta, tb)
    assert not np.array_equal(sample(6)[0], a)


def test_net_options_and_the_augmentation_they_choose():
    (net,) = parse_cfg_text(
        "[net]\nwidth=8\nheight=8\nchannels=3\nmosaic=1\nblur=2\ngaussian_noise=5\nmixup=1\n"
    )
    o = parse_net_options(net)
    assert (o.mosaic, o.blur, o.gaussian_noise, o.mixup, o.letter_box) == (1, 2, 5, 1, 0)
    assert not net.unused()
    (both,) = parse_cfg_text(
        "[net]\nwidth=8\nheight=8\nchannels=3\nmosaic=1\nletter_box=1\ncutmix=1\n"
    )
    o = parse_net_options(both)  # the fork's stock cfgs set both: they build
    head = types.SimpleNamespace(jitter=0.3, resize=1.5)
    with pytest.raises(DataError, match="mosaic=1 with letter_box=1 cannot train"):
        detector_augment(o, head)
    o.letter_box = 0
    warned = []
    aug = detector_augment(o, head, warn=warned.append)
    assert isinstance(aug, ForkAugment) and aug.mosaic and aug.resize == 1.5
    assert "cutmix is a classifier augmentation" in warned[0]
    o.mosaic = o.cutmix = 0
    assert isinstance(detector_augment(o, head), DetectorAugment)
    assert isinstance(detector_augment(o, head, fork=True), ForkAugment)


def test_loader_builds_fork_batches_reproducibly(tmp_path):
    from darknet_py import demo_data
    from darknet_py.data.config import load_data_config
    from darknet_py.data.loader import DataLoader

    data = demo_data.build_detection_set(
        tmp_path / "set", 6, 1, seed=0, canvas_size=32, max_digits=3, min_digit=8, max_digit=14
    )
    paths = load_data_config(data).train_paths()
    aug = ForkAugment(jitter=0.2, mosaic=True, blur=2, gaussian_noise=4)

    def batches(seed):
        with DataLoader(
            paths,
            task="detector",
            width=32,
            height=32,
            batch=4,
            classes=10,
            augment=aug,
            seed=seed,
            workers=2,
        ) as loader:
            return [loader.next_batch() for _ in range(3)]

    first, again = batches(3), batches(3)
    for (x, t), (x2, t2) in zip(first, again):
        np.testing.assert_array_equal(x, x2)
        np.testing.assert_array_equal(t, t2)
    truth = np.concatenate([t for _, t in first]).reshape(-1, 5)
    boxes = truth[truth[:, 0] > 0]
    # Mosaics gather boxes of several images: some sample holds more than one canvas has.
    assert len(boxes) > 0 and (boxes[:, :4] > 0).all() and (boxes[:, :4] < 1).all()
    assert max((t.reshape(4, -1, 5)[:, :, 0] > 0).sum(axis=1).max() for _, t in first) > 3
