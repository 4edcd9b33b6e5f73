"""The [region] and [detection] losses on the GPU (ops/losses/region_loss.cu) against their NumPy
references (losses/region.py, losses/detection.py), element for element.

Each case runs the op on both backends from the same float32 inputs, the arrays it writes
poisoned with NaN first (an element it fails to write shows). Deltas must agree to 1e-5
relative, the scalars (cost and statistics sums) to 1e-5; the grid truth and the random
draws exactly. Repeated CUDA runs must give the same bits (fixed-order sums). A training
step of a network with such a head reads nothing back from the device but the scalars.
"""

import numpy as np
import pytest
from test_detection import REGION_TRAIN
from test_head_losses import DETECTION_RANDOM

from darknet_py.backends.numpy_backend import NumpyBackend
from darknet_py.cfg import parse_cfg_text
from darknet_py.losses.detection import DETECTION_SCALARS, DetectionHead
from darknet_py.losses.region import REGION_SCALARS, RegionHead
from darknet_py.network import Network

pytestmark = pytest.mark.gpu
F32 = np.float32
REF = NumpyBackend(np.float32)


def run(backend, op, *args):
    """backend.<op>(*args) with every host array made a backend array; the host copies of
    the array arguments afterwards."""
    arrays = [backend.from_host(a) if isinstance(a, np.ndarray) else a for a in args]
    getattr(backend, op)(*arrays)
    return [backend.to_host(a) for a, host in zip(arrays, args) if isinstance(host, np.ndarray)]


def poison(n):
    return np.full(int(n), np.nan, dtype=F32)


def both(cuda, op, *args, written=1):
    """(reference, CUDA) host copies of the last `written` array arguments after op; CUDA
    runs twice, which must agree bit for bit."""
    want = run(REF, op, *args)[-written:]
    got = run(cuda, op, *args)[-written:]
    again = run(cuda, op, *args)[-written:]
    for g, a in zip(got, again):
        np.testing.assert_array_equal(g, a, err_msg=f"{op}: a repeated run differs")
    return want, got


def assert_close(got, want, what):
    """max |got - want| / max |want| under 1e-5 (what the CUDA op tests use), every
    element written."""
    assert not np.isnan(got).any(), f"{what}: elements left unwritten"
    err = np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-30)
    assert err < 1e-5, f"{what}: relative error {err:.3g}"


def truth_rows(rng, batch, per_image, counts, fields=5, classes=4):
    """Box rows (batch, per_image*fields) with counts[b] random boxes in image b."""
    truth = np.zeros((batch, per_image, fields), dtype=F32)
    for b, k in enumerate(counts):
        truth[b, :k, :2] = rng.uniform(0.01, 1, (k, 2))
        truth[b, :k, 2:4] = rng.uniform(0.02, 0.8, (k, 2))
        truth[b, :k, 4] = rng.integers(0, classes, k)
    return truth


def region_output(rng, head):
    out = rng.random((head.batch, head.n, head.entries, head.h, head.w), dtype=F32)
    out[:, :, 2:4] = rng.normal(0, 0.5, out[:, :, 2:4].shape)
    # Softmax-like class scores: positive, under 1.
    out[:, :, 5:] = rng.uniform(0.01, 0.99, out[:, :, 5:].shape)
    return out.reshape(-1)


def region_case(rng, name):
    """(head, truth (batch, floats), truth_size, seen) of one named case."""
    head = dict(
        batch=4,
        n=5,
        h=13,
        w=13,
        classes=4,
        softmax=1,
        bias_match=1,
        rescore=1,
        thresh=0.6,
        coord_scale=1.0,
        object_scale=5.0,
        noobject_scale=1.0,
        class_scale=1.0,
    )
    fields, seen = 5, 64
    if name == "above_prior":
        seen = 12800
    if name == "fork_rows":
        fields = 6
    if name == "softmax0":
        head.update(softmax=0, bias_match=0, rescore=0, thresh=0.3)
    truth = truth_rows(rng, 4, 90, [0, 3, 12, 1], fields)
    if name == "empty":
        truth[:] = 0
    if name == "border":
        truth[0, :4, :4] = [
            [1.0, 0.5, 0.3, 0.4],
            [0.5, 1.0, 0.2, 0.2],
            [1.0, 1.0, 0.9, 0.9],
            [0.999, 0.001, 0.1, 0.1],
        ]
    if name == "crowded":
        # 40 boxes an image, more than the 30 read and than the anchors of a cell.
        head.update(n=2, h=4, w=4, thresh=0.3)
        truth = truth_rows(rng, 4, 90, [40, 40, 0, 35], fields)
    if name in ("softmax0", "same_cell"):
        # Two boxes in one cell with one shape: one anchor, the second overwrites the first.
        truth[1, :3, :4] = [[0.31, 0.32, 0.3, 0.4], [0.33, 0.30, 0.31, 0.41], [0.7, 0.2, 0.1, 0.5]]
    return RegionHead(**head), truth.reshape(4, -1), fields, seen


@pytest.mark.parametrize(
    "name",
    ["random", "above_prior", "empty", "border", "crowded", "same_cell", "softmax0", "fork_rows"],
)
def test_region_loss(cuda, name):
    rng = np.random.default_rng(sum(map(ord, name)))
    head, truth, fields, seen = region_case(rng, name)
    out = region_output(rng, head)
    anchors = np.array([0.57, 0.68, 1.87, 2.06, 3.34, 5.47, 7.88, 3.53, 9.77, 9.17], dtype=F32)[
        : 2 * head.n
    ]
    (want_delta, want_scalars), (delta, scalars) = both(
        cuda,
        "region_loss",
        head,
        out,
        truth.reshape(-1),
        fields,
        anchors,
        seen,
        poison(out.size),
        poison(len(REGION_SCALARS)),
        written=2,
    )
    assert not np.isnan(want_delta).any()
    assert_close(delta, want_delta, name)
    np.testing.assert_allclose(scalars, want_scalars, rtol=1e-5)
    count = REGION_SCALARS.index("count")
    assert scalars[count] == want_scalars[count]
    # The case reaches what it is named for.
    obj = want_delta.reshape(head.batch, head.n, head.entries, -1)[:, :, 4]
    if name == "empty":
        assert want_scalars[count] == 0
    else:
        assert want_scalars[count] > 0 and (obj == 0).any()  # thresh zeroed some cells
    if name == "crowded":
        assert want_scalars[count] == 30 + 30 + 30


def detection_case(rng, name):
    head = dict(
        batch=3,
        side=7,
        n=3,
        classes=5,
        sqrt=1,
        rescore=1,
        forced=0,
        coord_scale=5.0,
        object_scale=1.0,
        noobject_scale=0.5,
        class_scale=1.0,
    )
    if name == "forced":
        head.update(forced=1, sqrt=0, rescore=0)
    head = DetectionHead(**head)
    out = rng.uniform(0.05, 0.95, (head.batch, head.outputs)).astype(F32)
    if name == "far_boxes":
        # Small boxes far outside the image overlap no truth: the RMSE decides (image 0),
        # or with every RMSE >= 20 no box does and Darknet writes the slots before the
        # cell's (image 2).
        boxes = out[:, 49 * (5 + 3) :].reshape(3, -1, 4)
        boxes[:, :, 2:] = rng.uniform(0.01, 0.05, boxes[:, :, 2:].shape)
        boxes[0, :, :2] = rng.uniform(40, 60, boxes[0, :, :2].shape)
        boxes[2, :, :2] = rng.uniform(150, 200, boxes[2, :, :2].shape)
    truth = truth_rows(rng, 3, 90, [6, 0, 20], classes=6)  # class 5: outside, sets none
    truth[0, 1, :2] = truth[0, 0, :2] + 0.01  # the first box claims the cell
    truth[0, 2, 2] = 0.004  # too narrow: dropped
    truth[2, 3, :2] = [1.0, 1.0]  # the border cell
    truth[2, 10, 0] = 0  # ends image 2's boxes
    return head, out.reshape(-1), truth.reshape(3, -1)


@pytest.mark.parametrize("name", ["random", "forced", "far_boxes", "random_box"])
def test_detection_grid_truth_and_loss(cuda, name):
    rng = np.random.default_rng(sum(map(ord, name)))
    head, out, truth = detection_case(rng, name)
    cells = head.batch * head.side * head.side
    (want_grid,), (grid,) = both(
        cuda,
        "detection_grid_truth",
        truth.reshape(-1),
        head.batch,
        5,
        90,
        head.side,
        head.classes,
        poison(cells * head.cell_truth),
    )
    np.testing.assert_array_equal(grid, want_grid)
    assert want_grid.reshape(cells, -1)[:, 0].sum() > 5
    draws = None
    if name == "random_box":
        (want_draws,), (draws,) = both(cuda, "uniform", poison(cells), 1234)
        np.testing.assert_array_equal(draws, want_draws)
        assert len(np.unique(np.minimum((draws * 3).astype(int), 2))) == 3
    (want_delta, want_scalars), (delta, scalars) = both(
        cuda,
        "detection_loss",
        head,
        out,
        want_grid,
        draws,
        poison(out.size),
        poison(len(DETECTION_SCALARS)),
        written=2,
    )
    assert not np.isnan(want_delta).any()
    assert_close(delta, want_delta, name)
    np.testing.assert_allclose(scalars, want_scalars, rtol=1e-5)


@pytest.mark.parametrize(
    "text,image",
    [(REGION_TRAIN.format(softmax=1), (3, 8, 8)), (DETECTION_RANDOM, (2, 4, 4))],
    ids=["region", "detection"],
)
def test_a_training_step_reads_back_only_the_scalars(cuda, text, image, monkeypatch):
    from darknet_py.backends import get_backend

    rng = np.random.default_rng(3)
    cfg = parse_cfg_text(text, "t.cfg")
    x = rng.random((2,) + image, dtype=F32)
    truth = truth_rows(rng, 2, 90, [3, 1], classes=3).reshape(2, -1)
    nets = [Network(cfg, "t.cfg", batch=2, seed=5, backend=get_backend(d)) for d in ("cpu", "cuda")]
    for net in nets:
        net.train_pass(x, truth)  # buffers made, kernels loaded
    gpu = nets[1]
    reads = []
    real = type(gpu.be).to_host
    monkeypatch.setattr(type(gpu.be), "to_host", lambda be, arr: reads.append(arr) or real(be, arr))
    costs = [net.train_pass(x, truth) for net in nets]
    assert reads == [gpu.layers[1].scalars]
    assert costs[1] == pytest.approx(costs[0], rel=1e-4)
    assert gpu.layers[1].stats["count"] == nets[0].layers[1].stats["count"] > 0


@pytest.mark.parametrize("activation", ["logistic", "leaky"])
def test_gradient_strided(cuda, activation):
    """The region layer's backward: the logistic planes (x, y; objectness) of each anchor
    block, rows of width wh every (5 + classes)*wh."""
    rng = np.random.default_rng(8)
    rows, stride, offset, width = 40, 9 * 169, 4 * 169, 169
    y = rng.uniform(-0.99, 0.99, rows * stride + 7).astype(F32)  # leaky: both slopes
    delta = rng.uniform(-1, 1, y.size).astype(F32)
    (want,), (got,) = both(
        cuda, "gradient_strided", y, rows, stride, offset, width, activation, delta
    )
    assert_close(got, want, activation)
    rows_of = np.zeros(y.size, dtype=bool)
    rows_of[(offset + np.arange(rows)[:, None] * stride + np.arange(width)).reshape(-1)] = True
    assert np.array_equal(want[~rows_of], delta[~rows_of]) and not np.array_equal(want, delta)
