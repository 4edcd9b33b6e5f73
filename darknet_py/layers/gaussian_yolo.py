"""[Gaussian_yolo]: Gaussian YOLOv3's head (the AlexeyAB fork's gaussian_yolo_layer.c).

A [yolo] head that also predicts how uncertain each box coordinate is. Per image, `n`
anchor blocks of (8 + 1 + classes) planes of w*h: x, σx, y, σy, w, σw, h, σh, objectness,
classes. Forward applies the logistic to everything but w and h, then scale_x_y's affine
to x and y (not to their σ). Detections multiply each class probability by
1 - mean(σx, σy, σw, σh) as well as by the objectness. The training loss treats each
coordinate as a Gaussian of mean the prediction and deviation its σ: the box delta is the
gradient of its negative log likelihood (or, with an IoU loss, the IoU's gradient for the
box while σ keeps the likelihood's), computed on the host by losses/gaussian_yolo.py.

Where the fork's code differs from its [yolo]: the objectness deltas are weighted by
cls_normalizer (obj_normalizer and objectness_smooth are read and unused, as in the fork;
delta_normalizer, but not loss_scale, scales its GPU build's gradient), counters_per_class
weighs a class delta without cls_normalizer,
box deltas are always averaged over the classes a slot was told, and the statistics' IoU
is the GIoU under an IoU loss. The fork reads this layer's truth as rows of 5 whatever
its truth layout; darknet-py reads the network's own (net.truth_size).
"""

import numpy as np

from ..boxes import correct_yolo_boxes, make_detections, thresholded
from ..losses.gaussian_yolo import CLS, F32, OBJ, UH, UW, UX, UY, H, W, X, Y, gaussian_loss
from .base import refuse_options
from .heads import check_classes, keep_report, truth_boxes
from .yolo import YoloLayer

YOLO_POINTS = ("center", "left_top", "right_bottom")
# Read by the fork's parser for this layer but never used by it.
UNUSED_BY_THE_FORK = ("obj_normalizer", "objectness_smooth")


class GaussianYoloLayer(YoloLayer):
    type = "gaussian_yolo"
    capturable = False  # its loss runs on the host
    short = "Gaussian_yolo"

    def parse(self, s, ctx):
        self.parse_head_options(s, fork=True)  # the fork alone has this layer
        self.random = s.get_float("random", 0)
        if s.has("new_coords"):
            raise s.error(
                "[Gaussian_yolo] has no new_coords (the fork reads it only in [yolo])", "new_coords"
            )
        refuse_options(s, "map")
        self.parse_fork_options(s)
        self.uc_normalizer = s.get_float("uc_normalizer", 1.0)
        self.yolo_point = self._choice(s, "yolo_point", "center", YOLO_POINTS)
        for key in UNUSED_BY_THE_FORK:
            if s.has(key):
                s.get_str(key)
                s.warn(
                    "has no effect in [Gaussian_yolo] (the fork reads it and does not use it)", key
                )
        self.parse_anchors_and_shape(s, 8 + 1 + self.classes)
        self.stats = {}
        self.stats_line = ""

    def gradient_scale(self, net):
        """backward_gaussian_yolo_layer_gpu: delta_normalizer alone (no loss_scale)."""
        return 1.0 if self.fork_cpu else self.delta_normalizer

    # ---- computation --------------------------------------------------------------
    def forward(self, net):
        be = net.be
        be.copy(net.input[: self.batch * self.outputs], self.output)
        wh = self.w * self.h
        rows, stride = self.batch * self.n, self.entries * wh
        for first, count in ((X, 4), (UW, 1), (UH, 2 + self.classes)):
            be.activate_strided(self.output, rows, stride, first * wh, count * wh, "logistic")
        if self.scale_x_y != 1:
            for coord in (X, Y):
                be.scale_add_strided(
                    self.output,
                    rows,
                    stride,
                    coord * wh,
                    wh,
                    F32(self.scale_x_y),
                    F32(-0.5 * (self.scale_x_y - 1)),
                )
        self.cost = None
        if net.train and net.truth is not None:
            truths = truth_boxes(net, self.batch, self.max_boxes)
            netw, neth = net.input_shape[2], net.input_shape[1]
            for truth in truths:
                check_classes(truth, self.classes, self)
            delta, self.cost, self.stats = gaussian_loss(
                self, be.to_host(self.output), truths, netw, neth
            )
            be.write(self.delta, delta)
            self.print_stats = getattr(net, "verbose", False)
            keep_report(self, self.stats_report())

    def stats_report(self):
        st = self.stats
        return (
            f"Region {self.index} Avg IOU: {st['avg_iou']:f}, Class: {st['class']:f}, "
            f"Obj: {st['obj']:f}, No Obj: {st['no_obj']:f}, .5R: {st['recall']:f}, "
            f".75R: {st['recall75']:f},  count: {st['count']}, class_loss = "
            f"{st['class_loss']:.2f}, iou_loss = {st['iou_loss']:.2f}, uc_loss = "
            f"{st['uc_loss']:.2f}, total_loss = {st['total_loss']:.2f} "
        )

    # ---- boxes --------------------------------------------------------------------
    def point_shift(self, w, h):
        """How far the box centre lies from the predicted point (yolo_point): the point is
        the centre, the box's left-top corner or its right-bottom corner."""
        sign = {"center": 0, "left_top": 1, "right_bottom": -1}[self.yolo_point]
        return F32(sign) * w / F32(2), F32(sign) * h / F32(2)

    def gaussian_boxes(self, out, col, row, anchor_w, anchor_h, netw, neth):
        """get_gaussian_yolo_box on arrays: out (..., entries) broadcasting with the cell
        and anchor arrays; boxes (..., 4) float32 relative to the network input."""
        b = self.decode(
            out[..., X],
            out[..., Y],
            out[..., W],
            out[..., H],
            col,
            row,
            anchor_w,
            anchor_h,
            netw,
            neth,
        )
        dx, dy = self.point_shift(b[..., 2], b[..., 3])
        b[..., 0] += dx
        b[..., 1] += dy
        return b

    def image_boxes(self, o, netw, neth):
        """Every anchor's and cell's box of one image's output o (n, entries, h, w):
        (n, h, w, 4)."""
        j, i = np.meshgrid(
            np.arange(self.h, dtype=F32), np.arange(self.w, dtype=F32), indexing="ij"
        )
        anchors = self.biases.reshape(-1, 2)[self.mask]
        return self.gaussian_boxes(
            np.moveaxis(o, 1, -1),
            i,
            j,
            anchors[:, 0, None, None],
            anchors[:, 1, None, None],
            netw,
            neth,
        )

    def truth_cell(self, t):
        """The cell (j, i) responsible for truth t: the one holding its point."""
        if self.yolo_point == "center":
            # Darknet truncates; x = 1 would overrun the grid.
            return min(int(t[1] * F32(self.h)), self.h - 1), min(
                int(t[0] * F32(self.w)), self.w - 1
            )
        dx, dy = self.point_shift(t[2], t[3])
        x, y = (t[0] - dx) * F32(self.w), (t[1] - dy) * F32(self.h)
        return int(min(self.h - 1, max(0, y))), int(min(self.w - 1, max(0, x)))

    def detections(self, output, img_w, img_h, netw, neth, thresh, relative=True, letter=True):
        """get_gaussian_yolo_detections for image 0: one detection per anchor and cell
        whose objectness is above thresh (cells in row-major order, anchors inner); each
        class probability is objectness * p * (1 - the σs' mean)."""
        wh = self.w * self.h
        out = np.asarray(output, dtype=F32).reshape(-1)[: self.outputs]
        out = out.reshape(self.n, self.entries, wh).transpose(2, 0, 1)  # (cell, anchor, entry)
        cell, anchor = np.nonzero(out[:, :, OBJ] > F32(thresh))
        e = out[cell, anchor]
        biases = self.biases.reshape(-1, 2)[np.asarray(self.mask, dtype=np.int64)[anchor]]
        boxes = self.gaussian_boxes(
            e,
            (cell % self.w).astype(F32),
            (cell // self.w).astype(F32),
            biases[:, 0],
            biases[:, 1],
            netw,
            neth,
        ).reshape(-1, 4)
        objectness = e[:, OBJ]
        # As the fork: the σs summed in float, the rest in double.
        sigma_sum = ((e[:, UX] + e[:, UY]) + e[:, UW]) + e[:, UH]
        sigma_mean = (sigma_sum / 4.0).astype(F32)
        probs = (
            (objectness[:, None] * e[:, CLS:]).astype(np.float64)
            * (1.0 - sigma_mean[:, None].astype(np.float64))
        ).astype(F32)
        boxes = correct_yolo_boxes(boxes, img_w, img_h, netw, neth, relative, letter)
        return make_detections(boxes, objectness, thresholded(probs, thresh), self.index)
