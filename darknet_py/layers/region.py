"""[region]: YOLOv2's detection head (Darknet's region_layer.c).

Image-shaped output: per image, `n` anchor blocks of (coords + 1 + classes) planes of
w*h. Forward applies the logistic to x, y and objectness, and a softmax over the classes
of each anchor and cell (logistic instead with softmax=0). In training the backend's
region_loss op (losses/region.py, ops/losses/region_loss.cu) computes forward_region_layer's
delta, cost and statistics where the output is; backward is Darknet's GPU one
(backward_region_layer_gpu): the delta times the logistic gradient on x, y and
objectness, added to the previous layer's. (Darknet's CPU backward_region_layer is
commented out and passes nothing back; the GPU build is the one that trains.)

tree= (YOLO9000) takes the softmax over each group of a class hierarchy (tree.py) as
Darknet's GPU build does (its CPU build indexes the old flattened layout and mixes
anchors); the class delta then follows the tree, and decoding picks each box's class by
walking down the tree while the product of probabilities stays above the hierarchy
threshold (get_region_detections). map= (a file of class ids, one a line) maps the truth's
class ids onto the network's, as Darknet's loss does.
"""

import os

import numpy as np

from ..boxes import correct_region_boxes, make_detections, thresholded, truth_table
from ..losses.region import PRIOR_SEEN, REGION_SCALARS, REGION_TRUTHS, RegionClasses, RegionHead
from ..plurals import counted
from ..tree import (
    TreeArrays,
    hierarchy_predictions,
    hierarchy_top_prediction,
    int_array,
    resolve_tree_path,
    tree_option,
)
from .base import Layer, refuse_options
from .heads import check_classes, keep_report, parse_anchors, ratio

F32 = np.float32


class RegionLayer(Layer):
    type = "region"
    short = "detection"  # what Darknet's layer table prints for [region]

    def parse(self, s, ctx):
        self.coords = s.get_int("coords", 4)
        self.classes = s.get_int("classes", 20)
        self.n = s.get_int("num", 1)
        self.log = s.get_int("log", 0)  # read by Darknet, used nowhere
        self.sqrt = s.get_int("sqrt", 0)  # read by Darknet, used nowhere
        self.softmax = s.get_int("softmax", 0)
        self.max_boxes = s.get_int("max", 30)  # the data loader's box count
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
        refuse_options(s, "background")
        self.hierarchy = tree_option(s)
        self.class_map = read_class_map(s)
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
            raise s.error(
                f"the layer before [region] gives {counted(self.c, 'channel')} but "
                f"num={self.n} anchors x ({self.coords} + 1 + "
                f"{counted(self.classes, 'class', 'classes')}) need {self.out_c}: "
                f"set its filters={self.out_c}",
                "classes",
            )
        if self.hierarchy is not None and self.hierarchy.n != self.classes:
            raise s.error(
                f"{self.hierarchy.path} has "
                f"{counted(self.hierarchy.n, 'class', 'classes')} but "
                f"classes={self.classes}",
                "tree",
            )
        if self.class_map is not None and not all(0 <= c < self.classes for c in self.class_map):
            raise s.error(f"the map file holds class ids outside 0..{self.classes - 1}", "map")
        self.stats = {}
        self.stats_line = ""

    def describe(self):
        return ""

    # ---- computation --------------------------------------------------------------
    def forward(self, net):
        be = net.be
        wh = self.w * self.h
        be.copy(net.input[: self.batch * self.outputs], self.output)
        rows, stride = self.batch * self.n, self.size * wh
        be.activate_strided(self.output, rows, stride, 0, 2 * wh, "logistic")
        be.activate_strided(self.output, rows, stride, self.coords * wh, wh, "logistic")
        first_class = (self.coords + 1) * wh
        if self.tree is not None:
            # softmax_tree_gpu(input + index, w*h, batch*n, inputs/n, 1, output + index)
            be.softmax_tree(
                net.input[first_class:],
                wh,
                rows,
                self.outputs // self.n,
                1.0,
                self.tree.offset,
                self.tree.size,
                self.classes,
                self.output[first_class:],
            )
        elif self.softmax:
            # Darknet's softmax_cpu(input + index, classes, batch*n, inputs/n, w*h, 1, w*h, 1, ...)
            be.softmax(
                net.input[first_class:],
                self.classes,
                rows,
                self.outputs // self.n,
                wh,
                1,
                wh,
                1.0,
                self.output[first_class:],
            )
        else:
            be.activate_strided(
                self.output, rows, stride, first_class, self.classes * wh, "logistic"
            )
        self.cost = None
        if net.train and net.truth is not None:
            be.region_loss(
                self.loss_head(),
                self.output,
                net.truth,
                net.truth_size,
                self.anchors,
                net.seen,
                self.delta,
                self.scalars,
                self.classes_arrays,
            )
            self.print_stats = getattr(net, "verbose", False)
            self.pending = True

    def check_truth(self, net, truth_host):
        """Refuse a class id beyond classes. Before PRIOR_SEEN images the loss's pull
        towards the anchors is switched on by a launch argument, which a recorded step
        would keep: those steps run eagerly."""
        # Its own rows: the network checks it before sizing its arrays for them.
        boxes, valid = truth_table(truth_host, len(truth_host), net.truth_size, REGION_TRUTHS)
        boxes = boxes[valid]
        if self.class_map is not None:
            check_classes(boxes, len(self.class_map), self, "map= entries for ")
        else:
            check_classes(boxes, self.classes, self)
        if (
            self.hierarchy is not None
            and len(boxes)
            and ((boxes[:, 0] > 100000) & (boxes[:, 1] > 100000)).any()
        ):
            raise ValueError(
                f"[region] layer {self.index}: truth boxes at x, y > 100000 "
                f"(YOLO9000's class-only images) are not supported"
            )
        self.capturable = net.seen >= PRIOR_SEEN

    def allocate(self, be, batch, train):
        super().allocate(be, batch, train)
        self.anchors = be.from_host(self.biases) if train else None
        self.scalars = be.zeros(len(REGION_SCALARS)) if train else None
        self.tree = TreeArrays(be, self.hierarchy) if self.hierarchy is not None else None
        self.classes_arrays = None
        if train and (self.tree is not None or self.class_map is not None):
            self.classes_arrays = RegionClasses(
                int_array(be, self.class_map) if self.class_map is not None else None, self.tree
            )

    def loss_head(self):
        return RegionHead(
            self.batch,
            self.n,
            self.h,
            self.w,
            self.classes,
            self.softmax,
            self.bias_match,
            self.rescore,
            self.thresh,
            self.coord_scale,
            self.object_scale,
            self.noobject_scale,
            self.class_scale,
        )

    def collect(self, values):
        """The region_loss op's figures: the cost, the statistics and Darknet's line."""
        cost, iou, recall, cat, obj, count, any_obj = (float(v) for v in values)
        count = int(count)
        self.cost = cost
        self.stats = {
            "avg_iou": ratio(iou, count),
            "class": ratio(cat, count),
            "obj": ratio(obj, count),
            "no_obj": any_obj / (self.w * self.h * self.n * self.batch),
            "recall": ratio(recall, count),
            "count": count,
        }
        keep_report(
            self,
            f"Region Avg IOU: {self.stats['avg_iou']:f}, "
            f"Class: {self.stats['class']:f}, Obj: {self.stats['obj']:f}, "
            f"No Obj: {self.stats['no_obj']:f}, "
            f"Avg Recall: {self.stats['recall']:f},  count: {count}",
        )

    def backward(self, net):
        be = net.be
        wh = self.w * self.h
        rows, stride = self.batch * self.n, self.size * wh
        for start, width in ((0, 2 * wh), (self.coords * wh, wh)):  # x, y and objectness
            be.gradient_strided(self.output, rows, stride, start, width, "logistic", self.delta)
        if net.delta is not None:
            be.axpy(1.0, self.delta, net.delta[: self.batch * self.outputs])

    def detections(
        self, output, img_w, img_h, netw, neth, thresh, relative=True, letter=True, hier=0.5
    ):
        """Darknet's get_region_detections for image 0 of a [region] layer: one detection per
        anchor and cell (anchor-major, as Darknet indexes them), objectness 0 where it is not
        above thresh. With a tree, each box gets one class, found by walking down the tree
        while the probability stays above hier, with the objectness as its score."""
        wh = self.w * self.h
        size = self.coords + self.classes + 1
        out = np.asarray(output, dtype=F32).reshape(-1)[: self.outputs].reshape(self.n, size, wh)
        cells = np.arange(wh)
        col = np.tile((cells % self.w).astype(F32), self.n)
        row = np.tile((cells // self.w).astype(F32), self.n)
        e = out.transpose(0, 2, 1).reshape(self.n * wh, size)  # (anchor*cell, entry)
        biases = np.repeat(self.biases.reshape(self.n, 2), wh, axis=0)
        with np.errstate(over="ignore"):  # an infinite box is dropped by get_network_boxes
            boxes = np.stack(
                [
                    (col + e[:, 0]) / F32(self.w),
                    (row + e[:, 1]) / F32(self.h),
                    (np.exp(e[:, 2].astype(np.float64)) * biases[:, 0] / self.w).astype(F32),
                    (np.exp(e[:, 3].astype(np.float64)) * biases[:, 1] / self.h).astype(F32),
                ],
                axis=1,
            )
        scale = e[:, self.coords]
        objectness = np.where(scale > F32(thresh), scale, F32(0)).astype(F32)
        # Where scale <= thresh every scale * p (p <= 1) is too, so those rows are all 0.
        if self.hierarchy is not None:
            probs = self._tree_probs(e[:, self.coords + 1 :], scale, thresh, hier)
        else:
            probs = thresholded(scale[:, None] * e[:, self.coords + 1 :], thresh)
        boxes = correct_region_boxes(boxes, img_w, img_h, netw, neth, relative, letter)
        return make_detections(boxes, objectness, probs, self.index)

    def _tree_probs(self, class_out, scale, thresh, hier):
        """get_region_detections' tree branch: P(class) by hierarchy_predictions, then
        where the objectness is above thresh, the objectness on the class
        hierarchy_top_prediction picks (0 elsewhere)."""
        p = hierarchy_predictions(class_out, self.hierarchy)
        probs = np.zeros_like(p)
        for k in np.flatnonzero(scale > np.float32(thresh)):
            probs[k, hierarchy_top_prediction(p[k], self.hierarchy, hier)] = scale[k]
        return probs


def read_class_map(s):
    """[region] map=: Darknet's read_map, a class id a line (atoi), or None."""
    value = s.get_str("map")
    if value is None:
        return None
    path = resolve_tree_path(value, s.path)
    if path is None:
        raise s.error(
            f"{value}: no such file (looked in the working directory, as Darknet "
            f"does, and next to the cfg)",
            "map",
        )
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise s.error(f"{path}: {e.strerror or e}", "map") from None
    ids = []
    for number, line in enumerate(lines, 1):
        try:
            ids.append(int(line.split()[0]))
        except (ValueError, IndexError):
            raise s.error(
                f"{os.fspath(path)}:{number}: expected a class id, got '{line.strip()}'", "map"
            ) from None
    return np.array(ids, dtype=np.int64)
