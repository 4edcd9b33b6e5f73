"""[yolo]: YOLOv3's detection head (Darknet's yolo_layer.c), with the AlexeyAB fork's options.

The output keeps the input's image shape: per image, `n` anchor blocks of
(4 + 1 + classes) planes of w*h: x, y, w, h, objectness, classes. Forward applies the
logistic to x, y, objectness and classes (none of it with the fork's new_coords=1, whose
convolution is expected to end in a logistic), then the fork's scale_x_y affine on x and y.
In training the loss is forward_yolo_layer's, computed by the backend op yolo_loss
(darknet_py/losses/yolo.py is its reference, ops/losses/yolo_loss.cu the GPU's): it writes the
delta and leaves the cost and statistics in `scalars`, read after the step by `collect`;
backward adds the delta to the previous layer's.

Two losses: the original Darknet's and the fork's (iou_loss, normalizers, label
smoothing, iou_thresh, ...; `loss` and `fork_loss` run them on host arrays). The fork's
is used when the network is the fork's flavour or the section sets any option only the
fork knows.
"""

from dataclasses import replace

import numpy as np

from ..boxes import (
    IOU_KINDS,
    NMS_KINDS,
    TRUTH_FIELDS,
    correct_yolo_boxes,
    make_detections,
    thresholded,
)
from ..losses.yolo import (
    FLT_MAX,
    IOU_LOSSES,
    SCALARS,
    YoloLossSpec,
    decode,
    every_truth,
    loss_stats,
    yolo_loss,
)
from ..plurals import counted
from .base import Layer, refuse_options
from .heads import check_classes, is_fork_flavour, keep_report, parse_anchors

F32 = np.float32
# Options only the AlexeyAB fork reads: any of them switches the layer to the fork's loss.
FORK_OPTIONS = (
    "scale_x_y",
    "new_coords",
    "iou_loss",
    "iou_normalizer",
    "obj_normalizer",
    "cls_normalizer",
    "max_delta",
    "iou_thresh",
    "iou_thresh_kind",
    "beta_nms",
    "nms_kind",
    "label_smooth_eps",
    "objectness_smooth",
    "counters_per_class",
    "resize",
)


class YoloLayer(Layer):
    type = "yolo"
    short = "yolo"

    def parse(self, s, ctx):
        self.parse_head_options(s, is_fork_flavour(ctx) or any(s.has(k) for k in FORK_OPTIONS))
        self.random = s.get_int("random", 0)
        refuse_options(s, "map", "focal_loss")
        self.parse_fork_options(s)
        self.parse_anchors_and_shape(s, 4 + 1 + self.classes)
        self.stats = {}
        self.stats_line = ""

    def parse_head_options(self, s, fork):
        """What [yolo] and [Gaussian_yolo] read alike: classes, num, mask, max (200 in the
        fork, 90 in the original), jitter and the two thresholds."""
        self.classes = s.get_int("classes", 20)
        self.total = s.get_int("num", 1)
        mask = s.get_int_list("mask", None)
        self.mask = list(mask) if mask else list(range(self.total))
        self.n = len(self.mask)
        self.fork = fork
        self.max_boxes = s.get_int("max", 200 if fork else 90)
        self.jitter = s.get_float("jitter", 0.2)
        self.ignore_thresh = s.get_float("ignore_thresh", 0.5)
        self.truth_thresh = s.get_float("truth_thresh", 1.0)

    def parse_anchors_and_shape(self, s, entries):
        """classes, num, mask and anchors checked, biases read, and the output shape of
        `entries` planes per masked anchor (4 + 1 + classes here; the Gaussian head has 8
        box planes). Shared by [yolo] and [Gaussian_yolo]."""
        if self.classes < 1:
            raise s.error("must be at least 1", "classes")
        if self.total < 1:
            raise s.error("must be at least 1", "num")
        listed = len(s.get_float_list("anchors", None) or ()) // 2
        if self.mask and self.total <= max(self.mask) < listed:
            # The fork's stock cspx-p7 cfgs mask anchors past num that anchors= does list;
            # the C code then reads past its array. Use the listed anchors instead.
            s.warn(
                f"mask uses anchor {max(self.mask)} but num={self.total}; taking "
                f"num={listed}, the anchors listed",
                "num",
            )
            self.total = listed
        for m in self.mask:
            if not 0 <= m < self.total:
                raise s.error(
                    f"anchor {m} does not exist: num={self.total} anchors are "
                    f"numbered 0..{self.total - 1}",
                    "mask",
                )
        self.biases = parse_anchors(s, 2 * self.total)
        self.entries = entries
        self.out_c = self.n * entries
        self.out_h, self.out_w = self.h, self.w
        self.outputs = self.out_c * self.out_h * self.out_w
        if self.outputs != self.inputs:
            box = entries - 1 - self.classes
            raise s.error(
                f"the layer before [{self.short}] gives {counted(self.c, 'channel')} "
                f"but {counted(self.n, 'masked anchor')} x ({box} + 1 + "
                f"{counted(self.classes, 'class', 'classes')}) need {self.out_c}: "
                f"set its filters={self.out_c}",
                "classes",
            )

    def parse_fork_options(self, s):
        """The fork's [yolo] options (parse_yolo in its parser.c), with its defaults."""
        self.scale_x_y = s.get_float("scale_x_y", 1.0)
        self.new_coords = s.get_int("new_coords", 0)
        self.iou_loss = self._choice(s, "iou_loss", "mse", IOU_LOSSES)
        self.iou_normalizer = s.get_float("iou_normalizer", 0.75)
        self.obj_normalizer = s.get_float("obj_normalizer", 1.0)
        self.cls_normalizer = s.get_float("cls_normalizer", 1.0)
        self.max_delta = s.get_float("max_delta", FLT_MAX)
        self.iou_thresh = s.get_float("iou_thresh", 1.0)
        self.iou_thresh_kind = self._choice(s, "iou_thresh_kind", "iou", IOU_KINDS)
        self.beta_nms = s.get_float("beta_nms", 0.6)
        self.nms_kind = self._choice(s, "nms_kind", "default", NMS_KINDS)
        self.label_smooth_eps = s.get_float("label_smooth_eps", 0.0)
        self.objectness_smooth = s.get_int("objectness_smooth", 0)
        self.resize = s.get_float("resize", 1.0)
        # show_details=0: the fork's cost is the plain Σ delta² (as with iou_loss=mse).
        self.show_details = s.get_int("show_details", 1)
        self.delta_normalizer = s.get_float("delta_normalizer", 1.0)
        if self.delta_normalizer != 1.0 and self.fork_cpu:
            s.warn(
                "has no effect with --darknet alexeyab-cpu: the fork's CPU build ignores it "
                "(its GPU build, the default alexeyab, scales the gradient by it)",
                "delta_normalizer",
            )
        counters = s.get_int_list("counters_per_class", None)
        self.class_multipliers = None
        if counters is not None:
            if len(counters) != self.classes:
                raise s.error(
                    f"{len(counters)} counts given for classes={self.classes}", "counters_per_class"
                )
            # get_classes_multipliers: rarer classes weigh more, capped at max_delta.
            counts = np.maximum(np.array(counters, dtype=F32), F32(1))
            self.class_multipliers = np.minimum(counts.max() / counts, F32(self.max_delta))

    @staticmethod
    def _choice(s, key, default, known):
        value = s.get_str(key, default)
        if value not in known:
            raise s.error(f"unknown value '{value}' (known: {', '.join(known)})", key)
        return value

    def describe(self):
        return ""

    # ---- computation --------------------------------------------------------------
    def forward(self, net):
        be = net.be
        be.copy(net.input[: self.batch * self.outputs], self.output)
        wh = self.w * self.h
        rows, stride = self.batch * self.n, (5 + self.classes) * wh
        if not self.new_coords:
            be.activate_strided(self.output, rows, stride, 0, 2 * wh, "logistic")
            be.activate_strided(
                self.output, rows, stride, 4 * wh, (1 + self.classes) * wh, "logistic"
            )
        if self.scale_x_y != 1:
            # The fork passes the offset as a float computed in double.
            be.scale_add_strided(
                self.output,
                rows,
                stride,
                0,
                2 * wh,
                F32(self.scale_x_y),
                F32(-0.5 * (self.scale_x_y - 1)),
            )
        self.cost = None
        if net.train and net.truth is not None:
            self.loss_spec = self._loss_spec(net)
            be.yolo_loss(self.loss_spec, self.output, net.truth, self.delta, self.scalars)
            self.pending = True
            self.print_stats = getattr(net, "verbose", False)

    def _loss_spec(self, net):
        return self.spec(
            net.input_shape[2], net.input_shape[1], getattr(net, "truth_size", TRUTH_FIELDS)
        )

    def check_truth(self, net, truth_host):
        # The loss runs on the backend (and may be a replayed graph): class ids are checked
        # here, on the host copy, when the network stages a step's truth.
        # Its own rows: the network checks it before sizing its arrays for them.
        spec = replace(self._loss_spec(net), batch=len(truth_host))
        check_classes(every_truth(spec, truth_host), self.classes, self)

    def allocate(self, be, batch, train):
        super().allocate(be, batch, train)
        self.scalars = be.zeros(len(SCALARS)) if train else None

    def spec(self, netw, neth, truth_fields=TRUTH_FIELDS, fork=None):
        """The loss's view of this layer (yolo_loss.YoloLossSpec) for a netw x neth input;
        fork: the flavour (default: the layer's)."""
        return YoloLossSpec(
            batch=self.batch,
            n=self.n,
            classes=self.classes,
            h=self.h,
            w=self.w,
            total=self.total,
            mask=tuple(self.mask),
            biases=self.biases,
            netw=netw,
            neth=neth,
            truth_fields=truth_fields,
            max_boxes=self.max_boxes,
            fork=self.fork if fork is None else fork,
            ignore_thresh=self.ignore_thresh,
            truth_thresh=self.truth_thresh,
            new_coords=self.new_coords,
            iou_loss=self.iou_loss,
            iou_normalizer=self.iou_normalizer,
            obj_normalizer=self.obj_normalizer,
            cls_normalizer=self.cls_normalizer,
            max_delta=self.max_delta,
            iou_thresh=self.iou_thresh,
            iou_thresh_kind=self.iou_thresh_kind,
            label_smooth_eps=self.label_smooth_eps,
            objectness_smooth=self.objectness_smooth,
            class_multipliers=self.class_multipliers,
        )

    def collect(self, values):
        """The cost and statistics the backend's yolo_loss left in scalars."""
        plain = self.fork and not getattr(self, "show_details", 1)
        self.cost = float(values[SCALARS.index("loss")] if plain else values[0])
        self.stats = loss_stats(self.loss_spec, values)
        keep_report(self, self.stats_report())

    def stats_report(self):
        """The line Darknet prints per yolo layer and step: the original's statistics, or
        the fork's loss summary (which names every loss that is not mse or giou "iou")."""
        st = self.stats
        if self.fork:
            kind = self.iou_loss if self.iou_loss in ("mse", "giou") else "iou"
            return (
                f"v3 ({kind} loss, Normalizer: (iou: {self.iou_normalizer:.2f}, obj: "
                f"{self.obj_normalizer:.2f}, cls: {self.cls_normalizer:.2f}) Region "
                f"{self.index} Avg (IOU: {st['avg_iou']:f}), count: {st['count']}, "
                f"class_loss = {st['class_loss']:f}, iou_loss = {st['iou_loss']:f}, "
                f"total_loss = {st['total_loss']:f} "
            )
        return (
            f"Region {self.index} Avg IOU: {st['avg_iou']:f}, Class: {st['class']:f}, "
            f"Obj: {st['obj']:f}, No Obj: {st['no_obj']:f}, .5R: {st['recall']:f}, "
            f".75R: {st['recall75']:f},  count: {st['count']}"
        )

    def backward(self, net):
        if net.delta is not None:
            net.be.axpy(
                self.gradient_scale(net), self.delta, net.delta[: self.batch * self.outputs]
            )

    def gradient_scale(self, net):
        """What the delta is multiplied by on its way back: the fork's GPU build's
        loss_scale * delta_normalizer (backward_yolo_layer_gpu); 1 elsewhere."""
        if self.darknet != "alexeyab" or self.fork_cpu:
            return 1.0
        scale = getattr(net, "fork_loss_scale", 1.0)
        return float(np.float32(scale) * np.float32(self.delta_normalizer))

    # ---- the loss on host arrays (losses/yolo.py) ------------------------------------------
    def decode(self, tx, ty, tw, th, col, row, anchor_w, anchor_h, netw, neth):
        """get_yolo_box on arrays (broadcasting): boxes (..., 4) float32 relative to the
        network input."""
        return decode(
            tx,
            ty,
            tw,
            th,
            col,
            row,
            anchor_w,
            anchor_h,
            self.w,
            self.h,
            netw,
            neth,
            self.new_coords,
        )

    def loss(self, output, truths, netw, neth):
        """The original Darknet's loss on host arrays: output (batch * outputs) after
        activation, truths a list (per image) of (n, 5) boxes. Returns (delta, cost, stats)
        with delta shaped like output."""
        return self._host_loss(output, truths, self.spec(netw, neth, fork=False))

    def fork_loss(self, output, truths, netw, neth):
        """The fork's loss on host arrays (see loss)."""
        return self._host_loss(output, truths, self.spec(netw, neth, fork=True))

    def _host_loss(self, output, truths, spec):
        for truth in truths:
            check_classes(truth, self.classes, self)
        delta, sums = yolo_loss(spec, output, truths)
        return delta, float(sums[0]), loss_stats(spec, sums)

    def class_multiplier(self, class_id):
        return F32(1) if self.class_multipliers is None else self.class_multipliers[class_id]

    def detections(self, output, img_w, img_h, netw, neth, thresh, relative=True, letter=True):
        """Darknet's get_yolo_detections for image 0 of a [yolo] layer's (host) output: one
        detection per anchor and cell whose objectness is above thresh, cells in row-major
        order, anchors inner."""
        wh = self.w * self.h
        out = np.asarray(output, dtype=F32).reshape(-1)[: self.outputs]
        out = out.reshape(self.n, 5 + self.classes, wh).transpose(2, 0, 1)  # (cell, anchor, entry)
        obj = out[:, :, 4]
        cell, anchor = np.nonzero(obj > F32(thresh))
        col = (cell % self.w).astype(F32)
        row = (cell // self.w).astype(F32)
        e = out[cell, anchor]
        biases = self.biases.reshape(-1, 2)[np.asarray(self.mask, dtype=np.int64)[anchor]]
        boxes = self.decode(
            e[:, 0], e[:, 1], e[:, 2], e[:, 3], col, row, biases[:, 0], biases[:, 1], netw, neth
        ).reshape(-1, 4)
        objectness = e[:, 4]
        probs = thresholded(objectness[:, None] * e[:, 5:], thresh)
        boxes = correct_yolo_boxes(boxes, img_w, img_h, netw, neth, relative, letter)
        return make_detections(boxes, objectness, probs, self.index)
