"""Box arithmetic below the layers: IoU, correction of letterboxed boxes, NMS and the
`Detection` record (Darknet's src/box.c and the shared part of its detection decoding).

Boxes are Darknet's ``box``: (x, y, w, h), centre-based. Arithmetic is float32 where Darknet
computes in float, so scores and boxes agree with it. The detection heads (layers/yolo.py,
region.py, detection.py) and the application module predictions.py both build on this.
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
        edges.append(
            (
                box[:, 0] - half_w,
                box[:, 0] + half_w,
                box[:, 1] - half_h,
                box[:, 1] + half_h,
                box[:, 2] * box[:, 3],
            )
        )
    (al, ar, at, ab, aa), (bl, br, bt, bb, ba) = edges
    w = np.minimum.outer(ar, br) - np.maximum.outer(al, bl)
    h = np.minimum.outer(ab, bb) - np.maximum.outer(at, bt)
    inter = np.where((w < 0) | (h < 0), F32(0), w * h)
    union = np.add.outer(aa, ba) - inter
    with np.errstate(divide="ignore", invalid="ignore"):
        return (inter / union).astype(F32)


def truth_table(truth, batch, fields, limit):
    """A truth buffer (batch images of boxes of `fields` floats) as the loss loops read it:
    (rows (batch, T, fields) float32, valid (batch, T) bool), T = at most `limit` boxes;
    a box is valid up to the first whose x is 0 in its image (Darknet's
    `if(!truth.x) break`)."""
    truth = np.asarray(truth, dtype=F32).reshape(batch, -1)
    per_image = truth.shape[1] // fields
    rows = truth[:, : per_image * fields].reshape(batch, per_image, fields)[:, :limit]
    valid = np.cumprod(rows[:, :, 0] != 0, axis=1, dtype=bool)
    return rows, valid


def truth_per_image(truth, batch, fields=TRUTH_FIELDS, limit=None):
    """truth_table's valid boxes image by image: a list of float32 (n, fields) rows of
    (x, y, w, h, class, and the fork's track id with fields=6)."""
    rows, valid = truth_table(truth, batch, fields, limit)
    return [r[v] for r, v in zip(rows, valid)]


def truth_boxes(truth_row, fields=TRUTH_FIELDS):
    """The boxes in one image's truth row (truth_per_image of a single image)."""
    return truth_per_image(truth_row, 1, fields)[0]


def box_rmse(a, b):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return np.sqrt(((a - b) ** 2).sum(axis=-1))


# ---- the AlexeyAB fork's IoU family (its src/box.c) ------------------------------------------
IOU_KINDS = ("iou", "giou", "diou", "ciou")


def fork_iou(a, b):
    """The fork's box_iou: 0 (not NaN) when the union is empty."""
    return np.nan_to_num(box_iou(a, b), nan=0.0).astype(F32)


def _enclosing(a, b):
    """Width and height of the smallest box holding both a and b (the fork's box_c)."""
    half = F32(2)
    left = np.minimum(a[..., 0] - a[..., 2] / half, b[..., 0] - b[..., 2] / half)
    right = np.maximum(a[..., 0] + a[..., 2] / half, b[..., 0] + b[..., 2] / half)
    top = np.minimum(a[..., 1] - a[..., 3] / half, b[..., 1] - b[..., 3] / half)
    bottom = np.maximum(a[..., 1] + a[..., 3] / half, b[..., 1] + b[..., 3] / half)
    return right - left, bottom - top


def _centre_distance2(a, b):
    return (a[..., 0] - b[..., 0]) * (a[..., 0] - b[..., 0]) + (a[..., 1] - b[..., 1]) * (
        a[..., 1] - b[..., 1]
    )


def box_giou(a, b):
    """Generalised IoU: IoU - (C - U)/C with C the enclosing box's area (IoU when C = 0)."""
    a, b = np.asarray(a, dtype=F32), np.asarray(b, dtype=F32)
    iou = fork_iou(a, b)
    cw, ch = _enclosing(a, b)
    c = cw * ch
    w = _overlap(a[..., 0], a[..., 2], b[..., 0], b[..., 2])
    h = _overlap(a[..., 1], a[..., 3], b[..., 1], b[..., 3])
    union = a[..., 2] * a[..., 3] + b[..., 2] * b[..., 3] - np.where((w < 0) | (h < 0), 0, w * h)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(c == 0, iou, iou - (c - union) / c).astype(F32)


def box_diounms(a, b, beta):
    """IoU - (d²/c²)^beta, d the centres' distance, c the enclosing box's diagonal
    (IoU when c = 0). beta = 0.6 is the fork's box_diou."""
    a, b = np.asarray(a, dtype=F32), np.asarray(b, dtype=F32)
    iou = fork_iou(a, b)
    cw, ch = _enclosing(a, b)
    c = cw * cw + ch * ch
    with np.errstate(divide="ignore", invalid="ignore"):
        term = np.power((_centre_distance2(a, b) / c).astype(np.float64), beta)
        return np.where(c == 0, iou, iou - term.astype(F32)).astype(F32)


def box_diou(a, b):
    return box_diounms(a, b, 0.6)


def _aspect_term(pred, truth):
    """CIoU's v = 4/pi² (atan(w_t/h_t) - atan(w_p/h_p))², in double as the fork does."""
    with np.errstate(divide="ignore", invalid="ignore"):
        gap = np.arctan((truth[..., 2] / truth[..., 3]).astype(np.float64)) - np.arctan(
            (pred[..., 2] / pred[..., 3]).astype(np.float64)
        )
    return gap, 4 / (np.pi * np.pi) * gap * gap


def box_ciou(a, b):
    """Complete IoU: IoU - d²/c² - alpha*v, alpha = v/(1 - IoU + v + 1e-6); a is the
    prediction, b the truth (IoU when c = 0)."""
    a, b = np.asarray(a, dtype=F32), np.asarray(b, dtype=F32)
    iou = fork_iou(a, b)
    cw, ch = _enclosing(a, b)
    c = cw * cw + ch * ch
    _, v = _aspect_term(a, b)
    v = v.astype(F32)
    alpha = (v / (1.0 - iou.astype(np.float64) + v + 0.000001)).astype(F32)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(c == 0, iou, iou - (_centre_distance2(a, b) / c + alpha * v)).astype(F32)


def box_iou_kind(a, b, kind):
    return {"iou": fork_iou, "giou": box_giou, "diou": box_diou, "ciou": box_ciou}[kind](a, b)


def dx_box_iou(pred, truth, kind):
    """The fork's dx_box_iou: the (x, y, w, h) gradient that increases the IoU of kind
    ``kind`` (iou, giou, diou or ciou) of pred with truth, as its yolo layer uses it
    (w and h steps are not halved; outside an overlap GIoU/DIoU/CIoU use their extra term
    alone). Arrays of boxes in the last axis; float32 (N..., 4)."""
    p = np.asarray(pred, dtype=F32)
    t = np.asarray(truth, dtype=F32)
    two = F32(2)
    pt0, pb0 = p[..., 1] - p[..., 3] / two, p[..., 1] + p[..., 3] / two
    pl0, pr0 = p[..., 0] - p[..., 2] / two, p[..., 0] + p[..., 2] / two
    pt, pb = np.minimum(pt0, pb0), np.maximum(pt0, pb0)
    pl, pr = np.minimum(pl0, pr0), np.maximum(pl0, pr0)
    tt, tb = t[..., 1] - t[..., 3] / two, t[..., 1] + t[..., 3] / two
    tl, tr = t[..., 0] - t[..., 2] / two, t[..., 0] + t[..., 2] / two
    X = (pb - pt) * (pr - pl)
    Xhat = (tb - tt) * (tr - tl)
    Ih = np.minimum(pb, tb) - np.maximum(pt, tt)
    Iw = np.minimum(pr, tr) - np.maximum(pl, tl)
    I = Iw * Ih
    U = X + Xhat - I
    S = _centre_distance2(p, t)
    gCw = np.maximum(pr, tr) - np.minimum(pl, tl)
    gCh = np.maximum(pb, tb) - np.minimum(pt, tt)
    gC = gCw * gCh
    zero = np.zeros_like(X)
    dX = {"t": -(pr - pl), "b": pr - pl, "l": -(pb - pt), "r": pb - pt}
    dI = {
        "t": np.where(pt > tt, -Iw, zero),
        "b": np.where(pb < tb, Iw, zero),
        "l": np.where(pl > tl, -Ih, zero),
        "r": np.where(pr < tr, Ih, zero),
    }
    dU = {k: dX[k] - dI[k] for k in dX}
    dC = {
        "t": np.where(pt < tt, -gCw, zero),
        "b": np.where(pb > tb, gCw, zero),
        "l": np.where(pl < tl, -gCh, zero),
        "r": np.where(pr > tr, gCh, zero),
    }
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        g = {k: np.where(U > 0, (U * dI[k] - I * dU[k]) / (U * U), zero) for k in dX}
        # Where the prediction's edges are not in order the fork gives both edges the
        # bottom (right) edge's gradient: its two assignments run one after the other.
        g["t"] = np.where(pt0 < pb0, g["t"], g["b"])
        g["l"] = np.where(pl0 < pr0, g["l"], g["r"])
        apart = (Iw <= 0) | (Ih <= 0)
        if kind == "giou":
            c_term = {k: (gC * dU[k] - U * dC[k]) / (gC * gC) for k in dX}
            for k in dX:
                g[k] = np.where(apart, c_term[k], np.where(gC > 0, g[k] + c_term[k], g[k]))
        dx, dy = g["l"] + g["r"], g["t"] + g["b"]
        dw, dh = g["r"] - g["l"], g["b"] - g["t"]
        if kind in ("diou", "ciou"):
            Cw, Ch = _enclosing(p, t)
            C = Cw * Cw + Ch * Ch
            one, half = F32(1), F32(0.5)
            dCw_dx = np.where(pr > tr, one, 0) - np.where(pl < tl, one, 0)
            dCw_dw = np.where(pr > tr, half, 0) - np.where(pl < tl, -half, 0)
            dCh_dy = np.where(pb > tb, one, 0) - np.where(pt < tt, one, 0)
            dCh_dh = np.where(pb > tb, half, 0) - np.where(pt < tt, -half, 0)
            C2 = C * C
            ex = (two * (t[..., 0] - p[..., 0]) * C - (two * Cw * dCw_dx) * S) / C2
            ey = (two * (t[..., 1] - p[..., 1]) * C - (two * Ch * dCh_dy) * S) / C2
            ew = (two * Cw * dCw_dw) * S / C2
            eh = (two * Ch * dCh_dh) * S / C2
            if kind == "ciou":
                gap, v = _aspect_term(p, t)
                alpha = (v / (1 - (I / U).astype(np.float64) + v + 0.000001)).astype(F32)
                ar_dw = (8 / (np.pi * np.pi) * gap * p[..., 3]).astype(F32)
                ar_dh = (-8 / (np.pi * np.pi) * gap * p[..., 2]).astype(F32)
                ew, eh = ew + alpha * ar_dw, eh + alpha * ar_dh
            near = C > 0
            dx = np.where(apart, ex, np.where(near, dx + ex, dx))
            dy = np.where(apart, ey, np.where(near, dy + ey, dy))
            dw = np.where(apart, ew, np.where(near, dw + ew, dw))
            dh = np.where(apart, eh, np.where(near, dh + eh, dh))
    return np.stack([dx, dy, dw, dh], axis=-1).astype(F32)


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
    image_size: Optional[tuple] = field(default=None, repr=False)  # (w, h), set by detect()

    @property
    def score(self):
        """The best class's probability (objectness * P(class))."""
        return self.prob

    @property
    def xyxy(self):
        """(left, top, right, bottom) in pixels of the original image, unclamped floats
        (the box as the network placed it, possibly past the border)."""
        if self.image_size is None:
            raise ValueError("xyxy needs the image size: detections from detect() have it")
        x, y, w, h = (float(v) for v in self.box)
        img_w, img_h = self.image_size
        return ((x - w / 2) * img_w, (y - h / 2) * img_h, (x + w / 2) * img_w, (y + h / 2) * img_h)

    def __repr__(self):
        label = self.name if self.name is not None else f"class {self.class_id}"
        if self.image_size is not None:
            where = "xyxy=(" + ", ".join(f"{v:.0f}" for v in self.xyxy) + ")"
        else:
            where = "box=(" + ", ".join(f"{float(v):.3f}" for v in self.box) + ")"
        return f"Detection({label} {self.prob:.2f} {where})"


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
    x = (b[:, 0].astype(np.float64) - (netw - new_w) / 2.0 / netw) / np.float64(
        F32(new_w) / F32(netw)
    )
    y = (b[:, 1].astype(np.float64) - (neth - new_h) / 2.0 / neth) / np.float64(
        F32(new_h) / F32(neth)
    )
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
    return [
        Detection(
            box=tuple(float(v) for v in boxes[k]),
            objectness=float(objectness[k]),
            probs=probs[k].copy(),
            layer=layer_index,
        )
        for k in range(len(objectness))
    ]


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


NMS_KINDS = ("default", "greedynms", "diounms", "cornersnms")


def nms_overlap(kind, beta=0.6):
    """The overlap measure a kind of NMS compares with its threshold: IoU for Darknet's
    default and the fork's cornersnms, DIoU for greedynms, DIoU with exponent beta
    (beta_nms) for diounms."""
    if kind in ("default", "cornersnms"):
        return box_iou
    if kind == "greedynms":
        return box_diou
    if kind == "diounms":
        return lambda a, b: box_diounms(a, b, beta)
    raise ValueError(f"unknown NMS kind '{kind}' (known: {', '.join(NMS_KINDS)})")


# do_nms_sort compares every pair of boxes once per call, not once per class, where the
# pairs fit in this many bytes (a boolean each): a network early in training scores
# thousands of boxes above a low threshold, and 80 classes of row-by-row overlaps took
# 100 s for one image of yolov4 (175,913 rows). Each overlap is the same float32
# arithmetic as the row's, so the same boxes are kept.
PAIRWISE_MAX_BOXES = 8192
_PAIRWISE_ROWS = 256


def _over_threshold(overlap, boxes, nms):
    """(N, N) booleans: whether overlap(boxes[i], boxes[j]) > nms, a block of rows at a
    time (the overlap's temporaries are a few arrays of the block's size)."""
    n = len(boxes)
    out = np.empty((n, n), dtype=bool)
    for start in range(0, n, _PAIRWISE_ROWS):
        rows = boxes[start : start + _PAIRWISE_ROWS, None, :]
        out[start : start + len(rows)] = overlap(rows, boxes[None, :, :]) > nms
    return out


def do_nms_sort(dets, classes, nms, kind="default", beta=0.6):
    """Darknet's do_nms_sort (kind "default") and the fork's diounms_sort (the other
    NMS_KINDS), in place: for each class, sort by that class's probability (descending,
    stable: ties keep their order, as glibc's qsort, a merge sort, keeps them) and zero
    the class probability of every later box overlapping a kept one by more than nms (see
    nms_overlap). Detections with objectness 0 take no part. Returns dets."""
    overlap = nms_overlap(kind, beta)
    total = _zero_objectness_last(dets)
    if total == 0:
        return dets
    front = dets[:total]
    boxes = np.array([d.box for d in front], dtype=F32)
    probs = np.zeros((total, classes), dtype=F32)
    for i, d in enumerate(front):
        m = min(classes, d.probs.size)
        probs[i, :m] = d.probs[:m]
    over = _over_threshold(overlap, boxes, nms) if total <= PAIRWISE_MAX_BOXES else None
    order = np.arange(total)
    for k in range(classes):
        order = order[np.argsort(-probs[order, k], kind="stable")]
        for pos in np.flatnonzero(probs[order, k]):  # a zero probability never suppresses
            a = order[pos]
            if probs[a, k] == 0:  # read now: an earlier box may have suppressed it
                continue
            later = order[pos + 1 :]
            hit = over[a, later] if over is not None else overlap(boxes[a], boxes[later]) > nms
            probs[later[hit], k] = 0
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
        hit = np.nonzero(alive[a + 1 :] & (box_iou(boxes[a], boxes[a + 1 :]) > nms))[0] + a + 1
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
