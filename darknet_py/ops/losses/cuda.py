"""The CUDA backend's softmax and losses: softmax, softmax over a class tree and the
cost functions (softmax.cu); the [yolo] loss (yolo_loss.cu); the [region]
and [detection] losses (region_loss.cu). A mixin of CudaBackend."""

import numpy as np
import pycuda.driver as drv

from ...backends.cuda_core import _BLOCK, _ceil_div
from ...losses.detection import DETECTION_SCALARS
from ...losses.region import PRIOR_SEEN, REGION_SCALARS, REGION_TRUTHS
from ...losses.yolo import FLT_MAX, IOU_LOSSES, SCALARS

# The kernel files this family launches from (formats from their declarations,
# backends/kernel_signatures.py).
KERNEL_FILES = ("softmax.cu", "region_loss.cu", "yolo_loss.cu")

# Per-image figures the truth kernels of region_loss.cu leave for loss_final.
_LOSS_IMAGE_STATS = 5
# Threads of the kernels that walk one image's truths in order (one thread an image).
_IMAGE_THREADS = 64
_YOLO_STATS = 8  # per-image statistics of yolo_loss.cu (enum Stat)


class CudaLosses:
    """softmax, softmax_tree, the cost functions, yolo_loss, region_loss, detection_loss."""

    # ---- softmax -------------------------------------------------------------
    def softmax(self, x, n, batch, batch_offset, groups, group_offset, stride, temp, out):
        """Darknet's softmax: batch*groups softmaxes of n elements spaced `stride` apart."""
        if n <= 0 or batch <= 0 or groups <= 0:
            return
        last = (batch - 1) * batch_offset + (groups - 1) * group_offset + (n - 1) * stride + 1
        self._check_size("softmax x", x, last)
        self._check_size("softmax out", out, last)
        self._launch(
            "softmax_kernel",
            self._grid1d(32 * batch * groups),
            (_BLOCK,),
            self._ptr(x),
            int(n),
            int(batch),
            int(batch_offset),
            int(groups),
            int(group_offset),
            int(stride),
            float(temp),
            self._ptr(out),
        )

    def softmax_tree(self, x, spatial, batch, stride, temp, group_offset, group_size, classes, out):
        """A softmax over each group of a class tree of `classes` classes (see the NumPy
        backend); group_offset and group_size are int32 arrays (int_zeros)."""
        groups = group_size.size
        if (
            group_offset.size != groups
            or group_offset.dtype != np.int32
            or group_size.dtype != np.int32
        ):
            raise TypeError("softmax_tree groups must be two int32 arrays of one size")
        last = (batch - 1) * stride + spatial * classes
        self._check_size("softmax_tree x", x, last)
        self._check_size("softmax_tree out", out, last)
        self._launch(
            "softmax_tree_kernel",
            self._grid1d(32 * batch * groups * spatial),
            (_BLOCK,),
            self._ptr(x),
            int(spatial),
            int(batch),
            int(stride),
            float(temp),
            self._ptr(group_offset),
            self._ptr(group_size),
            int(groups),
            self._ptr(out),
        )

    def mask(self, x, truth, value):
        """x[i] = 0 wherever truth[i] == value."""
        self._check_size("mask truth", truth, x.size)
        self._launch(
            "mask_kernel",
            self._grid1d(x.size),
            (_BLOCK,),
            x.size,
            self._ptr(x),
            self._ptr(truth),
            float(value),
        )

    def softmax_x_ent(self, pred, truth, delta, error):
        """Cross-entropy: error = -t*log(p) where t != 0; delta = t - p."""
        n = pred.size
        for what, arr in (("truth", truth), ("delta", delta), ("error", error)):
            self._check_size(f"softmax_x_ent {what}", arr, n)
        self._launch(
            "softmax_x_ent_kernel",
            self._grid1d(n),
            (_BLOCK,),
            n,
            self._ptr(pred),
            self._ptr(truth),
            self._ptr(delta),
            self._ptr(error),
        )

    def l2(self, pred, truth, delta, error):
        """Sum-squared error: delta = t - p, error = (t - p)^2."""
        n = pred.size
        for what, arr in (("truth", truth), ("delta", delta), ("error", error)):
            self._check_size(f"l2 {what}", arr, n)
        self._launch(
            "l2_kernel",
            self._grid1d(n),
            (_BLOCK,),
            n,
            self._ptr(pred),
            self._ptr(truth),
            self._ptr(delta),
            self._ptr(error),
        )

    def logistic_x_ent(self, pred, truth, delta, error):
        """Logistic cross-entropy: error = -t*log(p) - (1-t)*log(1-p); delta = t - p."""
        n = pred.size
        for what, arr in (("truth", truth), ("delta", delta), ("error", error)):
            self._check_size(f"logistic_x_ent {what}", arr, n)
        self._launch(
            "logistic_x_ent_kernel",
            self._grid1d(n),
            (_BLOCK,),
            n,
            self._ptr(pred),
            self._ptr(truth),
            self._ptr(delta),
            self._ptr(error),
        )

    # ---- detection losses --------------------------------------------------------
    def yolo_loss(self, spec, output, truth, delta, scalars):
        """The [yolo] head's training loss (yolo_loss.cu; losses/yolo.py is the
        reference): writes the whole delta and the yolo_loss.SCALARS into scalars, queued
        on the stream (no host sync)."""
        wh = spec.w * spec.h
        size = spec.batch * spec.n * (5 + spec.classes) * wh
        self._check_size("yolo_loss output", output, size)
        self._check_size("yolo_loss delta", delta, size)
        self._check_size("yolo_loss scalars", scalars, len(SCALARS))
        if truth.size % spec.batch:
            raise ValueError(f"yolo_loss truth: {truth.size} values for {spec.batch} images")
        args = self._ptr(self._yolo_loss_args(spec, truth.size // spec.batch))
        blocks = _ceil_div(spec.n * wh, _BLOCK)
        parts = blocks * spec.batch
        scratch = self._ptr(
            self._scratch_buffer("yolo_loss", 8 * (3 * parts + _YOLO_STATS * spec.batch))
        )
        stats = scratch + 8 * 3 * parts
        out, tr, d = self._ptr(output), self._ptr(truth), self._ptr(delta)
        self._launch("yolo_predictions", (blocks, spec.batch), (_BLOCK,), args, out, tr, d)
        self._launch("yolo_truths", (spec.batch,), (32,), args, out, tr, d, stats)
        self._launch("yolo_finish", (blocks, spec.batch), (_BLOCK,), args, out, d, scratch)
        self._launch(
            "yolo_reduce", (1,), (_BLOCK,), args, scratch, parts, stats, self._ptr(scalars)
        )

    def _yolo_loss_args(self, spec, truth_stride):
        """The kernels' YoloArgs for spec on the device: uploaded once per distinct spec
        (a new input size brings a new one), so a training step copies nothing."""
        extra_anchors = spec.fork and spec.iou_thresh < 1
        ints = [
            spec.batch,
            spec.n,
            spec.classes,
            spec.h,
            spec.w,
            spec.total,
            spec.netw,
            spec.neth,
            spec.truth_fields,
            truth_stride,
            spec.max_boxes,
            spec.fork,
            spec.new_coords,
            IOU_LOSSES.index(spec.iou_loss),
            IOU_LOSSES.index(spec.iou_thresh_kind),
            spec.objectness_smooth,
            spec.class_multipliers is not None,
            spec.max_delta != FLT_MAX,
            extra_anchors,
        ]
        floats = [
            spec.ignore_thresh,
            spec.truth_thresh,
            spec.iou_normalizer,
            spec.obj_normalizer,
            spec.cls_normalizer,
            spec.max_delta,
            spec.iou_thresh,
            spec.smoothed(1),
            spec.smoothed(0),
        ]
        multipliers = () if spec.class_multipliers is None else spec.class_multipliers
        words = np.concatenate(
            [
                np.array(ints, dtype=np.int32).view(np.uint32),
                np.array(floats, dtype=np.float32).view(np.uint32),
                np.asarray(spec.biases, dtype=np.float32).view(np.uint32),
                np.array(spec.mask, dtype=np.int32).view(np.uint32),
                np.asarray(multipliers, dtype=np.float32).view(np.uint32),
            ]
        )
        key = words.tobytes()
        arr = self._yolo_args.get(key)
        if arr is None:
            arr = self._yolo_args[key] = self._new(words.size, np.uint32)
            drv.memcpy_htod_async(self._ptr(arr), words, self.stream)
        return arr

    # ---- detection losses ------------------------------------------------------------
    def region_loss(
        self, head, output, truth, truth_size, anchors, seen, delta, scalars, classes=None
    ):
        """[region]'s training loss (losses/region.py) for head (a RegionHead): every element
        of delta; the cost and statistics in scalars (region_loss.REGION_SCALARS). classes:
        the layer's RegionClasses (map= and tree=) or None."""
        batch, cells = head.batch, head.batch * head.n * head.h * head.w
        wh = head.h * head.w
        total = cells * head.entries
        for what, arr, need in (
            ("output", output, total),
            ("delta", delta, total),
            ("anchors", anchors, 2 * head.n),
            ("scalars", scalars, len(REGION_SCALARS)),
        ):
            self._check_size(f"region_loss {what}", arr, need)
        truth_stride = truth.size // batch
        boxes = (
            self._ptr(output),
            self._ptr(truth),
            truth_stride,
            int(truth_size),
            min(REGION_TRUTHS, truth_stride // truth_size),
            self._ptr(anchors),
            batch,
            head.n,
            head.h,
            head.w,
            head.classes,
        )
        self._launch(
            "region_cells",
            self._grid1d(cells),
            (_BLOCK,),
            *boxes,
            float(head.thresh),
            float(head.noobject_scale),
            int(seen < PRIOR_SEEN),
            self._ptr(delta),
        )
        stats = self._scratch_buffer("loss_stats", 8 * _LOSS_IMAGE_STATS * batch)
        self._launch(
            "region_truths",
            (_ceil_div(batch, _IMAGE_THREADS),),
            (_IMAGE_THREADS,),
            *boxes,
            int(head.softmax),
            int(head.bias_match),
            int(head.rescore),
            float(head.coord_scale),
            float(head.object_scale),
            float(head.class_scale),
            *self._region_class_pointers(classes),
            self._ptr(delta),
            stats.ptr,
        )
        self._loss_figures(
            output, delta, total, head.entries * wh, 4 * wh, wh, stats, batch, scalars
        )

    def _region_class_pointers(self, classes):
        """region_truths' class_map, parent, group, group_offset, group_size (null for
        what the layer lacks)."""
        tree = classes.tree if classes is not None else None
        arrays = [classes.class_map if classes is not None else None]
        arrays += [tree.parent, tree.group, tree.offset, tree.size] if tree else [None] * 4
        for arr in arrays:
            if arr is not None and arr.dtype != np.int32:
                raise TypeError("region_loss class arrays must be int32 (int_zeros)")
        return [0 if a is None else self._ptr(a) for a in arrays]  # 0: a null pointer

    def detection_grid_truth(self, truth, batch, truth_size, max_boxes, side, classes, grid):
        """[detection]'s grid truth from box rows (losses/detection.py): every element of grid."""
        cells = batch * side * side
        self._check_size("detection_grid_truth grid", grid, cells * (5 + classes))
        truth_stride = truth.size // batch
        self._launch(
            "detection_grid",
            self._grid1d(cells),
            (_BLOCK,),
            self._ptr(truth),
            truth_stride,
            int(truth_size),
            min(int(max_boxes), truth_stride // truth_size),
            int(batch),
            int(side),
            int(classes),
            self._ptr(grid),
        )

    def detection_loss(self, head, output, grid, draws, delta, scalars):
        """[detection]'s training loss (losses/detection.py) for head (a DetectionHead): every
        element of delta; the cost and statistics in scalars (DETECTION_SCALARS)."""
        batch, loc = head.batch, head.side * head.side
        total = batch * head.outputs
        for what, arr, need in (
            ("output", output, total),
            ("delta", delta, total),
            ("grid", grid, batch * loc * head.cell_truth),
            ("draws", draws, batch * loc if draws is not None else 0),
            ("scalars", scalars, len(DETECTION_SCALARS)),
        ):
            if arr is not None:
                self._check_size(f"detection_loss {what}", arr, need)
        p_begin, p_end = loc * head.classes, loc * (head.classes + head.n)
        self._launch(
            "detection_base",
            self._grid1d(total),
            (_BLOCK,),
            self._ptr(output),
            total,
            head.outputs,
            p_begin,
            p_end,
            float(head.noobject_scale),
            self._ptr(delta),
        )
        stats = self._scratch_buffer("loss_stats", 8 * _LOSS_IMAGE_STATS * batch)
        self._launch(
            "detection_objects",
            (_ceil_div(batch, _IMAGE_THREADS),),
            (_IMAGE_THREADS,),
            self._ptr(output),
            self._ptr(grid),
            0 if draws is None else self._ptr(draws),
            batch,
            head.side,
            head.n,
            head.classes,
            int(head.sqrt),
            int(head.rescore),
            int(head.forced),
            float(head.coord_scale),
            float(head.object_scale),
            float(head.class_scale),
            self._ptr(delta),
            stats.ptr,
        )
        self._loss_figures(
            output, delta, total, head.outputs, p_begin, p_end - p_begin, stats, batch, scalars
        )

    def _loss_figures(self, output, delta, total, period, offset, width, stats, batch, scalars):
        """scalars = cost (sum of delta^2), the per-image stats summed, the objectness sum
        (output[i] where i % period lies in [offset, offset + width)): fixed-order sums,
        so repeated steps give the same bits."""
        blocks = self._grid1d(total)[0]
        partial = self._scratch_buffer("loss_partial", 16 * blocks)
        self._launch(
            "loss_sums",
            (blocks,),
            (_BLOCK,),
            self._ptr(delta),
            self._ptr(output),
            total,
            period,
            offset,
            width,
            partial.ptr,
        )
        self._launch(
            "loss_final",
            (1,),
            (_BLOCK,),
            partial.ptr,
            blocks,
            stats.ptr,
            batch,
            _LOSS_IMAGE_STATS,
            self._ptr(scalars),
        )
