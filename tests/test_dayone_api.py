"""The Python side of issue 21: no raw NumPy warnings from an untrained detector (item 4),
names (5), the API (6) and bad inputs (10)."""
import warnings

import numpy as np
import pytest

from darknet_py import load_network
from test_dayone_labels import DETECTOR_CFG


def untrained_detector(tmp_path, size_bias=0.0):
    """The 2-class test detector with zero weights and its box-size outputs' biases at
    size_bias (1000: exp overflows as in an early checkpoint)."""
    cfg = tmp_path / "d.cfg"
    cfg.write_text(DETECTOR_CFG)
    net = load_network(str(cfg), None, device="cpu")
    conv = net.layers[0]
    weights = np.zeros_like(net.be.to_host(conv.weights))
    biases = np.zeros(21, np.float32)
    biases[[4, 11, 18]] = 5.0            # objectness: every cell sure of an object
    biases[[2, 3, 9, 10]] = size_bias    # w, h of the first two anchors
    conv.weights = net.be.from_host(weights.astype(np.float32))
    conv.biases = net.be.from_host(biases)
    net.params_changed()
    return net


def test_an_overflowing_box_gives_no_numpy_warning_and_is_dropped(tmp_path):
    net = untrained_detector(tmp_path, size_bias=1000.0)
    image = np.full((40, 60, 3), 90, np.uint8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dets = net.detect(image, thresh=0.1)
    # the first two anchors' boxes are infinite and dropped; the third anchor's remain
    assert dets and all(np.all(np.isfinite(d.box)) for d in dets)
    assert all(d.box[2] < 2 for d in dets)
