"""[detection]: YOLOv1's detection head (Darknet's detection_layer.c).

Its input is flat (usually a [connected] layer): side*side class vectors, then
side*side*num objectness scores, then side*side*num boxes (x, y, w, h). Forward
copies it through, with a softmax over each cell's classes when softmax=1 (YOLOv1 uses
none: the connected layer is linear). Training follows forward_detection_layer through
the backend's detection_loss op (losses/detection.py, ops/losses/region_loss.cu); its truth
is Darknet's grid form (per cell: is_object, one-hot classes, x, y, w, h with x, y
relative to the cell), built on the backend from box rows when the data loader gives
those.
"""

import numpy as np

from ..boxes import make_detections, thresholded
from ..draws import uniform_hash
from ..losses.detection import DETECTION_SCALARS, RANDOM_SEEN, DetectionHead, detection_loss
from .base import Layer
from .heads import keep_report, ratio

F32 = np.float32


class DetectionLayer(Layer):
    type = "detection"
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
            raise s.error(
                f"side={self.side}, num={self.n}, classes={self.classes} need "
                f"side*side*((1 + coords)*num + classes) = {need} inputs, but the "
                f"layer before gives {self.inputs}",
                "side",
            )
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
        be.copy(net.input[: self.batch * self.outputs], self.output)
        locations = self.side * self.side
        if self.softmax:
            be.softmax(
                self.output,
                self.classes,
                self.batch,
                self.inputs,
                locations,
                self.classes,
                1,
                1.0,
                self.output,
            )
        self.cost = None
        if net.train and net.truth is not None:
            be.detection_loss(
                self.loss_head(),
                self.output,
                self.grid_truth(net),
                self.random_draws(net),
                self.delta,
                self.scalars,
            )
            self.print_stats = getattr(net, "verbose", False)
            self.pending = True

    def allocate(self, be, batch, train):
        super().allocate(be, batch, train)
        self.grid = be.zeros(batch * self.truths) if train else None
        self.draws = be.zeros(batch * self.side * self.side) if train and self.random else None
        self.scalars = be.zeros(len(DETECTION_SCALARS)) if train else None

    def loss_head(self):
        return DetectionHead(
            self.batch,
            self.side,
            self.n,
            self.classes,
            self.sqrt,
            self.rescore,
            self.forced,
            self.coord_scale,
            self.object_scale,
            self.noobject_scale,
            self.class_scale,
        )

    def collect(self, values):
        """The detection_loss op's figures: the cost, the statistics and Darknet's line."""
        self.cost, self.stats = float(values[0]), self.statistics(values)
        keep_report(
            self,
            f"Detection Avg IOU: {self.stats['avg_iou']:f}, "
            f"Pos Cat: {self.stats['pos_cat']:f}, "
            f"All Cat: {self.stats['all_cat']:f}, "
            f"Pos Obj: {self.stats['pos_obj']:f}, "
            f"Any Obj: {self.stats['any_obj']:f}, count: {self.stats['count']}",
        )

    def statistics(self, values):
        _, iou, pos_cat, all_cat, pos_obj, count, any_obj = (float(v) for v in values)
        count = int(count)
        return {
            "avg_iou": ratio(iou, count),
            "pos_cat": ratio(pos_cat, count),
            "all_cat": ratio(all_cat, count * self.classes),
            "pos_obj": ratio(pos_obj, count),
            "any_obj": any_obj / (self.batch * self.side * self.side * self.n),
            "count": count,
        }

    def backward(self, net):
        if net.delta is not None:
            net.be.axpy(1.0, self.delta, net.delta[: self.batch * self.outputs])

    def check_truth(self, net, truth_host):
        """Refuse a truth that is neither the grid nor box rows. With random=1 early in
        training the box draws' seed is a launch argument, which a recorded step would
        keep: those steps run eagerly."""
        per_image = truth_host.shape[1]
        if per_image != self.truths and per_image % net.truth_size:
            raise ValueError(
                f"[detection] layer {self.index} needs a truth of {self.truths} "
                f"floats per image (or box rows of {net.truth_size}), got "
                f"{per_image}"
            )
        self.capturable = not (self.random and net.seen < RANDOM_SEEN)

    def grid_truth(self, net):
        """The truth in grid form on the backend: net.truth as it is when it has that size,
        else built from its box rows of net.truth_size fields (the detector data loader's
        form) into self.grid."""
        if net.truth_host.shape[1] == self.truths:
            return net.truth
        net.be.detection_grid_truth(
            net.truth,
            self.batch,
            net.truth_size,
            self.max_boxes,
            self.side,
            self.classes,
            self.grid,
        )
        return self.grid

    def random_draws(self, net):
        """With random=1 early in training, one uniform draw per image and cell choosing its
        responsible box (Darknet uses rand()); else None."""
        if not (self.random and net.seen < RANDOM_SEEN):
            return None
        net.be.uniform(self.draws, int(net.rng.integers(1 << 31)))
        return self.draws

    def loss(self, output, truth, seen, rng=None):
        """The loss on host arrays: output (batch * outputs), grid truth (batch, truths),
        seen = images seen; random=1 draws from `rng`. Returns (delta, cost, stats)."""
        draws = None
        if self.random and seen < RANDOM_SEEN:
            seed = (rng or np.random.default_rng()).integers(1 << 31)
            draws = uniform_hash(seed, self.batch * self.side * self.side)
        delta = np.zeros(self.batch * self.outputs, dtype=F32)
        scalars = np.zeros(len(DETECTION_SCALARS))
        detection_loss(self.loss_head(), output, truth, draws, delta, scalars)
        return delta, float(scalars[0]), self.statistics(scalars)

    def detections(self, output, img_w, img_h, netw, neth, thresh, relative=True, letter=True):
        """Darknet's get_detection_detections for image 0 of a YOLOv1 [detection] layer: one
        detection per box predictor and cell. Boxes are relative (Darknet's yolo.c calls it with
        w = h = 1), or in img_w x img_h pixels with relative=False. The net size and `letter`
        do not apply: YOLOv1 input is plainly resized and its boxes are relative to the grid."""
        side, n, classes = self.side, self.n, self.classes
        loc = side * side
        out = np.asarray(output, dtype=F32).reshape(-1)[: self.outputs]
        cls = out[: loc * classes].reshape(loc, classes)
        scale = out[loc * classes : loc * (classes + n)].reshape(loc * n)
        coords = out[loc * (classes + n) :].reshape(loc * n, self.coords)
        cell = np.repeat(np.arange(loc), n)
        col = (cell % side).astype(F32)
        row = (cell // side).astype(F32)
        power = 2 if self.sqrt else 1
        sx, sy = (1, 1) if relative else (img_w, img_h)
        boxes = np.stack(
            [
                (coords[:, 0] + col) / F32(side) * F32(sx),
                (coords[:, 1] + row) / F32(side) * F32(sy),
                (np.power(coords[:, 2].astype(np.float64), power) * sx).astype(F32),
                (np.power(coords[:, 3].astype(np.float64), power) * sy).astype(F32),
            ],
            axis=1,
        )
        probs = thresholded(scale[:, None] * cls[cell], thresh)
        return make_detections(boxes, scale, probs, self.index)
