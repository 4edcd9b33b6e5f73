"""Options, shapes and cfg errors of issue 23's layers ([activation], [logistic], [l2norm],
[normalization]/[lrn], [deconvolutional]/[deconv]); their numbers are in
test_layers_c_fixtures.py."""
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


@pytest.mark.parametrize("section,out", [
    ("[activation]\nactivation=tanh", (3, 6, 5)),
    ("[logistic]", (3, 6, 5)),
    ("[l2norm]", (3, 6, 5)),
    ("[lrn]", (3, 6, 5)),
    ("[normalization]\nsize=3", (3, 6, 5)),
    ("[deconv]\nfilters=4\nsize=4\nstride=2\npad=1", (4, 10, 8)),     # (h-1)*2 + 4 - 2*2
    ("[deconvolutional]\nfilters=2\nsize=3\nstride=3", (2, 18, 15)),  # (h-1)*3 + 3
])
def test_output_shapes(tmp_path, section, out):
    layer = build(tmp_path, section + "\n").layers[0]
    assert (layer.out_c, layer.out_h, layer.out_w) == out
    assert layer.outputs == int(np.prod(out))


@pytest.mark.parametrize("section,where", [
    ("[activation]\nactivation=sigmoid", ":7: activation: unknown activation 'sigmoid'"),
    ("[lrn]\nsize=0", ":7: size: must be at least 1"),
    ("[deconv]\nfilters=0", ":7: filters: must be at least 1"),
    ("[deconv]\nsize=2\npadding=3", ":8: padding: padding 3 leaves no output"),
])
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
    np.testing.assert_allclose(net.layer_output(0) * np.linalg.norm(x, axis=1, keepdims=True),
                               x, rtol=1e-5, atol=1e-7)


def test_deconv_is_the_adjoint_of_a_convolution(tmp_path):
    """<deconv(x), y> = <x, conv(y)> with the same weights and no bias: the transposed
    convolution's definition, independent of Darknet."""
    net = build(tmp_path, "[deconv]\nfilters=2\nsize=3\nstride=2\npad=1\nactivation=linear\n")
    layer = net.layers[0]
    rng = np.random.default_rng(2)
    w = rng.standard_normal((3, 2, 3, 3)).astype(np.float32)   # (c, filters, k, k)
    net.be.write(layer.weights, w)
    x = rng.standard_normal((2, 3, 6, 5)).astype(np.float32)
    net.forward(x)
    y = rng.standard_normal(net.layer_output(0).shape)
    # conv(y)[c, i, j] = sum over f, a, b of w[c, f, a, b] * y_padded[f, 2i + a, 2j + b]
    yp = np.pad(y, ((0, 0), (0, 0), (1, 1), (1, 1)))
    conv = np.zeros(x.shape)
    for a in range(3):
        for b in range(3):
            window = yp[:, :, a:a + 2 * 6:2, b:b + 2 * 5:2]
            conv += np.einsum("cf,nfij->ncij", w[:, :, a, b], window)
    assert float((net.layer_output(0) * y).sum()) == pytest.approx(float((x * conv).sum()),
                                                                    rel=1e-4)


def test_info_table_rows(tmp_path):
    p = tmp_path / "net.cfg"
    p.write_text(NET + "[deconv]\nfilters=4\nsize=4\nstride=2\npad=1\n[lrn]\n[l2norm]\n"
                 "[activation]\nactivation=leaky\n[logistic]\n")
    text = "\n".join(darknet_py.network.build_network(p).summary())
    assert "deconv    4  4 x 4 / 2     5 x   6 x   3   ->     8 x  10 x   4" in text
    assert "norm      5" in text and "l2norm" in text and "logxent" in text
