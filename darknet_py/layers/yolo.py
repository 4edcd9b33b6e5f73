"""[yolo]: YOLOv3's detection head (Darknet's yolo_layer.c), with the AlexeyAB fork's options.

The output keeps the input's image shape: per image, `n` anchor blocks of
(4 + 1 + classes) planes of w*h: x, y, w, h, objectness, classes. Forward applies the
logistic to x, y, objectness and classes (none of it with the fork's new_coords=1, whose
convolution is expected to end in a logistic), then the fork's scale_x_y affine on x and y.
In training the loss is computed on the host exactly as forward_yolo_layer does (as
Darknet's GPU build also does) and the delta is written back to the device; backward
adds that delta to the previous layer's.

Two losses: the original Darknet's (`loss`) and the fork's (`fork_loss`: iou_loss,
normalizers, label smoothing, iou_thresh, ...). The fork's is used when the network is
the fork's flavour or the section sets any option only the fork knows.
"""
import numpy as np

from ..boxes import (IOU_KINDS, NMS_KINDS, box_giou, box_iou, box_iou_kind, box_iou_matrix,
                     correct_yolo_boxes, dx_box_iou, fork_iou, make_detections, thresholded)
from .base import Layer, refuse_options
from .heads import check_classes, is_fork_flavour, parse_anchors, ratio, report, truth_boxes

F32 = np.float32
IOU_LOSSES = ("mse",) + IOU_KINDS
# Options only the AlexeyAB fork reads: any of them switches the layer to the fork's loss.
FORK_OPTIONS = ("scale_x_y", "new_coords", "iou_loss", "iou_normalizer", "obj_normalizer",
                "cls_normalizer", "max_delta", "iou_thresh", "iou_thresh_kind", "beta_nms",
                "nms_kind", "label_smooth_eps", "objectness_smooth", "counters_per_class",
                "resize")
FLT_MAX = float(np.finfo(np.float32).max)


class YoloLayer(Layer):
    type = "yolo"
    capturable = False   # its loss runs on the host (for now)
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
            s.warn(f"mask uses anchor {max(self.mask)} but num={self.total}; taking "
                   f"num={listed}, the anchors listed", "num")
            self.total = listed
        for m in self.mask:
            if not 0 <= m < self.total:
                raise s.error(f"anchor {m} does not exist: num={self.total} anchors are "
                              f"numbered 0..{self.total - 1}", "mask")
        self.biases = parse_anchors(s, 2 * self.total)
        self.entries = entries
        self.out_c = self.n * entries
        self.out_h, self.out_w = self.h, self.w
        self.outputs = self.out_c * self.out_h * self.out_w
        if self.outputs != self.inputs:
            box = entries - 1 - self.classes
            raise s.error(f"the layer before [{self.short}] gives {self.c} channels but "
                          f"{self.n} masked anchors x ({box} + 1 + {self.classes} classes) "
                          f"need {self.out_c}: set its filters={self.out_c}", "classes")

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
        counters = s.get_int_list("counters_per_class", None)
        self.class_multipliers = None
        if counters is not None:
            if len(counters) != self.classes:
                raise s.error(f"{len(counters)} counts given for classes={self.classes}",
                              "counters_per_class")
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
        be.copy(net.input[:self.batch * self.outputs], self.output)
        wh = self.w * self.h
        rows, stride = self.batch * self.n, (5 + self.classes) * wh
        if not self.new_coords:
            be.activate_strided(self.output, rows, stride, 0, 2 * wh, "logistic")
            be.activate_strided(self.output, rows, stride, 4 * wh, (1 + self.classes) * wh,
                                "logistic")
        if self.scale_x_y != 1:
            # The fork passes the offset as a float computed in double.
            be.scale_add_strided(self.output, rows, stride, 0, 2 * wh, F32(self.scale_x_y),
                                 F32(-0.5 * (self.scale_x_y - 1)))
        self.cost = None
        if net.train and net.truth is not None:
            truths = truth_boxes(net, self.batch, self.max_boxes)
            netw, neth = net.input_shape[2], net.input_shape[1]
            output = be.to_host(self.output)
            if self.fork:
                delta, self.cost, self.stats = self.fork_loss(output, truths, netw, neth)
            else:
                delta, self.cost, self.stats = self.loss(output, truths, netw, neth)
            be.write(self.delta, delta)
            report(net, self, self.stats_report())

    def stats_report(self):
        """The line Darknet prints per yolo layer and step: the original's statistics, or
        the fork's loss summary (which names every loss that is not mse or giou "iou")."""
        st = self.stats
        if self.fork:
            kind = self.iou_loss if self.iou_loss in ("mse", "giou") else "iou"
            return (f"v3 ({kind} loss, Normalizer: (iou: {self.iou_normalizer:.2f}, obj: "
                    f"{self.obj_normalizer:.2f}, cls: {self.cls_normalizer:.2f}) Region "
                    f"{self.index} Avg (IOU: {st['avg_iou']:f}), count: {st['count']}, "
                    f"class_loss = {st['class_loss']:f}, iou_loss = {st['iou_loss']:f}, "
                    f"total_loss = {st['total_loss']:f} ")
        return (f"Region {self.index} Avg IOU: {st['avg_iou']:f}, Class: {st['class']:f}, "
                f"Obj: {st['obj']:f}, No Obj: {st['no_obj']:f}, .5R: {st['recall']:f}, "
                f".75R: {st['recall75']:f},  count: {st['count']}")

    def backward(self, net):
        if net.delta is not None:
            net.be.axpy(1.0, self.delta, net.delta[:self.batch * self.outputs])

    # ---- the loss (forward_yolo_layer) ------------------------------------------------
    def decode(self, tx, ty, tw, th, col, row, anchor_w, anchor_h, netw, neth):
        """get_yolo_box on arrays (broadcasting): boxes (..., 4) float32 relative to the
        network input. Sizes are exp(t)*anchor, or with new_coords (2t)²*anchor."""
        x = (col + tx) / F32(self.w)
        y = (row + ty) / F32(self.h)
        if self.new_coords:
            bw = tw * tw * F32(4) * anchor_w / F32(netw)
            bh = th * th * F32(4) * anchor_h / F32(neth)
        else:
            bw = (np.exp(np.asarray(tw, dtype=np.float64)) * anchor_w / netw).astype(F32)
            bh = (np.exp(np.asarray(th, dtype=np.float64)) * anchor_h / neth).astype(F32)
        return np.stack(np.broadcast_arrays(x, y, bw, bh), axis=-1).astype(F32)

    def pred_boxes(self, out, netw, neth):
        """get_yolo_box for every anchor and cell of one image: (n, h, w, 4) float32."""
        j, i = np.meshgrid(np.arange(self.h, dtype=F32), np.arange(self.w, dtype=F32),
                           indexing="ij")
        anchors = self.biases.reshape(-1, 2)[self.mask]
        return self.decode(out[:, 0], out[:, 1], out[:, 2], out[:, 3], i, j,
                           anchors[:, 0, None, None], anchors[:, 1, None, None], netw, neth)

    def box_delta(self, truth, out, delta, anchor, a, j, i, netw, neth, pred):
        """delta_yolo_box: Darknet's box delta for truth at anchor slot a of cell (j, i),
        scaled by 2 - w*h; `anchor` indexes the biases. Returns the IoU of pred and truth."""
        scale = F32(2) - truth[2] * truth[3]
        tx = truth[0] * F32(self.w) - F32(i)
        ty = truth[1] * F32(self.h) - F32(j)
        tw = F32(np.log(np.float64(truth[2] * F32(netw) / self.biases[2 * anchor])))
        th = F32(np.log(np.float64(truth[3] * F32(neth) / self.biases[2 * anchor + 1])))
        for k, t in enumerate((tx, ty, tw, th)):
            delta[a, k, j, i] = scale * (t - out[a, k, j, i])
        return float(box_iou(pred, truth[:4]))

    @staticmethod
    def class_delta(out, delta, a, j, i, class_id, classes):
        """delta_yolo_class, quirk included: when class 0's delta is already set (by an
        earlier truth in the same cell and anchor), only class_id's delta is set.
        Returns the predicted probability of class_id (what Darknet adds to avg_cat)."""
        c0 = 5
        if delta[a, c0, j, i]:
            delta[a, c0 + class_id, j, i] = F32(1) - out[a, c0 + class_id, j, i]
        else:
            onehot = np.zeros(classes, dtype=F32)
            if 0 <= class_id < classes:
                onehot[class_id] = 1
            delta[a, c0:c0 + classes, j, i] = onehot - out[a, c0:c0 + classes, j, i]
        return float(out[a, c0 + class_id, j, i])

    def _loss_arrays(self, output, netw, neth):
        """What both losses start from: the output as (batch, n, 5 + classes, h, w), a
        zero delta shaped like it, and every anchor as a box at the origin (total, 4) for
        matching truths by shape alone."""
        out = np.asarray(output, dtype=F32).reshape(-1)[:self.batch * self.outputs].reshape(
            self.batch, self.n, 5 + self.classes, self.h, self.w)
        anchors = self.biases.reshape(-1, 2)
        anchor_shapes = np.zeros((self.total, 4), dtype=F32)
        anchor_shapes[:, 2] = anchors[:, 0] / F32(netw)
        anchor_shapes[:, 3] = anchors[:, 1] / F32(neth)
        return out, np.zeros_like(out), anchor_shapes

    def loss(self, output, truths, netw, neth):
        """Darknet's forward_yolo_layer training part on host arrays: output (batch * outputs)
        after activation, truths a list (per image) of (n, 5) boxes. Returns (delta, cost,
        stats) with delta shaped like output."""
        B, n, C, h, w = self.batch, self.n, self.classes, self.h, self.w
        out, delta, anchor_shapes = self._loss_arrays(output, netw, neth)
        mask = np.asarray(self.mask)
        avg_iou = recall = recall75 = avg_cat = avg_obj = avg_anyobj = 0.0
        count = 0
        for b in range(B):
            o, d, truth = out[b], delta[b], truths[b]
            check_classes(truth, C, self)
            pred = self.pred_boxes(o, netw, neth)  # (n, h, w, 4)
            obj = o[:, 4]
            avg_anyobj += float(obj.sum(dtype=np.float64))
            d[:, 4] = F32(0) - obj
            if len(truth):
                iou = box_iou_matrix(pred.reshape(-1, 4), truth[:, :4]).reshape(n, h, w, -1)
                iou[np.isnan(iou)] = 0  # a NaN IoU never passes Darknet's `iou > best_iou`
                # Darknet keeps the first best (strict >, from 0): argmax where max > 0.
                best_iou = np.max(iou, axis=-1, initial=F32(0))
                best_t = np.argmax(iou, axis=-1)
                d[:, 4][best_iou > self.ignore_thresh] = 0
                for a, j, i in zip(*np.nonzero(best_iou > self.truth_thresh)):
                    t = truth[best_t[a, j, i]]
                    d[a, 4, j, i] = F32(1) - obj[a, j, i]
                    self.class_delta(o, d, a, j, i, int(t[4]), C)
                    self.box_delta(t, o, d, mask[a], a, j, i, netw, neth, pred[a, j, i])
            for t in truth:
                i = min(int(t[0] * F32(w)), w - 1)  # Darknet truncates; x = 1 would overrun
                j = min(int(t[1] * F32(h)), h - 1)
                shape_iou = box_iou(anchor_shapes, np.array([0, 0, t[2], t[3]], dtype=F32))
                shape_iou[np.isnan(shape_iou)] = 0
                best_n = int(np.argmax(shape_iou))
                if best_n not in self.mask:
                    continue
                a = self.mask.index(best_n)
                iou = self.box_delta(t, o, d, best_n, a, j, i, netw, neth, pred[a, j, i])
                avg_obj += float(o[a, 4, j, i])
                d[a, 4, j, i] = F32(1) - o[a, 4, j, i]
                avg_cat += self.class_delta(o, d, a, j, i, int(t[4]), C)
                count += 1
                recall += iou > .5
                recall75 += iou > .75
                avg_iou += iou
        cost = float(np.sum(np.square(delta), dtype=np.float64))
        stats = {"avg_iou": ratio(avg_iou, count), "class": ratio(avg_cat, count),
                 "obj": ratio(avg_obj, count), "no_obj": avg_anyobj / (w * h * n * B),
                 "recall": ratio(recall, count), "recall75": ratio(recall75, count),
                 "count": count}
        return delta.reshape(-1), cost, stats

    # ---- the fork's loss (its forward_yolo_layer and process_batch) ---------------------
    def fork_box_delta(self, truth, out, delta, anchor, a, j, i, netw, neth, iou_normalizer):
        """The fork's delta_yolo_box with accumulate=1: add the box delta of truth at anchor
        slot a of cell (j, i) (`anchor` indexes the biases): mse's scaled coordinate
        differences, or the gradient of the iou_loss. Returns (iou, giou) of the
        prediction with the truth."""
        aw, ah = self.biases[2 * anchor], self.biases[2 * anchor + 1]
        pred = self.decode(*out[a, :4, j, i], F32(i), F32(j), aw, ah, netw, neth)
        t = truth[:4]
        iou, giou = float(fork_iou(pred, t)), float(box_giou(pred, t))
        if self.iou_loss == "mse":
            scale = F32(2) - truth[2] * truth[3]
            target = [truth[0] * F32(self.w) - F32(i), truth[1] * F32(self.h) - F32(j)]
            if self.new_coords:
                target += [F32(np.sqrt(np.float64(truth[2] * F32(netw) / (F32(4) * aw)))),
                           F32(np.sqrt(np.float64(truth[3] * F32(neth) / (F32(4) * ah))))]
            else:
                target += [F32(np.log(np.float64(truth[2] * F32(netw) / aw))),
                           F32(np.log(np.float64(truth[3] * F32(neth) / ah)))]
            for k in range(4):
                delta[a, k, j, i] += scale * (target[k] - out[a, k, j, i]) * F32(iou_normalizer)
            return iou, giou
        pred = pred.copy()
        pred[2:][pred[2:] == 0] = 1  # the fork's guard against NaN in dx_box_iou
        d = dx_box_iou(pred, t, self.iou_loss)
        if not self.new_coords:
            d[2:] *= np.exp(out[a, 2:4, j, i].astype(np.float64)).astype(F32)
        d *= F32(iou_normalizer)
        d[~np.isfinite(d)] = 0
        if self.max_delta != FLT_MAX:
            d = np.clip(d, -F32(self.max_delta), F32(self.max_delta))
        delta[a, :4, j, i] += d
        return iou, giou

    def fork_class_delta(self, out, delta, a, j, i, class_id):
        """The fork's delta_yolo_class (focal loss aside): targets smoothed by
        label_smooth_eps, the class's delta times its counters_per_class multiplier (and
        cls_normalizer when a fresh one-hot is written). When class_id's delta is already
        set (an earlier truth in the same cell and anchor) only it is rewritten.
        Returns the predicted probability of class_id."""
        c0, eps, mult = 5, self.label_smooth_eps, self.class_multipliers

        def target(y):
            return F32(y * (1 - eps) + 0.5 * eps) if eps else F32(y)

        p = out[a, c0:c0 + self.classes, j, i]
        d = delta[a, c0:c0 + self.classes, j, i]
        if d[class_id]:
            r = target(1) - p[class_id]
            if np.isfinite(r):
                d[class_id] = r
            if mult is not None:
                d[class_id] *= mult[class_id]
        else:
            for c in range(self.classes):
                r = target(1 if c == class_id else 0) - p[c]
                if np.isfinite(r):
                    d[c] = r
            if mult is not None:
                d[class_id] *= mult[class_id] * F32(self.cls_normalizer)
        delta[a, c0:c0 + self.classes, j, i] = d
        return float(p[class_id])

    def fork_loss(self, output, truths, netw, neth):
        """The fork's forward_yolo_layer training part on host arrays (see loss for the
        arguments). Returns (delta, cost, stats); cost is the fork's: with an IoU loss
        iou_normalizer * mean(1 - IoU) (GIoU for giou) + obj_normalizer * Σ delta² over
        every entry but the box's, else Σ delta²."""
        B, n, C, h, w = self.batch, self.n, self.classes, self.h, self.w
        out, delta, anchor_shapes = self._loss_arrays(output, netw, neth)
        obj_norm = F32(self.obj_normalizer)
        tot = dict(iou=0.0, iou_loss=0.0, giou_loss=0.0, cat=0.0, obj=0.0, anyobj=0.0,
                   recall=0, recall75=0, count=0)
        for b in range(B):
            o, d, truth = out[b], delta[b], truths[b]
            check_classes(truth, C, self)
            pred = self.pred_boxes(o, netw, neth)
            obj = o[:, 4]
            tot["anyobj"] += float(obj.sum(dtype=np.float64))
            d[:, 4] = obj_norm * (F32(0) - obj)
            if len(truth):
                iou = np.nan_to_num(box_iou_matrix(pred.reshape(-1, 4), truth[:, :4]),
                                    nan=0.0).reshape(n, h, w, -1)
                best_iou = np.max(iou, axis=-1, initial=F32(0))
                best_t = np.argmax(iou, axis=-1)
                # A prediction near a truth is not punished for its objectness when it
                # also names some class with probability above .25.
                named = (o[:, 5:] > F32(0.25)).any(axis=1)
                best_match = np.where(named, best_iou, F32(0))
                near = best_match > self.ignore_thresh
                if self.objectness_smooth:
                    d[:, 4] = np.where(near, np.maximum(d[:, 4], obj_norm * (best_match - obj)),
                                       d[:, 4])
                else:
                    d[:, 4][near] = 0
                for a, j, i in zip(*np.nonzero(best_iou > self.truth_thresh)):
                    t = truth[best_t[a, j, i]]
                    class_id = int(t[4])
                    if self.objectness_smooth:
                        d[a, 4, j, i] = obj_norm * (best_iou[a, j, i] ** 2 - obj[a, j, i])
                    else:
                        d[a, 4, j, i] = obj_norm * (F32(1) - obj[a, j, i])
                    self.fork_class_delta(o, d, a, j, i, class_id)
                    mult = self.class_multiplier(class_id)
                    if self.objectness_smooth:
                        d[a, 5 + class_id, j, i] = mult * (best_iou[a, j, i] ** 2
                                                           - o[a, 5 + class_id, j, i])
                    self.fork_box_delta(t, o, d, self.mask[a], a, j, i, netw, neth,
                                        F32(self.iou_normalizer) * mult)
            for t in truth:
                i = min(int(t[0] * F32(w)), w - 1)  # x = 1 would overrun the grid
                j = min(int(t[1] * F32(h)), h - 1)
                shape = np.array([0, 0, t[2], t[3]], dtype=F32)
                shape_iou = fork_iou(anchor_shapes, shape)
                best_n = int(np.argmax(shape_iou)) if shape_iou.max() > 0 else 0
                assigned = [best_n] if best_n in self.mask else []
                if self.iou_thresh < 1:
                    kind_iou = box_iou_kind(anchor_shapes, shape, self.iou_thresh_kind)
                    assigned += [k for k in range(self.total) if k in self.mask and
                                 k != best_n and kind_iou[k] > self.iou_thresh]
                for anchor in assigned:
                    self._fork_assign(t, o, d, anchor, j, i, netw, neth, tot)
            if self.iou_thresh < 1:
                # Average the accumulated box deltas over the classes the slot was told.
                told = (d[:, 5:] > 0).sum(axis=1)
                spread = (d[:, 4] != 0) & (told > 0)
                d[:, :4] = np.where(spread[:, None], d[:, :4] / np.maximum(told, 1)[:, None],
                                    d[:, :4])
        count = max(tot["count"], 1)
        box_free = delta.copy()
        box_free[:, :, :4] = 0
        class_loss = float(obj_norm) * float(np.sum(np.square(box_free, dtype=np.float64)))
        loss = float(np.sum(np.square(delta, dtype=np.float64)))
        if self.iou_loss == "mse":
            cost = loss
        else:
            lost = tot["giou_loss"] if self.iou_loss == "giou" else tot["iou_loss"]
            cost = self.iou_normalizer * lost / count + class_loss
        stats = {"avg_iou": tot["iou"] / count, "count": tot["count"],
                 "class_loss": class_loss / B, "iou_loss": (loss - class_loss) / B,
                 "total_loss": loss / B, "class": ratio(tot["cat"], tot["count"]),
                 "obj": ratio(tot["obj"], tot["count"]),
                 "no_obj": tot["anyobj"] / (w * h * n * B),
                 "recall": ratio(tot["recall"], tot["count"]),
                 "recall75": ratio(tot["recall75"], tot["count"])}
        return delta.reshape(-1), cost, stats

    def class_multiplier(self, class_id):
        return F32(1) if self.class_multipliers is None else self.class_multipliers[class_id]

    def _fork_assign(self, t, o, d, anchor, j, i, netw, neth, tot):
        """Make anchor (an index into the biases, one of the mask) of cell (j, i)
        responsible for truth t: box, objectness and class deltas, and the statistics."""
        a = self.mask.index(anchor)
        class_id = int(t[4])
        mult = self.class_multiplier(class_id)
        iou, giou = self.fork_box_delta(t, o, d, anchor, a, j, i, netw, neth,
                                        F32(self.iou_normalizer) * mult)
        tot["iou"] += iou
        tot["iou_loss"] += 1 - iou
        tot["giou_loss"] += 1 - giou
        obj = o[a, 4, j, i]
        tot["obj"] += float(obj)
        fresh = mult * F32(self.obj_normalizer) * (F32(1) - obj)
        if not self.objectness_smooth or d[a, 4, j, i] == 0:
            d[a, 4, j, i] = fresh
        tot["cat"] += self.fork_class_delta(o, d, a, j, i, class_id)
        tot["count"] += 1
        tot["recall"] += iou > .5
        tot["recall75"] += iou > .75

    def detections(self, output, img_w, img_h, netw, neth, thresh, relative=True, letter=True):
        """Darknet's get_yolo_detections for image 0 of a [yolo] layer's (host) output: one
        detection per anchor and cell whose objectness is above thresh, cells in row-major
        order, anchors inner."""
        wh = self.w * self.h
        out = np.asarray(output, dtype=F32).reshape(-1)[:self.outputs]
        out = out.reshape(self.n, 5 + self.classes, wh).transpose(2, 0, 1)  # (cell, anchor, entry)
        obj = out[:, :, 4]
        cell, anchor = np.nonzero(obj > F32(thresh))
        col = (cell % self.w).astype(F32)
        row = (cell // self.w).astype(F32)
        e = out[cell, anchor]
        biases = self.biases.reshape(-1, 2)[np.asarray(self.mask, dtype=np.int64)[anchor]]
        boxes = self.decode(e[:, 0], e[:, 1], e[:, 2], e[:, 3], col, row, biases[:, 0],
                            biases[:, 1], netw, neth).reshape(-1, 4)
        objectness = e[:, 4]
        probs = thresholded(objectness[:, None] * e[:, 5:], thresh)
        boxes = correct_yolo_boxes(boxes, img_w, img_h, netw, neth, relative, letter)
        return make_detections(boxes, objectness, probs, self.index)
