"""[detection]'s training loss: Darknet's forward_detection_layer (YOLOv1) as the NumPy
reference of the backends' `detection_grid_truth` and `detection_loss` ops
(ops/losses/region_loss.cu does the same on the GPU, element for element).

The truth is Darknet's grid form: per image and cell, is_object, one-hot classes and
x, y, w, h (x, y relative to the cell); detection_grid_truth builds it from the data
loader's box rows as fill_truth_region does.
"""

from dataclasses import dataclass

import numpy as np

from ..boxes import TRUTH_FIELDS, box_iou, box_rmse, truth_table

F32 = np.float32
RANDOM_SEEN = 64000  # with random=1, images seen before which the responsible box is random
MIN_REGION_BOX = 0.005  # fill_truth_region drops boxes narrower or shorter than this
NO_RMSE = 20.0  # the RMSE a box must beat when no box overlaps the truth
# The op's figures (layer.scalars), cost first; the rest are sums over the batch's objects,
# then the objectness summed over every box predictor and cell.
DETECTION_SCALARS = ("cost", "iou", "pos_cat", "all_cat", "pos_obj", "count", "any_obj")


@dataclass(frozen=True)
class DetectionHead:
    """What the loss takes from a [detection] layer (coords = 4)."""

    batch: int
    side: int
    n: int
    classes: int
    sqrt: int
    rescore: int
    forced: int
    coord_scale: float
    object_scale: float
    noobject_scale: float
    class_scale: float

    @property
    def cell_truth(self):
        """Floats of one cell's grid truth: is_object, classes, x, y, w, h."""
        return 5 + self.classes

    @property
    def outputs(self):
        return self.side * self.side * (5 * self.n + self.classes)


def detection_grid_truth(truth, batch, truth_size, max_boxes, side, classes, grid):
    """fill_truth_region for every image: grid (batch, side*side, 5 + classes) flat from box
    rows of truth_size floats (at most max_boxes an image, ending at the first x == 0).
    The first box whose centre falls in a cell claims it; boxes under MIN_REGION_BOX wide
    or high are dropped; a class id outside 0..classes-1 sets no class."""
    rows, valid = truth_table(truth, batch, truth_size, max_boxes)
    loc, per_cell = side * side, 5 + classes
    g = grid[: batch * loc * per_cell].reshape(batch * loc, per_cell)
    g[...] = 0
    # Darknet compares the float sizes with the double .005.
    keep = (
        valid
        & (rows[:, :, 2].astype(np.float64) >= MIN_REGION_BOX)
        & (rows[:, :, 3].astype(np.float64) >= MIN_REGION_BOX)
    )
    b, k = np.nonzero(keep)  # image-major, box order within an image
    x, y, w, h, cls = (rows[b, k, f] for f in range(TRUTH_FIELDS))
    col = np.clip((x * F32(side)).astype(np.int64), 0, side - 1)
    row = np.clip((y * F32(side)).astype(np.int64), 0, side - 1)
    cells, first = np.unique(b * loc + col + row * side, return_index=True)
    x, y, w, h, cls, col, row = (v[first] for v in (x, y, w, h, cls, col, row))
    g[cells, 0] = 1
    cls = cls.astype(np.int64)
    known = (cls >= 0) & (cls < classes)
    g[cells[known], 1 + cls[known]] = 1
    g[cells, 1 + classes :] = np.stack(
        [x * F32(side) - col.astype(F32), y * F32(side) - row.astype(F32), w, h], axis=1
    )


def random_choices(draws, n):
    """The responsible box random=1 picks from uniform draws in [0, 1): int(draw * n)."""
    return np.minimum((np.asarray(draws, dtype=F32) * F32(n)).astype(np.int64), n - 1)


def detection_loss(head, output, grid, draws, delta, scalars):
    """Darknet's [detection] loss. output: the layer's output (batch, outputs) flat; grid:
    (batch, side*side, 5 + classes) flat; draws: None, or (random=1 early in training) one
    uniform draw per image and cell choosing its responsible box. Writes every element
    of delta and scalars[:len(DETECTION_SCALARS)]."""
    B, n, C, side = head.batch, head.n, head.classes, head.side
    loc = side * side
    out = np.asarray(output, dtype=F32)[: B * head.outputs].reshape(B, -1)
    truth = np.asarray(grid, dtype=F32)[: B * loc * head.cell_truth].reshape(B, loc, -1)
    d = delta[: out.size].reshape(B, -1)
    choices = None if draws is None else random_choices(draws, n).reshape(B, loc)
    p_base, box_base = loc * C, loc * (C + n)
    d[...] = 0
    d[:, p_base:box_base] = F32(head.noobject_scale) * (F32(0) - out[:, p_base:box_base])
    sums = np.zeros(len(DETECTION_SCALARS))
    for b in range(B):
        o, db = out[b], d[b]
        for cell in np.nonzero(truth[b, :, 0].astype(np.int64))[0]:
            t = truth[b, cell]
            cls = o[cell * C : (cell + 1) * C]
            db[cell * C : (cell + 1) * C] = F32(head.class_scale) * (t[1 : 1 + C] - cls)
            tbox = t[1 + C : 5 + C].copy()
            tbox[:2] /= F32(side)
            boxes = _boxes(o[box_base + cell * n * 4 :][: n * 4].reshape(n, 4), head)
            ious, rmses = box_iou(boxes, tbox), box_rmse(boxes, tbox)
            best, best_iou, best_rmse = -1, F32(0), NO_RMSE
            for k in range(n):  # IoU decides once any is positive, else the RMSE
                if best_iou > 0 or ious[k] > 0:
                    if ious[k] > best_iou:
                        best, best_iou = k, ious[k]
                elif rmses[k] < best_rmse:
                    best, best_rmse = k, rmses[k]
            if head.forced:
                best = 1 if float(tbox[2] * tbox[3]) < 0.1 else 0  # C compares in double
            if choices is not None:
                best = int(choices[b, cell])
            # best stays -1 when every IoU is 0 and every RMSE >= NO_RMSE; Darknet then uses
            # the slots just before this cell's, which are still inside the image.
            box_index = box_base + (cell * n + best) * 4
            iou = float(box_iou(_boxes(o[box_index : box_index + 4], head), tbox)[0])
            p_index = p_base + cell * n + best
            db[p_index] = F32(head.object_scale) * (
                (F32(iou) if head.rescore else F32(1)) - o[p_index]
            )
            targets = t[1 + C : 5 + C].copy()
            if head.sqrt:
                targets[2:] = np.sqrt(targets[2:])
            db[box_index : box_index + 4] = F32(head.coord_scale) * (
                targets - o[box_index : box_index + 4]
            )
            sums[1:6] += (
                iou,
                cls[t[1 : 1 + C] != 0].sum(dtype=np.float64),
                cls.sum(dtype=np.float64),
                float(o[p_index]),
                1,
            )
    sums[0] = np.sum(np.square(d, dtype=np.float64))
    sums[6] = out[:, p_base:box_base].sum(dtype=np.float64)
    scalars[: len(sums)] = sums


def _boxes(coords, head):
    """Predicted (x, y, w, h) rows relative to the image: x, y over side, w, h squared
    with sqrt=1."""
    boxes = np.array(coords, dtype=F32).reshape(-1, 4)
    boxes[:, :2] /= F32(head.side)
    if head.sqrt:
        boxes[:, 2:] = boxes[:, 2:] * boxes[:, 2:]
    return boxes
