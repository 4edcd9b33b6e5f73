"""YOLO anchors from a dataset's box sizes: k-means with 1 - IoU as the distance."""

import sys

import numpy as np

from ..plurals import counted
from .check import check_detector_dataset
from .config import DataError, load_data_config
from .labels import MissingLabelFile, label_path, read_image_labels


def _wh_iou(boxes, centroids):
    """IoU of (n, 2) widths/heights against (k, 2), boxes aligned at a common centre."""
    inter = np.minimum(boxes[:, None, 0], centroids[None, :, 0]) * np.minimum(
        boxes[:, None, 1], centroids[None, :, 1]
    )
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
        raise DataError(f"cannot make {k} anchors from {counted(distinct, 'distinct box size')}")
    rng = np.random.default_rng(seed)
    centroids = np.empty((k, 2))
    centroids[0] = boxes[rng.integers(len(boxes))]
    nearest = 1 - _wh_iou(boxes, centroids[:1])[:, 0]
    for j in range(1, k):
        weights = nearest**2
        total = weights.sum()
        pick = rng.choice(len(boxes), p=weights / total) if total > 0 else rng.integers(len(boxes))
        centroids[j] = boxes[pick]
        nearest = np.minimum(nearest, 1 - _wh_iou(boxes, centroids[j : j + 1])[:, 0])
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
    return float(
        _wh_iou(boxes, np.asarray(anchors, dtype=np.float64).reshape(-1, 2)).max(axis=1).mean()
    )


def training_label_rows(data_path):
    """Every (class, x, y, w, h) box of a .data file's training list, float64 (n, 5), and
    the .data file's class count. Images without a label file are counted and summed up
    in one line on stderr."""
    config = load_data_config(data_path, require=("train",))
    paths = config.train_paths()
    check_detector_dataset(
        paths,
        config.classes,
        what="training",
        warn=lambda m: print(f"darknet-py: warning: {m}", file=sys.stderr),
    )
    missing = []
    rows = []
    for p in paths:
        try:
            b = read_image_labels(p, config.classes)
        except MissingLabelFile:
            missing.append(p)
            continue
        rows.append(np.column_stack([b[:, 4], b[:, 0:4]]))
    if missing:
        print(
            f"darknet-py: warning: {len(missing)} of {counted(len(paths), 'training image')} "
            f"{'has' if len(missing) == 1 else 'have'} no label "
            f"file (first: {label_path(missing[0])})",
            file=sys.stderr,
        )
    rows = np.concatenate(rows) if rows else np.zeros((0, 5))
    return rows.astype(np.float64), config.classes


def gather_label_boxes(data_path, width, height, labels=None):
    """Widths and heights, in network-input pixels, of every box in the training list of
    a .data file: float64 (n, 2). `labels`: training_label_rows(data_path), if read."""
    rows, _ = labels if labels is not None else training_label_rows(data_path)
    return rows[:, 3:5] * np.array([width, height], dtype=np.float64)


def fork_class_counters_text(rows, classes):
    """counters_per_class.txt as the fork's calc_anchors writes it beside anchors.txt:
    'counters_per_class = n0, n1, ...' (boxes per class of training_label_rows' rows), no
    line end."""
    counts = np.bincount(rows[:, 0].astype(np.int64), minlength=classes)[:classes]
    return "counters_per_class = " + ", ".join(str(int(c)) for c in counts)


def compute_anchors(data_path, num, width, height, seed=0, labels=None):
    """Anchors for a .data file's training boxes at a width x height network input.
    Returns (anchors, boxes): [(w, h), ...] sorted by area, and the boxes' (n, 2) sizes
    they were clustered from (gather_label_boxes)."""
    boxes = gather_label_boxes(data_path, width, height, labels)
    if len(boxes) == 0:
        raise DataError(f"{data_path}: no labelled boxes in the training list")
    return [(float(w), float(h)) for w, h in kmeans_anchors(boxes, num, seed)], boxes


def format_anchors(anchors):
    """The cfg line: 'anchors = 10,13, 16,30, ...' (whole pixels, at least 1)."""
    return "anchors = " + ", ".join(f"{max(1, round(w))},{max(1, round(h))}" for w, h in anchors)


def fork_anchors_text(anchors, width):
    """anchors.txt as the AlexeyAB fork's calc_anchors writes it: 'w,h, w,h, ...' with no
    line end, each value "%3.0f" (so padded to 3 characters) for a network wider than 32
    pixels, else "%2.4f"."""
    spec = "3.0f" if width > 32 else "2.4f"
    return ", ".join(f"{w:{spec}},{h:{spec}}" for w, h in anchors)


DEFAULT_SETTINGS = {"num": 9, "width": 416, "height": 416}


def anchor_settings(cfg=None, **given):
    """num, width and height for `anchors`: those given (not None), else the cfg's (the last
    [yolo]/[region] layer's num, [net] width and height), else YOLOv3's 9 at 416 x 416.
    Returns (settings, [the keys taken from the cfg])."""
    from ..cfg import parse_cfg

    from_cfg = {}
    if cfg is not None:
        sections = parse_cfg(cfg)
        net = sections[0]
        from_cfg = {
            "width": net.get_int("width", 0) or None,
            "height": net.get_int("height", 0) or None,
        }
        heads = [s for s in sections if s.type in ("yolo", "region", "gaussian_yolo")]
        if not heads:
            raise DataError(f"{cfg}: no [yolo] or [region] layer, so no anchors to compute")
        from_cfg["num"] = heads[-1].get_int("num", 1)
    settings, used = {}, []
    for key, default in DEFAULT_SETTINGS.items():
        if given.get(key) is not None:
            settings[key] = given[key]
        elif from_cfg.get(key):
            settings[key] = from_cfg[key]
            used.append(key)
        else:
            settings[key] = default
    return settings, used
