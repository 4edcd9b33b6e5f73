"""Darknet's training-time image augmentation (src/image.c, src/data.c), one sample at a
time: each per-sample function takes the decoded image, the settings and a NumPy
generator, and draws all its randomness from that generator, so a seed reproduces it.
Images are float32 RGB in [0, 1]."""

import math
from dataclasses import dataclass

import numpy as np

from ..image import decode_image, letterbox, resize_image
from .labels import MAX_BOXES, detection_truth


def _rand_uniform(rng, lo, hi):
    if hi < lo:
        lo, hi = hi, lo
    return float(rng.uniform(lo, hi)) if hi > lo else float(lo)


def _rand_scale(rng, s):
    """Darknet's rand_scale: a factor in [1, s], inverted half of the time."""
    scale = _rand_uniform(rng, 1.0, s)
    return scale if rng.integers(2) else 1.0 / scale


def _rand_int(rng, lo, hi):
    if hi < lo:
        lo, hi = hi, lo
    return int(rng.integers(lo, hi + 1))


def _cv2():
    import cv2  # imported lazily, as in image.py

    return cv2


# The augmentation runs on (H, W, C) arrays with OpenCV, which is several times faster
# than NumPy here. The *_hwc functions work on (H, W, C); the others take and return
# Darknet's (C, H, W).


def _channels_kept(out):
    """OpenCV returns a one-channel image as (H, W): give it its channel axis back."""
    return out[:, :, None] if out.ndim == 2 else out


def mirror_hwc(hwc):
    """hwc mirrored left to right, as a new contiguous array (OpenCV's flip: ~15x faster
    than NumPy's copy of a reversed view)."""
    return _channels_kept(_cv2().flip(hwc, 1))


# NumPy's float32 mean over axis 0 of (pixels, C), C = 2 to 4, adds the pixels one by one in
# float32, in order (one channel: pairwise, and fast). OpenCV's float32 integral of the
# pixels laid out as one row adds them in that order too, 3-4x faster; mean_colour checks
# once a process, for each C, that both agree.
_integral_sums_agree = {}  # channels -> bool
_SUM_CHUNK = 1 << 19  # pixels an integral adds at a time: its output is 8 floats a pixel


def _sums_in_order(flat):
    """Each column of the float32 (N, C) array, C = 2 to 4, summed in row order, in float32."""
    cv2 = _cv2()
    n, c = flat.shape
    sums = np.zeros(c, dtype=np.float32)
    for start in range(0, n, _SUM_CHUNK):
        chunk = flat[start : start + _SUM_CHUNK]
        if start:  # go on from the sums so far: they lead the chunk as its first pixel
            chunk = np.concatenate([sums[None], chunk])
        row = chunk.reshape(1, len(chunk), c)
        sums = np.array(cv2.integral(row, sdepth=cv2.CV_32F)[1, -1], dtype=np.float32)
    return sums.reshape(c)


def mean_colour(hwc):
    """The mean of each channel of a float32 (H, W, C) image: bit for bit what
    hwc.reshape(-1, C).mean(axis=0) gives (for 2 to 4 channels its float32 sum in pixel
    order, divided as NumPy's mean divides), at a quarter of its cost."""
    flat = np.ascontiguousarray(hwc, dtype=np.float32).reshape(-1, hwc.shape[-1])
    channels = flat.shape[1]
    if not 2 <= channels <= 4 or not len(flat):
        return flat.mean(axis=0)
    if channels not in _integral_sums_agree:
        probe = np.random.default_rng(channels).random((100_003, channels), dtype=np.float32)
        _integral_sums_agree[channels] = bool(
            np.array_equal(_sums_in_order(probe), probe.sum(axis=0))
        )
    if not _integral_sums_agree[channels]:
        return flat.mean(axis=0)
    sums = _sums_in_order(flat)
    return np.true_divide(sums, np.intp(len(flat)), out=sums, casting="unsafe")


def to_hwc(img):
    return np.ascontiguousarray(img.transpose(1, 2, 0), dtype=np.float32)


def from_hwc(a):
    return np.ascontiguousarray((a[:, :, None] if a.ndim == 2 else a).transpose(2, 0, 1))


def _warp_hwc(hwc, source_of, w, h, replicate_edges):
    """Bilinear samples of hwc at source_of @ (x, y, 1) for each output pixel (x, y)."""
    cv2 = _cv2()
    out = cv2.warpAffine(
        hwc,
        np.asarray(source_of, dtype=np.float64),
        (w, h),
        flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
        borderMode=cv2.BORDER_REPLICATE if replicate_edges else cv2.BORDER_CONSTANT,
        borderValue=0,
    )
    return out[:, :, None] if out.ndim == 2 else out


def crop_image(img, dx, dy, w, h):
    """Darknet's crop_image: the w x h window at (dx, dy); pixels outside the image take
    the nearest edge pixel."""
    c, ih, iw = img.shape
    rows = np.clip(np.arange(h) + dy, 0, ih - 1)
    cols = np.clip(np.arange(w) + dx, 0, iw - 1)
    return np.ascontiguousarray(img[:, rows][:, :, cols], dtype=np.float32)


def _crop_resize_source(dx, dy, cw, ch, w, h):
    """Affine map for crop_image(dx, dy, cw, ch) followed by Darknet's resize_image to
    w x h: that resize samples source pixel x * (cw-1)/(w-1) (corners aligned), and
    bilinear sampling with replicated edges equals sampling the edge-clamped crop."""
    return [[(cw - 1) / (w - 1), 0, dx], [0, (ch - 1) / (h - 1), dy]]


def _crop_resize_hwc(hwc, dx, dy, cw, ch, w, h):
    if w < 2 or h < 2:  # Darknet's resize takes the last row/column here; rare enough
        img = crop_image(from_hwc(hwc), dx, dy, cw, ch)
        return to_hwc(resize_image(img, w, h))
    return _warp_hwc(hwc, _crop_resize_source(dx, dy, cw, ch, w, h), w, h, True)


def center_crop_hwc(hwc, w, h):
    """Darknet's center_crop_image: the central square, resized to w x h (the classifier's
    validation input)."""
    ih, iw = hwc.shape[:2]
    m = min(iw, ih)
    return _crop_resize_hwc(hwc, (iw - m) // 2, (ih - m) // 2, m, m, w, h)


def _rotate_crop_source(iw, ih, rad, scale, w, h, dx, dy, aspect):
    """Darknet's rotate_crop_image samples, for output pixel (x, y),
    u = ((x - w/2) + dx) * aspect / scale,  v = ((y - h/2) + dy) / scale,
    source (cos*u - sin*v + iw/2,  sin*u + cos*v + ih/2):  an affine map."""
    cos, sin = math.cos(rad), math.sin(rad)
    ax = aspect / scale
    u0, v0 = (dx - w / 2) * ax, (dy - h / 2) / scale
    return [
        [cos * ax, -sin / scale, cos * u0 - sin * v0 + iw / 2],
        [sin * ax, cos / scale, sin * u0 + cos * v0 + ih / 2],
    ]


def rotate_crop_image(img, rad, scale, w, h, dx, dy, aspect):
    """Darknet's rotate_crop_image: a w x h view of img rotated by ``rad`` about its
    centre, scaled by ``scale`` (x also by 1/aspect), shifted by (dx, dy) output pixels;
    bilinear, reading 0 outside the image."""
    c, ih, iw = img.shape
    source_of = _rotate_crop_source(iw, ih, rad, scale, w, h, dx, dy, aspect)
    return from_hwc(_warp_hwc(to_hwc(img), source_of, w, h, False))


def _random_augment_source(rng, iw, ih, angle, aspect, low, high, w, h):
    aspect = _rand_scale(rng, aspect)
    r = _rand_int(rng, low, high)
    shorter = int(min(ih, iw * aspect))
    scale = r / max(shorter, 1)
    rad = _rand_uniform(rng, -angle, angle) * 2 * math.pi / 360
    dx = (iw * scale / aspect - w) / 2
    dy = (ih * scale - h) / 2  # Darknet subtracts w here; the same for its square crops
    dx = _rand_uniform(rng, -dx, dx)
    dy = _rand_uniform(rng, -dy, dy)
    return _rotate_crop_source(iw, ih, rad, scale, w, h, dx, dy, aspect)


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


def rgb_to_hsv(img):
    """Darknet's rgb_to_hsv on a (3, H, W) image: hue, saturation, value all in [0, 1]
    (hue in turns: Darknet's formulas, which OpenCV computes in degrees)."""
    hsv = _cv2().cvtColor(to_hwc(img), _cv2().COLOR_RGB2HSV)
    hsv[:, :, 0] *= np.float32(1 / 360)
    return from_hwc(hsv)


def hsv_to_rgb(img):
    """Darknet's hsv_to_rgb, the inverse of rgb_to_hsv (values are not clipped)."""
    hsv = to_hwc(img)
    hsv[:, :, 0] *= np.float32(360)
    return from_hwc(_cv2().cvtColor(hsv, _cv2().COLOR_HSV2RGB))


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


def distort_image(img, hue, saturation, exposure):
    """Darknet's distort_image: shift hue (wrapping), scale saturation and value, clip.
    A one-channel image has no hue or saturation: only exposure applies."""
    return from_hwc(_distort_hwc(to_hwc(img), hue, saturation, exposure))


def _random_distort_hwc(hwc, rng, hue, saturation, exposure):
    dhue = _rand_uniform(rng, -hue, hue)
    dsat = _rand_scale(rng, saturation)
    dexp = _rand_scale(rng, exposure)
    if dhue == 0 and dsat == 1 and dexp == 1:
        return hwc
    return _distort_hwc(hwc, dhue, dsat, dexp)


@dataclass
class ClassifierAugment:
    """Darknet's classifier augmentation (load_data_augment). Crop sizes are ratios of the
    network width, as Darknet recomputes min/max from them when the width changes."""

    min_ratio: float = 1.0  # [net] min_crop / width (Darknet default min_crop = width)
    max_ratio: float = 2.0  # [net] max_crop / width (Darknet default max_crop = 2*width)
    angle: float = 0.0
    aspect: float = 1.0
    hue: float = 0.0
    saturation: float = 1.0
    exposure: float = 1.0
    center: bool = False  # centre crop instead of random crop/scale/rotate
    flip: bool = True  # Darknet always flips at random; flip=0 as in AlexeyAB's fork


@dataclass
class DetectorAugment:
    """pjreddie's detector augmentation (load_data_detection): aspect-ratio jitter and a
    random placement on a grey canvas, flip and HSV distortion. ``jitter`` comes from the
    last [yolo]/[region] layer."""

    jitter: float = 0.2
    hue: float = 0.0
    saturation: float = 1.0
    exposure: float = 1.0
    flip: bool = True


def augment_classifier_hwc(hwc, augment, w, h, rng):
    """One classifier training input as Darknet's load_image_augment_paths makes it:
    centre crop or random_augment_image, a random flip, random_distort_image."""
    ih, iw = hwc.shape[:2]
    if augment.center:
        out = center_crop_hwc(hwc, w, h)
    else:
        low, high = int(augment.min_ratio * w), int(augment.max_ratio * w)
        source_of = _random_augment_source(
            rng, iw, ih, augment.angle, augment.aspect, low, high, w, h
        )
        out = _warp_hwc(hwc, source_of, w, h, False)
    if augment.flip and rng.integers(2):
        out = mirror_hwc(out)
    return _random_distort_hwc(out, rng, augment.hue, augment.saturation, augment.exposure)


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
        out = mirror_hwc(out)
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


def prepare_detector_eval_image(img, w, h, letterbox_input=True):
    """A detector's test input: letterboxed as Darknet's validate_detector and
    test_detector do, or plainly resized (validate_detector_recall, older YOLO)."""
    return letterbox(img, w, h) if letterbox_input else resize_image(img, w, h)
