"""Validation: a classifier's top-1/top-k accuracy and a detector's mAP@0.5.

Classifier: every image of the .data file's valid list is centre-cropped to the network
size (Darknet's validate_classifier_single: the central square, resized) and its label is
the class name found in its path; accuracy is the share of images whose class is the most
probable (top-1) or among the k most probable (top-k; ties keep the lower class index
first, as Darknet's top_k does).

Detector: every valid image is letterboxed and run as `darknet-py detect` does, with a low
threshold (.005) and per-class NMS (.45), the settings Darknet's validation uses. Every
non-zero class probability of every box is one scored detection of that class. Per class,
detections sorted by score are matched greedily to that class's ground-truth boxes of the
same image (IoU >= .5, each ground-truth box matched at most once, as the PASCAL VOC
devkit does), and the AP is the area under the precision/recall curve with VOC's all-point
interpolation. mAP is the mean AP over the classes that have ground-truth boxes in the
valid set (a class without any cannot be scored).

Both print one last plain line a script can read: ``top-1: 0.9533 top-5: 0.9990`` or
``mAP@0.5: 0.7120``.
"""

import json
import os
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from .boxes import box_iou, fork_iou, results_corners
from .data.check import check_detector_dataset, refuse_unlabelled, scan_labels
from .data.config import _where, load_data_config
from .data.labels import MissingLabelFile, check_classifier_labels, read_image_labels
from .data.loader import DataLoader
from .errors import DarknetError
from .export.engine import load_with_engine
from .files import write_text_atomically
from .image import ImageError, load_image
from .network import load_network
from .plurals import counted
from .predictions import detect, detector_layers, output_layer
from .tree import hierarchy_predictions

VALID_THRESH = 0.005  # detections kept for mAP (Darknet's validate_detector)
VALID_NMS = 0.45
MAP_IOU = 0.5


class ValidationError(DarknetError):
    """A problem with what is validated (network kind, an empty valid list)."""


def network_task(net):
    """ "detector" when the network has a [yolo]/[region]/[detection] layer, "classifier"
    when its output layer is a [softmax] (or it ends in a [cost] layer), else an error."""
    if detector_layers(net):
        return "detector"
    last = output_layer(net)
    if last.type == "softmax" or net.layers[-1].type == "cost":
        return "classifier"
    raise ValidationError(
        f"{net.path}: cannot tell a classifier from a detector: the network ends in "
        f"[{last.type}] (a classifier ends in [softmax], a detector has a [yolo], [region] or "
        f"[detection] layer)"
    )


def check_valid_images(paths, list_path, warn=None):
    """Refuse a valid list none of whose images exists, naming the first and the count
    (before a network is loaded, or a training run starts); warn(message) about some
    missing."""
    missing = [p for p in paths if not os.path.isfile(p)]
    if len(missing) == len(paths):
        raise ValidationError(
            f"no image of the valid list could be read: all {len(paths)} "
            f"are missing, the first {_where(missing[0])} (listed in "
            f"{list_path})"
        )
    if missing and warn is not None:
        one = len(missing) == 1
        warn(
            f"{len(missing)} of the {counted(len(paths), 'valid image')} "
            f"{'is' if one else 'are'} missing (the first: {_where(missing[0])}); "
            f"{'it is' if one else 'they are'} skipped"
        )


def check_valid_set(
    paths, list_path, task, classes=None, labels=None, warn=None, darknet="original"
):
    """What `train --map` checks before iteration 1: the valid list's images exist and are
    labelled (a detector's label files hold a box, a classifier's paths name a class), so
    that no run stops (or ends without _best weights) at its first evaluation."""
    check_valid_images(paths, list_path, warn)
    if task == "detector":
        refuse_unlabelled(scan_labels(paths, classes, darknet), "validation")
        return
    problems = check_classifier_labels(paths, labels)
    if len(problems) == len(paths):
        raise ValidationError(
            f"no image of the valid list {list_path} can be labelled: {problems[0][1]}"
        )


class ImageProgress:
    """A progress line on stderr for a pass over images: done/total, images/s and the ETA.
    On a terminal the line is rewritten in place (4 times a second at most; end_line()
    before another message); otherwise a new line every `every` seconds. finish() prints
    the last one, with the time taken."""

    def __init__(self, total, what, stream=None, every=None, clock=time.monotonic):
        self.total, self.what, self.clock = total, what, clock
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.every = every if every is not None else (0.25 if self.tty else 5.0)
        self.start = self.last = clock()
        self.done = 0
        self.open_line = False  # a terminal line written without its line end

    def update(self, done):
        self.done = done
        now = self.clock()
        if now - self.last >= self.every:
            self.last = now
            rate = done / (now - self.start)
            eta = (self.total - done) / rate if rate > 0 else None
            self._show(
                f"{rate:.1f} images/s, ETA "
                + (seconds_text(eta) if eta is not None else "unknown"),
                final=False,
            )

    def finish(self):
        elapsed = self.clock() - self.start
        rate = self.done / elapsed if elapsed > 0 else 0.0
        self._show(f"{rate:.1f} images/s, in {seconds_text(elapsed)}", final=True)

    def _show(self, tail, final):
        line = f"{self.what}: {self.done}/{self.total} images, {tail}"
        if self.tty:
            line = "\r" + line + "\x1b[K"  # over the last one
        self.stream.write(line + ("\n" if final or not self.tty else ""))
        self.stream.flush()
        self.open_line = self.tty and not final

    def end_line(self):
        """End a terminal line left open, so that a warning starts on a line of its own."""
        if self.open_line:
            self.stream.write("\n")
            self.open_line = False


def seconds_text(seconds):
    """'42 s', '3 min 05 s', '2 h 07 min'."""
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {seconds:02d} s"
    return f"{minutes // 60} h {minutes % 60:02d} min"


def unread(skipped, total):
    """The end of the error for a list none of whose images could be read."""
    return f": {len(skipped)} of {total} skipped, the first: {skipped[0]}" if skipped else ""


# ---- classifier accuracy ---------------------------------------------------------------
def top_k_indexes(scores, k):
    """Indexes of the k highest scores, highest first; among equal scores the lower index
    comes first (Darknet's top_k uses a strict '>')."""
    scores = np.asarray(scores)
    return np.argsort(-scores, axis=-1, kind="stable")[..., :k]


def top_k_hits(predictions, labels, k):
    """(N,) bool: whether each row's label is among its k highest predictions."""
    predictions = np.asarray(predictions).reshape(len(labels), -1)
    labels = np.asarray(labels).reshape(-1, 1)
    return (top_k_indexes(predictions, k) == labels).any(axis=1)


@dataclass
class ClassifierResult:
    top1: float
    topk: float
    k: int
    images: int  # images scored
    skipped: int = 0  # images that could not be read or labelled

    def summary(self):
        return f"top-1: {self.top1:.4f} top-{self.k}: {self.topk:.4f}"


def evaluate_classifier(
    net, paths, labels, classes, k=5, batch=32, channels=None, log=None, workers=2
):
    """Top-1 and top-k accuracy of a classifier network over image `paths`, labelled by
    Darknet's class-name-in-path rule against `labels`. Uses the network's weights in
    inference mode (batch normalisation from the rolling statistics)."""
    o = net.options
    channels = channels or o.channels
    k = max(1, min(int(k), classes))
    head = output_layer(net)
    hits1 = hitsk = count = 0
    skipped = []
    loader = DataLoader(
        paths,
        task="classifier",
        width=o.width,
        height=o.height,
        batch=batch,
        classes=classes,
        labels=labels,
        channels=channels,
        train=False,
        workers=workers,
        on_warning=skipped.append,
    )
    try:
        for x, truth in loader:
            if len(x) == 0:
                continue
            net.forward(x, train=False)
            pred = net.be.to_host(head.output)[: len(x) * head.outputs].reshape(len(x), -1)
            if net.hierarchy is not None:  # validate_classifier: the leaves' P(class)
                pred = hierarchy_predictions(pred, net.hierarchy, only_leaves=True)
            pred = pred[:, :classes]
            label = truth.argmax(axis=1)
            hits1 += int(top_k_hits(pred, label, 1).sum())
            hitsk += int(top_k_hits(pred, label, k).sum())
            count += len(x)
            if log is not None:
                log(f"{count}: top 1: {hits1 / count:f}, top {k}: {hitsk / count:f}")
    finally:
        loader.close()
    for message in skipped[:3]:
        print(f"darknet-py: warning: {message}", file=sys.stderr)
    if count == 0:
        raise ValidationError(
            "no image of the valid list could be read and labelled" + unread(skipped, len(paths))
        )
    return ClassifierResult(hits1 / count, hitsk / count, k, count, len(skipped))


# ---- detector mAP ----------------------------------------------------------------------
def voc_ap(recall, precision):
    """PASCAL VOC's all-point interpolated average precision (VOC2010 onwards): the area
    under the precision/recall curve after making precision monotonically decreasing."""
    mrec = np.concatenate(([0.0], np.asarray(recall, dtype=np.float64), [1.0]))
    mpre = np.concatenate(([0.0], np.asarray(precision, dtype=np.float64), [0.0]))
    mpre = np.maximum.accumulate(mpre[::-1])[::-1]
    changes = np.nonzero(mrec[1:] != mrec[:-1])[0]
    return float(np.sum((mrec[changes + 1] - mrec[changes]) * mpre[changes + 1]))


def class_average_precision(detections, truths, iou_thresh=MAP_IOU):
    """AP of one class. `detections`: [(image_key, score, (x, y, w, h))]; `truths`:
    {image_key: (n, 4) boxes (x, y, w, h)}. Boxes are centre-based, in any one unit.
    Returns (ap, true positives, false positives); ap is None without ground truth."""
    npos = sum(len(b) for b in truths.values())
    if npos == 0:
        return None, 0, len(detections)
    order = sorted(range(len(detections)), key=lambda i: -detections[i][1])
    used = {key: np.zeros(len(b), dtype=bool) for key, b in truths.items()}
    tp = np.zeros(len(order))
    fp = np.zeros(len(order))
    for rank, i in enumerate(order):
        key, _, box = detections[i]
        gt = truths.get(key)
        if gt is None or len(gt) == 0:
            fp[rank] = 1
            continue
        overlaps = np.nan_to_num(box_iou(np.asarray(box, dtype=np.float32)[None], gt), nan=0.0)
        best = int(np.argmax(overlaps))
        if overlaps[best] >= iou_thresh and not used[key][best]:
            used[key][best] = True
            tp[rank] = 1
        else:
            fp[rank] = 1  # a miss, or a second detection of an object already found
    ctp, cfp = np.cumsum(tp), np.cumsum(fp)
    recall = ctp / npos
    precision = ctp / np.maximum(ctp + cfp, np.finfo(np.float64).eps)
    return voc_ap(recall, precision), int(tp.sum()), int(fp.sum())


def mean_average_precision(detections, truths, classes, iou_thresh=MAP_IOU):
    """Per-class AP and their mean. `detections`: [(image_key, class_id, score, box)];
    `truths`: {image_key: (n, 5) rows (x, y, w, h, class)}. Returns (map, [ap or None per
    class], [ground-truth count per class]); map is the mean over classes with ground
    truth (0 when there are none)."""
    per_class_dets = [[] for _ in range(classes)]
    for key, c, score, box in detections:
        if 0 <= c < classes:
            per_class_dets[c].append((key, score, box))
    aps, counts = [], []
    rows_of = {
        key: np.asarray(rows, dtype=np.float32).reshape(-1, 5) for key, rows in truths.items()
    }
    for c in range(classes):
        gt = {key: rows[rows[:, 4] == c, :4] for key, rows in rows_of.items()}
        counts.append(int(sum(len(b) for b in gt.values())))
        aps.append(class_average_precision(per_class_dets[c], gt, iou_thresh)[0])
    scored = [ap for ap in aps if ap is not None]
    return (float(np.mean(scored)) if scored else 0.0), aps, counts


@dataclass
class DetectorResult:
    map: float
    aps: list  # per class: AP, or None for a class without ground truth
    truths: list  # ground-truth boxes per class
    images: int
    names: list = field(default_factory=list)
    skipped: int = 0

    def per_class_lines(self):
        lines = []
        for c, (ap, n) in enumerate(zip(self.aps, self.truths)):
            name = self.names[c] if c < len(self.names) else str(c)
            value = f"{ap:.4f}" if ap is not None else "n/a (no ground truth)"
            lines.append(f"class {c:3d} {name}: AP {value}, {n} object{'s' if n != 1 else ''}")
        return lines

    def summary(self):
        return f"mAP@0.5: {self.map:.4f}"


def image_detections(net, image, thresh=VALID_THRESH, nms=VALID_NMS):
    """[(class_id, score, (x, y, w, h) relative)] of one image: every class probability
    left non-zero by the threshold and NMS, in the order Darknet's validation loops visit
    them (boxes in NMS's order, each box's classes ascending): the order that decides
    where detections of equal score rank (see fork_map)."""
    out = []
    for d in detect(net, image, thresh=thresh, nms=nms, darknet_order=True):
        for c in np.nonzero(d.probs > 0)[0]:
            out.append((int(c), float(d.probs[c]), d.box))
    return out


def evaluate_detector(
    net,
    paths,
    classes,
    names=None,
    thresh=VALID_THRESH,
    nms=VALID_NMS,
    iou_thresh=MAP_IOU,
    log=None,
    on_image=None,
):
    """mAP@iou_thresh of a detector network over image `paths` (labels by Darknet's
    label-path rule; an image without a label file has no objects). on_image(path, width,
    height, [(class_id, score, box)]) is called with each image's scored detections."""
    channels = net.options.channels
    detections, truths = [], {}
    skipped = []
    missing = 0
    start = time.perf_counter()
    for index, path in enumerate(paths):
        try:
            image = load_image(path, channels)
        except ImageError as e:
            skipped.append(str(e))
            continue
        try:
            truths[index] = read_image_labels(path, classes, net.darknet)
        except MissingLabelFile:
            missing += 1
            truths[index] = np.zeros((0, 5), dtype=np.float32)
        found = image_detections(net, image, thresh, nms)
        for c, score, box in found:
            detections.append((index, c, score, box))
        if on_image is not None:
            on_image(path, image.shape[2], image.shape[1], found)
        if log is not None and (index + 1) % 100 == 0:
            log(f"{index + 1} of {len(paths)} images, {time.perf_counter() - start:.1f} s")
    for message in skipped[:3]:
        print(f"darknet-py: warning: {message}; skipping it", file=sys.stderr)
    if missing:
        print(
            f"darknet-py: warning: {missing} of {len(paths)} valid images have no label file; "
            f"counted as images without objects",
            file=sys.stderr,
        )
    if not truths:
        raise ValidationError(
            "no image of the valid list could be read" + unread(skipped, len(paths))
        )
    mean_ap, aps, counts = mean_average_precision(detections, truths, classes, iou_thresh)
    if sum(counts) == 0:
        raise ValidationError("the valid images have no labelled boxes: mAP cannot be computed")
    return DetectorResult(mean_ap, aps, counts, len(truths), list(names or []), len(skipped))


# ---- Darknet's results files ----------------------------------------------------------
# COCO's category ids of the 80 classes in coco.names order (COCO numbers 1..90 with gaps).
COCO_CATEGORY_IDS = (
    1,
    2,
    3,
    4,
    5,
    6,
    7,
    8,
    9,
    10,
    11,
    13,
    14,
    15,
    16,
    17,
    18,
    19,
    20,
    21,
    22,
    23,
    24,
    25,
    27,
    28,
    31,
    32,
    33,
    34,
    35,
    36,
    37,
    38,
    39,
    40,
    41,
    42,
    43,
    44,
    46,
    47,
    48,
    49,
    50,
    51,
    52,
    53,
    54,
    55,
    56,
    57,
    58,
    59,
    60,
    61,
    62,
    63,
    64,
    65,
    67,
    70,
    72,
    73,
    74,
    75,
    76,
    77,
    78,
    79,
    80,
    81,
    82,
    84,
    85,
    86,
    87,
    88,
    89,
    90,
)
COMP4_PREFIX = "comp4_det_test_"
COCO_RESULTS = "coco_results.json"


class DetectionResultsWriter:
    """Collects a detector's scored detections per image and writes Darknet's results
    files into one directory:

    * ``comp4_det_test_<class name>.txt`` per class (validate_detector's VOC files): one
      line per detection, ``<image id> <prob> <left> <top> <right> <bottom>``, the image id
      being the file name without directory and extension, corners in pixels of the
      original image, 1-based and clipped to [1, size];
    * ``coco_results.json`` (validate_detector with eval=coco): a list of
      ``{"image_id", "category_id", "bbox": [left, top, width, height], "score"}``, pixels,
      0-based. image_id is the number after the last '_' of the file name, as Darknet's
      get_coco_image_id reads COCO's names (the name itself where that is no number);
      category_id is COCO's id for an 80-class network, else the class index.

    Existing files are an error unless overwrite; every file is written atomically."""

    def __init__(self, directory, classes, names=None, overwrite=False):
        self.directory = os.fspath(directory)
        self.classes = classes
        self.names = [names[c] if names and c < len(names) else str(c) for c in range(classes)]
        self.comp4 = [[] for _ in range(classes)]
        self.coco = []
        existing = [p for p in self.paths() if os.path.exists(p)]
        if existing and not overwrite:
            more = f" and {len(existing) - 1} more" if len(existing) > 1 else ""
            raise ValidationError(
                f"{existing[0]}{more}: results of an earlier run; pass "
                f"--overwrite to replace them, or choose another "
                f"--results-dir"
            )

    def paths(self):
        return [
            os.path.join(self.directory, f"{COMP4_PREFIX}{name}.txt") for name in self.names
        ] + [os.path.join(self.directory, COCO_RESULTS)]

    def add(self, path, width, height, detections):
        """One image's [(class_id, score, relative box)], as evaluate_detector's on_image."""
        image_id = os.path.splitext(os.path.basename(path))[0]
        number = image_id.rsplit("_", 1)[-1]
        coco_id = int(number) if number.isdigit() else image_id
        for c, score, box in detections:
            left, top, right, bottom = results_corners(box, width, height, origin=1)
            self.comp4[c].append(f"{image_id} {score:f} {left:f} {top:f} {right:f} {bottom:f}\n")
            left, top, right, bottom = results_corners(box, width, height, origin=0)
            self.coco.append(
                {
                    "image_id": coco_id,
                    "category_id": COCO_CATEGORY_IDS[c] if self.classes == 80 else c,
                    "bbox": [round(v, 6) for v in (left, top, right - left, bottom - top)],
                    "score": round(score, 6),
                }
            )

    def write(self):
        """Write every file; returns their paths."""
        os.makedirs(self.directory, exist_ok=True)
        paths = self.paths()
        for path, lines in zip(paths, self.comp4):
            write_text_atomically(path, "".join(lines))
        write_text_atomically(paths[-1], json.dumps(self.coco, indent=0) + "\n")
        return paths


# ---- the AlexeyAB fork's `detector map` -------------------------------------------------
MAP_CONF_THRESH = 0.25  # the fork's thresh_calc_avg_iou: precision/recall/F1 are taken here


@dataclass
class ForkMapResult:
    map: float
    aps: list  # per class
    tp: list  # per class, detections above the confidence threshold
    fp: list
    truths: list  # ground-truth boxes per class
    detections: int  # scored (detection, class) pairs
    avg_iou: float  # over the detections above the confidence threshold
    iou_thresh: float
    points: int
    thresh: float
    names: list = field(default_factory=list)
    curves: list = field(default_factory=list, repr=False)  # per class: (recall, precision)

    def lines(self):
        """The fork's report, with each class's precision, recall and F1 at the
        confidence threshold added to its line."""
        out = [f" detections_count = {self.detections}, unique_truth_count = {sum(self.truths)}  "]
        for c, ap in enumerate(self.aps):
            name = self.names[c] if c < len(self.names) else str(c)
            p, r, f1 = shown_ratios(self.tp[c], self.fp[c], self.truths[c])
            out.append(
                f"class_id = {c}, name = {name}, ap = {ap * 100:2.2f}%   \t (TP = "
                f"{self.tp[c]}, FP = {self.fp[c]}) precision = {p:1.2f}, recall = "
                f"{r:1.2f}, F1-score = {f1:1.2f} "
            )
        tp, fp, truths = sum(self.tp), sum(self.fp), sum(self.truths)
        p, r, f1 = shown_ratios(tp, fp, truths)
        out += [
            "",
            f" for conf_thresh = {self.thresh:1.2f}, precision = {p:1.2f}, recall = "
            f"{r:1.2f}, F1-score = {f1:1.2f} ",
            f" for conf_thresh = {self.thresh:0.2f}, TP = {tp}, FP = {fp}, FN = "
            f"{truths - tp}, average IoU = {self.avg_iou * 100:2.2f} % ",
            "",
        ]
        how = (
            f"used {self.points} Recall-points "
            if self.points
            else "used Area-Under-Curve for each unique Recall "
        )
        out += [
            f" IoU threshold = {self.iou_thresh * 100:2.0f} %, {how}",
            f" mean average precision (mAP@{self.iou_thresh:0.2f}) = {self.map:f}, or "
            f"{self.map * 100:2.2f} % ",
        ]
        return out


def precision_recall_f1(tp, fp, truths):
    """Precision, recall and F1 as the fork divides them (NaN where it divides by 0)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.float64(tp) / np.float64(tp + fp)
        r = np.float64(tp) / np.float64(truths)
        return float(p), float(r), float(2 * p * r / (p + r))


def warn_on_stderr(message):
    print(f"darknet-py: warning: {message}", file=sys.stderr)


def shown_ratios(tp, fp, truths):
    """precision_recall_f1 for the report: 0 where a ratio has nothing to divide (no
    detections, no truth), as "F1-score = nan" tells a user nothing."""
    return tuple(0.0 if np.isnan(v) else v for v in precision_recall_f1(tp, fp, truths))


def fork_map(images, classes, iou_thresh=MAP_IOU, points=0, thresh=MAP_CONF_THRESH, names=None):
    """The fork's validate_detector_map on scored images: `images` is a list of
    (detections [(class_id, score, (x, y, w, h))], truth rows (n, 5) of x, y, w, h, class).
    A detection is a true positive when its IoU with a not yet found truth box of its
    class is above iou_thresh (its best such box); all detections, every class together,
    are ranked by score. AP per class: the area under the precision/recall curve made
    monotonic, for every recall reached (points=0, VOC 2010-2012), or the mean over
    `points` equally spaced recalls of the best precision at that recall or more (11:
    VOC 2007, 101: MS COCO). mAP is the mean over all classes, those without ground
    truth included, as the fork divides.

    Detections of equal score rank in the order they are given (images in list order,
    each image's as image_detections lists them), which is where the fork's qsort leaves
    them with glibc: its qsort is a merge sort, stable whenever it can allocate its
    buffer (qsort's fallback, and other C libraries' qsort, may order ties otherwise)."""
    scored = []  # (score, class, unique truth index or -1)
    truth_count = np.zeros(classes, dtype=np.int64)
    tp_at = np.zeros(classes, dtype=np.int64)
    fp_at = np.zeros(classes, dtype=np.int64)
    iou_sum = 0.0
    unique = 0
    for dets, truth in images:
        truth = np.asarray(truth, dtype=np.float32).reshape(-1, 5)
        labels = truth[:, 4].astype(np.int64)
        np.add.at(truth_count, labels[(labels >= 0) & (labels < classes)], 1)
        claimed = set()  # truth indexes taken above the confidence threshold in this image
        for c, score, box in dets:
            same = np.nonzero(labels == c)[0]
            ious = fork_iou(np.asarray(box, dtype=np.float32), truth[same, :4])
            ok = ious > np.float32(iou_thresh)
            index, best = -1, 0.0
            if ok.any():
                k = int(np.argmax(np.where(ok, ious, -1)))
                index, best = unique + int(same[k]), float(ious[k])
            scored.append((score, c, index))
            if score > thresh:
                if index > -1 and index not in claimed:
                    iou_sum += best
                    tp_at[c] += 1
                else:
                    fp_at[c] += 1
            claimed.add(index)
        unique += len(truth)
    above = int(tp_at.sum() + fp_at.sum())
    order = sorted(range(len(scored)), key=lambda i: -scored[i][0])
    tp = np.zeros((classes, len(order)), dtype=np.int64)
    fp = np.zeros((classes, len(order)), dtype=np.int64)
    found = set()
    for rank, i in enumerate(order):
        _, c, index = scored[i]
        if index > -1 and index not in found:
            found.add(index)
            tp[c, rank] = 1
        else:
            fp[c, rank] = 1
    tp, fp = np.cumsum(tp, axis=1), np.cumsum(fp, axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        precision = np.where(tp + fp > 0, tp / (tp + fp), 0.0)
        recall = np.where(truth_count[:, None] > 0, tp / truth_count[:, None], 0.0)
    aps = [curve_ap(recall[c], precision[c], points) for c in range(classes)]
    # Each class's curve at its own detections' ranks (for map --plots).
    curves = [
        (
            recall[c][np.diff(tp[c] + fp[c], prepend=0) > 0],
            precision[c][np.diff(tp[c] + fp[c], prepend=0) > 0],
        )
        for c in range(classes)
    ]
    return ForkMapResult(
        float(np.sum(aps) / classes),
        aps,
        tp_at.tolist(),
        fp_at.tolist(),
        truth_count.tolist(),
        len(scored),
        iou_sum / above if above else 0.0,
        iou_thresh,
        points,
        thresh,
        list(names or []),
        curves,
    )


def curve_ap(recall, precision, points=0):
    """One class's AP from its precision/recall at every rank (see fork_map)."""
    if len(recall) == 0:
        return 0.0
    if points:
        targets = np.arange(points) / (points - 1)
        best = [precision[recall >= r].max(initial=0.0) for r in targets]
        return float(np.sum(best) / points)
    ap, last_recall, last_precision = 0.0, recall[-1], precision[-1]
    for rank in range(len(recall) - 2, -1, -1):
        ap += (last_recall - recall[rank]) * max(last_precision, precision[rank])
        last_recall = recall[rank]
        last_precision = max(last_precision, precision[rank])
    return float(ap + last_recall * last_precision)


def detector_map(
    cfg,
    data,
    weights,
    device="auto",
    iou_thresh=MAP_IOU,
    points=0,
    thresh=MAP_CONF_THRESH,
    log=print,
    darknet=None,
    plots=None,
    engine="numpy",
    progress=True,
):
    """The fork's `detector map`: load CFG with WEIGHTS, detect on the valid list of the
    .data file DATA as validation does (threshold .005, NMS .45 of the network's kind),
    and print fork_map's report (with progress, an ImageProgress line on stderr while the
    images run). A valid set without a single labelled box is refused (the fork prints
    mAP 0). Returns the ForkMapResult."""
    config = load_data_config(data, require=("valid",))
    paths = config.valid_paths()
    if not paths:
        raise ValidationError(f"{config.valid}: the valid list is empty")
    check_valid_images(paths, config.valid)
    net = load_with_engine(
        load_network, engine, device, cfg=cfg, weights=weights, batch=1, darknet=darknet
    )
    if network_task(net) != "detector":
        raise ValidationError(
            f"{cfg}: map scores detectors; the network is a classifier (use `darknet-py valid`)"
        )
    classes = detector_layers(net)[-1].classes
    refuse_unlabelled(
        check_detector_dataset(
            paths, classes, warn_on_stderr, what="validation", darknet=net.darknet
        )
    )
    images, skipped = [], []
    shown = ImageProgress(len(paths), "map") if progress else None
    for index, path in enumerate(paths):
        if shown is not None:
            shown.update(index)
        try:
            image = load_image(path, net.options.channels)
        except ImageError as e:
            if shown is not None:
                shown.end_line()
            print(f"darknet-py: warning: {e}; skipping it", file=sys.stderr)
            skipped.append(str(e))
            continue
        try:
            truth = read_image_labels(path, classes, net.darknet)
        except MissingLabelFile:
            truth = np.zeros((0, 5), dtype=np.float32)
        images.append((image_detections(net, image), truth))
    if shown is not None:
        shown.done = len(paths)
        shown.finish()
    if not images:
        raise ValidationError(
            "no image of the valid list could be read" + unread(skipped, len(paths))
        )
    result = fork_map(images, classes, iou_thresh, points, thresh, config.names)
    for line in result.lines():
        log(line)
    if plots is not None:  # PR curves and the confusion matrix (map_plots.py)
        from .map_plots import write_map_plots

        for path in write_map_plots(plots, result, images, classes, config.names):
            log(f"wrote {path}")
    return result


# ---- the `valid` command ---------------------------------------------------------------
def validate(
    cfg,
    data,
    weights,
    device="auto",
    top=None,
    log=print,
    results_dir=None,
    overwrite=False,
    darknet=None,
    engine="numpy",
):
    """Load CFG with WEIGHTS and score it on the valid list of the .data file DATA. Prints
    per-class results, then the summary line; returns the result. For a detector with
    results_dir, also writes Darknet's results files there (DetectionResultsWriter),
    refusing to replace earlier ones unless overwrite."""
    config = load_data_config(data, require=("valid",))
    paths = config.valid_paths()
    if not paths:
        raise ValidationError(f"{config.valid}: the valid list is empty")
    check_valid_images(paths, config.valid)
    net = load_with_engine(
        load_network, engine, device, cfg=cfg, weights=weights, batch=1, darknet=darknet
    )
    net.names = config.names
    task = network_task(net)
    if task == "classifier":
        k = top if top is not None else (config.top if config.top > 1 else 5)
        result = evaluate_classifier(net, paths, config.labels, config.classes, k=k, log=None)
        log(
            f"{counted(result.images, 'image')}: top 1: {result.top1:f}, top {result.k}: "
            f"{result.topk:f}"
        )
    else:
        classes = detector_layers(net)[-1].classes
        if classes != config.classes:
            print(
                f"darknet-py: warning: {data} has classes={config.classes} but the "
                f"network's detection layer has classes={classes}; using {classes}",
                file=sys.stderr,
            )
        refuse_unlabelled(
            check_detector_dataset(
                paths, classes, warn_on_stderr, what="validation", darknet=net.darknet
            )
        )
        writer = (
            DetectionResultsWriter(results_dir, classes, config.names, overwrite)
            if results_dir is not None
            else None
        )
        result = evaluate_detector(
            net,
            paths,
            classes,
            config.names,
            log=log,
            on_image=writer.add if writer is not None else None,
        )
        for line in result.per_class_lines():
            log(line)
        log(counted(result.images, "image"))
        if writer is not None:
            written = writer.write()
            log(
                f"Results: {len(written) - 1} {COMP4_PREFIX}<class>.txt files and "
                f"{COCO_RESULTS} in {results_dir}"
            )
    log(result.summary())
    return result


__all__ = [
    "ClassifierResult",
    "DetectionResultsWriter",
    "DetectorResult",
    "ForkMapResult",
    "ImageProgress",
    "ValidationError",
    "check_valid_set",
    "class_average_precision",
    "detector_map",
    "fork_map",
    "evaluate_classifier",
    "evaluate_detector",
    "mean_average_precision",
    "network_task",
    "top_k_hits",
    "top_k_indexes",
    "validate",
    "voc_ap",
]
