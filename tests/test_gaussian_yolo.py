"""[Gaussian_yolo] (darknet_py/layers/gaussian_yolo.py) against plain-loop transcriptions of
the AlexeyAB fork's gaussian_yolo_layer.c: forward, detections, the training delta, cost
and statistics, and a finite-difference check of the delta where it is a gradient."""

import math

import numpy as np
import pytest
from helpers import c_iou

from darknet_py.boxes import box_giou, box_iou_kind, dx_box_iou
from darknet_py.cfg import CfgError, parse_cfg_text
from darknet_py.losses.gaussian_yolo import gaussian_box_delta
from darknet_py.network import Network

F32 = np.float32
W, H, CLASSES, TOTAL = 4, 3, 3, 4
MASK = [1, 3]
ENTRIES = 9 + CLASSES
ANCHORS = [0.4, 0.45, 0.9, 0.7, 1.5, 1.4, 2.5, 2.1]  # in input pixels
NETW, NETH = W, H  # the head reads the network input directly


def build(extra="", batch=2):
    text = (
        f"[net]\nwidth={W}\nheight={H}\nchannels={len(MASK) * ENTRIES}\n"
        f"[Gaussian_yolo]\nmask={','.join(map(str, MASK))}\n"
        f"anchors={','.join(map(str, ANCHORS))}\nclasses={CLASSES}\nnum={TOTAL}\n" + extra
    )
    net = Network(parse_cfg_text(text, "g.cfg"), "g.cfg", batch=batch)
    assert net.darknet == "alexeyab"
    return net


def logistic(x):
    return (1 / (1 + np.exp(-np.float64(x)))).astype(F32)


# ---- the fork's code, transcribed loop by loop -------------------------------------------------
def c_index(b, location, entry, outputs):
    n, loc = location // (W * H), location % (W * H)
    return b * outputs + n * W * H * ENTRIES + entry * W * H + loc


def c_forward(inp, batch, scale_x_y):
    out = np.array(inp, dtype=F32).reshape(-1).copy()
    outputs, wh = len(MASK) * ENTRIES * W * H, W * H
    for b in range(batch):
        for n in range(len(MASK)):
            for entry, count, scaled in (
                (0, 2, True),
                (2, 2, True),
                (5, 1, False),
                (7, 1, False),
                (8, 1 + CLASSES, False),
            ):
                k = c_index(b, n * wh, entry, outputs)
                out[k : k + count * wh] = logistic(out[k : k + count * wh])
                if scaled:
                    out[k : k + wh] = out[k : k + wh] * F32(scale_x_y) - F32(0.5 * (scale_x_y - 1))
    return out


def c_box(x, n, index, i, j, netw, neth, stride, point):
    bw = F32(math.exp(x[index + 4 * stride]) * ANCHORS[2 * n] / netw)
    bh = F32(math.exp(x[index + 6 * stride]) * ANCHORS[2 * n + 1] / neth)
    bx = F32((i + x[index]) / W)
    by = F32((j + x[index + 2 * stride]) / H)
    if point == "left_top":
        bx, by = bx + bw / 2, by + bh / 2
    elif point == "right_bottom":
        bx, by = bx - bw / 2, by - bh / 2
    return np.array([bx, by, bw, bh], dtype=F32)


def c_delta_box(truth, x, n, index, i, j, delta, scale, stride, o):
    """delta_gaussian_yolo_box with accumulate=1; o: the layer's options."""
    pred = c_box(x, n, index, i, j, NETW, NETH, stride, o["point"])
    iou = c_iou(pred, truth)
    giou = float(box_giou(pred, truth))
    if pred[2] == 0:
        pred[2] = 1
    if pred[3] == 0:
        pred[3] = 1
    tx, ty = truth[0] * W - i, truth[1] * H - j
    if o["point"] == "left_top":
        tx, ty = (truth[0] - truth[2] / 2) * W - i, (truth[1] - truth[3] / 2) * H - j
    elif o["point"] == "right_bottom":
        tx, ty = (truth[0] + truth[2] / 2) * W - i, (truth[1] + truth[3] / 2) * H - j
    tw = math.log(truth[2] * NETW / ANCHORS[2 * n])
    th = math.log(truth[3] * NETH / ANCHORS[2 * n + 1])
    deltas, uncert = [], []
    for k, t in enumerate((tx, ty, tw, th)):
        mu, sigma = float(x[index + 2 * k * stride]), float(x[index + (2 * k + 1) * stride])
        z = (t - mu) / sigma
        normal = math.exp(-z * z / 2) / (math.sqrt(2 * math.pi) * (sigma + 0.3))
        temp = 0.5 / (normal + 1e-9) * normal * scale
        deltas.append(temp * z / sigma)
        uncert.append(temp * (z * z / sigma - 1 / (sigma + 0.3)))
    if o["iou_loss"] != "mse":
        iou = giou
        dx, dy, dw, dh = (float(v) for v in dx_box_iou(pred, truth, o["iou_loss"]))
        if o["point"] == "left_top":
            dx, dy = dx - dw / 2, dy - dh / 2
        elif o["point"] == "right_bottom":
            dx, dy = dx + dw / 2, dy + dh / 2
        dw *= math.exp(x[index + 4 * stride])
        dh *= math.exp(x[index + 6 * stride])
        deltas = [dx, dy, dw, dh]
    for k in range(4):
        dc = deltas[k] * o["iou_norm"]
        du = uncert[k] * o["uc_norm"]
        dc, du = (0.0 if not math.isfinite(v) else v for v in (dc, du))
        if o["max_delta"] is not None:
            dc = min(max(dc, -o["max_delta"]), o["max_delta"])
            du = min(max(du, -o["max_delta"]), o["max_delta"])
        delta[index + 2 * k * stride] += dc
        delta[index + (2 * k + 1) * stride] += du
    return iou


def c_delta_class(output, delta, index, class_id, stride, o, mult):
    eps = o["eps"]
    if delta[index]:
        y = 1 * (1 - eps) + 0.5 * eps if eps else 1
        delta[index + stride * class_id] = y - output[index + stride * class_id]
        delta[index + stride * class_id] *= mult
        return output[index + stride * class_id]
    for c in range(CLASSES):
        y = float(c == class_id)
        if eps:
            y = y * (1 - eps) + 0.5 * eps
        delta[index + stride * c] = y - output[index + stride * c]
        if c == class_id:
            delta[index + stride * c] *= mult
    return output[index + stride * class_id]


def c_loss(output, truth, batch, o):
    """forward_gaussian_yolo_layer's training part; truth (batch, boxes, 5)."""
    out = np.asarray(output, dtype=np.float64)
    outputs, wh = len(MASK) * ENTRIES * W * H, W * H
    delta = np.zeros_like(out)
    mults = o["mults"] or [1.0] * CLASSES
    avg_iou = recall = recall75 = avg_cat = avg_obj = avg_anyobj = 0.0
    count = 0
    for b in range(batch):
        boxes = [t for t in truth[b] if t[0]]
        for j in range(H):
            for i in range(W):
                for n in range(len(MASK)):
                    loc = n * wh + j * W + i
                    box_index = c_index(b, loc, 0, outputs)
                    pred = c_box(out, MASK[n], box_index, i, j, NETW, NETH, wh, o["point"])
                    best_match_iou = best_iou = 0
                    best_t = 0
                    class_index = c_index(b, loc, 9, outputs)
                    match = any(out[class_index + wh * c] > 0.25 for c in range(CLASSES))
                    for t, tb in enumerate(boxes):
                        iou = c_iou(pred, tb[:4])
                        if iou > best_match_iou and match:
                            best_match_iou = iou
                        if iou > best_iou:
                            best_iou, best_t = iou, t
                    obj_index = c_index(b, loc, 8, outputs)
                    avg_anyobj += out[obj_index]
                    delta[obj_index] = o["cls_norm"] * (0 - out[obj_index])
                    if best_match_iou > o["ignore"]:
                        delta[obj_index] = 0
                    if best_iou > o["truth_thresh"]:
                        delta[obj_index] = o["cls_norm"] * (1 - out[obj_index])
                        cid = int(boxes[best_t][4])
                        c_delta_class(out, delta, class_index, cid, wh, o, mults[cid])
                        tb = boxes[best_t]
                        c_delta_box(
                            tb[:4],
                            out,
                            MASK[n],
                            box_index,
                            i,
                            j,
                            delta,
                            2 - tb[2] * tb[3],
                            wh,
                            dict(o, iou_norm=o["iou_norm"] * mults[cid]),
                        )
        for tb in boxes:
            if o["point"] == "center":
                i, j = int(tb[0] * W), int(tb[1] * H)
            else:
                sign = 1 if o["point"] == "left_top" else -1
                i = int(min(W - 1, max(0, (tb[0] - sign * tb[2] / 2) * W)))
                j = int(min(H - 1, max(0, (tb[1] - sign * tb[3] / 2) * H)))
            shift = np.array([0, 0, tb[2], tb[3]], dtype=F32)
            best_iou, best_n = 0, 0
            for n in range(TOTAL):
                anchor = np.array(
                    [0, 0, ANCHORS[2 * n] / NETW, ANCHORS[2 * n + 1] / NETH], dtype=F32
                )
                iou = c_iou(anchor, shift)
                if iou > best_iou:
                    best_iou, best_n = iou, n
            chosen = [best_n] if best_n in MASK else []
            for n in range(TOTAL):
                if n in MASK and n != best_n and o["iou_thresh"] < 1:
                    anchor = np.array(
                        [0, 0, ANCHORS[2 * n] / NETW, ANCHORS[2 * n + 1] / NETH], dtype=F32
                    )
                    if float(box_iou_kind(anchor, shift, o["iou_thresh_kind"])) > o["iou_thresh"]:
                        chosen.append(n)
            for n in chosen:
                mask_n = MASK.index(n)
                cid = int(tb[4])
                loc = mask_n * wh + j * W + i
                box_index = c_index(b, loc, 0, outputs)
                iou = c_delta_box(
                    tb[:4],
                    out,
                    n,
                    box_index,
                    i,
                    j,
                    delta,
                    2 - tb[2] * tb[3],
                    wh,
                    dict(o, iou_norm=o["iou_norm"] * mults[cid]),
                )
                obj_index = c_index(b, loc, 8, outputs)
                avg_obj += out[obj_index]
                delta[obj_index] = mults[cid] * o["cls_norm"] * (1 - out[obj_index])
                avg_cat += c_delta_class(
                    out, delta, c_index(b, loc, 9, outputs), cid, wh, o, mults[cid]
                )
                count += 1
                recall += iou > 0.5
                recall75 += iou > 0.75
                avg_iou += iou
        for j in range(H):
            for i in range(W):
                for n in range(len(MASK)):
                    loc = n * wh + j * W + i
                    box_index = c_index(b, loc, 0, outputs)
                    class_index = c_index(b, loc, 9, outputs)
                    told = sum(delta[class_index + wh * c] > 0 for c in range(CLASSES))
                    if told:
                        for k in range(8):
                            delta[box_index + k * wh] /= told
    stats = {
        "count": count,
        "avg_iou": avg_iou / count,
        "class": avg_cat / count,
        "obj": avg_obj / count,
        "no_obj": avg_anyobj / (W * H * len(MASK) * batch),
        "recall": recall / count,
        "recall75": recall75 / count,
    }
    return delta, float(np.sum(delta**2)), stats


CASES = {
    "mse": ("", dict(iou_loss="mse", point="center")),
    "giou_iou_thresh_scaled": (
        "iou_loss=giou\niou_thresh=0.1\nscale_x_y=1.1\n"
        "iou_normalizer=0.5\nuc_normalizer=0.7\ncls_normalizer=1.3\n",
        dict(
            iou_loss="giou",
            point="center",
            iou_thresh=0.1,
            iou_norm=0.5,
            uc_norm=0.7,
            cls_norm=1.3,
            scale=1.1,
        ),
    ),
    "ciou_left_top_counters": (
        "iou_loss=ciou\nyolo_point=left_top\ncounters_per_class=5,20,10\n"
        "label_smooth_eps=0.1\nmax_delta=3\ntruth_thresh=0.2\n"
        "ignore_thresh=0.3\n",
        dict(
            iou_loss="ciou",
            point="left_top",
            # get_classes_multipliers: 20/count, capped at max_delta
            mults=[3.0, 1.0, 2.0],
            eps=0.1,
            max_delta=3.0,
            truth_thresh=0.2,
            ignore=0.3,
        ),
    ),
    "mse_right_bottom_diou_kind": (
        "yolo_point=right_bottom\niou_thresh=0.05\niou_thresh_kind=diou\ntruth_thresh=0.1\n",
        dict(
            iou_loss="mse",
            point="right_bottom",
            iou_thresh=0.05,
            iou_thresh_kind="diou",
            truth_thresh=0.1,
        ),
    ),
}
DEFAULTS = dict(
    iou_norm=0.75,
    uc_norm=1.0,
    cls_norm=1.0,
    eps=0.0,
    max_delta=None,
    mults=None,
    iou_thresh=1.0,
    iou_thresh_kind="iou",
    truth_thresh=1.0,
    ignore=0.5,
    scale=1.0,
)


def truths():
    t = np.zeros((2, 200, 6), dtype=F32)
    t[0, :3] = [
        [0.3, 0.4, 0.2, 0.3, 1, 0],
        [0.7, 0.6, 0.5, 0.45, 2, 0],
        [0.32, 0.42, 0.15, 0.25, 0, 0],
    ]
    t[1, :2] = [[0.55, 0.5, 0.1, 0.12, 0, 0], [0.9, 0.2, 0.6, 0.3, 1, 0]]
    return t


@pytest.mark.parametrize("case", list(CASES))
def test_forward_and_training_delta_match_the_forks_code(case):
    extra, opts = CASES[case]
    o = dict(DEFAULTS, **opts)
    net = build(extra)
    layer = net.layers[0]
    rng = np.random.default_rng(5)
    x = rng.normal(0, 1.5, (2, len(MASK) * ENTRIES, H, W)).astype(F32)
    truth = truths()
    net.forward(x, truth.reshape(2, -1), train=True)
    out = net.layer_output(0).reshape(-1)
    np.testing.assert_allclose(out, c_forward(x, 2, o["scale"]), rtol=1e-6, atol=1e-7)
    want_delta, want_cost, want = c_loss(out, truth, 2, o)
    got_delta = net.layer_delta(0).reshape(-1)
    np.testing.assert_allclose(
        got_delta, want_delta, rtol=2e-4, atol=2e-5 * np.abs(want_delta).max()
    )
    assert layer.cost == pytest.approx(want_cost, rel=1e-4)
    for key, value in want.items():
        assert layer.stats[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    # The box entries carry deltas where truths were assigned, and the σs too.
    assert np.count_nonzero(want_delta.reshape(2, len(MASK), ENTRIES, -1)[:, :, 1]) > 0
    line = layer.stats_line
    assert line.startswith(f"Region 0 Avg IOU: {want['avg_iou']:f}, Class: ")
    assert f"count: {want['count']}, class_loss = " in line and ", uc_loss = " in line


def test_stats_split_the_loss_the_forks_way():
    net = build()
    layer = net.layers[0]
    x = np.random.default_rng(2).normal(0, 1, (2, len(MASK) * ENTRIES, H, W)).astype(F32)
    net.forward(x, truths().reshape(2, -1), train=True)
    d = net.layer_delta(0).reshape(2, len(MASK), ENTRIES, H * W).astype(np.float64)
    st = layer.stats
    assert st["class_loss"] == pytest.approx(np.sum(d[:, :, 8:] ** 2) / 2, rel=1e-5)
    assert st["uc_loss"] == pytest.approx(np.sum(d[:, :, 4:8] ** 2) / 2, rel=1e-5)
    assert st["iou_loss"] == pytest.approx(np.sum(d[:, :, :4] ** 2) / 2, rel=1e-5)
    assert st["total_loss"] == pytest.approx(layer.cost / 2, rel=1e-6)


def test_box_delta_is_the_negative_gradient_of_the_gaussian_likelihood():
    """With mse and both normalizers 1, delta_gaussian_yolo_box is -dL/d(output) for
    L = (2 - w*h)/2 * Σ_coords (z²/2 + log(σ + 0.3)), z = (target - μ)/σ."""
    net = build("iou_normalizer=1\n", batch=1)
    layer = net.layers[0]
    rng = np.random.default_rng(8)
    o = rng.uniform(0.3, 0.7, (len(MASK), ENTRIES, H, W)).astype(F32)
    a, j, i, anchor = 1, 1, 2, MASK[1]
    o[a, [4, 6], j, i] = [0.2, -0.3]  # w and h are not squashed
    t = np.array([(i + 0.4) / W, (j + 0.7) / H, 0.35, 0.3, 1], dtype=F32)
    d = np.zeros_like(o)
    gaussian_box_delta(layer, t, o, d, anchor, a, j, i, NETW, NETH, F32(1))
    target = np.array(
        [
            t[0] * W - i,
            t[1] * H - j,
            math.log(t[2] * NETW / ANCHORS[2 * anchor]),
            math.log(t[3] * NETH / ANCHORS[2 * anchor + 1]),
        ]
    )
    scale = 2 - float(t[2]) * float(t[3])

    def loss(e):
        mu, sigma = e[[0, 2, 4, 6]], e[[1, 3, 5, 7]]
        z = (target - mu) / sigma
        return scale / 2 * np.sum(z * z / 2 + np.log(sigma + 0.3))

    e = o[a, :8, j, i].astype(np.float64)
    step = 1e-5
    for k in range(8):
        up, down = e.copy(), e.copy()
        up[k] += step
        down[k] -= step
        numeric = -(loss(up) - loss(down)) / (2 * step)
        assert d[a, k, j, i] == pytest.approx(numeric, rel=1e-3, abs=1e-4), k
    assert not np.delete(
        d.reshape(-1), [np.ravel_multi_index((a, k, j, i), d.shape) for k in range(8)]
    ).any()


def c_detections(out, thresh, point):
    """get_gaussian_yolo_detections for image 0 (boxes before correction)."""
    wh = W * H
    outputs = len(MASK) * ENTRIES * wh
    dets = []
    for cell in range(wh):
        row, col = cell // W, cell % W
        for n in range(len(MASK)):
            obj = out[c_index(0, n * wh + cell, 8, outputs)]
            if obj <= thresh:
                continue
            box = c_box(
                out, MASK[n], c_index(0, n * wh + cell, 0, outputs), col, row, NETW, NETH, wh, point
            )
            uc = [out[c_index(0, n * wh + cell, e, outputs)] for e in (1, 3, 5, 7)]
            aver = sum(uc) / 4
            probs = [
                obj * out[c_index(0, n * wh + cell, 9 + c, outputs)] * (1 - aver)
                for c in range(CLASSES)
            ]
            dets.append((box, obj, [p if p > thresh else 0 for p in probs]))
    return dets


@pytest.mark.parametrize("point", ["center", "left_top"])
def test_detections_weigh_probabilities_by_the_uncertainty(point):
    net = build(f"yolo_point={point}\n", batch=1)
    layer = net.layers[0]
    x = np.random.default_rng(3).normal(0, 1.5, (1, len(MASK) * ENTRIES, H, W)).astype(F32)
    net.forward(x)
    out = net.layer_output(0).reshape(-1)
    want = c_detections(out, 0.4, point)
    got = layer.detections(out, NETW, NETH, NETW, NETH, 0.4, relative=True, letter=False)
    assert len(got) == len(want) > 3
    for g, (box, obj, probs) in zip(got, want):
        np.testing.assert_allclose(g.box, box, rtol=1e-5)
        assert g.objectness == pytest.approx(obj)
        np.testing.assert_allclose(g.probs, probs, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize(
    "extra,key,message",
    [
        ("new_coords=1\n", "new_coords", "has no new_coords"),
        ("yolo_point=middle\n", "yolo_point", "unknown value 'middle'"),
        ("iou_loss=l1\n", "iou_loss", "unknown value 'l1'"),
        ("map=labels.map\n", "map", "not supported"),
    ],
)
def test_options_that_do_not_fit_are_refused(extra, key, message):
    with pytest.raises(CfgError) as e:
        build(extra, batch=1)
    assert e.value.key == key and message in str(e.value)


@pytest.mark.parametrize(
    "head,key,message",
    [
        ("mask=0,1\nclasses=3\nnum=2\n", "classes", "set its filters=24"),
        ("mask=0,7\nclasses=4\nnum=4\n", "mask", "anchor 7 does not exist"),
    ],
)
def test_heads_that_do_not_fit_their_input_are_refused(head, key, message):
    text = f"[net]\nwidth=4\nheight=3\nchannels=26\n[Gaussian_yolo]\n{head}"
    with pytest.raises(CfgError) as e:
        Network(parse_cfg_text(text, "g.cfg"), "g.cfg", batch=1)
    assert e.value.key == key and message in str(e.value)


def test_options_the_fork_reads_and_ignores_are_warned_about():
    with pytest.warns(UserWarning, match="obj_normalizer: has no effect in \\[Gaussian_yolo\\]"):
        build("obj_normalizer=2\n", batch=1)


def test_the_network_decodes_the_gaussian_head_with_its_nms_kind():
    from darknet_py.predictions import get_network_boxes, nms_kind

    net = build("nms_kind=diounms\nbeta_nms=0.7\n", batch=1)
    assert nms_kind(net) == ("diounms", 0.7)
    net.forward(np.random.default_rng(6).normal(0, 2, (1, len(MASK) * ENTRIES, H, W)))
    out = net.layer_output(0).reshape(-1)
    dets = get_network_boxes(net, W, H, thresh=0.05, letter=False)
    want = c_detections(out, 0.05, "center")
    assert len(dets) == len(want) > 3
    np.testing.assert_allclose(
        [d.probs for d in dets], [p for _, _, p in want], rtol=1e-5, atol=1e-7
    )
