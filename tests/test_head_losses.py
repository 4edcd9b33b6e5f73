"""The [region] and [detection] loss ops' NumPy side (losses/region.py, losses/detection.py) and
how the layers use them; the transcriptions of Darknet's loops are in test_detection.py,
the CUDA kernels against these in test_cuda_region_loss.py."""

import copy

import numpy as np
import pytest
from helpers import grid_truth_from_boxes
from test_detection import REGION_TRAIN

from darknet_py.boxes import truth_table
from darknet_py.cfg import parse_cfg_text
from darknet_py.draws import uniform_hash
from darknet_py.losses.detection import (
    DETECTION_SCALARS,
    detection_grid_truth,
    detection_loss,
    random_choices,
)
from darknet_py.network import Network

F32 = np.float32


def test_truth_table_stops_each_image_at_its_first_zero_x_and_at_the_limit():
    truth = np.zeros((2, 4, 6), dtype=F32)
    truth[0, :3, 0] = [0.5, 0, 0.7]  # the box after the zero x is not read
    truth[1, :, 0] = [0.1, 0.2, 0.3, 0.4]
    rows, valid = truth_table(truth.reshape(-1), 2, 6, 3)
    assert rows.shape == (2, 3, 6)
    assert valid.tolist() == [[True, False, False], [True, True, True]]


def test_grid_truth_of_a_batch_is_each_images_fill_truth_region():
    boxes = np.zeros((2, 6, 5), dtype=F32)
    boxes[0, :4] = [
        [0.75, 0.25, 0.2, 0.3, 2],
        [0.80, 0.40, 0.5, 0.5, 0],  # one cell: the first wins
        [0.20, 0.90, 0.004, 0.5, 1],
        [0.1, 0.9, 0.3, 0.3, 7],
    ]  # too narrow; class 7: none
    boxes[1, :3] = [
        [1.0, 1.0, 0.3, 0.3, 1],
        [0, 0.5, 0.5, 0.5, 0],
        [0.2, 0.2, 0.2, 0.2, 0],
    ]  # x=0 ends
    grid = np.full(2 * 4 * 8, np.nan, dtype=F32)
    detection_grid_truth(boxes.reshape(-1), 2, 5, 6, 2, 3, grid)
    grid = grid.reshape(2, 4, 8)
    np.testing.assert_allclose(grid[0, 1], [1, 0, 0, 1, 0.5, 0.5, 0.2, 0.3], rtol=1e-6)
    np.testing.assert_allclose(grid[0, 2], [1, 0, 0, 0, 0.2, 0.8, 0.3, 0.3], rtol=1e-6)
    np.testing.assert_allclose(grid[1, 3], [1, 0, 1, 0, 1, 1, 0.3, 0.3], rtol=1e-6)
    assert not grid[0, [0, 3]].any() and not grid[1, :3].any()
    np.testing.assert_array_equal(grid[0].reshape(-1), grid_truth_from_boxes(boxes[0, :4], 2, 3))


DETECTION_RANDOM = """[net]
width=4
height=4
channels=2
[connected]
output=117
activation=linear
[detection]
classes=3
coords=4
side=3
num=2
sqrt=1
rescore=1
random=1
"""


def test_detection_random_draws_the_responsible_box_from_the_networks_rng():
    net = Network(parse_cfg_text(DETECTION_RANDOM, "t.cfg"), "t.cfg", batch=2, seed=6)
    layer = net.layers[1]
    rng = np.random.default_rng(2)
    x = rng.random((2, 2, 4, 4), dtype=F32)
    boxes = np.zeros((2, 10, 5), dtype=F32)
    boxes[0, :3] = [[0.5, 0.5, 0.3, 0.4, 1], [0.1, 0.2, 0.2, 0.1, 0], [0.9, 0.85, 0.15, 0.2, 2]]
    boxes[1, :2] = [[0.4, 0.6, 0.6, 0.7, 2], [0.8, 0.1, 0.3, 0.3, 1]]
    grid = np.concatenate([grid_truth_from_boxes(b, 3, 3) for b in boxes])

    def expected(draws):
        delta, scalars = np.zeros(2 * 117, dtype=F32), np.zeros(len(DETECTION_SCALARS))
        detection_loss(layer.loss_head(), net.layer_output(1), grid, draws, delta, scalars)
        return delta

    rng_before = copy.deepcopy(net.rng)
    net.forward(x, boxes.reshape(2, -1), train=True)
    draws = uniform_hash(rng_before.integers(1 << 31), 2 * 9)
    choices = random_choices(draws, 2)
    assert 0 in choices and 1 in choices
    np.testing.assert_array_equal(net.layer_delta(1).reshape(-1), expected(draws))
    assert not np.array_equal(expected(draws), expected(None))
    net.seen = 64000  # from then on the best box is chosen, as without random
    net.forward(x, boxes.reshape(2, -1), train=True)
    np.testing.assert_array_equal(net.layer_delta(1).reshape(-1), expected(None))


def test_region_reports_its_line_after_the_step_and_refuses_an_unknown_class(capsys):
    text = REGION_TRAIN.format(softmax=1)
    net = Network(parse_cfg_text(text, "t.cfg"), "t.cfg", batch=1, seed=1)
    x = np.random.default_rng(1).random((1, 3, 8, 8), dtype=F32)
    truth = np.zeros((1, 30 * 5), dtype=F32)
    truth[0, :10] = [0.3, 0.3, 0.3, 0.3, 1, 0.7, 0.6, 0.2, 0.5, 3]
    net.verbose = True
    net.train_pass(x, truth)
    line = net.layers[1].stats_line
    assert capsys.readouterr().out == line + "\n"
    assert line.startswith("Region Avg IOU: ") and line.endswith("count: 2")
    truth[0, 9] = 4  # classes=4: ids 0..3
    with pytest.raises(ValueError, match="class 4"):
        net.train_pass(x, truth)
