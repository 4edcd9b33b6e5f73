"""The AlexeyAB fork's [yolo] head: its forward (scale_x_y, new_coords) against the fork's
own outputs (../shared/fixtures-ab), and its box maths, loss and NMS kinds against
scalar transcriptions of its src/box.c and src/yolo_layer.c."""

import math
from pathlib import Path

import numpy as np
import pytest

from darknet_py.backends.numpy_backend import NumpyBackend
from darknet_py.boxes import (
    Detection,
    box_ciou,
    box_diou,
    box_diounms,
    box_giou,
    do_nms_sort,
    dx_box_iou,
    fork_iou,
)
from darknet_py.cfg import CfgError, parse_cfg, parse_cfg_text
from darknet_py.layers.base import BuildContext
from darknet_py.layers.yolo import FLT_MAX, YoloLayer
from darknet_py.network import NetOptions, Network

F32 = np.float32
FIXTURES_AB = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures-ab"


def yolo_layer(section, c, h, w, batch=1, index=0):
    return YoloLayer(index, section, c, h, w, c * h * w, BuildContext([], NetOptions(), batch))


def yolo_section(body):
    return [s for s in parse_cfg_text("[net]\n[yolo]\n" + body) if s.type == "yolo"][0]


def run_forward(layer, x):
    be = NumpyBackend()
    layer.allocate(be, layer.batch, False)

    class State:
        pass

    state = State()
    state.be, state.input, state.train, state.truth = be, x.reshape(-1).astype(F32), False, None
    layer.forward(state)
    return layer.output


# ---- forward against the fork's outputs --------------------------------------------------
@pytest.mark.skipif(
    not (FIXTURES_AB / "a1_yolov4tiny").is_dir(), reason=f"fork fixtures not found at {FIXTURES_AB}"
)
def test_yolov4tiny_yolo_layers_match_the_fork_from_their_stored_inputs():
    d = FIXTURES_AB / "a1_yolov4tiny"
    ref = np.load(d / "a1_yolov4tiny.npz")
    sections = [s for s in parse_cfg(d / "a1_yolov4tiny.cfg") if s.type == "yolo"]
    for section, index in zip(sections, (30, 37)):
        x = ref[f"layer_{index - 1}"]
        _, c, h, w = x.shape
        layer = yolo_layer(section, c, h, w, index=index)
        assert layer.fork and layer.scale_x_y == pytest.approx(1.05)
        assert layer.iou_loss == "ciou" and layer.nms_kind == "greedynms"
        got = run_forward(layer, x)
        want = ref[f"layer_{index}"].reshape(-1)
        err = np.abs(got - want).max() / np.abs(want).max()
        assert err < 1e-4, (index, err)
        assert not section.unused(), [o.key for o in section.unused()]


def forward_reference(x, n, classes, wh, scale_x_y, new_coords):
    """The fork's CPU forward_yolo_layer, loop by loop."""
    out = x.astype(F32).copy()
    per = (5 + classes) * wh
    for a in range(n):
        for k in range(per):
            entry = k // wh
            if not new_coords and entry != 2 and entry != 3:
                out[a * per + k] = F32(1 / (1 + math.exp(-float(out[a * per + k]))))
        for k in range(2 * wh):
            out[a * per + k] = out[a * per + k] * F32(scale_x_y) + F32(-0.5 * (scale_x_y - 1))
    return out


@pytest.mark.parametrize("new_coords,scale", [(0, 1.0), (0, 1.2), (1, 2.0), (1, 1.0)])
def test_forward_scale_x_y_and_new_coords(new_coords, scale):
    section = yolo_section(
        f"mask=0,1\nanchors=4,5, 9,8\nnum=2\nclasses=3\n"
        f"scale_x_y={scale}\nnew_coords={new_coords}\n"
    )
    layer = yolo_layer(section, 16, 3, 4)
    x = np.random.default_rng(3).normal(0, 2, 16 * 12).astype(F32)
    got = run_forward(layer, x)
    want = forward_reference(x, 2, 3, 12, scale, new_coords)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    if new_coords and scale == 1.0:
        np.testing.assert_array_equal(got, x)  # no activation at all


def test_detections_decode_new_coords_sizes_and_scaled_centres():
    section = yolo_section(
        "mask=1\nanchors=4,5, 16,8\nnum=2\nclasses=2\nnew_coords=1\nscale_x_y=2.0\n"
    )
    layer = yolo_layer(section, 7, 2, 3)
    x = np.zeros((7, 2, 3), dtype=F32)
    x[:, 1, 2] = [0.75, 0.25, 0.5, 0.25, 0.9, 0.5, 0.8]  # cell row 1, col 2
    out = run_forward(layer, x)
    (d,) = layer.detections(out, 64, 32, 64, 32, thresh=0.5, letter=False)
    # x' = 2x - .5; w = (2 tw)² anchor / netw
    assert d.box == pytest.approx(
        ((2 + 1.0) / 3, (1 + 0.0) / 2, 4 * 0.25 * 16 / 64, 4 * 0.0625 * 8 / 32)
    )
    assert d.objectness == pytest.approx(0.9)
    np.testing.assert_allclose(d.probs, [0, 0.9 * 0.8], rtol=1e-6)  # .45 is not above .5


# ---- cfg -----------------------------------------------------------------------------------
def test_original_layer_without_fork_options_keeps_original_defaults():
    layer = yolo_layer(yolo_section("mask=0\nanchors=4,5\nnum=1\nclasses=1\n"), 6, 2, 2)
    assert not layer.fork and layer.max_boxes == 90
    fork = yolo_layer(yolo_section("mask=0\nanchors=4,5\nnum=1\nclasses=1\nbeta_nms=.5\n"), 6, 2, 2)
    assert fork.fork and fork.max_boxes == 200 and fork.iou_normalizer == 0.75


@pytest.mark.parametrize(
    "line,key,message",
    [
        ("iou_loss=ciuo", "iou_loss", "unknown value 'ciuo'"),
        ("nms_kind=softnms", "nms_kind", "unknown value 'softnms'"),
        ("iou_thresh_kind=mse", "iou_thresh_kind", "unknown value 'mse'"),
        ("counters_per_class=3,4", "counters_per_class", "2 counts given for classes=3"),
        ("focal_loss=1", "focal_loss", "not supported"),
    ],
)
def test_bad_fork_options_name_line_and_key(line, key, message):
    section = yolo_section(f"mask=0\nanchors=4,5\nnum=1\nclasses=3\n{line}\n")
    with pytest.raises(CfgError) as e:
        yolo_layer(section, 8, 2, 2)
    assert f":7: {key}: " in str(e.value) and message in str(e.value)


def test_counters_per_class_weights_rare_classes_capped_at_max_delta():
    section = yolo_section(
        "mask=0\nanchors=4,5\nnum=1\nclasses=3\ncounters_per_class=100,0,40\nmax_delta=2\n"
    )
    layer = yolo_layer(section, 8, 2, 2)
    np.testing.assert_allclose(layer.class_multipliers, [1, 2, 2], rtol=0)
    layer = yolo_layer(
        yolo_section("mask=0\nanchors=4,5\nnum=1\nclasses=3\ncounters_per_class=100,0,40\n"),
        8,
        2,
        2,
    )
    np.testing.assert_allclose(layer.class_multipliers, [1, 100, 2.5], rtol=1e-7)


# ---- box maths: scalar transcriptions of the fork's box.c ----------------------------------
def c_overlap(x1, w1, x2, w2):
    left = max(F32(x1 - w1 / F32(2)), F32(x2 - w2 / F32(2)))
    right = min(F32(x1 + w1 / F32(2)), F32(x2 + w2 / F32(2)))
    return F32(right - left)


def c_iou(a, b):
    w, h = c_overlap(a[0], a[2], b[0], b[2]), c_overlap(a[1], a[3], b[1], b[3])
    inter = F32(0) if w < 0 or h < 0 else F32(w * h)
    union = F32(a[2] * a[3] + b[2] * b[3] - inter)
    return F32(0) if inter == 0 or union == 0 else F32(inter / union)


def c_box_c(a, b):
    top = min(F32(a[1] - a[3] / F32(2)), F32(b[1] - b[3] / F32(2)))
    bot = max(F32(a[1] + a[3] / F32(2)), F32(b[1] + b[3] / F32(2)))
    left = min(F32(a[0] - a[2] / F32(2)), F32(b[0] - b[2] / F32(2)))
    right = max(F32(a[0] + a[2] / F32(2)), F32(b[0] + b[2] / F32(2)))
    return F32(right - left), F32(bot - top)


def c_giou(a, b):
    w, h = c_box_c(a, b)
    c = F32(w * h)
    iou = c_iou(a, b)
    if c == 0:
        return iou
    w2, h2 = c_overlap(a[0], a[2], b[0], b[2]), c_overlap(a[1], a[3], b[1], b[3])
    inter = F32(0) if w2 < 0 or h2 < 0 else F32(w2 * h2)
    u = F32(a[2] * a[3] + b[2] * b[3] - inter)
    return F32(iou - F32((c - u) / c))


def c_diounms(a, b, beta):
    w, h = c_box_c(a, b)
    c = F32(w * w + h * h)
    iou = c_iou(a, b)
    if c == 0:
        return iou
    d = F32((a[0] - b[0]) * (a[0] - b[0]) + (a[1] - b[1]) * (a[1] - b[1]))
    return F32(iou - F32(math.pow(float(F32(d / c)), beta)))


def c_ciou(a, b):
    w, h = c_box_c(a, b)
    c = F32(w * w + h * h)
    iou = c_iou(a, b)
    if c == 0:
        return iou
    u = F32((a[0] - b[0]) * (a[0] - b[0]) + (a[1] - b[1]) * (a[1] - b[1]))
    d = F32(u / c)
    gap = math.atan(float(F32(b[2] / b[3]))) - math.atan(float(F32(a[2] / a[3])))
    ar_loss = F32(4 / (math.pi * math.pi) * gap * gap)
    alpha = F32(float(ar_loss) / (1 - float(iou) + float(ar_loss) + 0.000001))
    return F32(iou - F32(d + alpha * ar_loss))


def c_dx_box_iou(pred, truth, kind):
    """dx_box_iou of the fork's box.c, branch by branch."""
    px, py, pw, ph = (F32(v) for v in pred)
    tx, ty, tw, th = (F32(v) for v in truth)
    top0, bot0 = F32(py - ph / F32(2)), F32(py + ph / F32(2))
    left0, right0 = F32(px - pw / F32(2)), F32(px + pw / F32(2))
    pt, pb, pl, pr = min(top0, bot0), max(top0, bot0), min(left0, right0), max(left0, right0)
    tt, tb = F32(ty - th / F32(2)), F32(ty + th / F32(2))
    tl, trr = F32(tx - tw / F32(2)), F32(tx + tw / F32(2))
    X = F32((pb - pt) * (pr - pl))
    Xhat = F32((tb - tt) * (trr - tl))
    Ih = F32(min(pb, tb) - max(pt, tt))
    Iw = F32(min(pr, trr) - max(pl, tl))
    I = F32(Iw * Ih)
    U = F32(X + Xhat - I)
    S = F32((px - tx) * (px - tx) + (py - ty) * (py - ty))
    gCw = F32(max(pr, trr) - min(pl, tl))
    gCh = F32(max(pb, tb) - min(pt, tt))
    gC = F32(gCw * gCh)
    dX_t, dX_b, dX_l, dX_r = -(pr - pl), pr - pl, -(pb - pt), pb - pt
    dI_t = -Iw if pt > tt else F32(0)
    dI_b = Iw if pb < tb else F32(0)
    dI_l = -Ih if pl > tl else F32(0)
    dI_r = Ih if pr < trr else F32(0)
    dU_t, dU_b, dU_l, dU_r = dX_t - dI_t, dX_b - dI_b, dX_l - dI_l, dX_r - dI_r
    dC_t = -gCw if pt < tt else F32(0)
    dC_b = gCw if pb > tb else F32(0)
    dC_l = -gCh if pl < tl else F32(0)
    dC_r = gCh if pr > trr else F32(0)
    p_dt = p_db = p_dl = p_dr = F32(0)
    if U > 0:
        p_dt = F32((U * dI_t - I * dU_t) / (U * U))
        p_db = F32((U * dI_b - I * dU_b) / (U * U))
        p_dl = F32((U * dI_l - I * dU_l) / (U * U))
        p_dr = F32((U * dI_r - I * dU_r) / (U * U))
    p_dt = p_dt if top0 < bot0 else p_db
    p_db = p_db if top0 < bot0 else p_dt
    p_dl = p_dl if left0 < right0 else p_dr
    p_dr = p_dr if left0 < right0 else p_dl
    with np.errstate(divide="ignore", invalid="ignore"):
        if kind == "giou":
            terms = [
                F32((gC * dU - U * dC) / (gC * gC))
                for dU, dC in ((dU_t, dC_t), (dU_b, dC_b), (dU_l, dC_l), (dU_r, dC_r))
            ]
            if gC > 0:
                p_dt, p_db, p_dl, p_dr = (p + t for p, t in zip((p_dt, p_db, p_dl, p_dr), terms))
            if Iw <= 0 or Ih <= 0:
                p_dt, p_db, p_dl, p_dr = terms
        Cw, Ch = c_box_c(pred, truth)
        C = F32(Cw * Cw + Ch * Ch)
        dCw_dx = F32((1 if pr > trr else 0) - (1 if pl < tl else 0))
        dCw_dw = F32((0.5 if pr > trr else 0) - (-0.5 if pl < tl else 0))
        dCh_dy = F32((1 if pb > tb else 0) - (1 if pt < tt else 0))
        dCh_dh = F32((0.5 if pb > tb else 0) - (-0.5 if pt < tt else 0))
        p_dx, p_dy = F32(p_dl + p_dr), F32(p_dt + p_db)
        p_dw, p_dh = F32(p_dr - p_dl), F32(p_db - p_dt)
        if kind in ("diou", "ciou"):
            ex = F32((2 * (tx - px) * C - (2 * Cw * dCw_dx) * S) / (C * C))
            ey = F32((2 * (ty - py) * C - (2 * Ch * dCh_dy) * S) / (C * C))
            ew = F32((2 * Cw * dCw_dw) * S / (C * C))
            eh = F32((2 * Ch * dCh_dh) * S / (C * C))
            if kind == "ciou":
                gap = math.atan(float(F32(tw / th))) - math.atan(float(F32(pw / ph)))
                ar_loss = 4 / (math.pi * math.pi) * gap * gap
                alpha = F32(ar_loss / (1 - float(F32(I / U)) + ar_loss + 0.000001))
                ew = F32(ew + alpha * F32(8 / (math.pi * math.pi) * gap * float(ph)))
                eh = F32(eh + alpha * F32(-8 / (math.pi * math.pi) * gap * float(pw)))
            if C > 0:
                p_dx, p_dy, p_dw, p_dh = p_dx + ex, p_dy + ey, p_dw + ew, p_dh + eh
            if Iw <= 0 or Ih <= 0:
                p_dx, p_dy, p_dw, p_dh = ex, ey, ew, eh
    return np.array([p_dx, p_dy, p_dw, p_dh], dtype=F32)


def box_pairs(seed, count=60):
    """Random prediction/truth pairs: overlapping, nested, disjoint, identical centres."""
    rng = np.random.default_rng(seed)
    pred = np.concatenate(
        [rng.random((count, 2)) * 0.8 + 0.1, rng.random((count, 2)) * 0.4 + 0.02], axis=1
    ).astype(F32)
    truth = np.concatenate(
        [rng.random((count, 2)) * 0.8 + 0.1, rng.random((count, 2)) * 0.4 + 0.02], axis=1
    ).astype(F32)
    truth[:10, :2] = pred[:10, :2] + F32(0.01)  # nearly concentric
    truth[10:15] = [0.5, 0.5, 0.1, 0.1]  # far apart from ...
    pred[10:15, :2] = [0.05, 0.05]
    pred[15:20, 2:] = truth[15:20, 2:] * F32(3)  # truth inside the prediction
    pred[15:20, :2] = truth[15:20, :2]
    return pred, truth


def test_iou_family_matches_the_forks_box_c():
    pred, truth = box_pairs(11)
    for fn, ref in (
        (fork_iou, c_iou),
        (box_giou, c_giou),
        (box_diou, lambda a, b: c_diounms(a, b, 0.6)),
        (box_ciou, c_ciou),
        (lambda a, b: box_diounms(a, b, 0.8), lambda a, b: c_diounms(a, b, 0.8)),
    ):
        want = np.array([ref(p, t) for p, t in zip(pred, truth)], dtype=F32)
        np.testing.assert_allclose(fn(pred, truth), want, rtol=2e-6, atol=2e-7)
    same = np.array([0.5, 0.5, 0.2, 0.3], dtype=F32)
    for fn in (fork_iou, box_giou, box_diou, box_ciou):
        assert fn(same, same) == pytest.approx(1.0, abs=1e-6)
    far = box_giou(np.array([0, 0, 0.1, 0.1], F32), np.array([0.9, 0.9, 0.1, 0.1], F32))
    assert -1 < far < 0  # GIoU goes negative for disjoint boxes


@pytest.mark.parametrize("kind", ["iou", "giou", "diou", "ciou"])
def test_dx_box_iou_matches_the_forks_branches(kind):
    pred, truth = box_pairs(12 + len(kind))
    got = dx_box_iou(pred, truth, kind)
    want = np.stack([c_dx_box_iou(p, t, kind) for p, t in zip(pred, truth)])
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6)
    # The step raises the IoU of its kind (for overlapping, not nested pairs).
    step = pred[:10] + F32(1e-3) * got[:10] / np.abs(got[:10]).max(axis=1, keepdims=True)
    fn = {"iou": fork_iou, "giou": box_giou, "diou": box_diou, "ciou": box_ciou}[kind]
    assert (fn(step, truth[:10]) > fn(pred[:10], truth[:10])).all()


# ---- the loss: a scalar transcription of the fork's process_batch and forward_yolo_layer ---
def c_fork_yolo_loss(out, truth, batch, lw, lh, n, total, mask, classes, biases, netw, neth, o):
    """The fork's training part of forward_yolo_layer, cell by cell and truth by truth.
    `o` holds the layer's options. Returns (delta, cost, count, tot_iou)."""
    outputs = lw * lh * n * (4 + 1 + classes)
    stride = lw * lh
    delta = np.zeros(batch * outputs, dtype=F32)
    max_boxes, fields = len(truth) // batch // 6, 6
    truths = max_boxes * fields
    mult = o["multipliers"]

    def entry_index(b, location, entry):
        nn, loc = location // (lw * lh), location % (lw * lh)
        return b * outputs + nn * lw * lh * (4 + classes + 1) + entry * lw * lh + loc

    def get_box(x, nn, index, i, j):
        if o["new_coords"]:
            return (
                F32((i + x[index]) / F32(lw)),
                F32((j + x[index + stride]) / F32(lh)),
                F32(
                    x[index + 2 * stride]
                    * x[index + 2 * stride]
                    * F32(4)
                    * biases[2 * nn]
                    / F32(netw)
                ),
                F32(
                    x[index + 3 * stride]
                    * x[index + 3 * stride]
                    * F32(4)
                    * biases[2 * nn + 1]
                    / F32(neth)
                ),
            )
        return (
            F32((i + x[index]) / F32(lw)),
            F32((j + x[index + stride]) / F32(lh)),
            F32(math.exp(float(x[index + 2 * stride])) * float(biases[2 * nn]) / netw),
            F32(math.exp(float(x[index + 3 * stride])) * float(biases[2 * nn + 1]) / neth),
        )

    def delta_box(tr, x, nn, index, i, j, scale, iou_normalizer):
        pred = list(get_box(x, nn, index, i, j))
        iou, giou = c_iou(pred, tr), c_giou(pred, tr)
        if pred[2] == 0:
            pred[2] = F32(1)
        if pred[3] == 0:
            pred[3] = F32(1)
        if o["iou_loss"] == "mse":
            tx = F32(tr[0] * F32(lw) - F32(i))
            ty = F32(tr[1] * F32(lh) - F32(j))
            if o["new_coords"]:
                tw = F32(math.sqrt(float(tr[2] * F32(netw) / (F32(4) * biases[2 * nn]))))
                th = F32(math.sqrt(float(tr[3] * F32(neth) / (F32(4) * biases[2 * nn + 1]))))
            else:
                tw = F32(math.log(float(tr[2] * F32(netw) / biases[2 * nn])))
                th = F32(math.log(float(tr[3] * F32(neth) / biases[2 * nn + 1])))
            for k, t in enumerate((tx, ty, tw, th)):
                delta[index + k * stride] += scale * (t - x[index + k * stride]) * iou_normalizer
            return iou, giou
        d = c_dx_box_iou(pred, tr, o["iou_loss"])
        if not o["new_coords"]:
            d[2] *= F32(math.exp(float(x[index + 2 * stride])))
            d[3] *= F32(math.exp(float(x[index + 3 * stride])))
        for k in range(4):
            v = F32(d[k] * iou_normalizer)
            if math.isnan(v) or math.isinf(v):
                v = F32(0)
            if o["max_delta"] is not None:
                v = min(max(v, -F32(o["max_delta"])), F32(o["max_delta"]))
            delta[index + k * stride] += v
        return iou, giou

    def smooth(y):
        eps = o["label_smooth_eps"]
        return F32(y * (1 - eps) + 0.5 * eps) if eps else F32(y)

    def delta_class(output, index, cls, stats):
        if delta[index + stride * cls]:
            delta[index + stride * cls] = smooth(1) - output[index + stride * cls]
            if mult is not None:
                delta[index + stride * cls] *= mult[cls]
            if stats is not None:
                stats["cat"] += output[index + stride * cls]
            return
        for k in range(classes):
            delta[index + stride * k] = smooth(1 if k == cls else 0) - output[index + stride * k]
            if mult is not None and k == cls:
                delta[index + stride * cls] *= mult[cls] * F32(o["cls_normalizer"])
            if k == cls and stats is not None:
                stats["cat"] += output[index + stride * k]

    obj_norm = F32(o["obj_normalizer"])
    stats = dict(cat=0.0, count=0, tot_iou=0.0, tot_iou_loss=0.0, tot_giou_loss=0.0)
    for b in range(batch):
        for j in range(lh):
            for i in range(lw):
                for a in range(n):
                    class_index = entry_index(b, a * lw * lh + j * lw + i, 5)
                    obj_index = entry_index(b, a * lw * lh + j * lw + i, 4)
                    box_index = entry_index(b, a * lw * lh + j * lw + i, 0)
                    pred = get_box(out, mask[a], box_index, i, j)
                    best_match_iou, best_iou, best_t = F32(0), F32(0), 0
                    for t in range(max_boxes):
                        tr = truth[t * fields + b * truths :][:4]
                        if not tr[0]:
                            break
                        class_id_match = any(
                            out[class_index + stride * k] > F32(0.25) for k in range(classes)
                        )
                        iou = c_iou(pred, tr)
                        if iou > best_match_iou and class_id_match:
                            best_match_iou = iou
                        if iou > best_iou:
                            best_iou, best_t = iou, t
                    delta[obj_index] = obj_norm * (F32(0) - out[obj_index])
                    if best_match_iou > o["ignore_thresh"]:
                        if o["objectness_smooth"]:
                            d = obj_norm * (best_match_iou - out[obj_index])
                            if d > delta[obj_index]:
                                delta[obj_index] = d
                        else:
                            delta[obj_index] = 0
                    if best_iou > o["truth_thresh"]:
                        mul2 = best_iou * best_iou
                        if o["objectness_smooth"]:
                            delta[obj_index] = obj_norm * (mul2 - out[obj_index])
                        else:
                            delta[obj_index] = obj_norm * (F32(1) - out[obj_index])
                        cls = int(truth[best_t * fields + b * truths + 4])
                        delta_class(out, class_index, cls, None)
                        cm = F32(1) if mult is None else mult[cls]
                        if o["objectness_smooth"]:
                            delta[class_index + stride * cls] = cm * (
                                mul2 - out[class_index + stride * cls]
                            )
                        tr = truth[best_t * fields + b * truths :][:4]
                        delta_box(
                            tr,
                            out,
                            mask[a],
                            box_index,
                            i,
                            j,
                            F32(2) - tr[2] * tr[3],
                            F32(o["iou_normalizer"]) * cm,
                        )
        for t in range(max_boxes):
            tr = truth[t * fields + b * truths :][:4]
            if not tr[0]:
                break
            cls = int(truth[t * fields + b * truths + 4])
            best_iou, best_n = F32(0), 0
            i, j = int(tr[0] * F32(lw)), int(tr[1] * F32(lh))
            shift = (F32(0), F32(0), tr[2], tr[3])
            for k in range(total):
                iou = c_iou((0, 0, biases[2 * k] / F32(netw), biases[2 * k + 1] / F32(neth)), shift)
                if iou > best_iou:
                    best_iou, best_n = iou, k
            candidates = [best_n] if best_n in mask else []
            for k in range(total):
                if k in mask and k != best_n and o["iou_thresh"] < 1:
                    anchor = (0, 0, biases[2 * k] / F32(netw), biases[2 * k + 1] / F32(neth))
                    kind = {
                        "iou": c_iou,
                        "giou": c_giou,
                        "ciou": c_ciou,
                        "diou": lambda p, q: c_diounms(p, q, 0.6),
                    }[o["iou_thresh_kind"]]
                    if kind(anchor, shift) > o["iou_thresh"]:
                        candidates.append(k)
            for k in candidates:
                mask_n = mask.index(k)
                box_index = entry_index(b, mask_n * lw * lh + j * lw + i, 0)
                cm = F32(1) if mult is None else mult[cls]
                iou, giou = delta_box(
                    tr,
                    out,
                    k,
                    box_index,
                    i,
                    j,
                    F32(2) - tr[2] * tr[3],
                    F32(o["iou_normalizer"]) * cm,
                )
                stats["tot_iou"] += iou
                stats["tot_iou_loss"] += 1 - iou
                stats["tot_giou_loss"] += 1 - giou
                obj_index = entry_index(b, mask_n * lw * lh + j * lw + i, 4)
                d = cm * obj_norm * (F32(1) - out[obj_index])
                if o["objectness_smooth"]:
                    if delta[obj_index] == 0:
                        delta[obj_index] = d
                else:
                    delta[obj_index] = d
                class_index = entry_index(b, mask_n * lw * lh + j * lw + i, 5)
                delta_class(out, class_index, cls, stats)
                stats["count"] += 1
        if o["iou_thresh"] < 1:
            for j in range(lh):
                for i in range(lw):
                    for a in range(n):
                        obj_index = entry_index(b, a * lw * lh + j * lw + i, 4)
                        box_index = entry_index(b, a * lw * lh + j * lw + i, 0)
                        class_index = entry_index(b, a * lw * lh + j * lw + i, 5)
                        if delta[obj_index] != 0:
                            told = sum(
                                1 for k in range(classes) if delta[class_index + stride * k] > 0
                            )
                            if told > 0:
                                for k in range(4):
                                    delta[box_index + k * stride] /= told
    count = max(stats["count"], 1)
    no_box = delta.copy()
    for b in range(batch):
        for a in range(n):
            for k in range(4 * lw * lh):
                no_box[entry_index(b, a * lw * lh, 0) + k] = 0
    class_loss = float(obj_norm) * sum(float(v) * float(v) for v in no_box)
    loss = sum(float(v) * float(v) for v in delta)
    if o["iou_loss"] == "mse":
        cost = loss
    else:
        lost = stats["tot_giou_loss"] if o["iou_loss"] == "giou" else stats["tot_iou_loss"]
        cost = o["iou_normalizer"] * lost / count + class_loss
    return delta, cost, stats["count"], stats["tot_iou"]


FORK_OPTION_CASES = {
    "mse": "iou_loss=mse\n",
    "mse-new-coords": "iou_loss=mse\nnew_coords=1\nscale_x_y=2.0\n",
    "giou": "iou_loss=giou\niou_normalizer=0.5\nobj_normalizer=2\n",
    "diou": "iou_loss=diou\nlabel_smooth_eps=0.1\nignore_thresh=.3\n",
    "ciou-thresh": "iou_loss=ciou\niou_normalizer=0.07\niou_thresh=0.2\nmax_delta=0.01\n",
    "ciou-new-coords": "iou_loss=ciou\nnew_coords=1\niou_thresh=0.3\niou_thresh_kind=giou\n",
    "iou-classes": "iou_loss=iou\ncounters_per_class=10,50,25\ncls_normalizer=0.5\n"
    "objectness_smooth=1\nignore_thresh=.3\ntruth_thresh=.75\n",
    "diou-smooth": "iou_loss=diou\nobjectness_smooth=1\nignore_thresh=.2\nscale_x_y=1.1\n",
}


def fork_case(layer, rng):
    """An activated output and 6-field truths reaching every branch of the fork's loss."""
    B, n, C, h, w = layer.batch, layer.n, layer.classes, layer.h, layer.w
    out = np.empty((B, n, 5 + C, h, w), dtype=F32)
    out[:, :, [0, 1, 4]] = rng.random((B, n, 3, h, w))
    out[:, :, 5:] = rng.random((B, n, C, h, w)) * F32(0.5)
    out[:, :, 2:4] = (
        rng.random((B, n, 2, h, w)) * F32(0.8) + F32(0.1)
        if layer.new_coords
        else rng.normal(0, 0.3, (B, n, 2, h, w))
    )
    truth = np.zeros((B, 200, 6), dtype=F32)
    # Image 0: three boxes in one cell (classes 0, 2, 0: the third rewrites only its class),
    # a small box whose best anchor is not masked, and one elsewhere.
    truth[0, :5] = [
        [0.30, 0.25, 0.60, 0.70, 0, 7],
        [0.33, 0.30, 0.62, 0.74, 2, 8],
        [0.31, 0.28, 0.61, 0.72, 0, 9],
        [0.80, 0.70, 0.09, 0.15, 1, 0],
        [0.55, 0.60, 0.31, 0.37, 1, 0],
    ]
    out[0, :, 5 + 1] = F32(0.6)  # class 1 named everywhere in image 0: ignore_thresh applies
    # Image 1: a box the prediction of slot 0 fits closely (truth_thresh), and a loose one.
    truth[1, :2] = [[0.40, 0.40, 0.60, 0.75, 1, 0], [0.85, 0.30, 0.30, 0.40, 2, 0]]
    out[1, :, 5 + 2] = F32(0.3)
    for tx, ty, tw, th, a in ((0.40, 0.40, 0.60, 0.75, 0), (0.85, 0.30, 0.33, 0.40, 0)):
        i, j = int(tx * w), int(ty * h)
        s = F32(layer.scale_x_y)
        out[1, a, 0, j, i] = tx * w - i
        out[1, a, 1, j, i] = ty * h - j
        anchor = layer.biases.reshape(-1, 2)[layer.mask[a]]
        if layer.new_coords:
            out[1, a, 2, j, i] = math.sqrt(tw * 64 / anchor[0] / 4)
            out[1, a, 3, j, i] = math.sqrt(th * 32 / anchor[1] / 4)
        else:
            out[1, a, 2, j, i] = math.log(tw * 64 / anchor[0])
            out[1, a, 3, j, i] = math.log(th * 32 / anchor[1])
        del s
    return out.reshape(-1), truth.reshape(-1)


@pytest.mark.parametrize("case", sorted(FORK_OPTION_CASES))
def test_fork_loss_matches_the_forks_transcription(case):
    options = dict(line.split("=") for line in FORK_OPTION_CASES[case].split())
    options = {"ignore_thresh": ".5", "truth_thresh": ".9", **options}
    body = "mask=1,2\nanchors=6,5, 20,12, 40,24\nclasses=3\nnum=3\n" + "".join(
        f"{k}={v}\n" for k, v in options.items()
    )
    section = yolo_section(body)
    layer = yolo_layer(section, 16, 2, 4, batch=2)
    assert layer.fork and not section.unused()
    out, truth = fork_case(layer, np.random.default_rng(len(case)))
    options = dict(
        iou_loss=layer.iou_loss,
        new_coords=layer.new_coords,
        multipliers=layer.class_multipliers,
        label_smooth_eps=F32(layer.label_smooth_eps),
        cls_normalizer=layer.cls_normalizer,
        obj_normalizer=layer.obj_normalizer,
        iou_normalizer=layer.iou_normalizer,
        ignore_thresh=F32(layer.ignore_thresh),
        truth_thresh=F32(layer.truth_thresh),
        objectness_smooth=layer.objectness_smooth,
        iou_thresh=F32(layer.iou_thresh),
        iou_thresh_kind=layer.iou_thresh_kind,
        max_delta=None if "max_delta" not in body else layer.max_delta,
    )
    want_delta, want_cost, want_count, want_iou = c_fork_yolo_loss(
        out, truth, 2, 4, 2, 2, 3, [1, 2], 3, layer.biases, 64, 32, options
    )
    rows = truth.reshape(2, 200, 6)
    delta, cost, stats = layer.fork_loss(out, [rows[0, :5], rows[1, :2]], 64, 32)
    np.testing.assert_allclose(delta, want_delta, rtol=2e-5, atol=2e-6)
    assert cost == pytest.approx(want_cost, rel=1e-5)
    assert stats["count"] == want_count and stats["count"] >= 6
    assert stats["avg_iou"] == pytest.approx(float(want_iou) / want_count, rel=1e-5)
    if "max_delta" in body:  # the cap changed something
        layer.max_delta = FLT_MAX
        assert (
            np.abs(layer.fork_loss(out, [rows[0, :5], rows[1, :2]], 64, 32)[0] - delta).max() > 0.1
        )


def test_fork_report_line_is_the_forks():
    layer = yolo_layer(
        yolo_section(
            "mask=1,2\nanchors=6,5, 20,12, 40,24\nclasses=3\nnum=3\n"
            "iou_loss=ciou\niou_normalizer=0.07\n"
        ),
        16,
        2,
        4,
        batch=2,
        index=30,
    )
    out, truth = fork_case(layer, np.random.default_rng(1))
    rows = truth.reshape(2, 200, 6)
    _, cost, layer.stats = layer.fork_loss(out, [rows[0, :5], rows[1, :2]], 64, 32)
    line = layer.stats_report()
    assert line.startswith(
        "v3 (iou loss, Normalizer: (iou: 0.07, obj: 1.00, cls: 1.00) Region 30 Avg (IOU: "
    )
    st = layer.stats
    assert f"count: {st['count']}, class_loss = {st['class_loss']:f}, " in line
    assert st["total_loss"] == pytest.approx(st["class_loss"] + st["iou_loss"])
    # The cost is not the reported total: iou_normalizer * mean(1 - IoU) + the class part.
    assert cost == pytest.approx(0.07 * (1 - st["avg_iou"]) + 2 * st["class_loss"], rel=1e-5)


# ---- NMS kinds -----------------------------------------------------------------------------
def c_diounms_sort(boxes, probs, thresh, kind, beta):
    """The fork's diounms_sort (objectness all non-zero): per class a descending sort,
    then suppression by the kind's overlap."""
    total, classes = probs.shape
    probs = probs.copy()
    for k in range(classes):
        order = sorted(range(total), key=lambda i: -probs[i, k])
        for x in range(total):
            if probs[order[x], k] == 0:
                continue
            a = boxes[order[x]]
            for y in range(x + 1, total):
                b = boxes[order[y]]
                if kind == "cornersnms" and c_iou(a, b) > thresh:
                    probs[order[y], k] = 0
                elif kind == "greedynms" and c_diounms(a, b, 0.6) > thresh:
                    probs[order[y], k] = 0
                elif kind == "diounms" and c_diounms(a, b, beta) > thresh:
                    probs[order[y], k] = 0
    return probs


@pytest.mark.parametrize("kind", ["greedynms", "diounms", "cornersnms"])
def test_nms_kinds_match_the_forks_diounms_sort(kind):
    rng = np.random.default_rng(4)
    boxes = np.concatenate(
        [rng.random((40, 2)) * 0.5 + 0.25, rng.random((40, 2)) * 0.3 + 0.05], axis=1
    ).astype(F32)
    probs = (rng.random((40, 3)) * (rng.random((40, 3)) > 0.3)).astype(F32)
    dets = [
        Detection(box=tuple(map(float, b)), objectness=1.0, probs=p.copy())
        for b, p in zip(boxes, probs)
    ]
    for d, i in zip(dets, range(40)):
        d.layer = i
    do_nms_sort(dets, 3, 0.45, kind, beta=0.8)
    got = np.array([d.probs for d in sorted(dets, key=lambda d: d.layer)])
    want = c_diounms_sort(boxes, probs, F32(0.45), kind, 0.8)
    np.testing.assert_array_equal(got, want)
    assert (got == 0).sum() > (probs == 0).sum()  # something was suppressed


def test_greedynms_keeps_boxes_whose_centres_are_apart():
    # IoU .5 (suppressed by default NMS at .45) but DIoU about .33 (kept by greedynms).
    a, b = (0.5, 0.5, 0.4, 0.2), (0.5 + 0.4 / 3, 0.5, 0.4, 0.2)
    for kind, kept in (("default", 1), ("greedynms", 2)):
        dets = [
            Detection(box=a, objectness=1.0, probs=np.array([0.9], F32)),
            Detection(box=b, objectness=1.0, probs=np.array([0.8], F32)),
        ]
        do_nms_sort(dets, 1, 0.45, kind)
        assert sum(d.probs[0] > 0 for d in dets) == kept, kind


def test_detector_takes_the_nms_kind_of_its_last_yolo_layer():
    from darknet_py.predictions import nms_kind

    head = (
        "[convolutional]\nfilters=6\nsize=1\nactivation=linear\n[yolo]\nmask=0\nanchors=4,5\n"
        "num=1\nclasses=1\n"
    )
    text = (
        "[net]\nwidth=8\nheight=8\nchannels=3\n" + head + "nms_kind=diounms\nbeta_nms=.7\n"
        "[route]\nlayers=-2\n" + head + "nms_kind=greedynms\n"
    )
    net = Network(parse_cfg_text(text), backend=NumpyBackend())
    assert nms_kind(net) == ("greedynms", pytest.approx(0.6))
    plain = Network(
        parse_cfg_text("[net]\nwidth=8\nheight=8\nchannels=3\n" + head), backend=NumpyBackend()
    )
    assert nms_kind(plain) == ("default", 0.6)


@pytest.mark.parametrize("letter_box", [0, 1])
def test_fork_detector_resizes_its_input_plainly_unless_letter_box(letter_box):
    from darknet_py.image import letterbox, resize_image
    from darknet_py.predictions import detect

    text = (
        "[net]\nwidth=16\nheight=16\nchannels=3\n"
        f"letter_box={letter_box}\n[convolutional]\nfilters=6\nsize=1\nactivation=linear\n"
        "[yolo]\nmask=0\nanchors=4,5\nnum=1\nclasses=1\nscale_x_y=1.05\n"
    )
    net = Network(parse_cfg_text(text), backend=NumpyBackend())
    assert net.darknet == "alexeyab"
    image = np.random.default_rng(0).random((3, 10, 24), dtype=F32)
    detect(net, image, thresh=0.01)
    got = net.layer_output(0).copy()
    sized = letterbox(image, 16, 16) if letter_box else resize_image(image, 16, 16)
    net.predict(sized[None])
    np.testing.assert_array_equal(got, net.layer_output(0))
