"""The [yolo] loss as a backend op (`yolo_loss`): the CUDA kernels (ops/losses/yolo_loss.cu)
against the NumPy op (darknet_py/losses/yolo.py) element for element, in both flavours and
with each of the fork's options, and a detector trained on the GPU against the CPU.

Cases: random activated outputs with predictions planted on some truths (so that
ignore_thresh and truth_thresh both act), an image without truths, truths on the image's
border (x = 1.0), more truths than the head has anchors and cells, two and three truths in
one cell (later ones overwrite; Darknet's class-delta quirk), truths past max= and after
a zero x. The CUDA op's outputs start as NaN, so an entry it does not write shows.
"""

import math

import numpy as np
import pytest

import darknet_py as dn
from darknet_py.backends import cuda_available
from darknet_py.backends.numpy_backend import NumpyBackend
from darknet_py.cfg import parse_cfg_text
from darknet_py.layers.base import BuildContext
from darknet_py.layers.yolo import YoloLayer
from darknet_py.losses.yolo import SCALARS, every_truth, image_truths
from darknet_py.network import NetOptions

F32 = np.float32
NETW, NETH = 80, 64
gpu = pytest.mark.gpu

ORIGINAL = "original"
# name -> (flavour, [yolo] options)
CASES = {
    "original": (ORIGINAL, ""),
    "original-truth-thresh": (ORIGINAL, "ignore_thresh=.4\ntruth_thresh=.7\n"),
    "original-max": (ORIGINAL, "max=12\n"),
    "fork-mse": ("alexeyab", "iou_loss=mse\n"),
    "fork-mse-new-coords": ("alexeyab", "iou_loss=mse\nnew_coords=1\ntruth_thresh=.7\n"),
    "fork-iou": (
        "alexeyab",
        "iou_loss=iou\niou_normalizer=0.5\nobj_normalizer=2\ncls_normalizer=.7\n",
    ),
    "fork-giou": ("alexeyab", "iou_loss=giou\ntruth_thresh=.7\nmax_delta=0.02\n"),
    "fork-diou": ("alexeyab", "iou_loss=diou\nlabel_smooth_eps=0.1\nignore_thresh=.3\n"),
    "fork-ciou-iou-thresh": (
        "alexeyab",
        "iou_loss=ciou\niou_normalizer=0.07\niou_thresh=0.2\nmax_delta=5\n",
    ),
    "fork-ciou-new-coords-giou-thresh": (
        "alexeyab",
        "iou_loss=ciou\nnew_coords=1\niou_thresh=0.3\niou_thresh_kind=giou\n",
    ),
    "fork-diou-thresh-kinds": (
        "alexeyab",
        "iou_loss=diou\niou_thresh=0.25\niou_thresh_kind=ciou\ntruth_thresh=.8\n",
    ),
    "fork-smooth-counters": (
        "alexeyab",
        "iou_loss=iou\ncounters_per_class=10,50,25\n"
        "cls_normalizer=0.5\nobjectness_smooth=1\n"
        "ignore_thresh=.3\ntruth_thresh=.75\n",
    ),
    "fork-mse-smooth-eps-diou-kind": (
        "alexeyab",
        "iou_loss=mse\nobjectness_smooth=1\n"
        "label_smooth_eps=.05\niou_thresh=.3\n"
        "iou_thresh_kind=diou\nmax=20\n",
    ),
}


def make_layer(flavour, options, batch):
    body = (
        "[net]\n[yolo]\nmask=1,2,4\nanchors=6,5, 20,12, 40,24, 12,30, 60,44\nclasses=3\n"
        "num=5\n" + options
    )
    section = [s for s in parse_cfg_text(body) if s.type == "yolo"][0]
    c, h, w = 3 * 8, 4, 5
    ctx = BuildContext([], NetOptions(), batch, darknet=flavour)
    return YoloLayer(0, section, c, h, w, c * h * w, ctx)


def case_data(layer, fields, rng):
    """An activated output and a truth buffer (90 or 200 boxes of `fields` floats)."""
    B, n, C, h, w = layer.batch, layer.n, layer.classes, layer.h, layer.w
    out = np.empty((B, n, 5 + C, h, w), dtype=F32)
    out[:, :, [0, 1, 4]] = rng.random((B, n, 3, h, w))
    out[:, :, 5:] = rng.random((B, n, C, h, w)) * F32(0.6)
    out[:, :, 2:4] = (
        rng.random((B, n, 2, h, w)) * F32(0.8) + F32(0.1)
        if layer.new_coords
        else rng.normal(0, 0.5, (B, n, 2, h, w))
    )
    boxes = np.zeros((B, 200 if fields == 6 else 90, fields), dtype=F32)
    # Image 0: three truths in one cell (classes 0, 2, 0), a truth on the right and bottom
    # borders (x = y = 1.0), a small one whose best anchor is not masked, two more.
    boxes[0, :7, :5] = [
        [0.30, 0.25, 0.60, 0.70, 0],
        [0.33, 0.30, 0.62, 0.74, 2],
        [0.31, 0.28, 0.61, 0.72, 0],
        [1.0, 1.0, 0.20, 0.30, 1],
        [0.80, 0.70, 0.05, 0.06, 1],
        [0.55, 0.60, 0.31, 0.37, 1],
        [0.12, 0.85, 0.14, 0.35, 2],
    ]
    out[0, 1, 5, 1, 1] = 1.0  # class 0 saturated where the three meet (the quirk's case)
    # Image 1: none. Image 2: more truths than anchors x cells (60 > 3 x 20), many sharing
    # cells, then a zero x that ends the list before a box that must not count.
    many = rng.random((60, 5)).astype(F32)
    many[:, :2] = many[:, :2] * F32(0.98) + F32(0.01)
    many[:, 2:4] = many[:, 2:4] * F32(0.6) + F32(0.04)
    many[:, 4] = rng.integers(0, C, 60)
    boxes[2, :60, :5] = many
    boxes[2, 61, :5] = [0.5, 0.5, 0.3, 0.3, 1]
    if fields == 6:
        boxes[:, :, 5] = rng.integers(0, 9, boxes.shape[:2])
    # Image 3: a truth that the prediction at its cell fits closely, one loosely.
    boxes[3, :2, :5] = [[0.42, 0.45, 0.55, 0.70, 1], [0.85, 0.30, 0.30, 0.40, 2]]
    out[:, :, 5 + 1] = np.maximum(out[:, :, 5 + 1], F32(0.3))  # class 1 named: ignore acts
    # (image, truth, anchor slot, width factor): a close fit and a loose one in image 3,
    # and one in image 0.
    for b, k, slot, loose in ((3, 0, 1, 1.0), (3, 1, 0, 1.3), (0, 5, 0, 1.0)):
        tx, ty, tw, th = boxes[b, k, :4]
        i, j = int(tx * w), int(ty * h)
        out[b, slot, 0, j, i] = tx * w - i
        out[b, slot, 1, j, i] = ty * h - j
        aw, ah = layer.biases.reshape(-1, 2)[layer.mask[slot]]
        if layer.new_coords:
            out[b, slot, 2, j, i] = math.sqrt(tw * loose * NETW / aw / 4)
            out[b, slot, 3, j, i] = math.sqrt(th * NETH / ah / 4)
        else:
            out[b, slot, 2, j, i] = math.log(tw * loose * NETW / aw)
            out[b, slot, 3, j, i] = math.log(th * NETH / ah)
    return out.reshape(-1), boxes.reshape(B, -1)


def run_op(be, spec, out, truth, poison):
    size = out.size
    delta = be.from_host(np.full(size, np.nan if poison else 0, dtype=F32))
    scalars = be.from_host(np.full(len(SCALARS), np.nan if poison else 0, dtype=F32))
    be.yolo_loss(spec, be.from_host(out), be.from_host(truth), delta, scalars)
    return be.to_host(delta), be.to_host(scalars)


def case(name, batch=4):
    flavour, options = CASES[name]
    layer = make_layer(flavour, options, batch)
    fields = 6 if flavour == "alexeyab" else 5
    out, truth = case_data(layer, fields, np.random.default_rng(len(name)))
    return layer, layer.spec(NETW, NETH, fields), out, truth


# ---- CPU: the NumPy op is the layer's host loss -------------------------------------------
@pytest.mark.parametrize("name", ["original", "fork-ciou-iou-thresh", "fork-smooth-counters"])
def test_numpy_op_writes_the_host_loss_delta_and_figures(name):
    layer, spec, out, truth = case(name)
    delta, scalars = run_op(NumpyBackend(), spec, out, truth, poison=True)
    rows = truth.reshape(layer.batch, -1, spec.truth_fields)
    ends = [int(np.argmax(r[:, 0] == 0)) for r in rows]
    truths = [r[: min(e, spec.max_boxes)] for r, e in zip(rows, ends)]
    assert [len(t) for t in truths] == [7, 0, min(60, spec.max_boxes), 2]
    host = layer.fork_loss if layer.fork else layer.loss
    want_delta, want_cost, want_stats = host(out, truths, NETW, NETH)
    np.testing.assert_array_equal(delta, want_delta)
    assert scalars[0] == pytest.approx(want_cost, rel=1e-6)
    assert scalars[SCALARS.index("count")] == want_stats["count"] > 8
    assert np.all(np.isfinite(scalars))


def test_numpy_op_loss_reaches_each_branch():
    # The cases do what they claim: truth_thresh and ignore_thresh act, the quirk rewrites.
    layer, spec, out, truth = case("original-truth-thresh")
    delta, _ = run_op(NumpyBackend(), spec, out, truth, poison=False)
    d = delta.reshape(layer.batch, layer.n, 8, layer.h, layer.w)
    o = out.reshape(d.shape)
    assert np.sum((d[:, :, 4] == 0)) > 0  # ignored predictions
    assert np.sum(d[:, :, 4] == 1 - o[:, :, 4]) >= 3  # assigned (truths, thresh)
    assert np.all(d[1, :, :4] == 0) and np.all(d[1, :, 4] == -o[1, :, 4])  # no truths


# ---- GPU: the CUDA op against the NumPy op ---------------------------------------------------
@gpu
@pytest.mark.parametrize("name", sorted(CASES))
def test_cuda_yolo_loss_matches_numpy(cuda, name):
    layer, spec, out, truth = case(name)
    want_delta, want = run_op(NumpyBackend(), spec, out, truth, poison=False)
    got_delta, got = run_op(cuda, spec, out, truth, poison=True)
    np.testing.assert_allclose(got_delta, want_delta, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert got[SCALARS.index("count")] > 8


@gpu
def test_cuda_yolo_loss_is_bit_identical_from_run_to_run(cuda):
    _, spec, out, truth = case("fork-ciou-iou-thresh", batch=64)
    first = run_op(cuda, spec, out, truth, poison=True)
    for _ in range(3):
        again = run_op(cuda, spec, out, truth, poison=True)
        for a, b in zip(first, again):
            np.testing.assert_array_equal(a, b)


DETECTOR_CFG = """
[net]
batch=8
subdivisions=1
width=32
height=32
channels=3
learning_rate={learning_rate}
momentum=0.9
decay=0.0005
max_batches=200
policy=constant

[convolutional]
batch_normalize=1
filters=8
size=3
stride=1
pad=1
activation=leaky

[maxpool]
size=2
stride=2

[convolutional]
batch_normalize=1
filters=16
size=3
stride=1
pad=1
activation=leaky

[maxpool]
size=2
stride=2

[convolutional]
filters=16
size=1
stride=1
pad=1
activation=linear

[yolo]
mask=0,1
anchors=6,6, 14,14
classes=3
num=2
ignore_thresh=.5
truth_thresh=1
"""
FORK_OPTIONS = "iou_loss=ciou\niou_normalizer=0.07\niou_thresh=0.213\nscale_x_y=1.05\n"
# The fork's loss is far more sensitive to rounding than the original's (its objectness
# delta jumps where a class probability crosses .25): on the CPU alone, initial weights
# moved by 1e-6 relative change the loss of iteration 200 by 3.4e-2 at learning_rate=0.002
# (the original's: 7e-7) and by 2.6e-4 at 0.0005, so the fork's run takes the latter.
LEARNING_RATES = {"original": 0.002, "alexeyab": 0.0005}


def train_detector(device, darknet, steps=200):
    """A deterministic 200-iteration run on synthetic boxes (a bright square of one of 3
    colours on noise): the loss of every iteration."""
    text = DETECTOR_CFG.format(learning_rate=LEARNING_RATES[darknet]) + (
        FORK_OPTIONS if darknet == "alexeyab" else ""
    )
    net = dn.Network(
        parse_cfg_text(text, "det.cfg"),
        "det.cfg",
        backend=dn.backends.get_backend(device),
        seed=5,
        darknet=darknet,
    )
    rng = np.random.default_rng(9)
    losses = []
    for _ in range(steps):
        x = rng.random((net.batch, 3, 32, 32), dtype=np.float32) * F32(0.3)
        truth = np.zeros((net.batch, net.max_boxes * net.truth_size), dtype=F32)
        for b in range(net.batch):
            size = rng.integers(6, 16)
            x0, y0 = rng.integers(0, 32 - size, 2)
            cls = rng.integers(0, 3)
            x[b, cls, y0 : y0 + size, x0 : x0 + size] += F32(0.7)
            truth[b, :5] = [(x0 + size / 2) / 32, (y0 + size / 2) / 32, size / 32, size / 32, cls]
        losses.append(net.train_pass(x, truth))
    return np.asarray(losses), net.layers[-1]


@gpu
@pytest.mark.skipif(not cuda_available(), reason="needs PyCUDA and a CUDA GPU")
@pytest.mark.parametrize("darknet", ["original", "alexeyab"])
def test_200_iteration_detector_loss_curve_matches_cpu(darknet):
    cpu, cpu_head = train_detector("cpu", darknet)
    gpu_, gpu_head = train_detector("cuda", darknet)
    # As test_cuda_network's classifier curve: float32 rounding grows slowly over the
    # updates; 1e-3 relative at every iteration.
    worst = np.max(np.abs(gpu_ - cpu) / np.abs(cpu))
    print(f"{darknet}: worst relative gap {worst:.2e}, loss {cpu[0]:.3f} -> {cpu[-1]:.3f}")
    assert np.all(np.abs(gpu_ - cpu) <= 1e-3 * np.abs(cpu) + 1e-5), worst
    assert cpu[-20:].mean() < 0.5 * cpu[:20].mean()  # it did learn
    assert gpu_head.stats["count"] == cpu_head.stats["count"] >= 8
    assert gpu_head.stats["avg_iou"] == pytest.approx(cpu_head.stats["avg_iou"], rel=1e-2)


def test_every_truth_is_image_truths_together():
    layer, spec, _, truth = case("original-max")
    # Darknet's loop: per image, boxes up to max_boxes, stopping at the first x == 0.
    rows = truth.reshape(spec.batch, -1)
    want = []
    for row in rows:
        image = []
        for t in range(min(spec.max_boxes, row.size // spec.truth_fields)):
            box = row[t * spec.truth_fields : (t + 1) * spec.truth_fields]
            if not box[0]:
                break
            image.append(box)
        want.append(np.array(image, dtype=np.float32).reshape(-1, spec.truth_fields))
    assert [len(w) for w in want] == [len(g) for g in image_truths(spec, truth)]
    for w, g in zip(want, image_truths(spec, truth)):
        np.testing.assert_array_equal(g, w)
    assert sum(map(len, want)) == 7 + 12 + 2
    np.testing.assert_array_equal(every_truth(spec, truth), np.concatenate(want))
