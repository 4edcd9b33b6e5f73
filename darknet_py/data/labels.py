"""Labels and truth rows, following pjreddie's C Darknet (src/data.c):

* A classifier image's class is the class name that occurs in its path (``strstr``).
* A detector image's labels live in a .txt file whose path is derived from the image
  path by each Darknet's own substitutions (pjreddie: ``images`` -> ``labels`` anywhere,
  ``.jpg`` -> ``.txt``, ...; the AlexeyAB fork: beside the image, but for COCO and VOC
  folders), one ``class x y w h`` line per box, coordinates relative to the image size.
* A detector truth row is ``max_boxes`` (90) boxes of ``(x, y, w, h, class)``,
  zero padded: the [yolo] layer stops at the first box whose x is 0.
"""

import math
import os

import numpy as np

from ..boxes import TRUTH_FIELDS
from .config import DataError, _read_text, _where

MAX_BOXES = 90  # Darknet's default for [yolo]/[region] max=
MIN_BOX_SIZE = 0.001  # fill_truth_detection drops boxes narrower or shorter than this
_EXACT_FLOAT32_INT = 2**24  # class ids below this are exact in a float32 truth row


class MissingLabelFile(DataError):
    """A detector image has no label file. Darknet-style callers treat it as 'no boxes'."""

    def __init__(self, label_path, image_path=None):
        self.label_path, self.image_path = label_path, image_path
        for_image = f" (for image {image_path})" if image_path else ""
        super().__init__(f"{_where(label_path)}: label file not found{for_image}")


def classifier_label_index(path, labels):
    """Darknet's classifier label rule: the class whose name occurs in the image path.
    Exactly one must occur; otherwise DataError says which did (or that none did)."""
    path = os.fspath(path)
    found = [i for i, name in enumerate(labels) if name in path]
    if len(found) == 1:
        return found[0]
    if not found:
        raise DataError(
            f"{path}: no class name occurs in the path (a classifier image's "
            f"class is the class name found in its path)"
        )
    names = ", ".join(repr(labels[i]) for i in found)
    raise DataError(
        f"{path}: {len(found)} class names occur in the path ({names}); exactly "
        f"one must (class names that are substrings of each other, or of a "
        f"directory name, make the label ambiguous)"
    )


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


# Where a detector image's label file is: each Darknet has its own rule.
#
# pjreddie's fill_truth_detection (src/data.c) rewrites the image path with these
# substitutions, in this order, each replacing only the first occurrence (its find_replace
# uses strstr), anywhere in the path: a folder /data/raw_photos/ becomes /data/labels_photos/.
_ORIGINAL_SUBSTITUTIONS = (
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
_ORIGINAL_EXTENSIONS = (".jpg", ".png", ".JPG", ".JPEG", ".jpeg")

# The AlexeyAB fork's replace_image_to_label (src/utils.c) rewrites only whole COCO and VOC
# folder names (first occurrence each, in this order; its general images -> labels and raw
# -> labels rules are commented out), trims spaces and tabs off both ends, then replaces the
# image extension only where it ends the path: other images keep their labels beside them.
_FORK_FOLDERS = (
    ("/images/train2017/", "/labels/train2017/"),
    ("/images/val2017/", "/labels/val2017/"),
    ("/JPEGImages/", "/labels/"),
    ("\\images\\train2017\\", "\\labels\\train2017\\"),
    ("\\images\\val2017\\", "\\labels\\val2017\\"),
    ("\\images\\train2014\\", "\\labels\\train2014\\"),
    ("\\images\\val2014\\", "\\labels\\val2014\\"),
    ("/images/train2014/", "/labels/train2014/"),
    ("/images/val2014/", "/labels/val2014/"),
    ("\\JPEGImages\\", "\\labels\\"),
)
_FORK_EXTENSIONS = (
    ".jpg",
    ".JPG",
    ".jpeg",
    ".JPEG",
    ".png",
    ".PNG",
    ".bmp",
    ".BMP",
    ".ppm",
    ".PPM",
    ".tiff",
    ".TIFF",
)

# The folder names both rules mean when they rewrite a folder (the image's own folder).
_IMAGE_FOLDERS = ("images", "JPEGImages", "raw")

RULE_NAMES = {
    "original": "the original Darknet's rule (images, JPEGImages, raw -> labels anywhere in "
    "the path)",
    "alexeyab": "the fork's rule (the label file beside the image)",
    "folder": "the image's own folder renamed to labels",
}


def is_fork_rule(darknet):
    """Whether a flavour ("original", "alexeyab", "alexeyab-cpu", ...) finds labels as the
    AlexeyAB fork does."""
    return str(darknet or "original").startswith("alexeyab")


def original_label_path(image_path):
    """The label file pjreddie's Darknet reads for a detector image."""
    image_path = os.fspath(image_path)
    out = image_path
    for find, replace in _ORIGINAL_SUBSTITUTIONS:
        out = out.replace(find, replace, 1)
    if not any(ext in image_path for ext in _ORIGINAL_EXTENSIONS):
        raise DataError(
            f"{image_path}: cannot derive a label file name: Darknet maps only "
            f"{', '.join(_ORIGINAL_EXTENSIONS)} images to .txt labels"
        )
    return out


def _fork_extension(path):
    for ext in _FORK_EXTENSIONS:
        if path.endswith(ext):
            return path[: -len(ext)] + ".txt"
    raise DataError(
        f"{path}: cannot derive a label file name: the fork maps only "
        f"{', '.join(_FORK_EXTENSIONS)} images to .txt labels"
    )


def fork_label_path(image_path):
    """The label file the AlexeyAB fork reads for a detector image."""
    out = os.fspath(image_path)
    for find, replace in _FORK_FOLDERS:
        out = out.replace(find, replace, 1)
    return _fork_extension(out.strip(" \t"))


def folder_label_path(image_path):
    """The image's own folder, when it is named images, JPEGImages or raw, renamed to
    labels, and the extension to .txt; None for an image in another folder."""
    folder, name = os.path.split(os.fspath(image_path))
    parent, own = os.path.split(folder)
    if own not in _IMAGE_FOLDERS:
        return None
    return _fork_extension(os.path.join(parent, "labels", name))


def label_path(image_path, darknet="original"):
    """The label file the Darknet of flavour `darknet` reads for a detector image (its rule
    alone; find_label_file also looks where the rule does not)."""
    return fork_label_path(image_path) if is_fork_rule(darknet) else original_label_path(image_path)


def label_candidates(image_path, darknet="original"):
    """[(rule, label path)], the flavour's own rule first, then the other Darknet's, then the
    image's own folder renamed (rules that give no name, or a name given before, left out).
    Raises the own rule's DataError when no rule gives a name (an unknown extension)."""
    own = "alexeyab" if is_fork_rule(darknet) else "original"
    other = "original" if own == "alexeyab" else "alexeyab"
    makers = {
        "original": original_label_path,
        "alexeyab": fork_label_path,
        "folder": folder_label_path,
    }
    out, seen = [], {os.fspath(image_path)}  # an image is never its own label file
    for rule in (own, other, "folder"):
        path = _or_none(makers[rule], image_path)
        if path is not None and path not in seen:
            seen.add(path)
            out.append((rule, path))
    if not out:
        label_path(image_path, own)  # raises the reason
    return out


def _or_none(fn, image_path):
    try:
        return fn(image_path)
    except DataError:
        return None


def find_label_file(image_path, darknet="original"):
    """(rule, path) of a detector image's label file: where the flavour's rule puts it,
    else the first of label_candidates that exists; the first candidate (the own rule's,
    where it gives a name) when none does. Raises DataError when no rule gives a name."""
    candidates = label_candidates(image_path, darknet)
    for rule, path in candidates:
        if os.path.isfile(path):
            return rule, path
    return candidates[0]


def parse_labels(text, source="<labels>", classes=None):
    """Parse label text into float32 (n, 5) rows of (x, y, w, h, class). A malformed line
    raises DataError naming ``source`` and the line number."""
    # All boxes at once: the per-token work runs in C (map over builtins, one array
    # conversion). Anything unusual (a malformed line, a value out of range, a class id
    # beyond float32's exact integers) goes to the line-by-line parser, which reports it.
    if set(map(len, map(str.split, text.splitlines()))) <= {0, TRUTH_FIELDS}:
        tokens = text.split()
        if not tokens:
            return np.zeros((0, TRUTH_FIELDS), dtype=np.float32)
        try:
            values = list(map(float, tokens))
            ids = list(map(int, tokens[::TRUTH_FIELDS]))
        except (ValueError, OverflowError):
            pass
        else:
            top = _EXACT_FLOAT32_INT if classes is None else min(classes, _EXACT_FLOAT32_INT)
            if (
                min(ids) >= 0
                and max(ids) < top
                and all(map(math.isfinite, values))
                and min(values[3::TRUTH_FIELDS] + values[4::TRUTH_FIELDS]) >= 0
            ):
                # The class column holds float(id): id exactly, below 2**24.
                rows = np.array(values, dtype=np.float32).reshape(-1, TRUTH_FIELDS)
                return rows[:, [1, 2, 3, 4, 0]]
    return _parse_labels_by_line(text, source, classes)


def _parse_labels_by_line(text, source, classes):
    """parse_labels one line at a time: the path for text the vectorised parser does not
    take as it is, so that an error names its line, as here."""
    rows = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line:
            continue
        fields = line.split()
        where = f"{source}:{lineno}"
        if len(fields) != 5:
            raise DataError(
                f"{where}: expected 'class x y w h' (5 fields), got {len(fields)}: '{line}'"
            )
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


def read_image_labels(image_path, classes=None, darknet="original"):
    """Boxes of a detector image, its label file found by find_label_file."""
    return read_labels(find_label_file(image_path, darknet)[1], classes, image_path)


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


def detection_truth(
    boxes, max_boxes=MAX_BOXES, dx=0.0, dy=0.0, sx=1.0, sy=1.0, flip=False, rng=None
):
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
    truth[: len(b)] = b
    return truth.reshape(-1)
