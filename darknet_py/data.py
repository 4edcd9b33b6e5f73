"""Darknet's training data: .data files, image lists, labels, augmentation, batches, anchors.

Conventions follow pjreddie's C Darknet (src/data.c, src/image.c):

* A classifier image's class is the class name that occurs in its path (``strstr``).
* A detector image's labels live in a .txt file whose path is derived from the image
  path by Darknet's substitutions (``images`` -> ``labels``, ``.jpg`` -> ``.txt``, ...),
  one ``class x y w h`` line per box, coordinates relative to the image size.
* A detector truth row is ``max_boxes`` (90) boxes of ``(x, y, w, h, class)``,
  zero padded: the [yolo] layer stops at the first box whose x is 0.

Images are Darknet-style float32 (C, H, W) RGB in [0, 1] (see image.py). All randomness
comes from NumPy generators derived from a seed, so a seed reproduces every batch.
"""
import math
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from .cfg import CfgError, read_data_file
from .image import ImageError, decode_image, letterbox, resize_image

MAX_BOXES = 90            # Darknet's default for [yolo]/[region] max=
TRUTH_FIELDS = 5          # x, y, w, h, class
MIN_BOX_SIZE = 0.001      # fill_truth_detection drops boxes narrower or shorter than this


class DataError(Exception):
    """A problem with a dataset file; the message names the file (and line where known)."""


class MissingLabelFile(DataError):
    """A detector image has no label file. Darknet-style callers treat it as 'no boxes'."""

    def __init__(self, label_path, image_path=None):
        self.label_path, self.image_path = label_path, image_path
        for_image = f" (for image {image_path})" if image_path else ""
        super().__init__(f"{_where(label_path)}: label file not found{for_image}")


def _where(path):
    """A path as the user wrote it, plus where a relative one was looked for."""
    path = os.fspath(path)
    if os.path.isabs(path):
        return path
    return f"{path} (relative to {os.getcwd()})"


def _read_text(path, what):
    path = os.fspath(path)
    try:
        # surrogateescape keeps non-UTF-8 bytes in paths intact on the round trip to open()
        with open(path, encoding="utf-8", errors="surrogateescape") as f:
            return f.read()
    except FileNotFoundError:
        raise DataError(f"{_where(path)}: {what} not found") from None
    except IsADirectoryError:
        raise DataError(f"{_where(path)}: {what} is a directory, expected a file") from None
    except OSError as e:
        raise DataError(f"{_where(path)}: cannot read {what}: {e.strerror}") from None


# ---------------------------------------------------------------------------------------
# .data files and lists

def read_list(path, what="list file"):
    """Lines of a Darknet list file (image paths, class names): CRLF or LF, surrounding
    whitespace removed, blank lines skipped (Darknet would keep a blank line as an empty
    path or, in a names file, as an empty label that matches every path)."""
    return [s for s in (line.strip() for line in _read_text(path, what).splitlines()) if s]


@dataclass
class DataConfig:
    """A parsed .data file. Paths are kept as written: relative ones are relative to the
    current directory, as in Darknet."""
    path: str
    classes: int
    train: str
    valid: str
    names_path: str        # display names (``names=``, else ``labels=``)
    labels_path: str       # strings matched against classifier paths (``labels=``, else ``names=``)
    backup: str
    top: int
    names: list
    labels: list
    options: dict = field(default_factory=dict)   # every key=value, as strings

    def train_paths(self):
        return read_list(self.train, "train list")

    def valid_paths(self):
        return read_list(self.valid, "valid list")


def load_data_config(path, require=()):
    """Read a Darknet .data file and its names file.

    Keys and defaults as Darknet: classes, train (data/train.list), valid (defaults to
    train), names / labels (either serves for both), backup (/backup/), top (1). Darknet
    defaults a missing ``classes`` to 2; here it defaults to the number of names, which is
    what that default is meant to stand for. ``require`` lists keys among "train", "valid"
    whose files must exist now (detection-only use of a .data needs no training list).
    Raises DataError naming the file for anything missing or malformed.
    """
    path = os.fspath(path)
    try:
        options = read_data_file(path)
    except CfgError as e:
        if not os.path.exists(path):
            raise DataError(f"{_where(path)}: .data file not found") from None
        raise DataError(str(e)) from None

    train = options.get("train", "data/train.list")
    valid = options.get("valid", train)
    names_path = options.get("names") or options.get("labels") or "data/names.list"
    labels_path = options.get("labels") or options.get("names") or "data/labels.list"
    backup = options.get("backup", "/backup/")

    def int_option(key, default):
        if key not in options:
            return default
        try:
            return int(options[key])
        except ValueError:
            raise DataError(f"{path}: {key}: expected an integer, got '{options[key]}'") from None

    if "names" not in options and "labels" not in options:
        raise DataError(f"{path}: no names= (or labels=) file given")
    names = _read_names(names_path, path)
    labels = names if labels_path == names_path else _read_names(labels_path, path)
    classes = int_option("classes", len(names))
    top = int_option("top", 1)
    if classes <= 0:
        raise DataError(f"{path}: classes: must be positive, got {classes}")
    for what, lst, p in (("names", names, names_path), ("labels", labels, labels_path)):
        if len(lst) < classes:
            raise DataError(f"{_where(p)}: {len(lst)} {what} for classes={classes} "
                            f"given in {path}")
    # Darknet uses the first `classes` entries and ignores the rest.
    names, labels = names[:classes], labels[:classes]

    for key in require:
        if key not in ("train", "valid"):
            raise ValueError(f"require: unknown key {key!r}")
        p = train if key == "train" else valid
        if not os.path.isfile(p):
            raise DataError(f"{_where(p)}: {key} list not found (given in {path})")

    return DataConfig(path=path, classes=classes, train=train, valid=valid,
                      names_path=names_path, labels_path=labels_path, backup=backup, top=top,
                      names=names, labels=labels, options=dict(options))


def _read_names(names_path, data_path):
    try:
        return read_list(names_path, "names file")
    except DataError as e:
        raise DataError(f"{e} (given in {data_path})") from None


# ---------------------------------------------------------------------------------------
# Classifier labels

def classifier_label_index(path, labels):
    """Darknet's classifier label rule: the class whose name occurs in the image path.
    Exactly one must occur; otherwise DataError says which did (or that none did)."""
    path = os.fspath(path)
    found = [i for i, name in enumerate(labels) if name in path]
    if len(found) == 1:
        return found[0]
    if not found:
        raise DataError(f"{path}: no class name occurs in the path (a classifier image's "
                        f"class is the class name found in its path)")
    names = ", ".join(repr(labels[i]) for i in found)
    raise DataError(f"{path}: {len(found)} class names occur in the path ({names}); exactly "
                    f"one must (class names that are substrings of each other, or of a "
                    f"directory name, make the label ambiguous)")


def classifier_truth(path, labels, classes=None):
    """One-hot float32 truth of length ``classes`` (default len(labels)) for an image path."""
    classes = len(labels) if classes is None else classes
    truth = np.zeros(classes, dtype=np.float32)
    truth[classifier_label_index(path, labels[:classes])] = 1.0
    return truth


def check_classifier_labels(paths, labels):
    """[(path, message)] for every path the label rule rejects; [] when all are fine."""
    problems = []
    for p in paths:
        try:
            classifier_label_index(p, labels)
        except DataError as e:
            problems.append((p, str(e)))
    return problems


# ---------------------------------------------------------------------------------------
# Detector labels

# Darknet's fill_truth_detection rewrites the image path with these substitutions, in
# this order, each replacing only the first occurrence (its find_replace uses strstr).
_LABEL_PATH_SUBSTITUTIONS = (
    ("images", "labels"),
    ("JPEGImages", "labels"),
    ("raw", "labels"),
    (".jpg", ".txt"),
    (".png", ".txt"),
    (".JPG", ".txt"),
    (".JPEG", ".txt"),
    # Not in Darknet, which would then read the .jpeg image itself as its label file and
    # find no boxes; mapping it is what such a dataset means.
    (".jpeg", ".txt"),
)
_LABEL_EXTENSIONS = (".jpg", ".png", ".JPG", ".JPEG", ".jpeg")


def label_path(image_path):
    """The label file Darknet reads for a detector image (first-occurrence substitutions:
    images/JPEGImages/raw -> labels, then .jpg/.png/.JPG/.JPEG (and .jpeg) -> .txt)."""
    image_path = os.fspath(image_path)
    out = image_path
    for find, replace in _LABEL_PATH_SUBSTITUTIONS:
        out = out.replace(find, replace, 1)
    if not any(ext in image_path for ext in _LABEL_EXTENSIONS):
        raise DataError(f"{image_path}: cannot derive a label file name: Darknet maps only "
                        f"{', '.join(_LABEL_EXTENSIONS)} images to .txt labels")
    return out


def parse_labels(text, source="<labels>", classes=None):
    """Parse label text into float32 (n, 5) rows of (x, y, w, h, class)."""
    rows = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        fields = line.split()
        where = f"{source}:{lineno}"
        if len(fields) != 5:
            raise DataError(f"{where}: expected 'class x y w h' (5 fields), got {len(fields)}: "
                            f"'{line}'")
        try:
            cls = int(fields[0])
        except ValueError:
            raise DataError(f"{where}: class id must be an integer, got '{fields[0]}'") from None
        try:
            x, y, w, h = (float(v) for v in fields[1:])
        except ValueError:
            raise DataError(f"{where}: x y w h must be numbers, got '{line}'") from None
        if not all(math.isfinite(v) for v in (x, y, w, h)):
            raise DataError(f"{where}: x y w h must be finite, got '{line}'")
        if cls < 0 or (classes is not None and cls >= classes):
            top = f"0..{classes - 1}" if classes is not None else "non-negative"
            raise DataError(f"{where}: class id {cls} out of range ({top})")
        if w < 0 or h < 0:
            raise DataError(f"{where}: negative box size w={w} h={h}")
        rows.append((x, y, w, h, cls))
    return np.array(rows, dtype=np.float32).reshape(-1, TRUTH_FIELDS)


def read_labels(path, classes=None, image_path=None):
    """Read a label file into float32 (n, 5) rows of (x, y, w, h, class).
    A missing file raises MissingLabelFile (a DataError); a malformed line raises
    DataError naming the file and line."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise MissingLabelFile(path, image_path)
    return parse_labels(_read_text(path, "label file"), path, classes)


def read_image_labels(image_path, classes=None):
    """Boxes of a detector image, found by Darknet's label-path rule."""
    return read_labels(label_path(image_path), classes, image_path)


def find_missing_labels(image_paths):
    """Image paths whose label file does not exist (Darknet trains on them as empty)."""
    return [p for p in image_paths if not os.path.exists(label_path(p))]


def correct_boxes(boxes, dx=0.0, dy=0.0, sx=1.0, sy=1.0, flip=False):
    """Darknet's correct_boxes: map (x, y, w, h, class) rows through scale (sx, sy) then
    shift (-dx, -dy), mirror if ``flip``, clip the edges to [0, 1]. Returns a new array.
    Rows whose centre is exactly (0, 0) are Darknet's 'no box' marker: they come back
    with zero size so that detection_truth drops them (Darknet writes junk for them)."""
    b = np.array(boxes, dtype=np.float32).reshape(-1, TRUTH_FIELDS)
    x, y, w, h = b[:, 0], b[:, 1], b[:, 2], b[:, 3]
    left = (x - w / 2) * sx - dx
    right = (x + w / 2) * sx - dx
    top = (y - h / 2) * sy - dy
    bottom = (y + h / 2) * sy - dy
    if flip:
        left, right = 1 - right, 1 - left
    left, right, top, bottom = (np.clip(v, 0, 1) for v in (left, right, top, bottom))
    marker = (x == 0) & (y == 0)
    out = b.copy()
    out[:, 0] = (left + right) / 2
    out[:, 1] = (top + bottom) / 2
    out[:, 2] = np.where(marker, 0, np.clip(right - left, 0, 1))
    out[:, 3] = np.where(marker, 0, np.clip(bottom - top, 0, 1))
    return out


def detection_truth(boxes, max_boxes=MAX_BOXES, dx=0.0, dy=0.0, sx=1.0, sy=1.0, flip=False,
                    rng=None):
    """Darknet's fill_truth_detection on already-read boxes: shuffle (when ``rng`` is
    given), correct_boxes, keep the first ``max_boxes``, then drop boxes under 0.001 wide
    or high, packing the rest to the front. Returns float32 (max_boxes * 5,)."""
    b = np.array(boxes, dtype=np.float32).reshape(-1, TRUTH_FIELDS)
    if rng is not None and len(b) > 1:
        # Darknet shuffles before truncating, so which boxes survive a cut is random.
        b = b[rng.permutation(len(b))]
    b = correct_boxes(b, dx, dy, sx, sy, flip)[:max_boxes]
    b = b[(b[:, 2] >= MIN_BOX_SIZE) & (b[:, 3] >= MIN_BOX_SIZE)]
    truth = np.zeros((max_boxes, TRUTH_FIELDS), dtype=np.float32)
    truth[:len(b)] = b
    return truth.reshape(-1)


def truth_boxes(truth_row):
    """The boxes in one truth row: float32 (n, 5) (x, y, w, h, class), padding removed."""
    b = np.asarray(truth_row, dtype=np.float32).reshape(-1, TRUTH_FIELDS)
    n = int(np.argmax(b[:, 0] == 0)) if (b[:, 0] == 0).any() else len(b)
    return b[:n]


# ---------------------------------------------------------------------------------------
# Image operations Darknet's augmentation uses (image.c), on (C, H, W) float32 images

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
# than NumPy here and releases the GIL, so the loader's threads really run in parallel.
# The public functions take and return Darknet's (C, H, W).

def _to_hwc(img):
    return np.ascontiguousarray(img.transpose(1, 2, 0), dtype=np.float32)


def _from_hwc(a):
    return np.ascontiguousarray((a[:, :, None] if a.ndim == 2 else a).transpose(2, 0, 1))


def _warp_hwc(hwc, source_of, w, h, replicate_edges):
    """Bilinear samples of hwc at source_of @ (x, y, 1) for each output pixel (x, y)."""
    cv2 = _cv2()
    out = cv2.warpAffine(hwc, np.asarray(source_of, dtype=np.float64), (w, h),
                         flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
                         borderMode=cv2.BORDER_REPLICATE if replicate_edges
                         else cv2.BORDER_CONSTANT, borderValue=0)
    return out[:, :, None] if out.ndim == 2 else out


def flip_image(img):
    """Mirror left-right (a new array)."""
    return np.ascontiguousarray(img[:, :, ::-1])


def crop_image(img, dx, dy, w, h):
    """Darknet's crop_image: the w x h window at (dx, dy); pixels outside the image take
    the nearest edge pixel."""
    c, ih, iw = img.shape
    rows = np.clip(np.arange(h) + dy, 0, ih - 1)
    cols = np.clip(np.arange(w) + dx, 0, iw - 1)
    return np.ascontiguousarray(img[:, rows][:, :, cols], dtype=np.float32)


def center_crop_image(img, w, h):
    """Darknet's center_crop_image: the central square, resized to w x h (the classifier's
    validation input)."""
    c, ih, iw = img.shape
    m = min(iw, ih)
    return crop_resize_image(img, (iw - m) // 2, (ih - m) // 2, m, m, w, h)


def _crop_resize_source(dx, dy, cw, ch, w, h):
    """Affine map for crop_image(dx, dy, cw, ch) followed by Darknet's resize_image to
    w x h: that resize samples source pixel x * (cw-1)/(w-1) (corners aligned), and
    bilinear sampling with replicated edges equals sampling the edge-clamped crop."""
    return [[(cw - 1) / (w - 1), 0, dx], [0, (ch - 1) / (h - 1), dy]]


def _crop_resize_hwc(hwc, dx, dy, cw, ch, w, h):
    if w < 2 or h < 2:   # Darknet's resize takes the last row/column here; rare enough
        img = crop_image(_from_hwc(hwc), dx, dy, cw, ch)
        return _to_hwc(resize_image(img, w, h))
    return _warp_hwc(hwc, _crop_resize_source(dx, dy, cw, ch, w, h), w, h, True)


def crop_resize_image(img, dx, dy, cw, ch, w, h):
    """resize_image(crop_image(img, dx, dy, cw, ch), w, h) in one pass."""
    return _from_hwc(_crop_resize_hwc(_to_hwc(img), dx, dy, cw, ch, w, h))


def _rotate_crop_source(iw, ih, rad, scale, w, h, dx, dy, aspect):
    """Darknet's rotate_crop_image samples, for output pixel (x, y),
        u = ((x - w/2) + dx) * aspect / scale,  v = ((y - h/2) + dy) / scale,
        source (cos*u - sin*v + iw/2,  sin*u + cos*v + ih/2):  an affine map."""
    cos, sin = math.cos(rad), math.sin(rad)
    ax = aspect / scale
    u0, v0 = (dx - w / 2) * ax, (dy - h / 2) / scale
    return [[cos * ax, -sin / scale, cos * u0 - sin * v0 + iw / 2],
            [sin * ax, cos / scale, sin * u0 + cos * v0 + ih / 2]]


def rotate_crop_image(img, rad, scale, w, h, dx, dy, aspect):
    """Darknet's rotate_crop_image: a w x h view of img rotated by ``rad`` about its
    centre, scaled by ``scale`` (x also by 1/aspect), shifted by (dx, dy) output pixels;
    bilinear, reading 0 outside the image."""
    c, ih, iw = img.shape
    source_of = _rotate_crop_source(iw, ih, rad, scale, w, h, dx, dy, aspect)
    return _from_hwc(_warp_hwc(_to_hwc(img), source_of, w, h, False))


def _random_augment_source(rng, iw, ih, angle, aspect, low, high, w, h):
    aspect = _rand_scale(rng, aspect)
    r = _rand_int(rng, low, high)
    shorter = int(min(ih, iw * aspect))
    scale = r / max(shorter, 1)
    rad = _rand_uniform(rng, -angle, angle) * 2 * math.pi / 360
    dx = (iw * scale / aspect - w) / 2
    dy = (ih * scale - h) / 2   # Darknet subtracts w here; the same for its square crops
    dx = _rand_uniform(rng, -dx, dx)
    dy = _rand_uniform(rng, -dy, dy)
    return _rotate_crop_source(iw, ih, rad, scale, w, h, dx, dy, aspect)


def random_augment_image(img, rng, angle, aspect, low, high, w, h):
    """Darknet's random_augment_image: random aspect (rand_scale(aspect)), rescale so the
    shorter side is a random size in [low, high], rotate by up to +-angle degrees, then a
    random w x h crop."""
    c, ih, iw = img.shape
    source_of = _random_augment_source(rng, iw, ih, angle, aspect, low, high, w, h)
    return _from_hwc(_warp_hwc(_to_hwc(img), source_of, w, h, False))


def _read_hwc(path, channels=3):
    """load_image's result as (H, W, C): what the augmentation works on, without the
    two transposes a round trip through (C, H, W) would cost."""
    cv2 = _cv2()
    # The loader's threads decode at once: the decoder's messages are not captured (that
    # takes a process-wide lock), the other checks of load_image apply.
    a, _ = decode_image(path, channels, quiet_decoder=False)
    if a.ndim == 2:
        a = a[:, :, None]
    elif channels == 3:
        a = cv2.cvtColor(a, cv2.COLOR_BGR2RGB)
    return np.divide(a, np.float32(255), dtype=np.float32)


def rgb_to_hsv(img):
    """Darknet's rgb_to_hsv on a (3, H, W) image: hue, saturation, value all in [0, 1]
    (hue in turns: Darknet's formulas, which OpenCV computes in degrees)."""
    hsv = _cv2().cvtColor(_to_hwc(img), _cv2().COLOR_RGB2HSV)
    hsv[:, :, 0] *= np.float32(1 / 360)
    return _from_hwc(hsv)


def hsv_to_rgb(img):
    """Darknet's hsv_to_rgb, the inverse of rgb_to_hsv (values are not clipped)."""
    hsv = _to_hwc(img)
    hsv[:, :, 0] *= np.float32(360)
    return _from_hwc(_cv2().cvtColor(hsv, _cv2().COLOR_HSV2RGB))


def _distort_hwc(hwc, hue, saturation, exposure):
    if hwc.shape[2] == 1:
        return np.clip(hwc * np.float32(exposure), 0, 1).astype(np.float32)
    if hwc.shape[2] != 3:
        raise ValueError(f"distort_image: expected 1 or 3 channels, got {hwc.shape[2]}")
    cv2 = _cv2()
    hsv = cv2.cvtColor(hwc, cv2.COLOR_RGB2HSV)    # hue in degrees
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
    return _from_hwc(_distort_hwc(_to_hwc(img), hue, saturation, exposure))


def _random_distort_hwc(hwc, rng, hue, saturation, exposure):
    dhue = _rand_uniform(rng, -hue, hue)
    dsat = _rand_scale(rng, saturation)
    dexp = _rand_scale(rng, exposure)
    if dhue == 0 and dsat == 1 and dexp == 1:
        return hwc
    return _distort_hwc(hwc, dhue, dsat, dexp)


def random_distort_image(img, rng, hue, saturation, exposure):
    """Darknet's random_distort_image: hue shift in [-hue, hue], saturation and exposure
    factors from rand_scale."""
    return _from_hwc(_random_distort_hwc(_to_hwc(img), rng, hue, saturation, exposure))


# ---------------------------------------------------------------------------------------
# Augmentation settings and per-image pipelines

@dataclass
class ClassifierAugment:
    """Darknet's classifier augmentation (load_data_augment). Crop sizes are ratios of the
    network width, as Darknet recomputes min/max from them when the width changes."""
    min_ratio: float = 1.0      # [net] min_crop / width (Darknet default min_crop = width)
    max_ratio: float = 2.0      # [net] max_crop / width (Darknet default max_crop = 2*width)
    angle: float = 0.0
    aspect: float = 1.0
    hue: float = 0.0
    saturation: float = 1.0
    exposure: float = 1.0
    center: bool = False        # centre crop instead of random crop/scale/rotate
    flip: bool = True           # Darknet always flips at random; flip=0 as in AlexeyAB's fork

    @classmethod
    def from_net_section(cls, net):
        """Read the [net] options (a cfg.Section) with Darknet's defaults."""
        width = net.get_int("width", 0) or 1
        max_crop = net.get_int("max_crop", 2 * width)
        min_crop = net.get_int("min_crop", width)
        return cls(min_ratio=net.get_float("min_ratio", min_crop / width),
                   max_ratio=net.get_float("max_ratio", max_crop / width),
                   angle=net.get_float("angle", 0), aspect=net.get_float("aspect", 1),
                   hue=net.get_float("hue", 0), saturation=net.get_float("saturation", 1),
                   exposure=net.get_float("exposure", 1),
                   center=bool(net.get_int("center", 0)), flip=bool(net.get_int("flip", 1)))


@dataclass
class DetectorAugment:
    """Darknet's detector augmentation (load_data_detection): random crop jitter, flip and
    HSV distortion. ``jitter`` comes from the last [yolo]/[region] layer."""
    jitter: float = 0.2
    hue: float = 0.0
    saturation: float = 1.0
    exposure: float = 1.0
    flip: bool = True

    @classmethod
    def from_sections(cls, net, detection_layer=None):
        """Read [net] hue/saturation/exposure (and flip) and the layer's jitter."""
        jitter = detection_layer.get_float("jitter", 0.2) if detection_layer is not None else 0.2
        return cls(jitter=jitter, hue=net.get_float("hue", 0),
                   saturation=net.get_float("saturation", 1),
                   exposure=net.get_float("exposure", 1), flip=bool(net.get_int("flip", 1)))


def _augment_classifier_hwc(hwc, augment, w, h, rng):
    ih, iw = hwc.shape[:2]
    if augment.center:
        m = min(iw, ih)
        out = _crop_resize_hwc(hwc, (iw - m) // 2, (ih - m) // 2, m, m, w, h)
    else:
        low, high = int(augment.min_ratio * w), int(augment.max_ratio * w)
        source_of = _random_augment_source(rng, iw, ih, augment.angle, augment.aspect,
                                           low, high, w, h)
        out = _warp_hwc(hwc, source_of, w, h, False)
    if augment.flip and rng.integers(2):
        out = np.ascontiguousarray(out[:, ::-1])
    return _random_distort_hwc(out, rng, augment.hue, augment.saturation, augment.exposure)


def augment_classifier_image(img, augment, w, h, rng):
    """One training input as Darknet's load_image_augment_paths makes it: centre crop or
    random_augment_image, a random flip, random_distort_image."""
    return _from_hwc(_augment_classifier_hwc(_to_hwc(img), augment, w, h, rng))


def _augment_detection_hwc(hwc, boxes, augment, w, h, rng, max_boxes):
    oh, ow = hwc.shape[:2]
    dw, dh = int(ow * augment.jitter), int(oh * augment.jitter)
    # int() truncates toward zero, as Darknet's float-to-int assignment does.
    pleft = int(_rand_uniform(rng, -dw, dw))
    pright = int(_rand_uniform(rng, -dw, dw))
    ptop = int(_rand_uniform(rng, -dh, dh))
    pbot = int(_rand_uniform(rng, -dh, dh))
    # jitter >= 0.5 could leave nothing to crop; Darknet would crash there.
    swidth = max(1, ow - pleft - pright)
    sheight = max(1, oh - ptop - pbot)
    sx, sy = swidth / ow, sheight / oh
    flip = bool(augment.flip and rng.integers(2))
    out = _crop_resize_hwc(hwc, pleft, ptop, swidth, sheight, w, h)
    if flip:
        out = np.ascontiguousarray(out[:, ::-1])
    out = _random_distort_hwc(out, rng, augment.hue, augment.saturation, augment.exposure)
    dx, dy = (pleft / ow) / sx, (ptop / oh) / sy
    return out, detection_truth(boxes, max_boxes, dx, dy, 1 / sx, 1 / sy, flip, rng)


def augment_detection_sample(img, boxes, augment, w, h, rng, max_boxes=MAX_BOXES):
    """One training (input, truth) as Darknet's load_data_detection makes it: crop the
    image with each side moved by a random amount in [-jitter, jitter] of its size (out
    of bounds repeats the edge), resize to w x h, maybe mirror, distort HSV, and move the
    boxes the same way (corrected, clipped, tiny ones dropped)."""
    out, truth = _augment_detection_hwc(_to_hwc(img), boxes, augment, w, h, rng, max_boxes)
    return _from_hwc(out), truth


def prepare_detector_eval_image(img, w, h, letterbox_input=True):
    """A detector's test input: letterboxed as Darknet's validate_detector and
    test_detector do, or plainly resized (validate_detector_recall, older YOLO)."""
    return letterbox(img, w, h) if letterbox_input else resize_image(img, w, h)


# ---------------------------------------------------------------------------------------
# Batches

class Batch(tuple):
    """A batch: unpacks as ``x, truth``; also carries ``paths`` (one per row) and
    ``image_sizes`` ((width, height) of each source image, for undoing a letterbox)."""

    def __new__(cls, x, truth, paths, image_sizes):
        self = super().__new__(cls, (x, truth))
        self.paths = paths
        self.image_sizes = image_sizes
        return self

    @property
    def x(self):
        return self[0]

    @property
    def truth(self):
        return self[1]


_SAMPLE_ATTEMPTS = 100    # replacement draws for one batch slot before giving up
TASKS = ("classifier", "detector")


class DataLoader:
    """Batches of Darknet training (or validation) data, built ahead in worker threads.

    Training (``train=True``): an endless stream; each image is drawn at random with
    replacement (``sampling="random"``, as Darknet's get_random_paths) or from a fresh
    permutation each epoch (``sampling="shuffle"``), then augmented. Batch ``k`` depends
    only on (seed, k, input size), never on thread timing, so a seed reproduces the run,
    and ``start=k`` (a resumed run's iteration) yields what an uninterrupted run would.
    An image that cannot be read (or whose labels are malformed or ambiguous) is reported
    once through ``on_error(path, message)`` (default: a line on stderr) and its slot is
    refilled with another image. A detector image without a label file is used with no
    boxes, as in Darknet, and reported once too.

    Validation (``train=False``): each path once, in list order, without augmentation
    (classifier: centre crop; detector: letterbox, or plain resize with
    ``letterbox=False``; truth boxes are the label file's, relative to the original image).
    The last batch may be short; unreadable images are reported and left out.

    ``set_size(w, h)`` changes the input size from the next batch on (YOLO random=1).
    """

    def __init__(self, paths, *, task, width, height, batch, classes, labels=None,
                 channels=3, augment=None, train=True, letterbox=True,
                 max_boxes=MAX_BOXES, sampling="random", seed=0, workers=4, prefetch=None,
                 on_error=None, start=0):
        if task not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, got {task!r}")
        if sampling not in ("random", "shuffle"):
            raise ValueError(f"sampling must be 'random' or 'shuffle', got {sampling!r}")
        if batch < 1 or width < 1 or height < 1:
            raise ValueError("batch, width and height must be positive")
        self.paths = [os.fspath(p) for p in paths]
        if not self.paths:
            raise DataError("no images to load: the image list is empty")
        self._distinct_paths = len(set(self.paths))
        if task == "classifier":
            if labels is None:
                raise ValueError("a classifier loader needs labels (the class names)")
            if len(labels) < classes:
                raise ValueError(f"{len(labels)} labels for {classes} classes")
        if augment is None and train:
            augment = ClassifierAugment() if task == "classifier" else DetectorAugment()
        self.task, self.batch, self.classes = task, batch, classes
        self.labels = list(labels)[:classes] if labels is not None else None
        self.channels, self.augment, self.train = channels, augment, train
        self.letterbox, self.max_boxes, self.sampling = letterbox, max_boxes, sampling
        self.truth_size = classes if task == "classifier" else max_boxes * TRUTH_FIELDS
        self.seed = int(np.random.SeedSequence().entropy) if seed is None else int(seed)
        self.bad_paths = {}           # path -> message: unusable images, reported once
        self.missing_labels = set()   # detector images trained on with no label file
        self._on_error = on_error or _report_to_stderr
        self._report_lock = threading.Lock()
        self._perm_lock = threading.Lock()
        self._perms = {}              # epoch -> permutation (sampling="shuffle")
        self._size = (int(width), int(height))
        self._workers = max(1, int(workers))
        self._prefetch = max(1, int(prefetch if prefetch is not None else 2 * self._workers))
        self._executor = ThreadPoolExecutor(self._workers, thread_name_prefix="darknet-data")
        self._pending = {}            # batch index -> (future, size)
        self._next = int(start)
        self._lock = threading.Lock()
        self._closed = False

    # -- public --------------------------------------------------------------------------

    @property
    def size(self):
        """The current input (width, height)."""
        return self._size

    def set_size(self, width, height):
        """Use a new input size from the next batch on; batches prefetched at the old size
        are rebuilt (Darknet likewise drops its in-flight load when it resizes)."""
        with self._lock:
            size = (int(width), int(height))
            if size == self._size:
                return
            self._size = size
            for k, (future, old) in list(self._pending.items()):
                if future.cancel():
                    self._pending[k] = (self._executor.submit(self._build, k, size), size)

    @property
    def batches_per_epoch(self):
        return math.ceil(len(self.paths) / self.batch)

    def __len__(self):
        """Batches in one pass over the list (training streams go on past it)."""
        return self.batches_per_epoch

    def next_batch(self):
        """The next Batch; in validation mode raises StopIteration after the last."""
        with self._lock:
            if self._closed:
                raise RuntimeError("DataLoader is closed")
            k = self._next
            if not self.train and k >= self.batches_per_epoch:
                raise StopIteration
            self._fill()
            future, size = self._pending.pop(k)
            self._next = k + 1
            self._fill()
            want = self._size
        if size != want:
            future.cancel()
            return self._build(k, want)
        return future.result()

    def __iter__(self):
        """Training: continue the endless stream. Validation: one pass from the start."""
        if not self.train:
            with self._lock:
                for future, _ in self._pending.values():
                    future.cancel()
                self._pending.clear()
                self._next = 0
        while True:
            try:
                batch = self.next_batch()
            except StopIteration:
                return
            yield batch

    def close(self):
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for future, _ in self._pending.values():
                future.cancel()
            self._pending.clear()
        self._executor.shutdown(wait=False, cancel_futures=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    # -- internals -----------------------------------------------------------------------

    def _fill(self):
        end = self._next + self._prefetch
        if not self.train:
            end = min(end, self.batches_per_epoch)
        for k in range(self._next, end):
            if k not in self._pending:
                self._pending[k] = (self._executor.submit(self._build, k, self._size), self._size)

    def _rng(self, *key):
        return np.random.default_rng(np.random.SeedSequence([self.seed, *key]))

    def _report(self, path, message, missing_label=False):
        with self._report_lock:
            if missing_label:
                if path in self.missing_labels:
                    return
                self.missing_labels.add(path)
            else:
                if path in self.bad_paths:
                    return
                self.bad_paths[path] = message
        self._on_error(path, message)

    def _slot_index(self, k, i, picks):
        """Index into paths for slot i of batch k, first choice."""
        if self.sampling == "random":
            return int(picks[i])
        position = k * self.batch + i
        epoch, offset = divmod(position, len(self.paths))
        with self._perm_lock:
            perm = self._perms.get(epoch)
            if perm is None:
                perm = self._rng(1, epoch).permutation(len(self.paths))
                self._perms = {e: p for e, p in self._perms.items() if e >= epoch - 1}
                self._perms[epoch] = perm
        return int(perm[offset])

    def _build(self, k, size):
        w, h = size
        if self.train:
            picks = self._rng(0, k).integers(0, len(self.paths), self.batch)
            count = self.batch
        else:
            first = k * self.batch
            count = min(self.batch, len(self.paths) - first)
        x = np.zeros((count, self.channels, h, w), dtype=np.float32)
        truth = np.zeros((count, self.truth_size), dtype=np.float32)
        paths, sizes = [], []
        row = 0
        for i in range(count):
            if self.train:
                index, image_size = self._train_slot(k, i, picks, w, h, x[row], truth[row])
            else:
                index = first + i
                image_size = self._load_into(index, None, w, h, x[row], truth[row])
                if image_size is None:
                    continue
            paths.append(self.paths[index])
            sizes.append(image_size)
            row += 1
        return Batch(x[:row], truth[:row], paths, sizes)

    def _train_slot(self, k, i, picks, w, h, x_out, truth_out):
        for attempt in range(_SAMPLE_ATTEMPTS):
            if attempt == 0:
                index = self._slot_index(k, i, picks)
            else:
                index = int(self._rng(3, k, i, attempt).integers(len(self.paths)))
            if self.paths[index] in self.bad_paths:
                continue   # as if read and failed again: the same draws follow either way
            image_size = self._load_into(index, self._rng(2, k, i, attempt), w, h, x_out,
                                         truth_out)
            if image_size is not None:
                return index, image_size
            if len(self.bad_paths) >= self._distinct_paths:
                break
        raise DataError(f"no usable image after {_SAMPLE_ATTEMPTS} draws "
                        f"({len(self.bad_paths)} of {len(self.paths)} images are unusable; "
                        f"first: {next(iter(self.bad_paths.items()), ('', ''))[1]})")

    def _load_into(self, index, rng, w, h, x_out, truth_out):
        """Load, augment (rng given) or prepare (rng None) image `index` into the output
        rows. Returns the source image's (width, height), or None (after reporting it)
        when the image is unusable."""
        path = self.paths[index]
        try:
            hwc = _read_hwc(path, self.channels)
            if self.task == "classifier":
                truth_out[:] = classifier_truth(path, self.labels, self.classes)
                if rng is None:
                    ih, iw = hwc.shape[:2]
                    m = min(iw, ih)    # Darknet's center_crop_image
                    out = _crop_resize_hwc(hwc, (iw - m) // 2, (ih - m) // 2, m, m, w, h)
                else:
                    out = _augment_classifier_hwc(hwc, self.augment, w, h, rng)
            else:
                try:
                    boxes = read_image_labels(path, self.classes)
                except MissingLabelFile as e:
                    self._report(path, f"{e}; using the image with no boxes", missing_label=True)
                    boxes = np.zeros((0, TRUTH_FIELDS), dtype=np.float32)
                if rng is None:
                    out = _to_hwc(prepare_detector_eval_image(_from_hwc(hwc), w, h,
                                                              self.letterbox))
                    kept = boxes[:self.max_boxes]
                    truth_out[:] = 0
                    truth_out[:kept.size] = kept.reshape(-1)
                else:
                    out, truth_out[:] = _augment_detection_hwc(hwc, boxes, self.augment, w, h,
                                                               rng, self.max_boxes)
            x_out[:] = out.transpose(2, 0, 1)
            return hwc.shape[1], hwc.shape[0]
        except (ImageError, DataError) as e:
            message = str(e)
            self._report(path, f"{message}; skipping it" if path in message
                         else f"{path}: {message}; skipping it")
            return None


def _report_to_stderr(path, message):
    print(f"darknet-py: {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------
# Anchors

def _wh_iou(boxes, centroids):
    """IoU of (n, 2) widths/heights against (k, 2), boxes aligned at a common centre."""
    inter = (np.minimum(boxes[:, None, 0], centroids[None, :, 0]) *
             np.minimum(boxes[:, None, 1], centroids[None, :, 1]))
    union = (boxes[:, 0] * boxes[:, 1])[:, None] + (centroids[:, 0] * centroids[:, 1])[None] - inter
    return inter / union


def kmeans_anchors(boxes_wh, k, seed=0, max_iter=300):
    """k-means on widths/heights with distance 1 - IoU (YOLOv2's anchor recipe).
    k-means++ seeding from ``seed``, so the result is deterministic. Returns float64
    (k, 2) anchors sorted by area, smallest first."""
    boxes = np.asarray(boxes_wh, dtype=np.float64).reshape(-1, 2)
    boxes = boxes[(boxes[:, 0] > 0) & (boxes[:, 1] > 0)]
    if k < 1:
        raise ValueError(f"k must be positive, got {k}")
    distinct = len(np.unique(boxes, axis=0))
    if distinct < k:
        raise DataError(f"cannot make {k} anchors from {distinct} distinct box sizes")
    rng = np.random.default_rng(seed)
    centroids = np.empty((k, 2))
    centroids[0] = boxes[rng.integers(len(boxes))]
    nearest = 1 - _wh_iou(boxes, centroids[:1])[:, 0]
    for j in range(1, k):
        weights = nearest ** 2
        total = weights.sum()
        pick = rng.choice(len(boxes), p=weights / total) if total > 0 else rng.integers(len(boxes))
        centroids[j] = boxes[pick]
        nearest = np.minimum(nearest, 1 - _wh_iou(boxes, centroids[j:j + 1])[:, 0])
    assign = None
    for _ in range(max_iter):
        iou = _wh_iou(boxes, centroids)
        new_assign = iou.argmax(axis=1)
        if assign is not None and np.array_equal(new_assign, assign):
            break
        assign = new_assign
        for j in range(k):
            members = boxes[assign == j]
            if len(members):
                centroids[j] = members.mean(axis=0)
            else:
                # An empty cluster takes the box its centroid fits worst.
                centroids[j] = boxes[iou.max(axis=1).argmin()]
    return centroids[np.argsort(centroids[:, 0] * centroids[:, 1], kind="stable")]


def anchor_mean_iou(boxes_wh, anchors):
    """Mean over boxes of the best IoU with any anchor (how well anchors fit the data)."""
    boxes = np.asarray(boxes_wh, dtype=np.float64).reshape(-1, 2)
    return float(_wh_iou(boxes, np.asarray(anchors, dtype=np.float64).reshape(-1, 2))
                 .max(axis=1).mean())


def gather_label_boxes(data_path, width, height, on_missing=None):
    """Widths and heights, in network-input pixels, of every box in the training list of
    a .data file: float64 (n, 2). Images without a label file are passed to
    ``on_missing(path)`` (default: counted and summarised on stderr)."""
    config = load_data_config(data_path, require=("train",))
    paths = config.train_paths()
    missing = []
    sizes = []
    for p in paths:
        try:
            b = read_image_labels(p, config.classes)
        except MissingLabelFile:
            missing.append(p)
            if on_missing is not None:
                on_missing(p)
            continue
        sizes.append(b[:, 2:4])
    if missing and on_missing is None:
        print(f"darknet-py: {len(missing)} of {len(paths)} training images have no label "
              f"file (first: {label_path(missing[0])})", file=sys.stderr)
    boxes = np.concatenate(sizes) if sizes else np.zeros((0, 2), dtype=np.float32)
    return boxes.astype(np.float64) * np.array([width, height], dtype=np.float64)


def compute_anchors(data_path, num, width, height, seed=0):
    """Anchors for a .data file's training boxes at a width x height network input:
    [(w, h), ...] sorted by area."""
    boxes = gather_label_boxes(data_path, width, height)
    if len(boxes) == 0:
        raise DataError(f"{data_path}: no labelled boxes in the training list")
    return [(float(w), float(h)) for w, h in kmeans_anchors(boxes, num, seed)]


def format_anchors(anchors):
    """The cfg line: 'anchors = 10,13, 16,30, ...' (whole pixels, at least 1)."""
    return "anchors = " + ", ".join(f"{max(1, round(w))},{max(1, round(h))}"
                                    for w, h in anchors)
