"""The AlexeyAB fork's layers and options on the NumPy backend: each forward (and the
fork's own weight-gradient rule) against a plain-loop transcription of the fork's C code,
each backward against finite differences, and the fork's flavour: batch norm, weights
files, truth layout."""

import math
import struct

import numpy as np
import pytest
from test_layers_gradcheck import GradCheck, net_text

from darknet_py.backends.numpy_backend import NumpyBackend
from darknet_py.cfg import CfgError, parse_cfg_text
from darknet_py.network import Network, load_network


def build(body, width, height, channels, batch=2, darknet=None, seed=0):
    text = f"[net]\nbatch={batch}\nwidth={width}\nheight={height}\nchannels={channels}\n\n" + body
    return Network(
        parse_cfg_text(text), backend=NumpyBackend(dtype=np.float64), seed=seed, darknet=darknet
    )


def run(net, seed=1):
    x = np.random.default_rng(seed).uniform(-1, 1, (net.batch,) + net.input_shape)
    x = x.astype(np.float32).astype(np.float64)
    net.forward(x)
    return x


def out(net, i):
    return net.layer_output(i)


CONV = "[convolutional]\nfilters={f}\nsize={k}\nstride=1\npad=1\nactivation={a}\n\n"


# ---- [route] groups ------------------------------------------------------------------------
def test_route_groups_take_the_group_id_th_slice_of_each_input():
    net = build(
        CONV.format(f=4, k=1, a="linear")
        + CONV.format(f=6, k=1, a="linear")
        + "[route]\nlayers=-1,-2\ngroups=2\ngroup_id=1\n",
        3,
        2,
        2,
    )
    run(net)
    a, b = out(net, 1), out(net, 0)  # 6 and 4 channels
    got = out(net, 2)
    assert got.shape == (2, 5, 2, 3)
    for n in range(2):
        want = [a[n, c] for c in range(3, 6)] + [b[n, c] for c in range(2, 4)]
        for c in range(5):
            np.testing.assert_array_equal(got[n, c], want[c])


def test_route_groups_must_divide_the_channels():
    with pytest.raises(CfgError, match="groups: groups=4 does not divide the 6 channels"):
        build(CONV.format(f=6, k=1, a="linear") + "[route]\nlayers=-1\ngroups=4\n", 3, 3, 2)


def test_convolutional_antialiasing_is_refused_not_read_past():
    # The fork blurs after such a convolution: building without the blur would give
    # other outputs than the fork's, so the option stops the build.
    with pytest.raises(
        CfgError, match=r"<cfg>:11: antialiasing: option is not supported by darknet-py"
    ):
        build("[convolutional]\nfilters=4\nsize=3\nstride=2\nantialiasing=1\n", 8, 8, 1)
    build("[convolutional]\nfilters=4\nsize=3\nstride=2\nantialiasing=0\n", 8, 8, 1)


def test_route_groups_gradient():
    body = (
        CONV.format(f=4, k=3, a="leaky")
        + CONV.format(f=2, k=1, a="logistic")
        + "[route]\nlayers=-1,-2\ngroups=2\ngroup_id=1\n\n"
        + CONV.format(f=2, k=1, a="linear")
    )
    GradCheck(net_text(4, 4, 2, body)).check(expect=["input", "0.weights", "1.weights"])


# ---- [shortcut] several `from`, weights ------------------------------------------------------
def shortcut_loops(prev, froms, weights, n_channels, normalization):
    """shortcut_multilayer_cpu: out = w0*prev + sum w_i*from_i over the flat prefix."""
    batch, outputs = prev.shape
    n = len(froms)
    layer_step = len(weights) // (n + 1) if weights is not None else 0
    step = outputs // layer_step if weights is not None else 0
    out = np.zeros_like(prev)
    for b in range(batch):
        for i in range(outputs):

            def weight(k):
                w = weights[i // step + k * layer_step]
                ws = [weights[i // step + j * layer_step] for j in range(n + 1)]
                if normalization == "relu":
                    return max(w, 0) / (1e-4 + sum(max(v, 0) for v in ws))
                if normalization == "softmax":
                    m = max(ws)
                    return math.exp(w - m) / (1e-4 + sum(math.exp(v - m) for v in ws))
                return w

            out[b, i] = prev[b, i] * (weight(0) if weights is not None else 1)
            for k, f in enumerate(froms):
                if i < f.shape[1]:
                    out[b, i] += f[b, i] * (weight(k + 1) if weights is not None else 1)
    return out


def shortcut_weight_updates_loops(delta, prev, froms, n_weights, n, outputs):
    """backward_shortcut_multilayer_cpu's weight_updates: delta * input, un-normalised."""
    layer_step = n_weights // (n + 1)
    step = outputs // layer_step
    upd = np.zeros(n_weights)
    for b in range(delta.shape[0]):
        for i in range(outputs):
            upd[i // step] += delta[b, i] * prev[b, i]
            for k, f in enumerate(froms):
                if i < f.shape[1]:
                    upd[i // step + (k + 1) * layer_step] += delta[b, i] * f[b, i]
    return upd


SHORTCUT_NET = (
    CONV.format(f=3, k=3, a="leaky")
    + CONV.format(f=2, k=1, a="linear")
    + CONV.format(f=3, k=1, a="logistic")
)


@pytest.mark.parametrize(
    "wtype,norm",
    [
        ("none", "none"),
        ("per_feature", "none"),
        ("per_feature", "relu"),
        ("per_channel", "softmax"),
        ("per_channel", "relu"),
    ],
)
def test_shortcut_several_from_weighted_against_the_forks_loops(wtype, norm):
    body = SHORTCUT_NET + (
        f"[shortcut]\nfrom=-2,-3\nweights_type={wtype}\n"
        f"weights_normalization={norm}\nactivation=linear\n"
    )
    net = build(body, 3, 3, 2)
    assert net.darknet == "alexeyab"
    sc = net.layers[3]
    if wtype != "none":
        sc.weights[...] = np.random.default_rng(3).uniform(-1, 1.5, sc.weights.size)
        assert sc.weights.size == {"per_feature": 3, "per_channel": 9}[wtype]
    run(net)
    flat = [out(net, i).reshape(2, -1) for i in range(3)]
    want = shortcut_loops(
        flat[2], [flat[1], flat[0]], sc.weights.copy() if wtype != "none" else None, 3, norm
    )
    np.testing.assert_allclose(out(net, 3).reshape(2, -1), want, rtol=1e-12, atol=1e-12)
    if wtype != "none":
        # the fork's weight gradient: delta * input, ignoring the normalisation
        net.forward(np.random.default_rng(1).uniform(-1, 1, (2, 2, 3, 3)), train=True)
        flat = [out(net, i).reshape(2, -1) for i in range(3)]
        sc.delta[...] = np.random.default_rng(4).uniform(-1, 1, sc.delta.size)
        sc.weight_updates[...] = 0
        net.input, net.delta = net.layers[2].output, net.layers[2].delta
        sc.backward(net)
        want = shortcut_weight_updates_loops(
            sc.delta.reshape(2, -1), flat[2], [flat[1], flat[0]], sc.nweights, 2, sc.outputs
        )
        np.testing.assert_allclose(sc.weight_updates, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("wtype", ["none", "per_feature", "per_channel"])
def test_shortcut_several_from_gradient(wtype):
    body = SHORTCUT_NET + f"[shortcut]\nfrom=-2,-3\nweights_type={wtype}\nactivation=swish\n"
    expect = ["input", "0.weights", "1.weights", "2.weights"]
    GradCheck(net_text(3, 3, 2, body)).check(
        expect=expect + (["3.weights"] if wtype != "none" else [])
    )


def test_shortcut_adds_a_smaller_from_over_the_flat_prefix():
    body = (
        CONV.format(f=4, k=1, a="linear")
        + CONV.format(f=2, k=1, a="linear")
        + "[shortcut]\nfrom=-2,-1\n"
    )  # prev 2 channels, from 4 (cut) and 2
    net = build(body, 2, 2, 1, darknet="alexeyab")
    run(net)
    a, b = out(net, 0).reshape(2, -1), out(net, 1).reshape(2, -1)
    np.testing.assert_allclose(out(net, 2).reshape(2, -1), b + a[:, :8] + b)


def test_shortcut_rejects_another_width_in_the_fork():
    body = (
        CONV.format(f=2, k=1, a="linear")
        + "[maxpool]\nsize=2\nstride=2\n"
        + "[shortcut]\nfrom=-2\n"
    )
    with pytest.raises(CfgError, match="from: layer 0 is 4x4 but the previous layer is 2x2"):
        build(body, 4, 4, 1, darknet="alexeyab")


@pytest.mark.parametrize(
    "key,value", [("weights_type", "per_pixel"), ("weights_normalization", "tanh")]
)
def test_shortcut_unknown_weights_options(key, value):
    with pytest.raises(CfgError, match=f"{key}: unknown {key} '{value}'"):
        build(SHORTCUT_NET + f"[shortcut]\nfrom=-2\n{key}={value}\n", 3, 3, 2)


# ---- [maxpool] stride_x/stride_y, maxpool_depth; [local_avgpool] ---------------------------------
def pool_loops(x, size, sx, sy, pad, out_h, out_w, average):
    """forward_maxpool_layer's generic loop / forward_local_avgpool_layer."""
    batch, c, h, w = x.shape
    res = np.zeros((batch, c, out_h, out_w))
    for b in range(batch):
        for k in range(c):
            for i in range(out_h):
                for j in range(out_w):
                    vals = []
                    for n in range(size):
                        for m in range(size):
                            cy, cx = -(pad // 2) + i * sy + n, -(pad // 2) + j * sx + m
                            if 0 <= cy < h and 0 <= cx < w:
                                vals.append(x[b, k, cy, cx])
                    res[b, k, i, j] = sum(vals) / len(vals) if average else max(vals)
    return res


@pytest.mark.parametrize("section", ["maxpool", "local_avgpool"])
def test_pool_with_separate_strides_against_the_forks_loop(section):
    net = build(f"[{section}]\nsize=3\nstride_x=2\nstride_y=1\n", 7, 5, 2)
    layer = net.layers[0]
    assert (layer.out_w, layer.out_h) == ((7 + 2 - 3) // 2 + 1, (5 + 2 - 3) // 1 + 1)
    x = run(net)
    want = pool_loops(x, 3, 2, 1, 2, layer.out_h, layer.out_w, section == "local_avgpool")
    np.testing.assert_allclose(out(net, 0), want, rtol=1e-12)


def test_maxpool_depth_takes_strided_channels():
    net = build("[maxpool]\nmaxpool_depth=1\nout_channels=2\n", 3, 2, 5)
    x = run(net)
    got = out(net, 0)
    assert got.shape == (2, 2, 2, 3)
    np.testing.assert_array_equal(got[:, 0], np.max(x[:, [0, 2, 4]], axis=1))
    np.testing.assert_array_equal(got[:, 1], np.max(x[:, [1, 3]], axis=1))


@pytest.mark.parametrize(
    "pool",
    [
        "[maxpool]\nsize=2\nstride_x=1\nstride_y=2\n",
        "[maxpool]\nmaxpool_depth=1\nout_channels=2\n",
        "[local_avgpool]\nsize=3\nstride=2\n",
        "[local_avgpool]\nsize=2\nstride_x=2\nstride_y=1\n",
    ],
)
def test_pool_gradients(pool):
    body = CONV.format(f=4, k=3, a="leaky") + pool + "\n" + CONV.format(f=2, k=1, a="linear")
    GradCheck(net_text(5, 4, 2, body)).check(expect=["input", "0.weights"])


# ---- [sam], [scale_channels], [reorg3d], [empty] -------------------------------------------------
def test_sam_multiplies_elementwise():
    net = build(
        CONV.format(f=3, k=3, a="leaky") + CONV.format(f=3, k=1, a="logistic") + "[sam]\nfrom=-2\n",
        3,
        3,
        2,
    )
    run(net)
    np.testing.assert_allclose(out(net, 2), out(net, 1) * out(net, 0), rtol=1e-15)


SCALE_NET = (
    CONV.format(f=4, k=3, a="leaky")
    + "[avgpool]\n\n"
    + CONV.format(f=4, k=1, a="logistic")
    + "[scale_channels]\nfrom=-3\n"
)
SCALE_WH_NET = (
    CONV.format(f=4, k=3, a="leaky")
    + CONV.format(f=1, k=1, a="logistic")
    + "[scale_channels]\nfrom=-2\nscale_wh=1\n"
)


def test_scale_channels_against_the_forks_loops():
    for body, wh in ((SCALE_NET, 0), (SCALE_WH_NET, 1)):
        net = build(body, 3, 2, 2)
        run(net)
        last = len(net.layers) - 1
        prev, src = out(net, last - 1).reshape(-1), out(net, 0).reshape(-1)
        size, channel_size, batch_size = src.size, 6, 4 * 6
        want = np.empty(size)
        for i in range(size):
            scale = (
                prev[i % channel_size + (i // batch_size) * channel_size]
                if wh
                else prev[i // channel_size]
            )
            want[i] = scale * src[i]
        np.testing.assert_allclose(out(net, last).reshape(-1), want, rtol=1e-15)


def test_scale_channels_shape_errors():
    with pytest.raises(
        CfgError,
        match="from: the previous layer is 3x2x4; with layer 0 "
        r"\(3x2x4\) it must be 1x1x4",
    ):
        build(CONV.format(f=4, k=3, a="leaky") + "[scale_channels]\nfrom=-1\n", 3, 2, 2)


def reorg3d_loops(x, stride):
    """forward_reorg_layer (the fork's): reorg_cpu over the output shape, forward=0."""
    batch, c, h, w = x.shape
    out_w, out_h, out_c = w // stride, h // stride, c * stride * stride
    src, dst = x.reshape(-1), np.zeros(x.size)
    in_c = out_c // (stride * stride)
    for b in range(batch):
        for k in range(out_c):
            for j in range(out_h):
                for i in range(out_w):
                    in_index = i + out_w * (j + out_h * (k + out_c * b))
                    c2, offset = k % in_c, k // in_c
                    w2, h2 = i * stride + offset % stride, j * stride + offset // stride
                    dst[in_index] = src[
                        w2 + out_w * stride * (h2 + out_h * stride * (c2 + in_c * b))
                    ]
    return dst.reshape(batch, out_c, out_h, out_w)


def test_reorg3d_against_the_forks_loop():
    net = build("[reorg3d]\nstride=2\n", 4, 6, 3)
    x = run(net)
    np.testing.assert_array_equal(out(net, 0), reorg3d_loops(x, 2))


@pytest.mark.parametrize(
    "section",
    [
        "[sam]\nfrom=-2\nactivation=mish\n",
        "[scale_channels]\nfrom=-3\n",
        "[reorg3d]\nstride=2\n",
        "[empty]\n",
        "[silence]\n",
    ],
)
def test_new_section_gradients(section):
    head = (
        CONV.format(f=4, k=3, a="leaky") + "[avgpool]\n\n" + CONV.format(f=4, k=1, a="tanh")
        if "scale" in section
        else CONV.format(f=4, k=3, a="leaky") + CONV.format(f=4, k=1, a="logistic")
    )
    body = head + section + "\n" + CONV.format(f=2, k=1, a="linear")
    GradCheck(net_text(4, 4, 2, body)).check(expect=["input", "0.weights"])


def test_scale_wh_gradient():
    body = SCALE_WH_NET + "\n" + CONV.format(f=2, k=1, a="linear")
    GradCheck(net_text(4, 3, 2, body)).check(expect=["input", "0.weights", "1.weights"])


# ---- activations inside layers ---------------------------------------------------------------
@pytest.mark.parametrize(
    "act",
    [
        "mish",
        "swish",
        "hard_mish",
        "gelu",
        "relu6",
        "normalize_channels",
        "normalize_channels_softmax",
        "normalize_channels_softmax_maxval",
    ],
)
def test_fork_activation_gradients_in_a_convolution(act):
    body = CONV.format(f=3, k=3, a=act) + CONV.format(f=2, k=1, a="linear")
    GradCheck(net_text(4, 4, 2, body), input_range=(-2.0, 2.0)).check(
        expect=["input", "0.weights", "1.weights"]
    )


def test_normalize_channels_sums_to_one_over_channels():
    net = build(CONV.format(f=4, k=1, a="normalize_channels_softmax"), 3, 3, 2)
    run(net)
    np.testing.assert_allclose(out(net, 0).sum(axis=1), 1.0, atol=1e-3)


# ---- flavour: batch norm --------------------------------------------------------------------
BN_CONV = "[convolutional]\nfilters=3\nsize=1\nstride=1\nbatch_normalize=1\nactivation=linear\n"


@pytest.mark.parametrize("darknet", ["original", "alexeyab"])
def test_batch_norm_inference_epsilon_by_flavour(darknet):
    net = build(BN_CONV, 2, 2, 2, darknet=darknet)
    conv = net.layers[0]
    rng = np.random.default_rng(0)
    for name in ("weights", "biases", "scales", "rolling_mean"):
        getattr(conv, name)[...] = rng.uniform(-1, 1, getattr(conv, name).size)
    conv.rolling_variance[...] = [1e-4, 0.5, 2.0]  # small: the epsilons differ most
    x = run(net)
    z = np.einsum("fc,nchw->nfhw", conv.weights.reshape(3, 2), x)
    m, v = conv.rolling_mean.reshape(1, 3, 1, 1), conv.rolling_variance.reshape(1, 3, 1, 1)
    norm = (z - m) / (np.sqrt(v + 1e-5) if darknet == "alexeyab" else np.sqrt(v) + 1e-6)
    want = norm * conv.scales.reshape(1, 3, 1, 1) + conv.biases.reshape(1, 3, 1, 1)
    np.testing.assert_allclose(out(net, 0), want, rtol=1e-10)


@pytest.mark.parametrize(
    "darknet,keep,beta_trained",
    [("original", 0.99, True), ("alexeyab-cpu", 0.9, False), ("alexeyab", 0.99, True)],
)
def test_batch_norm_training_by_flavour(darknet, keep, beta_trained):
    net = build(BN_CONV, 2, 2, 2, batch=4, darknet=darknet)
    conv = net.layers[0]
    conv.rolling_mean[...] = 0.5
    conv.rolling_variance[...] = 2.0
    x = np.random.default_rng(2).uniform(-1, 1, (4, 2, 2, 2)).astype(np.float32).astype(float)
    net.forward(x, train=True)
    z = np.einsum("fc,nchw->nfhw", conv.weights.reshape(3, 2), x)
    mean, var = z.mean(axis=(0, 2, 3)), z.var(axis=(0, 2, 3), ddof=1)  # unbiased
    np.testing.assert_allclose(conv.rolling_mean, keep * 0.5 + (1 - keep) * mean, rtol=1e-12)
    np.testing.assert_allclose(conv.rolling_variance, keep * 2.0 + (1 - keep) * var, rtol=1e-12)
    conv.delta[...] = 1.0
    net.backward()
    assert np.any(conv.bias_updates != 0) == beta_trained
    assert np.any(conv.scale_updates != 0)


# ---- flavour: weights files ------------------------------------------------------------------
FORK_NET = (
    CONV.format(f=3, k=3, a="mish")
    + "[batchnorm]\n\n"
    + CONV.format(f=3, k=1, a="leaky")
    + "[shortcut]\nfrom=-3\nweights_type=per_channel\nweights_normalization=softmax\n"
)


def _fork_files(tmp_path, header=(0, 2, 5), seen=6000):
    cfg = tmp_path / "fork.cfg"
    cfg.write_text("[net]\nbatch=8\nsubdivisions=2\nwidth=4\nheight=4\nchannels=2\n\n" + FORK_NET)
    net = build(FORK_NET, 4, 4, 2)
    floats = sum(a.size for l in net.layers for _, a in l.params())
    # conv 3*(1+18) ... + batchnorm 4*3 + conv 3+9 + shortcut 2*3 weights
    assert floats == (3 + 3 * 2 * 9) + 4 * 3 + (3 + 9) + 6
    values = np.random.default_rng(9).uniform(-1, 1, floats).astype("<f4")
    weights = tmp_path / "fork.weights"
    weights.write_bytes(struct.pack("<3iQ", *header, seen) + values.tobytes())
    return cfg, weights, values


def test_fork_weights_load_and_save_byte_identically(tmp_path):
    cfg, weights, values = _fork_files(tmp_path)
    net = load_network(cfg, weights)
    assert net.darknet == "alexeyab"
    sc = net.layers[3]
    np.testing.assert_array_equal(sc.weights, values[-6:])  # the shortcut's, at its place
    np.testing.assert_array_equal(net.layers[1].biases, values[57:60])  # [batchnorm] biases
    out_path = tmp_path / "again.weights"
    net.save_weights(out_path)
    assert out_path.read_bytes() == weights.read_bytes()


def test_fork_saves_seen_as_whole_iterations_and_its_header(tmp_path):
    # seen 6003 with batch 4 x subdivisions 2: the fork saves 750 iterations * 8 = 6000
    cfg, weights, _ = _fork_files(tmp_path, header=(0, 2, 0), seen=6003)
    net = load_network(cfg, weights, darknet="alexeyab")
    net.save_weights(tmp_path / "out.weights")
    head = (tmp_path / "out.weights").read_bytes()[:20]
    assert struct.unpack("<3iQ", head) == (0, 2, 5, 6000)


def test_flavour_from_the_weights_header(tmp_path):
    cfg, weights, _ = _fork_files(tmp_path)
    plain = tmp_path / "plain.cfg"
    plain.write_text(
        "[net]\nbatch=1\nwidth=4\nheight=4\nchannels=2\n\n" + CONV.format(f=3, k=3, a="leaky")
    )
    w = tmp_path / "plain.weights"
    for header, flavour in (((0, 2, 5), "alexeyab"), ((0, 2, 0), "original")):
        w.write_bytes(struct.pack("<3iQ", *header, 0) + np.zeros(57, "<f4").tobytes())
        assert load_network(plain, w).darknet == flavour
    assert load_network(plain, w, darknet="alexeyab").darknet == "alexeyab"


# ---- flavour: truth layout ---------------------------------------------------------------------
YOLO = (
    "[convolutional]\nfilters=18\nsize=1\nstride=1\nactivation=linear\n\n"
    "[yolo]\nmask=0,1,2\nanchors=1,1,2,2,3,3\nclasses=1\nnum=3\n"
)


@pytest.mark.parametrize("darknet,size,boxes", [("original", 5, 90), ("alexeyab", 6, 200)])
def test_truth_layout_by_flavour(darknet, size, boxes):
    net = build(YOLO, 4, 4, 1, darknet=darknet)
    assert (net.truth_size, net.max_boxes) == (size, boxes)
    box = [0.5, 0.5, 0.2, 0.3, 0]
    for count, fields in ((90, 5), (200, 5), (200, 6)):  # original, loader (max=200), fork
        given = np.zeros((2, count, fields), np.float32)
        given[:, 0, :5] = given[:, 1, :5] = box
        got = net.truth_for_network(given.reshape(2, -1)).reshape(2, count, size)
        np.testing.assert_array_equal(got[:, :2, :5], given[:, :2, :5])
        assert not got[:, 2:].any() and not got[:, :, 5:].any()


def test_a_fork_detector_trains_the_same_from_either_truth_layout():
    losses = []
    for fields in (5, 6):
        net = build(YOLO, 4, 4, 1, batch=2, darknet="alexeyab", seed=1)
        truth = np.zeros((2, 200, fields), np.float32)
        truth[:, 0, :5] = [0.4, 0.6, 0.3, 0.2, 0]
        x = np.random.default_rng(0).random((2, 1, 4, 4))
        losses.append(net.train_pass(x, truth.reshape(2, -1)))
    assert losses[0] == losses[1] and losses[0] > 0


def test_a_classifier_truth_is_left_alone():
    net = build(
        "[connected]\noutput=450\nactivation=linear\n\n[softmax]\n", 2, 2, 1, darknet="alexeyab"
    )
    truth = np.eye(450, dtype=np.float32)[:2]
    assert net.truth_for_network(truth) is not None
    np.testing.assert_array_equal(net.truth_for_network(truth), truth)


# ---- [convolutional] in the fork -----------------------------------------------------------------
def test_conv_stride_x_and_y_override_stride():
    net = build(
        "[convolutional]\nfilters=2\nsize=3\nstride=1\nstride_x=2\nstride_y=2\npad=1\n"
        "activation=linear\n",
        8,
        6,
        1,
        darknet="alexeyab",
    )
    assert (net.layers[0].out_w, net.layers[0].out_h, net.layers[0].stride) == (4, 3, 2)


def test_conv_separate_strides_against_a_loop():
    net = build(
        "[convolutional]\nfilters=2\nsize=3\nstride_x=2\npad=1\nactivation=linear\n",
        9,
        5,
        2,
        darknet="alexeyab",
    )
    conv = net.layers[0]
    assert (conv.out_w, conv.out_h) == (5, 5)  # stride_x 2, stride_y from stride (1)
    assert "/2x1" in conv.describe()
    x = run(net)
    img = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    w = conv.weights.reshape(2, 2, 3, 3)
    want = np.zeros((2, 2, 5, 5))
    for i in range(5):
        for j in range(5):
            want[:, :, i, j] = np.einsum(
                "bcyx,fcyx->bf", img[:, :, i : i + 3, 2 * j : 2 * j + 3], w
            )
    np.testing.assert_allclose(out(net, 0), want, rtol=1e-12)


def test_conv_separate_strides_gradient():
    body = (
        "[convolutional]\nfilters=3\nsize=3\nstride_x=1\nstride_y=2\npad=1\nactivation=mish\n\n"
        + CONV.format(f=2, k=1, a="linear")
    )
    GradCheck(net_text(5, 6, 2, body)).check(expect=["input", "0.weights", "1.weights"])


def test_conv_dilation_keeps_the_size_and_pads_by_padding_times_dilation():
    net = build(
        "[convolutional]\nfilters=2\nsize=3\nstride=1\npadding=1\ndilation=2\nactivation=linear\n",
        9,
        7,
        1,
        darknet="alexeyab",
    )
    conv = net.layers[0]
    assert (conv.out_w, conv.out_h, conv.padding) == (9, 7, 2)
    x = run(net)
    img = np.pad(x[:, 0], ((0, 0), (2, 2), (2, 2)))
    w = conv.weights.reshape(2, 3, 3)
    want = np.zeros((2, 2, 7, 9))
    for f in range(2):
        for i in range(7):
            for j in range(9):
                want[:, f, i, j] = (img[:, i : i + 5 : 2, j : j + 5 : 2] * w[f]).sum(axis=(1, 2))
    np.testing.assert_allclose(out(net, 0), want, rtol=1e-12)
    with pytest.raises(CfgError, match="dilation: dilation=2 with padding=0"):
        build("[convolutional]\nfilters=2\nsize=3\ndilation=2\n", 9, 7, 1, darknet="alexeyab")


SHARED_NET = (
    CONV.format(f=3, k=3, a="leaky")
    + CONV.format(f=3, k=3, a="leaky")
    + "[convolutional]\nfilters=3\nsize=3\nstride=1\npad=1\nactivation=leaky\n"
    "share_index=-1\n"
)


def test_conv_share_index_uses_and_trains_the_owners_parameters(tmp_path):
    net = build(SHARED_NET, 4, 4, 3, darknet="alexeyab")
    owner, sharer = net.layers[1], net.layers[2]
    assert sharer.weights is owner.weights and sharer.params() == []
    run(net)
    want = build(CONV.format(f=3, k=3, a="leaky"), 4, 4, 3)
    want.layers[0].weights[...] = owner.weights
    want.forward(out(net, 1))
    np.testing.assert_allclose(out(net, 2), out(want, 0), rtol=1e-5, atol=1e-7)  # via float32
    GradCheck(net_text(4, 4, 3, SHARED_NET)).check(expect=["input", "0.weights", "1.weights"])


def test_conv_share_index_must_match():
    with pytest.raises(
        CfgError, match="share_index: layer 0 must be a .convolutional. with the same filters"
    ):
        build(
            CONV.format(f=3, k=3, a="leaky")
            + CONV.format(f=2, k=3, a="leaky")
            + "[convolutional]\nfilters=2\nsize=3\npad=1\nshare_index=0\n",
            4,
            4,
            3,
            darknet="alexeyab",
        )
