"""Convolutions run a batch in chunks sized by the workspace cap: any chunking must give
the same outputs, deltas and weight gradients as the whole batch at once."""

import numpy as np

from darknet_py.backends.numpy_backend import NumpyBackend
from darknet_py.cfg import parse_cfg_text
from darknet_py.layers import convolutional
from darknet_py.network import Network

CFG = """[net]
batch=5
width=11
height=9
channels=4
[convolutional]
batch_normalize=1
filters=6
size=3
stride=2
pad=1
groups=2
activation=leaky
[convolutional]
filters=4
size=1
activation=logistic
[convolutional]
filters=3
size=3
dilation=2
pad=1
activation=linear
[avgpool]
[softmax]
"""


def run(cap, monkeypatch):
    # chunk = cap // ((k + m) * n) images: tiny caps force chunks of 1 or a few images
    monkeypatch.setattr(convolutional, "WORKSPACE_CAP_FLOATS", cap)
    net = Network(
        parse_cfg_text(CFG, "chunks.cfg"), "chunks.cfg", backend=NumpyBackend(np.float64), seed=4
    )
    rng = np.random.default_rng(9)
    x = rng.random((5, 4, 9, 11))
    truth = np.eye(3)[rng.integers(0, 3, 5)]
    net.forward(x, truth, train=True)
    net.backward()
    chunks = [l._chunk(net.batch) for l in net.layers[:3]]
    outputs = [net.layer_output(i) for i in range(3)]
    deltas = [net.layer_delta(i) for i in range(2)]
    grads = [net.be.to_host(l.weight_updates) for l in net.layers[:3]]
    return chunks, outputs, deltas, grads


def test_any_chunking_gives_the_same_numbers(monkeypatch):
    whole = run(1 << 25, monkeypatch)
    assert whole[0] == [5, 5, 5]
    for cap, expect in [(1, [1, 1, 1]), (3 * (18 + 3) * 30, [3, 5, 1])]:
        part = run(cap, monkeypatch)
        assert part[0] == expect
        for a_list, b_list in zip(whole[1:], part[1:]):
            for a, b in zip(a_list, b_list):
                np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-12)


def test_workspace_is_sized_for_the_chunk():
    net = Network(parse_cfg_text(CFG, "chunks.cfg"), "chunks.cfg")
    conv = net.layers[0]
    m, k, n = conv._gemm_dims()
    assert (m, k, n) == (3, 18, 30)
    assert conv.workspace_size == (k + m) * n * 5
    assert net.workspace.size == max(l.workspace_size for l in net.layers)
