"""[region]: YOLOv2's detection head (Darknet's region_layer.c).

Image-shaped output: per image, `n` anchor blocks of (coords + 1 + classes) planes of
w*h. Forward applies the logistic to x, y and objectness, and a softmax over the classes
of each anchor and cell (logistic instead with softmax=0). In training the loss is
computed on the host as forward_region_layer does; backward is Darknet's GPU one
(backward_region_layer_gpu): the delta times the logistic gradient on x, y and
objectness, added to the previous layer's. (Darknet's CPU backward_region_layer is
commented out and passes nothing back; the GPU build is the one that trains.)
"""
import numpy as np

from ..boxes import box_iou, box_iou_matrix, correct_region_boxes, make_detections, thresholded
from .base import Layer, refuse_options
from .heads import check_classes, parse_anchors, ratio, report, truth_boxes

F32 = np.float32
REGION_TRUTHS = 30        # forward_region_layer reads at most 30 boxes per image
PRIOR_SEEN = 12800        # images seen before which boxes are pulled towards their anchors


class RegionLayer(Layer):
    type = "region"
    capturable = False   # its loss runs on the host (for now)
    short = "detection"   # what Darknet's layer table prints for [region]

    def parse(self, s, ctx):
        self.coords = s.get_int("coords", 4)
        self.classes = s.get_int("classes", 20)
        self.n = s.get_int("num", 1)
        self.log = s.get_int("log", 0)            # read by Darknet, used nowhere
        self.sqrt = s.get_int("sqrt", 0)          # read by Darknet, used nowhere
        self.softmax = s.get_int("softmax", 0)
        self.max_boxes = s.get_int("max", 30)     # the data loader's box count
        self.jitter = s.get_float("jitter", 0.2)
        self.rescore = s.get_int("rescore", 0)
        self.thresh = s.get_float("thresh", 0.5)
        self.classfix = s.get_int("classfix", 0)  # read by Darknet, used nowhere
        self.absolute = s.get_int("absolute", 0)  # read by Darknet, used nowhere
        self.random = s.get_int("random", 0)
        self.coord_scale = s.get_float("coord_scale", 1.0)
        self.object_scale = s.get_float("object_scale", 1.0)
        self.noobject_scale = s.get_float("noobject_scale", 1.0)
        self.mask_scale = s.get_float("mask_scale", 1.0)
        self.class_scale = s.get_float("class_scale", 1.0)
        self.bias_match = s.get_int("bias_match", 0)
        refuse_options(s, "background", "tree", "map")
        if self.coords != 4:
            raise s.error("only coords=4 is supported (x, y, w, h)", "coords")
        if self.classes < 1:
            raise s.error("must be at least 1", "classes")
        if self.n < 1:
            raise s.error("must be at least 1", "num")
        self.biases = parse_anchors(s, 2 * self.n)
        self.size = self.coords + 1 + self.classes
        self.out_c = self.n * self.size
        self.out_h, self.out_w = self.h, self.w
        self.outputs = self.out_c * self.out_h * self.out_w
        if self.outputs != self.inputs:
            raise s.error(f"the layer before [region] gives {self.c} channels but num={self.n} "
                          f"anchors x ({self.coords} + 1 + {self.classes} classes) need "
                          f"{self.out_c}: set its filters={self.out_c}", "classes")
        self.stats = {}
        self.stats_line = ""

    def describe(self):
        return ""

    # ---- computation --------------------------------------------------------------
    def forward(self, net):
        be = net.be
        wh = self.w * self.h
        be.copy(net.input[:self.batch * self.outputs], self.output)
        rows, stride = self.batch * self.n, self.size * wh
        be.activate_strided(self.output, rows, stride, 0, 2 * wh, "logistic")
        be.activate_strided(self.output, rows, stride, self.coords * wh, wh, "logistic")
        first_class = (self.coords + 1) * wh
        if self.softmax:
            # Darknet's softmax_cpu(input + index, classes, batch*n, inputs/n, w*h, 1, w*h, 1, ...)
            be.softmax(net.input[first_class:], self.classes, rows, self.outputs // self.n, wh,
                       1, wh, 1.0, self.output[first_class:])
        else:
            be.activate_strided(self.output, rows, stride, first_class, self.classes * wh,
                                "logistic")
        self.cost = None
        if net.train and net.truth is not None:
            delta, self.cost, self.stats = self.loss(
                be.to_host(self.output), truth_boxes(net, self.batch, REGION_TRUTHS), net.seen)
            be.write(self.delta, delta)
            report(net, self, f"Region Avg IOU: {self.stats['avg_iou']:f}, "
                              f"Class: {self.stats['class']:f}, Obj: {self.stats['obj']:f}, "
                              f"No Obj: {self.stats['no_obj']:f}, "
                              f"Avg Recall: {self.stats['recall']:f},  "
                              f"count: {self.stats['count']}")

    def backward(self, net):
        be = net.be
        wh = self.w * self.h
        for block in range(self.batch * self.n):
            base = block * self.size * wh
            for start, width in ((0, 2 * wh), (self.coords * wh, wh)):
                lo, hi = base + start, base + start + width
                be.gradient(self.output[lo:hi], "logistic", self.delta[lo:hi])
        if net.delta is not None:
            be.axpy(1.0, self.delta, net.delta[:self.batch * self.outputs])

    # ---- the loss (forward_region_layer) ----------------------------------------------
    def pred_boxes(self, out):
        """get_region_box for every anchor and cell of one image: (n, h, w, 4) float32."""
        j, i = np.meshgrid(np.arange(self.h, dtype=F32), np.arange(self.w, dtype=F32),
                           indexing="ij")
        anchors = self.biases.reshape(-1, 2)
        bw = np.exp(out[:, 2].astype(np.float64)) * anchors[:, 0, None, None] / self.w
        bh = np.exp(out[:, 3].astype(np.float64)) * anchors[:, 1, None, None] / self.h
        return np.stack([(i + out[:, 0]) / F32(self.w), (j + out[:, 1]) / F32(self.h),
                         bw.astype(F32), bh.astype(F32)], axis=-1)

    def box_delta(self, truth, out, delta, a, j, i, scale):
        """delta_region_box for a truth (x, y, w, h) at anchor a of cell (j, i); returns the
        IoU of the predicted box with it."""
        tx = truth[0] * F32(self.w) - F32(i)
        ty = truth[1] * F32(self.h) - F32(j)
        tw = F32(np.log(np.float64(truth[2] * F32(self.w) / self.biases[2 * a])))
        th = F32(np.log(np.float64(truth[3] * F32(self.h) / self.biases[2 * a + 1])))
        for k, t in enumerate((tx, ty, tw, th)):
            delta[a, k, j, i] = F32(scale) * (t - out[a, k, j, i])

    def class_delta(self, out, delta, a, j, i, class_id):
        """delta_region_class without a tree. With softmax=0 (Darknet's tag), a class-0
        delta already set by an earlier truth means only class_id's delta is set (and the
        class statistic is not counted). Returns what Darknet adds to avg_cat."""
        c0 = self.coords + 1
        scale = F32(self.class_scale)
        if delta[a, c0, j, i] and not self.softmax:
            delta[a, c0 + class_id, j, i] = scale * (F32(1) - out[a, c0 + class_id, j, i])
            return 0.0
        onehot = np.zeros(self.classes, dtype=F32)
        onehot[class_id] = 1
        delta[a, c0:c0 + self.classes, j, i] = scale * (onehot - out[a, c0:c0 + self.classes, j, i])
        return float(out[a, c0 + class_id, j, i])

    def loss(self, output, truths, seen):
        """Darknet's forward_region_layer training part on host arrays: output (batch *
        outputs) after activation, truths per image as (n, 5) boxes, seen = images seen
        (this batch included). Returns (delta, cost, stats)."""
        B, n, h, w = self.batch, self.n, self.h, self.w
        obj_entry = self.coords
        out = np.asarray(output, dtype=F32).reshape(-1)[:B * self.outputs].reshape(
            B, n, self.size, h, w)
        delta = np.zeros_like(out)
        anchors = self.biases.reshape(-1, 2)
        avg_iou = recall = avg_cat = avg_obj = avg_anyobj = 0.0
        count = 0
        jj, ii = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
        for b in range(B):
            o, d, truth = out[b], delta[b], truths[b]
            check_classes(truth, self.classes, self)
            pred = self.pred_boxes(o)
            obj = o[:, obj_entry]
            avg_anyobj += float(obj.sum(dtype=np.float64))
            d[:, obj_entry] = F32(self.noobject_scale) * (F32(0) - obj)
            if len(truth):
                iou = box_iou_matrix(pred.reshape(-1, 4), truth[:, :4]).reshape(n, h, w, -1)
                iou[np.isnan(iou)] = 0
                best_iou = np.max(iou, axis=-1)
                d[:, obj_entry][best_iou > self.thresh] = 0
            if seen < PRIOR_SEEN:
                # Pull every box towards its anchor at the cell centre, with scale .01.
                prior_x = ((ii + F32(.5)) / F32(w)).astype(F32)
                prior_y = ((jj + F32(.5)) / F32(h)).astype(F32)
                for a in range(n):
                    pw, ph = anchors[a, 0] / F32(w), anchors[a, 1] / F32(h)
                    tx = prior_x * F32(w) - ii.astype(F32)
                    ty = prior_y * F32(h) - jj.astype(F32)
                    tw = F32(np.log(np.float64(pw * F32(w) / anchors[a, 0])))
                    th = F32(np.log(np.float64(ph * F32(h) / anchors[a, 1])))
                    for k, t in enumerate((tx, ty, tw, th)):
                        d[a, k] = F32(.01) * (t - o[a, k])
            for t in truth:
                i = min(int(t[0] * F32(w)), w - 1)  # Darknet truncates; x = 1 would overrun
                j = min(int(t[1] * F32(h)), h - 1)
                shapes = pred[:, j, i].copy()
                if self.bias_match:
                    shapes[:, 2] = anchors[:, 0] / F32(w)
                    shapes[:, 3] = anchors[:, 1] / F32(h)
                shapes[:, :2] = 0
                shape_iou = box_iou(shapes, np.array([0, 0, t[2], t[3]], dtype=F32))
                shape_iou[np.isnan(shape_iou)] = 0
                a = int(np.argmax(shape_iou))
                self.box_delta(t, o, d, a, j, i, self.coord_scale * (F32(2) - t[2] * t[3]))
                iou = float(box_iou(pred[a, j, i], t[:4]))
                recall += iou > .5
                avg_iou += iou
                p = o[a, obj_entry, j, i]
                avg_obj += float(p)
                target = F32(iou) if self.rescore else F32(1)
                d[a, obj_entry, j, i] = F32(self.object_scale) * (target - p)
                avg_cat += self.class_delta(o, d, a, j, i, int(t[4]))
                count += 1
        cost = float(np.sum(np.square(delta), dtype=np.float64))
        stats = {"avg_iou": ratio(avg_iou, count), "class": ratio(avg_cat, count),
                 "obj": ratio(avg_obj, count), "no_obj": avg_anyobj / (w * h * n * B),
                 "recall": ratio(recall, count), "count": count}
        return delta.reshape(-1), cost, stats

    def detections(self, output, img_w, img_h, netw, neth, thresh, relative=True, letter=True):
        """Darknet's get_region_detections for image 0 of a [region] layer: one detection per
        anchor and cell (anchor-major, as Darknet indexes them), objectness 0 where it is not
        above thresh."""
        wh = self.w * self.h
        size = self.coords + self.classes + 1
        out = np.asarray(output, dtype=F32).reshape(-1)[:self.outputs].reshape(self.n, size, wh)
        cells = np.arange(wh)
        col = np.tile((cells % self.w).astype(F32), self.n)
        row = np.tile((cells // self.w).astype(F32), self.n)
        e = out.transpose(0, 2, 1).reshape(self.n * wh, size)  # (anchor*cell, entry)
        biases = np.repeat(self.biases.reshape(self.n, 2), wh, axis=0)
        boxes = np.stack([(col + e[:, 0]) / F32(self.w), (row + e[:, 1]) / F32(self.h),
                          (np.exp(e[:, 2].astype(np.float64)) * biases[:, 0] / self.w).astype(F32),
                          (np.exp(e[:, 3].astype(np.float64)) * biases[:, 1] / self.h).astype(F32)],
                         axis=1)
        scale = e[:, self.coords]
        objectness = np.where(scale > F32(thresh), scale, F32(0)).astype(F32)
        # Where scale <= thresh every scale * p (p <= 1) is too, so those rows are all 0.
        probs = thresholded(scale[:, None] * e[:, self.coords + 1:], thresh)
        boxes = correct_region_boxes(boxes, img_w, img_h, netw, neth, relative, letter)
        return make_detections(boxes, objectness, probs, self.index)
