"""The training augmentations as they were before their fast paths (bench/NOTES.md, L1),
kept unchanged as the reference the fast paths must equal bit for bit (tests/
test_augment_fast_paths.py). Not used by darknet_py."""

import math

import numpy as np

from darknet_py.data.augment import _cv2, _rand_scale, _rand_uniform, _warp_hwc
from darknet_py.data.augment_fork import (
    MOSAIC_MIN_OFFSET,
    TRUTH_FIELDS,
    PieceDraws,
    crop_borders,
    fork_fill_truth,
    mosaic_truth,
)
from darknet_py.data.labels import MAX_BOXES, detection_truth
from darknet_py.image import decode_image


def read_hwc(path, channels=3):
    """load_image's result as (H, W, C): what the augmentation works on, without the
    two transposes a round trip through (C, H, W) would cost."""
    cv2 = _cv2()
    # load_image's checks (a pipe, a truncated file, a huge header), without its capture of
    # the decoder's messages: loader workers silence those themselves.
    a, _ = decode_image(path, channels, quiet_decoder=False)
    if a.ndim == 2:
        a = a[:, :, None]
    elif channels == 3:
        a = cv2.cvtColor(a, cv2.COLOR_BGR2RGB)
    return np.divide(a, np.float32(255), dtype=np.float32)


def _distort_hwc(hwc, hue, saturation, exposure):
    if hwc.shape[2] == 1:
        return np.clip(hwc * np.float32(exposure), 0, 1).astype(np.float32)
    if hwc.shape[2] != 3:
        raise ValueError(f"distort_image: expected 1 or 3 channels, got {hwc.shape[2]}")
    cv2 = _cv2()
    hsv = cv2.cvtColor(hwc, cv2.COLOR_RGB2HSV)  # hue in degrees
    # Darknet wraps the shifted hue once into [0, 1]; OpenCV's HSV->RGB wraps hues of
    # 360 and more itself, so only a negative shift needs a turn added. (OpenCV's
    # per-channel scalar ops: NumPy's take twice as long and hold the GIL.)
    cv2.add(hsv, ((hue + (hue < 0)) * 360, 0, 0, 0), dst=hsv)
    cv2.multiply(hsv, (1, saturation, exposure, 1), dst=hsv)
    rgb = cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB)
    cv2.max(rgb, (0, 0, 0, 0), dst=rgb)
    cv2.min(rgb, (1, 1, 1, 1), dst=rgb)
    return rgb


def _random_distort_hwc(hwc, rng, hue, saturation, exposure):
    dhue = _rand_uniform(rng, -hue, hue)
    dsat = _rand_scale(rng, saturation)
    dexp = _rand_scale(rng, exposure)
    if dhue == 0 and dsat == 1 and dexp == 1:
        return hwc
    return _distort_hwc(hwc, dhue, dsat, dexp)


def augment_detection_hwc(hwc, boxes, augment, w, h, rng, max_boxes=MAX_BOXES):
    """One detector training (input, truth row) as pjreddie's load_data_detection makes it
    (src/data.c): the whole image, its aspect ratio jittered by up to +-jitter of each
    side, shrunk to fit w x h and placed at a random offset on a grey (0.5) canvas, its HSV
    distorted, maybe mirrored; the boxes move the same way, so none is ever cut by the
    crop (the fork's crop rule is augment_fork's)."""
    oh, ow = hwc.shape[:2]
    dw, dh = augment.jitter * ow, augment.jitter * oh
    new_ar = (ow + _rand_uniform(rng, -dw, dw)) / (oh + _rand_uniform(rng, -dh, dh))
    if new_ar < 1:
        nh = float(h)
        nw = nh * new_ar
    else:
        nw = float(w)
        nh = nw / new_ar
    dx = _rand_uniform(rng, 0, w - nw)
    dy = _rand_uniform(rng, 0, h - nh)
    out = _place_hwc(hwc, int(nw), int(nh), int(dx), int(dy), w, h)
    out = _random_distort_hwc(out, rng, augment.hue, augment.saturation, augment.exposure)
    flip = bool(augment.flip and rng.integers(2))
    if flip:
        out = np.ascontiguousarray(out[:, ::-1])
    return out, detection_truth(boxes, max_boxes, -dx / w, -dy / h, nw / w, nh / h, flip, rng)


def _place_hwc(hwc, pw, ph, px, py, w, h):
    """Darknet's place_image on a w x h canvas filled with 0.5: canvas pixel (px + x,
    py + y), 0 <= x < pw, 0 <= y < ph, is the bilinear sample of the image at
    (x * iw / pw, y * ih / ph), pixels beyond the image counting as 0 (get_pixel_extend);
    what falls outside the canvas is dropped."""
    ih, iw = hwc.shape[:2]
    canvas = np.full((h, w, hwc.shape[2]), 0.5, dtype=np.float32)
    if pw <= 0 or ph <= 0:
        return canvas
    sx, sy = iw / pw, ih / ph
    placed = _warp_hwc(hwc, [[sx, 0, -px * sx], [0, sy, -py * sy]], w, h, False)
    x0, y0 = max(px, 0), max(py, 0)
    x1, y1 = min(px + pw, w), min(py + ph, h)
    canvas[y0:y1, x0:x1] = placed[y0:y1, x0:x1]
    return canvas


def image_data_augmentation(
    hwc, w, h, pleft, ptop, swidth, sheight, flip, dhue, dsat, dexp, noise, blur, truth, rng
):
    """The fork's image_data_augmentation: crop (outside the image: its mean colour),
    resize to w x h (OpenCV, bilinear), mirror, HSV, blur, positive noise."""
    cv2 = _cv2()
    oh, ow = hwc.shape[:2]
    if (pleft, ptop, swidth, sheight) == (0, 0, ow, oh):
        cropped = hwc
    else:
        cropped = np.empty((sheight, swidth, hwc.shape[2]), dtype=np.float32)
        cropped[:] = hwc.reshape(-1, hwc.shape[2]).mean(axis=0)
        x0, y0 = max(0, pleft), max(0, ptop)
        x1, y1 = min(ow, pleft + swidth), min(oh, ptop + sheight)
        if x1 > x0 and y1 > y0:
            cropped[y0 - ptop : y1 - ptop, x0 - pleft : x1 - pleft] = hwc[y0:y1, x0:x1]
    sized = cv2.resize(cropped, (w, h), interpolation=cv2.INTER_LINEAR)
    sized = sized[:, :, None] if sized.ndim == 2 else sized
    if flip:
        sized = sized[:, ::-1]
    sized = np.ascontiguousarray(sized, dtype=np.float32)
    if dsat != 1 or dexp != 1 or dhue != 0:
        if sized.shape[2] >= 3:
            hsv = cv2.cvtColor(sized, cv2.COLOR_RGB2HSV)  # hue in degrees
            # 8-bit OpenCV hue has 180 steps: the fork adds 179*dhue of them.
            hsv[:, :, 0] = np.mod(hsv[:, :, 0] + np.float32(2 * 179 * dhue), 360)
            hsv[:, :, 1] *= np.float32(dsat)
            hsv[:, :, 2] *= np.float32(dexp)
            sized = cv2.cvtColor(hsv, cv2.COLOR_HSV2RGB)
        else:
            sized = sized * np.float32(dexp)
        sized = np.clip(sized, 0, 1).astype(np.float32)  # the fork's 8-bit image saturates
    if blur:
        size = 17 if blur == 1 else (blur // 2) * 2 + 1
        blurred = cv2.GaussianBlur(sized, (size, size), 0)
        blurred = blurred[:, :, None] if blurred.ndim == 2 else blurred
        if blur == 1:  # only the background: the boxes keep their sharp pixels
            for x, y, bw, bh in truth[:, :4]:
                left, top = int((x - bw / 2) * w), int((y - bh / 2) * h)
                right, bottom = left + int(bw * w), top + int(bh * h)
                left, top = max(left, 0), max(top, 0)
                right, bottom = min(right, w), min(bottom, h)
                if right > left and bottom > top:
                    blurred[top:bottom, left:right] = sized[top:bottom, left:right]
        sized = blurred
    if noise:
        # cv::randn into an 8-bit image: negative draws become 0, then a saturating add.
        sigma = min(max(noise, 0), 127)
        levels = np.rint(np.maximum(rng.normal(0, sigma, sized.shape), 0))
        sized = np.clip(sized + (levels / 255).astype(np.float32), 0, 1)
    return np.ascontiguousarray(sized, dtype=np.float32)


def augment_piece(hwc, boxes, aug, w, h, rng, max_boxes, piece=None):
    """One image of a sample: returns (image (h, w, C), truth (n, 5), borders, flip)."""
    oh, ow = hwc.shape[:2]
    d = PieceDraws.draw(rng, aug)
    pleft, pright, ptop, pbot = crop_borders(ow, oh, w, h, aug, d, piece)
    swidth, sheight = ow - pleft - pright, oh - ptop - pbot
    sx, sy = swidth / ow, sheight / oh
    dx, dy = (pleft / ow) / sx, (ptop / oh) / sy
    truth, min_side = fork_fill_truth(boxes, dx, dy, 1 / sx, 1 / sy, d.flip, w, h, rng, max_boxes)
    blur = d.blur
    if blur > 1 and min_side / 8 < blur:
        blur = int(min_side / 8)  # a small object would vanish under a wide blur
    out = image_data_augmentation(
        hwc,
        w,
        h,
        pleft,
        ptop,
        swidth,
        sheight,
        d.flip,
        d.hue,
        d.sat,
        d.exp,
        d.noise,
        blur,
        truth,
        rng,
    )
    return out, truth, (pleft, pright, ptop, pbot), d.flip


def fork_detection_sample(hwc, boxes, draw_image, aug, w, h, rng, max_boxes=MAX_BOXES):
    """One detector training (input (h, w, C), truth row (max_boxes * 5,)) as the fork's
    load_data_detection makes it. `draw_image()` returns another random (image, boxes)
    of the training list for a mosaic's or a mixup's other images."""
    kind = "mosaic" if aug.mosaic else "mixup" if aug.mixup else None
    if kind and rng.integers(2) == 0:
        kind = None  # the fork leaves half of its loads plain
    if kind is None:
        out, truth, _, _ = augment_piece(hwc, boxes, aug, w, h, rng, max_boxes)
    elif kind == "mixup":
        first, truth, _, _ = augment_piece(hwc, boxes, aug, w, h, rng, max_boxes)
        second, more, _, _ = augment_piece(*draw_image(), aug, w, h, rng, max_boxes)
        out = np.float32(0.5) * second + np.float32(0.5) * first
        truth = np.concatenate([truth, more])
    else:
        cut_x = int(rng.integers(int(w * MOSAIC_MIN_OFFSET), int(w * (1 - MOSAIC_MIN_OFFSET)) + 1))
        cut_y = int(rng.integers(int(h * MOSAIC_MIN_OFFSET), int(h * (1 - MOSAIC_MIN_OFFSET)) + 1))
        out = np.zeros((h, w, hwc.shape[2]), dtype=np.float32)
        parts = []
        for piece in range(4):
            image, piece_boxes = (hwc, boxes) if piece == 0 else draw_image()
            oh, ow = image.shape[:2]
            ai, truth, (pleft, pright, ptop, pbot), flip = augment_piece(
                image, piece_boxes, aug, w, h, rng, max_boxes, piece
            )
            if flip:
                pleft, pright = pright, pleft
            # How much of the piece is padding on each side, in network pixels: the
            # window moves past it so that image content fills the corner.
            shifts = (
                min(cut_x, max(0, math.trunc(-pleft * w / ow))),
                min(w - cut_x, max(0, math.trunc(-pright * w / ow))),
                min(cut_y, max(0, math.trunc(-ptop * h / oh))),
                min(h - cut_y, max(0, math.trunc(-pbot * h / oh))),
            )
            left_shift, right_shift, top_shift, bot_shift = shifts
            sx = w - cut_x - right_shift if piece in (0, 2) else left_shift
            sy = h - cut_y - bot_shift if piece in (0, 1) else top_shift
            dx, dwid = (0, cut_x) if piece in (0, 2) else (cut_x, w - cut_x)
            dy, dhei = (0, cut_y) if piece in (0, 1) else (cut_y, h - cut_y)
            out[dy : dy + dhei, dx : dx + dwid] = ai[sy : sy + dhei, sx : sx + dwid]
            parts.append(mosaic_truth(truth, piece, cut_x, cut_y, shifts, w, h, aug.mosaic_bound))
        truth = np.concatenate(parts)
    row = np.zeros((max_boxes, TRUTH_FIELDS), dtype=np.float32)
    truth = truth[:max_boxes]
    row[: len(truth)] = truth
    return out, row.reshape(-1)
