"""[Gaussian_yolo]: Gaussian YOLOv3's head (the AlexeyAB fork's gaussian_yolo_layer.c).

A [yolo] head that also predicts how uncertain each box coordinate is. Per image, `n`
anchor blocks of (8 + 1 + classes) planes of w*h: x, σx, y, σy, w, σw, h, σh, objectness,
classes. Forward applies the logistic to everything but w and h, then scale_x_y's affine
to x and y (not to their σ). Detections multiply each class probability by
1 - mean(σx, σy, σw, σh) as well as by the objectness. The training loss treats each
coordinate as a Gaussian of mean the prediction and deviation its σ: the box delta is the
gradient of its negative log likelihood (or, with an IoU loss, the IoU's gradient for the
box while σ keeps the likelihood's), computed on the host (the output is copied there
and the delta back; [yolo]'s runs on the backend).

Where the fork's code differs from its [yolo]: the objectness deltas are weighted by
cls_normalizer (obj_normalizer, objectness_smooth and delta_normalizer are read and
unused, as in the fork), counters_per_class weighs a class delta without cls_normalizer,
box deltas are always averaged over the classes a slot was told, and the statistics' IoU
is the GIoU under an IoU loss. The fork reads this layer's truth as rows of 5 whatever
its truth layout; darknet-py reads the network's own (net.truth_size).
"""
import math

import numpy as np

from ..boxes import (box_giou, box_iou_kind, box_iou_matrix, correct_yolo_boxes, dx_box_iou,
                     fork_iou, make_detections, thresholded)
from .base import refuse_options
from .heads import check_classes, keep_report, ratio, truth_boxes
from .yolo import FLT_MAX, YoloLayer

F32 = np.float32
X, UX, Y, UY, W, UW, H, UH, OBJ, CLS = range(10)   # entries of one anchor's block
COORDS = [X, Y, W, H]
SIGMAS = [UX, UY, UW, UH]
YOLO_POINTS = ("center", "left_top", "right_bottom")
SIGMA_CONST = 0.3   # the fork's floor added to σ in the Gaussian's normaliser
EPSILON = 1e-9
# Read by the fork's parser for this layer but never used by it.
UNUSED_BY_THE_FORK = ("obj_normalizer", "objectness_smooth", "delta_normalizer")


class GaussianYoloLayer(YoloLayer):
    type = "gaussian_yolo"
    capturable = False   # its loss runs on the host
    short = "Gaussian_yolo"

    def parse(self, s, ctx):
        self.parse_head_options(s, fork=True)   # the fork alone has this layer
        self.random = s.get_float("random", 0)
        if s.has("new_coords"):
            raise s.error("[Gaussian_yolo] has no new_coords (the fork reads it only in "
                          "[yolo])", "new_coords")
        refuse_options(s, "map")
        self.parse_fork_options(s)
        self.uc_normalizer = s.get_float("uc_normalizer", 1.0)
        self.yolo_point = self._choice(s, "yolo_point", "center", YOLO_POINTS)
        for key in UNUSED_BY_THE_FORK:
            if s.has(key):
                s.get_str(key)
                s.warn("has no effect in [Gaussian_yolo] (the fork reads it and does not "
                       "use it)", key)
        self.parse_anchors_and_shape(s, 8 + 1 + self.classes)
        self.stats = {}
        self.stats_line = ""

    # ---- computation --------------------------------------------------------------
    def forward(self, net):
        be = net.be
        be.copy(net.input[:self.batch * self.outputs], self.output)
        wh = self.w * self.h
        rows, stride = self.batch * self.n, self.entries * wh
        for first, count in ((X, 4), (UW, 1), (UH, 2 + self.classes)):
            be.activate_strided(self.output, rows, stride, first * wh, count * wh, "logistic")
        if self.scale_x_y != 1:
            for coord in (X, Y):
                be.scale_add_strided(self.output, rows, stride, coord * wh, wh,
                                     F32(self.scale_x_y), F32(-0.5 * (self.scale_x_y - 1)))
        self.cost = None
        if net.train and net.truth is not None:
            truths = truth_boxes(net, self.batch, self.max_boxes)
            netw, neth = net.input_shape[2], net.input_shape[1]
            delta, self.cost, self.stats = self.gaussian_loss(be.to_host(self.output), truths,
                                                              netw, neth)
            be.write(self.delta, delta)
            self.print_stats = getattr(net, "verbose", False)
            keep_report(self, self.stats_report())

    def stats_report(self):
        st = self.stats
        return (f"Region {self.index} Avg IOU: {st['avg_iou']:f}, Class: {st['class']:f}, "
                f"Obj: {st['obj']:f}, No Obj: {st['no_obj']:f}, .5R: {st['recall']:f}, "
                f".75R: {st['recall75']:f},  count: {st['count']}, class_loss = "
                f"{st['class_loss']:.2f}, iou_loss = {st['iou_loss']:.2f}, uc_loss = "
                f"{st['uc_loss']:.2f}, total_loss = {st['total_loss']:.2f} ")

    # ---- boxes --------------------------------------------------------------------
    def point_shift(self, w, h):
        """How far the box centre lies from the predicted point (yolo_point): the point is
        the centre, the box's left-top corner or its right-bottom corner."""
        sign = {"center": 0, "left_top": 1, "right_bottom": -1}[self.yolo_point]
        return F32(sign) * w / F32(2), F32(sign) * h / F32(2)

    def gaussian_boxes(self, out, col, row, anchor_w, anchor_h, netw, neth):
        """get_gaussian_yolo_box on arrays: out (..., entries) broadcasting with the cell
        and anchor arrays; boxes (..., 4) float32 relative to the network input."""
        b = self.decode(out[..., X], out[..., Y], out[..., W], out[..., H], col, row,
                        anchor_w, anchor_h, netw, neth)
        dx, dy = self.point_shift(b[..., 2], b[..., 3])
        b[..., 0] += dx
        b[..., 1] += dy
        return b

    def image_boxes(self, o, netw, neth):
        """Every anchor's and cell's box of one image's output o (n, entries, h, w):
        (n, h, w, 4)."""
        j, i = np.meshgrid(np.arange(self.h, dtype=F32), np.arange(self.w, dtype=F32),
                           indexing="ij")
        anchors = self.biases.reshape(-1, 2)[self.mask]
        return self.gaussian_boxes(np.moveaxis(o, 1, -1), i, j, anchors[:, 0, None, None],
                                   anchors[:, 1, None, None], netw, neth)

    def truth_cell(self, t):
        """The cell (j, i) responsible for truth t: the one holding its point."""
        if self.yolo_point == "center":
            # Darknet truncates; x = 1 would overrun the grid.
            return min(int(t[1] * F32(self.h)), self.h - 1), min(int(t[0] * F32(self.w)),
                                                                  self.w - 1)
        dx, dy = self.point_shift(t[2], t[3])
        x, y = (t[0] - dx) * F32(self.w), (t[1] - dy) * F32(self.h)
        return int(min(self.h - 1, max(0, y))), int(min(self.w - 1, max(0, x)))

    # ---- the loss (forward_gaussian_yolo_layer) ---------------------------------------
    def gaussian_box_delta(self, truth, o, d, anchor, a, j, i, netw, neth, iou_normalizer):
        """delta_gaussian_yolo_box with accumulate=1 for truth at anchor slot a of cell
        (j, i) (`anchor` indexes the biases): add the box's and the σs' deltas to d.
        Returns the IoU of prediction and truth (the GIoU under an IoU loss)."""
        aw, ah = self.biases[2 * anchor], self.biases[2 * anchor + 1]
        e = o[a, :, j, i]
        pred = self.gaussian_boxes(e, F32(i), F32(j), aw, ah, netw, neth)
        t = truth[:4]
        iou = float(fork_iou(pred, t))
        giou = float(box_giou(pred, t))
        pred[2:][pred[2:] == 0] = 1   # the fork's guard against NaN in dx_box_iou
        dx, dy = self.point_shift(t[2], t[3])
        target = np.array([(t[0] - dx) * F32(self.w) - F32(i),
                           (t[1] - dy) * F32(self.h) - F32(j),
                           np.log(np.float64(t[2] * F32(netw) / aw)),
                           np.log(np.float64(t[3] * F32(neth) / ah))], dtype=F32)
        scale = float(F32(2) - t[2] * t[3])
        diff = (target - e[COORDS]).astype(F32)
        sigma = e[SIGMAS].astype(np.float64)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            z = (diff / e[SIGMAS]).astype(F32)
            z2 = np.square(z.astype(np.float64)).astype(F32)
            density = (np.exp(-0.5 * z2.astype(np.float64))
                       / (math.sqrt(2 * math.pi) * (sigma + SIGMA_CONST))).astype(F32)
            weight = (0.5 / (density + EPSILON) * density * scale).astype(F32)
            coord = (weight * z.astype(np.float64) * (1.0 / sigma)).astype(F32)
            spread = (weight * (z2 / sigma - 1.0 / (sigma + SIGMA_CONST))).astype(F32)
            if self.iou_loss != "mse":
                iou = giou
                coord = dx_box_iou(pred, t, self.iou_loss).astype(F32)
                sx, sy = self.point_shift(coord[2], coord[3])
                coord[0] -= sx
                coord[1] -= sy
                coord[2:] *= np.exp(e[[W, H]].astype(np.float64)).astype(F32)
            coord = coord * F32(iou_normalizer)
            spread = spread * F32(self.uc_normalizer)
        for values in (coord, spread):
            values[~np.isfinite(values)] = 0
            if self.max_delta != FLT_MAX:
                np.clip(values, -F32(self.max_delta), F32(self.max_delta), out=values)
        d[a, COORDS, j, i] += coord
        d[a, SIGMAS, j, i] += spread
        return iou

    def gaussian_class_delta(self, o, d, a, j, i, class_id):
        """delta_gaussian_yolo_class: label-smoothed targets; class_id's delta times its
        counters_per_class multiplier. When class_id's delta is already set (an earlier
        truth in the same cell and anchor) only it is rewritten. Returns the predicted
        probability of class_id."""
        eps, mult = self.label_smooth_eps, self.class_multipliers
        p = o[a, CLS:, j, i]
        target = np.zeros(self.classes, dtype=np.float64)
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

    def gaussian_loss(self, output, truths, netw, neth):
        """The fork's forward_gaussian_yolo_layer training part on host arrays: output
        (batch * outputs) after activation, truths a list (per image) of truth rows.
        Returns (delta, cost, stats) with delta shaped like output; cost is Σ delta²."""
        B, n, C, h, w = self.batch, self.n, self.classes, self.h, self.w
        out = np.asarray(output, dtype=F32).reshape(-1)[:B * self.outputs].reshape(
            B, n, self.entries, h, w)
        delta = np.zeros_like(out)
        anchor_shapes = np.zeros((self.total, 4), dtype=F32)
        anchor_shapes[:, 2:] = self.biases.reshape(-1, 2) / np.array([netw, neth], dtype=F32)
        cls_norm = F32(self.cls_normalizer)
        tot = dict(iou=0.0, cat=0.0, obj=0.0, anyobj=0.0, recall=0, recall75=0, count=0)
        for b in range(B):
            o, d, truth = out[b], delta[b], truths[b]
            check_classes(truth, C, self)
            obj = o[:, OBJ]
            tot["anyobj"] += float(obj.sum(dtype=np.float64))
            d[:, OBJ] = cls_norm * (F32(0) - obj)
            if len(truth):
                pred = self.image_boxes(o, netw, neth)
                iou = np.nan_to_num(box_iou_matrix(pred.reshape(-1, 4), truth[:, :4]),
                                    nan=0.0).reshape(n, h, w, -1)
                best_iou = np.max(iou, axis=-1, initial=F32(0))
                best_t = np.argmax(iou, axis=-1)
                # Not punished for objectness near a truth when it names some class.
                named = (o[:, CLS:] > F32(0.25)).any(axis=1)
                d[:, OBJ][named & (best_iou > self.ignore_thresh)] = 0
                for a, j, i in zip(*np.nonzero(best_iou > self.truth_thresh)):
                    t = truth[best_t[a, j, i]]
                    class_id = int(t[4])
                    d[a, OBJ, j, i] = cls_norm * (F32(1) - obj[a, j, i])
                    self.gaussian_class_delta(o, d, a, j, i, class_id)
                    self.gaussian_box_delta(t, o, d, self.mask[a], a, j, i, netw, neth,
                                            F32(self.iou_normalizer)
                                            * self.class_multiplier(class_id))
            for t in truth:
                j, i = self.truth_cell(t)
                shape = np.array([0, 0, t[2], t[3]], dtype=F32)
                shape_iou = fork_iou(anchor_shapes, shape)
                best_n = int(np.argmax(shape_iou)) if shape_iou.max() > 0 else 0
                assigned = [best_n] if best_n in self.mask else []
                if self.iou_thresh < 1:
                    kind_iou = box_iou_kind(anchor_shapes, shape, self.iou_thresh_kind)
                    assigned += [k for k in range(self.total) if k in self.mask and
                                 k != best_n and kind_iou[k] > self.iou_thresh]
                for anchor in assigned:
                    self._gaussian_assign(t, o, d, anchor, j, i, netw, neth, tot)
            # Average the accumulated box deltas over the classes each slot was told.
            told = (d[:, CLS:] > 0).sum(axis=1)
            d[:, :CLS - 1] /= np.maximum(told, 1)[:, None].astype(F32)
        box_free = delta.copy()
        box_free[:, :, :OBJ] = 0
        class_loss = float(np.sum(np.square(box_free, dtype=np.float64)))
        no_size = delta.copy()
        no_size[:, :, W:OBJ] = 0   # the fork's "except uncertainty" clears w, σw, h, σh
        except_uc_loss = float(np.sum(np.square(no_size, dtype=np.float64)))
        loss = float(np.sum(np.square(delta, dtype=np.float64)))
        count = tot["count"]
        stats = {"avg_iou": ratio(tot["iou"], count), "class": ratio(tot["cat"], count),
                 "obj": ratio(tot["obj"], count), "no_obj": tot["anyobj"] / (w * h * n * B),
                 "recall": ratio(tot["recall"], count),
                 "recall75": ratio(tot["recall75"], count), "count": count,
                 "class_loss": class_loss / B, "iou_loss": (except_uc_loss - class_loss) / B,
                 "uc_loss": (loss - except_uc_loss) / B, "total_loss": loss / B}
        return delta.reshape(-1), loss, stats

    def _gaussian_assign(self, t, o, d, anchor, j, i, netw, neth, tot):
        """Make anchor (an index into the biases, one of the mask) of cell (j, i)
        responsible for truth t: box, objectness and class deltas, and the statistics."""
        a = self.mask.index(anchor)
        class_id = int(t[4])
        mult = self.class_multiplier(class_id)
        iou = self.gaussian_box_delta(t, o, d, anchor, a, j, i, netw, neth,
                                      F32(self.iou_normalizer) * mult)
        tot["obj"] += float(o[a, OBJ, j, i])
        d[a, OBJ, j, i] = mult * F32(self.cls_normalizer) * (F32(1) - o[a, OBJ, j, i])
        tot["cat"] += self.gaussian_class_delta(o, d, a, j, i, class_id)
        tot["count"] += 1
        tot["recall"] += iou > .5
        tot["recall75"] += iou > .75
        tot["iou"] += iou

    def detections(self, output, img_w, img_h, netw, neth, thresh, relative=True, letter=True):
        """get_gaussian_yolo_detections for image 0: one detection per anchor and cell
        whose objectness is above thresh (cells in row-major order, anchors inner); each
        class probability is objectness * p * (1 - the σs' mean)."""
        wh = self.w * self.h
        out = np.asarray(output, dtype=F32).reshape(-1)[:self.outputs]
        out = out.reshape(self.n, self.entries, wh).transpose(2, 0, 1)  # (cell, anchor, entry)
        cell, anchor = np.nonzero(out[:, :, OBJ] > F32(thresh))
        e = out[cell, anchor]
        biases = self.biases.reshape(-1, 2)[np.asarray(self.mask, dtype=np.int64)[anchor]]
        boxes = self.gaussian_boxes(e, (cell % self.w).astype(F32),
                                    (cell // self.w).astype(F32), biases[:, 0], biases[:, 1],
                                    netw, neth).reshape(-1, 4)
        objectness = e[:, OBJ]
        # As the fork: the σs summed in float, the rest in double.
        sigma_sum = ((e[:, UX] + e[:, UY]) + e[:, UW]) + e[:, UH]
        sigma_mean = (sigma_sum / 4.0).astype(F32)
        probs = ((objectness[:, None] * e[:, CLS:]).astype(np.float64)
                 * (1.0 - sigma_mean[:, None].astype(np.float64))).astype(F32)
        boxes = correct_yolo_boxes(boxes, img_w, img_h, netw, neth, relative, letter)
        return make_detections(boxes, objectness, thresholded(probs, thresh), self.index)
