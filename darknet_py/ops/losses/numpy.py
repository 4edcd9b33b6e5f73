"""The NumPy backend's softmax, costs and detection losses (mixed into NumpyBackend). The
detection losses themselves live in darknet_py/losses/ (host arrays, used by the layers
too); these ops call them."""

import numpy as np

from ...losses import detection as detection_loss
from ...losses import region as region_loss
from ...losses.yolo import image_truths, yolo_loss


class NumpyLosses:
    """softmax, softmax_tree, the cost functions, yolo_loss, region_loss, detection_loss."""

    def softmax(self, x, n, batch, batch_offset, groups, group_offset, stride, temp, out):
        """Darknet's softmax_cpu: batch*groups softmaxes of n elements spaced `stride` apart."""
        b = np.arange(batch).reshape(-1, 1, 1) * batch_offset
        g = np.arange(groups).reshape(1, -1, 1) * group_offset
        i = np.arange(n).reshape(1, 1, -1) * stride
        _softmax_at(x, (b + g + i).reshape(batch * groups, n), temp, out)

    def softmax_tree(self, x, spatial, batch, stride, temp, group_offset, group_size, classes, out):
        """A softmax over each group of a class tree of `classes` classes (tree.py): for
        instance b < batch and position s < spatial, group g's group_size[g] elements at
        x[b*stride + (group_offset[g] + i)*spatial + s] (integer arrays, as int_zeros)."""
        instances = (np.arange(batch)[:, None] * stride + np.arange(spatial)).reshape(-1)
        for first, size in zip(np.asarray(group_offset).tolist(), np.asarray(group_size).tolist()):
            _softmax_at(x, (instances[:, None] + (first + np.arange(size)) * spatial), temp, out)

    def mask(self, x, truth, value):
        """x[i] = 0 wherever truth[i] == value (Darknet's mask_gpu with mask_num 0)."""
        x[truth[: x.size] == value] = 0

    def softmax_x_ent(self, pred, truth, delta, error):
        """Cross-entropy: error = -t*log(p) where t != 0; delta = t - p."""
        t = truth[: pred.size]
        with np.errstate(divide="ignore"):
            error[...] = np.where(t != 0, -t * np.log(pred), 0)
        delta[...] = t - pred

    def l2(self, pred, truth, delta, error):
        """Sum-squared error: delta = t - p, error = (t - p)^2."""
        delta[...] = truth[: pred.size] - pred
        error[...] = delta * delta

    def logistic_x_ent(self, pred, truth, delta, error):
        """Logistic cross-entropy ([logistic]): error = -t*log(p) - (1-t)*log(1-p);
        delta = t - p. As Darknet's CPU code: no epsilon, so p of exactly 0 or 1 gives inf
        (or nan where t makes 0 * inf)."""
        t = truth[: pred.size]
        with np.errstate(divide="ignore", invalid="ignore"):
            error[...] = -t * np.log(pred) - (1 - t) * np.log(1 - pred)
        delta[...] = t - pred

    def yolo_loss(self, spec, output, truth, delta, scalars):
        """The [yolo] head's training loss (losses/yolo.py, of spec's flavour) of output
        (spec.batch images, after activation) against the truth buffer (spec.batch rows of
        truth_fields floats a box): writes the whole delta and the yolo_loss.SCALARS
        (cost first) into scalars."""
        d, sums = yolo_loss(spec, output, image_truths(spec, truth))
        delta[: d.size] = d
        scalars[: sums.size] = sums

    def region_loss(
        self, head, output, truth, truth_size, anchors, seen, delta, scalars, classes=None
    ):
        """[region]'s training loss (losses/region.py) for head (a RegionHead): every element
        of delta; the cost and statistics in scalars (region_loss.REGION_SCALARS). classes:
        the layer's region_loss.RegionClasses (map= and tree=) or None."""
        region_loss.region_loss(
            head, output, truth, truth_size, anchors, seen, delta, scalars, classes
        )

    def detection_grid_truth(self, truth, batch, truth_size, max_boxes, side, classes, grid):
        """[detection]'s grid truth from box rows (losses/detection.py): every element of grid."""
        detection_loss.detection_grid_truth(
            truth, batch, truth_size, max_boxes, side, classes, grid
        )

    def detection_loss(self, head, output, grid, draws, delta, scalars):
        """[detection]'s training loss (losses/detection.py) for head (a DetectionHead): every
        element of delta; the cost and statistics in scalars (DETECTION_SCALARS)."""
        detection_loss.detection_loss(head, output, grid, draws, delta, scalars)


def _softmax_at(x, index, temp, out):
    """One softmax per row of the index matrix (instances x elements) of flat x into out."""
    v = x[index] / temp
    e = np.exp(v - v.max(axis=1, keepdims=True))
    out[index] = e / e.sum(axis=1, keepdims=True)
