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

from .boxes import box_iou, results_corners
from .data.config import load_data_config
from .data.labels import MissingLabelFile, read_image_labels
from .data.loader import DataLoader
from .files import write_text_atomically
from .detection import detector_layers, output_layer

VALID_THRESH = 0.005   # detections kept for mAP (Darknet's validate_detector)
VALID_NMS = 0.45
MAP_IOU = 0.5


class ValidationError(Exception):
    """A problem with what is validated (network kind, an empty valid list)."""


def network_task(net):
    """"detector" when the network has a [yolo]/[region]/[detection] layer, "classifier"
    when its output layer is a [softmax] (or it ends in a [cost] layer), else an error."""
    if detector_layers(net):
        return "detector"
    last = output_layer(net)
    if last.type == "softmax" or net.layers[-1].type == "cost":
        return "classifier"
    raise ValidationError(
        f"{net.path}: cannot tell a classifier from a detector: the network ends in "
        f"[{last.type}] (a classifier ends in [softmax], a detector has a [yolo], [region] or "
        f"[detection] layer)")


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
    images: int            # images scored
    skipped: int = 0       # images that could not be read or labelled

    def summary(self):
        return f"top-1: {self.top1:.4f} top-{self.k}: {self.topk:.4f}"


def evaluate_classifier(net, paths, labels, classes, k=5, batch=32, channels=None,
                        log=None, workers=2):
    """Top-1 and top-k accuracy of a classifier network over image `paths`, labelled by
    Darknet's class-name-in-path rule against `labels`. Uses the network's weights in
    inference mode (batch normalisation from the rolling statistics)."""
    o = net.options
    channels = channels or o.channels
    k = max(1, min(int(k), classes))
    head = output_layer(net)
    hits1 = hitsk = count = 0
    skipped = []
    loader = DataLoader(paths, task="classifier", width=o.width, height=o.height,
                        batch=batch, classes=classes, labels=labels, channels=channels,
                        train=False, workers=workers,
                        on_error=lambda path, message: skipped.append(message))
    try:
        for x, truth in loader:
            if len(x) == 0:
                continue
            net.forward(x, train=False)
            pred = net.be.to_host(head.output)[:len(x) * head.outputs].reshape(len(x), -1)
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
        print(f"darknet-py: {message}", file=sys.stderr)
    if count == 0:
        raise ValidationError("no image of the valid list could be read and labelled")
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
    rows_of = {key: np.asarray(rows, dtype=np.float32).reshape(-1, 5)
               for key, rows in truths.items()}
    for c in range(classes):
        gt = {key: rows[rows[:, 4] == c, :4] for key, rows in rows_of.items()}
        counts.append(int(sum(len(b) for b in gt.values())))
        aps.append(class_average_precision(per_class_dets[c], gt, iou_thresh)[0])
    scored = [ap for ap in aps if ap is not None]
    return (float(np.mean(scored)) if scored else 0.0), aps, counts


@dataclass
class DetectorResult:
    map: float
    aps: list              # per class: AP, or None for a class without ground truth
    truths: list           # ground-truth boxes per class
    images: int
    names: list = field(default_factory=list)
    skipped: int = 0

    def per_class_lines(self):
        lines = []
        for c, (ap, n) in enumerate(zip(self.aps, self.truths)):
            name = self.names[c] if c < len(self.names) else str(c)
            value = f"{ap:.4f}" if ap is not None else "n/a (no ground truth)"
            lines.append(f"class {c:3d} {name}: AP {value}, {n} objects")
        return lines

    def summary(self):
        return f"mAP@0.5: {self.map:.4f}"


def image_detections(net, image, thresh=VALID_THRESH, nms=VALID_NMS):
    """[(class_id, score, (x, y, w, h) relative)] of one image: every class probability
    left non-zero by the threshold and NMS."""
    out = []
    for d in net.detect(image, thresh=thresh, nms=nms):
        for c in np.nonzero(d.probs > 0)[0]:
            out.append((int(c), float(d.probs[c]), d.box))
    return out


def evaluate_detector(net, paths, classes, names=None, thresh=VALID_THRESH, nms=VALID_NMS,
                      iou_thresh=MAP_IOU, log=None, on_image=None):
    """mAP@iou_thresh of a detector network over image `paths` (labels by Darknet's
    label-path rule; an image without a label file has no objects). on_image(path, width,
    height, [(class_id, score, box)]) is called with each image's scored detections."""
    from .image import ImageError, load_image

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
            truths[index] = read_image_labels(path, classes)
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
        print(f"darknet-py: {message}; skipping it", file=sys.stderr)
    if missing:
        print(f"darknet-py: {missing} of {len(paths)} valid images have no label file; "
              f"counted as images without objects", file=sys.stderr)
    if not truths:
        raise ValidationError("no image of the valid list could be read")
    mean_ap, aps, counts = mean_average_precision(detections, truths, classes, iou_thresh)
    if sum(counts) == 0:
        raise ValidationError("the valid images have no labelled boxes: mAP cannot be "
                              "computed")
    return DetectorResult(mean_ap, aps, counts, len(truths), list(names or []), len(skipped))


# ---- Darknet's results files ----------------------------------------------------------
# COCO's category ids of the 80 classes in coco.names order (COCO numbers 1..90 with gaps).
COCO_CATEGORY_IDS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22,
                     23, 24, 25, 27, 28, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44,
                     46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64,
                     65, 67, 70, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 84, 85, 86, 87, 88,
                     89, 90)
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
            raise ValidationError(f"{existing[0]}{more}: results of an earlier run; pass "
                                  f"--overwrite to replace them, or choose another "
                                  f"--results-dir")

    def paths(self):
        return [os.path.join(self.directory, f"{COMP4_PREFIX}{name}.txt") for name in self.names
                ] + [os.path.join(self.directory, COCO_RESULTS)]

    def add(self, path, width, height, detections):
        """One image's [(class_id, score, relative box)], as evaluate_detector's on_image."""
        image_id = os.path.splitext(os.path.basename(path))[0]
        number = image_id.rsplit("_", 1)[-1]
        coco_id = int(number) if number.isdigit() else image_id
        for c, score, box in detections:
            left, top, right, bottom = results_corners(box, width, height, origin=1)
            self.comp4[c].append(f"{image_id} {score:f} {left:f} {top:f} {right:f} "
                                 f"{bottom:f}\n")
            left, top, right, bottom = results_corners(box, width, height, origin=0)
            self.coco.append({
                "image_id": coco_id,
                "category_id": COCO_CATEGORY_IDS[c] if self.classes == 80 else c,
                "bbox": [round(v, 6) for v in (left, top, right - left, bottom - top)],
                "score": round(score, 6)})

    def write(self):
        """Write every file; returns their paths."""
        os.makedirs(self.directory, exist_ok=True)
        paths = self.paths()
        for path, lines in zip(paths, self.comp4):
            write_text_atomically(path, "".join(lines))
        write_text_atomically(paths[-1], json.dumps(self.coco, indent=0) + "\n")
        return paths


# ---- the `valid` command ---------------------------------------------------------------
def validate(cfg, data, weights, device="auto", top=None, log=print, results_dir=None,
             overwrite=False, darknet=None):
    """Load CFG with WEIGHTS and score it on the valid list of the .data file DATA. Prints
    per-class results, then the summary line; returns the result. For a detector with
    results_dir, also writes Darknet's results files there (DetectionResultsWriter),
    refusing to replace earlier ones unless overwrite."""
    from .network import load_network

    config = load_data_config(data, require=("valid",))
    paths = config.valid_paths()
    if not paths:
        raise ValidationError(f"{config.valid}: the valid list is empty")
    net = load_network(cfg, weights, batch=1, device=device, darknet=darknet)
    net.names = config.names
    task = network_task(net)
    if task == "classifier":
        k = top if top is not None else (config.top if config.top > 1 else 5)
        result = evaluate_classifier(net, paths, config.labels, config.classes, k=k,
                                     log=None)
        log(f"{result.images} images: top 1: {result.top1:f}, top {result.k}: "
            f"{result.topk:f}")
    else:
        classes = detector_layers(net)[-1].classes
        if classes != config.classes:
            print(f"darknet-py: warning: {data} has classes={config.classes} but the "
                  f"network's detection layer has classes={classes}; using {classes}",
                  file=sys.stderr)
        writer = (DetectionResultsWriter(results_dir, classes, config.names, overwrite)
                  if results_dir is not None else None)
        result = evaluate_detector(net, paths, classes, config.names, log=log,
                                   on_image=writer.add if writer is not None else None)
        for line in result.per_class_lines():
            log(line)
        log(f"{result.images} images")
        if writer is not None:
            written = writer.write()
            log(f"Results: {len(written) - 1} {COMP4_PREFIX}<class>.txt files and "
                f"{COCO_RESULTS} in {results_dir}")
    log(result.summary())
    return result


__all__ = ["ClassifierResult", "DetectionResultsWriter", "DetectorResult", "ValidationError",
           "class_average_precision", "evaluate_classifier", "evaluate_detector", "mean_average_precision",
           "network_task", "top_k_hits", "top_k_indexes", "validate", "voc_ap"]
