"""The AlexeyAB fork's [yolo] head: its forward (scale_x_y, new_coords) against the fork's
own outputs (../shared/fixtures-ab), and its box maths, loss and NMS kinds against
scalar transcriptions of its src/box.c and src/yolo_layer.c."""
import math
from pathlib import Path

import numpy as np
import pytest

from darknet_py.backends.numpy_backend import NumpyBackend
from darknet_py.boxes import (Detection, box_ciou, box_diou, box_diounms, box_giou, do_nms_sort,
                              dx_box_iou, fork_iou)
from darknet_py.cfg import CfgError, parse_cfg, parse_cfg_text
from darknet_py.layers.base import BuildContext
from darknet_py.layers.yolo import YoloLayer
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
@pytest.mark.skipif(not (FIXTURES_AB / "a1_yolov4tiny").is_dir(),
                    reason=f"fork fixtures not found at {FIXTURES_AB}")
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
    section = yolo_section(f"mask=0,1\nanchors=4,5, 9,8\nnum=2\nclasses=3\n"
                           f"scale_x_y={scale}\nnew_coords={new_coords}\n")
    layer = yolo_layer(section, 16, 3, 4)
    x = np.random.default_rng(3).normal(0, 2, 16 * 12).astype(F32)
    got = run_forward(layer, x)
    want = forward_reference(x, 2, 3, 12, scale, new_coords)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    if new_coords and scale == 1.0:
        np.testing.assert_array_equal(got, x)  # no activation at all


def test_detections_decode_new_coords_sizes_and_scaled_centres():
    section = yolo_section("mask=1\nanchors=4,5, 16,8\nnum=2\nclasses=2\nnew_coords=1\n"
                           "scale_x_y=2.0\n")
    layer = yolo_layer(section, 7, 2, 3)
    x = np.zeros((7, 2, 3), dtype=F32)
    x[:, 1, 2] = [.75, .25, .5, .25, .9, .5, .8]  # cell row 1, col 2
    out = run_forward(layer, x)
    (d,) = layer.detections(out, 64, 32, 64, 32, thresh=.5, letter=False)
    # x' = 2x - .5; w = (2 tw)² anchor / netw
    assert d.box == pytest.approx(((2 + 1.0) / 3, (1 + 0.0) / 2, 4 * .25 * 16 / 64,
                                   4 * .0625 * 8 / 32))
    assert d.objectness == pytest.approx(.9)
    np.testing.assert_allclose(d.probs, [0, .9 * .8], rtol=1e-6)  # .45 is not above .5


# ---- cfg -----------------------------------------------------------------------------------
def test_original_layer_without_fork_options_keeps_original_defaults():
    layer = yolo_layer(yolo_section("mask=0\nanchors=4,5\nnum=1\nclasses=1\n"), 6, 2, 2)
    assert not layer.fork and layer.max_boxes == 90
    fork = yolo_layer(yolo_section("mask=0\nanchors=4,5\nnum=1\nclasses=1\nbeta_nms=.5\n"), 6, 2, 2)
    assert fork.fork and fork.max_boxes == 200 and fork.iou_normalizer == .75


@pytest.mark.parametrize("line,key,message", [
    ("iou_loss=ciuo", "iou_loss", "unknown value 'ciuo'"),
    ("nms_kind=softnms", "nms_kind", "unknown value 'softnms'"),
    ("iou_thresh_kind=mse", "iou_thresh_kind", "unknown value 'mse'"),
    ("counters_per_class=3,4", "counters_per_class", "2 counts given for classes=3"),
    ("focal_loss=1", "focal_loss", "not supported"),
])
def test_bad_fork_options_name_line_and_key(line, key, message):
    section = yolo_section(f"mask=0\nanchors=4,5\nnum=1\nclasses=3\n{line}\n")
    with pytest.raises(CfgError) as e:
        yolo_layer(section, 8, 2, 2)
    assert f":7: {key}: " in str(e.value) and message in str(e.value)


def test_counters_per_class_weights_rare_classes_capped_at_max_delta():
    section = yolo_section("mask=0\nanchors=4,5\nnum=1\nclasses=3\ncounters_per_class=100,0,40\n"
                           "max_delta=2\n")
    layer = yolo_layer(section, 8, 2, 2)
    np.testing.assert_allclose(layer.class_multipliers, [1, 2, 2], rtol=0)
    layer = yolo_layer(yolo_section("mask=0\nanchors=4,5\nnum=1\nclasses=3\n"
                                    "counters_per_class=100,0,40\n"), 8, 2, 2)
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
            terms = [F32((gC * dU - U * dC) / (gC * gC))
                     for dU, dC in ((dU_t, dC_t), (dU_b, dC_b), (dU_l, dC_l), (dU_r, dC_r))]
            if gC > 0:
                p_dt, p_db, p_dl, p_dr = (p + t for p, t in zip((p_dt, p_db, p_dl, p_dr), terms))
            if Iw <= 0 or Ih <= 0:
                p_dt, p_db, p_dl, p_dr = terms
        Cw, Ch = c_box_c(pred, truth)
        C = F32(Cw * Cw + Ch * Ch)
        dCw_dx = F32((1 if pr > trr else 0) - (1 if pl < tl else 0))
        dCw_dw = F32((.5 if pr > trr else 0) - (-.5 if pl < tl else 0))
        dCh_dy = F32((1 if pb > tb else 0) - (1 if pt < tt else 0))
        dCh_dh = F32((.5 if pb > tb else 0) - (-.5 if pt < tt else 0))
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
    pred = np.concatenate([rng.random((count, 2)) * .8 + .1, rng.random((count, 2)) * .4 + .02],
                          axis=1).astype(F32)
    truth = np.concatenate([rng.random((count, 2)) * .8 + .1, rng.random((count, 2)) * .4 + .02],
                           axis=1).astype(F32)
    truth[:10, :2] = pred[:10, :2] + F32(.01)        # nearly concentric
    truth[10:15] = [.5, .5, .1, .1]                   # far apart from ...
    pred[10:15, :2] = [.05, .05]
    pred[15:20, 2:] = truth[15:20, 2:] * F32(3)       # truth inside the prediction
    pred[15:20, :2] = truth[15:20, :2]
    return pred, truth


def test_iou_family_matches_the_forks_box_c():
    pred, truth = box_pairs(11)
    for fn, ref in ((fork_iou, c_iou), (box_giou, c_giou), (box_diou, lambda a, b: c_diounms(a, b, .6)),
                    (box_ciou, c_ciou), (lambda a, b: box_diounms(a, b, .8),
                                          lambda a, b: c_diounms(a, b, .8))):
        want = np.array([ref(p, t) for p, t in zip(pred, truth)], dtype=F32)
        np.testing.assert_allclose(fn(pred, truth), want, rtol=2e-6, atol=2e-7)
    same = np.array([.5, .5, .2, .3], dtype=F32)
    for fn in (fork_iou, box_giou, box_diou, box_ciou):
        assert fn(same, same) == pytest.approx(1.0, abs=1e-6)
    far = box_giou(np.array([0, 0, .1, .1], F32), np.array([.9, .9, .1, .1], F32))
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
