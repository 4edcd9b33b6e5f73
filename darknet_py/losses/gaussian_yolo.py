"""[Gaussian_yolo]'s training loss: the AlexeyAB fork's forward_gaussian_yolo_layer after
the activations, on host arrays (the layer copies its output here and the delta back;
[yolo]'s loss runs on the backend). Each coordinate is a Gaussian of mean the prediction
and deviation its σ: the box delta is the gradient of its negative log likelihood (or,
with an IoU loss, the IoU's gradient for the box while σ keeps the likelihood's).

`layer` is the GaussianYoloLayer: its options and its box decoding (gaussian_boxes,
image_boxes, point_shift, truth_cell), which detection shares with the loss.
"""

import math

import numpy as np

from ..boxes import box_giou, box_iou_kind, box_iou_matrix, dx_box_iou, fork_iou
from .yolo import FLT_MAX, ratio

F32 = np.float32
X, UX, Y, UY, W, UW, H, UH, OBJ, CLS = range(10)  # entries of one anchor's block
COORDS = [X, Y, W, H]
SIGMAS = [UX, UY, UW, UH]
SIGMA_CONST = 0.3  # the fork's floor added to σ in the Gaussian's normaliser
EPSILON = 1e-9


def gaussian_box_delta(layer, truth, o, d, anchor, a, j, i, netw, neth, iou_normalizer):
    """delta_gaussian_yolo_box with accumulate=1 for truth at anchor slot a of cell
    (j, i) (`anchor` indexes the biases): add the box's and the σs' deltas to d.
    Returns the IoU of prediction and truth (the GIoU under an IoU loss)."""
    aw, ah = layer.biases[2 * anchor], layer.biases[2 * anchor + 1]
    e = o[a, :, j, i]
    pred = layer.gaussian_boxes(e, F32(i), F32(j), aw, ah, netw, neth)
    t = truth[:4]
    iou = float(fork_iou(pred, t))
    giou = float(box_giou(pred, t))
    pred[2:][pred[2:] == 0] = 1  # the fork's guard against NaN in dx_box_iou
    dx, dy = layer.point_shift(t[2], t[3])
    target = np.array(
        [
            (t[0] - dx) * F32(layer.w) - F32(i),
            (t[1] - dy) * F32(layer.h) - F32(j),
            np.log(np.float64(t[2] * F32(netw) / aw)),
            np.log(np.float64(t[3] * F32(neth) / ah)),
        ],
        dtype=F32,
    )
    scale = float(F32(2) - t[2] * t[3])
    diff = (target - e[COORDS]).astype(F32)
    sigma = e[SIGMAS].astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        z = (diff / e[SIGMAS]).astype(F32)
        z2 = np.square(z.astype(np.float64)).astype(F32)
        density = (
            np.exp(-0.5 * z2.astype(np.float64)) / (math.sqrt(2 * math.pi) * (sigma + SIGMA_CONST))
        ).astype(F32)
        weight = (0.5 / (density + EPSILON) * density * scale).astype(F32)
        coord = (weight * z.astype(np.float64) * (1.0 / sigma)).astype(F32)
        spread = (weight * (z2 / sigma - 1.0 / (sigma + SIGMA_CONST))).astype(F32)
        if layer.iou_loss != "mse":
            iou = giou
            coord = dx_box_iou(pred, t, layer.iou_loss).astype(F32)
            sx, sy = layer.point_shift(coord[2], coord[3])
            coord[0] -= sx
            coord[1] -= sy
            coord[2:] *= np.exp(e[[W, H]].astype(np.float64)).astype(F32)
        coord = coord * F32(iou_normalizer)
        spread = spread * F32(layer.uc_normalizer)
    for values in (coord, spread):
        values[~np.isfinite(values)] = 0
        if layer.max_delta != FLT_MAX:
            np.clip(values, -F32(layer.max_delta), F32(layer.max_delta), out=values)
    d[a, COORDS, j, i] += coord
    d[a, SIGMAS, j, i] += spread
    return iou


def gaussian_class_delta(layer, o, d, a, j, i, class_id):
    """delta_gaussian_yolo_class: label-smoothed targets; class_id's delta times its
    counters_per_class multiplier. When class_id's delta is already set (an earlier
    truth in the same cell and anchor) only it is rewritten. Returns the predicted
    probability of class_id."""
    eps, mult = layer.label_smooth_eps, layer.class_multipliers
    p = o[a, CLS:, j, i]
    target = np.zeros(layer.classes, dtype=np.float64)
    target[class_id] = 1
    if eps:
        target = target * (1 - eps) + 0.5 * eps
    if d[a, CLS + class_id, j, i]:
        d[a, CLS + class_id, j, i] = F32(target[class_id]) - p[class_id]
    else:
        d[a, CLS:, j, i] = target.astype(F32) - p
    if mult is not None:
        d[a, CLS + class_id, j, i] *= mult[class_id]
    return float(p[class_id])


def gaussian_loss(layer, output, truths, netw, neth):
    """The fork's forward_gaussian_yolo_layer training part on host arrays: output
    (batch * outputs) after activation, truths a list (per image) of truth rows.
    Returns (delta, cost, stats) with delta shaped like output; cost is Σ delta²."""
    B, n, h, w = layer.batch, layer.n, layer.h, layer.w
    out = (
        np.asarray(output, dtype=F32)
        .reshape(-1)[: B * layer.outputs]
        .reshape(B, n, layer.entries, h, w)
    )
    delta = np.zeros_like(out)
    anchor_shapes = np.zeros((layer.total, 4), dtype=F32)
    anchor_shapes[:, 2:] = layer.biases.reshape(-1, 2) / np.array([netw, neth], dtype=F32)
    cls_norm = F32(layer.cls_normalizer)
    tot = dict(iou=0.0, cat=0.0, obj=0.0, anyobj=0.0, recall=0, recall75=0, count=0)
    for b in range(B):
        o, d, truth = out[b], delta[b], truths[b]
        obj = o[:, OBJ]
        tot["anyobj"] += float(obj.sum(dtype=np.float64))
        d[:, OBJ] = cls_norm * (F32(0) - obj)
        if len(truth):
            pred = layer.image_boxes(o, netw, neth)
            iou = np.nan_to_num(box_iou_matrix(pred.reshape(-1, 4), truth[:, :4]), nan=0.0).reshape(
                n, h, w, -1
            )
            best_iou = np.max(iou, axis=-1, initial=F32(0))
            best_t = np.argmax(iou, axis=-1)
            # Not punished for objectness near a truth when it names some class.
            named = (o[:, CLS:] > F32(0.25)).any(axis=1)
            d[:, OBJ][named & (best_iou > layer.ignore_thresh)] = 0
            for a, j, i in zip(*np.nonzero(best_iou > layer.truth_thresh)):
                t = truth[best_t[a, j, i]]
                class_id = int(t[4])
                d[a, OBJ, j, i] = cls_norm * (F32(1) - obj[a, j, i])
                gaussian_class_delta(layer, o, d, a, j, i, class_id)
                gaussian_box_delta(
                    layer,
                    t,
                    o,
                    d,
                    layer.mask[a],
                    a,
                    j,
                    i,
                    netw,
                    neth,
                    F32(layer.iou_normalizer) * layer.class_multiplier(class_id),
                )
        for t in truth:
            j, i = layer.truth_cell(t)
            shape = np.array([0, 0, t[2], t[3]], dtype=F32)
            shape_iou = fork_iou(anchor_shapes, shape)
            best_n = int(np.argmax(shape_iou)) if shape_iou.max() > 0 else 0
            assigned = [best_n] if best_n in layer.mask else []
            if layer.iou_thresh < 1:
                kind_iou = box_iou_kind(anchor_shapes, shape, layer.iou_thresh_kind)
                assigned += [
                    k
                    for k in range(layer.total)
                    if k in layer.mask and k != best_n and kind_iou[k] > layer.iou_thresh
                ]
            for anchor in assigned:
                _gaussian_assign(layer, t, o, d, anchor, j, i, netw, neth, tot)
        # Average the accumulated box deltas over the classes each slot was told.
        told = (d[:, CLS:] > 0).sum(axis=1)
        d[:, : CLS - 1] /= np.maximum(told, 1)[:, None].astype(F32)
    box_free = delta.copy()
    box_free[:, :, :OBJ] = 0
    class_loss = float(np.sum(np.square(box_free, dtype=np.float64)))
    no_size = delta.copy()
    no_size[:, :, W:OBJ] = 0  # the fork's "except uncertainty" clears w, σw, h, σh
    except_uc_loss = float(np.sum(np.square(no_size, dtype=np.float64)))
    loss = float(np.sum(np.square(delta, dtype=np.float64)))
    count = tot["count"]
    stats = {
        "avg_iou": ratio(tot["iou"], count),
        "class": ratio(tot["cat"], count),
        "obj": ratio(tot["obj"], count),
        "no_obj": tot["anyobj"] / (w * h * n * B),
        "recall": ratio(tot["recall"], count),
        "recall75": ratio(tot["recall75"], count),
        "count": count,
        "class_loss": class_loss / B,
        "iou_loss": (except_uc_loss - class_loss) / B,
        "uc_loss": (loss - except_uc_loss) / B,
        "total_loss": loss / B,
    }
    return delta.reshape(-1), loss, stats


def _gaussian_assign(layer, t, o, d, anchor, j, i, netw, neth, tot):
    """Make anchor (an index into the biases, one of the mask) of cell (j, i)
    responsible for truth t: box, objectness and class deltas, and the statistics."""
    a = layer.mask.index(anchor)
    class_id = int(t[4])
    mult = layer.class_multiplier(class_id)
    iou = gaussian_box_delta(
        layer, t, o, d, anchor, a, j, i, netw, neth, F32(layer.iou_normalizer) * mult
    )
    tot["obj"] += float(o[a, OBJ, j, i])
    d[a, OBJ, j, i] = mult * F32(layer.cls_normalizer) * (F32(1) - o[a, OBJ, j, i])
    tot["cat"] += gaussian_class_delta(layer, o, d, a, j, i, class_id)
    tot["count"] += 1
    tot["recall"] += iou > 0.5
    tot["recall75"] += iou > 0.75
    tot["iou"] += iou
