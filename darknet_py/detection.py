"""Detections and classifications from a network's output, as Darknet's test paths make them.

Follows pjreddie's src/box.c (box_iou, do_nms_sort), src/network.c (get_network_boxes),
src/yolo_layer.c / region_layer.c / detection_layer.c (decoding each layer's output) and
src/image.c (draw_detections). Boxes are Darknet's ``box``: (x, y, w, h), centre-based.
Arithmetic is float32 where Darknet computes in float, so scores and boxes agree with it.
"""
import math
import os
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from .image import (ImageError, from_bgr, letterbox, letterbox_size, load_image, match_channels,
                    resize_image)

DETECTOR_TYPES = ("yolo", "region", "detection")
F32 = np.float32


# ---- box arithmetic (box.c) --------------------------------------------------------------
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


def _thresholded(p, thresh):
    return np.where(p > F32(thresh), p, F32(0)).astype(F32)


def _make_detections(boxes, objectness, probs, layer_index):
    return [Detection(box=tuple(float(v) for v in boxes[k]), objectness=float(objectness[k]),
                      probs=probs[k].copy(), layer=layer_index)
            for k in range(len(objectness))]


def yolo_detections(layer, output, img_w, img_h, netw, neth, thresh, relative=True, letter=True):
    """Darknet's get_yolo_detections for image 0 of a [yolo] layer's (host) output: one
    detection per anchor and cell whose objectness is above thresh, cells in row-major
    order, anchors inner."""
    wh = layer.w * layer.h
    out = np.asarray(output, dtype=F32).reshape(-1)[:layer.outputs]
    out = out.reshape(layer.n, 5 + layer.classes, wh).transpose(2, 0, 1)  # (cell, anchor, entry)
    obj = out[:, :, 4]
    cell, anchor = np.nonzero(obj > F32(thresh))
    col = (cell % layer.w).astype(F32)
    row = (cell // layer.w).astype(F32)
    e = out[cell, anchor]
    biases = layer.biases.reshape(-1, 2)[np.asarray(layer.mask, dtype=np.int64)[anchor]]
    boxes = np.stack([(col + e[:, 0]) / F32(layer.w), (row + e[:, 1]) / F32(layer.h),
                      (np.exp(e[:, 2].astype(np.float64)) * biases[:, 0] / netw).astype(F32),
                      (np.exp(e[:, 3].astype(np.float64)) * biases[:, 1] / neth).astype(F32)],
                     axis=1).reshape(-1, 4)
    objectness = e[:, 4]
    probs = _thresholded(objectness[:, None] * e[:, 5:], thresh)
    boxes = correct_yolo_boxes(boxes, img_w, img_h, netw, neth, relative, letter)
    return _make_detections(boxes, objectness, probs, layer.index)


def region_detections(layer, output, img_w, img_h, netw, neth, thresh, relative=True,
                      letter=True):
    """Darknet's get_region_detections for image 0 of a [region] layer: one detection per
    anchor and cell (anchor-major, as Darknet indexes them), objectness 0 where it is not
    above thresh."""
    wh = layer.w * layer.h
    size = layer.coords + layer.classes + 1
    out = np.asarray(output, dtype=F32).reshape(-1)[:layer.outputs].reshape(layer.n, size, wh)
    cells = np.arange(wh)
    col = np.tile((cells % layer.w).astype(F32), layer.n)
    row = np.tile((cells // layer.w).astype(F32), layer.n)
    e = out.transpose(0, 2, 1).reshape(layer.n * wh, size)  # (anchor*cell, entry)
    biases = np.repeat(layer.biases.reshape(layer.n, 2), wh, axis=0)
    boxes = np.stack([(col + e[:, 0]) / F32(layer.w), (row + e[:, 1]) / F32(layer.h),
                      (np.exp(e[:, 2].astype(np.float64)) * biases[:, 0] / layer.w).astype(F32),
                      (np.exp(e[:, 3].astype(np.float64)) * biases[:, 1] / layer.h).astype(F32)],
                     axis=1)
    scale = e[:, layer.coords]
    objectness = np.where(scale > F32(thresh), scale, F32(0)).astype(F32)
    # Where scale <= thresh every scale * p (p <= 1) is too, so those rows are all 0.
    probs = _thresholded(scale[:, None] * e[:, layer.coords + 1:], thresh)
    boxes = correct_region_boxes(boxes, img_w, img_h, netw, neth, relative, letter)
    return _make_detections(boxes, objectness, probs, layer.index)


def detection_detections(layer, output, img_w, img_h, thresh, relative=True):
    """Darknet's get_detection_detections for image 0 of a YOLOv1 [detection] layer: one
    detection per box predictor and cell. Boxes are relative (Darknet's yolo.c calls it with
    w = h = 1), or in img_w x img_h pixels with relative=False."""
    side, n, classes = layer.side, layer.n, layer.classes
    loc = side * side
    out = np.asarray(output, dtype=F32).reshape(-1)[:layer.outputs]
    cls = out[:loc * classes].reshape(loc, classes)
    scale = out[loc * classes:loc * (classes + n)].reshape(loc * n)
    coords = out[loc * (classes + n):].reshape(loc * n, layer.coords)
    cell = np.repeat(np.arange(loc), n)
    col = (cell % side).astype(F32)
    row = (cell // side).astype(F32)
    power = 2 if layer.sqrt else 1
    sx, sy = (1, 1) if relative else (img_w, img_h)
    boxes = np.stack([(coords[:, 0] + col) / F32(side) * F32(sx),
                      (coords[:, 1] + row) / F32(side) * F32(sy),
                      (np.power(coords[:, 2].astype(np.float64), power) * sx).astype(F32),
                      (np.power(coords[:, 3].astype(np.float64), power) * sy).astype(F32)],
                     axis=1)
    probs = _thresholded(scale[:, None] * cls[cell], thresh)
    return _make_detections(boxes, scale, probs, layer.index)


def detector_layers(net):
    return [l for l in net.layers if l.type in DETECTOR_TYPES]


def get_network_boxes(net, img_w, img_h, thresh=0.5, hier=0.5, relative=True, letter=True):
    """Darknet's get_network_boxes: every [yolo]/[region]/[detection] layer's detections for
    image 0 of the last forward pass, in layer order, boxes on the original img_w x img_h
    image. ``letter`` says whether the input was letterboxed (else plainly resized).
    ``hier`` is Darknet's tree threshold, which matters only for softmax trees (not
    supported), so it is accepted and unused."""
    netw, neth = net.input_shape[2], net.input_shape[1]
    dets = []
    for layer in detector_layers(net):
        output = net.be.to_host(layer.output)[:layer.outputs]
        if layer.type == "yolo":
            dets += yolo_detections(layer, output, img_w, img_h, netw, neth, thresh, relative,
                                    letter)
        elif layer.type == "region":
            dets += region_detections(layer, output, img_w, img_h, netw, neth, thresh, relative,
                                      letter)
        else:
            dets += detection_detections(layer, output, img_w, img_h, thresh, relative)
    return dets


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


# ---- applications -----------------------------------------------------------------------------
def as_image(image, channels=3):
    """A Darknet (C, H, W) float32 image from a path, a Darknet image, or an OpenCV BGR
    uint8 array (H, W[, 3])."""
    if isinstance(image, (str, os.PathLike)):
        return load_image(image, channels)
    a = np.asarray(image)
    if a.dtype == np.uint8:
        return from_bgr(a, channels)
    if a.ndim == 3 and a.shape[0] in (1, 3):
        return match_channels(np.ascontiguousarray(a, dtype=np.float32), channels)
    raise ImageError(f"expected an image path, a Darknet (C, H, W) float image or an OpenCV "
                     f"(H, W, 3) uint8 BGR array; got {a.dtype} array of shape {a.shape}")


def _class_name(names, class_id):
    if names is not None and 0 <= class_id < len(names):
        return names[class_id]
    return None


def detect(net, image, thresh=0.5, hier=0.5, nms=0.45):
    """Detect objects in one image as Darknet's `detector test` does: letterbox to the
    network size (a YOLOv1 [detection] net is plainly resized, as Darknet's yolo.c does),
    run with batch 1, decode, NMS per class. Returns the detections whose best class is
    above thresh, sorted by that probability, highest first; boxes relative to the
    original image."""
    layers = detector_layers(net)
    if not layers:
        raise ValueError(f"{net.path}: the network has no [yolo], [region] or [detection] "
                         f"layer; use classify() for classifiers")
    channels, neth, netw = net.input_shape
    img = as_image(image, channels)
    img_h, img_w = img.shape[1], img.shape[2]
    letter = layers[-1].type != "detection"
    sized = letterbox(img, netw, neth) if letter else resize_image(img, netw, neth)
    net.set_batch(1)
    net.predict(sized[None])
    dets = get_network_boxes(net, img_w, img_h, thresh, hier, relative=True, letter=letter)
    classes = layers[-1].classes
    if nms:
        do_nms_sort(dets, classes, nms)
    found = []
    for d in dets:
        if d.probs.size == 0:
            continue
        best = int(np.argmax(d.probs))
        if d.probs[best] > thresh:
            d.class_id, d.prob = best, float(d.probs[best])
            d.name = _class_name(net.names, best)
            found.append(d)
    found.sort(key=lambda d: -d.prob)
    return found


def output_layer(net):
    """Darknet's get_network_output_layer: the last layer that is not a [cost] layer."""
    for layer in reversed(net.layers):
        if layer.type != "cost":
            return layer
    return net.layers[-1]


def classify(net, image, top=5):
    """Classify one image as Darknet's `classifier predict` does: letterbox to the network
    size, batch 1, and the top-k outputs of the last non-cost layer (ties keep the lower
    index first, as Darknet's top_k). Returns [(class_id, prob, name or None), ...]."""
    channels, neth, netw = net.input_shape
    img = as_image(image, channels)
    sized = letterbox(img, netw, neth)
    net.set_batch(1)
    net.predict(sized[None])
    layer = output_layer(net)
    pred = net.be.to_host(layer.output)[:layer.outputs].astype(np.float32)
    order = np.argsort(-pred, kind="stable")[:max(0, int(top))]
    return [(int(i), float(pred[i]), _class_name(net.names, int(i))) for i in order]


# ---- drawing and export (image.c) ---------------------------------------------------------------
_COLORS = ((1, 0, 1), (0, 0, 1), (0, 1, 1), (0, 1, 0), (1, 1, 0), (1, 0, 0))


def class_color(class_id, classes):
    """Darknet's colour for a class (draw_detections' offset and get_color), as an
    (r, g, b) tuple of floats in [0, 1]."""
    classes = max(1, int(classes))
    offset = class_id * 123457 % classes
    ratio = offset / classes * 5
    i, j = math.floor(ratio), math.ceil(ratio)
    ratio -= i
    return tuple((1 - ratio) * _COLORS[i][c] + ratio * _COLORS[j][c] for c in range(3))


def pixel_box(box, img_w, img_h):
    """(left, top, right, bottom) integer pixels of a relative box, clamped to the image
    as Darknet's draw_detections does. A box wholly outside the image (possible: the
    network may place a centre past the border) collapses to a line on the border rather
    than getting a negative width or height."""
    x, y, w, h = box
    left = min(img_w - 1, max(0, int((x - w / 2) * img_w)))
    right = max(left, min(img_w - 1, int((x + w / 2) * img_w)))
    top = min(img_h - 1, max(0, int((y - h / 2) * img_h)))
    bottom = max(top, min(img_h - 1, int((y + h / 2) * img_h)))
    return left, top, right, bottom


def _label(d, names):
    name = d.name if d.name is not None else _class_name(names, d.class_id)
    return f"{name if name is not None else d.class_id} {100 * d.prob:.0f}%"


def draw_detections(bgr_image, detections, names=None, classes=None):
    """Draw labelled boxes on a copy of an OpenCV BGR uint8 image and return it: Darknet's
    box widths (0.6% of the height) and class colours, the label above the box on a
    filled patch of the box colour, in black or white, whichever reads better on it.
    ``classes`` (for the colours) defaults to len(names), else the highest class id + 1."""
    import cv2
    img = np.ascontiguousarray(np.array(bgr_image, dtype=np.uint8, copy=True))
    if img.ndim == 2:
        img = cv2.cvtColor(img, cv2.COLOR_GRAY2BGR)
    img_h, img_w = img.shape[:2]
    if classes is None:
        classes = len(names) if names else max([d.class_id for d in detections] + [0]) + 1
    width = max(1, int(img_h * .006))
    font = cv2.FONT_HERSHEY_SIMPLEX
    font_scale = max(0.35, img_h * .03 / 22)  # Darknet's label is 3% of the image height
    thickness = max(1, int(round(font_scale * 1.5)))
    for d in detections:
        if d.class_id < 0:
            continue
        r, g, b = class_color(d.class_id, classes)
        color = (int(b * 255), int(g * 255), int(r * 255))
        left, top, right, bottom = pixel_box(d.box, img_w, img_h)
        for k in range(width):  # Darknet's draw_box_width: lines nested inwards
            cv2.rectangle(img, (left + k, top + k), (right - k, bottom - k), color, 1)
        text = _label(d, names)
        (tw, th), base = cv2.getTextSize(text, font, font_scale, thickness)
        label_h = th + base + 2
        y0 = top - label_h if top - label_h >= 0 else top  # above the box when it fits
        x0 = min(left, max(0, img_w - tw - 2))
        cv2.rectangle(img, (x0, y0), (x0 + tw + 2, y0 + label_h), color, cv2.FILLED)
        luminance = 0.299 * r + 0.587 * g + 0.114 * b
        ink = (0, 0, 0) if luminance > 0.5 else (255, 255, 255)
        cv2.putText(img, text, (x0 + 1, y0 + th + 1), font, font_scale, ink, thickness,
                    cv2.LINE_AA)
    return img


def detections_to_json(detections, img_w, img_h, names=None):
    """JSON-ready dicts for detect()'s results on an img_w x img_h image: name, class_id,
    prob, objectness, the box in pixels (left, top, width, height, clamped as Darknet draws
    it) and the relative box (centre x, y, width, height)."""
    rows = []
    for d in detections:
        left, top, right, bottom = pixel_box(d.box, img_w, img_h)
        name = d.name if d.name is not None else _class_name(names, d.class_id)
        rows.append({
            "name": name if name is not None else str(d.class_id),
            "class_id": int(d.class_id),
            "prob": round(float(d.prob), 6),
            "objectness": round(float(d.objectness), 6),
            "box": {"left": left, "top": top, "width": right - left, "height": bottom - top},
            "relative_box": {k: round(float(v), 6) for k, v in zip(("x", "y", "w", "h"), d.box)},
        })
    return rows
