"""The AlexeyAB fork's classifier augmentation (darknet_py/data/augment_fork.py): mixup,
cutmix, mosaic and blur of its load_data_augment, against a plain-loop transcription of
its C code, on images whose colours say where every pixel came from, in the loader and in
a short training run."""

import types

import numpy as np
import pytest
from helpers import CLASSIFIER_CFG, Lines, data_file, write_classifier_cfg

from darknet_py.cfg import CfgError, parse_cfg_text
from darknet_py.data.augment import ClassifierAugment
from darknet_py.data.augment_fork import (
    CUTMIX,
    CUTMIX_OR_MOSAIC,
    MIXUP,
    MOSAIC,
    ForkAugment,
    ForkClassifierAugment,
    classifier_augment,
    detector_augment,
    fork_classifier_sample,
    mix_classifier_samples,
    smooth_classifier_truth,
)
from darknet_py.data.config import DataError
from darknet_py.network import parse_net_options

F32 = np.float32


# ---- the fork's code, transcribed loop by loop ----------------------------------------------
def c_rand_int(rng, lo, hi):
    """The fork's rand_int: [lo, hi] inclusive, swapped when hi < lo."""
    if hi < lo:
        lo, hi = hi, lo
    return int(rng.integers(lo, hi + 1))


def c_float_to_int(x):
    return int(F32(x))


def c_mix_row(use_mixup, d, d2, d3, d4, y, y2, y3, y4, w, h, rng):
    """load_data_augment's mixing of row i (after its coin said mix), statement by
    statement. d..d4 are Darknet's flat (c, h, w) rows, y..y4 the label rows."""
    d, y = d.copy(), y.copy()
    mixup = use_mixup
    if use_mixup == 4:
        mixup = c_rand_int(rng, 2, 3)
    if mixup == 1:
        for j in range(d.size):
            d[j] = (d[j] + d2[j]) / F32(2.0)
        for j in range(y.size):
            y[j] = (y[j] + y2[j]) / F32(2.0)
    elif mixup == 2:
        lo, hi = F32(0.3), F32(0.8)
        cut_w = c_rand_int(rng, c_float_to_int(F32(w) * lo), c_float_to_int(F32(w) * hi))
        cut_h = c_rand_int(rng, c_float_to_int(F32(h) * lo), c_float_to_int(F32(h) * hi))
        cut_x = c_rand_int(rng, 0, w - cut_w - 1)
        cut_y = c_rand_int(rng, 0, h - cut_h - 1)
        left, right, top, bot = cut_x, cut_x + cut_w, cut_y, cut_y + cut_h
        alpha = F32(cut_w * cut_h) / F32(w * h)
        beta = F32(1) - alpha
        for c in range(3):
            for yy in range(top, bot):
                for x in range(left, right):
                    j = x + yy * w + c * w * h
                    d[j] = d2[j]
        for j in range(y.size):
            y[j] = y[j] * beta + y2[j] * alpha
    elif mixup == 3:
        min_offset = F32(0.2)
        cut_x = c_rand_int(
            rng, c_float_to_int(F32(w) * min_offset), c_float_to_int(F32(w) * (F32(1) - min_offset))
        )
        cut_y = c_rand_int(
            rng, c_float_to_int(F32(h) * min_offset), c_float_to_int(F32(h) * (F32(1) - min_offset))
        )
        s1 = F32(cut_x * cut_y) / F32(w * h)
        s2 = F32((w - cut_x) * cut_y) / F32(w * h)
        s3 = F32(cut_x * (h - cut_y)) / F32(w * h)
        s4 = F32((w - cut_x) * (h - cut_y)) / F32(w * h)
        for c in range(3):
            for yy in range(h):
                for x in range(w):
                    j = x + yy * w + c * w * h
                    if x >= cut_x and yy < cut_y:
                        d[j] = d2[j]
                    if x < cut_x and yy >= cut_y:
                        d[j] = d3[j]
                    if x >= cut_x and yy >= cut_y:
                        d[j] = d4[j]
        for j in range(y.size):
            y[j] = y[j] * s1 + y2[j] * s2 + y3[j] * s3 + y4[j] * s4
    return d, y


@pytest.mark.parametrize("kind", [MIXUP, CUTMIX, MOSAIC])
@pytest.mark.parametrize("w,h", [(10, 10), (13, 9), (30, 20)])
def test_mixing_matches_the_forks_load_data_augment(kind, w, h):
    for seed in range(4):
        rng = np.random.default_rng(seed)
        images = [rng.random((h, w, 3)).astype(F32) for _ in range(4)]
        truths = [rng.random(5).astype(F32) for _ in range(4)]
        got, got_truth = mix_classifier_samples(
            kind, images, truths, np.random.default_rng(100 + seed)
        )
        flat = [a.transpose(2, 0, 1).reshape(-1) for a in images]
        want, want_truth = c_mix_row(kind, *flat, *truths, w, h, np.random.default_rng(100 + seed))
        np.testing.assert_array_equal(got.transpose(2, 0, 1).reshape(-1), want)
        np.testing.assert_array_equal(got_truth, want_truth)
        assert got.dtype == F32 and got_truth.dtype == F32


def test_cut_bounds_truncate_as_the_forks_float_products():
    for share in (0.2, 0.3, 0.8):
        assert [int(n * share) for n in range(1, 700)] == [
            c_float_to_int(F32(n) * F32(share)) for n in range(1, 700)
        ]


# ---- whole samples on solid colours ---------------------------------------------------------
COLOURS = np.array([(1, 0, 0), (0, 1, 0), (0, 0, 1), (1, 1, 0)], dtype=F32)
ONE_HOT = np.eye(4, dtype=F32)
W, H = 20, 16


def sample(seed, mix, blur=0, image=None):
    """A sample of image 0 (red unless given) mixed with images 1-3 as needed; returns
    (image, truth, how many other images were drawn)."""
    aug = ForkClassifierAugment(center=True, flip=False, mix=mix, blur=blur)
    queue = [(np.full((24, 24, 3), c, dtype=F32), t) for c, t in zip(COLOURS[1:], ONE_HOT[1:])]
    first = np.full((24, 24, 3), COLOURS[0], dtype=F32) if image is None else image
    drawn = []
    out, truth = fork_classifier_sample(
        first,
        ONE_HOT[0],
        lambda: drawn.append(1) or queue.pop(0),
        aug,
        W,
        H,
        np.random.default_rng(seed),
    )
    return out, truth, len(drawn)


def pixel_shares(out):
    """Each colour's share of the pixels (the image's only colours)."""
    return np.array([np.all(np.isclose(out, c), axis=2).mean() for c in COLOURS], dtype=F32)


@pytest.mark.parametrize("mix", [CUTMIX, MOSAIC, CUTMIX_OR_MOSAIC])
def test_labels_are_each_images_share_of_the_pixels(mix):
    kinds = set()
    plain = 0
    for seed in range(40):
        out, truth, drawn = sample(seed, mix)
        if not drawn:  # the fork's coin: this sample is not mixed
            plain += 1
            np.testing.assert_array_equal(truth, ONE_HOT[0])
            assert pixel_shares(out)[0] == 1
            continue
        assert drawn == (1 if mix == CUTMIX else 3)
        shares = pixel_shares(out)
        np.testing.assert_allclose(truth, shares, atol=1e-6)
        assert shares.sum() == pytest.approx(1) and shares[0] > 0
        kinds.add("mosaic" if (shares > 0).sum() == 4 else "cutmix")
    assert 10 < plain < 30  # about half, as the fork's coin
    assert kinds == {"cutmix", "mosaic"} if mix == CUTMIX_OR_MOSAIC else len(kinds) == 1
    if mix == MOSAIC:
        out, _, drawn = next(s for s in map(lambda k: sample(k, MOSAIC), range(40)) if s[2])
        # Top left, top right, bottom left, bottom right: images 0, 1, 2, 3.
        for (r, c), colour in zip(((0, 0), (0, -1), (-1, 0), (-1, -1)), COLOURS):
            np.testing.assert_array_equal(out[r, c], colour)


def test_mixup_averages_the_images_and_the_labels():
    for seed in range(10):
        out, truth, drawn = sample(seed, MIXUP)
        if drawn:
            np.testing.assert_allclose(
                out, np.broadcast_to((COLOURS[0] + COLOURS[1]) / 2, out.shape), atol=1e-6
            )
            np.testing.assert_array_equal(truth, [0.5, 0.5, 0, 0])
            return
    pytest.fail("no mixup in 10 samples")


def test_blur_blurs_a_quarter_of_the_samples():
    noise = np.random.default_rng(0).random((24, 24, 3)).astype(F32)
    sharp = sample(0, 0, image=noise)[0].std()
    blurred = [sample(seed, 0, blur=3, image=noise)[0].std() < 0.8 * sharp for seed in range(80)]
    assert 10 <= sum(blurred) <= 30


def test_same_seed_same_sample():
    a, ta, _ = sample(7, CUTMIX_OR_MOSAIC, blur=1)
    b, tb, _ = sample(7, CUTMIX_OR_MOSAIC, blur=1)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(ta, tb)


# ---- [net] options ----------------------------------------------------------------------------
def net_options(text):
    (net,) = parse_cfg_text("[net]\nwidth=8\nheight=8\nchannels=3\n" + text)
    return parse_net_options(net)


@pytest.mark.parametrize(
    "text,mix",
    [
        ("mixup=1\n", MIXUP),
        ("cutmix=1\n", CUTMIX),
        ("mosaic=1\n", MOSAIC),
        ("mixup=3\n", MOSAIC),
        ("mosaic=1\ncutmix=1\nmixup=1\n", CUTMIX_OR_MOSAIC),
    ],
)
def test_net_options_choose_the_forks_mix(text, mix):
    aug = classifier_augment(net_options(text))
    assert isinstance(aug, ForkClassifierAugment) and aug.mix == mix


def test_classifier_options_the_fork_refuses_or_ignores():
    assert type(classifier_augment(net_options(""))) is ClassifierAugment
    with pytest.raises(DataError, match="mixup=5: the AlexeyAB fork knows 0"):
        classifier_augment(net_options("mixup=5\n"))
    with pytest.raises(DataError, match="blur=4: .* must be odd"):
        classifier_augment(net_options("blur=4\n"))
    assert classifier_augment(net_options("blur=1\n")).blur == 1
    warned = []
    aug = classifier_augment(net_options("gaussian_noise=5\nmixup=1\n"), warn=warned.append)
    assert aug.mix == MIXUP and warned == [
        "gaussian_noise=5 is a detector augmentation: a classifier trains without it (as in "
        "the AlexeyAB fork)"
    ]


def test_a_detector_reads_mixup_numbers_as_the_fork_does():
    head = types.SimpleNamespace(jitter=0.3, resize=1.0)
    aug = detector_augment(net_options("mixup=3\n"), head)  # mosaic
    assert isinstance(aug, ForkAugment) and aug.mosaic and not aug.mixup
    warned = []
    aug = detector_augment(net_options("mixup=2\n"), head, warn=warned.append)  # cutmix
    assert not aug.mosaic and not aug.mixup and "cutmix is a classifier" in warned[0]
    aug = detector_augment(net_options("mixup=1\n"), head)
    assert aug.mixup and not aug.mosaic


# ---- label smoothing ([net] label_smooth_eps) ----------------------------------------------
def c_fill_truth_smooth(class_id, k, eps):
    """The fork's fill_truth_smooth, a loop over the classes."""
    truth = [0.0] * k
    for i in range(k):
        truth[i] = np.float32(1 - eps) if i == class_id else np.float32(eps) / np.float32(k - 1)
    return np.array(truth, dtype=F32)


@pytest.mark.parametrize("k,eps", [(2, 0.1), (4, 0.05), (10, 0.3)])
def test_label_smoothing_matches_the_forks_fill_truth_smooth(k, eps):
    for class_id in (0, k - 1):
        np.testing.assert_array_equal(
            smooth_classifier_truth(np.eye(k, dtype=F32)[class_id], eps),
            c_fill_truth_smooth(class_id, k, eps),
        )
    np.testing.assert_array_equal(
        smooth_classifier_truth(np.eye(k, dtype=F32)[1], 0.0), np.eye(k, dtype=F32)[1]
    )


def test_smoothed_labels_are_smoothed_before_mixing():
    """mixup of a red (class 0) and a green (class 1) sample, eps 0.2 over 4 classes:
    each row is (0.8, 0.2/3, 0.2/3, 0.2/3) or its class-1 twin before they are averaged."""
    aug = ForkClassifierAugment(center=True, flip=False, mix=MIXUP, label_smooth_eps=0.2)
    green = (np.full((24, 24, 3), COLOURS[1], dtype=F32), ONE_HOT[1])
    for seed in range(8):  # the coin decides whether a sample is mixed
        out, truth = fork_classifier_sample(
            np.full((24, 24, 3), COLOURS[0], dtype=F32),
            ONE_HOT[0],
            lambda: green,
            aug,
            W,
            H,
            np.random.default_rng(seed),
        )
        plain = c_fill_truth_smooth(0, 4, 0.2)
        mixed = (plain + c_fill_truth_smooth(1, 4, 0.2)) / F32(2)
        assert np.allclose(truth, plain) or np.allclose(truth, mixed)
        np.testing.assert_allclose(truth.sum(), 1, atol=1e-6)


def test_label_smooth_eps_option():
    aug = classifier_augment(net_options("label_smooth_eps=0.1\n"))
    assert isinstance(aug, ForkClassifierAugment) and aug.label_smooth_eps == pytest.approx(0.1)
    assert aug.mix == 0 and aug.blur == 0
    with pytest.raises(CfgError, match="label_smooth_eps: must be at least 0 and below 1, got 1"):
        net_options("label_smooth_eps=1\n")
    warned = []
    detector_augment(
        net_options("label_smooth_eps=0.1\n"),
        types.SimpleNamespace(jitter=0.3, resize=1.0),
        fork=True,
        warn=warned.append,
    )
    assert warned == [
        "[net] label_smooth_eps=0.1 smooths a classifier's labels: a detector "
        "trains without it (as in the AlexeyAB fork; [yolo] has its own)"
    ]


# ---- the loader and a training run -----------------------------------------------------------
def test_loader_mixes_classifier_batches_reproducibly(bars):
    from darknet_py.data.config import read_list
    from darknet_py.data.loader import DataLoader

    paths = read_list(bars / "train.list")
    aug = ForkClassifierAugment(min_ratio=1, max_ratio=1.2, flip=False, mix=CUTMIX_OR_MOSAIC)

    def batches(seed, workers):
        with DataLoader(
            paths,
            task="classifier",
            width=12,
            height=12,
            batch=8,
            classes=2,
            labels=["horiz", "vert"],
            channels=1,
            augment=aug,
            seed=seed,
            workers=workers,
        ) as loader:
            return [tuple(np.array(a) for a in loader.next_batch()) for _ in range(3)]

    first, again = batches(3, 2), batches(3, 0)
    for (x, t), (x2, t2) in zip(first, again):
        np.testing.assert_array_equal(x, x2)
        np.testing.assert_array_equal(t, t2)
    truth = np.concatenate([t for _, t in first])
    np.testing.assert_allclose(truth.sum(axis=1), 1, atol=1e-6)
    mixed = (truth > 0) & (truth < 1)
    assert 4 <= mixed.any(axis=1).sum() <= 20  # about half the 24 samples


def test_training_a_classifier_with_cutmix_and_mosaic_runs(bars, tmp_path):
    from darknet_py.train import train

    text = CLASSIFIER_CFG.replace(
        "flip=0\n", "flip=0\nmosaic=1\ncutmix=1\nblur=3\nlabel_smooth_eps=0.1\n"
    )
    cfg = write_classifier_cfg(tmp_path, max_batches=4, text=text)
    log = Lines()
    result = train(
        cfg, data_file(bars, tmp_path / "backup"), seed=1, device="cpu", log=log, workers=0
    )
    assert result.iterations == 4 and np.isfinite([loss for _, loss, *_ in result.losses]).all()
    assert not [line for line in log if "warning" in line]
