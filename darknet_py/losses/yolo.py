"""The [yolo] head's training loss below the layers: the NumPy reference of the backend op
`yolo_loss` (ops/losses/yolo_loss.cu is the CUDA one), on host arrays.

Two flavours, chosen by `YoloLossSpec.fork`: the original Darknet's forward_yolo_layer
(`original_loss`) and the AlexeyAB fork's (`fork_loss`: iou_loss, normalizers, label
smoothing, iou_thresh, ...). Both give the delta shaped like the head's output and a
float64 vector of sums named by SCALARS (the cost first); `loss_stats` turns that vector
into the statistics of Darknet's report line, so both backends report alike.
"""

from dataclasses import dataclass
from typing import Optional

import numpy as np

from ..boxes import (
    IOU_KINDS,
    box_giou,
    box_iou,
    box_iou_kind,
    box_iou_matrix,
    dx_box_iou,
    fork_iou,
    truth_per_image,
    truth_table,
)

F32 = np.float32
FLT_MAX = float(np.finfo(np.float32).max)
IOU_LOSSES = ("mse",) + IOU_KINDS
# What the loss leaves in the layer's scalars, in this order: the cost, then sums over the
# batch of the truths' IoU, class probability and objectness, every prediction's
# objectness, the truths above .5 and .75 IoU, the truths assigned, Σ delta², Σ delta² of
# all but the box entries, and the IoU and GIoU losses Σ (1 - IoU), Σ (1 - GIoU).
SCALARS = (
    "cost",
    "iou",
    "cat",
    "obj",
    "anyobj",
    "recall",
    "recall75",
    "count",
    "loss",
    "box_free_loss",
    "iou_loss",
    "giou_loss",
)


@dataclass(frozen=True)
class YoloLossSpec:
    """What the loss of one [yolo] head needs to know: its shape, anchors, the network's
    input size and truth layout, and its options (the fork's with their defaults)."""

    batch: int
    n: int  # masked anchors
    classes: int
    h: int
    w: int
    total: int  # anchors listed (num)
    mask: tuple
    biases: np.ndarray  # float32 (2 * total,): anchor widths and heights in pixels
    netw: int
    neth: int
    truth_fields: int  # floats per truth box: 5, or the fork's 6
    max_boxes: int
    fork: bool
    ignore_thresh: float
    truth_thresh: float
    new_coords: int = 0
    iou_loss: str = "mse"
    iou_normalizer: float = 0.75
    obj_normalizer: float = 1.0
    cls_normalizer: float = 1.0
    max_delta: float = FLT_MAX
    iou_thresh: float = 1.0
    iou_thresh_kind: str = "iou"
    label_smooth_eps: float = 0.0
    objectness_smooth: int = 0
    class_multipliers: Optional[np.ndarray] = None  # float32 (classes,), counters_per_class

    def class_multiplier(self, class_id):
        return F32(1) if self.class_multipliers is None else self.class_multipliers[class_id]

    def smoothed(self, y):
        """The fork's class target for y (1 or 0) under label_smooth_eps."""
        eps = self.label_smooth_eps
        return F32(y * (1 - eps) + 0.5 * eps) if eps else F32(y)


def decode(tx, ty, tw, th, col, row, anchor_w, anchor_h, w, h, netw, neth, new_coords):
    """get_yolo_box on arrays (broadcasting): boxes (..., 4) float32 relative to the
    network input, for a w x h grid. Sizes are exp(t)*anchor, or with new_coords
    (2t)²*anchor."""
    x = (col + tx) / F32(w)
    y = (row + ty) / F32(h)
    if new_coords:
        bw = tw * tw * F32(4) * anchor_w / F32(netw)
        bh = th * th * F32(4) * anchor_h / F32(neth)
    else:
        # An untrained net's huge t overflows to an infinite box, as expf does in C;
        # get_network_boxes drops such boxes, so NumPy's warning would only be noise.
        with np.errstate(over="ignore"):
            bw = (np.exp(np.asarray(tw, dtype=np.float64)) * anchor_w / netw).astype(F32)
            bh = (np.exp(np.asarray(th, dtype=np.float64)) * anchor_h / neth).astype(F32)
    return np.stack(np.broadcast_arrays(x, y, bw, bh), axis=-1).astype(F32)


def image_truths(spec, truth):
    """Per image, the truth boxes Darknet's loss loops see in a truth buffer of `batch`
    rows: (n, truth_fields) float32, at most max_boxes, ending before the first x == 0."""
    return truth_per_image(truth, spec.batch, spec.truth_fields, spec.max_boxes)


def every_truth(spec, truth):
    """image_truths of all images as one (n, truth_fields) array."""
    rows, valid = truth_table(truth, spec.batch, spec.truth_fields, spec.max_boxes)
    return rows[valid]


def yolo_loss(spec, output, truths):
    """The loss of spec's flavour: (delta, sums), see original_loss and fork_loss."""
    return (fork_loss if spec.fork else original_loss)(spec, output, truths)


def loss_stats(spec, sums):
    """The statistics of Darknet's report line from a SCALARS vector (host values)."""
    s = dict(zip(SCALARS, (float(v) for v in sums)))
    count = int(round(s["count"]))
    stats = {
        "avg_iou": ratio(s["iou"], count),
        "class": ratio(s["cat"], count),
        "obj": ratio(s["obj"], count),
        "no_obj": s["anyobj"] / (spec.w * spec.h * spec.n * spec.batch),
        "recall": ratio(s["recall"], count),
        "recall75": ratio(s["recall75"], count),
        "count": count,
    }
    if spec.fork:
        class_loss = float(F32(spec.obj_normalizer)) * s["box_free_loss"]
        stats.update(
            avg_iou=s["iou"] / max(count, 1),
            class_loss=class_loss / spec.batch,
            iou_loss=(s["loss"] - class_loss) / spec.batch,
            total_loss=s["loss"] / spec.batch,
        )
    return stats


def ratio(num, den):
    return num / den if den else float("nan")


# ---- what both flavours share -----------------------------------------------------------------
def _arrays(spec, output):
    """The output as (batch, n, 5 + classes, h, w), a zero delta shaped like it, and every
    anchor as a box at the origin (total, 4) for matching truths by shape alone."""
    out = np.asarray(output, dtype=F32).reshape(-1)[
        : spec.batch * spec.n * (5 + spec.classes) * spec.h * spec.w
    ]
    out = out.reshape(spec.batch, spec.n, 5 + spec.classes, spec.h, spec.w)
    anchors = spec.biases.reshape(-1, 2)
    anchor_shapes = np.zeros((spec.total, 4), dtype=F32)
    anchor_shapes[:, 2] = anchors[:, 0] / F32(spec.netw)
    anchor_shapes[:, 3] = anchors[:, 1] / F32(spec.neth)
    return out, np.zeros_like(out), anchor_shapes


def pred_boxes(spec, out):
    """get_yolo_box for every anchor and cell of one image: (n, h, w, 4) float32."""
    j, i = np.meshgrid(np.arange(spec.h, dtype=F32), np.arange(spec.w, dtype=F32), indexing="ij")
    anchors = spec.biases.reshape(-1, 2)[list(spec.mask)]
    return decode(
        out[:, 0],
        out[:, 1],
        out[:, 2],
        out[:, 3],
        i,
        j,
        anchors[:, 0, None, None],
        anchors[:, 1, None, None],
        spec.w,
        spec.h,
        spec.netw,
        spec.neth,
        spec.new_coords,
    )


def _best_truths(pred, truth, n, h, w):
    """Per prediction the best IoU with a truth (0 when none overlaps; a NaN IoU never
    passes Darknet's `iou > best_iou`) and that truth's index, the first of equals."""
    iou = np.nan_to_num(box_iou_matrix(pred.reshape(-1, 4), truth[:, :4]), nan=0.0).reshape(
        n, h, w, -1
    )
    return np.max(iou, axis=-1, initial=F32(0)), np.argmax(iou, axis=-1)


def _truth_cell(spec, t):
    """The cell (j, i) holding truth t's centre: Darknet truncates; x = 1 would overrun."""
    return min(int(t[1] * F32(spec.h)), spec.h - 1), min(int(t[0] * F32(spec.w)), spec.w - 1)


def _sums(spec, delta, cost, tot):
    box_free = delta.copy()
    box_free[:, :, :4] = 0
    return np.array(
        [cost]
        + [tot[k] for k in SCALARS[1:8]]
        + [
            float(np.sum(np.square(delta, dtype=np.float64))),
            float(np.sum(np.square(box_free, dtype=np.float64))),
            tot["iou_loss"],
            tot["giou_loss"],
        ],
        dtype=np.float64,
    )


def _totals():
    return {k: 0.0 for k in SCALARS[1:]}


# ---- the original Darknet's loss ------------------------------------------------------------
def box_delta(spec, truth, out, delta, anchor, a, j, i, pred):
    """delta_yolo_box: Darknet's box delta for truth at anchor slot a of cell (j, i),
    scaled by 2 - w*h; `anchor` indexes the biases. Returns the IoU of pred and truth."""
    scale = F32(2) - truth[2] * truth[3]
    tx = truth[0] * F32(spec.w) - F32(i)
    ty = truth[1] * F32(spec.h) - F32(j)
    tw = F32(np.log(np.float64(truth[2] * F32(spec.netw) / spec.biases[2 * anchor])))
    th = F32(np.log(np.float64(truth[3] * F32(spec.neth) / spec.biases[2 * anchor + 1])))
    for k, t in enumerate((tx, ty, tw, th)):
        delta[a, k, j, i] = scale * (t - out[a, k, j, i])
    return float(box_iou(pred, truth[:4]))


def class_delta(out, delta, a, j, i, class_id, classes):
    """delta_yolo_class, quirk included: when class 0's delta is already set (by an
    earlier truth in the same cell and anchor), only class_id's delta is set.
    Returns the predicted probability of class_id (what Darknet adds to avg_cat)."""
    c0 = 5
    if delta[a, c0, j, i]:
        delta[a, c0 + class_id, j, i] = F32(1) - out[a, c0 + class_id, j, i]
    else:
        onehot = np.zeros(classes, dtype=F32)
        onehot[class_id] = 1
        delta[a, c0 : c0 + classes, j, i] = onehot - out[a, c0 : c0 + classes, j, i]
    return float(out[a, c0 + class_id, j, i])


def original_loss(spec, output, truths):
    """Darknet's forward_yolo_layer training part: output (batch * outputs) after
    activation, truths a list (per image) of (n, 5+) boxes with valid class ids. Returns
    (delta, sums) with delta flat like output and sums a SCALARS vector; the cost is Σ delta²."""
    n, C, h, w = spec.n, spec.classes, spec.h, spec.w
    out, delta, anchor_shapes = _arrays(spec, output)
    mask = list(spec.mask)
    tot = _totals()
    for o, d, truth in zip(out, delta, truths):
        pred = pred_boxes(spec, o)  # (n, h, w, 4)
        obj = o[:, 4]
        tot["anyobj"] += float(obj.sum(dtype=np.float64))
        d[:, 4] = F32(0) - obj
        if len(truth):
            best_iou, best_t = _best_truths(pred, truth, n, h, w)
            d[:, 4][best_iou > spec.ignore_thresh] = 0
            for a, j, i in zip(*np.nonzero(best_iou > spec.truth_thresh)):
                t = truth[best_t[a, j, i]]
                d[a, 4, j, i] = F32(1) - obj[a, j, i]
                class_delta(o, d, a, j, i, int(t[4]), C)
                box_delta(spec, t, o, d, mask[a], a, j, i, pred[a, j, i])
        for t in truth:
            j, i = _truth_cell(spec, t)
            shape_iou = box_iou(anchor_shapes, np.array([0, 0, t[2], t[3]], dtype=F32))
            shape_iou[np.isnan(shape_iou)] = 0
            best_n = int(np.argmax(shape_iou))
            if best_n not in mask:
                continue
            a = mask.index(best_n)
            iou = box_delta(spec, t, o, d, best_n, a, j, i, pred[a, j, i])
            tot["obj"] += float(o[a, 4, j, i])
            d[a, 4, j, i] = F32(1) - o[a, 4, j, i]
            tot["cat"] += class_delta(o, d, a, j, i, int(t[4]), C)
            tot["count"] += 1
            tot["recall"] += iou > 0.5
            tot["recall75"] += iou > 0.75
            tot["iou"] += iou
    cost = float(np.sum(np.square(delta), dtype=np.float64))
    return delta.reshape(-1), _sums(spec, delta, cost, tot)


# ---- the fork's loss (its forward_yolo_layer and process_batch) -----------------------------
def fork_box_delta(spec, truth, out, delta, anchor, a, j, i, iou_normalizer):
    """The fork's delta_yolo_box with accumulate=1: add the box delta of truth at anchor
    slot a of cell (j, i) (`anchor` indexes the biases): mse's scaled coordinate
    differences, or the gradient of the iou_loss. Returns (iou, giou) of the prediction
    with the truth."""
    aw, ah = spec.biases[2 * anchor], spec.biases[2 * anchor + 1]
    pred = decode(
        *out[a, :4, j, i],
        F32(i),
        F32(j),
        aw,
        ah,
        spec.w,
        spec.h,
        spec.netw,
        spec.neth,
        spec.new_coords,
    )
    t = truth[:4]
    iou, giou = float(fork_iou(pred, t)), float(box_giou(pred, t))
    if spec.iou_loss == "mse":
        scale = F32(2) - truth[2] * truth[3]
        target = [truth[0] * F32(spec.w) - F32(i), truth[1] * F32(spec.h) - F32(j)]
        if spec.new_coords:
            target += [
                F32(np.sqrt(np.float64(truth[2] * F32(spec.netw) / (F32(4) * aw)))),
                F32(np.sqrt(np.float64(truth[3] * F32(spec.neth) / (F32(4) * ah)))),
            ]
        else:
            target += [
                F32(np.log(np.float64(truth[2] * F32(spec.netw) / aw))),
                F32(np.log(np.float64(truth[3] * F32(spec.neth) / ah))),
            ]
        for k in range(4):
            delta[a, k, j, i] += scale * (target[k] - out[a, k, j, i]) * F32(iou_normalizer)
        return iou, giou
    pred = pred.copy()
    pred[2:][pred[2:] == 0] = 1  # the fork's guard against NaN in dx_box_iou
    d = dx_box_iou(pred, t, spec.iou_loss)
    if not spec.new_coords:
        d[2:] *= np.exp(out[a, 2:4, j, i].astype(np.float64)).astype(F32)
    d *= F32(iou_normalizer)
    d[~np.isfinite(d)] = 0
    if spec.max_delta != FLT_MAX:
        d = np.clip(d, -F32(spec.max_delta), F32(spec.max_delta))
    delta[a, :4, j, i] += d
    return iou, giou


def fork_class_delta(spec, out, delta, a, j, i, class_id):
    """The fork's delta_yolo_class (focal loss aside): targets smoothed by
    label_smooth_eps, the class's delta times its counters_per_class multiplier (and
    cls_normalizer when a fresh one-hot is written). When class_id's delta is already
    set (an earlier truth in the same cell and anchor) only it is rewritten.
    Returns the predicted probability of class_id."""
    c0, mult = 5, spec.class_multipliers
    p = out[a, c0 : c0 + spec.classes, j, i]
    d = delta[a, c0 : c0 + spec.classes, j, i]
    if d[class_id]:
        r = spec.smoothed(1) - p[class_id]
        if np.isfinite(r):
            d[class_id] = r
        if mult is not None:
            d[class_id] *= mult[class_id]
    else:
        for c in range(spec.classes):
            r = spec.smoothed(1 if c == class_id else 0) - p[c]
            if np.isfinite(r):
                d[c] = r
        if mult is not None:
            d[class_id] *= mult[class_id] * F32(spec.cls_normalizer)
    return float(p[class_id])


def fork_loss(spec, output, truths):
    """The fork's forward_yolo_layer training part (see original_loss for the arguments).
    Its cost: with an IoU loss iou_normalizer * mean(1 - IoU) (GIoU for giou) +
    obj_normalizer * Σ delta² over every entry but the box's, else Σ delta²."""
    n, h, w = spec.n, spec.h, spec.w
    out, delta, anchor_shapes = _arrays(spec, output)
    obj_norm = F32(spec.obj_normalizer)
    mask = list(spec.mask)
    tot = _totals()
    for o, d, truth in zip(out, delta, truths):
        pred = pred_boxes(spec, o)
        obj = o[:, 4]
        tot["anyobj"] += float(obj.sum(dtype=np.float64))
        d[:, 4] = obj_norm * (F32(0) - obj)
        if len(truth):
            best_iou, best_t = _best_truths(pred, truth, n, h, w)
            # A prediction near a truth is not punished for its objectness when it
            # also names some class with probability above .25.
            named = (o[:, 5:] > F32(0.25)).any(axis=1)
            best_match = np.where(named, best_iou, F32(0))
            near = best_match > spec.ignore_thresh
            if spec.objectness_smooth:
                d[:, 4] = np.where(
                    near, np.maximum(d[:, 4], obj_norm * (best_match - obj)), d[:, 4]
                )
            else:
                d[:, 4][near] = 0
            for a, j, i in zip(*np.nonzero(best_iou > spec.truth_thresh)):
                t = truth[best_t[a, j, i]]
                class_id = int(t[4])
                if spec.objectness_smooth:
                    d[a, 4, j, i] = obj_norm * (best_iou[a, j, i] ** 2 - obj[a, j, i])
                else:
                    d[a, 4, j, i] = obj_norm * (F32(1) - obj[a, j, i])
                fork_class_delta(spec, o, d, a, j, i, class_id)
                mult = spec.class_multiplier(class_id)
                if spec.objectness_smooth:
                    d[a, 5 + class_id, j, i] = mult * (
                        best_iou[a, j, i] ** 2 - o[a, 5 + class_id, j, i]
                    )
                fork_box_delta(spec, t, o, d, mask[a], a, j, i, F32(spec.iou_normalizer) * mult)
        for t in truth:
            j, i = _truth_cell(spec, t)
            shape = np.array([0, 0, t[2], t[3]], dtype=F32)
            shape_iou = fork_iou(anchor_shapes, shape)
            best_n = int(np.argmax(shape_iou)) if shape_iou.max() > 0 else 0
            assigned = [best_n] if best_n in mask else []
            if spec.iou_thresh < 1:
                kind_iou = box_iou_kind(anchor_shapes, shape, spec.iou_thresh_kind)
                assigned += [
                    k
                    for k in range(spec.total)
                    if k in mask and k != best_n and kind_iou[k] > spec.iou_thresh
                ]
            for anchor in assigned:
                _fork_assign(spec, t, o, d, anchor, j, i, tot)
        if spec.iou_thresh < 1:
            # Average the accumulated box deltas over the classes the slot was told.
            told = (d[:, 5:] > 0).sum(axis=1)
            spread = (d[:, 4] != 0) & (told > 0)
            d[:, :4] = np.where(spread[:, None], d[:, :4] / np.maximum(told, 1)[:, None], d[:, :4])
    count = max(tot["count"], 1)
    if spec.iou_loss == "mse":
        cost = float(np.sum(np.square(delta, dtype=np.float64)))
    else:
        box_free = delta.copy()
        box_free[:, :, :4] = 0
        class_loss = float(obj_norm) * float(np.sum(np.square(box_free, dtype=np.float64)))
        lost = tot["giou_loss"] if spec.iou_loss == "giou" else tot["iou_loss"]
        cost = spec.iou_normalizer * lost / count + class_loss
    return delta.reshape(-1), _sums(spec, delta, cost, tot)


def _fork_assign(spec, t, o, d, anchor, j, i, tot):
    """Make anchor (an index into the biases, one of the mask) of cell (j, i)
    responsible for truth t: box, objectness and class deltas, and the statistics."""
    a = list(spec.mask).index(anchor)
    class_id = int(t[4])
    mult = spec.class_multiplier(class_id)
    iou, giou = fork_box_delta(spec, t, o, d, anchor, a, j, i, F32(spec.iou_normalizer) * mult)
    tot["iou"] += iou
    tot["iou_loss"] += 1 - iou
    tot["giou_loss"] += 1 - giou
    obj = o[a, 4, j, i]
    tot["obj"] += float(obj)
    fresh = mult * F32(spec.obj_normalizer) * (F32(1) - obj)
    if not spec.objectness_smooth or d[a, 4, j, i] == 0:
        d[a, 4, j, i] = fresh
    tot["cat"] += fork_class_delta(spec, o, d, a, j, i, class_id)
    tot["count"] += 1
    tot["recall"] += iou > 0.5
    tot["recall75"] += iou > 0.75
