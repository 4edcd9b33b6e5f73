"""The detection heads: their activations as forward applies them (the raw outputs
`predict` returns), and --decode / --nms on top.

--decode turns every [yolo] and [region] head into `boxes` [B, N, 4] (centre x, centre y,
width, height relative to the network input, as Darknet's get_yolo_box/get_region_box
make them before correct_*_boxes) and `scores` [B, N, classes] (objectness times class
probability). Letterboxing is the caller's: boxes are relative to the network input,
which maps back to the image by undoing the letterbox (metadata `letterbox`). --nms adds
ONNX's NonMaxSuppression, per class on IoU, which is Darknet's default NMS (and the
fork's cornersnms, which compares IoU too); the fork's greedynms and diounms compare DIoU,
which ONNX's operator cannot, and are refused."""

import numpy as np

from ..losses.gaussian_yolo import UH, UW, X, Y
from . import ExportError
from .layers import exports, tree_softmax


def _planes(g, layer, x, entries, logistic, scale_xy=1, xy=(0, 1)):
    """The head's (n*entries, h, w) output: the logistic on the `logistic` entries of each
    anchor's block, and the fork's scale_x_y affine on its `xy` entries."""
    n, hw = layer.n, layer.h * layer.w
    t = g.reshape(x, (n, entries, hw))
    mask = np.zeros((1, entries, 1), dtype=bool)
    mask[0, logistic] = True
    if mask.any():
        t = g.op(
            "Where",
            [g.const(mask, "logistic_mask", np.bool_), g.op("Sigmoid", [t]), t],
            (n, entries, hw),
        )
    if scale_xy != 1:
        a, b = np.ones((1, entries, 1)), np.zeros((1, entries, 1))
        a[0, list(xy)] = np.float32(scale_xy)
        b[0, list(xy)] = np.float32(-0.5 * (scale_xy - 1))
        t = g.op(
            "Add",
            [g.op("Mul", [t, g.const(a, "scale_x_y")]), g.const(b, "offset_x_y")],
            (n, entries, hw),
        )
    return g.reshape(t, (layer.out_c, layer.out_h, layer.out_w))


@exports("yolo")
def yolo(g, layer, x):
    entries = 5 + layer.classes
    logistic = [] if layer.new_coords else [0, 1] + list(range(4, entries))
    return _planes(g, layer, x, entries, logistic, layer.scale_x_y)


@exports("gaussian_yolo")
def gaussian_yolo(g, layer, x):
    logistic = list(range(X, X + 4)) + [UW] + list(range(UH, UH + 2 + layer.classes))
    return _planes(g, layer, x, layer.entries, logistic, layer.scale_x_y, (X, Y))


@exports("region")
def region(g, layer, x):
    size, n, hw = layer.size, layer.n, layer.h * layer.w
    logistic = [0, 1, layer.coords] + ([] if layer.softmax else list(range(layer.coords + 1, size)))
    if layer.hierarchy is not None:
        logistic = [0, 1, layer.coords]
    y = _planes(g, layer, x, size, logistic)
    if not layer.softmax and layer.hierarchy is None:
        return y
    t = g.reshape(y, (n, size, hw))
    first = layer.coords + 1
    box = g.slice(t, 2, 0, first, shape=(n, first, hw))
    scores = g.slice(t, 2, first, size, shape=(n, layer.classes, hw))
    if layer.hierarchy is not None:  # a softmax per sibling group, as Darknet's GPU build
        scores = g.op("Transpose", [scores], (layer.classes, n, hw), perm=[0, 2, 1, 3])
        scores = tree_softmax(g, scores, layer.hierarchy, (n, hw))
        classes = g.op("Transpose", [scores], (n, layer.classes, hw), perm=[0, 2, 1, 3])
    else:
        classes = g.op("Softmax", [scores], (n, layer.classes, hw), axis=2)
    return g.concat([box, classes], 2, (n, size, hw))


@exports("detection")
def detection(g, layer, x):
    """YOLOv1: a softmax over the classes of each grid cell, the rest as it is."""
    if not layer.softmax:
        return x
    cells = layer.side * layer.side
    x = g.flat(x)
    probs = g.slice(x, 1, 0, cells * layer.classes, shape=(cells * layer.classes,))
    probs = g.op(
        "Softmax", [g.reshape(probs, (cells, layer.classes))], (cells, layer.classes), axis=-1
    )
    rest = g.slice(
        x, 1, cells * layer.classes, layer.outputs, shape=(layer.outputs - cells * layer.classes,)
    )
    return g.concat([g.flat(probs), rest], 1, (layer.outputs,))


# ---- --decode --------------------------------------------------------------------------------
def decode_heads(g, net, heads):
    """(boxes, scores) tensors of every [yolo]/[region] head, concatenated in layer order;
    within a [yolo] head cells are row-major with anchors inner (get_yolo_detections), within
    a [region] head anchors outer (get_region_detections)."""
    classes = {layer.classes for layer in heads}
    if len(classes) > 1:
        raise ExportError(f"--decode: the heads have different class counts {sorted(classes)}")
    boxes, scores = [], []
    netw, neth = net.input_shape[2], net.input_shape[1]
    for layer in heads:
        if layer.type not in ("yolo", "region"):
            raise ExportError(
                f"layer {layer.index} [{layer.type}]: --decode covers [yolo] "
                f"and [region] heads; export it without --decode"
            )
        if getattr(layer, "hierarchy", None) is not None:
            raise ExportError(
                f"layer {layer.index} [region]: --decode cannot walk a class "
                f"tree (tree=); export the raw outputs without --decode"
            )
        b, s = _decode(g, layer, g.outputs[layer.index], netw, neth)
        boxes.append(b)
        scores.append(s)
    total = sum(g.shapes[b][0] for b in boxes)
    return (g.concat(boxes, 1, (total, 4)), g.concat(scores, 1, (total, classes.pop())))


def _decode(g, layer, y, netw, neth):
    n, w, h, hw = layer.n, layer.w, layer.h, layer.w * layer.h
    entries = layer.out_c // n
    t = g.reshape(y, (n, entries, hw))
    cell, anchor = np.meshgrid(np.arange(hw), np.arange(n), indexing="ij")  # yolo's order
    if layer.type == "yolo":
        t = g.op("Transpose", [t], (hw, n, entries), perm=[0, 3, 1, 2])
        anchors = layer.biases.reshape(-1, 2)[np.asarray(layer.mask)]
        size = np.array([netw, neth], dtype=np.float64)
    else:
        t = g.op("Transpose", [t], (n, hw, entries), perm=[0, 1, 3, 2])
        cell, anchor = cell.T, anchor.T
        anchors = layer.biases.reshape(-1, 2)[:n]
        size = np.array([w, h], dtype=np.float64)
    count = n * hw
    t = g.reshape(t, (count, entries))
    cell, anchor = cell.reshape(-1), anchor.reshape(-1)
    grid = np.stack([cell % w, cell // w], axis=1)
    xy = g.op(
        "Div",
        [
            g.op("Add", [g.slice(t, 2, 0, 2, shape=(count, 2)), g.const(grid, "grid")]),
            g.const([w, h], "grid_size"),
        ],
        (count, 2),
    )
    twh = g.slice(t, 2, 2, 4, shape=(count, 2))
    scale = anchors[anchor] / size
    if getattr(layer, "new_coords", 0):  # (2t)² times the anchor
        wh = g.op("Mul", [g.op("Mul", [twh, twh]), g.const(4 * scale, "anchors")], (count, 2))
    else:
        wh = g.op("Mul", [g.op("Exp", [twh]), g.const(scale, "anchors")], (count, 2))
    obj = g.slice(t, 2, 4, 5, shape=(count, 1))
    probs = g.slice(t, 2, 5, entries, shape=(count, layer.classes))
    return (g.concat([xy, wh], 2, (count, 4)), g.op("Mul", [obj, probs], (count, layer.classes)))


def add_nms(g, boxes, scores, kind, iou_thresh, score_thresh):
    """ONNX NonMaxSuppression per class (center_point_box: Darknet's x, y, w, h boxes):
    `selected` [K, 3] rows of (image, class, box index)."""
    if kind not in ("default", "cornersnms"):
        raise ExportError(
            f"--nms: the cfg's nms_kind={kind} compares DIoU, which ONNX's "
            f"NonMaxSuppression cannot; export with --decode and run that NMS "
            f"outside the model"
        )
    count = g.shapes[boxes][0]
    boxes, scores = (
        g.op("Cast", [t], g.shapes[t], to=1) if g.dtype != np.float32 else t
        for t in (boxes, scores)
    )
    per_class = g.op("Transpose", [scores], None, perm=[0, 2, 1])
    return g.op(
        "NonMaxSuppression",
        [
            boxes,
            per_class,
            g.ints([count]),
            g.const([iou_thresh], "iou_threshold", np.float32),
            g.const([score_thresh], "score_threshold", np.float32),
        ],
        None,
        hint="selected",
        center_point_box=1,
    )
