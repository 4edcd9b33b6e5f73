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
import sys
import time
from dataclasses import dataclass, field

import numpy as np

from .data.config import load_data_config
from .data.labels import MissingLabelFile, read_image_labels
from .data.loader import DataLoader
from .boxes import box_iou
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
                        on_warning=skipped.append)
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
                      iou_thresh=MAP_IOU, log=None):
    """mAP@iou_thresh of a detector network over image `paths` (labels by Darknet's
    label-path rule; an image without a label file has no objects)."""
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
        for c, score, box in image_detections(net, image, thresh, nms):
            detections.append((index, c, score, box))
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


# ---- the `valid` command ---------------------------------------------------------------
def validate(cfg, data, weights, device="auto", top=None, log=print):
    """Load CFG with WEIGHTS and score it on the valid list of the .data file DATA. Prints
    per-class results, then the summary line; returns the result."""
    from .network import load_network

    config = load_data_config(data, require=("valid",))
    paths = config.valid_paths()
    if not paths:
        raise ValidationError(f"{config.valid}: the valid list is empty")
    net = load_network(cfg, weights, batch=1, device=device)
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
        result = evaluate_detector(net, paths, classes, config.names, log=log)
        for line in result.per_class_lines():
            log(line)
        log(f"{result.images} images")
    log(result.summary())
    return result


__all__ = ["ClassifierResult", "DetectorResult", "ValidationError", "class_average_precision",
           "evaluate_classifier", "evaluate_detector", "mean_average_precision",
           "network_task", "top_k_hits", "top_k_indexes", "validate", "voc_ap"]
