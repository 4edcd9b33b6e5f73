"""Detection heads and predictions.py: box decoding, letterbox correction, NMS, and each
layer's training loss against a plain loop transcription of Darknet's C
(forward_yolo_layer, forward_region_layer, forward_detection_layer) on small random cases.
The transcriptions below follow the C line by line, in float32 scalars, and share no code
with the layers they check."""

import math
from pathlib import Path

import numpy as np
import pytest
from helpers import grid_truth_from_boxes

import darknet_py
from darknet_py.boxes import Detection, box_iou, correct_yolo_boxes, do_nms_obj, do_nms_sort
from darknet_py.cfg import CfgError, parse_cfg_text
from darknet_py.image import letterbox, load_image, to_bgr
from darknet_py.network import Network
from darknet_py.predictions import classify, detect, detections_to_json, draw_detections

F32 = np.float32
SHARED = Path(__file__).resolve().parents[1].parent / "shared"
FIXTURES = SHARED / "fixtures"
needs_p2 = pytest.mark.skipif(
    not (FIXTURES / "p2_tinyyolo").is_dir(), reason=f"Darknet fixtures not found at {FIXTURES}"
)
needs_photo = pytest.mark.skipif(
    not (SHARED / "images" / "dog.jpg").is_file(),
    reason=f"sample photos not found at {SHARED / 'images'}",
)


def build(text, batch=None, seed=0):
    return Network(parse_cfg_text(text, "t.cfg"), "t.cfg", batch=batch, seed=seed)


def sigmoid(x):
    return (1 / (1 + np.exp(-x))).astype(F32)


# ---- Darknet's box.c, transcribed ---------------------------------------------------------
def c_overlap(x1, w1, x2, w2):
    l1, l2 = x1 - w1 / 2, x2 - w2 / 2
    left = l1 if l1 > l2 else l2
    r1, r2 = x1 + w1 / 2, x2 + w2 / 2
    right = r1 if r1 < r2 else r2
    return right - left


def c_box_iou(a, b):
    a = [F32(v) for v in a]
    b = [F32(v) for v in b]
    w = c_overlap(a[0], a[2], b[0], b[2])
    h = c_overlap(a[1], a[3], b[1], b[3])
    inter = F32(0) if (w < 0 or h < 0) else w * h
    union = a[2] * a[3] + b[2] * b[3] - inter
    return inter / union


def c_box_rmse(a, b):
    return math.sqrt(sum((float(F32(p)) - float(F32(q))) ** 2 for p, q in zip(a, b)))


# ---- decoding -----------------------------------------------------------------------------
YOLO_HEAD = """[net]
width=3
height=2
channels=14
[yolo]
mask=1,2
anchors=10,14, 23,27, 37,58
classes=2
num=3
"""


def test_yolo_box_decoding_by_hand():
    layer = build(YOLO_HEAD).layers[0]
    assert (layer.out_c, layer.out_h, layer.out_w, layer.n) == (14, 2, 3, 2)
    out = np.full((2, 7, 2, 3), 0.1, dtype=F32)  # (anchor slot, entry, row, col), activated
    out[1, :, 1, 2] = [0.25, 0.75, math.log(2), 0.0, 0.9, 0.5, 0.8]
    dets = layer.detections(out.reshape(-1), 320, 200, 96, 64, thresh=0.5, letter=False)
    assert len(dets) == 1
    d = dets[0]
    # x = (col + x)/lw, y = (row + y)/lh, w = e^tw * anchor_w / netw (slot 1 is anchor 2)
    np.testing.assert_allclose(
        d.box, [(2 + 0.25) / 3, (1 + 0.75) / 2, 2 * 37 / 96, 58 / 64], rtol=1e-6
    )
    assert d.objectness == pytest.approx(0.9)
    np.testing.assert_allclose(d.probs, [0.0, 0.9 * 0.8], rtol=1e-6)  # 0.45 is not > 0.5


def test_yolo_detections_order_cells_then_anchors():
    layer = build(YOLO_HEAD).layers[0]
    out = np.zeros((2, 7, 2, 3), dtype=F32)
    out[:, 4] = 0.2
    out[1, 4, 0, 0] = out[0, 4, 0, 1] = out[1, 4, 0, 1] = 0.9
    dets = layer.detections(out.reshape(-1), 3, 2, 3, 2, thresh=0.5)
    # Darknet loops cells in row-major order with the anchors inside.
    centres = [(round(d.box[0] * 3 - 0.5), round(d.box[1] * 2 - 0.5)) for d in dets]
    assert centres == [(0, 0), (1, 0), (1, 0)]
    assert [d.box[2] for d in dets] == pytest.approx([37 / 3, 23 / 3, 37 / 3])


def test_correct_yolo_boxes_undoes_letterbox_for_wide_and_tall_images():
    # 640x480 into 416x416: new size 416x312, 52 grey rows above and below.
    b = correct_yolo_boxes([[0.5, 0.5, 0.25, 0.25], [0.3, 0.2, 0.1, 0.1]], 640, 480, 416, 416)
    np.testing.assert_allclose(
        b,
        [
            [0.5, 0.5, 0.25, 0.25 * 416 / 312],
            [0.3, (0.2 - 52 / 416) / (312 / 416), 0.1, 0.1 * 416 / 312],
        ],
        rtol=1e-6,
    )
    pixels = correct_yolo_boxes([[0.3, 0.2, 0.1, 0.1]], 640, 480, 416, 416, relative=False)
    np.testing.assert_allclose(pixels, b[1:] * [640, 480, 640, 480], rtol=1e-6)
    # 480x640 (tall) into 416x416: new size 312x416, 52 grey columns left and right.
    t = correct_yolo_boxes([[0.2, 0.4, 0.5, 0.5]], 480, 640, 416, 416)
    np.testing.assert_allclose(
        t, [[(0.2 - 52 / 416) / (312 / 416), 0.4, 0.5 * 416 / 312, 0.5]], rtol=1e-6
    )
    # A plain resize (letter=False) keeps relative boxes as they are.
    np.testing.assert_allclose(
        correct_yolo_boxes([[0.3, 0.2, 0.1, 0.1]], 640, 480, 416, 416, letter=False),
        [[0.3, 0.2, 0.1, 0.1]],
    )


def test_correct_yolo_boxes_maps_a_letterboxed_point_back():
    # Paint a block of a 50x30 image (centre 37, 21), letterbox it into 40x40, find it again.
    img = np.zeros((3, 30, 50), dtype=F32)
    img[:, 18:24, 34:40] = 1
    boxed = letterbox(img, 40, 40)
    ys, xs = np.nonzero(boxed[0] > 0.6)  # the grey border is 0.5
    net_xy = [[(xs.mean() + 0.5) / 40, (ys.mean() + 0.5) / 40, 0.1, 0.1]]
    x, y, w, h = correct_yolo_boxes(net_xy, 50, 30, 40, 40)[0]
    assert x * 50 == pytest.approx(37, abs=1.0)
    assert y * 30 == pytest.approx(21, abs=1.0)
    assert (w * 50, h * 30) == pytest.approx((0.1 * 40 * 50 / 40, 0.1 * 40 * 50 / 40), rel=1e-5)


REGION_HEAD = """[net]
width=2
height=2
channels=16
[region]
anchors=1,1, 2,3
classes=3
coords=4
num=2
softmax=1
"""


def test_region_box_decoding_by_hand():
    layer = build(REGION_HEAD).layers[0]
    out = np.zeros((2, 8, 2, 2), dtype=F32)
    out[:, 4] = 0.05
    out[1, :, 0, 1] = [0.5, 0.5, 0.0, math.log(0.5), 0.8, 0.1, 0.2, 0.7]
    dets = layer.detections(out.reshape(-1), 2, 2, 2, 2, thresh=0.1, letter=False)
    assert len(dets) == 8  # one per anchor and cell, kept even when below thresh
    d = dets[1 * 4 + 1]  # Darknet's index: anchor * w*h + cell
    # w and h are e^t * anchor / layer size (Darknet's DOABS)
    np.testing.assert_allclose(
        d.box, [(1 + 0.5) / 2, (0 + 0.5) / 2, 1 * 2 / 2, 0.5 * 3 / 2], rtol=1e-6
    )
    assert d.objectness == pytest.approx(0.8)
    np.testing.assert_allclose(d.probs, [0.0, 0.16, 0.56], rtol=1e-6)
    others = [x for k, x in enumerate(dets) if k != 5]
    assert all(x.objectness == 0 and not x.probs.any() for x in others)


DETECTION_HEAD = """[net]
width=1
height=1
channels=48
[detection]
classes=2
coords=4
side=2
num=2
sqrt=1
"""


def test_detection_box_decoding_by_hand():
    layer = build(DETECTION_HEAD).layers[0]
    assert layer.output_shape(1) == (1, 48)
    out = np.zeros(48, dtype=F32)
    out[3 * 2 : 3 * 2 + 2] = [0.25, 0.75]  # classes of cell 3 (row 1, col 1)
    out[8 + 3 * 2 + 1] = 0.8  # objectness of box 1 of cell 3
    out[16 + (3 * 2 + 1) * 4 :][:4] = [0.5, 0.25, 0.6, 0.4]
    dets = layer.detections(out, 640, 480, 448, 448, thresh=0.2)
    assert len(dets) == 8
    d = dets[3 * 2 + 1]
    np.testing.assert_allclose(d.box, [(0.5 + 1) / 2, (0.25 + 1) / 2, 0.36, 0.16], rtol=1e-6)
    np.testing.assert_allclose(d.probs, [0.0, 0.6], rtol=1e-6)  # 0.8*0.25 = 0.2 is not > 0.2
    pixels = layer.detections(out, 640, 480, 448, 448, thresh=0.2, relative=False)[7]
    np.testing.assert_allclose(pixels.box, np.multiply(d.box, [640, 480, 640, 480]), rtol=1e-6)


# ---- NMS ----------------------------------------------------------------------------------
def det(box, objectness, probs):
    return Detection(box=box, objectness=objectness, probs=np.array(probs, dtype=F32))


def test_nms_sort_suppresses_overlaps_within_a_class_only():
    a = det((0.50, 0.5, 0.2, 0.2), 0.9, [0.9, 0])
    b = det((0.51, 0.5, 0.2, 0.2), 0.8, [0.8, 0])  # IoU with a ~0.9: suppressed
    c = det((0.10, 0.1, 0.1, 0.1), 0.7, [0.7, 0])  # far away: kept
    d = det((0.505, 0.5, 0.2, 0.2), 0.6, [0, 0.6])  # overlaps a, other class: kept
    e = det((0.50, 0.5, 0.2, 0.2), 0, [0, 0])  # objectness 0: moved to the end
    dets = do_nms_sort([e, c, b, d, a], 2, 0.45)
    assert dets[-1] is e
    assert b.probs.tolist() == [0, 0]
    assert a.probs[0] == pytest.approx(0.9) and c.probs[0] == pytest.approx(0.7)
    assert d.probs[1] == pytest.approx(0.6)
    # The list ends sorted by the last class's probability (class 1), stably.
    assert dets[0] is d


def test_nms_keeps_boxes_below_the_overlap_threshold_and_skips_suppressed_ones():
    a = det((0.0, 0, 2, 1), 0.9, [0.9])
    b = det((1.5, 0, 2, 1), 0.8, [0.8])  # IoU(a, b) = 0.5 / 3.5 ~ 0.14
    c = det((2.5, 0, 2, 1), 0.7, [0.7])  # IoU(b, c) = 1/3, a and c do not meet
    do_nms_sort([a, b, c], 1, 0.3)
    assert [float(x.probs[0]) for x in (a, b, c)] == pytest.approx([0.9, 0.8, 0.0])
    a2, b2 = det((0.0, 0, 2, 1), 0.9, [0.9]), det((1.0, 0, 2, 1), 0.8, [0.8])
    c2 = det((2.0, 0, 2, 1), 0.7, [0.7])
    do_nms_sort([c2, b2, a2], 1, 0.3)  # b2 falls to a2; c2 survives since b2 no longer counts
    assert [float(x.probs[0]) for x in (a2, b2, c2)] == pytest.approx([0.9, 0, 0.7])


def test_nms_obj_uses_objectness_across_classes():
    a = det((0.5, 0.5, 0.2, 0.2), 0.9, [0.9, 0])
    b = det((0.51, 0.5, 0.2, 0.2), 0.8, [0, 0.8])
    out = do_nms_obj([b, a], 2, 0.45)
    assert out[0] is a and b.objectness == 0 and not b.probs.any()


def test_box_iou_matches_darknet():
    rng = np.random.default_rng(3)
    boxes = rng.random((20, 4)).astype(F32) * [1, 1, 0.5, 0.5] + [0, 0, 0.01, 0.01]
    got = box_iou(boxes[:, None], boxes[None, :])
    want = np.array([[c_box_iou(p, q) for q in boxes] for p in boxes], dtype=F32)
    np.testing.assert_array_equal(got, want)


# ---- [yolo] training loss ------------------------------------------------------------------
def c_forward_yolo_loss(
    out,
    truth,
    batch,
    lw,
    lh,
    n,
    mask,
    classes,
    biases,
    netw,
    neth,
    ignore_thresh,
    truth_thresh,
    max_boxes=90,
    truths=90 * 5,
):
    """pjreddie's forward_yolo_layer from `*(l.cost) = 0` on, scalar by scalar. Also counts
    which branches ran, so the test can insist they did."""
    outputs = lw * lh * n * (4 + 1 + classes)
    delta = np.zeros(batch * outputs, dtype=F32)
    ran = dict(ignored=0, truth_thresh=0, masked_out=0, class_quirk=0, matched=0)

    def entry_index(b, location, entry):
        nn, loc = location // (lw * lh), location % (lw * lh)
        return b * outputs + nn * lw * lh * (4 + classes + 1) + entry * lw * lh + loc

    def get_yolo_box(x, nn, index, i, j, stride):
        return (
            F32((i + x[index]) / F32(lw)),
            F32((j + x[index + stride]) / F32(lh)),
            F32(math.exp(float(x[index + 2 * stride])) * float(biases[2 * nn]) / netw),
            F32(math.exp(float(x[index + 3 * stride])) * float(biases[2 * nn + 1]) / neth),
        )

    def delta_yolo_box(tr, x, nn, index, i, j, scale, stride):
        pred = get_yolo_box(x, nn, index, i, j, stride)
        iou = c_box_iou(pred, tr)
        tx = tr[0] * F32(lw) - F32(i)
        ty = tr[1] * F32(lh) - F32(j)
        tw = F32(math.log(float(tr[2] * F32(netw) / biases[2 * nn])))
        th = F32(math.log(float(tr[3] * F32(neth) / biases[2 * nn + 1])))
        delta[index] = scale * (tx - x[index])
        delta[index + stride] = scale * (ty - x[index + stride])
        delta[index + 2 * stride] = scale * (tw - x[index + 2 * stride])
        delta[index + 3 * stride] = scale * (th - x[index + 3 * stride])
        return iou

    def delta_yolo_class(output, index, cls, stride, stats):
        if delta[index]:
            ran["class_quirk"] += 1
            delta[index + stride * cls] = F32(1) - output[index + stride * cls]
            if stats is not None:
                stats["cat"] += output[index + stride * cls]
            return
        for k in range(classes):
            delta[index + stride * k] = F32(1 if k == cls else 0) - output[index + stride * k]
            if k == cls and stats is not None:
                stats["cat"] += output[index + stride * k]

    stats = dict(cat=0.0)
    for b in range(batch):
        for j in range(lh):
            for i in range(lw):
                for a in range(n):
                    box_index = entry_index(b, a * lw * lh + j * lw + i, 0)
                    pred = get_yolo_box(out, mask[a], box_index, i, j, lw * lh)
                    best_iou, best_t = F32(0), 0
                    for t in range(max_boxes):
                        tr = truth[t * 5 + b * truths :][:4]
                        if not tr[0]:
                            break
                        iou = c_box_iou(pred, tr)
                        if iou > best_iou:
                            best_iou, best_t = iou, t
                    obj_index = entry_index(b, a * lw * lh + j * lw + i, 4)
                    delta[obj_index] = F32(0) - out[obj_index]
                    if best_iou > ignore_thresh:
                        ran["ignored"] += 1
                        delta[obj_index] = 0
                    if best_iou > truth_thresh:
                        ran["truth_thresh"] += 1
                        delta[obj_index] = F32(1) - out[obj_index]
                        cls = int(truth[best_t * 5 + b * truths + 4])
                        class_index = entry_index(b, a * lw * lh + j * lw + i, 5)
                        delta_yolo_class(out, class_index, cls, lw * lh, None)
                        tr = truth[best_t * 5 + b * truths :][:4]
                        delta_yolo_box(
                            tr, out, mask[a], box_index, i, j, F32(2) - tr[2] * tr[3], lw * lh
                        )
        for t in range(max_boxes):
            tr = truth[t * 5 + b * truths :][:4]
            if not tr[0]:
                break
            best_iou, best_n = F32(0), 0
            i, j = int(tr[0] * F32(lw)), int(tr[1] * F32(lh))
            for k in range(len(biases) // 2):
                iou = c_box_iou(
                    (0, 0, biases[2 * k] / F32(netw), biases[2 * k + 1] / F32(neth)),
                    (0, 0, tr[2], tr[3]),
                )
                if iou > best_iou:
                    best_iou, best_n = iou, k
            if best_n not in mask:
                ran["masked_out"] += 1
                continue
            mask_n = mask.index(best_n)
            box_index = entry_index(b, mask_n * lw * lh + j * lw + i, 0)
            delta_yolo_box(tr, out, best_n, box_index, i, j, F32(2) - tr[2] * tr[3], lw * lh)
            obj_index = entry_index(b, mask_n * lw * lh + j * lw + i, 4)
            delta[obj_index] = F32(1) - out[obj_index]
            cls = int(truth[t * 5 + b * truths + 4])
            class_index = entry_index(b, mask_n * lw * lh + j * lw + i, 5)
            delta_yolo_class(out, class_index, cls, lw * lh, stats)
            ran["matched"] += 1
    mag = math.sqrt(sum(float(v) * float(v) for v in delta))
    return delta, mag**2, ran, stats["cat"]


YOLO_TRAIN = """[net]
width=64
height=32
channels=3
[convolutional]
filters=16
size=1
stride=1
activation=linear
[maxpool]
size=16
stride=16
[convolutional]
filters=16
size=1
stride=1
activation=linear
[yolo]
mask=1,2
anchors=6,5, 20,12, 40,24
classes=3
num=3
ignore_thresh=.5
truth_thresh=.8
"""


def yolo_case(layer, netw, neth, rng):
    """A random activated output and truths that reach every branch of the loss."""
    B, n, C, h, w = layer.batch, layer.n, layer.classes, layer.h, layer.w
    out = np.empty((B, n, 5 + C, h, w), dtype=F32)
    out[:, :, [0, 1, 4]] = rng.random((B, n, 3, h, w))
    out[:, :, 5:] = rng.random((B, n, C, h, w))
    out[:, :, 2:4] = rng.normal(0, 0.3, (B, n, 2, h, w))
    truth = np.zeros((B, 90, 5), dtype=F32)
    # Image 0: three boxes in cell (0, 1) matching anchor 2 (slot 1), classes 0, 2, 1, with
    # class 0 saturated to exactly 1 there: the first leaves class 0's delta at 0, so the
    # second sets every class and the third only its own (Darknet's delta_yolo_class tests
    # class 0's delta, not its own class's). Then a small box whose best anchor (0) is not
    # masked, and one matching anchor 1.
    truth[0, :5] = [
        [0.30, 0.25, 0.60, 0.70, 0],
        [0.33, 0.30, 0.62, 0.74, 2],
        [0.31, 0.28, 0.61, 0.72, 1],
        [0.80, 0.70, 0.09, 0.15, 1],
        [0.55, 0.60, 0.31, 0.37, 1],
    ]
    out[0, 1, 5, 0, 1] = 1.0
    # Image 1: a box fitted closely (IoU > truth_thresh) by the prediction of anchor slot 0,
    # which is not the box's best anchor (so pass 2 does not overwrite those deltas), and a
    # box with a looser fit (ignore_thresh < IoU = 1/1.4 < truth_thresh).
    truth[1, :2] = [[0.40, 0.40, 0.60, 0.75, 1], [0.85, 0.30, 0.30, 0.40, 2]]
    for tx, ty, tw, th, a, jitter in (
        (0.40, 0.40, 0.60, 0.75, 0, 1.0),
        (0.85, 0.30, 0.30, 0.40, 0, 1.4),
    ):
        i, j = int(tx * w), int(ty * h)
        out[1, a, 0, j, i] = tx * w - i
        out[1, a, 1, j, i] = ty * h - j
        anchor = layer.biases.reshape(-1, 2)[layer.mask[a]]
        out[1, a, 2, j, i] = math.log(tw * jitter * netw / anchor[0])
        out[1, a, 3, j, i] = math.log(th * netw / netw * neth / anchor[1])
    return out.reshape(-1), truth.reshape(-1)


def test_yolo_loss_matches_darknet_transcription():
    net = build(YOLO_TRAIN, batch=2)
    layer = net.layers[3]
    assert (layer.w, layer.h, layer.n) == (4, 2, 2)
    out, truth = yolo_case(layer, 64, 32, np.random.default_rng(5))
    want_delta, want_cost, ran, want_cat = c_forward_yolo_loss(
        out, truth, 2, 4, 2, 2, [1, 2], 3, layer.biases, 64, 32, F32(0.5), F32(0.8)
    )
    assert all(ran.values()), f"a branch of the loss never ran: {ran}"
    truths = [truth.reshape(2, 90, 5)[0, :5], truth.reshape(2, 90, 5)[1, :2]]
    delta, cost, stats = layer.loss(out, truths, 64, 32)
    np.testing.assert_allclose(delta, want_delta, rtol=1e-6, atol=1e-7)
    assert cost == pytest.approx(want_cost, rel=1e-6)
    assert stats["count"] == ran["matched"]
    assert stats["class"] * stats["count"] == pytest.approx(float(want_cat), rel=1e-6)


def test_yolo_training_forward_writes_delta_cost_and_backward_adds_it():
    net = build(YOLO_TRAIN, batch=2)
    rng = np.random.default_rng(7)
    x = rng.random((2, 3, 32, 64), dtype=F32)
    truth = np.zeros((2, 450), dtype=F32)
    truth[0, :10] = [0.3, 0.25, 0.6, 0.7, 0, 0.55, 0.6, 0.31, 0.37, 1]
    truth[1, :5] = [0.4, 0.4, 0.6, 0.75, 1]
    net.seen = 2
    net.forward(x, truth, train=True)
    layer = net.layers[3]
    out = net.layer_output(3).reshape(-1)
    raw = net.layer_output(2).reshape(2, 2, 8, 2, 4)
    act = raw.copy()
    act[:, :, [0, 1, 4, 5, 6, 7]] = sigmoid(raw[:, :, [0, 1, 4, 5, 6, 7]])
    np.testing.assert_allclose(out, act.reshape(-1), rtol=1e-6)  # logistic on all but w, h
    want_delta, want_cost, _, _ = c_forward_yolo_loss(
        out, truth.reshape(-1), 2, 4, 2, 2, [1, 2], 3, layer.biases, 64, 32, F32(0.5), F32(0.8)
    )
    np.testing.assert_allclose(net.layer_delta(3).reshape(-1), want_delta, rtol=1e-6, atol=1e-7)
    assert layer.cost == pytest.approx(want_cost, rel=1e-6)
    assert net.cost == pytest.approx(want_cost, rel=1e-6)
    assert layer.stats_line.startswith("Region 3 Avg IOU: ")
    net.delta = np.zeros(2 * layer.outputs, dtype=F32)
    layer.backward(net)
    np.testing.assert_array_equal(net.delta, want_delta)


def test_yolo_stats_print_only_when_verbose(capsys):
    net = build(YOLO_TRAIN, batch=1)
    x = np.zeros((1, 3, 32, 64), dtype=F32)
    truth = np.zeros((1, 450), dtype=F32)
    truth[0, :5] = [0.3, 0.25, 0.6, 0.7, 0]
    net.forward(x, truth, train=True)
    assert capsys.readouterr().out == ""
    net.verbose = True
    net.forward(x, truth, train=True)
    printed = capsys.readouterr().out
    assert printed.startswith("Region 3 Avg IOU: ") and printed.rstrip().endswith("count: 1")


# ---- [region] training loss ---------------------------------------------------------------
def c_forward_region_loss(
    out,
    truth,
    batch,
    w,
    h,
    n,
    classes,
    biases,
    seen,
    *,
    thresh,
    softmax,
    rescore,
    bias_match,
    coord_scale,
    object_scale,
    noobject_scale,
    class_scale,
    truths=90 * 5,
):
    """pjreddie's forward_region_layer (coords=4, no tree, no background) from
    `*(l.cost) = 0` on, scalar by scalar."""
    coords = 4
    outputs = w * h * n * (coords + classes + 1)
    delta = np.zeros(batch * outputs, dtype=F32)
    ran = dict(thresh_zeroed=0, class_quirk=0)

    def entry_index(b, location, entry):
        nn, loc = location // (w * h), location % (w * h)
        return b * outputs + nn * w * h * (coords + classes + 1) + entry * w * h + loc

    def get_region_box(x, nn, index, i, j, stride):
        return (
            F32((i + x[index]) / F32(w)),
            F32((j + x[index + stride]) / F32(h)),
            F32(math.exp(float(x[index + 2 * stride])) * float(biases[2 * nn]) / w),
            F32(math.exp(float(x[index + 3 * stride])) * float(biases[2 * nn + 1]) / h),
        )

    def delta_region_box(tr, x, nn, index, i, j, scale, stride):
        pred = get_region_box(x, nn, index, i, j, stride)
        iou = c_box_iou(pred, tr)
        tx = F32(tr[0]) * F32(w) - F32(i)
        ty = F32(tr[1]) * F32(h) - F32(j)
        tw = F32(math.log(float(F32(tr[2]) * F32(w) / biases[2 * nn])))
        th = F32(math.log(float(F32(tr[3]) * F32(h) / biases[2 * nn + 1])))
        for k, t in enumerate((tx, ty, tw, th)):
            delta[index + k * stride] = F32(scale) * (t - x[index + k * stride])
        return iou

    def delta_region_class(output, index, cls, scale, stride, tag, stats):
        if delta[index] and tag:
            ran["class_quirk"] += 1
            delta[index + stride * cls] = F32(scale) * (F32(1) - output[index + stride * cls])
            return
        for k in range(classes):
            delta[index + stride * k] = F32(scale) * (
                F32(1 if k == cls else 0) - output[index + stride * k]
            )
            if k == cls:
                stats["cat"] += float(output[index + stride * k])

    stats = dict(cat=0.0, count=0)
    for b in range(batch):
        for j in range(h):
            for i in range(w):
                for a in range(n):
                    box_index = entry_index(b, a * w * h + j * w + i, 0)
                    pred = get_region_box(out, a, box_index, i, j, w * h)
                    best_iou = F32(0)
                    for t in range(30):
                        tr = truth[t * 5 + b * truths :][:4]
                        if not tr[0]:
                            break
                        iou = c_box_iou(pred, tr)
                        if iou > best_iou:
                            best_iou = iou
                    obj_index = entry_index(b, a * w * h + j * w + i, coords)
                    delta[obj_index] = F32(noobject_scale) * (F32(0) - out[obj_index])
                    if best_iou > thresh:
                        ran["thresh_zeroed"] += 1
                        delta[obj_index] = 0
                    if seen < 12800:
                        prior = (
                            (i + 0.5) / w,
                            (j + 0.5) / h,
                            biases[2 * a] / F32(w),
                            biases[2 * a + 1] / F32(h),
                        )
                        delta_region_box(prior, out, a, box_index, i, j, 0.01, w * h)
        for t in range(30):
            tr = truth[t * 5 + b * truths :][:4]
            if not tr[0]:
                break
            best_iou, best_n = F32(0), 0
            i, j = int(tr[0] * F32(w)), int(tr[1] * F32(h))
            for a in range(n):
                box_index = entry_index(b, a * w * h + j * w + i, 0)
                pred = list(get_region_box(out, a, box_index, i, j, w * h))
                if bias_match:
                    pred[2], pred[3] = biases[2 * a] / F32(w), biases[2 * a + 1] / F32(h)
                pred[0] = pred[1] = 0
                iou = c_box_iou(pred, (0, 0, tr[2], tr[3]))
                if iou > best_iou:
                    best_iou, best_n = iou, a
            box_index = entry_index(b, best_n * w * h + j * w + i, 0)
            iou = delta_region_box(
                tr, out, best_n, box_index, i, j, F32(coord_scale) * (F32(2) - tr[2] * tr[3]), w * h
            )
            obj_index = entry_index(b, best_n * w * h + j * w + i, coords)
            delta[obj_index] = F32(object_scale) * (F32(1) - out[obj_index])
            if rescore:
                delta[obj_index] = F32(object_scale) * (iou - out[obj_index])
            cls = int(truth[t * 5 + b * truths + coords])
            class_index = entry_index(b, best_n * w * h + j * w + i, coords + 1)
            delta_region_class(out, class_index, cls, class_scale, w * h, not softmax, stats)
            stats["count"] += 1
    mag = math.sqrt(sum(float(v) * float(v) for v in delta))
    return delta, mag**2, ran, stats


REGION_TRAIN = """[net]
width=8
height=8
channels=3
[convolutional]
filters=18
size=4
stride=4
activation=linear
[region]
anchors=0.6,0.7, 1.5,1.2
bias_match=1
classes=4
coords=4
num=2
softmax={softmax}
rescore=1
thresh=.45
object_scale=5
noobject_scale=1
class_scale=2
coord_scale=1.5
"""


def region_truth():
    truth = np.zeros((2, 90, 5), dtype=F32)
    # Two boxes claiming the same cell and anchor (for the class quirk), one elsewhere.
    truth[0, :3] = [
        [0.30, 0.30, 0.30, 0.35, 1],
        [0.35, 0.28, 0.32, 0.33, 3],
        [0.70, 0.80, 0.60, 0.50, 0],
    ]
    truth[1, :1] = [[0.55, 0.45, 0.80, 0.70, 2]]
    return truth


@pytest.mark.parametrize("softmax,seen", [(1, 64), (0, 64), (1, 20000)])
def test_region_loss_matches_darknet_transcription(softmax, seen):
    net = build(REGION_TRAIN.format(softmax=softmax), batch=2, seed=4)
    layer = net.layers[1]
    x = np.random.default_rng(11).random((2, 3, 8, 8), dtype=F32)
    truth = region_truth()
    net.seen = seen
    net.forward(x, truth.reshape(2, -1), train=True)
    out = net.layer_output(1).reshape(-1)
    # Forward: logistic on x, y, objectness; softmax (or logistic) over each box's classes.
    raw = net.layer_output(0).reshape(2, 2, 9, 2, 2)
    act = raw.copy()
    act[:, :, [0, 1, 4]] = sigmoid(raw[:, :, [0, 1, 4]])
    if softmax:
        e = np.exp(raw[:, :, 5:] - raw[:, :, 5:].max(axis=2, keepdims=True))
        act[:, :, 5:] = e / e.sum(axis=2, keepdims=True)
    else:
        act[:, :, 5:] = sigmoid(raw[:, :, 5:])
    np.testing.assert_allclose(out, act.reshape(-1), rtol=1e-5, atol=1e-7)

    want_delta, want_cost, ran, stats = c_forward_region_loss(
        out,
        truth.reshape(-1),
        2,
        2,
        2,
        2,
        4,
        layer.biases,
        seen,
        thresh=F32(0.45),
        softmax=softmax,
        rescore=1,
        bias_match=1,
        coord_scale=1.5,
        object_scale=5,
        noobject_scale=1,
        class_scale=2,
    )
    assert ran["thresh_zeroed"] > 0
    assert (ran["class_quirk"] > 0) == (not softmax)
    np.testing.assert_allclose(net.layer_delta(1).reshape(-1), want_delta, rtol=1e-6, atol=1e-7)
    assert layer.cost == pytest.approx(want_cost, rel=1e-6)
    assert layer.stats["count"] == stats["count"] == 4
    assert layer.stats_line.startswith("Region Avg IOU: ")

    # Backward (Darknet's GPU one): times the logistic gradient on x, y and objectness.
    net.delta = np.zeros(2 * layer.outputs, dtype=F32)
    layer.backward(net)
    grad = np.ones((2, 2, 9, 2, 2), dtype=F32)
    y = out.reshape(2, 2, 9, 2, 2)[:, :, [0, 1, 4]]
    grad[:, :, [0, 1, 4]] = (1 - y) * y
    np.testing.assert_allclose(net.delta, want_delta * grad.reshape(-1), rtol=1e-6, atol=1e-8)


# ---- [detection] training loss --------------------------------------------------------------
def c_forward_detection_loss(
    out,
    truth,
    batch,
    side,
    n,
    classes,
    *,
    sqrt,
    rescore,
    coord_scale,
    object_scale,
    noobject_scale,
    class_scale,
    forced=0,
):
    """pjreddie's forward_detection_layer training part (random=0), scalar by scalar."""
    coords, locations = 4, side * side
    inputs = locations * ((1 + coords) * n + classes)
    delta = np.zeros(batch * inputs, dtype=F32)
    ran = dict(by_iou=0, by_rmse=0)
    count = 0
    for b in range(batch):
        index = b * inputs
        for i in range(locations):
            truth_index = (b * locations + i) * (1 + coords + classes)
            is_obj = int(truth[truth_index])
            for j in range(n):
                p_index = index + locations * classes + i * n + j
                delta[p_index] = F32(noobject_scale) * (F32(0) - out[p_index])
            best_index, best_iou, best_rmse = -1, F32(0), 20.0
            if not is_obj:
                continue
            class_index = index + i * classes
            for j in range(classes):
                delta[class_index + j] = F32(class_scale) * (
                    truth[truth_index + 1 + j] - out[class_index + j]
                )
            tb = truth[truth_index + 1 + classes :][:4].copy()
            tb[0] /= F32(side)
            tb[1] /= F32(side)
            for j in range(n):
                box_index = index + locations * (classes + n) + (i * n + j) * coords
                ob = out[box_index : box_index + 4].copy()
                ob[0] /= F32(side)
                ob[1] /= F32(side)
                if sqrt:
                    ob[2], ob[3] = ob[2] * ob[2], ob[3] * ob[3]
                iou = c_box_iou(ob, tb)
                rmse = c_box_rmse(ob, tb)
                if best_iou > 0 or iou > 0:
                    if iou > best_iou:
                        best_iou, best_index = iou, j
                        ran["by_iou"] += 1
                elif rmse < best_rmse:
                    best_rmse, best_index = rmse, j
                    ran["by_rmse"] += 1
            if forced:
                best_index = 1 if float(tb[2] * tb[3]) < 0.1 else 0
            box_index = index + locations * (classes + n) + (i * n + best_index) * coords
            tbox_index = truth_index + 1 + classes
            ob = out[box_index : box_index + 4].copy()
            ob[0] /= F32(side)
            ob[1] /= F32(side)
            if sqrt:
                ob[2], ob[3] = ob[2] * ob[2], ob[3] * ob[3]
            iou = c_box_iou(ob, tb)
            p_index = index + locations * classes + i * n + best_index
            delta[p_index] = F32(object_scale) * (F32(1) - out[p_index])
            if rescore:
                delta[p_index] = F32(object_scale) * (iou - out[p_index])
            for k in range(4):
                delta[box_index + k] = F32(coord_scale) * (
                    truth[tbox_index + k] - out[box_index + k]
                )
            if sqrt:
                for k in (2, 3):
                    delta[box_index + k] = F32(coord_scale) * (
                        F32(math.sqrt(float(truth[tbox_index + k]))) - out[box_index + k]
                    )
            count += 1
    mag = math.sqrt(sum(float(v) * float(v) for v in delta))
    return delta, mag**2, ran, count


DETECTION_TRAIN = """[net]
width=4
height=4
channels=2
[connected]
output={inputs}
activation=linear
[detection]
classes=3
coords=4
rescore=1
side=3
num=2
softmax={softmax}
sqrt=1
object_scale=1
noobject_scale=.5
class_scale=1
coord_scale=5
"""


def test_grid_truth_from_boxes_by_hand():
    boxes = [
        [0.75, 0.25, 0.2, 0.3, 2],  # cell (row 0, col 1)
        [0.80, 0.40, 0.5, 0.5, 0],  # same cell: ignored, the first box claimed it
        [0.20, 0.90, 0.004, 0.5, 1],
    ]  # too narrow: dropped
    truth = grid_truth_from_boxes(boxes, 2, 3).reshape(4, 8)
    np.testing.assert_allclose(truth[1], [1, 0, 0, 1, 0.5, 0.5, 0.2, 0.3], rtol=1e-6)
    assert not truth[[0, 2, 3]].any()


@pytest.mark.parametrize("softmax", [0, 1])
def test_detection_loss_matches_darknet_transcription(softmax):
    inputs = 9 * (5 * 2 + 3)
    net = build(DETECTION_TRAIN.format(inputs=inputs, softmax=softmax), batch=2, seed=2)
    layer = net.layers[1]
    rng = np.random.default_rng(9)
    net.layers[0].weights[:] = rng.normal(0, 0.3, net.layers[0].weights.size)
    net.layers[0].biases[:] = rng.uniform(0.1, 0.6, inputs)
    x = rng.random((2, 2, 4, 4), dtype=F32)
    boxes = np.zeros((2, 90, 5), dtype=F32)
    boxes[0, :3] = [[0.5, 0.5, 0.3, 0.4, 1], [0.1, 0.2, 0.2, 0.1, 0], [0.9, 0.85, 0.15, 0.2, 2]]
    boxes[1, :1] = [[0.4, 0.6, 0.6, 0.7, 2]]
    net.forward(x, boxes.reshape(2, -1), train=True)  # the loader's box rows
    out = net.layer_output(1).reshape(-1)
    if softmax:
        cls = out.reshape(2, -1)[:, :27].reshape(2, 9, 3)
        np.testing.assert_allclose(cls.sum(axis=2), 1, rtol=1e-6)
    else:
        np.testing.assert_array_equal(out, net.layer_output(0).reshape(-1))
    grid = np.concatenate([grid_truth_from_boxes(boxes[b], 3, 3) for b in range(2)])
    want_delta, want_cost, ran, count = c_forward_detection_loss(
        out,
        grid,
        2,
        3,
        2,
        3,
        sqrt=1,
        rescore=1,
        coord_scale=5,
        object_scale=1,
        noobject_scale=0.5,
        class_scale=1,
    )
    assert count == 4 and ran["by_iou"] > 0
    np.testing.assert_allclose(net.layer_delta(1).reshape(-1), want_delta, rtol=1e-6, atol=1e-7)
    assert layer.cost == pytest.approx(want_cost, rel=1e-6)
    # The grid form itself is accepted as it is.
    net.forward(x, grid.reshape(2, -1), train=True)
    np.testing.assert_allclose(net.layer_delta(1).reshape(-1), want_delta, rtol=1e-6, atol=1e-7)


def test_detection_reads_the_forks_six_field_truth_rows():
    """A fork-flavoured network's truth has a track id after each box's class: the
    [detection] layer must step by net.truth_size, not read it as rows of 5."""
    inputs = 9 * (5 * 2 + 3)
    text = DETECTION_TRAIN.format(inputs=inputs, softmax=0)
    net = Network(parse_cfg_text(text, "t.cfg"), "t.cfg", batch=1, seed=2, darknet="alexeyab")
    assert net.truth_size == 6
    rng = np.random.default_rng(4)
    net.layers[0].weights[:] = rng.normal(0, 0.3, net.layers[0].weights.size)
    net.layers[0].biases[:] = rng.uniform(0.1, 0.6, inputs)
    x = rng.random((1, 2, 4, 4), dtype=F32)
    boxes = np.zeros((1, 4, 6), dtype=F32)
    boxes[0, :3] = [
        [0.5, 0.5, 0.3, 0.4, 1, 7],
        [0.1, 0.2, 0.2, 0.1, 0, 8],
        [0.9, 0.85, 0.15, 0.2, 2, 9],
    ]
    net.forward(x, boxes.reshape(1, -1), train=True)
    out = net.layer_output(1).reshape(-1)
    grid = grid_truth_from_boxes(boxes[0, :3, :5], 3, 3)
    want_delta, want_cost, _, count = c_forward_detection_loss(
        out,
        grid,
        1,
        3,
        2,
        3,
        sqrt=1,
        rescore=1,
        coord_scale=5,
        object_scale=1,
        noobject_scale=0.5,
        class_scale=1,
    )
    assert count == 3
    np.testing.assert_allclose(net.layer_delta(1).reshape(-1), want_delta, rtol=1e-6, atol=1e-7)
    assert net.layers[1].cost == pytest.approx(want_cost, rel=1e-6)
    # The loader's rows of 5, made the fork's by truth_for_network, give the same loss.
    net.forward(x, net.truth_for_network(boxes[:, :, :5].reshape(1, -1)), train=True)
    np.testing.assert_allclose(net.layer_delta(1).reshape(-1), want_delta, rtol=1e-6, atol=1e-7)


def test_detection_loss_falls_back_to_rmse_when_no_box_overlaps():
    inputs = 9 * (5 * 2 + 3)
    net = build(DETECTION_TRAIN.format(inputs=inputs, softmax=0), batch=1)
    layer = net.layers[1]
    out = np.zeros(inputs, dtype=F32)
    base = 9 * (3 + 2)
    out[base + 4 * 4 :][:8] = [
        0.9,
        0.9,
        0.1,
        0.1,
        0.1,
        0.1,
        0.2,
        0.2,
    ]  # cell 2's boxes: far from truth
    grid = grid_truth_from_boxes([[0.85, 0.15, 0.2, 0.2, 1]], 3, 3)
    want_delta, want_cost, ran, _ = c_forward_detection_loss(
        out,
        grid,
        1,
        3,
        2,
        3,
        sqrt=1,
        rescore=1,
        coord_scale=5,
        object_scale=1,
        noobject_scale=0.5,
        class_scale=1,
    )
    assert ran["by_rmse"] > 0 and ran["by_iou"] == 0
    delta, cost, stats = layer.loss(out, grid[None], seen=0)
    np.testing.assert_allclose(delta, want_delta, rtol=1e-6, atol=1e-7)
    assert cost == pytest.approx(want_cost, rel=1e-6)
    assert stats["count"] == 1


def test_detection_loss_forced_picks_box_by_truth_area():
    inputs = 9 * (5 * 2 + 3)
    text = DETECTION_TRAIN.format(inputs=inputs, softmax=0).replace("sqrt=1", "sqrt=1\nforced=1")
    layer = build(text, batch=1).layers[1]
    out = np.random.default_rng(4).uniform(0.1, 0.9, inputs).astype(F32)
    # A small box (area < .1: box 1) and a large one (box 0), whatever the IoUs say.
    grid = grid_truth_from_boxes([[0.15, 0.15, 0.2, 0.3, 0], [0.8, 0.8, 0.5, 0.6, 2]], 3, 3)
    kw = dict(sqrt=1, rescore=1, coord_scale=5, object_scale=1, noobject_scale=0.5, class_scale=1)
    want, want_cost, _, _ = c_forward_detection_loss(out, grid, 1, 3, 2, 3, forced=1, **kw)
    unforced, _, _, _ = c_forward_detection_loss(out, grid, 1, 3, 2, 3, **kw)
    assert not np.array_equal(want, unforced)
    delta, cost, _ = layer.loss(out, grid[None], seen=0)
    np.testing.assert_allclose(delta, want, rtol=1e-6, atol=1e-7)
    assert cost == pytest.approx(want_cost, rel=1e-6)


# ---- layer definitions ---------------------------------------------------------------------
def test_wrong_filter_count_names_the_fix():
    bad = YOLO_HEAD.replace("channels=14", "channels=12")
    with pytest.raises(CfgError, match="filters=14"):
        build(bad)
    with pytest.raises(CfgError, match="mask"):
        build(YOLO_HEAD.replace("mask=1,2", "mask=1,3"))
    with pytest.raises(CfgError, match="filters=16"):
        build(REGION_HEAD.replace("channels=16", "channels=15"))
    with pytest.raises(CfgError, match="side"):
        build(DETECTION_HEAD.replace("channels=48", "channels=47"))


def test_layer_table_rows_read_as_darknets():
    lines = [
        build(YOLO_HEAD).summary()[1],
        build(REGION_HEAD).summary()[1],
        build(DETECTION_HEAD).summary()[1],
    ]
    assert [l.rstrip() for l in lines] == ["    0 yolo", "    0 detection", "    0 Detection Layer"]


# ---- detect / classify on real images ---------------------------------------------------------
def p2_net():
    d = FIXTURES / "p2_tinyyolo"
    net = darknet_py.load_network(
        d / "p2_tinyyolo.cfg", d / "p2_tinyyolo.weights", device="cpu", engine="numpy"
    )
    net.names = ["cat", "dog", "bird"]
    return net


@needs_p2
@needs_photo
def test_detect_on_a_photo_and_draw(tmp_path):
    import cv2

    net = p2_net()
    path = SHARED / "images" / "dog.jpg"
    dets = detect(net, path, thresh=0.3, nms=0.45)
    assert dets, "the random-weight p2 net gives scores near 0.5: some pass 0.3"
    assert net.batch == 1
    probs = [d.prob for d in dets]
    assert probs == sorted(probs, reverse=True)
    for d in dets:
        assert 0 <= d.class_id < 3 and d.name == net.names[d.class_id]
        assert d.prob > 0.3 and d.prob == pytest.approx(float(d.probs[d.class_id]))
        assert d.prob == pytest.approx(float(d.probs.max()))
        assert len(d.box) == 4 and all(math.isfinite(v) for v in d.box) and d.box[2] > 0
    # After NMS no two kept boxes of one class overlap by more than the threshold.
    for c in range(3):
        boxes = np.array([d.box for d in dets if d.probs[c] > 0.3], dtype=F32).reshape(-1, 4)
        iou = box_iou(boxes[:, None], boxes[None, :])
        np.fill_diagonal(iou, 0)
        assert (iou <= 0.45).all()

    # The same photo as an OpenCV BGR array and as a Darknet float image: same detections.
    bgr = cv2.imread(str(path))
    for image in (bgr, load_image(path)):
        again = detect(net, image, thresh=0.3)
        assert [(d.class_id, round(d.prob, 5)) for d in again] == [
            (d.class_id, round(d.prob, 5)) for d in dets
        ]

    drawn = draw_detections(bgr, dets, net.names)
    assert drawn.shape == bgr.shape and drawn.dtype == np.uint8
    assert (drawn != bgr).any() and (cv2.imread(str(path)) == bgr).all()  # input untouched
    out = tmp_path / "predictions.jpg"
    assert cv2.imwrite(str(out), drawn)
    assert cv2.imread(str(out)).shape == bgr.shape

    rows = detections_to_json(dets, bgr.shape[1], bgr.shape[0])
    assert len(rows) == len(dets)
    for row, d in zip(rows, dets):
        assert row["name"] == d.name and row["class_id"] == d.class_id
        b = row["box"]
        assert 0 <= b["left"] and b["left"] + b["width"] <= bgr.shape[1] - 1
        assert 0 <= b["top"] and b["top"] + b["height"] <= bgr.shape[0] - 1
        assert row["relative_box"]["x"] == pytest.approx(d.box[0], abs=1e-6)


@needs_p2
@needs_photo
def test_detect_boxes_follow_darknets_letterbox_mapping():
    net = p2_net()
    img = load_image(SHARED / "images" / "person.jpg")
    dets = detect(net, img, thresh=0.25, nms=0)
    # Recompute one detection's box from the raw yolo output by hand.
    net.predict(letterbox(img, 96, 96)[None])
    h, w = img.shape[1:]
    new_w, new_h = (96, h * 96 // w) if 96 / w < 96 / h else (w * 96 // h, 96)
    layer = net.layers[23]
    out = net.layer_output(23)[0].reshape(3, 8, 6, 6)
    a, row, col = np.unravel_index(np.argmax(out[:, 4]), (3, 6, 6))
    e = out[a, :, row, col]
    x = (col + e[0]) / 6
    bw = math.exp(e[2]) * layer.biases[2 * layer.mask[a]] / 96
    x_img = (x - (96 - new_w) / 2 / 96) / (new_w / 96)
    match = [d for d in dets if d.objectness == pytest.approx(float(e[4]))]
    assert match and match[0].box[0] == pytest.approx(x_img, rel=1e-5)
    assert match[0].box[2] == pytest.approx(bw * 96 / new_w, rel=1e-5)


@pytest.mark.skipif(not (FIXTURES / "p1_classifier").is_dir(), reason="fixtures not found")
@needs_photo
def test_classify_letterboxes_and_ranks_like_darknet():
    d = FIXTURES / "p1_classifier"
    net = darknet_py.load_network(
        d / "p1_classifier.cfg", d / "p1_classifier.weights", device="cpu", engine="numpy"
    )
    net.names = [f"class{i}" for i in range(10)]
    path = SHARED / "images" / "eagle.jpg"
    top = classify(net, path, top=3)
    assert net.batch == 1
    probs = net.predict(letterbox(load_image(path), 32, 32)[None]).reshape(-1)
    order = np.argsort(-probs, kind="stable")[:3]
    assert [t[0] for t in top] == order.tolist()
    assert [t[1] for t in top] == pytest.approx(probs[order].tolist())
    assert [t[2] for t in top] == [f"class{i}" for i in order]
    net.names = None
    assert all(name is None for _, _, name in classify(net, to_bgr(load_image(path))))
    assert len(classify(net, path, top=20)) == 10


def test_detect_refuses_a_classifier():
    net = build("[net]\nwidth=4\nheight=4\nchannels=3\n[avgpool]\n")
    with pytest.raises(ValueError, match="classify"):
        detect(net, np.zeros((3, 4, 4), dtype=F32))


# ---- the same on CUDA ---------------------------------------------------------------------------
def _cuda_ready():
    from darknet_py.backends import cuda_available

    return cuda_available()


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda_ready(), reason="needs PyCUDA and a CUDA GPU")
@pytest.mark.parametrize("head", ["yolo", "region", "detection"])
def test_heads_train_the_same_on_cuda(head):
    from darknet_py.backends import get_backend

    rng = np.random.default_rng(21)
    if head == "yolo":
        text, shape, truth = YOLO_TRAIN, (2, 3, 32, 64), np.zeros((2, 90, 5), dtype=F32)
        truth[0, :2] = [[0.3, 0.25, 0.6, 0.7, 0], [0.55, 0.6, 0.31, 0.37, 1]]
        truth[1, :1] = [[0.4, 0.4, 0.6, 0.75, 2]]
    elif head == "region":
        text, shape, truth = REGION_TRAIN.format(softmax=1), (2, 3, 8, 8), region_truth()
    else:
        text = DETECTION_TRAIN.format(inputs=9 * 13, softmax=1)
        shape, truth = (2, 2, 4, 4), np.zeros((2, 90, 5), dtype=F32)
        truth[0, :2] = [[0.5, 0.5, 0.3, 0.4, 1], [0.1, 0.2, 0.2, 0.1, 0]]
        truth[1, :1] = [[0.4, 0.6, 0.6, 0.7, 2]]
    x = rng.random(shape, dtype=F32)
    nets = [
        Network(
            parse_cfg_text(text, "t.cfg"), "t.cfg", batch=2, seed=3, backend=get_backend(device)
        )
        for device in ("cpu", "cuda")
    ]
    for net in nets:
        net.seen = 2
        net.forward(x, truth.reshape(2, -1), train=True)
        net.backward()
    cpu, gpu = nets
    last = len(cpu.layers) - 1
    assert gpu.cost == pytest.approx(cpu.cost, rel=1e-4)
    for i in (last, last - 1):
        np.testing.assert_allclose(gpu.layer_delta(i), cpu.layer_delta(i), rtol=1e-4, atol=1e-5)


def test_detect_converts_images_to_the_networks_channels(tmp_path):
    """A greyscale detector (channels=1) takes colour input in every form detect() accepts;
    colour becomes grey by OpenCV's luma weights, as IMREAD_GRAYSCALE reads the file."""
    import cv2

    from darknet_py import load_network
    from darknet_py.image import load_image, match_channels

    cfg = Path(__file__).resolve().parents[1] / "cfg" / "digits-yolo.cfg"
    net = load_network(cfg, batch=1, device="cpu", seed=3)
    assert net.input_shape[0] == 1
    for layer in net.layers:  # fresh BN statistics are zero variance: make them usable
        if getattr(layer, "batch_normalize", 0):
            net.be.write(layer.rolling_variance, np.ones(layer.out_c))
    rng = np.random.default_rng(5)
    bgr = (rng.random((40, 56, 3)) * 255).astype(np.uint8)
    path = tmp_path / "colour.png"
    cv2.imwrite(str(path), bgr)
    colour = load_image(path)  # (3, H, W), as the CLI loads it for drawing
    grey = match_channels(colour, 1)
    assert grey.shape == (1, 40, 56)
    ref = cv2.imread(str(path), cv2.IMREAD_GRAYSCALE).astype(np.float32) / 255
    assert np.abs(grey[0] - ref).max() <= 1.5 / 255  # OpenCV rounds to uint8 in fixed point
    from_path, from_bgr, from_float = (
        net.detect(image, thresh=0.01) for image in (str(path), bgr, colour)
    )
    assert from_path, "random weights at thresh .01 should give some boxes"
    # The BGR array and the float image take the same conversion: identical results.
    assert [(d.class_id, d.prob) for d in from_bgr] == [(d.class_id, d.prob) for d in from_float]
    # The file is read as grey by OpenCV (rounded to uint8, checked above), so near-tied
    # random-weight boxes may reorder: compare the strongest box only.
    assert from_path[0].prob == pytest.approx(from_bgr[0].prob, abs=0.02)


def test_pixel_box_clamps_and_never_goes_negative():
    from darknet_py.predictions import pixel_box

    assert pixel_box((0.5, 0.5, 0.5, 0.5), 100, 80) == (25, 20, 75, 60)
    assert pixel_box((0.0, 0.0, 0.5, 0.5), 100, 80) == (0, 0, 25, 20)
    # centre below and right of the image: a zero-size box on the border
    left, top, right, bottom = pixel_box((1.4, 1.3, 0.2, 0.2), 100, 80)
    assert (left, top) == (99, 79) and right - left == 0 and bottom - top == 0
