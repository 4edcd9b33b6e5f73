"""The fork's NMS kinds against its own C code (CPU build, 59596d78): the fixtures in
tests/fixtures/fork_nms hold the detections its get_network_boxes gave for dog.jpg
(letterboxed, stock yolov4-tiny.cfg, the seeded random weights of
../shared/fixtures-ab/a1_yolov4tiny) and what do_nms_sort / diounms_sort left of them for
each kind; made by tests/fork_harness (fork_detect.c, make_fixtures.py nms)."""

from pathlib import Path

import numpy as np
import pytest

from darknet_py.backends.numpy_backend import NumpyBackend
from darknet_py.boxes import NMS_KINDS, Detection, do_nms_sort
from darknet_py.cfg import parse_cfg_text
from darknet_py.network import Network, load_network
from darknet_py.predictions import nms_kind

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "fork_nms"
SHARED = Path(__file__).resolve().parents[1].parent / "shared"
WEIGHTS = SHARED / "fixtures-ab" / "a1_yolov4tiny" / "a1_yolov4tiny.weights"
CASES = sorted(p.stem for p in FIXTURES.glob("*.npz"))


def fork_detections(ref):
    return [
        Detection(box=tuple(map(float, b)), objectness=float(o), probs=p.copy())
        for b, o, p in zip(ref["boxes"], ref["objectness"], ref["probs"])
    ]


@pytest.mark.parametrize("kind", NMS_KINDS)
@pytest.mark.parametrize("name", CASES)
def test_nms_kinds_keep_and_order_as_the_fork(name, kind):
    ref = np.load(FIXTURES / f"{name}.npz")
    dets = fork_detections(ref)
    do_nms_sort(dets, int(ref["classes"]), float(ref["nms"]), kind, float(ref["beta"]))
    # diounms_sort / do_nms_sort leave the detections sorted by the last class: same order,
    # and every class probability NMS zeroed or kept.
    np.testing.assert_array_equal(np.array([d.box for d in dets], np.float32), ref[f"{kind}_boxes"])
    np.testing.assert_array_equal(np.array([d.probs for d in dets]), ref[f"{kind}_probs"])
    kept = sum(d.probs.max() > ref["thresh"] for d in dets)
    assert kept == int(ref[f"{kind}_kept"])


def test_the_kinds_differ_on_the_fixtures():
    ref = np.load(FIXTURES / "dog_yolov4tiny_beta.npz")
    kept = [int(ref[f"{kind}_kept"]) for kind in ("default", "greedynms", "diounms")]
    assert len(set(kept)) == 3, kept  # beta_nms matters; DIoU keeps more than IoU


@pytest.mark.skipif(not WEIGHTS.is_file(), reason=f"fork weights not found at {WEIGHTS}")
def test_detect_keeps_what_the_forks_greedynms_keeps(tmp_path):
    ref = np.load(FIXTURES / "dog_yolov4tiny.npz")
    (tmp_path / "yolov4-tiny.cfg").write_text(str(ref["cfg"]))
    net = load_network(tmp_path / "yolov4-tiny.cfg", WEIGHTS, batch=1, engine="numpy")
    assert nms_kind(net) == ("greedynms", pytest.approx(0.6))
    found = net.detect(
        SHARED / "images" / "dog.jpg", thresh=float(ref["thresh"]), nms=float(ref["nms"])
    )
    # The fork decodes JPEG with stb_image, darknet-py with OpenCV: the pixels differ a
    # little, the boxes by up to about 1e-2 of the image.
    assert len(found) == int(ref["greedynms_kept"])
    want = ref["greedynms_boxes"][ref["greedynms_probs"].max(axis=1) > ref["thresh"]]
    got = np.array([d.box for d in found])
    nearest = np.abs(want[:, None, :] - got[None, :, :]).max(axis=2).min(axis=1)
    assert nearest.max() < 2e-2


def test_the_kind_comes_from_the_networks_last_layer():
    head = (
        "[convolutional]\nfilters=6\nsize=1\nactivation=linear\n[yolo]\nmask=0\n"
        "anchors=4,5\nnum=1\nclasses=1\nnms_kind=diounms\nbeta_nms=.7\n"
    )
    net = Network(
        parse_cfg_text("[net]\nwidth=8\nheight=8\nchannels=3\n" + head), backend=NumpyBackend()
    )
    assert nms_kind(net) == ("diounms", pytest.approx(0.7))
    # The fork's test/map/valid read net.layers[net.n - 1]: a last layer that is no [yolo]
    # has the default NMS.
    tail = Network(
        parse_cfg_text("[net]\nwidth=8\nheight=8\nchannels=3\n" + head + "[route]\nlayers=-1\n"),
        backend=NumpyBackend(),
    )
    assert nms_kind(tail) == ("default", 0.6)


def crowded_detections(seed, count=600, classes=20):
    """Many overlapping boxes, some of no area (their IoU is NaN), probabilities with ties
    and zeros: what a network early in training scores above a low threshold."""
    rng = np.random.default_rng(seed)
    boxes = rng.uniform(0.3, 0.7, (count, 4)).astype(np.float32)
    boxes[:, 2:] = rng.uniform(0.0, 0.4, (count, 2))
    boxes[::37, 2] = 0  # no width
    probs = np.round(rng.uniform(-0.5, 1, (count, classes)), 2).clip(0).astype(np.float32)
    return [
        Detection(box=tuple(map(float, b)), objectness=1.0, probs=p.copy())
        for b, p in zip(boxes, probs)
    ]


@pytest.mark.parametrize("kind", NMS_KINDS)
def test_pairs_compared_once_keep_what_row_by_row_keeps(kind, monkeypatch):
    """do_nms_sort's overlaps of every pair at once (PAIRWISE_MAX_BOXES) against its row by
    row form, which it keeps for more boxes than that: the same boxes, probabilities and
    order, bit for bit."""
    import darknet_py.boxes as boxes_module

    once = crowded_detections(7)
    do_nms_sort(once, 20, 0.45, kind, 0.6)
    monkeypatch.setattr(boxes_module, "PAIRWISE_MAX_BOXES", 0)
    rows = crowded_detections(7)
    do_nms_sort(rows, 20, 0.45, kind, 0.6)
    assert [d.box for d in once] == [d.box for d in rows]
    np.testing.assert_array_equal(np.array([d.probs for d in once]), [d.probs for d in rows])
    kept = np.array([d.probs for d in once]) > 0
    assert 0 < kept.sum() < (np.array([d.probs for d in crowded_detections(7)]) > 0).sum()
