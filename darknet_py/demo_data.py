"""Demo datasets in Darknet's on-disk layout, built from the bundled handwritten digits.

darknet_py/demo_data/digits.npz holds the 1797 8x8 UCI digits (see LICENSE-digits.txt).
From it this module writes:

* a classification set: one PNG per digit, named so the class name is in the path
  (Darknet labels classifier images by the class name found in the path), with
  train.list, valid.list, digits.names and digits.data;
* a detection set: canvases with a few tinted digits pasted at random positions and
  sizes, images under images/ and boxes under labels/ (Darknet's label-path rule),
  with train.list, valid.list, digits.names and digits.data.

Class names are digit0..digit9: none is a substring of another, and unlike zero..nine
("one" is in "someone", "two" in "network") they are unlikely to occur in the directory
the set is written to, which Darknet's substring rule would also match. The builders
check every written path against Darknet's rules and raise DataError if one fails.
Lists and .data files hold absolute paths, so a set works from any current directory.
Both builders are deterministic for a given seed. Use a separate out_dir for each.
"""

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .data.augment import hsv_to_rgb
from .data.config import DataError
from .data.labels import check_classifier_labels, label_path
from .image import LUMA_RGB, resize_image, to_bgr

DIGITS_NPZ = os.path.join(os.path.dirname(os.path.abspath(__file__)), "demo_data", "digits.npz")
CLASS_NAMES = tuple(f"digit{i}" for i in range(10))
INK_THRESHOLD = 0.2  # glyph intensity that counts as ink when measuring a digit's box
INK_CONTRAST = 0.3  # least grey-value step from a canvas's background to its digits


def load_digits(path=DIGITS_NPZ):
    """The bundled digits: (images uint8 (N, 8, 8) 0..255, labels int64 (N,) 0..9)."""
    try:
        with np.load(path) as npz:
            images, labels = npz["images"], npz["labels"].astype(np.int64)
    except FileNotFoundError:
        raise DataError(
            f"{path}: bundled digits data not found (is the package installed "
            f"with its package data?)"
        ) from None
    if images.ndim != 3 or len(images) != len(labels):
        raise DataError(
            f"{path}: expected images (N, 8, 8) and N labels, got {images.shape} and {labels.shape}"
        )
    return images, labels


def split_digits(labels, seed=0, valid_fraction=0.2):
    """Stratified train/valid split: (train indices, valid indices), each sorted."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, 101]))
    train, valid = [], []
    for cls in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == cls))
        n_valid = int(round(len(members) * valid_fraction))
        valid.extend(members[:n_valid])
        train.extend(members[n_valid:])
    return np.sort(np.array(train, dtype=np.int64)), np.sort(np.array(valid, dtype=np.int64))


def _glyph(image8, w, h):
    """An 8x8 uint8 digit as a float32 (1, h, w) image in [0, 1], Darknet-resized."""
    return resize_image(image8[None].astype(np.float32) / 255.0, w, h)


def _prepare_out_dir(out_dir):
    out_dir = os.path.abspath(os.fspath(out_dir))
    if any(ch.isspace() for ch in out_dir):
        # Darknet's .data parser drops all whitespace, so such paths cannot be written.
        raise DataError(
            f"{out_dir}: the dataset directory must not contain whitespace "
            f"(Darknet's .data files cannot hold such paths)"
        )
    os.makedirs(out_dir, exist_ok=True)
    os.makedirs(os.path.join(out_dir, "backup"), exist_ok=True)
    return out_dir


def _write_lines(path, lines):
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write("".join(f"{line}\n" for line in lines))


def _write_data_file(path, options):
    _write_lines(path, [f"{k}={v}" for k, v in options.items()])


def _write_png(path, img):
    import cv2

    if img.shape[0] == 1:
        ok = cv2.imwrite(path, (np.clip(img[0], 0, 1) * 255 + 0.5).astype(np.uint8))
    else:
        ok = cv2.imwrite(path, to_bgr(img))
    if not ok:
        raise DataError(f"{path}: could not write image")


def _write_pngs(items):
    """Write [(path, image)]; creating many small files is I/O-bound, so use threads."""
    with ThreadPoolExecutor(8) as pool:
        for done in [pool.submit(_write_png, p, img) for p, img in items]:
            done.result()


def _write_names_and_data(out_dir, lists, classifier):
    """Write digits.names and digits.data for the train/valid lists; returns the .data path."""
    names = os.path.join(out_dir, "digits.names")
    _write_lines(names, CLASS_NAMES)
    options = {
        "classes": len(CLASS_NAMES),
        "train": lists["train"],
        "valid": lists["valid"],
        "names": names,
        "backup": os.path.join(out_dir, "backup") + os.sep,
    }
    if classifier:
        options.update(labels=names, top=2)
    data_path = os.path.join(out_dir, "digits.data")
    _write_data_file(data_path, options)
    return data_path


def build_classification_set(out_dir, seed=0, size=32, valid_fraction=0.2):
    """Write the digits as size x size grey PNGs, train/NNNN_digitK.png and
    valid/NNNN_digitK.png (NNNN: index in digits.npz), a stratified split. Returns the
    path of digits.data (classes=10, train, valid, labels, names, backup, top=2)."""
    out_dir = _prepare_out_dir(out_dir)
    images, labels = load_digits()
    train_idx, valid_idx = split_digits(labels, seed, valid_fraction)
    lists = {}
    for split, indices in (("train", train_idx), ("valid", valid_idx)):
        split_dir = os.path.join(out_dir, split)
        os.makedirs(split_dir, exist_ok=True)
        # Darknet's resize treats channels independently: resize them all in one call.
        glyphs = resize_image(images[indices].astype(np.float32) / 255.0, size, size)
        paths = [os.path.join(split_dir, f"{i:04d}_{CLASS_NAMES[labels[i]]}.png") for i in indices]
        problems = check_classifier_labels(paths, CLASS_NAMES)
        if problems:
            raise DataError(
                f"{out_dir}: Darknet's class-name-in-path rule would mislabel "
                f"the images; choose another directory. {problems[0][1]}"
            )
        _write_pngs((p, glyph[None]) for p, glyph in zip(paths, glyphs))
        lists[split] = os.path.join(out_dir, f"{split}.list")
        _write_lines(lists[split], paths)
    # Darknet's classifier matches paths against labels= and displays names=.
    return _write_names_and_data(out_dir, lists, classifier=True)


def _random_colour(rng, background, tries=20):
    """A bright, saturated RGB colour (so hue/saturation augmentation has work to do) whose
    grey value (the detector sees grey) is at least INK_CONTRAST above the background's:
    pure blue on dark brown is a clear digit in colour and next to invisible in grey."""
    floor = float(LUMA_RGB @ background.reshape(3)) + INK_CONTRAST
    for _ in range(tries):
        hsv = np.array(
            [rng.uniform(0, 1), rng.uniform(0.5, 1), rng.uniform(0.75, 1)], dtype=np.float32
        ).reshape(3, 1, 1)
        colour = hsv_to_rgb(hsv).reshape(3)
        if LUMA_RGB @ colour >= floor:
            break
    else:
        colour = np.ones(3, dtype=np.float32)  # white: grey value 1
    return colour.astype(np.float32).reshape(3, 1, 1)


def render_canvas(
    rng,
    images,
    labels,
    pool,
    canvas_size=128,
    max_digits=4,
    min_digit=16,
    max_digit=40,
    margin=2,
    tries=30,
):
    """One detection canvas: (float32 (3, S, S) image, [(class, left, top, right, bottom)]
    in pixels). 1..max_digits digits from ``pool`` (indices into images), each scaled to
    a height in [min_digit, max_digit] and a width of 0.75..1.15 of that, tinted and
    pasted where its ink box keeps ``margin`` pixels from every other ink box."""
    s = canvas_size
    background = rng.uniform(0.0, 0.3, size=(3, 1, 1)).astype(np.float32)
    canvas = np.clip(background + rng.uniform(-0.04, 0.04, size=(3, s, s)), 0, 1)
    canvas = canvas.astype(np.float32)
    boxes = []
    for _ in range(int(rng.integers(1, max_digits + 1))):
        index = int(pool[rng.integers(len(pool))])
        gh = int(rng.integers(min_digit, max_digit + 1))
        gw = max(4, int(round(gh * rng.uniform(0.75, 1.15))))
        gh, gw = min(gh, s), min(gw, s)
        glyph = _glyph(images[index], gw, gh)[0]
        ink_rows = np.flatnonzero((glyph > INK_THRESHOLD).any(axis=1))
        ink_cols = np.flatnonzero((glyph > INK_THRESHOLD).any(axis=0))
        if len(ink_rows) == 0:
            continue
        colour = _random_colour(rng, background)
        for _ in range(tries):
            ox, oy = int(rng.integers(0, s - gw + 1)), int(rng.integers(0, s - gh + 1))
            box = (ox + ink_cols[0], oy + ink_rows[0], ox + ink_cols[-1] + 1, oy + ink_rows[-1] + 1)
            if all(
                box[0] >= b[3] + margin
                or b[1] >= box[2] + margin
                or box[1] >= b[4] + margin
                or b[2] >= box[3] + margin
                for b in boxes
            ):
                alpha = glyph[None]
                region = canvas[:, oy : oy + gh, ox : ox + gw]
                canvas[:, oy : oy + gh, ox : ox + gw] = region * (1 - alpha) + colour * alpha
                boxes.append((int(labels[index]),) + tuple(int(v) for v in box))
                break
    return canvas, boxes


def build_detection_set(
    out_dir, n_train, n_valid, seed=0, canvas_size=128, max_digits=4, min_digit=16, max_digit=40
):
    """Write n_train + n_valid canvases (images/{train,valid}/NNNNNN.png, boxes in
    labels/{train,valid}/NNNNNN.txt as 'class x y w h' relative lines). Training canvases
    use the digits of the classification training split, validation canvases only the
    held-out ones, so the valid list is unseen data for the demo's detect step.
    Returns the path of digits.data (classes=10, train, valid, names, backup)."""
    if n_train < 1 or n_valid < 0:
        raise ValueError("need n_train >= 1 and n_valid >= 0")
    if not 4 <= min_digit <= max_digit <= canvas_size:
        raise ValueError("need 4 <= min_digit <= max_digit <= canvas_size")
    out_dir = _prepare_out_dir(out_dir)
    images, labels = load_digits()
    pools = dict(zip(("train", "valid"), split_digits(labels, seed)))
    lists = {}
    for split_id, (split, count) in enumerate((("train", n_train), ("valid", n_valid))):
        image_dir = os.path.join(out_dir, "images", split)
        labels_dir = os.path.join(out_dir, "labels", split)
        os.makedirs(image_dir, exist_ok=True)
        os.makedirs(labels_dir, exist_ok=True)
        paths, pngs = [], []
        for n in range(count):
            rng = np.random.default_rng(np.random.SeedSequence([seed, 202, split_id, n]))
            canvas, boxes = render_canvas(
                rng, images, labels, pools[split], canvas_size, max_digits, min_digit, max_digit
            )
            image_path = os.path.join(image_dir, f"{n:06d}.png")
            labels_path = os.path.join(labels_dir, f"{n:06d}.txt")
            if label_path(image_path) != labels_path:
                raise DataError(
                    f"{out_dir}: Darknet would look for the labels of "
                    f"{image_path} in {label_path(image_path)} (its path rule "
                    f"rewrites 'images', 'JPEGImages' and 'raw' anywhere in the "
                    f"path); choose a directory without those words"
                )
            pngs.append((image_path, canvas))
            s = float(canvas_size)
            _write_lines(
                labels_path,
                [
                    f"{cls} {(l + r) / 2 / s:.6f} {(t + b) / 2 / s:.6f} {(r - l) / s:.6f} "
                    f"{(b - t) / s:.6f}"
                    for cls, l, t, r, b in boxes
                ],
            )
            paths.append(image_path)
            if len(pngs) == 256:  # bound the memory held by canvases waiting to be written
                _write_pngs(pngs)
                pngs = []
        _write_pngs(pngs)
        lists[split] = os.path.join(out_dir, f"{split}.list")
        _write_lines(lists[split], paths)
    return _write_names_and_data(out_dir, lists, classifier=False)
