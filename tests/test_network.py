"""Network-level behaviour: batch changes, resize, the iteration count, predict's output."""

import numpy as np
import pytest

from darknet_py.cfg import parse_cfg_text
from darknet_py.network import Network, NetworkError

CFG = """[net]
batch=4
subdivisions=2
width=16
height=16
channels=3
learning_rate=0.1
policy=steps
steps=2
scales=.5
[convolutional]
batch_normalize=1
filters=4
size=3
stride=2
pad=1
activation=leaky
[convolutional]
filters=3
size=1
activation=linear
[avgpool]
[softmax]
"""


def make(text=CFG):
    return Network(parse_cfg_text(text, "n.cfg"), "n.cfg", seed=1)


def batch_of(net, n, rng):
    x = rng.random((n,) + net.input_shape, dtype=np.float32)
    return x, np.eye(3, dtype=np.float32)[rng.integers(0, 3, n)]


def test_iteration_count_ignores_inference_batch():
    net = make()
    rng = np.random.default_rng(0)
    assert net.batch == 2  # batch / subdivisions per forward
    for _ in range(4):
        net.train_pass(*batch_of(net, 2, rng))
    assert (net.seen, net.iteration) == (8, 2)
    assert net.learning_rate == pytest.approx(0.05)  # past step 2
    net.predict(rng.random((1,) + net.input_shape, dtype=np.float32))
    assert net.batch == 1
    assert (net.seen, net.iteration) == (8, 2)
    assert net.learning_rate == pytest.approx(0.05)


def test_update_only_after_all_subdivisions():
    net = make()
    rng = np.random.default_rng(1)
    conv = net.layers[0]
    before = net.be.to_host(conv.weights)
    net.train_pass(*batch_of(net, 2, rng))
    assert net.last_rate is None
    np.testing.assert_array_equal(net.be.to_host(conv.weights), before)
    net.train_pass(*batch_of(net, 2, rng))
    assert net.last_rate == pytest.approx(0.1)
    assert not np.array_equal(net.be.to_host(conv.weights), before)


def test_resize_keeps_parameters_and_changes_shapes():
    net = make()
    rng = np.random.default_rng(2)
    net.train_pass(*batch_of(net, 2, rng))
    weights = net.be.to_host(net.layers[0].weights)
    rolling = net.be.to_host(net.layers[0].rolling_mean)
    net.resize(24, 20)
    conv = net.layers[0]
    assert (conv.out_w, conv.out_h) == (12, 10)
    np.testing.assert_array_equal(net.be.to_host(conv.weights), weights)
    np.testing.assert_array_equal(net.be.to_host(conv.rolling_mean), rolling)
    loss = net.train_pass(*batch_of(net, 2, rng))
    assert np.isfinite(loss) and net.seen == 4


def test_resize_refuses_input_sized_weights():
    net = make(CFG.replace("[avgpool]\n[softmax]\n", "[connected]\noutput=3\n[softmax]\n"))
    with pytest.raises(NetworkError, match="connected"):
        net.resize(32, 32)
    assert (net.options.width, net.options.height) == (16, 16)


def test_predict_checks_the_input_shape():
    net = make()
    with pytest.raises(ValueError, match=r"\(N, 3, 16, 16\)"):
        net.predict(np.zeros((2, 3, 8, 8), dtype=np.float32))


def test_train_iteration_is_its_subdivision_passes_and_one_update():
    rng = np.random.default_rng(3)
    x, truth = batch_of(make(), 4, rng)
    by_passes, whole = make(), make()
    assert (whole.images_per_pass, whole.images_per_iteration) == (2, 4)
    costs = [by_passes.train_pass(x[:2], truth[:2]), by_passes.train_pass(x[2:], truth[2:])]
    loss = whole.train_iteration(x, truth)
    assert loss == pytest.approx(sum(costs) / 4, rel=1e-6)
    assert whole.seen == 4 and whole.iteration == 1 and whole.last_rate == pytest.approx(0.1)
    for a, b in zip(by_passes.layers, whole.layers):
        for (name, pa), (_, pb) in zip(a.params(), b.params()):
            np.testing.assert_array_equal(a.be.to_host(pa), b.be.to_host(pb), err_msg=name)
    with pytest.raises(
        ValueError,
        match=r"train_iteration takes 4 images \(subdivisions=2 "
        r"passes of net.images_per_pass=2\), got 3",
    ):
        whole.train_iteration(x[:3], truth[:3])
