"""[detection]: YOLOv1's detection head (Darknet's detection_layer.c).

Its input is flat (usually a [connected] layer): side*side class vectors, then
side*side*num objectness scores, then side*side*num boxes (x, y, w, h). Forward
copies it through, with a softmax over each cell's classes when softmax=1 (YOLOv1 uses
none: the connected layer is linear). Training follows forward_detection_layer; its
truth is Darknet's grid form (per cell: is_object, one-hot classes, x, y, w, h with
x, y relative to the cell), built here from box rows when the data loader gives those.
"""
import numpy as np

from ..boxes import TRUTH_FIELDS, box_iou, box_rmse, make_detections, thresholded
from .base import Layer
from .heads import ratio, report, truth_boxes

F32 = np.float32
RANDOM_SEEN = 64000   # with random=1, images seen before which the responsible box is random
MIN_REGION_BOX = .005  # fill_truth_region drops boxes narrower or shorter than this


def grid_truth_from_boxes(boxes, side, classes):
    """Darknet's fill_truth_region on (n, 5) rows of (x, y, w, h, class) relative to the
    image: the first box whose centre falls in a cell claims it. Returns float32
    (side*side*(5 + classes),)."""
    per_cell = 5 + classes
    truth = np.zeros(side * side * per_cell, dtype=F32)
    for x, y, w, h, cls in np.asarray(boxes, dtype=F32).reshape(-1, TRUTH_FIELDS):
        if w < MIN_REGION_BOX or h < MIN_REGION_BOX:
            continue
        col = min(int(x * F32(side)), side - 1)
        row = min(int(y * F32(side)), side - 1)
        index = (col + row * side) * per_cell
        if truth[index]:
            continue
        truth[index] = 1
        if int(cls) < classes:
            truth[index + 1 + int(cls)] = 1
        truth[index + 1 + classes:index + per_cell] = (x * F32(side) - F32(col),
                                                        y * F32(side) - F32(row), w, h)
    return truth


class DetectionLayer(Layer):
    type = "detection"
    capturable = False   # its loss runs on the host (for now)
    short = "Detection Layer"  # Darknet's layer table prints exactly this
    image_shaped = False

    def parse(self, s, ctx):
        self.coords = s.get_int("coords", 1)
        self.classes = s.get_int("classes", 1)
        self.rescore = s.get_int("rescore", 0)
        self.n = s.get_int("num", 1)
        self.side = s.get_int("side", 7)
        self.softmax = s.get_int("softmax", 0)
        self.sqrt = s.get_int("sqrt", 0)
        self.max_boxes = s.get_int("max", 90)
        self.coord_scale = s.get_float("coord_scale", 1.0)
        self.forced = s.get_int("forced", 0)
        self.object_scale = s.get_float("object_scale", 1.0)
        self.noobject_scale = s.get_float("noobject_scale", 1.0)
        self.class_scale = s.get_float("class_scale", 1.0)
        self.jitter = s.get_float("jitter", 0.2)
        self.random = s.get_int("random", 0)
        self.reorg = s.get_int("reorg", 0)  # read by Darknet, its use is commented out
        if self.coords != 4:
            raise s.error("only coords=4 is supported (x, y, w, h)", "coords")
        if self.forced and self.n < 2:
            raise s.error("forced=1 picks box 0 or 1: needs num >= 2", "forced")
        need = self.side * self.side * ((1 + self.coords) * self.n + self.classes)
        if need != self.inputs:
            raise s.error(f"side={self.side}, num={self.n}, classes={self.classes} need "
                          f"side*side*((1 + coords)*num + classes) = {need} inputs, but the "
                          f"layer before gives {self.inputs}", "side")
        self.outputs = self.inputs
        self.out_c = self.out_h = self.out_w = 0  # Darknet gives this layer no image shape
        self.truths = self.side * self.side * (1 + self.coords + self.classes)
        self.stats = {}
        self.stats_line = ""

    def describe(self):
        return ""

    # ---- computation --------------------------------------------------------------
    def forward(self, net):
        be = net.be
        be.copy(net.input[:self.batch * self.outputs], self.output)
        locations = self.side * self.side
        if self.softmax:
            be.softmax(self.output, self.classes, self.batch, self.inputs, locations,
                       self.classes, 1, 1.0, self.output)
        self.cost = None
        if net.train and net.truth is not None:
            delta, self.cost, self.stats = self.loss(
                be.to_host(self.output), self.grid_truth(net), net.seen, net.rng)
            be.write(self.delta, delta)
            report(net, self, f"Detection Avg IOU: {self.stats['avg_iou']:f}, "
                              f"Pos Cat: {self.stats['pos_cat']:f}, "
                              f"All Cat: {self.stats['all_cat']:f}, "
                              f"Pos Obj: {self.stats['pos_obj']:f}, "
                              f"Any Obj: {self.stats['any_obj']:f}, count: {self.stats['count']}")

    def backward(self, net):
        if net.delta is not None:
            net.be.axpy(1.0, self.delta, net.delta[:self.batch * self.outputs])

    def grid_truth(self, net):
        """The truth as (batch, truths) grid rows: as given when it has that size, else
        converted from box rows of net.truth_size fields (x, y, w, h, class, and the fork's
        track id), the detector data loader's form."""
        truth = net.truth_host.reshape(self.batch, -1)
        if truth.shape[1] == self.truths:
            return truth
        fields = net.truth_size
        if truth.shape[1] % fields:
            raise ValueError(f"[detection] layer {self.index} needs a truth of {self.truths} "
                             f"floats per image (or box rows of {fields}), got "
                             f"{truth.shape[1]}")
        return np.stack([grid_truth_from_boxes(boxes[:, :TRUTH_FIELDS], self.side, self.classes)
                         for boxes in truth_boxes(net, self.batch, self.max_boxes)])

    # ---- the loss (forward_detection_layer) ---------------------------------------------
    def loss(self, output, truth, seen, rng=None):
        """Darknet's forward_detection_layer training part on host arrays: output (batch *
        outputs), truth (batch, side*side*(1 + classes + coords)), seen = images seen.
        With random=1 the responsible box is drawn from `rng` (Darknet uses rand()).
        Returns (delta, cost, stats)."""
        B, n, C, side = self.batch, self.n, self.classes, self.side
        loc = side * side
        out = np.asarray(output, dtype=F32).reshape(-1)[:B * self.outputs].reshape(B, -1)
        truth = np.asarray(truth, dtype=F32).reshape(B, loc, 1 + C + self.coords)
        delta = np.zeros_like(out)
        avg_iou = avg_cat = avg_allcat = avg_obj = avg_anyobj = 0.0
        count = 0
        p_base, box_base = loc * C, loc * (C + n)
        for b in range(B):
            o, d = out[b], delta[b]
            scores = o[p_base:box_base]
            d[p_base:box_base] = F32(self.noobject_scale) * (F32(0) - scores)
            avg_anyobj += float(scores.sum(dtype=np.float64))
            for cell in np.nonzero(truth[b, :, 0].astype(np.int64))[0]:
                t = truth[b, cell]
                cls_lo = cell * C
                d[cls_lo:cls_lo + C] = F32(self.class_scale) * (t[1:1 + C] - o[cls_lo:cls_lo + C])
                avg_cat += float(o[cls_lo:cls_lo + C][t[1:1 + C] != 0].sum(dtype=np.float64))
                avg_allcat += float(o[cls_lo:cls_lo + C].sum(dtype=np.float64))
                tbox = t[1 + C:1 + C + 4].copy()
                tbox[:2] /= F32(side)
                boxes = o[box_base + cell * n * 4:][:n * 4].reshape(n, 4).copy()
                boxes[:, :2] /= F32(side)
                if self.sqrt:
                    boxes[:, 2:] = boxes[:, 2:] * boxes[:, 2:]
                ious = box_iou(boxes, tbox)
                rmses = box_rmse(boxes, tbox)
                best, best_iou, best_rmse = -1, F32(0), 20.0
                for k in range(n):  # IoU decides once any is positive, else the RMSE
                    if best_iou > 0 or ious[k] > 0:
                        if ious[k] > best_iou:
                            best, best_iou = k, ious[k]
                    elif rmses[k] < best_rmse:
                        best, best_rmse = k, rmses[k]
                if self.forced:
                    best = 1 if float(tbox[2] * tbox[3]) < .1 else 0  # C compares in double
                if self.random and seen < RANDOM_SEEN:
                    best = int((rng or np.random.default_rng()).integers(n))
                # best stays -1 when every IoU is 0 and every RMSE >= 20; Darknet then uses
                # the slots just before this cell's, which are still inside the image.
                box_index = box_base + (cell * n + best) * 4
                chosen = o[box_index:box_index + 4].copy()
                chosen[:2] /= F32(side)
                if self.sqrt:
                    chosen[2:] = chosen[2:] * chosen[2:]
                iou = float(box_iou(chosen, tbox))
                p_index = p_base + cell * n + best
                avg_obj += float(o[p_index])
                target = F32(iou) if self.rescore else F32(1)
                d[p_index] = F32(self.object_scale) * (target - o[p_index])
                targets = t[1 + C:1 + C + 4].copy()
                if self.sqrt:
                    targets[2:] = np.sqrt(targets[2:])
                d[box_index:box_index + 4] = F32(self.coord_scale) * (
                    targets - o[box_index:box_index + 4])
                avg_iou += iou
                count += 1
        cost = float(np.sum(np.square(delta), dtype=np.float64))
        stats = {"avg_iou": ratio(avg_iou, count), "pos_cat": ratio(avg_cat, count),
                 "all_cat": ratio(avg_allcat, count * C), "pos_obj": ratio(avg_obj, count),
                 "any_obj": avg_anyobj / (B * loc * n), "count": count}
        return delta.reshape(-1), cost, stats

    def detections(self, output, img_w, img_h, netw, neth, thresh, relative=True, letter=True):
        """Darknet's get_detection_detections for image 0 of a YOLOv1 [detection] layer: one
        detection per box predictor and cell. Boxes are relative (Darknet's yolo.c calls it with
        w = h = 1), or in img_w x img_h pixels with relative=False. The net size and `letter`
        do not apply: YOLOv1 input is plainly resized and its boxes are relative to the grid."""
        side, n, classes = self.side, self.n, self.classes
        loc = side * side
        out = np.asarray(output, dtype=F32).reshape(-1)[:self.outputs]
        cls = out[:loc * classes].reshape(loc, classes)
        scale = out[loc * classes:loc * (classes + n)].reshape(loc * n)
        coords = out[loc * (classes + n):].reshape(loc * n, self.coords)
        cell = np.repeat(np.arange(loc), n)
        col = (cell % side).astype(F32)
        row = (cell // side).astype(F32)
        power = 2 if self.sqrt else 1
        sx, sy = (1, 1) if relative else (img_w, img_h)
        boxes = np.stack([(coords[:, 0] + col) / F32(side) * F32(sx),
                          (coords[:, 1] + row) / F32(side) * F32(sy),
                          (np.power(coords[:, 2].astype(np.float64), power) * sx).astype(F32),
                          (np.power(coords[:, 3].astype(np.float64), power) * sy).astype(F32)],
                         axis=1)
        probs = thresholded(scale[:, None] * cls[cell], thresh)
        return make_detections(boxes, scale, probs, self.index)
