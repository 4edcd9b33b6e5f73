"""The AlexeyAB fork's detector training augmentation: its data.c load_data_detection and
image_opencv.cpp image_data_augmentation, switched on by [net] options.

Each sample is cropped with jitter (and the fork's `resize` range), kept at the network's
aspect ratio with letter_box=1, resized with OpenCV, mirrored, HSV-distorted, blurred
(blur=1: the background only, boxes stay sharp; blur=N>1: everything, a Gaussian of N
pixels, less when a box is small) and given positive Gaussian noise (gaussian_noise=N,
N grey levels). With mosaic=1 four such images fill the four corners around a random
centre (20-80% of each side), boxes moved and clipped; with mixup=1 two are blended
half and half, both images' boxes kept. As in the fork, half the samples get no mosaic
or mixup, and cutmix is a classifier augmentation (a detector ignores it).

For classifiers (the fork's load_data_augment), half the samples are mixed with other
images of the list: mixup (the mean of two images and of their labels), cutmix (a
rectangle of a second image pasted in) or mosaic (four images in the four corners around a
random centre), the labels weighted by each image's share of the area; blur=N blurs a
quarter of the samples.

Images are float32 RGB (H, W, C) in [0, 1]; the fork works on 8-bit images, so its
pixel quantities (noise, blur sizes) are in grey levels / pixels of those.
"""

import math
from dataclasses import dataclass

import numpy as np

from .augment import (
    ClassifierAugment,
    DetectorAugment,
    _channels_kept,
    _cv2,
    _rand_int,
    _rand_scale,
    _rand_uniform,
    augment_classifier_hwc,
    mean_colour,
    mirror_hwc,
)
from .config import DataError
from .labels import MAX_BOXES, correct_boxes

TRUTH_FIELDS = 5
MOSAIC_MIN_OFFSET = 0.2  # the mosaic's centre stays 20% away from every border
SIMD_COLUMNS = 64  # a colour jitter window's column alignment (image_data_augmentation)


@dataclass
class ForkAugment:
    """The fork's detector augmentation settings: [net] options and the last
    [yolo] layer's jitter and resize."""

    jitter: float = 0.2
    resize: float = 1.0
    hue: float = 0.0
    saturation: float = 1.0
    exposure: float = 1.0
    flip: bool = True
    letter_box: bool = False
    mosaic: bool = False
    mixup: bool = False
    mosaic_bound: bool = False
    blur: int = 0
    gaussian_noise: int = 0

    @property
    def pieces(self):
        """Images one sample is made of when it is a mosaic (4) or a mixup (2)."""
        return 4 if self.mosaic else 2 if self.mixup else 1


def _precalc(lo, hi, r):
    """The fork's rand_precalc_random, truncated to int as its callers store it."""
    if hi < lo:
        lo, hi = hi, lo
    return int(r * (hi - lo) + lo)


@dataclass
class PieceDraws:
    """The random numbers of one image of a sample, drawn in the fork's order."""

    resize_r1: float
    resize_r2: float
    r: tuple
    flip: bool
    hue: float
    sat: float
    exp: float
    blur: int
    noise: int
    corner: bool  # mosaic: push this image into its corner

    @classmethod
    def draw(cls, rng, aug):
        resize_r1, resize_r2 = rng.random(), rng.random()
        r = tuple(rng.random(4))
        flip = bool(aug.flip and rng.integers(2))
        dhue = _rand_uniform(rng, -aug.hue, aug.hue)
        dsat = _rand_scale(rng, aug.saturation)
        dexp = _rand_scale(rng, aug.exposure)
        blur = 0
        if aug.blur:
            choice = int(rng.integers(0, 3))  # 0: none, 1: background, 2: whole image
            blur = 0 if choice == 0 else 1 if choice == 1 else aug.blur
        noise = aug.gaussian_noise if aug.gaussian_noise and rng.integers(2) else 0
        corner = bool(rng.integers(2) == 0)
        return cls(resize_r1, resize_r2, r, flip, dhue, dsat, dexp, blur, noise, corner)


def crop_borders(ow, oh, w, h, aug, d, piece=None):
    """(pleft, pright, ptop, pbot): how far each side of the crop moves inwards (negative:
    outwards) for an ow x oh image, as the fork's load_data_detection works them out.
    `piece` is the image's mosaic corner (0..3), or None outside a mosaic."""
    dw, dh = int(ow * aug.jitter), int(oh * aug.jitter)
    pleft, pright = _precalc(-dw, dw, d.r[0]), _precalc(-dw, dw, d.r[1])
    ptop, pbot = _precalc(-dh, dh, d.r[2]), _precalc(-dh, dh, d.r[3])
    down = 1 / aug.resize if aug.resize > 1 else aug.resize
    up = 1 / aug.resize if aug.resize < 1 else aug.resize
    min_rdw, min_rdh = int(ow * (1 - 1 / down) / 2), int(oh * (1 - 1 / down) / 2)
    max_rdw, max_rdh = int(ow * (1 - 1 / up) / 2), int(oh * (1 - 1 / up) / 2)
    if aug.resize < 1:
        max_rdw = max_rdh = 0  # downsize only
    pleft += _precalc(min_rdw, max_rdw, d.resize_r1)
    pright += _precalc(min_rdw, max_rdw, d.resize_r2)
    ptop += _precalc(min_rdh, max_rdh, d.resize_r1)
    pbot += _precalc(min_rdh, max_rdh, d.resize_r2)
    if aug.letter_box:
        # Grow the crop to the network's aspect ratio: the image keeps its own.
        net_ar = w / h
        if (ow / oh) / net_ar > 1:
            delta = (ow / net_ar - oh) / 2
            ptop, pbot = int(ptop - delta), int(pbot - delta)
        else:
            delta = (oh * net_ar - ow) / 2
            pleft, pright = int(pleft - delta), int(pright - delta)
    if piece is not None and d.corner:
        # Push the image towards the mosaic's outer corner so most of it stays visible.
        to_left = (piece in (0, 2)) != d.flip  # the side the crop's slack moves to
        if to_left:
            pright, pleft = pright + pleft, 0
        else:
            pleft, pright = pleft + pright, 0
        if piece in (0, 1):
            pbot, ptop = pbot + ptop, 0
        else:
            ptop, pbot = ptop + pbot, 0
    if ow - pleft - pright <= 0 or oh - ptop - pbot <= 0 or ow - pleft <= 0 or oh - ptop <= 0:
        return 0, 0, 0, 0  # the fork resets an impossible crop to the whole image
    return pleft, pright, ptop, pbot


def fork_fill_truth(boxes, dx, dy, sx, sy, flip, w, h, rng, max_boxes=MAX_BOXES):
    """The fork's fill_truth_detection on read boxes: shuffle, correct_boxes, keep the
    first max_boxes; drop boxes under one network pixel and those whose centre left the
    image; sizes capped at 1. Returns ((n, 5) boxes, the smallest side in network pixels
    or 0 when there is none)."""
    b = np.array(boxes, dtype=np.float32).reshape(-1, TRUTH_FIELDS)
    if len(b) > 1:
        b = b[rng.permutation(len(b))]
    b = correct_boxes(b, dx, dy, sx, sy, flip)[:max_boxes]
    x, y, bw, bh = b[:, 0], b[:, 1], b[:, 2], b[:, 3]
    keep = (
        (bw >= np.float32(1 / w))
        & (bh >= np.float32(1 / h))
        & (x > 0)
        & (x <= 1)
        & (y > 0)
        & (y <= 1)
    )
    b = b[keep]
    b[:, 2:4] = np.minimum(b[:, 2:4], 1)
    min_side = float(min((b[:, 2] * w).min(), (b[:, 3] * h).min())) if len(b) else 0.0
    return b, min_side


def _resize_reads(lo, hi, source, target):
    """The first and last of `source` pixels that OpenCV's bilinear resize to `target`
    reads for the outputs lo..hi-1 (it samples (x + 0.5) * source / target - 0.5 and
    the pixel after), two more each side for its float32 rounding."""
    scale = source / target
    first = math.floor((lo + 0.5) * scale - 0.5) - 2
    last = math.floor((hi - 0.5) * scale - 0.5) + 3
    return max(first, 0), min(last, source - 1)


def _crop_with_fill(hwc, pleft, ptop, swidth, sheight, reads=None):
    """The swidth x sheight window of hwc at (pleft, ptop); pixels outside the image take
    its mean colour. A window inside the image is a view (no mean to compute).
    `reads` (first column, last column, first row, last row of the window): the only
    pixels anything will read; when they are all the image's, the fill's colour never
    shows and is left 0 (no mean to compute either)."""
    oh, ow, channels = hwc.shape
    x0, y0 = max(0, pleft), max(0, ptop)
    x1, y1 = min(ow, pleft + swidth), min(oh, ptop + sheight)
    if (x0, y0, x1, y1) == (pleft, ptop, pleft + swidth, ptop + sheight):
        return hwc[y0:y1, x0:x1]
    first_x, last_x, first_y, last_y = reads or (-1, -1, -1, -1)
    fill_unread = (
        reads is not None
        and x0 - pleft <= first_x
        and last_x < x1 - pleft
        and y0 - ptop <= first_y
        and last_y < y1 - ptop
    )
    if fill_unread:
        fill = np.zeros(channels, dtype=np.float32)
    else:
        fill = mean_colour(hwc)
    if x1 <= x0 or y1 <= y0 or channels > 4:
        cropped = np.empty((sheight, swidth, channels), dtype=np.float32)
        cropped[:] = fill
        if x1 > x0 and y1 > y0:
            cropped[y0 - ptop : y1 - ptop, x0 - pleft : x1 - pleft] = hwc[y0:y1, x0:x1]
        return cropped
    # One pass: the image's part of the window and the fill around it (a float32 border
    # value is exact through OpenCV's double Scalar).
    cv2 = _cv2()
    cropped = cv2.copyMakeBorder(
        hwc[y0:y1, x0:x1],
        y0 - ptop,
        ptop + sheight - y1,
        x0 - pleft,
        pleft + swidth - x1,
        cv2.BORDER_CONSTANT,
        value=tuple(float(v) for v in fill) + (0.0,) * (4 - channels),
    )
    return _channels_kept(cropped)


def wrap_degrees(hue):
    """np.mod(hue, 360) in place on float32 hues in (-360, 720), bit for bit, without its
    slow fmod: one of 360 or more loses a turn (exact), a negative one gains a turn
    (rounded as np.mod rounds it: a tiny negative hue becomes 360.0, as there)."""
    np.subtract(hue, np.float32(360), out=hue, where=hue >= 360)
    np.add(hue, np.float32(360), out=hue, where=hue < 0)
    return hue


def _fork_colour_jitter(rgb, dhue, dsat, dexp):
    """The fork's HSV jitter of a float32 (H, W, C) image (a view allowed), as a new array:
    hue shifted by 179 * dhue of OpenCV's 8-bit hue steps (wrapping), saturation and value
    scaled, the result clipped to [0, 1] as the fork's 8-bit image saturates."""
    cv2 = _cv2()
    if rgb.shape[2] < 3:
        out = rgb * np.float32(dexp)
    else:
        hue, sat, val = cv2.split(cv2.cvtColor(rgb, cv2.COLOR_RGB2HSV))  # hue in degrees
        hue += np.float32(2 * 179 * dhue)
        wrap_degrees(hue)
        sat *= np.float32(dsat)
        val *= np.float32(dexp)
        out = cv2.cvtColor(cv2.merge((hue, sat, val)), cv2.COLOR_HSV2RGB)
    return np.clip(out, 0, 1, out=out)


def image_data_augmentation(
    hwc,
    w,
    h,
    pleft,
    ptop,
    swidth,
    sheight,
    flip,
    dhue,
    dsat,
    dexp,
    noise,
    blur,
    truth,
    rng,
    window=None,
):
    """The fork's image_data_augmentation: crop (outside the image: its mean colour),
    resize to w x h (OpenCV, bilinear), mirror, HSV, blur, positive noise.
    `window` (x0, y0, x1, y1): only that part of the result is used (a mosaic's corner),
    the colour jitter skips the rest (left as resized), unless blur or noise need it."""
    cv2 = _cv2()
    oh, ow = hwc.shape[:2]
    if (pleft, ptop, swidth, sheight) == (0, 0, ow, oh):
        cropped = hwc
    else:
        reads = None
        if window is not None and not blur and not noise:
            x0, y0, x1, y1 = window
            if flip:  # the window's columns before the mirror
                x0, x1 = w - x1, w - x0
            reads = (
                *_resize_reads(x0, x1, swidth, w),
                *_resize_reads(y0, y1, sheight, h),
            )
        cropped = _crop_with_fill(hwc, pleft, ptop, swidth, sheight, reads)
    sized = _channels_kept(cv2.resize(cropped, (w, h), interpolation=cv2.INTER_LINEAR))
    if flip:
        sized = mirror_hwc(sized)
    if sized.dtype != np.float32 or not sized.flags.c_contiguous:
        sized = np.ascontiguousarray(sized, dtype=np.float32)
    if dsat != 1 or dexp != 1 or dhue != 0:
        x0, y0, x1, y1 = (0, 0, w, h) if window is None or blur or noise else window
        # OpenCV's RGB->HSV gives the last pixels of a row that fill no whole SIMD vector
        # (its scalar code) slightly different hues: a window's columns start and end where
        # the whole image's rows have vector boundaries (multiples of 64 pixels hold those
        # of every vector width), so each of its pixels takes the same path as there.
        x0, x1 = x0 - x0 % SIMD_COLUMNS, min(w, x1 + (-x1) % SIMD_COLUMNS)
        if x1 > x0 and y1 > y0:
            sized[y0:y1, x0:x1] = _fork_colour_jitter(sized[y0:y1, x0:x1], dhue, dsat, dexp)
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


def augment_piece(hwc, boxes, aug, w, h, rng, max_boxes, piece=None, window_of=None):
    """One image of a sample: returns (image (h, w, C), truth (n, 5), borders, flip).
    `window_of(borders, flip)`, when given, says which part (x0, y0, x1, y1) of the image
    will be used (a mosaic's corner): only that part is sure to be finished."""
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
    borders = (pleft, pright, ptop, pbot)
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
        window=None if window_of is None else window_of(borders, d.flip),
    )
    return out, truth, borders, d.flip


def _mosaic_corner(piece, borders, flip, ow, oh, cut_x, cut_y, w, h):
    """Where a mosaic's piece goes: (shifts, (sx, sy), (dx, dy), (width, height)): the
    padding skipped on each side (network pixels), the corner's origin in the piece's image
    and in the mosaic, and its size."""
    pleft, pright, ptop, pbot = borders
    if flip:
        pleft, pright = pright, pleft
    # How much of the piece is padding on each side, in network pixels: the window moves
    # past it so that image content fills the corner.
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
    return shifts, (sx, sy), (dx, dy), (dwid, dhei)


def mosaic_truth(truth, piece, cut_x, cut_y, shifts, w, h, bound=False):
    """The fork's blend_truth_mosaic for one corner's boxes: moved with its image, clipped
    at the mosaic's border (with bound, at the corner's own border) and kept only when
    still inside, wider and higher than a network pixel."""
    left_shift, right_shift, top_shift, bot_shift = shifts
    kept = []
    for row in truth:
        xb, yb, wb, hb = (float(v) for v in row[:4])
        xb += (cut_x - left_shift) / w if piece in (1, 3) else -(w - cut_x - right_shift) / w
        yb += (cut_y - top_shift) / h if piece in (2, 3) else -(h - cut_y - bot_shift) / h
        left, right = int((xb - wb / 2) * w), int((xb + wb / 2) * w)
        top, bot = int((yb - hb / 2) * h), int((yb + hb / 2) * h)
        if bound:
            lo_x, hi_x = (0, cut_x) if piece in (0, 2) else (cut_x, w)
            lo_y, hi_y = (0, cut_y) if piece in (0, 1) else (cut_y, h)
            left, right = max(left, lo_x), min(right, hi_x)
            top, bot = max(top, lo_y), min(bot, hi_y)
            xb, wb = (left + right) / 2 / w, (right - left) / w
            yb, hb = (top + bot) / 2 / h, (bot - top) / h
        if left < 0:
            xb, wb = xb - left / w / 2, wb + left / w
        if right > w:
            xb, wb = xb - (right - w) / w / 2, wb - (right - w) / w
        if top < 0:
            yb, hb = yb - top / h / 2, hb + top / h
        if bot > h:
            yb, hb = yb - (bot - h) / h / 2, hb - (bot - h) / h
        left, right = int((xb - wb / 2) * w), int((xb + wb / 2) * w)
        top, bot = int((yb - hb / 2) * h), int((yb + hb / 2) * h)
        if (
            left >= 0
            and right <= w
            and top >= 0
            and bot <= h
            and 1 / w < wb < 1
            and 1 / h < hb < 1
            and 0 < xb < 1
            and 0 < yb < 1
        ):
            kept.append([xb, yb, wb, hb, row[4]])
    return np.array(kept, dtype=np.float32).reshape(-1, TRUTH_FIELDS)


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

            def corner_of(borders, flip, piece=piece, ow=ow, oh=oh):
                return _mosaic_corner(piece, borders, flip, ow, oh, cut_x, cut_y, w, h)

            def window_of(borders, flip, corner_of=corner_of):
                _, (sx, sy), _, (dwid, dhei) = corner_of(borders, flip)
                return sx, sy, sx + dwid, sy + dhei

            ai, truth, borders, flip = augment_piece(
                image, piece_boxes, aug, w, h, rng, max_boxes, piece, window_of
            )
            shifts, (sx, sy), (dx, dy), (dwid, dhei) = corner_of(borders, flip)
            out[dy : dy + dhei, dx : dx + dwid] = ai[sy : sy + dhei, sx : sx + dwid]
            parts.append(mosaic_truth(truth, piece, cut_x, cut_y, shifts, w, h, aug.mosaic_bound))
        truth = np.concatenate(parts)
    row = np.zeros((max_boxes, TRUTH_FIELDS), dtype=np.float32)
    truth = truth[:max_boxes]
    row[: len(truth)] = truth
    return out, row.reshape(-1)


# The fork's net->mixup: one number for the [net] options mixup=, cutmix= and mosaic=.
MIXUP, CUTMIX, MOSAIC, CUTMIX_OR_MOSAIC = 1, 2, 3, 4


def fork_mix(options):
    """The fork's net->mixup from the NetOptions: mixup= as given (0-4), then cutmix=1
    makes it CUTMIX, mosaic=1 MOSAIC and both CUTMIX_OR_MOSAIC. DataError for a mixup=
    the fork has no branch for."""
    o = options
    if not 0 <= o.mixup <= CUTMIX_OR_MOSAIC:
        raise DataError(
            f"[net] mixup={o.mixup}: the AlexeyAB fork knows 0 (off), 1 (mixup), "
            f"2 (cutmix), 3 (mosaic) and 4 (cutmix or mosaic)"
        )
    if o.mosaic and o.cutmix:
        return CUTMIX_OR_MOSAIC
    return CUTMIX if o.cutmix else MOSAIC if o.mosaic else o.mixup


def detector_augment(options, head, fork=False, warn=None):
    """The augmentation a detector trains with: the fork's (ForkAugment) for a network of
    the fork's flavour or one that sets any of its [net] augmentation options, else the
    original's DetectorAugment. `options` is the NetOptions, `head` the last [yolo]/
    [region] layer; `warn(message)` is told that cutmix does nothing for a detector
    (the fork's load_data_detection: cutmix off, cutmix-or-mosaic a mosaic).
    mosaic with letter_box is a DataError."""
    o = options
    switches = ("letter_box", "mosaic", "mixup", "cutmix", "blur", "gaussian_noise")
    if not fork and not any(getattr(o, k, 0) for k in switches):
        return DetectorAugment(
            jitter=head.jitter,
            hue=o.hue,
            saturation=o.saturation,
            exposure=o.exposure,
            flip=bool(o.flip),
        )
    mix = fork_mix(o)
    if mix in (MOSAIC, CUTMIX_OR_MOSAIC) and o.letter_box:
        # The fork's stock cfgs set both; its training stops on them, as here.
        raise DataError(
            "[net] mosaic=1 with letter_box=1 cannot train (as in the AlexeyAB "
            "fork): set one of them to 0"
        )
    if o.label_smooth_eps and warn is not None:
        warn(
            f"[net] label_smooth_eps={o.label_smooth_eps:g} smooths a classifier's labels: "
            f"a detector trains without it (as in the AlexeyAB fork; [yolo] has its own)"
        )
    if mix in (CUTMIX, CUTMIX_OR_MOSAIC) and warn is not None:
        warn(
            "cutmix is a classifier augmentation: a detector trains without it (as in "
            "the AlexeyAB fork)" + ("; mosaic is used" if mix == CUTMIX_OR_MOSAIC else "")
        )
    return ForkAugment(
        jitter=head.jitter,
        resize=getattr(head, "resize", 1.0),
        hue=o.hue,
        saturation=o.saturation,
        exposure=o.exposure,
        flip=bool(o.flip),
        letter_box=bool(o.letter_box),
        mosaic=mix in (MOSAIC, CUTMIX_OR_MOSAIC),
        mixup=mix == MIXUP,
        mosaic_bound=bool(o.mosaic_bound),
        blur=o.blur,
        gaussian_noise=o.gaussian_noise,
    )


# ---- classifiers: the fork's load_data_augment -------------------------------------------------
CUTMIX_MIN, CUTMIX_MAX = 0.3, 0.8  # a cutmix rectangle's sides, as shares of the input's
BLUR_ONE_KSIZE = 15  # blur=1's Gaussian kernel (blur=N: N pixels)
BLUR_SHARE = 4  # one sample in 4 is blurred


@dataclass
class ForkClassifierAugment(ClassifierAugment):
    """Darknet's classifier augmentation plus the fork's mixing (`mix`: fork_mix's
    number), blur (0: none, 1: a 15-pixel Gaussian, N: an N-pixel one) and label
    smoothing ([net] label_smooth_eps)."""

    mix: int = 0
    blur: int = 0
    label_smooth_eps: float = 0.0


def classifier_augment(options, warn=None):
    """The augmentation a classifier trains with: ClassifierAugment from the [net]
    options, ForkClassifierAugment when the fork's mixup, cutmix, mosaic, blur or
    label_smooth_eps is set.
    `warn(message)` is told of the fork's detector-only options, which a classifier
    trains without. An even blur is a DataError (OpenCV's Gaussian needs an odd size:
    the fork stops there)."""
    o = options
    base = dict(
        min_ratio=o.min_ratio,
        max_ratio=o.max_ratio,
        angle=o.angle,
        aspect=o.aspect,
        hue=o.hue,
        saturation=o.saturation,
        exposure=o.exposure,
        center=bool(o.center),
        flip=bool(o.flip),
    )
    for key in ("letter_box", "mosaic_bound", "gaussian_noise"):
        if getattr(o, key) and warn is not None:
            warn(
                f"{key}={getattr(o, key)} is a detector augmentation: a classifier trains "
                f"without it (as in the AlexeyAB fork)"
            )
    mix = fork_mix(o)
    if not mix and not o.blur and not o.label_smooth_eps:
        return ClassifierAugment(**base)
    if o.blur < 0 or (o.blur > 1 and o.blur % 2 == 0):
        raise DataError(
            f"[net] blur={o.blur}: a classifier is blurred with a Gaussian of "
            f"blur x blur pixels, which must be odd (the AlexeyAB fork stops on "
            f"an even one); 1 means {BLUR_ONE_KSIZE}"
        )
    return ForkClassifierAugment(**base, mix=mix, blur=o.blur, label_smooth_eps=o.label_smooth_eps)


def smooth_classifier_truth(truth, eps):
    """The fork's fill_truth_smooth on a one-hot row: the image's class 1 - eps, every
    other eps / (classes - 1)."""
    truth = np.asarray(truth, dtype=np.float32)
    if not eps:
        return truth
    off = eps / (truth.size - 1) if truth.size > 1 else 0.0
    return np.where(truth > 0, np.float32(1 - eps), np.float32(off)).astype(np.float32)


def mix_classifier_samples(kind, images, truths, rng):
    """Mix a sample (images[0], truths[0]) with others as the fork's load_data_augment
    does: MIXUP (2 images) averages the images and the labels; CUTMIX (2) pastes a random
    rectangle of images[1] (sides 30-80% of the input's), the labels weighted by its
    share of the area; MOSAIC (4) fills the corners around a random centre (20-80% along
    each side) with images 0-3, top left to bottom right, the labels weighted by their
    corners' areas. Images are (H, W, C) float32. Returns (image, truth)."""
    if kind == MIXUP:
        return ((images[0] + images[1]) / np.float32(2), (truths[0] + truths[1]) / np.float32(2))
    out = images[0].copy()
    h, w = out.shape[:2]
    if kind == CUTMIX:
        # (Python's products truncate as the fork's float ones for every size to 700.)
        cut_w = _rand_int(rng, int(w * CUTMIX_MIN), int(w * CUTMIX_MAX))
        cut_h = _rand_int(rng, int(h * CUTMIX_MIN), int(h * CUTMIX_MAX))
        cut_x = _rand_int(rng, 0, max(0, w - cut_w - 1))
        cut_y = _rand_int(rng, 0, max(0, h - cut_h - 1))
        out[cut_y : cut_y + cut_h, cut_x : cut_x + cut_w] = images[1][
            cut_y : cut_y + cut_h, cut_x : cut_x + cut_w
        ]
        alpha = np.float32(cut_w * cut_h) / np.float32(w * h)
        return out, truths[0] * (np.float32(1) - alpha) + truths[1] * alpha
    if kind != MOSAIC:
        raise ValueError(f"no classifier mix {kind}")
    cut_x = _rand_int(rng, int(w * MOSAIC_MIN_OFFSET), int(w * (1 - MOSAIC_MIN_OFFSET)))
    cut_y = _rand_int(rng, int(h * MOSAIC_MIN_OFFSET), int(h * (1 - MOSAIC_MIN_OFFSET)))
    out[:cut_y, cut_x:] = images[1][:cut_y, cut_x:]
    out[cut_y:, :cut_x] = images[2][cut_y:, :cut_x]
    out[cut_y:, cut_x:] = images[3][cut_y:, cut_x:]
    areas = (cut_x * cut_y, (w - cut_x) * cut_y, cut_x * (h - cut_y), (w - cut_x) * (h - cut_y))
    truth = np.zeros_like(truths[0])
    for t, area in zip(truths, areas):
        truth = truth + t * (np.float32(area) / np.float32(w * h))
    return out, truth


def fork_classifier_sample(hwc, truth, draw_image, aug, w, h, rng):
    """One classifier training (input (h, w, C), truth row) as the fork's load_data_augment
    makes it: the image augmented as Darknet's classifier loader does; then, when aug.mix
    is set and a coin says so, mixed (mix_classifier_samples) with 1 (mixup, cutmix) or 3
    (mosaic, cutmix-or-mosaic) other images, each augmented likewise, CUTMIX_OR_MOSAIC
    picking cutmix or mosaic per sample; then, with blur, a quarter of the samples
    blurred. Every truth row is smoothed first (label_smooth_eps), as the fork fills
    its rows with fill_truth_smooth before mixing. `draw_image()` returns another random
    (image, truth) of the training list.
    The fork tosses its coin once per loader thread's share of a batch; here each sample
    tosses its own (as the detector's mosaic does), so that a sample depends on its own
    seed only."""
    out = augment_classifier_hwc(hwc, aug, w, h, rng)
    truth = smooth_classifier_truth(truth, aug.label_smooth_eps)
    if aug.mix and rng.integers(2):
        pieces = 4 if aug.mix >= MOSAIC else 2
        images, truths = [out], [truth]
        for _ in range(pieces - 1):
            other, other_truth = draw_image()
            images.append(augment_classifier_hwc(other, aug, w, h, rng))
            truths.append(smooth_classifier_truth(other_truth, aug.label_smooth_eps))
        kind = _rand_int(rng, CUTMIX, MOSAIC) if aug.mix == CUTMIX_OR_MOSAIC else aug.mix
        out, truth = mix_classifier_samples(kind, images, truths, rng)
    if aug.blur and rng.integers(BLUR_SHARE) == 0:
        size = BLUR_ONE_KSIZE if aug.blur == 1 else aug.blur
        blurred = _cv2().GaussianBlur(np.ascontiguousarray(out), (size, size), 0)
        out = blurred[:, :, None] if blurred.ndim == 2 else blurred
    return np.ascontiguousarray(out, dtype=np.float32), truth
