"""[yolo]: YOLOv3's detection head (Darknet's yolo_layer.c).

The output keeps the input's image shape: per image, `n` anchor blocks of
(4 + 1 + classes) planes of w*h: x, y, w, h, objectness, classes. Forward applies the
logistic to x, y, objectness and classes. In training the loss is computed on the host
exactly as forward_yolo_layer does (as Darknet's GPU build also does) and the delta is
written back to the device; backward adds that delta to the previous layer's.
"""
import numpy as np

from ..boxes import box_iou, box_iou_matrix, correct_yolo_boxes, make_detections, thresholded
from .base import Layer, refuse_options
from .heads import check_classes, parse_anchors, ratio, report, truth_boxes

F32 = np.float32


class YoloLayer(Layer):
    type = "yolo"
    short = "yolo"

    def parse(self, s, ctx):
        self.classes = s.get_int("classes", 20)
        self.total = s.get_int("num", 1)
        mask = s.get_int_list("mask", None)
        self.mask = list(mask) if mask else list(range(self.total))
        self.n = len(self.mask)
        self.max_boxes = s.get_int("max", 90)
        self.jitter = s.get_float("jitter", 0.2)
        self.ignore_thresh = s.get_float("ignore_thresh", 0.5)
        self.truth_thresh = s.get_float("truth_thresh", 1.0)
        self.random = s.get_int("random", 0)
        refuse_options(s, "map")
        if self.classes < 1:
            raise s.error("must be at least 1", "classes")
        if self.total < 1:
            raise s.error("must be at least 1", "num")
        for m in self.mask:
            if not 0 <= m < self.total:
                raise s.error(f"anchor {m} does not exist: num={self.total} anchors are "
                              f"numbered 0..{self.total - 1}", "mask")
        self.biases = parse_anchors(s, 2 * self.total)
        per_anchor = 4 + 1 + self.classes
        self.out_c = self.n * per_anchor
        self.out_h, self.out_w = self.h, self.w
        self.outputs = self.out_c * self.out_h * self.out_w
        if self.outputs != self.inputs:
            raise s.error(f"the layer before [yolo] gives {self.c} channels but {self.n} "
                          f"masked anchors x (4 + 1 + {self.classes} classes) need "
                          f"{self.out_c}: set its filters={self.out_c}", "classes")
        self.stats = {}
        self.stats_line = ""

    def describe(self):
        return ""

    # ---- computation --------------------------------------------------------------
    def forward(self, net):
        be = net.be
        be.copy(net.input[:self.batch * self.outputs], self.output)
        wh = self.w * self.h
        rows, stride = self.batch * self.n, (5 + self.classes) * wh
        be.activate_strided(self.output, rows, stride, 0, 2 * wh, "logistic")
        be.activate_strided(self.output, rows, stride, 4 * wh, (1 + self.classes) * wh,
                            "logistic")
        self.cost = None
        if net.train and net.truth is not None:
            delta, self.cost, self.stats = self.loss(
                be.to_host(self.output), truth_boxes(net, self.batch, self.max_boxes),
                net.input_shape[2], net.input_shape[1])
            be.write(self.delta, delta)
            report(net, self, f"Region {self.index} Avg IOU: {self.stats['avg_iou']:f}, "
                              f"Class: {self.stats['class']:f}, Obj: {self.stats['obj']:f}, "
                              f"No Obj: {self.stats['no_obj']:f}, .5R: {self.stats['recall']:f}, "
                              f".75R: {self.stats['recall75']:f},  count: {self.stats['count']}")

    def backward(self, net):
        if net.delta is not None:
            net.be.axpy(1.0, self.delta, net.delta[:self.batch * self.outputs])

    # ---- the loss (forward_yolo_layer) ------------------------------------------------
    def pred_boxes(self, out, netw, neth):
        """get_yolo_box for every anchor and cell of one image: (n, h, w, 4) float32."""
        j, i = np.meshgrid(np.arange(self.h, dtype=F32), np.arange(self.w, dtype=F32),
                           indexing="ij")
        anchors = self.biases.reshape(-1, 2)[self.mask]
        bw = np.exp(out[:, 2].astype(np.float64)) * anchors[:, 0, None, None] / netw
        bh = np.exp(out[:, 3].astype(np.float64)) * anchors[:, 1, None, None] / neth
        return np.stack([(i + out[:, 0]) / F32(self.w), (j + out[:, 1]) / F32(self.h),
                         bw.astype(F32), bh.astype(F32)], axis=-1)

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

    def loss(self, output, truths, netw, neth):
        """Darknet's forward_yolo_layer training part on host arrays: output (batch * outputs)
        after activation, truths a list (per image) of (n, 5) boxes. Returns (delta, cost,
        stats) with delta shaped like output."""
        B, n, C, h, w = self.batch, self.n, self.classes, self.h, self.w
        out = np.asarray(output, dtype=F32).reshape(-1)[:B * self.outputs].reshape(
            B, n, 5 + C, h, w)
        delta = np.zeros_like(out)
        anchors_all = self.biases.reshape(-1, 2)
        # Every anchor as a box at the origin, for matching truths by shape alone.
        anchor_shapes = np.zeros((self.total, 4), dtype=F32)
        anchor_shapes[:, 2] = anchors_all[:, 0] / F32(netw)
        anchor_shapes[:, 3] = anchors_all[:, 1] / F32(neth)
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
        boxes = np.stack([(col + e[:, 0]) / F32(self.w), (row + e[:, 1]) / F32(self.h),
                          (np.exp(e[:, 2].astype(np.float64)) * biases[:, 0] / netw).astype(F32),
                          (np.exp(e[:, 3].astype(np.float64)) * biases[:, 1] / neth).astype(F32)],
                         axis=1).reshape(-1, 4)
        objectness = e[:, 4]
        probs = thresholded(objectness[:, None] * e[:, 5:], thresh)
        boxes = correct_yolo_boxes(boxes, img_w, img_h, netw, neth, relative, letter)
        return make_detections(boxes, objectness, probs, self.index)
