"""[region]'s training loss: Darknet's forward_region_layer after the activations, as the
NumPy reference of the backends' `region_loss` op (ops/losses/region_loss.cu does the same
on the GPU, element for element).

Arithmetic is float32 where Darknet computes in float (box maths, deltas) and float64
where it calls exp/log or compares in double, so both backends take the same decisions
(which anchor, which truth passes thresh) and agree to float rounding. The per-cell part
is vectorised over the batch; truths are taken in order, all images at once per truth
index, because a later truth in an image may overwrite an earlier one's deltas.
"""

from dataclasses import dataclass

import numpy as np

from ..boxes import box_iou, truth_table

F32 = np.float32
REGION_TRUTHS = 30  # forward_region_layer reads at most 30 boxes per image
PRIOR_SEEN = 12800  # images seen before which every box is pulled towards its anchor
PRIOR_SCALE = 0.01
# The op's figures (layer.scalars), cost first; the rest are sums over the batch's truths,
# then the objectness summed over every anchor and cell.
REGION_SCALARS = ("cost", "iou", "recall", "class", "obj", "count", "any_obj")


@dataclass(frozen=True)
class RegionHead:
    """What the loss takes from a [region] layer (coords = 4)."""

    batch: int
    n: int
    h: int
    w: int
    classes: int
    softmax: int
    bias_match: int
    rescore: int
    thresh: float
    coord_scale: float
    object_scale: float
    noobject_scale: float
    class_scale: float

    @property
    def entries(self):
        """x, y, w, h, objectness, classes: the planes of one anchor."""
        return 5 + self.classes


@dataclass(frozen=True)
class RegionClasses:
    """How a [region] layer reads truth classes: class_map (map=, a class id for each truth
    class id) and tree (tree=, a tree.TreeArrays), each backend int arrays or None."""

    class_map: object = None
    tree: object = None


def region_loss(head, output, truth, truth_size, anchors, seen, delta, scalars, classes=None):
    """Darknet's [region] loss. output: the layer's activated output (batch, n, entries,
    h, w) flat; truth: box rows of truth_size floats per image, the first with x == 0
    ending an image; anchors: 2n floats; classes: a RegionClasses or None. Writes every
    element of delta and scalars[:len(REGION_SCALARS)]."""
    B, n, h, w, C = head.batch, head.n, head.h, head.w, head.classes
    shape = (B, n, head.entries, h, w)
    out = np.asarray(output, dtype=F32)[: np.prod(shape)].reshape(shape)
    d = delta[: out.size].reshape(shape)
    anchors = np.asarray(anchors, dtype=F32).reshape(n, 2)
    rows, valid = truth_table(truth, B, truth_size, REGION_TRUTHS)
    pred = _pred_boxes(out, anchors, h, w)

    # Every anchor and cell: no-object objectness unless some truth overlaps it by more
    # than thresh; before PRIOR_SEEN images, a pull towards the anchor at the cell centre.
    obj = out[:, :, 4]
    d[...] = 0
    d[:, :, 4] = F32(head.noobject_scale) * (F32(0) - obj)
    if rows.shape[1]:
        iou = box_iou(pred.reshape(B, -1, 1, 4), rows[:, None, :, :4])
        iou[np.isnan(iou) | ~valid[:, None, :]] = 0
        covered = iou.max(axis=2).reshape(B, n, h, w) > F32(head.thresh)
        d[:, :, 4][covered] = 0
    if seen < PRIOR_SEEN:
        # Darknet's prior truth: centre (i + .5)/w in double, stored in a float.
        tx = ((np.arange(w) + 0.5) / w).astype(F32) * F32(w) - np.arange(w, dtype=F32)
        ty = ((np.arange(h) + 0.5) / h).astype(F32) * F32(h) - np.arange(h, dtype=F32)
        shape_w, shape_h = anchors[:, 0] / F32(w), anchors[:, 1] / F32(h)
        tw = _log(shape_w * F32(w) / anchors[:, 0])[:, None, None]
        th = _log(shape_h * F32(h) / anchors[:, 1])[:, None, None]
        for k, t in enumerate((tx, ty[:, None], tw, th)):
            d[:, :, k] = F32(PRIOR_SCALE) * (t - out[:, :, k])

    # Each truth: its cell, the anchor whose shape fits it best, box, objectness and class
    # deltas there. Images are independent, so truth t of every image goes at once.
    sums = np.zeros(len(REGION_SCALARS))
    scale = {k: F32(getattr(head, k)) for k in ("coord_scale", "object_scale", "class_scale")}
    for t in range(rows.shape[1]):
        b = np.nonzero(valid[:, t])[0]
        if not b.size:
            break
        tr = rows[b, t]
        i = np.clip((tr[:, 0] * F32(w)).astype(np.int64), 0, w - 1)
        j = np.clip((tr[:, 1] * F32(h)).astype(np.int64), 0, h - 1)
        shapes = pred[b, :, j, i].copy()  # (truths, n, 4)
        if head.bias_match:
            shapes[:, :, 2] = anchors[:, 0] / F32(w)
            shapes[:, :, 3] = anchors[:, 1] / F32(h)
        shapes[:, :, :2] = 0
        fit = box_iou(
            shapes, np.concatenate([np.zeros_like(tr[:, :2]), tr[:, 2:4]], axis=1)[:, None]
        )
        fit[np.isnan(fit)] = 0
        a = np.argmax(fit, axis=1)
        box_scale = scale["coord_scale"] * (F32(2) - tr[:, 2] * tr[:, 3])
        targets = (
            tr[:, 0] * F32(w) - i.astype(F32),
            tr[:, 1] * F32(h) - j.astype(F32),
            _log(tr[:, 2] * F32(w) / anchors[a, 0]),
            _log(tr[:, 3] * F32(h) / anchors[a, 1]),
        )
        for k, target in enumerate(targets):
            d[b, a, k, j, i] = box_scale * (target - out[b, a, k, j, i])
        iou = box_iou(pred[b, a, j, i], tr[:, :4])
        p = out[b, a, 4, j, i]
        d[b, a, 4, j, i] = scale["object_scale"] * ((iou if head.rescore else F32(1)) - p)
        cls = tr[:, 4].astype(np.int64)
        if classes is not None and classes.class_map is not None:
            cls = np.asarray(classes.class_map)[cls]
        sums[1:6] += (
            iou.sum(dtype=np.float64),
            np.count_nonzero(iou > F32(0.5)),
            0,
            p.sum(dtype=np.float64),
            b.size,
        )
        if classes is not None and classes.tree is not None:
            sums[3] += _tree_class_deltas(
                d, out, classes.tree, b, a, j, i, cls, scale["class_scale"]
            )
            continue
        # delta_region_class: with softmax=0 (Darknet's tag), a class-0 delta an earlier
        # truth left here means only this class's delta is set, and not counted.
        tagged = (d[b, a, 5, j, i] != 0) & (not head.softmax)
        u, g = ~tagged, tagged
        onehot = (np.arange(C) == cls[u, None]).astype(F32)
        d[b[u], a[u], 5:, j[u], i[u]] = scale["class_scale"] * (
            onehot - out[b[u], a[u], 5:, j[u], i[u]]
        )
        d[b[g], a[g], 5 + cls[g], j[g], i[g]] = scale["class_scale"] * (
            F32(1) - out[b[g], a[g], 5 + cls[g], j[g], i[g]]
        )
        sums[3] += out[b[u], a[u], 5 + cls[u], j[u], i[u]].sum(dtype=np.float64)
    sums[0] = np.sum(np.square(d, dtype=np.float64))
    sums[6] = obj.sum(dtype=np.float64)
    scalars[: len(sums)] = sums


def _tree_class_deltas(d, out, tree, b, a, j, i, cls, class_scale):
    """delta_region_class's hierarchy branch for each truth (image b, anchor a, cell j, i,
    class cls): from the class up to its root, every class of its sibling group pushed
    towards 0 and the class itself towards 1. Returns the sum over truths of the product of
    the outputs along each path (Darknet's avg_cat)."""
    parent, group = np.asarray(tree.parent), np.asarray(tree.group)
    offset, size = np.asarray(tree.offset), np.asarray(tree.size)
    total = 0.0
    for bb, aa, jj, ii, c in zip(b, a, j, i, cls):
        o, dc = out[bb, aa, 5:, jj, ii], d[bb, aa, 5:, jj, ii]
        pred = F32(1)
        while c >= 0:
            pred = F32(pred * o[c])
            first = offset[group[c]]
            dc[first : first + size[group[c]]] = class_scale * (
                F32(0) - o[first : first + size[group[c]]]
            )
            dc[c] = class_scale * (F32(1) - o[c])
            c = parent[c]
        total += float(pred)
    return total


def _log(x):
    """Darknet's logf of a float, as float32: log in double, rounded once."""
    return np.log(np.asarray(x, dtype=np.float64)).astype(F32)


def _pred_boxes(out, anchors, h, w):
    """get_region_box for every image, anchor and cell: (B, n, h, w, 4) float32."""
    i = np.arange(w, dtype=F32)
    j = np.arange(h, dtype=F32)[:, None]
    bw = np.exp(out[:, :, 2].astype(np.float64)) * anchors[:, 0, None, None] / w
    bh = np.exp(out[:, :, 3].astype(np.float64)) * anchors[:, 1, None, None] / h
    return np.stack(
        [(i + out[:, :, 0]) / F32(w), (j + out[:, :, 1]) / F32(h), bw.astype(F32), bh.astype(F32)],
        axis=-1,
    )
