"""Labels on pictures (issue 21, item 7): placed by descending score, a likelier label
never covered by a less likely one, every label inside the picture, text 3% of the height
and at least 10 px."""

import numpy as np
import pytest

from darknet_py.boxes import Detection
from darknet_py.predictions import _label_style, _place_label, class_color, draw_detections


def det(box, class_id, prob, classes=3):
    probs = np.zeros(classes, np.float32)
    probs[class_id] = prob
    return Detection(box=box, objectness=prob, probs=probs, class_id=class_id, prob=prob)


def bgr(class_id, classes=3):
    r, g, b = class_color(class_id, classes)
    return [int(b * 255), int(g * 255), int(r * 255)]


def label_rects(dets, w, h, names):
    from darknet_py.predictions import _label, pixel_box

    taken, style = [], _label_style(h)
    for d in sorted(dets, key=lambda d: -d.prob):
        _place_label(_label(d, names), pixel_box(d.box, w, h), w, h, taken, style)
    return taken


@pytest.mark.parametrize("height", [160, 576, 2160])
def test_text_is_three_percent_high_and_at_least_ten_pixels(height):
    style = _label_style(height)
    assert style["text_h"] == pytest.approx(max(10, 0.03 * height), abs=1.5)


@pytest.mark.parametrize("w, h", [(213, 160), (768, 576), (3840, 2160)])
def test_overlapping_labels_are_moved_apart_and_stay_inside(w, h):
    dets = [
        det((0.5, 0.5, 0.4, 0.5), 1, 0.90),
        det((0.52, 0.5, 0.4, 0.5), 1, 0.91),
        det((0.3, 0.01, 0.3, 0.2), 0, 0.75),
        det((0.99, 0.99, 0.1, 0.1), 2, 0.55),
    ]
    rects = label_rects(dets, w, h, ["bicycle", "dog", "truck"])
    for x0, y0, x1, y1 in rects:
        assert 0 <= x0 < x1 < w and 0 <= y0 < y1 < h
    for i, a in enumerate(rects):
        for b in rects[i + 1 :]:
            assert not (a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]), (a, b)
    # the likeliest (dog 91%) keeps the place above its box
    top_91 = int((0.5 - 0.25) * h)
    assert rects[0][3] == top_91


def test_a_likelier_label_is_drawn_over_a_less_likely_one():
    image = np.full((160, 213, 3), 255, np.uint8)
    # Same box, three classes: only two of three label places are free; the third label
    # lands on the first place and must be drawn under the likeliest one.
    dets = [det((0.5, 0.5, 0.6, 0.2), c, p) for c, p in ((0, 0.60), (1, 0.95), (2, 0.70))]
    out = draw_detections(image, dets, ["a", "b", "c"])
    x0, y0, x1, y1 = label_rects(dets, 213, 160, ["a", "b", "c"])[0]  # the 95% label's place
    patch = out[y0 + 1 : y1, x0 + 1 : x1].reshape(-1, 3)
    colours = {tuple(c) for c in patch}
    assert tuple(bgr(1)) in colours and tuple(bgr(0)) not in colours


def test_a_label_at_the_top_edge_is_inside_the_picture():
    image = np.full((576, 768, 3), 255, np.uint8)
    out = draw_detections(image, [det((0.5, 0.0, 0.3, 0.1), 2, 0.8)], ["a", "b", "c"])
    rows_with_label = np.flatnonzero((out == bgr(2)).all(axis=2).sum(axis=1) > 50)
    assert rows_with_label.min() == 0 and rows_with_label.max() < 40
