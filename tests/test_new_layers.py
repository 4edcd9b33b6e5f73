"""Options, shapes and cfg errors of issue 23's layers ([activation], [logistic], [l2norm],
[normalization]/[lrn], [deconvolutional]/[deconv]); their numbers are in
test_layers_c_fixtures.py."""

from pathlib import Path

import numpy as np
import pytest

import darknet_py
from darknet_py.cfg import CfgError, parse_cfg
from darknet_py.network import Network

NET = "[net]\nbatch=2\nheight=6\nwidth=5\nchannels=3\n"


def build(tmp_path, body):
    p = tmp_path / "net.cfg"
    p.write_text(NET + body)
    return Network(parse_cfg(p), p)


@pytest.mark.parametrize(
    "section,out",
    [
        ("[activation]\nactivation=tanh", (3, 6, 5)),
        ("[logistic]", (3, 6, 5)),
        ("[l2norm]", (3, 6, 5)),
        ("[lrn]", (3, 6, 5)),
        ("[normalization]\nsize=3", (3, 6, 5)),
        ("[deconv]\nfilters=4\nsize=4\nstride=2\npad=1", (4, 10, 8)),  # (h-1)*2 + 4 - 2*2
        ("[deconvolutional]\nfilters=2\nsize=3\nstride=3", (2, 18, 15)),  # (h-1)*3 + 3
    ],
)
def test_output_shapes(tmp_path, section, out):
    layer = build(tmp_path, section + "\n").layers[0]
    assert (layer.out_c, layer.out_h, layer.out_w) == out
    assert layer.outputs == int(np.prod(out))


@pytest.mark.parametrize(
    "section,where",
    [
        ("[activation]\nactivation=sigmoid", ":7: activation: unknown activation 'sigmoid'"),
        ("[lrn]\nsize=0", ":7: size: must be at least 1"),
        ("[deconv]\nfilters=0", ":7: filters: must be at least 1"),
        ("[deconv]\nsize=2\npadding=3", ":8: padding: padding 3 leaves no output"),
    ],
)
def test_bad_options_name_file_line_and_key(tmp_path, section, where):
    with pytest.raises(CfgError) as e:
        build(tmp_path, section + "\n")
    assert where in str(e.value)


def test_logistic_cost_is_the_cross_entropy(tmp_path):
    net = build(tmp_path, "[logistic]\n")
    rng = np.random.default_rng(0)
    x = rng.uniform(-2, 2, (2, 3, 6, 5)).astype(np.float32)
    truth = (rng.uniform(size=(2, 90)) < 0.5).astype(np.float32)
    net.forward(x, truth)
    p = 1 / (1 + np.exp(-x.reshape(2, -1).astype(np.float64)))
    want = -(truth * np.log(p) + (1 - truth) * np.log(1 - p)).sum()
    assert net.layers[0].cost == pytest.approx(want, rel=1e-5)
    np.testing.assert_allclose(net.layer_output(0).reshape(2, -1), p, rtol=1e-5)


def test_l2norm_gives_unit_channel_vectors(tmp_path):
    net = build(tmp_path, "[l2norm]\n")
    x = np.random.default_rng(1).uniform(-1, 1, (2, 3, 6, 5)).astype(np.float32)
    net.forward(x)
    np.testing.assert_allclose(np.linalg.norm(net.layer_output(0), axis=1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(
        net.layer_output(0) * np.linalg.norm(x, axis=1, keepdims=True), x, rtol=1e-5, atol=1e-7
    )


def test_deconv_is_the_adjoint_of_a_convolution(tmp_path):
    """<deconv(x), y> = <x, conv(y)> with the same weights and no bias: the transposed
    convolution's definition, independent of Darknet."""
    net = build(tmp_path, "[deconv]\nfilters=2\nsize=3\nstride=2\npad=1\nactivation=linear\n")
    layer = net.layers[0]
    rng = np.random.default_rng(2)
    w = rng.standard_normal((3, 2, 3, 3)).astype(np.float32)  # (c, filters, k, k)
    net.be.write(layer.weights, w)
    x = rng.standard_normal((2, 3, 6, 5)).astype(np.float32)
    net.forward(x)
    y = rng.standard_normal(net.layer_output(0).shape)
    # conv(y)[c, i, j] = sum over f, a, b of w[c, f, a, b] * y_padded[f, 2i + a, 2j + b]
    yp = np.pad(y, ((0, 0), (0, 0), (1, 1), (1, 1)))
    conv = np.zeros(x.shape)
    for a in range(3):
        for b in range(3):
            window = yp[:, :, a : a + 2 * 6 : 2, b : b + 2 * 5 : 2]
            conv += np.einsum("cf,nfij->ncij", w[:, :, a, b], window)
    assert float((net.layer_output(0) * y).sum()) == pytest.approx(
        float((x * conv).sum()), rel=1e-4
    )


def test_info_table_rows(tmp_path):
    p = tmp_path / "net.cfg"
    p.write_text(
        NET + "[deconv]\nfilters=4\nsize=4\nstride=2\npad=1\n[lrn]\n[l2norm]\n"
        "[activation]\nactivation=leaky\n[logistic]\n"
    )
    text = "\n".join(darknet_py.network.build_network(p).summary())
    assert "deconv    4  4 x 4 / 2     5 x   6 x   3   ->     8 x  10 x   4" in text
    assert "norm      5" in text and "l2norm" in text and "logxent" in text


def binarized(w, filters):
    w = w.reshape(filters, -1)
    mean = np.abs(w).mean(axis=1, keepdims=True)
    return np.where(w > 0, mean, -mean).reshape(-1)


CONV = "[convolutional]\nfilters=4\nsize=3\npad=1\nactivation=linear\n"


@pytest.mark.parametrize("option", ["binary=1", "xnor=1"])
def test_binary_convolution_is_a_convolution_with_binarized_operands(tmp_path, option):
    """Forward: a plain convolution of the binarized weights (and, for xnor, of the input's
    signs). Backward: the plain convolution's gradients with the real weights and input."""
    rng = np.random.default_rng(3)
    x = rng.uniform(-1, 1, (2, 3, 6, 5)).astype(np.float32)
    x[0, 0, 0, :2] = 0  # a zero input binarizes to -1
    truth = rng.uniform(size=(2, 120)).astype(np.float32)
    net = build(tmp_path, CONV + option + "\n[cost]\n")
    plain = build(tmp_path, CONV + "[cost]\n")
    layer, ref = net.layers[0], plain.layers[0]
    weights = net.be.to_host(layer.weights)
    net.be.write(ref.weights, binarized(weights, 4))
    net.be.write(ref.biases, net.be.to_host(layer.biases))
    ref_x = np.where(x > 0, 1, -1).astype(np.float32) if option == "xnor=1" else x
    net.forward(x, truth, train=True)
    plain.forward(ref_x, truth, train=True)
    np.testing.assert_allclose(net.layer_output(0), plain.layer_output(0), rtol=1e-5, atol=1e-6)
    # backward: the plain layer's with the real weights and input
    net.backward()
    plain.be.write(ref.weights, weights)
    plain.forward(x, truth, train=True)
    plain.be.write(plain.layers[1].delta, net.be.to_host(net.layers[1].delta))
    plain.backward()
    np.testing.assert_allclose(
        net.be.to_host(layer.weight_updates),
        plain.be.to_host(ref.weight_updates),
        rtol=1e-5,
        atol=1e-6,
    )


def test_fork_xnor_turns_groups_off_and_counts_a_32nd_of_the_bflops(tmp_path):
    p = tmp_path / "net.cfg"
    p.write_text(NET + "[convolutional]\nfilters=3\ngroups=3\nsize=3\npad=1\nxnor=1\n")
    fork = darknet_py.network.build_network(p, darknet="alexeyab").layers[0]
    assert fork.groups == 1 and fork.nweights == 3 * 3 * 9
    assert fork.fork_bflops == pytest.approx(2 * 3 * 27 * 30 / 1e9 / 32)
    original = darknet_py.network.build_network(p, darknet="original").layers[0]
    assert original.groups == 3 and original.nweights == 3 * 9


STOCK_AB = Path(__file__).resolve().parents[1].parent / "shared" / "darknet-cfg-ab"


@pytest.mark.skipif(not STOCK_AB.is_dir(), reason=f"the fork's stock cfgs are not at {STOCK_AB}")
@pytest.mark.parametrize("name", ["tiny-yolo_xnor.cfg", "yolov3-tiny_xnor.cfg"])
def test_forks_xnor_cfgs_run(name):
    net = darknet_py.load_network(STOCK_AB / name, batch=1)
    net.resize(64, 64)
    x = np.random.default_rng(4).uniform(0, 1, (1, 3, 64, 64)).astype(np.float32)
    out = net.predict(x)
    assert np.isfinite(out).all() and np.abs(out).max() > 0
    assert any(getattr(l, "xnor", 0) for l in net.layers)
