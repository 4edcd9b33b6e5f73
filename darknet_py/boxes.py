"""Box arithmetic below the layers: IoU, correction of letterboxed boxes, NMS and the
`Detection` record (Darknet's src/box.c and the shared part of its detection decoding).

Boxes are Darknet's ``box``: (x, y, w, h), centre-based. Arithmetic is float32 where Darknet
computes in float, so scores and boxes agree with it. The detection heads (layers/yolo.py,
region.py, detection.py) and the application module detection.py both build on this.
"""
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from .image import letterbox_size

F32 = np.float32
TRUTH_FIELDS = 5  # a truth box as the data loader writes it: x, y, w, h, class


def _overlap(x1, w1, x2, w2):
    left = np.maximum(x1 - w1 / 2, x2 - w2 / 2)
    right = np.minimum(x1 + w1 / 2, x2 + w2 / 2)
    return right - left


def box_iou(a, b):
    """Darknet's box_iou for arrays of (x, y, w, h) in the last axis (broadcasting).
    A zero union gives NaN, as in Darknet, and NaN compares False in every test."""
    a = np.asarray(a, dtype=F32)
    b = np.asarray(b, dtype=F32)
    w = _overlap(a[..., 0], a[..., 2], b[..., 0], b[..., 2])
    h = _overlap(a[..., 1], a[..., 3], b[..., 1], b[..., 3])
    inter = np.where((w < 0) | (h < 0), F32(0), w * h)
    union = a[..., 2] * a[..., 3] + b[..., 2] * b[..., 3] - inter
    with np.errstate(divide="ignore", invalid="ignore"):
        return (inter / union).astype(F32)


def box_iou_matrix(a, b):
    """box_iou of every box of a (P, 4) with every box of b (T, 4): (P, T) float32, the
    same arithmetic as box_iou with each box's edges worked out once."""
    a = np.asarray(a, dtype=F32).reshape(-1, 4)
    b = np.asarray(b, dtype=F32).reshape(-1, 4)
    edges = []
    for box in (a, b):
        half_w, half_h = box[:, 2] / 2, box[:, 3] / 2
        edges.append((box[:, 0] - half_w, box[:, 0] + half_w, box[:, 1] - half_h,
                      box[:, 1] + half_h, box[:, 2] * box[:, 3]))
    (al, ar, at, ab, aa), (bl, br, bt, bb, ba) = edges
    w = np.minimum.outer(ar, br) - np.maximum.outer(al, bl)
    h = np.minimum.outer(ab, bb) - np.maximum.outer(at, bt)
    inter = np.where((w < 0) | (h < 0), F32(0), w * h)
    union = np.add.outer(aa, ba) - inter
    with np.errstate(divide="ignore", invalid="ignore"):
        return (inter / union).astype(F32)


def truth_boxes(truth_row):
    """The boxes in one image's truth row: float32 (n, 5) (x, y, w, h, class), ending
    before the first box whose x is 0 (Darknet's `if(!truth.x) break`)."""
    b = np.asarray(truth_row, dtype=F32).reshape(-1, TRUTH_FIELDS)
    zero = np.nonzero(b[:, 0] == 0)[0]
    return b[:zero[0] if zero.size else len(b)]


def box_rmse(a, b):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return np.sqrt(((a - b) ** 2).sum(axis=-1))


# ---- detections ------------------------------------------------------------------------------
@dataclass
class Detection:
    """One candidate box. ``box`` is (x, y, w, h), centre-based, relative to the original
    image (or in its pixels when built with relative=False); ``probs[c]`` is
    objectness * P(class c), or 0 where that is not above the threshold (or NMS removed it).
    ``class_id``/``prob``/``name`` are the best class, set by detect() (-1 when none)."""
    box: tuple
    objectness: float
    probs: np.ndarray
    class_id: int = -1
    prob: float = 0.0
    name: Optional[str] = None
    layer: int = field(default=-1, repr=False)  # index of the layer that produced it


def correct_yolo_boxes(boxes, img_w, img_h, netw, neth, relative=True, letter=True):
    """Darknet's correct_yolo_boxes (correct_region_boxes is the same): map (N, 4) boxes
    relative to the network input back onto the original img_w x img_h image, undoing
    the letterbox (letter=True) or a plain resize (letter=False). Returns float32 (N, 4)."""
    b = np.array(boxes, dtype=F32).reshape(-1, 4)
    if letter:
        new_w, new_h = letterbox_size(img_w, img_h, netw, neth)
    else:
        new_w, new_h = netw, neth
    # Darknet does the shift and the division in double, then stores floats.
    x = ((b[:, 0].astype(np.float64) - (netw - new_w) / 2.0 / netw)
         / np.float64(F32(new_w) / F32(netw)))
    y = ((b[:, 1].astype(np.float64) - (neth - new_h) / 2.0 / neth)
         / np.float64(F32(new_h) / F32(neth)))
    out = np.empty_like(b)
    out[:, 0] = x.astype(F32)
    out[:, 1] = y.astype(F32)
    out[:, 2] = b[:, 2] * (F32(netw) / F32(new_w))
    out[:, 3] = b[:, 3] * (F32(neth) / F32(new_h))
    if not relative:
        out[:, 0::2] *= F32(img_w)
        out[:, 1::2] *= F32(img_h)
    return out


correct_region_boxes = correct_yolo_boxes


def thresholded(p, thresh):
    return np.where(p > F32(thresh), p, F32(0)).astype(F32)


def make_detections(boxes, objectness, probs, layer_index):
    return [Detection(box=tuple(float(v) for v in boxes[k]), objectness=float(objectness[k]),
                      probs=probs[k].copy(), layer=layer_index)
            for k in range(len(objectness))]


# ---- non-maximum suppression (box.c) ------------------------------------------------------------
def _zero_objectness_last(dets):
    """Darknet's first step of do_nms_*: swap detections with objectness 0 to the end.
    Returns how many remain in front."""
    k = len(dets) - 1
    i = 0
    while i <= k:
        if dets[i].objectness == 0:
            dets[i], dets[k] = dets[k], dets[i]
            k -= 1
        else:
            i += 1
    return k + 1


def do_nms_sort(dets, classes, nms):
    """Darknet's do_nms_sort, in place: for each class, sort by that class's probability
    (descending; Python's stable sort where Darknet's qsort leaves ties unordered) and
    zero the class probability of every later box overlapping a kept one by IoU > nms.
    Detections with objectness 0 take no part. Returns dets."""
    total = _zero_objectness_last(dets)
    if total == 0:
        return dets
    front = dets[:total]
    boxes = np.array([d.box for d in front], dtype=F32)
    probs = np.zeros((total, classes), dtype=F32)
    for i, d in enumerate(front):
        m = min(classes, d.probs.size)
        probs[i, :m] = d.probs[:m]
    order = np.arange(total)
    for k in range(classes):
        order = order[np.argsort(-probs[order, k], kind="stable")]
        for pos in range(total):
            a = order[pos]
            if probs[a, k] == 0:  # read now: an earlier box may have suppressed it
                continue
            later = order[pos + 1:]
            probs[later[box_iou(boxes[a], boxes[later]) > nms], k] = 0
    for i, d in enumerate(front):
        m = min(classes, d.probs.size)
        d.probs[:m] = probs[i, :m]
    dets[:total] = [front[i] for i in order]
    return dets


def do_nms_obj(dets, classes, nms):
    """Darknet's do_nms_obj: NMS on objectness alone; a suppressed box loses its
    objectness and every class probability. Returns dets (sorted in front)."""
    total = _zero_objectness_last(dets)
    front = sorted(dets[:total], key=lambda d: -d.objectness)
    boxes = np.array([d.box for d in front], dtype=F32).reshape(-1, 4)
    alive = np.array([d.objectness != 0 for d in front], dtype=bool)
    for a in range(total):
        if not alive[a]:
            continue
        hit = np.nonzero(alive[a + 1:] & (box_iou(boxes[a], boxes[a + 1:]) > nms))[0] + a + 1
        alive[hit] = False
        for b in hit:
            front[b].objectness = 0.0
            front[b].probs[:] = 0
    dets[:total] = front
    return dets


def results_corners(box, img_w, img_h, origin):
    """(left, top, right, bottom) float pixels of a relative box as Darknet's results
    files give them: origin 1 for the VOC comp4 files (print_detector_detections adds 1
    and clips to [1, size]), origin 0 for COCO's JSON (print_cocos clips to [0, size])."""
    x, y, w, h = (float(v) for v in box)
    x, y, w, h = x * img_w, y * img_h, w * img_w, h * img_h
    left = max(origin, x - w / 2 + origin)
    top = max(origin, y - h / 2 + origin)
    right = min(img_w, x + w / 2 + origin)
    bottom = min(img_h, y + h / 2 + origin)
    return left, top, right, bottom
